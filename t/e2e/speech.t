# Speech out with the official `openai` npm package (t/e2e/speech.js):
# audio.speech.create raw and "sse", chat audio streaming and not, through
# nginx + ngx_omni_module. The upstream is a parameter:
#
#   OMNI_E2E_UPSTREAM=fake    (default) t/lib/FakeEngine.pm, whose audio
#                             is known byte for byte
#   OMNI_E2E_UPSTREAM=engine  the real omni-engine (once it serves
#                             speech; until then it answers 501)
#
# The package is installed by `make test-deps` (pinned, into
# $OMNI_CACHE/npm, ~/.cache/ngx_omni/npm by default; OMNI_NPM_DIR
# overrides).
use strict;
use warnings;
use lib '.';
use Test::More;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use t::lib::OmniServer;
use t::lib::NodeTap;
use t::lib::FakeEngine;

my $npm = $ENV{OMNI_NPM_DIR}
          // ($ENV{OMNI_CACHE} // ($ENV{HOME} // '') . '/.cache/ngx_omni')
             . '/npm';
die "the openai npm package is not installed in $npm (make test-deps)\n"
    unless -f "$npm/node_modules/openai/package.json";

my $upstream = $ENV{OMNI_E2E_UPSTREAM} // 'fake';
die "OMNI_E2E_UPSTREAM is fake or engine\n"
    unless $upstream =~ /^(fake|engine)$/;

my ($s, $model, $expect);
if ($upstream eq 'fake') {
    my $sock = "$main::TMP/e2e-speech-fake.sock";
    fake_engine_start($sock);
    $s = omni_server_start(socket => $sock);
    $model = 'tts-1';
    $expect = encode_json({ map { $_ => encode_base64(fake_audio($_), '') }
                                qw(mp3 pcm) });
} else {
    $s = omni_server_start();
    $model = main::models($s->{engine})->{data}[0]{id};
    $expect = '';
}
note("upstream: $upstream");

local $ENV{NODE_PATH} = "$npm/node_modules";
local $ENV{OMNI_BASE_URL} = "http://127.0.0.1:$s->{port}/v1";
local $ENV{OMNI_MODEL_ID} = $model;
local $ENV{OMNI_AUDIO_EXPECT} = $expect;
node_tap('t/e2e/speech.js', 'openai npm', 20);

my $log = main::slurp("$s->{prefix}/logs/error.log");
my @bad = grep { /\[(error|crit|alert|emerg)\]/ } split /\n/, $log;
is(scalar(@bad), 0, 'no error in error.log')
    or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);

omni_server_stop($s);
done_testing();

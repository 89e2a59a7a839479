# Audio in with the official `openai` npm package
# (t/e2e/transcriptions.js): audio.transcriptions.create in every
# response_format and streaming, a 400 as the SDK raises it, and a chat
# completion with an input_audio part, through nginx + ngx_omni_module
# against the stand-in engine (t/lib/FakeEngine.pm), which records what
# it received: the SDK's own multipart body must reach it as the exact
# bytes of the file.
#
# The package is installed by `make test-deps` (pinned, into
# $OMNI_CACHE/npm, ~/.cache/ngx_omni/npm by default; OMNI_NPM_DIR
# overrides).
use strict;
use warnings;
use lib '.';
use Test::More;
use t::lib::OmniServer;
use t::lib::NodeTap;
use t::lib::FakeEngine;

my $npm = $ENV{OMNI_NPM_DIR}
          // ($ENV{OMNI_CACHE} // ($ENV{HOME} // '') . '/.cache/ngx_omni')
             . '/npm';
die "the openai npm package is not installed in $npm (make test-deps)\n"
    unless -f "$npm/node_modules/openai/package.json";

my $sock = "$main::TMP/e2e-stt-fake.sock";
fake_engine_start($sock);
my $s = omni_server_start(socket => $sock,
                          http => "    client_max_body_size 25m;\n");

# a file with what trips careless multipart parsers: CRs, "\r\n--"
srand(3);
my $audio = 'RIFF' . pack('V', 100_000) . 'WAVE';
$audio .= join('', map { chr(int rand 256) } 1 .. 97) . "\r\n--" while length $audio < 100_000;

local $ENV{NODE_PATH} = "$npm/node_modules";
local $ENV{OMNI_BASE_URL} = "http://127.0.0.1:$s->{port}/v1";
my $file = "$s->{prefix}/tmp/speech.wav";
open(my $fh, '>', $file) or die "$file: $!\n";
binmode $fh;
print $fh $audio;
close $fh;
local $ENV{OMNI_AUDIO} = $file;
local $ENV{OMNI_TEXT} = join ' ', map { $_->{text} } @FAKE_SEGMENTS;
node_tap('t/e2e/transcriptions.js', 'openai npm', 19);

my $rec = fake_engine_record($sock);
ok($rec && $rec->{audio} eq $audio,
   'the engine got the file the SDK uploaded, byte for byte');
is_deeply($rec && $rec->{bad}, [], 'in well-formed AUDIO_IN frames');

my $log = main::slurp("$s->{prefix}/logs/error.log");
my @bad = grep { /\[(error|crit|alert|emerg)\]/ } split /\n/, $log;
is(scalar(@bad), 0, 'no error in error.log')
    or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);

omni_server_stop($s);
done_testing();

# The official `openai` npm package against nginx + ngx_omni_module + the
# engine: t/e2e/openai.js does the talking (models, chat and completions,
# streaming and not, errors as APIError); this file starts the servers,
# computes what the engine itself answers for the same prompts, and turns
# the script's TAP lines into tests.
#
# The package is installed by `make test-deps` (pinned, into
# $OMNI_CACHE/npm, ~/.cache/ngx_omni/npm by default; OMNI_NPM_DIR
# overrides).
use strict;
use warnings;
use lib '.';
use Test::More;
use JSON::PP;
use t::lib::OmniServer;
use t::lib::NodeTap;
our ($MODEL);

my $npm = $ENV{OMNI_NPM_DIR}
          // ($ENV{OMNI_CACHE} // ($ENV{HOME} // '') . '/.cache/ngx_omni')
             . '/npm';
die "the openai npm package is not installed in $npm (make test-deps)\n"
    unless -f "$npm/node_modules/openai/package.json";

sub gen {
    my @args = @_;
    my ($rc, $out, $err) = main::run_engine('generate', '--model', $MODEL,
        '--threads', 1, '--temperature', 0, '--max-tokens', 24, @args);
    die "generate failed: $err" if $rc != 0;
    return $out;
}

my %expect = (chat => gen('--chat', '--prompt', 'Tell me a story'),
              completion => gen('--prompt', 'Once upon a time'));

my $s = omni_server_start();
my $k = omni_server_start(name => 'openai-keys', socket => $s->{socket},
                          api_keys => ['sk-test-right-key']);
my ($model_id) = main::models($s->{engine})->{data}[0]{id};

my $ver = decode_json(main::slurp("$npm/node_modules/openai/package.json"))
          ->{version};
note("openai npm $ver, node " . `node --version`);

local $ENV{NODE_PATH} = "$npm/node_modules";
local $ENV{OMNI_BASE_URL} = "http://127.0.0.1:$s->{port}/v1";
local $ENV{OMNI_BAD_KEY_URL} = "http://127.0.0.1:$k->{port}/v1";
local $ENV{OMNI_MODEL_ID} = $model_id;
local $ENV{OMNI_EXPECT} = encode_json(\%expect);
node_tap('t/e2e/openai.js', 'openai npm', 30);

# The right key passes through the keyed server as well.
{
    local $ENV{OMNI_BASE_URL} = "http://127.0.0.1:$k->{port}/v1";
    my $js = q{
        const m = require('openai'); const O = m.OpenAI || m.default || m;
        new O({ baseURL: process.env.OMNI_BASE_URL, apiKey:
                'sk-test-right-key', maxRetries: 0 }).models.list()
          .then((l) => { console.log(l.data[0].id); },
                (e) => { console.log('ERR ' + e.status); process.exit(1); });
    };
    open(my $fh, '-|', 'node', '-e', $js) or die "node: $!\n";
    my $got = do { local $/; <$fh> } // '';
    close $fh;
    is($got, "$model_id\n", 'openai npm: the right API key lists models');
}

my $log = main::slurp("$k->{prefix}/logs/error.log");
unlike($log, qr/sk-test-right-key|sk-wrong/, 'no API key in error.log');
for my $srv ($s, $k) {
    my $log = main::slurp("$srv->{prefix}/logs/error.log");
    my @bad = grep { /\[(error|crit|alert|emerg)\]/ } split /\n/, $log;
    is(scalar(@bad), 0, "$srv->{prefix}: no error in error.log")
        or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
}

omni_server_stop($k);
omni_server_stop($s);
done_testing();

# Under load: 256 concurrent streaming clients for 60 s (OMNI_LOAD_SECONDS)
# against nginx + the sidecar exactly as `make run` serves them: conf/
# nginx.conf rendered the way the Makefile's run target renders it (its
# @...@ names replaced), nginx started on a free port from a private
# prefix under build/t/load/, the engine started by nginx (omni_engine).
#
# build/bench/loadgen keeps 256 streaming chat requests in flight (a
# bounded, closed loop on loopback; each request max_tokens 32, greedy),
# --expect-done: a stream must end with "data: [DONE]" or an error event.
#
# Checks: every request ended with [DONE] or a well-formed error (an HTTP
# error with an OpenAI error object, or an SSE error event); after a first
# wave, a second wave leaves the nginx workers' resident memory where the
# first left it (within 10% + 2 MB); the error log has nothing at
# [error]/[crit]/[alert]/[emerg]; the module's and engine's metrics agree
# that nothing is left running.
use strict;
use warnings;
use lib '.';
use Cwd qw(getcwd);
use File::Path qw(make_path remove_tree);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);
use t::lib::OmniServer;
our ($MODEL);

my $secs = $ENV{OMNI_LOAD_SECONDS} // 60;
my $conc = $ENV{OMNI_LOAD_CONCURRENCY} // 256;
my $loadgen = 'build/bench/loadgen';
die "$loadgen is not built (make build/bench/loadgen)\n" unless -x $loadgen;
my $root = getcwd();
my $prefix = "$root/build/t/load";
my $port = free_port();

# --- conf/nginx.conf, rendered as `make run` renders it ---------------------
my $model = $MODEL =~ m{^/} ? $MODEL : "$root/$MODEL";
my %subst = (ROOT => $root, PREFIX => $prefix, OMNI_PORT => $port,
             OMNI_MODEL => $model, OMNI_ENGINE_ARGS => '--log-level warn');
my $conf = main::slurp('conf/nginx.conf');
die "conf/nginx.conf is missing\n" unless length $conf;
$conf =~ s/\@(ROOT|PREFIX|OMNI_PORT|OMNI_MODEL|OMNI_ENGINE_ARGS)\@/$subst{$1}/g;
unlike($conf, qr/\@[A-Z_]+\@/, 'conf/nginx.conf: every @name@ replaced');
remove_tree($prefix);
make_path(map { "$prefix/$_" } qw(conf logs temp));
open(my $fh, '>', "$prefix/conf/nginx.conf") or die $!;
print $fh $conf;
close $fh;

my $nginx = $t::lib::OmniServer::NGINX;
my $pid = fork() // die "fork: $!";
if ($pid == 0) {
    open(STDOUT, '>', "$prefix/logs/stdout.log") or die;
    open(STDERR, '>&', \*STDOUT) or die;
    exec($nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf',
         '-g', 'daemon off;') or exit 127;
}
my $srv = { pid => $pid, port => $port, prefix => $prefix };

sub stop_nginx {
    return unless $srv->{pid};
    kill 'QUIT', $srv->{pid};
    my $until = time + 30;
    while (time < $until) {
        last if waitpid($srv->{pid}, WNOHANG) == $srv->{pid};
        sleep 0.1;
    }
    if (kill 0, $srv->{pid}) {
        kill 'KILL', $srv->{pid};
        waitpid($srv->{pid}, 0);
    }
    $srv->{pid} = undef;
}
END { stop_nginx() if $srv && $srv->{pid} && $$ != 0 }

# ready: /health answers 200 (the engine started by nginx is up)
my ($status, $head, $body);
my $until = time + 120;
while (time < $until) {
    ($status, $head, $body) = http_get($srv, '/health');
    last if ($status // 0) == 200;
    die "nginx exited at start:\n" . main::slurp("$prefix/logs/stdout.log")
        . main::slurp("$prefix/logs/error.log")
        if waitpid($pid, WNOHANG) == $pid;
    sleep 0.2;
}
is($status, 200, 'make run config: /health is 200') or BAIL_OUT(
    "not ready: $body\n" . main::slurp("$prefix/logs/error.log"));

(undef, undef, $body) = http_get($srv, '/v1/models');
my $model_id = eval { decode_json($body)->{data}[0]{id} };
ok(defined $model_id, "the served model: " . ($model_id // 'none'));

my $prompts = "$prefix/prompts.txt";
open($fh, '>', $prompts) or die $!;
print $fh "Tell me story number $_ about a dog and a cat.\n" for 1 .. 64;
close $fh;

# One wave: returns loadgen's report.
sub wave {
    my ($n, $seconds) = @_;
    my $json = "$prefix/wave$n.json";
    my @cmd = ($loadgen, '--http', "127.0.0.1:$port",
               '--path', '/v1/chat/completions', '--prompts', $prompts,
               '--model', $model_id,
               '--concurrency', $conc, '--duration', $seconds,
               '--max-tokens', 32, '--expect-done', '--timeout', 120,
               '--json', $json);
    my $t0 = time;
    my $rc = system(@cmd) >> 8;
    note(sprintf "wave %d: %.1f s, loadgen exit %d", $n, time - $t0, $rc);
    ok($rc == 0 || $rc == 3, "wave $n: loadgen ran") or diag("@cmd");
    return decode_json(main::slurp($json));
}

# Every request ended with [DONE] or a well-formed error.
sub well_formed {
    my ($r, $n) = @_;
    ok($r->{requests} >= $conc, "wave $n: $r->{requests} requests");
    is($r->{completed} + $r->{errors}, $r->{requests},
       "wave $n: every request ended");
    my $kinds = 0;
    for my $e (@{ $r->{error_messages} }) {
        $kinds += $e->{count};
        like($e->{message},
             qr/^(?:HTTP [45]\d\d: \{"error":\{"message":.*"type":"[a-z_]+",(?#
                )"param":.*"code":.*\}\}|server error event: .+)/s,
             "wave $n: a well-formed error ($e->{count}x)");
    }
    is($kinds, $r->{errors}, "wave $n: every error is one of those");
    diag("wave $n: $r->{errors} errors: "
         . encode_json($r->{error_messages})) if $r->{errors};
    ok($r->{completed} >= 0.9 * $r->{requests},
       "wave $n: $r->{completed} streams ended with [DONE]");
    ok($r->{completion_tokens} > 0, "wave $n: tokens streamed "
       . "($r->{completion_tokens}, $r->{tokens_per_s} tok/s)");
}

sub workers_rss {
    my @w = nginx_worker_pids($srv);
    my $kb = 0;
    $kb += rss_kb($_) for @w;
    return ($kb, scalar @w);
}

my $r1 = wave(1, $secs);
well_formed($r1, 1);
sleep 1;
my ($rss1, $nw) = workers_rss();
ok($nw >= 1 && $rss1 > 0, "nginx workers: $nw, $rss1 kB after wave 1");

my $r2 = wave(2, $secs > 20 ? int($secs / 2) : $secs);
well_formed($r2, 2);
sleep 1;
my ($rss2) = workers_rss();
ok($rss2 <= $rss1 * 1.10 + 2048,
   "nginx workers' memory is flat: $rss1 kB, then $rss2 kB after wave 2");

# nothing left in flight, in the module's and the engine's metrics
($status, $head, $body) = http_get($srv, '/metrics');
is($status, 200, '/metrics');
my %m = map { /^(\S+) (\S+)$/ ? ($1, $2) : () } grep { !/^#/ }
        split /\n/, $body // '';
my $deadline = time + 10;
while (($m{'omni_engine_num_requests_running{stage="thinker"}'} // 1) != 0 && time < $deadline) {
    sleep 0.2;
    (undef, undef, $body) = http_get($srv, '/metrics');
    %m = map { /^(\S+) (\S+)$/ ? ($1, $2) : () } grep { !/^#/ }
         split /\n/, $body // '';
}
is($m{'omni_engine_num_requests_running{stage="thinker"}'}, 0, 'engine: nothing running');
is($m{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
   'engine: no KV block in use');

stop_nginx();
my @bad = grep { /\[(error|crit|alert|emerg)\]/ }
          split /\n/, main::slurp("$prefix/logs/error.log");
is(scalar(@bad), 0, 'error.log: nothing at error/crit/alert/emerg')
    or diag(join "\n", @bad[0 .. ($#bad < 19 ? $#bad : 19)]);

done_testing();

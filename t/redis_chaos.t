# The hiredis adapter under chaos: nginx (two workers, t/lib/OmniServer.pm)
# and the real engine answer a load that keeps 16 requests in flight
# (t/lib/HttpLoad.pm: chat and completions, streamed or not, one client in
# 8 leaving 0-50 ms after its request) through a requests and a tokens
# limit high enough never to refuse, failing open (and a location failing
# closed: 503 is an answer too), while Redis (t/lib/Redis.pm) is killed
# and restarted 100 times: SIGKILL and SHUTDOWN NOSAVE in turn, down for
# 20-100 ms; every other time the next kill waits until both workers are
# connected again, the others come at once (mid-handshake, mid-backoff).
#
# Then: every request got an answer (200, 429 or 503; none over 10 s, none
# without one); the workers are the same processes, and error.log has no
# [alert], [crit] or "exited on signal" (with worker_connections 64, a
# connection object lost at each reconnect would show as an [alert]);
# Redis sees exactly one client connection per worker (CLIENT LIST); the
# module's metrics say omni_nginx_redis_pending 0 and omni_nginx_redis_up
# 2; and the workers' open descriptors (/proc/PID/fd) are as many as
# before the chaos.
use strict;
use warnings;
use lib '.';
use t::lib::OmniServer;
use t::lib::Proc qw(wait_for);
use t::lib::Redis;
use t::lib::HttpLoad;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

my $WORKERS = 2;
my $KILLS = $ENV{OMNI_CHAOS_KILLS} // 100;

my $redis = t::lib::Redis->start;
my $addr = $redis->addr;
my $engine = main::serve_start(timeout => 60);

# nginx's freed memory is overwritten (glibc's MALLOC_PERTURB_, read by
# the nginx started below), so that memory used after it was freed shows
# as a worker that dies
$ENV{MALLOC_PERTURB_} //= 165;
my $pid0 = $$;
END { main::serve_stop($engine, 15) if $engine && $$ == $pid0 }
my $sock = $engine->{socket};

# few connections a worker: one the adapter did not give back at each
# reconnect would run them out ("worker_connections are not enough")
my $s = omni_server_start(name => 'redis_chaos', workers => $WORKERS,
    worker_connections => 64, socket => $sock,
    http => <<"HTTP", server => <<"SERVER");
    omni_redis $addr timeout=500ms connect_timeout=500ms;
    omni_limit_zone zone=rpm rate=1000000r/m;
    omni_limit_zone zone=tpm rate=100000000t/m;
    omni_limit rpm tpm;
HTTP
        location /closed/v1/ {
            omni_limit rpm tpm;
            omni_limit_fail closed;
            omni_pass unix:$sock;
        }
SERVER
my $log_file = "$s->{prefix}/logs/error.log";
my $model = main::models($engine)->{data}[0]{id};

sub up { return (nginx_metrics($s)->{omni_nginx_redis_up} // -1) == $WORKERS }

sub fds {
    my ($pid) = @_;
    opendir(my $d, "/proc/$pid/fd") or return -1;
    return scalar grep { /^\d+$/ } readdir $d;
}

sub settled {
    my $m = nginx_metrics($s);
    return ($m->{omni_nginx_redis_pending} // -1) == 0
           && ($m->{omni_nginx_redis_up} // -1) == $WORKERS;
}

my @reqs;
for my $i (1 .. 16) {
    my $stream = $i % 2 ? JSON::PP::true : JSON::PP::false;
    my $where = $i % 8 == 0 ? '/closed' : '';
    push @reqs, { port => $s->{port},
        path => "$where/v1/chat/completions",
        headers => { Authorization => "Bearer sk-chaos-$i" },
        body => encode_json({ model => $model, max_tokens => 8,
            stream => $stream,
            messages => [{ role => 'user', content => "Story $i" }] }) },
        { port => $s->{port}, path => "$where/v1/completions",
          headers => { Authorization => "Bearer sk-chaos-$i" },
          body => encode_json({ model => $model, max_tokens => 8,
              stream => $stream, prompt => "Once upon a time $i" }) };
}

ok(wait_for(10, \&up), 'both workers connected');
my @pids = sort(nginx_worker_pids($s));
is(scalar @pids, $WORKERS, "workers @pids");

# a warm-up, so that the descriptors counted are those of a worker that
# has served requests
my @warm = http_burst([@reqs[0 .. 7]], timeout => 30);
is(scalar(grep { $_->{status} == 200 } @warm), 8, 'warm-up answered')
    or diag(explain([map { "$_->{status} $_->{body}" } @warm]));
ok(wait_for(10, \&settled), 'settled after the warm-up');
my %fd0 = map { $_ => fds($_) } @pids;

my $load = http_load_start(requests => \@reqs, concurrency => 16,
                           timeout => 10, abort_every => 8);
my $t0 = time;
my $waited = 0;
for my $k (1 .. $KILLS) {
    if ($k % 2) {
        $redis->kill('KILL');
    } else {
        $redis->shutdown;
    }
    sleep 0.02 + rand(0.08);
    $redis->restart;
    if ($k % 2) {
        $waited += wait_for(10, \&up) ? 1 : 0;
    } else {
        sleep rand(0.05);
    }
}
my $chaos = time - $t0;
note(sprintf '%d kills in %.1f s', $KILLS, $chaos);
is($waited, $KILLS / 2, 'every other restart, both workers connected again');
sleep 0.5;
my $res = http_load_stop($load, 60);
my %st = %{ $res->{status} };
note('load: ' . join(', ', map { "$_ x $st{$_}" } sort keys %st));
ok($res->{n} > 1000, "the load ran: $res->{n} requests");
is_deeply($res->{over}, [], 'every request answered, none over 10 s')
    or diag(explain($res->{over}));
ok(!grep({ !/^(?:200|429|503|aborted)$/ } keys %st),
   'every answer a 200, 429 or 503');
ok(($st{200} // 0) > 500, 'most of them 200s');

ok(wait_for(10, \&settled), 'pending back to 0, both workers connected')
    or diag(explain(nginx_metrics($s)));
my $m = nginx_metrics($s);
is($m->{omni_nginx_redis_pending}, 0, 'omni_nginx_redis_pending 0');
is($m->{omni_nginx_redis_up}, $WORKERS, "omni_nginx_redis_up $WORKERS");
ok($m->{omni_nginx_redis_connects_total} >= $KILLS,
   "the workers connected again and again "
   . "($m->{omni_nginx_redis_connects_total} connections)");

my $clients = $redis->wait_clients($WORKERS, 10);
is(scalar @$clients, $WORKERS, "Redis sees $WORKERS clients")
    or diag(explain($clients));

is_deeply([sort(nginx_worker_pids($s))], \@pids, 'the same workers');
my %fd1 = map { $_ => fds($_) } @pids;
for my $pid (@pids) {
    ok($fd1{$pid} <= $fd0{$pid},
       "worker $pid: $fd1{$pid} descriptors open, $fd0{$pid} before");
}

my $log = main::slurp($log_file);
my @bad = grep { /\[(?:alert|crit|emerg)\]|exited on signal/ }
          split /\n/, $log;
is_deeply(\@bad, [], 'nothing at [crit] or worse, no worker died')
    or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
my @errors = grep { /\[error\]/ } split /\n/, $log;
my @other = grep { !/omni redis: / } @errors;
is_deeply(\@other, [], 'the [error] lines are the outages only')
    or diag(join "\n", @other[0 .. ($#other < 9 ? $#other : 9)]);
ok(@errors <= 2 * $KILLS * $WORKERS,
   scalar(@errors) . " outage lines for $KILLS kills and $WORKERS workers");

omni_server_stop($s);
main::serve_stop($engine, 15);
undef $engine;
done_testing();

# Redis failing under nginx (two workers, t/lib/OmniServer.pm) in front of
# the stand-in engine (t/lib/FakeEngine.pm), with a location that fails
# open and one that fails closed (omni_limit_fail):
#
#   - Redis killed (SIGKILL) while requests run: every request is answered
#     by the policy at once (open: 200 without x-ratelimit headers;
#     closed: 503 rate_limit_unavailable with Retry-After), none waits
#     (each under 3 s: "does not hang", not a measure of speed); restarted:
#     both workers connect again and the limits count again within
#     seconds; the outage is one [error] line per worker (the connection
#     lost; the reconnects refused after it are the same outage), and one
#     [notice] when Redis answers again;
#   - Redis slower than omni_redis timeout= (DEBUG SLEEP 5 with 1s): the
#     policy answers, a worker's first call times out, the calls after it
#     fail at once while that one is late (the metrics' timeout and busy
#     counts), and the limits count again once Redis is back;
#   - Redis asleep 13 s, past the 10 s a late call may wait: the workers
#     drop the connection and make it again, the policy answers
#     throughout, a client leaving while its request waits on Redis is no
#     matter, and in the end Redis sees one connection per worker;
#   - SCRIPT FLUSH: the script is sent again (NOSCRIPT, EVAL);
#   - a password: Redis restarted with requirepass while nginx has none
#     (NOAUTH), then nginx reloaded with a wrong one (WRONGPASS): one
#     [error] line naming it per worker, however many reconnects and
#     requests, and the policy; reloaded with the right one, limits again.
#
# Polls with deadlines throughout; nothing waits a fixed time to assert.
use strict;
use warnings;
use lib '.';
use t::lib::OmniServer;
use t::lib::Proc qw(wait_for);
use t::lib::FakeEngine;
use t::lib::Redis;
use t::lib::HttpLoad;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

my $WORKERS = 2;
my $HANG = 3;           # seconds: an answer slower than this "hangs"

my $redis = t::lib::Redis->start;

# nginx's freed memory is overwritten (glibc's MALLOC_PERTURB_, read by
# the nginx started below), so that memory used after it was freed shows
# as a worker that dies
$ENV{MALLOC_PERTURB_} //= 165;
my $sock = "$main::TMP/fake-engine.sock";
my $fake = fake_engine_start($sock);
my $addr = $redis->addr;

sub http_text {
    my ($password) = @_;
    my $pw = defined $password ? " password=$password" : '';
    return <<"HTTP";
    omni_redis $addr timeout=1s connect_timeout=1s$pw;
    omni_limit_zone zone=rph rate=3r/h;
HTTP
}

my $s = omni_server_start(name => 'redis_outage', socket => $sock,
    workers => $WORKERS, http => http_text(undef), server => <<"SERVER");
        location /open/v1/ {
            omni_limit rph;
            omni_pass unix:$sock;
        }
        location /closed/v1/ {
            omni_limit rph;
            omni_limit_fail closed;
            omni_pass unix:$sock;
        }
SERVER
my $log_file = "$s->{prefix}/logs/error.log";

my $keyn = 0;
sub chat {
    my ($where, $key) = @_;
    return { port => $s->{port}, path => "/$where/v1/chat/completions",
             headers => { Authorization => "Bearer $key" },
             body => encode_json({ model => 'fake-model',
                 messages => [{ role => 'user', content => 'hi' }] }) };
}

sub redis_up { return (nginx_metrics($s)->{omni_nginx_redis_up} // -1) == $_[0] }

# An answer by the policy: open 200 bare, closed 503 rate_limit_unavailable
# with Retry-After; undef when it is one, else what is wrong.
sub policy_wrong {
    my ($where, $a) = @_;
    return "no answer ($a->{error}) after $a->{elapsed} s" unless $a->{status};
    return "answered after $a->{elapsed} s" if $a->{elapsed} >= $HANG;
    my $h = $a->{headers};
    return "x-ratelimit headers" if grep { /^x-ratelimit/ } keys %$h;
    if ($where eq 'open') {
        return "$a->{status}: $a->{body}" unless $a->{status} == 200;
        return undef;
    }
    return "$a->{status}: $a->{body}" unless $a->{status} == 503;
    return "no Retry-After" unless ($h->{'retry-after'} // '') eq '1';
    my $e = $a->{json}{error} // {};
    return "error $a->{body}" unless ($e->{code} // '') eq
        'rate_limit_unavailable' && ($e->{type} // '') eq 'server_error';
    return undef;
}

# The limits count: a fresh key takes 3 requests, the 4th is a 429.
sub limits_count {
    my ($where, $what) = @_;
    my $key = 'sk-' . ++$keyn;
    my @codes = map { (http_burst([chat($where, $key)]))[0]{status} } 1 .. 4;
    is("@codes", '200 200 200 429', "$what: the limit counts ($where)");
}

# Waits until a request through $where carries the limit's headers.
sub wait_limits {
    my ($where) = @_;
    my $key = 'sk-probe-' . ++$keyn;
    return wait_for(10, sub {
        my ($a) = http_burst([chat($where, $key)], timeout => 5);
        return defined $a->{headers}{'x-ratelimit-limit-requests'};
    });
}

# [error] lines about Redis since $from in the log, by worker pid.
sub redis_errors {
    my ($from, $re) = @_;
    my $log = substr(main::slurp($log_file), $from);
    my %by;
    for (split /\n/, $log) {
        my ($pid) = /\[error\] (\d+)#\d+: omni redis: / or next;
        next if $re && !/$re/;
        push @{ $by{$pid} }, $_;
    }
    return \%by;
}

sub log_size { return -s $log_file // 0 }

sub conns_received {
    my $info = $redis->try_cmd('INFO', 'stats') // '';
    return $info =~ /^total_connections_received:(\d+)/m ? $1 : 0;
}

ok(wait_for(10, sub { redis_up($WORKERS) }), 'both workers connected');
limits_count($_, 'Redis up') for qw(open closed);

# --- killed under load, then back --------------------------------------

my @mix = map { chat($_ % 2 ? 'open' : 'closed', "sk-load-$_") } 1 .. 8;
my $from = log_size();
my $load = http_load_start(requests => \@mix, concurrency => 8,
                           timeout => 5);
sleep 0.3;
$redis->kill('KILL');
ok(wait_for(10, sub { redis_up(0) }), 'killed: both workers see it');
my @a = http_burst([map { chat($_ % 2 ? 'open' : 'closed', "sk-down-$_") }
                    1 .. 20], timeout => 30);
my @wrong = grep { defined } map { my $w = $_ % 2 ? 'open' : 'closed';
    my $e = policy_wrong($w, $a[$_ - 1]); $e && "$w: $e" } 1 .. 20;
is_deeply(\@wrong, [], '20 requests at once while it is down: the policy, '
                       . 'at once') or diag(join "\n", @wrong);
my $m = nginx_metrics($s);
ok($m->{'omni_nginx_limit_fail_total{policy="open"}'} >= 10
   && $m->{'omni_nginx_limit_fail_total{policy="closed"}'} >= 10,
   'omni_nginx_limit_fail_total counts them');
$redis->restart;
ok(wait_for(10, sub { redis_up($WORKERS) }),
   'restarted: both workers connected again');
my $res = http_load_stop($load);
is_deeply($res->{over}, [], "the load meanwhile: $res->{n} requests, each "
          . "answered within 5 s") or diag(explain($res));
my @codes = sort keys %{ $res->{status} };
ok(!grep({ !/^(?:200|429|503)$/ } @codes),
   'the load got 200, 429 or 503 only (' . join(', ', map {
       "$_ x $res->{status}{$_}" } @codes) . ')');
ok(wait_limits($_), "limits counted again ($_)") for qw(open closed);
limits_count($_, 'Redis back') for qw(open closed);

my $errs = redis_errors($from);
is(scalar keys %$errs, $WORKERS, 'the outage logged by each worker');
for my $pid (sort keys %$errs) {
    is(scalar @{ $errs->{$pid} }, 1, "worker $pid: once")
        or diag(join "\n", @{ $errs->{$pid} });
    like($errs->{$pid}[0], qr/omni redis: \Q$addr\E: the connection was lost: .*; until it answers again, omni_limit_fail decides limits/,
         "worker $pid: the connection lost");
}
my @back = substr(main::slurp($log_file), $from)
           =~ /\[notice\] \d+#\d+: (omni redis: \S+ answers again after \d+ ms; \d+ calls failed meanwhile)/g;
is(scalar @back, $WORKERS, 'its end logged by each worker, at notice')
    or diag(join "\n", @back);

# --- slow: DEBUG SLEEP past timeout= -------------------------------------

$m = nginx_metrics($s);
my %before = map { $_ => $m->{"omni_nginx_redis_errors_total{kind=\"$_\"}"} }
             qw(timeout busy);
$from = log_size();
$redis->sleep_bg(5);
my $t0 = time;
ok(wait_for(5, sub { !$redis->responsive(0.1) }), 'Redis sleeps 5 s');
my @slow;
while (time - $t0 < 3) {
    my $where = @slow % 2 ? 'open' : 'closed';
    my ($a) = http_burst([chat($where, 'sk-slow-' . @slow)], timeout => 30);
    push @slow, [$where, $a];
}
@wrong = grep { defined } map { policy_wrong(@$_) } @slow;
is_deeply(\@wrong, [], scalar(@slow) . ' requests while Redis sleeps: the '
                       . 'policy, none waits') or diag(join "\n", @wrong);
is($redis->sleep_wait(10), 'OK', 'the sleep ended');
$m = nginx_metrics($s);
my $timeouts = $m->{'omni_nginx_redis_errors_total{kind="timeout"}'}
               - $before{timeout};
my $busy = $m->{'omni_nginx_redis_errors_total{kind="busy"}'}
           - $before{busy};
ok($timeouts >= 1 && $timeouts <= $WORKERS,
   "one call timed out per worker at most ($timeouts)");
ok($busy >= 1 && $busy + $timeouts == @slow,
   "the others failed at once, busy ($busy)");
ok(wait_limits($_), "limits counted again after the sleep ($_)")
    for qw(open closed);
$errs = redis_errors($from);
ok(scalar keys %$errs >= 1, 'the slowness logged');
for my $pid (sort keys %$errs) {
    is(scalar @{ $errs->{$pid} }, 1, "worker $pid: the slowness once")
        or diag(join "\n", @{ $errs->{$pid} });
    like($errs->{$pid}[0], qr/no answer within 1000 ms \(timeout\)/,
         "worker $pid: says the timeout");
}

# --- asleep past the stall: the connection is made again -----------------

# DEBUG SLEEP 13: a worker's late call stays unanswered for 10 s, so the
# worker drops the connection and connects again (its handshake then
# waits on Redis too, connect_timeout drops it, and so on until Redis
# wakes); a client that leaves while its request waits on Redis; the
# policy throughout; then one connection per worker, nothing pending.
$m = nginx_metrics($s);
my $connects = $m->{omni_nginx_redis_connects_total};
$from = log_size();
$redis->sleep_bg(13);
$t0 = time;
ok(wait_for(5, sub { !$redis->responsive(0.1) }), 'Redis sleeps 13 s');
{
    my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$s->{port}");
    my $r = http_request(chat('closed', 'sk-leaves'));
    print $c $r;
    sleep 0.05;
    close $c;
}
@slow = ();
while (time - $t0 < 11) {
    my $where = @slow % 2 ? 'open' : 'closed';
    my ($a) = http_burst([chat($where, 'sk-stall-' . @slow)], timeout => 30);
    push @slow, [$where, $a];
    sleep 0.1;
}
@wrong = grep { defined } map { policy_wrong(@$_) } @slow;
is_deeply(\@wrong, [], scalar(@slow) . ' requests in 11 s of sleep: the '
                       . 'policy, none waits') or diag(join "\n", @wrong);
is($redis->sleep_wait(10), 'OK', 'the sleep ended');
ok(wait_for(10, sub { redis_up($WORKERS) }), 'both workers connected');
ok(wait_for(10, sub { nginx_metrics($s)->{omni_nginx_redis_pending} == 0 }),
   'nothing pending');
ok(wait_limits($_), "limits counted again after the stall ($_)")
    for qw(open closed);
my $clients = $redis->wait_clients($WORKERS, 10);
is(scalar @$clients, $WORKERS, "Redis sees $WORKERS clients")
    or diag(explain($clients));
$errs = redis_errors($from);
ok(scalar keys %$errs >= 1, 'the slowness logged');
for my $pid (sort keys %$errs) {
    is(scalar @{ $errs->{$pid} }, 1, "worker $pid: once, stall and "
                                     . "reconnects included")
        or diag(join "\n", @{ $errs->{$pid} });
}
# a worker whose first call came late enough in the sleep is answered
# before its 10 s are up; the first call's is not
my $again = nginx_metrics($s)->{omni_nginx_redis_connects_total} - $connects;
ok($again >= 1 && $again <= scalar keys %$errs,
   "a worker that waited on Redis 10 s connected again ($again)");

# --- a script Redis lost: NOSCRIPT, sent again as EVAL ---------------------

$from = log_size();
is($redis->cmd('SCRIPT', 'FLUSH'), 'OK', 'SCRIPT FLUSH');
limits_count($_, 'after SCRIPT FLUSH') for qw(open closed);
like(substr(main::slurp($log_file), $from),
     qr/\[notice\] .*omni redis: \Q$addr\E does not have the script omni_limit, sending it again/,
     'NOSCRIPT: sent again, at notice');
is_deeply(redis_errors($from), {}, 'NOSCRIPT: no [error]');

# --- a password ------------------------------------------------------------

sub reload_with {
    my ($password) = @_;
    my $c = main::slurp("$s->{prefix}/conf/nginx.conf");
    $c =~ s/\n    omni_redis [^\n]*\n    omni_limit_zone [^\n]*\n/\n/ or die;
    $c =~ s/^http \{\n/"http {\n" . http_text($password)/me or die;
    open(my $fh, '>', "$s->{prefix}/conf/nginx.conf") or die $!;
    print $fh $c;
    close $fh;
    omni_server_reload($s);
}

sub policy_while {
    my ($what) = @_;
    my @a = http_burst([map { chat($_ % 2 ? 'open' : 'closed', "sk-pw-$_") }
                        1 .. 10], timeout => 30);
    my @wrong = grep { defined } map { policy_wrong($_ % 2 ? 'open'
                                       : 'closed', $a[$_ - 1]) } 1 .. 10;
    is_deeply(\@wrong, [], "$what: the policy") or diag(join "\n", @wrong);
}

$from = log_size();
$redis->{password} = 's3cret';
$redis->restart;
ok(wait_for(10, sub { scalar keys %{ redis_errors($from, qr/NOAUTH/) }
                      == $WORKERS }),
   'requirepass, nginx without a password: each worker says NOAUTH');
policy_while('NOAUTH');
# the workers connect again (a second apart at most), are refused again:
# still one line each
my $conns = conns_received();
ok(wait_for(10, sub { conns_received() >= $conns + 2 * $WORKERS }),
   'NOAUTH: the workers keep connecting');
policy_while('NOAUTH, later');
$errs = redis_errors($from);
for my $pid (sort keys %$errs) {
    is(scalar @{ $errs->{$pid} }, 2, "worker $pid: the kill and NOAUTH, "
                                     . "once each")
        or diag(join "\n", @{ $errs->{$pid} });
    like($errs->{$pid}[-1], qr/omni redis: \Q$addr\E: .* was refused: NOAUTH Authentication required/,
         "worker $pid: names NOAUTH");
}

$from = log_size();
reload_with('wrong');
ok(wait_for(10, sub { scalar keys %{ redis_errors($from, qr/WRONGPASS/) }
                      == $WORKERS }),
   'a wrong password: each new worker says WRONGPASS');
policy_while('WRONGPASS');
$errs = redis_errors($from);
for my $pid (sort keys %$errs) {
    is(scalar @{ $errs->{$pid} }, 1, "worker $pid: once")
        or diag(join "\n", @{ $errs->{$pid} });
    like($errs->{$pid}[0], qr/omni redis: \Q$addr\E: AUTH was refused: WRONGPASS/,
         "worker $pid: names AUTH and WRONGPASS");
}

reload_with('s3cret');
ok(wait_for(10, sub { redis_up($WORKERS) }),
   'the right password: both workers connected');
limits_count($_, 'the right password') for qw(open closed);

my @bad = grep { /\[(?:crit|alert|emerg)\]|exited on signal/ }
          split /\n/, main::slurp($log_file);
is_deeply(\@bad, [], 'nothing at [crit] or worse, no worker died');

omni_server_stop($s);
done_testing();

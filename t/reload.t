# Reloads that replace the engine (omni_engine), under load, against nginx
# with the sidecar as `make run` runs it: one nginx from a private prefix
# under build/t/reload/, the engine started by nginx's cache manager. As
# root, nginx runs its workers (and so the engine) as `nobody`, which also
# checks who owns what (README, "Access").
#
#   1. A reload that changes the engine's command line (another model file,
#      another kernel set) while build/bench/loadgen keeps 32 streams in
#      flight and a probe loop sends completions and health checks: every
#      stream ends with [DONE], no probe gets a 5xx or a failed connection,
#      error.log has no [crit] (no failed connect()) and nothing at error;
#      the new engine takes over (its lock, its kernel set in /metrics), the
#      old one drained streams and exited with its stage.
#   2. A plain reload keeps the engine and its pid.
#   3. A reload to an engine that cannot start (a missing model, a 3 s
#      omni_engine_start_timeout): probes stay 200, error.log says why at
#      error, the new engine and its stage are gone, the old one serves.
#   4. A reload while a replacement is still starting: the one started for
#      the superseded command line is stopped, the newest takes over.
#   5. kill -9 of the live engine while its replacement starts (an engine
#      that waits 2 s before exec): the replacement takes over, and no
#      second engine is started meanwhile.
#   6. nginx stopped (QUIT) during a replacement: no engine or stage is
#      left.
use strict;
use warnings;
use lib '.';
use Cwd qw(getcwd);
use File::Copy qw(copy);
use File::Path qw(make_path remove_tree);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);
use t::lib::OmniServer qw(free_port http_get);
use t::lib::Proc qw(lock_holder alive children wait_for);
our ($ENGINE, $MODEL, $KERNEL_SET);

my $loadgen = 'build/bench/loadgen';
die "$loadgen is not built (make build/bench/loadgen)\n" unless -x $loadgen;
my $root = getcwd();
my $prefix = "$root/build/t/reload";
my $state = "$prefix/omni";
my $sock = "$state/engine.sock";
my $port = free_port();
my $engine = $ENGINE =~ m{^/} ? $ENGINE : "$root/$ENGINE";
my $model = $MODEL =~ m{^/} ? $MODEL : "$root/$MODEL";
(my $model_id = $model) =~ s{.*/|\.gguf$}{}g;
my ($user, $group) = $> == 0
    ? ('nobody', scalar getgrgid((getpwnam('nobody'))[3])) : ();
my $pid0 = $$;

remove_tree($prefix);
make_path(map { "$prefix/$_" } qw(conf logs temp));
chmod 0755, $prefix;

# the same model under another name: a model swap
my $model2 = "$prefix/swapped.gguf";
copy($model, $model2) or die "copying the model: $!\n";
chmod 0644, $model2;

# an engine that takes 2 s to start: bash re-execs the engine under its
# own name, so that its /proc/PID/cmdline is the configured command line
my $slow = "$prefix/slow-engine";
open(my $fh, '>', $slow) or die $!;
print $fh "#!/bin/bash\nsleep 2\nexec -a \"\$0\" $engine \"\$\@\"\n";
close $fh;
chmod 0755, $slow;

sub conf {
    my (%o) = @_;
    my $bin = $o{binary} // $engine;
    my $args = $o{args} // '';
    my $timeout = $o{start_timeout} // '30s';
    my $u = $user ? "user $user $group;" : '';
    return <<"CONF";
load_module $root/build/ngx_omni_module.so;
$u
master_process on;
worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;

omni_engine $bin serve --model $o{model} --model-name $model_id
            --socket $sock --threads 1 $args;
omni_engine_state_dir omni;
omni_engine_check_interval 200ms;
omni_engine_start_timeout $timeout;

events {
    worker_connections 1024;
}

http {
    access_log off;
    client_body_temp_path temp/body;
    proxy_temp_path       temp/proxy;
    fastcgi_temp_path     temp/fastcgi;
    uwsgi_temp_path       temp/uwsgi;
    scgi_temp_path        temp/scgi;

    server {
        listen 127.0.0.1:$port;
        location /v1/ {
            omni_pass unix:$sock;
        }
        location = /health {
            omni_health;
            omni_pass unix:$sock;
        }
        location = /metrics {
            omni_metrics;
            omni_pass unix:$sock;
        }
    }
}
CONF
}

sub write_conf {
    open(my $out, '>', "$prefix/conf/nginx.conf") or die $!;
    print $out conf(@_);
    close $out;
}

# --- helpers ----------------------------------------------------------------

sub holder { return lock_holder(shift // "$state/engine.lock") }

my $log_from = 0;
sub error_log { return slurp("$prefix/logs/error.log") }
sub new_log { return substr(error_log(), $log_from) }      # since mark_log
sub mark_log { $log_from = length(error_log()) }

# Every omni-engine process (frontends and stages) of this prefix.
sub engine_procs {
    my @p;
    for my $dir (glob '/proc/[0-9]*') {
        my $cmd = slurp("$dir/cmdline");
        (my $pid = $dir) =~ s{.*/}{};
        push @p, $pid if index($cmd, $sock) >= 0 && alive($pid);
    }
    return @p;
}

sub master_pid { my $p = slurp("$prefix/logs/nginx.pid"); chomp $p; $p }

sub reload {
    kill 'HUP', master_pid();
}

sub nginx_health { my ($s) = http_get({ port => $port }, '/health'); $s // 0 }

sub kernels {
    my (undef, undef, $body) = http_get({ port => $port }, '/metrics');
    return ($body // '') =~ /omni_engine_info\{[^}]*kernels="(\w+)"/ ? $1
                                                                       : '';
}

my $completion = encode_json({ model => $model_id, max_tokens => 4,
                               prompt => 'Once upon a time',
                               temperature => 0 });

# A blocking HTTP/1.1 exchange; returns the status, 0 when it failed.
sub http {
    my ($method, $path, $body) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => 10) or return 0;
    my $req = "$method $path HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              . "Connection: close\r\n";
    $req .= "Content-Type: application/json\r\nContent-Length: "
            . length($body) . "\r\n" if defined $body;
    print $c "$req\r\n" . ($body // '');
    local $/;
    my $resp = <$c> // '';
    close $c;
    return $resp =~ m{^HTTP/1\.\d (\d+)} ? $1 : 0;
}

# A process sending probes (a completion, then /health, alternately) until
# it gets SIGTERM; one line per probe in $out: "time method path status".
sub probes_start {
    my $out = shift;
    my $pid = fork() // die "fork: $!";
    return $pid if $pid;
    open(my $o, '>', $out) or POSIX::_exit(1);
    $o->autoflush(1);
    my $stop = 0;
    $SIG{TERM} = sub { $stop = 1 };
    for (my $i = 0; !$stop; $i++) {
        my @r = $i % 2 ? ('GET', '/health') : ('POST', '/v1/completions',
                                                $completion);
        my $t = time;
        my $st = eval {
            local $SIG{ALRM} = sub { die "timeout\n" };
            alarm 30;
            my $s = http(@r);
            alarm 0;
            $s;
        } // 0;
        printf $o "%.3f %s %s %d\n", $t, $r[0], $r[1], $st;
        sleep 0.01;
    }
    POSIX::_exit(0);
}

# Stops the probe process; returns its lines as [time, method, path, status].
sub probes_stop {
    my ($pid, $out) = @_;
    kill 'TERM', $pid;
    waitpid($pid, 0);
    return map { [split ' '] } split /\n/, slurp($out);
}

sub probes_ok {
    my ($name, @p) = @_;
    my @bad = grep { $_->[3] != 200 } @p;
    ok(@p >= 10, "$name: " . scalar(@p) . " probes");
    is(scalar(@bad), 0, "$name: every probe got 200")
        or diag(join "\n", map { "@$_" } @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
}

sub clean_log {
    my ($name, %o) = @_;
    my $log = new_log();
    my @bad = grep { /\[(crit|alert|emerg)\]/
                     || (!$o{errors_ok} && /\[error\]/) }
              split /\n/, $log;
    is(scalar(@bad), 0, "$name: error.log has nothing at "
       . ($o{errors_ok} ? '' : 'error, ') . 'crit, alert, emerg')
        or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
    unlike($log, qr/connect\(\) to unix:\S+ failed/,
           "$name: no failed connect() to the engine");
}

# --- start ------------------------------------------------------------------

my $nginx = $t::lib::OmniServer::NGINX;
my $master;
sub stop_nginx {
    return unless $master;
    kill 'QUIT', $master;
    my $until = time + 30;
    until (waitpid($master, WNOHANG) == $master || time > $until) {
        sleep 0.05;
    }
    if (kill 0, $master) {
        kill 'KILL', $master;
        waitpid($master, 0);
    }
    $master = undef;
}
END {
    if ($$ == $pid0) {
        stop_nginx();
        kill 'KILL', engine_procs();
    }
}

write_conf(model => $model);
$master = fork() // die "fork: $!";
if ($master == 0) {
    open(STDOUT, '>', "$prefix/logs/stdout.log") or die;
    open(STDERR, '>&', \*STDOUT) or die;
    umask 027;                          # as `make run` starts it
    exec($nginx, '-p', "$prefix/", '-c', 'conf/nginx.conf',
         '-g', 'daemon off;') or POSIX::_exit(127);
}
ok(wait_for(60, sub { nginx_health() == 200
                      || waitpid($master, WNOHANG) == $master }),
   'nginx started; the engine it started is ready')
    or BAIL_OUT("not ready:\n" . slurp("$prefix/logs/stdout.log")
                . error_log() . slurp("$state/engine.log"));
BAIL_OUT("nginx exited:\n" . slurp("$prefix/logs/stdout.log"))
    unless kill 0, $master;
my $live = holder();
ok($live && alive($live), "engine A ($live) holds the lock");

# --- access: who owns the engine's files, and their modes -------------------

{
    my @st = stat($state);
    is($st[2] & 07777, 0700, 'state dir: mode 0700');
    my @so = stat($sock);
    is($so[2] & 0777, 0660, 'socket: mode 0660');
    my @lg = stat("$state/engine.log");
    is($lg[2] & 0777, 0640, 'engine.log: mode 0640');
    my @lk = stat("$state/engine.lock");
    is($lk[2] & 0777, 0600, 'engine.lock: mode 0600');
    my @cm = stat("$state/engine.cmd");
    is($cm[2] & 0777, 0600, 'engine.cmd: mode 0600');
    SKIP: {
        skip 'not root: nginx and the engine run as the invoking user', 5
            unless $user;
        my $uid = getpwnam($user);
        my ($euid) = slurp("/proc/$live/status") =~ /^Uid:\s+\d+\s+(\d+)/m;
        is($euid, $uid, "the engine runs as $user");
        is($st[4], $uid, "state dir owned by $user");
        is($so[4], $uid, "socket owned by $user");
        is($lg[4], $uid, "engine.log owned by $user");
        is($cm[4], $uid, "engine.cmd owned by $user (the master wrote it)");
    }
}

my $prompts = "$prefix/prompts.txt";
open($fh, '>', $prompts) or die $!;
print $fh "Tell me story number $_ about a dog and a cat.\n" for 1 .. 64;
close $fh;

# --- 1. a changed command line under load -----------------------------------

{
    my $name = 'swap under load';
    my @a_stage = children($live);
    is(kernels(), $KERNEL_SET, "$name: A serves with the kernels auto "
       . "picks here ($KERNEL_SET)");
    mark_log();
    # the load must outlast B's start-up (four stages, the listener's
    # models among them: seconds on a loaded 2-core machine)
    my $lg = fork() // die;
    if ($lg == 0) {
        open(STDOUT, '>', "$prefix/loadgen.out") or die;
        open(STDERR, '>&', \*STDOUT) or die;
        exec($loadgen, '--http', "127.0.0.1:$port", '--path',
             '/v1/completions', '--prompts', $prompts, '--model', $model_id,
             '--concurrency', 32, '--duration', 12, '--max-tokens', 200,
             '--ignore-eos', '--expect-done', '--timeout', 120,
             '--json', "$prefix/loadgen.json") or POSIX::_exit(127);
    }
    my $pr = probes_start("$prefix/probes1.txt");
    sleep 2;
    write_conf(model => $model2, args => '--isa ref');
    reload();
    my $nb = wait_for(30, sub { my $h = holder();
                                $h && $h != $live ? $h : 0 });
    ok($nb, "$name: engine B ($nb) took the lock");
    ok(wait_for(30, sub { !alive($live) && !grep { alive($_) } @a_stage }),
       "$name: A and its stage exited");
    ok(wait_for(10, sub { new_log() =~ /\(pid $nb\) took the place of (?#
                          )pid $live/ }),
       "$name: the cache manager saw B take A's place");
    waitpid($lg, 0);
    my $rc = $? >> 8;
    my @p = probes_stop($pr, "$prefix/probes1.txt");
    is($rc, 0, "$name: loadgen saw no error")
        or diag(slurp("$prefix/loadgen.out"));
    my $r = eval { decode_json(slurp("$prefix/loadgen.json")) } // {};
    ok(($r->{completed} // 0) >= 32,
       "$name: $r->{completed} streams ended with [DONE]");
    is($r->{errors}, 0, "$name: no stream failed")
        or diag(encode_json($r->{error_messages} // []));
    probes_ok($name, @p);
    my ($drained) = slurp("$state/engine.log")
                    =~ /Terminated: draining (\d+) requests/;
    ok(($drained // 0) > 0, "$name: A was streaming when B took over "
       . "(it drained " . ($drained // 'no') . " requests)");
    is(kernels(), 'ref', "$name: /metrics through nginx reaches B");
    like(slurp("/proc/$nb/cmdline"), qr/\Q$model2\E/, "$name: B runs the "
         . "swapped model");
    is(nginx_health(), 200, "$name: health 200");
    ok(!-e "$sock.next", "$name: no private socket left");
    clean_log($name);
    $live = $nb;
}

# --- 2. a plain reload keeps the engine -------------------------------------

{
    my $name = 'plain reload';
    mark_log();
    reload();
    ok(wait_for(15, sub { new_log() =~ /\(pid $live\) already running, (?#
                          )kept/ }),
       "$name: the master kept it");
    sleep 1;                            # a few cache manager checks
    is(holder(), $live, "$name: same pid ($live)");
    unlike(new_log(), qr/omni engine started/, "$name: none started");
    clean_log($name);
}

# --- 3. a new engine that cannot start --------------------------------------

{
    my $name = 'missing model';
    mark_log();
    my $pr = probes_start("$prefix/probes3.txt");
    write_conf(model => "$prefix/missing.gguf", start_timeout => '3s');
    reload();
    my ($c) = wait_for(15, sub { new_log() =~ /started \(pid (\d+)\) beside/
                                 ? $1 : 0 });
    ok($c, "$name: engine C ($c) started beside A ($live)");
    my @c_procs = ($c, children($c));
    ok(wait_for(30, sub { new_log() =~ /\[error\].*\(pid $c\) was not ready (?#
                          )within 3000 ms, stopping it; pid $live keeps (?#
                          )serving; engine\.log ends with ".*missing\.gguf/ }),
       "$name: error.log says why")
        or diag(new_log());
    ok(wait_for(20, sub { !grep { alive($_) } @c_procs }),
       "$name: C and its stage are gone (@c_procs)");
    my @p = probes_stop($pr, "$prefix/probes3.txt");
    probes_ok($name, @p);
    is(holder(), $live, "$name: A still holds the lock");
    is(nginx_health(), 200, "$name: health 200");
    is(http('POST', '/v1/completions', $completion), 200,
       "$name: A serves");
    sleep 1;
    unlike(substr(new_log(), index(new_log(), 'stopping it')),
           qr/omni engine started/, "$name: not retried before a reload");
    is_deeply([sort { $a <=> $b } engine_procs()],
              [sort { $a <=> $b } ($live, children($live))],
              "$name: no other engine process");
    ok(!-e "$sock.next", "$name: no private socket left");
    clean_log($name, errors_ok => 1);
}

# --- 4. a reload while a replacement starts ---------------------------------

{
    my $name = 'reload during a replacement';
    mark_log();
    my $pr = probes_start("$prefix/probes4.txt");
    write_conf(model => "$prefix/missing.gguf", start_timeout => '60s');
    reload();
    my ($c) = wait_for(15, sub { new_log() =~ /started \(pid (\d+)\) beside/
                                 ? $1 : 0 });
    ok($c, "$name: engine C ($c) starting (it never gets ready)");
    ok(wait_for(10, sub { holder("$state/engine.lock.next") == $c }),
       "$name: C holds engine.lock.next");
    my @c_procs = ($c, children($c));
    write_conf(model => $model, args => '--max-queue 512');
    reload();
    ok(wait_for(15, sub { new_log() =~ /\(pid $c\) was started for another (?#
                          )command line, stopping it/ }),
       "$name: C is stopped");
    my $d = wait_for(30, sub { my $h = holder(); $h != $live ? $h : 0 });
    ok($d && $d != $c, "$name: engine D ($d) took over");
    ok(wait_for(30, sub { !grep { alive($_) } @c_procs, $live }),
       "$name: A, C and C's stage are gone");
    my @p = probes_stop($pr, "$prefix/probes4.txt");
    probes_ok($name, @p);
    is(kernels(), $KERNEL_SET, "$name: D serves");
    clean_log($name);
    $live = $d;
}

# --- 5. kill -9 of the live engine during a replacement ---------------------

{
    my $name = 'kill -9 during a replacement';
    mark_log();
    my @a_procs = ($live, children($live));
    write_conf(binary => $slow, model => $model);
    reload();
    my ($w) = wait_for(15, sub { new_log() =~ /started \(pid (\d+)\) beside/
                                 ? $1 : 0 });
    ok($w, "$name: engine W ($w) starting, slowly");
    kill 'KILL', $live;
    ok(wait_for(30, sub { holder() == $w }), "$name: W took the lock");
    ok(wait_for(30, sub { nginx_health() == 200 }), "$name: health 200 again");
    ok(wait_for(10, sub { new_log() =~ /\(pid $w\) took the place of (?#
                          )pid $live/ }),
       "$name: the cache manager saw it");
    unlike(new_log(), qr/respawning|not running, starting it/,
           "$name: no other engine was started meanwhile");
    ok(wait_for(10, sub { !grep { alive($_) } @a_procs }),
       "$name: A's stage exited too");
    is_deeply([sort { $a <=> $b } engine_procs()],
              [sort { $a <=> $b } ($w, children($w))],
              "$name: one engine runs");
    is(http('POST', '/v1/completions', $completion), 200, "$name: W serves");
    $live = $w;
}

# --- 6. nginx stops during a replacement ------------------------------------

{
    my $name = 'stop during a replacement';
    mark_log();
    write_conf(model => "$prefix/missing.gguf", start_timeout => '60s');
    reload();
    my ($c) = wait_for(15, sub { new_log() =~ /started \(pid (\d+)\) beside/
                                 ? $1 : 0 });
    ok($c, "$name: engine C ($c) starting");
    ok(wait_for(10, sub { holder("$state/engine.lock.next") == $c }),
       "$name: C holds engine.lock.next");
    my @procs = engine_procs();
    ok(@procs >= 3, "$name: engine processes: @procs");
    stop_nginx();
    ok(wait_for(20, sub { !grep { alive($_) } @procs }),
       "$name: none is left after nginx exits")
        or diag(`ps -o pid,stat,cmd -p @procs`);
    like(new_log(), qr/stopping omni engine \(pid $live\)/,
         "$name: the master stopped A");
    like(new_log(), qr/stopping omni engine \(pid $c\)/,
         "$name: and C");
}

done_testing();

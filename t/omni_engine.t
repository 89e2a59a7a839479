# omni_engine: nginx's master runs the engine as a sidecar. With
# master_process on, each block gets its own nginx (Test::Nginx restarts it
# with QUIT between blocks); the engine's pid is read from its lock file
# with F_GETLK, as the module does. Covered: start and health, a reload
# keeping the engine, a reload with a new command line replacing it,
# kill -9 of the engine (respawned, requests work again), a killed master
# (the next nginx adopts the engine), `nginx -t` (starts none), a command
# line that cannot start (nginx keeps serving), the modes of the state
# directory, socket, lock and log (a reload narrows a state directory open
# to others; a restarted engine narrows its log); after the blocks, nginx
# stopped with QUIT and with TERM leaves no engine process behind.
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }       # the module starts ours
use t::lib::Omni ();                        # its environment, --- check
use Test::Nginx::Socket 'no_plan';
use Cwd qw(abs_path);
use t::lib::Proc qw(lock_holder alive children wait_for);
use Time::HiRes qw(time sleep);
our ($ENGINE, $MODEL);

master_on();
no_shuffle();
repeat_each(1);

our $State = "$ENV{TEST_NGINX_SERVROOT}/logs/omni";
our $Sock = "$State/engine.sock";
our @Gone;              # engines of nginx instances stopped since

$ENV{TEST_NGINX_OMNI_ENGINE} = abs_path($ENGINE);
$ENV{TEST_NGINX_OMNI_MODEL_PATH} = abs_path($MODEL);
$ENV{TEST_NGINX_OMNI_STATE} = $State;

# logs/ is emptied by Test::Nginx between blocks, when no engine runs.
our $Main = <<'CONF';
omni_engine $TEST_NGINX_OMNI_ENGINE serve
            --model $TEST_NGINX_OMNI_MODEL_PATH
            --socket $TEST_NGINX_OMNI_STATE/engine.sock --threads 1;
omni_engine_state_dir $TEST_NGINX_OMNI_STATE;
omni_engine_check_interval 200ms;
CONF

our $Config = <<'CONF';
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_STATE/engine.sock;
    }
    location = /health {
        omni_health;
        omni_pass unix:$TEST_NGINX_OMNI_STATE/engine.sock;
    }
CONF

our $Completion = "POST /v1/completions\n" . encode_json({
    model => $ENV{TEST_NGINX_OMNI_MODEL}, prompt => 'Once upon a time',
    max_tokens => 4, temperature => 0 });

# The pid holding the engine's lock, 0 if none.
sub holder { return lock_holder(shift // "$State/engine.lock") }

# Waits for an engine whose health is 200; returns its pid.
sub ready {
    my $pid = wait_for(30, sub { holder() });
    wait_health({ socket => $Sock }, 200, 30) or return 0;
    return $pid;
}

sub master_pid { return Test::Nginx::Util::get_pid_from_pidfile('') }

sub error_log { return slurp("$ENV{TEST_NGINX_SERVROOT}/logs/error.log") }

# The engines of stopped nginx instances (QUIT between blocks) are gone.
sub none_left {
    my $name = shift;
    my @left = grep { alive($_) } @Gone;
    ok(!@left, "$name: no engine left by the nginx before (@Gone)")
        or diag(`ps -o pid,stat,cmd -p @left`);
    @Gone = ();
}

add_block_preprocessor(sub {
    my $block = shift;
    $block->set_value('main_config', $Main)
        unless defined $block->main_config;
    $block->set_value('config', $Config) unless defined $block->config;
});

run_tests();

# Stopping nginx with TERM (the blocks stopped it with QUIT) stops the
# engine and its stage too.
{
    my $master = master_pid();
    my $pid = holder();
    ok($pid && alive($pid), "TERM: an engine runs ($pid)");
    my @stage = children($pid);
    kill 'TERM', $master;
    ok(wait_for(20, sub { !alive($master) }), 'TERM: nginx exits');
    ok(wait_for(10, sub { !alive($pid) && !grep { alive($_) } @stage }),
       'TERM: no engine or stage process is left');
    like(error_log(), qr/stopping omni engine \(pid $pid\)/,
         'TERM: the master stopped it');
}

__DATA__

=== TEST 1: nginx starts the engine; health answers 200 once it is ready
--- init
my $pid = main::ready();
Test::More::ok($pid, "an engine runs ($pid)");
Test::More::ok(-S $main::Sock, 'it serves on the socket');
Test::More::is((stat $main::State)[2] & 07777, 0700, 'state dir: 0700');
Test::More::is((stat $main::Sock)[2] & 0777, 0660, 'socket: 0660');
Test::More::is((stat "$main::State/engine.log")[2] & 0777, 0640,
               'engine.log: 0640');
Test::More::is((stat "$main::State/engine.lock")[2] & 0777, 0600,
               'engine.lock: 0600');
my ($rc, undef, $err) = main::run_engine('serve', '--model', $main::MODEL,
    '--socket', "$main::State/second.sock", '--threads', 1,
    '--lock-file', "$main::State/engine.lock");
Test::More::is($rc, 1, 'a second engine on the same lock file exits 1');
Test::More::like($err, qr/another engine \(pid $pid\) holds \Q$main::State\E/,
                 'naming the pid that holds the lock');
Test::More::ok(!-e "$main::State/second.sock", 'before touching a socket');
push @main::Gone, $pid, main::children($pid);
--- request
GET /health
--- error_code: 200
--- error_log eval
qr/omni engine started \(pid \d+\)/
--- no_error_log
[error]
[alert]



=== TEST 2: a completion through omni_pass to the engine nginx started
--- init
main::none_left('QUIT');
my $pid = main::ready();
push @main::Gone, $pid, main::children($pid);
--- request eval: $::Completion
--- error_code: 200
--- check
is($json->{object}, 'text_completion', 'a text completion');
is($json->{usage}{completion_tokens}, 4, 'four tokens');
--- no_error_log
[error]
[alert]



=== TEST 3: a reload (HUP) keeps the engine and its pid
--- init
main::none_left('QUIT');
my $pid = main::ready();
kill 'HUP', main::master_pid();
main::wait_for(10, sub { main::error_log() =~ /already running, kept/ });
Test::More::is(main::holder(), $pid, "the engine kept its pid ($pid)");
Test::More::ok(main::ready(), 'and is ready');
push @main::Gone, $pid, main::children($pid);
--- request
GET /health
--- error_code: 200
--- error_log eval
qr/omni engine \(pid \d+\) already running, kept/
--- no_error_log
[error]
[alert]



=== TEST 4: a reload with a changed command line replaces the engine
--- init
main::none_left('QUIT');
my $pid = main::ready();
my $conf = main::slurp($Test::Nginx::Util::ConfFile);
$conf =~ s/--threads 1;/--threads 1 --max-queue 99;/
    or die "no --threads 1 in the config";
open(my $fh, '>', $Test::Nginx::Util::ConfFile) or die;
print $fh $conf;
close $fh;
kill 'HUP', main::master_pid();
my $new = main::wait_for(15, sub { my $h = main::holder();
                                   $h != $pid ? $h : 0 });
Test::More::ok($new, "a new engine ($new) replaced $pid");
Test::More::ok(main::wait_for(10, sub { !main::alive($pid) }),
               'the old one exited');
Test::More::ok(main::ready(), 'the new one is ready');
Test::More::ok(main::wait_for(10, sub {
    main::error_log() =~ /\(pid $new\) took the place of pid $pid/ }),
    'the cache manager saw it take over');
Test::More::like(main::slurp("$main::State/engine.cmd"),
                 qr/--max-queue\x{0}99\x{0}/, 'engine.cmd has the new one');
push @main::Gone, $new, main::children($new);
--- request eval: $::Completion
--- error_code: 200
--- error_log eval
[qr/omni engine command line changed: a new engine starts beside pid \d+/,
 qr/omni engine \(pid \d+\) took the place of pid \d+/]
--- no_error_log
[error]
[alert]



=== TEST 5: kill -9 of the engine: respawned, requests succeed again
--- init
main::none_left('QUIT');
my $pid = main::ready();
my @stage = main::children($pid);
kill 'KILL', $pid;
my $new = main::wait_for(10, sub { my $h = main::holder();
                                   $h != $pid ? $h : 0 });
Test::More::ok($new, "respawned: $new after $pid");
Test::More::ok(main::ready(), 'the new engine is ready');
Test::More::ok(main::wait_for(10, sub { !grep { main::alive($_) } @stage }),
               'the dead engine\'s stage exited');
push @main::Gone, $new, main::children($new);
--- request eval: $::Completion
--- error_code: 200
--- check
is($json->{usage}{completion_tokens}, 4, 'the completion after respawn');
--- error_log eval
qr/omni engine \(pid \d+\) exited, respawning/
--- no_error_log
[error]
[alert]



=== TEST 6: nginx killed with -9: the next nginx adopts the engine it left
--- init
main::none_left('QUIT');
my $pid = main::ready();
my $master = main::master_pid();
my @nginx = ($master, main::children($master));
kill 'KILL', @nginx;
main::wait_for(10, sub { !grep { main::alive($_) } @nginx });
Test::More::is(main::holder(), $pid, 'the engine outlived nginx');
system($Test::Nginx::Util::NginxBinary, '-p', "$ENV{TEST_NGINX_SERVROOT}/",
       '-c', $Test::Nginx::Util::ConfFile) == 0 or die "nginx did not start";
main::wait_for(10, sub { main::error_log() =~ /already running, kept/ });
Test::More::is(main::holder(), $pid, 'the new nginx kept it');
push @main::Gone, $pid, main::children($pid);
--- request eval: $::Completion
--- error_code: 200
--- error_log eval
qr/omni engine \(pid \d+\) already running, kept/



=== TEST 7: nginx -t starts no engine
--- init
main::none_left('QUIT');
my $pid = main::ready();
my $conf = main::slurp($Test::Nginx::Util::ConfFile);
$conf =~ s{logs/omni\b}{logs/omni-t}g;
my $t = "$ENV{TEST_NGINX_SERVROOT}/conf/t.conf";
open(my $fh, '>', $t) or die;
print $fh $conf;
close $fh;
Test::More::is(system("$Test::Nginx::Util::NginxBinary -q -t -p "
                      . "$ENV{TEST_NGINX_SERVROOT}/ -c $t"), 0,
               'nginx -t: ok');
sleep 0.5;
my $dir = "$ENV{TEST_NGINX_SERVROOT}/logs/omni-t";
Test::More::ok(!-e "$dir/engine.lock" && !-e "$dir/engine.log",
               'nginx -t started no engine');
Test::More::is(main::holder(), $pid, 'the running engine is untouched');
push @main::Gone, $pid, main::children($pid);
--- request
GET /health
--- error_code: 200
--- no_error_log
[error]
[alert]



=== TEST 8: an engine that cannot start: logged, retried, nginx serves on
--- main_config
omni_engine $TEST_NGINX_OMNI_ENGINE serve --no-such-option;
omni_engine_state_dir $TEST_NGINX_OMNI_STATE;
omni_engine_check_interval 200ms;
--- config
    location = /t {
        return 200 "still here\n";
    }
    location = /health {
        omni_health;
        omni_pass unix:$TEST_NGINX_OMNI_STATE/engine.sock;
    }
--- init
main::none_left('QUIT');
Test::More::ok(main::wait_for(10, sub {
    main::slurp("$main::State/engine.log") =~ /unknown option/ }),
    "engine.log says why");
Test::More::ok(main::wait_for(10, sub {
    main::error_log() =~ /did not start, see "[^"]+": "[^"]*unknown option/ }),
    "error.log quotes it");
Test::More::ok(!main::holder(), 'no engine runs');
--- request
GET /t
--- response_body
still here
--- error_log eval
qr/omni engine "[^"]+" did not start, see "[^"]+engine\.log"/



=== TEST 9: health is 503 while no engine runs
--- main_config
omni_engine $TEST_NGINX_OMNI_ENGINE serve --no-such-option;
omni_engine_state_dir $TEST_NGINX_OMNI_STATE;
--- init
Test::More::ok(!main::holder(), 'no engine runs');
--- request
GET /health
--- error_code: 503



=== TEST 10: a reload takes group write and others' access off the state dir
--- init
main::none_left('QUIT');
my $pid = main::ready();
chmod 0777, $main::State or die;
chmod 0666, "$main::State/engine.log" or die;
kill 'HUP', main::master_pid();
Test::More::ok(main::wait_for(10, sub {
    main::error_log() =~ /"\Q$main::State\E" was open to others \(mode 0777\), (?#
                          )now 0750/ }), 'logged');
Test::More::is((stat $main::State)[2] & 07777, 0750, 'state dir: 0750');
Test::More::is(main::holder(), $pid, 'the engine is kept');
kill 'KILL', $pid;
my $new = main::wait_for(10, sub { my $h = main::holder();
                                   $h != $pid ? $h : 0 });
Test::More::ok($new, "respawned: $new");
Test::More::is((stat "$main::State/engine.log")[2] & 0777, 0640,
               'the engine it starts narrows engine.log to 0640');
push @main::Gone, $new, main::children($new);
# it holds the lock before its model is loaded: /health is 503 until then
Test::More::ok(main::wait_health({ socket => $main::Sock }, 200, 30),
               'the new engine is ready');
--- request
GET /health
--- error_code: 200



=== TEST 11: a healthy engine again (stopped with TERM after the blocks)
--- init
my $pid = main::ready();
Test::More::ok($pid, "an engine runs ($pid)");
--- request
GET /health
--- error_code: 200
--- no_error_log
[error]
[alert]

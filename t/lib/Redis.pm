# t::lib::Redis -- a redis-server of the test's own (Debian's redis-server
# package), for the suites of omni_redis and omni_limit (t/limit.t,
# t/limit_fleet.t, t/redis_outage.t, t/redis_chaos.t), and a small client
# speaking RESP over a raw socket (no redis-cli, no CPAN module).
#
#   use t::lib::Redis;
#   my $r = t::lib::Redis->start(unix => 1, password => 'pw');
#   $r->{port}, $r->{socket} (with unix => 1), $r->{pid}, $r->{dir}
#   $r->addr                    "127.0.0.1:PORT", as omni_redis takes it
#   $r->cmd('SET', 'k', 'v')    the reply: a string, a number, an array
#                               ref, undef (nil), or a t::lib::Redis::Error
#                               (its ->{message}; true in boolean context);
#                               dies when Redis cannot be reached
#   $r->try_cmd(...)            the same, undef when it cannot be reached
#   $r->ping                    true when it answers PONG
#   $r->responsive(0.1)         it answers (anything) within 0.1 s
#   $r->kill('KILL')            a signal, then reaps it (SIGKILL by default)
#   $r->shutdown                SHUTDOWN NOSAVE, then reaps it
#   $r->restart                 a new redis-server on the same port and
#                               socket (with the password it has now)
#   $r->stop                    SIGTERM (SIGKILL after 5 s), reaps it;
#                               also done at END and on SIGTERM/SIGINT
#   $r->set_password('pw')      CONFIG SET requirepass (undef or '': none)
#   $r->sleep_bg(1.5)           DEBUG SLEEP 1.5 sent on a connection of its
#                               own, not waited for; $r->sleep_wait reads
#                               its answer (when the sleep is over)
#   $r->clients                 CLIENT LIST without this client's own
#                               connections: [{id, addr, cmd, ...}, ...]
#   $r->wait_clients($n, $s)    the same, once it holds $n clients (polled
#                               for up to $s seconds; then as it is)
#   $r->keys('*')               KEYS, sorted
#   $r->monitor_start           MONITOR on a connection of its own;
#   $r->monitor_stop            the commands Redis saw since, one line
#                               each ('"EVALSHA" "..." ...'), once it has
#                               been quiet for 0.3 s
#
# redis-server runs in the foreground as this process's child (daemonize
# no, its own pid, killed with this process even by SIGKILL: PDEATHSIG),
# in a temporary directory, bound to 127.0.0.1 on a free port, with no
# persistence (--save '' --appendonly no) and DEBUG enabled
# (--enable-debug-command yes: DEBUG SLEEP). start() and restart() return
# once it answers PING.
package t::lib::Redis;

use strict;
use warnings;

use Config;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use IO::Socket::UNIX;
use POSIX qw(WNOHANG);
use Socket qw(SOCK_STREAM);
use t::lib::Proc qw(free_port);
use Time::HiRes qw(time sleep);

our $SERVER = $ENV{REDIS_SERVER} // '/usr/bin/redis-server';

my (@all, $pid0);
$pid0 = $$;

# prctl(PR_SET_PDEATHSIG, SIGKILL): the server dies with the test even
# when the test is SIGKILLed (a harness timeout). The syscall's number by
# architecture; elsewhere the END block and the signal handlers do.
my %PRCTL = (x86_64 => 157, aarch64 => 167);

sub start {
    my ($class, %o) = @_;
    die "$SERVER is missing (apt-get install redis-server)\n"
        unless -x $SERVER;
    my $dir = tempdir('omni-redis-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $self = bless { dir => $dir, port => $o{port} // free_port(),
                       password => $o{password}, conns => [] }, $class;
    $self->{socket} = "$dir/redis.sock" if $o{unix};
    push @all, $self;
    $self->spawn;
    return $self;
}

sub addr { my $self = shift; return "127.0.0.1:$self->{port}" }

sub spawn {
    my ($self) = @_;
    my @args = ($SERVER, '--port', $self->{port}, '--bind', '127.0.0.1',
                '--dir', $self->{dir}, '--save', '', '--appendonly', 'no',
                '--daemonize', 'no', '--enable-debug-command', 'yes',
                '--logfile', "$self->{dir}/redis.log", '--loglevel', 'notice',
                '--databases', 16);
    push @args, '--unixsocket', $self->{socket}, '--unixsocketperm', 700
        if $self->{socket};
    push @args, '--requirepass', $self->{password}
        if defined $self->{password} && length $self->{password};
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        my $n = $PRCTL{ (POSIX::uname())[4] };
        syscall($n, 1, 9) if $n;
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>>', "$self->{dir}/stdout.log");
        open(STDERR, '>&', \*STDOUT);
        exec(@args) or POSIX::_exit(127);
    }
    $self->{pid} = $pid;
    my $until = time + 20;
    while (time < $until) {
        die "redis-server exited at start:\n" . $self->log
            if waitpid($pid, WNOHANG) == $pid;
        return $self if $self->ping;
        sleep 0.02;
    }
    $self->stop;
    die "redis-server did not answer PING within 20 s:\n" . $self->log;
}

sub log {
    my ($self) = @_;
    my $text = '';
    for my $f ("$self->{dir}/stdout.log", "$self->{dir}/redis.log") {
        open(my $fh, '<', $f) or next;
        local $/;
        $text .= <$fh> // '';
    }
    return $text;
}

sub alive {
    my ($self) = @_;
    return $self->{pid} && waitpid($self->{pid}, WNOHANG) == 0;
}

# --- the client -------------------------------------------------------------

sub connect_ {
    my ($self, $timeout) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $self->{port},
                                  Timeout => $timeout // 5)
        or return undef;
    binmode $c;
    if (defined $self->{password} && length $self->{password}) {
        send_cmd($c, 'AUTH', $self->{password});
        my $r = read_reply($c, $timeout // 5);
        return undef if !defined $r || ref $r;
    }
    return $c;
}

sub encode {
    return '*' . scalar(@_) . "\r\n"
           . join('', map { '$' . length($_) . "\r\n$_\r\n" } @_);
}

sub send_cmd {
    my ($c, @args) = @_;
    my $buf = encode(@args);
    while (length $buf) {
        my $n = syswrite($c, $buf);
        return 0 unless $n;
        substr($buf, 0, $n, '');
    }
    return 1;
}

# One reply, read within timeout seconds; dies on EOF or timeout.
sub read_reply {
    my ($c, $timeout) = @_;
    my $until = time + ($timeout // 10);
    my $rbuf = \(${*$c}{omni_rbuf} //= '');
    my $line = sub {
        while ((my $i = index($$rbuf, "\r\n")) < 0) {
            fill($c, $rbuf, $until);
        }
        my $i = index($$rbuf, "\r\n");
        my $l = substr($$rbuf, 0, $i);
        substr($$rbuf, 0, $i + 2, '');
        return $l;
    };
    my $parse;
    $parse = sub {
        my $l = $line->();
        my ($t, $v) = (substr($l, 0, 1), substr($l, 1));
        return $v if $t eq '+';
        return $v + 0 if $t eq ':';
        return bless { message => $v }, 't::lib::Redis::Error' if $t eq '-';
        if ($t eq '$') {
            return undef if $v < 0;
            fill($c, $rbuf, $until) while length($$rbuf) < $v + 2;
            my $s = substr($$rbuf, 0, $v);
            substr($$rbuf, 0, $v + 2, '');
            return $s;
        }
        if ($t eq '*') {
            return undef if $v < 0;
            return [map { $parse->() } 1 .. $v];
        }
        die "redis: bad reply line '$l'\n";
    };
    my $r = $parse->();
    undef $parse;
    return $r;
}

sub fill {
    my ($c, $rbuf, $until) = @_;
    my $left = $until - time;
    die "redis: no answer in time\n" if $left <= 0;
    my $rin = '';
    vec($rin, fileno($c), 1) = 1;
    my $n = select(my $rout = $rin, undef, undef, $left);
    die "redis: no answer in time\n" unless $n > 0;
    my $got = sysread($c, $$rbuf, 65536, length $$rbuf);
    die "redis: connection closed\n" unless $got;
}

# A command on the persistent connection (made again when it broke).
sub cmd {
    my ($self, @args) = @_;
    for my $try (1, 2) {
        my $c = $self->{conn} //= $self->connect_
            or die "redis: cannot connect to $self->{port}\n";
        my $r = eval {
            send_cmd($c, @args) or die "redis: write failed\n";
            read_reply($c, $self->{timeout} // 10);
        };
        return $r unless $@;
        close $c;
        undef $self->{conn};
        die $@ if $try == 2;
    }
}

sub try_cmd {
    my ($self, @args) = @_;
    my $r = eval { $self->cmd(@args) };
    return $@ ? undef : $r;
}

sub ping {
    my ($self) = @_;
    my $c = $self->connect_(1);
    if (!$c) {
        # a password the server does not have (yet): it answers, though
        my $raw = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                        PeerPort => $self->{port},
                                        Timeout => 1) or return 0;
        send_cmd($raw, 'PING');
        my $r = eval { read_reply($raw, 1) };
        return defined $r;
    }
    send_cmd($c, 'PING');
    my $r = eval { read_reply($c, 2) };
    return defined $r && !ref $r && $r eq 'PONG';
}

# Whether it answers PING within $timeout seconds (a DEBUG SLEEP: not).
sub responsive {
    my ($self, $timeout) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $self->{port},
                                  Timeout => 1) or return 0;
    send_cmd($c, 'PING');
    my $r = eval { read_reply($c, $timeout) };
    close $c;
    return defined $r;
}

sub keys {
    my ($self, $pattern) = @_;
    return sort @{ $self->cmd('KEYS', $pattern // '*') };
}

# CLIENT LIST, less this object's own connections.
sub wait_clients {
    my ($self, $n, $secs) = @_;
    return t::lib::Proc::wait_for($secs, sub {
        my $c = $self->clients;
        return @$c == $n ? $c : undef;
    }) // $self->clients;
}

sub clients {
    my ($self) = @_;
    my $me = $self->cmd('CLIENT', 'ID');
    my $list = $self->cmd('CLIENT', 'LIST');
    die "redis: CLIENT LIST: $list->{message}\n" if ref $list;
    my %own = ($me => 1, map { $_ => 1 } @{ $self->{bg_ids} // [] });
    my @c;
    for my $line (split /\n/, $list) {
        my %f = map { /^([^=]+)=(.*)$/ ? ($1, $2) : () } split ' ', $line;
        push @c, \%f unless $own{ $f{id} // '' };
    }
    return \@c;
}

sub set_password {
    my ($self, $pw) = @_;
    my $r = $self->cmd('CONFIG', 'SET', 'requirepass', $pw // '');
    die "redis: CONFIG SET requirepass: $r->{message}\n" if ref $r;
    # the connection is authenticated already; new ones use the new one
    $self->{password} = $pw;
    return 1;
}

sub sleep_bg {
    my ($self, $secs) = @_;
    my $c = $self->connect_ or die "redis: cannot connect\n";
    send_cmd($c, 'CLIENT', 'ID');
    push @{ $self->{bg_ids} }, read_reply($c, 5);
    send_cmd($c, 'DEBUG', 'SLEEP', $secs);
    $self->{bg} = $c;
    return 1;
}

sub sleep_wait {
    my ($self, $timeout) = @_;
    my $c = delete $self->{bg} or return undef;
    my $r = eval { read_reply($c, $timeout // 30) };
    close $c;
    return $r;
}

sub monitor_start {
    my ($self) = @_;
    my $c = $self->connect_ or die "redis: cannot connect\n";
    send_cmd($c, 'CLIENT', 'ID');
    push @{ $self->{bg_ids} }, read_reply($c, 5);
    send_cmd($c, 'MONITOR');
    my $r = read_reply($c, 5);
    die "redis: MONITOR: $r\n" unless defined $r && $r eq 'OK';
    $self->{mon} = $c;
    return 1;
}

sub monitor_stop {
    my ($self) = @_;
    my $c = delete $self->{mon} or return ();
    my @lines;
    while (1) {
        my $l = eval { read_reply($c, 0.3) };
        last unless defined $l;
        push @lines, $l;
    }
    close $c;
    return @lines;
}

# --- the process ------------------------------------------------------------

sub reap {
    my ($self, $timeout) = @_;
    my $until = time + ($timeout // 10);
    while (time < $until) {
        my $w = waitpid($self->{pid}, WNOHANG);
        if ($w == $self->{pid} || $w < 0) {
            undef $self->{pid};
            return 1;
        }
        sleep 0.01;
    }
    return 0;
}

sub forget_conns {
    my ($self) = @_;
    close $self->{conn} if $self->{conn};
    close $self->{bg} if $self->{bg};
    close $self->{mon} if $self->{mon};
    undef $self->{conn};
    undef $self->{bg};
    undef $self->{mon};
    $self->{bg_ids} = [];
}

sub kill {
    my ($self, $sig) = @_;
    return unless $self->{pid};
    CORE::kill($sig // 'KILL', $self->{pid});
    $self->forget_conns;
    $self->reap(10) or do { CORE::kill('KILL', $self->{pid}); $self->reap(5) };
}

sub shutdown {
    my ($self) = @_;
    return unless $self->{pid};
    my $c = $self->connect_(2);
    send_cmd($c, 'SHUTDOWN', 'NOSAVE') if $c;
    close $c if $c;
    $self->forget_conns;
    $self->reap(10) or $self->kill('KILL');
}

sub restart {
    my ($self) = @_;
    $self->kill('KILL') if $self->{pid};
    unlink $self->{socket} if $self->{socket};
    return $self->spawn;
}

sub stop {
    my ($self) = @_;
    return unless $self->{pid};
    $self->forget_conns;
    CORE::kill('TERM', $self->{pid});
    $self->reap(5) or do { CORE::kill('KILL', $self->{pid}); $self->reap(5) };
}

# A test killed by SIGTERM or SIGINT (a timeout, Ctrl-C) still stops what
# it started: exit runs the END blocks.
$SIG{$_} = sub { exit 1 } for qw(TERM INT);

END {
    local $?;
    if ($$ == $pid0) {
        $_->stop for @all;
    }
}

package t::lib::Redis::Error;

use overload 'bool' => sub { 1 }, '""' => sub { "ERR($_[0]{message})" },
             fallback => 1;

1;

# t::lib::HttpLoad -- many HTTP/1.1 requests at once over raw sockets, for
# the suites that need concurrency against nginx (t/limit_fleet.t,
# t/redis_outage.t, t/redis_chaos.t): one process, non-blocking sockets,
# one connection per request (Connection: close), every answer parsed.
#
#   my @r = http_burst([{ port => P, path => '/v1/...', body => JSON,
#                         headers => { ... } }, ...], timeout => 30);
#       sends them all at once; returns one answer per request, in order:
#       { status (0: none), headers => { lowercase => value }, body,
#         json (decoded or undef), elapsed (seconds), error (why none) }
#
#   my $load = http_load_start(requests => [req, ...], concurrency => 16,
#                              timeout => 10, abort_every => 0);
#       a child process keeping `concurrency` requests in flight, taking
#       them from the list in turn, until http_load_stop($load), which
#       waits for those in flight and returns
#       { n, status => { code => count }, slowest (seconds), over
#         => [answers that took longer than timeout or got none] }.
#       With abort_every => N, every Nth request is a client that leaves:
#       its connection is closed 0 to 50 ms after the request was sent
#       (counted as status "aborted", unless its answer came first).
package t::lib::HttpLoad;

use strict;
use warnings;

use Errno qw(EAGAIN EINPROGRESS EWOULDBLOCK);
use Exporter 'import';
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time sleep);

our @EXPORT = qw(http_burst http_load_start http_load_stop http_request
                 parse_response);

my $pid0 = $$;
my %running;

# The bytes of one request: POST with a body, else GET.
sub http_request {
    my ($q) = @_;
    my $method = $q->{method} // (defined $q->{body} ? 'POST' : 'GET');
    my %h = (Host => '127.0.0.1', Connection => 'close',
             %{ $q->{headers} // {} });
    if (defined $q->{body}) {
        $h{'Content-Type'} //= 'application/json';
        $h{'Content-Length'} = length $q->{body};
    }
    return "$method $q->{path} HTTP/1.1\r\n"
           . join('', map { "$_: $h{$_}\r\n" } sort keys %h) . "\r\n"
           . ($q->{body} // '');
}

# A whole response (read to EOF): status, headers, de-chunked body.
sub parse_response {
    my ($raw) = @_;
    my %a = (status => 0, headers => {}, body => '');
    my ($head, $body) = split /\r\n\r\n/, $raw, 2;
    return \%a unless defined $body;
    my @lines = split /\r\n/, $head;
    ($a{status}) = (shift(@lines) // '') =~ m{^HTTP/1\.\d (\d{3})};
    $a{status} //= 0;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
        $k = lc $k;
        $a{headers}{$k} = exists $a{headers}{$k}
                          ? "$a{headers}{$k}, $v" : $v;
    }
    if (($a{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
        my $out = '';
        while ($body =~ s/^([0-9a-fA-F]+)[^\r]*\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $out .= substr($body, 0, $n, '');
            $body =~ s/^\r\n//;
        }
        $body = $out;
    }
    $a{body} = $body;
    $a{json} = eval { JSON::PP->new->utf8->decode($body) };
    return \%a;
}

sub open_conn {
    my ($q) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $q->{port}, Blocking => 0);
    return undef unless $s;
    setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
    binmode $s;
    return { sock => $s, out => http_request($q), in => '', q => $q,
             start => time };
}

# One round over the connections in %$conns (fileno => conn): waits up to
# $wait seconds for any to be ready, writes and reads what it can, and
# calls $done->($conn, $answer) for each that has its answer (EOF).
sub step {
    my ($conns, $wait, $done) = @_;
    my (@r, @w);
    # the clients that leave
    for my $fd (keys %$conns) {
        my $c = $conns->{$fd};
        next unless $c->{abort_at} && !length $c->{out}
                    && time >= $c->{start} + $c->{abort_at};
        delete $conns->{$fd};
        close $c->{sock};
        $done->($c, { status => 'aborted', headers => {}, body => '',
                      elapsed => time - $c->{start} });
    }
    for my $c (values %$conns) {
        push @r, $c->{sock};
        push @w, $c->{sock} if length $c->{out};
    }
    my ($rr, $ww) = IO::Select->select(IO::Select->new(@r),
                                       IO::Select->new(@w), undef, $wait);
    for my $s (@{ $ww // [] }) {
        my $c = $conns->{ fileno $s } or next;
        my $n = syswrite($s, $c->{out});
        substr($c->{out}, 0, $n, '') if $n;
    }
    for my $s (@{ $rr // [] }) {
        my $c = $conns->{ fileno $s } or next;
        my $n = sysread($s, $c->{in}, 65536, length $c->{in});
        next if !defined $n && ($! == EAGAIN || $! == EWOULDBLOCK);
        next if $n;
        # EOF (or an error): the answer is whole, or there is none
        delete $conns->{ fileno $s };
        my $a = parse_response($c->{in});
        $a->{elapsed} = time - $c->{start};
        $a->{error} = defined $n ? 'no answer' : "read: $!"
            unless $a->{status};
        close $s;
        $done->($c, $a);
    }
}

# Gives up on the connections older than $age seconds: $done->($conn,
# an answer with status 0).
sub expire {
    my ($conns, $age, $done) = @_;
    for my $fd (keys %$conns) {
        my $c = $conns->{$fd};
        next if time - $c->{start} < $age;
        delete $conns->{$fd};
        close $c->{sock};
        $done->($c, { status => 0, headers => {}, body => '',
                      elapsed => time - $c->{start},
                      error => 'no answer in time' });
    }
}

sub http_burst {
    my ($reqs, %o) = @_;
    my (%conns, @answers);
    for my $i (0 .. $#$reqs) {
        my $c = open_conn($reqs->[$i]);
        if (!$c) {
            $answers[$i] = { status => 0, headers => {}, body => '',
                             elapsed => 0, error => "connect: $!" };
            next;
        }
        $c->{i} = $i;
        $conns{ fileno $c->{sock} } = $c;
    }
    my $done = sub { $answers[$_[0]{i}] = $_[1] };
    while (%conns) {
        step(\%conns, 0.05, $done);
        expire(\%conns, $o{timeout} // 30, $done);
    }
    return @answers;
}

sub http_load_start {
    my (%o) = @_;
    my $file = "/tmp/omni-load-$$-" . int(rand(1e9)) . '.json';
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        my $stop = 0;
        $SIG{USR1} = sub { $stop = 1 };
        $SIG{$_} = 'DEFAULT' for qw(TERM INT);
        my $reqs = $o{requests};
        my $conc = $o{concurrency} // 16;
        my $timeout = $o{timeout} // 10;
        my (%conns, %status, @over);
        my ($n, $next, $slowest) = (0, 0, 0);
        my $fill = sub {
            while (!$stop && keys(%conns) < $conc) {
                my $c = open_conn($reqs->[$next++ % @$reqs]);
                $c->{abort_at} = 0.001 + rand(0.05)
                    if $c && $o{abort_every} && $next % $o{abort_every} == 0;
                if (!$c) {
                    $status{0}++;
                    $n++;
                    push @over, { status => 0, error => "connect: $!" }
                        if @over < 20;
                    sleep 0.01;
                    next;
                }
                $conns{ fileno $c->{sock} } = $c;
            }
        };
        $fill->();
        # an answer slower than timeout is reported; one slower than
        # three times that is given up on
        my $done = sub {
            my ($c, $a) = @_;
            $n++;
            $status{ $a->{status} }++;
            return if $a->{status} eq 'aborted';
            $slowest = $a->{elapsed} if $a->{elapsed} > $slowest;
            if ((!$a->{status} || $a->{elapsed} > $timeout) && @over < 20) {
                push @over, { status => $a->{status},
                              elapsed => $a->{elapsed},
                              error => $a->{error},
                              body => substr($a->{body}, 0, 300) };
            }
        };
        while (!$stop || %conns) {
            step(\%conns, 0.05, $done);
            expire(\%conns, 3 * $timeout, $done);
            $fill->();
            sleep 0.01 if !%conns && !$stop;
        }
        open(my $fh, '>', $file) or POSIX::_exit(1);
        print $fh encode_json({ n => $n, status => \%status,
                                slowest => $slowest, over => \@over });
        close $fh;
        POSIX::_exit(0);
    }
    $running{$pid} = 1;
    return { pid => $pid, file => $file };
}

sub http_load_stop {
    my ($load, $timeout) = @_;
    kill 'USR1', $load->{pid};
    my $until = time + ($timeout // 60);
    while (time < $until) {
        last if waitpid($load->{pid}, WNOHANG) == $load->{pid};
        sleep 0.05;
    }
    delete $running{ $load->{pid} };
    if (kill 0, $load->{pid}) {
        kill 'KILL', $load->{pid};
        waitpid($load->{pid}, 0);
        return { n => 0, status => {}, over => [{ error => 'the load '
                 . 'process did not end' }], slowest => 0 };
    }
    open(my $fh, '<', $load->{file}) or return { n => 0, status => {},
        over => [{ error => 'no results' }], slowest => 0 };
    local $/;
    my $r = decode_json(<$fh>);
    close $fh;
    unlink $load->{file};
    $load->{done} = 1;
    return $r;
}

# a load still running when the test ends (it died): stopped with it
END {
    local $?;
    if ($$ == $pid0) {
        for my $pid (keys %running) {
            kill 'KILL', $pid;
            waitpid($pid, 0);
        }
    }
}

1;

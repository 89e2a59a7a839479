# t::lib::RawHttp -- HTTP/1.x over a raw TCP socket, for tests that frame
# requests by hand (t/body.t, the body-path fuzzer t/fuzz/http_body.pl):
# every byte on the wire is the caller's, pieces go out as separate
# writes, and the responses are parsed back with their 1xx interim ones.
#
#   use t::lib::RawHttp;
#   my $raw = raw_exchange($port, [$piece1, $piece2], delay => 0.002);
#   my @r = http_responses($raw);   # ({status, head, headers, body,
#                                   #   complete}, ...)
#   my $wire = chunked($body, sizes => [1, 5], ext => ';a=b',
#                      trailers => "X-T: 1\r\n", upper => 1);
package t::lib::RawHttp;

use strict;
use warnings;

use Exporter 'import';
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time sleep);

our @EXPORT = qw(raw_connect raw_send raw_read raw_exchange http_responses
                 chunked http_request);

# A connected socket with Nagle off (each write its own segment), or undef.
sub raw_connect {
    my ($port, $timeout) = @_;
    my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                  Timeout => $timeout // 10)
        or return undef;
    setsockopt($c, IPPROTO_TCP, TCP_NODELAY, 1);
    binmode $c;
    return $c;
}

# Writes each piece with one syswrite (looping on short writes), sleeping
# delay seconds between pieces (a number or a code ref returning one).
# Returns false when the peer closed before everything was written.
sub raw_send {
    my ($c, $pieces, %o) = @_;
    local $SIG{PIPE} = 'IGNORE';
    my $first = 1;
    for my $p (@$pieces) {
        if (!$first && $o{delay}) {
            my $d = ref $o{delay} ? $o{delay}->() : $o{delay};
            sleep $d if $d > 0;
        }
        $first = 0;
        my $off = 0;
        while ($off < length $p) {
            my $n = syswrite($c, $p, length($p) - $off, $off);
            return 0 unless defined $n && $n > 0;
            $off += $n;
        }
    }
    return 1;
}

# Reads until the peer closes, until $o{until}->($bytes) is true, or for
# at most $o{timeout} seconds (default 30). Returns the bytes read; with
# eof => \$flag, sets $flag when the peer closed (or reset) the connection.
sub raw_read {
    my ($c, %o) = @_;
    my $buf = '';
    my $deadline = time + ($o{timeout} // 30);
    my $sel = IO::Select->new($c);
    ${ $o{eof} } = 0 if $o{eof};
    while (1) {
        my $left = $deadline - time;
        last if $left <= 0;
        last unless $sel->can_read($left);
        my $n = sysread($c, $buf, 65536, length $buf);
        if (!$n) {                       # EOF, or a reset (ECONNRESET)
            ${ $o{eof} } = 1 if $o{eof};
            last;
        }
        last if $o{until} && $o{until}->($buf);
    }
    return $buf;
}

# Connects, sends the pieces, optionally half-closes (shutdown => 1) or
# closes at once (close => 1, then returns ''), reads what comes back.
sub raw_exchange {
    my ($port, $pieces, %o) = @_;
    my $c = raw_connect($port) or die "connect to 127.0.0.1:$port: $!\n";
    raw_send($c, $pieces, %o);
    if ($o{close}) {
        close $c;
        return '';
    }
    shutdown($c, 1) if $o{shutdown};
    my $raw = raw_read($c, %o);
    close $c;
    return $raw;
}

# The responses in a byte string: a list of hashes { status, head (the
# status line and headers), headers => { lowercase name => value },
# body (de-chunked), complete (the whole message arrived) }. Interim 1xx
# responses are listed too. A response without length runs to the end.
sub http_responses {
    my ($raw) = @_;
    my @out;
    while (length $raw) {
        $raw =~ s{\A(HTTP/1\.[01] (\d{3})[^\r\n]*\r\n((?:[^\r\n]+\r\n)*))\r\n}{}
            or do { push @out, { garbage => $raw, complete => 0 }; last };
        my %r = (head => $1, status => $2, headers => {}, body => '',
                 complete => 1);
        for (split /\r\n/, $3) {
            my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
            $r{headers}{lc $k} = exists $r{headers}{lc $k}
                                 ? "$r{headers}{lc $k}, $v" : $v;
        }
        push @out, \%r;
        next if $r{status} =~ /^1/ || $r{status} == 204 || $r{status} == 304;
        if (($r{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
            $r{complete} = 0;
            while ($raw =~ s/\A([0-9a-fA-F]+)[^\r\n]*\r\n//) {
                my $n = hex $1;
                if ($n == 0) {
                    $r{complete} = 1 if $raw =~ s/\A(?:[^\r\n]+\r\n)*\r\n//;
                    last;
                }
                last if length($raw) < $n + 2;
                $r{body} .= substr($raw, 0, $n, '');
                $raw =~ s/\A\r\n// or last;
            }
        } elsif (defined(my $len = $r{headers}{'content-length'})) {
            $r{body} = substr($raw, 0, $len, '');
            $r{complete} = length($r{body}) == $len;
        } else {
            $r{body} = $raw;
            $raw = '';
        }
    }
    return @out;
}

# A body in chunked framing: chunks of the given sizes (cycled; default
# one chunk), each size with extension ext (a string or a code ref
# called per chunk), hex in upper case with upper, then "0", trailers
# (lines, each ending in CRLF) and the final CRLF.
sub chunked {
    my ($body, %o) = @_;
    my @sizes = @{ $o{sizes} // [length($body) || 1] };
    my ($out, $i) = ('', 0);
    while (length $body) {
        my $n = $sizes[$i++ % @sizes];
        $n = 1 if $n < 1;
        my $part = substr($body, 0, $n, '');
        my $hex = sprintf($o{upper} ? '%X' : '%x', length $part);
        my $ext = ref $o{ext} ? $o{ext}->() : ($o{ext} // '');
        $out .= "$hex$ext\r\n$part\r\n";
    }
    return $out . "0\r\n" . ($o{trailers} // '') . "\r\n";
}

# A request: method, target, headers (a list of "Name: value" lines, in
# order), body; HTTP/1.1 and Host unless told (version => '1.0',
# host => undef).
sub http_request {
    my (%o) = @_;
    my $v = $o{version} // '1.1';
    my @h = @{ $o{headers} // [] };
    unshift @h, "Host: localhost" unless exists $o{host} && !defined $o{host};
    return "$o{method} $o{target} HTTP/$v\r\n"
           . join('', map { "$_\r\n" } @h) . "\r\n" . ($o{body} // '');
}

1;

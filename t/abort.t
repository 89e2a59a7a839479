# A client that disconnects mid-stream: nginx closes its engine
# connection, and the engine stops that sequence at once: its
# requests_cancelled_total goes up, num_requests_running goes back to 0
# and no KV block stays in use; the module counts the client abort; other
# streams carry on to [DONE]; nginx logs nothing at [error].
#
# The engine runs with the reference (scalar) kernels so that a 500-token
# answer takes a few hundred milliseconds: long enough to hang up in the
# middle of it.
use strict;
use warnings;
use lib '.';
BEGIN { $ENV{OMNI_TEST_ENGINE_ARGS} = '--isa ref' }
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

# A streaming chat request that runs to the end of the context.
sub long_chat {
    my ($n) = @_;
    my $body = encode_json({ model => $M, stream => JSON::PP::true,
        messages => [{ role => 'user', content => "Tell me story $n" }],
        ignore_eos => JSON::PP::true, temperature => 0 });
    return "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
         . "Content-Type: application/json\r\nConnection: close\r\n"
         . "Content-Length: " . length($body) . "\r\n\r\n$body";
}

# $n streams at once; those in @close are closed as soon as their first
# content delta arrives. Returns the raw responses.
sub streams {
    my ($n, @close) = @_;
    my %close = map { $_ => 1 } @close;
    my $sel = IO::Select->new;
    my (@s, @resp, %idx);
    for my $i (0 .. $n - 1) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                    PeerPort => $ENV{TEST_NGINX_SERVER_PORT}) or die $!;
        print $s long_chat($i);
        push @s, $s;
        $idx{fileno $s} = $i;
        $resp[$i] = '';
        $sel->add($s);
    }
    my $until = time + 60;
    while ($sel->count && time < $until) {
        for my $s ($sel->can_read(0.5)) {
            my $i = $idx{fileno $s};
            my $got = sysread($s, my $buf, 65536);
            $resp[$i] .= $buf if $got;
            if (!$got || ($close{$i} && $resp[$i] =~ /"delta":\{"content"/)) {
                $sel->remove($s);
                close $s;
            }
        }
    }
    return @resp;
}

# the module's metrics text, from nginx
sub nginx_metrics {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                PeerPort => $ENV{TEST_NGINX_SERVER_PORT}) or die $!;
    print $s "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    local $/;
    my $r = <$s> // '';
    return $r;
}

run_tests();

__DATA__

=== TEST 1: one stream, closed by the client after its first delta
--- request
GET /health
--- error_code: 200
--- check
my $before = engine_metrics();
my @r = streams(1, 0);
like($r[0], qr/"delta":\{"content"/, "$name: a delta came");
unlike($r[0], qr/\[DONE\]/, "$name: the stream was cut");
my $m = wait_engine_idle(10);
is($m->{omni_engine_requests_cancelled_total}
   - $before->{omni_engine_requests_cancelled_total}, 1,
   "$name: the engine cancelled the sequence");
is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, "$name: nothing running");
is($m->{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
   "$name: no KV block in use");
my ($n) = nginx_metrics() =~ /^omni_nginx_client_aborts_total (\d+)$/m;
is($n, 1, "$name: omni_nginx_client_aborts_total 1");
--- no_error_log
[error]
[alert]



=== TEST 2: 4 streams, 2 closed after their first delta
--- request
GET /health
--- error_code: 200
--- check
my $before = engine_metrics();
my @r = streams(4, 0, 1);
for my $i (2, 3) {
    like($r[$i], qr/data: \[DONE\]\n\n\r\n0\r\n\r\n\z/,
         "$name: stream $i ran to [DONE]");
}
for my $i (0, 1) {
    unlike($r[$i], qr/\[DONE\]/, "$name: stream $i was cut");
}
my $m = wait_engine_idle(10);
is($m->{omni_engine_requests_cancelled_total}
   - $before->{omni_engine_requests_cancelled_total}, 2,
   "$name: the engine cancelled the 2 closed streams");
is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, "$name: nothing running");
is($m->{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
   "$name: no KV block in use");
my $t = nginx_metrics();
my ($n) = $t =~ /^omni_nginx_client_aborts_total (\d+)$/m;
is($n, 2, "$name: the module counted 2 client aborts") or diag($t);
--- no_error_log
[error]
[alert]

# Two nginx instances (each its own master and two workers, its own
# prefix: t/lib/OmniServer.pm) in front of one engine (the stand-in,
# t/lib/FakeEngine.pm) share one Redis (t/lib/Redis.pm), and so one set of
# limits:
#
#   - requests: 60 requests at once, 30 to each instance, against
#     rate=20r/h: exactly 20 are 200s, each with its own
#     x-ratelimit-remaining-requests from 19 down to 0, and 40 are 429s
#     with OpenAI's error, retry-after and retry-after-ms, whichever
#     instance answered; then either instance refuses the next;
#   - tokens, charged by streamed completions: 10 streams at once, 5 to
#     each, are each corrected to the DONE's 3 + 1 tokens in the shared
#     bucket; then streams taken in turn from A and B fill a small bucket
#     until the one the prediction says (from the estimate the first
#     answer shows) is refused, on whichever instance it lands.
#
# The rates refill too slowly for a loaded machine's delays to change a
# count (20r/h: one request per 3 minutes; 1000t/d: a token per 86 s).
use strict;
use warnings;
use lib '.';
use t::lib::OmniServer;
use t::lib::FakeEngine;
use t::lib::Redis;
use t::lib::HttpLoad;
use Digest::SHA qw(sha1_hex);
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

our $TMP;

my $redis = t::lib::Redis->start;

# nginx's freed memory is overwritten (glibc's MALLOC_PERTURB_, read by
# the nginx started below), so that memory used after it was freed shows
# as a worker that dies
$ENV{MALLOC_PERTURB_} //= 165;
my $sock = "$main::TMP/fake-engine.sock";
my $fake = fake_engine_start($sock);
my $addr = $redis->addr;
my %srv;
for my $n (qw(a b)) {
    $srv{$n} = omni_server_start(name => "limit_fleet_$n", socket => $sock,
        workers => 2, http => <<"HTTP", server => <<"SERVER");
    omni_redis $addr timeout=5s connect_timeout=5s;
    omni_limit_zone zone=rph rate=20r/h;
    omni_limit_zone zone=tpd rate=1000t/d;
    omni_limit_zone zone=small rate=1000t/d burst=60;
    omni_limit rph;
HTTP
        location /tpd/v1/ {
            omni_limit tpd;
            omni_pass unix:$sock;
        }
        location /small/v1/ {
            omni_limit small;
            omni_pass unix:$sock;
        }
SERVER
}

sub post {
    my ($n, $path, $body, %h) = @_;
    return { port => $srv{$n}{port}, path => $path, body => $body,
             headers => { Authorization => 'Bearer sk-fleet', %h } };
}

sub chat {
    my ($n) = @_;
    return post($n, '/v1/chat/completions', encode_json({
        model => 'fake-model',
        messages => [{ role => 'user', content => 'hi' }] }));
}

sub rkey { return "omni:limit:$_[0]:" . sha1_hex($_[1]) }

# Units a bucket holds taken now.
sub used {
    my ($zone, $key, $unit_us) = @_;
    my $tat = $redis->cmd('GET', rkey($zone, $key));
    return 0 unless defined $tat;
    my $t = $redis->cmd('TIME');
    my $u = ($tat - ($t->[0] * 1e6 + $t->[1])) / $unit_us;
    return $u < 0 ? 0 : $u;
}

sub wait_used {
    my ($want, @b) = @_;
    my ($u, $until) = (0, time + 15);
    while (time < $until) {
        $u = used(@b);
        return $u if abs($u - $want) < 0.5;
        sleep 0.02;
    }
    return $u;
}

# --- requests: one limit for both --------------------------------------

my @reqs = map { chat($_ % 2 ? 'a' : 'b') } 1 .. 60;
my $t0 = time;
my @ans = http_burst(\@reqs, timeout => 60);
note(sprintf '60 requests at once: %.2f s', time - $t0);

my (%by, @remaining, @bad);
for my $i (0 .. $#ans) {
    my $a = $ans[$i];
    my $n = $i % 2 ? 'b' : 'a';
    $by{ $a->{status} }{$n}++;
    my $h = $a->{headers};
    if ($a->{status} == 200) {
        push @remaining, $h->{'x-ratelimit-remaining-requests'};
        push @bad, "$i: 200 without limit 20" unless
            ($h->{'x-ratelimit-limit-requests'} // '') eq '20';
        push @bad, "$i: 200 without the answer"
            unless ($a->{json}{object} // '') eq 'chat.completion';
    } elsif ($a->{status} == 429) {
        my $e = $a->{json}{error} // {};
        push @bad, "$i: 429 without OpenAI's error: $a->{body}"
            unless ($e->{type} // '') eq 'requests'
                   && ($e->{code} // '') eq 'rate_limit_exceeded'
                   && ($e->{message} // '') =~ /^Rate limit reached for requests per hour \(RPH\) in omni_limit_zone "rph": Limit 20, Used 20, Requested 1\. Please try again in /;
        my $ms = $h->{'retry-after-ms'} // -1;
        push @bad, "$i: 429 with retry-after-ms $ms"
            unless $ms > 0 && $ms <= 180_000;
        push @bad, "$i: 429 with retry-after "
                   . ($h->{'retry-after'} // 'none')
            unless ($h->{'retry-after'} // -1) == int(($ms + 999) / 1000);
        push @bad, "$i: 429 with remaining "
                   . ($h->{'x-ratelimit-remaining-requests'} // 'none')
            unless ($h->{'x-ratelimit-remaining-requests'} // '') eq '0'
                   && ($h->{'x-ratelimit-limit-requests'} // '') eq '20';
    } else {
        push @bad, "$i: $a->{status} " . ($a->{error} // $a->{body});
    }
}
my $ok = ($by{200}{a} // 0) + ($by{200}{b} // 0);
my $refused = ($by{429}{a} // 0) + ($by{429}{b} // 0);
is($ok, 20, "exactly 20 allowed (A " . ($by{200}{a} // 0) . ", B "
            . ($by{200}{b} // 0) . ")");
is($refused, 40, "the other 40 refused (A " . ($by{429}{a} // 0) . ", B "
                 . ($by{429}{b} // 0) . ")");
is_deeply([sort { $a <=> $b } @remaining], [0 .. 19],
          'each 200 has its own remaining, 19 down to 0');
is_deeply(\@bad, [], 'every answer with the right headers and body')
    or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);

for my $n (qw(a b)) {
    my ($r) = http_burst([chat($n)]);
    is($r->{status}, 429, "then instance " . uc($n) . " refuses too");
}
my $u = used('rph', 'sk-fleet', 180_000_000);
ok($u > 19.5 && $u <= 20, "the shared bucket holds the 20 allowed ($u)");

# --- tokens: streamed completions charge one bucket ---------------------

sub stream {
    my ($n, $zone) = @_;
    return post($n, "/$zone/v1/completions", encode_json({
        model => 'fake-model', prompt => "a story",
        stream => JSON::PP::true }));
}

@ans = http_burst([map { stream($_ % 2 ? 'a' : 'b', 'tpd') } 1 .. 10],
                  timeout => 60);
my @codes = map { $_->{status} } @ans;
is_deeply(\@codes, [(200) x 10], '10 streams at once, 5 on each: answered');
my @done = grep { $_->{body} =~ /data: \[DONE\]\n\n\z/ } @ans;
is(scalar @done, 10, 'each stream ends with [DONE]');
my @lim = grep { ($_->{headers}{'x-ratelimit-limit-tokens'} // '') eq '1000' }
          @ans;
is(scalar @lim, 10, 'each with the tokens headers');
$u = wait_used(40, 'tpd', 'sk-fleet', 86_400_000);
ok(abs($u - 40) < 0.5, "the shared bucket took 10 x (3 + 1) ($u)");

# the small bucket: streams in turn on A and B until it cannot hold the
# estimate
my ($est, $k, @seq) = (undef, 0);
for my $i (0 .. 20) {
    my $n = $i % 2 ? 'b' : 'a';
    my ($r) = http_burst([stream($n, 'small')], timeout => 30);
    push @seq, uc($n) . ":$r->{status}";
    if ($r->{status} != 200) {
        is($r->{status}, 429, "stream " . ($i + 1) . " on " . uc($n)
                              . ": refused");
        is($r->{json}{error}{type}, 'tokens', '... by the tokens limit');
        like($r->{json}{error}{message}, qr/^Rate limit reached for tokens per day \(TPD\) in omni_limit_zone "small": Limit 60, Used \d+, Requested $est\./,
             '... in OpenAI\'s words, its estimate requested');
        last;
    }
    $est //= 60 - $r->{headers}{'x-ratelimit-remaining-tokens'};
    $k++;
    my $u = wait_used(4 * $k, 'small', 'sk-fleet', 86_400_000);
    ok(abs($u - 4 * $k) < 0.5, "stream $k on " . uc($n)
                               . ": the bucket holds 4 x $k ($u)");
}
note("streams: @seq; estimate $est");
# admitted while 60 - 4 k >= estimate
is($k, int((60 - $est) / 4) + 1, "the streams the bucket had room for ($k)");

for my $n (qw(a b)) {
    my $log = main::slurp("$srv{$n}{prefix}/logs/error.log");
    my @w = grep { /\[(?:error|crit|alert|emerg)\]|exited on signal/ }
            split /\n/, $log;
    is_deeply(\@w, [], "instance " . uc($n) . ": nothing at [error] or worse");
}

omni_server_stop($_) for values %srv;
done_testing();

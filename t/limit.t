# omni_limit_zone / omni_limit / omni_limit_fail against a Redis of the
# suite's own (t/lib/Redis.pm), one nginx worker, the stand-in engine
# (t/lib/FakeEngine.pm: its DONE says 3 prompt and 1 completion tokens,
# 3 and 2 for speech) and, for the usage it reports, the real one:
#
#   - a requests limit: x-ratelimit-{limit,remaining,reset}-requests
#     counting down, the N+1th a 429 with OpenAI's error (type requests,
#     code rate_limit_exceeded, its words) and retry-after(-ms);
#   - the reset of a fresh bucket is one unit's time, in Go's duration
#     format, for r/s, r/m, r/h, r/d; t/s, t/m, t/h, t/d: the tokens
#     headers and OpenAI's words for each; burst= is the bucket;
#   - keys: key=$http_x_user (one bucket per value, none for an empty
#     value), the default API key (with omni_api_keys: an unknown key is
#     a 401 that costs nothing); Redis holds their SHA-1 only, never the
#     key (its keys, and every command it was sent: MONITOR);
#   - two limits in a location: the tightest in the headers; refused by
#     one, charged to none (a requests limit refused in preaccess, a
#     tokens limit refused at admission, a prompt too large for a bucket);
#   - tokens: only chat, completions and speech are charged; the
#     admission estimate (the engine request's bytes / 4), corrected at
#     the end to the DONE's prompt + completion tokens, streamed or not,
#     with the fake and with the real engine (the usage its answer
#     reports); a prompt larger than the bucket: 429 "Request too large",
#     x-should-retry: false, charged nothing;
#   - omni_limit_fail with a Redis that is not there: open (200, no
#     headers) and closed (503 rate_limit_unavailable, Retry-After);
#   - omni_redis over a Unix socket, with an ACL user and password, a
#     database and a key namespace;
#   - the metrics: omni_nginx_limit_total, omni_nginx_redis_*,
#     omni_nginx_limit_fail_total;
#   - an internal redirect (error_page to a fallback) is checked and
#     charged once;
#   - configuration errors: nginx -t fails, naming the mistake.
#
# omni_redis has timeout=5s: on a loaded machine Redis may answer later
# than the default 200 ms, and a call that times out fails open, which a
# block would take for a wrong count.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use t::lib::FakeEngine;
use t::lib::Redis;
use Test::Nginx::Socket 'no_plan';
use Digest::SHA qw(sha1_hex);
use File::Path qw(make_path);
use HTTP::Tiny;
use IO::Socket::UNIX;
use POSIX qw(ceil);
use Time::HiRes qw(time sleep);

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
our $redis = t::lib::Redis->start(unix => 1);
$ENV{TEST_NGINX_REDIS} = $redis->addr;
$ENV{TEST_NGINX_REDIS_SOCKET} = $redis->{socket};
# a user of Redis's ACLs, for omni_redis user= password=
$redis->cmd(qw(ACL SETUSER omni on >omni-pw ~* +@all));
$ENV{TEST_NGINX_DEAD_REDIS} = '127.0.0.1:' . t::lib::Redis::free_port();
$ENV{TEST_NGINX_FAKE_SOCKET} = "$main::TMP/fake-engine.sock";
our $fake = fake_engine_start($ENV{TEST_NGINX_FAKE_SOCKET});
# a socket file nothing listens on: connect() is refused (an [error],
# where a missing file would be a [crit])
$ENV{TEST_NGINX_REFUSING_SOCKET} = "$main::TMP/refusing.sock";
IO::Socket::UNIX->new(Local => $ENV{TEST_NGINX_REFUSING_SOCKET},
                      Listen => 1) or die "refusing.sock: $!\n";

our %PERIOD = (s => 1000, m => 60_000, h => 3_600_000, d => 86_400_000);

# nginx's freed memory is overwritten (glibc's MALLOC_PERTURB_, read by
# the nginx processes Test::Nginx starts from here on), so that a request
# used after it was freed shows as a worker that dies
$ENV{MALLOC_PERTURB_} //= 165;

# each block starts from an empty Redis
add_block_preprocessor(sub { $redis->cmd('FLUSHALL') });

sub chat_json {
    my ($content, %o) = @_;
    return encode_json({ model => $M,
        messages => [{ role => 'user', content => $content }], %o });
}

sub chat {
    my ($content, %o) = @_;
    my $prefix = delete $o{prefix} // '';
    return "POST $prefix/v1/chat/completions\n" . chat_json($content, %o);
}

# A request of the check's own: { status, h => { lowercase => value },
# json, body }.
sub api {
    my ($method, $path, %o) = @_;
    my $url = "http://127.0.0.1:$ENV{TEST_NGINX_SERVER_PORT}$path";
    my %h = %{ $o{headers} // {} };
    $h{'Content-Type'} //= 'application/json' if defined $o{body};
    my $r = HTTP::Tiny->new(timeout => 30)->request($method, $url,
        { headers => \%h, defined $o{body} ? (content => $o{body}) : () });
    return { status => $r->{status}, h => $r->{headers},
             body => $r->{content},
             json => scalar eval { decode_json($r->{content}) } };
}

sub rkey { return "omni:limit:$_[0]:" . sha1_hex($_[1]) }

# A unit's microseconds, as the module passes it to the script.
sub unit_us {
    my ($rate, $unit) = @_;
    return sprintf('%.3f', $PERIOD{$unit} * 1000 / $rate);
}

sub redis_now {
    my $t = $redis->cmd('TIME');
    return $t->[0] * 1_000_000 + $t->[1];
}

# The units a bucket holds taken now (its TAT less Redis's clock).
sub used {
    my ($zone, $key, $rate, $unit) = @_;
    my $tat = $redis->cmd('GET', rkey($zone, $key));
    return 0 unless defined $tat;
    my $u = ($tat - redis_now()) / unit_us($rate, $unit);
    return $u < 0 ? 0 : $u;
}

# Polls until the bucket holds $want units taken (within 0.5; the end's
# correction is sent after the answer); returns what it holds last.
sub wait_used {
    my ($want, @bucket) = @_;
    my ($u, $until) = (0, time + 10);
    while (time < $until) {
        $u = used(@bucket);
        return $u if abs($u - $want) < 0.5;
        sleep 0.02;
    }
    return $u;
}

# Sets a bucket so that $left units are left in it.
sub fill_bucket {
    my ($zone, $key, $rate, $unit, $burst, $left) = @_;
    my $tat = redis_now() + ($burst - $left) * unit_us($rate, $unit);
    $redis->cmd('SET', rkey($zone, $key), sprintf('%.0f', $tat),
                'PX', 3_600_000);
}

# A Go duration ("250ms", "8.572s", "1h2m3.5s", "0s") in milliseconds.
sub go_ms {
    my ($d) = @_;
    return undef unless defined $d;
    return $1 + 0 if $d =~ /^(\d+)ms$/;
    $d =~ /^(?:(\d+)h)?(?:(\d+)m)?(\d+(?:\.\d+)?)s$/ or return undef;
    return (($1 // 0) * 3600 + ($2 // 0) * 60 + $3) * 1000;
}

# The metrics' value of a line: metric('name{labels}', $text).
sub metric {
    my ($line, $text) = @_;
    return $text =~ /^\Q$line\E (\S+)$/m ? $1 + 0 : undef;
}

# Waits until the worker is connected to Redis (metrics say so).
sub redis_up {
    my $until = time + 10;
    while (time < $until) {
        my $m = api(GET => '/metrics');
        return 1 if (metric('omni_nginx_redis_up', $m->{body}) // 0) >= 1;
        sleep 0.02;
    }
    return 0;
}

run_tests();

# --- configuration errors: nginx -t fails, naming the mistake -------------

my $dir = "$main::TMP/conf-test";
make_path("$dir/conf", "$dir/logs");
my $redis_line = "omni_redis $ENV{TEST_NGINX_REDIS};";
my $loc = 'server { listen 127.0.0.1:%d; location /v1/ { %s omni_pass '
          . "unix:$ENV{TEST_NGINX_FAKE_SOCKET}; } }";
my @bad = (
    ['omni_limit_zone without omni_redis',
     "omni_limit_zone zone=a rate=1r/s;",
     qr/"omni_limit_zone" needs "omni_redis"/],
    ['a rate without a unit', "$redis_line omni_limit_zone zone=a rate=10;",
     qr/invalid parameter "rate=10" of "omni_limit_zone"/],
    ['a rate of neither r nor t',
     "$redis_line omni_limit_zone zone=a rate=1x/s;",
     qr/invalid parameter "rate=1x\/s"/],
    ['a rate of 0', "$redis_line omni_limit_zone zone=a rate=0r/s;",
     qr/invalid parameter "rate=0r\/s"/],
    ['a period not s, m, h or d',
     "$redis_line omni_limit_zone zone=a rate=1r/w;",
     qr/invalid parameter "rate=1r\/w"/],
    ['burst=0', "$redis_line omni_limit_zone zone=a rate=1r/s burst=0;",
     qr/invalid parameter "burst=0"/],
    ['burst=x', "$redis_line omni_limit_zone zone=a rate=1r/s burst=x;",
     qr/invalid parameter "burst=x"/],
    ['no rate=', "$redis_line omni_limit_zone zone=a;",
     qr/"omni_limit_zone" must have "zone=" and "rate="/],
    ['no zone=', "$redis_line omni_limit_zone rate=1r/s;",
     qr/"omni_limit_zone" must have "zone=" and "rate="/],
    ['an unknown parameter',
     "$redis_line omni_limit_zone zone=a rate=1r/s nodelay;",
     qr/invalid parameter "nodelay" of "omni_limit_zone"/],
    ['a zone defined twice',
     "$redis_line omni_limit_zone zone=a rate=1r/s; "
     . "omni_limit_zone zone=a rate=2r/s;",
     qr/omni_limit_zone "a" is duplicate/],
    ['omni_limit naming no zone',
     "$redis_line omni_limit_zone zone=a rate=1r/s; "
     . sprintf($loc, 1, 'omni_limit a nope;'),
     qr/omni_limit "nope": no "omni_limit_zone zone=nope"/],
    ['omni_limit naming a zone twice',
     "$redis_line omni_limit_zone zone=a rate=1r/s; "
     . sprintf($loc, 1, 'omni_limit a a;'),
     qr/omni_limit "a" is listed twice/],
    ['omni_limit twice in a location',
     "$redis_line omni_limit_zone zone=a rate=1r/s; "
     . sprintf($loc, 1, 'omni_limit a; omni_limit a;'),
     qr/"omni_limit" directive is duplicate/],
    ['omni_redis twice', "$redis_line $redis_line",
     qr/"omni_redis" directive is duplicate/],
    ['omni_redis timeout=0', "omni_redis $ENV{TEST_NGINX_REDIS} timeout=0;",
     qr/invalid parameter "timeout=0" of "omni_redis"/],
    ['omni_redis password= empty',
     "omni_redis $ENV{TEST_NGINX_REDIS} password=;",
     qr/invalid parameter "password=" of "omni_redis"/],
    ['omni_redis namespace= empty',
     "omni_redis $ENV{TEST_NGINX_REDIS} namespace=;",
     qr/invalid parameter "namespace=" of "omni_redis"/],
    ['key= empty', "$redis_line omni_limit_zone zone=a rate=1r/s key=;",
     qr/invalid parameter "key=" of "omni_limit_zone"/],
    ['omni_redis user= without password=',
     "omni_redis $ENV{TEST_NGINX_REDIS} user=omni;",
     qr/"omni_redis" directive has "user=" without "password="/],
    ['omni_limit_fail neither open nor closed',
     "$redis_line omni_limit_fail maybe;", qr/invalid value "maybe"/],
);
for my $b (@bad) {
    my ($what, $http, $re) = @$b;
    open(my $fh, '>', "$dir/conf/nginx.conf") or die $!;
    print $fh "load_module $ENV{TEST_NGINX_OMNI_MODULE};\n"
              . "error_log logs/error.log;\npid logs/nginx.pid;\n"
              . "events {}\nhttp {\n$http\n}\n";
    close $fh;
    my $out = `$ENV{TEST_NGINX_BINARY} -t -p $dir/ -c conf/nginx.conf 2>&1`;
    isnt($?, 0, "nginx -t: $what: fails");
    like($out, $re, "nginx -t: $what: says so") or diag($out);
    like($out, qr/\[emerg\]/, "nginx -t: $what: at emerg");
}

__DATA__

=== TEST 1: a requests limit: the headers count down; the 4th is OpenAI's 429
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=rpm rate=3r/m;
--- config
    location /v1/ {
        omni_limit rpm;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[map { ::chat('hi') } 1 .. 4]
--- error_code eval
[200, 200, 200, 429]
--- response_headers_like eval
["x-ratelimit-limit-requests: 3
x-ratelimit-remaining-requests: 2
x-ratelimit-reset-requests: 20s",
"x-ratelimit-limit-requests: 3
x-ratelimit-remaining-requests: 1
x-ratelimit-reset-requests: (?:3\\d(?:\\.\\d+)?s|40s)",
"x-ratelimit-limit-requests: 3
x-ratelimit-remaining-requests: 0
x-ratelimit-reset-requests: (?:5\\d(?:\\.\\d+)?s|1m0s)",
"x-ratelimit-limit-requests: 3
x-ratelimit-remaining-requests: 0
x-ratelimit-reset-requests: (?:5\\d(?:\\.\\d+)?s|1m0s)
retry-after: (?:1\\d|20)
retry-after-ms: (?:1\\d{4}|20000)
content-type: application/json"]
--- raw_response_headers_unlike eval
[("(?i)x-ratelimit-[a-z]+-tokens|x-should-retry") x 4]
--- check
if ($i < 3) {
    is($json->{choices}[0]{message}{content}, 'fake', "$name: answered");
    return;
}
error_is($json, 'requests', undef, 'rate_limit_exceeded', $name);
like($json->{error}{message}, qr/^Rate limit reached for requests per min \(RPM\) in omni_limit_zone "rpm": Limit 3, Used 3, Requested 1\. Please try again in 1?\d(?:\.\d+)?s\.$/,
     "$name: OpenAI's words");
# the same in a request of the check's own: the wait it names is
# retry-after-ms's, and retry-after is that in whole seconds, rounded up
my $r = ::api(POST => '/v1/chat/completions', body => ::chat_json('hi'),
              headers => { Authorization => 'Bearer sk-one' });
is($r->{status}, 429, "$name: still refused");
my $ms = $r->{h}{'retry-after-ms'};
my ($in) = $r->{json}{error}{message} =~ /try again in (\S+)\.$/;
is(::go_ms($in), $ms, "$name: the message's wait is retry-after-ms");
is($r->{h}{'retry-after'}, ceil($ms / 1000), "$name: retry-after rounds up");
like(main::slurp("$ENV{TEST_NGINX_SERVROOT}/logs/error.log"),
     qr/\[info\] .*omni limit: refused by omni_limit_zone "rpm"/,
     "$name: the refusal logged at info");
--- no_error_log
[error]



=== TEST 2: the reset of a fresh bucket is one unit's time (r/s, r/m, r/h, r/d), in Go's format
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=s rate=4r/s;
    omni_limit_zone zone=m rate=7r/m;
    omni_limit_zone zone=h rate=7r/h;
    omni_limit_zone zone=d rate=1r/d;
--- config
    location /s/ {
        omni_limit s;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /m/ {
        omni_limit m;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /h/ {
        omni_limit h;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /d/ {
        omni_limit d;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[::chat('hi', prefix => '/s'), ::chat('hi', prefix => '/m'),
 ::chat('hi', prefix => '/h'), ::chat('hi', prefix => '/d'),
 ::chat('hi', prefix => '/d')]
--- error_code eval
[200, 200, 200, 200, 429]
--- response_headers_like eval
["x-ratelimit-limit-requests: 4
x-ratelimit-remaining-requests: 3
x-ratelimit-reset-requests: 250ms",
"x-ratelimit-limit-requests: 7
x-ratelimit-remaining-requests: 6
x-ratelimit-reset-requests: 8\\.572s",
"x-ratelimit-limit-requests: 7
x-ratelimit-remaining-requests: 6
x-ratelimit-reset-requests: 8m34\\.286s",
"x-ratelimit-limit-requests: 1
x-ratelimit-remaining-requests: 0
x-ratelimit-reset-requests: 24h0m0s",
"x-ratelimit-reset-requests: 2[34]h\\d+m\\d+(?:\\.\\d+)?s
retry-after: 8\\d{4}
retry-after-ms: 8\\d{7}"]
--- check
like($json->{error}{message}, qr/requests per day \(RPD\) in omni_limit_zone "d": Limit 1, Used 1, Requested 1\. Please try again in 2[34]h/,
     "$name: OpenAI's words for a day") if $i == 4;



=== TEST 3: burst= is the bucket: 5 at once at 1r/m, the 6th waits a minute
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=b rate=1r/m burst=5;
--- config
    location /v1/ {
        omni_limit b;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[map { ::chat('hi') } 1 .. 6]
--- error_code eval
[200, 200, 200, 200, 200, 429]
--- response_headers_like eval
[map({ "x-ratelimit-limit-requests: 5\nx-ratelimit-remaining-requests: $_" }
     4, 3, 2, 1, 0),
 "x-ratelimit-limit-requests: 5
x-ratelimit-remaining-requests: 0
x-ratelimit-reset-requests: (?:4m5\\d(?:\\.\\d+)?s|5m0s)
retry-after: 60
retry-after-ms: (?:5\\d{4}|60000)"]
--- check
like($json->{error}{message}, qr/Limit 5, Used 5, Requested 1\./,
     "$name: the limit is the burst") if $i == 5;



=== TEST 4: t/s, t/m, t/h, t/d: the tokens headers and OpenAI's words
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=ts rate=1000t/s burst=60;
    omni_limit_zone zone=tm rate=7000t/m burst=60;
    omni_limit_zone zone=th rate=7000t/h burst=60;
    omni_limit_zone zone=td rate=1000t/d burst=60;
--- config
    location /ts/ {
        omni_limit ts;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /tm/ {
        omni_limit tm;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /th/ {
        omni_limit th;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /td/ {
        omni_limit td;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('hi', prefix => '/td')
--- more_headers
Authorization: Bearer sk-one
--- error_code: 200
--- raw_response_headers_unlike: (?i)x-ratelimit-[a-z]+-requests
--- check
my %words = (ts => 'tokens per sec (TPS)', tm => 'tokens per min (TPM)',
             th => 'tokens per hour (TPH)', td => 'tokens per day (TPD)');
my %rate = (ts => 1000, tm => 7000, th => 7000, td => 1000);
# the block's own request is corrected first (3 + 1), then its bucket
# is emptied, as the others are
my $u = ::wait_used(4, 'td', 'sk-one', 1000, 'd');
ok(abs($u - 4) < 0.5, "$name: td: corrected to 4 ($u)");
for my $z (qw(ts tm th td)) {
    my $unit = substr($z, 1);
    $::redis->cmd('DEL', ::rkey($z, 'sk-one'));
    my $r = ::api(POST => "/$z/v1/chat/completions",
                  body => ::chat_json('hi'),
                  headers => { Authorization => 'Bearer sk-one' });
    is($r->{status}, 200, "$name: $z: answered");
    is($r->{h}{'x-ratelimit-limit-tokens'}, 60, "$name: $z: limit 60");
    # a fresh bucket took the estimate: its reset is the estimate's time
    my $est = 60 - $r->{h}{'x-ratelimit-remaining-tokens'};
    ok($est > 10 && $est < 60, "$name: $z: an estimate ($est)");
    my $want = ceil($est * ::unit_us($rate{$z}, $unit) / 1000);
    my $got = ::go_ms($r->{h}{'x-ratelimit-reset-tokens'});
    ok(defined $got && abs($got - $want) <= 1,
       "$name: $z: reset-tokens $r->{h}{'x-ratelimit-reset-tokens'} is "
       . "$est tokens' time (${want} ms)");
    $r = ::api(POST => "/$z/v1/chat/completions",
               body => ::chat_json('x' x 400),
               headers => { Authorization => 'Bearer sk-one' });
    is($r->{status}, 429, "$name: $z: a prompt too large for it");
    like($r->{json}{error}{message},
         qr/^Request too large for \Q$words{$z}\E in omni_limit_zone "$z": Limit 60, Requested \d+\./,
         "$name: $z: $words{$z}");
}



=== TEST 5: key=$http_x_user: a bucket per value; an empty value is not limited; Redis holds the SHA-1
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=u rate=2r/m key=$http_x_user;
--- config
    location /v1/ {
        omni_limit u;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers eval
["X-User: alice", "X-User: alice", "X-User: alice", "X-User: bob",
 "", "", ""]
--- request eval
[map { ::chat('hi') } 1 .. 7]
--- error_code eval
[200, 200, 429, 200, 200, 200, 200]
--- response_headers_like eval
["x-ratelimit-remaining-requests: 1", "x-ratelimit-remaining-requests: 0",
 "x-ratelimit-remaining-requests: 0", "x-ratelimit-remaining-requests: 1",
 "x-ratelimit-limit-requests: ", "x-ratelimit-limit-requests: ",
 "x-ratelimit-limit-requests: "]
--- check
return unless $i == 6;
is_deeply([$::redis->keys('*')],
          [sort map { ::rkey('u', $_) } qw(alice bob)],
          "$name: one key per value, its SHA-1, none for an empty one");



=== TEST 6: the API key by default (omni_api_keys): unknown keys are 401s that cost nothing; the key is never in Redis
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=k rate=2r/m;
    omni_limit_zone zone=kt rate=1000t/d;
--- config
    location /v1/ {
        omni_api_keys $TEST_NGINX_SERVROOT/html/keys.txt;
        omni_limit k kt;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- user_files
>>> keys.txt
sk-right-key-0001
sk-second-key-0002
--- more_headers eval
["Authorization: Bearer sk-wrong-key-9999", "",
 "Authorization: Bearer sk-right-key-0001",
 "Authorization: Bearer sk-right-key-0001",
 "Authorization: Bearer sk-right-key-0001",
 "Authorization: Bearer sk-second-key-0002"]
--- request eval
[map { ::chat('hi') } 1 .. 6]
--- error_code eval
[401, 401, 200, 200, 429, 200]
--- response_headers_like eval
["x-ratelimit-limit-requests: ", "x-ratelimit-limit-requests: ",
 "x-ratelimit-remaining-requests: 1", "x-ratelimit-remaining-requests: 0",
 "x-ratelimit-remaining-requests: 0", "x-ratelimit-remaining-requests: 1"]
--- init
$::redis->monitor_start;
--- check
return unless $i == 5;
my @cmds = $::redis->monitor_stop;
ok(@cmds >= 4, "$name: Redis was sent commands (" . @cmds . ")");
my @leak = grep { /sk-(?:right|second|wrong)/ } @cmds, $::redis->keys('*');
is_deeply(\@leak, [], "$name: no key in clear in any command or key");
is_deeply([$::redis->keys('*')],
          [sort map { (::rkey('k', $_), ::rkey('kt', $_)) }
                qw(sk-right-key-0001 sk-second-key-0002)],
          "$name: the known keys' SHA-1 only, none for the unknown");
--- no_error_log
sk-right-key-0001
sk-second-key-0002
sk-wrong-key-9999



=== TEST 7: two requests limits: the tightest in the headers; refused by one, charged to neither
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=a rate=2r/m;
    omni_limit_zone zone=b rate=10r/h;
--- config
    location /v1/ {
        omni_limit b a;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[map { ::chat('hi') } 1 .. 4]
--- error_code eval
[200, 200, 429, 429]
--- response_headers_like eval
["x-ratelimit-limit-requests: 2\nx-ratelimit-remaining-requests: 1",
 "x-ratelimit-limit-requests: 2\nx-ratelimit-remaining-requests: 0",
 "x-ratelimit-limit-requests: 2\nx-ratelimit-remaining-requests: 0",
 "x-ratelimit-limit-requests: 2\nx-ratelimit-remaining-requests: 0"]
--- check
return unless $i == 3;
like($json->{error}{message}, qr/omni_limit_zone "a": Limit 2, Used 2/,
     "$name: refused by a");
my $b = ::used('b', 'sk-one', 10, 'h');
ok($b > 1.5 && $b <= 2, "$name: b holds the 2 allowed only ($b)");



=== TEST 8: requests and tokens: a tokens refusal at admission gives the request's units back
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=r rate=10r/h;
    omni_limit_zone zone=t rate=1000t/d burst=200;
--- config
    location /v1/ {
        omni_limit r t;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- init
::fill_bucket('t', 'sk-one', 1000, 'd', 200, 10);
--- more_headers
Authorization: Bearer sk-one
--- request eval
::chat('hi')
--- error_code: 429
--- response_headers_like
x-ratelimit-limit-tokens: 200
x-ratelimit-remaining-tokens: 10
retry-after-ms: \d+
--- check
error_is($json, 'tokens', undef, 'rate_limit_exceeded', $name);
like($json->{error}{message}, qr/^Rate limit reached for tokens per day \(TPD\) in omni_limit_zone "t": Limit 200, Used 190, Requested \d+\. Please try again in /,
     "$name: OpenAI's words");
my $r = ::wait_used(0, 'r', 'sk-one', 10, 'h');
ok($r < 0.5, "$name: the requests limit holds nothing ($r)");
my $t = ::used('t', 'sk-one', 1000, 'd');
ok($t > 189 && $t <= 190, "$name: the tokens limit took nothing ($t)");



=== TEST 9: a prompt no bucket could hold: 429 "Request too large", x-should-retry: false, nothing charged
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=r rate=10r/h;
    omni_limit_zone zone=t rate=100t/m;
--- config
    location /v1/ {
        omni_limit r t;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
::chat('x' x 1000)
--- error_code: 429
--- response_headers
x-should-retry: false
!retry-after
!retry-after-ms
--- check
error_is($json, 'tokens', undef, 'rate_limit_exceeded', $name);
my ($n) = $json->{error}{message} =~ /^Request too large for tokens per min \(TPM\) in omni_limit_zone "t": Limit 100, Requested (\d+)\. The input is too long for this limit: send a shorter one\.$/;
ok($n && $n >= 250, "$name: OpenAI's words, the estimate (" . ($n // '?')
   . ")");
my $r = ::wait_used(0, 'r', 'sk-one', 10, 'h');
ok($r < 0.5, "$name: the requests limit holds nothing ($r)");
is($::redis->cmd('GET', ::rkey('t', 'sk-one')), undef,
   "$name: the tokens limit took nothing");
--- error_log
omni limit: refused by omni_limit_zone "t" (too large)



=== TEST 10: tokens: only chat, completions and speech are charged, answers with audio corrected too
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=r rate=100r/h;
    omni_limit_zone zone=t rate=1000t/d burst=100000;
--- config
    location /v1/ {
        omni_limit r t;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
["GET /v1/models",
 "POST /v1/audio/speech\n" . JSON::PP::encode_json({ model => 'tts-1',
     input => 'Hello there.', voice => 'alloy' }),
 "POST /v1/completions\n" . JSON::PP::encode_json({ model => $::M,
     prompt => 'Hi' }),
 ::chat('hi'),
 ::chat('hi', modalities => ['text', 'audio'],
        audio => { voice => 'alloy', format => 'pcm16' })]
--- error_code eval
[200, 200, 200, 200, 200]
--- response_headers_like eval
["x-ratelimit-remaining-requests: 99",
 "x-ratelimit-remaining-requests: 98\nx-ratelimit-limit-tokens: 100000",
 "x-ratelimit-remaining-requests: 97\nx-ratelimit-limit-tokens: 100000",
 "x-ratelimit-remaining-requests: 96\nx-ratelimit-limit-tokens: 100000",
 "x-ratelimit-remaining-requests: 95\nx-ratelimit-limit-tokens: 100000"]
--- check
if ($i == 0) {
    is($::redis->cmd('GET', ::rkey('t', 'sk-one')), undef,
       "$name: models: no tokens taken");
} elsif ($i == 1) {
    # speech: the DONE of an answer with audio (3 + 2)
    my $u = ::wait_used(5, 't', 'sk-one', 1000, 'd');
    ok(abs($u - 5) < 0.5, "$name: speech: corrected to 5 ($u)");
} elsif ($i == 4) {
    # speech 3 + 2, completions 3 + 1, chat 3 + 1, chat with audio 3 + 2
    my $u = ::wait_used(18, 't', 'sk-one', 1000, 'd');
    ok(abs($u - 18) < 0.5, "$name: 18 tokens in all ($u)");
    my $r = ::api(POST => '/v1/audio/transcriptions',
        headers => { Authorization => 'Bearer sk-one',
                     'Content-Type' => 'multipart/form-data; boundary=XyZ' },
        body => "--XyZ\r\nContent-Disposition: form-data; name=\"model\""
                . "\r\n\r\nwhisper-1\r\n--XyZ\r\nContent-Disposition: "
                . "form-data; name=\"file\"; filename=\"a.wav\"\r\n"
                . "Content-Type: audio/wav\r\n\r\nRIFFxxxxWAVEdata\r\n"
                . "--XyZ--\r\n");
    is($r->{status}, 200, "$name: a transcription");
    is($r->{h}{'x-ratelimit-remaining-requests'}, 94,
       "$name: transcription: a request taken");
    ok(!exists $r->{h}{'x-ratelimit-limit-tokens'},
       "$name: transcription: no tokens headers");
    sleep 0.2;
    $u = ::used('t', 'sk-one', 1000, 'd');
    ok(abs($u - 18) < 0.5, "$name: transcription: no tokens taken ($u)");
}
--- no_error_log
[error]



=== TEST 11: the estimate at admission (bytes / 4), corrected at the end to the DONE's prompt + completion, streamed or not
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=t rate=1000t/d burst=100000;
--- config
    location /v1/ {
        omni_limit t;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
::chat('x' x 400)
--- error_code: 200
--- response_headers_like
x-ratelimit-limit-tokens: 100000
x-ratelimit-remaining-tokens: 99[89]\d\d
--- check
my @kinds = (
    ['chat', '/v1/chat/completions', ::chat_json('x' x 400)],
    ['streamed chat', '/v1/chat/completions',
     ::chat_json('x' x 400, stream => JSON::PP::true)],
    ['streamed completion', '/v1/completions',
     encode_json({ model => $::M, prompt => 'x' x 400,
                   stream => JSON::PP::true })],
    ['streamed chat with usage', '/v1/chat/completions',
     ::chat_json('x' x 400, stream => JSON::PP::true,
                 stream_options => { include_usage => JSON::PP::true })],
);
# the first request (the block's own): 3 + 1 in the end
my $u = ::wait_used(4, 't', 'sk-one', 1000, 'd');
ok(abs($u - 4) < 0.5, "$name: corrected to 4 ($u)");
my $before = 4;
for my $k (@kinds) {
    my ($what, $path, $body) = @$k;
    my $r = ::api(POST => $path, body => $body,
                  headers => { Authorization => 'Bearer sk-one' });
    is($r->{status}, 200, "$name: $what: answered");
    my $est = 100000 - $before - $r->{h}{'x-ratelimit-remaining-tokens'};
    ok($est >= 100 && $est <= 200,
       "$name: $what: the estimate is about the request's size ($est)");
    $u = ::wait_used($before + 4, 't', 'sk-one', 1000, 'd');
    ok(abs($u - $before - 4) < 0.5,
       "$name: $what: corrected to 4 more ($u)");
    $before += 4;
}
--- no_error_log
[error]



=== TEST 12: the real engine: the bucket takes the usage its answer reports, streamed or not
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=t rate=1000t/d burst=100000;
--- config
    location /v1/ {
        omni_limit t;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
::chat('Tell me a story', max_tokens => 24)
--- error_code: 200
--- check
my $total = $json->{usage}{total_tokens};
ok($total > 5, "$name: usage reported ($total)");
my $u = ::wait_used($total, 't', 'sk-one', 1000, 'd');
ok(abs($u - $total) < 0.5, "$name: the bucket took $total ($u)");
my $r = ::api(POST => '/v1/completions',
    headers => { Authorization => 'Bearer sk-one' },
    body => encode_json({ model => $::M, prompt => 'Once upon a time',
        max_tokens => 20, stream => JSON::PP::true,
        stream_options => { include_usage => JSON::PP::true } }));
is($r->{status}, 200, "$name: a streamed completion");
my ($usage) = grep { ref $_ && $_->{usage} } sse_events($r->{body});
my $more = $usage ? $usage->{usage}{total_tokens} : 0;
ok($more > 5, "$name: its usage ($more)");
$u = ::wait_used($total + $more, 't', 'sk-one', 1000, 'd');
ok(abs($u - $total - $more) < 0.5,
   "$name: the bucket took $more more ($u)");
--- no_error_log
[error]



=== TEST 13: the metrics: checks by zone, Redis's gauges and counters
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=rpm rate=2r/m;
    omni_limit_zone "zone=odd\zone" rate=100r/m;
--- config
    location /v1/ {
        omni_limit rpm "odd\zone";
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers eval
[("Authorization: Bearer sk-one") x 3, ""]
--- request eval
[::chat('hi'), ::chat('hi'), ::chat('hi'), "GET /metrics"]
--- error_code eval
[200, 200, 429, 200]
--- check
return unless $i == 3;
my %want = (
    'omni_nginx_limit_total{zone="rpm",result="allowed"}' => 2,
    'omni_nginx_limit_total{zone="rpm",result="refused"}' => 1,
    'omni_nginx_limit_total{zone="odd\\\\zone",result="allowed"}' => 2,
    'omni_nginx_limit_total{zone="odd\\\\zone",result="refused"}' => 0,
    'omni_nginx_redis_up' => 1,
    'omni_nginx_redis_pending' => 0,
    'omni_nginx_redis_connects_total' => 1,
    'omni_nginx_redis_errors_total{kind="down"}' => 0,
    'omni_nginx_redis_errors_total{kind="timeout"}' => 0,
    'omni_nginx_redis_errors_total{kind="busy"}' => 0,
    'omni_nginx_redis_errors_total{kind="reply"}' => 0,
    'omni_nginx_limit_fail_total{policy="open"}' => 0,
    'omni_nginx_limit_fail_total{policy="closed"}' => 0,
);
for my $l (sort keys %want) {
    is(::metric($l, $body), $want{$l}, "$name: $l");
}
is(::metric('omni_nginx_redis_seconds_count', $body), 3,
   "$name: three round trips timed");
like($body, qr/^# TYPE omni_nginx_redis_seconds histogram$/m,
     "$name: a histogram");
like($body, qr/^omni_nginx_redis_seconds_bucket\{le="\+Inf"\} 3$/m,
     "$name: its +Inf bucket");



=== TEST 14: Redis not there: omni_limit_fail open lets requests through bare, closed answers 503
--- http_config
    omni_redis $TEST_NGINX_DEAD_REDIS timeout=200ms;
    omni_limit_zone zone=rpm rate=1r/m;
--- config
    location /open/ {
        omni_limit rpm;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location /closed/ {
        omni_limit rpm;
        omni_limit_fail closed;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[::chat('hi', prefix => '/open'), ::chat('hi', prefix => '/open'),
 ::chat('hi', prefix => '/closed'), "GET /metrics"]
--- error_code eval
[200, 200, 503, 200]
--- response_headers_like eval
["content-type: application/json", "content-type: application/json",
 "retry-after: 1", "content-type: text/plain.*"]
--- raw_response_headers_unlike eval
[("(?i)x-ratelimit|retry-after-ms") x 4]
--- check
if ($i == 2) {
    error_is($json, 'server_error', undef, 'rate_limit_unavailable', $name);
    is($json->{error}{message},
       'The rate limiter is not available, please try again later.',
       "$name: its words");
} elsif ($i == 3) {
    is(::metric('omni_nginx_limit_fail_total{policy="open"}', $body), 2,
       "$name: two failed open");
    is(::metric('omni_nginx_limit_fail_total{policy="closed"}', $body), 1,
       "$name: one failed closed");
    is(::metric('omni_nginx_redis_up', $body), 0, "$name: not connected");
    is(::metric('omni_nginx_redis_errors_total{kind="down"}', $body), 3,
       "$name: three calls failed, down");
    like(main::slurp("$ENV{TEST_NGINX_SERVROOT}/logs/error.log"),
         qr/\[error\] .*omni redis: 127\.0\.0\.1:\d+: connect\(\) failed: Connection refused; until it answers again, omni_limit_fail decides/,
         "$name: the outage logged");
}



=== TEST 15: omni_redis over a Unix socket, with user=, password=, db= and namespace=
--- http_config
    omni_redis unix:$TEST_NGINX_REDIS_SOCKET user=omni password=omni-pw db=3
               namespace=fleet1: timeout=5s connect_timeout=5s;
    omni_limit_zone zone=rpm rate=2r/m;
--- config
    location /v1/ {
        omni_limit rpm;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[::chat('hi'), ::chat('hi'), ::chat('hi')]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
["x-ratelimit-remaining-requests: 1", "x-ratelimit-remaining-requests: 0",
 "x-ratelimit-remaining-requests: 0"]
--- check
return unless $i == 2;
is_deeply([$::redis->keys('*')], [], "$name: nothing in db 0");
$::redis->cmd('SELECT', 3);
is_deeply([$::redis->keys('*')],
          ['fleet1:limit:rpm:' . Digest::SHA::sha1_hex('sk-one')],
          "$name: db 3 holds the key, in the namespace");
$::redis->cmd('SELECT', 0);
my @c = grep { ($_->{user} // '') eq 'omni' } @{ $::redis->clients };
is(scalar @c, 1, "$name: one connection as user omni");
is($c[0]{db}, 3, "$name: on db 3");
like($c[0]{laddr} // $c[0]{addr}, qr/\Q$ENV{TEST_NGINX_REDIS_SOCKET}\E/,
     "$name: over the socket");
--- no_error_log
[error]



=== TEST 16: an internal redirect (error_page to a fallback engine) is checked and charged once, as limit_req does
--- http_config
    omni_redis $TEST_NGINX_REDIS timeout=5s connect_timeout=5s;
    omni_limit_zone zone=r rate=3r/h;
    omni_limit_zone zone=t rate=1000t/d burst=1000;
--- config
    location /v1/ {
        omni_limit r t;
        omni_pass unix:$TEST_NGINX_REFUSING_SOCKET;
        error_page 502 503 = @fallback;
    }
    location @fallback {
        omni_limit r t;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- more_headers
Authorization: Bearer sk-one
--- request eval
[map { ::chat('hi') } 1 .. 4]
--- error_code eval
[200, 200, 200, 429]
--- response_headers_like eval
["x-ratelimit-remaining-requests: 2", "x-ratelimit-remaining-requests: 1",
 "x-ratelimit-remaining-requests: 0", "x-ratelimit-remaining-requests: 0"]
--- check
if ($i < 3) {
    is($json->{choices}[0]{message}{content}, 'fake',
       "$name: answered by the fallback");
    my $u = ::wait_used(4 * ($i + 1), 't', 'sk-one', 1000, 'd');
    ok(abs($u - 4 * ($i + 1)) < 0.5,
       "$name: one estimate, corrected once ($u)");
}

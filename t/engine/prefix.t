# omni-engine serve --redis: what the engine publishes for nginx's
# prefix-aware routing (engine/proto/prefix_key.h), checked in a Redis of
# the test's own (redis-server on a Unix socket and a loopback port in a
# temporary folder, no persistence, with a password; stopped by pid at the
# end):
#
#   - `prefix-keys` prints the unit test's fixed vectors;
#   - bad --redis options are startup errors naming the option;
#   - the keys of each turn of a conversation appear with the TOKENS the
#     engine's own `prefix-keys` computes and the TTL asked for; a
#     cache_salt gives other keys; the load key appears and is refreshed;
#   - flooding the KV cache with other prompts evicts the blocks and their
#     keys go (prefix_keys_removed_total counts them);
#   - a thinker killed with SIGKILL (the frontend restarts it) leaves no
#     key behind: its successor deletes them at start;
#   - a wrong password is logged once, clearly, and serving goes on;
#   - Redis killed and started again: the keys are published again;
#   - SIGTERM removes the keys and the load key.
#
# Expected keys come from `omni-engine prefix-keys` (Perl has no XXH3),
# which the first block checks against the vectors of
# t/unit/test_prefix_key.c.
use strict;
use warnings;
use Test::More;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use lib '.';
use t::lib::Redis;
use t::lib::Proc qw(wait_for);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP);

my $PASS = 'omni-test-secret';
my $BS = 16;
my $TTL = 40;
my $SYSTEM = 'You are a storyteller for small children. Your stories are '
    . 'short and kind, they have a cat, a dog and a little girl named Lily '
    . 'in them, and they always end well. Use simple words and short '
    . 'sentences, and never say anything scary or sad.';
my $redis = t::lib::Redis->start(unix => 1, password => $PASS);
my ($RSOCK, $RPORT) = ($redis->{socket}, $redis->{port});

# One command's answer (a string, a number, undef).
sub rcli { return $redis->cmd(@_) }

# { key => value } of the keys matching the glob.
sub rkeys {
    my ($glob) = @_;
    return { map { ($_ => $redis->cmd('GET', $_)) } $redis->keys($glob) };
}

# The keys `prefix-keys` prints: [[i, hex, tokens], ...].
sub cli_keys {
    my ($req, @model) = @_;
    my ($rc, $out, $err) = run_engine('prefix-keys', @model, '--block-size',
                                      $BS, '--request', encode_json($req));
    die "prefix-keys: $err" if $rc != 0;
    return [ map { [split ' '] } split /\n/, $out ];
}

# hex => tokens of the keys the engine publishes for $req.
sub published {
    my ($req) = @_;
    return { map { $_->[1] => $_->[2] } grep { $_->[2] > 0 }
             @{ cli_keys($req, '--model', $MODEL) } };
}

sub px {
    my ($route) = @_;
    return "omni:px:$route:";
}

# Whether every key of $want (hex => tokens) is in Redis under $route with
# its tokens.
sub has_keys {
    my ($route, $want) = @_;
    for my $hex (keys %$want) {
        return 0 unless (rcli('GET', px($route) . $hex) // '') eq
                        $want->{$hex};
    }
    return 1;
}

sub chat {
    my (%o) = @_;
    return { messages => $o{messages}, max_tokens => $o{max_tokens} // 8,
             temperature => 0,
             ($o{salt} ? (cache_salt => $o{salt}) : ()) };
}

# --- prefix-keys: the unit test's fixed vectors ----------------------------
{
    my $req = { model => 'stories260K', cache_salt => 'tenant-7', messages => [
        { role => 'developer', content => 'You are a helpful assistant.' },
        { role => 'user', content => 'Hello' },
        { role => 'assistant', content => 'Hi! How can I help?' },
        { role => 'user', content => [{ type => 'text',
                                        text => 'Tell me a story about a cat.' }] },
    ] };
    is_deeply([map { $_->[1] } @{ cli_keys($req) }],
              [qw(abee3ac69268c01405c72c051998bee1
                  fb6a3da8fa8ad611a88fbeb20569863e
                  899c460e6a2f9d8dd99834a6efaf9264
                  777f1fd3f4ffb6c7b3264c7c8c26b5fb)],
              'prefix-keys: vector C of test_prefix_key.c');
    delete $req->{model};
    delete $req->{cache_salt};
    is(cli_keys($req)->[3][1], '7800294062ba54b9a28dda20679a5c2c',
       'prefix-keys: vector A (no model, no salt)');
    my $k = cli_keys($req, '--model', $MODEL);
    is(scalar(@$k), 4, 'prefix-keys --model: a line per message');
    ok(!grep({ $_->[2] % $BS } @$k), 'tokens are whole blocks');
    ok($k->[3][2] >= $k->[0][2] && $k->[3][2] > 0,
       "tokens grow with the conversation ($k->[0][2] .. $k->[3][2])");
}

# --- option errors --------------------------------------------------------
{
    my @base = ('serve', '--model', $MODEL, '--socket', "$TMP/x.sock");
    my @bad = (
        [['--redis', 'nowhere'], qr/'--redis': 'nowhere' is neither/],
        [['--redis', 'localhost:99999'], qr/'--redis'.*port/],
        [['--redis-db', '1'], qr/'--redis-db' needs '--redis'/],
        [['--redis', "unix:$RSOCK", '--redis-password-file',
          "$TMP/missing"], qr/'--redis-password-file': .*missing/],
        [['--redis', "unix:$RSOCK", '--redis-user', 'u'],
         qr/'--redis-user' needs '--redis-password-file'/],
        [['--redis', "unix:$RSOCK", '--prefix-ttl', '1'],
         qr/'--prefix-ttl' must be an integer in 3\.\.86400/],
        [['--redis', "unix:$RSOCK", '--redis-namespace', 'a b'],
         qr/'--redis-namespace'/],
        [['--redis', "unix:$RSOCK", '--route-id', ''], qr/'--route-id'/],
    );
    for my $b (@bad) {
        my ($rc, undef, $err) = run_engine(@base, @{ $b->[0] });
        is($rc, 1, "serve @{ $b->[0] }: exit 1");
        like($err, $b->[1], "serve @{ $b->[0] }: says why");
    }
}

my $pwfile = "$TMP/redis.pass";
open(my $pw, '>', $pwfile) or die;
print $pw "$PASS\n";
close $pw;

# every engine this test starts, stopped at the end even when it dies
# early (a stopped one is reaped already: kill 0 says so)
my @engines;
END {
    local $?;
    serve_stop($_, 10) for grep { kill 0, $_->{pid} } @engines;
}

my $srv = serve_start(args => ['--redis', "unix:$RSOCK",
                               '--redis-password-file', $pwfile,
                               '--prefix-ttl', $TTL, '--ctx', 256,
                               '--kv-cache-mb', 0.3, '--max-seqs', 4,
                               '--block-size', $BS]);
push @engines, $srv;
my $ROUTE = "unix:$srv->{socket}";

# --- the keys of each turn -------------------------------------------------
my @turn1 = ({ role => 'system', content => $SYSTEM },
             { role => 'user', content => 'Tell me a story about the cat.' });
my ($want1, $want2);
{
    my $r = request($srv, chat(messages => \@turn1));
    ok($r->{done}, 'turn 1 answered') or diag explain $r;
    $want1 = published(chat(messages => \@turn1));
    is(scalar(keys %$want1), 2, 'turn 1: two keys to publish');
    ok(wait_for(5, sub { has_keys($ROUTE, $want1) }),
       'turn 1: its keys are in Redis with their tokens')
        or diag explain [rkeys(px($ROUTE) . '*'), $want1];
    my $all = rkeys(px($ROUTE) . '*');
    is(scalar(keys %$all), 2, 'turn 1: no other key');
    for my $hex (keys %$want1) {
        my $ttl = rcli('TTL', px($ROUTE) . $hex);
        ok($ttl > $TTL - 10 && $ttl <= $TTL, "turn 1: TTL $ttl of $TTL");
    }

    my @turn2 = (@turn1, { role => 'assistant', content => $r->{text} },
                 { role => 'user', content => 'And one about the dog?' });
    $r = request($srv, chat(messages => \@turn2));
    ok($r->{done}, 'turn 2 answered');
    ok($r->{done}{cached_tokens} > 0, 'turn 2 hit the prefix cache');
    $want2 = published(chat(messages => \@turn2));
    is(scalar(keys %$want2), 4, 'turn 2: four keys to publish');
    ok(!grep({ !exists $want2->{$_} } keys %$want1),
       "turn 2's keys include turn 1's");
    ok(wait_for(5, sub { has_keys($ROUTE, $want2) }),
       'turn 2: its keys are in Redis with their tokens')
        or diag explain [rkeys(px($ROUTE) . '*'), $want2];

    my $salted = chat(messages => \@turn1, salt => 'tenant-a');
    $r = request($srv, $salted);
    ok($r->{done}, 'salted request answered');
    is($r->{done}{cached_tokens}, 0, 'another salt shares no block');
    my $want_s = published($salted);
    ok(!grep({ exists $want1->{$_} } keys %$want_s),
       'another salt, other keys');
    ok(wait_for(5, sub { has_keys($ROUTE, $want_s) }),
       "the salted request's keys are in Redis");
}

# --- the load key ----------------------------------------------------------
{
    my $load = "omni:load:$ROUTE";
    like(rcli('GET', $load), qr/^\d+ \d+ 4$/, 'load key: RUNNING WAITING '
         . 'MAX_SEQS (' . (rcli('GET', $load) // 'none') . ')');
    my $p1 = rcli('PTTL', $load);
    sleep 2.2;
    my $p2 = rcli('PTTL', $load);
    ok($p1 > 0 && $p1 <= 5000, "load key: expires within 5 s ($p1 ms)");
    ok($p2 > 3300, "load key: refreshed each second ($p2 ms left after "
       . '2.2 s)');
    my $m = metrics($srv);
    is($m->{omni_engine_redis_up}, 1, 'metrics: redis_up 1');
    ok($m->{omni_engine_prefix_keys_held} >= 6,
       "metrics: prefix_keys_held $m->{omni_engine_prefix_keys_held}");
    ok($m->{omni_engine_prefix_keys_published_total} >= 6,
       'metrics: prefix_keys_published_total');
    ok($m->{omni_engine_prefix_resyncs_total} >= 1,
       'metrics: prefix_resyncs_total counts the start');
    is($m->{omni_engine_redis_errors_total}, 0, 'metrics: no redis error');
}

# --- eviction: flooding the cache removes the keys -------------------------
{
    my @flood = map {
        chat(messages => [{ role => 'user', content => "Story number $_: "
            . join(' ', map { "word$_" } 1 .. 25) }], max_tokens => 4)
    } 1 .. 6;
    my @r = map { request($srv, $_) } @flood;
    is(scalar(grep { $_->{done} } @r), 6, 'flood answered');
    ok(wait_for(5, sub {
        !grep { length(rcli('GET', px($ROUTE) . $_) // '') } keys %$want2 }),
       "the conversation's keys are gone after the flood")
        or diag explain [rkeys(px($ROUTE) . '*'), $want2];
    my $m = metrics($srv);
    ok($m->{omni_engine_prefix_keys_removed_total} >= 4,
       "metrics: prefix_keys_removed_total "
       . "$m->{omni_engine_prefix_keys_removed_total}");
}

# --- a killed thinker leaves no key ----------------------------------------
{
    my $r = request($srv, chat(messages => \@turn1));
    ok(wait_for(5, sub { has_keys($ROUTE, $want1) }), 'keys before the kill');
    my $pid = stage_pid($srv);
    kill 'KILL', $pid;
    ok(wait_for(30, sub { my $p = stage_pid($srv);
                            $p && $p != $pid && (health($srv))[0] == 200 }),
       'the thinker is back');
    ok(wait_for(5, sub { !%{ rkeys(px($ROUTE) . '*') } }),
       "its successor deleted the old incarnation's keys");
    $r = request($srv, chat(messages => \@turn1));
    ok(wait_for(5, sub { has_keys($ROUTE, $want1) }),
       'the next request publishes again');
}

# --- a wrong password: one clear error, serving goes on --------------------
{
    my $bad = "$TMP/bad.pass";
    open(my $f, '>', $bad) or die;
    print $f "wrong\n";
    close $f;
    my $b = serve_start(args => ['--redis', "127.0.0.1:$RPORT",
                                 '--redis-password-file', $bad,
                                 '--route-id', 'engine-b']);
    push @engines, $b;
    my $r = request($b, chat(messages => \@turn1));
    ok($r->{done}, 'wrong password: the request is answered');
    sleep 2;
    my @lines = grep { /redis/ && /\[(warn|error)\]/ }
                split /\n/, slurp($b->{log});
    is(scalar(@lines), 1, 'wrong password: one line, however many retries')
        or diag explain \@lines;
    like($lines[0] // '', qr/\[error\] thinker: redis 127\.0\.0\.1:$RPORT: (?#
         )AUTH: authentication failed \("WRONGPASS/,
         'wrong password: the line quotes Redis');
    ok(!%{ rkeys('omni:*engine-b*') }, 'wrong password: nothing published');
    my $m = metrics($b);
    is($m->{omni_engine_redis_up}, 0, 'wrong password: redis_up 0');
    ok($m->{omni_engine_redis_errors_total} >= 2,
       'wrong password: redis_errors_total counts the tries');
    is(serve_stop($b), 0, 'wrong password: SIGTERM exits 0');
}

# --- Redis killed and started again: the keys come back --------------------
{
    ok(has_keys($ROUTE, $want1), 'keys before Redis goes');
    $redis->kill('KILL');
    my $r = request($srv, chat(messages => \@turn1));
    ok($r->{done}, 'Redis down: requests are answered');
    ok(wait_for(5, sub { slurp($srv->{log}) =~ /\[warn\] thinker: redis/ }),
       'Redis down: logged');
    $redis->restart;
    ok(wait_for(10, sub { has_keys($ROUTE, $want1) }),
       'Redis back: the keys are published again');
    ok(length(rcli('GET', "omni:load:$ROUTE") // ''),
       'Redis back: the load too');
    like(slurp($srv->{log}), qr/\[info\] thinker: redis \S+ is back after/,
         'Redis back: logged');
    my @warn = grep { /\[warn\] thinker: redis/ } split /\n/,
               slurp($srv->{log});
    is(scalar(@warn), 1, 'one line for the outage') or diag explain \@warn;
}

# --- SIGTERM removes everything ---------------------------------------------
{
    is(serve_stop($srv), 0, 'SIGTERM: exit 0');
    is_deeply(rkeys("omni:*$srv->{socket}*"), {},
              'SIGTERM: the keys and the load key are gone');
}

done_testing();

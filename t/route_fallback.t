# omni_prefix_route when the holder cannot take a request, or Redis
# cannot say who holds it (issue 14): whatever happens, the client gets
# its answer (200) from an engine, never an error. A Redis of the test's
# own, two real engines publishing to it (E1 with a tiny KV cache) under
# a namespace of their own, nginx with two workers and the upstream's
# peers in a shared zone (t/lib/RouteFleet.pm):
#
#   - the engine holding the most messages wins; when it is down, a holder
#     of fewer does;
#   - max_waiting=0 (every engine overloaded): fallback;
#   - the holder marked down: fallback to the other;
#   - eviction: E1 flooded with other prompts drops the conversation's
#     keys; its next turn misses, or hits E0 only where E0 holds a prefix
#     of it;
#   - Redis slowed by DEBUG SLEEP: fallback, answered while Redis still
#     sleeps (clients that leave while their lookup waits end their
#     request); hits again after;
#   - Redis killed: fallback, every request served; restarted: hits again;
#   - the holder killed (SIGKILL): answered by the other engine, as a
#     fallback (the chosen engine failed), then fallback while nginx
#     counts it failed;
#   - the access-log variables and omni_nginx_route_total agree with the
#     headers; no alert, no crashed worker.
use strict;
use warnings;
use lib '.';
use Test::More;
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Time::HiRes qw(time sleep);
use t::lib::RouteFleet;

our ($TMP, $MODEL);

my $f = fleet_start(
    engines => [[], ['--ctx', 256, '--kv-cache-mb', 0.3, '--max-seqs', 4]],
    timeout => '1s', workers => 2, upstream => 'zone engines 256k;',
    ns => 'fleet-b:',
    http => sub {
        my ($f) = @_;
        my ($a, $b) = @{ $f->{route} };
        return <<"HTTP";
    upstream busy {
        omni_prefix_route max_waiting=0;
        server $a;
        server $b;
    }
    upstream down0 {
        omni_prefix_route;
        server $a down;
        server $b;
    }
    upstream down1 {
        omni_prefix_route;
        server $a;
        server $b down;
    }
HTTP
    },
    server => sub {
        return join '', map { "        location /$_/ { omni_pass $_; }\n" }
                        qw(busy down0 down1);
    });
my ($E0, $E1) = @{ $f->{route} };
my $CHAT = '/v1/chat/completions';

my $SP = 'You are a storyteller for small children. Your stories are short '
    . 'and kind, they have a cat, a dog and a little girl named Lily.';
my $SQ = 'You are a gardener who answers questions about flowers, trees '
    . 'and vegetables in a few short and friendly sentences.';
my $SR = 'You are a sailor telling tales of the sea, of ships, storms, '
    . 'whales and far islands, always in short and simple words.';

# A request as it is, without adding to its conversation; unless nowait,
# waits until the engine that answered publishes what it holds of it.
sub ask {
    my ($path, $req, %o) = @_;
    my $r = post($f, $path, $req);
    my $i = engine_index($f, $r->{engine});
    wait_held($f, $i, engine_form($req))
        if !$o{nowait} && $r->{status} == 200 && defined $i;
    return $r;
}

# A request sent on a connection of its own, not read: the socket.
sub abandon {
    my ($path, $req, $id) = @_;
    my $body = JSON::PP->new->utf8->encode($req);
    my $c = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$f->{port}")
        or die "connect: $!\n";
    print $c "POST $path HTTP/1.1\r\nHost: localhost\r\n"
             . "Content-Type: application/json\r\nX-Test-Id: $id\r\n"
             . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
    return $c;
}

# The reply went where holder() said, as a hit.
sub is_holder_hit {
    my ($r, $what, $h) = @_;
    ok($h, "$what: Redis says an engine holds it") or return;
    is($r->{route}{result}, 'hit', "$what: hit") or diag explain $r->{route};
    ok(scalar(grep { $_ eq ($r->{engine} // '') } @{ $h->{engines} }),
       "$what: on the holder of the longest prefix (@{ $h->{engines} })")
        or diag "answered by " . ($r->{engine} // 'none');
    is($r->{route}{engine}, $r->{engine}, "$what: engine= what answered");
    is($r->{route}{messages}, $h->{messages}, "$what: messages="
       . $h->{messages});
    is($r->{route}{tokens}, $h->{tokens}, "$what: tokens=$h->{tokens}");
}

sub is_fallback {
    my ($r, $what, $engine) = @_;
    is($r->{status}, 200, "$what: answered") or diag $r->{body};
    is($r->{route}{result}, 'fallback', "$what: fallback")
        or diag explain $r->{route};
    is($r->{route}{engine}, $r->{engine}, "$what: engine= what answered");
    is($r->{engine}, $engine, "$what: by $engine") if $engine;
    ok(!exists $r->{route}{messages}, "$what: no messages=, tokens=");
}

# --- the longest holder wins; down and busy holders ------------------------
my $pnext;
{
    conv($f, 'p', $SP);
    my $r = turn($f, 'p', "/e0$CHAT", 'Tell me about the cat.');
    is($r->{engine}, $E0, 'p turn 1: on E0, by hand');
    $r = turn($f, 'p', "/r$CHAT", 'And then?');
    is_hit($r, 'p turn 2', $E0, $r->{prev});

    # E0 the only holder, and down
    $r = turn($f, 'p', "/down0$CHAT", 'Where is Lily?');
    is_fallback($r, 'the holder E0 down', $E1);

    # E1 holds more of p than E0 now: it wins; with E1 down, E0 does
    $pnext = chat_req($f, [@{ $f->{conv}{p}{msgs} },
                           { role => 'user', content => 'And after?' }]);
    my $h = holder($f, engine_form($pnext), 0, 1);
    is_deeply($h && $h->{engines}, [$E1], 'E1 holds the longest prefix');
    my $h0 = holder($f, engine_form($pnext), 0);
    ok($h0 && $h0->{messages} < $h->{messages}, 'E0 a shorter one ('
       . ($h0 && $h0->{messages}) . " of $h->{messages} messages)");
    $r = ask("/r$CHAT", $pnext);
    is_holder_hit($r, 'both up: the longest holder', $h);
    $r = ask("/down1$CHAT", $pnext);
    is_holder_hit($r, 'the longest holder E1 down: E0, for less', $h0);

    # every engine overloaded
    $r = ask("/busy$CHAT", $pnext);
    is_fallback($r, 'max_waiting=0');
}

# --- eviction ----------------------------------------------------------------
{
    # q1 lives on E1 only; q2's system prompt is on E0 too
    conv($f, 'q1', $SQ);
    my $r = turn($f, 'q1', "/e1$CHAT", 'How do I grow tomatoes?');
    $r = turn($f, 'q1', "/r$CHAT", 'And potatoes?');
    is_hit($r, 'q1 turn 2', $E1, $r->{prev});
    conv($f, 'q2', $SR);
    $r = turn($f, 'q2', "/e1$CHAT", 'Tell me about a whale.');
    conv($f, 'q0', $SR);
    $r = turn($f, 'q0', "/e0$CHAT", 'Tell me about a storm.');

    my @q = map { $f->{conv}{$_}{keys} } qw(q1 q2);
    my ($flooded, $answered) = (0, 0);
    my $evicted = sub {
        for my $k (map { @$_ } @q) {
            my $v = $f->{redis}->try_cmd('GET', px($f, 1, $k->[1]));
            return 0 if defined $v;
        }
        return 1;
    };
    my $until = time + 60;
    while (!$evicted->() && time < $until) {
        my $rr = main::request($f->{engines}[1], chat_req($f, [{
            role => 'user', content => "Story number $flooded: "
            . join(' ', map { "word$_" } 1 .. 25) }], max_tokens => 4));
        $answered++ if $rr && $rr->{done};
        $flooded++;
        wait_until(1, $evicted) if $flooded % 4 == 0;
    }
    is($answered, $flooded, "E1 flooded: $flooded prompts answered");
    ok($evicted->(), "E1 flooded: q1's and q2's keys are gone");
    my $m = main::metrics($f->{engines}[1]);
    my $removed = $m->{omni_engine_prefix_keys_removed_total} // 0;
    ok($removed > 0, "E1: prefix_keys_removed_total $removed");

    $r = turn($f, 'q1', "/r$CHAT", 'And carrots?');
    is($r->{route}{result}, 'miss', 'q1 after the eviction: miss (no '
       . 'engine holds it)') or diag explain $r->{route};
    $r = turn($f, 'q2', "/r$CHAT", 'And the storm?');
    is_hit($r, 'q2 after the eviction: E0, for the system prompt it holds',
           $E0, [grep { $_->[0] == 0 } @{ $f->{conv}{q0}{keys} }]);
}

# --- Redis slow: DEBUG SLEEP past omni_redis's timeout ---------------------
{
    my $h = holder($f, engine_form($pnext), 0, 1);
    ok($h, 'p is held before Redis sleeps');
    $f->{redis}->sleep_bg(8);
    my $bg = IO::Select->new($f->{redis}{bg});

    # clients that leave while their lookup waits for Redis: the request
    # ends, and the answer, when it comes, is dropped
    my @gone = map { abandon("/r$CHAT", $pnext, "abandoned-$_") } 1 .. 3;
    sleep 0.3;
    close $_ for @gone;

    my @r = map { ask("/r$CHAT", $pnext, nowait => 1) } 1 .. 4;
    my $asleep = !$bg->can_read(0);
    is_fallback($r[$_], "Redis asleep, request $_") for 0 .. $#r;
    ok($asleep, 'all four answered while Redis still slept');
    $f->{redis}->sleep_wait(30);
    my $r;
    ok(wait_until(30, sub {
           $r = ask("/r$CHAT", $pnext);
           ($r->{route}{result} // '') eq 'hit' }),
       'Redis awake: hits again');
    is_holder_hit($r, 'Redis awake', holder($f, engine_form($pnext), 0, 1));
}

# --- Redis killed, then back ------------------------------------------------
{
    $f->{redis}->kill('KILL');
    my @r = map { ask("/r$CHAT", $pnext, nowait => 1) } 1 .. 6;
    is_fallback($r[$_], "Redis killed, request $_") for 0 .. $#r;
    $f->{redis}->restart;
    my $r;
    ok(wait_until(40, sub {
           $r = ask("/r$CHAT", $pnext);
           ($r->{route}{result} // '') eq 'hit' }),
       'Redis back: the engines publish again, and hits come back');
    is_holder_hit($r, 'Redis back', holder($f, engine_form($pnext), 0, 1));
}

# --- the holder killed -------------------------------------------------------
{
    # v, w and x live on E0 alone
    my %next;
    for my $c (qw(v w x)) {
        conv($f, $c, "$SP And a horse named " . uc($c) . '.');
        my $r = turn($f, $c, "/e0$CHAT", 'Tell me about the horse.');
        $next{$c} = chat_req($f, [@{ $f->{conv}{$c}{msgs} },
                                  { role => 'user', content => 'And then?' }]);
        my $h = holder($f, engine_form($next{$c}), 0, 1);
        is_deeply($h && $h->{engines}, [$E0], "$c: E0 holds it, E1 not");
    }

    # all of E0 at once: no stage is left to delete its keys
    my $e = $f->{engines}[0];
    my @kids = split ' ',
                     main::slurp("/proc/$e->{pid}/task/$e->{pid}/children");
    kill 'KILL', @kids, $e->{pid};
    waitpid($e->{pid}, 0);
    $e->{pid} = undef;
    ok(wait_until(10, sub { !grep { kill 0, $_ } @kids }),
       'E0 and its stages killed');
    is_deeply(holder($f, engine_form($next{v}), 0, 1)->{engines}, [$E0],
              "E0's keys outlive it: nginx will choose it for v");

    # v's finds E0 refusing and goes on to E1; then nginx counts E0
    # failed (max_fails=1) and chooses it no more
    my $r = ask("/r$CHAT", $next{v}, nowait => 1);
    is_fallback($r, 'the holder killed: v', $E1);
    like(log_of($f, $r->{id})->{upstream}, qr/^\Q$E0\E, \Q$E1\E$/,
         'the holder killed: v tried E0 first');
    for my $c (qw(w x)) {
        $r = ask("/r$CHAT", $next{$c}, nowait => 1);
        is_fallback($r, "the holder killed, failed: $c", $E1);
        is(log_of($f, $r->{id})->{upstream}, $E1,
           "the holder killed, failed: $c not tried on E0");
    }
    $r = get($f, '/r/v1/models');
    is($r->{status}, 200, 'models: answered by E1');
}

# --- the headers, the log and the metrics agree ----------------------------
{
    my $last = get($f, '/rmetrics');
    log_of($f, $last->{id});
    my $log = log_lines($f);
    my %count = (hit => 0, miss => 0, fallback => 0);
    my ($bad, $errors) = (0, 0);
    for my $id (sort keys %$log) {
        my $l = $log->{$id};
        if ($id =~ /^abandoned/) {
            is($l->{status}, 499, "$id: the client left (499)");
            next;
        }
        $errors++, diag("request $id: $l->{status}") if $l->{status} != 200;
        next if $l->{prefix} eq '-';
        $count{ $l->{prefix} }++;
        my $want = logged_route($l);
        $bad++, diag("request $id: $l->{header} vs $want")
            if $l->{header} ne $want;
        $bad++, diag("request $id: $l->{prefix} with messages "
                     . "$l->{messages}, tokens $l->{tokens}")
            if $l->{prefix} ne 'hit'
               && "$l->{messages} $l->{tokens}" ne '0 0';
    }
    is($errors, 0, 'every request was answered 200');
    is($bad, 0, 'the log variables say what x-omni-route says');
    is_deeply(route_metrics($f), \%count,
              'omni_nginx_route_total counts what the log has');
    is_deeply([bad_lines($f)], [], 'error.log: no alert, no crash');
}

fleet_stop($f);
done_testing();

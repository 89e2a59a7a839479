# Nothing leaks: 10,000 requests, 32 at a time, half of them cancelled at a
# random point (the client closes its socket before sending, right after,
# or after some text). Afterwards every KV block is free or
# cached-and-unreferenced, no sequence is left, and neither process's
# resident memory has grown since the first 1,000 requests. The helpers
# are in proto.pl.
use strict;
use warnings;
use Test::More;
use IO::Select;
use JSON::PP;
use Time::HiRes qw(time);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F);

my $TOTAL = $ENV{OMNI_LEAK_REQUESTS} // 10000;
my $WARM = int($TOTAL / 10);
my $CONC = 32;
my @WORDS = qw(cat dog sun moon tree boat girl boy fish bird king queen
               cake rain snow ball red blue happy sad little big garden);

srand(7);
# --kv-cache-mb 2: about 200 blocks, so the pool is also exercised full
# (preemption and eviction) while requests come and go.
my $srv = serve_start(args => ['--kv-cache-mb', 2, '--max-seqs', 32]);

sub rss {
    my $m = metrics($srv);
    return ($m->{'omni_engine_resident_memory_bytes{process="frontend"}'},
            $m->{'omni_engine_resident_memory_bytes{process="thinker"}'});
}

# One request: [socket, reply, texts before closing (-1: run to the end)].
sub start_one {
    my $cancel = rand() < 0.5;
    my @w = map { $WORDS[int rand @WORDS] } 1 .. 1 + int rand 60;
    my $req = encode_json({ prompt => join(' ', @w),
                            max_tokens => 1 + int rand 120,
                            temperature => rand() < 0.5 ? 0 : 0.9,
                            seed => int rand 1000 });
    my $s = engine_connect($srv) or die "connect: $!";
    my $at = $cancel ? int(rand 12) - 2 : -1;   # -2: before sending
    if ($at == -2) {
        close $s;
        return undef;
    }
    $s->syswrite(frame($F{REQUEST}, $req));
    if ($at == -1 + 0 && $cancel) {             # right after sending
        close $s;
        return undef;
    }
    $s->blocking(0);
    return [$s, new_reply(), $cancel ? $at : -1];
}

my %stat = (done => 0, cancelled => 0, errors => 0, bad => 0);
my @rss_warm;

sub run_requests {
    my ($n) = @_;
    my $sel = IO::Select->new;
    my %live;
    my $started = 0;
    my $until = time + 900;
    while (($started < $n || $sel->count) && time < $until) {
        while ($started < $n && $sel->count < $CONC) {
            $started++;
            my $r = start_one();
            if (!$r) {
                $stat{cancelled}++;
                next;
            }
            $live{fileno $r->[0]} = $r;
            $sel->add($r->[0]);
        }
        for my $s ($sel->can_read(0.5)) {
            my $r = $live{fileno $s};
            my $k = $s->sysread(my $chunk, 65536);
            next if !defined $k && $!{EAGAIN};
            $r->[1]{buf} .= $chunk if $k;
            add_frames($r->[1], take_frames(\$r->[1]{buf}));
            my $texts = grep { $_->[0] == $F{TEXT} } @{ $r->[1]{frames} };
            my $end = !$k;
            if ($r->[2] >= 0 && $texts >= $r->[2] && !$r->[1]{done}) {
                $stat{cancelled}++;
                $end = 1;
            } elsif ($end) {
                if ($r->[1]{done}) { $stat{done}++ }
                elsif ($r->[1]{error}) { $stat{errors}++ }
                else { $stat{bad}++ }
            }
            next unless $end;
            $sel->remove($s);
            delete $live{fileno $s};
            close $s;
        }
    }
}

run_requests($WARM);
my @rss0 = rss();
my $t0 = time;
run_requests($TOTAL - $WARM);
my $dt = time - $t0;
diag sprintf('%d requests in %.1f s: %d done, %d cancelled, %d errors',
             $TOTAL, $dt, @stat{qw(done cancelled errors)});
is($stat{done} + $stat{cancelled} + $stat{errors}, $TOTAL,
   'every request ended');
is($stat{bad}, 0, 'no connection ended without DONE or ERROR');
is($stat{errors}, 0, 'no errors');
ok($stat{cancelled} > $TOTAL * 0.4, "about half were cancelled");

# The engine finishes cancels asynchronously: give it a moment.
my $m;
for (1 .. 100) {
    $m = metrics($srv);
    last if $m->{'omni_engine_num_requests_running{stage="thinker"}'} == 0
            && $m->{'omni_engine_num_requests_waiting{stage="thinker"}'} == 0;
    select(undef, undef, undef, 0.05);
}
is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, 'no sequence running');
is($m->{'omni_engine_num_requests_waiting{stage="thinker"}'}, 0, 'no request waiting');
is($m->{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
   'no KV block referenced');
my $total = $m->{'omni_engine_kv_cache_blocks{state="free"}'}
            + $m->{'omni_engine_kv_cache_blocks{state="cached"}'};
ok($total > 100, "every block ($total) is free or cached");
is($m->{omni_engine_connections}, 1, 'only the metrics connection is open');
ok($m->{omni_engine_requests_cancelled_total} > 0, 'cancels were counted');

my @rss1 = rss();
for my $i (0, 1) {
    my $name = (qw(frontend thinker))[$i];
    my $grew = $rss1[$i] - $rss0[$i];
    ok($grew < 1 << 20, "$name resident memory did not grow: "
       . sprintf('%.1f -> %.1f MiB', $rss0[$i] / 2**20, $rss1[$i] / 2**20));
}
is(serve_stop($srv), 0, 'clean exit');

done_testing();

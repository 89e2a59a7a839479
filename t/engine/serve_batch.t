# Batching must not change what anyone gets: 64 concurrent greedy requests
# with different prompts and lengths, arriving at different times, stream
# exactly the text each produces alone (`omni-engine generate`), with the
# prefix cache on, off, and with a KV cache so small that sequences are
# preempted and recomputed. Then the prefix cache: a request sharing a long
# prefix with an earlier one computes only its new tokens and still matches
# a cold run. The helpers are in proto.pl.
use strict;
use warnings;
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F);

my @WORDS = qw(cat dog sun moon tree boat girl boy fish bird king queen
               cake rain snow ball red blue happy sad little big garden
               river castle dragon friend toy apple star);

# 64 prompts of 1 to 40 words and max_tokens of 4 to 200, seeded so a
# failure reproduces.
srand(20261202);
my @CASES;
for my $i (0 .. 63) {
    my @w = map { $WORDS[int rand @WORDS] } 1 .. 1 + int rand 40;
    push @CASES, { prompt => ucfirst(join ' ', @w) . ($i % 3 ? '.' : ''),
                   max_tokens => 4 + int rand 197 };
}

sub alone {
    my ($c) = @_;
    my ($st, $out, $err) = run_engine('generate', '--model', $MODEL,
        '--threads', 1, '--temperature', 0, '--max-tokens', $c->{max_tokens},
        '--prompt', $c->{prompt});
    die "generate failed: $err" if $st != 0;
    return $out;
}

my @want = map { alone($_) } @CASES;

sub check_exact {
    my ($name, $gap, @args) = @_;
    my $srv = serve_start(args => [@args]);
    my @r = run_concurrent($srv, [map { { %$_, temperature => 0 } } @CASES],
                           gap => $gap, timeout => 300);
    my ($ok, $bad) = (0, '');
    for my $i (0 .. $#CASES) {
        my $r = $r[$i];
        if ($r->{done} && !$r->{error} && $r->{text} eq $want[$i]) {
            $ok++;
        } elsif (!length $bad) {
            $bad = "request $i: " . ($r->{error} ? $r->{error}{message}
                   : "got '$r->{text}'\nwant '$want[$i]'");
        }
    }
    is($ok, scalar @CASES, "$name: all 64 equal their run alone")
        or diag $bad;
    my $m = metrics($srv);
    is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, "$name: none running");
    is($m->{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
       "$name: no block in use");
    my $tokens = 0;
    $tokens += $_->{done}{completion_tokens} // 0 for @r;
    is($m->{omni_engine_generation_tokens_total}, $tokens,
       "$name: generation tokens counted");
    ok($m->{omni_engine_step_tokens_total} > $m->{omni_engine_steps_total},
       "$name: steps batched more than one token on average");
    is(serve_stop($srv), 0, "$name: clean exit");
    return $m;
}

check_exact('prefix cache on', 0.01);
check_exact('prefix cache off', 0.01, '--no-prefix-cache');
{
    # 0.5 MB holds 51 blocks of 16 tokens for this model: enough for one
    # full context (32 blocks) but not for 64 sequences at once, which
    # arrive nearly together here.
    my $m = check_exact('tiny KV cache', 0.001, '--kv-cache-mb', '0.5');
    ok($m->{omni_engine_num_preemptions_total} > 0,
       "tiny KV cache: sequences were preempted and recomputed ($m->{omni_engine_num_preemptions_total})")
        or diag "preemptions: $m->{omni_engine_num_preemptions_total}";
    ok($m->{'omni_engine_kv_cache_blocks{state="free"}'}
       + $m->{'omni_engine_kv_cache_blocks{state="cached"}'} <= 51,
       'tiny KV cache: the pool is the size asked for');
}

# --- prefix cache -----------------------------------------------------------
{
    my $prefix = join ' ', map { $WORDS[$_ % @WORDS] } 1 .. 100;
    my %a = (prompt => "$prefix. The end of the first.", max_tokens => 32,
             temperature => 0);
    my %b = (prompt => "$prefix. Then the girl sang.", max_tokens => 32,
             temperature => 0);

    my $srv = serve_start();
    my $ra = request($srv, \%a);
    ok($ra->{done}, 'prefix: first request done');
    is($ra->{done}{cached_tokens}, 0, 'prefix: first request is cold');
    my $m0 = metrics($srv);
    my $rb = request($srv, \%b);
    my $n = $rb->{done}{prompt_tokens};
    my $cached = $rb->{done}{cached_tokens};
    # every full 16-token block of the shared prefix, but never the tokens
    # after it
    ok($cached >= 96 && $cached < $n && $cached % 16 == 0,
       "prefix: second request found $cached of $n prompt tokens cached");
    my $m1 = metrics($srv);
    is($m1->{omni_engine_prefix_cache_hits_total}
       - $m0->{omni_engine_prefix_cache_hits_total}, $cached,
       'prefix: metrics count the hits');
    is($m1->{omni_engine_prefix_cache_queries_total}
       - $m0->{omni_engine_prefix_cache_queries_total}, $n,
       'prefix: metrics count the queries');
    ok($m1->{omni_engine_step_tokens_total}
       - $m0->{omni_engine_step_tokens_total}
       <= $n - $cached + $rb->{done}{completion_tokens},
       'prefix: only the new tokens were computed');

    my $cold = request($srv, { %b, cache_salt => 'another tenant' });
    is($cold->{done}{cached_tokens}, 0, 'prefix: another salt shares nothing');
    is($rb->{text}, $cold->{text}, 'prefix: cached run equals a cold run');
    is($rb->{text}, alone({ %b }), 'prefix: and equals generate alone');
    is(serve_stop($srv), 0, 'prefix: clean exit');
}

done_testing();

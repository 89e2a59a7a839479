# Greedy decoding of the default model equals llama.cpp's, byte for byte.
# The expected texts come from llama.cpp's own llama-simple; the command for
# each and the script that regenerates them are in t/data/.
#
# Near ties are the exception, and are checked as such: prompts where
# llama.cpp's default greedy text differs from ours at a step whose two best
# logits are closer than the two engines' logits are to each other on the
# steps before it (both store the KV cache in f16; llama.cpp's CPU flash
# attention also rounds Q and the value sums to f16, ours keeps f32). There
# our text must equal llama.cpp's with flash attention off, and the step
# must be a near tie by the figures measured here.
use strict;
use warnings;
use Test::More;
use JSON::PP;
require './t/engine/lib.pl';
our ($MODEL, $TMP);

open(my $fh, '<', 't/data/llama-cpp-greedy.json') or die $!;
my $ref = decode_json(do { local $/; <$fh> });
my @cases = @{ $ref->{cases} };

for my $c (@cases) {
    for my $threads (1, 2) {
        my ($rc, $out, $err) = run_engine(
            'generate', '--model', $MODEL, '--prompt', $c->{prompt},
            '--max-tokens', $c->{max_tokens}, '--temperature', 0,
            '--threads', $threads);
        is($rc, 0, "exit 0: '$c->{prompt}' ($threads threads)") or diag $err;
        is($out, $c->{expected},
           "same text as llama.cpp: $c->{command} ($threads threads)");
    }
}

# Prefill in chunks smaller than the prompt (several forward calls, across
# KV blocks) gives the same text as one chunk.
my $long = $cases[5];
for my $batch (1, 7, 16) {
    my ($rc, $out) = run_engine(
        'generate', '--model', $MODEL, '--prompt', $long->{prompt},
        '--max-tokens', $long->{max_tokens}, '--temperature', 0,
        '--batch', $batch);
    is($out, $long->{expected}, "prefill in chunks of $batch");
}

# Every kernel set the CPU has gives the same greedy text.
for my $isa (qw(ref avx2 avx512 neon)) {
    my ($rc, $out, $err) = run_engine(
        'generate', '--model', $MODEL, '--prompt', $cases[0]{prompt},
        '--max-tokens', $cases[0]{max_tokens}, '--temperature', 0,
        '--isa', $isa);
  SKIP: {
        skip("isa $isa: $err", 1)
            if $rc != 0 && $err =~ /lacks|not in this build/;
        is($out, $cases[0]{expected}, "isa $isa gives llama.cpp's text");
    }
}

# --- near ties -------------------------------------------------------------

# (first step whose tokens differ, the largest |our logit - llama.cpp's|
# over the tokens both have in their top 2 on the steps before it, the
# largest |logit| among those)
sub divergence {
    my ($ours, $llama) = @_;
    my ($d, $noise, $scale) = (0, 0, 0);

    $d++ while $d < @$ours && $d < @$llama
               && $ours->[$d]{token} == $llama->[$d]{token};
    for my $i (0 .. $d - 1) {
        my %l = map { $_->[0] => $_->[1] } @{ $llama->[$i]{top} };
        for my $t (@{ $ours->[$i]{top} }) {
            next unless exists $l{ $t->{id} };
            my $diff = abs($t->{logit} - $l{ $t->{id} });
            $noise = $diff if $diff > $noise;
            $scale = abs($t->{logit}) if abs($t->{logit}) > $scale;
        }
    }
    return ($d, $noise, $scale);
}

for my $c (@{ $ref->{near_ties} }) {
    for my $isa (qw(auto ref)) {
        my $name = "near tie '$c->{prompt}' (isa $isa)";
        my ($rc, $out, $err) = run_engine(
            'generate', '--model', $MODEL, '--prompt', $c->{prompt},
            '--max-tokens', $c->{max_tokens}, '--temperature', 0,
            '--isa', $isa, '--top-logits', 2);
        my @ours = map { decode_json($_) } grep { /^\{/ } split /\n/, $err;
        my @llama = @{ $c->{steps} };

        is($rc, 0, "$name: exit 0") or diag $err;
        is($out, $c->{expected_flash_attn_off},
           "$name: llama.cpp's text with flash attention off");
        my ($d, $noise, $scale) = divergence(\@ours, \@llama);
        ok($d > 0 && $d < @ours && $d < @llama,
           "$name: llama.cpp's default text differs at step $d");
        next unless $d > 0 && $d < @ours && $d < @llama;

        # the engines' logits before the tie differ at f16 precision (the
        # KV cache's), not more
        cmp_ok($noise / $scale, '<', 2 ** -10, sprintf(
               "%s: before step %d the logits differ by at most %.3g (of "
               . "%.3g)", $name, $d, $noise, $scale));
        my @o = map { $_->{id} } @{ $ours[$d]{top} };
        my @l = map { $_->[0] } @{ $llama[$d]{top} };
        is_deeply([@o], [reverse @l],
                  "$name: the same two candidates, in the other order");
        my $lm = $llama[$d]{top}[0][1] - $llama[$d]{top}[1][1];
        cmp_ok($ours[$d]{margin}, '<', $noise, sprintf(
               "%s: our margin %.3g (%d over %d) is below that noise",
               $name, $ours[$d]{margin}, @o));
        cmp_ok($lm, '<', $noise, sprintf(
               "%s: llama.cpp's margin %.3g (%d over %d) is below that noise",
               $name, $lm, @l));
    }
}

done_testing();

# Every weight type on every architecture decodes as llama.cpp does: for
# each (architecture, type) our greedy tokens for several prompts equal
# llama.cpp's on the same file, token for token, 32 tokens each, or differ
# only at a near tie (t/engine/llama_ref.pl says what that is; the test
# prints every one).
#
# The files: a random-weight model per architecture written by
# `omni-engine make-model` in F32 (dimensions multiples of 256, so every
# K-quant block fits; weights with a std large enough that the logits are
# far from flat and greedy decoding follows the weights, not ties), and the
# default model (stories260K), each requantized by llama.cpp's
# llama-quantize to every type: pure (--pure: every matrix in the type)
# and llama.cpp's usual mixes (Q4_K_M, ...). stories260K's rows are 64
# long (172 for ffn_down): no multiple of 256, so llama-quantize stores its
# K-quant and IQ4_XS matrices in 32-element fallback types (Q5_0, Q5_1,
# Q8_0, IQ4_NL), and 172 fits no block at all, so ffn_down stays F16 in
# every file; the test prints the types each file ended up with.
#
#   OMNI_QUANT_TYPES   only these llama-quantize types (space-separated)
#   OMNI_QUANT_ARCHS   only these architectures
#   OMNI_QUANT_PROMPTS prompts per file (default 2)
use strict;
use warnings;
use Test::More;
require './t/engine/lib.pl';
require './t/engine/llama_ref.pl';
our ($MODEL, $TMP);

my $bin = llama_tools();
my $src = llama_src();
my $dir = 'build/t/quants';
system('mkdir', '-p', $dir) == 0 or die;

my @types = quant_types($ENV{OMNI_QUANT_TYPES});
my @archs = quant_archs($src, $ENV{OMNI_QUANT_ARCHS});

my @prompts = ('Once upon a time', 'The quick brown fox jumps over',
               'In the beginning', 'Hello, my name is',
               'Lily and Tom went to the park');
splice(@prompts, $ENV{OMNI_QUANT_PROMPTS} // 2);
my $n_tokens = 32;
# Largest logit difference from llama.cpp's, relative to the largest logit.
# Activations are quantized before every quantized matmul, which amplifies
# last-bit differences upstream: on these random models the F32 files'
# logits agree with llama.cpp's to 0.05%, their Q8_0 versions to about 1%
# (a 0.05% difference moves ~2% of a row's values across a rounding
# boundary, each by a whole quantization step), the others to 1-3%;
# llama.cpp's own two attention paths (flash attention on and off) differ
# on these files as much (bench/agreement measures both). A misread block
# or scale moves logits by far more; the kernels themselves are held to the
# scalar reference to 1e-10 by the unit tests.
my $NOISE = 0.05;
my $MIN_DISTINCT = 4;           # tokens in 32 a model must vary over

my ($total, $exact, @ties) = (0, 0);
for my $a (@archs) {
    for my $t (@types) {
        my ($file, $label) = quant_file($bin, $dir, $a, $t);
        note("$label: " . gguf_types($bin, $file));
        for my $p (@prompts) {
            my $llama = llama_steps($bin, $file, $p, $n_tokens);
            my ($ours, $err) = our_steps($file, $p, $n_tokens);
            ok($ours, "$label '$p': the engine runs it") or diag $err;
            next unless $ours;
            my $r = compare_steps($ours, $llama);
            my %seen = map { $_->{token} => 1 } @$llama;
            cmp_ok(scalar keys %seen, '>=', $MIN_DISTINCT,
                   "$label '$p': llama.cpp's tokens vary (the comparison "
                   . "means something)");
            # whatever the tokens, the logits agree to within a few
            # activation quantization steps: a wrong scale or a misread
            # block would move them by far more
            cmp_ok($r->{noise}, '<=', $NOISE * $r->{scale}, sprintf(
                "%s '%s': logits within %.3g of llama.cpp's (of %.3g)",
                $label, $p, $r->{noise}, $r->{scale}));
            $total++;
            $exact++ if $r->{same};
            if ($r->{same}) {
                pass("$label '$p': $r->{n} tokens as llama.cpp's");
                next;
            }
            my $why = sprintf("first differs at step %d of %d: margins "
                . "%.3g (ours) and %.3g (llama.cpp), logits differ by up "
                . "to %.3g", $r->{step}, $r->{n}, $r->{ours} // -1,
                $r->{llama} // -1, $r->{noise});
            ok($r->{tie}, "$label '$p': a near tie ($why)");
            push @ties, "$label '$p': $why" if $r->{tie};
        }
    }
}
note(sprintf("%d of %d generations equal llama.cpp's token for token; "
             . "%d near ties", $exact, $total, scalar @ties));
note($_) for @ties;
ok($total > 0, 'something was compared');

done_testing();

# The omni-engine command line: every subcommand's output and every error
# path (non-zero exit, one line on stderr naming the problem).
use strict;
use warnings;
use Test::More;
use JSON::PP;
require './t/engine/lib.pl';
our ($ENGINE, $MODEL, $TMP);

my $M = $MODEL;
my $T = $TMP;

sub gen {
    return run_engine('generate', '--model', $M, @_);
}

sub one_line_error {
    my ($name, $re, @args) = @_;
    my ($rc, $out, $err) = run_engine(@args);
    isnt($rc, 0, "$name: non-zero exit");
    is($out, '', "$name: nothing on stdout");
    like($err, qr/\Aomni-engine: [^\n]*$re[^\n]*\n\z/, "$name: one line")
        or diag $err;
}

# --- tokenize -------------------------------------------------------------
{
    my ($rc, $out) = run_engine('tokenize', '--model', $M, '--text',
                                'Once upon a time');
    is($out, "1 403 407 261 378\n", 'tokenize adds BOS (llama-tokenize ids)');
    ($rc, $out) = run_engine('tokenize', '--model', $M, '--text',
                             'Once upon a time', '--no-bos');
    is($out, "403 407 261 378\n", 'tokenize --no-bos');
}

# --- tokenize: llama.cpp's vocabulary-only files ---------------------------
# models/ggml-vocab-*.gguf hold a tokenizer and no tensor: tokenize reads
# the vocabulary alone and gives llama.cpp's ids for every test input
# (the .inp/.out pairs of llama.cpp's test-tokenizer-0, no BOS); generate
# says what the file is.
{
    my $src = llama_src();
    for my $v (qw(llama-spm llama-bpe qwen2 gpt-2 phi-3 deepseek-coder
                  starcoder)) {
        my $f = "$src/models/ggml-vocab-$v.gguf";
        my @inp = split /\n__ggml_vocab_test__\n/, slurp("$f.inp"), -1;
        pop @inp;                       # the file ends with a separator
        my @out = split /\n/, slurp("$f.out"), -1;
        my ($n, $bad) = (0, 0);
        for my $k (0 .. $#inp) {
            next if $inp[$k] =~ /^-/;           # would read as an option
            my ($rc, $ids, $err) = run_engine('tokenize', '--model', $f,
                                              '--text', $inp[$k], '--no-bos');
            (my $want = $out[$k] // '') =~ s/^\s+//;
            $n++;
            next if $rc == 0 && $ids eq "$want\n";
            diag("ggml-vocab-$v case $k: got '$ids' ($err), want '$want'")
                if $bad++ < 3;
        }
        ok($n >= 30, "tokenize $v: $n of llama.cpp's cases run");
        is($bad, 0, "tokenize $v (vocabulary-only GGUF): llama.cpp's ids");
    }
    my $f = "$src/models/ggml-vocab-llama-spm.gguf";
    my ($rc, $out) = run_engine('tokenize', '--model', $f, '--text',
                                'Hello world');
    is($out, "1 15043 3186\n", 'tokenize on a vocabulary-only file adds BOS');
    one_line_error('generate on a vocabulary-only file',
                   qr/\Q$f\E: a vocabulary-only GGUF \(a tokenizer, no (?#
                      )weights\): 'tokenize' reads it, but generating needs (?#
                      )a model/,
                   'generate', '--model', $f, '--prompt', 'Hello');
    one_line_error('tokenize on a file that is not a GGUF', 'not a GGUF file',
                   'tokenize', '--model', "$src/models/ggml-vocab-llama-spm"
                   . '.gguf.inp', '--text', 'x');
}

# --- generate: sampling ---------------------------------------------------
{
    my @p = ('--prompt', 'Once upon a time', '--max-tokens', 40,
             '--temperature', 1);
    my (undef, $a) = gen(@p, '--seed', 1);
    my (undef, $b) = gen(@p, '--seed', 1);
    my (undef, $c) = gen(@p, '--seed', 2);
    ok(length($a) > 20, 'sampled text is produced');
    is($a, $b, 'same seed, same text');
    isnt($a, $c, 'another seed, another text');

    # without --seed: a fresh seed per run, which --stats reports and
    # which reproduces the run
    my @p48 = ('--prompt', 'Once upon a time', '--max-tokens', 48,
               '--temperature', 1);
    my @runs = map { [gen(@p48, '--stats')] } 1 .. 3;
    my @seeds = map { $_->[2] =~ /, seed (\d+)\n\z/ ? $1 : '' } @runs;
    is(scalar(grep { /^\d+$/ } @seeds), 3, 'no --seed: --stats says the seed')
        or diag $runs[0][2];
    is(scalar(keys %{{ map { $_ => 1 } @seeds }}), 3, 'no --seed: 3 seeds');
    cmp_ok(scalar(keys %{{ map { $_->[1] => 1 } @runs }}), '>', 1,
           'no --seed: not the same text three times');
    my (undef, $again) = gen(@p48, '--seed', $seeds[0]);
    is($again, $runs[0][1], 'the reported seed reproduces the run');

    my (undef, $k1) = gen(@p, '--seed', 3, '--top-k', 1);
    my (undef, $greedy) = gen('--prompt', 'Once upon a time',
                              '--max-tokens', 40, '--temperature', 0);
    is($k1, $greedy, 'top-k 1 is greedy at any temperature');

    my ($rc, $out, $err) = gen('--prompt', 'Once upon a time',
                               '--max-tokens', 64, '--temperature', 0,
                               '--stop', 'Lily', '--stats');
    is($out, ', there was a little girl named ',
       'stop string ends the text and is not emitted');
    like($err, qr/finish stop/, 'finish reason stop');

    ($rc, $out, $err) = gen('--prompt', 'Once upon a time', '--max-tokens',
                            3, '--temperature', 0, '--stats');
    like($err, qr/generated 3 .*finish length/, 'max tokens gives length');
}

# --- generate: chat template ----------------------------------------------
{
    my ($rc, $out, $err) = gen('--prompt', 'Tell me a story', '--chat',
                               '--max-tokens', 16, '--temperature', 0);
    is($rc, 0, 'chat mode on a model without a template (plain format)')
        or diag $err;
    ok(length($out) > 0, 'chat mode generates');
}

# --- generate --top-logits ------------------------------------------------
# One JSON line per generated token on stderr; checked for shape and
# against the generation itself (the text on stdout is unchanged).

sub top_lines {
    my ($err) = @_;
    return map { decode_json($_) } grep { /^\{/ } split /\n/, $err;
}

sub check_top_lines {
    my ($name, $lines, $k, $n_prompt, $greedy) = @_;
    my ($bad, $step) = ('', 0);

    for my $j (@$lines) {
        my @top = @{ $j->{top} // [] };
        my %ids = map { $_->{id} => 1 } @top;
        my $why =
            $j->{step} != $step             ? "step $j->{step}, want $step"
          : $j->{pos} != $n_prompt + $step  ? "pos $j->{pos}"
          : @top != $k                      ? scalar(@top) . " entries"
          : keys(%ids) != $k                ? 'repeated ids'
          : (grep { $top[$_ - 1]{logit} < $top[$_]{logit} } 1 .. $#top)
                                            ? 'not sorted'
          : !($j->{margin} >= 0)            ? "margin $j->{margin}"
          : @top > 1 && abs($j->{margin} - ($top[0]{logit} - $top[1]{logit}))
                > 1e-5                      ? "margin $j->{margin}"
          : $j->{logit} > $top[0]{logit}    ? 'sampled above the best'
          : $greedy && ($j->{token} != $top[0]{id}
                        || $j->{logit} != $top[0]{logit})
                                            ? "token $j->{token} not argmax"
          : '';
        if ($why ne '') {
            $bad = "step $step: $why: " . encode_json($j);
            last;
        }
        $step++;
    }
    is($bad, '', "$name: every line well formed and consistent");
}

{
    my ($rc, $ids) = run_engine('tokenize', '--model', $M, '--text',
                                'Once upon a time');
    my $n_prompt = () = $ids =~ /\d+/g;
    my @p = ('--prompt', 'Once upon a time', '--max-tokens', 24);
    my (undef, $plain) = gen(@p, '--temperature', 0);
    my ($out, $err);

    ($rc, $out, $err) = gen(@p, '--temperature', 0, '--top-logits', 5);
    my @l = top_lines($err);
    is($rc, 0, '--top-logits: exit 0') or diag $err;
    is($out, $plain, '--top-logits: the text is unchanged');
    is(scalar @l, 24, '--top-logits: one line per generated token');
    check_top_lines('greedy, K 5', \@l, 5, $n_prompt, 1);
    is(join('', map { $_->{piece} } @l), $plain,
       '--top-logits: the chosen pieces spell the text');

    ($rc, $out, $err) = gen(@p, '--temperature', 0, '--top-logits', 1,
                            '--max-tokens', 4);
    @l = top_lines($err);
    check_top_lines('greedy, K 1', \@l, 1, $n_prompt, 1);
    ok(@l == 4 && (grep { $_->{margin} > 0 } @l) == 4,
       'K 1: the margin to the unlisted second is still there');

    # the whole vocabulary: every id once (one step; stderr is read after
    # stdout, so the output must fit a pipe)
    ($rc, $out, $err) = gen(@p, '--temperature', 0, '--top-logits', 512,
                            '--max-tokens', 1);
    @l = top_lines($err);
    check_top_lines('K = vocabulary', \@l, 512, $n_prompt, 1);
    is_deeply([sort { $a <=> $b } map { $_->{id} } @{ $l[0]{top} }],
              [0 .. 511], 'K = vocabulary: every token id once');

    # sampling with a penalty: the same text as without the report; the
    # logits shown are the model's, before the penalty, so the token may be
    # any of them. The whole vocabulary is listed, so every token's raw
    # logit is there to compare.
    my @s = (@p, '--temperature', 1, '--seed', 4, '--presence-penalty', 2);
    my (undef, $sampled) = gen(@s);
    my (undef, $top_out, $top_err) = gen(@s, '--top-logits', 512);
    @l = top_lines($top_err);
    is($top_out, $sampled, 'sampling with --top-logits: the same text');
    check_top_lines('sampled, K 512', \@l, 512, $n_prompt, 0);
    ok((grep { $_->{token} != $_->{top}[0]{id} } @l) > 0,
       'sampling: some steps do not take the best logit');
    my (%seen, $repeats, $raw);
    for my $j (@l) {
        my ($t) = grep { $_->{id} == $j->{token} } @{ $j->{top} };
        $raw++ if $t->{logit} == $j->{logit};
        $repeats++ if $seen{ $j->{token} }++;
    }
    ok($repeats, 'sampling: some tokens repeat (and were penalised)');
    is($raw, scalar @l, "sampling: each token's logit is its raw one");
}

# --- make-model: every family loads and generates ------------------------
# (test_model checks their logits; llama.cpp agreement is in the commit log)
for my $arch (qw(qwen3 gemma gemma2 gemma3 phi3)) {
    for my $type (qw(f32 q8_0)) {
        my $f = "$T/m-$arch-$type.gguf";
        my ($rc, $out, $err) = run_engine(
            'make-model', '--out', $f, '--arch', $arch, '--dim', 64,
            '--layers', 2, '--heads', 4, '--kv-heads', 2, '--ffn', 128,
            '--type', $type, '--vocab-from', $M, '--seed', 5, '--swa', 3,
            '--std', 0.1);
        is($rc, 0, "make-model $arch $type") or diag $err;
        ($rc, $out, $err) = run_engine(
            'generate', '--model', $f, '--prompt', 'Once upon a time',
            '--max-tokens', 8, '--temperature', 0, '--stats');
        is($rc, 0, "generate with $arch $type") or diag $err;
        like($err, qr/generated \d+ /, "$arch $type reports its run");
    }
}

# --- make-model: every type loads and generates --------------------------
for my $type (qw(f32 f16 bf16 q8_0 q4_0)) {
    for my $arch (qw(llama qwen2)) {
        my $f = "$T/m-$arch-$type.gguf";
        my ($rc, $out, $err) = run_engine(
            'make-model', '--out', $f, '--arch', $arch, '--dim', 64,
            '--layers', 2, '--heads', 4, '--kv-heads', 2, '--ffn', 128,
            '--type', $type, '--vocab-from', $M, '--seed', 5);
        is($rc, 0, "make-model $arch $type") or diag $err;
        ($rc, $out, $err) = run_engine(
            'generate', '--model', $f, '--prompt', 'Once upon a time',
            '--max-tokens', 8, '--temperature', 0, '--stats');
        is($rc, 0, "generate with $arch $type") or diag $err;
        like($err, qr/generated \d+ /, "$arch $type reports its run");
    }
}
{
    my $f1 = "$T/same1.gguf";
    my $f2 = "$T/same2.gguf";
    my @a = ('--arch', 'llama', '--dim', 64, '--layers', 1, '--heads', 4,
             '--ffn', 64, '--type', 'q8_0', '--vocab-from', $M, '--seed', 9);
    run_engine('make-model', '--out', $f1, @a);
    run_engine('make-model', '--out', $f2, @a);
    is(slurp($f1), slurp($f2), 'make-model is deterministic for a seed');
}

sub slurp {
    open(my $fh, '<:raw', $_[0]) or return '';
    local $/;
    return <$fh>;
}

# --- errors ---------------------------------------------------------------
one_line_error('no command', 'usage|unknown command', 'frobnicate');
one_line_error('unknown option', "unknown option '--bogus'",
               'generate', '--model', $M, '--prompt', 'x', '--bogus', 1);
one_line_error('missing prompt', "missing required option '--prompt'",
               'generate', '--model', $M);
one_line_error('bad temperature', "'--temperature' must be a number",
               'generate', '--model', $M, '--prompt', 'x', '--temperature',
               'hot');
one_line_error('temperature range', "'--temperature' must be a number in 0..2",
               'generate', '--model', $M, '--prompt', 'x', '--temperature', 3);
one_line_error('missing model file', 'No such file',
               'generate', '--model', "$T/none.gguf", '--prompt', 'x');
one_line_error('unknown isa', qr/option '--isa' \(or OMNI_ISA\) must be auto, avx512, avx2, neon or ref, not 'sse9'/,
               'generate', '--model', $M, '--prompt', 'x', '--isa', 'sse9');
one_line_error('top-logits over the vocabulary',
               'K must be between 0 and the vocabulary size 512, got 513',
               'generate', '--model', $M, '--prompt', 'x', '--top-logits',
               513);
one_line_error('top-logits negative', "'--top-logits' must be an integer",
               'generate', '--model', $M, '--prompt', 'x', '--top-logits',
               -1);
one_line_error('prompt too long', 'more than the context',
               'generate', '--model', $M, '--prompt', 'the cat ' x 400);

# corrupt copies of the real model: truncated, bad magic, zeroed header
{
    my $bytes = slurp($M);
    my %bad = (
        'truncated'  => [ substr($bytes, 0, length($bytes) / 2),
                          'truncated or corrupt' ],
        'header cut' => [ substr($bytes, 0, 1000), 'truncated or corrupt' ],
        'bad magic'  => [ 'XXXX' . substr($bytes, 4), 'not a GGUF file' ],
        'tiny'       => [ 'GGUF', 'too short' ],
        'version'    => [ 'GGUF' . pack('V', 7) . substr($bytes, 8),
                          'version 7 is not supported' ],
    );
    for my $name (sort keys %bad) {
        my $f = "$T/bad-$name.gguf";
        open(my $fh, '>:raw', $f) or die $!;
        print $fh $bad{$name}[0];
        close $fh;
        one_line_error("corrupt model ($name)", qr/\Q$f\E: .*$bad{$name}[1]/,
                       'generate', '--model', $f, '--prompt', 'x');
    }
}

one_line_error('make-model bad type', "'--type' must be f32, f16",
               'make-model', '--out', "$T/x.gguf", '--arch', 'llama',
               '--dim', 64, '--layers', 1, '--heads', 4, '--ffn', 64,
               '--type', 'q5_k', '--vocab-from', $M);
one_line_error('make-model bad shape', 'multiples of 32 for q8_0',
               'make-model', '--out', "$T/x.gguf", '--arch', 'llama',
               '--dim', 48, '--layers', 1, '--heads', 4, '--ffn', 64,
               '--type', 'q8_0', '--vocab-from', $M);
one_line_error('make-model bad arch', '--arch must be llama, qwen2, qwen3',
               'make-model', '--out', "$T/x.gguf", '--arch', 'gpt2',
               '--dim', 64, '--layers', 1, '--heads', 4, '--ffn', 64,
               '--type', 'f32', '--vocab-from', $M);
ok(!-e "$T/x.gguf", 'a failed make-model leaves no file');

done_testing();

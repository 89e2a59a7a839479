# The omni-engine command line: every subcommand's output and every error
# path (non-zero exit, one line on stderr naming the problem).
use strict;
use warnings;
use Test::More;
require './t/engine/lib.pl';
our ($MODEL, $TMP);

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
one_line_error('unknown isa', qr/option '--isa' \(or OMNI_ISA\) must be auto, avx512, avx2 or ref, not 'sse9'/,
               'generate', '--model', $M, '--prompt', 'x', '--isa', 'sse9');
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
one_line_error('make-model bad arch', '--arch must be llama or qwen2',
               'make-model', '--out', "$T/x.gguf", '--arch', 'gpt2',
               '--dim', 64, '--layers', 1, '--heads', 4, '--ffn', 64,
               '--type', 'f32', '--vocab-from', $M);
ok(!-e "$T/x.gguf", 'a failed make-model leaves no file');

done_testing();

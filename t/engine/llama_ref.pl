# Greedy decoding compared with llama.cpp's on the same file, token for
# token: what t/engine/quants.t (every weight type x architecture) and
# bench/agreement (the rate over many prompts) share.
#
# llama.cpp's side is t/data/llama-top-logits.c, built by t/build-llama-tools
# against the npm-bundled llama.cpp: llama-simple's greedy loop, printing
# each step's token and two best logits in the engine's --top-logits format,
# run with flash attention off (llama.cpp's CPU flash attention rounds Q and
# the value sums to f16; the engine keeps f32 there, as llama.cpp does with
# it off). Models are written by `omni-engine make-model` and quantized by
# llama.cpp's own llama-quantize, so both engines read the same bytes.
#
# Exact agreement is the rule. The exception is a near tie: a step whose two
# best candidates are closer than the two engines' logits are to each other.
# Activations are quantized before every quantized matmul (Q8_0, Q8_1 or
# Q8_K, as llama.cpp does), so a last-bit difference anywhere upstream (f32
# sums in another order) can move a value across a rounding boundary and
# change a logit by one quantization step of the activations. When every
# logit of one engine is within d of the other's, a margin (best - second)
# can differ by up to 2d between them, so a divergence counts as a near tie
# only when, at that step, both engines' margins are below twice the
# largest logit difference seen up to it (on the candidates both rank in
# their top $TOP_K). That alone would excuse anything, so the callers also
# bound the difference itself relative to the logits (quants.t: 3%).
use strict;
use warnings;
use JSON::PP;
use POSIX ();
use Digest::MD5 qw(md5_hex);

our ($TMP, $MODEL);

# Pieces may be cut inside a UTF-8 sequence (llama-top-logits prints them
# raw): lines are decoded as bytes, and only ids and logits are compared.
my $JSON = JSON::PP->new->utf8(0);

# Candidates each engine reports per step: enough that the token one engine
# picks is almost always among the other's, so its logit difference is
# measured rather than hidden.
our $TOP_K = 8;

# The weight types compared: [llama-quantize type name, pure]. Pure
# (--pure) stores every matrix in the type itself; otherwise llama.cpp's
# mix for that name (Q4_K_M: Q4_K with some Q6_K, ...). only: a
# space-separated list of names to keep, or undef.
sub quant_types {
    my $only = shift;
    my @t = (
        [ 'Q8_0', 1 ], [ 'Q4_0', 1 ], [ 'Q4_1', 1 ], [ 'Q5_0', 1 ],
        [ 'Q5_1', 1 ], [ 'Q2_K', 1 ], [ 'Q3_K', 1 ], [ 'Q4_K', 1 ],
        [ 'Q5_K', 1 ], [ 'Q6_K', 1 ], [ 'IQ4_NL', 1 ], [ 'IQ4_XS', 1 ],
        [ 'Q4_K_M', 0 ], [ 'Q5_K_M', 0 ], [ 'Q3_K_M', 0 ], [ 'Q2_K', 0 ],
    );
    return @t unless $only;
    my %o = map { $_ => 1 } split ' ', $only;
    return grep { $o{ $_->[0] } } @t;
}

# The architectures compared: [name, make-model arguments (undef: the
# default model), vocabulary file]. Random-weight models have rows that are
# multiples of 256, so every K-quant block fits, and a weight std chosen
# per family so that greedy decoding wanders through the vocabulary rather
# than repeating one token (Gemma's embeddings are scaled by sqrt(dim) and
# tied to the output, so it needs its own): quants.t checks the outputs are
# varied. gemma2 and gemma3 get an 8-token window so that sliding-window
# layers matter within 32 tokens (gemma2's final soft-cap flattens its
# logits at a larger std: it gets a small one and 4 layers); gemma3's 7 layers hold its 5 local : 1
# global pattern and one more local layer.
sub quant_archs {
    my ($src, $only) = @_;
    my $m = "$src/models";
    my @shape = qw(--dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768);
    my @a = (
        [ 'stories260K', undef ],
        [ 'llama', [ qw(--arch llama --std 0.08), @shape ],
          "$m/ggml-vocab-llama-spm.gguf" ],
        [ 'qwen2', [ qw(--arch qwen2 --std 0.08), @shape ],
          "$m/ggml-vocab-qwen2.gguf" ],
        [ 'qwen3', [ qw(--arch qwen3 --std 0.08), @shape ],
          "$m/ggml-vocab-qwen2.gguf" ],
        [ 'gemma', [ qw(--arch gemma --std 0.15), @shape ],
          "$m/ggml-vocab-llama-spm.gguf" ],
        [ 'gemma2', [ qw(--arch gemma2 --std 0.01 --swa 8), @shape,
                      qw(--layers 4) ], "$m/ggml-vocab-llama-spm.gguf" ],
        [ 'gemma3', [ qw(--arch gemma3 --std 0.08 --swa 8), @shape,
                      qw(--layers 7) ], "$m/ggml-vocab-llama-spm.gguf" ],
        [ 'phi3', [ qw(--arch phi3 --std 0.08), @shape ],
          "$m/ggml-vocab-phi-3.gguf" ],
    );
    return @a unless $only;
    my %o = map { $_ => 1 } split ' ', $only;
    return grep { $o{ $_->[0] } } @a;
}

# The F32 file of architecture a in dir, written once.
sub source_model {
    my ($dir, $a) = @_;
    my ($name, $args, $vocab) = @$a;
    return $MODEL unless $args;
    my $f = "$dir/$name-f32.gguf";
    return $f if -f $f;
    my ($rc, $out, $err) = run_engine(
        'make-model', '--out', "$f.tmp", @$args, '--type', 'f32',
        '--vocab-from', $vocab, '--seed', 7, '--ctx', 512);
    die "make-model $name failed: $err\n" if $rc != 0;
    rename("$f.tmp", $f) or die "rename: $!\n";
    return $f;
}

# (file, label) of architecture a quantized as type t, written once.
sub quant_file {
    my ($bin, $dir, $a, $t) = @_;
    my ($type, $pure) = @$t;
    my $f32 = source_model($dir, $a);
    my $file = llama_quantize($bin, $f32, "$dir/$a->[0]-" . lc($type)
                              . ($pure ? '' : '-mix') . '.gguf', $type, $pure);
    return ($file, "$a->[0] " . ($pure ? $type : "$type mix"));
}

# (bin dir) of the built llama.cpp tools, building them on first use.
sub llama_tools {
    my $out = `t/build-llama-tools`;
    die "t/build-llama-tools failed\n" if $? != 0;
    chomp(my $bin = (split /\n/, $out)[-1]);
    return $bin;
}

# Runs a command with stdout and stderr in files; returns (rc, out, err).
sub run_cmd {
    my ($env, @cmd) = @_;
    my $o = "$TMP/cmd.out";
    my $e = "$TMP/cmd.err";
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        $ENV{$_} = $env->{$_} for keys %$env;
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $o);
        open(STDERR, '>', $e);
        exec(@cmd) or POSIX::_exit(127);
    }
    waitpid($pid, 0);
    my $rc = $? >> 8;
    local $/;
    open(my $ofh, '<', $o) or die $!;
    open(my $efh, '<', $e) or die $!;
    my ($out, $err) = (<$ofh> // '', <$efh> // '');
    return ($rc, $out, $err);
}

# llama-quantize SRC -> DST as FTYPE (a llama-quantize type name); pure
# asks for every matrix in the type itself (--pure), else llama.cpp's mix.
sub llama_quantize {
    my ($bin, $src, $dst, $ftype, $pure) = @_;
    return $dst if -f $dst;
    my ($rc, $out, $err) = run_cmd({}, "$bin/llama-quantize",
        '--allow-requantize', $pure ? ('--pure') : (), $src, "$dst.tmp",
        $ftype);
    die "llama-quantize $ftype failed:\n$out$err\n" if $rc != 0;
    rename("$dst.tmp", $dst) or die "rename: $!\n";
    return $dst;
}

# The tensor types llama-quantize wrote: "type => count" as a string.
sub gguf_types {
    my ($bin, $file) = @_;
    my ($rc, $out, $err) = run_cmd({ LLAMA_VERBOSE => 1 },
        "$bin/llama-top-logits", $file, 1, 1, 'x');
    my %n = ("$out$err" =~ /- type\s+(\w+):\s+(\d+) tensors/g);
    return join ', ', map { "$n{$_} $_" } sort keys %n;
}

# llama.cpp's greedy steps: list of { token, top => [{id, logit}...],
# margin } hashes, one per generated token.
#
# fa: llama.cpp's flash attention ("off", or "on" for its other path).
# The lines are kept next to the model (model.steps/...), since they depend
# only on the file, the prompt and the count: the passes of isa.t (one per
# kernel set) run llama.cpp once.
sub llama_steps {
    my ($bin, $model, $prompt, $n, $fa) = @_;
    $fa //= 'off';
    my $key = md5_hex("$prompt\0$n\0$fa\0$TOP_K");
    my $cache = "$model.steps/$key";
    my $out;
    if (open(my $fh, '<', $cache)) {
        local $/;
        $out = <$fh>;
    } else {
        my ($rc, $err);
        ($rc, $out, $err) = run_cmd({ LLAMA_FA => $fa },
            "$bin/llama-top-logits", $model, $n, $TOP_K, $prompt);
        die "llama-top-logits failed on $model:\n$err\n" if $rc != 0;
        mkdir("$model.steps");
        open(my $w, '>', "$cache.$$") or die "$cache: $!\n";
        print $w $out;
        close $w;
        rename("$cache.$$", $cache) or die "rename: $!\n";
    }
    return [ map { $JSON->decode($_) } grep { /^\{/ } split /\n/, $out ];
}


# Ours, the same way: `generate --top-logits 2`.
sub our_steps {
    my ($model, $prompt, $n, @extra) = @_;
    my ($rc, $out, $err) = run_engine(
        'generate', '--model', $model, '--prompt', $prompt,
        '--max-tokens', $n, '--temperature', 0, '--top-logits', $TOP_K, @extra);
    return (undef, $err) if $rc != 0;
    return ([ map { $JSON->decode($_) } grep { /^\{/ } split /\n/, $err ],
            '');
}

# Compares two step lists. Returns a hash: same (1 when every token
# agrees), step (the first that differs), noise (largest |logit
# difference| over the candidates both report up to and including that
# step), scale (the largest |logit| among them), ours/llama (the margins
# there), tie (1 when the divergence is a
# near tie as defined above), n (steps compared).
sub compare_steps {
    my ($ours, $llama) = @_;
    my $n = @$ours < @$llama ? @$ours : @$llama;
    my ($d, $noise, $scale) = (0, 0, 0);

    $d++ while $d < $n && $ours->[$d]{token} == $llama->[$d]{token};
    my $last = $d < $n ? $d : $n - 1;
    for my $i (0 .. $last) {
        my %l = map { $_->{id} => $_->{logit} } @{ $llama->[$i]{top} };
        for my $t (@{ $ours->[$i]{top} }) {
            next unless exists $l{ $t->{id} };
            my $diff = abs($t->{logit} - $l{ $t->{id} });
            $noise = $diff if $diff > $noise;
            $scale = abs($t->{logit}) if abs($t->{logit}) > $scale;
        }
    }
    my %r = (same => $d == $n && @$ours == @$llama ? 1 : 0, step => $d,
             noise => $noise, scale => $scale, n => $n);
    return \%r if $d == $n;
    $r{ours} = $ours->[$d]{margin};
    $r{llama} = $llama->[$d]{margin};
    $r{tie} = $r{ours} <= 2 * $noise && $r{llama} <= 2 * $noise ? 1 : 0;
    return \%r;
}

1;

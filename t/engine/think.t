# A Qwen3 model with its own chat template (make-model --chat-template,
# llama.cpp's copy of Qwen/Qwen3-0.6B's) served over the wire protocol:
# the prompt the engine renders, with thinking on and off, counted in
# tokens against `tokenize` on the text Qwen3's template gives; the
# reasoning split on sampled answers (random weights, so what is checked
# is the shape: REASONING before TEXT, reasoning_tokens within
# completion_tokens, none without reasoning); "thinking" ignored by a model
# without a thinking template; a bad "thinking" named. The split itself,
# on token streams with known answers, is t/unit/test_think.c's and
# test_decode.c's; nginx's fields t/reasoning.t's.
use strict;
use warnings;
use Test::More;
use JSON::PP;
require './t/engine/proto.pl';
our ($MODEL, $TMP);

my $LLAMA = $ENV{OMNI_LLAMA_SRC} // '/root/.cache/ngx_omni/llama.cpp';
my $VOCAB = "$LLAMA/models/ggml-vocab-qwen2.gguf";
my $TMPL = "$LLAMA/models/templates/Qwen-Qwen3-0.6B.jinja";
die "$VOCAB or $TMPL is missing (t/fetch-llama-src)\n"
    unless -f $VOCAB && -f $TMPL;

my $q3 = "$TMP/qwen3.gguf";
my ($rc, undef, $err) = run_engine('make-model', '--out', $q3, '--arch',
    'qwen3', '--dim', 64, '--layers', 2, '--heads', 4, '--kv-heads', 2,
    '--ffn', 128, '--type', 'q8_0', '--tied', '--ctx', 512, '--vocab-from',
    $VOCAB, '--chat-template', $TMPL, '--seed', 3);
is($rc, 0, 'make-model qwen3 with the Qwen3 template') or diag $err;

sub n_tokens {
    my ($text) = @_;
    my ($c, $out, $e) = run_engine('tokenize', '--model', $q3, '--text',
                                   $text, '--parse-special');
    die "tokenize: $e" if $c;
    return scalar(split ' ', $out);
}

my $srv = serve_start(model => $q3);
my @hi = (messages => [{ role => 'user', content => 'Hi' }]);
my $gen = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";

# --- the prompt, thinking on and off ------------------------------------
{
    my $on = request($srv, { @hi, max_tokens => 1, temperature => 0 });
    my $off = request($srv, { @hi, max_tokens => 1, temperature => 0,
                              thinking => JSON::PP::false });
    ok($on->{done} && $off->{done}, 'prompt: both answered')
        or diag explain [$on->{error}, $off->{error}];
    is($on->{done}{prompt_tokens}, n_tokens($gen),
       'prompt: thinking on is chatml');
    is($off->{done}{prompt_tokens},
       n_tokens("$gen<think>\n\n</think>\n\n"),
       'prompt: thinking off ends with an empty think block');
    ok($off->{done}{prompt_tokens} > $on->{done}{prompt_tokens},
       'prompt: thinking off is longer');

    # earlier assistant turns lose their reasoning
    my $conv = request($srv, { max_tokens => 1, temperature => 0,
        messages => [{ role => 'user', content => 'Hi' },
                     { role => 'assistant',
                       content => "<think>\nhmm\n</think>\n\nHello" },
                     { role => 'user', content => 'Bye' }] });
    is($conv->{done}{prompt_tokens},
       n_tokens("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                . "Hello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                . "<|im_start|>assistant\n"),
       'prompt: an earlier answer without its reasoning');
}

# --- sampled answers: the split's shape ---------------------------------
for my $seed (1 .. 6) {
    my $r = request($srv, { @hi, max_tokens => 24, temperature => 1,
                            seed => $seed, ignore_eos => JSON::PP::true });
    my $d = $r->{done} // {};
    ok($d->{completion_tokens}, "seed $seed: answered")
        or diag explain $r->{error};
    my @types = map { $_->[0] } @{ $r->{frames} };
    my ($first_text) = grep { $types[$_] == 16 } 0 .. $#types;
    my @late = defined $first_text
        ? grep { $_ == 24 } @types[$first_text .. $#types] : ();
    is(scalar @late, 0, "seed $seed: no REASONING after the first TEXT");
    ok($d->{reasoning_tokens} <= $d->{completion_tokens},
       "seed $seed: reasoning_tokens within completion_tokens");
    if ($r->{reasoning} eq '' && $r->{text} !~ /^<think>/) {
        is($d->{reasoning_tokens}, 0,
           "seed $seed: no reasoning, no reasoning tokens");
    }
    is($d->{finish}, 'length', "seed $seed: cut by max_tokens");
}

# --- a prompt request is never split ------------------------------------
{
    my $r = request($srv, { prompt => 'Hi', max_tokens => 8,
                            temperature => 0 });
    ok(!grep({ $_->[0] == 24 } @{ $r->{frames} }),
       'prompt request: no REASONING');
    is($r->{done}{reasoning_tokens}, 0, 'prompt request: 0 reasoning');
}

# --- a bad "thinking" ---------------------------------------------------
{
    my $r = request($srv, { @hi, thinking => 'no' });
    is($r->{error}{status}, 400, 'bad thinking: 400');
    is($r->{error}{param}, 'thinking', 'bad thinking: param');
}
serve_stop($srv);

# --- a model without a thinking template ignores "thinking" -------------
{
    my $plain = serve_start();
    my @m = (messages => [{ role => 'user', content => 'Once' }],
             max_tokens => 4, temperature => 0);
    my $on = request($plain, { @m });
    my $off = request($plain, { @m, thinking => JSON::PP::false });
    is($off->{done}{prompt_tokens}, $on->{done}{prompt_tokens},
       'no thinking template: the same prompt');
    is($off->{text}, $on->{text}, 'no thinking template: the same answer');
    is($on->{reasoning}, '', 'no thinking template: no REASONING');
    serve_stop($plain);
}

done_testing();

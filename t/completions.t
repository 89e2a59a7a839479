# POST /v1/completions (the legacy endpoint) through nginx: the
# text_completion object, its stream byte for byte, include_usage, stop
# sequences, OpenAI's default of 16 tokens, and what it refuses (n, echo,
# best_of, suffix, logprobs, prompts as token ids or several prompts).
# Texts are the engine's own greedy output (`omni-engine generate
# --temperature 0`) for the same prompt.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
our $P = 'Once upon a time';

our %want = (
    p24 => gen(prompt => $P, max_tokens => 24),
    p16 => gen(prompt => $P, max_tokens => 16),
    p64 => gen(prompt => $P, max_tokens => 64),
);
our $done24 = request(engine(), { prompt => $P, max_tokens => 24,
                                  temperature => 0 })->{done};
our ($stop) = $want{p64} =~ /^(.{12,}?\w) /s;       # a word in the middle
($stop) = $stop =~ /(\w+)$/;
$stop = " $stop";
$want{stop} = substr($want{p64}, 0, index($want{p64}, $stop));
our $engine_stop = request(engine(), { prompt => $P, max_tokens => 64,
    temperature => 0, stop => [$stop] })->{text};

sub cmpl {
    my %o = @_;
    return "POST /v1/completions\n" . encode_json({
        model => $M, prompt => $P, temperature => 0, %o });
}

sub cmpl_json_ok {
    my ($json, $name, $text, %o) = @_;
    ok(ref $json eq 'HASH', "$name: JSON object") or return;
    is_deeply([sort keys %$json],
              [qw(choices created id model object usage)], "$name: keys");
    like($json->{id}, qr/^cmpl-[A-Za-z0-9]+$/, "$name: id");
    is($json->{object}, 'text_completion', "$name: object");
    ok(abs($json->{created} - time) < 120, "$name: created is now");
    is($json->{model}, $M, "$name: model");
    is_deeply($json->{choices}, [{ text => $text, index => 0,
                                   logprobs => undef,
                                   finish_reason => $o{finish} }],
              "$name: one choice with the engine's text");
    my $u = $json->{usage};
    is($u->{completion_tokens}, $o{completion_tokens},
       "$name: completion_tokens") if defined $o{completion_tokens};
    is($u->{total_tokens}, $u->{prompt_tokens} + $u->{completion_tokens},
       "$name: total_tokens adds up");
}

run_tests();

__DATA__

=== TEST 1: completions, non-streaming
--- request eval
::cmpl(max_tokens => 24)
--- error_code: 200
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
cmpl_json_ok($json, $name, $::want{p24}, finish => $::done24->{finish},
             completion_tokens => $::done24->{completion_tokens});
is($json->{usage}{prompt_tokens}, $::done24->{prompt_tokens},
   "$name: prompt_tokens as the engine");
--- no_error_log
[error]



=== TEST 2: no max_tokens: OpenAI's default of 16
--- request eval
::cmpl()
--- error_code: 200
--- check
cmpl_json_ok($json, $name, $::want{p16}, finish => 'length',
             completion_tokens => 16);



=== TEST 3: completions, streaming with include_usage, byte for byte
--- request eval
::cmpl(max_tokens => 24, stream => JSON::PP::true,
       stream_options => { include_usage => JSON::PP::true })
--- error_code: 200
--- response_headers_like
Content-Type: text/event-stream.*
--- check
my $s = sse_parse($body, endpoint => 'completions', model => $::M,
                  include_usage => 1);
ok($s->{ok}, "$name: SSE framing byte for byte")
    or diag("stopped at byte $s->{at}: " . substr($body, $s->{at}, 300));
is($s->{text}, $::want{p24}, "$name: the engine's text");
ok(@{ $s->{texts} } > 1, "$name: several text chunks");
is(scalar(keys %{ $s->{ids} }), 1, "$name: one id");
is($s->{finish}, $::done24->{finish}, "$name: finish_reason");
is($s->{usage}{completion_tokens}, $::done24->{completion_tokens},
   "$name: usage chunk");



=== TEST 4: completions, streaming without include_usage
--- request eval
::cmpl(max_tokens => 16, stream => JSON::PP::true)
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'completions', model => $::M);
ok($s->{ok}, "$name: SSE framing byte for byte");
is($s->{text}, $::want{p16}, "$name: the engine's text");
unlike($body, qr/"usage"/, "$name: no usage");



=== TEST 5: stop as an array of one
--- request eval
::cmpl(max_tokens => 64, stop => [$::stop])
--- error_code: 200
--- check
is($json->{choices}[0]{text}, $::want{stop}, "$name: cut before the stop");
is($json->{choices}[0]{text}, $::engine_stop, "$name: as the engine");
is($json->{choices}[0]{finish_reason}, 'stop', "$name: finish_reason stop");



=== TEST 6: prompt as an array of one string
--- request eval
"POST /v1/completions\n" . ::encode_json({ model => $::M, prompt => [$::P],
    max_tokens => 16, temperature => 0 })
--- error_code: 200
--- check
is($json->{choices}[0]{text}, $::want{p16}, "$name: same as the string");



=== TEST 7: prompt as token ids is refused
--- request eval
::cmpl(prompt => [1, 2, 3])
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'prompt', 'unsupported_value', $name);



=== TEST 8: several prompts are refused
--- request eval
::cmpl(prompt => ['a', 'b'])
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'prompt', 'unsupported_value', $name);



=== TEST 9: missing prompt
--- request eval
"POST /v1/completions\n" . ::encode_json({ model => $::M })
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'prompt',
         'missing_required_parameter', $name);



=== TEST 10: logprobs (an integer here) is refused, naming it
--- request eval
::cmpl(logprobs => 2)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'logprobs', 'unsupported_parameter',
         $name);



=== TEST 11: echo is refused
--- request eval
::cmpl(echo => JSON::PP::true)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'echo', 'unsupported_parameter',
         $name);



=== TEST 12: best_of 2 is refused
--- request eval
::cmpl(best_of => 2)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'best_of', 'unsupported_value',
         $name);



=== TEST 13: n 3 is refused
--- request eval
::cmpl(n => 3)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'n', 'unsupported_value', $name);
like($json->{error}{message}, qr/\b3\b/, "$name: the message quotes n");



=== TEST 14: a non-empty suffix is refused
--- request eval
::cmpl(suffix => 'The end.')
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'suffix', 'unsupported_parameter',
         $name);



=== TEST 15: x-omni-seed on every completion, streamed or not: the client's seed, or a fresh one per request that reproduces its text
--- request eval
[::cmpl(max_tokens => 24, temperature => 1, seed => 77),
 ::cmpl(max_tokens => 24, temperature => 1, seed => 77,
        stream => JSON::PP::true),
 ::cmpl(max_tokens => 24, temperature => 1),
 ::cmpl(max_tokens => 24, temperature => 1, stream => JSON::PP::true)]
--- error_code eval
[200, 200, 200, 200]
--- response_headers_like eval
["X-Omni-Seed: 77", "X-Omni-Seed: 77", "X-Omni-Seed: \\d+",
 "X-Omni-Seed: \\d+"]
--- check
my $text = $i % 2 ? sse_parse($body, endpoint => 'completions',
                              model => $::M)->{text}
                  : $json->{choices}[0]{text};
push @::texts, $text;
is($::texts[1], $::texts[0], "$name: seed 77, streamed or not, one text")
    if $i == 1;
if ($i == 3) {
    # the engine's own answer for seed 77, on its socket
    is(request(engine(), { prompt => $::P, max_tokens => 24,
                           temperature => 1, seed => 77 })->{text},
       $::texts[0], "$name: the engine's text for seed 77");
    my %req = (model => $::M, prompt => $::P, max_tokens => 48,
               temperature => 1, ignore_eos => JSON::PP::true);
    my @r = map { post_json('/v1/completions', \%req) } 1 .. 3;
    my @t = map { $_->{json}{choices}[0]{text} } @r;
    cmp_ok(scalar(keys %{{ map { $_ => 1 } @t }}), '>', 1,
           "$name: unseeded answers differ");
    my $again = post_json('/v1/completions',
                          { %req, seed => 0 + $r[2]{headers}{'x-omni-seed'} });
    is($again->{json}{choices}[0]{text}, $t[2],
       "$name: the reported seed reproduces the text");
}
--- no_error_log
[error]

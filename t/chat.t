# POST /v1/chat/completions through nginx: the JSON answer, the SSE stream
# byte for byte (role chunk, content deltas, finish chunk, include_usage's
# usage chunk, [DONE]), stop sequences, max_completion_tokens and
# max_tokens, what is ignored, and x-request-id. Every expected text is
# the engine's own greedy output for the same prompt (`omni-engine generate
# --chat --temperature 0`; stories260K has no chat template, so the engine
# uses its plain format), and the usage is what the engine reports.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
our $STORY = 'Tell me a story';

# The engine's own answer (text, usage, finish) to a request on its socket.
sub engine_says {
    my %req = @_;
    my $r = request(engine(), { temperature => 0, %req });
    die "engine: no answer for " . encode_json(\%req) unless $r->{done};
    return $r;
}

our %want = (
    story24 => chat_gen(prompt => $STORY, max_tokens => 24),
    story5  => chat_gen(prompt => $STORY, max_tokens => 5),
    story3  => chat_gen(prompt => $STORY, max_tokens => 3),
    story64 => chat_gen(prompt => $STORY, max_tokens => 64),
);
our %engine = (
    story24 => engine_says(messages => [{ role => 'user', content => $STORY }],
                           max_tokens => 24),
);

# Stop sequences taken from the 64-token answer itself, so that they do
# occur: the second word (a string), and a word later on plus one that
# never occurs (an array).
our @words = grep { length > 2 } split /[^A-Za-z']+/, $want{story64};
our $stop1 = " $words[1]";
our @stop2 = ('never-in-this-story', " $words[4]");
sub cut_at { my ($t, @s) = @_; my $i = length $t;
             for (@s) { my $k = index($t, $_); $i = $k if $k >= 0 && $k < $i }
             return substr($t, 0, $i) }
$want{stop1} = cut_at($want{story64}, $stop1);
$want{stop2} = cut_at($want{story64}, @stop2);
$engine{stop1} = engine_says(messages => [{ role => 'user',
    content => $STORY }], max_tokens => 64, stop => $stop1)->{text};
$engine{stop2} = engine_says(messages => [{ role => 'user',
    content => $STORY }], max_tokens => 64, stop => \@stop2)->{text};

# A chat request line and body (Test::Nginx's --- request eval).
sub chat {
    my %o = @_;
    return "POST /v1/chat/completions\n" . ::encode_json({
        model => $M, messages => [{ role => 'user', content => $STORY }],
        temperature => 0, %o });
}

# The JSON of a non-streaming chat answer, key by key.
sub chat_json_ok {
    my ($json, $name, $text, %o) = @_;
    ok(ref $json eq 'HASH', "$name: JSON object") or return;
    is_deeply([sort keys %$json],
              [qw(choices created id model object usage)], "$name: keys");
    like($json->{id}, qr/^chatcmpl-[A-Za-z0-9]+$/, "$name: id");
    is($json->{object}, 'chat.completion', "$name: object");
    ok(abs($json->{created} - time) < 120, "$name: created is now");
    is($json->{model}, $M, "$name: model");
    is(scalar @{ $json->{choices} }, 1, "$name: one choice");
    my $c = $json->{choices}[0];
    is_deeply([sort keys %$c], [qw(finish_reason index logprobs message)],
              "$name: choice keys");
    is($c->{index}, 0, "$name: index 0");
    is($c->{logprobs}, undef, "$name: logprobs null");
    is_deeply($c->{message}, { role => 'assistant', content => $text,
                               refusal => undef, annotations => [] },
              "$name: message: the engine's text");
    is($c->{finish_reason}, $o{finish}, "$name: finish_reason $o{finish}")
        if $o{finish};
    my $u = $json->{usage};
    is($u->{total_tokens}, $u->{prompt_tokens} + $u->{completion_tokens},
       "$name: total_tokens adds up");
    is($u->{completion_tokens}, $o{completion_tokens},
       "$name: completion_tokens $o{completion_tokens}")
        if defined $o{completion_tokens};
    is($u->{prompt_tokens}, $o{prompt_tokens},
       "$name: prompt_tokens $o{prompt_tokens}")
        if defined $o{prompt_tokens};
    is_deeply([sort keys %{ $u->{prompt_tokens_details} }],
              [qw(audio_tokens cached_tokens)], "$name: usage details");
}

# Checks an SSE body byte for byte (sse_parse in t/lib/Omni.pm) and that
# its text is the engine's.
sub chat_sse_ok {
    my ($body, $name, $text, %o) = @_;
    my $s = sse_parse($body, endpoint => 'chat', model => $M, %o);
    ok($s->{ok}, "$name: SSE framing byte for byte")
        or diag("stopped at byte $s->{at}: "
                . substr($body, $s->{at}, 300));
    is($s->{text}, $text, "$name: streamed text is the engine's");
    ok(@{ $s->{texts} } > 1, "$name: several content deltas");
    ok(!grep({ $_ eq '' } @{ $s->{texts} }), "$name: no empty delta");
    is(scalar(keys %{ $s->{ids} }), 1, "$name: one id in every chunk");
    is(scalar(keys %{ $s->{created} }), 1, "$name: one created");
    is($s->{finish}, $o{finish}, "$name: finish_reason $o{finish}")
        if $o{finish};
    return $s;
}

run_tests();

__DATA__

=== TEST 1: chat, non-streaming: the chat.completion object
--- request eval
::chat(max_tokens => 24)
--- more_headers
Content-Type: application/json
--- error_code: 200
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
chat_json_ok($json, $name, $::want{story24},
             finish => $::engine{story24}{done}{finish},
             completion_tokens => $::engine{story24}{done}{completion_tokens},
             prompt_tokens => $::engine{story24}{done}{prompt_tokens});
like($body, qr/\A\{"id":"chatcmpl-[A-Za-z0-9]+","object":"chat\.completion",(?#
               )"created":\d+,"model":"\Q$::M\E","choices":\[\{"index":0,(?#
               )"message":\{"role":"assistant","content":"(?:[^"\\]|\\.)*",(?#
               )"refusal":null,"annotations":\[\]\},"logprobs":null,(?#
               )"finish_reason":"(?:stop|length)"\}\],"usage":\{[^\n]*\}\}\n\z/,
     "$name: the bytes, key order included");
--- no_error_log
[error]



=== TEST 2: chat, streaming: role chunk, deltas, finish chunk, [DONE]
--- request eval
::chat(max_tokens => 24, stream => JSON::PP::true)
--- error_code: 200
--- response_headers_like
Content-Type: text/event-stream.*
X-Request-Id: [0-9a-f]{32}
--- check
my $s = chat_sse_ok($body, $name, $::want{story24},
                    finish => $::engine{story24}{done}{finish});
unlike($body, qr/"usage"/, "$name: no usage key without include_usage");
--- no_error_log
[error]



=== TEST 3: chat, streaming with stream_options.include_usage
--- request eval
::chat(max_tokens => 24, stream => JSON::PP::true,
       stream_options => { include_usage => JSON::PP::true })
--- error_code: 200
--- check
my $s = chat_sse_ok($body, $name, $::want{story24}, include_usage => 1,
                    finish => $::engine{story24}{done}{finish});
my $u = $s->{usage};
ok($u, "$name: a usage chunk before [DONE]");
is($u->{completion_tokens}, $::engine{story24}{done}{completion_tokens},
   "$name: usage.completion_tokens as the engine");
is($u->{prompt_tokens}, $::engine{story24}{done}{prompt_tokens},
   "$name: usage.prompt_tokens as the engine");
is($u->{total_tokens}, $u->{prompt_tokens} + $u->{completion_tokens},
   "$name: usage.total_tokens adds up");
--- no_error_log
[error]



=== TEST 4: stream_options.include_usage false: no usage chunk
--- request eval
::chat(max_tokens => 5, stream => JSON::PP::true,
       stream_options => { include_usage => JSON::PP::false })
--- error_code: 200
--- check
chat_sse_ok($body, $name, $::want{story5});
unlike($body, qr/"usage"/, "$name: no usage key");



=== TEST 5: stop as a string: the text ends before it, finish_reason stop
--- request eval
::chat(max_tokens => 64, stop => $::stop1)
--- error_code: 200
--- check
is($json->{choices}[0]{message}{content}, $::want{stop1},
   "$name: cut before the stop string");
is($json->{choices}[0]{message}{content}, $::engine{stop1},
   "$name: as the engine");
is($json->{choices}[0]{finish_reason}, 'stop', "$name: finish_reason stop");
unlike($json->{choices}[0]{message}{content}, qr/\Q$::stop1\E/,
       "$name: the stop string is not in the text");



=== TEST 6: stop as an array, streaming
--- request eval
::chat(max_tokens => 64, stop => \@::stop2, stream => JSON::PP::true)
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
ok($s->{ok}, "$name: SSE framing");
is($s->{text}, $::want{stop2}, "$name: cut before the first stop string");
is($s->{text}, $::engine{stop2}, "$name: as the engine");
is($s->{finish}, 'stop', "$name: finish_reason stop");



=== TEST 7: max_tokens limits the answer: finish_reason length
--- request eval
::chat(max_tokens => 5)
--- error_code: 200
--- check
chat_json_ok($json, $name, $::want{story5}, finish => 'length',
             completion_tokens => 5);



=== TEST 8: max_completion_tokens wins over max_tokens
--- request eval
::chat(max_tokens => 5, max_completion_tokens => 3)
--- error_code: 200
--- check
chat_json_ok($json, $name, $::want{story3}, finish => 'length',
             completion_tokens => 3);



=== TEST 9: max_completion_tokens alone
--- request eval
::chat(max_completion_tokens => 5)
--- error_code: 200
--- check
chat_json_ok($json, $name, $::want{story5}, finish => 'length',
             completion_tokens => 5);



=== TEST 10: unknown and ignorable fields are ignored
--- request eval
::chat(max_tokens => 5, user => 'u-1', metadata => { a => 'b' },
       store => JSON::PP::false, service_tier => 'auto',
       some_future_field => [1, 2, 3], n => 1, logprobs => JSON::PP::false,
       tools => [], tool_choice => 'none', response_format => { type => 'text' },
       modalities => ['text'], parallel_tool_calls => JSON::PP::true)
--- error_code: 200
--- check
chat_json_ok($json, $name, $::want{story5}, completion_tokens => 5);



=== TEST 11: content as an array of text parts equals the string
--- request eval
"POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    temperature => 0, max_tokens => 5, messages => [{ role => 'user',
    content => [{ type => 'text', text => 'Tell me ' },
                { type => 'text', text => 'a story' }] }] })
--- error_code: 200
--- check
is($json->{choices}[0]{message}{content}, $::want{story5},
   "$name: the engine's text for the joined parts");



=== TEST 12: seed: two sampled requests with one seed agree, streamed or not; x-omni-seed says the seed
--- request eval
[::chat(max_tokens => 16, temperature => 1, seed => 1234),
 ::chat(max_tokens => 16, temperature => 1, seed => 1234,
        stream => JSON::PP::true)]
--- error_code eval
[200, 200]
--- response_headers_like eval
["X-Omni-Seed: 1234", "X-Omni-Seed: 1234"]
--- check
push @::seeded, $i ? sse_parse($body, endpoint => 'chat', model => $::M)->{text}
                   : $json->{choices}[0]{message}{content};
ok(length $::seeded[-1] > 0, "$name #$i: text");
is($::seeded[1], $::seeded[0], "$name: same text") if @::seeded == 2;



=== TEST 13: x-request-id is the id of the completion
--- request eval
::chat(max_tokens => 2)
--- error_code: 200
--- response_headers_like
X-Request-Id: [0-9a-f]{32}
--- check
like($json->{id}, qr/^chatcmpl-[0-9a-f]{32}$/, "$name: chatcmpl-<request id>");



=== TEST 14: GET is refused: 405
--- request
GET /v1/chat/completions
--- error_code: 405
--- response_headers_like
X-Request-Id: [0-9a-f]{32}
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 15: a multi-turn conversation with a system message
--- request eval
"POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    temperature => 0, max_tokens => 8, messages => [
        { role => 'system', content => 'You tell stories.' },
        { role => 'user', content => 'Hi' },
        { role => 'assistant', content => 'Hello!' },
        { role => 'developer', content => 'Be brief.' },
        { role => 'user', content => $::STORY }] })
--- error_code: 200
--- check
ok(length $json->{choices}[0]{message}{content}, "$name: an answer");
is($json->{usage}{completion_tokens} <= 8, 1, "$name: within max_tokens");



=== TEST 16: without a seed each request samples afresh, and sending back its x-omni-seed reproduces it
--- request eval
::chat(max_tokens => 2, temperature => 1)
--- error_code: 200
--- response_headers_like
X-Omni-Seed: \d+
--- check
# four unseeded answers of 48 sampled tokens (ignore_eos: all 48 come):
# the same text four times by chance is practically impossible
my %req = (model => $::M, temperature => 1, max_tokens => 48,
           ignore_eos => JSON::PP::true,
           messages => [{ role => 'user', content => $::STORY }]);
my @r = map { post_json('/v1/chat/completions', \%req) } 1 .. 4;
my @seeds = map { $_->{headers}{'x-omni-seed'} // '' } @r;
my @texts = map { $_->{json}{choices}[0]{message}{content} // '' } @r;
is_deeply([map { $_->{status} } @r], [200, 200, 200, 200], "$name: 200s");
is(scalar(grep { /^\d+$/ && $_ <= 9223372036854775807 } @seeds), 4,
   "$name: each reports its seed (a valid seed)") or diag "@seeds";
is(scalar(keys %{{ map { $_ => 1 } @seeds }}), 4, "$name: four seeds");
cmp_ok(scalar(keys %{{ map { $_ => 1 } @texts }}), '>', 1,
       "$name: not the same text four times") or diag(Test::More::explain(\@texts));
is($r[0]{json}{usage}{completion_tokens}, 48, "$name: 48 tokens sampled");

# the reported seed reproduces the answer, whole and streamed
my $again = post_json('/v1/chat/completions', { %req, seed => 0 + $seeds[0] });
is($again->{json}{choices}[0]{message}{content}, $texts[0],
   "$name: seed $seeds[0] reproduces the first answer");
is($again->{headers}{'x-omni-seed'}, $seeds[0], "$name: and reports it");
my $st = post_json('/v1/chat/completions', { %req, seed => 0 + $seeds[1],
                                             stream => JSON::PP::true });
is(sse_parse($st->{body}, endpoint => 'chat', model => $::M)->{text},
   $texts[1], "$name: streamed with seed $seeds[1]: the second answer");
is($st->{headers}{'x-omni-seed'}, $seeds[1], "$name: streamed: header");

# greedy does not depend on the seed: two unseeded answers agree
my @g = map { post_json('/v1/chat/completions', { %req, temperature => 0 }) }
        1 .. 2;
isnt($g[0]{headers}{'x-omni-seed'}, $g[1]{headers}{'x-omni-seed'},
     "$name: greedy: seeds drawn");
is($g[0]{json}{choices}[0]{message}{content},
   $g[1]{json}{choices}[0]{message}{content}, "$name: greedy: same text");
--- no_error_log
[error]

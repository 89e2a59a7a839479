# A thinking model's reasoning (Qwen3's <think>): the options that turn
# thinking off (reasoning_effort "none", chat_template_kwargs
# .enable_thinking false) and their checks, and the engine's REASONING
# frames as message.reasoning_content, delta.reasoning_content and
# usage.completion_tokens_details.reasoning_tokens. The frames come from
# the stand-in engine (t/lib/FakeEngine.pm: "think", "think-length"), so
# every byte of the answers is known; "think-echo" answers with the
# engine request the module sent. The real engine's split is
# t/unit/test_think.c's and t/engine/think.t's.
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }
use t::lib::Omni;
use t::lib::FakeEngine;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = 'fake-model';
$ENV{TEST_NGINX_FAKE_SOCKET} = "$main::TMP/fake-engine-think.sock";
our $fake = fake_engine_start($ENV{TEST_NGINX_FAKE_SOCKET});

sub chat {
    my ($content, %o) = @_;
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => $content }], %o });
}

sub stream { return chat($_[0], stream => JSON::PP::true, @_[1 .. $#_]) }

sub completion {
    my ($prompt, %o) = @_;
    return "POST /v1/completions\n" . encode_json({ model => $M,
        prompt => $prompt, %o });
}

add_block_preprocessor(sub {
    my $block = shift;
    $block->set_value('config', <<'EOF') unless defined $block->config;
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
EOF
});

run_tests();

__DATA__

=== TEST 1: reasoning and answer apart, not streaming
--- request eval
::chat('think')
--- error_code: 200
--- check
my $m = $json->{choices}[0]{message};
is($m->{content}, 'It is 4.', "$name: content");
is($m->{reasoning_content}, 'Let me see.', "$name: reasoning_content");
is($m->{role}, 'assistant', "$name: role");
is($json->{choices}[0]{finish_reason}, 'stop', "$name: finish");
is($json->{usage}{completion_tokens}, 9, "$name: completion_tokens");
is($json->{usage}{completion_tokens_details}{reasoning_tokens}, 6,
   "$name: reasoning_tokens");
like($body, qr/"content":"It is 4\.","reasoning_content":"Let me see\.",(?#
               )"refusal":null/, "$name: field order");
--- no_error_log
[error]



=== TEST 2: without reasoning there is no reasoning_content, and 0 tokens
--- request eval
::chat('plain')
--- error_code: 200
--- check
my $m = $json->{choices}[0]{message};
is($m->{content}, 'fake', "$name: content");
ok(!exists $m->{reasoning_content}, "$name: no reasoning_content");
is($json->{usage}{completion_tokens_details}{reasoning_tokens}, 0,
   "$name: reasoning_tokens");
--- no_error_log
[error]



=== TEST 3: streaming: role first, reasoning deltas, then content deltas
--- request eval
::stream('think', stream_options => { include_usage => JSON::PP::true })
--- error_code: 200
--- check
my $s = sse_parse($body, model => $M, include_usage => 1);
ok($s->{ok}, "$name: the stream is well-formed") or diag $body;
is_deeply($s->{reasonings}, ['Let me', ' see.'], "$name: reasoning deltas");
is_deeply($s->{texts}, ['It is', ' 4.'], "$name: content deltas");
is($s->{finish}, 'stop', "$name: finish");
is($s->{usage}{completion_tokens_details}{reasoning_tokens}, 6,
   "$name: reasoning_tokens");
is($s->{usage}{completion_tokens}, 9, "$name: completion_tokens");
unlike($body, qr/"delta":\{\}[^\n]*"finish_reason":null/,
       "$name: no empty delta before the end");
--- no_error_log
[error]



=== TEST 4: cut short while thinking: all reasoning, finish "length"
--- request eval
[::chat('think-length'), ::stream('think-length')]
--- error_code eval
[200, 200]
--- check
if ($i == 0) {
    my $m = $json->{choices}[0]{message};
    is($m->{content}, '', "$name: content");
    is($m->{reasoning_content}, 'Still thinking', "$name: reasoning");
    is($json->{choices}[0]{finish_reason}, 'length', "$name: finish");
    is($json->{usage}{completion_tokens_details}{reasoning_tokens}, 4,
       "$name: reasoning_tokens");
} else {
    my $s = sse_parse($body, model => $M);
    ok($s->{ok}, "$name: the stream is well-formed") or diag $body;
    is($s->{reasoning}, 'Still thinking', "$name: reasoning");
    is_deeply($s->{texts}, [], "$name: no content delta");
    is($s->{finish}, 'length', "$name: finish");
}
--- no_error_log
[error]



=== TEST 5: thinking off reaches the engine as "thinking": false
--- request eval
[::chat('think-echo', reasoning_effort => 'none'),
 ::chat('think-echo', chat_template_kwargs =>
        { enable_thinking => JSON::PP::false, other => 1 }),
 ::chat('think-echo', reasoning_effort => 'high',
        chat_template_kwargs => { enable_thinking => JSON::PP::true }),
 ::chat('think-echo', reasoning_effort => undef,
        chat_template_kwargs => undef),
 ::chat('think-echo', reasoning_effort => 'low',
        chat_template_kwargs => { enable_thinking => JSON::PP::false })]
--- error_code eval
[200, 200, 200, 200, 200]
--- check
my $req = decode_json($json->{choices}[0]{message}{content});
my @off = (1, 1, 0, 0, 1);
if ($off[$i]) {
    ok(exists $req->{thinking} && !$req->{thinking},
       "$name: request $i has thinking false");
} else {
    ok(!exists $req->{thinking}, "$name: request $i has no thinking");
}
ok(!exists $req->{reasoning_effort} && !exists $req->{chat_template_kwargs},
   "$name: request $i: the OpenAI fields are not passed on");
--- no_error_log
[error]



=== TEST 6: bad values are 400s naming the field
--- request eval
[::chat('x', reasoning_effort => 'huge'),
 ::chat('x', reasoning_effort => 1),
 ::chat('x', chat_template_kwargs => 'enable_thinking=false'),
 ::chat('x', chat_template_kwargs => { enable_thinking => 'false' }),
 ::chat('x', chat_template_kwargs => [1])]
--- error_code eval
[400, 400, 400, 400, 400]
--- check
my @want = (['reasoning_effort', 'invalid_value'],
            ['reasoning_effort', 'invalid_type'],
            ['chat_template_kwargs', 'invalid_type'],
            ['chat_template_kwargs.enable_thinking', 'invalid_type'],
            ['chat_template_kwargs', 'invalid_type']);
error_is($json, 'invalid_request_error', $want[$i][0], $want[$i][1],
         "$name: request $i");
like($json->{error}{message}, qr/\Q$want[$i][0]\E|huge/,
     "$name: request $i: the message names it");



=== TEST 7: a completions request ignores the chat-only fields
--- request eval
::completion('think-echo', reasoning_effort => 'huge')
--- error_code: 200
--- check
my $req = decode_json($json->{choices}[0]{text});
ok(!exists $req->{thinking}, "$name: no thinking");
--- no_error_log
[error]



=== TEST 8: REASONING for a completions request is the engine's mistake
--- request eval
::completion('think')
--- error_code: 502
--- error_log
omni engine sent unexpected frame type 24

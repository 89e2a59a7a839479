# Errors through nginx, each an OpenAI error object
# {"error":{"message","type","param","code"}} with the right status:
# invalid JSON, wrong types, missing or empty messages, values out of
# range (the engine's checks, passed on with their param), n > 1 and
# logprobs refused naming the parameter, unknown model 404, unknown route
# 404, wrong method 405, a body over client_max_body_size 413, the engine
# down 503 with Retry-After. A client mistake is never a 5xx, and every
# answer has an x-request-id.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

sub chat {
    my %o = @_;
    my %body = (model => $M, messages => [{ role => 'user', content => 'Hi' }],
                max_tokens => 2, %o);
    delete $body{$_} for grep { !defined $body{$_} } keys %body;
    return "POST /v1/chat/completions\n" . encode_json(\%body);
}

add_block_preprocessor(sub {
    my $b = shift;
    $b->set_value('error_code', 400) unless defined $b->error_code;
    $b->set_value('response_headers_like',
                  "Content-Type: application/json\nX-Request-Id: [0-9a-f]{32}")
        unless defined $b->response_headers_like;
});

run_tests();

__DATA__

=== TEST 1: invalid JSON
--- request
POST /v1/chat/completions
{"model": "x", "messages": [
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);
like($json->{error}{message}, qr/could not parse the JSON body/,
     "$name: says so");
--- no_error_log
[error]



=== TEST 2: not an object
--- request
POST /v1/chat/completions
[1, 2, 3]
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_type', $name);



=== TEST 3: an empty body
--- request
POST /v1/chat/completions
--- check
error_is($json, 'invalid_request_error', undef, '*', $name);



=== TEST 4: missing messages
--- request eval
"POST /v1/chat/completions\n" . ::encode_json({ model => $::M })
--- check
error_is($json, 'invalid_request_error', 'messages',
         'missing_required_parameter', $name);



=== TEST 5: empty messages
--- request eval
::chat(messages => [])
--- check
error_is($json, 'invalid_request_error', 'messages', 'empty_array', $name);



=== TEST 6: messages of the wrong type
--- request eval
::chat(messages => 'Hi')
--- check
error_is($json, 'invalid_request_error', 'messages', 'invalid_type', $name);



=== TEST 7: a message without content (the engine names it)
--- request eval
::chat(messages => [{ role => 'user' }])
--- check
error_is($json, 'invalid_request_error', 'messages[0].content', undef, $name);



=== TEST 8: a message with an unknown role
--- request eval
::chat(messages => [{ role => 'wizard', content => 'x' }])
--- check
error_is($json, 'invalid_request_error', 'messages[0].role', undef, $name);



=== TEST 9: an image content part is refused, with its path
--- request eval
::chat(messages => [{ role => 'user', content => [{ type => 'text',
    text => 'x' }, { type => 'image_url', image_url => { url => 'x' } }] }])
--- check
error_is($json, 'invalid_request_error', 'messages[0].content[1]',
         'unsupported_value', $name);



=== TEST 10: missing model
--- request eval
::chat(model => undef)
--- check
error_is($json, 'invalid_request_error', 'model',
         'missing_required_parameter', $name);



=== TEST 11: model of the wrong type
--- request eval
::chat(model => 7)
--- check
error_is($json, 'invalid_request_error', 'model', 'invalid_type', $name);



=== TEST 12: unknown model: 404 model_not_found
--- request eval
::chat(model => 'no-such-model')
--- error_code: 404
--- check
error_is($json, 'invalid_request_error', 'model', 'model_not_found', $name);
like($json->{error}{message}, qr/no-such-model/, "$name: names the model");



=== TEST 13: stream of the wrong type
--- request eval
::chat(stream => 'yes')
--- check
error_is($json, 'invalid_request_error', 'stream', 'invalid_type', $name);



=== TEST 14: stream_options without stream
--- request eval
::chat(stream_options => { include_usage => JSON::PP::true })
--- check
error_is($json, 'invalid_request_error', 'stream_options', undef, $name);



=== TEST 15: temperature of the wrong type (the engine's check)
--- request eval
::chat(temperature => 'hot')
--- check
error_is($json, 'invalid_request_error', 'temperature', undef, $name);



=== TEST 16: temperature out of range (no x-omni-seed: nothing was sampled)
--- request eval
::chat(temperature => 5)
--- raw_response_headers_unlike: (?i)x-omni-seed
--- check
error_is($json, 'invalid_request_error', 'temperature', undef, $name);
like($json->{error}{message}, qr/\b5\b/, "$name: quotes the value");



=== TEST 17: top_p out of range
--- request eval
::chat(top_p => 0)
--- check
error_is($json, 'invalid_request_error', 'top_p', undef, $name);



=== TEST 18: presence_penalty out of range
--- request eval
::chat(presence_penalty => 3)
--- check
error_is($json, 'invalid_request_error', 'presence_penalty', undef, $name);



=== TEST 19: seed below 0, not an integer, too large (the module checks the seed: it reports it in x-omni-seed)
--- request eval
[::chat(seed => -1), ::chat(seed => 1.5), ::chat(seed => '7'),
 "POST /v1/chat/completions\n{\"model\":\"$::M\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"seed\":9223372036854775808}"]
--- error_code eval
[400, 400, 400, 400]
--- response_headers_like eval
[("Content-Type: application/json\nX-Request-Id: [0-9a-f]{32}") x 4]
--- raw_response_headers_unlike eval
[("(?i)x-omni-seed") x 4]
--- check
error_is($json, 'invalid_request_error', 'seed',
         ['integer_below_min_value', 'invalid_type', 'invalid_type',
          'integer_above_max_value']->[$i], "$name #$i");



=== TEST 20: stop of the wrong type
--- request eval
::chat(stop => [1])
--- check
error_is($json, 'invalid_request_error', 'stop', undef, $name);



=== TEST 21: five stop sequences
--- request eval
::chat(stop => [qw(a b c d e)])
--- check
error_is($json, 'invalid_request_error', 'stop', undef, $name);



=== TEST 22: max_tokens 0
--- request eval
::chat(max_tokens => 0)
--- check
error_is($json, 'invalid_request_error', 'max_tokens',
         'integer_below_min_value', $name);



=== TEST 23: max_completion_tokens not an integer
--- request eval
::chat(max_completion_tokens => 2.5)
--- check
error_is($json, 'invalid_request_error', 'max_completion_tokens',
         'invalid_type', $name);



=== TEST 24: max_tokens as a string
--- request eval
::chat(max_tokens => '10')
--- check
error_is($json, 'invalid_request_error', 'max_tokens', 'invalid_type', $name);



=== TEST 25: n 2 is refused, naming n
--- request eval
::chat(n => 2)
--- check
error_is($json, 'invalid_request_error', 'n', 'unsupported_value', $name);



=== TEST 26: logprobs true is refused, naming logprobs
--- request eval
::chat(logprobs => JSON::PP::true)
--- check
error_is($json, 'invalid_request_error', 'logprobs', 'unsupported_parameter',
         $name);



=== TEST 27: top_logprobs is refused
--- request eval
::chat(top_logprobs => 3)
--- check
error_is($json, 'invalid_request_error', 'top_logprobs',
         'unsupported_parameter', $name);



=== TEST 28: tools are refused
--- request eval
::chat(tools => [{ type => 'function', function => { name => 'f' } }])
--- check
error_is($json, 'invalid_request_error', 'tools', 'unsupported_parameter',
         $name);



=== TEST 29: audio output without its "audio" parameter is refused
--- request eval
::chat(modalities => ['text', 'audio'])
--- check
error_is($json, 'invalid_request_error', 'audio', 'missing_required_parameter',
         $name);



=== TEST 30: a prompt longer than the context (the engine's check)
--- request eval
::chat(messages => [{ role => 'user', content => 'x ' x 3000 }])
--- check
error_is($json, 'invalid_request_error', 'messages',
         'context_length_exceeded', $name);



=== TEST 31: a streaming request's error comes before the stream: JSON
--- request eval
::chat(stream => JSON::PP::true, temperature => 9)
--- check
error_is($json, 'invalid_request_error', 'temperature', undef, $name);



=== TEST 32: a NUL byte in the body
--- request eval
"POST /v1/chat/completions\n{\"model\":\"x\",\0\"messages\":[]}"
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 33: nesting deeper than 64 levels
--- request eval
"POST /v1/chat/completions\n{\"model\":\"x\",\"metadata\":"
. ('[' x 100) . (']' x 100) . "}"
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 34: wrong method on chat: 405
--- request
GET /v1/chat/completions
--- error_code: 405
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 35: wrong method on models: 405
--- request
POST /v1/models
{}
--- error_code: 405
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 36: unknown route under /v1/: 404
--- request
POST /v1/embeddings
{}
--- error_code: 404
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 37: a body over client_max_body_size: 413 in JSON
--- config
    location /v1/ {
        client_max_body_size 100;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request eval
::chat(messages => [{ role => 'user', content => 'x' x 500 }])
--- error_code: 413
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 38: engine down: 503 JSON with Retry-After
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
    }
--- request eval
::chat()
--- error_code: 503
--- response_headers_like
Content-Type: application/json
Retry-After: \d+
X-Request-Id: [0-9a-f]{32}
--- check
error_is($json, 'server_error', undef, 'engine_unavailable', $name);



=== TEST 39: engine down, streaming: still a JSON 503 (nothing was sent)
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
    }
--- request eval
::chat(stream => JSON::PP::true)
--- error_code: 503
--- response_headers_like
Content-Type: application/json
Retry-After: \d+
--- check
error_is($json, 'server_error', undef, 'engine_unavailable', $name);



=== TEST 40: engine down: models list 503 too
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
    }
--- request
GET /v1/models
--- error_code: 503
--- response_headers_like
Content-Type: application/json
Retry-After: \d+
--- check
error_is($json, 'server_error', undef, 'engine_unavailable', $name);



=== TEST 41: the nginx still serves after all that
--- request eval
::chat()
--- error_code: 200
--- response_headers_like
Content-Type: application/json
--- check
is($json->{object}, 'chat.completion', "$name: a completion");

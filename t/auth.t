# omni_api_keys FILE: Bearer-token auth. No key or a wrong one is a 401
# with the OpenAI error object (and the request never reaches the
# engine); a listed key passes; the keys never appear in error.log.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

sub chat {
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => 'Hi' }], max_tokens => 2 });
}

add_block_preprocessor(sub {
    my $b = shift;
    $b->set_value('user_files', <<'KEYS') unless defined $b->user_files;
>>> keys.txt
# one key a line; comments and blank lines are skipped
sk-right-key-0001

sk-second-key-0002
KEYS
    $b->set_value('config', <<'CONF') unless defined $b->config;
    location /v1/ {
        omni_api_keys $TEST_NGINX_SERVROOT/html/keys.txt;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
CONF
    $b->set_value('no_error_log', "sk-right-key-0001\nsk-second-key-0002\n"
                  . "sk-wrong-key-9999\n[error]")
        unless defined $b->no_error_log;
});

run_tests();

__DATA__

=== TEST 1: no Authorization header: 401
--- request
GET /v1/models
--- error_code: 401
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
error_is($json, 'invalid_request_error', undef, '*', $name);
like($json->{error}{message}, qr/API key/i, "$name: says an API key is needed");



=== TEST 2: a wrong key: 401 invalid_api_key
--- request
GET /v1/models
--- more_headers
Authorization: Bearer sk-wrong-key-9999
--- error_code: 401
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_api_key', $name);
unlike($body, qr/sk-wrong-key-9999/, "$name: the key is not echoed whole");



=== TEST 3: the right key: 200
--- request
GET /v1/models
--- more_headers
Authorization: Bearer sk-right-key-0001
--- error_code: 200
--- check
is($json->{data}[0]{id}, $::M, "$name: the models list");



=== TEST 4: the second key of the file works too, for a chat
--- request eval
::chat()
--- more_headers
Authorization: Bearer sk-second-key-0002
--- error_code: 200
--- check
is($json->{object}, 'chat.completion', "$name: a completion");



=== TEST 5: a wrong key on a chat request: 401 before the body matters
--- request eval
::chat()
--- more_headers
Authorization: Bearer sk-wrong-key-9999
--- error_code: 401
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_api_key', $name);



=== TEST 6: not a Bearer token: 401
--- request
GET /v1/models
--- more_headers
Authorization: Basic c2stcmlnaHQta2V5LTAwMDE=
--- error_code: 401
--- check
error_is($json, 'invalid_request_error', undef, '*', $name);



=== TEST 7: a prefix of a right key is wrong
--- request
GET /v1/models
--- more_headers
Authorization: Bearer sk-right-key-000
--- error_code: 401
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_api_key', $name);



=== TEST 8: the module counts auth failures in its metrics
--- request eval
["GET /v1/models", "GET /metrics"]
--- error_code eval
[401, 200]
--- check
if ($i == 1) {
    my ($n) = $body =~ /^omni_\w*auth\w*(?:\{[^}]*\})? (\d+)$/m;
    ok(defined $n && $n >= 1, "$name: an auth failure counted")
        or diag($body);
}



=== TEST 9: omni_api_keys with a missing file: nginx refuses the config
--- config
    location /v1/ {
        omni_api_keys $TEST_NGINX_SERVROOT/html/no-such-keys.txt;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- must_die
--- error_log eval
qr/no-such-keys\.txt/
--- no_error_log

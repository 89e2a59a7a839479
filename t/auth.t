# omni_api_keys FILE: Bearer-token auth. No key, a wrong one or a
# malformed Authorization (no key after Bearer, another scheme, a very
# long key) is a 401 with the OpenAI error object and WWW-Authenticate
# (and the request never reaches the engine); a listed key passes; no
# other response carries WWW-Authenticate. The keys never appear in
# error.log: not in the module's lines at any level (debug included),
# not at all at info and above, but for the lines nginx itself writes
# before any module runs (a duplicate Authorization: 400, logged at info
# with both values; the README says to log at notice in production).
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

# a key of 4 KB (large_client_header_buffers is 8k)
our $LONG = 'sk-long-' . ('Z9' x 2048);

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
                  . "sk-wrong-key-9999\nZ9Z9Z9Z9\n[error]\n[alert]\n[crit]")
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
WWW-Authenticate: Bearer
--- check
error_is($json, 'invalid_request_error', undef, '*', $name);
like($json->{error}{message}, qr/API key/i, "$name: says an API key is needed");



=== TEST 2: a wrong key: 401 invalid_api_key
--- request
GET /v1/models
--- more_headers
Authorization: Bearer sk-wrong-key-9999
--- error_code: 401
--- response_headers
WWW-Authenticate: Bearer
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_api_key', $name);
unlike($body, qr/sk-wrong/, "$name: the key is not echoed, not even in part");



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



=== TEST 10: WWW-Authenticate only on 401: not on 200, 400, 404, 405, streams, engine errors
--- request eval
my $c = sub { "POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    messages => [{ role => 'user', content => 'Hi' }], max_tokens => 2,
    @_ }) };
[$c->(), $c->(stream => JSON::PP::true), "POST /v1/chat/completions\n{",
 $c->(temperature => 5), $c->(model => 'no-such-model'), "GET /v1/models",
 "GET /v1/nowhere", "PUT /v1/models", "POST /v1/audio/speech\n{}",
 "POST /v1/completions\n"]
--- more_headers
Authorization: Bearer sk-right-key-0001
--- error_code eval
[200, 200, 400, 400, 404, 200, 404, 405, 400, 400]
--- response_headers eval
[("!WWW-Authenticate") x 10]
--- check
ok(length $body, "$name: request $i answered");



=== TEST 11: "Bearer" with no key, "Bearer" and spaces: 401, no key
--- request eval
["GET /v1/models", "GET /v1/models"]
--- more_headers eval
["Authorization: Bearer", "Authorization: Bearer     "]
--- error_code eval
[401, 401]
--- response_headers eval
[("WWW-Authenticate: Bearer") x 2]
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);
like($json->{error}{message}, qr/didn't provide an API key/, "$name: no key");
--- error_log
omni: no API key in the request



=== TEST 12: other schemes, even with a right key: 401
--- request eval
["GET /v1/models", "GET /v1/models", "GET /v1/models"]
--- more_headers eval
["Authorization: Token sk-right-key-0001",
 "Authorization: Basic c2stcmlnaHQta2V5LTAwMDE=",
 "Authorization: sk-right-key-0001"]
--- error_code eval
[401, 401, 401]
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);
unlike($body, qr/sk-right|c2stcm/, "$name: nothing of the header echoed");



=== TEST 13: the scheme is case-insensitive (RFC 9110): "bearer KEY" passes
--- request
GET /v1/models
--- more_headers
Authorization: bearer sk-right-key-0001
--- error_code: 200
--- response_headers
!WWW-Authenticate



=== TEST 14: a very long key (4 KB): 401 invalid_api_key, not echoed, not logged
--- request
GET /v1/models
--- more_headers eval
"Authorization: Bearer $::LONG"
--- error_code: 401
--- response_headers
WWW-Authenticate: Bearer
--- check
error_is($json, 'invalid_request_error', undef, 'invalid_api_key', $name);
unlike($body, qr/Z9Z9/, "$name: the key is not echoed");
ok(length($body) < 1024, "$name: a short answer");



=== TEST 15: a duplicate Authorization: nginx's 400, before the module; the key is in nginx's info line only
--- request
GET /v1/models
--- more_headers
Authorization: Bearer sk-wrong-key-9999
Authorization: Bearer sk-right-key-0001
--- error_code: 400
--- check
unlike($body, qr/sk-/, "$name: no key in the answer");
--- error_log eval
qr/\[info\] .*client sent duplicate header line: "Authorization/
--- no_error_log eval
[qr/\[(?:notice|warn|error|crit|alert|emerg)\][^\n]*sk-/,
 qr/omni[^\n]*sk-(?:right|wrong)/]



=== TEST 16: at debug level the module logs no key (only nginx's own header lines have it)
--- log_level: debug
--- request eval
my $c = "POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    messages => [{ role => 'user', content => 'Hi' }], max_tokens => 2 });
[$c, $c, $c, $c, "GET /v1/models"]
--- more_headers eval
["Authorization: Bearer sk-right-key-0001",
 "Authorization: Bearer sk-wrong-key-9999",
 "Authorization: Bearer $::LONG",
 "Authorization: Basic sk-wrong-key-9999",
 "Authorization: Bearer sk-second-key-0002"]
--- error_code eval
[200, 401, 401, 401, 200]
--- check
if ($i == 4) {
    # the module's lines are there, at debug and info: the check below
    # looks at something
    my $log = slurp("$ENV{TEST_NGINX_SERVROOT}/logs/error.log");
    like($log, qr/\[debug\] [^\n]*omni request: model/,
         "$name: the module logged at debug");
    like($log, qr/\[info\] [^\n]*omni: invalid API key/,
         "$name: and at info");
    like($log, qr/\[debug\] [^\n]*http header: "Authorization: Bearer sk-/,
         "$name: nginx's own header lines have the keys");
}
--- no_error_log eval
[qr/omni[^\n]*(?:sk-right|sk-second|sk-wrong|Z9Z9)/,
 qr/\[(?:info|notice|warn|error|crit|alert|emerg)\][^\n]*(?:sk-|Z9Z9)/]



=== TEST 17: no key and a bad chunked body: nginx's 400 while discarding it, without the WWW-Authenticate of the 401 it replaces
--- raw_request eval
"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n"
--- error_code: 400
--- response_headers
!WWW-Authenticate
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);
--- no_error_log
sk-
[alert]
[crit]

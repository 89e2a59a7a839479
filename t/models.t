# GET /v1/models and /v1/models/{id}: the list, one model, an id that is
# percent-encoded (org%2Fmodel: the SDKs encode "/"), an unknown id (404
# model_not_found), methods, and x-request-id. The engine is started with
# --model-name so that the served id has a "/" in it.
use strict;
use warnings;
use lib '.';
BEGIN { $ENV{OMNI_TEST_ENGINE_ARGS} = '--model-name test-org/stories:260K' }
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $ID = 'test-org/stories:260K';
die "the engine serves $ENV{TEST_NGINX_OMNI_MODEL}, not $ID\n"
    unless $ENV{TEST_NGINX_OMNI_MODEL} eq $ID;
our $ENGINE_MODEL = main::models(engine())->{data}[0];

sub model_ok {
    my ($m, $name) = @_;
    is_deeply([sort grep { $_ ne 'max_model_len' } keys %$m],
              [qw(created id object owned_by)], "$name: model keys");
    is($m->{id}, $ID, "$name: id");
    is($m->{object}, 'model', "$name: object model");
    is($m->{created}, $ENGINE_MODEL->{created}, "$name: created (engine's)");
    is($m->{owned_by}, $ENGINE_MODEL->{owned_by}, "$name: owned_by");
}

run_tests();

__DATA__

=== TEST 1: the list
--- request
GET /v1/models
--- error_code: 200
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
is($json->{object}, 'list', "$name: object list");
is(scalar @{ $json->{data} }, 1, "$name: one model");
model_ok($json->{data}[0], $name);
--- no_error_log
[error]



=== TEST 2: one model, its "/" percent-encoded as the SDKs send it
--- request
GET /v1/models/test-org%2Fstories%3A260K
--- error_code: 200
--- response_headers_like
Content-Type: application/json
--- check
model_ok($json, $name);



=== TEST 3: one model, "/" as it is
--- request
GET /v1/models/test-org/stories:260K
--- error_code: 200
--- check
model_ok($json, $name);



=== TEST 4: an unknown id: 404 model_not_found naming it
--- request
GET /v1/models/no%2Fsuch-model
--- error_code: 404
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
error_is($json, 'invalid_request_error', 'model', 'model_not_found', $name);
like($json->{error}{message}, qr{no/such-model}, "$name: the decoded id");



=== TEST 5: an id that decodes to invalid UTF-8 still gets valid JSON
--- request
GET /v1/models/%FF%FEbad
--- error_code: 404
--- check
error_is($json, 'invalid_request_error', 'model', 'model_not_found', $name);



=== TEST 6: HEAD of the list
--- request
HEAD /v1/models
--- error_code: 200
--- response_body



=== TEST 7: POST to a model: 405
--- request
POST /v1/models/test-org%2Fstories%3A260K
{}
--- error_code: 405
--- response_headers_like
Content-Type: application/json
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 8: a chat request naming the served id works
--- request eval
"POST /v1/chat/completions\n" . ::encode_json({ model => $::ID,
    messages => [{ role => 'user', content => 'Hi' }], max_tokens => 2 })
--- error_code: 200
--- check
is($json->{model}, $::ID, "$name: model echoed");

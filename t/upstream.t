# omni_pass through nginx's upstream machinery, and the engine failing:
# an upstream block that balances and fails over (a dead server next to
# the engine), omni_read_timeout (504), omni_keepalive_interval (": keep-
# alive" comments in an idle stream), and, with a stand-in engine that
# misbehaves on purpose (t/lib/FakeEngine.pm): an error after streaming
# began (an SSE error event, then a clean end), a stream closed before
# DONE, invalid frames (502), overloaded (503 + Retry-After), bytes that
# are not UTF-8 (still valid JSON), JSON escaping.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use t::lib::FakeEngine;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
$ENV{TEST_NGINX_FAKE_SOCKET} = "$main::TMP/fake-engine.sock";
our $fake = fake_engine_start($ENV{TEST_NGINX_FAKE_SOCKET});

sub chat {
    my ($content, %o) = @_;
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => $content }], %o });
}

sub stream { return chat($_[0], stream => JSON::PP::true, @_[1 .. $#_]) }

run_tests();

__DATA__

=== TEST 1: an upstream block: a dead server next to the engine
--- http_config
    upstream engines {
        server unix:$TEST_NGINX_OMNI_DEAD_SOCKET max_fails=1 fail_timeout=30s;
        server unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- config
    location /v1/ {
        omni_pass engines;
    }
--- request eval
[map { ::chat('Hi', max_tokens => 2) } 1 .. 4]
--- error_code eval
[200, 200, 200, 200]
--- check
is($json->{object}, 'chat.completion', "$name: request $i answered");



=== TEST 2: an upstream block of dead servers only: 503
--- http_config
    upstream engines {
        server unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
        server unix:$TEST_NGINX_OMNI_DEAD_SOCKET.2;
    }
--- config
    location /v1/ {
        omni_pass engines;
    }
--- request eval
::chat('Hi')
--- error_code: 503
--- response_headers_like
Retry-After: \d+
--- check
error_is($json, 'server_error', undef, 'engine_unavailable', $name);
is($json->{error}{message},
   'The engine is not available, please try again later.', "$name: message");



=== TEST 3: omni_read_timeout: an engine that never answers: 504
--- config
    location /v1/ {
        omni_read_timeout 300ms;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('hang')
--- error_code: 504
--- response_headers_like
Content-Type: application/json
--- check
error_is($json, 'server_error', undef, undef, $name);
is($json->{error}{message}, 'The engine did not answer in time.',
   "$name: message");



=== TEST 4: omni_read_timeout, streaming: still a JSON 504 (nothing sent yet)
--- config
    location /v1/ {
        omni_read_timeout 300ms;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('hang')
--- error_code: 504
--- check
error_is($json, 'server_error', undef, undef, $name);
is($json->{error}{message}, 'The engine did not answer in time.',
   "$name: message");



=== TEST 5: omni_keepalive_interval: comments while the engine is quiet
--- config
    location /v1/ {
        omni_keepalive_interval 100ms;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('slow')
--- error_code: 200
--- check
my @ka = $body =~ /^: keep-alive\n\n/mg;
ok(@ka >= 2, "$name: keep-alive comments (" . scalar(@ka) . ")");
(my $plain = $body) =~ s/^: keep-alive\n\n//mg;
my $s = sse_parse($plain, endpoint => 'chat', model => $::M);
ok($s->{ok}, "$name: the events around them are whole");
is($s->{text}, 'abc', "$name: the text");



=== TEST 6: an engine error after streaming began: an SSE error event, a clean end
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('error-after-text')
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
is($s->{text}, 'Hello world', "$name: the text before the error");
ok($s->{error}, "$name: an error event");
is($s->{error}{code}, 'stage_failed', "$name: the engine's code");
is($s->{error}{type}, 'server_error', "$name: type server_error");
like($s->{error}{message}, qr/stage died/, "$name: the engine's message");
like($body, qr/\A(?:data: [^\n]*\n\n)+\z/, "$name: whole events only");
unlike($body, qr/"finish_reason":"/, "$name: no finish chunk");
--- no_error_log
[alert]
[crit]



=== TEST 7: the same error without streaming: the engine's status in JSON
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('error-after-text')
--- error_code: 503
--- response_headers_like
Retry-After: \d+
--- check
error_is($json, 'server_error', undef, 'stage_failed', $name);



=== TEST 8: the engine closes mid-stream: an error event, a clean end
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('close-after-text')
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
is($s->{text}, 'Hello', "$name: the text before");
ok($s->{error}, "$name: an error event");
is($s->{error}{type}, 'server_error', "$name: type server_error");
is($s->{error}{code}, undef, "$name: code null");
is($s->{error}{message}, 'The engine closed the stream before the end.',
   "$name: message");
like($body, qr/\A(?:data: [^\n]*\n\n)+\z/, "$name: whole events only");
--- error_log
closed the stream before DONE



=== TEST 9: the engine closes before DONE, not streaming: a 5xx in JSON
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('close-after-text')
--- error_code_like: ^50[23]$
--- check
error_is($json, 'server_error', undef, '*', $name);
if (defined $json->{error}{code}) {
    # the 503 of an engine that took the request, then closed
    is($json->{error}{code}, 'engine_unavailable', "$name: code");
    is($json->{error}{message}, 'The engine closed the connection before '
       . 'its answer was complete, please try again later.', "$name: message");
} else {
    like($json->{error}{message}, qr/^The engine /, "$name: message");
}



=== TEST 10: an invalid frame: 502
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('bad-frame')
--- error_code: 502
--- check
error_is($json, 'server_error', undef, undef, $name);
is($json->{error}{message}, 'The engine sent an invalid response.',
   "$name: message");



=== TEST 11: an invalid frame mid-stream: an error event, a clean end
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('bad-frame-after-text')
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
is($s->{text}, 'Hello', "$name: the text before");
ok($s->{error}, "$name: an error event");
is($s->{error}{message}, 'The engine sent an invalid response.',
   "$name: message");
like($body, qr/\A(?:data: [^\n]*\n\n)+\z/, "$name: whole events only");



=== TEST 12: the engine is overloaded: 503 with Retry-After
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('overloaded')
--- error_code: 503
--- response_headers_like
Content-Type: application/json
Retry-After: \d+
--- check
error_is($json, 'server_error', undef, 'overloaded', $name);



=== TEST 13: text that is not UTF-8 still makes valid JSON (U+FFFD)
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::chat('bad-utf8')
--- error_code: 200
--- check
ok($json, "$name: the body is JSON");
is($json->{choices}[0]{message}{content}, "ok \x{fffd} end",
   "$name: the bad byte replaced");



=== TEST 14: quotes, backslashes and control characters are escaped
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
::stream('escapes')
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
ok($s->{ok}, "$name: one line per event");
is($s->{text}, qq{q"b\\s/n\nt\tc\x01 \x{20ac}}, "$name: the text round-trips");



=== TEST 15: omni_health: an engine not ready yet: 503 with its reason
--- config
    location = /health {
        omni_health;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request
GET /health
--- error_code: 503
--- response_headers_like
Content-Type: application/json
--- check
is_deeply($json, { status => 'not ready',
                   reason => 'warming up: loading the model' },
          "$name: the engine's reason");



=== TEST 16: omni_metrics: the engine's text, then the module's
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_FAKE_SOCKET;
    }
--- request eval
[::chat('fake'), ::chat('bad-frame'), "GET /metrics"]
--- error_code eval
[200, 502, 200]
--- check
if ($i == 2) {
    like($body, qr/^fake_engine_metric 42$/m, "$name: the engine's metrics");
    like($body, qr/^omni_nginx_requests_total\{endpoint="chat_completions",(?#
                   )code="200"\} 1$/m, "$name: the 200 counted");
    like($body, qr/^omni_nginx_requests_total\{endpoint="chat_completions",(?#
                   )code="502"\} 1$/m, "$name: the 502 counted");
    like($body, qr/^omni_nginx_upstream_errors_total 1$/m,
         "$name: the upstream error counted");
    like($body, qr/^omni_nginx_engine_up 1$/m, "$name: engine up");
}



=== TEST 17: omni_metrics with the engine down: the module's counters, engine_up 0
--- config
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
    }
--- request
GET /metrics
--- error_code: 200
--- response_headers_like
Content-Type: text/plain.*
--- check
like($body, qr/^omni_nginx_engine_up 0$/m, "$name: engine_up 0");
like($body, qr/^# TYPE omni_nginx_client_aborts_total counter$/m,
     "$name: the module's counters");



=== TEST 18: omni_health with the engine down: 503
--- config
    location = /health {
        omni_health;
        omni_pass unix:$TEST_NGINX_OMNI_DEAD_SOCKET;
    }
--- request
GET /health
--- error_code: 503
--- check
is($json->{status}, 'not ready', "$name: not ready");
ok(length $json->{reason}, "$name: a reason");



=== TEST 19: omni_health needs omni_pass in its location
--- config
    location = /health {
        omni_health;
    }
--- must_die
--- error_log
"omni_health" needs "omni_pass"
--- no_error_log



=== TEST 20: omni_pass twice in one location
--- config
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- must_die
--- error_log
"omni_pass" directive is duplicate
--- no_error_log

# omni_health and omni_metrics against the real engine: readiness as
# JSON, the Prometheus text (the engine's metrics, then the module's own:
# requests by endpoint and status, client aborts, upstream errors, auth
# failures, engine_up), methods, x-request-id. The engine-down and
# not-ready cases are in t/upstream.t (with a stand-in engine). Last, a
# hung engine: its thinker stopped (SIGSTOP: not ready after
# --stage-unready-after, 2 s here), then its frontend stopped (/health
# answers 503 within omni_health_timeout, not omni_read_timeout).
use strict;
use warnings;
use lib '.';
BEGIN { $ENV{OMNI_TEST_ENGINE_ARGS} = '--stage-unready-after 2 '
                                      . '--stage-kill-after 120' }
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

sub chat {
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => 'Hi' }], max_tokens => 2,
        @_ });
}

# SIGSTOP/SIGCONT of the engine's thinker stage or frontend; stop()
# remembers when, for the checks.
our ($Stopped, $StopAt);
sub stop { $Stopped = shift; $StopAt = Time::HiRes::time(); kill 'STOP', $Stopped }
sub cont { kill 'CONT', $Stopped if $Stopped; undef $Stopped }

# metric name (with labels) => value
sub prom { return map { /^(\S+) (\S+)$/ ? ($1, $2) : () }
                  grep { !/^#/ } split /\n/, shift }

run_tests();

__DATA__

=== TEST 1: omni_health: ready
--- request
GET /health
--- error_code: 200
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- response_body
{"status":"ready"}
--- no_error_log
[error]



=== TEST 2: omni_health: HEAD
--- request
HEAD /health
--- error_code: 200
--- response_body



=== TEST 3: omni_health: POST is refused
--- request
POST /health
{}
--- error_code: 405
--- response_headers_like
Allow: GET, HEAD
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 4: omni_metrics: the engine's metrics and the module's
--- request
GET /metrics
--- error_code: 200
--- response_headers_like
Content-Type: text/plain; version=0\.0\.4.*
X-Request-Id: [0-9a-f]{32}
--- check
my %m = prom($body);
for my $n (qw(num_requests_running num_requests_waiting kv_cache_usage_perc
              requests_cancelled_total stage_ready)) {
    like($body, qr/^# TYPE omni_engine_$n /m, "$name: engine's $n");
}
is($m{'omni_engine_stage_ready{stage="thinker"}'}, 1, "$name: the engine's stage is ready");
for my $n (qw(client_aborts_total upstream_errors_total auth_failures_total
              engine_up)) {
    like($body, qr/^# HELP omni_nginx_$n .+\n# TYPE omni_nginx_$n /m,
         "$name: module's $n with HELP and TYPE");
}
is($m{omni_nginx_engine_up}, 1, "$name: engine_up 1");
my @names = map { /^(\w+)/ } grep { !/^#/ && /\S/ } split /\n/, $body;
ok(!grep({ !/^omni_(?:engine|nginx)_/ } @names),
   "$name: every metric is omni_engine_* or omni_nginx_*");



=== TEST 5: requests counted by endpoint and status
--- request eval
[::chat(), ::chat(), ::chat(temperature => 7), "GET /v1/models",
 "GET /v1/models/nope", "GET /v1/nothing-here", "GET /metrics"]
--- error_code eval
[200, 200, 400, 200, 404, 404, 200]
--- check
if ($i == 6) {
    my %m = prom($body);
    my $k = sub { "omni_nginx_requests_total{endpoint=\"$_[0]\","
                  . "code=\"$_[1]\"}" };
    is($m{ $k->('chat_completions', 200) }, 2, "$name: chat 200 x2");
    is($m{ $k->('chat_completions', 400) }, 1, "$name: chat 400 x1");
    is($m{ $k->('models', 200) }, 1, "$name: models 200 x1");
    is($m{ $k->('model', 404) }, 1, "$name: model 404 x1");
    is($m{ $k->('unknown', 404) }, 1, "$name: unknown route 404 x1");
    is($m{omni_nginx_upstream_errors_total}, 0, "$name: no upstream error");
    like($body, qr/^omni_engine_request_success_total\{[^}]*\} [1-9]/m,
         "$name: the engine's own counters are there");
}



=== TEST 6: omni_metrics: POST is refused
--- request
POST /metrics
{}
--- error_code: 405
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 7: omni_metrics needs omni_pass in its location
--- config
    location = /metrics {
        omni_metrics;
    }
--- must_die
--- error_log
"omni_metrics" needs "omni_pass"
--- no_error_log



=== TEST 8: a stopped thinker stage: not ready, and the metrics say so
--- init
::stop(main::stage_pid(t::lib::Omni::engine()));
Time::HiRes::sleep(2.5);
--- request eval
["GET /health", "GET /metrics"]
--- error_code eval
[503, 200]
--- check
if ($i == 0) {
    is($json->{status}, 'not ready', "$name: not ready");
    like($json->{reason}, qr/^the thinker stage \(pid \d+\) has been (?#
         )silent for [\d.]+ s/, "$name: the reason says it is silent");
} else {
    my %m = prom($body);
    is($m{'omni_engine_stage_ready{stage="thinker"}'}, 0, "$name: stage_ready 0");
    ok($m{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'} >= 2,
       "$name: heartbeat age " . $m{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'});
    is($m{omni_nginx_engine_up}, 1, "$name: the engine itself answers");
    ::cont();
}



=== TEST 9: resumed: ready again
--- init
::cont();
main::wait_health(t::lib::Omni::engine(), 200, 10);
--- request
GET /health
--- error_code: 200
--- response_body
{"status":"ready"}



=== TEST 10: a stopped frontend: 503 within omni_health_timeout
--- config
    location = /health {
        omni_health;
        omni_health_timeout 1s;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_health_timeout 1s;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- init
::stop(t::lib::Omni::engine()->{pid});
--- request eval
["GET /health", "GET /metrics"]
--- error_code eval
[503, 200]
--- timeout: 5
--- check
my $took = Time::HiRes::time() - $::StopAt;
if ($i == 0) {
    is($json->{status}, 'not ready', "$name: not ready");
    like($json->{reason}, qr/did not answer in time/, "$name: why");
    ok($took < 3, sprintf("$name: answered after %.1f s", $took));
} else {
    my %m = prom($body);
    is($m{omni_nginx_engine_up}, 0, "$name: engine_up 0");
    ok(!defined $m{'omni_engine_stage_ready{stage="thinker"}'}, "$name: no engine metrics");
    ok($took < 5, sprintf("$name: both answered after %.1f s", $took));
    ::cont();
}



=== TEST 11: resumed: ready again
--- init
::cont();
main::wait_health(t::lib::Omni::engine(), 200, 10);
--- request
GET /health
--- error_code: 200
--- response_body
{"status":"ready"}



=== TEST 12: a stopped frontend, default omni_health_timeout (3s)
--- init
::stop(t::lib::Omni::engine()->{pid});
--- request
GET /health
--- error_code: 503
--- timeout: 8
--- check
my $took = Time::HiRes::time() - $::StopAt;
::cont();
like($json->{reason}, qr/did not answer in time/, "$name: why");
ok($took >= 2.5 && $took < 6, sprintf("$name: answered after %.1f s",
                                      $took));



=== TEST 13: resumed: ready again
--- init
::cont();
main::wait_health(t::lib::Omni::engine(), 200, 10);
--- request
GET /health
--- error_code: 200
--- response_body
{"status":"ready"}

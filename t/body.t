# Request bodies, however they are framed, never crash a worker, and a
# client's framing mistake is answered by nginx (400, 408, 413) or by the
# module (400 for an empty or broken body), never with a 5xx:
#
#   - chunked bodies: one chunk, many 1-byte chunks, chunk extensions,
#     upper-case hex, trailers, the empty body "0\r\n\r\n";
#   - Content-Length: 0, and no length at all, on both POST endpoints;
#   - a body in memory, in a temporary file (client_body_buffer_size 128
#     and a body of several KB, C-L and chunked), client_body_in_file_only,
#     client_body_in_single_buffer;
#   - every split of a request into two writes (chunked and C-L);
#   - Expect: 100-continue; a body cut short by the client; a length
#     larger than what comes (client_body_timeout); bad chunk framing;
#   - HTTP/1.0; HTTP/2 (h2c); pipelined requests after bodies the module
#     reads or discards.
#
# Valid bodies get a real completion from the engine. Every block also
# checks that no worker exited on a signal and nothing was logged at
# [alert] or [crit] (the preprocessor adds those to --- no_error_log).
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use t::lib::RawHttp;
use Test::Nginx::Socket 'no_plan';
use Time::HiRes qw(time sleep);

no_shuffle();
no_long_string();

# A master and its worker (Test::Nginx runs one process by default): a
# worker that dies is logged by the master as "exited on signal", and the
# master starts another, as in production.
master_on();
workers(1);

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
our $Port = $ENV{TEST_NGINX_SERVER_PORT};

# HTTP/2 blocks listen on a second port (Test::Nginx 0.33's own --- http2
# writes "http2 on;", which nginx 1.22 does not know)
BEGIN {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Listen => 1) or die "no free port: $!\n";
    $ENV{TEST_NGINX_H2_PORT} = $s->sockport;
}

our $PARSE = qr/^We could not parse the JSON body of your request\./;

# Request bodies: a short chat and a short completion (2 tokens), the
# same padded to several KB with a field the module ignores.
sub chat_body {
    return encode_json({ model => $M, max_tokens => 2,
        messages => [{ role => 'user', content => 'Hi' }], @_ });
}

sub cmpl_body {
    return encode_json({ model => $M, prompt => 'Once upon a time',
                         max_tokens => 2, @_ });
}

sub big_chat_body { chat_body(padding => 'x' x 6000, @_) }

# A raw POST with Connection: close; headers given as "Name: value".
sub post {
    my ($path, $body, @h) = @_;
    return http_request(method => 'POST', target => $path, body => $body,
                        headers => ['Connection: close', @h]);
}

sub post_cl {
    my ($path, $body, @h) = @_;
    return post($path, $body, 'Content-Length: ' . length($body), @h);
}

sub post_chunked {
    my ($path, $wire, @h) = @_;
    return post($path, $wire, 'Transfer-Encoding: chunked', @h);
}

# What a valid body must get: a completion of the engine's.
sub is_completion {
    my ($r, $name, $endpoint) = @_;
    my $json = ref $r eq 'HASH' && exists $r->{object} ? $r
             : eval { decode_json($r->{body}) };
    my $want = ($endpoint // 'chat') eq 'chat' ? 'chat.completion'
                                                : 'text_completion';
    is(ref $json eq 'HASH' ? $json->{object} : undef, $want,
       "$name: a $want") or diag(Test::More::explain($r));
    my $c = ref $json eq 'HASH' ? $json->{choices}[0] : undef;
    my $text = $want eq 'chat.completion' ? $c->{message}{content}
                                          : $c->{text};
    ok(defined $text && ($json->{usage}{completion_tokens} // 0) >= 1,
       "$name: the engine generated text");
}

sub is_parse_error {
    my ($json, $name) = @_;
    error_is($json, 'invalid_request_error', undef, undef, $name);
    like($json->{error}{message} // '', $PARSE, "$name: cannot parse");
}

# A POST over h2c (curl --http2-prior-knowledge) to the HTTP/2 port;
# body undef: no body at all (HEADERS with END_STREAM). Returns (status,
# body, HTTP version).
sub h2_post {
    my ($path, $body, @args) = @_;
    my $f = "$ENV{TEST_NGINX_SERVROOT}/html/h2-body";
    if (defined $body) {
        open(my $fh, '>', $f) or die "$f: $!";
        print $fh $body;
        close $fh;
        push @args, '--data-binary', "\@$f", '-H',
             'Content-Type: application/json';
    }
    open(my $p, '-|', 'curl', '-sS', '--http2-prior-knowledge', '-X', 'POST',
         '-o', '-', '-w', '\n%{http_code} %{http_version}', @args,
         "http://127.0.0.1:$ENV{TEST_NGINX_H2_PORT}$path") or die "curl: $!";
    local $/;
    my $out = <$p> // '';
    close $p;
    my ($b, $st, $v) = $out =~ /\A(.*)\n(\d+) (\S+)\z/s or return (0, $out, '');
    return ($st, $b, $v);
}

# One exchange on a fresh connection; returns its responses.
sub exchange {
    my ($pieces, %o) = @_;
    return http_responses(raw_exchange($Port,
                                       ref $pieces ? $pieces : [$pieces],
                                       timeout => 30, %o));
}

add_block_preprocessor(sub {
    my $b = shift;
    if (defined $b->loc_conf) {
        my $conf = $DefaultConfig;
        my $extra = $b->loc_conf;
        $conf =~ s{(location /v1/ \{\n)}{$1$extra};
        $b->set_value('config', $conf);
    }
    my $no = $b->no_error_log // '';
    $no = join("\n", grep { length } split(/\n/, $no),
               'exited on signal', '[alert]', '[crit]', '[emerg]') . "\n";
    $b->set_value('no_error_log', $no);
    $b->set_value('timeout', 30) unless defined $b->timeout;
});

run_tests();

__DATA__

=== TEST 1: chunked chat body in one chunk: a completion
--- raw_request eval
::post_chunked('/v1/chat/completions', ::chunked(::chat_body()))
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]



=== TEST 2: chunked completions body in several chunks, streamed: SSE to [DONE]
--- raw_request eval
::post_chunked('/v1/completions',
               ::chunked(::cmpl_body(stream => JSON::PP::true),
                         sizes => [7, 1, 30]))
--- error_code: 200
--- response_headers_like
Content-Type: text/event-stream(;.*)?
--- check
my $s = sse_parse($body, endpoint => 'completions', model => $::M);
ok($s->{ok}, "$name: a whole stream ending in [DONE]") or diag($body);
ok(length $s->{text}, "$name: with text");
--- no_error_log
[error]



=== TEST 3: chunk extensions and upper-case hex
--- raw_request eval
::post_chunked('/v1/chat/completions',
               ::chunked(::big_chat_body(), sizes => [300, 2000, 27],
                         upper => 1, ext => ';name=value;x="q;s"'))
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]



=== TEST 4: trailers after the last chunk
--- raw_request eval
::post_chunked('/v1/chat/completions',
               ::chunked(::chat_body(), sizes => [10],
                         trailers => "X-Trailer: one\r\nX-Other: two\r\n"))
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]



=== TEST 5: many tiny chunks (one byte each)
--- raw_request eval
::post_chunked('/v1/completions', ::chunked(::cmpl_body(), sizes => [1]))
--- error_code: 200
--- check
is_completion({ body => $body }, $name, 'completions');
--- no_error_log
[error]



=== TEST 6: an empty chunked body ("0" chunk only), chat: 400, cannot parse
--- raw_request eval
::post_chunked('/v1/chat/completions', "0\r\n\r\n")
--- error_code: 400
--- response_headers_like
Content-Type: application/json
X-Request-Id: [0-9a-f]{32}
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 7: an empty chunked body, completions: 400, cannot parse
--- raw_request eval
::post_chunked('/v1/completions', "0\r\n\r\n")
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 8: an empty chunked body with a trailer and an extension: 400
--- raw_request eval
::post_chunked('/v1/chat/completions', "0;ext=1\r\nX-Trailer: t\r\n\r\n")
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 9: Content-Length: 0, chat: 400, cannot parse
--- raw_request eval
::post_cl('/v1/chat/completions', '')
--- error_code: 400
--- response_headers_like
Content-Type: application/json
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 10: Content-Length: 0, completions: 400, cannot parse
--- raw_request eval
::post_cl('/v1/completions', '')
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 11: no Content-Length and no Transfer-Encoding: an empty body, 400
--- raw_request eval
::post('/v1/chat/completions', '')
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 12: a body in memory, sent in two writes (pre-read, then read)
--- raw_request eval
my $r = ::post_cl('/v1/chat/completions', ::big_chat_body());
[substr($r, 0, 200), substr($r, 200)]
--- raw_request_middle_delay: 0.05
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]
[warn]



=== TEST 13: a body in a temporary file (client_body_buffer_size 128)
--- loc_conf
        client_body_buffer_size 128;
--- raw_request eval
my $r = ::post_cl('/v1/chat/completions', ::big_chat_body());
[substr($r, 0, 150), substr($r, 150, 3000), substr($r, 3150)]
--- raw_request_middle_delay: 0.02
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]



=== TEST 14: a chunked body in a temporary file (client_body_buffer_size 128)
--- loc_conf
        client_body_buffer_size 128;
--- raw_request eval
::post_chunked('/v1/chat/completions',
               ::chunked(::big_chat_body(), sizes => [100, 333, 1]))
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]



=== TEST 15: client_body_in_file_only on: a Content-Length body
--- loc_conf
        client_body_in_file_only on;
--- raw_request eval
::post_cl('/v1/chat/completions', ::chat_body())
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]



=== TEST 16: client_body_in_file_only on: a chunked body, streamed
--- loc_conf
        client_body_in_file_only clean;
--- raw_request eval
::post_chunked('/v1/chat/completions',
               ::chunked(::chat_body(stream => JSON::PP::true), sizes => [5]))
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
ok($s->{ok}, "$name: a whole stream ending in [DONE]") or diag($body);
--- no_error_log
[error]



=== TEST 17: client_body_in_file_only on: Content-Length: 0 is a 400
--- loc_conf
        client_body_in_file_only on;
--- raw_request eval
::post_cl('/v1/completions', '')
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 18: client_body_in_file_only on: an empty chunked body is a 400
--- loc_conf
        client_body_in_file_only on;
--- raw_request eval
::post_chunked('/v1/chat/completions', "0\r\n\r\n")
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 19: client_body_in_single_buffer on, a body in two writes
--- loc_conf
        client_body_in_single_buffer on;
--- raw_request eval
my $r = ::post_cl('/v1/completions', ::cmpl_body());
[substr($r, 0, length($r) - 10), substr($r, -10)]
--- raw_request_middle_delay: 0.05
--- error_code: 200
--- check
is_completion({ body => $body }, $name, 'completions');
--- no_error_log
[error]



=== TEST 20: a chunked request split into two writes at every byte
--- request
GET /health
--- error_code: 200
--- check
my $req = ::post_chunked('/v1/chat/completions',
                         ::chunked(::chat_body(), sizes => [40, 3],
                                   ext => ';e=1', trailers => "X-T: 1\r\n"));
my ($ok, $n) = (0, 0);
for my $at (1 .. length($req) - 1) {
    my @r = ::exchange([substr($req, 0, $at), substr($req, $at)],
                       delay => 0.001);
    $n++;
    my $j = eval { decode_json($r[0]{body}) };
    if (@r == 1 && $r[0]{status} == 200 && $r[0]{complete}
        && ref $j eq 'HASH' && ($j->{object} // '') eq 'chat.completion') {
        $ok++;
    } else {
        diag("split at $at: " . explain(\@r));
        last;
    }
}
is($ok, $n, "$name: $n splits, each a completion");
ok($n > 100, "$name: every split tried");
--- no_error_log
[error]



=== TEST 21: a Content-Length request split into two writes at every byte
--- request
GET /health
--- error_code: 200
--- check
my $req = ::post_cl('/v1/completions', ::cmpl_body());
my ($ok, $n) = (0, 0);
for my $at (1 .. length($req) - 1) {
    my @r = ::exchange([substr($req, 0, $at), substr($req, $at)],
                       delay => 0.001);
    $n++;
    my $j = eval { decode_json($r[0]{body}) };
    if (@r == 1 && $r[0]{status} == 200 && $r[0]{complete}
        && ref $j eq 'HASH' && ($j->{object} // '') eq 'text_completion') {
        $ok++;
    } else {
        diag("split at $at: " . explain(\@r));
        last;
    }
}
is($ok, $n, "$name: $n splits, each a completion");
--- no_error_log
[error]



=== TEST 22: Expect: 100-continue: 100, then the body, then a completion
--- request
GET /health
--- error_code: 200
--- check
for my $framing ('cl', 'chunked') {
    my $body = ::chat_body();
    my $req = $framing eq 'cl'
        ? ::post_cl('/v1/chat/completions', $body, 'Expect: 100-continue')
        : ::post_chunked('/v1/chat/completions', ::chunked($body),
                         'Expect: 100-continue');
    my ($head, $rest) = split /\r\n\r\n/, $req, 2;
    my $c = raw_connect($::Port) or die;
    raw_send($c, ["$head\r\n\r\n"]);
    my $got = raw_read($c, timeout => 10,
                       until => sub { $_[0] =~ /\r\n\r\n/ });
    like($got, qr{^HTTP/1\.1 100 Continue\r\n\r\n\z},
         "$name ($framing): 100 Continue before the body");
    raw_send($c, [$rest]);
    my @r = http_responses($got . raw_read($c, timeout => 30));
    close $c;
    is(scalar @r, 2, "$name ($framing): 100, then the answer");
    is($r[1]{status}, 200, "$name ($framing): 200");
    is_completion($r[1], "$name ($framing)");
}
--- no_error_log
[error]



=== TEST 23: Expect: 100-continue with an empty body: 100 (nginx's), then 400
--- request
GET /health
--- error_code: 200
--- check
my @r = ::exchange(::post_cl('/v1/completions', '', 'Expect: 100-continue'));
is(join(' ', map { $_->{status} } @r), '100 400', "$name: 100, then 400");
is_parse_error(decode_json($r[-1]{body}), $name);
--- no_error_log
[error]



=== TEST 24: bodies cut short by the client (it closes): logged at info
--- request
GET /health
--- error_code: 200
--- check
my $big = ::big_chat_body();
my $cl = ::post_cl('/v1/chat/completions', $body);
my $ch = ::post_chunked('/v1/chat/completions',
                        ::chunked($big, sizes => [500]));
for my $cut ([$cl, length($cl) - length($big)], [$cl, length($cl) - 100],
             [$ch, length($ch) - 700], [$ch, length($ch) - 3],
             [$ch, length($ch) - 1]) {
    my ($req, $at) = @$cut;
    my @r = ::exchange([substr($req, 0, $at)], shutdown => 1);
    my @bad = grep { !$_->{status} || $_->{status} >= 500 } @r;
    ok(!@bad, "$name: cut at $at of " . length($req) . ": no 5xx")
        or diag(Test::More::explain(\@r));
}
my @r = ::exchange(::post_cl('/v1/completions', ::cmpl_body()));
is($r[0]{status}, 200, "$name: the next request is served");
--- error_log
client prematurely closed connection
--- no_error_log
[error]



=== TEST 25: a Content-Length larger than what is sent: client_body_timeout
--- loc_conf
        client_body_timeout 300ms;
--- request
GET /health
--- error_code: 200
--- check
for my $req (::post_cl('/v1/completions', ::cmpl_body()),
             ::post_chunked('/v1/completions', ::chunked(::cmpl_body()))) {
    (my $short = $req) =~ s/(Content-Length: )(\d+)/$1 . ($2 + 50)/e;
    $short = substr($req, 0, length($req) - 5) if $short eq $req;
    my $c = raw_connect($::Port) or die;
    raw_send($c, [$short]);
    my $got = raw_read($c, timeout => 20, eof => \my $eof);
    my @r = http_responses($got);
    ok($eof, "$name: nginx closed the connection");
    ok(!grep({ ($_->{status} // 0) >= 500 } @r),
       "$name: no 5xx") or diag($got);
    ok(!grep({ ($_->{status} // 0) == 200 } @r), "$name: no completion");
}
# nginx ends a body that times out with 408 and closes without a word
# (ngx_http_terminate_request): the access log has it
my $log = slurp("$ENV{TEST_NGINX_SERVROOT}/logs/access.log");
my $n = () = $log =~ m{"POST /v1/completions HTTP/1\.1" 408 }g;
is($n, 2, "$name: both logged as 408") or diag($log);
--- no_error_log
[error]



=== TEST 26: bad chunk framing: 400 from nginx, as an OpenAI error
--- request
GET /health
--- error_code: 200
--- check
my $b = ::chat_body();
my $n = length $b;
# what nginx refuses (400), and the two liberties its chunked parser takes
# (bare LF line ends; trailer lines it skips without looking): those
# bodies are read whole, so they get a completion
my @bad = (
    [400, 'not hex',            "zz\r\n$b\r\n0\r\n\r\n"],
    [400, 'size too small',     sprintf("%x\r\n%s\r\n0\r\n\r\n", $n - 5, $b)],
    [400, 'no CRLF after data', sprintf("%x\r\n%sXY0\r\n\r\n", $n, $b)],
    [400, 'size overflows',     "ffffffffffffffffffff\r\n$b\r\n0\r\n\r\n"],
    [400, 'negative size',      "-1\r\n$b\r\n0\r\n\r\n"],
    [400, 'space in size',      "1 0\r\n$b\r\n0\r\n\r\n"],
    [200, 'bare LF lines',      sprintf("%x\n%s\n0\n\n", $n, $b)],
    [200, 'garbage trailer',    sprintf("%x\r\n%s\r\n0\r\n\x01\x02\r\n\r\n",
                                        $n, $b)],
);
for my $case (@bad) {
    my ($want, $what, $wire) = @$case;
    my @r = ::exchange(::post_chunked('/v1/chat/completions', $wire));
    is($r[0]{status}, $want, "$name ($what): $want")
        or diag(Test::More::explain(\@r));
    my $j = eval { decode_json($r[0]{body}) };
    if ($want == 400) {
        error_is($j, 'invalid_request_error', undef, undef, "$name ($what)");
    } else {
        is_completion($r[0], "$name ($what)");
    }
}
my @r = ::exchange(::post_chunked('/v1/chat/completions', "zz\r\n\r\n"));
is($r[0]{status}, 400, "$name: not hex is a 400");
--- error_log
client sent invalid chunked body



=== TEST 27: Content-Length and Transfer-Encoding together: 400 (nginx's own page: refused with the header, before any location)
--- raw_request eval
::post_chunked('/v1/chat/completions', ::chunked(::chat_body()),
               'Content-Length: 10')
--- error_code: 400
--- error_log
client sent "Content-Length" and "Transfer-Encoding" headers at the same time



=== TEST 28: Transfer-Encoding with HTTP/1.0: 400 (nginx's own page, before any location)
--- raw_request eval
my $b = ::chunked(::chat_body());
"POST /v1/chat/completions HTTP/1.0\r\nHost: localhost\r\n"
. "Transfer-Encoding: chunked\r\n\r\n$b"
--- error_code: 400
--- error_log
client sent HTTP/1.0 request with "Transfer-Encoding" header



=== TEST 29: HTTP/1.0 with a Content-Length body: a completion
--- raw_request eval
my $b = ::chat_body();
"POST /v1/chat/completions HTTP/1.0\r\nHost: localhost\r\n"
. "Content-Length: " . length($b) . "\r\n\r\n$b"
--- error_code: 200
--- check
is_completion({ body => $body }, $name);
--- no_error_log
[error]



=== TEST 30: HTTP/1.0 without a length: the body is empty, 400
--- raw_request eval
"POST /v1/completions HTTP/1.0\r\nHost: localhost\r\n\r\n"
--- error_code: 400
--- check
is_parse_error($json, $name);
--- no_error_log
[error]



=== TEST 31: a chunked body over client_max_body_size: 413
--- loc_conf
        client_max_body_size 1k;
--- raw_request eval
::post_chunked('/v1/chat/completions',
               ::chunked(::big_chat_body(), sizes => [100]))
--- error_code: 413
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 32: client_max_body_size 0: a 2 MB body is read; one over 16 MB is refused (413) before it is copied into memory
--- loc_conf
        client_max_body_size 0;
--- request
GET /health
--- error_code: 200
--- check
my @r = ::exchange(::post_cl('/v1/chat/completions',
                             ::chat_body(padding => 'x' x (2 << 20))));
is($r[0]{status}, 200, "$name: 2 MB: 200");
is_completion($r[0], "$name: 2 MB");
for my $framing ('cl', 'chunked') {
    my $big = ::chat_body(padding => 'x' x ((16 << 20) + 1));
    my $req = $framing eq 'cl'
        ? ::post_cl('/v1/chat/completions', $big)
        : ::post_chunked('/v1/chat/completions',
                         ::chunked($big, sizes => [1 << 20]));
    @r = ::exchange($req);
    is($r[0]{status}, 413, "$name: over 16 MB ($framing): 413");
    my $j = eval { decode_json($r[0]{body}) };
    error_is($j, 'invalid_request_error', undef, undef, "$name ($framing)");
    like($j->{error}{message}, qr/too large/, "$name ($framing): says so");
}
# A Content-Length over 16 MB is refused from the header: the answer comes
# though not one byte of the gigabyte it announces is sent.
my $raw = t::lib::RawHttp::raw_exchange($::Port, [t::lib::RawHttp::http_request(
    method => 'POST', target => '/v1/chat/completions',
    headers => ['Content-Type: application/json',
                'Content-Length: ' . (1 << 30)])],
    timeout => 10, until => sub { $_[0] =~ /\r\n\r\n.*\}/s });
@r = t::lib::RawHttp::http_responses($raw);
is($r[0]{status}, 413, "$name: 1 GB announced, nothing sent: 413 at once");
--- error_log
client sent too large omni request body
--- no_error_log
[error]



=== TEST 33: bodies the module discards (404, 405, GET with a body): the next request on the connection is read right
--- request
GET /health
--- error_code: 200
--- check
my $next = ::post_cl('/v1/completions', ::cmpl_body());
my $ch = ::chunked(::chat_body(), sizes => [9]);
my $cl = ::chat_body();
my @first = (
    [404, "POST /v1/nowhere HTTP/1.1\r\nHost: x\r\n"
          . "Transfer-Encoding: chunked\r\n\r\n$ch"],
    [405, "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
          . "Transfer-Encoding: chunked\r\n\r\n$ch"],
    [405, "PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
          . "Content-Length: " . length($cl) . "\r\n\r\n$cl"],
    [200, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"
          . "Transfer-Encoding: chunked\r\n\r\n$ch"],
    [200, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"
          . "Content-Length: " . length($cl) . "\r\n\r\n$cl"],
    [400, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n"
          . "Transfer-Encoding: chunked\r\n\r\n$ch"],
);
for my $f (@first) {
    my ($want, $req) = @$f;
    for my $split (0, 1) {
        my @pieces = $split ? ($req, $next) : ($req . $next);
        my @r = ::exchange(\@pieces, delay => 0.05);
        is($r[0]{status}, $want, "$name: first answered $want");
        is($r[1]{status}, 200, "$name: then the pipelined completion")
            or diag(Test::More::explain(\@r));
        is_completion($r[1], "$name: pipelined", 'completions') if $r[1];
    }
}
--- no_error_log
[error]



=== TEST 34: a wrong method and a bad chunked body: nginx's 400 while discarding it, without the Allow of the 405 it replaces
--- raw_request eval
"PUT /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Transfer-Encoding: chunked\r\n\r\n5\r\nabcdeXX0\r\n\r\n"
--- error_code: 400
--- response_headers
!Allow
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);



=== TEST 35: pipelined requests with chunked and Content-Length bodies
--- request
GET /health
--- error_code: 200
--- check
my $keep = sub { my $r = shift; $r =~ s/Connection: close\r\n//; $r };
my $req = $keep->(::post_chunked('/v1/chat/completions',
                                 ::chunked(::chat_body(), sizes => [11])))
        . $keep->(::post_cl('/v1/completions', ::cmpl_body()))
        . $keep->(::post_chunked('/v1/completions', "0\r\n\r\n"))
        . ::post_chunked('/v1/completions', ::chunked(::cmpl_body()));
my @r = ::exchange($req);
is(join(' ', map { $_->{status} } @r), '200 200 400 200',
   "$name: four answers in order") or diag(Test::More::explain(\@r));
is_completion($r[0], "$name: 1");
is_completion($r[1], "$name: 2", 'completions');
is_completion($r[3], "$name: 4", 'completions');
--- no_error_log
[error]



=== TEST 36: HTTP/2 (h2c): a body in DATA frames, a body in a temporary file, an empty body, no body
--- http_config
    server {
        listen 127.0.0.1:$TEST_NGINX_H2_PORT http2;
        location /v1/ {
            omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
        }
        location /small/v1/ {
            client_body_buffer_size 128;
            omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
        }
    }
--- request
GET /health
--- error_code: 200
--- check
my ($st, $b, $proto) = ::h2_post('/v1/chat/completions', ::chat_body());
is($proto, '2', "$name: spoken over HTTP/2");
is($st, 200, "$name: 200");
is_completion({ body => $b }, "$name: in memory");
($st, $b) = ::h2_post('/small/v1/chat/completions', ::big_chat_body());
is($st, 200, "$name: temporary file: 200");
is_completion({ body => $b }, "$name: in a temporary file");
($st, $b) = ::h2_post('/v1/completions', '');
is($st, 400, "$name: an empty body: 400");
is_parse_error(eval { decode_json($b) }, "$name: an empty body");
($st, $b) = ::h2_post('/v1/chat/completions', undef);
is($st, 400, "$name: no body at all: 400");
is_parse_error(eval { decode_json($b) }, "$name: no body");
($st, $b) = ::h2_post('/v1/chat/completions', ::chat_body(), '-H',
                      'Content-Length: 5');
ok($st == 400, "$name: more data than Content-Length: 400 ($st)");
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]

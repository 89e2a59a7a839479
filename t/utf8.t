# Text that is not UTF-8, through nginx. Every class of ill-formed byte
# sequence (overlong forms of each length, encoded surrogates D800-DFFF,
# code points above U+10FFFF, bytes F5-FF, stray continuation bytes, a
# character cut short) and every unpaired surrogate escape ("\ud800"), in
# every string a request carries -- messages[].content, content parts,
# role, prompt, stop, model, user, prompt_cache_key, unknown fields, keys
# -- is a 400 with one shape: type invalid_request_error, param naming the
# value (null for a top-level key), code null, and the message
# "Invalid '<param>': the text is not valid UTF-8 (<what> at offset N)."
# The characters at each boundary that are valid pass, and reach the
# engine as the same text (same prompt token count as the engine's own
# answer for it).
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

# [bytes as sent inside a JSON string, how the message shows them]
our @BAD = (
    ["\xc0\xaf",         'bytes C0 AF'],          # overlong '/', 2 bytes
    ["\xc1\xbf",         'bytes C1 BF'],          # overlong U+007F
    ["\xe0\x80\xaf",     'bytes E0 80 AF'],       # overlong '/', 3 bytes
    ["\xe0\x9f\xbf",     'bytes E0 9F BF'],       # overlong U+07FF
    ["\xf0\x80\x80\xaf", 'bytes F0 80 80 AF'],    # overlong '/', 4 bytes
    ["\xf0\x8f\xbf\xbf", 'bytes F0 8F BF BF'],    # overlong U+FFFF
    ["\xed\xa0\x80",     'bytes ED A0 80'],       # U+D800
    ["\xed\xbf\xbf",     'bytes ED BF BF'],       # U+DFFF
    ["\xf4\x90\x80\x80", 'bytes F4 90 80 80'],    # U+110000
    ["\xf5\x80\x80\x80", 'bytes F5 80 80 80'],
    ["\xfe",             'byte FE'],
    ["\xff",             'byte FF'],
    ["\x80",             'byte 80'],              # stray continuation
    ["\xc3\xa9\xbf",     'byte BF'],              # one after a character
    ["\xc3",             'byte C3'],              # cut after 1 of 2
    ["\xe2\x82",         'bytes E2 82'],          # cut after 2 of 3
    ["\xf0\x9f\x98",     'bytes F0 9F 98'],       # cut after 3 of 4
    ['\ud800',           'unpaired surrogate \ud800'],
    ['\uDFFF',           'unpaired surrogate \uDFFF'],
    ['\ud83d\u0041',     'unpaired surrogate \ud83d'],
    ['\ude00\ud83d',     'unpaired surrogate \ude00'],
);

# [endpoint, body with %s where the text goes (after "a"), param]
our @WHERE = (
    ['chat', qq({"model":"$M","messages":[{"role":"user","content":"a%s"}]}),
     'messages[0].content'],
    ['chat', qq({"model":"$M","messages":[{"role":"system","content":"x"},)
             . qq({"role":"user","content":[{"type":"text","text":"x"},)
             . qq({"type":"text","text":"a%s"}]}]}),
     'messages[1].content[1].text'],
    ['chat', qq({"model":"$M","messages":[{"role":"a%s","content":"x"}]}),
     'messages[0].role'],
    ['chat', qq({"model":"a%s","messages":[{"role":"user","content":"x"}]}),
     'model'],
    ['chat', qq({"model":"$M","messages":[{"role":"user","content":"x"}],)
             . qq("stop":"a%s"}), 'stop'],
    ['chat', qq({"model":"$M","messages":[{"role":"user","content":"x"}],)
             . qq("stop":["\\n","a%s"]}), 'stop[1]'],
    ['chat', qq({"model":"$M","messages":[{"role":"user","content":"x"}],)
             . qq("user":"a%s"}), 'user'],
    ['chat', qq({"model":"$M","messages":[{"role":"user","content":"x"}],)
             . qq("metadata":{"k":"a%s"}}), 'metadata.k'],
    ['completions', qq({"model":"$M","prompt":"a%s"}), 'prompt'],
    ['completions', qq({"model":"$M","prompt":["a%s"]}), 'prompt[0]'],
    ['completions', qq({"model":"$M","prompt":"x","prompt_cache_key":"a%s"}),
     'prompt_cache_key'],
    ['completions', qq({"model":"$M","prompt":"x","a%s":1}), undef],
);

our @CASES;
for my $w (@WHERE) {
    for my $b (@BAD) {
        push @CASES, { path => "/v1/$w->[0]"
                               . ($w->[0] eq 'chat' ? '/completions' : ''),
                       body => sprintf($w->[1], $b->[0]),
                       param => $w->[2], what => $b->[1] };
    }
}

# The valid characters at each boundary: U+007F, U+0080, U+07FF, U+0800,
# U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF; raw and as JSON escapes.
our $EDGES = "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"
           . "\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
our $EDGES_ESC = '\u007f\u0080\u07ff\u0800\ud7ff\ue000\uffff'
               . '\ud800\udc00\udbff\udfff';
our $EDGE_TOKENS = do {
    my $text = "a $EDGES z";
    utf8::decode($text) or die "edges are not UTF-8";
    request(engine(), { prompt => $text, max_tokens => 1 })
        ->{done}{prompt_tokens};
};

run_tests();

__DATA__

=== TEST 1: every class of bad text in every field: 400, one error shape
--- request eval
[map { "POST $_->{path}\n$_->{body}" } @::CASES]
--- error_code eval
[(400) x @::CASES]
--- response_headers_like eval
[("Content-Type: application/json") x @::CASES]
--- check
my $c = $::CASES[$i];
my $p = $c->{param};
my $n = "$name: $c->{what} in " . ($p // 'a key');
error_is($json, 'invalid_request_error', $p, undef, $n);
my $what = qr/the text is not valid UTF-8 \(\Q$c->{what}\E at offset \d+\)\./;
like($json->{error}{message},
     defined $p ? qr/^Invalid '\Q$p\E': $what\z/
                : qr/^Invalid request body: $what\z/, "$n: message");
--- no_error_log
[error]



=== TEST 2: the valid characters at the edges pass, raw and escaped, and reach the engine as the same text
--- request eval
["POST /v1/completions\n{\"model\":\"$::M\",\"prompt\":\"a $::EDGES z\",\"max_tokens\":1,\"stop\":\"$::EDGES\"}",
 "POST /v1/completions\n{\"model\":\"$::M\",\"prompt\":\"a $::EDGES_ESC z\",\"max_tokens\":1}",
 "POST /v1/chat/completions\n{\"model\":\"$::M\",\"messages\":[{\"role\":\"user\",\"content\":\"$::EDGES\"}],\"max_tokens\":1,\"user\":\"$::EDGES_ESC\"}"]
--- error_code eval
[200, 200, 200]
--- check
ok(ref $json eq 'HASH' && $json->{usage}, "$name #$i: a completion")
    or diag $body;
is($json->{usage}{prompt_tokens}, $::EDGE_TOKENS,
   "$name #$i: prompt tokens as the engine counts them") if $i < 2;
--- no_error_log
[error]



=== TEST 3: a model name made of edge characters is only unknown (404)
--- request eval
"POST /v1/chat/completions\n{\"model\":\"$::EDGES\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"
--- error_code: 404
--- check
error_is($json, 'invalid_request_error', 'model', 'model_not_found', $name);
--- no_error_log
[error]



=== TEST 4: logged at info as the client's fault, naming the value
--- request eval
"POST /v1/chat/completions\n{\"model\":\"$::M\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}"
--- error_code: 400
--- error_log eval
qr/\[info\] .*client sent invalid omni request: Invalid 'messages\[0\]\.content': the text is not valid UTF-8 \(bytes ED A0 80 at offset \d+\)/
--- no_error_log
[error]

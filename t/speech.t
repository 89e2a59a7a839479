# POST /v1/audio/speech through nginx against a stand-in engine
# (t/lib/FakeEngine.pm), which answers with AUDIO frames as the speech
# stages will: the raw audio stream (Content-Type per format, chunked,
# each AUDIO sent as it arrives), stream_format "sse" byte for byte
# (speech.audio.delta events that decode alone, speech.audio.done with
# usage, [DONE]), the normalized request the engine gets (voice, format,
# speed, mode: omni_speech_mode and "speech_mode"), every 400 of the
# module, the engine's param names mapped back (audio.voice -> voice),
# engine errors before and after the audio began (a truncated raw body,
# an SSE error event), and a client that goes away mid-audio.
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }
use t::lib::Omni;
use t::lib::FakeEngine;
use t::lib::RawHttp;
use MIME::Base64 qw(decode_base64);
use Time::HiRes qw(time);
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = 'tts-1';
$ENV{TEST_NGINX_OMNI_SOCKET} = "$main::TMP/fake-speech.sock";
our $fake = fake_engine_start($ENV{TEST_NGINX_OMNI_SOCKET});

sub speech {
    my (%o) = @_;
    return "POST /v1/audio/speech\n" . encode_json({ model => $M,
        input => 'Hello there.', voice => 'alloy', %o });
}

# A raw request on its own connection, for what Test::Nginx cannot see:
# a body cut short, the time the first bytes arrive.
sub speech_raw {
    my ($body) = @_;
    return t::lib::RawHttp::http_request(method => 'POST',
        target => '/v1/audio/speech',
        headers => ['Content-Type: application/json',
                    'Content-Length: ' . length $body], body => $body);
}

our %types = (mp3 => 'audio/mpeg', opus => 'audio/opus', aac => 'audio/aac',
              flac => 'audio/flac', wav => 'audio/wav', pcm => 'audio/pcm');
our @formats = qw(mp3 opus aac flac wav pcm);

run_tests();

__DATA__

=== TEST 1: default mp3: 200 audio/mpeg, chunked, the engine's bytes as they are
--- request eval
::speech()
--- error_code: 200
--- response_headers
Content-Type: audio/mpeg
Transfer-Encoding: chunked
!Content-Length
--- check
ok($body eq fake_audio('mp3'), "$name: the engine's audio, byte for byte");
--- no_error_log
[error]



=== TEST 2: every response_format: its Content-Type and its bytes
--- request eval
[map { ::speech(response_format => $_) } @::formats]
--- error_code eval
[(200) x 6]
--- response_headers eval
[map { "Content-Type: $::types{$_}" } @::formats]
--- check
my $f = $::formats[$i];
ok($body eq fake_audio($f), "$name: $f bytes");



=== TEST 3: the engine's request: model, input, audio {voice, format, speed, mode}
--- request eval
[::speech(input => 'echo', voice => 'coral', response_format => 'wav',
          speed => 1.5, instructions => 'Speak softly.'),
 ::speech(input => 'echo', speech_mode => 'quality', stream => JSON::PP::true),
 ::speech(input => 'echo', voice => 'nobody')]
--- error_code eval
[200, 200, 200]
--- check
my @want = (
    { model => $::M, input => 'echo', audio => { voice => 'coral',
      format => 'wav', speed => 1.5, mode => 'latency' } },
    { model => $::M, input => 'echo', audio => { voice => 'alloy',
      format => 'mp3', mode => 'quality' } },
    { model => $::M, input => 'echo', audio => { voice => 'nobody',
      format => 'mp3', mode => 'latency' } },
);
is_deeply(decode_json($body), $want[$i], "$name: request $i");



=== TEST 4: omni_speech_mode quality: the default mode; "speech_mode" overrides it
--- config
    location /v1/ {
        omni_speech_mode quality;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request eval
[::speech(input => 'echo'), ::speech(input => 'echo', speech_mode => 'latency')]
--- error_code eval
[200, 200]
--- check
is(decode_json($body)->{audio}{mode}, $i ? 'latency' : 'quality',
   "$name: mode");



=== TEST 5: omni_speech_mode takes latency or quality only
--- config
    location /v1/ {
        omni_speech_mode fast;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request
GET /v1/models
--- must_die
--- error_log
invalid value "fast"



=== TEST 6: stream_format sse: delta events that decode alone, done with usage, [DONE]
--- request eval
::speech(stream_format => 'sse')
--- error_code: 200
--- response_headers
Content-Type: text/event-stream; charset=utf-8
--- check
my $delta = qr/data: \{"type":"speech\.audio\.delta","audio":"([A-Za-z0-9+\/=]+)"\}\n\n/;
like($body, qr/\A(?:$delta)+data: \{"type":"speech\.audio\.done","usage":(?#
    )\{"input_tokens":3,"output_tokens":5,"total_tokens":8\}\}\n\n(?#
    )data: \[DONE\]\n\n\z/, "$name: the exact bytes");
my @b64 = $body =~ /$delta/g;
is(scalar @b64, 4, "$name: one delta per AUDIO frame");
is(length decode_base64($b64[0]), 7, "$name: the first is the first frame");
is(join('', map { decode_base64($_) } @b64), fake_audio('mp3'),
   "$name: each decoded alone, joined: the audio");



=== TEST 7: the module's 400s: param, code, message
--- request eval
[::speech(model => undef),
 "POST /v1/audio/speech\n" . ::encode_json({ model => $::M, voice => 'alloy' }),
 ::speech(input => ''),
 ::speech(input => 42),
 ::speech(input => "\x{e9}" x 4097),
 "POST /v1/audio/speech\n" . ::encode_json({ model => $::M, input => 'x' }),
 ::speech(voice => { id => 'voice_1234' }),
 ::speech(voice => 7),
 ::speech(voice => ''),
 ::speech(response_format => 'ogg'),
 ::speech(speed => 0.1),
 ::speech(speed => 5),
 ::speech(speed => 'fast'),
 ::speech(instructions => 'x' x 4097),
 ::speech(stream_format => 'chunks'),
 ::speech(speech_mode => 'fast'),
 ::speech(stream => 'yes'),
 "POST /v1/audio/speech\n[1]"]
--- error_code eval
[(400) x 18]
--- check
my @want = (
    ['model', 'missing_required_parameter', qr/model/],
    ['input', 'missing_required_parameter', qr/^Missing required parameter: 'input'\.$/],
    ['input', 'empty_string', qr/empty string/],
    ['input', 'invalid_type', qr/expected a string, but got an integer/],
    ['input', 'string_above_max_length', qr/maximum length 4096, but got a string with length 4097/],
    ['voice', 'missing_required_parameter', qr/'voice'/],
    ['voice', 'invalid_value', qr/unknown custom voice 'voice_1234'/],
    ['voice', 'invalid_type', qr/'voice'/],
    ['voice', 'empty_string', qr/empty string/],
    ['response_format', 'invalid_value', qr/'ogg'.*'mp3', 'opus', 'aac', 'flac', 'wav' and 'pcm'/],
    ['speed', 'invalid_value', qr/0\.1 is out of range/],
    ['speed', 'invalid_value', qr/5 is out of range/],
    ['speed', 'invalid_type', qr/expected a number/],
    ['instructions', 'string_above_max_length', qr/maximum length 4096/],
    ['stream_format', 'invalid_value', qr/'chunks'.*'audio' and 'sse'/],
    ['speech_mode', 'invalid_value', qr/'fast'.*'latency' and 'quality'/],
    ['stream', 'invalid_type', qr/a boolean/],
    [undef, 'invalid_type', qr/expected a JSON object/],
);
my ($param, $code, $msg) = @{ $want[$i] };
error_is($json, 'invalid_request_error', $param, $code, "$name $i");
like($json->{error}{message}, $msg, "$name $i: message");



=== TEST 8: 4096 characters of two bytes each are within the limit
--- request eval
::speech(input => "\x{e9}" x 4096)
--- error_code: 200



=== TEST 9: the engine's errors name its fields: mapped back (audio.voice -> voice)
--- request eval
::speech(input => 'voice-error', voice => 'nobody')
--- error_code: 400
--- response_headers
Content-Type: application/json
--- check
error_is($json, 'invalid_request_error', 'voice', 'invalid_value', $name);
is($json->{error}{message}, "Unknown voice 'nobody'.", "$name: message");



=== TEST 10: an engine error after the audio began: raw: the body is cut, no last chunk
--- request eval
::speech()
--- error_code: 200
--- check
for my $what (qw(audio-error audio-close)) {
    my $raw = t::lib::RawHttp::raw_exchange(Test::Nginx::Util::server_port(),
        [::speech_raw(::encode_json({ model => $::M, input => $what,
                                      voice => 'alloy' }))], timeout => 5);
    my ($r) = t::lib::RawHttp::http_responses($raw);
    is($r->{status}, 200, "$name: $what: 200 (the header went out)");
    is($r->{headers}{'content-type'}, 'audio/mpeg', "$name: $what: type");
    is($r->{body}, 'abc', "$name: $what: the audio sent before");
    ok(!$r->{complete}, "$name: $what: no terminating chunk");
}
--- error_log
omni audio cut after its start



=== TEST 11: an engine error after the audio began: sse: an error event
--- request eval
::speech(input => 'audio-error', stream_format => 'sse')
--- error_code: 200
--- check
my @ev = sse_events($body);
is(scalar @ev, 2, "$name: two events");
is(decode_base64($ev[0]{audio}), 'abc', "$name: the audio before");
is($ev[1]{error}{code}, 'stage_failed', "$name: then the engine's error");
like($body, qr/\A(?:data: [^\n]*\n\n)+\z/, "$name: whole events only");



=== TEST 12: each AUDIO goes out as it arrives: the first bytes before the engine's DONE
--- request eval
::speech()
--- error_code: 200
--- check
my $c = t::lib::RawHttp::raw_connect(Test::Nginx::Util::server_port());
my $t0 = time;
t::lib::RawHttp::raw_send($c, [::speech_raw(::encode_json({ model => $::M,
    input => 'slow-audio', voice => 'alloy' }))]);
my $first = t::lib::RawHttp::raw_read($c, timeout => 5,
                                      until => sub { $_[0] =~ /first/ });
my $t1 = time - $t0;
my $rest = t::lib::RawHttp::raw_read($c, timeout => 5,
                                     until => sub { $_[0] =~ /\r\n0\r\n\r\n/ });
my $t2 = time - $t0;
close $c;
like($first, qr/first/, "$name: the first AUDIO came");
ok($t1 < 0.8, "$name: ... before the engine's second one ($t1 s)");
ok($t2 >= 0.9, "$name: the rest a second later ($t2 s)");
my ($r) = t::lib::RawHttp::http_responses($first . $rest);
is($r->{body}, 'firstsecond', "$name: the whole audio");
ok($r->{complete}, "$name: complete");



=== TEST 13: a client that leaves mid-audio: the engine's connection is closed, nginx goes on
--- request eval
::speech()
--- error_code: 200
--- check
my $c = t::lib::RawHttp::raw_connect(Test::Nginx::Util::server_port());
t::lib::RawHttp::raw_send($c, [::speech_raw(::encode_json({ model => $::M,
    input => 'slow-audio', voice => 'alloy' }))]);
my $first = t::lib::RawHttp::raw_read($c, timeout => 5,
                                      until => sub { $_[0] =~ /first/ });
like($first, qr/first/, "$name: audio began");
close $c;
Time::HiRes::sleep(1.3);
my $r = post_json('/v1/audio/speech', { model => $::M, input => 'x',
                                          voice => 'alloy' });
is($r->{status}, 200, "$name: the next request is answered");
require HTTP::Tiny;
my $m = HTTP::Tiny->new->get('http://127.0.0.1:'
    . Test::Nginx::Util::server_port() . '/metrics')->{content};
like($m, qr/^omni_nginx_client_aborts_total 1$/m,
     "$name: counted as a client abort");
--- no_error_log
[alert]
[crit]

# Chat completions with audio in: user content parts {"type":
# "input_audio", "input_audio": {"data": BASE64, "format": F}} through
# nginx against a stand-in engine (t/lib/FakeEngine.pm) that reads and
# records the AUDIO_IN frames: the engine's JSON (each part as {"type":
# "input_audio", "index": k}, "audio_in" with format, bytes and param,
# "max_audio_seconds"), the decoded bytes of every part in order in
# frames of at most 64 KiB, usage.input_audio_seconds (only with audio
# in), streaming and not, with speech out too; every 400 of the parts
# (bad base64, a missing or unknown format, not a user message, too many
# parts) and the engine's 400 before the audio is all sent.
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }
use t::lib::Omni;
use t::lib::FakeEngine;
use MIME::Base64 qw(encode_base64 decode_base64);
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = 'gpt-4o-audio-preview';
$ENV{TEST_NGINX_OMNI_SOCKET} = "$main::TMP/fake-chat-in.sock";
our $SOCK = $ENV{TEST_NGINX_OMNI_SOCKET};
our $fake = fake_engine_start($SOCK);

# a WAV header, then bytes of every value
our $WAV = 'RIFF' . pack('V', 36 + 256 * 8) . 'WAVEfmt '
           . pack('V v v V V v v', 16, 1, 1, 16000, 32000, 2, 16)
           . 'data' . pack('V', 256 * 8) . join('', map { chr } 0 .. 255) x 8;
our $MP3 = "ID3\x04\x00\x00" . join('', map { chr(($_ * 7) % 256) } 1 .. 999);
our $BIG = join('', map { chr(($_ * 13 + ($_ >> 8)) % 256) } 1 .. 500_000);

sub b64 { encode_base64($_[0], '') }

sub part { { type => 'input_audio',
             input_audio => { data => b64($_[0]), format => $_[1] } } }

sub chat {
    my ($messages, %o) = @_;
    return "POST /v1/chat/completions\n"
           . encode_json({ model => $M, messages => $messages, %o });
}

sub one {
    my ($text, $audio, $format, %o) = @_;
    return chat([{ role => 'user', content => [
        { type => 'text', text => $text }, part($audio, $format // 'wav') ] }],
        %o);
}

sub stream { (stream => JSON::PP::true,
              stream_options => { include_usage => JSON::PP::true }) }

sub audio_is {
    my ($want, $name) = @_;
    my $rec = fake_engine_record($::SOCK);
    ok($rec, "$name: the engine got the request") or return;
    ok($rec->{audio} eq $want, "$name: the decoded bytes, " . length($want)
       . ", exactly") or diag('got ' . length($rec->{audio}));
    is_deeply($rec->{bad}, [], "$name: every AUDIO_IN frame well-formed");
    ok(!grep({ $_ < 1 || $_ > 65536 } @{ $rec->{frames} }),
       "$name: frames of 1..65536 bytes (" . scalar(@{ $rec->{frames} }) . ")");
    return $rec;
}

add_block_preprocessor(sub { fake_engine_forget($::SOCK) });

run_tests();

__DATA__

=== TEST 1: one input_audio part: the engine's JSON, the bytes, usage with input_audio_seconds
--- request eval
::one('What is said here?', $::WAV)
--- error_code: 200
--- check
my $rec = ::audio_is($::WAV, $name);
my $r = $rec->{req};
is_deeply($r->{messages}, [{ role => 'user', content => [
    { type => 'text', text => 'What is said here?' },
    { type => 'input_audio', index => 0 }] }], "$name: the part as an index");
is_deeply($r->{audio_in}, [{ format => 'wav', bytes => length($::WAV),
    param => 'messages[0].content[1].input_audio' }], "$name: audio_in");
is($r->{max_audio_seconds}, 600, "$name: max_audio_seconds");
is($json->{choices}[0]{message}{content}, 'heard ' . length($::WAV) . ' bytes',
   "$name: the answer");
is_deeply($json->{usage}, { prompt_tokens => 7, completion_tokens => 3,
    total_tokens => 10,
    prompt_tokens_details => { cached_tokens => 0, audio_tokens => 0 },
    completion_tokens_details => { reasoning_tokens => 0, audio_tokens => 0,
        accepted_prediction_tokens => 0, rejected_prediction_tokens => 0 },
    input_audio_seconds => 11 }, "$name: usage");
like($body, qr/"input_audio_seconds":11\.0\}\}\n\z/, "$name: written as 11.0, the last key");
--- no_error_log
[error]



=== TEST 2: without audio in, no input_audio_seconds
--- request eval
::chat([{ role => 'user', content => 'Hi' }])
--- error_code: 200
--- check
ok(!exists $json->{usage}{input_audio_seconds}, "$name: no key");
ok(!fake_engine_record($::SOCK), "$name: no audio recorded");



=== TEST 3: several parts in several messages: indexes in order, the bytes one after the other; ogg is the engine's opus
--- request eval
::chat([{ role => 'system', content => 'Be brief.' },
        { role => 'user', content => [::part($::MP3, 'mp3'), { type => 'text', text => 'and' },
                                      ::part($::WAV, 'flac')] },
        { role => 'assistant', content => 'Yes?' },
        { role => 'user', content => [::part('OggS' . 'o' x 100, 'ogg'), ::part('OggS' . 'p' x 50, 'opus')] }])
--- error_code: 200
--- check
my $rec = ::audio_is($::MP3 . $::WAV . 'OggS' . 'o' x 100 . 'OggS' . 'p' x 50, $name);
my $r = $rec->{req};
is_deeply($r->{messages}[1]{content}, [{ type => 'input_audio', index => 0 },
    { type => 'text', text => 'and' }, { type => 'input_audio', index => 1 }], "$name: message 1");
is_deeply($r->{messages}[3]{content}, [{ type => 'input_audio', index => 2 },
    { type => 'input_audio', index => 3 }], "$name: message 3");
is_deeply([map { [$_->{format}, $_->{bytes}, $_->{param}] } @{ $r->{audio_in} }],
          [['mp3', length $::MP3, 'messages[1].content[0].input_audio'],
           ['flac', length $::WAV, 'messages[1].content[2].input_audio'],
           ['opus', 104, 'messages[3].content[0].input_audio'],
           ['opus', 54, 'messages[3].content[1].input_audio']], "$name: audio_in");
is($r->{messages}[0]{content}, 'Be brief.', "$name: other messages as they were");



=== TEST 4: 500 KB of audio (base64 670 KB): every byte, in frames of 64 KiB
--- config
    location /v1/ {
        client_max_body_size 4m;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request eval
::one('long', $::BIG)
--- error_code: 200
--- check
my $rec = ::audio_is($::BIG, $name);
ok(@{ $rec->{frames} } >= 8, "$name: at least 8 frames");
--- no_error_log
[error]



=== TEST 5: streaming: the chunks as for any chat, the usage chunk with input_audio_seconds
--- request eval
::one('hi', $::WAV, 'wav', ::stream())
--- error_code: 200
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M, include_usage => 1);
ok($s->{ok}, "$name: a whole stream") or diag($body);
is($s->{text}, 'heard ' . length($::WAV) . ' bytes', "$name: the text");
is($s->{usage}{input_audio_seconds}, 11, "$name: usage.input_audio_seconds");
::audio_is($::WAV, $name);



=== TEST 6: speech in and speech out in one request: not streaming (wav) and streaming (pcm16)
--- request eval
[::one('speak', $::WAV, 'wav', modalities => ['text', 'audio'], audio => { voice => 'alloy', format => 'wav' }),
 ::one('speak', $::WAV, 'wav', modalities => ['text', 'audio'], audio => { voice => 'alloy', format => 'pcm16' }, ::stream())]
--- error_code eval
[200, 200]
--- check
my $rec = ::audio_is($::WAV, $name);
ok($rec->{req}{audio}, "$name: request $i: speech out asked too");
if ($i == 0) {
    my $m = $json->{choices}[0]{message};
    is($m->{audio}{transcript}, 'heard ' . length($::WAV) . ' bytes', "$name: the transcript");
    ok(length decode_base64($m->{audio}{data}), "$name: audio out");
    is($json->{usage}{input_audio_seconds}, 11, "$name: input_audio_seconds");
} else {
    my ($u) = grep { ref $_ && $_->{usage} } @events;
    is($u->{usage}{input_audio_seconds}, 11, "$name: streamed usage");
    is($events[-1], '[DONE]', "$name: [DONE]");
}



=== TEST 7: omni_max_audio_seconds
--- config
    location /v1/ {
        omni_max_audio_seconds 90;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request eval
::one('x', $::WAV)
--- error_code: 200
--- check
is(fake_engine_record($::SOCK)->{req}{max_audio_seconds}, 90, "$name: 90");



=== TEST 8: base64 that is not: a bad character, '=' inside, too much padding, a data: URL, a line break, 4n+1 characters, empty
--- request eval
[map { ::chat([{ role => 'user', content => [{ type => 'input_audio', input_audio => { data => $_, format => 'wav' } }] }]) }
     'QUJD!', 'QUJD=QUJD', 'QQ===', 'data:audio/wav;base64,QUJD', "QUJD\nQUJD", 'QUJDR', '']
--- error_code eval
[(400) x 7]
--- check
error_is($json, 'invalid_request_error', 'messages[0].content[0].input_audio.data',
         ($i == 6 ? 'empty_string' : 'invalid_value'), $name);
ok(!fake_engine_record($::SOCK), "$name: request $i: nothing sent");
--- no_error_log
[error]



=== TEST 9: padded and unpadded base64 both decode
--- request eval
[map { ::chat([{ role => 'user', content => [{ type => 'input_audio', input_audio => { data => $_, format => 'mp3' } }] }]) }
     'QUJDRA==', 'QUJDRA', 'QUJDREU=', 'QUJDREU']
--- error_code eval
[200, 200, 200, 200]
--- check
is(fake_engine_record($::SOCK)->{audio}, $i < 2 ? 'ABCD' : 'ABCDE', "$name: request $i");



=== TEST 10: format missing, unknown (aac, WAV), not a string; data missing, not a string; input_audio missing or not an object: 400 naming the field
--- request eval
my @p = ({ data => 'QUJD' }, { data => 'QUJD', format => 'aac' }, { data => 'QUJD', format => 'WAV' },
         { data => 'QUJD', format => 5 }, { format => 'wav' }, { data => [1], format => 'wav' });
[(map { ::chat([{ role => 'user', content => [{ type => 'input_audio', input_audio => $_ }] }]) } @p),
 ::chat([{ role => 'user', content => [{ type => 'input_audio' }] }]),
 ::chat([{ role => 'user', content => [{ type => 'input_audio', input_audio => 'QUJD' }] }])]
--- error_code eval
[(400) x 8]
--- check
my $p = 'messages[0].content[0].input_audio';
my @param = ("$p.format", "$p.format", "$p.format", "$p.format", "$p.data", "$p.data", $p, $p);
my @code = qw(missing_required_parameter invalid_value invalid_value invalid_type
              missing_required_parameter invalid_type missing_required_parameter invalid_type);
error_is($json, 'invalid_request_error', $param[$i], $code[$i], $name);



=== TEST 11: audio in a system or assistant message: 400 naming the part
--- request eval
[::chat([{ role => 'system', content => [::part('x', 'wav')] }, { role => 'user', content => 'hi' }]),
 ::chat([{ role => 'user', content => 'hi' }, { role => 'assistant', content => [::part('x', 'wav')] }])]
--- error_code eval
[400, 400]
--- check
error_is($json, 'invalid_request_error', ($i == 0 ? 'messages[0].content[0]' : 'messages[1].content[0]'), 'invalid_value', $name);



=== TEST 12: at most 16 parts (the engine's limit), refused by the module
--- request eval
[::chat([{ role => 'user', content => [map { ::part("a$_", 'wav') } 1 .. 16] }]),
 ::chat([{ role => 'user', content => [map { ::part("a$_", 'wav') } 1 .. 17] }])]
--- error_code eval
[200, 400]
--- check
if ($i == 0) {
    is(scalar @{ fake_engine_record($::SOCK)->{req}{audio_in} }, 16, "$name: 16 inputs");
} else {
    error_is($json, 'invalid_request_error', 'messages[0].content[16].input_audio', 'invalid_value', $name);
}



=== TEST 13: the engine's 400 before it read the audio (500 KB being sent): passed on with the part's param
--- config
    location /v1/ {
        client_max_body_size 4m;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request eval
::one('err-early', $::BIG)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'messages[0].content[1].input_audio', 'invalid_value', $name);
--- no_error_log
[error]
[alert]



=== TEST 14: image and file parts are still refused
--- request eval
[::chat([{ role => 'user', content => [{ type => 'image_url', image_url => { url => 'data:image/png;base64,AA' } }] }]),
 ::chat([{ role => 'user', content => [{ type => 'file', file => { file_id => 'file-1' } }] }])]
--- error_code eval
[400, 400]
--- check
error_is($json, 'invalid_request_error', 'messages[0].content[0]', 'unsupported_value', $name);
like($json->{error}{message}, qr/only 'text' and 'input_audio' parts are/, "$name: says what is");

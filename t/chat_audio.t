# Chat completions with audio out ("modalities": ["text", "audio"])
# through nginx against a stand-in engine (t/lib/FakeEngine.pm), which
# answers with TEXT (the transcript) and AUDIO frames as the speech stages
# will: the non-streaming message.audio (id, data, expires_at,
# transcript; content null; a WAV with its real sizes; usage with
# audio_tokens and text_tokens), the stream as openai-api.md 2.6 has it
# (transcript and data pieces, every data piece a multiple of 6 bytes but
# the last, the id once, expires_at with finish_reason), the engine's
# request (audio {voice, format, mode, id}; assistant turns that refer to
# an earlier answer's id), the 400s, the bound on a buffered answer and
# an engine error mid-stream.
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }
use t::lib::Omni;
use t::lib::FakeEngine;
use MIME::Base64 qw(decode_base64);
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

our $M = 'gpt-audio';
$ENV{TEST_NGINX_OMNI_SOCKET} = "$main::TMP/fake-chat-audio.sock";
our $fake = fake_engine_start($ENV{TEST_NGINX_OMNI_SOCKET});

sub chat {
    my ($content, %o) = @_;
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => $content }],
        modalities => ['text', 'audio'],
        audio => { voice => 'alloy', format => 'pcm16' }, %o });
}

sub stream {
    return chat($_[0], stream => JSON::PP::true,
                stream_options => { include_usage => JSON::PP::true },
                @_[1 .. $#_]);
}

our $AID = qr/audio_[0-9a-f]{32}/;

run_tests();

__DATA__

=== TEST 1: not streaming, pcm16: content null, message.audio, usage with audio tokens
--- request eval
::chat('Hi')
--- error_code: 200
--- response_headers
Content-Type: application/json
--- check
my $m = $json->{choices}[0]{message};
is_deeply([sort keys %$m], [qw(annotations audio content refusal role)],
          "$name: message keys");
is($m->{content}, undef, "$name: content null");
is_deeply([sort keys %{ $m->{audio} }], [qw(data expires_at id transcript)],
          "$name: audio keys");
like($m->{audio}{id}, qr/^$::AID$/, "$name: id audio_ and 32 hex digits");
ok(decode_base64($m->{audio}{data}) eq fake_audio('pcm'),
   "$name: data: the engine's audio");
is($m->{audio}{expires_at}, $json->{created} + 3600,
   "$name: expires_at = created + 3600");
is($m->{audio}{transcript}, 'Hello', "$name: transcript: the TEXT joined");
is($json->{choices}[0]{finish_reason}, 'stop', "$name: finish_reason");
is_deeply($json->{usage}, { prompt_tokens => 3, completion_tokens => 7,
    total_tokens => 10,
    prompt_tokens_details => { cached_tokens => 0, audio_tokens => 0 },
    completion_tokens_details => { reasoning_tokens => 0, audio_tokens => 5,
        accepted_prediction_tokens => 0, rejected_prediction_tokens => 0,
        text_tokens => 2 } }, "$name: usage");



=== TEST 2: not streaming, wav: the header's sizes are the real ones
--- request eval
::chat('Hi', audio => { voice => 'alloy', format => 'wav' })
--- error_code: 200
--- check
my $d = decode_base64($json->{choices}[0]{message}{audio}{data});
my $want = fake_audio('wav');
is(length $d, length $want, "$name: length");
is(unpack('V', substr($d, 4, 4)), length($want) - 8, "$name: RIFF size");
is(unpack('V', substr($d, 40, 4)), length($want) - 44, "$name: data size");
substr($want, 4, 4) = substr($d, 4, 4);
substr($want, 40, 4) = substr($d, 40, 4);
ok($d eq $want, "$name: the rest as the engine sent it");



=== TEST 3: not streaming, mp3 and the other formats: their bytes, base64
--- request eval
[map { ::chat('Hi', audio => { voice => 'ash', format => $_ }) }
     qw(mp3 flac opus aac)]
--- error_code eval
[(200) x 4]
--- check
my $f = (qw(mp3 flac opus aac))[$i];
ok(decode_base64($json->{choices}[0]{message}{audio}{data}) eq fake_audio($f),
   "$name: $f");



=== TEST 4: the engine's request: audio {voice, format (pcm16 is pcm), mode, id}; earlier answers by id
--- request eval
["POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    modalities => ['text', 'audio'],
    audio => { voice => 'verse', format => 'pcm16' }, speech_mode => 'quality',
    messages => [{ role => 'user', content => 'Hi' },
                 { role => 'assistant', audio => { id => 'audio_abc' } },
                 { role => 'user', content => 'echo' }] })]
--- error_code: 200
--- check
my $a = $json->{choices}[0]{message}{audio};
my $req = decode_json($a->{transcript});
is_deeply($req->{audio}, { voice => 'verse', format => 'pcm', mode => 'quality',
                           id => $a->{id} }, "$name: audio, with the id sent back");
is_deeply($req->{messages}[1], { role => 'assistant',
                                 audio => { id => 'audio_abc' } },
          "$name: the assistant turn by id");
ok(!exists $req->{modalities}, "$name: no modalities for the engine");



=== TEST 5: streaming pcm16: role, transcript and data pieces, id once, expires_at with finish, usage, [DONE]
--- request eval
::stream('Hi')
--- error_code: 200
--- response_headers
Content-Type: text/event-stream; charset=utf-8
--- check
my $head = qr/data: \{"id":"chatcmpl-[A-Za-z0-9]+","object":"chat\.completion\.chunk","created":\d+,"model":"\Q$::M\E",/;
my $tail = qr/,"logprobs":null,"finish_reason":null\}\],"usage":null\}\n\n/;
my ($id, @pieces, @texts, $exp);
pos($body) = 0;
ok($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"role":"assistant",(?#
    )"content":null,"refusal":null\}$tail/gc, "$name: role chunk, content null");
ok($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"content":null,(?#
    )"audio":\{"id":"($::AID)","transcript":"Hel"\}\}$tail/gc,
   "$name: the first transcript piece carries the id");
$id = $1;
while ($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"audio":(?#
    )\{"data":"([A-Za-z0-9+\/=]+)"\}\}$tail/gc) {
    push @pieces, $1;
}
ok($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"audio":(?#
    )\{"transcript":"lo"\}\}$tail/gc, "$name: the second transcript piece");
while ($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"audio":(?#
    )\{"data":"([A-Za-z0-9+\/=]+)"\}\}$tail/gc) {
    push @pieces, $1;
}
ok($body =~ /\G$head"choices":\[\{"index":0,"delta":\{"audio":(?#
    )\{"expires_at":(\d+)\}\},"logprobs":null,"finish_reason":"stop"\}\],(?#
    )"usage":null\}\n\n/gc, "$name: expires_at with finish_reason");
ok($body =~ /\G${head}"choices":\[\],"usage":(\{[^\n]*\})\}\n\n/gc,
   "$name: the usage chunk");
my $usage = decode_json($1);
ok($body =~ /\Gdata: \[DONE\]\n\n\z/gc, "$name: [DONE], the end");
my @sizes = map { length decode_base64($_) } @pieces;
ok(@sizes >= 2, "$name: data pieces (@sizes)");
is(scalar(grep { $_ % 6 } @sizes[0 .. $#sizes - 1]), 0,
   "$name: every piece but the last a multiple of 6 bytes");
unlike(join('', @pieces[0 .. $#pieces - 1]), qr/=/, "$name: no padding inside");
ok(decode_base64(join '', @pieces) eq fake_audio('pcm'),
   "$name: the base64 strings joined: the engine's audio");
is($usage->{completion_tokens_details}{audio_tokens}, 5, "$name: audio tokens");
is($usage->{completion_tokens}, 7, "$name: completion = text + audio");



=== TEST 6: streaming without include_usage: no usage chunk, no "usage":null
--- request eval
::chat('Hi', stream => JSON::PP::true)
--- error_code: 200
--- check
unlike($body, qr/"usage"/, "$name: no usage anywhere");
like($body, qr/"finish_reason":"stop"\}\]\}\n\ndata: \[DONE\]\n\n\z/,
     "$name: finish, then [DONE]");



=== TEST 7: the 400s of chat audio
--- request eval
["POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    messages => [{ role => 'user', content => 'Hi' }],
    modalities => ['text', 'audio'] }),
 "POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    messages => [{ role => 'user', content => 'Hi' }],
    audio => { voice => 'alloy', format => 'pcm16' } }),
 ::chat('Hi', stream => JSON::PP::true,
        audio => { voice => 'alloy', format => 'wav' }),
 ::chat('Hi', audio => { voice => 'alloy', format => 'ogg' }),
 ::chat('Hi', audio => { format => 'wav' }),
 ::chat('Hi', audio => { voice => { id => 'voice_9' }, format => 'wav' }),
 ::chat('Hi', audio => { voice => 'alloy' }),
 ::chat('Hi', audio => 'alloy'),
 ::chat('Hi', speech_mode => 'best')]
--- error_code eval
[(400) x 9]
--- check
my @want = (
    ['audio', 'missing_required_parameter', qr/'audio'/],
    ['audio', 'invalid_value', qr/only allowed when 'modalities' includes 'audio'/],
    ['audio.format', 'unsupported_value', qr/^Unsupported value: 'audio\.format' does not support 'wav' when stream=true\. Supported values are: 'pcm16'\.$/],
    ['audio.format', 'invalid_value', qr/'ogg'/],
    ['audio.voice', 'missing_required_parameter', qr/'audio\.voice'/],
    ['audio.voice', 'invalid_value', qr/unknown custom voice 'voice_9'/],
    ['audio.format', 'missing_required_parameter', qr/'audio\.format'/],
    ['audio', 'invalid_type', qr/expected an object/],
    ['speech_mode', 'invalid_value', qr/'best'/],
);
my ($param, $code, $msg) = @{ $want[$i] };
error_is($json, 'invalid_request_error', $param, $code, "$name $i");
like($json->{error}{message}, $msg, "$name $i: message");



=== TEST 8: a non-streaming answer over 16 MiB of audio: 500, the engine's connection closed
--- request eval
::chat('big-audio')
--- error_code: 500
--- check
error_is($json, 'server_error', undef, 'audio_too_long', $name);
like($json->{error}{message}, qr/"stream": true/, "$name: says what to do");
--- error_log
omni chat audio over 16777216 bytes



=== TEST 9: an engine error after the audio began: an error event, whole events
--- request eval
::stream('audio-error')
--- error_code: 200
--- check
my @ev = sse_events($body);
is($ev[-1]{error}{code}, 'stage_failed', "$name: the engine's error last");
like($body, qr/\A(?:data: [^\n]*\n\n)+\z/, "$name: whole events only");
unlike($body, qr/\[DONE\]/, "$name: no [DONE]");



=== TEST 10: audio before any transcript: the role chunk still comes first, the id with the audio
--- request eval
::chat('audio-first', stream => JSON::PP::true)
--- error_code: 200
--- check
my @ev = sse_events($body);
is_deeply($ev[0]{choices}[0]{delta}, { role => 'assistant', content => undef,
                                       refusal => undef }, "$name: role first");
my $a = $ev[1]{choices}[0]{delta}{audio};
like($a->{id}, qr/^$::AID$/, "$name: the id with the first audio");
is(MIME::Base64::decode_base64($a->{data}), 'abcdef', "$name: the audio");
is_deeply($ev[2]{choices}[0]{delta}, { audio => { transcript => 'x' } },
          "$name: then the transcript, without the id");
is($ev[-1], '[DONE]', "$name: [DONE]");

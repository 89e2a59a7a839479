# /v1/audio/speech and chat audio through nginx against the real engine:
# the same paths t/speech.t and t/chat_audio.t walk with a stand-in, here
# with Flite's audio. Until the engine serves speech (its frontend answers
# 501 speech_unavailable while the talker and voicebox stages are not
# wired), the whole suite is skipped, saying so; it runs by itself once
# the engine speaks.
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use MIME::Base64 qw(decode_base64);
use Test::Nginx::Socket;

BEGIN {
    my $r = request(engine(), { input => 'Hi.',
                                audio => { voice => 'alloy', format => 'pcm' } });
    if (!$r || ($r->{error} && $r->{error}{status} == 501)) {
        plan(skip_all => 'the engine does not serve speech yet (501 '
             . 'speech_unavailable): the talker and voicebox stages are '
             . 'not wired');
    }
}

plan('no_plan');
no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};

sub speech {
    return "POST /v1/audio/speech\n" . encode_json({ model => $M,
        input => 'Hello there. This is a test.', voice => 'alloy', @_ });
}

sub chat {
    return "POST /v1/chat/completions\n" . encode_json({ model => $M,
        messages => [{ role => 'user', content => 'Tell me a story' }],
        max_tokens => 16, temperature => 0,
        modalities => ['text', 'audio'],
        audio => { voice => 'alloy', format => 'pcm16' }, @_ });
}

run_tests();

__DATA__

=== TEST 1: speech, every format: its type and its first bytes
--- request eval
[map { ::speech(response_format => $_) } qw(mp3 opus aac flac wav pcm)]
--- error_code eval
[(200) x 6]
--- response_headers eval
[map { "Content-Type: audio/$_" } qw(mpeg opus aac flac wav pcm)]
--- check
my @magic = (qr/\A(?:ID3|\xff[\xe0-\xff])/, qr/\AOggS/, qr/\A\xff[\xf0-\xff]/,
             qr/\AfLaC/, qr/\ARIFF\xff\xff\xff\xffWAVE/, qr/\A/);
like($body, $magic[$i], "$name: format $i starts right");
ok(length($body) > 1000, "$name: some audio (" . length($body) . " bytes)");
ok(length($body) % 2 == 0, "$name: whole samples") if $i == 5;



=== TEST 2: speech, sse: deltas that decode alone, done with usage
--- request eval
::speech(stream_format => 'sse', response_format => 'pcm')
--- error_code: 200
--- check
my @ev = sse_events($body);
is($ev[-1], '[DONE]', "$name: [DONE] last");
is($ev[-2]{type}, 'speech.audio.done', "$name: done before it");
ok($ev[-2]{usage}{output_tokens} > 0, "$name: speech units counted");
my $audio = join '', map { decode_base64($_->{audio}) } @ev[0 .. $#ev - 2];
ok(length($audio) > 1000, "$name: audio");



=== TEST 3: speech, an unknown voice: 400 param voice
--- request eval
::speech(voice => 'nobody')
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'voice', '*', $name);



=== TEST 4: chat audio, not streaming: transcript and audio
--- request eval
::chat()
--- error_code: 200
--- check
my $a = $json->{choices}[0]{message}{audio};
ok(length $a->{transcript}, "$name: a transcript");
ok(length(decode_base64($a->{data})) > 1000, "$name: audio");
ok($json->{usage}{completion_tokens_details}{audio_tokens} > 0,
   "$name: audio tokens");



=== TEST 5: chat audio, streaming pcm16: pieces of 6 bytes
--- request eval
::chat(stream => JSON::PP::true)
--- error_code: 200
--- check
my @ev = grep { ref } sse_events($body);
my @data = map { $_->{choices}[0]{delta}{audio}{data} // () }
           grep { @{ $_->{choices} } } @ev;
ok(@data > 0, "$name: audio pieces");
is(scalar(grep { length(decode_base64($_)) % 6 } @data[0 .. $#data - 1]), 0,
   "$name: multiples of 6 but the last");

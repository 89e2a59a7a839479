# POST /v1/audio/transcriptions through nginx against a stand-in engine
# (t/lib/FakeEngine.pm), which reads the AUDIO_IN frames, records what it
# received and answers with TRANSCRIPT events as the listener stage will:
#
#   - every response_format's exact bytes and headers (json, text, srt,
#     vtt, verbose_json with each timestamp granularity), the stream's SSE
#     framing (flushed per event), usage from the engine's input_audio_ms;
#   - the multipart framings of openai-api.md 10.1 (python-, node- and
#     .NET-style: bare, quoted and long boundaries, quoted and bare names,
#     file first and last, filenames with paths and filename*, text parts
#     with their own Content-Type, arrays with and without []), binary
#     safe (the file holds CRs, "\r\n--" and the boundary's prefixes);
#   - what the engine got: the REQUEST JSON, and the AUDIO_IN payloads
#     equal to the file part, in frames of at most 64 KiB, from memory,
#     from nginx's temporary file (sendfile on and off), chunked bodies;
#   - every 400 (fields, malformed multipart), the 413s as JSON, the
#     engine's ERROR before the audio is all sent and after the 200, an
#     engine that closes or sends garbage, the client leaving mid-upload
#     and mid-stream (the error log free of alerts and crashes).
use strict;
use warnings;
use lib '.';
BEGIN { $t::lib::Omni::NoEngine = 1 }
use t::lib::Omni;
use t::lib::FakeEngine;
use t::lib::RawHttp;
use Compress::Zlib ();
use Test::Nginx::Socket 'no_plan';

no_shuffle();
no_long_string();

$ENV{TEST_NGINX_OMNI_SOCKET} = "$main::TMP/fake-stt.sock";
our $SOCK = $ENV{TEST_NGINX_OMNI_SOCKET};
our $fake = fake_engine_start($SOCK);

# python-style: a bare boundary of 32 hex digits
our $B = '9a3f0c8e7b6d4e1fa2c5b8d0e7f1a2b3';

# The "audio": random bytes holding what a careless scanner trips on: CR
# and LF alone, "\r\n--", prefixes of the boundary, a CR at the end.
sub audio {
    my ($n, $seed) = @_;
    srand($seed // 7);
    my $a = 'RIFF' . pack('V', $n) . 'WAVEfmt ';
    my @tricks = ("\r", "\n", "\r\n", "\r\n-", "\r\n--", "\r\n--9a3f",
                  "\r\n--" . substr($B, 0, 31), "--$B", "\r\r\n--\r\n");
    while (length $a < $n) {
        $a .= join('', map { chr(int rand 256) } 1 .. 50 + int rand 400);
        $a .= $tricks[int rand @tricks];
    }
    $a = substr($a, 0, $n - 1) . "\r";

    # the delimiter itself may not be in the data (RFC 2046 5.1.1)
    $a =~ s/\r\n--(?=\Q$B\E)/\r\n-_/g;
    return $a;
}

our $AUDIO = audio(3000);
our $BIG = audio(300_000, 11);          # 5 frames of 64 KiB at most

# A multipart body: parts [name, value, options...]; options: bare (name
# unquoted), filename, filename_ext (filename*=...), type (its
# Content-Type), headers (more lines).
sub mp {
    my ($b, @parts) = @_;
    my $out = '';
    for my $p (@parts) {
        my ($name, $value, %o) = @$p;
        $out .= "--$b\r\n";
        my $cd = 'Content-Disposition: form-data; '
                 . ($o{bare} ? "name=$name" : qq{name="$name"});
        $cd .= qq{; filename="$o{filename}"} if defined $o{filename};
        $cd .= "; filename*=$o{filename_ext}" if defined $o{filename_ext};
        $out .= "$cd\r\n";
        $out .= "Content-Type: $o{type}\r\n" if $o{type};
        $out .= "$_\r\n" for @{ $o{headers} // [] };
        $out .= "\r\n$value\r\n";
    }
    return $out . "--$b--\r\n";
}

# A raw POST of a body (Connection: close), Content-Type given or the
# python-style boundary's.
sub post {
    my ($body, %o) = @_;
    my @h = ('Connection: close');
    push @h, 'Content-Type: ' . ($o{type} // "multipart/form-data; boundary=$B")
        unless $o{no_type};
    push @h, $o{chunked} ? 'Transfer-Encoding: chunked'
                         : 'Content-Length: ' . length $body;
    push @h, @{ $o{headers} // [] };
    return http_request(method => 'POST',
                        target => $o{path} // '/v1/audio/transcriptions',
                        headers => \@h,
                        body => $o{chunked} ? chunked($body, %{ $o{chunked} })
                                            : $body);
}

# The python SDK's request: text fields first, the file last with the
# Content-Type guessed from its name. fields: name => value or [values].
sub stt {
    my (%f) = @_;
    my $file = delete $f{file} // $AUDIO;
    my $filename = delete $f{filename} // 'speech.wav';
    my %o = (%{ delete $f{post} // {} });
    $f{model} //= 'whisper-1';
    delete $f{model} if $f{model} eq '';
    my @parts;
    for my $k (sort keys %f) {
        push @parts, map { [$k, $_] } ref $f{$k} ? @{ $f{$k} } : $f{$k};
    }
    push @parts, ['file', $file, filename => $filename,
                  type => 'audio/wav'];
    return post(mp($B, @parts), %o);
}

our $TEXT = join ' ', map { $_->{text} } @FAKE_SEGMENTS;

# Seconds as the module writes them: at most n decimals, the trailing
# zeros but one dropped.
sub num {
    my ($v, $n) = @_;
    my $s = sprintf("%.${n}f", $v);
    $s =~ s/0+\z//;
    $s .= '0' if $s =~ /\.\z/;
    return $s eq '-0.0' ? '0.0' : $s;
}

sub jstr { JSON::PP->new->utf8->allow_nonref->encode($_[0]) }

# Whisper's compression ratio: the bytes over zlib.compress()'s
sub ratio {
    my $t = shift;
    return num(length($t) / length(Compress::Zlib::compress($t)), 6);
}

sub seg_json {
    my ($i, $s) = @_;
    my $text = " $s->{text}";
    return sprintf('{"id":%d,"seek":%d,"start":%s,"end":%s,"text":%s,'
                   . '"tokens":[],"temperature":0.0,"avg_logprob":%s,'
                   . '"compression_ratio":%s,"no_speech_prob":0.0}',
                   $i, int(($s->{start} * 1000 + 0.5) / 10),
                   num($s->{start}, 3), num($s->{end}, 3), jstr($text),
                   num($s->{avg_logprob}, 6), ratio($text));
}

sub words_json {
    return join ',', map {
        sprintf('{"word":%s,"start":%s,"end":%s}', jstr($_->{word}),
                num($_->{start}, 3), num($_->{end}, 3))
    } map { @{ $_->{words} } } @FAKE_SEGMENTS;
}

# verbose_json's exact body with the segments and/or the words
sub verbose {
    my (%o) = @_;
    my $v = '{"task":"transcribe","language":"english","duration":11.0,'
            . '"text":' . jstr($TEXT);
    $v .= ',"segments":[' . join(',', map { seg_json($_, $FAKE_SEGMENTS[$_]) }
                                      0 .. $#FAKE_SEGMENTS) . ']'
        if $o{segments};
    $v .= ',"words":[' . words_json() . ']' if $o{words};
    return $v . ',"usage":{"type":"duration","seconds":11}}' . "\n";
}

# What the engine received: the JSON, and the audio in whole frames of
# 1..64 KiB that add up to the file part.
sub audio_is {
    my ($want, $name, %o) = @_;
    my $rec = fake_engine_record($::SOCK);
    ok($rec, "$name: the engine got the request") or return;
    ok($rec->{audio} eq $want, "$name: the engine got the file part's "
       . length($want) . " bytes, exactly")
        or diag('got ' . length($rec->{audio}) . ' bytes');
    is_deeply($rec->{bad}, [], "$name: every AUDIO_IN frame well-formed");
    my @f = @{ $rec->{frames} };
    ok(@f && !grep({ $_ < 1 || $_ > 65536 } @f),
       "$name: " . scalar(@f) . " frames of 1..65536 bytes");
    my $sum = 0;
    $sum += $_ for @f;
    is($sum, length $want, "$name: the frames add up");
    ok(@f >= $o{min_frames}, "$name: at least $o{min_frames} frames")
        if $o{min_frames};
    return $rec;
}

sub engine_json {
    my (%o) = @_;
    return { transcribe => { words => $o{words} ? JSON::PP::true
                                                : JSON::PP::false,
                             %{ $o{transcribe} // {} } },
             audio_in => [{ format => $o{format} // 'wav',
                            bytes => $o{bytes} // length($AUDIO),
                            param => 'file' }],
             max_audio_seconds => $o{max} // 600,
             %{ $o{more} // {} } };
}

sub sse {
    my @d = @_;
    my $first = 1;
    my $out = '';
    for (@d) {
        $out .= 'data: {"type":"transcript.text.delta","delta":'
                . jstr(($first ? '' : ' ') . $_) . "}\n\n";
        $first = 0;
    }
    return $out . 'data: {"type":"transcript.text.done","text":'
           . jstr(join ' ', @d) . "}\n\ndata: [DONE]\n\n";
}

sub clean_log {
    return "[alert]\n[crit]\n[emerg]\nexited on signal\n";
}

add_block_preprocessor(sub {
    my $block = shift;
    fake_engine_forget($::SOCK);
});

run_tests();

__DATA__

=== TEST 1: json (the default), python-style body: exact bytes, headers, the engine's request and audio
--- raw_request eval
::stt()
--- error_code: 200
--- response_headers
Content-Type: application/json
Content-Length: 120
--- response_body eval
qq{{"text":"$::TEXT","usage":{"type":"duration","seconds":11}}\n}
--- check
my $rec = ::audio_is($::AUDIO, $name);
is_deeply($rec->{req}, ::engine_json(), "$name: the engine's JSON (no "
          . "model: whisper-1 is the served model's name)");
is($rec->{json}, '{"transcribe":{"words":false},"audio_in":[{"format":"wav",'
   . '"bytes":3000,"param":"file"}],"max_audio_seconds":600}',
   "$name: the REQUEST payload, byte for byte");
--- no_error_log
[error]
[warn]



=== TEST 2: text: the joined text and a newline, text/plain
--- raw_request eval
::stt(response_format => 'text')
--- error_code: 200
--- response_headers
Content-Type: text/plain; charset=utf-8
--- response_body eval
"$::TEXT\n"
--- no_error_log
[error]



=== TEST 3: srt: numbered cues, HH:MM:SS,mmm, an extra newline at the end
--- raw_request eval
::stt(response_format => 'srt')
--- error_code: 200
--- response_headers
Content-Type: text/plain; charset=utf-8
--- response_body eval
"1\n00:00:00,320 --> 00:00:02,710\nand so my fellow americans\n\n"
. "2\n00:00:03,500 --> 00:01:05,905\nask not what your country can do "
. "for you\n\n\n"
--- no_error_log
[error]



=== TEST 4: vtt: the header, cues with '.', no extra newline
--- raw_request eval
::stt(response_format => 'vtt')
--- error_code: 200
--- response_headers
Content-Type: text/plain; charset=utf-8
--- response_body eval
"WEBVTT\n\n00:00:00.320 --> 00:00:02.710\nand so my fellow americans\n\n"
. "00:00:03.500 --> 00:01:05.905\nask not what your country can do for "
. "you\n\n"
--- no_error_log
[error]



=== TEST 5: verbose_json without granularities: segments only, Whisper's ten keys, Whisper's compression ratio
--- raw_request eval
::stt(response_format => 'verbose_json')
--- error_code: 200
--- response_headers
Content-Type: application/json
--- response_body eval
::verbose(segments => 1)
--- check
my $rec = fake_engine_record($::SOCK);
is($rec->{req}{transcribe}{words}, JSON::PP::false, "$name: no words asked");
is_deeply([map { [sort keys %$_] } @{ $json->{segments} }],
          [([sort qw(id seek start end text tokens temperature avg_logprob
                     compression_ratio no_speech_prob)]) x 2],
          "$name: ten keys a segment");
ok(!exists $json->{words}, "$name: no words key");
--- no_error_log
[error]



=== TEST 6: verbose_json, timestamp_granularities[]=word: words only, and the engine is asked for them
--- raw_request eval
::stt(response_format => 'verbose_json',
      'timestamp_granularities[]' => 'word')
--- error_code: 200
--- response_body eval
::verbose(words => 1)
--- check
my $rec = fake_engine_record($::SOCK);
is_deeply($rec->{req}, ::engine_json(words => 1), "$name: words: true");
ok(!exists $json->{segments}, "$name: no segments key");
is(scalar @{ $json->{words} }, 14, "$name: every word");
--- no_error_log
[error]



=== TEST 7: verbose_json, both granularities (two parts): segments then words
--- raw_request eval
::stt(response_format => 'verbose_json',
      'timestamp_granularities[]' => ['word', 'segment'])
--- error_code: 200
--- response_body eval
::verbose(segments => 1, words => 1)
--- no_error_log
[error]



=== TEST 8: verbose_json, timestamp_granularities=segment (no [], as curl users write it): segments only
--- raw_request eval
::stt(response_format => 'verbose_json',
      'timestamp_granularities' => 'segment')
--- error_code: 200
--- response_body eval
::verbose(segments => 1)
--- no_error_log
[error]



=== TEST 9: node-style: openai- boundary, file first, a path in the filename (the hint from its extension)
--- raw_request eval
my $b = 'openai-' . ('x1Y2' x 8);
::post(::mp($b, ['file', $::AUDIO, filename => '/home/u/rec/take 1.MP3',
                 type => 'application/octet-stream'],
            ['model', 'whisper-1'], ['response_format', 'json']),
       type => "multipart/form-data; boundary=$b")
--- error_code: 200
--- response_body eval
qq{{"text":"$::TEXT","usage":{"type":"duration","seconds":11}}\n}
--- check
my $rec = ::audio_is($::AUDIO, $name);
is_deeply($rec->{req}, ::engine_json(format => 'mp3'), "$name: hint mp3");
--- no_error_log
[error]



=== TEST 10: .NET-style: a quoted 70-character boundary with = and _, bare names, quoted [] names, text parts with Content-Type, a Windows path and filename*
--- raw_request eval
my $b = '=_' . ('aZ09=_' x 11) . 'ab';
my $t = 'text/plain; charset=utf-8';
::post(::mp($b, ['file', $::AUDIO, bare => 1,
                 filename => 'Assets\audio_hello_world.mp3',
                 filename_ext => "utf-8''Assets%5Caudio_hello_world.flac"],
            ['model', 'whisper-1', bare => 1, type => $t],
            ['response_format', 'verbose_json', bare => 1, type => $t],
            ['timestamp_granularities[]', 'word', type => $t],
            ['temperature', '0.4', bare => 1, type => $t]),
       type => qq{multipart/form-data; boundary="$b"})
--- error_code: 200
--- response_body eval
::verbose(words => 1)
--- check
is(length('=_' . ('aZ09=_' x 11) . 'ab'), 70, "$name: a 70-char boundary");
my $rec = ::audio_is($::AUDIO, $name);
is_deeply($rec->{req}, ::engine_json(format => 'flac', words => 1),
          "$name: filename* wins over filename (flac)");
--- no_error_log
[error]



=== TEST 11: the hint of each extension; nothing refused by its name (webm: the engine's 400 naming webm)
--- raw_request eval
[map { ::stt(filename => $_->[0], prompt => $_->[1]) }
     ['a.ogg', ''], ['b.Opus', ''], ['c.oga', ''], ['d.flac', ''],
     ['e.m4a', ''], ['noext', ''], ['x.webm', 'webm']]
--- error_code eval
[200, 200, 200, 200, 200, 200, 400]
--- check
my @hint = qw(opus opus opus flac auto auto auto);
my $rec = fake_engine_record($::SOCK);
is($rec->{req}{audio_in}[0]{format}, $hint[$i], "$name: request $i hint $hint[$i]");
if ($i == 6) {
    error_is($json, 'invalid_request_error', 'file', 'invalid_value', $name);
    like($json->{error}{message}, qr/^webm is not supported/, "$name: the engine's words");
}
--- no_error_log
[error]



=== TEST 12: curl -F (its own boundary, Expect: 100-continue for a large body, arrays without [], a path in the filename): the same bytes
--- raw_request eval
::stt()
--- error_code: 200
--- check
my $f = "$ENV{TEST_NGINX_SERVROOT}/html/take.mp3";
open(my $fh, '>', $f) or die $!;
binmode $fh;
print $fh $::BIG;
close $fh;
my $url = 'http://127.0.0.1:' . Test::Nginx::Util::server_port() . '/v1/audio/transcriptions';
my $out = `curl -s -S -F model=whisper-1 -F response_format=verbose_json -F timestamp_granularities=word -F 'file=\@$f' $url 2>&1`;
is($out, ::verbose(words => 1), "$name: the answer");
my $rec = ::audio_is($::BIG, $name, min_frames => 5);
is_deeply($rec->{req}, ::engine_json(format => 'mp3', words => 1, bytes => length $::BIG), "$name: the engine's JSON");
--- no_error_log
[error]



=== TEST 13: a file of 300 KB in memory: five frames, every byte
--- http_config
    client_body_buffer_size 1m;
--- raw_request eval
::stt(file => $::BIG)
--- error_code: 200
--- check
my $rec = ::audio_is($::BIG, $name, min_frames => 5);
is($rec->{req}{audio_in}[0]{bytes}, 300_000, "$name: bytes");
--- no_error_log
[error]
a client request body is buffered to a temporary file



=== TEST 14: the body in a temporary file (client_body_buffer_size 1k), sendfile off: the same bytes, read in bounded pieces
--- http_config
    client_body_buffer_size 1k;
    sendfile off;
--- raw_request eval
::stt(file => $::BIG, response_format => 'text', prompt => 'a prompt')
--- error_code: 200
--- response_body eval
"$::TEXT\n"
--- check
my $rec = ::audio_is($::BIG, $name, min_frames => 5);
is($rec->{req}{transcribe}{prompt}, 'a prompt', "$name: the text parts before the file");
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]



=== TEST 15: the body in a temporary file, sendfile on: views of the file go out, the same bytes
--- http_config
    client_body_buffer_size 1k;
    sendfile on;
--- raw_request eval
::stt(file => $::BIG, response_format => 'text')
--- error_code: 200
--- check
::audio_is($::BIG, $name, min_frames => 5);
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]



=== TEST 16: client_body_in_file_only, the file part first (.NET order) and text parts after it
--- http_config
    client_body_in_file_only clean;
--- raw_request eval
::post(::mp($::B, ['file', $::BIG, filename => 'x.wav'],
            ['model', 'whisper-1'], ['response_format', 'srt'],
            ['include[]', 'logprobs']))
--- error_code: 200
--- check
::audio_is($::BIG, $name, min_frames => 5);
like($body, qr/^1\n00:00:00,320 --> /, "$name: srt, from the part after the file");
--- no_error_log
[error]



=== TEST 17: a chunked body in small chunks, some of one byte: the same bytes
--- http_config
--- raw_request eval
::stt(file => $::BIG, post => { chunked => { sizes => [1, 7, 4093, 1, 65536] } })
--- error_code: 200
--- check
::audio_is($::BIG, $name, min_frames => 5);
--- no_error_log
[error]



=== TEST 18: unknown parts, include[], chunking_strategy (both wire forms), known_speaker_names[]: accepted and ignored
--- raw_request eval
::post(::mp($::B, ['model', 'whisper-1'], ['include[]', 'logprobs'],
            ['chunking_strategy', '{"type":"server_vad","threshold":0.5}'],
            ['chunking_strategy[type]', 'server_vad'],
            ['known_speaker_names[]', 'ann'], ['extra_body_key', 'x' x 100000],
            ['file', $::AUDIO, filename => 'a.wav']))
--- error_code: 200
--- check
my $rec = ::audio_is($::AUDIO, $name);
is_deeply($rec->{req}, ::engine_json(), "$name: none of them reaches the engine");
--- no_error_log
[error]



=== TEST 19: 20,000 parts nobody asked for around the file: parsed, not kept (a part's name and filename reuse one buffer)
--- raw_request eval
::post(::mp($::B, (map { ["x$_", 'v' x ($_ % 7)] } 1 .. 10000), ['model', 'whisper-1'],
            ['file', $::AUDIO, filename => 'a.wav'], (map { ["y$_", ''] } 1 .. 10000)))
--- error_code: 200
--- check
my $rec = ::audio_is($::AUDIO, $name);
is_deeply($rec->{req}, ::engine_json(), "$name: the engine's JSON as for one part");
--- no_error_log
[error]



=== TEST 20: the served model is named to the engine; language en (any case) and the prompt go in transcribe
--- raw_request eval
::stt(model => 'stories260K', language => 'EN', prompt => "Pr\x{c3}\x{a9}cis, \"quoted\"")
--- error_code: 200
--- check
my $rec = fake_engine_record($::SOCK);
is_deeply($rec->{req}, ::engine_json(more => { model => 'stories260K' },
    transcribe => { language => 'en', prompt => "Pr\x{e9}cis, \"quoted\"" }),
    "$name: model, language, prompt");
--- no_error_log
[error]



=== TEST 21: OpenAI's other transcription models name the served one too
--- raw_request eval
[map { ::stt(model => $_) } qw(gpt-4o-transcribe gpt-4o-mini-transcribe
                                gpt-4o-mini-transcribe-2025-12-15)]
--- error_code eval
[200, 200, 200]
--- check
my $rec = fake_engine_record($::SOCK);
ok(!exists $rec->{req}{model}, "$name: request $i: no model for the engine");
--- no_error_log
[error]



=== TEST 22: omni_max_audio_seconds goes to the engine, and its 400 names the limit
--- config
    location /v1/ {
        omni_max_audio_seconds 30;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- raw_request eval
::stt(prompt => 'too-long')
--- error_code: 400
--- check
my $rec = fake_engine_record($::SOCK);
is($rec->{req}{max_audio_seconds}, 30, "$name: max_audio_seconds 30");
error_is($json, 'invalid_request_error', 'file', 'invalid_value', $name);
like($json->{error}{message}, qr/max_audio_seconds \(30 s\)/, "$name: the limit named");
--- no_error_log
[error]



=== TEST 23: omni_max_audio_seconds takes 1 to 86400
--- config
    location /v1/ {
        omni_max_audio_seconds 0;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- request
GET /v1/models
--- must_die
--- error_log
must be between 1 and 86400



=== TEST 24: stream=true: one delta per TRANSCRIPT (a space before every one but the first), done with their concatenation, [DONE]
--- raw_request eval
::stt(stream => 'true', response_format => 'verbose_json')
--- error_code: 200
--- response_headers
Content-Type: text/event-stream; charset=utf-8
Cache-Control: no-store
Transfer-Encoding: chunked
--- response_body eval
::sse(map { $_->{text} } @::FAKE_SEGMENTS)
--- no_error_log
[error]



=== TEST 25: stream=True and stream=1 stream too; stream=false does not
--- raw_request eval
[::stt(stream => 'True'), ::stt(stream => '1'), ::stt(stream => 'false')]
--- error_code eval
[200, 200, 200]
--- check
if ($i < 2) {
    is($body, ::sse(map { $_->{text} } @::FAKE_SEGMENTS), "$name: request $i: SSE");
} else {
    ok($json && exists $json->{text}, "$name: JSON");
}



=== TEST 26: a stream is flushed per event: the first delta comes before the engine's second segment (0.5 s later)
--- raw_request eval
::stt(stream => 'true', prompt => 'slow')
--- error_code: 200
--- check
use Time::HiRes qw(time);
my $c = raw_connect(Test::Nginx::Util::server_port());
my $t0 = time;
raw_send($c, [::stt(stream => 'true', prompt => 'slow')]);
my $got = raw_read($c, until => sub { $_[0] =~ /"delta"/ }, timeout => 5);
my $t1 = time;
$got .= raw_read($c, timeout => 5);
my $t2 = time;
close $c;
like($got, qr/"delta":"and so/, "$name: the first delta");
ok($t1 - $t0 < 0.4, "$name: it came at once (" . sprintf('%.3f', $t1 - $t0) . " s)");
ok($t2 - $t1 >= 0.3, "$name: the rest later (" . sprintf('%.3f', $t2 - $t1) . " s)");
--- no_error_log
[error]



=== TEST 27: a transcript streams while its audio is still uploaded (the engine answers half-way): the rest of the audio still goes
--- http_config
    client_body_buffer_size 1k;
--- raw_request eval
::stt(stream => 'true', prompt => 'midway', file => $::BIG)
--- error_code: 200
--- response_body eval
::sse(map { $_->{text} } @::FAKE_SEGMENTS)
--- check
::audio_is($::BIG, $name, min_frames => 5);
--- no_error_log
[error]



=== TEST 28: the engine's ERROR before it read any audio (nginx still sending 300 KB from the file): the 400 as it is, nothing logged as an error
--- http_config
    client_body_buffer_size 1k;
--- raw_request eval
::stt(prompt => 'err-early', file => $::BIG)
--- error_code: 400
--- response_headers
Content-Type: application/json
--- check
error_is($json, 'invalid_request_error', 'file', 'invalid_value', $name);
like($json->{error}{message}, qr/^mp3: corrupt frame/, "$name: the engine's message");
--- no_error_log
[error]
[alert]
[crit]



=== TEST 29: the engine's ERROR half-way through the audio, streaming asked: still a 400 JSON (no stream had begun)
--- http_config
--- raw_request eval
::stt(prompt => 'err-mid', file => $::BIG, stream => 'true')
--- error_code: 400
--- response_headers
Content-Type: application/json
--- check
error_is($json, 'invalid_request_error', 'file', 'invalid_value', $name);
is($json->{error}{message}, 'mp3: corrupt frame at byte 70311', "$name: message");
--- no_error_log
[error]
[alert]



=== TEST 30: the engine stops reading half-way and answers a moment later: the write that fails is not the request's failure (logged at info), the engine's 400 is the answer
--- raw_request eval
::stt(prompt => 'err-shut', file => $::BIG)
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'file', 'invalid_value', $name);
is($json->{error}{message}, 'mp3: corrupt frame at byte 70311', "$name: the engine's words");
--- error_log eval
[qr/\[info\] .*(?:writev|sendfile)\(\) failed \(32: Broken pipe\)/,
 qr/\[info\] .*omni engine stopped reading the request after \d+ of its \d+ bytes/]
--- no_error_log
[error]
[alert]



=== TEST 31: the engine refusing the audio half-way, again and again: each a 400 with its words, whichever side sees the close first (the write that fails, or the ERROR read)
--- raw_request eval
::stt(prompt => 'err-mid', file => $::BIG)
--- error_code: 400
--- check
my $port = Test::Nginx::Util::server_port();
my $ok = 0;
for (1 .. 15) {
    my $c = raw_connect($port);
    raw_send($c, [::stt(prompt => 'err-mid', file => $::BIG)]);
    my @r = http_responses(raw_read($c, timeout => 10));
    close $c;
    $ok++ if ($r[0]{status} // 0) == 400
             && $r[0]{body} =~ /"message":"mp3: corrupt frame at byte 70311"/;
}
is($ok, 15, "$name: 15 of 15 got the engine's 400");
open(my $log, '<', "$ENV{TEST_NGINX_SERVROOT}/logs/error.log");
my $writes = grep { /omni engine stopped reading the request/ } <$log>;
Test::More::note("$writes of 16 saw the engine close as a failed write");
--- no_error_log
[error]
[alert]
[crit]



=== TEST 32: an engine ERROR after the stream began: the deltas, an error event, a clean end
--- raw_request eval
::stt(prompt => 'err-late', stream => 'true')
--- error_code: 200
--- response_body eval
'data: {"type":"transcript.text.delta","delta":"and so my fellow americans"}'
. "\n\n"
. 'data: {"error":{"message":"the listener stage died","type":"server_error",'
. '"param":null,"code":"stage_failed"}}' . "\n\n"
--- no_error_log
[error]



=== TEST 33: the same not streaming: the engine's 503 with Retry-After
--- raw_request eval
::stt(prompt => 'err-late')
--- error_code: 503
--- response_headers
Retry-After: 1
--- check
error_is($json, 'server_error', undef, 'stage_failed', $name);



=== TEST 34: an engine that closes after a segment, not streaming: 503 engine gone
--- raw_request eval
::stt(prompt => 'close')
--- error_code: 503
--- check
error_is($json, 'server_error', undef, 'engine_unavailable', $name);
--- error_log
upstream prematurely closed connection



=== TEST 35: an engine that closes after a segment, streaming: the delta, an error event
--- raw_request eval
::stt(prompt => 'close', stream => 'true')
--- error_code: 200
--- check
like($body, qr/\Adata: \{"type":"transcript\.text\.delta",[^\n]*\n\ndata: \{"error":\{"message":"The engine closed the stream before the end\."[^\n]*\n\n\z/,
     "$name: the delta, then the error event");
--- error_log
omni engine closed the stream before DONE



=== TEST 36: a TRANSCRIPT that is not JSON: 502, logged
--- raw_request eval
::stt(prompt => 'bad-json')
--- error_code: 502
--- check
error_is($json, 'server_error', undef, undef, $name);
is($json->{error}{message}, 'The engine sent an invalid response.', "$name: message");
--- error_log
omni engine sent invalid TRANSCRIPT



=== TEST 37: a TEXT frame (no such event for a transcription): 502, logged; streaming, an error event
--- raw_request eval
[::stt(prompt => 'bad-frame'), ::stt(prompt => 'bad-frame', stream => 'true')]
--- error_code eval
[502, 200]
--- check
if ($i == 0) {
    error_is($json, 'server_error', undef, undef, $name);
} else {
    like($body, qr/\Adata: \{"error":\{"message":"The engine sent an invalid response\."/, "$name: an error event");
}
--- error_log
omni engine sent unexpected frame type 16



=== TEST 38: escapes: quotes, a backslash, a tab and UTF-8 in the text, in JSON and as they are in text
--- raw_request eval
[::stt(prompt => 'escapes'), ::stt(prompt => 'escapes', response_format => 'text'),
 ::stt(prompt => 'escapes', stream => 'true')]
--- error_code eval
[200, 200, 200]
--- check
my $t = "say \"hi\" \\ to\tme \xc3\xa9t\xc3\xa9";
if ($i == 0) {
    is($body, '{"text":"say \"hi\" \\\\ to\tme ' . "\xc3\xa9t\xc3\xa9" . '","usage":{"type":"duration","seconds":11}}' . "\n", "$name: JSON");
} elsif ($i == 1) {
    is($body, "$t\n", "$name: text");
} else {
    is($body, 'data: {"type":"transcript.text.delta","delta":"say \"hi\" \\\\ to\tme ' . "\xc3\xa9t\xc3\xa9" . "\"}\n\n"
              . 'data: {"type":"transcript.text.done","text":"say \"hi\" \\\\ to\tme ' . "\xc3\xa9t\xc3\xa9" . "\"}\n\ndata: [DONE]\n\n", "$name: SSE");
}



=== TEST 39: no speech: an empty text in every format, usage rounded up (1.5 s is 2)
--- raw_request eval
[map { ::stt(prompt => 'empty', response_format => $_) } qw(json text srt vtt verbose_json)]
--- error_code eval
[(200) x 5]
--- response_body eval
[qq{{"text":"","usage":{"type":"duration","seconds":2}}\n}, "\n", "\n", "WEBVTT\n\n",
 qq{{"task":"transcribe","language":"english","duration":1.5,"text":"","segments":[],"usage":{"type":"duration","seconds":2}}\n}]



=== TEST 40: 120 segments not streaming: all of them, numbered, in order
--- raw_request eval
::stt(prompt => 'many', response_format => 'verbose_json', 'timestamp_granularities[]' => ['segment', 'word'])
--- error_code: 200
--- check
is(scalar @{ $json->{segments} }, 120, "$name: 120 segments");
is_deeply([map { $_->{id} } @{ $json->{segments} }], [0 .. 119], "$name: ids");
is($json->{segments}[119]{seek}, 11900, "$name: seek of the last");
is(scalar @{ $json->{words} }, 120, "$name: words");
is($json->{duration}, 120, "$name: duration");
is($json->{text}, join(' ', map { "segment $_" } 0 .. 119), "$name: text");



=== TEST 41: no file part: 400 file missing_required_parameter, nothing sent to the engine
--- raw_request eval
::post(::mp($::B, ['model', 'whisper-1']))
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'file', 'missing_required_parameter', $name);
ok(!fake_engine_record($::SOCK), "$name: the engine got nothing");
--- no_error_log
[error]



=== TEST 42: no model, or an empty one: 400 model missing_required_parameter
--- raw_request eval
[::stt(model => ''), ::post(::mp($::B, ['model', ''], ['file', $::AUDIO, filename => 'a.wav']))]
--- error_code eval
[400, 400]
--- check
error_is($json, 'invalid_request_error', 'model', 'missing_required_parameter', $name);



=== TEST 43: language: xx is not ISO-639-1 (OpenAI's invalid_language_format), fr is but not served, english is neither
--- raw_request eval
[::stt(language => 'xx'), ::stt(language => 'fr'), ::stt(language => 'english'), ::stt(language => '')]
--- error_code eval
[400, 400, 400, 400]
--- check
my @code = qw(invalid_language_format unsupported_value invalid_language_format invalid_language_format);
error_is($json, 'invalid_request_error', 'language', $code[$i], $name);
like($json->{error}{message}, qr/^Invalid language 'xx'\. Language parameter must be specified in ISO-639-1 format\.$/, "$name: OpenAI's words") if $i == 0;



=== TEST 44: response_format other than the five: 400 response_format
--- raw_request eval
[map { ::stt(response_format => $_) } 'diarized_json', 'JSON', 'xml', '']
--- error_code eval
[400, 400, 400, 400]
--- check
error_is($json, 'invalid_request_error', 'response_format', 'invalid_value', $name);



=== TEST 45: timestamp_granularities[] without verbose_json, or with an unknown value: 400
--- raw_request eval
[::stt('timestamp_granularities[]' => 'word'),
 ::stt(response_format => 'srt', timestamp_granularities => 'segment'),
 ::stt(response_format => 'verbose_json', 'timestamp_granularities[]' => 'char')]
--- error_code eval
[400, 400, 400]
--- check
error_is($json, 'invalid_request_error', 'timestamp_granularities[]', 'invalid_value', $name);
like($json->{error}{message}, qr/^`response_format` must be `verbose_json` if `timestamp_granularities\[\]` is provided$/, "$name: message") if $i < 2;



=== TEST 46: temperature outside 0..1 or not a number; stream not a boolean: 400 naming them
--- raw_request eval
[::stt(temperature => '1.5'), ::stt(temperature => 'hot'), ::stt(temperature => '-0.1'),
 ::stt(temperature => 'nan'), ::stt(stream => 'maybe'), ::stt(temperature => '0'), ::stt(temperature => '1')]
--- error_code eval
[400, 400, 400, 400, 400, 200, 200]
--- check
if ($i < 4) { error_is($json, 'invalid_request_error', 'temperature', 'invalid_value', $name) }
elsif ($i == 4) { error_is($json, 'invalid_request_error', 'stream', 'invalid_type', $name) }



=== TEST 47: a prompt or a model that is not UTF-8, or holds a NUL: 400 naming it
--- raw_request eval
[::stt(prompt => "bad \xff byte"), ::stt(model => "m\xc0\xafx"), ::stt(prompt => "nul \0 here")]
--- error_code eval
[400, 400, 400]
--- check
error_is($json, 'invalid_request_error', ($i == 1 ? 'model' : 'prompt'), undef, $name);



=== TEST 48: an empty file, two file parts: 400 file
--- raw_request eval
[::stt(file => ''),
 ::post(::mp($::B, ['model', 'whisper-1'], ['file', 'a', filename => 'a.wav'], ['file', 'b', filename => 'b.wav']))]
--- error_code eval
[400, 400]
--- check
error_is($json, 'invalid_request_error', 'file', ($i == 0 ? 'invalid_value' : undef), $name);



=== TEST 49: not multipart: no Content-Type, JSON, multipart/mixed; no boundary, an empty one, one too long: 400 before the body is read
--- raw_request eval
my $b = ::mp($::B, ['model', 'whisper-1'], ['file', 'x', filename => 'a.wav']);
[::post($b, no_type => 1), ::post('{"model":"whisper-1"}', type => 'application/json'),
 ::post($b, type => "multipart/mixed; boundary=$::B"), ::post($b, type => 'multipart/form-data'),
 ::post($b, type => 'multipart/form-data; boundary=""'),
 ::post($b, type => 'multipart/form-data; boundary=' . ('b' x 201)),
 ::post($b, type => "multipart/form-data; charset=utf-8; boundary=$::B")]
--- error_code eval
[400, 400, 400, 400, 400, 400, 200]
--- check
if ($i < 6) {
    error_is($json, 'invalid_request_error', undef, undef, $name);
    like($json->{error}{message}, qr/Content-Type/, "$name: request $i: names the Content-Type");
}



=== TEST 50: malformed bodies: no final boundary, cut in a part's headers, a part without a name, without Content-Disposition, a bare LF, garbage after a boundary, no boundary at all
--- raw_request eval
my $ok = ::mp($::B, ['model', 'whisper-1'], ['file', $::AUDIO, filename => 'a.wav']);
(my $nofinal = $ok) =~ s/--\Q$::B\E--\r\n\z//;
my $cut = substr($ok, 0, index($ok, 'filename=') + 3);
(my $noname = $ok) =~ s/form-data; name="model"/form-data; filename="m"/;
(my $nocd = $ok) =~ s/Content-Disposition: form-data; name="model"/X-Other: 1/;
(my $lf = $ok) =~ s/name="model"\r\n/name="model"\n/;
(my $garbage = $ok) =~ s/--\Q$::B\E(?=\r\nContent-Disposition: form-data; name="file")/"--" . $::B . "xx"/e;
[map { ::post($_) } $nofinal, $cut, $noname, $nocd, $lf, $garbage, "just some text\r\n"]
--- error_code eval
[(400) x 7]
--- check
my @why = ('ends before its closing boundary', 'ends before its closing boundary', 'has no name',
           'no Content-Disposition', 'does not end in CRLF', 'followed by something other than CRLF',
           'ends before its closing boundary');
error_is($json, 'invalid_request_error', undef, undef, $name);
like($json->{error}{message}, qr/^Invalid multipart\/form-data body: .*\Q$why[$i]\E/, "$name: request $i: $why[$i]");
--- no_error_log
[error]



=== TEST 51: a body over client_max_body_size: 413 JSON, by Content-Length and chunked
--- config
    location /v1/ {
        client_max_body_size 100k;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- raw_request eval
[::stt(file => $::BIG), ::stt(file => $::BIG, post => { chunked => { sizes => [30000] } })]
--- error_code eval
[413, 413]
--- response_headers
Content-Type: application/json
--- check
error_is($json, 'invalid_request_error', undef, undef, $name);
like($json->{error}{message}, qr/too large/, "$name: too large");
--- error_log
client intended to send too large



=== TEST 52: client_max_body_size 0: a Content-Length past the module's own bound (the engine's 128 MiB of audio and room for fields) is a 413 before a byte is read
--- config
    location /v1/ {
        client_max_body_size 0;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- raw_request eval
::stt(response_format => 'text')
--- error_code: 200
--- check
my $raw = raw_exchange(Test::Nginx::Util::server_port(), [http_request(
    method => 'POST', target => '/v1/audio/transcriptions',
    headers => ["Content-Type: multipart/form-data; boundary=$::B",
                'Content-Length: ' . (128 * 1024 * 1024 + 200000)])],
    timeout => 10, until => sub { $_[0] =~ /\r\n\r\n.*\}/s });
my @r = http_responses($raw);
is($r[0]{status}, 413, "$name: 413 at once, nothing of the body sent");
error_is(eval { decode_json($r[0]{body}) }, 'invalid_request_error', undef, undef, $name);
--- error_log
client sent too large omni request body



=== TEST 53: a value kept over 64 KiB: 400 naming the part; too many kept parts: 400
--- raw_request eval
[::stt(prompt => 'p' x 70000), ::post(::mp($::B, (map { ['model', 'whisper-1'] } 1 .. 70), ['file', 'x', filename => 'a.wav']))]
--- error_code eval
[400, 400]
--- check
error_is($json, 'invalid_request_error', ($i == 0 ? 'prompt' : undef), undef, $name);



=== TEST 54: a wrong method is a 405 with Allow; an API key is checked before the body is read
--- config
    location /v1/ {
        omni_api_keys $TEST_NGINX_SERVROOT/html/keys.txt;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
--- user_files
>>> keys.txt
sk-test-1
--- raw_request eval
[::stt(), ::stt(post => { headers => ['Authorization: Bearer sk-test-1'] }),
 "GET /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-1\r\nConnection: close\r\n\r\n"]
--- error_code eval
[401, 200, 405]
--- check
ok($i != 2 || ($json->{error}{message} // '') =~ /Invalid method/, "$name: 405 Invalid method");



=== TEST 55: the client leaves mid-upload, and mid-stream: no worker crash; the next request is served
--- http_config
    client_body_buffer_size 1k;
--- raw_request eval
::stt(response_format => 'text')
--- error_code: 200
--- check
use Time::HiRes qw(sleep);
my $port = Test::Nginx::Util::server_port();
my $req = ::stt(file => $::BIG);
for my $cut (100, 5000, length($req) / 2, length($req) - 10) {
    my $c = raw_connect($port);
    raw_send($c, [substr($req, 0, $cut)]);
    close $c;
}
# mid-stream (the engine sleeps between its segments) and mid-answer
for my $p ('slow', 'hang') {
    my $c = raw_connect($port);
    raw_send($c, [::stt(stream => 'true', prompt => $p, file => $::BIG)]);
    raw_read($c, timeout => 0.2);
    close $c;
}
sleep 0.5;
my $c = raw_connect($port);
raw_send($c, [::stt(response_format => 'text')]);
my @r = http_responses(raw_read($c, timeout => 5));
close $c;
is($r[0]{status}, 200, "$name: the next request");
is($r[0]{body}, "$::TEXT\n", "$name: its answer");
--- no_error_log eval
::clean_log()

# Speech through nginx from the real engine, decoded and checked by an
# independent decoder (build/tools/audio_probe: libmpg123, libopusfile,
# faad2, libsndfile; none shares code with our encoders):
#
#   - every response_format: 24 kHz mono, a duration plausible for the
#     words, not silent; speed 2 about halves it;
#   - streamed chat audio (delta.audio.data, pcm16) equals the audio of the
#     same greedy request not streamed (message.audio.data, pcm16);
#   - 64 speech requests at once all complete, and the voicebox's memory
#     stays bounded (its RSS after them, against before).
use strict;
use warnings;
use lib '.';
use Test::More;
use JSON::PP;
use MIME::Base64 qw(decode_base64);
use HTTP::Tiny;
use t::lib::OmniServer;

my $probe = 'build/tools/audio_probe';
my $loadgen = 'build/bench/loadgen';
die "$probe is not built (make unit)\n" unless -x $probe;
die "$loadgen is not built\n" unless -x $loadgen;

my $s = omni_server_start(name => 'speech-audio');
my $base = "http://127.0.0.1:$s->{port}/v1";
my $http = HTTP::Tiny->new(timeout => 120);
my $text = 'The little dog ran to the park with his best friend the cat.';
my $words = () = $text =~ /\w+/g;

sub post {
    my ($path, $body) = @_;
    my $r = $http->post("$base$path", {
        headers => { 'Content-Type' => 'application/json' },
        content => encode_json($body) });
    return $r;
}

# audio_probe's JSON for these bytes, or undef (with a diagnostic)
sub probe {
    my ($format, $bytes) = @_;
    my $f = "$main::TMP/probe.$format";
    open(my $o, '>', $f) or die "$f: $!";
    print $o $bytes;
    close $o;
    my $out = `$probe $format $f 2>&1`;
    my $j = eval { decode_json($out) };
    diag("audio_probe $format: $out") unless $j;
    return $j;
}

my %seconds;
for my $fmt (qw(mp3 opus aac flac wav pcm)) {
    my $r = post('/audio/speech', { model => 'tts-1', input => $text,
                                    voice => 'alloy',
                                    response_format => $fmt });
    is($r->{status}, 200, "$fmt: 200") or diag($r->{content});
    my $p = probe($fmt, $r->{content}) or next;
    is($p->{rate}, 24000, "$fmt: 24 kHz");
    is($p->{channels}, 1, "$fmt: mono");
    # speech runs at 2-4 words a second; a chunk join adds a pause
    ok($p->{seconds} > $words * 0.2 && $p->{seconds} < $words * 0.6,
       "$fmt: $p->{seconds} s for $words words");
    ok($p->{rms} > 0.01, "$fmt: not silent (rms $p->{rms})");
    $seconds{$fmt} = $p->{seconds};
}
{
    my $r = post('/audio/speech', { model => 'tts-1', input => $text,
                                    voice => 'alloy', speed => 2,
                                    response_format => 'wav' });
    my $p = probe('wav', $r->{content});
    ok($p && $seconds{wav}
       && abs($p->{seconds} / $seconds{wav} - 0.5) < 0.1,
       'speed 2: about half the duration') or diag(explain($p));
}

# --- streamed chat audio equals the same request not streamed ---------------
{
    my %req = (model => main::models($s->{engine})->{data}[0]{id},
               messages => [{ role => 'user', content => 'Tell me a story' }],
               max_tokens => 40, temperature => 0,
               modalities => ['text', 'audio'],
               audio => { voice => 'alloy', format => 'pcm16' });
    my $r = post('/chat/completions', \%req);
    my $j = eval { decode_json($r->{content}) } // {};
    my $whole = decode_base64($j->{choices}[0]{message}{audio}{data} // '');
    my $said = $j->{choices}[0]{message}{audio}{transcript} // '';
    ok(length($whole) > 1000, 'chat: audio not streamed');
    $r = post('/chat/completions', { %req, stream => JSON::PP::true });
    my ($data, $transcript) = ('', '');
    for my $ev ($r->{content} =~ /^data: (\{.*\})$/mg) {
        my $a = (decode_json($ev)->{choices} // [])->[0]{delta}{audio} // {};
        $data .= $a->{data} // '';
        $transcript .= $a->{transcript} // '';
    }
    my $streamed = decode_base64($data);
    is(length($streamed), length($whole), 'chat: streamed audio, same length');
    ok($streamed eq $whole, 'chat: streamed pcm16 equals the one not streamed');
    is($transcript, $said, 'chat: the same transcript');
}

# --- 64 at once; the voicebox's memory bounded ------------------------------
{
    my $vb = main::stage_pid($s->{engine}, 'voicebox');
    ok($vb, 'the voicebox stage runs');
    my $before = rss_kb($vb);
    my $prompts = "$main::TMP/speech-prompts.txt";
    open(my $o, '>', $prompts) or die;
    print $o "$text\n", "Once upon a time there was a little girl.\n";
    close $o;
    my $json = "$main::TMP/speech-64.json";
    my $rc = system($loadgen, '--http', "127.0.0.1:$s->{port}", '--path',
                    '/v1/audio/speech', '--model', 'tts-1', '--prompts',
                    $prompts, '--audio', 'alloy', '--audio-format', 'mp3',
                    '--concurrency', 64, '--requests', 64, '--json', $json,
                    '--timeout', 120) >> 8;
    my $lg = eval { local $/; open(my $f, '<', $json) or die; decode_json(<$f>) }
             // {};
    is($rc, 0, '64 at once: loadgen ok');
    is($lg->{completed}, 64, '64 at once: all completed');
    is($lg->{errors}, 0, '64 at once: no errors');
    ok(($lg->{audio_bytes} // 0) > 64 * 5000, '64 at once: audio for each');
    my $after = rss_kb($vb);
    is(main::stage_pid($s->{engine}, 'voicebox'), $vb,
       'the same voicebox process');
    # fixed state per request and the shared pool, not the audio: 64
    # requests' worth of encoders stays well under this
    ok($after - $before < 64 * 1024,
       "voicebox RSS $before kB -> $after kB (bounded)");
}

omni_server_stop($s);
done_testing();

# Speech -> text -> speech through one omni-engine serve, over its wire
# protocol: the speech pipeline's own audio for the 20 first sentences of
# bench/speech_sentences.txt (talker and voicebox, voice alloy, as wav;
# the first 8 also as mp3, flac and opus) sent back to the listener as
# audio input, its transcripts within a stated word error rate of the
# sentences; and one
# chat request whose user turn is audio and whose answer is spoken
# (listener -> thinker -> talker -> voicebox): text and audio out, DONE
# with the input's milliseconds and the answer's audio. The helpers are
# in proto.pl.
use strict;
use warnings;
use Test::More;
use JSON::PP;
use lib 't/lib';
use Wer qw(words);
require './t/engine/proto.pl';
our ($ENGINE, $TMP, %F);

# The word error rate the listener reaches on our own voice (measured
# here over the 20 sentences, 275 words: README, "Audio in": 12.0% from
# WAV and FLAC, 11.6% through our MP3, 14.2% through our Opus), with
# headroom. (bench/asr, one utterance per sentence without the voice
# activity detection's cuts, measures the same voice at about 9%.)
my $WER_MAX = 0.22;
my $N = 20;
my %N_OF = (wav => $N, mp3 => 8, flac => 8, opus => 8);

my $stages = `$ENGINE stage nosuch 2>&1`;
unless ($stages =~ /\blistener\b/ && $stages =~ /\bvoicebox\b/) {
    plan skip_all => 'this engine was built without the speech stages';
}
my @sentences = grep { length } split /\n/,
    slurp('bench/speech_sentences.txt');
@sentences = @sentences[0 .. $N - 1];
my $srv = serve_start(args => ['--listener-slots', 2], timeout => 60);

sub ok_done {
    my ($r, $name) = @_;
    ok($r->{done} && !$r->{error} && $r->{eof}, "$name: DONE, then closed")
        or diag explain $r->{error};
}

sub speak {
    my ($text, $fmt) = @_;
    my $r = request($srv, { input => $text,
                            audio => { voice => 'alloy', format => $fmt } },
                    timeout => 60);
    return $r->{done} ? $r->{audio} : undef;
}

sub hear {
    my ($bytes, $fmt) = @_;
    return request_audio($srv, {
        transcribe => { language => 'en' },
        audio_in => [{ format => $fmt, bytes => length $bytes,
                       param => 'file' }] }, [$bytes], timeout => 60);
}

for my $fmt (qw(wav mp3 flac opus)) {
    my ($edits, $n, $ok) = (0, 0, 0);
    for my $s (@sentences[0 .. $N_OF{$fmt} - 1]) {
        my $audio = speak($s, $fmt);
        my $r = defined $audio ? hear($audio, $fmt) : {};
        $ok++ if $r->{done} && !$r->{error};
        my @ref = words($s);
        $edits += Wer::edits(\@ref, [words(transcript_text($r))]);
        $n += @ref;
    }
    is($ok, $N_OF{$fmt}, "$fmt: $N_OF{$fmt} sentences spoken and heard");
    my $w = $edits / $n;
    diag sprintf('%s: WER %.1f%% over %d words', $fmt, 100 * $w, $n);
    ok($w <= $WER_MAX, sprintf('%s: WER %.1f%% <= %d%%', $fmt, 100 * $w,
                               100 * $WER_MAX));
}

# --- speech in, speech out: one request ------------------------------------
{
    my $q = speak('Tell me a story about a little dog.', 'wav');
    my $req = { messages => [{ role => 'user', content => [
                    { type => 'input_audio', index => 0 } ] }],
                max_tokens => 48, temperature => 0,
                audio => { voice => 'alloy', format => 'wav' },
                audio_in => [{ format => 'wav', bytes => length $q,
                               param => 'messages[0].content[0]'
                                        . '.input_audio' }] };
    my $r = request_audio($srv, $req, [$q], timeout => 60);
    ok_done($r, 'speech in, speech out');
    ok(length($r->{text}) > 0, 'speech in, speech out: the answer\'s text');
    like($r->{audio}, qr/\ARIFF....WAVE/s, 'speech in, speech out: a WAV');
    ok($r->{done}{input_audio_ms} > 1000, 'speech in, speech out: '
       . "input_audio_ms $r->{done}{input_audio_ms}");
    ok($r->{done}{audio_ms} > 500, "speech in, speech out: audio_ms "
       . "$r->{done}{audio_ms}");
    ok($r->{done}{prompt_tokens} > 5, 'speech in, speech out: the heard '
       . "words are the prompt ($r->{done}{prompt_tokens} tokens)");
}

serve_stop($srv);
done_testing();

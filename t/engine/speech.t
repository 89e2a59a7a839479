# omni-engine serve with speech out, over its wire protocol: a speech
# request (input) and a chat with "audio" get AUDIO frames, a chat's TEXT
# and AUDIO interleaved, then one DONE with audio_tokens and audio_ms; bad
# speech parameters are 400 with their param; a client that leaves
# mid-speech gets its pool blocks reclaimed; a voicebox killed under 8
# speech streams fails those 8 only, not 4 text streams beside them, and
# restarts. The helpers are in proto.pl.
#
# Without the talker and voicebox stages in the build (OMNI_HAVE_SPEECH),
# speech is refused with 501 speech_unavailable and text is served: that
# is checked, and the rest is skipped.
use strict;
use warnings;
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
require './t/engine/proto.pl';
our ($ENGINE, $TMP, %F);

my $SPEECH = { input => 'Hello there. This is a test of the speech path.',
               audio => { voice => 'alloy', format => 'pcm' } };
# long enough that the thinker is still writing when the first audio
# comes (the test model writes hundreds of tokens a second)
my $CHAT = { messages => [{ role => 'user', content => 'Tell me a story' }],
             max_tokens => 400, temperature => 0,
             audio => { voice => 'alloy', format => 'wav' } };
my $TEXT = { prompt => 'Once upon a time', max_tokens => 200,
             temperature => 0 };

sub ok_done {
    my ($r, $name) = @_;
    ok($r->{done} && !$r->{error} && $r->{eof}, "$name: DONE, then closed")
        or diag explain $r->{error};
}

my $stages = `$ENGINE stage nosuch 2>&1`;
my $has_speech = $stages =~ /\btalker\b/ && $stages =~ /\bvoicebox\b/;
my $srv = serve_start();

# An assistant turn that refers to a spoken answer never kept: 400, naming
# the message (the store is the frontend's, in every build).
{
    my $r = request($srv, { messages => [
        { role => 'user', content => 'Hi' },
        { role => 'assistant', audio => { id => 'audio_nope' } },
        { role => 'user', content => 'And then?' } ], max_tokens => 5 });
    is($r->{error}{status}, 400, 'unknown audio id: 400');
    is($r->{error}{param}, 'messages[1].audio.id', 'unknown audio id: param');
    like($r->{error}{message}, qr/audio_nope/, 'unknown audio id: named');
}

unless ($has_speech) {
    my $r = request($srv, $SPEECH);
    is($r->{error}{status}, 501, 'no speech stages: 501');
    is($r->{error}{code}, 'speech_unavailable', 'no speech stages: code');
    $r = request($srv, $TEXT);
    ok_done($r, 'no speech stages: text still served');
    my $m = metrics($srv);
    ok(defined $m->{omni_engine_pool_blocks_total}
       && $m->{omni_engine_pool_blocks_total} == 512,
       'pool: 512 blocks by default');
    is($m->{omni_engine_pool_blocks_used}, 0, 'pool: none used');
    serve_stop($srv);
    done_testing();
    exit 0;
}

# --- a speech request: AUDIO, then DONE ------------------------------------
{
    my $r = request($srv, $SPEECH);
    ok_done($r, 'speech');
    my @audio = grep { $_->[0] == $F{AUDIO} } @{ $r->{frames} };
    ok(@audio > 0, 'speech: AUDIO frames');
    ok(!grep({ length($_->[1]) > 65536 } @audio),
       'speech: each AUDIO at most 64 KiB');
    is(length($r->{audio}) % 2, 0, 'speech: pcm is whole 16-bit samples');
    ok($r->{done}{audio_tokens} > 0, 'speech: audio_tokens > 0');
    ok($r->{done}{audio_ms} > 0, 'speech: audio_ms > 0');
    ok($r->{done}{prompt_tokens} > 0, 'speech: the words read');
    is($r->{frames}[-1][0], $F{DONE}, 'speech: DONE last');
}

# --- a chat with audio: TEXT and AUDIO interleaved -------------------------
{
    my $r = request($srv, $CHAT);
    ok_done($r, 'chat audio');
    ok(length($r->{text}) > 0, 'chat audio: text');
    ok(length($r->{audio}) > 44, 'chat audio: audio beyond a wav header');
    is(substr($r->{audio}, 0, 4), 'RIFF', 'chat audio: a wav file');
    my @t = map { $_->[0] } @{ $r->{frames} };
    my ($first_audio) = grep { $t[$_] == $F{AUDIO} } 0 .. $#t;
    my ($last_text) = grep { $t[$_] == $F{TEXT} } reverse 0 .. $#t;
    ok(defined $first_audio && $first_audio < $last_text,
       'chat audio: audio starts before the text ends');
    ok($r->{done}{completion_tokens} > 0, 'chat audio: the thinker\'s counts');
    ok($r->{done}{audio_tokens} > 0 && $r->{done}{audio_ms} > 0,
       'chat audio: the talker\'s and the voicebox\'s');

    # its transcript is kept under its id: a later turn may refer to it
    $r = request($srv, { %$CHAT, audio => { %{ $CHAT->{audio} },
                                             id => 'audio_t1' } });
    ok_done($r, 'chat audio with an id');
    my $said = $r->{text};
    my @turns = ({ role => 'user', content => 'Tell me a story' },
                 { role => 'assistant', audio => { id => 'audio_t1' } },
                 { role => 'user', content => 'And then?' });
    my $by_id = request($srv, { messages => \@turns, max_tokens => 5,
                                temperature => 0 });
    ok_done($by_id, 'a turn referring to audio_t1');
    $turns[1] = { role => 'assistant', content => $said };
    my $by_text = request($srv, { messages => \@turns, max_tokens => 5,
                                  temperature => 0 });
    is($by_id->{done}{prompt_tokens}, $by_text->{done}{prompt_tokens},
       'the transcript stands in for the answer\'s text');
    is($by_id->{text}, $by_text->{text}, '... and the reply is the same');
}

# --- errors from the request's checks --------------------------------------
{
    my %bad = ('audio.voice'  => { voice => 'nobody', format => 'mp3' },
               'audio.format' => { voice => 'alloy', format => 'ogg' },
               'audio.speed'  => { voice => 'alloy', speed => 9 });
    for my $param (sort keys %bad) {
        my $r = request($srv, { input => 'Hi.', audio => $bad{$param} });
        is($r->{error}{status}, 400, "$param: 400");
        is($r->{error}{param}, $param, "$param: param");
    }
}

# --- the model a speech request may name ------------------------------------
{
    for my $m (qw(tts-1 tts-1-hd gpt-4o-mini-tts flite)) {
        my $r = request($srv, { model => $m, input => 'Hi.',
                                audio => { voice => 'alloy', format => 'pcm' } });
        ok($r->{done} && length($r->{audio}) > 0, "speech as model $m");
    }
    my $r = request($srv, { model => 'tts-2', input => 'Hi.',
                            audio => { voice => 'alloy' } });
    is($r->{error}{status}, 404, 'an unknown speech model: 404');
    $r = request($srv, { model => 'tts-1', max_tokens => 2,
                         messages => [{ role => 'user', content => 'Hi' }] });
    is($r->{error}{status}, 404, 'tts-1 is no chat model: 404');
}

# --- a client gone mid-speech: the pool returns to empty --------------------
{
    my $long = { input => 'The quick brown fox jumps over the lazy dog. ' x 60,
                 audio => { voice => 'alloy', format => 'pcm' } };
    my @r = run_concurrent($srv, [$long], on_read => sub {
        my ($rs) = @_;
        return length($rs->[0]{audio} // '') > 0 && !$rs->[0]{closed}
               ? 'close:0' : ();
    });
    ok($r[0]{closed} && !$r[0]{done}, 'cancel: closed mid-speech');
    my $m;
    for (1 .. 100) {
        $m = metrics($srv);
        last if $m->{omni_engine_pool_blocks_used} == 0;
        sleep 0.05;
    }
    is($m->{omni_engine_pool_blocks_used}, 0, 'cancel: pool back to empty');
    unlike(slurp($srv->{log}), qr/a leak/, 'cancel: no leaked block logged');
}

# --- a client that stops reading: the voicebox is paused, not the request
# cancelled (without flow control its ~8 MiB of pcm would pass the 8 MiB
# limit on a client's pending output) --------------------------------------
{
    my $long = { input => ('The quick brown fox jumps over the lazy dog. '
                           x 90),
                 audio => { voice => 'alloy', format => 'pcm' } };
    my $s = engine_connect($srv) or die "connect: $!";
    $s->syswrite(frame($F{REQUEST}, encode_json($long)));
    sleep 8;                                # not reading: the voicebox
                                            #   makes ~2 MB/s here
    my $r = new_reply();
    while ($s->sysread(my $chunk, 1 << 16)) {
        $r->{buf} .= $chunk;
        add_frames($r, take_frames(\$r->{buf}));
    }
    close $s;
    ok($r->{done} && !$r->{error}, 'slow reader: served to the end')
        or diag explain $r->{error};
    ok(length($r->{audio}) > (4 << 20), 'slow reader: '
       . length($r->{audio}) . ' bytes of audio');
    is($r->{done}{audio_ms}, int(length($r->{audio}) / 48),
       'slow reader: audio_ms says the bytes sent');
    unlike(slurp($srv->{log}), qr/MiB behind; cancelling/,
           'slow reader: not cancelled');
}

# --- a speech stage killed under 8 speech and 4 text streams ---------------
# Each of the two: the 8 speech requests fail naming it, the text ones are
# untouched, it restarts, the next speech request speaks, the pool is empty.
for my $stage (qw(voicebox talker)) {
    my $long = { input => 'The quick brown fox jumps over the lazy dog. ' x 30,
                 audio => { voice => 'alloy', format => 'pcm' } };
    my @reqs = ((map { $long } 1 .. 8), (map { $TEXT } 1 .. 4));
    my $pid = stage_pid($srv, $stage);
    ok($pid, "kill $stage: it runs");
    my $killed = 0;
    my @r = run_concurrent($srv, \@reqs, on_read => sub {
        my ($rs) = @_;
        if (!$killed && grep { length($_->{audio} // '') > 0 } @$rs[0 .. 7]) {
            kill 'KILL', $pid;
            $killed = 1;
        }
        return ();
    });
    ok($killed, "kill $stage: killed while speaking");
    for my $i (0 .. 7) {
        is($r[$i]{error}{code}, 'stage_failed', "kill $stage: speech $i "
           . 'failed') or diag explain $r[$i]{error};
        like($r[$i]{error}{message} // '', qr/$stage/,
             "kill $stage: speech $i names it");
    }
    ok_done($r[$_], "kill $stage: text $_ untouched") for 8 .. 11;
    ok(wait_health($srv, 200), "kill $stage: health 200 again");
    my $new = stage_pid($srv, $stage);
    ok($new && $new != $pid, "kill $stage: it restarted");
    my $r = request($srv, $SPEECH);
    ok_done($r, "kill $stage: the next speech request");
    ok(length($r->{audio}) > 0, "kill $stage: and it has audio");
    my $m = metrics($srv);
    is($m->{"omni_engine_stage_restarts_total{stage=\"$stage\"}"}, 1,
       "kill $stage: one restart counted");
    is($m->{omni_engine_pool_blocks_used}, 0, "kill $stage: pool empty");
}

serve_stop($srv);
done_testing();

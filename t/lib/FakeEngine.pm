# t::lib::FakeEngine -- a stand-in for omni-engine that misbehaves on
# purpose, for the failure paths of ngx_omni_module: it speaks the wire
# protocol (engine/proto/omni_proto.h) on a Unix socket, one process per
# connection, and answers a REQUEST according to the text of its prompt
# (or last message):
#
#   hang                  reads, never answers (omni_read_timeout)
#   slow                  TEXT "a", 0.35 s, TEXT "b", 0.35 s, TEXT "c", DONE
#   error-after-text      TEXT "Hello", TEXT " world", then ERROR 503
#                         server_error / stage_failed
#   close-after-text      TEXT "Hello", then closes without DONE
#   bad-frame             a frame of an unknown type
#   bad-frame-after-text  TEXT "Hello", then a frame of an unknown type
#   overloaded            ERROR 503 server_error / overloaded
#   bad-utf8              TEXT "ok \xff end" (not UTF-8), DONE
#   escapes               TEXT with quotes, backslashes, controls, DONE
#   think                 REASONING "Let me", REASONING " see.", TEXT "It
#                         is", TEXT " 4.", DONE: completion 9, reasoning 6
#   think-length          REASONING "Still", REASONING " thinking", DONE
#                         length: completion 4, reasoning 4
#   think-echo            TEXT: the REQUEST JSON it got, DONE
#   anything else         TEXT "fake", DONE
#
# A request with "audio" (speech out: /v1/audio/speech's "input", or chat
# with audio) is answered by its input text (speech) or last message:
#
#   echo                  the request JSON itself as the audio (speech),
#                         or as the transcript with 6 bytes of audio (chat)
#   slow-audio            AUDIO "first", 1 s, AUDIO "second", DONE
#   audio-error           AUDIO "abc", then ERROR 503 server_error /
#                         stage_failed
#   audio-close           AUDIO "abc", then closes without DONE
#   audio-first           AUDIO "abcdef", then TEXT "x", DONE
#   voice-error           ERROR 400 invalid_request_error, param
#                         "audio.voice", as the engine names it
#   big-audio             17 MiB of AUDIO in 64 KiB frames, then DONE
#   anything else         fake_audio($format): TEXT "Hel", "lo" (chat),
#                         AUDIO in slices of 7, 1, 4096 and the rest
#                         bytes; DONE with audio_tokens 5, audio_ms 250
#
# A request with "audio_in" (audio in, protocol v4) is followed by the
# bytes of its inputs in AUDIO_IN frames: the fake reads exactly their
# sum (checking every frame: type, version, flags, 1..64 KiB), then
# answers. What it received is recorded in the directory "$path.rec"
# before it answers (fake_engine_record()): the REQUEST JSON, the audio
# bytes, each AUDIO_IN frame's size, the protocol mistakes it saw. A
# transcription ("transcribe") is answered by the first word of its
# "prompt" (default: none):
#
#   err-early   ERROR 400 param "file" before it reads any audio, then
#               closes (nginx is still sending)
#   err-mid     reads half the audio, ERROR 400 "file" (an mp3 corrupt
#               frame), closes
#   err-shut    reads a third of the audio, shuts its reading side down
#               and reads what was queued (so nginx writes again, into a
#               socket that takes no more: EPIPE), then 0.3 s later
#               ERROR 400 "file", closes
#   webm        reads it all, ERROR 400 "file", the webm message
#   too-long    reads it all, ERROR 400 "file", over max_audio_seconds
#   err-late    reads it all, one TRANSCRIPT, ERROR 503 stage_failed
#   close       reads it all, one TRANSCRIPT, closes without DONE
#   midway      one TRANSCRIPT after half the audio, the second after the
#               rest, DONE
#   slow        TRANSCRIPT, 0.5 s, TRANSCRIPT, DONE
#   empty       DONE only (no speech), input_audio_ms 1500
#   escapes     one TRANSCRIPT with quotes, a backslash, a tab, UTF-8
#   bad-json    a TRANSCRIPT that is not JSON
#   bad-frame   TEXT (no such event for a transcription)
#   many        120 TRANSCRIPTs of 1 s, DONE
#   hang        never reads the audio nor answers
#   else        the two segments of @FAKE_SEGMENTS (words only with
#               "words": true), DONE with input_audio_ms 11000
#
# A chat request with audio in reads its audio, then is answered as any
# other (its last message's text parts joined pick the answer; "err-early"
# is the ERROR above with the input's param), with input_audio_ms 11000.
#
# HEALTH gets 503 "warming up: loading the model" (or 200 "ready" when
# the socket path contains "ready"), MODELS one model "fake-model",
# METRICS one line "fake_engine_metric 42".
#
#   my $pid = fake_engine_start($path);  ...  fake_engine_stop($pid);
#   my $rec = fake_engine_record($path);   # the last request's, or undef
package t::lib::FakeEngine;

use strict;
use warnings;

use Exporter 'import';
use IO::Socket::UNIX;
use JSON::PP;
use POSIX qw(_exit WNOHANG);
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(sleep);

# OMNI_PROTO_VERSION, from the header the engine and the module include.
my $VERSION = do {
    open(my $h, '<', 'engine/proto/omni_proto.h') or die "engine/proto/omni_proto.h: $!\n";
    my ($v) = join('', <$h>) =~ /#define OMNI_PROTO_VERSION\s+(\d+)/;
    $v // die "no OMNI_PROTO_VERSION in engine/proto/omni_proto.h\n";
};

our @EXPORT = qw(fake_engine_start fake_engine_stop fake_audio
                 fake_engine_record fake_engine_forget @FAKE_SLICES
                 @FAKE_SEGMENTS);

# The default transcription: two utterances, as the listener sends them.
our @FAKE_SEGMENTS = (
    { input => 0, text => 'and so my fellow americans', start => 0.32,
      end => 2.71, avg_logprob => -0.41,
      words => [map { { word => $_->[0], start => $_->[1], end => $_->[2] } }
                ['and', 0.32, 0.45], ['so', 0.45, 0.6], ['my', 0.6, 0.8],
                ['fellow', 0.8, 1.1], ['americans', 1.1, 2.71]] },
    { input => 0, text => 'ask not what your country can do for you',
      start => 3.5, end => 65.905, avg_logprob => -0.2,
      words => [map { { word => $_->[0], start => $_->[1], end => $_->[2] } }
                ['ask', 3.5, 3.8], ['not', 3.8, 4.1], ['what', 4.1, 4.3],
                ['your', 4.3, 4.5], ['country', 4.5, 5.0],
                ['can', 5.0, 5.2], ['do', 5.2, 5.4], ['for', 5.4, 5.6],
                ['you', 5.6, 65.905]] },
);

# The slices the default answer cuts its audio into: odd sizes, so that
# chat's 6-byte pieces need the carry; the rest goes in the last one.
our @FAKE_SLICES = (7, 1, 4096);

# The default answer's audio for a format: a WAV header as a streaming
# encoder writes it (both sizes 0xFFFFFFFF) and samples, or bytes that
# name the format.
sub fake_audio {
    my ($format) = @_;
    my $body = join('', map { pack('v', ($_ * 37) & 0xffff) } 0 .. 4999);
    return $body if $format eq 'pcm';
    return 'RIFF' . pack('V', 0xffffffff) . 'WAVEfmt '
           . pack('V v v V V v v', 16, 1, 1, 24000, 48000, 2, 16)
           . 'data' . pack('V', 0xffffffff) . $body if $format eq 'wav';
    return "FAKE-$format:" . $body;
}

my %started;

sub frame {
    my ($type, $p) = @_;
    return pack('V C C v', length $p, $type, $VERSION, 0) . $p;
}

sub error_frame {
    my ($status, $type, $param, $code, $msg) = @_;
    return frame(19, pack('v', $status)
                     . join('', map { pack('v', length) . $_ }
                                    $type, $param, $code, $msg));
}

# DONE (protocol v5, OMNI_DONE_LEN 40 bytes): prompt_tokens 3 (or
# $prompt), cached 0, completion, finish, seed 0, audio_tokens, audio_ms,
# input_audio_ms, reasoning_tokens.
sub done_frame {
    my ($completion, $finish, $audio_tokens, $audio_ms, $input_ms,
        $prompt, $reasoning) = @_;
    return frame(18, pack('V V V C x3 Q< V V V V', $prompt // 3, 0,
                          $completion, $finish // 0, 0, $audio_tokens // 0,
                          $audio_ms // 0, $input_ms // 0, $reasoning // 0));
}

sub audio_frames {
    my ($bytes) = @_;
    my @f;
    for my $n (@FAKE_SLICES) {
        last unless length $bytes;
        push @f, frame(17, substr($bytes, 0, $n, ''));
    }
    push @f, frame(17, substr($bytes, 0, 65536, '')) while length $bytes;
    return join('', @f);
}

sub speak {
    my ($req, $p, $out) = @_;
    my $speech = defined $req->{input};
    my $what = $speech ? $req->{input} : ($req->{messages}[-1]{content} // '');
    my $fmt = $req->{audio}{format} // 'mp3';
    if ($what eq 'echo') {
        $out->($speech ? frame(17, $p)
               : frame(16, $p) . frame(17, 'abcdef'));
        $out->(done_frame(1, 0, 1, 1));
    } elsif ($what eq 'slow-audio') {
        $out->(frame(17, 'first'));
        sleep 1;
        $out->(frame(17, 'second') . done_frame(1, 0, 2, 2));
    } elsif ($what eq 'audio-error') {
        $out->(frame(17, 'abc'));
        sleep 0.05;
        $out->(error_frame(503, 'server_error', '', 'stage_failed',
                           'the voicebox stage died'));
    } elsif ($what eq 'audio-close') {
        $out->(frame(17, 'abc'));
        sleep 0.05;
    } elsif ($what eq 'audio-first') {
        $out->(frame(17, 'abcdef') . frame(16, 'x') . done_frame(1, 0, 1, 1));
    } elsif ($what eq 'voice-error') {
        $out->(error_frame(400, 'invalid_request_error', 'audio.voice',
                           'invalid_value', "Unknown voice 'nobody'."));
    } elsif ($what eq 'big-audio') {
        my $slice = 'x' x 65536;
        for (1 .. 17 * 16) {
            $out->(frame(17, $slice)) or return;
        }
        $out->(done_frame(1, 0, 1, 1));
    } else {
        $out->(frame(16, 'Hel')) unless $speech;
        $out->(audio_frames(fake_audio($fmt eq 'pcm16' ? 'pcm' : $fmt)));
        $out->(frame(16, 'lo')) unless $speech;
        $out->(done_frame(2, 0, 5, 250));
    }
}

sub read_n {
    my ($c, $n) = @_;
    my $buf = '';
    while (length $buf < $n) {
        my $got = sysread($c, $buf, $n - length $buf, length $buf);
        return undef unless $got;
    }
    return $buf;
}

sub serve {
    my ($c, $path) = @_;
    my $hdr = read_n($c, 8) // return;
    my ($len, $type) = unpack('V C', $hdr);
    my $p = $len ? read_n($c, $len) // return : '';
    my $out = sub { syswrite($c, $_[0]) };
    if ($type == 2) {
        $out->($path =~ /ready/ ? frame(20, pack('v', 200) . 'ready')
               : frame(20, pack('v', 503) . 'warming up: loading the model'));
        return;
    }
    if ($type == 3) {
        $out->(frame(21, encode_json({ data => [{ id => 'fake-model',
            created => 1700000000, owned_by => 'ngx_omni',
            max_model_len => 512 }] })));
        return;
    }
    if ($type == 4) {
        $out->(frame(22, "# HELP fake_engine_metric x\n"
                         . "# TYPE fake_engine_metric gauge\n"
                         . "fake_engine_metric 42\n"));
        return;
    }
    return unless $type == 1;
    my $req = eval { decode_json($p) } // {};
    if (ref $req->{audio_in} eq 'ARRAY') {
        return listen_in($c, $path, $req, $p, $out);
    }
    return speak($req, $p, $out) if ref $req->{audio} eq 'HASH';
    my $what = $req->{prompt} // '';
    if (ref $req->{messages} eq 'ARRAY' && @{ $req->{messages} }) {
        $what = $req->{messages}[-1]{content} // '';
    }
    if ($what eq 'hang') {
        read_n($c, 1);                      # until nginx gives up
    } elsif ($what eq 'slow') {
        for my $t (qw(a b c)) {
            $out->(frame(16, $t));
            sleep 0.35 unless $t eq 'c';
        }
        $out->(done_frame(3));
    } elsif ($what eq 'error-after-text') {
        $out->(frame(16, 'Hello') . frame(16, ' world'));
        sleep 0.05;
        $out->(error_frame(503, 'server_error', '', 'stage_failed',
                           'the thinker stage died'));
    } elsif ($what eq 'close-after-text') {
        $out->(frame(16, 'Hello'));
        sleep 0.05;
    } elsif ($what eq 'bad-frame') {
        $out->(pack('V C C v', 5, 99, $VERSION, 0) . 'xxxxx');
        sleep 0.05;
    } elsif ($what eq 'bad-frame-after-text') {
        $out->(frame(16, 'Hello'));
        sleep 0.05;
        $out->(pack('V C C v', 5, 99, $VERSION, 0) . 'xxxxx');
        sleep 0.05;
    } elsif ($what eq 'overloaded') {
        $out->(error_frame(503, 'server_error', '', 'overloaded',
                           'The engine is overloaded.'));
    } elsif ($what eq 'bad-utf8') {
        $out->(frame(16, "ok \xff end") . done_frame(1));
    } elsif ($what eq 'escapes') {
        $out->(frame(16, qq{q"b\\s/n\nt\tc\x01 \xe2\x82\xac}) . done_frame(1));
    } elsif ($what eq 'think') {
        $out->(frame(24, 'Let me') . frame(24, ' see.'));
        sleep 0.05;
        $out->(frame(16, 'It is') . frame(16, ' 4.')
               . done_frame(9, 0, 0, 0, 0, undef, 6));
    } elsif ($what eq 'think-length') {
        $out->(frame(24, 'Still') . frame(24, ' thinking')
               . done_frame(4, 1, 0, 0, 0, undef, 4));
    } elsif ($what eq 'think-echo') {
        $out->(frame(16, $p) . done_frame(1));
    } else {
        $out->(frame(16, 'fake') . done_frame(1));
    }
}

# The audio of a request: at least $want bytes in AUDIO_IN frames, each
# checked, $total (default $want) in all at most. Returns (bytes, [frame
# sizes], [mistakes]); stops early at EOF.
sub read_audio {
    my ($c, $want, $total) = @_;
    $total //= $want;
    my ($audio, @sizes, @bad) = ('');
    while (length $audio < $want) {
        my $h = read_n($c, 8) // do { push @bad, 'EOF in the audio'; last };
        my ($len, $type, $ver, $flags) = unpack('V C C v', $h);
        push @bad, "frame type $type" if $type != 5;
        push @bad, "version $ver" if $ver != $VERSION;
        push @bad, "flags $flags" if $flags;
        push @bad, "frame of $len bytes" if $len < 1 || $len > 65536;
        push @bad, "more bytes than audio_in says"
            if length($audio) + $len > $total;
        last if $len > 65536;
        my $d = $len ? read_n($c, $len) : '';
        defined $d or do { push @bad, 'EOF in a frame'; last };
        push @sizes, $len;
        $audio .= $d;
    }
    return ($audio, \@sizes, \@bad);
}

sub record {
    my ($path, $json, $audio, $sizes, $bad) = @_;
    my $dir = "$path.rec";
    my $tmp = "$dir/tmp.$$";
    open(my $f, '>', $tmp) or return;
    binmode $f;
    print $f JSON::PP->new->utf8->canonical->encode({
        json => $json, frames => $sizes, bad => $bad,
        audio_len => length $audio });
    close $f;
    open($f, '>', "$tmp.audio") or return;
    binmode $f;
    print $f $audio;
    close $f;
    rename("$tmp.audio", "$dir/last.audio");
    rename($tmp, "$dir/last.json");
}

# What the fake received for the last request with audio in: { json =>
# the REQUEST payload (bytes), req => it decoded, audio => the bytes,
# frames => [sizes], bad => [mistakes] }, or undef.
sub fake_engine_record {
    my ($path) = @_;
    open(my $f, '<', "$path.rec/last.json") or return undef;
    my $r = decode_json(join('', <$f>));
    close $f;
    open($f, '<', "$path.rec/last.audio") or return undef;
    binmode $f;
    $r->{audio} = join('', <$f>);
    close $f;
    $r->{req} = eval { JSON::PP->new->utf8->decode($r->{json}) };
    return $r;
}

sub fake_engine_forget {
    my ($path) = @_;
    unlink "$path.rec/last.json", "$path.rec/last.audio";
}

sub transcript_frame {
    my ($seg, $words) = @_;
    my %s = %$seg;
    delete $s{words} unless $words;
    return frame(23, JSON::PP->new->utf8->canonical->encode(\%s));
}

# A request with "audio_in": its audio read and recorded, then the answer.
sub listen_in {
    my ($c, $path, $req, $p, $out) = @_;
    my $want = 0;
    $want += $_->{bytes} // 0 for @{ $req->{audio_in} };
    my $tr = ref $req->{transcribe} eq 'HASH' ? $req->{transcribe} : undef;
    my $what;
    if ($tr) {
        ($what) = split ' ', ($tr->{prompt} // '');
    } else {
        my $content = $req->{messages}[-1]{content};
        $what = ref $content eq 'ARRAY'
                ? join('', map { $_->{text} // '' }
                           grep { ($_->{type} // '') eq 'text' } @$content)
                : $content;
    }
    $what //= '';
    my $param = $req->{audio_in}[0]{param} // '';
    if ($what eq 'err-early') {
        record($path, $p, '', [], []);
        $out->(error_frame(400, 'invalid_request_error', $param,
                           'invalid_value', 'mp3: corrupt frame at byte 0'));
        return;
    }
    if ($what eq 'hang') {
        read_n($c, 1 << 30);
        return;
    }
    if (!$tr) {
        my ($audio, $sizes, $bad) = read_audio($c, $want);
        record($path, $p, $audio, $sizes, $bad);
        my $n = length $audio;
        $req->{messages}[-1]{content} = $what;
        if (ref $req->{audio} eq 'HASH') {
            $out->(frame(16, "heard $n bytes")
                   . audio_frames(fake_audio($req->{audio}{format} eq 'pcm'
                                             ? 'pcm' : $req->{audio}{format}))
                   . done_frame(3, 0, 5, 250, 11000, 7));
        } else {
            $out->(frame(16, "heard $n bytes") . done_frame(3, 0, 0, 0, 11000,
                                                            7));
        }
        return;
    }
    my $words = $tr->{words} ? 1 : 0;
    my $done = done_frame(0, 0, 0, 0, 11000, 0);
    if ($what eq 'err-mid') {
        my ($audio, $sizes, $bad) = read_audio($c, int($want / 2), $want);
        record($path, $p, $audio, $sizes, $bad);
        $out->(error_frame(400, 'invalid_request_error', $param,
                           'invalid_value',
                           'mp3: corrupt frame at byte 70311'));
        return;
    }
    if ($what eq 'err-shut') {
        my ($audio, $sizes, $bad) = read_audio($c, int($want / 3), $want);
        record($path, $p, $audio, $sizes, $bad);
        shutdown($c, 0);
        my $buf;
        1 while sysread($c, $buf, 65536);
        sleep 0.3;
        $out->(error_frame(400, 'invalid_request_error', $param,
                           'invalid_value',
                           'mp3: corrupt frame at byte 70311'));
        return;
    }
    if ($what eq 'midway') {
        my ($a1, $s1, $b1) = read_audio($c, int($want / 2), $want);
        $out->(transcript_frame($FAKE_SEGMENTS[0], $words));
        my ($a2, $s2, $b2) = read_audio($c, $want - length $a1);
        record($path, $p, $a1 . $a2, [@$s1, @$s2], [@$b1, @$b2]);
        $out->(transcript_frame($FAKE_SEGMENTS[1], $words) . $done);
        return;
    }
    my ($audio, $sizes, $bad) = read_audio($c, $want);
    record($path, $p, $audio, $sizes, $bad);
    if ($what eq 'webm') {
        $out->(error_frame(400, 'invalid_request_error', $param,
                           'invalid_value', 'webm is not supported: send '
                           . 'wav, mp3, flac or ogg opus'));
    } elsif ($what eq 'too-long') {
        $out->(error_frame(400, 'invalid_request_error', $param,
                           'invalid_value', 'the audio is longer than '
                           . "max_audio_seconds ($req->{max_audio_seconds} "
                           . 's)'));
    } elsif ($what eq 'err-late') {
        $out->(transcript_frame($FAKE_SEGMENTS[0], $words));
        sleep 0.05;
        $out->(error_frame(503, 'server_error', '', 'stage_failed',
                           'the listener stage died'));
    } elsif ($what eq 'close') {
        $out->(transcript_frame($FAKE_SEGMENTS[0], $words));
        sleep 0.05;
    } elsif ($what eq 'slow') {
        $out->(transcript_frame($FAKE_SEGMENTS[0], $words));
        sleep 0.5;
        $out->(transcript_frame($FAKE_SEGMENTS[1], $words) . $done);
    } elsif ($what eq 'empty') {
        $out->(done_frame(0, 0, 0, 0, 1500, 0));
    } elsif ($what eq 'escapes') {
        $out->(transcript_frame({ input => 0, start => 0, end => 1.5,
            avg_logprob => -1, text => "say \"hi\" \\ to\tme \x{e9}t\x{e9}",
            words => [] }, $words) . $done);
    } elsif ($what eq 'bad-json') {
        $out->(frame(23, '{"text": "x", "start": 0, "end"'));
    } elsif ($what eq 'bad-frame') {
        $out->(frame(16, 'text'));
    } elsif ($what eq 'many') {
        for my $i (0 .. 119) {
            $out->(transcript_frame({ input => 0, text => "segment $i",
                start => $i, end => $i + 0.9, avg_logprob => -0.5,
                words => [{ word => 'segment', start => $i,
                            end => $i + 0.5 }] }, $words));
        }
        $out->(done_frame(0, 0, 0, 0, 120000, 0));
    } else {
        $out->(join('', map { transcript_frame($_, $words) } @FAKE_SEGMENTS)
               . $done);
    }
}

sub fake_engine_start {
    my ($path) = @_;
    unlink $path;
    mkdir "$path.rec";
    my $l = IO::Socket::UNIX->new(Type => SOCK_STREAM, Local => $path,
                                  Listen => 128)
        or die "fake engine: $path: $!\n";
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        $SIG{CHLD} = 'IGNORE';
        $SIG{PIPE} = 'IGNORE';
        $SIG{$_} = 'DEFAULT' for qw(TERM INT);   # no END blocks here
        while (1) {
            my $c = $l->accept or next;
            my $k = fork();
            if (defined $k && $k == 0) {
                close $l;
                serve($c, $path);
                close $c;
                _exit(0);
            }
            close $c;
        }
    }
    close $l;
    $started{$pid} = $$;
    return $pid;
}

sub fake_engine_stop {
    my ($pid) = @_;
    return unless $pid && delete $started{$pid};
    kill 'TERM', $pid;
    waitpid($pid, 0);
}

END {
    local $?;                   # waitpid's status is not the test's
    for my $pid (keys %started) {
        fake_engine_stop($pid) if $started{$pid} == $$;
    }
}

1;

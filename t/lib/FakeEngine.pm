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
# HEALTH gets 503 "warming up: loading the model" (or 200 "ready" when
# the socket path contains "ready"), MODELS one model "fake-model",
# METRICS one line "fake_engine_metric 42".
#
#   my $pid = fake_engine_start($path);  ...  fake_engine_stop($pid);
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
                 @FAKE_SLICES);

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

# DONE (protocol v4, OMNI_DONE_LEN 40 bytes): prompt_tokens 3 (or
# $prompt), cached 0, completion, finish, seed 0, audio_tokens, audio_ms,
# input_audio_ms, a zero word.
sub done_frame {
    my ($completion, $finish, $audio_tokens, $audio_ms, $input_ms,
        $prompt) = @_;
    return frame(18, pack('V V V C x3 Q< V V V V', $prompt // 3, 0,
                          $completion, $finish // 0, 0, $audio_tokens // 0,
                          $audio_ms // 0, $input_ms // 0, 0));
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
    } else {
        $out->(frame(16, 'fake') . done_frame(1));
    }
}

sub fake_engine_start {
    my ($path) = @_;
    unlink $path;
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

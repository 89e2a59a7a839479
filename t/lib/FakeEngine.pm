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

our @EXPORT = qw(fake_engine_start fake_engine_stop);

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

sub done_frame {
    my ($completion, $finish) = @_;
    return frame(18, pack('V V V C x3 Q< V V', 3, 0, $completion,
                          $finish // 0, 0, 0, 0));
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
    for my $pid (keys %started) {
        fake_engine_stop($pid) if $started{$pid} == $$;
    }
}

1;

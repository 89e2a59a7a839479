# Helpers for tests that talk to `omni-engine serve` over the wire protocol
# (engine/proto/omni_proto.h): start and stop an engine, send frames, read
# replies, run many requests at once, read metrics.
#
# A reply is a hash:
#   { frames => [[type, payload], ...], text => '...',
#     done  => { prompt_tokens, cached_tokens, completion_tokens, finish,
#                seed },
#     error => { status, type, param, code, message },
#     eof   => 1 when the engine closed the connection after its frames }
use strict;
use warnings;
use IO::Select;
use IO::Socket::UNIX;
use JSON::PP;
use POSIX qw(WNOHANG);
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(time sleep);
require './t/engine/lib.pl';
our ($ENGINE, $MODEL, $TMP);

our %F = (REQUEST => 1, HEALTH => 2, MODELS => 3, METRICS => 4,
          AUDIO_IN => 5, TEXT => 16, AUDIO => 17, DONE => 18, ERROR => 19,
          HEALTH_R => 20, MODELS_R => 21, METRICS_R => 22,
          TRANSCRIPT => 23, REASONING => 24);
our @FINISH = ('stop', 'length');

# OMNI_PROTO_VERSION, read from the header both sides include.
our $VERSION = do {
    open(my $h, '<', 'engine/proto/omni_proto.h') or die "engine/proto/omni_proto.h: $!\n";
    my ($v) = join('', <$h>) =~ /#define OMNI_PROTO_VERSION\s+(\d+)/;
    $v // die "no OMNI_PROTO_VERSION in engine/proto/omni_proto.h\n";
};

my $n_servers = 0;

# frame(type, payload, version => $VERSION, flags => 0,
#       len => length(payload))
sub frame {
    my ($type, $payload, %o) = @_;
    $payload //= '';
    return pack('V C C v', $o{len} // length($payload), $type,
                $o{version} // $VERSION, $o{flags} // 0) . $payload;
}

# Starts `omni-engine serve` on a fresh socket with the model and one
# thread; extra serve options in @args. Waits for health 200 unless
# no_wait. Returns { pid, socket, log }.
sub serve_start {
    my (%o) = @_;
    my @args = @{ $o{args} // [] };
    my $sock = $o{socket} // "$TMP/engine-" . ++$n_servers . ".sock";
    my $log = "$TMP/engine-$n_servers.log";
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        open(STDOUT, '>>', $log) or die;
        open(STDERR, '>>', $log) or die;
        exec($ENGINE, 'serve', '--model', $o{model} // $MODEL, '--socket',
             $sock, '--threads', 1, @args) or exit 127;
    }
    my $srv = { pid => $pid, socket => $sock, log => $log };
    return $srv if $o{no_wait};
    wait_health($srv, 200, $o{timeout} // 30)
        or die "engine did not become ready:\n" . slurp($log);
    return $srv;
}

# Polls health until it answers want (or, with want undef, any answer);
# returns the [status, reason] seen last, or undef on timeout.
sub wait_health {
    my ($srv, $want, $timeout) = @_;
    my $until = time + ($timeout // 30);
    while (time < $until) {
        my @h = health($srv);
        return \@h if @h && (!defined $want || $h[0] == $want);
        sleep 0.01;
    }
    return undef;
}

# SIGTERM, then waits (timeout s). Returns the exit status (as $?), or
# undef when it did not exit (it is killed then).
sub serve_stop {
    my ($srv, $timeout) = @_;
    kill 'TERM', $srv->{pid};
    return serve_wait($srv, $timeout // 40);
}

sub serve_wait {
    my ($srv, $timeout) = @_;
    my $until = time + $timeout;
    while (time < $until) {
        return $? if waitpid($srv->{pid}, WNOHANG) == $srv->{pid};
        sleep 0.02;
    }
    kill 'KILL', $srv->{pid};
    waitpid($srv->{pid}, 0);
    return undef;
}

# The pid of a stage process (the thinker unless $kind names another): the
# frontend's child whose command line is `omni-engine stage KIND ...`.
sub stage_pid {
    my ($srv, $kind) = @_;
    $kind //= 'thinker';
    my $f = "/proc/$srv->{pid}/task/$srv->{pid}/children";
    my @pids = split ' ', (-r $f ? slurp($f) : `ps -o pid= --ppid $srv->{pid}`);
    for my $pid (@pids) {
        return $pid if slurp("/proc/$pid/cmdline") =~ /\0stage\0\Q$kind\E\0/;
    }
    return undef;
}

sub slurp {
    my ($path) = @_;
    open(my $fh, '<', $path) or return '';
    local $/;
    return <$fh> // '';
}

sub engine_connect {
    my ($srv) = @_;
    return IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $srv->{socket});
}

# Splits whole frames off the front of $$buf; returns [type, payload]s.
sub take_frames {
    my ($buf) = @_;
    my @frames;
    while (length($$buf) >= 8) {
        my ($len, $type) = unpack('V C', $$buf);
        last if length($$buf) < 8 + $len;
        push @frames, [$type, substr($$buf, 8, $len)];
        substr($$buf, 0, 8 + $len) = '';
    }
    return @frames;
}

sub decode_error {
    my ($p) = @_;
    my ($status, $rest) = unpack('v a*', $p);
    my @s;
    for (1 .. 4) {
        my ($n) = unpack('v', $rest);
        push @s, substr($rest, 2, $n);
        $rest = substr($rest, 2 + $n);
    }
    return { status => $status, type => $s[0], param => $s[1],
             code => $s[2], message => $s[3] };
}

# Folds frames into the reply hash.
sub add_frames {
    my ($r, @frames) = @_;
    for my $f (@frames) {
        my ($type, $p) = @$f;
        push @{ $r->{frames} }, $f;
        if ($type == $F{TEXT}) {
            $r->{text} .= $p;
        } elsif ($type == $F{REASONING}) {
            $r->{reasoning} .= $p;
        } elsif ($type == $F{AUDIO}) {
            $r->{audio} .= $p;
        } elsif ($type == $F{DONE}) {
            my @u = unpack('V V V C x3 Q< V V V V', $p);
            $r->{done} = { prompt_tokens => $u[0], cached_tokens => $u[1],
                           completion_tokens => $u[2],
                           finish => $FINISH[$u[3]] // $u[3], seed => $u[4],
                           audio_tokens => $u[5], audio_ms => $u[6],
                           input_audio_ms => $u[7],
                           reasoning_tokens => $u[8] };
        } elsif ($type == $F{TRANSCRIPT}) {
            push @{ $r->{transcripts} }, decode_json($p);
        } elsif ($type == $F{ERROR}) {
            $r->{error} = decode_error($p);
        }
    }
}

sub new_reply {
    return { frames => [], text => '', reasoning => '', audio => '',
             buf => '' };
}

# Sends raw bytes on a new connection and reads until the engine closes.
# shutdown => 1 closes our writing side after sending.
sub send_raw {
    my ($srv, $bytes, %o) = @_;
    my $s = engine_connect($srv) or return undef;
    my $r = new_reply();
    $s->syswrite($bytes) if length $bytes;
    shutdown($s, 1) if $o{shutdown};
    my $sel = IO::Select->new($s);
    my $until = time + ($o{timeout} // 60);
    while (time < $until) {
        next unless $sel->can_read(0.5);
        my $n = $s->sysread(my $chunk, 65536);
        last if !$n;                        # EOF, or a reset after the reply
        $r->{buf} .= $chunk;
        add_frames($r, take_frames(\$r->{buf}));
    }
    $r->{eof} = 1 if time < $until;
    close $s;
    return $r;
}

sub request {
    my ($srv, $req, %o) = @_;
    return send_raw($srv, frame($F{REQUEST}, encode_json($req)), %o);
}

# The frames of a request with audio input: REQUEST (with "audio_in"
# filled in from @$files when the request has none), then the files'
# bytes in AUDIO_IN frames of at most 64 KiB.
sub audio_frames {
    my ($req, $files) = @_;
    my %r = %$req;
    $r{audio_in} //= [ map { { format => 'auto', bytes => length $_ } }
                       @$files ];
    my $out = frame($F{REQUEST}, encode_json(\%r));
    my $all = join('', @$files);
    for (my $at = 0; $at < length $all; $at += 65536) {
        $out .= frame($F{AUDIO_IN}, substr($all, $at, 65536));
    }
    return $out;
}

# request() with audio input: $files the bytes of each input.
sub request_audio {
    my ($srv, $req, $files, %o) = @_;
    local $SIG{PIPE} = 'IGNORE';
    return send_raw($srv, audio_frames($req, $files), %o);
}

# The transcript of a reply: its TRANSCRIPT segments' texts joined.
sub transcript_text {
    my ($r) = @_;
    return join(' ', map { $_->{text} } @{ $r->{transcripts} // [] });
}

# (status, reason), or () when nothing answers.
sub health {
    my ($srv) = @_;
    my $r = send_raw($srv, frame($F{HEALTH}, ''), timeout => 5) or return ();
    my ($f) = @{ $r->{frames} };
    return () unless $f && $f->[0] == $F{HEALTH_R};
    return unpack('v a*', $f->[1]);
}

sub models {
    my ($srv) = @_;
    my $r = send_raw($srv, frame($F{MODELS}, ''));
    return decode_json($r->{frames}[0][1]);
}

# { 'name' or 'name{labels}' => value } plus _text => the exposition.
sub metrics {
    my ($srv) = @_;
    my $r = send_raw($srv, frame($F{METRICS}, ''));
    my $text = $r->{frames}[0][1] // '';
    my %m = (_text => $text);
    for (split /\n/, $text) {
        next if /^#/;
        my ($k, $v) = /^(\S+) (\S+)$/ or next;
        $m{$k} = $v;
    }
    return \%m;
}

# Runs every request (hashes) on its own connection, reading them all with
# IO::Select; request i starts at i * gap seconds (gap 0 by default: all at
# once). on_read, when given, is called with the reply list after each
# read; it may return 'close:<i>' to close request i early (a cancel).
# Returns the replies in order.
sub run_concurrent {
    my ($srv, $reqs, %o) = @_;
    my (@socks, @replies, %idx);
    my $sel = IO::Select->new;
    my $gap = $o{gap} // 0;
    my $t0 = time;
    my $until = $t0 + ($o{timeout} // 120);
    while ((@socks < @$reqs || $sel->count) && time < $until) {
        while (@socks < @$reqs && time >= $t0 + @socks * $gap) {
            my $i = @socks;
            my $s = engine_connect($srv) or die "connect: $!";
            local $SIG{PIPE} = 'IGNORE';
            # a request, or [request, [audio input bytes...]]
            $s->syswrite(ref $reqs->[$i] eq 'ARRAY'
                         ? audio_frames(@{ $reqs->[$i] })
                         : frame($F{REQUEST}, encode_json($reqs->[$i])));
            $s->blocking(0);
            push @socks, $s;
            push @replies, new_reply();
            $idx{fileno $s} = $i;
            $sel->add($s);
        }
        for my $s ($sel->can_read(@socks < @$reqs ? 0.002 : 0.5)) {
            my $i = $idx{fileno $s};
            my $n = $s->sysread(my $chunk, 65536);
            next if !defined $n && $!{EAGAIN};
            if (!$n) {
                $replies[$i]{eof} = 1;
                $sel->remove($s);
                close $s;
                next;
            }
            $replies[$i]{buf} .= $chunk;
            add_frames($replies[$i], take_frames(\$replies[$i]{buf}));
        }
        next unless $o{on_read};
        for my $act ($o{on_read}->(\@replies)) {
            next unless defined $act && $act =~ /^close:(\d+)$/;
            $sel->remove($socks[$1]);
            close $socks[$1];
            $replies[$1]{closed} = 1;
        }
    }
    return @replies;
}

1;

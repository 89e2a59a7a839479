# omni-engine serve: the shutdown drain and --replace, by hand (nginx's
# omni_engine uses both; t/reload.t covers them through nginx).
#
#   - SIGTERM with connections queued in the listen backlog (the engine is
#     stopped with SIGSTOP while they connect): each is accepted and
#     served, none is reset; the socket file is removed.
#   - --replace beside a live engine: the new one binds <socket>.next and
#     locks <lock>.next, and once ready renames both over the public names;
#     from then on a connection reaches it even while the old engine is
#     stopped; the old one, sent SIGTERM, leaves the socket file (no longer
#     its own) in place, serves what was queued on it and its stream in
#     flight, and exits 0.
#   - a second --replace while one is starting is refused; a candidate
#     stopped before it is ready (SIGTERM, or SIGUSR2, which a live engine
#     ignores) removes its private socket and leaves the live engine alone;
#     --replace needs --lock-file; the socket is 0660.
#   - a drain waits for a request frame still arriving when SIGTERM comes.
use strict;
use warnings;
use lib '.';
use IO::Select;
use IO::Socket::UNIX;
use JSON::PP;
use Socket qw(SOCK_STREAM);
use Test::More;
use Time::HiRes qw(time sleep);
use t::lib::Proc qw(lock_holder wait_for);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F);

my $PROMPT = 'Once upon a time';

sub holder { return lock_holder(shift) }

# Connects n clients to path and sends each a REQUEST; returns the sockets.
sub queue_requests {
    my ($path, $n, $req) = @_;
    my @s;
    for (1 .. $n) {
        my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path)
            or die "connect $path: $!";
        $s->syswrite(frame($F{REQUEST}, encode_json($req)));
        push @s, $s;
    }
    return @s;
}

# Reads every socket to EOF (or a reset); returns the replies.
sub read_replies {
    my (@socks) = @_;
    my @r = map { new_reply() } @socks;
    my %idx = map { (fileno($socks[$_]) => $_) } 0 .. $#socks;
    my $sel = IO::Select->new(@socks);
    my $until = time + 60;
    while ($sel->count && time < $until) {
        for my $s ($sel->can_read(0.5)) {
            my $i = $idx{fileno $s};
            my $n = $s->sysread(my $chunk, 65536);
            if (!$n) {
                $r[$i]{eof} = 1;
                $r[$i]{reset} = 1 unless defined $n;
                $sel->remove($s);
                next;
            }
            $r[$i]{buf} .= $chunk;
            add_frames($r[$i], take_frames(\$r[$i]{buf}));
        }
    }
    return @r;
}

sub all_done {
    my ($name, @r) = @_;
    my @bad = grep { !$_->{done} } @r;
    is(scalar(@bad), 0, "$name: all " . scalar(@r) . " answered with DONE")
        or diag explain [map { $_->{error} // { reset => $_->{reset} } }
                         @bad];
}

my $short = { prompt => $PROMPT, max_tokens => 8, temperature => 0 };

# --- SIGTERM with requests queued in the backlog ---------------------------
{
    my $srv = serve_start();
    kill 'STOP', $srv->{pid};
    my @s = queue_requests($srv->{socket}, 6, $short);
    kill 'TERM', $srv->{pid};
    kill 'CONT', $srv->{pid};
    all_done('SIGTERM, queued', read_replies(@s));
    is(serve_wait($srv, 30), 0, 'SIGTERM, queued: exit 0');
    ok(!-e $srv->{socket}, 'SIGTERM, queued: socket removed');
}

# --- --replace --------------------------------------------------------------
{
    my $sock = "$TMP/live.sock";
    my $lock = "$TMP/live.lock";
    my $mask = umask 0;                 # the engine's own umask decides
    my $old = serve_start(socket => $sock, args => ['--lock-file', $lock]);
    umask $mask;
    is(holder($lock), $old->{pid}, 'the first engine holds the lock');
    is((stat $sock)[2] & 0777, 0660, 'its socket is 0660 under umask 0');
    my $ino = (stat $sock)[1];

    # a stream in flight on the old engine
    my ($stream) = queue_requests($sock, 1, {
        prompt => $PROMPT, max_tokens => 300, ignore_eos => JSON::PP::true,
        temperature => 0 });
    my $buf = '';
    $stream->sysread($buf, 65536, length $buf) until length($buf) > 8;

    # while it is stopped, requests queue at its socket and the new engine
    # starts and takes over (its SIGTERM waits for SIGCONT)
    kill 'STOP', $old->{pid};
    my @queued = queue_requests($sock, 4, $short);
    my $new = serve_start(socket => $sock, no_wait => 1,
                          args => ['--lock-file', $lock, '--replace']);
    ok(wait_for(30, sub { holder($lock) == $new->{pid} }),
       'replace: the new engine holds the lock');
    isnt((stat $sock)[1], $ino, 'replace: the socket path is the new one\'s');
    ok(!-e "$sock.next" && !-e "$lock.next",
       'replace: the private names are gone (renamed)');
    is_deeply([health({ socket => $sock })], [200, 'ready'],
              'replace: a new connection is served by the new engine');
    like(slurp($new->{log}), qr/starting beside it.*serving on \Q$sock\E in (?#
         )place of pid $old->{pid}/s, 'replace: its log says so');

    kill 'CONT', $old->{pid};
    all_done('replace, queued at the old engine', read_replies(@queued));
    my ($r) = read_replies($stream);
    $r->{buf} = $buf . $r->{buf};
    add_frames($r, take_frames(\$r->{buf}));
    is($r->{done} && $r->{done}{completion_tokens}, 300,
       'replace: the old engine\'s stream finished');
    is(serve_wait($old, 30), 0, 'replace: the old engine exits 0');
    like(slurp($old->{log}), qr/\Q$sock\E is another engine's socket now; (?#
         )left in place/, 'replace: it left the socket alone');
    ok(-S $sock, 'replace: the socket file is still there');
    my $after = request({ socket => $sock }, $short);
    ok($after->{done}, 'replace: the new engine serves');

    # one replacement at a time; one that is stopped leaves no trace
    my $cand = serve_start(socket => $sock, model => "$TMP/missing.gguf",
                           no_wait => 1,
                           args => ['--lock-file', $lock, '--replace']);
    ok(wait_for(30, sub { holder("$lock.next") == $cand->{pid} }),
       'a candidate that cannot load holds the .next lock');
    ok(wait_for(10, sub { -S "$sock.next" }), 'and binds <socket>.next');
    my ($rc, undef, $err) = run_engine('serve', '--model', $MODEL,
        '--socket', $sock, '--threads', 1, '--lock-file', $lock,
        '--replace');
    is($rc, 1, 'a second --replace exits 1');
    like($err, qr/another replacement is starting: another engine (?#
         )\(pid $cand->{pid}\) holds \Q$lock\E\.next/, 'naming the first');
    is(serve_stop($cand, 30), 0, 'the candidate stops on SIGTERM');
    ok(!-e "$sock.next", 'removing its private socket');
    is(holder($lock), $new->{pid}, 'the live engine keeps the lock');
    is_deeply([health({ socket => $sock })], [200, 'ready'],
              'and keeps serving');

    # SIGUSR2, "give up the replacement" (nginx stops candidates with it,
    # so a stop that crosses a takeover cannot reach the live engine): a
    # candidate obeys, a live engine ignores it
    $cand = serve_start(socket => $sock, model => "$TMP/missing.gguf",
                        no_wait => 1,
                        args => ['--lock-file', $lock, '--replace']);
    ok(wait_for(30, sub { holder("$lock.next") == $cand->{pid} }),
       'SIGUSR2: a candidate is starting');
    kill 'USR2', $cand->{pid};
    is(serve_wait($cand, 30), 0, 'SIGUSR2: the candidate exits 0');
    like(slurp($cand->{log}), qr/told to give up the replacement/,
         'SIGUSR2: its log says why');
    ok(!-e "$sock.next", 'SIGUSR2: its private socket is gone');
    kill 'USR2', $new->{pid};
    sleep 0.3;
    is_deeply([health({ socket => $sock })], [200, 'ready'],
              'SIGUSR2: the live engine ignores it and keeps serving');
    like(slurp($new->{log}), qr/SIGUSR2 ignored: this engine is live/,
         'SIGUSR2: the live engine logs that it ignored it');
    is(holder($lock), $new->{pid}, 'SIGUSR2: it keeps the lock');

    local $SIG{PIPE} = 'IGNORE';     # a closed socket fails the write below
    # a drain waits for a request still arriving: half a frame is on the
    # socket when SIGTERM comes, the rest after; it is answered in full
    my $half = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $sock)
        or die "connect $sock: $!";
    my $f = frame($F{REQUEST}, encode_json({ %$short,
                                             user => 'x' x 300000 }));
    my $cut = int(length($f) / 2);
    $half->syswrite(substr($f, 0, $cut)) == $cut or die "short write";
    sleep 0.3;                          # the engine has read the half
    kill 'TERM', $new->{pid};
    sleep 0.5;                          # it is draining now
    my $rest = substr($f, $cut);
    while (length $rest) {
        my $n = $half->syswrite($rest) // die "write: $!";
        substr($rest, 0, $n) = '';
    }
    my ($r2) = read_replies($half);
    ok($r2->{done}, 'drain: a frame that arrives while draining is served')
        or diag explain $r2->{error} // { reset => $r2->{reset} };
    is(serve_wait($new, 30), 0, 'drain: then the engine exits 0');
    ok(!-e $sock, 'drain: and removes the socket, its own');

    ($rc, undef, $err) = run_engine('serve', '--model', $MODEL,
        '--socket', "$TMP/x.sock", '--replace');
    is($rc, 1, '--replace without --lock-file exits 1');
    like($err, qr/'--replace' needs '--lock-file'/, 'saying why');

}

done_testing();

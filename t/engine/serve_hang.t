# A hung thinker stage (SIGSTOP) is not ready, and is killed and restarted:
# health and metrics say so within --stage-unready-after, requests in
# flight end with 503 stage_failed when --stage-kill-after passes, new
# requests are refused meanwhile, and afterwards everything is served
# again. A stage that resumes (SIGCONT) before the kill is ready again
# without a restart. Times are short here (1 s and 4 s); every bound below
# leaves seconds of slack for a loaded machine.
use strict;
use warnings;
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F);

my ($UNREADY, $KILL) = (1, 4);
my $srv = serve_start(args => ['--stage-unready-after', $UNREADY,
                               '--stage-kill-after', $KILL]);

# Polls health until its status is $want; returns [seconds, reason].
sub health_within {
    my ($want, $timeout) = @_;
    my $t0 = time;
    while (time - $t0 < $timeout) {
        my @h = health($srv);
        return [time - $t0, $h[1]] if @h && $h[0] == $want;
        sleep 0.02;
    }
    return undef;
}

my $m0 = metrics($srv);
is($m0->{'omni_engine_stage_ready{stage="thinker"}'}, 1, 'ready at the start');
ok($m0->{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'} < $UNREADY,
   "heartbeat age " . $m0->{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'} . " s");
is($m0->{'omni_engine_stage_hang_kills_total{stage="thinker"}'}, 0, 'no hang kill yet');

# --- the idle stage beats: ready over several unready periods -------------
{
    my $bad = 0;
    for (1 .. 25) {
        my @h = health($srv);
        $bad++ unless @h && $h[0] == 200;
        sleep 0.1;
    }
    is($bad, 0, 'an idle stage stays ready for 2.5 s (beats while idle)');
}

# --- SIGSTOP, then SIGCONT before the kill: ready again, same process ----
{
    my $pid = stage_pid($srv);
    kill 'STOP', $pid;
    my $t0 = time;
    my $h = health_within(503, $UNREADY + 3);
    ok($h, 'stopped: health 503') or diag 'still ready';
    $h //= [0, ''];
    like($h->[1],
         qr/^the thinker stage \(pid $pid\) has been silent for [\d.]+ s/,
         "the reason names the stage and its silence: $h->[1]");
    ok(time - $t0 >= $UNREADY * 0.5, 'not before the unready time');
    my $m = metrics($srv);
    is($m->{'omni_engine_stage_ready{stage="thinker"}'}, 0, 'metrics: stage_ready 0');
    ok($m->{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'} >= $UNREADY,
       "metrics: heartbeat age " . $m->{'omni_engine_stage_heartbeat_age_seconds{stage="thinker"}'});
    my $r = request($srv, { prompt => 'Once', max_tokens => 4 }, timeout => 5);
    is($r->{error}{status}, 503, 'a new request: 503 at once');
    is($r->{error}{code}, 'engine_not_ready', '... engine_not_ready');
    like($r->{error}{message}, qr/has been silent/, '... saying why');

    kill 'CONT', $pid;
    ok(time - $t0 < $KILL, 'resumed before the kill time');
    ok(health_within(200, 3), 'SIGCONT: health 200 again');
    is(stage_pid($srv), $pid, 'the same process: no restart');
    my $m2 = metrics($srv);
    is($m2->{'omni_engine_stage_restarts_total{stage="thinker"}'}, 0, 'stage_restarts_total 0');
    is($m2->{'omni_engine_stage_hang_kills_total{stage="thinker"}'}, 0, 'hang kills 0');
    my $ok = request($srv, { prompt => 'Once', max_tokens => 4 });
    ok($ok->{done}, 'and it serves');
}

# --- SIGSTOP with requests in flight: killed at the kill time, restarted --
{
    my $pid = stage_pid($srv);
    my @streams = map { { prompt => "Once upon a time $_",
                          ignore_eos => JSON::PP::true } } 1 .. 4;
    my ($stopped, $t_stop, @late);
    # 4 streams running when the stage stops; 2 more submitted to the
    # stopped stage just after (it counts as ready for $UNREADY s more)
    my @r = run_concurrent($srv, \@streams, timeout => $KILL + 20,
                           on_read => sub {
        my ($rs) = @_;
        if (!$stopped && !grep { !length $_->{text} } @$rs) {
            kill 'STOP', $pid;
            $stopped = 1;
            $t_stop = time;
            for my $i (1, 2) {
                my $s = engine_connect($srv) or die "connect: $!";
                $s->syswrite(frame($F{REQUEST}, encode_json({
                    prompt => "Late $i", max_tokens => 8 })));
                push @late, $s;
            }
        }
        return;
    });
    my $t_end = time;
    ok($stopped, 'stopped while 4 requests were streaming');
    for my $s (@late) {                 # their replies wait in the socket
        my $r = new_reply();
        while (defined(my $n = $s->sysread(my $chunk, 65536))) {
            last if !$n;
            $r->{buf} .= $chunk;
        }
        add_frames($r, take_frames(\$r->{buf}));
        $r->{eof} = 1;
        push @r, $r;
    }
    my @failed = grep {
        $_->{error} && $_->{error}{status} == 503
        && $_->{error}{code} eq 'stage_failed' && $_->{eof}
    } @r;
    is(scalar(@failed), 6, '4 streams and 2 requests submitted after the '
       . 'stop: 503 stage_failed') or diag explain [map { $_->{error} } @r];
    like($failed[0]{error}{message} // '',
         qr/\(signal 9: killed after [\d.]+ s without a heartbeat/,
         'the error says the stage was killed for its silence');
    ok($t_end - $t_stop >= $KILL * 0.5 && $t_end - $t_stop < $KILL + 10,
       sprintf('they ended %.1f s after the stop (kill at %d s)',
               $t_end - $t_stop, $KILL));
    ok(health_within(200, 30), 'health 200 after the restart');
    my $new = stage_pid($srv);
    ok($new && $new != $pid, "a new thinker process ($pid -> $new)");
    ok(!kill(0, $pid), 'the stopped one is gone');
    my @after = run_concurrent($srv, [map { { prompt => "Once $_",
                                              max_tokens => 8 } } 1 .. 4]);
    is(scalar(grep { $_->{done} } @after), 4, 'the next requests succeed');
    my $m = metrics($srv);
    is($m->{'omni_engine_stage_hang_kills_total{stage="thinker"}'}, 1, 'hang kills 1');
    is($m->{'omni_engine_stage_restarts_total{stage="thinker"}'}, 1, 'stage_restarts_total 1');
    is($m->{'omni_engine_stage_ready{stage="thinker"}'}, 1, 'stage_ready 1');
    my $log = slurp($srv->{log});
    like($log, qr/silent for [\d.]+ s( in one step)?; not ready/,
         'the silence is logged');
    like($log, qr/has been silent for [\d.]+ s( in one step)?; killing it/,
         'the kill is logged');
}

# --- options --------------------------------------------------------------
{
    my ($rc, $out, $err) = run_engine('serve', '--model', $MODEL, '--socket',
                                      "$TMP/x.sock", '--stage-unready-after',
                                      5, '--stage-kill-after', 2);
    is($rc, 1, 'kill time below the unready time: exit 1');
    like($err, qr/'--stage-kill-after' \(2\) must be 0 or at least/,
         '... saying why');
}

is(serve_stop($srv), 0, 'clean shutdown');
done_testing();

# Huge prompts cost the engine work bounded by its context, not by their
# size, and do not slow anyone else down: a 900 KB prompt is refused (400
# context_length_exceeded, param as always) from the prompt bound without
# being tokenized, large requests that fit are parsed and prepared off the
# loops and served as small ones are, and while four clients loop such
# prompts on the engine socket a concurrent stream's time to first byte
# stays within 2x its idle value (medians over many probes, idle and under
# attack alternating, in this run; the attackers run at nice 10 so that
# what is measured is the engine's work more than theirs).
use strict;
use warnings;
use Test::More;
use IO::Handle;
use IO::Select;
use JSON::PP;
use POSIX qw(_exit);
use Time::HiRes qw(time sleep);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F);

my $srv = serve_start();
my $CTX = models($srv)->{data}[0]{max_model_len};
my $HUGE = 'Once upon a time there was a little dog. ' x 22500;   # 900 KB
my $SHORT = 'Once upon a time';

sub refused {
    my ($r, $param, $name) = @_;
    my $e = $r->{error} // {};
    is($e->{status}, 400, "$name: 400") or diag explain $r;
    is($e->{code}, 'context_length_exceeded', "$name: context_length_"
       . 'exceeded');
    is($e->{param}, $param, "$name: param $param");
    like($e->{message} // '', qr/^This model's maximum context length is $CTX tokens\. (?#
         )However, your (messages|prompt) resulted in (at least )?\d+ (?#
         )tokens\. Please reduce the length of the \1\.$/, "$name: message");
    return $e->{message} // '';
}

sub median {
    my @a = sort { $a <=> $b } @_;
    return @a ? $a[$#a / 2] : 0;
}

ok(length($HUGE) >= 900 * 1024, 'the huge prompt is ' . length($HUGE)
   . ' bytes');

# --- refusals: from the bound, and from tokenizing a prompt under it -------
{
    my $m = refused(request($srv, { prompt => $HUGE, max_tokens => 4 }),
                    'prompt', 'huge prompt');
    like($m, qr/at least \d+ tokens/, 'huge prompt: refused from the bound');
    refused(request($srv, { messages => [{ role => 'user',
                                           content => $HUGE }] }),
            'messages', 'huge message');
    refused(request($srv, { messages => [
                { role => 'system', content => 'Be brief.' },
                { role => 'user', content => (' ' x 300000) . 'Hi' }] }),
            'messages', 'huge whitespace message (the thinker refuses it)');
    refused(request($srv, { prompt => "$SHORT " x 200 }), 'prompt',
            'prompt over the context, under the bound (tokenized)');
    # a template may drop system messages, so the frontend does not count
    # them; the thinker refuses a huge one from the rendered prompt
    refused(request($srv, { messages => [
                { role => 'system', content => $HUGE },
                { role => 'user', content => 'Hi' }] }),
            'messages', 'huge system message (the thinker refuses it)');
    my $m1 = metrics($srv);
    is($m1->{'omni_engine_request_errors_total{status="400",'
              . 'code="context_length_exceeded"}'}, 5, 'metrics: 5 refusals');
    is($m1->{omni_engine_prompt_tokens_total}, 0, 'nothing was admitted');
}

# --- large requests that fit: served off the loops, as small ones are -----
{
    my %q = (prompt => $SHORT, max_tokens => 16, temperature => 0);
    my %c = (messages => [{ role => 'user', content => $SHORT }],
             max_tokens => 16, temperature => 0);
    my $pad = 'x' x 200000;             # an unknown key: ignored
    my $small = request($srv, \%q);
    ok($small->{done} && length $small->{text}, 'small prompt served');
    my $big = request($srv, { %q, padding => $pad });
    ok($big->{done}, '200 KB request with the same prompt served');
    is($big->{text}, $small->{text}, '... with the same text');
    my $small_c = request($srv, \%c);
    my $big_c = request($srv, { %c, padding => $pad });
    ok($big_c->{done} && length $big_c->{text}, '200 KB chat request served');
    is($big_c->{text}, $small_c->{text}, '... with the same text');
    my $fits = request($srv, { prompt => "$SHORT " x 60, max_tokens => 4,
                               padding => $pad });
    ok($fits->{done}, 'a long prompt that fits is not refused');
    ok($fits->{done}{prompt_tokens} > 200 && $fits->{done}{prompt_tokens}
       < $CTX, "... ($fits->{done}{prompt_tokens} prompt tokens)");

    # clients that go away while their 8 MB request is being parsed
    my $frame = frame($F{REQUEST}, encode_json({ %q, padding => 'y' x 8e6 }));
    for (1 .. 4) {
        my $s = engine_connect($srv) or die "connect: $!";
        $s->syswrite($frame);
        close $s;
    }
    my $after = request($srv, \%q);
    is($after->{text}, $small->{text}, 'served after 4 abandoned parses');
    my $m;
    for (1 .. 100) {
        $m = metrics($srv);
        last if $m->{omni_engine_connections} == 1;
        sleep 0.05;
    }
    is($m->{omni_engine_connections}, 1, 'no connection is left behind');
    is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, 'nothing running');
}

# --- four clients loop huge prompts; a stream's first byte ----------------
my $probe = frame($F{REQUEST}, encode_json({ prompt => $SHORT,
    max_tokens => 4, stream => JSON::PP::true }));

# Seconds from sending a streaming request to its first TEXT.
sub ttfb {
    my $s = engine_connect($srv) or die "connect: $!";
    my ($buf, $t) = ('');
    my $t0 = time;
    $s->syswrite($probe);
    while (!defined $t) {
        my $n = $s->sysread(my $chunk, 65536);
        last if !$n;
        $buf .= $chunk;
        for my $f (take_frames(\$buf)) {
            $t = time - $t0 if $f->[0] == $F{TEXT};
        }
    }
    close $s;
    return $t // 99;
}

# Forks n attackers looping the huge prompt. Each reads commands from its
# own pipe between requests: "p" pauses it (it answers "p" on the shared
# pipe once its request in flight has its refusal, so the engine is truly
# idle then), "g" resumes it, "q" ends it with a line "refusals wrong
# median_seconds". Returns the shared read end and the attackers.
sub attack {
    my ($n) = @_;
    my $big = frame($F{REQUEST}, encode_json({ prompt => $HUGE,
                                               max_tokens => 4 }));
    pipe(my $up, my $up_w) or die "pipe: $!";
    my @att;
    for (1 .. $n) {
        pipe(my $ctl, my $ctl_w) or die "pipe: $!";
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            close $up;
            close $ctl_w;
            $up_w->autoflush(1);
            setpriority(0, 0, 10);
            my ($wrong, @t, $cmd) = (0);
            my $sel = IO::Select->new($ctl);
            while (1) {
                $cmd = '';
                sysread($ctl, $cmd, 1) if $sel->can_read(0);
                if ($cmd eq 'p') {
                    print $up_w "p\n";
                    sysread($ctl, $cmd, 1);     # blocks until g or q
                }
                last if $cmd eq 'q';
                my $t0 = time;
                my $r = send_raw($srv, $big, timeout => 60) or last;
                push @t, time - $t0;
                $wrong++ unless $r->{error}
                    && $r->{error}{code} eq 'context_length_exceeded'
                    && $r->{error}{param} eq 'prompt';
            }
            print $up_w scalar(@t), " $wrong ", median(@t), "\n";
            _exit(0);
        }
        close $ctl;
        $ctl_w->autoflush(1);
        push @att, { pid => $pid, ctl => $ctl_w };
    }
    close $up_w;
    return ($up, @att);
}

sub tell_all {
    my ($cmd, @att) = @_;
    print { $_->{ctl} } $cmd for @att;
}

{
    my (@idle, @hit, @refusals);
    my ($n_ref, $wrong) = (0, 0);
    my ($up, @att) = attack(4);
    # idle and attacked probes alternate, so a change in the machine's
    # other load falls on both sides alike; idle means every attacker has
    # its last refusal
    for my $round (1 .. 10) {
        tell_all('p', @att);
        <$up> for @att;
        push @idle, map { ttfb() } 1 .. 6;
        tell_all('g', @att);
        sleep 0.3;                      # the attack is under way
        push @hit, map { ttfb() } 1 .. 6;
    }
    tell_all('q', @att);
    waitpid($_->{pid}, 0) for @att;
    while (my $line = <$up>) {
        my ($n, $w, $med) = split ' ', $line;
        next unless defined $med;
        $n_ref += $n;
        $wrong += $w;
        push @refusals, $med if $n > 0;
    }
    my ($mi, $mh) = (median(@idle), median(@hit));
    ok($n_ref >= 20, "the attackers were refused $n_ref times");
    is($wrong, 0, 'every refusal: 400 context_length_exceeded, param prompt');
    diag(sprintf('stream TTFB median idle %.2f ms, under attack %.2f ms '
                 . '(x%.2f); a 900 KB refusal takes %.1f ms (median of the '
                 . 'attackers\' medians, 4 at once)', 1e3 * $mi, 1e3 * $mh,
                 $mh / $mi, 1e3 * median(@refusals)));
    ok($mh <= 2 * $mi, sprintf('TTFB under attack within 2x idle (x%.2f)',
                               $mh / $mi));
    ok(health($srv) == 200, 'still ready');
}

is(serve_stop($srv), 0, 'clean shutdown');
done_testing();

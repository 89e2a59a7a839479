# omni-engine serve over its wire protocol: control replies, requests that
# match `generate`, protocol errors, cancels, a killed thinker stage,
# shutdown, and the client CLI. The helpers are in proto.pl.
use strict;
use warnings;
use Test::More;
use IO::Socket::UNIX;
use JSON::PP;
use Time::HiRes qw(time sleep);
require './t/engine/proto.pl';
our ($ENGINE, $MODEL, $TMP, %F, $VERSION);

my $PROMPT = 'Once upon a time';

sub gen_text {
    my (undef, $out) = run_engine('generate', '--model', $MODEL, '--threads',
                                  1, '--temperature', 0, @_);
    return $out;
}

sub client {
    return run_engine('client', @_);
}

sub ok_reply {
    my ($r, $name) = @_;
    ok($r->{done} && !$r->{error} && $r->{eof}, "$name: DONE, then closed")
        or diag explain $r->{error};
}

sub error_is {
    my ($r, $status, $code, $name, $param) = @_;
    my $e = $r->{error} // {};
    is($e->{status}, $status, "$name: status $status")
        or diag explain $r;
    is($e->{code}, $code // '', "$name: code " . ($code // 'none'));
    is($e->{type}, $status < 500 ? 'invalid_request_error' : 'server_error',
       "$name: type");
    is($e->{param}, $param, "$name: param $param") if defined $param;
    ok($r->{eof}, "$name: connection closed");
}

my $srv = serve_start(args => ['--read-timeout', 2]);

# --- control replies ------------------------------------------------------
{
    is_deeply([health($srv)], [200, 'ready'], 'health: 200 ready');
    my $m = models($srv)->{data}[0];
    is($m->{id}, 'stories260K', 'models: id is the file name');
    is($m->{owned_by}, 'ngx_omni', 'models: owned_by');
    ok($m->{max_model_len} > 0, 'models: max_model_len');
    ok(abs($m->{created} - time) < 600, 'models: created is the start time');

    my $mt = metrics($srv);
    is($mt->{'omni_engine_stage_ready{stage="thinker"}'}, 1, 'metrics: stage ready');
    for my $name (qw(num_requests_running num_requests_waiting
                     kv_cache_usage_perc prefix_cache_hits_total
                     time_to_first_token_seconds stage_restarts_total)) {
        like($mt->{_text}, qr/^# HELP omni_engine_$name .+\n# TYPE /m,
             "metrics: $name has HELP and TYPE");
    }
    ok($mt->{'omni_engine_resident_memory_bytes{process="thinker"}'} > 0,
       'metrics: thinker resident memory');
}

# --- requests equal generate ----------------------------------------------
{
    my $want = gen_text('--prompt', $PROMPT, '--max-tokens', 60);
    my $r = request($srv, { prompt => $PROMPT, max_tokens => 60,
                            temperature => 0 });
    ok_reply($r, 'prompt request');
    is($r->{text}, $want, 'prompt request: text equals generate');
    ok(scalar(grep { $_->[0] == $F{TEXT} } @{ $r->{frames} }) > 1,
       'prompt request: text streams in several events');

    $want = gen_text('--prompt', 'Tell me a story', '--chat',
                     '--max-tokens', 60);
    $r = request($srv, { messages => [{ role => 'user',
                                        content => 'Tell me a story' }],
                         max_tokens => 60, temperature => 0,
                         model => 'stories260K' });
    ok_reply($r, 'chat request');
    is($r->{text}, $want, 'chat request: text equals generate --chat');

    my ($rc, $ids) = run_engine('tokenize', '--model', $MODEL, '--text',
                                $PROMPT);
    $r = request($srv, { prompt => $PROMPT, max_tokens => 8,
                         temperature => 0 });
    is_deeply($r->{done}, { prompt_tokens => scalar(split ' ', $ids),
                            cached_tokens => $r->{done}{cached_tokens},
                            completion_tokens => 8, finish => 'length',
                            seed => $r->{done}{seed}, audio_tokens => 0,
                            audio_ms => 0, input_audio_ms => 0,
                            reasoning_tokens => 0 },
              'usage: prompt and completion tokens, finish length');

    $r = request($srv, { prompt => $PROMPT, max_tokens => 64,
                         temperature => 0, stop => ['Lily'] });
    is($r->{text}, ', there was a little girl named ',
       'stop string ends the text and is not sent');
    is($r->{done}{finish}, 'stop', 'stop string: finish stop');
}

# --- protocol errors: 400, and the engine keeps serving -------------------
{
    my $req = frame($F{REQUEST}, encode_json({ prompt => 'x' }));
    my @bad = (
        ['bad version', frame($F{REQUEST}, '{}', version => $VERSION + 1),
         qr/version/],
        ['nonzero flags', frame($F{REQUEST}, '{}', flags => 1),
         qr/flags/],
        ['unknown type', frame(99, ''), qr/frame type/],
        ['engine frame type', frame($F{TEXT}, 'hi'), qr/frame type/],
        ['stage frame type', frame(64, 'x' x 8), qr/frame type/],
        ['oversized length', frame($F{REQUEST}, '', len => (16 << 20) + 1),
         qr/too large/],
        ['control with payload', frame($F{HEALTH}, 'x'), qr/payload/],
        ['empty request', frame($F{REQUEST}, ''), qr/empty/],
        ['bad JSON', frame($F{REQUEST}, '{"prompt": '), qr/./],
        ['not an object', frame($F{REQUEST}, '[1]'), qr/./],
        ['data after the frame', $req . 'junk', qr/one frame/],
    );
    for my $b (@bad) {
        my ($name, $bytes, $re) = @$b;
        my $r = send_raw($srv, $bytes);
        error_is($r, 400, undef, $name);
        like($r->{error}{message} // '', $re, "$name: message");
    }
    my $r = send_raw($srv, substr(frame($F{REQUEST}, '{"prompt":"x"}'), 0,
                                  12), shutdown => 1);
    error_is($r, 400, undef, 'truncated frame');

    my @params = (
        [{ prompt => 5 }, 'prompt'],
        [{ prompt => 'x', max_tokens => '3' }, 'max_tokens'],
        [{ prompt => 'x', temperature => 'hot' }, 'temperature'],
        [{ prompt => 'x', top_p => 7 }, 'top_p'],
        [{ prompt => 'x', stop => [1] }, 'stop'],
        [{ messages => 'hi' }, 'messages'],
    );
    for my $p (@params) {
        my ($req_h, $param) = @$p;
        $r = request($srv, $req_h);
        error_is($r, 400, undef, "wrong type for $param", $param);
    }
    $r = request($srv, { prompt => 'x', model => 'gpt-4o' });
    error_is($r, 404, 'model_not_found', 'unknown model', 'model');
    like($r->{error}{message}, qr/gpt-4o/, 'unknown model: named');

    is_deeply([health($srv)], [200, 'ready'], 'still ready after errors');
    $r = request($srv, { prompt => $PROMPT, max_tokens => 4 });
    ok_reply($r, 'a request after the errors');
    my $m = metrics($srv);
    ok($m->{'omni_engine_request_errors_total{status="400",code=""}'} >= 18,
       'metrics: 400s counted');
    is($m->{'omni_engine_request_errors_total{status="404",code='
            . '"model_not_found"}'}, 1, 'metrics: the 404 counted');
}

# --- text that is not UTF-8: 400 naming the value, as through nginx -------
# (the same validator, json_scan.h; t/utf8.t has the nginx side)
{
    my @bad = (
        ["\xc0\xaf", 'bytes C0 AF'], ["\xe0\x80\xaf", 'bytes E0 80 AF'],
        ["\xf0\x80\x80\xaf", 'bytes F0 80 80 AF'],
        ["\xed\xa0\x80", 'bytes ED A0 80'], ["\xed\xbf\xbf", 'bytes ED BF BF'],
        ["\xf4\x90\x80\x80", 'bytes F4 90 80 80'], ["\xf5\x80", 'bytes F5 80'],
        ["\xff", 'byte FF'], ["\x80", 'byte 80'], ["\xe2\x82", 'bytes E2 82'],
        ['\ud800', 'unpaired surrogate \ud800'],
        ['\udc00', 'unpaired surrogate \udc00'],
        ['\ud83d\u0041', 'unpaired surrogate \ud83d'],
    );
    my @where = (
        ['{"prompt":"a%s"}', 'prompt'],
        ['{"messages":[{"role":"user","content":"a%s"}]}',
         'messages[0].content'],
        ['{"messages":[{"role":"user","content":[{"type":"text",'
         . '"text":"a%s"}]}]}', 'messages[0].content[0].text'],
        ['{"prompt":"x","stop":["y","a%s"]}', 'stop[1]'],
        ['{"prompt":"x","model":"a%s"}', 'model'],
        ['{"prompt":"x","user":"a%s"}', 'user'],
        ['{"prompt":"x","a%s":1}', ''],
    );
    my $bad = 0;
    for my $w (@where) {
        for my $b (@bad) {
            my $name = "$b->[1] in " . ($w->[1] || 'a key');
            my $r = send_raw($srv, frame($F{REQUEST},
                                         sprintf($w->[0], $b->[0])));
            my $e = $r->{error} // {};
            my $want = $w->[1] ? qr/^\Q$w->[1]\E: not valid UTF-8 / :
                                 qr/^request JSON is not valid UTF-8 /;
            $bad++ unless is($e->{status}, 400, "$name: 400")
                && is($e->{param}, $w->[1], "$name: param")
                && like($e->{message}, qr/$want\(\Q$b->[1]\E at offset \d+\)$/,
                        "$name: message")
                && ok($r->{eof}, "$name: closed");
        }
    }
    is($bad, 0, 'not UTF-8: every class in every place refused');
    my $r = request($srv, { prompt => "\x{7f}\x{80}\x{7ff}\x{800}\x{d7ff}"
                                      . "\x{e000}\x{fffd}\x{10000}\x{10ffff}",
                            max_tokens => 2 });
    ok_reply($r, 'the valid edge characters pass');
    is_deeply([health($srv)], [200, 'ready'], 'still ready after bad text');
}

# --- seeds: fresh per request without one, reported in DONE ---------------
{
    my %req = (prompt => $PROMPT, temperature => 1, max_tokens => 48,
               ignore_eos => JSON::PP::true);
    my @r = map { request($srv, \%req) } 1 .. 4;
    my @seeds = map { $_->{done}{seed} // -1 } @r;
    is(scalar(grep { $_ >= 0 && $_ <= 9223372036854775807 } @seeds), 4,
       'no seed: DONE reports the one drawn') or diag "@seeds";
    is(scalar(keys %{{ map { $_ => 1 } @seeds }}), 4, 'no seed: four seeds');
    cmp_ok(scalar(keys %{{ map { $_->{text} => 1 } @r }}), '>', 1,
           'no seed: not the same 48 tokens four times');
    my $again = request($srv, { %req, seed => $seeds[0] });
    is($again->{text}, $r[0]{text}, 'the reported seed reproduces the text');
    is($again->{done}{seed}, $seeds[0], 'a given seed is reported as it is');
    my @g = map { request($srv, { %req, temperature => 0 }) } 1 .. 2;
    is($g[0]{text}, $g[1]{text}, 'greedy: the same text without a seed');
}

# --- read timeout: a connection that never sends its frame -----------------
{
    my $t0 = time;
    my $r = send_raw($srv, '', timeout => 10);
    my $dt = time - $t0;
    error_is($r, 408, 'request_timeout', 'silent connection');
    like($r->{error}{message} // '', qr/within 2 s/,
         'silent connection: message names the timeout');
    ok($dt >= 1.8 && $dt < 6, sprintf('silent connection: closed after '
                                      . '%.1f s (--read-timeout 2)', $dt));
    $r = send_raw($srv, substr(frame($F{REQUEST}, '{"prompt":"x"}'), 0, 5),
                  timeout => 10);
    error_is($r, 408, 'request_timeout', 'half a header, then silence');
    $r = request($srv, { prompt => $PROMPT, max_tokens => 4 });
    ok_reply($r, 'a request after the timeouts');
    like(slurp($srv->{log}), qr/no complete request frame within 2 s/,
         'read timeout logged');
}

# --- cancel: a client that closes early -----------------------------------
{
    my $before = metrics($srv)->{omni_engine_requests_cancelled_total};
    my @reqs = map { { prompt => "$PROMPT $_", ignore_eos => JSON::PP::true,
                       temperature => 0 } } 1 .. 4;
    my %closed;
    my @r = run_concurrent($srv, \@reqs, on_read => sub {
        my ($rs) = @_;
        return map { $closed{$_}++ ? () : "close:$_" }
               grep { length $rs->[$_]{text} } 0, 1;
    });
    ok($r[$_]{closed}, "cancel: request $_ closed early") for 0, 1;
    ok_reply($r[$_], "cancel: request $_ unaffected") for 2, 3;
    my $m = metrics($srv);
    is($m->{omni_engine_requests_cancelled_total} - $before, 2,
       'cancel: counted');
    my $until = time + 5;
    $m = metrics($srv) until $m->{'omni_engine_num_requests_running{stage="thinker"}'} == 0
                             || time > $until;
    is($m->{'omni_engine_num_requests_running{stage="thinker"}'}, 0, 'cancel: nothing running');
    is($m->{'omni_engine_kv_cache_blocks{state="used"}'}, 0,
       'cancel: no KV block in use');
}

# --- the client CLI -------------------------------------------------------
{
    my $s = $srv->{socket};
    my ($rc, $out, $err) = client('--socket', $s, '--prompt', $PROMPT,
                                  '--temperature', 0, '--max-tokens', 30,
                                  '--usage');
    is($rc, 0, 'client: exit 0');
    is($out, gen_text('--prompt', $PROMPT, '--max-tokens', 30),
       'client: text equals generate');
    like($err, qr/^prompt_tokens 5 cached_tokens \d+ completion_tokens 30 (?#
                 )finish length seed \d+\n\z/, 'client --usage: one line');

    # without --seed the engine draws one; --usage says which, and sending
    # it back reproduces the text
    my @o = ('--socket', $s, '--prompt', $PROMPT, '--max-tokens', 40,
             '--temperature', 1, '--usage');
    my (undef, $t1, $e1) = client(@o);
    my (undef, $t2, $e2) = client(@o);
    my ($s1) = $e1 =~ /seed (\d+)$/m;
    my ($s2) = $e2 =~ /seed (\d+)$/m;
    ok(defined $s1 && defined $s2 && $s1 ne $s2, 'client: a seed per run');
    my (undef, $t3, $e3) = client(@o, '--seed', $s1);
    is($t3, $t1, 'client: --seed with the reported seed reproduces the text');
    like($e3, qr/ seed \Q$s1\E\n\z/, 'client: and reports it');

    ($rc, $out) = client('--socket', $s, '--prompt', "quote \" and \\ and \n",
                         '--max-tokens', 2, '--chat');
    is($rc, 0, 'client: JSON escaping of a chat prompt');

    ($rc, $out, $err) = client('--socket', $s, '--prompt', 'x', '--model',
                               'nope');
    is($rc, 1, 'client: exit 1 on an ERROR event');
    like($err, qr/^omni-engine: 404 invalid_request_error: .*nope/,
         'client: error line');

    ($rc, $out, $err) = client('--socket', "$TMP/none.sock", '--prompt', 'x');
    is($rc, 1, 'client: exit 1 when nothing listens');
    like($err, qr/^omni-engine: .*none\.sock/, 'client: names the socket');

    ($rc, $out) = client('--socket', $s, '--health');
    is("$rc $out", "0 200 ready\n", 'client --health');
    ($rc, $out) = client('--socket', $s, '--models');
    is(decode_json($out)->{data}[0]{id}, 'stories260K', 'client --models');
    ($rc, $out) = client('--socket', $s, '--metrics');
    like($out, qr/^omni_engine_request_success_total/m, 'client --metrics');
    ($rc, undef, $err) = client('--socket', $s, '--health', '--models');
    is($rc, 1, 'client: --health with --models is refused');
}

# --- serve's options are checked, naming the option -----------------------
{
    for my $c (['--max-seqs', 0], ['--block-size', 'x'], ['--isa', 'sse'],
               ['--kv-cache-mb', -1], ['--drain-timeout', -5]) {
        my ($rc, $out, $err) = run_engine('serve', '--model', $MODEL,
                                          '--socket', "$TMP/opt.sock", @$c);
        is($rc, 1, "serve $c->[0] $c->[1]: exit 1");
        like($err, qr/^omni-engine: option '\Q$c->[0]\E'/, "serve $c->[0]: "
             . 'named');
    }
    my ($rc, $out, $err) = run_engine('serve', '--model', $MODEL);
    like($err, qr/missing required option '--socket'/, 'serve needs --socket');
    ok(!-e "$TMP/opt.sock", 'no socket left behind');
}

# --- a second engine on the same socket is refused ------------------------
{
    my ($rc, $out, $err) = run_engine('serve', '--model', $MODEL, '--socket',
                                      $srv->{socket});
    is($rc, 1, 'second engine on a live socket: exit 1');
    like($err, qr/another engine is serving/, 'second engine: says why');
    is_deeply([health($srv)], [200, 'ready'], 'the first one still serves');
}

# --- kill -9 of the thinker during 16 streaming requests ------------------
{
    my $pid = stage_pid($srv);
    ok($pid, 'thinker stage pid found');
    my @reqs = map { { prompt => "$PROMPT $_", ignore_eos => JSON::PP::true,
                       temperature => 0 } } 1 .. 16;
    my $killed;
    my @r = run_concurrent($srv, \@reqs, on_read => sub {
        my ($rs) = @_;
        if (!$killed && !grep { !length $_->{text} } @$rs) {
            kill 'KILL', $pid;
            $killed = 1;
        }
        return;
    });
    ok($killed, 'killed while all 16 were streaming');
    my $errors = grep {
        $_->{error} && $_->{error}{status} == 503
        && $_->{error}{code} eq 'stage_failed' && $_->{eof}
        && $_->{error}{message} =~ /signal 9/
    } @r;
    is($errors, 16, 'each got ERROR 503 stage_failed naming signal 9')
        or diag explain [map { $_->{error} // $_->{done} } @r];
    my @h = health($srv);
    is($h[0], 503, "health 503 while the stage restarts ($h[1])");
    ok(wait_health($srv, 200, 30), 'health 200 again');
    isnt(stage_pid($srv), $pid, 'a new thinker process');
    my @after = run_concurrent($srv, [map { { prompt => "$PROMPT $_",
                                              max_tokens => 16 } } 1 .. 4]);
    is(scalar(grep { $_->{done} } @after), 4, 'the next requests succeed');
    my $m = metrics($srv);
    is($m->{'omni_engine_stage_restarts_total{stage="thinker"}'}, 1, 'stage_restarts_total 1');
    is($m->{'omni_engine_request_errors_total{status="503",code='
            . '"stage_failed"}'}, 16, 'metrics: 16 stage_failed errors');
    like(slurp($srv->{log}), qr/exited \(signal 9\)/, 'the exit is logged');
}

# --- SIGTERM: requests in flight finish, exit 0, socket removed -----------
{
    my $s = engine_connect($srv);
    $s->syswrite(frame($F{REQUEST}, encode_json({
        prompt => $PROMPT, ignore_eos => JSON::PP::true, temperature => 0 })));
    my $buf = '';
    $s->sysread($buf, 65536, length $buf) until length($buf) > 8;
    kill 'TERM', $srv->{pid};
    my $r = new_reply();
    $r->{buf} = $buf;
    while ($s->sysread(my $chunk, 65536)) { $r->{buf} .= $chunk }
    add_frames($r, take_frames(\$r->{buf}));
    ok($r->{done} && $r->{done}{completion_tokens} > 100,
       'SIGTERM: the request in flight finished')
        or diag explain $r->{error};
    is(serve_wait($srv, 30), 0, 'SIGTERM: exit status 0');
    ok(!-e $srv->{socket}, 'SIGTERM: socket removed');
}

# --- drain timeout 0: requests in flight get engine_shutdown --------------
{
    my $srv2 = serve_start(args => ['--drain-timeout', 0]);
    my $termed;
    my @r = run_concurrent($srv2, [{ prompt => $PROMPT,
                                     ignore_eos => JSON::PP::true }],
                           on_read => sub {
        my ($rs) = @_;
        kill 'TERM', $srv2->{pid} if length $rs->[0]{text} && !$termed++;
        return;
    });
    error_is($r[0], 503, 'engine_shutdown', 'drain timeout: request');
    is(serve_wait($srv2, 30), 0, 'drain timeout: exit 0');
}

# --- a stale socket file is replaced; a bad model keeps health at 503 -----
{
    my $path = "$TMP/stale.sock";
    my $l = IO::Socket::UNIX->new(Type => SOCK_STREAM, Local => $path,
                                  Listen => 1);
    close $l;
    ok(-S $path, 'stale socket file exists');
    my $srv3 = serve_start(socket => $path);
    is_deeply([health($srv3)], [200, 'ready'], 'stale socket: replaced');
    is(serve_stop($srv3), 0, 'stale socket: stopped');

    my $srv4 = serve_start(model => "$TMP/missing.gguf", no_wait => 1);
    my $h;
    my $until = time + 20;
    while (time < $until) {
        $h = [health($srv4)];
        last if @$h && $h->[1] =~ /failed \d+ times/;
        sleep 0.05;
    }
    is($h->[0], 503, 'bad model: health 503');
    like($h->[1], qr/failed \d+ times before it was ready \(last: status (?#
                    )1: omni-engine: .*missing\.gguf/,
         'bad model: health says why');
    my $r = request($srv4, { prompt => 'x' });
    error_is($r, 503, 'engine_not_ready', 'bad model: request');
    is(serve_stop($srv4), 0, 'bad model: SIGTERM exits 0');
}

done_testing();

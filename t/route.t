# omni_prefix_route end to end (issue 14): a Redis of the test's own, two
# real engines publishing to it (`omni-engine serve --redis`), nginx with
# `upstream engines { omni_prefix_route; server unix:E0; server unix:E1; }`
# (t/lib/RouteFleet.pm):
#
#   1. keys: for many request shapes, the keys nginx asks for in its one
#      MGET (seen by MONITOR) are what `omni-engine prefix-keys` prints for
#      the request the engine receives (string content, text parts,
#      developer, an assistant turn without content, tool, non-ASCII,
#      prompt_cache_key, API-key tenants, audio ending the chain, more than
#      64 messages), and the MGET's shape (loads, then every engine's keys);
#   2. multi-turn: each turn goes to the engine holding the conversation
#      (x-omni-route: hit; engine, messages and tokens as published, the
#      prompt cache hit in usage), a first turn whose system prompt an
#      engine holds too, a miss going on where round robin put it, a
#      streamed turn, omni_route_header off; the access-log variables and
#      omni_nginx_route_total agree with the headers;
#   3. isolation: another prompt_cache_key or API key is never routed by
#      (nor cached from) the first one's keys;
#   4. requests that are not chats through the routed upstream: served as
#      without it, no x-omni-route, not counted;
#   5. nginx -t: omni_prefix_route without omni_redis, bad parameters, out
#      of an upstream block;
#   6. hostile requests: answered as without routing (the engine's 400),
#      no worker crash;
#   7. with omni_limit: the MGET goes right after the prompt's tokens
#      charge, and requests still go to their holders;
#   8. after a reload, the new workers route as the old ones did.
#
# Fallbacks (a killed holder, max_waiting, down, Redis killed or slow) and
# eviction are t/route_fallback.t's.
use strict;
use warnings;
use lib '.';
use Test::More;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use Time::HiRes qw(time sleep);
use t::lib::RouteFleet;

our ($TMP, $MODEL);

my @KEYS = ('sk-route-alpha', 'sk-route-beta');
my $f = fleet_start(
    engines => [[], []], api_keys => \@KEYS, timeout => '2s',
    http => sub {
        return "    omni_limit_zone zone=rpm rate=6000r/m key=\$remote_addr;\n"
               . "    omni_limit_zone zone=tpm rate=10000000t/m "
               . "key=\$remote_addr;\n";
    },
    server => sub {
        return "        location /l/ { omni_limit rpm tpm; "
               . "omni_pass engines; }\n";
    });
my ($E0, $E1) = @{ $f->{route} };
my $M = $f->{model};

my $S0 = 'You are a poet who writes very short poems about the moon, the '
    . 'stars and the night sky, in simple words for children.';
my $S1 = 'You are a storyteller for small children. Your stories are short '
    . 'and kind, they have a cat, a dog and a little girl named Lily in '
    . 'them, and they always end well.';
my $S2 = 'You are a gardener who answers questions about flowers, trees '
    . 'and vegetables in a few short and friendly sentences.';
my $S3 = 'You are a sailor telling tales of the sea, of ships, storms, '
    . 'whales and far islands, always in short and simple words.';

sub chat { return chat_req($f, @_) }

# --- 1. the keys nginx asks for are the engine's ---------------------------

# MONITOR's lines for "MGET", each as its arguments.
sub mgets {
    my @out;
    for my $l (@_) {
        next unless $l =~ /"MGET"/;
        push @out, [map { s/\\(.)/$1/gr } $l =~ /"((?:[^"\\]|\\.)*)"/g];
    }
    return @out;
}

{
    my $audio = encode_base64('RIFF' . pack('V', 36 + 64) . 'WAVEfmt '
        . pack('V v v V V v v', 16, 1, 1, 16000, 32000, 2, 16)
        . 'data' . pack('V', 64) . "\0" x 64, '');
    my @many = map { { role => $_ % 2 ? 'assistant' : 'user',
                       content => "message number $_" } } 0 .. 99;
    my @shapes = (
        ['string content', chat([{ role => 'system', content => $S0 },
                                 { role => 'user', content => 'Hello' }])],
        ['text parts', chat([{ role => 'user', content => [
            { type => 'text', text => 'first part' },
            { type => 'text', text => 'second part' },
            { type => 'text', text => '' }] },
            { role => 'assistant', content => [{ type => 'text',
                                                 text => 'one part' }] },
            { role => 'user', content => [] }])],
        ['developer', chat([{ role => 'developer', content => $S0 },
                            { role => 'user', content => 'Hi' }])],
        ['assistant without content', chat([
            { role => 'user', content => 'What is the weather?' },
            { role => 'assistant', tool_calls => [{ id => 'call_1',
              type => 'function', function => { name => 'weather',
                                                arguments => '{}' } }] },
            { role => 'user', content => 'Well?' },
            { role => 'assistant', content => undef },
            { role => 'user', content => 'Thanks' }])],
        # the model's template has no tool role: the engine's 400, after
        # the lookup
        ['tool', chat([
            { role => 'user', content => 'What is the weather?' },
            { role => 'assistant', tool_calls => [{ id => 'call_1',
              type => 'function', function => { name => 'weather',
                                                arguments => '{}' } }] },
            { role => 'tool', tool_call_id => 'call_1',
              content => '{"ok":true}' },
            { role => 'user', content => 'Thanks' }])],
        ['non-ASCII', chat([{ role => 'user', content => "Gr\x{fc}\x{df}e, "
                              . "\x{4e16}\x{754c} \x{1f431}" },
                            { role => 'assistant', content => '' },
                            { role => 'user', name => 'lily',
                              content => "caf\x{e9}\n\"quoted\"\t\\" }])],
        ['prompt_cache_key', chat([{ role => 'user', content => 'Hello' }],
                                  prompt_cache_key => 'tenant-7')],
        ['api key', chat([{ role => 'system', content => $S0 },
                          { role => 'user', content => 'Hello' }]),
         api_key => $KEYS[0]],
        ['api key and prompt_cache_key', chat([{ role => 'user',
            content => 'Hello' }], prompt_cache_key => "\x{e9}t\x{e9}"),
         api_key => $KEYS[1]],
        ['input_audio ends the chain', chat([
            { role => 'system', content => $S0 },
            { role => 'user', content => 'Listen:' },
            { role => 'user', content => [
                { type => 'text', text => 'this' },
                { type => 'input_audio',
                  input_audio => { data => $audio, format => 'wav' } }] },
            { role => 'user', content => 'after the audio' }])],
        ['audio id ends the chain', chat([
            { role => 'user', content => 'Say hi' },
            { role => 'assistant', content => 'Hi there' },
            { role => 'user', content => 'Again' },
            { role => 'assistant', audio => { id => 'audio_abc123' } },
            { role => 'user', content => 'after it' }])],
        ['audio first: no key', chat([
            { role => 'user', content => [{ type => 'input_audio',
                input_audio => { data => $audio, format => 'wav' } }] }])],
        ['64 messages', chat([@many[0 .. 63]])],
        ['65 messages', chat([@many[0 .. 64]])],
        ['100 messages', chat([@many[0 .. 99]])],
    );
    my @raw = (
        # the last of two equal members counts, on both sides
        ['a member twice', '{"model":"' . $M . '","max_tokens":8,'
         . '"messages":[{"role":"user","content":"one","content":"two"},'
         . '{"role":"assistant","content":"x","role":"user"}]}',
         chat([{ role => 'user', content => 'two' },
               { role => 'user', content => 'x' }])],
        ['escapes', '{"model":"' . $M . '","max_tokens":8,"messages":'
         . '[{"role":"user","content":"\u00e9\ud83d\ude00\/\u0041"}]}',
         chat([{ role => 'user', content => "\x{e9}\x{1f600}/A" }])],
    );
    my %reply;
    $f->{redis}->monitor_start;
    for my $s (@shapes, @raw) {
        my ($name, $req, %o) = ref $s->[1] ? @$s : @$s[0, 1];
        $f->{redis}->cmd('ECHO', "shape: $name");
        my $raw = ref $req ? undef : $req;
        $req = $s->[2] if $raw;
        my $r = post($f, $o{api_key} ? '/k/v1/chat/completions'
                                     : '/r/v1/chat/completions',
                     $raw // $req, $o{api_key} ? bearer($o{api_key}) : ());
        ok($r->{status} < 500, "$name: answered ($r->{status})")
            or diag $r->{body};
        $reply{$name} = $r;
    }
    $f->{redis}->cmd('ECHO', 'shape: end');
    my @lines = $f->{redis}->monitor_stop;
    my (%seen, $cur);
    for my $l (@lines) {
        if ($l =~ /"ECHO" "shape: (.*)"$/) {
            $cur = $1;
            next;
        }
        push @{ $seen{$cur} }, mgets($l) if defined $cur && $l =~ /"MGET"/;
    }
    for my $s (@shapes, @raw) {
        my ($name, $req, %o) = ref $s->[1] ? @$s : @$s[0, 1];
        my $r = $reply{$name};
        $req = $s->[2] if !ref $req;
        my $salt = $o{api_key} ? tenant_salt($o{api_key},
                                             $req->{prompt_cache_key})
                               : $req->{prompt_cache_key};
        my $keys = used_keys(cli_keys(engine_form($req, $salt)));
        my @got = @{ $seen{$name} // [] };
        if (!@$keys) {
            is(scalar(@got), 0, "$name: no key, no MGET");
            is($r->{route}{result}, 'miss', "$name: a miss");
            next;
        }
        is(scalar(@got), 1, "$name: one MGET") or next;
        my @want = ('MGET', "$f->{ns}load:$E0", "$f->{ns}load:$E1",
                    map { my $e = $_;
                          map { "$f->{ns}px:$e:$_->[1]" } @$keys } $E0, $E1);
        is_deeply($got[0], \@want, "$name: its keys are the engine's ("
                  . scalar(@$keys) . ')')
            or diag explain [$got[0], \@want];
    }
    my @all = cli_keys(engine_form($shapes[-1][1]));
    is(scalar(@{ $all[0] }), 100, '100 messages: the engine names 100');
    is(scalar(@{ used_keys($all[0]) }), 64, '... of which 64 are asked');
}

# --- 2. multi-turn conversations go where their prefix is -----------------

{
    conv($f, 'c1', $S1);
    conv($f, 'c2', $S1);
    conv($f, 'c3', $S3);
    conv($f, 'c4', $S2);

    # c1 begins on E0, c4 on E1, where round robin would not have to
    my $r = turn($f, 'c1', '/e0/v1/chat/completions', 'Tell me about the cat.');
    is($r->{engine}, $E0, 'c1 turn 1: on E0, by hand');
    ok(!$r->{route}, 'c1 turn 1: not routed, no x-omni-route');
    $r = turn($f, 'c4', '/e1/v1/chat/completions', 'How do I grow tomatoes?');
    is($r->{engine}, $E1, 'c4 turn 1: on E1, by hand');

    # c2's first turn: E0 holds its system prompt (c1's)
    my $sys = [$f->{conv}{c1}{keys}[0]];
    is($sys->[0][0], 0, "the system prompt alone is published "
       . "($sys->[0][2] tokens)");
    $r = turn($f, 'c2', '/r/v1/chat/completions', 'Tell me about the dog.');
    is_hit($r, 'c2 turn 1 (the system prompt E0 holds)', $E0, $sys);

    $r = turn($f, 'c1', '/r/v1/chat/completions', 'And then what happened?');
    is_hit($r, 'c1 turn 2', $E0, $r->{prev});
    $r = turn($f, 'c4', '/r/v1/chat/completions', 'And potatoes?');
    is_hit($r, 'c4 turn 2', $E1, $r->{prev});

    # nobody holds c3's system prompt: a miss, then its engine holds it
    $r = turn($f, 'c3', '/r/v1/chat/completions', 'Tell me about a whale.');
    is_miss($r, 'c3 turn 1');
    my $c3 = $r->{engine};
    $r = turn($f, 'c3', '/r/v1/chat/completions', 'And the storm?');
    is_hit($r, 'c3 turn 2', $c3, $r->{prev});

    $r = turn($f, 'c1', '/r/v1/chat/completions', 'Was Lily happy?',
              stream => 1);
    is_hit($r, 'c1 turn 3 (streamed)', $E0, $r->{prev});
    like($r->{body}, qr/^data: \[DONE\]$/m, 'c1 turn 3: the stream ends');

    $r = turn($f, 'c4', '/nohdr/v1/chat/completions', 'And carrots?');
    ok(!exists $r->{headers}{'x-omni-route'},
       'omni_route_header off: no x-omni-route');
    is($r->{engine}, $E1, 'omni_route_header off: still routed to E1');
    my $l = log_of($f, $r->{id});
    is_deeply([@$l{qw(prefix engine messages tokens header)}],
              ['hit', $E1, $r->{prev}[-1][0] + 1, $r->{prev}[-1][2], '-'],
              'omni_route_header off: the log has it all the same');

    $r = turn($f, 'c2', '/r/v1/chat/completions', 'Where did the dog go?');
    is_hit($r, 'c2 turn 2', $E0, $r->{prev});
    $r = turn($f, 'c4', '/r/v1/chat/completions', 'And roses?');
    is_hit($r, 'c4 turn 4', $E1, $r->{prev});
}

# --- 3. tenants never see each other's prefixes ---------------------------
{
    # c1 again, with a prompt_cache_key: none of c1's keys
    conv($f, 'c1x', undef, req => { prompt_cache_key => 'another-tenant' });
    $f->{conv}{c1x}{msgs} = [@{ $f->{conv}{c1}{msgs} }];
    my $r = turn($f, 'c1x', '/r/v1/chat/completions', 'Tell me more.');
    is_miss($r, 'c1 with a prompt_cache_key');
    $r = turn($f, 'c1x', '/r/v1/chat/completions', 'And more.');
    is_hit($r, 'c1 with a prompt_cache_key, turn 2: its own prefix',
           $f->{conv}{c1x}{engine}, $r->{prev});

    # an API key: E0 holds S1 without a tenant, not for it
    conv($f, 'k1', $S1, api_key => $KEYS[0]);
    $r = turn($f, 'k1', '/k/v1/chat/completions', 'Tell me about the bird.');
    is_miss($r, 'key alpha, turn 1: the tenant-less system prompt is not '
            . 'its');
    $r = turn($f, 'k1', '/k/v1/chat/completions', 'And the dog?');
    is_hit($r, 'key alpha, turn 2: its own prefix', $f->{conv}{k1}{engine},
           $r->{prev});
    my @k1 = @{ $f->{conv}{k1}{msgs} };

    conv($f, 'k2', undef, api_key => $KEYS[1]);
    $f->{conv}{k2}{msgs} = [@k1];
    $r = turn($f, 'k2', '/k/v1/chat/completions', 'And Lily?');
    is_miss($r, 'key beta, the same conversation');

    conv($f, 'k1p', undef, api_key => $KEYS[0],
         req => { prompt_cache_key => 'p' });
    $f->{conv}{k1p}{msgs} = [@k1];
    $r = turn($f, 'k1p', '/k/v1/chat/completions', 'And Lily?');
    is_miss($r, 'key alpha with a prompt_cache_key');

    # the same messages without a key: only the tenant-less system prompt
    conv($f, 'k0', undef);
    $f->{conv}{k0}{msgs} = [@k1];
    $r = turn($f, 'k0', '/r/v1/chat/completions', 'And Lily?');
    is_hit($r, "no key: only the tenant-less system prompt's", $E0,
           [[0, undef, $f->{conv}{c1}{keys}[0][2]]]);
}

# --- 4. what is not a chat goes by round robin, uncounted ------------------
{
    my $before = route_metrics($f);
    my @cases = (
        ['completions', 'POST', '/v1/completions',
         { model => $M, prompt => 'Once upon a time', max_tokens => 4 }],
        ['models', 'GET', '/v1/models'],
        ['a model', 'GET', "/v1/models/$M"],
        ['speech', 'POST', '/v1/audio/speech',
         { model => $M, input => 'Hello.', voice => 'alloy' }],
        ['embeddings', 'POST', '/v1/embeddings',
         { model => $M, input => 'Hello.' }],
    );
    for my $c (@cases) {
        my ($name, $method, $uri, $body) = @$c;
        my $direct = $method eq 'GET' ? get($f, $uri) : post($f, $uri, $body);
        my $r = $method eq 'GET' ? get($f, "/r$uri")
                                 : post($f, "/r$uri", $body);
        is($r->{status}, $direct->{status},
           "$name: answered as without routing ($r->{status})");
        ok(!exists $r->{headers}{'x-omni-route'}, "$name: no x-omni-route");
        is($r->{engine}, $direct->{engine} ? $r->{engine} : undef,
           "$name: an engine answered, if one does without routing");
        is(log_of($f, $r->{id})->{prefix}, '-',
           "$name: \$omni_prefix empty");
    }
    is_deeply(route_metrics($f), $before, 'none of them counted');
}

# --- 5. nginx -t ------------------------------------------------------------
{
    my $n = 0;
    my $nginx_t = sub {
        my ($http) = @_;
        my $dir = "$TMP/nginx-t-" . ++$n;
        mkdir $dir;
        mkdir "$dir/$_" for qw(conf logs);
        open(my $fh, '>', "$dir/conf/nginx.conf") or die;
        print $fh "load_module $t::lib::OmniServer::MODULE;\n"
                  . "error_log logs/error.log;\npid logs/nginx.pid;\n"
                  . "events {}\nhttp {\n$http\n}\n";
        close $fh;
        my $cmd = "'$t::lib::OmniServer::NGINX' -t -q -p '$dir' "
                  . '-c conf/nginx.conf 2>&1';
        my $out = `$cmd`;
        return ($? >> 8, $out);
    };
    my $up = "upstream engines {\n%s\n server unix:$TMP/a.sock;\n}\n"
             . "server { listen 127.0.0.1:1; location / { omni_pass "
             . "engines; } }\n";
    my $redis = "omni_redis 127.0.0.1:6379;\n";
    my @cases = (
        ['without omni_redis', sprintf($up, 'omni_prefix_route;'),
         qr/"omni_prefix_route" in upstream "engines" needs "omni_redis"/],
        ['max_waiting=abc', $redis . sprintf($up,
         'omni_prefix_route max_waiting=abc;'),
         qr/invalid parameter "max_waiting=abc" of "omni_prefix_route"/],
        ['max_waiting=-1', $redis . sprintf($up,
         'omni_prefix_route max_waiting=-1;'),
         qr/invalid parameter "max_waiting=-1"/],
        ['max_waiting=', $redis . sprintf($up,
         'omni_prefix_route max_waiting=;'),
         qr/invalid parameter "max_waiting="/],
        ['an unknown parameter', $redis . sprintf($up,
         'omni_prefix_route weight=2;'),
         qr/invalid parameter "weight=2" of "omni_prefix_route"/],
        ['two parameters', $redis . sprintf($up,
         'omni_prefix_route max_waiting=1 max_waiting=2;'),
         qr/invalid number of arguments in "omni_prefix_route"/],
        ['in http{}', $redis . "omni_prefix_route;\n",
         qr/"omni_prefix_route" directive is not allowed here/],
        ['in server{}', $redis . "server { omni_prefix_route; }\n",
         qr/"omni_prefix_route" directive is not allowed here/],
        ['in location{}', $redis . "server { location / { "
         . "omni_prefix_route; } }\n",
         qr/"omni_prefix_route" directive is not allowed here/],
        ['a backup server', $redis . "upstream engines { omni_prefix_route;"
         . " server unix:$TMP/a.sock; server unix:$TMP/b.sock backup; }\n",
         qr/backup/],
    );
    for my $c (@cases) {
        my ($name, $http, $re) = @$c;
        my ($rc, $out) = $nginx_t->($http);
        isnt($rc, 0, "nginx -t: $name: refused");
        like($out, $re, "nginx -t: $name: says why") or diag $out;
        like($out, qr/\[emerg\]/, "nginx -t: $name: at emerg");
    }
    for my $ok (['max_waiting=0', $redis . sprintf($up,
                 'omni_prefix_route max_waiting=0;')],
                ['omni_redis after the upstream', sprintf($up,
                 'omni_prefix_route max_waiting=3;') . $redis],
                ['with max_fails, weight, down, max_conns', $redis
                 . "upstream engines { omni_prefix_route; server unix:"
                 . "$TMP/a.sock weight=2 max_fails=3 fail_timeout=5s "
                 . "max_conns=9; server unix:$TMP/b.sock down; }\n"]) {
        my ($rc, $out) = $nginx_t->($ok->[1]);
        is($rc, 0, "nginx -t: $ok->[0]: accepted") or diag $out;
    }
}

# --- 6. hostile requests: as without routing, and no crash -----------------
{
    my $big = 'word ' x 800_000;
    my @cases = (
        ['5000 messages', chat([map { { role => 'user', content => "m$_" } }
                                1 .. 5000])],
        ['3000 messages', chat([map { { role => 'user', content => "m$_" } }
                                1 .. 3000])],
        ['a 4 MB message', chat([{ role => 'user', content => $big }])],
        ['a 4 MB message after a held one', chat([
            { role => 'system', content => $S1 },
            { role => 'user', content => $big }])],
        ['a message that is a string', chat(['hello',
            { role => 'user', content => 'hi' }])],
        ['a message that is a number', chat([{ role => 'system',
            content => $S1 }, 5])],
        ['a message that is an array', chat([[{ role => 'user',
            content => 'hi' }]])],
        ['a message that is null', chat([{ role => 'system',
            content => $S1 }, undef])],
        ['a part of an unknown type', chat([{ role => 'system',
            content => $S1 }, { role => 'user', content => [{
            type => 'video', video => { url => 'x' } }] }])],
        ['a part without a type', chat([{ role => 'user',
            content => [{ text => 'hi' }] }])],
        ['an image part', chat([{ role => 'user', content => [{
            type => 'image_url', image_url => { url => 'x' } }] }])],
        ['a part whose text is a number', chat([{ role => 'user',
            content => [{ type => 'text', text => 5 }] }])],
        (map { my $p = $_; ["a part that is $p->[0]", chat([{ role => 'user',
            content => [$p->[1]] }])] }
         ['an integer', 5], ['a float', 1.5], ['a string', 'hi'],
         ['an array', [1, 2]], ['true', JSON::PP::true], ['null', undef],
         ['an empty object', {}]),
        ['a text part, then a number', chat([{ role => 'user', content => [
            { type => 'text', text => 'hi' }, 7] }])],
        ['content that is an object', chat([{ role => 'user',
            content => { type => 'text', text => 'hi' } }])],
        ['content that is a number', chat([{ role => 'user',
            content => 42 }])],
        ['a role that is a number', chat([{ role => 1, content => 'hi' }])],
        ['an unknown role', chat([{ role => 'robot', content => 'hi' }])],
        ['no role', chat([{ content => 'hi' }])],
        ['a user without content', chat([{ role => 'user' }])],
        ['an audio id that is not an object', chat([{ role => 'user',
            content => 'hi' }, { role => 'assistant', audio => 5 }])],
    );
    for my $c (@cases) {
        my ($name, $req) = @$c;
        my $r = post($f, '/r/v1/chat/completions', $req);
        my $d = post($f, '/v1/chat/completions', $req);
        ok($r->{status} && $r->{status} < 500,
           "$name: answered ($r->{status})") or diag $r->{body};
        is($r->{status}, $d->{status}, "$name: as without routing");
        is($r->{json} && $r->{json}{error} && $r->{json}{error}{message},
           $d->{json} && $d->{json}{error} && $d->{json}{error}{message},
           "$name: the same error");
    }
    is_deeply([bad_lines($f)], [], 'no worker crashed, no alert');
}

# --- 7. with omni_limit: the lookup rides with the tokens charge ----------
{
    # two conversations on each engine, then a turn of each through a
    # limited location: round robin alone would get two of them wrong
    my @on = ($E0, $E0, $E1, $E1);
    for my $n (0 .. 3) {
        conv($f, "l$n", "$S2 Be brief, number $n.");
        turn($f, "l$n", ($on[$n] eq $E0 ? '/e0' : '/e1')
                        . '/v1/chat/completions', 'How do I grow beans?');
    }
    my @r;
    $f->{redis}->monitor_start;
    push @r, turn($f, 'l0', '/l/v1/chat/completions', 'And peas?');
    my @cmds = grep { /"(EVALSHA|MGET)"/ } $f->{redis}->monitor_stop;
    push @r, map { turn($f, "l$_", '/l/v1/chat/completions', 'And peas?') }
             1 .. 3;
    my ($at) = grep { $cmds[$_] =~ /"MGET"/ } 0 .. $#cmds;
    ok(defined $at && $at > 0, 'omni_limit: one MGET') or diag explain \@cmds;
    my ($client) = ($cmds[$at // 0] =~ /\[\d+ (\S+)\]/);
    like($at ? $cmds[$at - 1] : '', qr/\Q$client\E\] "EVALSHA" "\w+" "1" (?#
         )"omni:limit:tpm:\w+" "check"/,
         "omni_limit: sent right after the prompt's tokens charge")
        or diag explain \@cmds;
    ok(defined $r[0]{headers}{'x-ratelimit-remaining-tokens'},
       "omni_limit: the limit's headers");
    is_hit($r[$_], "omni_limit: l$_ turn 2", $on[$_], $r[$_]{prev})
        for 0 .. 3;
}

# --- the headers, the log and the metrics agree ----------------------------
{
    log_of($f, $_->{id}) for get($f, '/rmetrics');
    my $log = log_lines($f);
    my %count = (hit => 0, miss => 0, fallback => 0);
    my $bad = 0;
    for my $id (sort { $a <=> $b } keys %$log) {
        my $l = $log->{$id};
        next if $l->{prefix} eq '-';
        $count{ $l->{prefix} }++;
        my $want = logged_route($l);
        $bad++, diag("request $id: $l->{header} vs $want")
            if $l->{header} ne $want && $l->{header} ne '-';
        $bad++, diag("request $id: $l->{prefix} with messages "
                     . "$l->{messages}, tokens $l->{tokens}")
            if $l->{prefix} ne 'hit'
               && "$l->{messages} $l->{tokens}" ne '0 0';
        $bad++, diag("request $id: engine $l->{engine}, upstream "
                     . $l->{upstream}) if $l->{engine} ne $l->{upstream};
    }
    is($bad, 0, 'the log variables say what x-omni-route says');
    ok($count{hit} >= 11 && $count{miss} >= 5,
       "hits ($count{hit}) and misses ($count{miss}) were logged");
    is_deeply(route_metrics($f), \%count,
              'omni_nginx_route_total counts what the log has');
    is_deeply([bad_lines($f)], [], 'error.log: no alert, no crash');
}

# --- a reload: the new workers route as the old ones did --------------------
{
    t::lib::OmniServer::omni_server_reload($f->{s});
    ok(wait_until(20, sub { (get($f, '/rmetrics')->{body} // '')
                            =~ /^omni_nginx_redis_up 1$/m }),
       'reload: the new worker is connected to Redis');
    my $r = turn($f, 'c1', '/r/v1/chat/completions', 'And the next day?');
    is_hit($r, 'reload: c1', $E0, $r->{prev});
    is_deeply([bad_lines($f)], [], 'reload: no alert, no crash');
}

fleet_stop($f);
done_testing();

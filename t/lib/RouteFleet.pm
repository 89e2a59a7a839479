# t::lib::RouteFleet -- a small fleet for the suites of prefix-aware
# routing (t/route.t, t/route_fallback.t): a Redis of its own
# (t::lib::Redis), real engines publishing to it (`omni-engine serve
# --redis`, t/engine/proto.pl's serve_start) and one nginx
# (t::lib::OmniServer) whose upstream routes by prefix over them:
#
#   use lib '.';
#   use t::lib::RouteFleet;
#   my $f = fleet_start(engines => [[], ['--kv-cache-mb', 0.3]],
#                       timeout => '2s', workers => 1,
#                       ns => 'omni:',  (engines' and nginx's namespace)
#                       upstream => 'zone engines 256k;',
#                       api_keys => ['sk-a', 'sk-b'],
#                       http => sub { my ($f) = @_; '...' },
#                       server => sub { my ($f) = @_; '...' });
#
#   upstream engines { omni_prefix_route; server unix:E0; server unix:E1; }
#   location /r/       omni_pass engines                 (routed)
#   location /nohdr/   the same, omni_route_header off
#   location /k/       the same, omni_api_keys (api_keys =>)
#   location /eN/      omni_pass unix:EN                 (engine N alone)
#   location /v1/      omni_pass unix:E0                 (OmniServer's)
#   location = /rmetrics   omni_metrics over the upstream
#
# Every location logs to logs/route.log: the X-Test-Id a request sent,
# its status, $omni_prefix, $omni_engine, $omni_prefix_messages,
# $omni_prefix_tokens, $upstream_addr and the x-omni-route sent; every
# answer carries X-Engine: $upstream_addr.
#
# $f->{redis}, $f->{engines} ([serve_start hashes]), $f->{route}
# (["unix:E0", ...], each engine's --route-id), $f->{s} (OmniServer's),
# $f->{port}, $f->{prefix}, $f->{model} (the served model's id), $f->{ns}
# (the key namespace).
#
# Helpers: post/get (HTTP::Tiny; the reply with its x-omni-route parsed),
# engine_form (what the engine receives for a client's request), cli_keys
# and published (`omni-engine prefix-keys`), px (a prefix key's Redis
# name), held/wait_held (whether an engine's keys are in Redis),
# route_metrics (omni_nginx_route_total), log_lines and log_of (route.log),
# bad_lines (error.log's alerts, crits, crashed workers), wait_until;
# conversations (conv, turn: a turn through a location, then waiting
# until the engine that answered publishes it), holder (which engines
# hold the longest prefix of a request, read from Redis: what nginx
# should choose), and the checks is_hit and is_miss.
package t::lib::RouteFleet;

use strict;
use warnings;

use Digest::SHA qw(sha1_hex);
use Exporter 'import';
use HTTP::Tiny;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);

use t::lib::OmniServer;
use t::lib::Proc qw(wait_for);
use t::lib::Redis;

# wait_until(SECONDS, COND): t::lib::Proc's wait_for, under the name the
# suites use
*wait_until = \&wait_for;

our @EXPORT = qw(logged_route fleet_start fleet_stop post get engine_form tenant_salt
                 cli_keys published px held wait_held route_metrics
                 log_lines log_of bad_lines wait_until used_keys chat_req
                 bearer conv turn is_hit is_miss holder engine_index);

our $BS = 16;                       # the engines' block size (default)

my $JSON = JSON::PP->new->utf8->canonical;
my $ids = 0;
my (@fleets, $pid0);
$pid0 = $$;

sub fleet_start {
    my (%o) = @_;
    my $f = { redis => t::lib::Redis->start, ns => $o{ns} // 'omni:' };
    push @fleets, $f;
    my $addr = $f->{redis}->addr;
    my @ns = $o{ns} ? ('--redis-namespace', $o{ns}) : ();
    for my $args (@{ $o{engines} // [[], []] }) {
        push @{ $f->{engines} },
            main::serve_start(args => ['--redis', $addr, @ns, @$args],
                              timeout => 60);
    }
    $f->{route} = [map { "unix:$_->{socket}" } @{ $f->{engines} }];
    my $servers = join '', map { "        server $_;\n" } @{ $f->{route} };
    my $keys = '';
    if ($o{api_keys}) {
        my $file = "$main::TMP/route-api-keys";
        open(my $fh, '>', $file) or die "$file: $!\n";
        print $fh "$_\n" for @{ $o{api_keys} };
        close $fh;
        $keys = "omni_api_keys $file;";
    }
    my $timeout = $o{timeout} // '2s';
    my $upstream = $o{upstream} ? "        $o{upstream}\n" : '';
    my $ns = $o{ns} ? " namespace=$o{ns}" : '';
    my $http = <<"HTTP";
    omni_redis $addr timeout=$timeout$ns;

    log_format route '\$http_x_test_id \$status "\$omni_prefix" '
                     '"\$omni_engine" "\$omni_prefix_messages" '
                     '"\$omni_prefix_tokens" "\$upstream_addr" '
                     '"\$sent_http_x_omni_route"';

    upstream engines {
        omni_prefix_route;
$servers$upstream    }
HTTP
    $http .= $o{http}->($f) if $o{http};
    my $server = <<"SERVER";
        access_log logs/route.log route;
        client_max_body_size 32m;
        add_header X-Engine \$upstream_addr always;

        location /r/ {
            omni_pass engines;
        }
        location /nohdr/ {
            omni_route_header off;
            omni_pass engines;
        }
        location /k/ {
            $keys
            omni_pass engines;
        }
        location = /rmetrics {
            omni_metrics;
            omni_pass engines;
        }
SERVER
    for my $i (0 .. $#{ $f->{route} }) {
        $server .= "        location /e$i/ {\n"
                   . "            omni_pass $f->{route}[$i];\n"
                   . "        }\n";
    }
    $server .= $o{server}->($f) if $o{server};
    $f->{s} = omni_server_start(socket => $f->{engines}[0]{socket},
                                workers => $o{workers} // 1,
                                http => $http, server => $server);
    $f->{port} = $f->{s}{port};
    $f->{prefix} = $f->{s}{prefix};
    $f->{ua} = HTTP::Tiny->new(timeout => 60, keep_alive => 0);
    $f->{model} = main::models($f->{engines}[0])->{data}[0]{id};
    # every worker connected to Redis, else its first lookups would be
    # fallbacks
    my $workers = $o{workers} // 1;
    wait_until(20, sub { (get($f, '/rmetrics')->{body} // '')
                         =~ /^omni_nginx_redis_up $workers$/m })
        or die "nginx's workers did not connect to Redis\n";
    return $f;
}

sub fleet_stop {
    my ($f) = @_;
    omni_server_stop($f->{s}) if $f->{s};
    for my $e (grep { $_->{pid} } @{ $f->{engines} // [] }) {
        main::serve_stop($e, 15);
        $e->{pid} = undef;
    }
    $f->{redis}->stop;
}

# A test that dies (or is killed by SIGTERM, which OmniServer turns into
# exit) stops its engines too: nginx and Redis have END blocks of their
# own, the engines' serve_start none.
END {
    local $?;
    if (defined $pid0 && $$ == $pid0) {
        fleet_stop($_) for @fleets;
    }
}

# The x-omni-route an access log line (log_lines) says was due.
sub logged_route {
    my ($l) = @_;
    return "$l->{prefix}; engine=$l->{engine}"
           . ($l->{prefix} eq 'hit'
              ? "; messages=$l->{messages}; tokens=$l->{tokens}" : '');
}

# x-omni-route: "hit; engine=unix:/x; messages=6; tokens=1184" as
# { result, engine, messages, tokens }, or undef when absent.
sub parse_route {
    my ($h) = @_;
    return undef unless defined $h;
    my ($result, @kv) = split /;\s*/, $h;
    return { result => $result, map { /^([^=]+)=(.*)$/ ? ($1, $2) : () } @kv };
}

sub reply {
    my ($id, $r, $t0) = @_;
    my $json = eval { JSON::PP->new->utf8->decode($r->{content}) };
    my $up = $r->{headers}{'x-engine'};
    return { id => $id, status => $r->{status}, headers => $r->{headers},
             body => $r->{content}, json => $json,
             route => parse_route($r->{headers}{'x-omni-route'}),
             upstream => $up, engine => defined $up ? (split /, /, $up)[-1]
                                                    : undef,
             secs => time - $t0 };
}

# POST path JSON (a hash, or a string sent as it is); extra headers. The
# reply: { id (its X-Test-Id), status, headers, body, json, route,
# upstream (X-Engine: every engine tried), engine (the last of them, the
# one that answered), secs }.
sub post {
    my ($f, $path, $body, %h) = @_;
    my $id = ++$ids;
    my $t0 = time;
    my $r = $f->{ua}->post("http://127.0.0.1:$f->{port}$path", {
        headers => { 'Content-Type' => 'application/json',
                     'X-Test-Id' => $id, %h },
        content => ref $body ? $JSON->encode($body) : $body });
    return reply($id, $r, $t0);
}

sub get {
    my ($f, $path, %h) = @_;
    my $id = ++$ids;
    my $t0 = time;
    my $r = $f->{ua}->get("http://127.0.0.1:$f->{port}$path",
                          { headers => { 'X-Test-Id' => $id, %h } });
    return reply($id, $r, $t0);
}

# The cache salt nginx gives a request: prompt_cache_key, after the API
# key's tenant name ("key-" and 16 hex digits of its SHA-1) with
# omni_api_keys on.
sub tenant_salt {
    my ($api_key, $pck) = @_;
    my $t = defined $api_key ? 'key-' . substr(sha1_hex($api_key), 0, 16)
                             : '';
    return $t unless defined $pck && length $pck;
    return length $t ? "$t:$pck" : $pck;
}

# What the engine receives for a client's chat request (the module's
# ngx_http_omni_gen_messages): each message's role, content and audio,
# input_audio parts as {"type": "input_audio", "index": k} with an
# "audio_in" entry each, and the cache_salt.
sub engine_form {
    my ($req, $salt) = @_;
    my (@in, @msgs);
    for my $m (@{ $req->{messages} }) {
        if (ref $m ne 'HASH') {
            push @msgs, $m;
            next;
        }
        my %e;
        $e{role} = $m->{role} if exists $m->{role};
        my $c = $m->{content};
        if (ref $c eq 'ARRAY') {
            $c = [map {
                ref $_ eq 'HASH' && ($_->{type} // '') eq 'input_audio'
                ? do { push @in, { format => 'wav', bytes => 100 };
                       { type => 'input_audio', index => $#in } }
                : $_ } @$c];
        }
        $e{content} = $c if defined $c;
        $e{audio} = $m->{audio} if defined $m->{audio};
        push @msgs, \%e;
    }
    return { (defined $req->{model} ? (model => $req->{model}) : ()),
             messages => \@msgs,
             (defined $salt && length $salt ? (cache_salt => $salt) : ()),
             (@in ? (audio_in => \@in) : ()) };
}

# `omni-engine prefix-keys` for an engine request: [[i, hex, tokens], ...]
# (tokens with the served model's vocabulary when $model).
sub cli_keys {
    my ($ereq, $model) = @_;
    my ($rc, $out, $err) = main::run_engine(
        'prefix-keys', ($model ? ('--model', $main::MODEL) : ()),
        '--block-size', $BS, '--request', $JSON->encode($ereq));
    die "prefix-keys: $err" if $rc != 0;
    return [map { [split ' '] } split /\n/, $out];
}

# The keys of cli_keys nginx asks for: all of up to 64, else the first 16
# and the last 48 (prefix_key.h's omni_pkey_used).
sub used_keys {
    my ($keys) = @_;
    my $n = @$keys;
    return [grep { $n <= 64 || $_->[0] < 16 || $_->[0] >= $n - 48 } @$keys];
}

# hex => tokens of what an engine publishes for it once computed.
sub published {
    my ($ereq) = @_;
    return { map { $_->[1] => $_->[2] } grep { $_->[2] > 0 }
             @{ cli_keys($ereq, 1) } };
}

sub px {
    my ($f, $i, $hex) = @_;
    return "$f->{ns}px:$f->{route}[$i]:$hex";
}

# Whether engine i's keys of $want (hex => tokens) are all in Redis, with
# their tokens.
sub held {
    my ($f, $i, $want) = @_;
    for my $hex (keys %$want) {
        my $v = $f->{redis}->try_cmd('GET', px($f, $i, $hex));
        return 0 unless defined $v && !ref $v && $v eq $want->{$hex};
    }
    return 1;
}

# Waits until engine i publishes what it holds of the engine request.
sub wait_held {
    my ($f, $i, $ereq, $timeout) = @_;
    my $want = published($ereq);
    return wait_until($timeout // 10, sub { held($f, $i, $want) });
}

# { hit => n, miss => n, fallback => n } of omni_nginx_route_total.
sub route_metrics {
    my ($f) = @_;
    my $r = get($f, '/rmetrics');
    my %m;
    $m{$1} = $2 while ($r->{body} // '')
        =~ /^omni_nginx_route_total\{result="(\w+)"\} (\d+)$/mg;
    return \%m;
}

# route.log: { id => {status, prefix, engine, messages, tokens, upstream,
# header} }, "-" for what was not set.
sub log_lines {
    my ($f) = @_;
    my %l;
    open(my $fh, '<', "$f->{prefix}/logs/route.log") or return \%l;
    while (<$fh>) {
        my ($id, $st, @q) = /^(\S+) (\d+) "([^"]*)" "([^"]*)" "([^"]*)" (?#
                             )"([^"]*)" "([^"]*)" "([^"]*)"$/ or next;
        my %e;
        @e{qw(status prefix engine messages tokens upstream header)} =
            ($st, @q);
        $l{$id} = \%e;
    }
    close $fh;
    return \%l;
}

# The log line of request $id, once nginx has written it (it logs after
# the answer's last byte, which the client may have read before).
sub log_of {
    my ($f, $id, $timeout) = @_;
    my $l;
    wait_until($timeout // 10, sub { $l = log_lines($f)->{$id} });
    return $l // {};
}

# error.log lines that must never be: alerts, crits, emergencies, a
# worker that crashed.
sub bad_lines {
    my ($f) = @_;
    return grep { /\[(alert|crit|emerg)\]|exited on signal|segfault/ }
           split /\n/, main::slurp("$f->{prefix}/logs/error.log");
}

# --- conversations ----------------------------------------------------------

sub chat_req {
    my ($f, $msgs, %o) = @_;
    return { model => $f->{model}, messages => $msgs, max_tokens => 8,
             temperature => 0, %o };
}

sub bearer { return (Authorization => "Bearer $_[0]") }

# Which of the fleet's engines a route ("unix:...") is; undef for none.
sub engine_index {
    my ($f, $route) = @_;
    my ($i) = grep { $f->{route}[$_] eq ($route // '') } 0 .. $#{ $f->{route} };
    return $i;
}

# A conversation: its system prompt (none when undef), and req (extra
# request fields), api_key.
sub conv {
    my ($f, $c, $system, %o) = @_;
    $f->{conv}{$c} = { msgs => defined $system
                               ? [{ role => 'system', content => $system }]
                               : [], %o };
    return $f->{conv}{$c};
}

# The SSE answer's text and usage.
sub sse_answer {
    my ($body) = @_;
    my ($text, $usage) = ('', undef);
    for my $d ($body =~ /^data: (.*)$/mg) {
        next if $d eq '[DONE]';
        my $j = eval { JSON::PP->new->utf8->decode($d) } or next;
        $text .= $j->{choices}[0]{delta}{content} // ''
            if @{ $j->{choices} // [] };
        $usage = $j->{usage} if $j->{usage};
    }
    return ($text, $usage);
}

# One turn of conversation $c through $path: its messages so far and a
# new user message (stream => 1: streamed, with usage). The answer is
# appended, then it waits until the engine that answered publishes what
# it holds of the turn. The reply, with {cached} (usage's cached tokens),
# {req} (what was sent), {ereq} (what the engine got) and {prev} (the
# keys the conversation's previous turn published, [i, hex, tokens]).
sub turn {
    my ($f, $c, $path, $text, %o) = @_;
    my $cv = $f->{conv}{$c};
    my $req = chat_req($f, [@{ $cv->{msgs} },
                            { role => 'user', content => $text }],
                       %{ $cv->{req} // {} },
                       $o{stream} ? (stream => JSON::PP::true,
                                     stream_options => {
                                         include_usage => JSON::PP::true })
                                  : ());
    my $r = post($f, $path, $req, $cv->{api_key} ? bearer($cv->{api_key})
                                                 : ());
    is($r->{status}, 200, "$c: turn " . int(@{ $req->{messages} } / 2)
       . " answered via $path") or diag $r->{body};
    my ($answer, $usage) = $o{stream} ? sse_answer($r->{body})
        : ($r->{json}{choices}[0]{message}{content}, $r->{json}{usage});
    $r->{cached} = $usage->{prompt_tokens_details}{cached_tokens} // 0;
    $r->{prev} = $cv->{keys};
    $r->{req} = $req;
    $r->{ereq} = engine_form($req, $cv->{api_key}
        ? tenant_salt($cv->{api_key}, $req->{prompt_cache_key})
        : $req->{prompt_cache_key});
    $cv->{msgs} = [@{ $req->{messages} },
                   { role => 'assistant', content => $answer // '' }];
    my $i = engine_index($f, $r->{engine});
    ok(defined $i && wait_held($f, $i, $r->{ereq}),
       "$c: the engine that answered publishes the turn's keys");
    $cv->{keys} = [grep { $_->[2] > 0 } @{ cli_keys($r->{ereq}, 1) }];
    $cv->{engine} = $r->{engine};
    return $r;
}

# A hit on $engine for the longest key of $held ([i, hex, tokens], what
# an earlier turn published), and the engine's prefix cache served it.
sub is_hit {
    my ($r, $what, $engine, $held) = @_;
    my $last = $held->[-1];
    is($r->{route}{result}, 'hit', "$what: hit") or diag explain $r->{route};
    is($r->{route}{engine}, $engine, "$what: engine=$engine");
    is($r->{engine}, $engine, "$what: X-Engine says it answered");
    is($r->{route}{messages}, $last->[0] + 1,
       "$what: messages=" . ($last->[0] + 1));
    is($r->{route}{tokens}, $last->[2], "$what: tokens=$last->[2]");
    ok($r->{cached} >= $last->[2], "$what: the engine's prefix cache "
       . "served them ($r->{cached} cached tokens)");
}

sub is_miss {
    my ($r, $what) = @_;
    is($r->{route}{result}, 'miss', "$what: miss")
        or diag explain $r->{route};
    is($r->{route}{engine}, $r->{engine}, "$what: engine= what answered");
    ok(!exists $r->{route}{messages}, "$what: no messages=, tokens=");
    is($r->{cached}, 0, "$what: nothing cached");
}

# Which of the engines @usable (indexes) hold the longest prefix of the
# engine request, as Redis says now: { engines => [routes], messages,
# tokens }, undef when none holds any. What nginx should choose.
sub holder {
    my ($f, $ereq, @usable) = @_;
    my $keys = used_keys(cli_keys($ereq));
    my $best;
    for my $i (@usable) {
        for my $k (reverse @$keys) {
            my $v = $f->{redis}->try_cmd('GET', px($f, $i, $k->[1]));
            next unless defined $v && !ref $v;
            my $n = $k->[0] + 1;
            if (!$best || $n > $best->{messages}) {
                $best = { engines => [], messages => $n, tokens => $v };
            }
            push @{ $best->{engines} }, $f->{route}[$i]
                if $n == $best->{messages};
            last;
        }
    }
    return $best;
}

1;

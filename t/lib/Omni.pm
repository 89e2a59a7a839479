# t::lib::Omni -- what the Test::Nginx suites of ngx_omni_module share.
#
#   use lib '.';
#   use t::lib::Omni;                       # first: sets the environment
#   use Test::Nginx::Socket 'no_plan';
#   run_tests();
#   __DATA__
#   ...
#
# Loading it:
#   - points Test::Nginx at Debian's nginx (TEST_NGINX_BINARY), a free port
#     (TEST_NGINX_SERVER_PORT) and a server root under build/t/servroot/
#     named after the .t file, unless the environment already says;
#   - starts ONE `omni-engine serve` (t/engine/proto.pl's serve_start) on
#     a temporary socket, exported as TEST_NGINX_OMNI_SOCKET, and stops it
#     at END by its pid. A suite that wants none sets
#     $t::lib::Omni::NoEngine = 1 in a BEGIN block before the `use`.
#     Extra engine flags: OMNI_TEST_ENGINE_ARGS.
#   - exports TEST_NGINX_OMNI_DEAD_SOCKET: a socket path nothing listens on
#     (engine down), TEST_NGINX_OMNI_MODULE (the .so) and
#     TEST_NGINX_OMNI_MODEL (the served model's id).
#
# The block preprocessor adds `load_module build/ngx_omni_module.so;` to
# every block's main_config, and a default server config when a block has
# no --- config:
#
#   location /v1/      { omni_pass unix:$TEST_NGINX_OMNI_SOCKET; }
#   location = /health  { omni_health  unix:...; }   (see $DefaultConfig)
#   location = /metrics { omni_metrics unix:...; }
#
# Extra block sections:
#   --- check         Perl code run on each response body, with $body (the
#                     de-chunked body), $json (decoded, or undef), @events
#                     (SSE data payloads, decoded JSON or the string
#                     '[DONE]'), $name, $block, $i (which request of the
#                     block, from 0); Test::More's functions and
#                     the helpers below are at hand.
#   --- engine_idle   wait (before the request) until the engine runs no
#                     request (num_requests_running 0), up to N seconds.
#
# Helpers for test code (exported): engine() (the serve_start hash),
# engine_metrics() (proto.pl's metrics: {name => value}), gen(%o) (the
# engine's `generate` output, greedy, for the same prompt), chat_gen(%o),
# sse_events($body), sse_frames($body), sse_parse($body, ...),
# error_is($json, $type, $param, $code) (an OpenAI error object),
# post_json($path, \%body) (a request of its own to the running nginx,
# from a --- check: for tests that chain requests, such as sending back
# the x-omni-seed of an earlier answer).
package t::lib::Omni;

use strict;
use warnings;

use Cwd qw(abs_path getcwd);
use File::Basename qw(basename);
use File::Path qw(make_path);
use IO::Socket::INET;

our ($NoEngine, $Engine, $Pid0, $DefaultConfig);

BEGIN {
    my $root = getcwd();
    die "run the suites from the repository root (prove t/...)\n"
        unless -f "$root/engine/proto/omni_proto.h";
    (my $suite = basename($0)) =~ s/\.t$//;
    $ENV{TEST_NGINX_BINARY} //= '/usr/sbin/nginx';
    $ENV{TEST_NGINX_SERVROOT} //= "$root/build/t/servroot/$suite";
    make_path($ENV{TEST_NGINX_SERVROOT});
    unless ($ENV{TEST_NGINX_SERVER_PORT} || $ENV{TEST_NGINX_PORT}) {
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
                                      LocalPort => 0, Listen => 1)
            or die "no free port: $!\n";
        $ENV{TEST_NGINX_SERVER_PORT} = $s->sockport;
        close $s;
    }
    # Debian's nginx logs at debug only with --with-debug (it has it):
    # a lot of text per request; info is enough for these suites.
    $ENV{TEST_NGINX_LOG_LEVEL} //= 'info';
    $ENV{TEST_NGINX_OMNI_MODULE} //= "$root/build/ngx_omni_module.so";
    die "$ENV{TEST_NGINX_BINARY} is missing (make test-deps)\n"
        unless -x $ENV{TEST_NGINX_BINARY};
    die "$ENV{TEST_NGINX_OMNI_MODULE} is not built (make "
        . "build/ngx_omni_module.so)\n" unless -f $ENV{TEST_NGINX_OMNI_MODULE};
}

use Test::Nginx::Socket ();
use JSON::PP ();
use Exporter 'import';
use Time::HiRes qw(time sleep);

# proto.pl's helpers go into main, as for the engine tests
{ package main; require './t/engine/proto.pl'; }

our @EXPORT = qw(engine engine_metrics gen chat_gen sse_events sse_frames
                 sse_parse error_is wait_engine_idle post_json
                 $DefaultConfig);

$Pid0 = $$;
$ENV{TEST_NGINX_OMNI_DEAD_SOCKET} = "$main::TMP/no-engine.sock";
if (!$NoEngine) {
    my @args = split ' ', ($ENV{OMNI_TEST_ENGINE_ARGS} // '');
    $Engine = main::serve_start(args => \@args);
    $ENV{TEST_NGINX_OMNI_SOCKET} = $Engine->{socket};
    $ENV{TEST_NGINX_OMNI_MODEL} = main::models($Engine)->{data}[0]{id};
} else {
    $ENV{TEST_NGINX_OMNI_SOCKET} = $ENV{TEST_NGINX_OMNI_DEAD_SOCKET};
    ($ENV{TEST_NGINX_OMNI_MODEL} = basename($main::MODEL)) =~ s/\.gguf$//;
}

# A test killed by SIGTERM or SIGINT (a timeout, Ctrl-C) still stops what
# it started: exit runs the END blocks.
$SIG{$_} = sub { exit 1 } for qw(TERM INT);

END {
    if (defined $Pid0 && $$ == $Pid0 && $Engine) {
        main::serve_stop($Engine, 10);
        undef $Engine;
    }
}

$DefaultConfig = <<'CONF';
    location /v1/ {
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
    location = /health {
        omni_health;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
    location = /metrics {
        omni_metrics;
        omni_pass unix:$TEST_NGINX_OMNI_SOCKET;
    }
CONF

sub engine () { return $Engine }

sub engine_metrics () { return main::metrics($Engine) }

# Waits until the engine runs and queues nothing; returns its metrics.
sub wait_engine_idle (;$) {
    my $timeout = shift // 10;
    my $until = time + $timeout;
    my $m;
    while (1) {
        $m = main::metrics($Engine);
        last if ($m->{omni_engine_num_requests_running} // 1) == 0
                && ($m->{omni_engine_num_requests_waiting} // 1) == 0;
        last if time > $until;
        sleep 0.02;
    }
    return $m;
}

# The engine's own greedy output for a prompt: `generate --temperature 0`.
#   gen(prompt => 'Once upon a time', max_tokens => 16, stop => [...])
sub gen (@) {
    my %o = @_;
    my @args = ('generate', '--model', $main::MODEL, '--threads', 1,
                '--temperature', 0, '--prompt', $o{prompt},
                '--max-tokens', $o{max_tokens} // 256);
    push @args, '--chat' if $o{chat};
    push @args, map { ('--stop', $_) } @{ $o{stop} // [] };
    push @args, '--ignore-eos' if $o{ignore_eos};
    my ($rc, $out, $err) = main::run_engine(@args);
    die "omni-engine generate failed ($rc): $err\n" if $rc != 0;
    return $out;
}

# The same for a one-message chat (the engine applies the model's chat
# template, or its plain format when the model has none).
sub chat_gen (@) {
    return gen(@_, chat => 1);
}

sub decode_json { return JSON::PP->new->utf8->decode(shift) }

# The data payloads of an SSE body, in order; comments (": ...") and other
# fields are skipped, events are separated by an empty line.
sub sse_frames ($) {
    my $body = shift;
    my @ev;
    for my $event (split /\n\n/, $body) {
        my @data = map { /^data: ?(.*)$/ ? $1 : () } split /\n/, $event;
        push @ev, join("\n", @data) if @data;
    }
    return @ev;
}

# The same, each JSON payload decoded ('[DONE]' stays a string).
sub sse_events ($) {
    return map { $_ eq '[DONE]' ? $_ : decode_json($_) } sse_frames(shift);
}

# Walks an SSE body event by event, each matched against the exact bytes
# the module writes (ids, created and the text pieces are the only free
# parts):
#
#   chat:        role chunk, content chunks, finish chunk,
#                [usage chunk], data: [DONE]
#   completions: text chunks, finish chunk, [usage chunk], data: [DONE]
#
# every chunk ending in ,"usage":null when include_usage was asked.
#   sse_parse($body, endpoint => 'chat'|'completions', model => M,
#             include_usage => 0|1)
# Returns { ok => the whole body matched, at => where matching stopped,
#           texts => [pieces], text => joined, finish => reason,
#           reasonings => [delta.reasoning_content pieces, chat: they come
#           before the content], reasoning => joined,
#           usage => {...} or undef, ids => {id => n}, created => {t => n},
#           error => the error event's object, if the stream ended in one }
sub sse_parse ($@) {
    my ($body, %o) = @_;
    my $chat = ($o{endpoint} // 'chat') eq 'chat';
    my $obj = $chat ? 'chat\.completion\.chunk' : 'text_completion';
    my $idp = $chat ? 'chatcmpl-' : 'cmpl-';
    my $model = JSON::PP->new->utf8->allow_nonref->encode($o{model});
    my $u = $o{include_usage} ? ',"usage":null' : '';
    my $str = qr/"((?:[^"\\]|\\.)*)"/;
    my $head = qr/data: \{"id":"(\Q$idp\E[A-Za-z0-9]+)","object":"$obj",(?#
                  )"created":(\d+),"model":\Q$model\E,/;
    my %s = (texts => [], reasonings => [], ids => {}, created => {},
             ok => 0, at => 0);
    my $unstr = sub { JSON::PP->new->utf8->allow_nonref->decode("\"$_[0]\"") };
    my $seen = sub { $s{ids}{$_[0]}++; $s{created}{$_[1]}++;
                     $s{at} = pos($body) };
    pos($body) = 0;
    if ($chat) {
        $body =~ /\G$head"choices":\[\{"index":0,"delta":\{"role":(?#
                  )"assistant","content":"","refusal":null\},"logprobs":null,(?#
                  )"finish_reason":null\}\]\Q$u\E\}\n\n/gc
            or return \%s;
        $seen->($1, $2);
        while ($body =~ /\G$head"choices":\[\{"index":0,"delta":(?#
                         )\{"reasoning_content":$str\},"logprobs":null,(?#
                         )"finish_reason":null\}\]\Q$u\E\}\n\n/gc) {
            $seen->($1, $2);
            push @{ $s{reasonings} }, $unstr->($3);
        }
        while ($body =~ /\G$head"choices":\[\{"index":0,"delta":(?#
                         )\{"content":$str\},"logprobs":null,(?#
                         )"finish_reason":null\}\]\Q$u\E\}\n\n/gc) {
            $seen->($1, $2);
            push @{ $s{texts} }, $unstr->($3);
        }
        if ($body =~ /\G$head"choices":\[\{"index":0,"delta":\{\},(?#
                      )"logprobs":null,"finish_reason":"(stop|length)"\}\](?#
                      )\Q$u\E\}\n\n/gc) {
            $seen->($1, $2);
            $s{finish} = $3;
        }
    } else {
        while ($body =~ /\G$head"choices":\[\{"text":$str,"index":0,(?#
                         )"logprobs":null,"finish_reason":null\}\]\Q$u\E(?#
                         )\}\n\n/gc) {
            $seen->($1, $2);
            push @{ $s{texts} }, $unstr->($3);
        }
        if ($body =~ /\G$head"choices":\[\{"text":"","index":0,(?#
                      )"logprobs":null,"finish_reason":"(stop|length)"\}\](?#
                      )\Q$u\E\}\n\n/gc) {
            $seen->($1, $2);
            $s{finish} = $3;
        }
    }
    $s{text} = join '', @{ $s{texts} };
    $s{reasoning} = join '', @{ $s{reasonings} };
    if ($o{include_usage} && defined $s{finish}) {
        $body =~ /\G$head"choices":\[\],"usage":(\{[^\n]*\})\}\n\n/gc
            or return \%s;
        $seen->($1, $2);
        $s{usage} = decode_json($3);
    }
    if (!defined $s{finish}
        && $body =~ /\Gdata: (\{"error":\{[^\n]*\}\})\n\n/gc) {
        $s{at} = pos($body);
        $s{error} = decode_json($1)->{error};
    }
    $s{at} = pos($body) // $s{at};
    $s{ok} = $body =~ /\Gdata: \[DONE\]\n\n\z/gc ? 1 : 0;
    return \%s;
}

# Checks an OpenAI error envelope: {"error": {message, type, param, code}}
# with all four keys. $param / $code undef: must be null; $code '*': any.
sub error_is ($$;$$$) {
    my ($j, $type, $param, $code, $name) = @_;
    $name //= 'error';
    my $e = ref $j eq 'HASH' ? $j->{error} : undef;
    Test::More::ok(ref $e eq 'HASH', "$name: an error object")
        or return Test::More::diag(Test::More::explain($j));
    Test::More::is_deeply([sort keys %$e], [qw(code message param type)],
                          "$name: message, type, param, code");
    Test::More::is($e->{type}, $type, "$name: type $type");
    Test::More::is($e->{param}, $param,
                   "$name: param " . ($param // 'null'));
    Test::More::is($e->{code}, $code, "$name: code " . ($code // 'null'))
        if @_ > 3 && !(defined $code && $code eq '*');
    Test::More::ok(defined $e->{message} && length $e->{message},
                   "$name: a message");
}

# POSTs a JSON body to the nginx of the block being run (call it from a
# --- check). Returns { status, headers => { lowercase name => value },
# body, json (decoded, or undef) }.
sub post_json ($$) {
    my ($path, $body) = @_;
    require HTTP::Tiny;
    my $url = 'http://127.0.0.1:' . Test::Nginx::Util::server_port() . $path;
    my $r = HTTP::Tiny->new(timeout => 60)->post($url, {
        headers => { 'Content-Type' => 'application/json' },
        content => JSON::PP->new->utf8->canonical->encode($body) });
    return { status => $r->{status}, headers => $r->{headers},
             body => $r->{content},
             json => scalar eval { decode_json($r->{content}) } };
}

# --- the block preprocessor and the --- check section ---------------------

Test::Nginx::Socket::add_block_preprocessor(sub {
    my $block = shift;
    my $load = "load_module $ENV{TEST_NGINX_OMNI_MODULE};";
    my $main = $block->main_config // '';
    $block->set_value('main_config', "$load\n$main")
        unless $main =~ /ngx_omni_module\.so/;
    $block->set_value('config', $DefaultConfig)
        unless defined $block->config;
    if (defined $block->engine_idle) {
        my $t = $block->engine_idle + 0 || 10;
        wait_engine_idle($t);
    }
});

Test::Nginx::Socket::add_response_body_check(sub {
    my ($block, $body, $req_idx, $repeated_req_idx, $dry_run) = @_;
    my $code = $block->check;
    return unless defined $code;
    my $name = $block->name;
    return if $dry_run;
    my $json = eval { decode_json($body) };
    my @events = eval { sse_events($body) };
    my $sub = eval "package main; no strict 'vars'; sub {\n"
                   . "my (\$body, \$json, \$name, \$block, \$i, \@events)"
                   . " = \@_;\n"
                   . "#line 1 \"$name --- check\"\n$code\n}";
    if (!$sub) {
        Test::More::fail("$name - check compiles: $@");
        return;
    }
    eval { $sub->($body, $json, $name, $block, $req_idx, @events); 1 }
        or Test::More::fail("$name - check died: $@");
});

1;

#!/usr/bin/perl
# t/fuzz/http_body.pl -- the request-body path of ngx_omni_module, fuzzed
# over raw sockets against nginx + the module + a real `omni-engine serve`.
#
#   t/fuzz/http_body.pl [--seconds 60] [--seed S] [--clients 4] [--verbose]
#   t/fuzz/http_body.pl --replay S:W.N      # one case again, verbosely
#
# Each case is one connection: 1-3 requests (pipelined) to
# /v1/chat/completions, /v1/completions or /v1/audio/transcriptions
# through one of several locations (client_body_buffer_size 128,
# client_body_in_file_only, client_body_in_single_buffer, omni_api_keys),
# with
#
#   bodies   valid requests (streamed or not, unicode, 900 KB of ignored
#            padding), and invalid ones: truncated, mutated, binary,
#            invalid UTF-8, NUL and \u0000, deeply nested, wrong types,
#            empty, over client_max_body_size; for transcriptions valid
#            multipart/form-data in the three SDKs' framings (boundaries
#            bare, quoted, long; names bare or quoted; file first, last
#            or between; text parts with a Content-Type; a file of 0 to
#            200 KB holding CRs, "\r\n--" and boundary prefixes), and
#            invalid: truncated anywhere, bytes mutated, a wrong or
#            missing boundary, a missing Content-Disposition or name,
#            bare LFs, no or another Content-Type;
#   framing  Content-Length right, short, long, zero, absent; chunked with
#            random chunk sizes, hex case, leading zeros, extensions,
#            trailers, and invalid sizes or CRLFs; both headers; an unknown
#            Transfer-Encoding; HTTP/1.0; Expect: 100-continue (waiting
#            for the 100 or not); a wrong method or path (discarded bodies);
#            missing, wrong, malformed and duplicate Authorization;
#   timing   the bytes cut into 1..n writes (or one write per byte) with
#            random delays; the client closing early (before the body is
#            whole, or once the answer starts).
#
# Asserted, per response: no 5xx but 503 (the engine is overloaded or not
# ready: the engine's fault, not the client's), 501 for an unknown
# Transfer-Encoding (nginx's own answer, RFC 9112 6.1) and 501
# audio_input_unavailable for a transcription (an engine without its
# listener stage says so); JSON errors are
# OpenAI error objects; WWW-Authenticate on 401 only, and no key in an
# answer; a 200 is a whole completion (JSON, or SSE ending in [DONE]).
# Per request the case knows the answer to: a valid request on a clean
# connection gets its completion; an empty body 400 "could not parse"; a
# bad key 401; a wrong method 405; an unknown model 404; a multipart body
# that is certainly malformed a 400, and a well-formed one never the
# module's 400 for a malformed body (the parser misreading a framing).
# Throughout (the
# parent process, every 0.5 s): nginx's worker pids do not change, the
# error log has no "exited on signal", [alert], [crit] or [emerg], no
# [error] from the module and none from nginx but the three a client
# causes (invalid chunked body, too large body), /health answers 200.
#
# Reproducible: the seed is printed; case W.N (client W, its Nth case)
# is generated from (seed, W, N) alone, so --replay SEED:W.N sends the
# same bytes in the same writes (timing and the other clients' load
# aside). A failure prints the case, its replay command, and writes its
# bytes to $BUILD/fuzz/http-fail-SEED-W.N.bin.
use strict;
use warnings;
use utf8;
use lib '.';

use Cwd ();
use Digest::MD5 qw(md5);
use File::Path qw(make_path);
use Getopt::Long;
use JSON::PP ();
use POSIX qw(WNOHANG _exit);
use Time::HiRes qw(time sleep);

use t::lib::OmniServer;
use t::lib::RawHttp;

$| = 1;
my %opt = (seconds => 60, clients => 4, verbose => 0);
GetOptions(\%opt, 'seconds=f', 'seed=i', 'clients=i', 'verbose!',
           'replay=s') or die "usage: $0 [--seconds N] [--seed S] "
                              . "[--clients N] [--replay S:W.N]\n";

my $BUILD = $ENV{BUILD} // 'build';
my $OUT = "$BUILD/fuzz/http";
make_path($OUT);

my ($SEED, $REPLAY_W, $REPLAY_N);
if ($opt{replay}) {
    ($SEED, $REPLAY_W, $REPLAY_N) = $opt{replay} =~ /^(\d+):(\d+)\.(\d+)$/
        or die "--replay SEED:W.N\n";
    $opt{verbose} = 1;
} else {
    $SEED = $opt{seed} // ($ENV{FUZZ_SEED} || int(time * 1000) % 2**31);
}

my @KEYS = ('sk-fuzz-right-0001', 'sk-fuzz-other-0002');
my $MAX_BODY = 1 << 20;                 # client_max_body_size (default)

# --- the server ------------------------------------------------------------

# another build of the module (to check that the fuzzer finds a known bug)
$t::lib::OmniServer::MODULE = Cwd::abs_path($ENV{OMNI_NGX_MODULE})
    if $ENV{OMNI_NGX_MODULE};

my $engine = main::serve_start(timeout => 60);
my $MODEL = main::models($engine)->{data}[0]{id};
my $PORT = t::lib::OmniServer::free_port();
my $keys_file = "$OUT/api_keys";
open(my $kf, '>', $keys_file) or die "$keys_file: $!";
print $kf "$_\n" for @KEYS;
close $kf;
my $sock = $engine->{socket};
my $http = <<"CONF";
    client_body_timeout 1s;
    client_header_timeout 2s;
    keepalive_timeout 2s;
    server {
        listen 127.0.0.1:$PORT;
        location /v1/ {
            omni_pass unix:$sock;
        }
        location /small/v1/ {
            client_body_buffer_size 128;
            omni_pass unix:$sock;
        }
        location /file/v1/ {
            client_body_in_file_only clean;
            omni_pass unix:$sock;
        }
        location /single/v1/ {
            client_body_in_single_buffer on;
            client_body_buffer_size 1k;
            omni_pass unix:$sock;
        }
        location /auth/v1/ {
            omni_api_keys ${\ Cwd::abs_path($keys_file) };
            omni_pass unix:$sock;
        }
    }
CONF
my $srv = omni_server_start(name => 'fuzz-http', socket => $sock,
                            workers => 2, http => $http,
                            log_level => $ENV{FUZZ_LOG_LEVEL} // 'info');
my $LOG = "$srv->{prefix}/logs/error.log";

# --- random generation ------------------------------------------------------

sub rnd  { int(rand(shift)) }                   # 0 .. n-1
sub pick { $_[rnd(scalar @_)] }
sub chance { rand() < shift }

sub text {
    my $n = 1 + rnd(shift // 60);
    my @bits = ('Once', ' upon', ' a time', ' "quoted"', ' back\\slash',
                "\n", "\t", ' é', ' 中文', ' 😀', ' Ω', "\x{7f}", ' {"x":1}',
                ' </s>', ' <|im_end|>', ' ', '.', '?');
    my $t = '';
    $t .= pick(@bits) while length($t) < $n;
    return $t;
}

sub json_out {
    my ($v) = @_;
    my $j = JSON::PP->new->canonical(chance(0.5));
    chance(0.3) ? $j->ascii : $j->utf8;
    $j->pretty if chance(0.15);
    my $s = $j->encode($v);
    utf8::encode($s) if utf8::is_utf8($s);
    return $s;
}

# A valid request body; returns (bytes, info).
sub valid_body {
    my ($endpoint) = @_;
    my %b = (model => $MODEL, max_tokens => 1 + rnd(4));
    if ($endpoint eq 'chat') {
        my @m;
        push @m, { role => 'system', content => text(40) } if chance(0.3);
        push @m, { role => 'user', content => text() },
                 { role => 'assistant', content => text(30) } if chance(0.3);
        push @m, { role => 'user', content => chance(0.2)
                   ? [{ type => 'text', text => text() }] : text() };
        $b{messages} = \@m;
    } else {
        $b{prompt} = text();
    }
    my $stream = chance(0.4);
    if ($stream) {
        $b{stream} = JSON::PP::true;
        $b{stream_options} = { include_usage => JSON::PP::true }
            if chance(0.5);
    }
    $b{temperature} = pick(0, 0.5, 1, 1.5) if chance(0.5);
    $b{seed} = rnd(1000) if chance(0.3);
    $b{top_p} = pick(0.5, 0.9, 1) if chance(0.2);
    $b{stop} = chance(0.5) ? text(5) : [text(4), text(4)] if chance(0.2);
    $b{padding} = 'p' x rnd(900_000) if chance(0.04);
    $b{unknown_field} = { nested => [1, 2, { a => text(10) }] }
        if chance(0.1);
    my %info = (kind => 'valid', stream => $stream);
    if (chance(0.04)) {
        $b{model} = 'no-such-model';
        $info{kind} = 'model404';
    }
    return (json_out(\%b), \%info);
}

# An invalid (or possibly invalid) body; returns (bytes, info).
sub invalid_body {
    my ($endpoint) = @_;
    my ($v) = valid_body($endpoint);
    my $what = pick(qw(truncate mutate binary utf8 nul u0000 deep types
                       empty whitespace scalar escape numbers huge bom
                       dupkeys));
    my $b;
    if ($what eq 'truncate') {
        $b = substr($v, 0, rnd(length $v));
    } elsif ($what eq 'mutate') {
        $b = $v;
        for (1 .. 1 + rnd(5)) {
            my $at = rnd(length($b) + 1);
            my $op = rnd(3);
            if ($op == 0) { substr($b, $at, 1, chr(rnd(256))) }
            elsif ($op == 1) { substr($b, $at, 1, '') }
            else { substr($b, $at, 0, pick('{', '}', '[', ']', '"', ',',
                                             ':', '\\', "\0", "\xff")) }
        }
    } elsif ($what eq 'binary') {
        $b = join '', map { chr(rnd(256)) } 1 .. rnd(3000);
    } elsif ($what eq 'utf8') {
        my $bad = pick("\xff\xfe", "\xc0\xaf", "\x80", "\xe2\x82",
                       "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80");
        ($b = $v) =~ s/("(?:content|prompt|text)":\s*")/$1$bad/;
    } elsif ($what eq 'nul') {
        $b = $v;
        substr($b, rnd(length $b), 0, "\0");
    } elsif ($what eq 'u0000') {
        ($b = $v) =~ s/("(?:content|prompt|text)":\s*")/$1\\u0000/;
    } elsif ($what eq 'deep') {
        my $d = pick(10, 63, 64, 65, 200, 5000, 100_000);
        my $o = pick('[', '{"a":');
        my $c = $o eq '[' ? ']' : '}';
        $b = qq({"model":"$MODEL","messages":) . ($o x $d) . '1'
             . ($c x $d) . '}';
    } elsif ($what eq 'types') {
        my %t = (model => $MODEL, max_tokens => 2);
        my $k = pick(qw(messages prompt max_tokens stream temperature
                        stream_options stop model n logprobs));
        $t{$k} = pick(5, 'x', [], {}, JSON::PP::true, undef, -1, 1e30,
                      [[]], [{ role => 5 }]);
        $t{$endpoint eq 'chat' ? 'messages' : 'prompt'} //=
            $endpoint eq 'chat' ? [{ role => 'user', content => 'x' }] : 'x'
            unless $k eq 'messages' || $k eq 'prompt';
        $b = json_out(\%t);
    } elsif ($what eq 'empty') {
        $b = '';
    } elsif ($what eq 'whitespace') {
        $b = pick(' ', "\r\n", "\t \n ");
    } elsif ($what eq 'scalar') {
        $b = pick('null', '[]', '{}', '"x"', '1', 'true', '[{}]');
    } elsif ($what eq 'escape') {
        my $e = pick('\\ud800', '\\udfff', '\\x41', '\\u12', '\\uZZZZ', '\\');
        ($b = $v) =~ s/("(?:content|prompt|text)":\s*")/$1$e/;
    } elsif ($what eq 'numbers') {
        my $n = pick('1e99999', '-0', '123456789012345678901234567890',
                     '0.0000000000000000000001', '-1e-400', '01', '1.', 'NaN');
        ($b = $v) =~ s/("max_tokens":\s*)\d+/$1$n/;
    } elsif ($what eq 'huge') {
        $b = pick('[', ' ', '{"a":"') x ($MAX_BODY + 1 + rnd(100_000));
    } elsif ($what eq 'bom') {
        $b = "\xef\xbb\xbf$v";
    } else {
        ($b = $v) =~ s/^\{/{"model":5,/;
    }
    return ($b, { kind => $b eq '' ? 'empty' : 'invalid', what => $what });
}

# --- multipart bodies (transcriptions) -------------------------------------

my @BCHARS = ('a' .. 'z', 'A' .. 'Z', '0' .. '9');

sub boundary {
    my $k = rnd(4);
    return join('', map { sprintf '%x', rnd(16) } 1 .. 32) if $k == 0;
    return 'openai-' . join('', map { pick(@BCHARS) } 1 .. 16) if $k == 1;
    return '----WebKitFormBoundary' . join('', map { pick(@BCHARS) } 1 .. 16)
        if $k == 2;
    return '=_' . join('', map { pick(@BCHARS, '=', '_', '-', '.') }
                           1 .. 1 + rnd(68));
}

sub bytes_of {
    my ($t) = @_;
    utf8::encode($t);
    return $t;
}

# file bytes a careless scanner trips on
sub stt_file {
    my ($b) = @_;
    my $n = pick(0, 1, 2, 100, 3000, 3000, 70_000, 200_000);
    my @tricks = ("\r", "\n", "\r\n", "\r\n-", "\r\n--", "--$b",
                  "\r\n--" . substr($b, 0, rnd(length $b)), "\r\r\n--\r\n");
    my $f = '';
    while (length $f < $n) {
        $f .= pick('RIFF', 'ID3', 'OggS', "\xff\xfb", '')
              . join('', map { chr(rnd(256)) } 1 .. 1 + rnd(300))
              . pick(@tricks);
    }
    $f = substr($f, 0, $n);

    # the delimiter itself may not be in the data (RFC 2046 5.1.1: the
    # boundary is chosen so); its prefixes and "--" may
    $f =~ s/\r\n--(?=\Q$b\E)/\r\n-_/g;
    return $f;
}

# A well-formed transcription body: (body, boundary, info).
sub stt_parts {
    my $b = boundary();
    my @p = (['model', pick($MODEL, 'whisper-1', 'gpt-4o-transcribe')]);
    my $fmt = chance(0.5) ? pick(qw(json text srt vtt verbose_json)) : undef;
    push @p, ['response_format', $fmt] if $fmt;
    push @p, ['timestamp_granularities[]', pick('word', 'segment')]
        if ($fmt // '') eq 'verbose_json' && chance(0.5);
    push @p, ['stream', pick('true', 'false', 'True')] if chance(0.3);
    push @p, ['language', pick('en', 'EN')] if chance(0.2);
    push @p, ['prompt', bytes_of(text(40))] if chance(0.2);
    push @p, ['temperature', pick('0', '0.4', '1')] if chance(0.2);
    push @p, ['include[]', 'logprobs'] if chance(0.1);
    push @p, ['chunking_strategy', pick('auto', '{"type":"server_vad"}')]
        if chance(0.1);
    push @p, ['x_unknown_' . rnd(9), bytes_of(text(20))] if chance(0.1);
    @p = sort { rnd(3) - 1 } @p if chance(0.3);
    my $file = stt_file($b);
    my $at = pick(0, scalar @p, rnd(@p + 1));
    splice(@p, $at, 0, ['file', $file,
                        filename => pick('a.wav', 'dir/b.mp3', 'C:\\x\\c.flac',
                                         'd.ogg', 'e.webm', 'noext', undef)]);
    my $body = '';
    for my $q (@p) {
        my ($name, $value, %o) = @$q;
        my $bare = $name !~ /\[/ && chance(0.3);
        $body .= "--$b\r\nContent-Disposition: form-data; "
                 . ($bare ? "name=$name" : qq{name="$name"});
        $body .= qq{; filename="$o{filename}"} if defined $o{filename};
        $body .= "\r\n";
        $body .= pick('Content-Type: text/plain; charset=utf-8',
                      'Content-Type: application/octet-stream',
                      'Content-Transfer-Encoding: binary') . "\r\n"
            if chance(0.3);
        $body .= "\r\n$value\r\n";
    }
    $body .= "--$b--" . pick("\r\n", '', "\r\nepilogue\r\n");
    return ($body, $b, { kind => length $file ? 'stt' : 'stt400',
                         what => 'multipart' });
}

# A transcription body, valid or broken: (body, Content-Type or undef,
# info); kind stt400 when it is certainly refused.
sub stt_body {
    my ($body, $b, $info) = stt_parts();
    my $type = "multipart/form-data; boundary="
               . ($b =~ /=/ || chance(0.3) ? qq{"$b"} : $b);
    return ($body, $type, $info) if chance(0.6);
    my $what = pick(qw(truncate mutate boundary notype json nocd noname lf
                       empty));
    if ($what eq 'truncate') {
        $body = substr($body, 0, rnd(rindex($body, "--$b--") + 2));
    } elsif ($what eq 'mutate') {
        for (1 .. 1 + rnd(5)) {
            substr($body, rnd(length $body), 1, chr(rnd(256)));
        }
    } elsif ($what eq 'boundary') {
        $type = "multipart/form-data; boundary=" . boundary();
    } elsif ($what eq 'notype') {
        $type = undef;
    } elsif ($what eq 'json') {
        $type = 'application/json';
    } elsif ($what eq 'nocd') {
        $body =~ s/Content-Disposition: form-data; name="?model"?/X-Y: z/;
    } elsif ($what eq 'noname') {
        $body =~ s/form-data; name="?model"?/form-data; x=1/;
    } elsif ($what eq 'lf') {
        $body =~ s/(name="?model"?)\r\n/$1\n/;
    } else {
        $body = '';
    }
    return ($body, $type, { kind => $what eq 'mutate' ? 'invalid' : 'stt400',
                            what => "multipart-$what" });
}

# The body framed: headers to add, the bytes after the header, and what
# the framing does to the connection.
sub frame_body {
    my ($body, $last) = @_;
    my $mode = pick(('cl') x 9, ('chunked') x 8, 'cl0', 'cl_short',
                    ($last ? ('cl_long', 'chunked_open') : ()), 'no_len',
                    'chunked_bad', 'chunked_bad', 'both', 'te_unknown');
    my %f = (mode => $mode, ok => 1, headers => [], wire => '');
    if ($mode eq 'cl') {
        push @{ $f{headers} }, 'Content-Length: ' . length $body;
        $f{wire} = $body;
    } elsif ($mode eq 'cl0') {
        push @{ $f{headers} }, 'Content-Length: 0';
        $f{empty} = 1;
    } elsif ($mode eq 'cl_short') {
        my $n = rnd(length $body);
        push @{ $f{headers} }, "Content-Length: $n";
        $f{wire} = $body;                 # the rest is read as a request
        @f{qw(ok body_changed)} = (0, 1);
    } elsif ($mode eq 'cl_long') {
        push @{ $f{headers} }, 'Content-Length: '
                               . (length($body) + 1 + rnd(1000));
        $f{wire} = $body;
        $f{ok} = 0;
    } elsif ($mode eq 'no_len') {
        $f{wire} = $body;                 # no body; the bytes: a request
        $f{empty} = 1;
        $f{ok} = length($body) == 0;
    } elsif ($mode =~ /^chunked/) {
        push @{ $f{headers} }, 'Transfer-Encoding: '
                               . pick('chunked', 'chunked', 'Chunked');
        my @sizes = map { 1 + rnd(pick(1, 4, 64, 1000, 70000)) } 1 .. 4;
        my $up = chance(0.3);
        my $zeros = chance(0.1) ? '0' x (1 + rnd(3)) : '';
        my $out = '';
        my $rest = $body;
        my $i = 0;
        while (length $rest) {
            my $part = substr($rest, 0, $sizes[$i++ % @sizes], '');
            my $ext = chance(0.15) ? pick(';a=b', ';x', ';q="v;w"', ' ;e')
                                   : '';
            $out .= $zeros . sprintf($up ? '%X' : '%x', length $part)
                    . "$ext\r\n$part\r\n";
        }
        $out .= '0' . (chance(0.1) ? ';end' : '') . "\r\n";
        $out .= chance(0.1) ? "X-Trailer: " . rnd(1000) . "\r\n" : '';
        $out .= "\r\n";
        $f{empty} = length($body) == 0;
        if ($mode eq 'chunked_open') {
            $out = substr($out, 0, length($out) - 2 - rnd(3));
            $f{ok} = 0;
        } elsif ($mode eq 'chunked_bad') {
            my $bad = pick('zz', '-1', 'fffffffffffffffffffff', '', '0x10',
                           '1 0', "\x01");
            my $how = rnd(3);
            if ($how == 0) {
                $out = "$bad\r\n$out";
            } elsif ($how == 1 && length $body > 2) {
                $out = sprintf("%x\r\n%sXY", length($body) - 1, $body)
                       . "0\r\n\r\n";
            } else {
                $out =~ s/\r\n\r\n\z/\r\n\r\nGARBAGE /;
                $f{garbage_after} = 1;
            }
            $f{ok} = 0;
        }
        $f{wire} = $out;
    } elsif ($mode eq 'both') {
        push @{ $f{headers} }, 'Transfer-Encoding: chunked',
                               'Content-Length: ' . length $body;
        $f{wire} = chunked($body);
        $f{ok} = 0;
    } else {
        push @{ $f{headers} }, 'Transfer-Encoding: '
                               . pick('gzip, chunked', 'identity', 'x');
        $f{wire} = chunked($body);
        @f{qw(ok te_unknown)} = (0, 1);
    }
    return \%f;
}

# One request of a case: { wire, expect => what the answer must be when
# the connection is clean up to it (undef: anything but a 5xx), ok =>
# the framing leaves the connection usable, ... }.
sub gen_request {
    my ($last) = @_;
    my $endpoint = pick('chat', 'chat', 'completions', 'completions', 'stt');
    my $loc = pick('/v1/', '/v1/', '/small/v1/', '/file/v1/', '/single/v1/',
                   '/auth/v1/');
    my $path = $loc . ($endpoint eq 'chat' ? 'chat/completions'
                       : $endpoint eq 'stt' ? 'audio/transcriptions'
                                            : 'completions');
    my $method = 'POST';
    my $route_error;
    if (chance(0.04)) {
        $method = pick('GET', 'PUT', 'DELETE', 'PATCH');
        $route_error = 405;
    } elsif (chance(0.02)) {
        $path = $loc . 'no/such/endpoint';
        $route_error = 404;
    }
    my ($body, $info, $type);
    if ($endpoint eq 'stt') {
        ($body, $type, $info) = stt_body();
    } else {
        ($body, $info) = chance(0.6) ? valid_body($endpoint)
                                     : invalid_body($endpoint);
        $type = 'application/json' if chance(0.7);
    }
    my $f = frame_body($body, $last);
    my @h = @{ $f->{headers} };
    push @h, "Content-Type: $type" if defined $type;
    my $auth;
    if ($loc eq '/auth/v1/') {
        $auth = pick('right', 'right', 'right', 'none', 'wrong', 'bearer',
                     'basic', 'long', 'dup');
        my %a = (right => "Bearer $KEYS[rnd(2)]",
                 wrong => 'Bearer sk-fuzz-wrong-9999',
                 bearer => pick('Bearer', 'Bearer   '),
                 basic => "Basic $KEYS[0]",
                 long => 'Bearer sk-fuzz-' . ('L' x (1000 + rnd(5000))));
        if ($auth eq 'dup') {
            push @h, "Authorization: Bearer $KEYS[0]",
                     'Authorization: Bearer sk-fuzz-wrong-9999';
        } elsif ($auth ne 'none') {
            push @h, "Authorization: $a{$auth}";
        }
    }
    my $version = '1.1';
    if ($last && chance(0.05) && $f->{mode} =~ /^(cl|cl0|no_len)$/) {
        $version = '1.0';
    }
    push @h, 'Expect: 100-continue' if chance(0.08) && $version eq '1.1';
    push @h, 'Connection: close' if $last && $version eq '1.1';
    @h = sort { rnd(3) - 1 } @h if chance(0.2);
    my $head = http_request(method => $method, target => $path,
                            version => $version, headers => \@h);
    my %r = (wire => $head . $f->{wire}, head_len => length $head,
             endpoint => $endpoint, path => $path, method => $method,
             framing => $f->{mode}, body => $info->{what} // $info->{kind},
             stream => $info->{stream}, auth => $auth,
             ok => $f->{ok} && $version eq '1.1',
             te_unknown => $f->{te_unknown});

    # what a clean connection must answer: nginx refuses a duplicate
    # header, then a Content-Length over client_max_body_size, before the
    # module runs; the module answers the route and the key before it
    # reads a body (discarding it), then nginx refuses a chunked body
    # that grows too large
    my $big = length($body) > $MAX_BODY && $f->{mode} =~ /^(cl|chunked)$/;
    my $e;
    if ($auth && $auth eq 'dup') {
        $e = 400;
    } elsif (!$f->{ok} && $f->{mode} ne 'no_len') {
        $e = undef;
    } elsif ($big && $f->{mode} eq 'cl') {
        $e = 413;
    } elsif ($route_error) {
        $e = $route_error;
    } elsif ($auth && $auth ne 'right') {
        $e = 401;
    } elsif ($big) {
        $e = 413;
    } elsif ($endpoint eq 'stt') {
        $e = ($f->{empty} || $info->{kind} eq 'stt400') ? 'stt400'
           : $info->{kind} eq 'stt' ? 'transcription' : undef;
    } elsif ($f->{empty} || $info->{kind} eq 'empty') {
        $e = 'parse400';
    } elsif ($info->{kind} eq 'model404') {
        $e = 404;
    } elsif ($info->{kind} eq 'valid') {
        $e = 'completion';
    }
    $r{expect} = $e;
    return \%r;
}

# A case: its requests, how the bytes are written, when the client gives
# up. Generated from (seed, w, n) alone.
sub gen_case {
    my ($w, $n) = @_;
    srand(unpack('N', md5("$SEED/$w/$n")));
    my $nreq = chance(0.7) ? 1 : 2 + rnd(2);
    my @reqs = map { gen_request($_ == $nreq) } 1 .. $nreq;
    my $wire = join '', map { $_->{wire} } @reqs;
    my %c = (id => "$w.$n", reqs => \@reqs, wire => $wire);

    # the writes
    my @cuts;
    my $how = rnd(10);
    if ($how < 4 || length($wire) > 200_000) {
        @cuts = ();
    } elsif ($how < 6) {
        @cuts = (1 + rnd(length $wire));
    } elsif ($how < 9) {
        @cuts = sort { $a <=> $b } map { 1 + rnd(length $wire) }
                1 .. 2 + rnd(9);
    } elsif (length $wire <= 600) {
        @cuts = 1 .. length($wire) - 1;
    }
    my ($prev, @pieces) = (0);
    for my $at (@cuts, length $wire) {
        next if $at <= $prev;
        push @pieces, substr($wire, $prev, $at - $prev);
        $prev = $at;
    }
    $c{pieces} = \@pieces;
    my $dmax = pick(0, 0, 0.001, 0.003, 0.02);
    $dmax = 0.0005 if @pieces > 50 && $dmax > 0.0005;
    # (rand(0) is rand(1))
    $c{delays} = [map { $dmax ? rand($dmax) : 0 } @pieces];

    # Expect: 100-continue, waited for (one request only)
    $c{expect_wait} = @reqs == 1 && $reqs[0]{wire} =~ /^Expect: 100/mi
                      && chance(0.5);

    # the client leaves early
    my $r = rand();
    if ($r < 0.05) {
        $c{close_at} = rnd(length $wire);        # before it all went out
    } elsif ($r < 0.08) {
        $c{abort_read} = 1;                      # once the answer starts
    }
    return \%c;
}

# --- running a case ---------------------------------------------------------

sub run_case {
    my ($c) = @_;
    my $s = raw_connect($PORT, 10) or return (undef, "connect: $!");
    my @d = @{ $c->{delays} };
    my @pieces = @{ $c->{pieces} };
    if (defined $c->{close_at}) {
        my $left = $c->{close_at};
        my @p;
        for (@pieces) {
            last if $left <= 0;
            push @p, substr($_, 0, $left);
            $left -= length $_;
        }
        raw_send($s, \@p, delay => sub { shift @d });
        close $s;
        return ('', undef);
    }
    my $raw = '';
    if ($c->{expect_wait}) {
        my $r = $c->{reqs}[0];
        raw_send($s, [substr($c->{wire}, 0, $r->{head_len})]);
        $raw = raw_read($s, timeout => 5,
                        until => sub { $_[0] =~ /\r\n\r\n/ });
        raw_send($s, [substr($c->{wire}, $r->{head_len})])
            if $raw =~ m{^HTTP/1\.1 100 };
    } else {
        raw_send($s, \@pieces, delay => sub { shift @d });
    }
    if ($c->{abort_read}) {
        $raw .= raw_read($s, timeout => 10, until => sub { length $_[0] });
        close $s;
        return ($raw, undef);
    }
    my $eof;
    $raw .= raw_read($s, timeout => 30, eof => \$eof);
    close $s;
    return ($raw, $eof ? undef : 'no end of the answer within 30 s');
}

# A whole transcription: SSE to [DONE], JSON with its text, or text/plain.
sub is_transcription {
    my ($resp) = @_;
    my $type = $resp->{headers}{'content-type'} // '';
    if ($type =~ m{^text/event-stream}) {
        return 'SSE not ending in [DONE]'
            unless $resp->{body} =~ /(?:^|\n\n)data: \[DONE\]\n\n\z/;
        return 'an error event' if $resp->{body} =~ /^data: \{"error"/m;
        return undef;
    }
    return undef if $type =~ m{^text/plain};
    my $j = eval { JSON::PP->new->utf8->decode($resp->{body}) };
    return "not a transcription: $resp->{body}"
        unless ref $j eq 'HASH' && defined $j->{text};
    return undef;
}

sub is_completion {
    my ($resp, $req) = @_;
    return is_transcription($resp) if $req->{endpoint} eq 'stt';
    my $type = $resp->{headers}{'content-type'} // '';
    if ($type =~ m{^text/event-stream}) {
        return 'SSE not ending in [DONE]'
            unless $resp->{body} =~ /(?:^|\n\n)data: \[DONE\]\n\n\z/;
        for my $ev (split /\n\n/, $resp->{body}) {
            next if $ev =~ /^: / || $ev eq 'data: [DONE]';
            my ($d) = $ev =~ /^data: (.*)\z/s or return "bad event: $ev";
            my $j = eval { JSON::PP->new->utf8->decode($d) };
            return "bad event JSON: $d" unless ref $j eq 'HASH';
            return "error event: $d" if $j->{error};
        }
        return undef;
    }
    my $j = eval { JSON::PP->new->utf8->decode($resp->{body}) };
    my $want = $req->{endpoint} eq 'chat' ? 'chat.completion'
                                           : 'text_completion';
    return "not a $want: $resp->{body}"
        unless ref $j eq 'HASH' && ($j->{object} // '') eq $want
               && ref $j->{choices} eq 'ARRAY' && ref $j->{usage} eq 'HASH';
    return undef;
}

# The failures of a case's answer (an empty list when it is right).
# Counts in $CHECKED the answers held to a known expectation.
my $CHECKED = 0;

sub check_case {
    my ($c, $raw, $err) = @_;
    my @fail;
    push @fail, $err if $err;
    return @fail if defined $c->{close_at} || $c->{abort_read};
    my @all = http_responses($raw);
    my @resp = grep { defined $_->{status} && $_->{status} !~ /^1/ } @all;
    push @fail, "unparsable answer: " . substr($_->{garbage}, 0, 200)
        for grep { exists $_->{garbage} } @all;
    my $clean = 1;
    my $reqs = $c->{reqs};
    for my $i (0 .. $#resp) {
        my $p = $resp[$i];
        next unless defined $p->{status};
        my $st = $p->{status};
        my $q = $i <= $#$reqs ? $reqs->[$i] : undef;
        my $type = $p->{headers}{'content-type'} // '';
        if ($st >= 500
            && !($st == 503 && $type =~ /json/)
            && !($st == 501 && grep { $_->{te_unknown} } @$reqs)
            && !($st == 501 && $q && $q->{endpoint} eq 'stt'
                 && $p->{body} =~ /"code":"audio_input_unavailable"/))
        {
            push @fail, "answer $i: $st";
        }
        if ($type =~ m{^application/json} && $st >= 400 && $p->{complete}) {
            my $j = eval { JSON::PP->new->utf8->decode($p->{body}) };
            push @fail, "answer $i: $st is not an OpenAI error: $p->{body}"
                unless ref $j eq 'HASH' && ref $j->{error} eq 'HASH'
                       && defined $j->{error}{message}
                       && defined $j->{error}{type};
        }
        my $www = exists $p->{headers}{'www-authenticate'};
        push @fail, "answer $i: $st with WWW-Authenticate"
            if $www && $st != 401;
        push @fail, "answer $i: 401 without WWW-Authenticate"
            if !$www && $st == 401;
        push @fail, "answer $i: an API key in the answer"
            if $p->{body} =~ /sk-fuzz|LLLLLLLL/;
        if ($st == 200 && $q && $q->{method} eq 'POST' && $p->{complete}
            && $q->{path} =~ /(?:completions|transcriptions)$/)
        {
            my $why = is_completion($p, $q);
            push @fail, "answer $i: 200, $why" if $why;
        }
        push @fail, "answer $i: 200 incomplete" if $st == 200
                                                   && !$p->{complete};
        if ($clean && $q && defined $q->{expect} && $st != 503) {
            my $e = $q->{expect};
            $CHECKED++;
            if ($e eq 'completion') {
                push @fail, "answer $i: $st, not a completion: "
                            . substr($p->{body}, 0, 300) if $st != 200;
            } elsif ($e eq 'transcription') {

                # the engine's answer, whatever the audio, but never the
                # module's refusal of a well-formed body
                push @fail, "answer $i: $st for a well-formed multipart "
                            . "body: " . substr($p->{body}, 0, 300)
                    if ($st != 200 && $st != 400 && $st != 501)
                       || $p->{body} =~ /Invalid multipart|Content-Type/;
            } elsif ($e eq 'stt400') {
                my $j = eval { JSON::PP->new->utf8->decode($p->{body}) };
                push @fail, "answer $i: $st, not a 400 for a malformed "
                            . "multipart body"
                    unless $st == 400 && ref $j eq 'HASH' && $j->{error};
            } elsif ($e eq 'parse400') {
                my $j = eval { JSON::PP->new->utf8->decode($p->{body}) };
                push @fail, "answer $i: $st, not 400 'could not parse'"
                    unless $st == 400 && ref $j eq 'HASH'
                           && ($j->{error}{message} // '')
                              =~ /^We could not parse the JSON body/;
            } elsif ($st != $e) {
                push @fail, "answer $i: $st, not $e";
            }
        }
        $clean = 0 unless $q && $q->{ok}
                          && ($p->{headers}{connection} // '') !~ /close/i;
    }
    # every request of a clean connection is answered: up to the first
    # one that breaks the framing, or that nginx answers and closes
    my $want = 0;
    for my $i (0 .. $#$reqs) {
        $want++;
        last unless $reqs->[$i]{ok} && defined $reqs->[$i]{expect};
        last if $resp[$i]
                && ($resp[$i]{headers}{connection} // '') =~ /close/i;
    }
    my $must = grep { defined $_->{expect} } @$reqs[0 .. $want - 1];
    push @fail, "only " . scalar(@resp) . " answers for $want requests"
        if @resp < $want && $must == $want;
    return @fail;
}

sub describe {
    my ($c) = @_;
    my @d = map {
        "$_->{method} $_->{path} framing=$_->{framing} body=$_->{body}"
        . ($_->{stream} ? ' stream' : '') . ($_->{auth} ? " auth=$_->{auth}"
                                                         : '')
        . ' expect=' . ($_->{expect} // 'any')
    } @{ $c->{reqs} };
    my $w = scalar @{ $c->{pieces} } . ' writes'
            . (defined $c->{close_at} ? ", client closes at $c->{close_at}"
                                      : '')
            . ($c->{abort_read} ? ', client closes once answered' : '')
            . ($c->{expect_wait} ? ', waits for 100' : '');
    return join('; ', @d) . " ($w, " . length($c->{wire}) . " bytes)";
}

sub printable {
    my ($s, $max) = @_;
    $s = substr($s, 0, $max) . '...' if length $s > $max;
    $s =~ s/([^\x20-\x7e\n])/sprintf('\\x%02x', ord $1)/ge;
    return $s;
}

sub report_failure {
    my ($c, $raw, @fail) = @_;
    my $bin = "$OUT/../http-fail-$SEED-$c->{id}.bin";
    if (open(my $fh, '>', $bin)) {
        binmode $fh;
        print $fh $c->{wire};
        close $fh;
    }
    return "case $c->{id} FAILED: " . join('; ', @fail) . "\n"
         . "  " . describe($c) . "\n"
         . "  replay: t/fuzz/http_body.pl --replay $SEED:$c->{id}\n"
         . "  bytes: $bin\n"
         . "  answer: " . printable($raw // '', 2000) . "\n";
}

# --- the clients and the watcher -------------------------------------------

sub client {
    my ($w, $until) = @_;
    my %st = (cases => 0, requests => 0, bytes => 0, status => {},
              checked => 0);
    my $cur = "$OUT/client-$w.cur";
    $SIG{TERM} = sub { _exit(1) };
    for (my $n = 1; time < $until; $n++) {
        write_stats($w, \%st) if $n % 100 == 0;
        my $c = gen_case($w, $n);
        if (open(my $fh, '>', $cur)) {
            print $fh "$c->{id}\n";
            close $fh;
        }
        my ($raw, $err) = run_case($c);
        my @fail = check_case($c, $raw, $err);
        $st{cases}++;
        $st{requests} += @{ $c->{reqs} };
        $st{bytes} += length $c->{wire};
        $st{checked} = $CHECKED;
        $st{status}{$_->{status} // 'none'}++ for http_responses($raw // '');
        if (@fail) {
            open(my $fh, '>', "$OUT/client-$w.fail");
            print $fh report_failure($c, $raw, @fail);
            close $fh;
            write_stats($w, \%st);
            _exit(1);
        }
    }
    write_stats($w, \%st);
    _exit(0);
}

sub write_stats {
    my ($w, $st) = @_;
    open(my $fh, '>', "$OUT/client-$w.json") or return;
    print $fh JSON::PP->new->canonical->encode($st);
    close $fh;
}

# what nginx itself logs at [error] for a client's mistake (1.22)
my $core_client_errors = join '|', 'client sent invalid chunked body',
    'client intended to send too large body',
    'client intended to send too large chunked body';
$core_client_errors = qr/^(?:$core_client_errors)(?::|,|$)/;

# New lines of the error log since $$pos: the ones that must not be.
sub bad_log_lines {
    my ($pos) = @_;
    open(my $fh, '<', $LOG) or return ();
    seek($fh, $$pos, 0);
    my @bad;
    while (my $l = <$fh>) {
        last unless $l =~ /\n\z/;
        $$pos = tell($fh);
        if ($l =~ /exited on signal|\[(?:alert|crit|emerg)\]/) {
            push @bad, $l;
        } elsif ($l =~ /\[error\] \d+#\d+: (?:\*\d+ )?(.*)/) {
            push @bad, $l unless $1 =~ $core_client_errors && $l !~ /omni/;
        }
    }
    return @bad;
}

sub health_ok {
    my ($st, $head, $body) = http_get($srv, '/health');
    return defined $st && $st == 200;
}

sub summary_stats {
    my %t = (cases => 0, requests => 0, bytes => 0, checked => 0,
             status => {});
    for my $w (1 .. $opt{clients}) {
        my $j = eval { JSON::PP->new->decode(
                           main::slurp("$OUT/client-$w.json")) } or next;
        $t{$_} += $j->{$_} // 0 for qw(cases requests bytes checked);
        $t{status}{$_} += $j->{status}{$_} for keys %{ $j->{status} };
    }
    return \%t;
}

print "http body fuzzer: seed $SEED, nginx on 127.0.0.1:$PORT "
      . "(prefix $srv->{prefix}), engine $engine->{pid}\n";

if ($opt{replay}) {
    my $c = gen_case($REPLAY_W, $REPLAY_N);
    print describe($c), "\n", printable($c->{wire}, 4000), "\n";
    my ($raw, $err) = run_case($c);
    print "answer:\n", printable($raw // '', 8000), "\n";
    sleep 0.3;
    my $pos = 0;
    my @fail = (check_case($c, $raw, $err), map { "log: $_" }
                bad_log_lines(\$pos));
    print @fail ? "FAILED: " . join("\n  ", @fail) . "\n" : "ok\n";
    omni_server_stop($srv);
    main::serve_stop($engine, 10);
    exit(@fail ? 1 : 0);
}

unlink glob("$OUT/client-*");
my @workers0 = sort(nginx_worker_pids($srv));
my $rss0 = join ' ', map { rss_kb($_) } @workers0;
my $until = time + $opt{seconds};
my %kids;
for my $w (1 .. $opt{clients}) {
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        client($w, $until);
    }
    $kids{$pid} = $w;
}

my ($pos, $probes, $t_health, @problems) = (0, 0, 0);
my $next_report = time + 60;
while (%kids) {
    sleep 0.5;
    for my $pid (keys %kids) {
        next unless waitpid($pid, WNOHANG) == $pid;
        my $w = delete $kids{$pid};
        push @problems, main::slurp("$OUT/client-$w.fail")
            || "client $w exited with status " . ($? >> 8) . "\n" if $?;
    }
    push @problems, map { "error.log: $_" } bad_log_lines(\$pos);
    my @now = sort(nginx_worker_pids($srv));
    push @problems, "nginx workers changed: @workers0 -> @now\n"
        if "@now" ne "@workers0";
    if (time - $t_health >= 2) {
        $t_health = time;
        $probes++;
        push @problems, "/health did not answer 200\n" unless health_ok();
    }
    push @problems, "the engine died\n"
        if waitpid($engine->{pid}, WNOHANG) == $engine->{pid};
    if (time >= $next_report) {
        $next_report += 60;
        my $t = summary_stats();
        printf "... %d s: about %d cases, %d requests so far\n",
               $opt{seconds} - ($until - time), $t->{cases}, $t->{requests};
    }
    if (@problems) {
        # name what each client was doing when it happened
        for my $w (1 .. $opt{clients}) {
            my $cur = main::slurp("$OUT/client-$w.cur");
            chomp $cur;
            push @problems, "  client $w was at case $cur (replay: "
                            . "t/fuzz/http_body.pl --replay $SEED:$cur)\n"
                if $cur;
        }
        kill 'TERM', keys %kids;
        waitpid($_, 0) for keys %kids;
        %kids = ();
        last;
    }
}

sleep 0.5;
push @problems, map { "error.log: $_" } bad_log_lines(\$pos);
push @problems, "/health did not answer 200 at the end\n" unless health_ok();
my @end = sort(nginx_worker_pids($srv));
push @problems, "nginx workers changed: @workers0 -> @end\n"
    if "@end" ne "@workers0";
my $rss1 = join ' ', map { rss_kb($_) } @end;

my $t = summary_stats();
my $codes = join ' ', map { "$_:$t->{status}{$_}" }
                      sort keys %{ $t->{status} };
printf "http body fuzzer: seed %s, %d s, %d clients: %d cases, %d requests, "
       . "%.1f MB sent; answers %s; %d held to a known answer; %d health "
       . "probes; workers %s (RSS kB %s -> %s)\n",
       $SEED, $opt{seconds}, $opt{clients}, $t->{cases}, $t->{requests},
       $t->{bytes} / 1e6, $codes, $t->{checked}, $probes, "@end", $rss0,
       $rss1;

omni_server_stop($srv);
main::serve_stop($engine, 10);

if (@problems) {
    print "FAILED\n", @problems;
    exit 1;
}
print "ok: no worker exited, no 5xx but 503/501 where allowed, every "
      . "checked answer right\n";
exit 0;

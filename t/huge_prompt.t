# Huge prompts through nginx: a 900 KB message or prompt (under a
# client_max_body_size of 2m) is refused with 400 context_length_exceeded
# naming messages or prompt, and while four clients loop such requests
# through nginx, streams served by the same nginx and engine stay whole
# and equal to `generate`. (How much a stream slows down is measured in
# t/engine/serve_huge.t, on the engine socket; here nginx's own JSON parse
# of each body, in its worker, is in the path too.)
use strict;
use warnings;
use lib '.';
use t::lib::Omni;
use Test::Nginx::Socket 'no_plan';
use IO::Socket::INET;
use POSIX qw(_exit);
use Time::HiRes qw(time sleep);

no_shuffle();
no_long_string();

our $M = $ENV{TEST_NGINX_OMNI_MODEL};
our $HUGE = 'Once upon a time there was a little dog. ' x 22500;   # 900 KB
our (@Attackers, $Results);

sub huge_chat {
    return encode_json({ model => $M, max_tokens => 4,
                         messages => [{ role => 'user', content => $HUGE }] });
}

# One POST on its own connection; returns (status, decoded body or undef).
sub post {
    my ($path, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $ENV{TEST_NGINX_SERVER_PORT})
        or return (0, undef);
    print $s "POST $path HTTP/1.0\r\nHost: localhost\r\nContent-Type: "
             . "application/json\r\nContent-Length: " . length($body)
             . "\r\n\r\n$body";
    local $/;
    my $resp = <$s> // '';
    close $s;
    my ($status) = $resp =~ m{^HTTP/1\.\d (\d+)};
    my ($json) = $resp =~ /\r\n\r\n(.*)\z/s;
    return ($status // 0, eval { JSON::PP->new->utf8->decode($json) });
}

# Forks n clients looping huge chat requests for `secs` seconds; each
# writes "requests wrong median_seconds" to $Results.
sub attack {
    my ($n, $secs) = @_;
    my $body = huge_chat();
    pipe($Results, my $wr) or die "pipe: $!";
    for (1 .. $n) {
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            close $Results;
            my ($wrong, @t) = (0);
            my $until = time + $secs;
            while (time < $until) {
                my $t0 = time;
                my ($st, $j) = post('/v1/chat/completions', $body);
                push @t, time - $t0;
                $wrong++ unless $st == 400 && $j
                    && $j->{error}{code} eq 'context_length_exceeded'
                    && $j->{error}{param} eq 'messages';
            }
            @t = sort { $a <=> $b } @t;
            syswrite($wr, scalar(@t) . " $wrong " . ($t[$#t / 2] // 0)
                          . "\n");
            _exit(0);
        }
        push @Attackers, $pid;
    }
    close $wr;
}

add_block_preprocessor(sub {
    my $b = shift;
    (my $conf = $DefaultConfig) =~ s{(location /v1/ \{)}
                                     {$1\n        client_max_body_size 2m;};
    $b->set_value('config', $conf);
});

run_tests();

__DATA__

=== TEST 1: a 900 KB message: 400 context_length_exceeded, param messages
--- request eval
"POST /v1/chat/completions\n" . ::huge_chat()
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'messages',
         'context_length_exceeded', $name);
like($json->{error}{message}, qr/However, your messages resulted in at least \d+ tokens\. Please reduce the length of the messages\./,
     "$name: refused from the bound, not tokenized");
--- no_error_log
[error]



=== TEST 2: a 900 KB prompt: 400 context_length_exceeded, param prompt
--- request eval
"POST /v1/completions\n" . ::encode_json({ model => $::M, max_tokens => 4,
                                           prompt => $::HUGE })
--- error_code: 400
--- check
error_is($json, 'invalid_request_error', 'prompt', 'context_length_exceeded',
         $name);
--- no_error_log
[error]



=== TEST 3: four clients loop huge prompts; streams stay whole
--- init
::attack(4, 3);
Time::HiRes::sleep(0.5);
--- request eval
[map { "POST /v1/chat/completions\n" . ::encode_json({ model => $::M,
    stream => JSON::PP::true, temperature => 0, max_tokens => 32,
    messages => [{ role => 'user', content => 'Once upon a time' }] }) }
 1 .. 8]
--- error_code eval
[(200) x 8]
--- check
my $s = sse_parse($body, endpoint => 'chat', model => $::M);
ok($s->{ok}, "$name: a whole stream");
is($s->{text}, chat_gen(prompt => 'Once upon a time', max_tokens => 32),
   "$name: the text equals generate's");
if ($i == 7) {
    waitpid($_, 0) for @::Attackers;
    my ($n, $wrong, @med) = (0, 0);
    while (my $line = readline($::Results)) {
        my ($k, $w, $m) = split ' ', $line;
        ($n, $wrong) = ($n + $k, $wrong + $w);
        push @med, $m;
    }
    ok($n >= 8, "$name: the attackers sent $n huge requests");
    is($wrong, 0, "$name: each refused 400 context_length_exceeded");
    diag(sprintf("through nginx: %d refusals in 3 s by 4 clients, medians "
                 . "%s ms", $n, join(' ', map { sprintf '%.1f', 1e3 * $_ }
                                       @med)));
}
--- no_error_log
[error]

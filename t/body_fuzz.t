# A short pass of the request-body fuzzer (t/fuzz/http_body.pl through
# t/fuzz/run http; long runs use the same script): random bodies and
# framing, write splits and early closes against nginx + the module + a
# real engine. It fails on a worker that exits on a signal (the error log,
# the worker pids), a 5xx for a client's mistake, a wrong answer to a
# request whose answer is known, an [alert]/[crit] or a module [error] in
# the log, or /health not answering. The seed is printed (FUZZ_SEED=S
# runs the same cases again; a failing case names its --replay command).
use strict;
use warnings;
use Test::More;

my $secs = $ENV{OMNI_HTTP_FUZZ_SECONDS} // 40;
my $log = `t/fuzz/run http $secs 2>&1`;
my $rc = $? >> 8;
my ($seed) = $log =~ /seed (\d+)/;
note("seed $seed") if defined $seed;
is($rc, 0, "http body fuzzer ran $secs s clean")
    or diag(substr($log, -6000));
my ($cases, $requests) = $log =~ /: (\d+) cases, (\d+) requests/;
ok(defined $requests && $requests > 0, "requests were sent")
    and note("$cases cases, $requests requests");
my ($ok200) = $log =~ /answers [^;]*\b200:(\d+)/;
ok(($ok200 // 0) > 0, "some requests got completions");
note($_) for grep { /^http body fuzzer: seed \d+, \d+ s/ } split /\n/, $log;
done_testing();

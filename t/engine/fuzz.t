# A short libFuzzer pass over the GGUF reader and the tokenizer built from
# its metadata (t/fuzz/run; the long runs behind the README use the same
# script). Any crash or sanitizer report fails this test.
use strict;
use warnings;
use Test::More;

my $secs = $ENV{OMNI_FUZZ_SECONDS} // 30;
my $log = `t/fuzz/run gguf $secs 2>&1`;
my $rc = $? >> 8;
is($rc, 0, "fuzz_gguf ran $secs s clean") or diag substr($log, -4000);
like($log, qr/stat::number_of_executed_units:\s*(\d+)/, 'it executed inputs');
my ($n) = $log =~ /stat::number_of_executed_units:\s*(\d+)/;
note("executed $n inputs") if defined $n;
done_testing();

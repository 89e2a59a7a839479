# Short libFuzzer passes (t/fuzz/run; the long runs behind the README use
# the same script): the GGUF reader and the tokenizer built from its
# metadata, the engine's frame reader and request JSON parser, then the
# audio-input decoders. Any crash, sanitizer report or broken contract
# fails this test.
use strict;
use warnings;
use Test::More;

my %secs = (
    gguf  => $ENV{OMNI_FUZZ_SECONDS} // 30,
    proto => $ENV{OMNI_FUZZ_PROTO_SECONDS} // 20,
    audio => $ENV{OMNI_FUZZ_AUDIO_SECONDS} // 20,
);

for my $target (qw(gguf proto audio)) {
    my $s = $secs{$target};
    my $log = `t/fuzz/run $target $s 2>&1`;
    my $rc = $? >> 8;
    is($rc, 0, "fuzz_$target ran $s s clean") or diag substr($log, -4000);
    my ($n) = $log =~ /stat::number_of_executed_units:\s*(\d+)/;
    ok(defined $n && $n > 0, "fuzz_$target executed inputs");
    note("fuzz_$target executed $n inputs") if defined $n;
}
done_testing();

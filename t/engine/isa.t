# The end-to-end engine suites once more for each kernel set this CPU runs
# besides the one 'auto' picks (which the plain run of t/engine/*.t uses),
# forced with OMNI_ISA: an AVX-512 machine proves the AVX2 and scalar paths
# end to end too. Each suite runs as a child; its TAP results are replayed
# as a subtest named after the suite and the kernel set.
use strict;
use warnings;
use Test::More;
require './t/engine/lib.pl';
our ($ENGINE, $MODEL);

my @suites = qw(cli reference quants serve_batch serve);

# The set generate --stats reports for OMNI_ISA=$isa, or undef when the
# CPU (or the build) cannot run it.
sub set_for {
    my ($isa) = @_;
    local $ENV{OMNI_ISA} = $isa;
    my ($rc, undef, $err) = run_engine('generate', '--model', $MODEL,
                                       '--prompt', 'x', '--max-tokens', 1,
                                       '--stats');
    return undef if $rc != 0;
    return $err =~ /backend (\S+),/ ? $1 : undef;
}

my $auto = set_for('auto');
ok(defined $auto, "'auto' runs a kernel set") or BAIL_OUT('no kernel set');
note("auto picks $auto (the plain pass of t/engine/*.t used it)");

for my $isa (qw(avx512 avx2 neon ref)) {
    my $got = set_for($isa);
    if (!defined $got) {
        note("OMNI_ISA=$isa: this CPU or build cannot run it; skipped");
        next;
    }
    is($got, $isa, "OMNI_ISA=$isa runs the $isa kernel set");
    next if $isa eq $auto;
    for my $suite (@suites) {
        subtest "t/engine/$suite.t with OMNI_ISA=$isa" => sub {
            local $ENV{OMNI_ISA} = $isa;
            # quants.t's main pass compares two prompts per file; one
            # proves another set's kernels against llama.cpp's as well
            local $ENV{OMNI_QUANT_PROMPTS} = 1;
            my $p = replay_tap($^X, "t/engine/$suite.t");
            is($p->exit, 0, "$suite.t exits 0");
            ok($p->tests_run > 0, "$suite.t ran tests");
        };
    }
}

done_testing();

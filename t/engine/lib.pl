# Helpers shared by the engine CLI tests (t/engine/*.t): where things are,
# and running omni-engine with its stdout, stderr and exit status captured.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Open3;
use Symbol qw(gensym);

our $ENGINE = $ENV{OMNI_ENGINE} // 'build/omni-engine';
our $MODEL  = $ENV{OMNI_MODEL}  // '../shared/models/stories260K.gguf';
our $TMP    = tempdir('omni-test-XXXXXX', TMPDIR => 1, CLEANUP => 1);

die "$ENGINE is not built (run make)\n" unless -x $ENGINE;
die "$MODEL is missing (see ../shared/models/README.md)\n" unless -f $MODEL;

# Which kernel set this pass runs (what 'auto' picks, or what OMNI_ISA
# forces), in the TAP output.
{
    my $s = `'$ENGINE' generate --model '$MODEL' --prompt x --max-tokens 1 --stats 2>&1 >/dev/null`;
    my ($set) = $s =~ /backend (\S+),/;
    print "# kernel set: ", $set // "none ($s)", " (OMNI_ISA=",
          $ENV{OMNI_ISA} || 'auto', ")\n";
}

# run(@args) -> (exit status, stdout, stderr)
sub run_engine {
    my @args = @_;
    my $err = gensym;
    my $pid = open3(my $in, my $out, $err, $ENGINE, @args);
    close $in;
    local $/;
    my $o = <$out> // '';
    my $e = <$err> // '';
    waitpid($pid, 0);
    return ($? >> 8, $o, $e);
}

# The llama.cpp checkout the tests read vectors from (t/fetch-llama-src).
sub llama_src {
    return $ENV{OMNI_LLAMA_SRC} if $ENV{OMNI_LLAMA_SRC};
    my @lines = `t/fetch-llama-src`;
    die "t/fetch-llama-src failed\n" if $? != 0 || !@lines;
    chomp(my $dir = $lines[-1]);
    return $dir;
}

1;

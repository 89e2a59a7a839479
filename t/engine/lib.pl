# Helpers shared by the engine CLI tests (t/engine/*.t): where things are,
# and running omni-engine with its stdout, stderr and exit status captured.
use strict;
use warnings;
use File::Temp qw(tempdir tempfile);
use POSIX ();

our $ENGINE = $ENV{OMNI_ENGINE} // 'build/omni-engine';
our $MODEL  = $ENV{OMNI_MODEL}  // '../shared/models/stories260K.gguf';
# The backend the suites run: the CPU unless the run names one
# (t/engine/cuda.t reruns suites with OMNI_BACKEND=cuda). 'auto' would add
# its fallback line to every stderr on a machine without a GPU, and the
# suites check stderr line by line; cuda.t tests 'auto' itself.
$ENV{OMNI_BACKEND} //= 'cpu';
# A command run_engine puts before the binary, split at spaces: an emulator
# for an engine built for another architecture (t/engine/aarch64.t sets
# "qemu-aarch64 -L /usr/aarch64-linux-gnu").
our @WRAPPER = split ' ', $ENV{OMNI_ENGINE_WRAPPER} // '';
our $TMP    = tempdir('omni-test-XXXXXX', TMPDIR => 1, CLEANUP => 1);

die "$ENGINE is not built (run make)\n" unless -x $ENGINE;
die "$MODEL is missing (see ../shared/models/README.md)\n" unless -f $MODEL;

# Which kernel set this pass runs (what 'auto' picks on this CPU, or what
# OMNI_ISA forces), in the TAP output and as $KERNEL_SET: tests compare
# with it, never with a set they assume the machine has.
our $KERNEL_SET;
{
    my $cmd = join ' ', map { "'$_'" } @WRAPPER, $ENGINE;
    my $s = `$cmd generate --model '$MODEL' --prompt x --max-tokens 1 --stats 2>&1 >/dev/null`;
    my ($set) = $s =~ /backend (\S+),/;
    $KERNEL_SET = $set // '';
    print "# kernel set: ", $set // "none ($s)", " (OMNI_ISA=",
          $ENV{OMNI_ISA} || 'auto', ")",
          @WRAPPER ? " under $WRAPPER[0]" : '', "\n";
}

# run(@args) -> (exit status, stdout, stderr). Both outputs go to files, so
# a child that writes a lot to one while the other is unread cannot block.
sub run_engine {
    my @args = @_;
    my ($ofh, $ofile) = tempfile(DIR => $TMP);
    my ($efh, $efile) = tempfile(DIR => $TMP);
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>&', $ofh);
        open(STDERR, '>&', $efh);
        exec(@WRAPPER, $ENGINE, @args) or POSIX::_exit(127);
    }
    waitpid($pid, 0);
    my $rc = $? >> 8;
    local $/;
    seek($ofh, 0, 0);
    seek($efh, 0, 0);
    my $o = <$ofh> // '';
    my $e = <$efh> // '';
    close $ofh;
    close $efh;
    unlink $ofile, $efile;
    return ($rc, $o, $e);
}

# The llama.cpp checkout the tests read vectors from (t/fetch-llama-src).
# Runs a TAP program (the command in @exec) and replays its results as
# tests of the caller's (a subtest, usually): each test as it passed or
# failed, a skip as a pass saying so, comments as notes. Returns the
# parser, for its exit status and count.
sub replay_tap {
    my (@exec) = @_;
    require TAP::Parser;
    my $p = TAP::Parser->new({ exec => \@exec, merge => 1 });
    while (my $r = $p->next) {
        if ($r->is_test) {
            if ($r->has_skip) {
                Test::More::pass($r->description . ' # skipped: '
                                 . $r->explanation);
            } else {
                Test::More::ok($r->is_ok, $r->description);
            }
        } elsif ($r->is_comment
                 || ($r->is_unknown && $r->as_string ne '')) {
            Test::More::note($r->as_string);
        }
    }
    return $p;
}

sub llama_src {
    return $ENV{OMNI_LLAMA_SRC} if $ENV{OMNI_LLAMA_SRC};
    my @lines = `t/fetch-llama-src`;
    die "t/fetch-llama-src failed\n" if $? != 0 || !@lines;
    chomp(my $dir = $lines[-1]);
    return $dir;
}

1;

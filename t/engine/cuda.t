# The CUDA backend: how the engine chooses it, and the engine's exactness
# suites once more on it.
#
# The choice is checked on every machine, so this file is never an empty
# skip where there is no GPU (CI, most developers): --backend cuda fails,
# naming what is missing, and --backend auto runs on the CPU and says why
# in one line. On a GPU machine the same checks run with the device hidden
# (CUDA_VISIBLE_DEVICES=-1: the runtime then sees none), so they hold there
# too.
#
# With a device (bench --backend cuda starts on the default model), the
# suites rerun with OMNI_BACKEND=cuda, each as a child whose TAP results
# are replayed as a subtest, as t/engine/isa.t does for kernel sets:
# reference.t (greedy text equal to llama.cpp's) and serve_batch.t (64
# concurrent requests equal to their runs alone: batch invariance through
# the scheduler); and the CUDA unit tests, build/t/test_cuda*, where built
# (test_model's batch invariance creates CPU backends only). Without one,
# those reruns are skipped with the first line of the engine's error.
use strict;
use warnings;
use Test::More;
require './t/engine/lib.pl';
our ($MODEL);

my @suites = qw(reference serve_batch);
# the CUDA unit tests beside the engine's build: build/t/, or the GPU
# bundle's t/ (bench/gpu.sh bundle)
our ($ENGINE);
(my $bindir = $ENGINE) =~ s{/[^/]*\z}{};
my @units = grep { -x } glob("$bindir/t/test_cuda*");

# the backend each check below names, not one from the caller's environment
delete $ENV{OMNI_BACKEND};

# --- the choice, with no device ------------------------------------------------
{
    local $ENV{CUDA_VISIBLE_DEVICES} = '-1';
    my %cmds = (
        generate => ['--prompt', 'Once upon a time', '--max-tokens', 8,
                     '--temperature', 0],
        bench    => ['--n-prompt', 4, '--n-gen', 4, '--reps', 1],
    );
    for my $cmd (sort keys %cmds) {
        my @args = ($cmd, '--model', $MODEL, @{ $cmds{$cmd} });
        my ($rc, $out, $err) = run_engine(@args, '--backend', 'cuda');
        isnt($rc, 0, "$cmd --backend cuda without a device fails");
        is($out, '', "$cmd --backend cuda: nothing on stdout");
        like($err, qr/CUDA/, "$cmd --backend cuda: the error names CUDA")
            or diag $err;
        like($err, qr/no CUDA device|driver|omni-cuda\.so|not built/,
             "$cmd --backend cuda: and what is missing") or diag $err;

        ($rc, $out, $err) = run_engine(@args, '--backend', 'auto');
        is($rc, 0, "$cmd --backend auto without a device runs") or diag $err;
        my @why = grep { /CUDA/ } split /\n/, $err;
        is(scalar @why, 1, "$cmd --backend auto: one line on why not CUDA")
            or diag $err;
        next unless $cmd eq 'generate';
        my ($crc, $cpu) = run_engine(@args, '--backend', 'cpu');
        ok($crc == 0 && length $cpu && $out eq $cpu,
           'generate --backend auto: the CPU backend\'s text')
            or diag "auto: '$out'\ncpu ($crc): '$cpu'";
    }

    # OMNI_BACKEND is what the reruns below set: it must be read
    local $ENV{OMNI_BACKEND} = 'cuda';
    my ($rc, undef, $err) = run_engine('generate', '--model', $MODEL,
                                       '--prompt', 'x', '--max-tokens', 1);
    isnt($rc, 0, 'OMNI_BACKEND=cuda without a device fails too');
    like($err, qr/CUDA/, 'OMNI_BACKEND=cuda: the error names CUDA')
        or diag $err;
}

# --- the plugin: built wherever nvcc is (CI compiles the CUDA code) ------------
{
    my $nvcc = `sh -c 'command -v nvcc' 2>/dev/null`;
    chomp $nvcc;
    $nvcc = '/usr/local/cuda/bin/nvcc' if $nvcc eq ''
                                          && -x '/usr/local/cuda/bin/nvcc';
    my $lib = "$bindir/omni-cuda.so";
    SKIP: {
        skip('no nvcc on this machine: make builds no CUDA plugin', 2)
            if $nvcc eq '';
        ok(-f $lib, "nvcc is here ($nvcc), so make built $lib");
        my @syms = grep { / [TDB] / } split /\n/,
                   `nm -D --defined-only '$lib' 2>&1`;
        is_deeply([map { (split ' ')[-1] } @syms], ['omni_cuda_backend_new'],
                  'it exports its entry point and nothing else')
            or diag explain \@syms;
    }
}

# --- the suites on the device ---------------------------------------------------
my ($rc, $out, $err) = run_engine('bench', '--backend', 'cuda', '--model',
                                  $MODEL, '--n-prompt', 1, '--n-gen', 1,
                                  '--reps', 1);
my ($why) = grep { /\S/ } split /\n/, $err;
SKIP: {
    skip('no CUDA device: ' . ($why // "exit $rc"),
         1 + @suites + @units) if $rc != 0;
    like($out, qr/"backend": "[^"]*cuda/i,
         'bench --backend cuda runs the CUDA backend') or diag $out;
    for my $test ((map { [ "t/engine/$_.t", $^X, "t/engine/$_.t" ] } @suites),
                  (map { [ $_, $_ ] } @units)) {
        my ($name, @exec) = @$test;
        subtest "$name with OMNI_BACKEND=cuda" => sub {
            local $ENV{OMNI_BACKEND} = 'cuda';
            my $p = replay_tap(@exec);
            is($p->exit, 0, "$name exits 0");
            ok($p->tests_run > 0, "$name ran tests");
        };
    }
}
note('CUDA unit tests: ' . (@units ? "@units" : 'none built'));

done_testing();

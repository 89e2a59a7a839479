# The kernel-set columns of make bench, shared by bench/run and bench/serve:
# which of our kernel sets runs against which build of llama.cpp.
#
#   native  omni-engine --isa auto, against llama.cpp built for this CPU
#           (-DGGML_NATIVE=ON) in $cache/llama-build
#   avx2    omni-engine --isa avx2, against llama.cpp with AVX-512 off
#           (-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
#           -DGGML_AVX512=OFF) in $cache/llama-build-avx2
#   avx512, ref   that set forced, against the native build
#
# A column is named after the kernel set our engine really runs, which we
# ask the engine (the "backend" of `omni-engine bench` on a tiny model)
# rather than guess from /proc/cpuinfo: the engine knows which features
# each of its sets needs. The avx2 set always runs against the AVX-512-off
# build, so on a CPU where auto picks avx2 (no AVX-512, or AVX-512 without
# VNNI) "native" and "avx2" are one column, run once, and no native
# llama.cpp is built. A column whose set this CPU cannot run is skipped
# with the engine's reason.
package bench::Columns;

use strict;
use warnings;
use JSON::PP;

my @common = qw(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF
                -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF);

# llama.cpp builds: directory and log suffix under the cache, cmake flags.
# The server embeds a web UI that the build would download; it is off, so
# the build needs no network.
my %builds = (
    native => { dir => 'llama-build', log => '',
                flags => [ '-DGGML_NATIVE=ON', @common ] },
    avx2   => { dir => 'llama-build-avx2', log => '-avx2',
                flags => [ qw(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
                              -DGGML_F16C=ON -DGGML_AVX512=OFF), @common ] },
);

sub sh {
    my $cmd = shift;
    my $out = `$cmd`;
    die "bench: failed: $cmd\n" if $? != 0;
    return $out;
}

# The llama.cpp checkout (t/fetch-llama-src) and its short commit.
sub llama_src {
    chomp(my $src = (split /\n/, sh('t/fetch-llama-src'))[-1]);
    chomp(my $commit = sh("git -C '$src' rev-parse --short HEAD"));
    return ($src, $commit);
}

# The cmake flags of build b ("native" or "avx2"), as one string.
sub llama_flags { return join ' ', @{ $builds{ $_[0] }{flags} } }

# Path of llama.cpp's program target (llama-bench, llama-server) in build
# b, configured and built into the cache the first time it is asked for.
sub llama_binary {
    my ($cache, $src, $b, $target, $jobs) = @_;
    my $spec = $builds{$b} or die "bench: no llama.cpp build '$b'\n";
    my $dir = "$cache/$spec->{dir}";
    my $bin = "$dir/bin/$target";
    return $bin if -x $bin;
    print "building llama.cpp's $target into $dir (once) ...\n";
    sh("cmake -S '$src' -B '$dir' " . llama_flags($b)
       . " >'$cache/llama-cmake$spec->{log}.log' 2>&1");
    sh("cmake --build '$dir' -j$jobs --target $target "
       . ">'$cache/llama-build$spec->{log}.log' 2>&1");
    return $bin;
}

# A model of one tiny layer, written once into the cache: enough for the
# engine to start a backend and name its kernel set.
sub probe_model {
    my ($engine, $cache, $src) = @_;
    my $f = "$cache/bench/omni-probe-f32.gguf";
    return $f if -f $f;
    sh("mkdir -p '$cache/bench'");
    sh("$engine make-model --out '$f' --arch llama --dim 64 --layers 1 "
       . "--heads 2 --kv-heads 2 --ffn 128 --type f32 --vocab-from "
       . "'$src/models/ggml-vocab-llama-spm.gguf' --seed 1 --ctx 64");
    return $f;
}

# The kernel set `--isa isa` gives on this CPU, or (undef, the engine's
# reason) when it cannot run here.
sub kernel_set {
    my ($engine, $model, $isa) = @_;
    my $cmd = "$engine bench --model '$model' --n-prompt 1 --n-gen 0 "
              . "--reps 1 --threads 1 --isa $isa 2>&1";
    my $out = `$cmd`;
    return (undef, (split /\n/, $out)[-1] // "exit $?") if $? != 0;
    return decode_json($out)->{backend};
}

# The columns asked for (a list of native, avx2, avx512, ref), resolved on
# this CPU, in that order, without repeats: hashes of
#   name      the kernel set our engine runs (the column's label)
#   isa       what we pass as --isa: the set's own name, so a native
#             column says what it ran (and OMNI_ISA cannot change it)
#   requested the names asked for that gave this column ("native avx2")
#   build     the llama.cpp build it runs against (native or avx2)
#   auto      true when it is what --isa auto picks (the native column)
sub resolve {
    my ($engine, $cache, $src, @asked) = @_;
    my $probe = probe_model($engine, $cache, $src);
    my ($auto, $why) = kernel_set($engine, $probe, 'auto');
    die "bench: the engine runs no kernel set: $why\n" unless defined $auto;
    my (@cols, %by_set);
    for my $a (@asked) {
        my $isa = $a eq 'native' ? 'auto' : $a;
        die "bench: BENCH_ISAS: '$a' is not native, avx2, avx512 or ref\n"
            unless grep { $isa eq $_ } qw(auto avx2 avx512 ref);
        my ($set, $reason) = $isa eq 'auto'
                             ? ($auto) : kernel_set($engine, $probe, $isa);
        unless (defined $set) {
            print "bench: skipping the $a column: $reason\n";
            next;
        }
        if (my $c = $by_set{$set}) {
            $c->{requested} .= " $a";
            next;
        }
        $by_set{$set} = { name => $set, isa => $set, requested => $a,
                          build => $set eq 'avx2' ? 'avx2' : 'native',
                          auto => $set eq $auto };
        push @cols, $by_set{$set};
    }
    die "bench: no column to run (BENCH_ISAS=\"@asked\")\n" unless @cols;
    return ($auto, @cols);
}

# A column's description for the reports.
sub describe {
    my ($c, $cache) = @_;
    return { requested => $c->{requested}, isa_flag => "--isa $c->{isa}",
             kernels => $c->{name},
             llama_cpp_build => { dir => "$cache/$builds{ $c->{build} }{dir}",
                                  cmake_flags => llama_flags($c->{build}) } };
}

1;

# The engine for aarch64, cross-built here (make ARCH=aarch64) and run
# under qemu-user: every unit test of t/unit/ and reference.t (greedy text
# equal to llama.cpp's, byte for byte), once per kernel set the aarch64
# build has. Needs Debian's cross compiler, qemu-user and the arm64
# libraries (`make cross-deps`; `make test` installs them on x86-64);
# skipped with the reason when one is missing, or when this machine is
# itself aarch64 (the plain run covers it).
#
# Each suite runs as a child, two at a time (qemu makes them 10-70 times
# slower and the machine has two cores), longest first, each with its own
# time limit; its TAP is then replayed as a subtest named after the suite,
# in a fixed order, as t/engine/isa.t does for OMNI_ISA.
use strict;
use warnings;
use Test::More;
use TAP::Parser;
use File::Temp qw(tempdir);
use POSIX ();
use Time::HiRes qw(time sleep);

my $ARCH    = 'aarch64';
my $TRIPLET = "$ARCH-linux-gnu";
my $BUILD   = "build/$ARCH";
my $SYSROOT = "/usr/$TRIPLET";                  # libc6-dev-arm64-cross
my $CACHE   = $ENV{OMNI_CACHE} || "$ENV{HOME}/.cache/ngx_omni";
my $LIBS    = "$CACHE/cross-libs-arm64";        # t/cross-libs
my @QEMU    = ("qemu-$ARCH", '-L', $SYSROOT);
my $WIDTH   = 2;                                # suites at once
my $LIMIT   = 1800;                             # seconds per suite
my $MODEL   = $ENV{OMNI_MODEL} // '../shared/models/stories260K.gguf';
my $TMP     = tempdir('omni-aarch64-XXXXXX', TMPDIR => 1, CLEANUP => 1);

sub in_path {
    my ($cmd) = @_;
    return grep { -x "$_/$cmd" } split /:/, $ENV{PATH} // '';
}

chomp(my $host = `uname -m`);
plan skip_all => "this machine is $ARCH: the plain run of t/ covers it"
    if $host eq $ARCH;
my @missing;
push @missing, "$TRIPLET-gcc (gcc-$TRIPLET)" unless in_path("$TRIPLET-gcc");
push @missing, "qemu-$ARCH (qemu-user)" unless in_path("qemu-$ARCH");
push @missing, "$SYSROOT (libc6-dev-arm64-cross)"
    unless -e "$SYSROOT/lib/ld-linux-aarch64.so.1";
push @missing, "the arm64 libraries in $LIBS (t/cross-libs)"
    unless glob("$LIBS/.omni-*");
plan skip_all => "aarch64 cross tools missing: " . join(', ', @missing)
                 . "; make cross-deps installs them" if @missing;

# --- the cross build -------------------------------------------------------

my @make = ('make', '-j2', "ARCH=$ARCH", 'all', 'unit');
my $rc = system("@make > $TMP/make.log 2>&1");
ok($rc == 0, "@make") or do {
    diag(`tail -30 $TMP/make.log`);
    done_testing();
    exit;
};
my $file = `file -b $BUILD/omni-engine`;
like($file, qr/ARM aarch64/, "$BUILD/omni-engine is an aarch64 binary");

# (the set generate --stats reports, or undef, and stderr) for OMNI_ISA=$isa
# under qemu with these extra options (-cpu MODEL).
sub set_for {
    my ($isa, @opt) = @_;
    my $err = `OMNI_ISA=$isa @QEMU @opt $BUILD/omni-engine generate --model '$MODEL' --prompt x --max-tokens 1 --stats 2>&1 >/dev/null`;
    return ($? == 0 && $err =~ /backend (\S+),/ ? $1 : undef, $err);
}

# qemu's default CPU has every Armv8 extension, the dot product included.
my ($auto) = set_for('auto');
ok(defined $auto, "the aarch64 engine runs under qemu ('auto' picks "
                  . ($auto // 'nothing') . ')')
    or do { done_testing(); exit };
my @sets = ($auto, grep { $_ ne $auto && defined((set_for($_))[0]) }
                   qw(neon ref));
note("kernel sets of the aarch64 build under qemu: @sets");

# A CPU without it (Cortex-A72, as in Graviton 1 or a Raspberry Pi 4), as
# the engine reads it from the kernel's hwcaps: 'auto' falls back to the
# scalar set, a forced neon is refused by name.
my @A72 = ('-cpu', 'cortex-a72');
is((set_for('auto', @A72))[0], 'ref', "a Cortex-A72 runs 'auto' as ref");
if (grep { $_ eq 'neon' } @sets) {
    like((set_for('neon', @A72))[1],
         qr/kernel set 'neon' needs CPU features this CPU lacks/,
         'a Cortex-A72 refuses --isa neon');
}

# --- the suites, two at a time -----------------------------------------------

# Speech (Flite, the codecs) is not in the cross build: the Makefile's
# SPEECH_TESTS are left out of it, and so here; they run natively.
my ($speech) = `make -s -f Makefile -p ARCH=$ARCH -n 2>/dev/null`
               =~ /^SPEECH_TESTS := (.*(?:\\\n.*)*)$/m;
my %speech = map { $_ => 1 } split ' ', (($speech // '') =~ s/\\\n//gr);
note('not cross-built (speech): ' . join(' ', sort keys %speech));
my @jobs;
for my $src (sort glob('t/unit/test_*.c')) {
    my ($name) = $src =~ m{t/unit/(test_\w+)\.c$};
    next if $speech{$name};
    push @jobs, { name => "t/unit/$name.c", cmd => [@QEMU, "$BUILD/t/$name"],
                  env => {} };
}
push @jobs, { name => 't/unit/test_kernel_set.c on a Cortex-A72',
              cmd => [@QEMU, @A72, "$BUILD/t/test_kernel_set"], env => {} };
for my $isa (@sets) {
    push @jobs, { name => "t/engine/reference.t with OMNI_ISA=$isa",
                  cmd => [$^X, 't/engine/reference.t'],
                  env => { OMNI_ENGINE => "$BUILD/omni-engine",
                           OMNI_ENGINE_WRAPPER => "@QEMU",
                           OMNI_ISA => $isa } };
}

# Rough seconds under qemu on this kind of machine, to start the longest
# first so that two at a time finish together; unknown ones count 1.
my %cost = ('t/unit/test_scheduler.c' => 350, 't/unit/test_kernels.c' => 60,
            't/unit/test_sampler.c' => 50, 't/unit/test_model.c' => 45,
            't/unit/test_kernels_ops.c' => 25);
my @queue = sort { ($cost{$b->{name}} // 1) <=> ($cost{$a->{name}} // 1) }
            @jobs;

sub start_job {
    my ($j, $n) = @_;
    $j->{out} = "$TMP/job$n.tap";
    $j->{start} = time;
    my $pid = fork() // die "fork: $!\n";
    if ($pid == 0) {
        open(STDIN, '<', '/dev/null');
        open(STDOUT, '>', $j->{out});
        open(STDERR, '>&', \*STDOUT);
        @ENV{keys %{ $j->{env} }} = values %{ $j->{env} };
        exec(@{ $j->{cmd} }) or POSIX::_exit(127);
    }
    return $pid;
}

my (%running, $n);
while (@queue || %running) {
    while (@queue && keys %running < $WIDTH) {
        my $j = shift @queue;
        $running{ start_job($j, $n++) } = $j;
    }
    my $pid = waitpid(-1, POSIX::WNOHANG());
    if ($pid > 0 && $running{$pid}) {
        my $j = delete $running{$pid};
        $j->{status} = $?;
        $j->{secs} = time - $j->{start};
        next;
    }
    for my $p (keys %running) {
        next if time - $running{$p}{start} < $LIMIT;
        $running{$p}{timed_out} = 1;
        kill 'KILL', $p;
    }
    sleep(0.2);
}

# --- their results, in order -----------------------------------------------

for my $j (@jobs) {
    subtest "$j->{name}: $ARCH under qemu" => sub {
        open(my $fh, '<', $j->{out}) or die "$j->{out}: $!";
        my $tap = do { local $/; <$fh> };
        my $p = TAP::Parser->new({ tap => $tap });
        while (my $r = $p->next) {
            if ($r->is_test) {
                # cmocka writes "ok 1 - name", Test::More "ok 1 - name" too
                # but TAP::Parser keeps cmocka's dash
                (my $what = $r->description) =~ s/^-\s*//;
                if ($r->has_skip) {
                    pass(($what eq '' ? '' : "$what: ") . 'skipped ('
                         . $r->explanation . ')');
                } else {
                    ok($r->is_ok, $what);
                }
            } elsif ($r->is_comment) {
                note($r->as_string);
            } elsif ($r->is_unknown && $r->as_string ne '') {
                note($r->as_string);
            }
        }
        ok(!$j->{timed_out}, "finished within $LIMIT s");
        is($j->{status}, 0, sprintf("exits 0 (took %.1f s)", $j->{secs}));
        # a program may skip itself whole, with its reason ("1..0 # SKIP
        # no CUDA backend: ..."): that is a plan too
        if ($p->skip_all) {
            pass('skipped as a whole (' . $p->skip_all . ')');
        } else {
            ok($p->tests_run > 0, 'ran tests');
        }
        ok(!$p->parse_errors, 'its TAP is well-formed')
            or diag(join "\n", $p->parse_errors);
        ok($p->is_good_plan, 'ran the tests it planned');
    };
}

done_testing();

# Greedy decoding of the default model equals llama.cpp's, byte for byte.
# The expected texts come from llama.cpp's own llama-simple; the command for
# each and the script that regenerates them are in t/data/.
use strict;
use warnings;
use Test::More;
use JSON::PP;
require './t/engine/lib.pl';
our ($MODEL, $TMP);

open(my $fh, '<', 't/data/llama-cpp-greedy.json') or die $!;
my $ref = decode_json(do { local $/; <$fh> });
my @cases = @{ $ref->{cases} };

for my $c (@cases) {
    for my $threads (1, 2) {
        my ($rc, $out, $err) = run_engine(
            'generate', '--model', $MODEL, '--prompt', $c->{prompt},
            '--max-tokens', $c->{max_tokens}, '--temperature', 0,
            '--threads', $threads);
        is($rc, 0, "exit 0: '$c->{prompt}' ($threads threads)") or diag $err;
        is($out, $c->{expected},
           "same text as llama.cpp: $c->{command} ($threads threads)");
    }
}

# Prefill in chunks smaller than the prompt (several forward calls, across
# KV blocks) gives the same text as one chunk.
my $long = $cases[5];
for my $batch (1, 7, 16) {
    my ($rc, $out) = run_engine(
        'generate', '--model', $MODEL, '--prompt', $long->{prompt},
        '--max-tokens', $long->{max_tokens}, '--temperature', 0,
        '--batch', $batch);
    is($out, $long->{expected}, "prefill in chunks of $batch");
}

# Every kernel set the CPU has gives the same greedy text.
for my $isa (qw(ref avx2 avx512)) {
    my ($rc, $out, $err) = run_engine(
        'generate', '--model', $MODEL, '--prompt', $cases[0]{prompt},
        '--max-tokens', $cases[0]{max_tokens}, '--temperature', 0,
        '--isa', $isa);
  SKIP: {
        skip("isa $isa: $err", 1)
            if $rc != 0 && $err =~ /lacks|not in this build/;
        is($out, $cases[0]{expected}, "isa $isa gives llama.cpp's text");
    }
}

done_testing();

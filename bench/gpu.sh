#!/bin/bash
# bench/gpu.sh: the CUDA backend on one GPU, in one command that fits a
# borrowed machine's few minutes (under 8 on an H200; estimates below).
#
# Needs build/omni-engine, build/omni-cuda.so, build/bench/loadgen and a
# vocabulary GGUF for make-model: GPU_BENCH_VOCAB, else build/bench/vocab/
# ggml-vocab-llama-bpe.gguf (Llama 3's 128256 tokens), else -llama-spm
# (32000). The GPU machine has no network and no cache, so `bench/gpu.sh
# prepare` copies both from llama.cpp's source (t/fetch-llama-src) into
# build/bench/vocab/ beforehand, to travel with build/.
#
# Steps, each under `timeout`, capped by what is left of the whole run's
# budget (GPU_BENCH_BUDGET, default 450 s), so one hang costs its own cap
# and the run never passes 8 minutes:
#   1. nvidia-smi's GPU; bench --backend cuda on a tiny model         ~10 s
#   2. a Llama-3-8B-shaped model (dim 4096, 32 layers, 32/8 heads, ffn
#      14336, ctx 4096, random weights) in F16 (16 GB) and Q8_0 (8.5 GB)
#      with make-model, skipping files that exist                     ~120 s
#   3. bench --backend cuda per type: pp512 with tg128 at batch 1, then
#      tg128 at batch 16 and 64; 3 reps. Six loads of 8-16 GB from the
#      page cache dominate                                      6 x ~20 s
#   4. TTFT through serve --backend cuda on the F16 file, with loadgen as
#      bench/serve drives it: 4 single requests, 32 at concurrency 16 ~45 s
#   5. LLAMA_CUDA_BUILD set (llama-bench built for CUDA, or its build dir):
#      its pp512/tg128 on the same files                         2 x ~40 s
# ~300 s without llama.cpp, ~380 s with it. Then decode at batch 1 as a
# fraction of the HBM roofline: weight bytes per token x tokens/s / HBM_BPS
# (default 4.8e12, the H200's); the goal is >= 0.80 in F16.
#
# Output: $OUT/gpu-bench.json when OUT is set (every step's raw output and
# log in $OUT/gpu-bench-logs/, so they come back too), else
# bench/results/gpu-DATE.json; a summary on stdout. Exit 1 when CUDA does
# not start, 2 when a later step failed (its error is in the JSON).
#   GPU_BENCH_DIR     scratch for the models (default /tmp/gpu-bench)
#   GPU_BENCH_LAYERS  layers (default 32, fewer if writing would be slow)
#   GPU_BENCH_MAKE_S  most seconds the writing may take (default 150)
#   GPU_BENCH_LOAD    load flag for bench and serve (default --mmap: the
#                     weights go to the GPU, a host copy first only costs)
#   OMNI_ENGINE       the engine (default build/omni-engine); loadgen is
#                     its folder's bench/loadgen, omni-cuda.so its folder's
#                     (the engine looks there), and that folder's lib/ and
#                     vocab/ are used when present (a bundle's, below)
#
# `bench/gpu.sh bundle` builds all of it for a machine that has CUDA but
# none of Debian's libraries (the borrowed GPU machine: no speech
# libraries, no -dev packages, no network): a speech-less engine
# (make BUILD=build/gpu SPEECH=0), its CUDA plugin, loadgen and the CUDA
# unit tests, copied without debug info into build/gpu-bundle/ with the
# shared libraries they need beyond glibc, libstdc++ and CUDA's (lib/),
# the vocabularies (vocab/) and the default model (models/); it checks
# that lib/ is all they miss, then prints the size, what to carry and the
# commands to run there.
set -u
cd "$(dirname "$0")/.." || exit 1
ENGINE=${OMNI_ENGINE:-build/omni-engine}
BIN=$(dirname "$ENGINE")
LOADGEN=$BIN/bench/loadgen
[ -d "$BIN/lib" ] &&
    export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ "${1:-}" = prepare ]; then
    src=${OMNI_LLAMA_SRC:-$(t/fetch-llama-src | tail -1)}
    mkdir -p build/bench/vocab &&
        cp "$src"/models/ggml-vocab-llama-{bpe,spm}.gguf build/bench/vocab/
    exit
fi

if [ "${1:-}" = bundle ]; then
    set -eo pipefail
    B=build/gpu OUTB=build/gpu-bundle
    MODEL=${OMNI_MODEL:-../shared/models/stories260K.gguf}
    VOC=(build/bench/vocab/ggml-vocab-llama-{bpe,spm}.gguf)
    for v in "${VOC[@]}"; do [ -f "$v" ] || { "$0" prepare; break; }; done
    [ -n "$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)" ] ||
        { echo "gpu.sh bundle: no nvcc, so no omni-cuda.so" >&2; exit 1; }
    TESTS=(t/test_cuda_kernels t/test_cuda_plan t/test_model)
    FILES=(omni-engine omni-cuda.so bench/loadgen "${TESTS[@]}"
           t/fake-cuda.so t/fake-noentry.so)
    make -j"$(nproc)" BUILD=$B SPEECH=0 "${FILES[@]/#/$B/}"
    rm -rf "$OUTB"
    mkdir -p "$OUTB"/{bench,t,lib,vocab,models}
    for f in "${FILES[@]}"; do strip --strip-debug -o "$OUTB/$f" "$B/$f"; done
    # what they link beyond glibc, libgcc_s, libstdc++ and CUDA's own
    sys='^(linux-vdso|libc|libm|libmvec|libpthread|libdl|librt|libresolv|'
    sys+='ld-linux[^.]*|libgcc_s|libstdc\+\+|libcublas[^.]*|libcudart|libcuda)\.so'
    for f in "${FILES[@]/#/$OUTB/}"; do
        ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
    done | sort -u | while read -r name path; do
        grep -Eq "$sys" <<<"$name" || cp -L "$path" "$OUTB/lib/$name"
    done
    cp "${VOC[@]}" "$OUTB/vocab/"
    cp "$MODEL" "$OUTB/models/"
    # with lib/ and nothing of this machine's: only CUDA's may be missing
    miss=$(for f in "${FILES[@]/#/$OUTB/}"; do
               env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$OUTB/lib" ldd "$f"
           done | grep 'not found' | grep -Ev "$(sed 's/^\^(/(/' <<<"$sys")" |
           sort -u || true)
    [ -z "$miss" ] || { echo "gpu.sh bundle: not found with $OUTB/lib:" >&2
                        echo "$miss" >&2; exit 1; }
    size=$(du -sb "$OUTB" | cut -f1)
    tree=$(git ls-files -co --exclude-standard -z |
           du --files0-from=- -cb 2>/dev/null | tail -1 | cut -f1)
    (cd "$OUTB" && du -sh -- * && du -sh -- lib/*) | sed 's/^/  /'
    awk -v b="$size" -v t="$tree" -v d="$OUTB" 'BEGIN { printf "bundle: %s, %.1f MiB; with the working tree %.1f MiB (limit 64)\n", d, b / 1048576, (b + t) / 1048576 }'
    [ $((size + tree)) -lt $((60 << 20)) ] ||
        { echo "gpu.sh bundle: too big to travel" >&2; exit 1; }
    m=$OUTB/models/$(basename "$MODEL")
    echo "carry: [\"$OUTB\"]"
    echo "bench: OMNI_ENGINE=$OUTB/omni-engine bench/gpu.sh"
    echo "tests: export LD_LIBRARY_PATH=$OUTB/lib" \
         "OMNI_ENGINE=$OUTB/omni-engine OMNI_MODEL=$m;" \
         "prove t/engine/cuda.t $OUTB/t/test_model"
    exit
fi

BUDGET=${GPU_BENCH_BUDGET:-450}
MAKE_S=${GPU_BENCH_MAKE_S:-150}
DIR=${GPU_BENCH_DIR:-/tmp/gpu-bench}
LOAD=${GPU_BENCH_LOAD---mmap}
export HBM_BPS=${HBM_BPS:-4.8e12}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
if [ -n "${OUT:-}" ]; then
    export JSON_OUT=$OUT/gpu-bench.json RUN=$OUT/gpu-bench-logs
else
    export JSON_OUT=bench/results/gpu-$STAMP.json RUN=$DIR/run-$STAMP
fi
mkdir -p "$DIR" "$RUN" "$(dirname "$JSON_OUT")" || exit 1
T0=$(date +%s)
FAILED=0

# cap S: S seconds, or what is left of the budget if that is less (>= 1)
cap() {
    local l=$((BUDGET - $(date +%s) + T0))
    [ "$l" -lt 1 ] && l=1
    [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
# step NAME CAP CMD...: CMD's stdout in $RUN/NAME.json, stderr in NAME.err
step() {
    local name=$1 s; s=$(cap "$2"); shift 2
    timeout -k 5 "$s" "$@" >"$RUN/$name.json" 2>"$RUN/$name.err" && return
    local rc=$?
    [ "$rc" -eq 124 ] && echo "timed out after ${s}s" >>"$RUN/$name.err"
    echo "$name failed ($rc): $(grep -v '^$' "$RUN/$name.err" | tail -1)"
    FAILED=1
    return "$rc"
}

# --- 1. the GPU, and whether the CUDA backend starts on it ----------------------
for v in "${GPU_BENCH_VOCAB:-}" \
         {"$BIN"/vocab,build/bench/vocab}/ggml-vocab-llama-{bpe,spm}.gguf \
         "${OMNI_CACHE:-$HOME/.cache/ngx_omni}"/llama.cpp/models/ggml-vocab-llama-bpe.gguf; do
    [ -n "$v" ] && [ -f "$v" ] && { export VOCAB=$v; break; }
done
[ -n "${VOCAB:-}" ] || { echo "gpu.sh: no vocabulary GGUF (run bench/gpu.sh prepare)"; exit 1; }
case $VOCAB in *llama-spm*) NV=32000 ;; *) NV=128256 ;; esac   # for estimates
export GPU_INFO="nvidia-smi not found"
command -v nvidia-smi >/dev/null && GPU_INFO=$(nvidia-smi --format=csv,noheader \
    --query-gpu=name,memory.total,driver_version 2>&1 | head -1)
echo "GPU: $GPU_INFO"
tiny=$DIR/tiny-f16.gguf
[ -f "$tiny" ] || "$ENGINE" make-model --out "$tiny" --arch llama --dim 256 \
    --layers 2 --heads 4 --ffn 512 --type f16 --ctx 256 --vocab-from "$VOCAB" ||
    { echo "gpu.sh: make-model failed"; exit 1; }
if ! step cuda-check 60 "$ENGINE" bench --backend cuda --model "$tiny" \
        --n-prompt 8 --n-gen 8 --reps 1; then
    echo "gpu.sh: omni-engine bench --backend cuda does not start:"
    cat "$RUN/cuda-check.err"
    exit 1
fi
echo "CUDA starts: $(grep -o '"backend": "[^"]*"' "$RUN/cuda-check.json")"

# --- 2. the models ----------------------------------------------------------------
# make-model is single-threaded (one generator, tensor by tensor): ~75M
# weights/s measured on an EPYC core, so 32 layers (8.0B weights at vocab
# 128256) take ~105 s in F16 and ~115 s in Q8_0, written side by side.
# The first two tensors (token_embd, output: 1.05B weights) tell this
# host's rate; if a file would take more than MAKE_S, both restart with
# the layers that fit (roofline figures are per byte, so they stay
# comparable; the JSON says "layers").
LW=218103808                                     # weights in one layer
EMB=$((2 * 4096 * NV))                           # token_embd and output
weights() { echo $(($1 * LW + EMB)); }
bytes() { [ "$1" = f16 ] && echo $(($2 * 2)) || echo $(($2 * 34 / 32)); }
model() { echo "$DIR/llama-L$1-$2.gguf"; }
write_models() {
    PIDS='' TODO=''
    for t in f16 q8_0; do
        [ -f "$(model "$L" $t)" ] && continue
        timeout -k 5 "$(cap $((MAKE_S + 60)))" "$ENGINE" make-model \
            --out "$(model "$L" $t)" --arch llama --dim 4096 --layers "$L" \
            --heads 32 --kv-heads 8 --ffn 14336 --ctx 4096 --type $t \
            --vocab-from "$VOCAB" --seed 1 >"$RUN/make-$t.err" 2>&1 &
        PIDS="$PIDS $!" TODO="$TODO $t"
    done
}
L=${GPU_BENCH_LAYERS:-$(cat "$DIR/layers" 2>/dev/null || echo 32)}
# the disk must hold both files with 2 GB to spare (the H200 host: 64 GB)
avail=$(($(df -Pk "$DIR" | awk 'NR == 2 { print $4 }') * 1024 - (2 << 30)))
while [ "$L" -gt 1 ] && [ ! -f "$(model "$L" f16)" ] && [ $(($(bytes f16 \
      "$(weights "$L")") + $(bytes q8_0 "$(weights "$L")"))) -gt "$avail" ]; do
    L=$((L - 1))
done
rm -f "$DIR"/*.tmp.*                 # a killed run's, never renamed
t_make=$(date +%s) ms0=$(date +%s%3N)
write_models
if [ -n "$PIDS" ] && [ -z "${GPU_BENCH_LAYERS:-}" ]; then
    declare -A est=()                # type -> seconds its whole file takes
    while [ ${#est[@]} -lt "$(wc -w <<<"$TODO")" ] &&
          [ $(($(date +%s) - t_make)) -lt 60 ]; do
        for t in $TODO; do
            got=$(stat -c %s "$(model "$L" $t)".tmp.* 2>/dev/null | head -1)
            [ -z "${est[$t]:-}" ] && [ "${got:-0}" -ge "$(bytes $t $EMB)" ] &&
                est[$t]=$((($(date +%s%3N) - ms0) * $(bytes $t \
                          "$(weights "$L")") / got / 1000))
        done
        sleep 0.5
    done
    worst=0
    for t in $TODO; do [ "${est[$t]:-9999}" -gt $worst ] && worst=${est[$t]:-9999}; done
    echo "make-model: $L layers, ~${worst}s to write here (at most ${MAKE_S}s)"
    if [ "$worst" -gt "$MAKE_S" ]; then
        fit=$(((MAKE_S * $(weights "$L") / worst - EMB) / LW))
        [ "$fit" -lt 1 ] && fit=1
        echo "make-model: too slow for $L layers; writing $fit"
        kill $PIDS; wait; rm -f "$DIR"/*.tmp.*
        L=$fit
        write_models
    fi
fi
for p in $PIDS; do wait "$p" || { echo "make-model failed: $(tail -1 "$RUN"/make-*.err)"; exit 1; }; done
echo "$L" >"$DIR/layers"
export LAYERS=$L MAKE_S_TOOK=$(($(date +%s) - t_make))
F16=$(model "$L" f16) Q8=$(model "$L" q8_0)
export F16 Q8
echo "models: $L layers, written in ${MAKE_S_TOOK}s ($F16, $Q8)"

# --- 3. bench ------------------------------------------------------------------------
for t in f16 q8_0; do
    f=$(model "$L" $t)
    step $t-b1 100 "$ENGINE" bench --backend cuda --model "$f" $LOAD \
        --n-prompt 512 --n-gen 128 --batch 1 --reps 3
    for b in 16 64; do
        step $t-b$b 100 "$ENGINE" bench --backend cuda --model "$f" $LOAD \
            --n-prompt 0 --n-gen 128 --batch $b --reps 3
    done
done

# --- 4. TTFT through serve ---------------------------------------------------------
# Word salad as bench/serve writes it (~130 tokens a prompt, each its own
# start so the prefix cache cannot help); 16 contexts of 1024 tokens of KV
# (L layers x K,V x 8 heads x 128 x 2 bytes a token).
awk 'BEGIN { srand(1); n = split("river stone lantern winter orchard copper \
whisper harbor meadow thunder violet candle market engine forest silver quiet \
journey marble garden shadow letter mountain pocket ribbon signal window the \
a of and to in on with under over runs sings drifts slowly gently", w, " ");
  for (i = 1; i <= 40; i++) { s = "Entry " i ":";
    for (j = 0; j < 72; j++) s = s " " w[int(rand() * n) + 1]; print s } }' \
    >"$RUN/prompts.txt"
sock=$DIR/serve.sock                 # short: a socket path has 108 bytes
rm -f "$sock"
"$ENGINE" serve --backend cuda --model "$F16" $LOAD --socket "$sock" \
    --ctx 1024 --max-seqs 16 --max-batch-tokens 2048 --drain-timeout 5 \
    --kv-cache-mb $((16 * 1024 * L * 4096 / 1048576 + 64)) \
    >"$RUN/serve.log" 2>&1 &
spid=$!
ready=$(($(date +%s) + $(cap 120)))  # loading 16 GB and starting the stage
until "$ENGINE" client --socket "$sock" --health >/dev/null 2>&1; do
    if ! kill -0 $spid 2>/dev/null || [ "$(date +%s)" -gt $ready ]; then
        echo "serve did not become ready: $(tail -1 "$RUN/serve.log")" |
            tee "$RUN/ttft-c1.err"
        FAILED=1; ready=0; break
    fi
    sleep 0.5
done
if [ $ready -gt 0 ]; then
    for c in 1 16; do
        step ttft-c$c 60 "$LOADGEN" --omni "$sock" --prompts "$RUN/prompts.txt" \
            --concurrency $c --requests $((c == 1 ? 4 : 32)) --max-tokens 16 \
            --ignore-eos --warmup $((c == 1))
    done
fi
kill $spid 2>/dev/null               # stopped by pid: TERM, then KILL
for _ in $(seq 20); do kill -0 $spid 2>/dev/null || break; sleep 0.5; done
kill -KILL $spid 2>/dev/null; wait $spid 2>/dev/null

# --- 5. llama.cpp, when a CUDA build was given ---------------------------------------
if [ -n "${LLAMA_CUDA_BUILD:-}" ]; then
    lb=$LLAMA_CUDA_BUILD
    [ -d "$lb" ] && lb=$lb/bin/llama-bench
    export LLAMA_BENCH=$lb
    for t in f16 q8_0; do
        step llama-$t 120 "$lb" -m "$(model "$L" $t)" -p 512 -n 128 -r 3 \
            -ngl 99 -o json
    done
fi

# --- report ---------------------------------------------------------------------------
export ELAPSED=$(($(date +%s) - T0)) BUDGET
perl - <<'REPORT' || FAILED=1
use strict;
use warnings;
use JSON::PP;
my %E = %ENV;
# a step's JSON, or {error => the last line of its stderr}
sub got {
    my $n = shift;
    my $j = eval { local (@ARGV, $/) = ("$E{RUN}/$n.json"); decode_json(<>) };
    return $j if $j;
    my @e = grep { /\S/ } eval { local @ARGV = ("$E{RUN}/$n.err"); <> };
    chomp(my $last = $e[-1] // 'no output');
    return { error => $last };
}
sub median {
    my @s = sort { $a <=> $b } @_;
    return @s % 2 ? $s[$#s / 2] : ($s[@s / 2 - 1] + $s[@s / 2]) / 2;
}
my ($name, $mem, $driver) = split /,\s*/, $E{GPU_INFO};
my %r = (date => `date -u +%FT%TZ` =~ s/\n//r,
         commit => `git rev-parse --short HEAD 2>/dev/null` =~ s/\n//r,
         gpu => { name => $name, memory => $mem, driver => $driver },
         hbm_bytes_per_s => $E{HBM_BPS} + 0, layers => $E{LAYERS} + 0,
         model => "llama, dim 4096, $E{LAYERS} layers, 32 heads, 8 KV heads, "
                  . "ffn 14336, ctx 4096, random weights (make-model)",
         vocab_from => $E{VOCAB}, make_model_s => $E{MAKE_S_TOOK} + 0,
         elapsed_s => $E{ELAPSED} + 0, budget_s => $E{BUDGET} + 0,
         goal => { decode_batch1_f16_fraction_of_roofline => 0.80 });
$r{note} = "fewer layers than Llama-3-8B's 32 (make-model too slow here or "
           . "the disk too small); per-byte figures are comparable"
    if $E{LAYERS} < 32;
printf "\n%-5s %-8s %10s %10s %10s %10s %9s\n", 'type', 'backend', 'pp512',
       'tg128 b1', 'b16', 'b64', 'roofline';
for my $t (qw(f16 q8_0)) {
    my %x = (file => $t eq 'f16' ? $E{F16} : $E{Q8},
             file_bytes => -s ($t eq 'f16' ? $E{F16} : $E{Q8}));
    for my $b (1, 16, 64) {
        my $j = got("$t-b$b");
        $x{pp512} = $j->{pp} if $j->{pp};
        $x{tg128}{"batch_$b"} = $j->{tg} // $j;
        $x{tg128}{"batch_$b"}{batch_reported} = $j->{batch} if $j->{tg};
        $x{$_} //= $j->{$_} for qw(backend weight_bytes_per_token);
    }
    my ($w, $tps) = ($x{weight_bytes_per_token}, $x{tg128}{batch_1}{median});
    if ($w && $tps) {
        $x{roofline_tok_per_s} = $E{HBM_BPS} / $w;
        $x{decode_batch1_fraction_of_roofline} = $w * $tps / $E{HBM_BPS};
    }
    $r{results}{$t} = \%x;
    my $f = sub { my $v = shift; defined $v ? sprintf('%.1f', $v) : 'fail' };
    printf "%-5s %-8s %10s %10s %10s %10s %9s\n", $t, $x{backend} // '-',
           $f->($x{pp512}{median}),
           map({ $f->($x{tg128}{"batch_$_"}{median}) } 1, 16, 64),
           defined $x{decode_batch1_fraction_of_roofline}
           ? sprintf('%.0f%%', 100 * $x{decode_batch1_fraction_of_roofline})
           : '-';
}
my $frac = $r{results}{f16}{decode_batch1_fraction_of_roofline};
$r{goal}{met} = defined $frac && $frac >= 0.80 ? JSON::PP::true
                                                : JSON::PP::false;
printf "decode at batch 1, F16: %s of the HBM roofline (%.2g B/s); goal "
       . ">= 0.80: %s\n", defined $frac ? sprintf('%.2f', $frac) : '-',
       $E{HBM_BPS}, $r{goal}{met} ? 'met' : 'NOT met';
for my $c (1, 16) {
    my $j = $r{ttft}{"concurrency_$c"} = got("ttft-c$c");
    printf "TTFT through serve (F16), %2d at once: %s\n", $c,
           $j->{ttft_ms} ? sprintf('p50 %.1f ms, p99 %.1f ms, %d errors',
                                   @{ $j->{ttft_ms} }{qw(p50 p99)},
                                   $j->{errors})
                         : "failed: $j->{error}";
}
# what the thinker said about its load and its device
$r{ttft}{serve_log} = [ grep { /thinker: loaded|CUDA|cuda/ }
                        eval { local @ARGV = ("$E{RUN}/serve.log"); <> } ];
chomp @{ $r{ttft}{serve_log} };
$r{'llama.cpp'} = 'not built';
if ($E{LLAMA_BENCH}) {
    $r{'llama.cpp'} = { llama_bench => $E{LLAMA_BENCH} };
    for my $t (qw(f16 q8_0)) {
        my $j = got("llama-$t");
        $r{'llama.cpp'}{$t} = ref $j eq 'ARRAY' ? { map {
            ($_->{n_prompt} ? 'pp512' : 'tg128') => {
                median => median(@{ $_->{samples_ts} }),
                tokens_per_s => $_->{samples_ts} }
        } @$j } : $j;
        printf "llama.cpp %-5s pp512 %s, tg128 %s tok/s\n", $t,
               map { my $m = $r{'llama.cpp'}{$t}{$_}{median};
                     defined $m ? sprintf('%.1f', $m) : 'fail' } qw(pp512 tg128);
    }
}
print "llama.cpp: not built (LLAMA_CUDA_BUILD unset)\n" unless ref $r{'llama.cpp'};
open(my $fh, '>', $E{JSON_OUT}) or die "$E{JSON_OUT}: $!\n";
print $fh JSON::PP->new->pretty->canonical->encode(\%r);
close $fh;
printf "%s, %d layers, %d s of %d; wrote %s\n", $E{GPU_INFO}, $E{LAYERS},
       $E{ELAPSED}, $E{BUDGET}, $E{JSON_OUT};
REPORT
[ $FAILED -eq 0 ] || exit 2

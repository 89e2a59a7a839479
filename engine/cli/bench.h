/* bench.h -- llama-bench's two measurements, on our engine.
 *
 *   pp: prefill of n_prompt random tokens in one batch at positions 0..n-1
 *   tg: n_gen decode steps at positions 0..n_gen-1, of `batch` sequences
 *       at once (one token each per step; tokens/s counts them all)
 * with a warm-up run of each first, as llama-bench does, so the figures are
 * comparable with its pp512 / tg128 on the same file and thread count. */

#ifndef OMNI_BENCH_H
#define OMNI_BENCH_H

#include <stdint.h>

#include "kernels.h"
#include "log.h"
#include "model.h"

#define BENCH_BLOCK 16             // tokens per KV block

typedef struct {
    int64_t n_prompt;           // pp size (0: skip)
    int64_t n_gen;              // tg size (0: skip)
    int     reps;               // repetitions of each, after the warm-up
    int64_t batch;              // sequences decoding together (0: 1)
} BenchParams;

typedef struct {
    double pp_tps[16];          // tokens/s of each pp repetition
    double tg_tps[16];          // tokens/s of each tg repetition
    int    reps;
} BenchResult;

/* Runs the measurements with be. Returns -1 with err set when memory for
 * the KV cache or activations runs out. */
int bench_run(const Model *m, Backend *be, const BenchParams *p,
              BenchResult *r, Err *err);

#endif

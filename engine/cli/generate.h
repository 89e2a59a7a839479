/* generate.h -- one sequence, start to finish: the runner behind the
 * `generate` CLI and the single-stream benchmarks.
 *
 * A Generator owns a KV cache for one sequence of up to n_ctx tokens, the
 * activations for prefill chunks of max_batch tokens and a decoder (its
 * sampler and text scratch), allocated in gen_init; gen_run allocates only
 * the top-logits report's scratch, when asked, once, before the first
 * token.
 * gen_run prefills the prompt in chunks, then decodes token by token with
 * decode.h's step (sample -> end-of-generation check -> detokenize -> stop
 * strings -> emit), until a stop, EOS or the token limit. The serving
 * scheduler batches many sequences through the same step instead; this is
 * the reference it must agree with. */

#ifndef OMNI_GENERATE_H
#define OMNI_GENERATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "decode.h"
#include "kernels.h"
#include "kv_cache.h"
#include "log.h"
#include "model.h"
#include "sampler.h"

#define GEN_BLOCK_SIZE 16          // tokens per KV block
#include "stop.h"
#include "tokenizer.h"

typedef struct {
    int64_t        max_tokens;      // tokens to generate at most
    SamplerParams  sampling;
    const char    *stop[STOP_MAX];  // stop strings, borrowed
    int            n_stop;
    int32_t        top_logits;      // K: report the K best logits of every
                                    //   step (0 = off), see gen_run
    FILE          *top_out;         // where those reports go, borrowed
} GenParams;

typedef struct {
    int64_t     n_prompt;
    int64_t     n_gen;
    double      t_prefill;          // seconds to the first token's logits
    double      t_decode;           // seconds for the remaining tokens
    const char *finish;             // "stop" or "length"
} GenStats;

/* Receives generated text as it is produced; nonzero return cancels. */
typedef DecodeEmitFn GenEmitFn;

typedef struct {
    const Model     *m;             // borrowed
    const Tokenizer *tk;            // borrowed
    Backend         *be;            // borrowed
    int64_t          n_ctx;
    int64_t          max_batch;
    KVCache          kv;
    RunState         rs;
    int32_t         *block_table;   // (n_ctx / block_size,), owned
    int32_t         *pos;           // (max_batch,), owned
    const int32_t  **tables;        // (max_batch,), owned
    Decoder          dec;           // the sequence's decode state, owned
} Generator;

/* Sets up for sequences of up to n_ctx tokens (prompt + output), prefilled
 * max_batch tokens at a time. */
int  gen_init(Generator *g, const Model *m, const Tokenizer *tk, Backend *be,
              int64_t n_ctx, int64_t max_batch, Err *err);
void gen_free(Generator *g);

/* Generates from n_prompt prompt tokens. Errors (-1, err set): an empty or
 * too long prompt, invalid sampling or stop parameters, top_logits out of
 * 0..n_vocab, out of memory.
 *
 * With p->top_logits = K > 0, every step also writes one JSON line to
 * p->top_out, before the token is emitted:
 *   {"step":0,"pos":6,"token":...,"piece":"...","logit":...,
 *    "top":[{"id":...,"piece":"...","logit":...}, ...K],"margin":...}
 * step counts generated tokens from 0; pos is the position the token takes
 * in the sequence; token is the one sampled (an end-of-generation token
 * too, on the last line); top is the K best logits best first (higher
 * logit, lower id on ties: greedy's order), and margin the first minus the
 * second of them (null when the vocabulary has one token). Logits are the
 * model's, before logit bias and penalties, printed with 9 significant
 * digits (enough to tell any two floats apart); a non-finite one is null.
 * A piece is the token's bytes (control tokens as their text), or
 * "<0xXX>" per byte when they are not valid UTF-8 on their own. */
int  gen_run(Generator *g, const int32_t *prompt, int64_t n_prompt,
             const GenParams *p, GenEmitFn emit, void *ud, GenStats *st,
             Err *err);

#endif

/* scheduler.h -- iteration-level continuous batching over the paged KV
 * cache.
 *
 * A sequence is its tokens (prompt, then what it generated) and how many
 * of them have K/V in the cache (n_computed). Every step runs one forward
 * pass over a batch mixing, under a token budget (max_batch_tokens) and a
 * sequence cap (max_seqs):
 *   1. one token for each admitted sequence that is decoding,
 *   2. prefill chunks for admitted sequences still prefilling (or
 *      recomputing after preemption), oldest first, as the budget allows,
 *   3. new sequences from the waiting queue, first come first served, while
 *      the cap and the budget allow.
 * A sequence whose chunk reaches its last token gets logits, samples one
 * token, streams its text (detokenizer, stop strings) and goes on decoding
 * in the next step; one that finishes leaves at once and its blocks go
 * back to the pool (or to the prefix cache).
 *
 * Prefill and decode are the same operation here: run tokens
 * [n_computed, end) of a sequence. Because the kernels are batch-invariant
 * (kernels.h), a sequence's logits do not depend on its batch mates, on how
 * its prompt was cut into chunks, or on whether its K/V came from the
 * prefix cache or a recompute: output is token for token what it is alone.
 *
 * Memory: when a step needs a block and none is free or evictable, the
 * newest admitted sequence is preempted: its blocks are released (full
 * ones stay in the prefix cache), n_computed drops to 0 and it is
 * recomputed when blocks allow, ahead of newer sequences; its sampler and
 * text state are kept, so its output is unchanged.
 *
 * Prefix cache: at admission (and after preemption) the full blocks of
 * tokens [0, n - 1) are looked up by hash chain (kv_cache.h, salted with
 * the request's cache_salt); hits are shared by reference and skipped.
 * Each block a sequence fills is published.
 *
 * Ownership: sched_new allocates everything (sequence slots, samplers,
 * token arrays, batch arrays, the KV cache, activations); sched_submit
 * allocates the queued request's prompt copy (a queue entry keeps its
 * buffer for the next request, so it grows only for a longer prompt);
 * sched_step allocates and frees nothing. Single-threaded: the stage's main thread calls everything; the
 * forward pass uses the backend's thread pool. */

#ifndef OMNI_SCHEDULER_H
#define OMNI_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "kv_cache.h"
#include "log.h"
#include "model.h"
#include "omni_proto.h"
#include "sampler.h"
#include "stage_channel.h"
#include "stop.h"
#include "tokenizer.h"

typedef struct {
    int64_t max_batch_tokens;   // tokens per step (>= max_seqs)
    int     max_seqs;           // admitted sequences (running + preempted)
    int     max_queue;          // waiting requests; more are refused (503)
    int     block_size;         // tokens per KV block
    int64_t n_blocks;           // KV blocks in the pool
    int64_t max_ctx;            // tokens per sequence (prompt + output)
    bool    prefix_cache;
} SchedConfig;

/* What one request asks for, beyond its prompt tokens. */
typedef struct {
    int64_t        max_tokens;      // -1: until EOS or the context is full
    SamplerParams  sampling;
    const char    *stop[STOP_MAX];  // borrowed for the call only
    int            n_stop;
    bool           ignore_eos;
    bool           think;           // split reasoning off (think.h): a
                                    //   chat request, thinking on, to a
                                    //   thinking template
    const void    *cache_salt;      // borrowed for the call only
    size_t         cache_salt_len;
    const char    *prompt_param;    // the request field the prompt came
                                    //   from, for errors: "messages"
                                    //   (NULL) or "prompt"
} SeqParams;

/* Where events go. Called from sched_submit, sched_step and
 * sched_abort_all; the buffers passed are valid for the call only. A
 * request gets STARTED (when first admitted), TEXT* (each reasoning or
 * content: SeqParams.think), then DONE; or one
 * ERROR instead, possibly after STARTED and TEXT. Callbacks must not call
 * back into the scheduler. */
typedef struct {
    void  *ud;
    void (*started)(void *ud, uint64_t id);
    void (*text)(void *ud, uint64_t id, bool reasoning, const char *s,
                 size_t n);
    void (*done)(void *ud, uint64_t id, const OmniDone *d);
    void (*error)(void *ud, uint64_t id, int status, const char *type,
                  const char *param, const char *code, const char *msg);
} SchedEvents;

typedef struct Scheduler Scheduler;

/* Sets up for cfg. The model, tokenizer, backend and stats page are
 * borrowed and must outlive the scheduler; stats may be NULL. Returns NULL
 * with err set for an invalid cfg (named) or when memory runs out. */
Scheduler *sched_new(const Model *m, const Tokenizer *tk, Backend *be,
                     const SchedConfig *cfg, const SchedEvents *ev,
                     OmniStats *stats, Err *err);
void       sched_free(Scheduler *s);

/* Queues request id with n prompt tokens (copied). Returns 0 when queued;
 * -1 when refused, after emitting its ERROR event: an empty prompt or one
 * that leaves no room in the context (400 context_length_exceeded, param
 * p->prompt_param), invalid sampling or stop parameters (400, param named), a
 * full queue (503 "overloaded"). */
int        sched_submit(Scheduler *s, uint64_t id, const int32_t *prompt,
                        int64_t n, const SeqParams *p);

/* Drops request id wherever it is (queued or admitted), freeing its
 * blocks at once; emits nothing. Unknown ids are ignored. */
void       sched_cancel(Scheduler *s, uint64_t id);

/* True when there is nothing to run. */
bool       sched_idle(const Scheduler *s);

/* Runs one step (see above) and emits its events. Can't fail. */
void       sched_step(Scheduler *s);

/* Ends every request with an ERROR event (503, "server_error",
 * code "engine_shutdown") and frees them. */
void       sched_abort_all(Scheduler *s, const char *why);

typedef struct {
    int64_t  running;           // admitted
    int64_t  waiting;
    int64_t  preemptions;
    int64_t  blocks_used, blocks_cached, blocks_free;
} SchedCounts;

void       sched_counts(const Scheduler *s, SchedCounts *c);

/* The KV cache, to read between steps (kv_find: which prefixes it holds;
 * the prefix index does, thinker/prefix_index.h). Only the scheduler
 * writes it, so a caller on its thread sees it whole. Can't fail. */
const KVCache *sched_kv(const Scheduler *s);

#endif

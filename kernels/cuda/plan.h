/* plan.h -- the CUDA backend's decisions that need no device: how much
 * memory it may take, how attention splits a context, how many KV blocks
 * fit, and which decode steps are recorded as CUDA graphs.
 *
 * Kept apart from cuda_backend.cu so that the host compiler builds it into
 * every engine and the unit tests exercise it on machines without a GPU
 * (t/unit/test_cuda_plan.c); the backend only feeds it what the device
 * reports. */

#ifndef OMNI_CUDA_PLAN_H
#define OMNI_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Memory ---------------------------------------------------------- */

#define CUDA_FRACTION_DEFAULT   0.9
#define CUDA_RESERVE_BYTES      (512ull << 20)  /* the context, cuBLAS's
                                                   own state and kernels'
                                                   code: memory we use but
                                                   do not allocate */

/* The backend's budget: fraction (0 = the default) of the device's total
 * memory, less the reserve. Fails, with err saying which numbers, when the
 * fraction is outside (0, 1], when the budget exceeds what is free now
 * (another process holds the rest) or when it leaves nothing. */
int cuda_plan_budget(uint64_t total, uint64_t free_now, double fraction,
                     uint64_t *budget, char *err, size_t errlen);

/* ---- Attention ------------------------------------------------------- */

#define CUDA_ATTN_MIN_CHUNK     256
#define CUDA_ATTN_MAX_SPLITS    32

/* Split-context attention's piece size and count for contexts up to
 * max_ctx: pieces of at least CUDA_ATTN_MIN_CHUNK positions (a multiple of
 * 32), at most CUDA_ATTN_MAX_SPLITS of them. Fixed at creation, so a
 * token's pieces never depend on its batch. */
void cuda_attn_shape(int64_t max_ctx, int *chunk, int *max_splits);

/* Bytes of the attention workspace (CuAttnWork.part). */
uint64_t cuda_attn_bytes(int64_t max_tokens, int n_heads, int head_dim,
                         int max_splits);

/* ---- Decode graphs ----------------------------------------------------
 * A decode step (every token the last of its sequence, so n == n_out) of
 * a batch size seen before is recorded once as a CUDA graph and replayed
 * from then on: one launch instead of a few hundred. A size is recorded on
 * its second sighting (a size seen once is likely a passing one), at most
 * CUDA_GRAPH_SLOTS are kept, and the least recently used is dropped for a
 * new one. Larger batches and prefills run as plain launches: their
 * launch overhead is small beside their work. */

#define CUDA_GRAPH_SLOTS        16
#define CUDA_GRAPH_MAX_BATCH    64
#define CUDA_GRAPH_SIZES        (CUDA_GRAPH_MAX_BATCH + 1)

typedef enum {
    GRAPH_RUN,          // launch the ops as they come
    GRAPH_CAPTURE,      // record them into slot, then launch the graph
    GRAPH_REPLAY,       // skip the ops; launch slot's graph at end
} GraphAction;

typedef struct {
    int64_t  n;         // batch size recorded, 0 = empty
    uint64_t bufs;      // the buffers' identity it was recorded with
    uint64_t last;      // tick of last use
} GraphSlot;

typedef struct {
    GraphSlot slots[CUDA_GRAPH_SLOTS];
    uint32_t  seen[CUDA_GRAPH_SIZES];   // steps seen per batch size
    uint64_t  tick;
    int       max_batch;    // largest batch recorded (<= MAX_BATCH)
    uint64_t  replays;      // counters, for the log and tests
    uint64_t  captures;
    uint64_t  evictions;
} GraphCache;

void graph_cache_init(GraphCache *g, int max_batch);

/* What to do with a step of n tokens of which n_out get logits, on the
 * buffers bufs identifies (a graph recorded on others is not theirs). For
 * GRAPH_CAPTURE *slot is where to record (the caller destroys the graph
 * already there when *evicted); for GRAPH_REPLAY the slot to launch. */
GraphAction graph_plan(GraphCache *g, int64_t n, int64_t n_out,
                       uint64_t bufs, int *slot, bool *evicted);

/* Forgets slot's recording (its capture failed): the size runs plainly
 * and is tried again after two more sightings. */
void graph_drop(GraphCache *g, int slot);

#ifdef __cplusplus
}
#endif

#endif

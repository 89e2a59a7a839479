/* plan.c -- the CUDA backend's device-free decisions; see plan.h. */

#include <stdio.h>
#include <string.h>

#include "plan.h"

#define GIB(b)  ((double) (b) / (double) (1ull << 30))


/* ---- Memory ---------------------------------------------------------- */

int cuda_plan_budget(uint64_t total, uint64_t free_now, double fraction,
                     uint64_t *budget, char *err, size_t errlen)
{
    double   f = fraction == 0.0 ? CUDA_FRACTION_DEFAULT : fraction;
    uint64_t want;

    *budget = 0;
    if (!(f > 0.0 && f <= 1.0)) {
        snprintf(err, errlen, "--gpu-memory-fraction must be above 0 and "
                 "at most 1, not %g", fraction);
        return -1;
    }
    want = (uint64_t) (f * (double) total);
    if (want > free_now) {
        snprintf(err, errlen, "--gpu-memory-fraction %g asks for %.1f GiB of "
                 "the device's %.1f GiB, but only %.1f GiB are free (other "
                 "processes hold the rest): lower it", f, GIB(want),
                 GIB(total), GIB(free_now));
        return -1;
    }
    if (want <= CUDA_RESERVE_BYTES) {
        snprintf(err, errlen, "--gpu-memory-fraction %g leaves %.2f GiB, not "
                 "more than the %.2f GiB the CUDA context itself needs", f,
                 GIB(want), GIB(CUDA_RESERVE_BYTES));
        return -1;
    }
    *budget = want - CUDA_RESERVE_BYTES;
    return 0;
}


/* ---- Attention ------------------------------------------------------- */

void cuda_attn_shape(int64_t max_ctx, int *chunk, int *max_splits) {
    int64_t c;

    if (max_ctx < 1) max_ctx = 1;
    c = (max_ctx + CUDA_ATTN_MAX_SPLITS - 1) / CUDA_ATTN_MAX_SPLITS;
    if (c < CUDA_ATTN_MIN_CHUNK) c = CUDA_ATTN_MIN_CHUNK;
    c = (c + 31) / 32 * 32;
    *chunk = (int) c;
    *max_splits = (int) ((max_ctx + c - 1) / c);
}

uint64_t cuda_attn_bytes(int64_t max_tokens, int n_heads, int head_dim,
                         int max_splits)
{
    return (uint64_t) max_tokens * (uint64_t) n_heads
           * (uint64_t) max_splits * ((uint64_t) head_dim + 2)
           * sizeof(float);
}


/* ---- Decode graphs --------------------------------------------------- */

void graph_cache_init(GraphCache *g, int max_batch) {
    memset(g, 0, sizeof(*g));
    if (max_batch > CUDA_GRAPH_MAX_BATCH) max_batch = CUDA_GRAPH_MAX_BATCH;
    g->max_batch = max_batch < 0 ? 0 : max_batch;
}

/* The slot to record into: an empty one, else the least recently used. */
static int graph_victim(const GraphCache *g) {
    int v = 0;

    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
        if (g->slots[i].n == 0) return i;
        if (g->slots[i].last < g->slots[v].last) v = i;
    }
    return v;
}

GraphAction graph_plan(GraphCache *g, int64_t n, int64_t n_out,
                       uint64_t bufs, int *slot, bool *evicted)
{
    int v;

    *slot = -1;
    *evicted = false;
    if (n < 1 || n != n_out || n > g->max_batch) return GRAPH_RUN;
    g->tick++;
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
        if (g->slots[i].n == n && g->slots[i].bufs == bufs) {
            g->slots[i].last = g->tick;
            g->replays++;
            *slot = i;
            return GRAPH_REPLAY;
        }
    }
    if (g->seen[n] < 2) g->seen[n]++;
    if (g->seen[n] < 2) return GRAPH_RUN;
    v = graph_victim(g);
    if (g->slots[v].n != 0) {
        *evicted = true;
        g->seen[g->slots[v].n] = 0;     /* re-earns a slot by sightings */
        g->evictions++;
    }
    g->slots[v].n = n;
    g->slots[v].bufs = bufs;
    g->slots[v].last = g->tick;
    g->captures++;
    *slot = v;
    return GRAPH_CAPTURE;
}

void graph_drop(GraphCache *g, int slot) {
    if (slot < 0 || slot >= CUDA_GRAPH_SLOTS || g->slots[slot].n == 0) return;
    g->seen[g->slots[slot].n] = 0;
    g->slots[slot].n = 0;
    g->slots[slot].last = 0;
}

/* cuda_backend.cu -- the CUDA implementation of the Backend table, built
 * into the plugin omni-cuda.so (kernels/backend.c loads it).
 *
 * This file owns the device: its stream, every allocation (charged to the
 * budget --gpu-memory-fraction allows, plan.h), the weights' device copies,
 * the batch staging area and the decode graphs. The kernels are in ops.cu,
 * attention.cu and matmul.cu, behind cuda_ops.h's launchers.
 *
 * A forward runs between begin and end. begin copies the batch's tokens,
 * positions, output rows and block tables (each sequence's once) to a
 * fixed device area in one transfer, so every op reads them from the same
 * addresses at every step; that is what lets a decode step be recorded as
 * a CUDA graph and replayed (plan.h decides when). During a replay the ops
 * return at once and end launches the graph. Only argmax and to_host wait
 * for the device: a step's results leave it as token ids, or as the logits
 * rows a sampler needs whole.
 *
 * A failure on the device after start-up (a kernel fault, a failed
 * capture) leaves the context unusable, so it ends the process with the
 * reason on stderr: the thinker is a stage, which the frontend restarts
 * with a fresh context while nginx keeps serving. */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_ops.h"
#include "kernels.h"
#include "plan.h"

typedef struct {
    void       *dev;
    size_t      bytes;
    const void *host;       // what an upload copied, NULL for alloc's
} CuAlloc;

typedef struct {
    BackendConfig cfg;
    int           device;
    cudaStream_t  st;
    uint64_t      budget;       // bytes we may hold
    uint64_t      used;         //   and hold
    CuAlloc      *allocs;       // every device allocation, owned
    int           n_allocs, cap_allocs;
    CuMatmul     *mm;
    CuAttnWork    attn;

    /* The staging area: host (pinned) and device copies of the same
     * layout, int32: tokens, pos, seq (max_tokens each), out_idx
     * (max_out), then tables (max_tokens rows of table_stride). */
    int32_t      *h_stage;
    int32_t      *d_stage;
    size_t        stage_ints;
    int           table_stride;
    cudaEvent_t   staged;       // the last staging copy is done with
    CuBatch       batch;        // views into d_stage, for the launchers

    int32_t      *h_ids;        // (max_out,) argmax results, pinned
    int32_t      *d_ids;

    GraphCache    gc;
    cudaGraphExec_t graphs[CUDA_GRAPH_SLOTS];
    GraphAction   action;       // of the step between begin and end
    int           slot;

    char          name[48];
} CudaCtx;


/* ---- Failure --------------------------------------------------------- */

static void die_cuda(const char *what, cudaError_t e) {
    fprintf(stderr, "omni-engine: CUDA backend: %s: %s; the stage restarts "
            "with a fresh context\n", what, cudaGetErrorString(e));
    abort();
}

static void check(const char *what, cudaError_t e) {
    if (e != cudaSuccess) die_cuda(what, e);
}


/* ---- Memory ---------------------------------------------------------- */

static CudaCtx *ctx_of(Backend *be) {
    return (CudaCtx *) be->ctx;
}

/* Device memory charged to the budget; NULL when it is spent or cudaMalloc
 * fails. host: the source of an upload, for sharing identical ones. */
static void *dev_alloc(CudaCtx *c, size_t bytes, const void *host) {
    void    *p = NULL;
    CuAlloc *grown;

    if (bytes == 0) bytes = 1;
    if (c->used + bytes > c->budget) return NULL;
    if (c->n_allocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;

        grown = (CuAlloc *) realloc(c->allocs, (size_t) cap * sizeof(*grown));
        if (grown == NULL) return NULL;
        c->allocs = grown;
        c->cap_allocs = cap;
    }
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();             /* not sticky: clear it */
        return NULL;
    }
    c->allocs[c->n_allocs++] = (CuAlloc) { p, bytes, host };
    c->used += bytes;
    return p;
}

static void *cuda_alloc(Backend *be, size_t bytes) {
    return dev_alloc(ctx_of(be), bytes, NULL);
}

/* Forgets every recorded graph: one may hold addresses in memory about to
 * be freed, which a later allocation could reuse for other buffers. */
static void drop_graphs(CudaCtx *c) {
    for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
        if (c->graphs[i] != NULL) cudaGraphExecDestroy(c->graphs[i]);
        c->graphs[i] = NULL;
    }
    graph_cache_init(&c->gc, c->gc.max_batch);
}

static void forget(CudaCtx *c, int i) {
    c->used -= c->allocs[i].bytes;
    c->allocs[i] = c->allocs[--c->n_allocs];
}

static void cuda_release(Backend *be, void *p) {
    CudaCtx *c = ctx_of(be);

    if (p == NULL) return;
    for (int i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].dev != p) continue;
        cudaStreamSynchronize(c->st);       /* no step still uses it */
        drop_graphs(c);
        cudaFree(p);
        forget(c, i);
        return;
    }
    fprintf(stderr, "omni-engine: CUDA backend: release of %p, which it "
            "did not allocate (a double release?)\n", p);
}

static int64_t cuda_budget_left(Backend *be) {
    CudaCtx *c = ctx_of(be);

    return (int64_t) (c->budget - c->used);
}

/* An earlier upload of the same host bytes (a tied output shares the
 * embedding's copy), or NULL. */
static void *uploaded(const CudaCtx *c, const void *host, size_t bytes) {
    for (int i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].host == host && c->allocs[i].bytes == bytes) {
            return c->allocs[i].dev;
        }
    }
    return NULL;
}

static void *upload_bytes(CudaCtx *c, const void *host, size_t bytes,
                          char *err, size_t errlen)
{
    void       *d = uploaded(c, host, bytes);
    cudaError_t e;

    if (d != NULL) return d;
    d = dev_alloc(c, bytes, host);
    if (d == NULL) {
        snprintf(err, errlen, "out of GPU memory: %.1f MiB more would pass "
                 "the budget of %.1f GiB (--gpu-memory-fraction), %.1f GiB "
                 "already held", (double) bytes / 1048576.0,
                 (double) c->budget / 1073741824.0,
                 (double) c->used / 1073741824.0);
        return NULL;
    }
    e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "copying weights to the GPU: %s",
                 cudaGetErrorString(e));
        cudaFree(d);
        forget(c, c->n_allocs - 1);     /* never shared: it holds nothing */
        return NULL;
    }
    return d;
}

static int cuda_upload(Backend *be, Matrix *w, char *err, size_t errlen) {
    CudaCtx *c = ctx_of(be);
    void    *d;

    if (!cu_matmul_supports(w->type) || w->layout != WL_ROWS) {
        snprintf(err, errlen, "the CUDA backend runs F32, F16, BF16, Q8_0 "
                 "and Q4_0 weights, not %s: use --backend cpu",
                 dtype_name(w->type));
        return -1;
    }
    d = upload_bytes(c, w->data, (size_t) w->rows * w->row_bytes, err,
                     errlen);
    if (d == NULL) return -1;
    w->data = d;
    return cu_matmul_prepare(c->mm, w, err, errlen);
}

static int cuda_upload_f32(Backend *be, const float **v, int64_t n,
                           char *err, size_t errlen)
{
    void *d = upload_bytes(ctx_of(be), *v, (size_t) n * sizeof(float), err,
                           errlen);

    if (d == NULL) return -1;
    *v = (const float *) d;
    return 0;
}


/* ---- The batch and the decode graphs --------------------------------- */

/* Lays the batch out in the host staging area and returns the ints to
 * copy: tokens, pos, out_idx, and one table row per run of tokens sharing
 * a block table (a sequence's tokens are adjacent), as many entries as
 * its furthest position needs. */
static size_t stage_batch(CudaCtx *c, const int32_t *tokens,
                          const TokenBatch *b, const int32_t *out_idx,
                          int64_t n_out)
{
    int64_t  mt = c->cfg.max_tokens, bs = c->cfg.block_size;
    int32_t *h = c->h_stage, *seq = h + 2 * mt;
    int32_t *tables = h + 3 * mt + c->cfg.max_out;
    int64_t  rows = 0, last, entries = 0;

    memcpy(h, tokens, (size_t) b->n * sizeof(int32_t));
    memcpy(h + mt, b->pos, (size_t) b->n * sizeof(int32_t));
    memcpy(h + 3 * mt, out_idx, (size_t) n_out * sizeof(int32_t));
    for (int64_t t = 0; t < b->n; t = last + 1, rows++) {
        int32_t top = b->pos[t];

        for (last = t; last + 1 < b->n
                       && b->block_table[last + 1] == b->block_table[t];
             last++)
        {
            top = b->pos[last + 1] > top ? b->pos[last + 1] : top;
        }
        for (int64_t u = t; u <= last; u++) seq[u] = (int32_t) rows;
        entries = top / bs + 1;
        if (entries > c->table_stride) {
            fprintf(stderr, "omni-engine: CUDA backend: position %d is past "
                    "the context of %lld the backend was sized for\n", top,
                    (long long) c->cfg.max_ctx);
            abort();
        }
        memcpy(tables + rows * c->table_stride, b->block_table[t],
               (size_t) entries * sizeof(int32_t));
    }
    return (size_t) (tables - h)
           + (rows > 0 ? (size_t) (rows - 1) * c->table_stride + entries : 0);
}

static void cuda_begin(Backend *be, const int32_t *tokens,
                       const TokenBatch *b, const int32_t *out_idx,
                       int64_t n_out, uint64_t bufs)
{
    CudaCtx *c = ctx_of(be);
    size_t   ints;
    bool     evicted;

    if (b->n < 1 || b->n > c->cfg.max_tokens || n_out < 0
        || n_out > c->cfg.max_out)
    {
        fprintf(stderr, "omni-engine: CUDA backend: a step of %lld tokens "
                "and %lld logits rows; it was sized for %lld and %lld\n",
                (long long) b->n, (long long) n_out,
                (long long) c->cfg.max_tokens, (long long) c->cfg.max_out);
        abort();
    }

    /* the previous step's copy may still read the pinned area */
    check("waiting for the last batch copy", cudaEventSynchronize(c->staged));
    ints = stage_batch(c, tokens, b, out_idx, n_out);
    check("copying the batch", cudaMemcpyAsync(c->d_stage, c->h_stage,
                                               ints * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, c->st));
    check("recording the batch copy", cudaEventRecord(c->staged, c->st));
    c->batch.n = b->n;
    c->batch.n_out = n_out;

    c->action = graph_plan(&c->gc, b->n, n_out, bufs, &c->slot, &evicted);
    if (evicted) {
        cudaGraphExecDestroy(c->graphs[c->slot]);
        c->graphs[c->slot] = NULL;
    }
    if (c->action == GRAPH_CAPTURE) {
        check("starting a graph capture",
              cudaStreamBeginCapture(c->st,
                                     cudaStreamCaptureModeThreadLocal));
    }
}

static void cuda_end(Backend *be) {
    CudaCtx   *c = ctx_of(be);
    cudaGraph_t g = NULL;

    if (c->action == GRAPH_CAPTURE) {
        check("ending a graph capture", cudaStreamEndCapture(c->st, &g));
        check("instantiating a decode graph",
              cudaGraphInstantiate(&c->graphs[c->slot], g, 0));
        cudaGraphDestroy(g);
    }
    if (c->action != GRAPH_RUN) {
        check("launching a decode graph",
              cudaGraphLaunch(c->graphs[c->slot], c->st));
    }
    c->action = GRAPH_RUN;
    check("a kernel launch", cudaGetLastError());
}

/* During a replay the ops were recorded already. */
#define SKIP_IF_REPLAY(c)  do { if ((c)->action == GRAPH_REPLAY) return; } \
                           while (0)


/* ---- Ops ------------------------------------------------------------- */

static void cuda_embed(Backend *be, float *out, const Matrix *table,
                       const int32_t *tokens, int64_t n)
{
    CudaCtx *c = ctx_of(be);

    (void) tokens;
    SKIP_IF_REPLAY(c);
    cu_embed(c->st, out, table, c->batch.tokens, n);
}

static void cuda_rmsnorm(Backend *be, float *out, const float *x,
                         const float *weight, int64_t n, int64_t dim,
                         float eps)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_rmsnorm(c->st, out, x, weight, n, dim, eps);
}

static void cuda_matmul(Backend *be, float *out, const float *x, int64_t n,
                        const Matrix *w)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_matmul(c->mm, c->st, out, x, n, w);
}

/* One matmul after another: bit for bit what separate calls give. */
static void cuda_matmul_n(Backend *be, float *const *outs, const float *x,
                          int64_t n, const Matrix *const *ws, int count)
{
    for (int i = 0; i < count; i++) cuda_matmul(be, outs[i], x, n, ws[i]);
}

static void cuda_add_bias(Backend *be, float *x, const float *bias,
                          int64_t n, int64_t dim)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_add_bias(c->st, x, bias, n, dim);
}

static void cuda_add(Backend *be, float *x, const float *y, int64_t n,
                     int64_t dim)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_add(c->st, x, y, n * dim);
}

static void cuda_rope(Backend *be, float *x, int64_t n, int n_heads,
                      int head_dim, const int32_t *pos, const RopeParams *p)
{
    CudaCtx *c = ctx_of(be);

    (void) pos;
    SKIP_IF_REPLAY(c);
    cu_rope(c->st, x, n, n_heads, head_dim, c->batch.pos, p);
}

static void cuda_kv_store(Backend *be, const KVLayer *kv, const float *k,
                          const float *v, const TokenBatch *b)
{
    CudaCtx *c = ctx_of(be);

    (void) b;
    SKIP_IF_REPLAY(c);
    cu_kv_store(c->st, kv, k, v, &c->batch);
}

static void cuda_attention(Backend *be, float *out, const float *q,
                           int n_heads, const KVLayer *kv,
                           const TokenBatch *b, const AttnParams *p)
{
    CudaCtx *c = ctx_of(be);

    (void) b;
    SKIP_IF_REPLAY(c);
    cu_attention(c->st, out, q, n_heads, kv, &c->batch, p, &c->attn);
}

static void cuda_swiglu(Backend *be, float *out, const float *gate,
                        const float *up, int64_t n)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_swiglu(c->st, out, gate, up, n);
}

static void cuda_geglu(Backend *be, float *out, const float *gate,
                       const float *up, int64_t n)
{
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_geglu(c->st, out, gate, up, n);
}

static void cuda_softcap(Backend *be, float *x, int64_t n, float cap) {
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_softcap(c->st, x, n, cap);
}

static void cuda_scale(Backend *be, float *x, int64_t n, float s) {
    CudaCtx *c = ctx_of(be);

    SKIP_IF_REPLAY(c);
    cu_scale(c->st, x, n, s);
}

static void cuda_gather(Backend *be, float *out, const float *x,
                        const int32_t *idx, int64_t n_out, int64_t dim)
{
    CudaCtx *c = ctx_of(be);

    (void) idx;
    (void) n_out;
    SKIP_IF_REPLAY(c);
    cu_gather(c->st, out, x, &c->batch, dim);
}


/* ---- Results to the host --------------------------------------------- */

static void cuda_argmax(Backend *be, int32_t *ids, const float *logits,
                        int64_t n, int64_t n_vocab)
{
    CudaCtx *c = ctx_of(be);

    if (n < 1 || n > c->cfg.max_out) {
        fprintf(stderr, "omni-engine: CUDA backend: argmax of %lld rows; it "
                "was sized for %lld\n", (long long) n,
                (long long) c->cfg.max_out);
        abort();
    }
    cu_argmax(c->st, c->d_ids, logits, n, n_vocab);
    check("copying token ids", cudaMemcpyAsync(c->h_ids, c->d_ids,
                                               (size_t) n * sizeof(int32_t),
                                               cudaMemcpyDeviceToHost, c->st));
    check("a decode step", cudaStreamSynchronize(c->st));
    memcpy(ids, c->h_ids, (size_t) n * sizeof(int32_t));
}

static void cuda_to_host(Backend *be, float *dst, const float *src,
                         int64_t n)
{
    CudaCtx *c = ctx_of(be);

    check("copying logits", cudaMemcpyAsync(dst, src,
                                            (size_t) n * sizeof(float),
                                            cudaMemcpyDeviceToHost, c->st));
    check("a forward step", cudaStreamSynchronize(c->st));
}


/* ---- Creation -------------------------------------------------------- */

static void cuda_free(Backend *be) {
    CudaCtx *c;

    if (be == NULL) return;
    c = ctx_of(be);
    if (c != NULL) {
        if (c->st != NULL) cudaStreamSynchronize(c->st);
        for (int i = 0; i < CUDA_GRAPH_SLOTS; i++) {
            if (c->graphs[i] != NULL) cudaGraphExecDestroy(c->graphs[i]);
        }
        cu_matmul_free(c->mm);
        for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i].dev);
        free(c->allocs);
        if (c->h_stage != NULL) cudaFreeHost(c->h_stage);
        if (c->h_ids != NULL) cudaFreeHost(c->h_ids);
        if (c->staged != NULL) cudaEventDestroy(c->staged);
        if (c->st != NULL) cudaStreamDestroy(c->st);
        free(c);
    }
    free(be);
}

/* Device 0 (CUDA_VISIBLE_DEVICES picks which that is), one this build has
 * code for. Errors say what is missing: a device, a driver new enough. */
static int pick_device(CudaCtx *c, char *err, size_t errlen) {
    int            n = 0;
    cudaError_t    e = cudaGetDeviceCount(&n);
    cudaDeviceProp p;

    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(err, errlen, "no CUDA device (cudaGetDeviceCount: %s)",
                 e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return -1;
    }
    if (e == cudaErrorInsufficientDriver || e == cudaErrorInitializationError)
    {
        /* cudart says "insufficient" when there is no driver at all */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);

        if (drv == NULL) {
            snprintf(err, errlen, "no NVIDIA driver (libcuda.so.1 not "
                     "found): no GPU on this machine, or its driver is not "
                     "installed");
        } else {
            dlclose(drv);
            snprintf(err, errlen, "the NVIDIA driver is older than CUDA 13 "
                     "needs (580 or newer): cudaGetDeviceCount: %s",
                     cudaGetErrorString(e));
        }
        return -1;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return -1;
    }
    c->device = 0;
    if ((e = cudaSetDevice(0)) != cudaSuccess
        || (e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess)
    {
        snprintf(err, errlen, "CUDA device 0: %s", cudaGetErrorString(e));
        return -1;
    }
    if (p.major < 8) {
        snprintf(err, errlen, "%s has compute capability %d.%d; this build "
                 "has code for 8.0 and newer", p.name, p.major, p.minor);
        return -1;
    }
    snprintf(c->name, sizeof(c->name), "cuda-sm_%d%d", p.major, p.minor);
    return 0;
}

/* The budget, then what every step needs: the matmul state, attention's
 * workspace, the staging area, the ids. */
static int make_buffers(CudaCtx *c, char *err, size_t errlen) {
    const BackendConfig *cfg = &c->cfg;
    size_t               total = 0, free_now = 0;
    cudaError_t          e;
    uint64_t             mmb = cu_matmul_bytes(cfg->max_tokens, cfg->max_cols);

    if ((e = cudaMemGetInfo(&free_now, &total)) != cudaSuccess) {
        snprintf(err, errlen, "cudaMemGetInfo: %s", cudaGetErrorString(e));
        return -1;
    }
    if (cuda_plan_budget(total, free_now, cfg->gpu_memory_fraction,
                         &c->budget, err, errlen) != 0)
    {
        return -1;
    }
    if (mmb > c->budget) goto oom;
    c->used += mmb;                 /* cu_matmul_new's own cudaMallocs */
    c->mm = cu_matmul_new(cfg->max_tokens, cfg->max_cols, err, errlen);
    if (c->mm == NULL) return -1;
    cuda_attn_shape(cfg->max_ctx, &c->attn.chunk, &c->attn.max_splits);
    c->attn.part = (float *) dev_alloc(c, cuda_attn_bytes(cfg->max_tokens,
                                           cfg->n_heads, cfg->head_dim,
                                           c->attn.max_splits), NULL);
    c->table_stride = (int) ((cfg->max_ctx + cfg->block_size - 1)
                             / cfg->block_size);
    c->stage_ints = (size_t) (3 * cfg->max_tokens + cfg->max_out)
                    + (size_t) cfg->max_tokens * (size_t) c->table_stride;
    c->d_stage = (int32_t *) dev_alloc(c, c->stage_ints * sizeof(int32_t),
                                       NULL);
    c->d_ids = (int32_t *) dev_alloc(c, (size_t) cfg->max_out
                                        * sizeof(int32_t), NULL);
    if (c->attn.part == NULL || c->d_stage == NULL || c->d_ids == NULL) {
        goto oom;
    }
    if ((e = cudaMallocHost((void **) &c->h_stage,
                            c->stage_ints * sizeof(int32_t))) != cudaSuccess
        || (e = cudaMallocHost((void **) &c->h_ids, (size_t) cfg->max_out
                               * sizeof(int32_t))) != cudaSuccess)
    {
        snprintf(err, errlen, "pinned host memory: %s", cudaGetErrorString(e));
        return -1;
    }
    {
        int32_t *d = c->d_stage;
        int64_t  mt = cfg->max_tokens;

        c->batch.tokens = d;
        c->batch.pos = d + mt;
        c->batch.seq = d + 2 * mt;
        c->batch.out_idx = d + 3 * mt;
        c->batch.tables = d + 3 * mt + cfg->max_out;
        c->batch.table_stride = c->table_stride;
    }
    return 0;

oom:
    snprintf(err, errlen, "the GPU budget of %.1f GiB (--gpu-memory-fraction) "
             "does not hold the workspaces for %lld tokens per step",
             (double) c->budget / 1073741824.0, (long long) cfg->max_tokens);
    return -1;
}

static int check_config(const BackendConfig *cfg, char *err, size_t errlen) {
    if (cfg->max_tokens < 1 || cfg->max_out < 1 || cfg->max_cols < 1
        || cfg->max_ctx < 1 || cfg->n_heads < 1 || cfg->block_size < 1)
    {
        snprintf(err, errlen, "the CUDA backend needs max_tokens, max_out, "
                 "max_cols, max_ctx, n_heads and block_size");
        return -1;
    }
    if (cfg->head_dim < 1 || cfg->head_dim > 256) {
        snprintf(err, errlen, "the CUDA attention runs heads of up to 256, "
                 "not %d", cfg->head_dim);
        return -1;
    }
    return 0;
}

static void fill_table(Backend *be, CudaCtx *c) {
    be->name = c->name;
    be->ctx = c;
    be->embed = cuda_embed;
    be->rmsnorm = cuda_rmsnorm;
    be->matmul = cuda_matmul;
    be->matmul_n = cuda_matmul_n;
    be->add_bias = cuda_add_bias;
    be->add = cuda_add;
    be->rope = cuda_rope;
    be->kv_store = cuda_kv_store;
    be->attention = cuda_attention;
    be->swiglu = cuda_swiglu;
    be->geglu = cuda_geglu;
    be->softcap = cuda_softcap;
    be->scale = cuda_scale;
    be->alloc = cuda_alloc;
    be->release = cuda_release;
    be->budget_left = cuda_budget_left;
    be->upload = cuda_upload;
    be->upload_f32 = cuda_upload_f32;
    be->begin = cuda_begin;
    be->end = cuda_end;
    be->gather = cuda_gather;
    be->argmax = cuda_argmax;
    be->to_host = cuda_to_host;
    be->free = cuda_free;
}

extern "C" __attribute__((visibility("default")))
Backend *omni_cuda_backend_new(const BackendConfig *cfg, char *err,
                               size_t errlen)
{
    Backend    *be;
    CudaCtx    *c;
    const char *graphs = getenv("OMNI_CUDA_GRAPHS");
    cudaError_t e;

    if (check_config(cfg, err, errlen) != 0) return NULL;
    be = (Backend *) calloc(1, sizeof(*be));
    c = (CudaCtx *) calloc(1, sizeof(*c));
    if (be == NULL || c == NULL) {
        free(be);
        free(c);
        snprintf(err, errlen, "out of memory creating the CUDA backend");
        return NULL;
    }
    c->cfg = *cfg;
    fill_table(be, c);
    if (pick_device(c, err, errlen) != 0) goto fail;
    if ((e = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking))
            != cudaSuccess
        || (e = cudaEventCreateWithFlags(&c->staged, cudaEventDisableTiming))
            != cudaSuccess)
    {
        snprintf(err, errlen, "creating a CUDA stream: %s",
                 cudaGetErrorString(e));
        goto fail;
    }
    if (make_buffers(c, err, errlen) != 0) goto fail;
    graph_cache_init(&c->gc, graphs != NULL && strcmp(graphs, "0") == 0
                             ? 0 : CUDA_GRAPH_MAX_BATCH);
    return be;

fail:
    cuda_free(be);
    return NULL;
}

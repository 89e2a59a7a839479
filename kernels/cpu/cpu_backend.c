/* cpu_backend.c -- the CPU implementation of the Backend table.
 *
 * This file owns threads, scratch memory and work splitting; the arithmetic
 * is in a CpuVec table (ref.c, avx2.c, avx512.c) chosen once at creation.
 * Every op either runs on the caller (when it is too small to be worth a
 * wake-up) or is split across the pool with each output element written by
 * exactly one thread, so results do not depend on the thread count.
 *
 * Matmul splits the output into chunks of (x rows, weight rows) claimed from
 * an atomic counter, so a thread slowed by a noisy neighbour does not hold
 * the others back. Within a chunk the weight tile is the outer loop: a tile
 * of nr weight rows stays in L1 while the chunk's activation rows stream
 * past it.
 *
 * All scratch (converted activations, attention scores) is allocated at
 * creation from the sizes in BackendConfig; ops never allocate. */

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "threadpool.h"
#include "vec.h"

#define PAR_MIN_ELEMS   32768       /* below this an elementwise op runs on
                                       the caller: a wake-up costs more */
#define MM_X_CHUNK      64          /* activation rows per matmul chunk */

typedef struct {
    const CpuVec *vec;
    ThreadPool   *tp;
    BackendConfig cfg;
    void         *xbuf;         // (max_tokens, max_cols) converted
                                //   activations, owned
    float        *scores;       // (nth, max_ctx) attention scores, owned
} CpuCtx;


/* ---- Row-parallel helper -------------------------------------------------
 * Elementwise ops on n rows run fn(row range) on the caller when small and
 * across the pool otherwise. */

typedef void (*RowFn)(const CpuCtx *c, void *arg, int64_t r0, int64_t r1);

typedef struct {
    const CpuCtx *c;
    RowFn         fn;
    void         *arg;
    int64_t       n;
} RowJob;

static void row_worker(void *p, int ith, int nth) {
    RowJob *j = p;
    int64_t per = (j->n + nth - 1) / nth;
    int64_t r0 = per * ith, r1 = r0 + per < j->n ? r0 + per : j->n;

    if (r0 < r1) j->fn(j->c, j->arg, r0, r1);
}

static void run_rows(const CpuCtx *c, RowFn fn, void *arg, int64_t n,
                     int64_t row_elems)
{
    RowJob job = { c, fn, arg, n };

    if (n == 1 || n * row_elems < PAR_MIN_ELEMS) {
        fn(c, arg, 0, n);
        return;
    }
    tp_run(c->tp, row_worker, &job);
}


/* ---- embed, rmsnorm, add, add_bias, swiglu -------------------------------- */

static void cpu_embed(Backend *be, float *out, const Matrix *table,
                      const int32_t *tokens, int64_t n)
{
    const CpuCtx *c = be->ctx;

    for (int64_t i = 0; i < n; i++) {
        const char *row = (const char *) table->data
                          + (size_t) tokens[i] * table->row_bytes;
        c->vec->dequantize(table->type, row, out + i * table->cols,
                           table->cols);
    }
}

typedef struct {
    float       *out;
    const float *x, *w, *y;
    int64_t      dim;
    float        eps;
} EwArgs;

static void rmsnorm_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    EwArgs *a = p;

    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + r * a->dim;
        float        ms = c->vec->sum_sq(x, a->dim) / (float) a->dim;

        c->vec->scale_mul(a->out + r * a->dim, x, 1.0f / sqrtf(ms + a->eps),
                          a->w, a->dim);
    }
}

static void cpu_rmsnorm(Backend *be, float *out, const float *x,
                        const float *weight, int64_t n, int64_t dim,
                        float eps)
{
    EwArgs a = { .out = out, .x = x, .w = weight, .dim = dim, .eps = eps };

    run_rows(be->ctx, rmsnorm_rows, &a, n, dim);
}

static void add_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    EwArgs *a = p;

    c->vec->add(a->out + r0 * a->dim, a->y + r0 * a->dim,
                (r1 - r0) * a->dim);
}

static void cpu_add(Backend *be, float *x, const float *y, int64_t n,
                    int64_t dim)
{
    EwArgs a = { .out = x, .y = y, .dim = dim };

    run_rows(be->ctx, add_rows, &a, n, dim);
}

static void bias_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    EwArgs *a = p;

    for (int64_t r = r0; r < r1; r++) c->vec->add(a->out + r * a->dim, a->y,
                                                  a->dim);
}

static void cpu_add_bias(Backend *be, float *x, const float *bias, int64_t n,
                         int64_t dim)
{
    EwArgs a = { .out = x, .y = bias, .dim = dim };

    run_rows(be->ctx, bias_rows, &a, n, dim);
}

static void swiglu_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    EwArgs *a = p;

    c->vec->silu_mul(a->out + r0 * a->dim, a->x + r0 * a->dim,
                     a->y + r0 * a->dim, (r1 - r0) * a->dim);
}

static void cpu_swiglu(Backend *be, float *out, const float *gate,
                       const float *up, int64_t n)
{
    /* split as rows of 1024 so threads get cache-line-aligned ranges */
    EwArgs  a = { .out = out, .x = gate, .y = up, .dim = 1024 };
    int64_t rows = n / 1024, tail = n - rows * 1024;
    const CpuCtx *c = be->ctx;

    if (rows > 0) run_rows(c, swiglu_rows, &a, rows, 1024);
    if (tail > 0) c->vec->silu_mul(out + rows * 1024, gate + rows * 1024,
                                   up + rows * 1024, tail);
}


/* ---- matmul -------------------------------------------------------------- */

typedef struct {
    const CpuVec    *vec;
    const float     *x;
    void            *xq;            // converted rows, or NULL for f32 form
    size_t           ldxq;
    DType            form;
    int64_t          cols;
} ConvArgs;

static void convert_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    ConvArgs *a = p;

    for (int64_t r = r0; r < r1; r++) {
        void *dst = (char *) a->xq + r * a->ldxq;

        if (a->form == DT_Q8_0) {
            a->vec->quantize_q8_0(a->x + r * a->cols, dst, a->cols);
        } else {
            a->vec->to_f16(a->x + r * a->cols, dst, a->cols);
        }
    }
}

typedef struct {
    GemmFn           gemm;
    int              mr, nr;
    const char      *x;
    size_t           ldx;
    int64_t          n;
    const Matrix    *w;
    float           *out;
    int64_t          w_chunk;       // weight rows per chunk, multiple of nr
    int64_t          n_wc, n_xc;    // chunks along each dimension
    _Atomic int64_t  next;
} MatmulJob;

static void matmul_chunk(MatmulJob *j, int64_t wc, int64_t xc) {
    int64_t     w0 = wc * j->w_chunk, x0 = xc * MM_X_CHUNK;
    int64_t     w1 = w0 + j->w_chunk, x1 = x0 + MM_X_CHUNK;
    const char *wd = j->w->data;
    size_t      ldw = j->w->row_bytes, ldo = (size_t) j->w->rows;

    w1 = w1 < j->w->rows ? w1 : j->w->rows;
    x1 = x1 < j->n ? x1 : j->n;
    for (int64_t wj = w0; wj < w1; wj += j->nr) {
        int nr = (int) (w1 - wj < j->nr ? w1 - wj : j->nr);

        for (int64_t xi = x0; xi < x1; xi += j->mr) {
            int mr = (int) (x1 - xi < j->mr ? x1 - xi : j->mr);

            j->gemm(j->w->cols, mr, nr, j->x + xi * j->ldx, j->ldx,
                    wd + wj * ldw, ldw, j->out + xi * ldo + wj, ldo);
        }
    }
}

static void matmul_worker(void *p, int ith, int nth) {
    MatmulJob *j = p;
    int64_t    total = j->n_wc * j->n_xc;

    (void) ith;
    (void) nth;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1,
                                              memory_order_relaxed);
        if (c >= total) break;
        /* consecutive chunks share a weight block while x blocks change */
        matmul_chunk(j, c / j->n_xc, c % j->n_xc);
    }
}

static void cpu_matmul(Backend *be, float *out, const float *x, int64_t n,
                       const Matrix *w)
{
    const CpuCtx *c = be->ctx;
    int           slot = vec_dtype_slot(w->type);
    DType         form = c->vec->mm[slot].x_form;
    MatmulJob     job;
    int64_t       nth = tp_size(c->tp), per;

    memset(&job, 0, sizeof(job));
    job.gemm = c->vec->mm[slot].gemm;
    job.mr = c->vec->mm[slot].mr;
    job.nr = c->vec->mm[slot].nr;
    job.n = n;
    job.w = w;
    job.out = out;
    if (form == DT_F32) {
        job.x = (const char *) x;
        job.ldx = (size_t) w->cols * sizeof(float);
    } else {
        ConvArgs a = { c->vec, x, c->xbuf, dtype_row_bytes(form, w->cols),
                       form, w->cols };
        run_rows(c, convert_rows, &a, n, w->cols);
        job.x = c->xbuf;
        job.ldx = a.ldxq;
    }

    /* about 8 chunks per thread: enough to balance, few enough that the
       counter is not contended */
    per = (w->rows + nth * 8 - 1) / (nth * 8);
    per = (per + job.nr - 1) / job.nr * job.nr;
    job.w_chunk = per > job.nr ? per : job.nr;
    job.n_wc = (w->rows + job.w_chunk - 1) / job.w_chunk;
    job.n_xc = (n + MM_X_CHUNK - 1) / MM_X_CHUNK;
    atomic_init(&job.next, 0);
    if (job.n_wc * job.n_xc == 1) {
        matmul_chunk(&job, 0, 0);
        return;
    }
    tp_run(c->tp, matmul_worker, &job);
}


/* ---- rope ---------------------------------------------------------------- */

typedef struct {
    float            *x;
    int               n_heads, head_dim;
    const int32_t    *pos;
    const RopeParams *p;
} RopeArgs;

/* Angles follow ggml: theta_i = pos * base^(-2i/n_rot), computed by repeated
 * multiplication, divided by the frequency factor and scaled linearly. */
static void rope_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    RopeArgs *a = p;
    int       half = a->p->n_rot / 2;
    float     theta_scale = powf(a->p->freq_base, -2.0f / (float) a->p->n_rot);
    float     cs[256], sn[256];

    (void) c;
    for (int64_t t = r0; t < r1; t++) {
        float theta = (float) a->pos[t];

        for (int i = 0; i < half; i++) {
            float ff = a->p->freq_factors ? a->p->freq_factors[i] : 1.0f;
            float th = a->p->freq_scale * (theta / ff);

            cs[i] = cosf(th);
            sn[i] = sinf(th);
            theta *= theta_scale;
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *v = a->x + (t * a->n_heads + h) * a->head_dim;

            for (int i = 0; i < half; i++) {
                int   i0 = a->p->mode == ROPE_NEOX ? i : 2 * i;
                int   i1 = a->p->mode == ROPE_NEOX ? i + half : 2 * i + 1;
                float x0 = v[i0], x1 = v[i1];

                v[i0] = x0 * cs[i] - x1 * sn[i];
                v[i1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static void cpu_rope(Backend *be, float *x, int64_t n, int n_heads,
                     int head_dim, const int32_t *pos, const RopeParams *p)
{
    RopeArgs a = { x, n_heads, head_dim, pos, p };

    run_rows(be->ctx, rope_rows, &a, n, (int64_t) n_heads * head_dim * 8);
}


/* ---- KV cache and attention ------------------------------------------------ */

static size_t kv_offset(const KVLayer *kv, int32_t block, int head, int slot) {
    return (((size_t) block * kv->n_kv_heads + (size_t) head) * kv->block_size
            + (size_t) slot) * kv->head_dim;
}

static void cpu_kv_store(Backend *be, const KVLayer *kv, const float *k,
                         const float *v, const TokenBatch *b)
{
    const CpuCtx *c = be->ctx;
    int64_t       kv_dim = (int64_t) kv->n_kv_heads * kv->head_dim;

    for (int64_t t = 0; t < b->n; t++) {
        int32_t pos = b->pos[t];
        int32_t blk = b->block_table[t][pos / kv->block_size];
        int     slot = pos % kv->block_size;

        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t off = kv_offset(kv, blk, h, slot);

            c->vec->to_f16(k + t * kv_dim + h * kv->head_dim, kv->k + off,
                           kv->head_dim);
            c->vec->to_f16(v + t * kv_dim + h * kv->head_dim, kv->v + off,
                           kv->head_dim);
        }
    }
}

typedef struct {
    const CpuCtx     *c;
    float            *out;
    const float      *q;
    int               n_heads;
    const KVLayer    *kv;
    const TokenBatch *b;
    float             scale;
    _Atomic int64_t   next;
} AttnJob;

/* One (token, head): scores over positions 0..pos, softmax, weighted sum of
 * values. Two passes over the keys' block table, in position order. */
static void attn_one(AttnJob *j, float *scores, int64_t t, int h) {
    const CpuVec  *vec = j->c->vec;
    const KVLayer *kv = j->kv;
    int            hd = kv->head_dim, bs = kv->block_size;
    int            kvh = h / (j->n_heads / kv->n_kv_heads);
    int32_t        npos = j->b->pos[t] + 1;
    const int32_t *bt = j->b->block_table[t];
    const float   *q = j->q + (t * j->n_heads + h) * hd;
    float         *out = j->out + (t * j->n_heads + h) * hd;
    float          max = -INFINITY, sum;

    for (int32_t p = 0; p < npos; p++) {
        const uint16_t *kp = kv->k + kv_offset(kv, bt[p / bs], kvh, p % bs);

        scores[p] = vec->dot_f16(kp, q, hd) * j->scale;
        max = scores[p] > max ? scores[p] : max;
    }
    sum = vec->exp_sum(scores, scores, max, npos);
    memset(out, 0, (size_t) hd * sizeof(float));
    for (int32_t p = 0; p < npos; p++) {
        const uint16_t *vp = kv->v + kv_offset(kv, bt[p / bs], kvh, p % bs);

        vec->axpy_f16(out, scores[p], vp, hd);
    }
    vec->scale(out, 1.0f / sum, hd);
}

static void attn_worker(void *p, int ith, int nth) {
    AttnJob *j = p;
    float   *scores = j->c->scores + (size_t) ith * j->c->cfg.max_ctx;
    int64_t  total = j->b->n * j->n_heads;

    (void) nth;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, 1,
                                              memory_order_relaxed);
        if (i >= total) break;
        attn_one(j, scores, i / j->n_heads, (int) (i % j->n_heads));
    }
}

static void cpu_attention(Backend *be, float *out, const float *q,
                          int n_heads, const KVLayer *kv, const TokenBatch *b,
                          float scale)
{
    AttnJob j = { be->ctx, out, q, n_heads, kv, b, scale, 0 };

    tp_run(((CpuCtx *) be->ctx)->tp, attn_worker, &j);
}


/* ---- creation -------------------------------------------------------------- */

static void cpu_free(Backend *be) {
    CpuCtx *c;

    if (be == NULL) return;
    c = be->ctx;
    if (c != NULL) {
        tp_free(c->tp);
        free(c->xbuf);
        free(c->scores);
        free(c);
    }
    free(be);
}

/* __builtin_cpu_supports takes only literals, hence the table. */
static bool cpu_has(const char *f) {
#if defined(__x86_64__)
    static const char *const names[] = {
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni", "avx2",
        "fma", "f16c",
    };
    bool on[] = {
        __builtin_cpu_supports("avx512f"), __builtin_cpu_supports("avx512bw"),
        __builtin_cpu_supports("avx512vl"), __builtin_cpu_supports("avx512dq"),
        __builtin_cpu_supports("avx512vnni"), __builtin_cpu_supports("avx2"),
        __builtin_cpu_supports("fma"), __builtin_cpu_supports("f16c"),
    };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(names[i], f) == 0) return on[i];
    }
#endif
    (void) f;
    return false;
}

/* Picks the kernel table: the requested one if this build has it and the
 * CPU runs it; "auto" takes the widest such. */
static const CpuVec *pick_vec(const char *isa, char *err, size_t errlen) {
    static const struct {
        const char   *name;
        const CpuVec *vec;
        const char   *need[7];
    } sets[] = {
#ifdef OMNI_HAVE_AVX512
        { "avx512", &cpu_vec_avx512, { "avx512f", "avx512bw", "avx512vl",
          "avx512dq", "avx512vnni", "fma", "f16c" } },
#endif
#ifdef OMNI_HAVE_AVX2
        { "avx2", &cpu_vec_avx2, { "avx2", "fma", "f16c" } },
#endif
        { "ref", &cpu_vec_ref, { NULL } },
    };
    bool any = isa == NULL || strcmp(isa, "auto") == 0;

    __builtin_cpu_init();
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        bool ok = true;

        if (!any && strcmp(isa, sets[i].name) != 0) continue;
        for (int f = 0; f < 7 && sets[i].need[f] != NULL; f++) {
            ok = ok && cpu_has(sets[i].need[f]);
        }
        if (ok) return sets[i].vec;
        snprintf(err, errlen, "kernel set '%s' needs CPU features this CPU "
                 "lacks", isa);
        return NULL;
    }
    snprintf(err, errlen, "kernel set '%s' is not in this build", isa);
    return NULL;
}

Backend *backend_cpu_new(const BackendConfig *cfg, char *err, size_t errlen) {
    Backend *be = calloc(1, sizeof(*be));
    CpuCtx  *c = calloc(1, sizeof(*c));
    int      nth = cfg->n_threads;
    size_t   xrow;

    if (be == NULL || c == NULL) {
        free(be);
        free(c);
        snprintf(err, errlen, "out of memory creating the CPU backend");
        return NULL;
    }
    be->ctx = c;
    be->free = cpu_free;
    c->vec = pick_vec(cfg->isa, err, errlen);
    if (c->vec == NULL) {
        cpu_free(be);
        return NULL;
    }
    if (nth <= 0) nth = (int) sysconf(_SC_NPROCESSORS_ONLN);
    c->cfg = *cfg;
    c->cfg.n_threads = nth;
    /* the widest converted row is f16 (2 bytes per element) */
    xrow = (size_t) cfg->max_cols * 2 + 64;
    c->xbuf = aligned_alloc(64, ((size_t) cfg->max_tokens * xrow + 63) / 64
                                * 64);
    c->scores = malloc((size_t) nth * (size_t) cfg->max_ctx * sizeof(float));
    c->tp = tp_new(nth);
    if (c->xbuf == NULL || c->scores == NULL || c->tp == NULL) goto oom;

    be->name = c->vec->name;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->matmul = cpu_matmul;
    be->add_bias = cpu_add_bias;
    be->add = cpu_add;
    be->rope = cpu_rope;
    be->kv_store = cpu_kv_store;
    be->attention = cpu_attention;
    be->swiglu = cpu_swiglu;
    return be;

oom:
    snprintf(err, errlen, "out of memory creating the CPU backend");
    cpu_free(be);
    return NULL;
}

/* cpu_backend.c -- the CPU implementation of the Backend table.
 *
 * This file owns threads, scratch memory and work splitting; the arithmetic
 * is in a CpuVec table (ref.c, avx2.c, avx512.c, neon.c) chosen once at
 * creation.
 * Every op either runs on the caller (when it is too small to be worth a
 * wake-up) or is split across the pool with each output element written by
 * exactly one thread, so results do not depend on the thread count.
 *
 * Matmul splits the weight rows into chunks claimed from an atomic
 * counter, so a thread slowed by a noisy neighbour does not hold the others
 * back. A chunk is handed to the table's gemm whole, one tile of
 * activation rows at a time; the table tiles it and blocks k for its
 * caches, and in decode reads the chunk's rows front to back. Activations
 * are converted once per call to the form the table reads (or copied to a
 * line-aligned buffer when f32 rows do not start on cache lines). A weight
 * type the table has no gemm for runs on ref.c's (vec_gemm), so every
 * kernel set runs every type, with the same results as ref.
 *
 * At load, repack rewrites a quantized matrix in place into the WL_X16
 * layout (dtype.h) when the table reads it (fills its mm slot), which
 * roughly doubles the avx512 prefill and lifts decode to the read
 * bandwidth; other tables read every matrix as stored.
 *
 * Attention items are (token, head) pairs, head-major so that consecutive
 * items read one KV head's keys and values while they sit in L2.
 *
 * All scratch (converted activations, attention scores) is allocated at
 * creation from the sizes in BackendConfig; ops never allocate. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "kernels.h"
#include "threadpool.h"
#include "vec.h"

#define PAR_MIN_ELEMS   32768       /* below this an elementwise op runs on
                                       the caller: a wake-up costs more */

typedef struct {
    const CpuVec *vec;
    ThreadPool   *tp;
    BackendConfig cfg;
    void         *xbuf;         // (max_tokens, widest converted row of
                                //   max_cols) activations, owned
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
    int64_t       n_items;
} RowJob;

/* Item i of n_items covers rows [i*n/n_items, (i+1)*n/n_items). */
static void row_worker(void *p, int64_t item, int ith) {
    RowJob *j = p;
    int64_t r0 = item * j->n / j->n_items;
    int64_t r1 = (item + 1) * j->n / j->n_items;

    (void) ith;
    if (r0 < r1) j->fn(j->c, j->arg, r0, r1);
}

static void run_rows(const CpuCtx *c, RowFn fn, void *arg, int64_t n,
                     int64_t row_elems)
{
    /* a few items per thread, so whoever is scheduled takes up the slack */
    int64_t items = 4 * (int64_t) tp_size(c->tp);
    RowJob  job = { c, fn, arg, n, n < items ? n : items };

    if (n == 1 || n * row_elems < PAR_MIN_ELEMS) {
        fn(c, arg, 0, n);
        return;
    }
    tp_run(c->tp, row_worker, &job, job.n_items);
}


/* ---- embed, rmsnorm, add, add_bias, swiglu -------------------------------- */

/* A repacked (tied output) table is unpacked a group at a time into
 * stored blocks on the stack, which the table's dequantize then reads. */
static void cpu_embed(Backend *be, float *out, const Matrix *table,
                      const int32_t *tokens, int64_t n)
{
    const CpuCtx *c = be->ctx;
    int64_t       k = table->cols, g = 0, ge = X16 * QK;
    size_t        gb = dtype_row_bytes(table->type, ge);

    for (int64_t i = 0; i < n; i++) {
        const char *row = (const char *) table->data
                          + (size_t) tokens[i] * table->row_bytes;
        float      *y = out + i * k;

        if (table->layout == WL_X16) {
            for (g = 0; g < k / ge; g++) {
                BlockQ8_0 blocks[X16];      /* room for either type */

                x16_unpack_group(table->type, row + g * gb, blocks);
                c->vec->dequantize(table->type, blocks, y + g * ge, ge);
            }
        }
        c->vec->dequantize(table->type, row + g * gb, y + g * ge, k - g * ge);
    }
}

typedef struct {
    float       *out;
    const float *x, *w, *y;
    int64_t      dim;
    float        eps;
    float        scale;         // scale and softcap's factor
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


/* ---- geglu, softcap, scale (gemma) ------------------------------------------
 * Flat elementwise ops, split like swiglu as rows of 1024. */

typedef void (*FlatFn)(const CpuCtx *c, const EwArgs *a, int64_t off,
                       int64_t n);

typedef struct {
    EwArgs a;
    FlatFn fn;
} FlatJob;

static void flat_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    FlatJob *j = p;

    j->fn(c, &j->a, r0 * 1024, (r1 - r0) * 1024);
}

static void run_flat(const CpuCtx *c, FlatFn fn, const EwArgs *a, int64_t n)
{
    FlatJob j = { *a, fn };
    int64_t rows = n / 1024;

    if (rows > 0) run_rows(c, flat_rows, &j, rows, 1024);
    if (n > rows * 1024) fn(c, a, rows * 1024, n - rows * 1024);
}

static void geglu_flat(const CpuCtx *c, const EwArgs *a, int64_t off,
                       int64_t n)
{
    c->vec->gelu_mul(a->out + off, a->x + off, a->y + off, n);
}

static void cpu_geglu(Backend *be, float *out, const float *gate,
                      const float *up, int64_t n)
{
    EwArgs a = { .out = out, .x = gate, .y = up };

    run_flat(be->ctx, geglu_flat, &a, n);
}

/* eps carries 1/cap, scale the cap */
static void softcap_flat(const CpuCtx *c, const EwArgs *a, int64_t off,
                         int64_t n)
{
    c->vec->tanh_scale(a->out + off, a->out + off, a->eps, a->scale, n);
}

static void cpu_softcap(Backend *be, float *x, int64_t n, float cap) {
    EwArgs a = { .out = x, .eps = 1.0f / cap, .scale = cap };

    run_flat(be->ctx, softcap_flat, &a, n);
}

static void scale_flat(const CpuCtx *c, const EwArgs *a, int64_t off,
                       int64_t n)
{
    c->vec->scale(a->out + off, a->scale, n);
}

static void cpu_scale(Backend *be, float *x, int64_t n, float s) {
    EwArgs a = { .out = x, .scale = s };

    run_flat(be->ctx, scale_flat, &a, n);
}


/* ---- matmul -------------------------------------------------------------- */

typedef struct {
    const CpuVec    *vec;
    const CpuGemm   *g;             // vec_gemm()'s entry for the weights
    const float     *x;
    void            *xq;
    size_t           ldxq;
    int64_t          cols;
} ConvArgs;

/* Q8_1 and Q8_K use dtype.c's quantizers whatever the table, so the
 * activations are the same bits on every kernel set; Q8_0 and f16 use the
 * table's, which the kernel tests hold to ref.c's bits. */
static void convert_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    ConvArgs *a = p;

    (void) c;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + r * a->cols;
        void        *dst = (char *) a->xq + r * a->ldxq;

        if (a->g->conv != NULL) {
            a->g->conv(x, dst, a->cols);
            continue;
        }
        switch (a->g->x_form) {
        case DT_Q8_0: a->vec->quantize_q8_0(x, dst, a->cols); break;
        case DT_Q8_1: quantize_row_q8_1_ref(x, dst, a->cols); break;
        case DT_Q8_K: quantize_row_q8_K_ref(x, dst, a->cols); break;
        default:      a->vec->to_f16(x, dst, a->cols); break;
        }
    }
}

static void copy_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    ConvArgs *a = p;

    (void) c;
    for (int64_t r = r0; r < r1; r++) {
        memcpy((char *) a->xq + r * a->ldxq, a->x + r * a->cols,
               (size_t) a->cols * sizeof(float));
    }
}

/* Bytes of a converted activation row of k elements. */
static size_t x_bytes(const CpuGemm *g, int64_t k) {
    if (g->x_bytes != NULL) return g->x_bytes(k);
    return dtype_row_bytes(g->x_form, k);
}

/* True when gemm entries a and b read the same converted activations. */
static bool same_x(const CpuGemm *a, const CpuGemm *b) {
    return a->x_form == b->x_form && a->conv == b->conv
           && a->x_bytes == b->x_bytes;
}

/* One parallel job over up to MM_MAX_FUSED matrices that read the same
 * activations (Q/K/V, gate/up): one conversion of x and one
 * synchronisation instead of three, and the small K/V projections no longer
 * leave threads idle at their tail. Chunk c belongs to the matrix i with
 * first[i] <= c < first[i + 1]. */
typedef struct {
    GemmFn           gemm[MM_MAX_FUSED];    // per matrix, one x form
    int              mr, nr;
    const char      *x;
    size_t           ldx;
    int64_t          n;
    int              count;
    const Matrix    *w[MM_MAX_FUSED];
    float           *out[MM_MAX_FUSED];
    int64_t          w_chunk;               // weight rows per chunk
    int64_t          first[MM_MAX_FUSED + 1];
} MatmulJob;

/* Weight rows [w0, w1) of matrix i against all activation rows: one gemm
 * call per tile of activation rows, each against the whole chunk, which the
 * table tiles and blocks for its caches. Consecutive calls share the chunk's
 * weights, kept in L2; the activations are read once per chunk. */
static void matmul_chunk(const MatmulJob *j, int i, int64_t w0, int64_t w1) {
    const Matrix *m = j->w[i];
    size_t        ldo = (size_t) m->rows;
    const char   *w = (const char *) m->data + (size_t) w0 * m->row_bytes;

    for (int64_t xi = 0; xi < j->n; xi += j->mr) {
        int mr = (int) (j->n - xi < j->mr ? j->n - xi : j->mr);

        j->gemm[i](m->cols, mr, (int) (w1 - w0), j->x + xi * (int64_t) j->ldx,
                j->ldx, w, m->row_bytes, j->out[i] + xi * (int64_t) ldo + w0,
                ldo);
    }
}

static void matmul_worker(void *p, int64_t c, int ith) {
    const MatmulJob *j = p;
    int              i = 0;
    int64_t          w0, w1;

    (void) ith;
    while (c >= j->first[i + 1]) i++;
    w0 = (c - j->first[i]) * j->w_chunk;
    w1 = w0 + j->w_chunk;
    matmul_chunk(j, i, w0, w1 < j->w[i]->rows ? w1 : j->w[i]->rows);
}

/* Weight rows per chunk: about 8 chunks per thread over all the matrices,
 * claimed in turn, so a thread slowed by a noisy neighbour does not hold the
 * others back (32 per thread measured no better in decode); a multiple of 16
 * rows (no two threads write one cache line of out) and of nr (tiles line
 * up across chunks). */
static int64_t matmul_chunk_rows(const MatmulJob *j, int nth) {
    int64_t unit = 16 * (int64_t) j->nr, rows = 0, per;

    for (int i = 0; i < j->count; i++) rows += j->w[i]->rows;
    per = (rows + (int64_t) nth * 8 - 1) / ((int64_t) nth * 8);
    return (per + unit - 1) / unit * unit;
}

/* Points job.x at the activations in the form the kernel reads: in place
 * for f32 rows that start cache lines, else converted (or copied) into the
 * scratch buffer. */
static void matmul_input(const CpuCtx *c, MatmulJob *job, const CpuGemm *g,
                         const float *x, int64_t cols)
{
    if (g->conv == NULL && g->x_form == DT_F32) {
        job->x = (const char *) x;
        job->ldx = (size_t) cols * sizeof(float);
        if (((uintptr_t) x | job->ldx) % 64 != 0) {
            /* read in place only when every row starts a cache line: a
               vector split over two lines costs two loads, 6-11% of a
               batch's f16 matmul */
            ConvArgs a = { c->vec, g, x, c->xbuf, (job->ldx + 63) / 64 * 64,
                           cols };

            run_rows(c, copy_rows, &a, job->n, cols);
            job->x = c->xbuf;
            job->ldx = a.ldxq;
        }
    } else {
        ConvArgs a = { c->vec, g, x, c->xbuf, x_bytes(g, cols), cols };

        run_rows(c, convert_rows, &a, job->n, cols);
        job->x = c->xbuf;
        job->ldx = a.ldxq;
    }
}

/* The matrices run as one job when they read the same activations the
 * same way: same cols, activation form and tile shape (Q/K/V of one type;
 * also a Q4_K_M file's Q4_K and Q6_K, both on Q8_K). Otherwise one by
 * one, which is rare. */
static bool fusable(const CpuVec *vec, const Matrix *const *ws, int count) {
    const CpuGemm *g0 = vec_gemm(vec, vec_slot(ws[0]->type, ws[0]->layout));

    for (int i = 1; i < count; i++) {
        const CpuGemm *g = vec_gemm(vec, vec_slot(ws[i]->type,
                                                  ws[i]->layout));

        if (ws[i]->cols != ws[0]->cols || !same_x(g, g0) || g->mr != g0->mr
            || g->nr != g0->nr)
        {
            return false;
        }
    }
    return true;
}

static void cpu_matmul_n(Backend *be, float *const *outs, const float *x,
                         int64_t n, const Matrix *const *ws, int count)
{
    const CpuCtx  *c = be->ctx;
    const CpuGemm *g = vec_gemm(c->vec, vec_slot(ws[0]->type,
                                                 ws[0]->layout));
    MatmulJob      job;

    if (!fusable(c->vec, ws, count)) {
        for (int k = 0; k < count; k++) {
            cpu_matmul_n(be, &outs[k], x, n, &ws[k], 1);
        }
        return;
    }
    memset(&job, 0, sizeof(job));
    job.mr = g->mr;
    job.nr = g->nr;
    job.n = n;
    job.count = count;
    for (int i = 0; i < count; i++) {
        job.gemm[i] = vec_gemm(c->vec, vec_slot(ws[i]->type,
                                                ws[i]->layout))->gemm;
        job.w[i] = ws[i];
        job.out[i] = outs[i];
    }
    matmul_input(c, &job, g, x, ws[0]->cols);
    job.w_chunk = matmul_chunk_rows(&job, tp_size(c->tp));
    for (int i = 0; i < count; i++) {
        job.first[i + 1] = job.first[i]
                           + (ws[i]->rows + job.w_chunk - 1) / job.w_chunk;
    }
    tp_run(c->tp, matmul_worker, &job, job.first[count]);
}

static void cpu_matmul(Backend *be, float *out, const float *x, int64_t n,
                       const Matrix *w)
{
    cpu_matmul_n(be, &out, x, n, &w, 1);
}

static void repack_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    Matrix *w = p;

    (void) c;
    for (int64_t r = r0; r < r1; r++) {
        x16_pack_row(w->type, (char *) w->data + (size_t) r * w->row_bytes,
                     w->cols);
    }
}

/* Repacks a quantized matrix whose rows hold at least one group when the
 * table reads WL_X16 (see avx512.c for why), rows split across the pool;
 * other matrices stay as stored. */
static void cpu_repack(Backend *be, Matrix *w) {
    const CpuCtx *c = be->ctx;
    int           slot = vec_slot(w->type, WL_X16);

    if (w->layout != WL_ROWS || slot < 0 || c->vec->mm[slot].gemm == NULL
        || w->cols < X16 * QK)
    {
        return;
    }
    run_rows(c, repack_rows, w, w->rows, w->cols);
    w->layout = WL_X16;
}


/* ---- rope ---------------------------------------------------------------- */

typedef struct {
    float            *x;
    int               n_heads, head_dim;
    const int32_t    *pos;
    const RopeParams *p;
} RopeArgs;

/* ggml's YaRN correction dims: the pair indices where the rotation
 * count over n_ctx_orig positions crosses beta_fast and beta_slow. */
static void rope_corr_dims(const RopeParams *p, float dims[2]) {
    float n = (float) p->n_rot, two_pi = 2.0f * (float) M_PI;
    float lo = n * logf((float) p->n_ctx_orig / (p->beta_fast * two_pi))
               / (2.0f * logf(p->freq_base));
    float hi = n * logf((float) p->n_ctx_orig / (p->beta_slow * two_pi))
               / (2.0f * logf(p->freq_base));

    dims[0] = fmaxf(0.0f, floorf(lo));
    dims[1] = fminf(n - 1.0f, ceilf(hi));
}

/* cos and sin of pair i's angle for one position, as ggml's rope_yarn:
 * theta_extrap = pos * base^(-2i/n_rot) / factor_i, by repeated
 * multiplication; linearly scaled; with YaRN mixed back towards the
 * unscaled angle below the correction range, and magnitude-scaled. */
static void rope_angles(const RopeParams *p, float pos, const float dims[2],
                        float *cs, float *sn)
{
    float theta = pos;
    float theta_scale = powf(p->freq_base, -2.0f / (float) p->n_rot);
    float mscale = p->attn_factor;

    if (p->ext_factor != 0.0f) mscale *= 1.0f + 0.1f * logf(1.0f
                                                            / p->freq_scale);
    for (int i = 0; i < p->n_rot / 2; i++) {
        float ff = p->freq_factors ? p->freq_factors[i] : 1.0f;
        float extrap = theta / ff, th = p->freq_scale * extrap;

        if (p->ext_factor != 0.0f) {
            float y = ((float) i - dims[0]) / fmaxf(0.001f, dims[1] - dims[0]);
            float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;

            th = th * (1.0f - mix) + extrap * mix;
        }
        cs[i] = cosf(th) * mscale;
        sn[i] = sinf(th) * mscale;
        theta *= theta_scale;
    }
}

static void rope_rows(const CpuCtx *c, void *p, int64_t r0, int64_t r1) {
    RopeArgs *a = p;
    int       half = a->p->n_rot / 2;
    float     cs[256], sn[256], dims[2] = { 0.0f, 0.0f };

    (void) c;
    if (a->p->ext_factor != 0.0f) rope_corr_dims(a->p, dims);
    for (int64_t t = r0; t < r1; t++) {
        rope_angles(a->p, (float) a->pos[t], dims, cs, sn);
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
    AttnParams        p;
} AttnJob;

/* scores[r] = scale * q . k_r over n consecutive key rows; returns the
 * largest. Uses the table's block kernel when it has one. */
static float attn_scores(const CpuVec *vec, float *scores, const float *q,
                         const uint16_t *k, int64_t n, int hd, float scale)
{
    float max = -INFINITY;

    if (vec->scores_f16 != NULL) {
        return vec->scores_f16(scores, q, k, n, hd, scale);
    }
    for (int64_t r = 0; r < n; r++) {
        scores[r] = vec->dot_f16(k + r * hd, q, hd) * scale;
        max = scores[r] > max ? scores[r] : max;
    }
    return max;
}

static void attn_mix(const CpuVec *vec, float *out, const float *p,
                     const uint16_t *v, int64_t n, int hd)
{
    if (vec->mix_f16 != NULL) {
        vec->mix_f16(out, p, v, n, hd);
        return;
    }
    for (int64_t r = 0; r < n; r++) vec->axpy_f16(out, p[r], v + r * hd, hd);
}

/* The largest of n scores: after soft-capping, which moves it. */
static float scores_max(const float *s, int64_t n) {
    float max = -INFINITY;

    for (int64_t r = 0; r < n; r++) max = s[r] > max ? s[r] : max;
    return max;
}

/* One (token, head): scores over positions first..pos (first = 0, or the
 * window's start), softmax, weighted sum of values. Both passes walk the
 * block table a run of contiguous rows at a time (a block's rows of one
 * head are contiguous), in position order; where runs start depends only
 * on the token's position, never on its batch. */
static void attn_one(AttnJob *j, float *scores, int64_t t, int h) {
    const CpuVec  *vec = j->c->vec;
    const KVLayer *kv = j->kv;
    int            hd = kv->head_dim, bs = kv->block_size;
    int            kvh = h / (j->n_heads / kv->n_kv_heads);
    int32_t        npos = j->b->pos[t] + 1, first = 0, p, n;
    const int32_t *bt = j->b->block_table[t];
    const float   *q = j->q + (t * j->n_heads + h) * hd;
    float         *out = j->out + (t * j->n_heads + h) * hd;
    float          max = -INFINITY, sum;

    if (j->p.window > 0 && npos > j->p.window) first = npos - j->p.window;
    for (p = first; p < npos; p += n) {
        float m;

        n = bs - p % bs < npos - p ? bs - p % bs : npos - p;
        m = attn_scores(vec, scores + (p - first), q,
                        kv->k + kv_offset(kv, bt[p / bs], kvh, p % bs),
                        n, hd, j->p.scale);
        max = m > max ? m : max;
    }
    if (j->p.softcap > 0.0f) {
        vec->tanh_scale(scores, scores, 1.0f, j->p.softcap, npos - first);
        max = scores_max(scores, npos - first);
    }
    sum = vec->exp_sum(scores, scores, max, npos - first);
    memset(out, 0, (size_t) hd * sizeof(float));
    for (p = first; p < npos; p += n) {
        n = bs - p % bs < npos - p ? bs - p % bs : npos - p;
        attn_mix(vec, out, scores + (p - first),
                 kv->v + kv_offset(kv, bt[p / bs], kvh, p % bs), n, hd);
    }
    vec->scale(out, 1.0f / sum, hd);
}

/* An item is one token and one KV head: the query heads that share the
 * head (GQA) run one after the other while its keys and values are in L1
 * (one item per query head read them once per head: attention was 17% of
 * a 16-sequence decode step). Items are head-major: consecutive items read
 * the same KV head, whose rows stay in L2 (token-major cycles through all
 * of them: 2.5x slower at 512 tokens). */
static void attn_worker(void *p, int64_t i, int ith) {
    AttnJob *j = p;
    float   *scores = j->c->scores + (size_t) ith * j->c->cfg.max_ctx;
    int      g = j->n_heads / j->kv->n_kv_heads;
    int      kvh = (int) (i / j->b->n);

    for (int h = kvh * g; h < (kvh + 1) * g; h++) {
        attn_one(j, scores, i % j->b->n, h);
    }
}

static void cpu_attention(Backend *be, float *out, const float *q,
                          int n_heads, const KVLayer *kv, const TokenBatch *b,
                          const AttnParams *p)
{
    AttnJob j = { be->ctx, out, q, n_heads, kv, b, *p };

    tp_run(((CpuCtx *) be->ctx)->tp, attn_worker, &j,
           b->n * kv->n_kv_heads);
}


/* ---- creation -------------------------------------------------------------- */

/* A few rows (one per sequence): the caller's thread does it. */
static void cpu_gather(Backend *be, float *out, const float *x,
                       const int32_t *idx, int64_t n_out, int64_t dim)
{
    (void) be;
    for (int64_t i = 0; i < n_out; i++) {
        memcpy(out + i * dim, x + (int64_t) idx[i] * dim,
               (size_t) dim * sizeof(float));
    }
}

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

/* The kernel sets in the order "auto" tries them, widest first, with the
 * CPU features each needs. The scalar set needs nothing, so "auto" always
 * ends with one. */
static const struct {
    const char   *name;
    const CpuVec *vec;
    unsigned      need;
} kernel_sets[] = {
#ifdef OMNI_HAVE_AVX512
    { "avx512", &cpu_vec_avx512, CPU_AVX512F | CPU_AVX512BW | CPU_AVX512VL
                                 | CPU_AVX512DQ | CPU_AVX512VNNI | CPU_AVX2
                                 | CPU_FMA | CPU_F16C },
#endif
#ifdef OMNI_HAVE_AVX2
    { "avx2", &cpu_vec_avx2, CPU_AVX2 | CPU_FMA | CPU_F16C },
#endif
#ifdef OMNI_HAVE_NEON
    { "neon", &cpu_vec_neon, CPU_NEON | CPU_DOTPROD },
#endif
    { "ref", &cpu_vec_ref, 0 },
};

#define N_KERNEL_SETS (sizeof(kernel_sets) / sizeof(kernel_sets[0]))

unsigned cpu_features(void) {
    unsigned f = 0;

#if defined(__x86_64__)
    /* __builtin_cpu_supports takes only literals, hence one line each. */
    __builtin_cpu_init();
    f |= __builtin_cpu_supports("avx512f") ? CPU_AVX512F : 0;
    f |= __builtin_cpu_supports("avx512bw") ? CPU_AVX512BW : 0;
    f |= __builtin_cpu_supports("avx512vl") ? CPU_AVX512VL : 0;
    f |= __builtin_cpu_supports("avx512dq") ? CPU_AVX512DQ : 0;
    f |= __builtin_cpu_supports("avx512vnni") ? CPU_AVX512VNNI : 0;
    f |= __builtin_cpu_supports("avx2") ? CPU_AVX2 : 0;
    f |= __builtin_cpu_supports("fma") ? CPU_FMA : 0;
    f |= __builtin_cpu_supports("f16c") ? CPU_F16C : 0;
#elif defined(__aarch64__)
    /* the kernel's hardware capabilities (what /proc/cpuinfo calls asimd
       and asimddp); reading the ID registers would trap on old kernels */
    unsigned long hw = getauxval(AT_HWCAP);

    f |= hw & HWCAP_ASIMD ? CPU_NEON : 0;
    f |= hw & HWCAP_ASIMDDP ? CPU_DOTPROD : 0;
#endif
    return f;
}

static int kernel_set_index(const char *isa, unsigned features, char *err,
                            size_t errlen)
{
    bool any = isa == NULL || strcmp(isa, "auto") == 0;

    for (size_t i = 0; i < N_KERNEL_SETS; i++) {
        bool ok = (kernel_sets[i].need & ~features) == 0;

        if (any) {
            if (ok) return (int) i;
            continue;
        }
        if (strcmp(isa, kernel_sets[i].name) != 0) continue;
        if (ok) return (int) i;
        snprintf(err, errlen, "kernel set '%s' needs CPU features this CPU "
                 "lacks", isa);
        return -1;
    }
    snprintf(err, errlen, "kernel set '%s' is not in this build",
             any ? "auto" : isa);
    return -1;
}

const char *cpu_kernel_set(const char *isa, unsigned features, char *err,
                           size_t errlen)
{
    int i = kernel_set_index(isa, features, err, errlen);

    return i < 0 ? NULL : kernel_sets[i].name;
}

Backend *backend_cpu_new(const BackendConfig *cfg, char *err, size_t errlen) {
    Backend *be = calloc(1, sizeof(*be));
    CpuCtx  *c = calloc(1, sizeof(*c));
    int      nth = cfg->n_threads, set;
    size_t   xrow;

    if (be == NULL || c == NULL) {
        free(be);
        free(c);
        snprintf(err, errlen, "out of memory creating the CPU backend");
        return NULL;
    }
    be->ctx = c;
    be->free = cpu_free;
    set = kernel_set_index(cfg->isa, cpu_features(), err, errlen);
    if (set < 0) {
        cpu_free(be);
        return NULL;
    }
    c->vec = kernel_sets[set].vec;
    if (nth <= 0) nth = (int) sysconf(_SC_NPROCESSORS_ONLN);
    c->cfg = *cfg;
    c->cfg.n_threads = nth;
    /* room for the widest converted row any weight type asks for; f32
       rows are copied there, line-aligned, when the caller's are not */
    xrow = 64;
    for (int t = 0; t < VEC_SLOTS; t++) {
        size_t b = x_bytes(vec_gemm(c->vec, t), cfg->max_cols);

        xrow = b > xrow ? b : xrow;
    }
    xrow = (xrow + 63) / 64 * 64;
    c->xbuf = aligned_alloc(64, ((size_t) cfg->max_tokens * xrow + 63) / 64
                                * 64);
    c->scores = malloc((size_t) nth * (size_t) cfg->max_ctx * sizeof(float));
    c->tp = tp_new(nth);
    if (c->xbuf == NULL || c->scores == NULL || c->tp == NULL) goto oom;

    be->name = c->vec->name;
    be->repack = cpu_repack;
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->matmul = cpu_matmul;
    be->matmul_n = cpu_matmul_n;
    be->add_bias = cpu_add_bias;
    be->add = cpu_add;
    be->rope = cpu_rope;
    be->kv_store = cpu_kv_store;
    be->attention = cpu_attention;
    be->swiglu = cpu_swiglu;
    be->geglu = cpu_geglu;
    be->softcap = cpu_softcap;
    be->scale = cpu_scale;
    be->gather = cpu_gather;
    return be;

oom:
    snprintf(err, errlen, "out of memory creating the CPU backend");
    cpu_free(be);
    return NULL;
}

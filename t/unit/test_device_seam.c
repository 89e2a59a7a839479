/* test_device_seam.c -- the engine's side of the device seam, without a
 * device.
 *
 * kernels.h's "Where the data lives" hooks (alloc, release, budget_left,
 * upload, upload_f32, begin, end, argmax, to_host) are filled only by a
 * device backend (CUDA), so on a machine without a GPU the engine code that
 * calls them (model_place, runstate_init/free/logits_row, kv_init/free with
 * a backend, model_forward's begin/end, sched_step's argmax path) never
 * runs. This test runs it against a "checking device": a Backend wrapping
 * the CPU backend, whose "device memory" is malloc'd regions it tracks
 * (poisoned with NaN bytes when allocated), and which before every op
 * checks that
 *   - each buffer a device reads or writes (activations, weights, norm
 *     weights, biases, RoPE factors, the KV layers) lies whole inside a
 *     tracked region; host arrays (tokens, positions, block tables, output
 *     rows) may be anywhere, but must be the ones begin was given;
 *   - it runs between begin and end, and argmax and to_host outside.
 * The first failed check (op and argument) fails the test.
 * The arithmetic is the CPU's, so results must equal the plain CPU
 * backend's bit for bit:
 *   1. every family test_model.c makes, placed on the device (model_place)
 *      and run over batches of several sequences, gives the CPU's logits:
 *      model_place uploads everything forward reads;
 *   2. the scheduler gives the CPU's text, greedy rows through argmax and
 *      only the rows a sampler needs whole copied to the host (to_host);
 *   3. the KV pool and activations come from device memory and go back to
 *      it, and running out of it is an error that says so. */

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels.h"
#include "kv_cache.h"
#include "make_model.h"
#include "model.h"
#include "scheduler.h"
#include "tokenizer.h"

#define CTX      64             // test_model.c's models
#define BLOCK    4
#define N_SEQ    3
#define MAX_TOK  16             // tokens in one forward
#define MAX_REG  1024           // device regions
#define F(n)     ((size_t) (n) * sizeof(float))

/* The model (test_scheduler.c's way), and the vocabulary the random
 * models copy (test_model.c's: only stories260K's fits their size). */
static const char *model_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m != NULL && *m != '\0' ? m : "../shared/models/stories260K.gguf";
}

static const char *vocab_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m && strstr(m, "stories260K") ? m
           : "../shared/models/stories260K.gguf";
}


/* ---- The checking device ---------------------------------------------- */

typedef struct {
    uintptr_t   p;
    size_t      bytes;
    const void *host;           // what an upload copied, NULL for alloc's
} Region;

typedef struct {
    Backend        be;          // what the engine calls; be.ctx is this
    Backend       *cpu;         // does the arithmetic, owned
    Region         reg[MAX_REG];
    int            n_reg;
    int64_t        budget, held;
    int            depth;       // begins minus ends
    const char    *op;          // the op being checked
    const int32_t *tokens;      // what begin was given
    TokenBatch     batch;
    const int32_t *out_idx;
    int64_t        n_out;
    int            n_begin, n_end, n_argmax;
    int64_t        argmax_rows, host_rows;
    char           fail[256];   // the first failed check, "" when none
} Dev;

static Dev *dev(Backend *be) {
    return be->ctx;
}

static void flag(Dev *d, const char *fmt, ...) {
    va_list ap;
    size_t  n;

    if (d->fail[0] != '\0') return;
    n = (size_t) snprintf(d->fail, sizeof(d->fail), "%s: ", d->op);
    va_start(ap, fmt);
    vsnprintf(d->fail + n, sizeof(d->fail) - n, fmt, ap);
    va_end(ap);
}

/* d, with op noted and checked to run inside begin/end, or outside. */
static Dev *at(Backend *be, const char *op, bool in_step) {
    Dev *d = dev(be);

    d->op = op;
    if (d->depth != (in_step ? 1 : 0)) {
        flag(d, in_step ? "called outside begin/end"
                        : "called between begin and end");
    }
    return d;
}

/* The region holding [p, p + bytes) whole, or NULL. */
static const Region *region_of(const Dev *d, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t) p;

    for (int i = 0; p != NULL && i < d->n_reg; i++) {
        const Region *r = &d->reg[i];

        if (a >= r->p && a - r->p <= r->bytes
            && bytes <= r->bytes - (a - r->p))
        {
            return r;
        }
    }
    return NULL;
}

static void need(Dev *d, const char *arg, const void *p, size_t bytes) {
    if (region_of(d, p, bytes) == NULL) {
        flag(d, "%s (%zu bytes at %p) is not device memory", arg, bytes, p);
    }
}

static void need_w(Dev *d, const char *arg, const Matrix *w) {
    need(d, arg, w->data, (size_t) w->rows * w->row_bytes);
}

static void need_kv(Dev *d, const KVLayer *kv) {
    size_t bytes = (size_t) kv->n_blocks * (size_t) kv->n_kv_heads
                   * (size_t) kv->block_size * (size_t) kv->head_dim
                   * sizeof(uint16_t);

    need(d, "kv->k", kv->k, bytes);
    need(d, "kv->v", kv->v, bytes);
}

/* Host arrays may be anywhere, but must be the ones begin was given. */
static void same_batch(Dev *d, const TokenBatch *b) {
    if (b->n != d->batch.n || b->pos != d->batch.pos
        || b->block_table != d->batch.block_table)
    {
        flag(d, "a batch other than the one begin was given");
    }
}

/* ---- its ops: check, then the CPU's ---- */

static void d_embed(Backend *be, float *out, const Matrix *table,
                    const int32_t *tokens, int64_t n)
{
    Dev *d = at(be, "embed", true);

    need(d, "out", out, F(n * table->cols));
    need_w(d, "table", table);
    if (tokens != d->tokens || n != d->batch.n) {
        flag(d, "tokens other than begin's");
    }
    d->cpu->embed(d->cpu, out, table, tokens, n);
}

static void d_rmsnorm(Backend *be, float *out, const float *x,
                      const float *weight, int64_t n, int64_t dim, float eps)
{
    Dev *d = at(be, "rmsnorm", true);

    need(d, "out", out, F(n * dim));
    need(d, "x", x, F(n * dim));
    need(d, "weight", weight, F(dim));
    d->cpu->rmsnorm(d->cpu, out, x, weight, n, dim, eps);
}

static void d_matmul(Backend *be, float *out, const float *x, int64_t n,
                     const Matrix *w)
{
    Dev *d = at(be, "matmul", true);

    need(d, "out", out, F(n * w->rows));
    need(d, "x", x, F(n * w->cols));
    need_w(d, "w", w);
    d->cpu->matmul(d->cpu, out, x, n, w);
}

static void d_matmul_n(Backend *be, float *const *outs, const float *x,
                       int64_t n, const Matrix *const *ws, int count)
{
    Dev *d = at(be, "matmul_n", true);

    need(d, "x", x, F(n * ws[0]->cols));
    for (int i = 0; i < count; i++) {
        need(d, i == 0 ? "outs[0]" : i == 1 ? "outs[1]" : "outs[2]", outs[i],
             F(n * ws[i]->rows));
        need_w(d, i == 0 ? "ws[0]" : i == 1 ? "ws[1]" : "ws[2]", ws[i]);
    }
    d->cpu->matmul_n(d->cpu, outs, x, n, ws, count);
}

static void d_add_bias(Backend *be, float *x, const float *bias, int64_t n,
                       int64_t dim)
{
    Dev *d = at(be, "add_bias", true);

    need(d, "x", x, F(n * dim));
    need(d, "bias", bias, F(dim));
    d->cpu->add_bias(d->cpu, x, bias, n, dim);
}

static void d_add(Backend *be, float *x, const float *y, int64_t n,
                  int64_t dim)
{
    Dev *d = at(be, "add", true);

    need(d, "x", x, F(n * dim));
    need(d, "y", y, F(n * dim));
    d->cpu->add(d->cpu, x, y, n, dim);
}

static void d_rope(Backend *be, float *x, int64_t n, int n_heads,
                   int head_dim, const int32_t *pos, const RopeParams *p)
{
    Dev *d = at(be, "rope", true);

    need(d, "x", x, F(n * n_heads * head_dim));
    if (p->freq_factors != NULL) {
        need(d, "freq_factors", p->freq_factors, F(p->n_rot / 2));
    }
    if (pos != d->batch.pos || n != d->batch.n) {
        flag(d, "positions other than begin's");
    }
    d->cpu->rope(d->cpu, x, n, n_heads, head_dim, pos, p);
}

static void d_kv_store(Backend *be, const KVLayer *kv, const float *k,
                       const float *v, const TokenBatch *b)
{
    Dev *d = at(be, "kv_store", true);

    need_kv(d, kv);
    need(d, "k", k, F(b->n * kv->n_kv_heads * kv->head_dim));
    need(d, "v", v, F(b->n * kv->n_kv_heads * kv->head_dim));
    same_batch(d, b);
    d->cpu->kv_store(d->cpu, kv, k, v, b);
}

static void d_attention(Backend *be, float *out, const float *q, int n_heads,
                        const KVLayer *kv, const TokenBatch *b,
                        const AttnParams *p)
{
    Dev *d = at(be, "attention", true);

    need(d, "out", out, F(b->n * n_heads * kv->head_dim));
    need(d, "q", q, F(b->n * n_heads * kv->head_dim));
    need_kv(d, kv);
    same_batch(d, b);
    d->cpu->attention(d->cpu, out, q, n_heads, kv, b, p);
}

/* swiglu's and geglu's checks: out, gate, up (n,). */
static Dev *glu(Backend *be, const char *op, const float *out,
                const float *gate, const float *up, int64_t n)
{
    Dev *d = at(be, op, true);

    need(d, "out", out, F(n));
    need(d, "gate", gate, F(n));
    need(d, "up", up, F(n));
    return d;
}

static void d_swiglu(Backend *be, float *out, const float *gate,
                     const float *up, int64_t n)
{
    Dev *d = glu(be, "swiglu", out, gate, up, n);

    d->cpu->swiglu(d->cpu, out, gate, up, n);
}

static void d_geglu(Backend *be, float *out, const float *gate,
                    const float *up, int64_t n)
{
    Dev *d = glu(be, "geglu", out, gate, up, n);

    d->cpu->geglu(d->cpu, out, gate, up, n);
}

static void d_softcap(Backend *be, float *x, int64_t n, float cap) {
    Dev *d = at(be, "softcap", true);

    need(d, "x", x, F(n));
    d->cpu->softcap(d->cpu, x, n, cap);
}

static void d_scale(Backend *be, float *x, int64_t n, float s) {
    Dev *d = at(be, "scale", true);

    need(d, "x", x, F(n));
    d->cpu->scale(d->cpu, x, n, s);
}

static void d_gather(Backend *be, float *out, const float *x,
                     const int32_t *idx, int64_t n_out, int64_t dim)
{
    Dev *d = at(be, "gather", true);

    need(d, "out", out, F(n_out * dim));
    need(d, "x", x, F(d->batch.n * dim));
    if (idx != d->out_idx || n_out != d->n_out) {
        flag(d, "output rows other than begin's");
    }
    d->cpu->gather(d->cpu, out, x, idx, n_out, dim);
}

/* ---- its memory, steps and results ---- */

/* A new region of bytes, NaN-filled, charged to the budget; NULL past it. */
static void *track(Dev *d, size_t bytes, const void *host) {
    size_t cap = (bytes + 64) / 64 * 64;
    void  *p;

    if (d->held + (int64_t) bytes > d->budget || d->n_reg == MAX_REG) {
        return NULL;
    }
    p = aligned_alloc(64, cap);
    assert_non_null(p);
    memset(p, 0xFF, cap);
    d->reg[d->n_reg++] = (Region) { (uintptr_t) p, bytes, host };
    d->held += (int64_t) bytes;
    return p;
}

static void *d_alloc(Backend *be, size_t bytes) {
    return track(at(be, "alloc", false), bytes, NULL);
}

static void d_release(Backend *be, void *p) {
    Dev *d = at(be, "release", false);

    for (int i = 0; p != NULL && i < d->n_reg; i++) {
        if (d->reg[i].p != (uintptr_t) p) continue;
        d->held -= (int64_t) d->reg[i].bytes;
        free(p);
        d->reg[i] = d->reg[--d->n_reg];
        return;
    }
    if (p != NULL) flag(d, "%p is not a region alloc gave", p);
}

static int64_t d_budget_left(Backend *be) {
    return dev(be)->budget - dev(be)->held;
}

/* The device copy of host's bytes: an earlier one of the same bytes (a
 * tied output), else a new region. NULL with err set past the budget. */
static void *copy_in(Backend *be, const void *host, size_t bytes, char *err,
                     size_t errlen)
{
    Dev  *d = at(be, "upload", false);
    void *p;

    for (int i = 0; i < d->n_reg; i++) {
        if (d->reg[i].host == host && d->reg[i].bytes == bytes) {
            return (void *) d->reg[i].p;
        }
    }
    p = track(d, bytes, host);
    if (p == NULL) {
        snprintf(err, errlen, "out of device memory: %zu bytes more would "
                 "pass the budget", bytes);
        return NULL;
    }
    memcpy(p, host, bytes);
    return p;
}

static int d_upload(Backend *be, Matrix *w, char *err, size_t errlen) {
    void *p = copy_in(be, w->data, (size_t) w->rows * w->row_bytes, err,
                      errlen);

    if (p == NULL) return -1;
    w->data = p;
    return 0;
}

static int d_upload_f32(Backend *be, const float **v, int64_t n, char *err,
                        size_t errlen)
{
    void *p = copy_in(be, *v, F(n), err, errlen);

    if (p == NULL) return -1;
    *v = p;
    return 0;
}

static void d_begin(Backend *be, const int32_t *tokens, const TokenBatch *b,
                    const int32_t *out_idx, int64_t n_out, uint64_t bufs)
{
    Dev *d = at(be, "begin", false);

    (void) bufs;
    d->depth++;
    d->n_begin++;
    d->tokens = tokens;
    d->batch = *b;
    d->out_idx = out_idx;
    d->n_out = n_out;
}

static void d_end(Backend *be) {
    Dev *d = at(be, "end", true);

    d->depth--;
    d->n_end++;
}

/* The lowest id among the highest, NaN never winning (sampler.c). */
static void d_argmax(Backend *be, int32_t *ids, const float *logits,
                     int64_t n, int64_t n_vocab)
{
    Dev *d = at(be, "argmax", false);

    need(d, "logits", logits, F(n * n_vocab));
    d->n_argmax++;
    d->argmax_rows += n;
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * n_vocab;

        float max = -INFINITY;

        ids[r] = 0;
        for (int32_t i = 0; i < n_vocab; i++) {
            if (row[i] > max) {
                max = row[i];
                ids[r] = i;
            }
        }
    }
}

static void d_to_host(Backend *be, float *dst, const float *src, int64_t n) {
    Dev *d = at(be, "to_host", false);

    need(d, "src", src, F(n));
    if (region_of(d, dst, F(n)) != NULL) flag(d, "dst is device memory");
    memcpy(dst, src, F(n));
    d->host_rows++;
}

static void d_free(Backend *be) {
    Dev *d = dev(be);

    for (int i = 0; i < d->n_reg; i++) free((void *) d->reg[i].p);
    d->cpu->free(d->cpu);
    free(d);
}

/* The CPU backend (the best kernel set, two threads) for batches of up
 * to max_tokens over contexts of max_ctx. */
static Backend *cpu_new(int64_t max_tokens, int64_t max_ctx) {
    BackendConfig cfg = {
        .n_threads = 2, .isa = "auto", .max_tokens = max_tokens,
        .max_out = max_tokens, .max_cols = 1024, .max_ctx = max_ctx,
    };
    char          err[ERR_MAX];
    Backend      *be = backend_cpu_new(&cfg, err, sizeof(err));

    if (be == NULL) fail_msg("backend_cpu_new: %s", err);
    return be;
}

/* A checking device of budget bytes over cpu_new's backend. */
static Backend *dev_new(int64_t budget, int64_t max_tokens, int64_t max_ctx) {
    Dev *d = calloc(1, sizeof(*d));

    assert_non_null(d);
    d->cpu = cpu_new(max_tokens, max_ctx);
    d->budget = budget;
    d->be = (Backend) {
        .name = "checking-device", .ctx = d, .embed = d_embed,
        .rmsnorm = d_rmsnorm, .matmul = d_matmul, .matmul_n = d_matmul_n,
        .add_bias = d_add_bias, .add = d_add, .rope = d_rope,
        .kv_store = d_kv_store, .attention = d_attention,
        .swiglu = d_swiglu, .geglu = d_geglu, .softcap = d_softcap,
        .scale = d_scale, .alloc = d_alloc, .release = d_release,
        .budget_left = d_budget_left, .upload = d_upload,
        .upload_f32 = d_upload_f32, .begin = d_begin, .end = d_end,
        .gather = d_gather, .argmax = d_argmax, .to_host = d_to_host,
        .free = d_free,
    };
    return &d->be;
}

/* Fails the test with the first failed check, if any. */
static void check_ok(Backend *be, const char *what) {
    Dev *d = dev(be);

    if (d->fail[0] != '\0') fail_msg("%s: %s", what, d->fail);
    assert_int_equal(d->depth, 0);
    assert_int_equal(d->n_begin, d->n_end);
}


/* ---- 1. Every family, placed and run ----------------------------------- */

typedef struct {
    const char *arch;
    DType       type;
    int         layers, head_dim, swa, tied;
    bool        rope_freqs;
} Family;

/* What each adds that forward reads: a tied output sharing the
 * embedding's copy, llama 3.1's rope_freqs (set after loading, as
 * bind_tensors would), qwen2's biases, qwen3's and gemma3's Q/K norms,
 * gemma's head size, gemma2/3's post norms, soft-capping and windows
 * shorter than the sequences, phi3's fused row views and short/long
 * factors; quantized weights copied as blocks. */
static const Family families[] = {
    { "llama",  DT_F32,  2,  0, 0, 0, false },
    { "llama",  DT_Q8_0, 2,  0, 0, 1, false },
    { "llama",  DT_Q4_0, 2,  0, 0, 0, true },
    { "qwen2",  DT_F32,  2,  0, 0, 0, false },
    { "qwen3",  DT_F16,  2,  0, 0, 0, false },
    { "gemma",  DT_F32,  2, 24, 0, 0, false },
    { "gemma2", DT_F32,  2,  0, 4, 0, false },
    { "gemma3", DT_Q8_0, 7,  0, 5, 0, false },
    { "phi3",   DT_F32,  2,  0, 0, 0, false },
    { "phi3",   DT_Q4_0, 2,  0, 0, 1, false },
};

static const float freqs[8] = { 1, 1, 1.5f, 2, 3, 4, 6, 8 };

/* Tokens each sequence runs in each forward: prefills, decodes, a mix;
 * blocks of 4 are crossed and the windows (4, 5) passed. */
static const int chunks[][N_SEQ] = { { 5, 2, 7 }, { 1, 1, 1 }, { 3, 1, 2 } };
#define N_STEPS ((int) (sizeof(chunks) / sizeof(chunks[0])))
#define N_ROWS  23                      // tokens in all the steps

/* One model on one backend, its KV pool and activations there. */
typedef struct {
    Model    m;
    Backend *be;
    KVCache  kv;
    RunState rs;
} Side;

static void side_init(Side *sd, const char *path, const Family *f,
                      bool device)
{
    Err err;

    if (model_load(&sd->m, path, GGUF_MAP, &err) != 0) fail_msg("%s", err.msg);
    if (f->rope_freqs) {
        assert_int_equal(sd->m.c.rope.n_rot / 2, 8);
        sd->m.c.rope.freq_factors = freqs;
    }
    model_use_context(&sd->m, CTX);
    sd->be = device ? dev_new(64 << 20, MAX_TOK, CTX) : cpu_new(MAX_TOK, CTX);
    if (model_place(&sd->m, sd->be, &err) != 0
        || kv_init(&sd->kv, sd->m.c.n_layers, sd->m.c.n_kv_heads,
                   sd->m.c.head_dim, BLOCK, N_SEQ * CTX / BLOCK, sd->be,
                   &err) != 0
        || runstate_init(&sd->rs, &sd->m.c, MAX_TOK, MAX_TOK, sd->be,
                         &err) != 0)
    {
        fail_msg("%s: %s", f->arch, err.msg);
    }
}

static void side_free(Side *sd) {
    runstate_free(&sd->rs);
    kv_free(&sd->kv);
    sd->be->free(sd->be);
    model_free(&sd->m);
}

/* Runs the chunks with logits for every token, into out row after row.
 * Sequence s's logical block i is physical block 7 (3 i + s) + 5 of the
 * pool's 48, so the sequences interleave. */
static void run_steps(Side *sd, float *out) {
    int32_t        tables[N_SEQ][CTX / BLOCK], done[N_SEQ] = { 0 };
    int32_t        toks[MAX_TOK], pos[MAX_TOK], idx[MAX_TOK];
    const int32_t *tabs[MAX_TOK];
    int64_t        nv = sd->m.c.n_vocab, rows = 0;

    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i < CTX / BLOCK; i++) {
            tables[s][i] = (7 * (i * N_SEQ + s) + 5) % (N_SEQ * CTX / BLOCK);
        }
    }
    for (int st = 0; st < N_STEPS; st++) {
        int        n = 0;
        TokenBatch b = { 0, pos, tabs };

        for (int s = 0; s < N_SEQ; s++) {
            for (int k = 0; k < chunks[st][s]; k++, n++) {
                pos[n] = done[s]++;
                toks[n] = 1 + (37 * s + 11 * pos[n] + 5) % 480;
                tabs[n] = tables[s];
                idx[n] = n;
            }
        }
        b.n = n;
        model_forward(&sd->m, sd->be, &sd->kv, &sd->rs, toks, &b, idx, n);
        for (int o = 0; o < n; o++, rows++) {
            memcpy(out + rows * nv, runstate_logits_row(&sd->rs, o, nv),
                   F(nv));
        }
    }
    assert_int_equal(rows, N_ROWS);
}

static void check_family(const Family *f) {
    char            path[256];
    Side            cpu, dv;
    float          *want, *got;
    size_t          n;
    Err             err;
    MakeModelParams p = {
        .arch = f->arch, .dim = 64, .layers = f->layers, .heads = 4,
        .kv_heads = 2, .ffn = 96, .ctx = CTX, .type = f->type,
        .vocab_from = vocab_path(), .seed = 11, .head_dim = f->head_dim,
        .swa = f->swa, .std = 0.05f, .tied = f->tied, .rope_factors = 1,
        .out = path,
    };

    snprintf(path, sizeof(path), "/tmp/omni-test-seam-%d-%s-%s.gguf",
             (int) getpid(), f->arch, dtype_name(f->type));
    if (make_model(&p, &err) != 0) fail_msg("make_model: %s", err.msg);
    side_init(&cpu, path, f, false);
    side_init(&dv, path, f, true);
    unlink(path);
    check_ok(dv.be, f->arch);
    assert_true(!f->tied || dv.m.output.data == dv.m.tok_embd.data);
    n = (size_t) N_ROWS * (size_t) cpu.m.c.n_vocab;
    want = malloc(F(n));
    got = malloc(F(n));
    run_steps(&cpu, want);
    run_steps(&dv, got);
    check_ok(dv.be, f->arch);
    assert_int_equal(dev(dv.be)->n_begin, N_STEPS);
    assert_int_equal(dev(dv.be)->host_rows, N_ROWS);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0) {
            fail_msg("%s %s: logits row %d, token %d: device %g, cpu %g",
                     f->arch, dtype_name(f->type),
                     (int) (i / cpu.m.c.n_vocab), (int) (i % cpu.m.c.n_vocab),
                     (double) got[i], (double) want[i]);
        }
    }
    free(want);
    free(got);
    side_free(&dv);
    side_free(&cpu);
}

static void test_families(void **state) {
    (void) state;
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        check_family(&families[i]);
    }
}


/* ---- 2. The scheduler -------------------------------------------------- */

#define SCHED_CTX  128
#define N_REQ      8

typedef struct {
    bool     done;
    char     text[4096];
    size_t   len;
    OmniDone d;
} Result;

static void on_text(void *ud, uint64_t id, bool reasoning, const char *s,
                    size_t n)
{
    Result *r = (Result *) ud + id - 1;

    (void) reasoning;
    assert_true(r->len + n <= sizeof(r->text));
    memcpy(r->text + r->len, s, n);
    r->len += n;
}

static void on_done(void *ud, uint64_t id, const OmniDone *d) {
    Result *r = (Result *) ud + id - 1;

    r->done = true;
    r->d = *d;
}

static const char *prompts[N_REQ] = {
    "Once upon a time", "The little dog", "Lily and Tom went to the park",
    "One day, a big red ball", "Once upon a time there was a girl",
    "Mom said", "The sun was", "The bird sang",
};

/* Request i's parameters: five plain greedy; then sampled with a seed,
 * greedy with a presence penalty, greedy with a logit bias, which ignore
 * EOS (each of their tokens is then one logits row). Returns whether it
 * is plain greedy. */
static bool req_params(int i, SeqParams *p) {
    memset(p, 0, sizeof(*p));
    sampler_params_default(&p->sampling);
    p->sampling.temperature = 0.0f;
    p->max_tokens = 40 + 10 * i;
    if (i < 5) return true;
    p->ignore_eos = true;
    p->max_tokens = 20;
    if (i == 5) {
        p->sampling.temperature = 0.8f;
        p->sampling.seed = 1234;
    } else if (i == 6) {
        p->sampling.presence_penalty = 0.6f;
    } else {
        p->sampling.n_bias = 1;
        p->sampling.bias[0] = (LogitBias) { 13, -100.0f };
    }
    return false;
}

/* Runs the requests, half before the first step and half at the fourth,
 * in steps of 8 tokens (prefills are cut), over a pool of blocks of 4
 * tokens (prefixes are shared) that holds little more than one context
 * (sequences are preempted and recomputed). Returns the preemptions. */
static int64_t run_sched(const Model *m, const Tokenizer *tk, Backend *be,
                         Result *res)
{
    SchedConfig c = {
        .max_batch_tokens = 8, .max_seqs = 6, .max_queue = N_REQ,
        .block_size = 4, .n_blocks = 36,
        .max_ctx = SCHED_CTX, .prefix_cache = true,
    };
    SchedCounts counts;
    SchedEvents ev = { res, NULL, on_text, on_done, NULL };
    Err         err;
    Scheduler  *s = sched_new(m, tk, be, &c, &ev, NULL, &err);

    if (s == NULL) fail_msg("sched_new: %s", err.msg);
    memset(res, 0, N_REQ * sizeof(Result));
    for (int step = 0; step < 4 || !sched_idle(s); step++) {
        for (int i = 0; i < N_REQ; i++) {
            int32_t   toks[64];
            int64_t   n;
            SeqParams p;

            if ((i < N_REQ / 2 ? 0 : 3) != step) continue;
            n = tokenizer_encode(tk, prompts[i], strlen(prompts[i]), true,
                                 false, toks, 64, &err);
            assert_true(n > 0 && n < 64);
            req_params(i, &p);
            assert_int_equal(sched_submit(s, (uint64_t) i + 1, toks, n, &p),
                             0);
        }
        sched_step(s);
        assert_true(step < 10000);
    }
    sched_counts(s, &counts);
    sched_free(s);
    return counts.preemptions;
}

/* The same text from the device as from the CPU; a logits row through
 * argmax for every token (and EOS), to the host only for the three. */
static void test_scheduler(void **state) {
    static Result want[N_REQ], got[N_REQ];
    Model         mc, md;
    Tokenizer    *tk = NULL;
    Backend      *cpu = cpu_new(24, SCHED_CTX);
    Backend      *be = dev_new((int64_t) 1 << 40, 24, SCHED_CTX);
    Err           err;
    int64_t       placed, rows = 0, sampled = 0, cached = 0;
    SeqParams     p;

    (void) state;
    if (model_load(&mc, model_path(), GGUF_MAP, &err) != 0
        || model_load(&md, model_path(), GGUF_MAP, &err) != 0
        || (tk = tokenizer_new(&mc.gguf, &err)) == NULL
        || model_place(&mc, cpu, &err) != 0
        || model_place(&md, be, &err) != 0)
    {
        fail_msg("%s", err.msg);
    }
    placed = be->budget_left(be);
    run_sched(&mc, tk, cpu, want);
    assert_true(run_sched(&md, tk, be, got) > 0);
    check_ok(be, "scheduler");
    for (int i = 0; i < N_REQ; i++) {
        assert_true(want[i].done && got[i].done);
        if (got[i].len != want[i].len
            || memcmp(got[i].text, want[i].text, want[i].len) != 0
            || got[i].d.completion_tokens != want[i].d.completion_tokens
            || got[i].d.finish != want[i].d.finish)
        {
            fail_msg("request %d: device %u tokens \"%.*s\", cpu %u tokens "
                     "\"%.*s\"", i + 1, got[i].d.completion_tokens,
                     (int) got[i].len, got[i].text,
                     want[i].d.completion_tokens, (int) want[i].len,
                     want[i].text);
        }
        rows += got[i].d.completion_tokens
                + (got[i].d.finish == OMNI_FINISH_STOP);    // EOS
        if (!req_params(i, &p)) sampled += got[i].d.completion_tokens;
        cached += got[i].d.cached_tokens;
    }
    print_message("# %d argmax calls for %d rows, %d rows to the host, %d "
                  "prompt tokens cached\n", dev(be)->n_argmax,
                  (int) dev(be)->argmax_rows, (int) dev(be)->host_rows,
                  (int) cached);
    assert_true(cached > 0);
    assert_int_equal(dev(be)->argmax_rows, rows);
    assert_int_equal(dev(be)->host_rows, sampled);
    assert_int_equal(be->budget_left(be), placed);
    be->free(be);
    cpu->free(cpu);
    tokenizer_free(tk);
    model_free(&md);
    model_free(&mc);
}


/* ---- 2b. the host copy given back --------------------------------------- */

/* Once the device holds the weights, a private copy's tensor pages are
 * freed (they read as zeros), the device copy keeps the bytes, and the
 * model still runs. */
static void test_host_copy_dropped(void **state) {
    Model             m;
    Backend          *be = dev_new(64 << 20, MAX_TOK, CTX);
    Err               err;
    const GGUFTensor *t;
    uint8_t          *was;
    size_t            mid, len = 4096;

    (void) state;
    if (model_load(&m, model_path(), GGUF_COPY, &err) != 0) {
        fail_msg("%s", err.msg);
    }
    t = gguf_find_tensor(&m.gguf, "token_embd.weight");
    assert_non_null(t);
    assert_true(t->nbytes > 3 * len);
    mid = (size_t) t->nbytes / 2 / len * len;
    was = malloc(len);
    memcpy(was, (const uint8_t *) t->data + mid, len);
    {
        size_t nz = 0;

        for (size_t i = 0; i < len; i++) nz += was[i] != 0;
        assert_true(nz > len / 2);      /* weights, so zeros would show */
    }
    assert_int_equal(model_place(&m, be, &err), 0);
    for (size_t i = 0; i < len; i++) {
        if (((const uint8_t *) t->data)[mid + i] != 0) {
            fail_msg("host byte %zu of the embedding is still there", i);
        }
    }
    assert_memory_equal((const uint8_t *) m.tok_embd.data + mid, was, len);
    free(was);
    model_free(&m);
    be->free(be);
}


/* ---- 3. KV pool and activations in device memory ----------------------- */

static void test_memory(void **state) {
    Model              m;
    const ModelConfig *c = &m.c;
    Backend           *be = dev_new(4 << 20, 8, CTX);
    Dev               *d = dev(be);
    KVCache            kv;
    RunState           rs;
    Err                err;
    int64_t            kv_bytes, rs_bytes, nv;
    int32_t            tok = 1, pos = 0, table = 0, out = 0;
    const int32_t     *tables = &table;
    TokenBatch         b = { 1, &pos, &tables };

    (void) state;
    if (model_load(&m, model_path(), GGUF_MAP, &err) != 0) {
        fail_msg("%s", err.msg);
    }
    nv = c->n_vocab;
    kv_bytes = 8 * (int64_t) kv_block_bytes(c->n_layers, c->n_kv_heads,
                                            c->head_dim, BLOCK);
    rs_bytes = (int64_t) runstate_bytes(c, 8, 2);

    /* both take device memory, and give it back */
    assert_int_equal(kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim,
                             BLOCK, 8, be, &err), 0);
    assert_int_equal(runstate_init(&rs, c, 8, 2, be, &err), 0);
    assert_non_null(region_of(d, kv.mem, (size_t) kv_bytes));
    d->op = "kv_init";
    for (int l = 0; l < c->n_layers; l++) need_kv(d, &kv.layers[l]);
    assert_non_null(region_of(d, rs.mem, (size_t) rs_bytes));
    assert_non_null(region_of(d, rs.logits, F(2 * nv)));
    assert_null(region_of(d, rs.logits_host, 1));
    assert_int_equal(be->budget_left(be), (4 << 20) - kv_bytes - rs_bytes);
    for (int64_t i = 0; i < 2 * nv; i++) rs.logits[i] = (float) i;
    assert_true(runstate_logits_row(&rs, 1, nv)[nv - 1] == 2 * nv - 1);
    assert_int_equal(d->host_rows, 1);
    runstate_free(&rs);
    kv_free(&kv);
    check_ok(be, "memory");
    assert_int_equal(be->budget_left(be), 4 << 20);
    assert_int_equal(d->n_reg, 0);

    /* past the budget: an error that says device memory, nothing held */
    assert_int_equal(kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim,
                             BLOCK, (4 << 20) / (kv_bytes / 8) + 1, be,
                             &err), -1);
    assert_non_null(strstr(err.msg, "device memory"));
    assert_int_equal(runstate_init(&rs, c, 1 << 20, 2, be, &err), -1);
    assert_non_null(strstr(err.msg, "device memory"));
    assert_int_equal(d->n_reg, 0);
    d->budget = 64 << 10;
    assert_int_equal(model_place(&m, be, &err), -1);
    assert_non_null(strstr(err.msg, "device memory"));
    model_free(&m);

    /* the checks bite: activations in host memory, caught at the first op */
    d->budget = 64 << 20;
    assert_int_equal(model_load(&m, model_path(), GGUF_MAP, &err), 0);
    assert_int_equal(model_place(&m, be, &err), 0);
    assert_int_equal(kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim,
                             BLOCK, 1, be, &err), 0);
    assert_int_equal(runstate_init(&rs, c, 1, 1, NULL, &err), 0);
    model_forward(&m, be, &kv, &rs, &tok, &b, &out, 1);
    assert_non_null(strstr(d->fail, "embed: out ("));
    assert_non_null(strstr(d->fail, "is not device memory"));
    runstate_free(&rs);
    kv_free(&kv);
    be->free(be);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_scheduler),
        cmocka_unit_test(test_host_copy_dropped),
        cmocka_unit_test(test_memory),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("device_seam", tests, NULL, NULL);
}

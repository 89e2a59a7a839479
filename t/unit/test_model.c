/* test_model.c -- the model's forward pass against a plain reference.
 *
 * For every architecture and weight type, a small random model is written
 * with make_model(), loaded with model_load(), and its logits compared with
 * a from-scratch double-precision forward written here the llama2.c way
 * (dequantize each weight row, loop over everything). This checks the
 * wiring (tensor binding, shapes, biases, RoPE layouts, GQA, tied output)
 * independently of the kernels, which test_kernels checks one by one.
 *
 * It also checks batch invariance end to end: the logits of a token are the
 * same bits whether its prompt was prefilled in one batch, in uneven
 * chunks, or one token at a time; and that a model whose weights the
 * backend repacked at load computes what the stored layout does. */

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
#include "gguf.h"
#include "kv_cache.h"
#include "make_model.h"
#include "model.h"

#define N_TOK   11
#define CTX     64
#define BLOCK   4

static const int32_t prompt[N_TOK] = { 1, 403, 407, 261, 378, 13, 9, 300, 42,
                                       17, 2 };

static const char *vocab_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m && strstr(m, "stories260K") ? m
           : "../shared/models/stories260K.gguf";
}

/* Writes a small model of the given arch/type/width to a temp file. */
static void write_model_dims(char *path, size_t cap, const char *arch,
                             DType type, int tied, int dim, int ffn)
{
    MakeModelParams p = {
        .arch = arch, .dim = dim, .layers = 2, .heads = 4, .kv_heads = 2,
        .ffn = ffn, .ctx = CTX, .type = type, .vocab_from = vocab_path(),
        .seed = 7, .tied = tied,
    };
    Err err;

    snprintf(path, cap, "/tmp/omni-test-model-%d-%s-%s-%d%s.gguf",
             (int) getpid(), arch, dtype_name(type), dim, tied ? "-tied" : "");
    p.out = path;
    if (make_model(&p, &err) != 0) fail_msg("make_model: %s", err.msg);
}

/* A small model of a family with its options: layers, head size (0:
 * dim / heads) and sliding window (0: the family's default). */
static void write_model_arch(char *path, size_t cap, const char *arch,
                             DType type, int layers, int head_dim, int swa)
{
    MakeModelParams p = {
        .arch = arch, .dim = 64, .layers = layers, .heads = 4,
        .kv_heads = 2, .ffn = 96, .ctx = CTX, .type = type,
        .vocab_from = vocab_path(), .seed = 9, .head_dim = head_dim,
        .swa = swa, .std = 0.05f,
    };
    Err err;

    snprintf(path, cap, "/tmp/omni-test-model-%d-%s-%s-l%d-h%d-w%d.gguf",
             (int) getpid(), arch, dtype_name(type), layers, head_dim, swa);
    p.out = path;
    if (make_model(&p, &err) != 0) fail_msg("make_model: %s", err.msg);
}

/* The tiny model the reference forward below is sized for. */
static void write_model(char *path, size_t cap, const char *arch, DType type,
                        int tied)
{
    write_model_dims(path, cap, arch, type, tied, 64, 96);
}


/* ---- Reference forward (double precision, no paging) ------------------ */

typedef struct {
    const Model *m;
    double      *k, *v;     // (layers, CTX, kv_dim)
} Ref;

static void row_f64(const Matrix *w, int64_t r, double *out) {
    float tmp[512];

    dequantize_row(w->type, (const char *) w->data + r * w->row_bytes, tmp,
                   w->cols);
    for (int64_t i = 0; i < w->cols; i++) out[i] = tmp[i];
}

static void matvec(const Matrix *w, const double *x, double *out) {
    double row[512];

    for (int64_t r = 0; r < w->rows; r++) {
        double s = 0;
        row_f64(w, r, row);
        for (int64_t i = 0; i < w->cols; i++) s += row[i] * x[i];
        out[r] = s;
    }
}

static void rmsnorm(double *out, const double *x, const float *w, int n,
                    float eps)
{
    double ss = 0;

    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * ss * w[i];
}

static void rope(double *v, int n_heads, int hd, int pos, const RopeParams *p)
{
    int half = p->n_rot / 2;

    for (int h = 0; h < n_heads; h++) {
        double *x = v + h * hd;

        for (int i = 0; i < half; i++) {
            double th = p->freq_scale * pos
                        * pow(p->freq_base, -2.0 * i / p->n_rot);
            int    i0 = p->mode == ROPE_NEOX ? i : 2 * i;
            int    i1 = p->mode == ROPE_NEOX ? i + half : 2 * i + 1;
            double a = x[i0], b = x[i1];

            x[i0] = a * cos(th) - b * sin(th);
            x[i1] = a * sin(th) + b * cos(th);
        }
    }
}

/* Scores as the family defines them: 1/sqrt(head_dim), or queries
 * pre-scaled (q_scale); soft-capped; over the sliding window on its
 * layers. */
static void attend(const Ref *r, int l, const double *q, int pos, double *out)
{
    const ModelConfig *c = &r->m->c;
    int                hd = c->head_dim, kvd = c->n_kv_heads * hd;
    double             att[CTX];
    double             sc = c->q_scale > 0 ? 1.0 : 1.0 / sqrt(hd);
    int                first = 0;

    if (model_layer_swa(c, l) && pos + 1 > c->n_swa) first = pos + 1 - c->n_swa;
    for (int h = 0; h < c->n_heads; h++) {
        int    kh = h / (c->n_heads / c->n_kv_heads);
        double max = -1e300, sum = 0;

        for (int p = first; p <= pos; p++) {
            const double *k = r->k + ((size_t) l * CTX + p) * kvd + kh * hd;
            double        s = 0;
            for (int i = 0; i < hd; i++) s += q[h * hd + i] * k[i];
            att[p] = s * sc;
            if (c->attn_softcap > 0) {
                att[p] = c->attn_softcap * tanh(att[p] / c->attn_softcap);
            }
            max = att[p] > max ? att[p] : max;
        }
        for (int p = first; p <= pos; p++) sum += att[p] = exp(att[p] - max);
        for (int i = 0; i < hd; i++) {
            double s = 0;
            for (int p = first; p <= pos; p++) {
                s += att[p] / sum
                     * r->v[((size_t) l * CTX + p) * kvd + kh * hd + i];
            }
            out[h * hd + i] = s;
        }
    }
}

/* ggml's gelu through f16, as kernels.h defines it (the double formula in
 * between). */
static double gelu_f16(double x) {
    double xh, g;

    if (x <= -10.0) return 0.0;
    if (x >= 10.0) return x;
    xh = f16_to_f32(f32_to_f16((float) x));
    g = 0.5 * xh * (1 + tanh(0.7978845608028654 * xh
                             * (1 + 0.044715 * xh * xh)));
    return f16_to_f32(f32_to_f16((float) g));
}

/* Q, K (into kv), V (into vr) of one token: projections, biases, per-head
 * norms, RoPE of the layer's kind, query scale. */
static void ref_qkv(const Model *m, int l, const double *xb, int pos,
                    double *q, double *kv, double *vr)
{
    const ModelConfig  *c = &m->c;
    const LayerWeights *L = &m->layers[l];
    int                 hd = c->head_dim, qd = c->n_heads * hd;
    int                 kvd = c->n_kv_heads * hd;
    const RopeParams   *rp = model_layer_swa(c, l) ? &c->rope_swa : &c->rope;

    matvec(&L->wq, xb, q);
    matvec(&L->wk, xb, kv);
    matvec(&L->wv, xb, vr);
    for (int i = 0; L->bq && i < qd; i++) q[i] += L->bq[i];
    for (int i = 0; L->bk && i < kvd; i++) kv[i] += L->bk[i];
    for (int i = 0; L->bv && i < kvd; i++) vr[i] += L->bv[i];
    for (int h = 0; L->q_norm && h < c->n_heads; h++) {
        rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->norm_eps);
    }
    for (int h = 0; L->k_norm && h < c->n_kv_heads; h++) {
        rmsnorm(kv + h * hd, kv + h * hd, L->k_norm, hd, c->norm_eps);
    }
    rope(q, c->n_heads, hd, pos, rp);
    rope(kv, c->n_kv_heads, hd, pos, rp);
    for (int i = 0; c->q_scale > 0 && i < qd; i++) q[i] *= c->q_scale;
}

/* One token through the reference; logits (n_vocab,) out. */
static void ref_token(Ref *r, int32_t tok, int pos, double *logits) {
    const Model       *m = r->m;
    const ModelConfig *c = &m->c;
    int                dim = c->dim, kvd = c->n_kv_heads * c->head_dim;
    double x[64], xb[64], q[128], att[128], o[64], g[96], u[96], kv[128];

    row_f64(&m->tok_embd, tok, x);
    for (int i = 0; i < dim; i++) x[i] *= c->embed_scale;
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &m->layers[l];
        double *kr = r->k + ((size_t) l * CTX + pos) * kvd;
        double *vr = r->v + ((size_t) l * CTX + pos) * kvd;

        rmsnorm(xb, x, L->attn_norm, dim, c->norm_eps);
        ref_qkv(m, l, xb, pos, q, kv, vr);
        memcpy(kr, kv, (size_t) kvd * sizeof(double));
        attend(r, l, q, pos, att);
        matvec(&L->wo, att, o);
        if (L->attn_post_norm) {
            rmsnorm(o, o, L->attn_post_norm, dim, c->norm_eps);
        }
        for (int i = 0; i < dim; i++) x[i] += o[i];

        rmsnorm(xb, x, L->ffn_norm, dim, c->norm_eps);
        matvec(&L->w_gate, xb, g);
        matvec(&L->w_up, xb, u);
        for (int i = 0; i < c->ffn_dim; i++) {
            g[i] = (c->geglu ? gelu_f16(g[i]) : g[i] / (1 + exp(-g[i])))
                   * u[i];
        }
        matvec(&L->w_down, g, o);
        if (L->ffn_post_norm) {
            rmsnorm(o, o, L->ffn_post_norm, dim, c->norm_eps);
        }
        for (int i = 0; i < dim; i++) x[i] += o[i];
    }
    rmsnorm(xb, x, m->output_norm, dim, c->norm_eps);
    matvec(&m->output, xb, logits);
    for (int i = 0; c->final_softcap > 0 && i < c->n_vocab; i++) {
        logits[i] = c->final_softcap * tanh(logits[i] / c->final_softcap);
    }
}


/* ---- Engine side -------------------------------------------------------- */

typedef struct {
    Backend  *be;
    KVCache   kv;
    RunState  rs;
    int32_t   table[CTX / BLOCK];
} Engine;

static void engine_init(Engine *e, const Model *m, const char *isa, int nth) {
    BackendConfig cfg = {
        .n_threads = nth, .isa = isa, .max_tokens = N_TOK,
        .max_cols = m->c.ffn_dim > m->c.dim ? m->c.ffn_dim : m->c.dim,
        .max_ctx = CTX };
    char          err[ERR_MAX];
    Err           e2;

    e->be = backend_cpu_new(&cfg, err, sizeof(err));
    if (e->be == NULL) fail_msg("backend %s: %s", isa, err);
    assert_int_equal(kv_init(&e->kv, m->c.n_layers, m->c.n_kv_heads,
                             m->c.head_dim, BLOCK, CTX / BLOCK, NULL, &e2), 0);
    assert_int_equal(runstate_init(&e->rs, &m->c, N_TOK, N_TOK, NULL, &e2), 0);
    /* a scattered block table: logical i -> physical (5 i + 3) mod n */
    for (int i = 0; i < CTX / BLOCK; i++) {
        e->table[i] = (5 * i + 3) % (CTX / BLOCK);
    }
}

static void engine_free(Engine *e) {
    e->be->free(e->be);
    kv_free(&e->kv);
    runstate_free(&e->rs);
}

/* Runs prompt[from, to) as one batch; logits of every token into out. */
static void engine_chunk(Engine *e, const Model *m, int from, int to,
                         float *out)
{
    int32_t        pos[N_TOK], idx[N_TOK];
    const int32_t *tabs[N_TOK];
    TokenBatch     b = { to - from, pos, tabs };

    for (int i = 0; i < to - from; i++) {
        pos[i] = from + i;
        tabs[i] = e->table;
        idx[i] = i;
    }
    model_forward(m, e->be, &e->kv, &e->rs, prompt + from, &b, idx, to - from);
    memcpy(out + (size_t) from * m->c.n_vocab, e->rs.logits,
           (size_t) (to - from) * m->c.n_vocab * sizeof(float));
}

/* Logits for every prompt token, prefilled in the given chunk sizes. */
static void engine_logits(const Model *m, const char *isa, int nth,
                          int chunk, float *out)
{
    Engine e;

    engine_init(&e, m, isa, nth);
    for (int i = 0; i < N_TOK; i += chunk) {
        engine_chunk(&e, m, i, i + chunk < N_TOK ? i + chunk : N_TOK, out);
    }
    engine_free(&e);
}

/* The logits of every prompt token against the reference, for the model
 * in path (removed after). */
static void check_file(const char *path, const char *arch, DType type,
                       double tol)
{
    Model   m;
    Err     err;
    Ref     r;
    float  *got;
    double *want;

    if (model_load(&m, path, GGUF_COPY, &err) != 0) {
        fail_msg("%s: %s", arch, err.msg);
    }
    r.m = &m;
    r.k = calloc((size_t) m.c.n_layers * CTX * 128, sizeof(double));
    r.v = calloc((size_t) m.c.n_layers * CTX * 128, sizeof(double));
    got = malloc((size_t) N_TOK * m.c.n_vocab * sizeof(float));
    want = malloc((size_t) m.c.n_vocab * sizeof(double));

    engine_logits(&m, "ref", 1, N_TOK, got);
    for (int t = 0; t < N_TOK; t++) {
        double num = 0, den = 0;

        ref_token(&r, prompt[t], t, want);
        for (int i = 0; i < m.c.n_vocab; i++) {
            double d = got[(size_t) t * m.c.n_vocab + i] - want[i];
            num += d * d;
            den += want[i] * want[i];
        }
        if (!(num / den < tol)) {
            fail_msg("%s %s token %d: normalized MSE %g >= %g", arch,
                     dtype_name(type), t, num / den, tol);
        }
    }
    free(r.k);
    free(r.v);
    free(got);
    free(want);
    model_free(&m);
    unlink(path);
}

static void check_against_reference(const char *arch, DType type, int tied,
                                    double tol)
{
    char  path[256];
    Model m;
    Err   err;

    write_model(path, sizeof(path), arch, type, tied);
    assert_int_equal(model_load(&m, path, GGUF_MAP, &err), 0);
    assert_true(tied ? m.output.data == m.tok_embd.data
                     : m.output.data != m.tok_embd.data);
    model_free(&m);
    check_file(path, arch, type, tol);
}

static void check_arch(const char *arch, DType type, int layers,
                       int head_dim, int swa, double tol)
{
    char path[256];

    write_model_arch(path, sizeof(path), arch, type, layers, head_dim, swa);
    check_file(path, arch, type, tol);
}

/* The newer families, with what makes each differ: qwen3's Q/K norms;
 * gemma's GeGLU, scaled embeddings and a head size that is not dim /
 * heads; gemma2's soft-capping, post norms and a window shorter than the
 * prompt on even layers; gemma3's 5:1 window pattern over 7 layers with
 * its own local RoPE base; phi3's fused matrices. GeGLU rounds gelu to
 * f16 (as ggml does), so where float and double land on either side of an
 * f16 rounding boundary the two differ by an f16 ulp: 1e-5 for them. */
static void test_families(void **state) {
    (void) state;
    check_arch("qwen3", DT_F32, 2, 0, 0, 1e-6);
    check_arch("gemma", DT_F32, 2, 24, 0, 1e-5);
    check_arch("gemma2", DT_F32, 2, 0, 4, 1e-5);
    check_arch("gemma3", DT_F32, 7, 0, 5, 1e-5);
    check_arch("gemma3", DT_Q8_0, 2, 24, 5, 1e-3);
    check_arch("phi3", DT_F32, 2, 0, 0, 1e-6);
    check_arch("phi3", DT_Q4_0, 2, 0, 0, 1e-3);
}

/* Quantized weights are compared against their own dequantized values, so
 * the only differences are activation quantization (q8_0 rows for
 * quantized weights) and the f16 KV cache. */
static void test_llama_all_types(void **state) {
    (void) state;
    check_against_reference("llama", DT_F32, 0, 1e-6);
    check_against_reference("llama", DT_F16, 0, 1e-6);
    check_against_reference("llama", DT_BF16, 0, 1e-6);
    check_against_reference("llama", DT_Q8_0, 0, 1e-3);
    check_against_reference("llama", DT_Q4_0, 0, 1e-3);
}

static void test_qwen2_and_tied(void **state) {
    (void) state;
    check_against_reference("qwen2", DT_F32, 0, 1e-6);
    check_against_reference("qwen2", DT_Q8_0, 0, 1e-3);
    check_against_reference("llama", DT_F16, 1, 1e-6);
}

/* Same bits for a token whatever batch it was computed in, for every
 * kernel set and thread count. */
static void check_invariance_of(const char *arch, DType type) {
    static const char *isas[] = { "ref", "avx2", "avx512" };
    char   path[256];
    Model  m;
    Err    err;
    size_t n;
    float *base, *other;

    if (strcmp(arch, "llama") == 0) {
        write_model(path, sizeof(path), arch, type, 0);
    } else {
        write_model_arch(path, sizeof(path), arch, type, 2, 0, 4);
    }
    assert_int_equal(model_load(&m, path, GGUF_MAP, &err), 0);
    n = (size_t) N_TOK * m.c.n_vocab;
    base = malloc(n * sizeof(float));
    other = malloc(n * sizeof(float));
    for (size_t s = 0; s < sizeof(isas) / sizeof(isas[0]); s++) {
        BackendConfig cfg = { .n_threads = 1, .isa = isas[s],
        .max_tokens = 1, .max_cols = 128, .max_ctx = CTX };
        char          e[ERR_MAX];
        Backend      *probe = backend_cpu_new(&cfg, e, sizeof(e));

        if (probe == NULL) continue;        /* not on this CPU/build */
        probe->free(probe);
        engine_logits(&m, isas[s], 1, N_TOK, base);
        for (int chunk = 1; chunk <= 4; chunk++) {
            for (int nth = 1; nth <= 3; nth++) {
                engine_logits(&m, isas[s], nth, chunk, other);
                if (memcmp(base, other, n * sizeof(float)) != 0) {
                    fail_msg("%s %s %s: chunk %d, %d threads differs from "
                             "one batch", arch, isas[s], dtype_name(type),
                             chunk, nth);
                }
            }
        }
    }
    free(base);
    free(other);
    model_free(&m);
    unlink(path);
}

static void check_invariance(DType type) {
    check_invariance_of("llama", type);
}

static void test_batch_invariance(void **state) {
    (void) state;
    /* GeGLU, soft-capping and windows that start mid-block; fused views */
    check_invariance_of("gemma2", DT_F32);
    check_invariance_of("phi3", DT_Q8_0);
    check_invariance(DT_F32);
    check_invariance(DT_F16);
    check_invariance(DT_BF16);
    check_invariance(DT_Q8_0);
    check_invariance(DT_Q4_0);
}

/* A copied model repacked for the best kernel set (WL_X16 where it has
 * one) gives the logits of the same file mapped and read as stored, and
 * is itself batch and thread invariant bit for bit. The two differ in
 * float summation order only, but a last-bit difference can flip the
 * rounding of a quantized activation, which these random weights amplify:
 * ref.c and avx512 on the same stored rows differ by up to 2e-4 here, so
 * the bound is the one quantized types get against the reference. dim
 * 576 and ffn 1120 make rows of 18 and 35 blocks: groups and tails; tied
 * covers embed reading a repacked table. */
static void check_repacked(DType type, int tied) {
    char     path[256];
    Model    mm, mc;
    Err      err;
    size_t   n;
    float   *want, *base, *other;
    char     e[ERR_MAX];
    BackendConfig cfg = { .n_threads = 1, .isa = "auto",
        .max_tokens = 1, .max_cols = 1120, .max_ctx = CTX };
    Backend *be;
    double   num = 0, den = 0;

    write_model_dims(path, sizeof(path), "llama", type, tied, 576, 1120);
    assert_int_equal(model_load(&mm, path, GGUF_MAP, &err), 0);
    assert_int_equal(model_load(&mc, path, GGUF_COPY, &err), 0);
    assert_true(mc.gguf.writable);
    be = backend_cpu_new(&cfg, e, sizeof(e));
    assert_non_null(be);
    model_repack(&mm, be);                  /* mapped: stays as stored */
    model_repack(&mc, be);
    assert_false(mc.gguf.writable);
    assert_int_equal(mm.layers[0].w_down.layout, WL_ROWS);
    if (strcmp(be->name, "avx512") == 0) {
        assert_int_equal(mc.layers[1].w_down.layout, WL_X16);
        assert_int_equal(mc.output.layout, WL_X16);
        assert_int_equal(mc.tok_embd.layout, tied ? WL_X16 : WL_ROWS);
    }
    be->free(be);

    n = (size_t) N_TOK * mm.c.n_vocab;
    want = malloc(n * sizeof(float));
    base = malloc(n * sizeof(float));
    other = malloc(n * sizeof(float));
    engine_logits(&mm, "auto", 1, N_TOK, want);
    engine_logits(&mc, "auto", 1, N_TOK, base);
    for (size_t i = 0; i < n; i++) {
        num += ((double) base[i] - want[i]) * ((double) base[i] - want[i]);
        den += (double) want[i] * want[i];
    }
    if (!(num / den < 1e-3)) {
        fail_msg("repacked %s: normalized MSE %g", dtype_name(type), num / den);
    }
    for (int chunk = 1; chunk <= 4; chunk++) {
        for (int nth = 1; nth <= 3; nth++) {
            engine_logits(&mc, "auto", nth, chunk, other);
            if (memcmp(base, other, n * sizeof(float)) != 0) {
                fail_msg("repacked %s: chunk %d, %d threads differs from one "
                         "batch", dtype_name(type), chunk, nth);
            }
        }
    }
    free(want);
    free(base);
    free(other);
    model_free(&mm);
    model_free(&mc);
    unlink(path);
}

static void test_repacked(void **state) {
    (void) state;
    check_repacked(DT_Q8_0, 0);
    check_repacked(DT_Q4_0, 0);
    check_repacked(DT_Q8_0, 1);
}

/* Writes a header-only llama GGUF with the given tensors (data zeroed). */
static void write_bad(const char *path, const char *arch, bool hparams,
                      int n_t, const char *const *names, const uint32_t *types,
                      const int64_t (*ne)[2])
{
    GGUFWriter w;
    FILE      *f = fopen(path, "wb");
    Err        err;
    static char zeros[1 << 18];

    assert_non_null(f);
    gguf_writer_init(&w);
    gguf_writer_str(&w, "general.architecture", arch);
    if (hparams) {
        gguf_writer_u32(&w, "llama.context_length", 64);
        gguf_writer_u32(&w, "llama.embedding_length", 64);
        gguf_writer_u32(&w, "llama.block_count", 1);
        gguf_writer_u32(&w, "llama.feed_forward_length", 96);
        gguf_writer_u32(&w, "llama.attention.head_count", 4);
    }
    for (int i = 0; i < n_t; i++) {
        gguf_writer_tensor(&w, names[i], types[i], 2, ne[i]);
    }
    assert_int_equal(gguf_writer_write_header(&w, f, &err), 0);
    for (int i = 0; i < n_t; i++) {
        assert_int_equal(gguf_writer_write_data(&w, f, zeros, &err), 0);
    }
    gguf_writer_free(&w);
    fclose(f);
}

static void expect_load_error(const char *path, const char *needle) {
    Model m;
    Err   err;

    assert_int_equal(model_load(&m, path, GGUF_MAP, &err), -1);
    if (strstr(err.msg, needle) == NULL || strstr(err.msg, path) == NULL) {
        fail_msg("error '%s' does not name '%s' and the file", err.msg,
                 needle);
    }
}

static void test_load_errors(void **state) {
    char                path[64];
    static const char  *emb[] = { "token_embd.weight" };
    static const int64_t ok[][2] = { { 64, 512 } }, bad[][2] = { { 32, 512 } };
    /* mxfp4 is a ggml weight type the kernels do not run; q4_K rows of 64
       are not whole super-blocks */
    static const uint32_t f32[] = { 0 }, mxfp4[] = { 39 }, q4_K[] = { 12 };

    (void) state;
    snprintf(path, sizeof(path), "/tmp/omni-test-bad-%d.gguf", (int) getpid());
    expect_load_error("/nonexistent.gguf", "No such file");
    write_bad(path, "gpt9", true, 0, NULL, NULL, NULL);
    expect_load_error(path, "architecture 'gpt9' is not supported");
    write_bad(path, "llama", false, 0, NULL, NULL, NULL);
    expect_load_error(path, "missing metadata key 'llama.context_length'");
    write_bad(path, "llama", true, 0, NULL, NULL, NULL);
    expect_load_error(path, "missing tensor 'token_embd.weight'");
    write_bad(path, "llama", true, 1, emb, mxfp4, ok);
    expect_load_error(path, "has type mxfp4, which is not supported");
    write_bad(path, "llama", true, 1, emb, q4_K, ok);
    expect_load_error(path, "tensor 'token_embd.weight' row length 64 is "
                      "not a multiple of the q4_K block size 256");
    write_bad(path, "llama", true, 1, emb, f32, bad);
    expect_load_error(path, "tensor 'token_embd.weight' has shape [32, 512");
    write_bad(path, "llama", true, 1, emb, f32, ok);
    expect_load_error(path, "missing tensor 'output_norm.weight'");
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_all_types),
        cmocka_unit_test(test_qwen2_and_tied),
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_repacked),
        cmocka_unit_test(test_load_errors),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}

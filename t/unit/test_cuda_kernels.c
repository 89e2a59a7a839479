/* test_cuda_kernels.c -- the CUDA backend (the plugin backend_new loads)
 * against the CPU backend, op by op, through the Backend table only:
 * inputs go over with upload_f32 and upload, outputs and the KV pool come
 * from alloc, results come back with to_host (argmax: the ids), and every
 * op that reads the batch runs between begin and end.
 *
 * Covered: matmul of F32, F16, BF16, Q8_0, Q4_0 (dtype.h's quantizers), n
 * 1, 3, 8, 17, 64, rows 1 .. 1003 (most not multiples of 8 or 64), cols 32
 * .. 4096; matmul_n; embed and gather of those types; rmsnorm, add,
 * add_bias, scale, swiglu, geglu, softcap (in place too); rope NORM and
 * NEOX, partial, with freq_factors, YaRN; kv_store and attention: GQA 8 on
 * 2 heads, head_dim 64/128, blocks of 16/32 shuffled in a pool whose unused
 * slots hold NaN, sequences of 1, 300, 700 positions (block boundaries,
 * the split chunk), windows, softcap; argmax: ties to the lowest id, NaN
 * never wins, -inf, -0 and +0, vocab 1 .. 151936.
 * Device invariance, bit for bit: a token's matmul and attention outputs
 * alone equal them in batches of 3, 8, 17, 64 (matmul), 8, 64 and prefill
 * chunks of 256 (attention); matmul_n equals separate calls; a decode step
 * (n == n_out: the device may record a graph and replay it) run twice and
 * at the next positions equals the step run directly (one more token).
 *
 * Tolerances, NMSE sum (a-b)^2 / sum b^2 as ggml's test-backend-ops:
 *   F32 matmul  1e-9    f32 products in another order (~1e-13); TF32
 *                       tensor cores (~1e-7) fail, on purpose
 *   F16, BF16   5e-7,   cuBLASLt rounds activations to f16/bf16 (the CPU
 *               2.5e-5  multiplies f32 ones): per product a relative error
 *                       of variance 2^-22/6 = 4e-8, 2^-16/6 = 2.5e-6; x10
 *   Q8_0, Q4_0  1e-4    the CPU quantizes activations to Q8_0 (f16 scale);
 *                       the device may too (~1e-7) or use f32 ones: the
 *                       Q8_0 rounding, (1/127)^2/12 / E[x^2] = 1.5e-5; x6
 *   rmsnorm     1e-10   a sum of squares in another order
 *   swiglu, softcap 1e-9  expf, tanhf within a few ulp (tanh.approx fails)
 *   geglu       1e-8    both round gate and gelu to f16 (kernels.h); a
 *                       last-bit tanhf difference may land on the next f16
 *   rope        1e-8    base^(-2i/n_rot) by products (ggml's CPU) or powf
 *                       (ggml's CUDA), positions < 1024: 3e-10 measured
 *   attention   5e-7    q and softmax weights rounded to f16 for tensor
 *                       cores (llama.cpp's flash attention): 7e-8
 *   decode step 1e-3    the chain of the above, against the CPU
 *   embed, gather, add, add_bias, scale, kv_store, argmax: exact.
 * Margins checked against a CPU emulation of those device choices: 5x or
 * more. Without a CUDA backend (plugin, device, driver, memory) the file
 * is one TAP skip carrying backend_new's reason. */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer the other checks stay, but the CUDA runtime maps
 * memory where ASan keeps its shadow gap, and a plugin unloaded for want
 * of a device leaves libstdc++'s emergency pool behind, which
 * LeakSanitizer would report as this program's leak. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "protect_shadow_gap=0:detect_leaks=0";
}
#endif

#define MAX_B       256         // max_tokens: the largest batch here
#define MAX_OUT     64
#define MAX_COLS    4096
#define MAX_CTX     1024        // and the length of every block table
#define N_VOCAB     151936
#define N_TABLES    64

#define TOL_F32     1e-9
#define TOL_F16     5e-7
#define TOL_BF16    2.5e-5
#define TOL_Q       1e-4
#define TOL_NORM    1e-10
#define TOL_TRANS   1e-9        // swiglu, softcap
#define TOL_GEGLU   1e-8
#define TOL_ROPE    1e-8
#define TOL_ATTN    5e-7
#define TOL_STEP    1e-3

#define FL(n) ((size_t) (n) * sizeof(float))

enum { CPU, CU };               // the two sides: bes[]


/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-amp, amp). */
static void fill(float *x, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = amp * (float) ((double) (rng_next() >> 40) / (1 << 23) - 1.0);
    }
}

static void assert_nmse(const char *what, const float *got,
                        const float *want, int64_t n, double tol)
{
    double num = 0.0, den = 0.0, e;

    for (int64_t i = 0; i < n; i++) {
        double d = (double) got[i] - (double) want[i];

        num += d * d;
        den += (double) want[i] * want[i];
    }
    e = den > 0.0 ? num / den : num;
    if (!(e <= tol)) fail_msg("%s: nmse %.3g > %.3g", what, e, tol);
}

static void assert_same_bits(const char *what, const void *a, const void *b,
                             size_t bytes)
{
    if (memcmp(a, b, bytes) != 0) fail_msg("%s: bits differ", what);
}


/* ---- the two sides' memory ---- */

static Backend *bes[2];
static void   **kept, **dev;    // host buffers, device allocs: freed at
static size_t   n_kept, n_dev;  //   teardown
static int32_t  tables[N_TABLES][MAX_CTX];
static int      n_tables;

static void *push(void ***list, size_t *n, void *p) {
    void **l = realloc(*list, (*n + 1) * sizeof(void *));

    assert_non_null(p);
    assert_non_null(l);
    l[(*n)++] = p;
    *list = l;
    return p;
}

/* Host memory that outlives the backends: upload shares the copy of a
 * matrix with the same data pointer and size, so a buffer freed and
 * reallocated at the same address would be taken for the old one. */
static float *hf(int64_t n) {
    return push(&kept, &n_kept, aligned_alloc(64, (FL(n) + 63) / 64 * 64));
}

/* bytes of side s's memory, for ops to write. */
static void *mem(int s, size_t bytes) {
    if (s == CPU) return hf((int64_t) (bytes + 3) / 4);
    return push(&dev, &n_dev, bes[CU]->alloc(bes[CU], bytes));
}

static float *buf(int s, int64_t n) {
    return mem(s, FL(n));
}

/* A private copy of x (n floats) in side s's memory, which ops may write
 * (in place): each is uploaded from a host array of its own. */
static float *put(int s, const float *x, int64_t n) {
    float       *h = hf(n);
    const float *p = h;
    char         err[256];

    memcpy(h, x, FL(n));
    if (s == CU && bes[CU]->upload_f32(bes[CU], &p, n, err, sizeof(err))) {
        fail_msg("upload_f32 of %ld floats: %s", (long) n, err);
    }
    return (float *) p;
}

/* A host copy of n floats (or 2n f16) of side s's memory at p. */
static const void *get(int s, const void *p, int64_t n) {
    float *h = hf(n);

    if (s == CPU) {
        memcpy(h, p, FL(n));
    } else {
        bes[CU]->to_host(bes[CU], h, p, n);
    }
    return h;
}

/* A (rows, cols) matrix of type t from values in [-1, 1). */
static Matrix mat_rand(DType t, int64_t rows, int64_t cols) {
    size_t rb = dtype_row_bytes(t, cols);
    char  *d = (char *) hf((int64_t) (rows * rb + 3) / 4);
    float  src[MAX_COLS];

    for (int64_t r = 0; r < rows; r++) {
        fill(src, cols, 1.0f);
        if (quantize_row(t, src, d + r * rb, cols) != 0) {
            fail_msg("no quantizer for %s", dtype_name(t));
        }
    }
    return (Matrix) { t, rows, cols, rb, d, WL_ROWS };
}

/* w as side s reads it: itself on the host, else the device's copy. */
static Matrix on(int s, Matrix w) {
    char err[256];

    if (s == CU && bes[CU]->upload(bes[CU], &w, err, sizeof(err)) != 0) {
        fail_msg("upload %s %ldx%ld: %s", dtype_name(w.type), (long) w.rows,
                 (long) w.cols, err);
    }
    return w;
}


/* ---- batches ---- */

typedef struct {
    int64_t        n, n_out;
    int32_t        tok[MAX_B], pos[MAX_B], out[MAX_OUT];
    const int32_t *bt[MAX_B];
    TokenBatch     tb;
} Batch;

/* A sequence's block table: blocks[0..nb), then block 0 up to MAX_CTX
 * entries (begin may copy a fixed stride of every table). */
static const int32_t *seq_table(const int32_t *blocks, int64_t nb) {
    int32_t *t;

    assert_true(n_tables < N_TABLES);
    t = tables[n_tables++];
    memset(t, 0, sizeof(tables[0]));
    if (nb > 0) memcpy(t, blocks, (size_t) nb * sizeof(int32_t));
    return t;
}

static void batch_add(Batch *B, int32_t tok, int32_t pos, const int32_t *bt) {
    assert_true(B->n < MAX_B);
    B->tok[B->n] = tok;
    B->pos[B->n] = pos;
    B->bt[B->n++] = bt;
}

/* Tokens t0 .. t0+m of a list, as one batch without logits; pos NULL: one
 * new sequence at positions 0 .. m-1. */
static void batch_of(Batch *B, const int32_t *pos, const int32_t **bt,
                     int64_t t0, int64_t m)
{
    const int32_t *t = pos == NULL ? seq_table(NULL, 0) : NULL;

    memset(B, 0, sizeof(*B));
    for (int64_t i = t0; i < t0 + m; i++) {
        batch_add(B, 0, pos ? pos[i] : (int32_t) i, pos ? bt[i] : t);
    }
}

/* Logits rows (n_out) < n unless the test means a decode step (a graph). */
static void b_begin(int s, Batch *B) {
    B->tb = (TokenBatch) { B->n, B->pos, B->bt };
    if (bes[s]->begin != NULL) {
        bes[s]->begin(bes[s], B->tok, &B->tb, B->out, B->n_out, 1);
    }
}

static void b_end(int s) {
    if (bes[s]->end != NULL) bes[s]->end(bes[s]);
}

/* gather on side s; a host backend without the hook: the rows copied. */
static void gather(int s, float *out, const float *x, const int32_t *idx,
                   int64_t m, int64_t dim)
{
    if (bes[s]->gather != NULL) {
        bes[s]->gather(bes[s], out, x, idx, m, dim);
        return;
    }
    for (int64_t i = 0; i < m; i++) memcpy(out + i * dim, x + idx[i] * dim,
                                           FL(dim));
}


/* ---- setup ---- */

static BackendConfig config(const char *backend) {
    return (BackendConfig) {
        .backend = backend, .n_threads = 4, .isa = "auto",
        .max_tokens = MAX_B, .max_out = MAX_OUT, .max_cols = MAX_COLS,
        .max_ctx = MAX_CTX, .block_size = 16, .n_heads = 8, .head_dim = 128,
        .n_vocab = N_VOCAB, .gpu_memory_fraction = 0.5,
    };
}

static int setup(void **state) {
    BackendConfig c = config("cpu"), g = config("cuda");
    char          err[512] = "";
    Backend      *cu;

    (void) state;
    n_tables = 0;
    bes[CPU] = backend_cpu_new(&c, err, sizeof(err));
    bes[CU] = cu = bes[CPU] ? backend_new(&g, err, sizeof(err)) : NULL;
    if (cu != NULL && (!cu->alloc || !cu->release || !cu->upload
                       || !cu->upload_f32 || !cu->begin || !cu->end
                       || !cu->gather || !cu->argmax || !cu->to_host)) {
        snprintf(err, sizeof(err), "%s lacks a device hook", cu->name);
        cu = NULL;
    }
    if (cu == NULL) fprintf(stderr, "# setup: %s\n", err);
    return cu == NULL ? -1 : 0;
}

static int teardown(void **state) {
    (void) state;
    for (size_t i = 0; i < n_dev; i++) bes[CU]->release(bes[CU], dev[i]);
    for (int s = 0; s < 2; s++) {
        if (bes[s] != NULL) bes[s]->free(bes[s]);
        bes[s] = NULL;
    }
    for (size_t i = 0; i < n_kept; i++) free(kept[i]);
    free(kept);
    free(dev);
    kept = dev = NULL;
    n_kept = n_dev = 0;
    return 0;
}


/* ---- matmul, embed, gather ---- */

static const DType types[5] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0 };

static double tol_of(DType t) {
    return t == DT_F32 ? TOL_F32 : t == DT_F16 ? TOL_F16
           : t == DT_BF16 ? TOL_BF16 : TOL_Q;
}

/* x (n, w->cols) . w^T on side s, on the host. */
static const float *matmul_on(int s, const Matrix *w, const float *x,
                              int64_t n)
{
    Matrix m = on(s, *w);
    float *o = buf(s, n * w->rows);

    bes[s]->matmul(bes[s], o, put(s, x, n * w->cols), n, &m);
    return get(s, o, n * w->rows);
}

static void test_matmul(void **state) {
    /* n, rows, cols; 67 outputs or more, so that no single near-zero dot
       product dominates the NMSE */
    static const int64_t shapes[][3] = {
        { 1, 67, 32 }, { 17, 1, 96 }, { 3, 200, 544 }, { 8, 129, 1056 },
        { 17, 7, 4096 }, { 64, 71, 2048 }, { 64, 333, 4096 },
        { 1, 1003, 4096 },
    };

    (void) state;
    rng_state = 1;
    for (int ti = 0; ti < 5; ti++) {
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
            int64_t n = shapes[si][0], rows = shapes[si][1];
            int64_t cols = shapes[si][2];
            Matrix  w = mat_rand(types[ti], rows, cols);
            float  *x = hf(n * cols);
            char    what[64];

            fill(x, n * cols, 1.0f);
            snprintf(what, sizeof(what), "matmul %s %ldx%ldx%ld",
                     dtype_name(types[ti]), (long) n, (long) rows,
                     (long) cols);
            assert_nmse(what, matmul_on(CU, &w, x, n),
                        matmul_on(CPU, &w, x, n), n * rows,
                        tol_of(types[ti]));
        }
    }
}

/* Each of 64 rows alone equals the same row in batches of 3, 8, 17 and
 * 64, every type; matmul_n over 2 and 3 of them (Q8_0, F16, Q4_0: a fused
 * Q/K/V of three heights) equals the separate calls. */
static void test_matmul_batch(void **state) {
    static const int64_t sizes[] = { 3, 8, 17, 64 };
    static const int64_t rows[5] = { 333, 67, 200, 321, 129 };
    static const int     fused[3] = { 3, 1, 4 };
    int64_t       cols = 4096, nx = 64, n = 17;
    float        *x = hf(nx * cols), *xd, *outs[3];
    float        *o1 = buf(CU, nx * 333), *ob = buf(CU, nx * 333);
    Matrix        w[5];
    const Matrix *ws[3] = { &w[3], &w[1], &w[4] };
    const float  *alone[5];

    (void) state;
    rng_state = 3;
    fill(x, nx * cols, 1.0f);
    xd = put(CU, x, nx * cols);
    for (int ti = 0; ti < 5; ti++) {
        w[ti] = on(CU, mat_rand(types[ti], rows[ti], cols));
        for (int64_t i = 0; i < nx; i++) {
            bes[CU]->matmul(bes[CU], o1 + i * rows[ti], xd + i * cols, 1,
                            &w[ti]);
        }
        alone[ti] = get(CU, o1, nx * rows[ti]);
        for (int si = 0; si < 4; si++) {
            int64_t m = sizes[si], covered = nx / m * m;

            for (int64_t r0 = 0; r0 < covered; r0 += m) {
                bes[CU]->matmul(bes[CU], ob + r0 * rows[ti], xd + r0 * cols,
                                m, &w[ti]);
            }
            assert_same_bits(dtype_name(types[ti]),
                             get(CU, ob, covered * rows[ti]), alone[ti],
                             FL(covered * rows[ti]));
        }
    }
    for (int count = 2; count <= 3; count++) {
        for (int i = 0; i < count; i++) outs[i] = buf(CU, n * ws[i]->rows);
        bes[CU]->matmul_n(bes[CU], outs, xd, n, ws, count);
        for (int i = 0; i < count; i++) {
            assert_same_bits("matmul_n", get(CU, outs[i], n * ws[i]->rows),
                             alone[fused[i]], FL(n * ws[i]->rows));
        }
    }
}

/* 17 ids (the first and last row, repeats) embedded, 5 rows of them
 * gathered (the batch's logits rows): both the CPU's bits. */
static void test_embed_gather(void **state) {
    static const int64_t dims[] = { 172, 544, 4096 };
    static const int32_t idx[5] = { 0, 3, 4, 11, 16 };
    int64_t rows = 50, n = 17;
    Batch   B;

    (void) state;
    rng_state = 4;
    batch_of(&B, NULL, NULL, 0, n);
    for (int64_t i = 0; i < n; i++) {
        B.tok[i] = i == 0 ? 0 : i == 1 ? (int32_t) rows - 1
                   : i % 5 == 0 ? 7 : (int32_t) (rng_next() % rows);
    }
    memcpy(B.out, idx, sizeof(idx));
    B.n_out = 5;
    for (int ti = 0; ti < 5; ti++) {
        for (int di = 0; di < 3; di++) {
            int64_t      dim = dims[di];
            Matrix       w;
            const float *r[2], *g[2];

            if (dim % dtype_block(types[ti]) != 0) continue;
            w = mat_rand(types[ti], rows, dim);
            for (int s = 0; s < 2; s++) {
                Matrix m = on(s, w);
                float *o = buf(s, n * dim), *og = buf(s, 5 * dim);

                b_begin(s, &B);
                bes[s]->embed(bes[s], o, &m, B.tok, n);
                gather(s, og, o, B.out, 5, dim);
                b_end(s);
                r[s] = get(s, o, n * dim);
                g[s] = get(s, og, 5 * dim);
            }
            assert_same_bits(dtype_name(types[ti]), r[CU], r[CPU],
                             FL(n * dim));
            assert_same_bits("gather", g[CU], g[CPU], FL(5 * dim));
        }
    }
}


/* ---- norms, elementwise ops, rope ---- */

static void test_rmsnorm(void **state) {
    static const int64_t dims[] = { 1, 17, 64, 896, 4096 };
    int64_t n = 17;

    (void) state;
    rng_state = 5;
    for (int di = 0; di < 5; di++) {
        int64_t      dim = dims[di];
        float       *x = hf(n * dim), *w = hf(dim);
        const float *r[2], *inplace = NULL;

        fill(x, n * dim, 3.0f);
        fill(w, dim, 1.0f);
        for (int s = 0; s < 2; s++) {
            float *xs = put(s, x, n * dim), *ws = put(s, w, dim);
            float *o = buf(s, n * dim);

            bes[s]->rmsnorm(bes[s], o, xs, ws, n, dim, 1e-5f);
            r[s] = get(s, o, n * dim);
            bes[s]->rmsnorm(bes[s], xs, xs, ws, n, dim, 1e-5f);
            inplace = get(s, xs, n * dim);
        }
        assert_nmse("rmsnorm", r[CU], r[CPU], n * dim, TOL_NORM);
        assert_same_bits("rmsnorm in place", inplace, r[CU], FL(n * dim));
    }
}

/* Over 17 rows of 1003 (an odd count). */
enum { ADD_BIAS, ADD, SCALE, SOFTCAP, SWIGLU, GEGLU, SWIGLU_IP, GEGLU_IP };

static void test_elementwise(void **state) {
    static const char *names[] = { "add_bias", "add", "scale", "softcap",
                                   "swiglu", "geglu" };
    static const double tol[] = { 0, 0, 0, TOL_TRANS, TOL_TRANS, TOL_GEGLU };
    int64_t      n = 17, dim = 1003, N = n * dim;
    float       *x = hf(N), *y = hf(N), *bias = hf(dim), *g = hf(N);
    float       *g2 = hf(N), *u = hf(N);
    const float *r[2][8];

    (void) state;
    rng_state = 6;
    fill(x, N, 1.0f);
    fill(y, N, 1.0f);
    fill(bias, dim, 1.0f);
    fill(g, N, 8.0f);
    fill(g2, N, 12.0f);             // past gelu's clamps at +-10
    fill(u, N, 1.0f);
    g[0] = -100.0f;                 // exp overflow inside silu
    g[1] = 100.0f;
    for (int s = 0; s < 2; s++) {
        Backend *be = bes[s];
        float   *X = put(s, x, N), *G = put(s, g, N), *G2 = put(s, g2, N);
        float   *U = put(s, u, N), *C = put(s, g, N), *o = buf(s, N);
        float   *o2 = buf(s, N);

        be->add_bias(be, X, put(s, bias, dim), n, dim);
        r[s][ADD_BIAS] = get(s, X, N);
        be->add(be, X, put(s, y, N), n, dim);
        r[s][ADD] = get(s, X, N);
        be->scale(be, X, N, 0.37f);
        r[s][SCALE] = get(s, X, N);
        be->softcap(be, C, N, 5.0f);
        r[s][SOFTCAP] = get(s, C, N);
        be->swiglu(be, o, G, U, N);
        r[s][SWIGLU] = get(s, o, N);
        be->geglu(be, o2, G2, U, N);
        r[s][GEGLU] = get(s, o2, N);
        be->swiglu(be, G, G, U, N);
        r[s][SWIGLU_IP] = get(s, G, N);
        be->geglu(be, G2, G2, U, N);
        r[s][GEGLU_IP] = get(s, G2, N);
    }
    for (int i = ADD_BIAS; i <= GEGLU; i++) {
        if (tol[i] == 0) {
            assert_same_bits(names[i], r[CU][i], r[CPU][i], FL(N));
        } else {
            assert_nmse(names[i], r[CU][i], r[CPU][i], N, tol[i]);
        }
    }
    assert_same_bits("swiglu in place", r[CU][SWIGLU_IP], r[CU][SWIGLU],
                     FL(N));
    assert_same_bits("geglu in place", r[CU][GEGLU_IP], r[CU][GEGLU], FL(N));
}

/* Plain, partial, linear scaling with factors, YaRN (x4 over a trained
 * 64, the ramp inside the rotated dims) with a magnitude; NORM and NEOX
 * alternately; 17 tokens of one sequence at positions up to 1002. */
static void test_rope(void **state) {
    int   heads = 8, n = 17;
    float ff[64];
    Batch B;

    (void) state;
    rng_state = 7;
    batch_of(&B, NULL, NULL, 0, n);
    for (int i = 0; i < n; i++) B.pos[i] = i * 59 + (int32_t) (rng_next() % 59);
    for (int i = 0; i < 64; i++) ff[i] = 1.0f + (float) i * 0.25f;
    for (int hd = 64; hd <= 128; hd *= 2) {
        for (int v = 0; v < 6; v++) {
            RopeParams   p = { v & 1 ? ROPE_NEOX : ROPE_NORM,
                               v < 2 ? hd : hd * 3 / 4,
                               hd == 64 ? 10000.0f : 1e6f,
                               v == 3 ? 0.5f : v >= 4 ? 0.25f : 1.0f, NULL,
                               v >= 4 ? 1.0f : 0.0f, v == 5 ? 0.9f : 1.0f,
                               32.0f, 1.0f, 64 };
            int64_t      N = (int64_t) n * heads * hd;
            float       *x = hf(N);
            const float *r[2];
            char         what[48];

            fill(x, N, 1.0f);
            for (int s = 0; s < 2; s++) {
                RopeParams ps = p;
                float     *X = put(s, x, N);

                if (v == 2 || v == 3) ps.freq_factors = put(s, ff, hd / 2);
                b_begin(s, &B);
                bes[s]->rope(bes[s], X, n, heads, hd, B.pos, &ps);
                b_end(s);
                r[s] = get(s, X, N);
            }
            snprintf(what, sizeof(what), "rope hd %d variant %d", hd, v);
            assert_nmse(what, r[CU], r[CPU], N, TOL_ROPE);
        }
    }
}


/* ---- KV cache and attention ---- */

/* A pool of n_blocks blocks on side s, every slot NaN (reading one by
 * mistake poisons the result), written by kv_store: the interface has no
 * other way to fill memory from alloc. */
static KVLayer kv_new(int s, int kvh, int hd, int bs, int64_t n_blocks) {
    size_t  bytes = (size_t) n_blocks * kvh * bs * hd * 2;
    KVLayer kv = { kvh, hd, bs, n_blocks, mem(s, bytes), mem(s, bytes) };
    int64_t per = MAX_CTX / bs, nn = (int64_t) MAX_B * kvh * hd;
    float  *nan_h = hf(nn), *nan_d;
    int32_t blocks[MAX_CTX];
    Batch   B;

    for (int64_t i = 0; i < nn; i++) nan_h[i] = NAN;
    nan_d = put(s, nan_h, nn);
    for (int64_t b0 = 0; b0 < n_blocks; b0 += per) {    // per table
        int64_t        nb = n_blocks - b0 < per ? n_blocks - b0 : per;
        const int32_t *t;

        for (int64_t i = 0; i < nb; i++) blocks[i] = (int32_t) (b0 + i);
        t = seq_table(blocks, nb);
        for (int64_t p0 = 0; p0 < nb * bs; p0 += MAX_B) {
            memset(&B, 0, sizeof(B));
            for (int64_t p = p0; p < nb * bs && p < p0 + MAX_B; p++) {
                batch_add(&B, 0, (int32_t) p, t);
            }
            b_begin(s, &B);
            bes[s]->kv_store(bes[s], &kv, nan_d, nan_d, &B.tb);
            b_end(s);
        }
    }
    return kv;
}

typedef struct {
    int   hd, bs;
    int   window;       // AttnParams's, 0 = none
    float softcap;      //   and 0 = none
} AttnShape;

#define ATT_N 1001      // tokens: sequences of 1, 300 and 700

static void attn_case(AttnShape sh) {
    static const int64_t ms[3] = { 1, 8, 64 }, strides[3] = { 5, 43, 323 };
    int            heads = 8, kvh = 2, hd = sh.hd, bs = sh.bs;
    int            lens[3] = { 1, 300, 700 };
    int64_t        n = ATT_N, qd = (int64_t) heads * hd, kvd = kvh * hd;
    int64_t        nblk = 3, b = 0, t = 0;
    int32_t        perm[ATT_N + 3], pos[ATT_N];
    const int32_t *bt[ATT_N], *tab[3];
    float         *q = hf(n * qd), *k = hf(n * kvd), *v = hf(n * kvd);
    float         *Q = NULL, *ob = buf(CU, 64 * qd);
    const float   *r[2];
    const uint16_t *kh[2], *vh[2];
    KVLayer        kv[2];
    AttnParams     ap = { 0.3f, sh.softcap, sh.window };
    Batch          B;

    n_tables = 0;
    for (int s = 0; s < 3; s++) nblk += (lens[s] + bs - 1) / bs;
    for (int64_t i = 0; i < nblk; i++) perm[i] = (int32_t) i;
    for (int64_t i = nblk - 1; i > 0; i--) {            // shuffled blocks
        int64_t j = (int64_t) (rng_next() % (uint64_t) (i + 1));
        int32_t tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int s = 0; s < 3; s++) {
        tab[s] = seq_table(perm + b, (lens[s] + bs - 1) / bs);
        b += (lens[s] + bs - 1) / bs;
    }
    for (int p = 0; t < n; p++) {       // interleaved, in position order
        for (int s = 0; s < 3; s++) {
            if (p < lens[s]) {
                pos[t] = p;
                bt[t++] = tab[s];
            }
        }
    }
    fill(q, n * qd, 1.0f);
    fill(k, n * kvd, 1.0f);
    fill(v, n * kvd, 1.0f);
    for (int s = 0; s < 2; s++) {       // in prefill chunks of MAX_B
        float  *K = put(s, k, n * kvd), *V = put(s, v, n * kvd);
        float  *O = buf(s, n * qd);
        int64_t halves = nblk * kvd * bs / 2;   // the pool as floats

        kv[s] = kv_new(s, kvh, hd, bs, nblk);
        Q = put(s, q, n * qd);
        for (int64_t c0 = 0; c0 < n; c0 += MAX_B) {
            batch_of(&B, pos, bt, c0, n - c0 < MAX_B ? n - c0 : MAX_B);
            b_begin(s, &B);
            bes[s]->kv_store(bes[s], &kv[s], K + c0 * kvd, V + c0 * kvd,
                             &B.tb);
            bes[s]->attention(bes[s], O + c0 * qd, Q + c0 * qd, heads,
                              &kv[s], &B.tb, &ap);
            b_end(s);
        }
        r[s] = get(s, O, n * qd);
        kh[s] = get(s, kv[s].k, halves);
        vh[s] = get(s, kv[s].v, halves);
    }
    assert_nmse("attention", r[CU], r[CPU], n * qd, TOL_ATTN);
    for (t = 0; t < n; t++) {           // the stored slots, bit for bit
        for (int g = 0; g < kvh; g++) {
            size_t off = (((size_t) bt[t][pos[t] / bs] * kvh + g) * bs
                          + (size_t) pos[t] % bs) * hd;

            assert_same_bits("kv_store k", kh[CU] + off, kh[CPU] + off,
                             (size_t) hd * 2);
            assert_same_bits("kv_store v", vh[CU] + off, vh[CPU] + off,
                             (size_t) hd * 2);
        }
    }
    /* on the device (Q is its copy): every 5th token alone, and batches
       of 8 and 64, against the chunks of 256 above */
    for (int i = 0; i < 3; i++) {
        for (t = 0; t + ms[i] <= n; t += strides[i]) {
            batch_of(&B, pos, bt, t, ms[i]);
            b_begin(CU, &B);
            bes[CU]->attention(bes[CU], ob, Q + t * qd, heads, &kv[CU],
                               &B.tb, &ap);
            b_end(CU);
            assert_same_bits(i == 0 ? "attention alone" : "attention batch",
                             get(CU, ob, ms[i] * qd), r[CU] + t * qd,
                             FL(ms[i] * qd));
        }
    }
}

static void test_attention(void **state) {
    /* plain at both widths and block sizes; sliding windows starting
       mid-block, one shorter than a block; soft-capping, alone and with
       a window */
    static const AttnShape shapes[] = {
        { 64, 16, 0, 0.0f }, { 128, 16, 0, 0.0f }, { 128, 32, 0, 0.0f },
        { 64, 16, 37, 0.0f }, { 128, 32, 300, 0.0f }, { 64, 16, 5, 0.0f },
        { 64, 16, 0, 2.0f }, { 128, 16, 100, 1.5f },
    };

    (void) state;
    rng_state = 8;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        attn_case(shapes[i]);
    }
}


/* ---- argmax ---- */

/* The lowest id among the highest values; NaN never wins. */
static int32_t argmax_ref(const float *x, int64_t n) {
    int64_t best = -1;

    for (int64_t i = 0; i < n; i++) {
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    }
    return best < 0 ? 0 : (int32_t) best;
}

/* Rows: random; the max three times; NaN at 0 and every 97th; NaN but the
 * last; all -inf; +inf twice after a NaN; all equal; -0 before +0 as the
 * max. */
static void test_argmax(void **state) {
    static const int64_t vocabs[] = { 1, 7, 1000, 32000, N_VOCAB };

    (void) state;
    rng_state = 10;
    for (int vi = 0; vi < 5; vi++) {
        int64_t V = vocabs[vi];
        float  *L = hf(8 * V), *r;
        int32_t ids[8];

        fill(L, 8 * V, 10.0f);
        r = L + V;
        r[V / 3] = r[V / 2] = r[V - 1] = 11.0f;
        for (int64_t i = V > 1 ? 0 : 1; i < V; i += 97) L[2 * V + i] = NAN;
        for (int64_t i = 0; i < V; i++) {
            L[3 * V + i] = i == V - 1 ? -5.0f : NAN;
            L[4 * V + i] = -INFINITY;
            L[6 * V + i] = 0.5f;
            L[7 * V + i] = -1.0f - (float) (i % 3);
        }
        r = L + 5 * V;
        r[0] = V > 2 ? NAN : r[0];
        r[V / 2] = r[V - 1] = INFINITY;
        r = L + 7 * V;
        r[V / 2] = 0.0f;
        r[V / 3] = -0.0f;
        bes[CU]->argmax(bes[CU], ids, put(CU, L, 8 * V), 8, V);
        for (int i = 0; i < 8; i++) {
            if (ids[i] != argmax_ref(L + i * V, V)) {
                fail_msg("argmax vocab %ld row %d: %d, not %d", (long) V, i,
                         ids[i], argmax_ref(L + i * V, V));
            }
        }
    }
}


/* ---- a decode step: graph replay equals direct execution ---- */

#define DIM   256               // 4 heads of 64 on 2 KV heads
#define VOCAB 1000

enum { EMB, WQ, WK, WV, WO, OUT };

/* One side's weights and buffers for a one-layer step of up to 5 tokens. */
typedef struct {
    Matrix  w[6];
    float  *nw, *x, *h, *q, *k, *v, *o, *y, *xo, *lg;
    KVLayer kv;
} Step;

static const float *step(int s, Step *S, Batch *B, int32_t *ids) {
    Backend      *be = bes[s];
    int64_t       n = B->n, m = B->n_out;
    float        *qkv[3] = { S->q, S->k, S->v };
    const Matrix *ws[3] = { &S->w[WQ], &S->w[WK], &S->w[WV] };
    RopeParams    rp = { ROPE_NEOX, 64, 10000.0f, 1.0f, NULL, 0.0f, 1.0f,
                         32.0f, 1.0f, 0 };
    AttnParams    ap = { 0.125f, 0.0f, 0 };
    const float  *lg;

    b_begin(s, B);
    be->embed(be, S->x, &S->w[EMB], B->tok, n);
    be->rmsnorm(be, S->h, S->x, S->nw, n, DIM, 1e-6f);
    be->matmul_n(be, qkv, S->h, n, ws, 3);
    be->rope(be, S->q, n, 4, 64, B->pos, &rp);
    be->rope(be, S->k, n, 2, 64, B->pos, &rp);
    be->kv_store(be, &S->kv, S->k, S->v, &B->tb);
    be->attention(be, S->o, S->q, 4, &S->kv, &B->tb, &ap);
    be->matmul(be, S->y, S->o, n, &S->w[WO]);
    be->add(be, S->x, S->y, n, DIM);
    gather(s, S->xo, S->x, B->out, m, DIM);
    be->rmsnorm(be, S->xo, S->xo, S->nw, m, DIM, 1e-6f);
    be->matmul(be, S->lg, S->xo, m, &S->w[OUT]);
    b_end(s);
    lg = get(s, S->lg, m * VOCAB);
    for (int64_t i = 0; i < m; i++) ids[i] = argmax_ref(lg + i * VOCAB, VOCAB);
    if (be->argmax != NULL) be->argmax(be, ids, S->lg, m, VOCAB);
    return lg;
}

/* Four sequences with 0, 5, 40 and 300 positions stored decode three
 * steps. Each runs on the device as a decode batch (n == n_out == 4)
 * twice, the first time recorded and every later one replayed at new
 * positions and tokens, then directly with a fifth token (a sequence of
 * its own) that gets no logits: the same logits and ids, bit for bit, and
 * close to the CPU's. */
static void test_graph(void **state) {
    static const int     lens[4] = { 0, 5, 40, 300 };
    static const DType   wt[6] = { DT_Q8_0, DT_F16, DT_BF16, DT_Q4_0,
                                   DT_F32, DT_Q8_0 };
    static const int64_t wr[6] = { VOCAB, 256, 128, 128, DIM, VOCAB };
    static const int64_t sz[9] = { 5 * DIM, 5 * DIM, 5 * 256, 5 * 128,
                                   5 * 128, 5 * 256, 5 * DIM, 4 * DIM,
                                   4 * VOCAB };
    Matrix         w[6];
    Step           S[2];
    const int32_t *tab[5];
    int32_t        blocks[MAX_CTX];
    int64_t        nb = 0;
    float         *nw = hf(DIM), *kh = hf(300 * 128), *vh = hf(300 * 128);

    (void) state;
    rng_state = 11;
    for (int i = 0; i < 6; i++) w[i] = mat_rand(wt[i], wr[i], DIM);
    fill(nw, DIM, 1.0f);
    for (int i = 0; i < 5; i++) {       // room for 3 steps after the stored
        int64_t need = (i < 4 ? lens[i] : 0) / 16 + 1;

        for (int64_t j = 0; j < need; j++) blocks[j] = (int32_t) (nb + j);
        tab[i] = seq_table(blocks, need);
        nb += need;
    }
    for (int s = 0; s < 2; s++) {
        Step   *P = &S[s];
        float **bufs[9] = { &P->x, &P->h, &P->q, &P->k, &P->v, &P->o,
                            &P->y, &P->xo, &P->lg };

        for (int i = 0; i < 6; i++) P->w[i] = on(s, w[i]);
        for (int i = 0; i < 9; i++) *bufs[i] = buf(s, sz[i]);
        P->nw = put(s, nw, DIM);
        P->kv = kv_new(s, 2, 64, 16, nb);
    }
    for (int i = 1; i < 4; i++) {       // the stored contexts
        fill(kh, lens[i] * 128, 1.0f);
        fill(vh, lens[i] * 128, 1.0f);
        for (int p0 = 0; p0 < lens[i]; p0 += MAX_B) {
            int   m = lens[i] - p0 < MAX_B ? lens[i] - p0 : MAX_B;
            Batch B = { 0 };

            for (int p = p0; p < p0 + m; p++) batch_add(&B, 0, p, tab[i]);
            for (int s = 0; s < 2; s++) {
                float *K = put(s, kh + p0 * 128, m * 128);
                float *V = put(s, vh + p0 * 128, m * 128);

                b_begin(s, &B);
                bes[s]->kv_store(bes[s], &S[s].kv, K, V, &B.tb);
                b_end(s);
            }
        }
    }
    for (int st = 0; st < 3; st++) {
        Batch        G = { 0 }, D;
        int32_t      ids[3][4], idc[4];
        const float *lg[3], *lc;
        char         what[48];

        for (int i = 0; i < 4; i++) {
            batch_add(&G, (int32_t) (rng_next() % VOCAB), lens[i] + st,
                      tab[i]);
            G.out[i] = i;
        }
        G.n_out = 4;
        D = G;
        batch_add(&D, 7, st, tab[4]);
        lg[0] = step(CU, &S[CU], &G, ids[0]);
        lg[1] = step(CU, &S[CU], &G, ids[1]);
        lg[2] = step(CU, &S[CU], &D, ids[2]);
        lc = step(CPU, &S[CPU], &D, idc);
        snprintf(what, sizeof(what), "decode step %d", st);
        for (int i = 1; i < 3; i++) {
            assert_same_bits(what, lg[i], lg[0], FL(4 * VOCAB));
            assert_same_bits(what, ids[i], ids[0], sizeof(ids[0]));
        }
        for (int i = 0; i < 4; i++) {
            assert_int_equal(ids[0][i], argmax_ref(lg[0] + i * VOCAB, VOCAB));
        }
        assert_nmse(what, lg[0], lc, 4 * VOCAB, TOL_STEP);
    }
}


/* ---- main ---- */

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(test_matmul), T(test_matmul_batch),
        T(test_embed_gather), T(test_rmsnorm), T(test_elementwise),
        T(test_rope), T(test_attention), T(test_argmax), T(test_graph),
#undef T
    };
    BackendConfig cfg = config("cuda");
    char          err[512] = "";
    Backend      *be;

    use_built_cuda_plugin();
    be = backend_new(&cfg, err, sizeof(err));

    if (be == NULL) {
        for (char *c = err; *c != '\0'; c++) *c = *c == '\n' ? ' ' : *c;
        fprintf(stderr, "backend_new(cuda): %s\n", err);
        printf("1..0 # SKIP no CUDA backend: %s\n", err);
        return 0;
    }
    printf("# device backend: %s\n", be->name);
    be->free(be);
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("cuda_kernels", tests, NULL, NULL);
}

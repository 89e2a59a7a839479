/* test_kernels.c -- the CPU kernels (kernels/cpu/) on the matmul path:
 * every CpuVec table against ref.c, and every backend op against a plain
 * double-precision reference, for each instruction set this CPU has.
 * test_kernels_ops.c does the same for the other kernels (attention,
 * elementwise, norms, rope, swiglu); kernels_util.h holds what both use.
 *
 * Inputs come from one fixed seed. Sizes cover 1, the vector widths -1/0/+1
 * (8 and 16 floats, 32 and 64 quantized elements), the tiny model's odd
 * shapes (dim 64, ffn 172, head_dim 8) and rows longer than a K block.
 * Results are compared by normalized MSE, sum (a-b)^2 / sum b^2, as ggml's
 * test-backend-ops does; conversions that must be exact (f16, Q8_0
 * activation quantization, dequantization, embedding rows) are compared
 * bit for bit.
 *
 * The batch invariance contract of kernels.h is checked bit for bit: a row
 * of a batch of n = 1..70 and 512 equals that row computed alone, for every
 * weight type, and 1, 2 and 3 threads agree; matmul_n equals separate
 * matmuls. An ISA the CPU (or the build) lacks is reported as one TAP skip
 * with the reason. */

#include "kernels_util.h"

#define N_TYPES 15
#define N_KINDS 17

static const DType types[N_TYPES] = {
    DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1,
    DT_Q2_K, DT_Q3_K, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_IQ4_NL, DT_IQ4_XS,
};

/* The weight forms a matmul reads: every type as stored, then the
 * quantized ones repacked (WL_X16), which only some tables read. */
typedef struct {
    DType   type;
    WLayout layout;
} Kind;

static const Kind kinds[N_KINDS] = {
    { DT_F32, WL_ROWS }, { DT_F16, WL_ROWS }, { DT_BF16, WL_ROWS },
    { DT_Q8_0, WL_ROWS }, { DT_Q4_0, WL_ROWS },
    { DT_Q8_0, WL_X16 }, { DT_Q4_0, WL_X16 },
    { DT_Q4_1, WL_ROWS }, { DT_Q5_0, WL_ROWS }, { DT_Q5_1, WL_ROWS },
    { DT_Q2_K, WL_ROWS }, { DT_Q3_K, WL_ROWS }, { DT_Q4_K, WL_ROWS },
    { DT_Q5_K, WL_ROWS }, { DT_Q6_K, WL_ROWS }, { DT_IQ4_NL, WL_ROWS },
    { DT_IQ4_XS, WL_ROWS },
};

/* Weight types dtype.c cannot write (llama-quantize does): their test
 * matrices are random blocks, every byte random but the f16 scales, kept
 * finite and moderate (about 1 / the largest integer product, so weights
 * are of order 1). d is positive; m signed (Q4_1, Q5_1), dmin positive. */
#define NO_M ((size_t) -1)

static const struct {
    DType  t;
    size_t d_off, m_off;
    float  d_amp, m_amp;
} rand_specs[] = {
    { DT_Q4_1, offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m), 1.0f / 8, 1 },
    { DT_Q5_0, offsetof(BlockQ5_0, d), NO_M, 1.0f / 16, 0 },
    { DT_Q5_1, offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m), 1.0f / 32, 1 },
    { DT_Q2_K, offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin),
      1.0f / 45, 1.0f / 15 },
    { DT_Q3_K, offsetof(BlockQ3_K, d), NO_M, 1.0f / 128, 0 },
    { DT_Q4_K, offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin),
      1.0f / 945, 1.0f / 63 },
    { DT_Q5_K, offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin),
      1.0f / 1953, 1.0f / 63 },
    { DT_Q6_K, offsetof(BlockQ6_K, d), NO_M, 1.0f / 4096, 0 },
    { DT_IQ4_NL, offsetof(BlockIQ4_NL, d), NO_M, 1.0f / 128, 0 },
    { DT_IQ4_XS, offsetof(BlockIQ4_XS, d), NO_M, 1.0f / 4096, 0 },
};

static void put_f16(void *p, float f) {
    uint16_t h = f32_to_f16(f);

    memcpy(p, &h, 2);
}

/* Fills a row of n elements of type t (one of rand_specs) with random
 * blocks. */
static void rand_row(DType t, void *row, int64_t n) {
    size_t bs = dtype_row_bytes(t, dtype_block(t)), i = 0;

    while (rand_specs[i].t != t) i++;
    for (int64_t b = 0; b < n / dtype_block(t); b++) {
        uint8_t *blk = (uint8_t *) row + (size_t) b * bs;

        for (size_t j = 0; j < bs; j++) blk[j] = (uint8_t) rng_next();
        put_f16(blk + rand_specs[i].d_off,
                rand_specs[i].d_amp * (0.25f + 0.75f * fabsf(rng_f())));
        if (rand_specs[i].m_off == NO_M) continue;
        put_f16(blk + rand_specs[i].m_off, rand_specs[i].m_amp
                * (t == DT_Q4_1 || t == DT_Q5_1 ? rng_f() : fabsf(rng_f())));
    }
}

static bool quantized(DType t) {
    return dtype_block(t) > 1;
}

/* The activation form ggml's vec_dot reads for weight type t, which
 * ref.c's gemm reads. */
static DType x_form_of(DType t) {
    return cpu_vec_ref.mm[vec_slot(t, WL_ROWS)].x_form;
}

/* Quantizes a row of k activations to form f as the backend does. */
static void x_quantize(DType f, const float *x, void *y, int64_t k) {
    if (f == DT_Q8_0) {
        cpu_vec_ref.quantize_q8_0(x, y, k);
    } else {
        assert_int_equal(quantize_row(f, x, y, k), 0);
    }
}


/* ---- weight matrices and activations ---- */

/* A weight matrix of random values in type t, with its f32 values. */
typedef struct {
    Matrix  m;
    void   *data;
    void   *plain;          // the rows as stored (WL_ROWS): data, or a copy
                            //   once data is repacked
    float  *deq;            // (rows, cols) dequantized
} TestMat;

static void mat_make(TestMat *tm, DType t, int64_t rows, int64_t cols) {
    float  *src = xmalloc((size_t) cols * sizeof(float));
    size_t  rb = dtype_row_bytes(t, cols);
    char   *d = xmalloc((size_t) rows * rb);

    tm->deq = xmalloc((size_t) (rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        void *row = d + r * rb;

        fill(src, cols, 1.0f);
        if (quantize_row(t, src, row, cols) != 0) rand_row(t, row, cols);
        dequantize_row(t, row, tm->deq + r * cols, cols);
    }
    tm->data = d;
    tm->plain = d;
    tm->m = (Matrix) { t, rows, cols, rb, d, WL_ROWS };
    free(src);
}

/* Gives tm the layout l: repacked through be (the path the engine takes),
 * or with be NULL by dtype.c directly (table tests have no backend).
 * plain keeps the stored rows for ref.c. */
static void mat_layout(TestMat *tm, WLayout l, Backend *be) {
    size_t bytes = (size_t) tm->m.rows * tm->m.row_bytes;

    if (l == WL_ROWS) return;
    tm->plain = xmalloc(bytes);
    memcpy(tm->plain, tm->data, bytes);
    if (be != NULL) {
        be->repack(be, &tm->m);
        return;
    }
    for (int64_t r = 0; r < tm->m.rows; r++) {
        x16_pack_row(tm->m.type, (char *) tm->data + r * tm->m.row_bytes,
                     tm->m.cols);
    }
    tm->m.layout = l;
}

static void mat_free(TestMat *tm) {
    if (tm->plain != tm->data) free(tm->plain);
    free(tm->data);
    free(tm->deq);
}

/* True when table v reads kind k (its own gemm or ref.c's). */
static bool kind_ok(const CpuVec *v, Kind k) {
    return vec_gemm(v, vec_slot(k.type, k.layout))->gemm != NULL;
}

/* True when table v runs kind k on ref.c's gemm (vec_gemm's fallback). */
static bool kind_ref(const CpuVec *v, Kind k) {
    int s = vec_slot(k.type, k.layout);

    return v != &cpu_vec_ref && vec_gemm(v, s) == &cpu_vec_ref.mm[s];
}

static const char *kind_name(Kind k) {
    if (k.layout == WL_ROWS) return dtype_name(k.type);
    return k.type == DT_Q8_0 ? "q8_0/x16" : "q4_0/x16";
}

/* The values a matmul of type t really multiplies: quantized weight types
 * quantize the activations to their form first (x_form_of). */
static void x_effective(DType t, const float *x, float *y, int64_t n,
                        int64_t cols)
{
    DType f = x_form_of(t);
    void *q;

    if (f == DT_F32) {
        memcpy(y, x, (size_t) (n * cols) * sizeof(float));
        return;
    }
    q = xmalloc(dtype_row_bytes(f, cols));
    for (int64_t r = 0; r < n; r++) {
        x_quantize(f, x + r * cols, q, cols);
        dequantize_row(f, q, y + r * cols, cols);
    }
    free(q);
}

/* Q4_1 and Q5_1 multiply a block's min by the activations' s, d * sum q
 * rounded to f16: what they compute exactly is the dot of the dequantized
 * rows plus m * (s - d sum q) per block. Returns that term for weight row
 * j and activation row x. */
static double q8_1_term(const TestMat *w, int64_t j, const float *x) {
    int64_t    nb = w->m.cols / QK;
    BlockQ8_1 *q = xmalloc((size_t) nb * sizeof(BlockQ8_1));
    double     t = 0.0;

    quantize_row_q8_1_ref(x, q, w->m.cols);
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = (const char *) w->plain + j * w->m.row_bytes
                          + b * dtype_row_bytes(w->m.type, QK);
        uint16_t    m;
        int         sum = 0;

        /* m follows d in both layouts */
        memcpy(&m, blk + 2, 2);
        for (int e = 0; e < QK; e++) sum += q[b].qs[e];
        t += (double) f16_to_f32(m) * ((double) f16_to_f32(q[b].s)
             - (double) f16_to_f32(q[b].d) * sum);
    }
    free(q);
    return t;
}

static void matmul_plain(float *out, const float *x, int64_t n,
                         const TestMat *w)
{
    int64_t k = w->m.cols;
    float  *xe = xmalloc((size_t) (n * k) * sizeof(float));

    x_effective(w->m.type, x, xe, n, k);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < w->m.rows; j++) {
            double s = 0.0;

            for (int64_t e = 0; e < k; e++) {
                s += (double) xe[i * k + e] * w->deq[j * k + e];
            }
            if (x_form_of(w->m.type) == DT_Q8_1) {
                s += q8_1_term(w, j, x + i * k);
            }
            out[i * w->m.rows + j] = (float) s;
        }
    }
    free(xe);
}


/* Converts n activation rows to the form table v's gemm for weight kind
 * wk reads, as cpu_backend.c does; returns the row stride. */
static size_t x_convert(const CpuVec *v, Kind wk, const float *x, int64_t n,
                        int64_t k, char *y)
{
    const CpuGemm *g = vec_gemm(v, vec_slot(wk.type, wk.layout));
    size_t         ld;

    if (g->conv != NULL) {
        ld = g->x_bytes(k);
        for (int64_t r = 0; r < n; r++) g->conv(x + r * k, y + r * ld, k);
    } else if (g->x_form == DT_Q8_0) {
        ld = dtype_row_bytes(DT_Q8_0, k);
        for (int64_t r = 0; r < n; r++) {
            v->quantize_q8_0(x + r * k, (BlockQ8_0 *) (y + r * ld), k);
        }
    } else if (g->x_form == DT_Q8_1 || g->x_form == DT_Q8_K) {
        ld = dtype_row_bytes(g->x_form, k);
        for (int64_t r = 0; r < n; r++) x_quantize(g->x_form, x + r * k,
                                                   y + r * ld, k);
    } else if (g->x_form == DT_F16) {
        ld = (size_t) k * 2;
        for (int64_t r = 0; r < n; r++) {
            v->to_f16(x + r * k, (uint16_t *) (y + r * ld), k);
        }
    } else {
        ld = (size_t) k * 4;
        memcpy(y, x, ld * (size_t) n);
    }
    return ld;
}


/* ---- CpuVec primitives against ref.c ---- */

/* Every activation tile up to the table's, against 1..101 weight rows
 * (partial tiles, several panels) and k from 1 to past a K block: each
 * output equals the same output computed alone (one row by one row, the
 * decode path) bit for bit, and all of them are close to ref.c on the
 * stored rows. Repacked rows: no group, one, one and a tail, an odd count
 * of groups across K blocks. */
#define GW 101                  // weight rows

static void test_gemm(void **state) {
    const Isa *I = *state;
    static const int64_t ks_f[] = { 1, 7, 8, 9, 15, 16, 17, 64, 172, 1000,
                                    1040, 2112, 2113 };
    static const int64_t ks_q[] = { 32, 64, 96, 160, 1024, 1056, 2112 };
    static const int64_t ks_x[] = { 32, 480, 512, 544, 1536, 1568, 2112 };
    static const int64_t ks_k[] = { 256, 512, 768, 1024, 1536, 1792, 2048 };
    static const int     nrs[] = { 1, 2, 3, 4, 5, 8, 12, 47, 48, 49, 64, GW };
    /* activation rows per call, up to the table's mr (repacked q types
       take up to GEMM_MR_MAX and block them for L2 themselves) */
    static const int     ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 57,
                                  GEMM_MR_MAX };
    int64_t kmax = 2113;
    float  *x = xmalloc(GEMM_MR_MAX * kmax * sizeof(float));
    char   *xv = xmalloc(GEMM_MR_MAX * (size_t) kmax * 4 + 4096);
    char   *xr = xmalloc(GEMM_MR_MAX * (size_t) kmax * 4 + 4096);
    float  *want = xmalloc(GEMM_MR_MAX * GW * sizeof(float));
    float  *one = xmalloc(GEMM_MR_MAX * GW * sizeof(float));
    float  *got = xmalloc(GEMM_MR_MAX * GW * sizeof(float));

    rng_state = 1;
    fill(x, GEMM_MR_MAX * kmax, 1.0f);
    for (int ki0 = 0; ki0 < N_KINDS; ki0++) {
        Kind           wk = kinds[ki0], plain = { wk.type, WL_ROWS };
        DType          t = wk.type;
        int            s = vec_slot(t, wk.layout), sr = vec_slot(t, WL_ROWS);
        bool           q = quantized(t);
        const CpuGemm *g = vec_gemm(I->vec, s);
        const int64_t *ks = wk.layout == WL_X16 ? ks_x
                            : dtype_block(t) == QK_K ? ks_k : q ? ks_q : ks_f;
        int            nk = q ? 7 : 13, mr = g->mr;

        if (!kind_ok(I->vec, wk)) continue;
        for (int ki = 0; ki < nk; ki++) {
            int64_t k = ks[ki];
            TestMat w;
            size_t  ldv = x_convert(I->vec, wk, x, mr, k, xv);
            size_t  ldr = x_convert(&cpu_vec_ref, plain, x, mr, k, xr);
            char    what[64];

            mat_make(&w, t, GW, k);
            mat_layout(&w, wk.layout, NULL);
            snprintf(what, sizeof(what), "gemm %s k=%ld", kind_name(wk),
                     (long) k);
            cpu_vec_ref.mm[sr].gemm(k, mr, GW, xr, ldr, w.plain,
                                    w.m.row_bytes, want, GW);
            for (int i = 0; i < mr; i++) {
                for (int j = 0; j < GW; j++) {
                    g->gemm(k, 1, 1, xv + i * ldv, ldv,
                                       (char *) w.data + j * w.m.row_bytes,
                                       w.m.row_bytes, &one[i * GW + j], 1);
                }
            }
            assert_nmse(what, one, want, mr * GW, NMSE_F32);
            for (int mi = 0, m = 0; m < mr; mi++) {
                m = ms[mi] < mr ? ms[mi] : mr;

                for (size_t ni = 0; ni < sizeof(nrs) / sizeof(nrs[0]); ni++) {
                    g->gemm(k, m, nrs[ni], xv, ldv, w.data,
                                       w.m.row_bytes, got, GW);
                    for (int i = 0; i < m; i++) {
                        assert_same_bits(what, got + i * GW, one + i * GW,
                                         (size_t) nrs[ni] * sizeof(float));
                    }
                }
            }
            mat_free(&w);
        }
    }
    free(x);
    free(xv);
    free(xr);
    free(want);
    free(one);
    free(got);
}

/* Q8_0 activation quantization must match ref.c bit for bit: random
 * scales, an all-zero block, ties at .5, a negative extreme. */
static void test_quantize(void **state) {
    const Isa *I = *state;
    int64_t    k = 4096;
    float     *x = xmalloc((size_t) k * sizeof(float));
    BlockQ8_0 *a = xmalloc((size_t) (k / QK) * sizeof(BlockQ8_0));
    BlockQ8_0 *b = xmalloc((size_t) (k / QK) * sizeof(BlockQ8_0));

    rng_state = 2;
    for (int64_t i = 0; i < k; i++) {
        x[i] = rng_f() * powf(2.0f, (float) ((i / QK) % 40) - 20.0f);
    }
    memset(x + 64, 0, QK * sizeof(float));
    for (int j = 0; j < QK; j++) x[128 + j] = (float) (j - 16) * 0.5f;
    x[128] = -127.0f;
    for (int64_t n = QK; n <= k; n += n < 256 ? QK : 1024) {
        memset(a, 0x55, (size_t) (k / QK) * sizeof(BlockQ8_0));
        memset(b, 0x55, (size_t) (k / QK) * sizeof(BlockQ8_0));
        I->vec->quantize_q8_0(x, a, n);
        cpu_vec_ref.quantize_q8_0(x, b, n);
        assert_same_bits("quantize_q8_0", a, b,
                         (size_t) (n / QK) * sizeof(BlockQ8_0));
    }
    free(x);
    free(a);
    free(b);
}

/* f16 conversion is exact (round to nearest even) everywhere but NaN. */
static void test_to_f16(void **state) {
    const Isa *I = *state;
    int64_t    n = 70000;
    float     *x = xmalloc((size_t) n * sizeof(float));
    uint16_t  *a = xmalloc((size_t) n * 2), *b = xmalloc((size_t) n * 2);

    rng_state = 3;
    for (int64_t i = 0; i < n; i++) {
        /* exponents from f16-subnormal to overflow */
        x[i] = rng_f() * powf(2.0f, (float) (i % 50) - 30.0f);
    }
    x[0] = INFINITY;
    x[1] = -INFINITY;
    x[2] = 65520.0f;                /* rounds to inf */
    x[3] = 5.9604644775390625e-8f;  /* smallest subnormal */
    x[4] = -0.0f;
    for (int64_t len = 1; len <= n; len = len < 40 ? len + 1 : len * 3) {
        I->vec->to_f16(x, a, len);
        cpu_vec_ref.to_f16(x, b, len);
        assert_same_bits("to_f16", a, b, (size_t) len * 2);
    }
    free(x);
    free(a);
    free(b);
}

static void test_dequantize(void **state) {
    const Isa *I = *state;

    rng_state = 4;
    for (int ti = 0; ti < N_TYPES; ti++) {
        int64_t blk = dtype_block(types[ti]);
        int64_t k = blk == QK_K ? 5 * QK_K : 1024 + 64;
        TestMat w;
        float  *y = xmalloc((size_t) k * sizeof(float));

        mat_make(&w, types[ti], 1, k);
        for (int64_t n = blk; n <= k;
             n += blk * (n < 64 || blk == QK_K ? 1 : 31)) {
            I->vec->dequantize(types[ti], w.data, y, n);
            assert_same_bits(dtype_name(types[ti]), y, w.deq,
                             (size_t) n * sizeof(float));
        }
        free(y);
        mat_free(&w);
    }
}


/* ---- the new types' definitions, written independently ---- */

/* One block of type t to f32, written from ggml's bit layouts as its
 * dequantizers walk them (in output order, shifting masks), not as
 * dtype.c computes them (element index to bits); the float operations
 * are ggml's, so the results must agree bit for bit. */
static void deq_q4_1_5(DType t, const uint8_t *b, float *y) {
    float    d = f16_to_f32((uint16_t) (b[0] | b[1] << 8)), m = 0.0f;
    uint32_t qh = 0;
    const uint8_t *qs = b + 2;

    if (t != DT_Q5_0) {
        m = f16_to_f32((uint16_t) (b[2] | b[3] << 8));
        qs += 2;
    }
    if (t != DT_Q4_1) {
        memcpy(&qh, qs, 4);
        qs += 4;
    }
    for (int j = 0; j < 16; j++) {
        int lo = qs[j] & 15, hi = qs[j] >> 4;

        if (t != DT_Q4_1) {
            lo |= (int) ((qh >> j) << 4 & 0x10);
            hi |= (int) ((qh >> (j + 12)) & 0x10);
        }
        y[j] = t == DT_Q5_0 ? (lo - 16) * d : lo * d + m;
        y[j + 16] = t == DT_Q5_0 ? (hi - 16) * d : hi * d + m;
    }
}

static void deq_q2_3_K(DType t, const uint8_t *b, float *y) {
    const BlockQ2_K *x2 = (const BlockQ2_K *) b;
    const BlockQ3_K *x3 = (const BlockQ3_K *) b;
    const uint8_t   *q = t == DT_Q2_K ? x2->qs : x3->qs;
    int8_t           sc3[16];
    uint8_t          m = 1;
    int              is = 0;

    for (int i = 0; i < 16; i++) {         /* Q3_K: 4 + 4 bits, 2 high */
        int lo = (x3->scales[i % 8] >> (i < 8 ? 0 : 4)) & 15;

        sc3[i] = (int8_t) ((lo | ((x3->scales[8 + i % 4] >> (i / 4 * 2)) & 3)
                                 << 4) - 32);
    }
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++, is++) {
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    int v = (q[l] >> shift) & 3;

                    if (t == DT_Q2_K) {
                        float dl = f16_to_f32(x2->d) * (x2->scales[is] & 15);
                        float ml = f16_to_f32(x2->dmin) * (x2->scales[is] >> 4);

                        *y++ = dl * v - ml;
                    } else {
                        float dl = f16_to_f32(x3->d) * sc3[is];

                        *y++ = dl * (v - (x3->hmask[l] & m ? 0 : 4));
                    }
                }
            }
        }
    }
}

static void deq_q4_5_K(DType t, const uint8_t *b, float *y) {
    const BlockQ4_K *x4 = (const BlockQ4_K *) b;
    const BlockQ5_K *x5 = (const BlockQ5_K *) b;
    const uint8_t   *sc = t == DT_Q4_K ? x4->scales : x5->scales;
    const uint8_t   *q = t == DT_Q4_K ? x4->qs : x5->qs;
    float            d = f16_to_f32(x4->d), dmin = f16_to_f32(x4->dmin);
    uint8_t          u = 1;

    for (int j = 0; j < 8; j++, u <<= 1) {
        /* 6-bit pairs: j < 4 in bytes j, j+4; else split over 3 bytes */
        int s6 = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
        int m6 = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        const uint8_t *qq = q + 32 * (j / 2);

        for (int l = 0; l < 32; l++) {
            int v = j % 2 == 0 ? qq[l] & 15 : qq[l] >> 4;

            if (t == DT_Q5_K) v += x5->qh[l] & u ? 16 : 0;
            *y++ = d * s6 * v - dmin * m6;
        }
    }
}

static void deq_q6_K_plain(const uint8_t *b, float *y) {
    const BlockQ6_K *x = (const BlockQ6_K *) b;
    float            d = f16_to_f32(x->d);

    for (int n = 0; n < 2; n++, y += 128) {
        const uint8_t *ql = x->ql + 64 * n, *qh = x->qh + 32 * n;
        const int8_t  *sc = x->scales + 8 * n;

        for (int l = 0; l < 32; l++) {
            int is = l / 16;

            y[l] = d * sc[is] * ((int8_t) ((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
            y[l + 32] = d * sc[is + 2]
                        * ((int8_t) ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
            y[l + 64] = d * sc[is + 4]
                        * ((int8_t) ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            y[l + 96] = d * sc[is + 6]
                        * ((int8_t) ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

static void deq_iq4(DType t, const uint8_t *b, float *y) {
    static const int8_t lv[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                   1, 13, 25, 38, 53, 69, 89, 113 };
    const BlockIQ4_XS  *x = (const BlockIQ4_XS *) b;
    float               d = f16_to_f32((uint16_t) (b[0] | b[1] << 8));
    int                 nsub = t == DT_IQ4_NL ? 1 : 8;
    const uint8_t      *qs = t == DT_IQ4_NL ? b + 2 : x->qs;

    for (int ib = 0; ib < nsub; ib++, y += 32, qs += 16) {
        float dl = d;

        if (t == DT_IQ4_XS) {
            int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 15)
                     | ((x->scales_h >> 2 * ib) & 3) << 4;

            dl = d * (ls - 32);
        }
        for (int j = 0; j < 16; j++) {
            y[j] = dl * lv[qs[j] & 15];
            y[j + 16] = dl * lv[qs[j] >> 4];
        }
    }
}

static void deq_plain_block(DType t, const uint8_t *b, float *y) {
    switch (t) {
    case DT_Q4_1: case DT_Q5_0: case DT_Q5_1: deq_q4_1_5(t, b, y); return;
    case DT_Q2_K: case DT_Q3_K:               deq_q2_3_K(t, b, y); return;
    case DT_Q4_K: case DT_Q5_K:               deq_q4_5_K(t, b, y); return;
    case DT_Q6_K:                             deq_q6_K_plain(b, y); return;
    default:                                  deq_iq4(t, b, y); return;
    }
}

/* dequantize_row against the block-by-block version above, on random
 * blocks of every new type; and a hand-packed Q4_K, Q3_K and IQ4_XS block
 * with known scales (packed as ggml's quantizers pack them), whose values
 * are checked one by one. */
static void test_dequantize_def(void **state) {
    const Isa *I = *state;
    int64_t    k = 4 * QK_K;
    float     *got = xmalloc((size_t) k * sizeof(float));
    float     *want = xmalloc((size_t) k * sizeof(float));
    uint8_t   *row = xmalloc(dtype_row_bytes(DT_Q8_K, k));

    if (I->vec != &cpu_vec_ref) goto done;    /* no table involved */
    rng_state = 20;
    for (size_t i = 0; i < sizeof(rand_specs) / sizeof(rand_specs[0]); i++) {
        DType   t = rand_specs[i].t;
        int64_t blk = dtype_block(t);
        size_t  bs = dtype_row_bytes(t, blk);

        for (int rep = 0; rep < 8; rep++) {
            rand_row(t, row, k);
            dequantize_row(t, row, got, k);
            for (int64_t b = 0; b < k / blk; b++) {
                deq_plain_block(t, row + b * bs, want + b * blk);
            }
            assert_same_bits(dtype_name(t), got, want,
                             (size_t) k * sizeof(float));
        }
    }
    {
        BlockQ4_K q4 = { 0 };
        BlockQ3_K q3 = { 0 };
        BlockIQ4_XS xs = { 0 };

        /* Q4_K: sc_j = 3 + 7j (up to 52), mn_j = 60 - 5j */
        q4.d = f32_to_f16(0.5f);
        q4.dmin = f32_to_f16(0.25f);
        for (int j = 0; j < 8; j++) {
            int sc = 3 + 7 * j, mn = 60 - 5 * j;

            if (j < 4) {
                q4.scales[j] |= (uint8_t) sc;
                q4.scales[j + 4] |= (uint8_t) mn;
            } else {
                q4.scales[j + 4] = (uint8_t) ((sc & 15) | (mn & 15) << 4);
                q4.scales[j - 4] |= (uint8_t) ((sc >> 4) << 6);
                q4.scales[j] |= (uint8_t) ((mn >> 4) << 6);
            }
        }
        for (int l = 0; l < QK_K / 2; l++) q4.qs[l] = (uint8_t) (l % 16 | (15 - l % 16) << 4);
        dequantize_row(DT_Q4_K, &q4, got, QK_K);
        for (int e = 0; e < QK_K; e++) {
            int j = e / 32, l = e % 32;
            int q = j % 2 == 0 ? l % 16 : 15 - l % 16;

            assert_float_equal(got[e], 0.5f * (3 + 7 * j) * q
                               - 0.25f * (60 - 5 * j), 0.0f);
        }

        /* Q3_K: scale i = i * 4 - 30 (6 bits: i * 4 + 2), all q = 3 with
           the high bit set in even elements only */
        q3.d = f32_to_f16(0.125f);
        for (int i = 0; i < 16; i++) {
            int l6 = i * 4 + 2;

            q3.scales[i % 8] |= (uint8_t) ((l6 & 15) << (i < 8 ? 0 : 4));
            q3.scales[8 + i % 4] |= (uint8_t) ((l6 >> 4) << (2 * (i / 4)));
        }
        memset(q3.qs, 0xff, sizeof(q3.qs));
        for (int l = 0; l < 32; l += 2) q3.hmask[l] = 0xff;
        dequantize_row(DT_Q3_K, &q3, got, QK_K);
        for (int e = 0; e < QK_K; e++) {
            int q = e % 32 % 2 == 0 ? 3 : -1;

            assert_float_equal(got[e], 0.125f * (e / 16 * 4 - 30) * q, 0.0f);
        }

        /* IQ4_XS: scale j = 32 + 3j - 10 (6 bits), index e % 16 */
        xs.d = f32_to_f16(2.0f);
        for (int j = 0; j < 8; j++) {
            int l6 = 22 + 3 * j;

            xs.scales_l[j / 2] |= (uint8_t) ((l6 & 15) << 4 * (j % 2));
            xs.scales_h |= (uint16_t) ((l6 >> 4) << 2 * j);
        }
        for (int l = 0; l < QK_K / 2; l++) xs.qs[l] = (uint8_t) (l % 16 | (l % 16) << 4);
        dequantize_row(DT_IQ4_XS, &xs, got, QK_K);
        for (int e = 0; e < QK_K; e++) {
            assert_float_equal(got[e], 2.0f * (3 * (e / 32) - 10)
                               * iq4nl_values[e % 16], 0.0f);
        }
    }
done:
    free(got);
    free(want);
    free(row);
}

/* Q8_K and Q8_1 activation quantization: ggml's reference rounding,
 * written again plainly (nearest by the 1.5 * 2^23 trick, halves away
 * from zero by roundf), on random rows of mixed scales, an all-zero
 * super-block, ties and a positive and a negative extreme; bsums and s
 * are the sums they claim; dequantized values are within d / 2. */
static void test_quantize_xq(void **state) {
    const Isa *I = *state;
    int64_t    k = 8 * QK_K;
    float     *x = xmalloc((size_t) k * sizeof(float));
    BlockQ8_K *a = xmalloc((size_t) (k / QK_K) * sizeof(BlockQ8_K));
    BlockQ8_1 *c = xmalloc((size_t) (k / QK) * sizeof(BlockQ8_1));

    if (I->vec != &cpu_vec_ref) goto done;
    rng_state = 21;
    for (int64_t i = 0; i < k; i++) {
        x[i] = rng_f() * powf(2.0f, (float) ((i / 64) % 20) - 10.0f);
    }
    memset(x + QK_K, 0, QK_K * sizeof(float));
    x[2 * QK_K + 7] = 50.0f;                    /* positive extreme */
    x[3 * QK_K + 9] = -50.0f;
    for (int j = 0; j < 64; j++) x[4 * QK_K + j] = (float) (j - 32) / 127.0f * 2.0f;
    x[4 * QK_K + 100] = -2.0f;                  /* scale 63.5: ties */
    assert_int_equal(quantize_row(DT_Q8_K, x, a, k), 0);
    assert_int_equal(quantize_row(DT_Q8_1, x, c, k), 0);
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float        amax = 0.0f, max = 0.0f, is;

        for (int j = 0; j < QK_K; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        if (amax == 0.0f) {
            assert_true(a[b].d == 0.0f);
            for (int j = 0; j < QK_K; j++) assert_int_equal(a[b].qs[j], 0);
            for (int j = 0; j < 16; j++) assert_int_equal(a[b].bsums[j], 0);
            continue;
        }
        is = -127.0f / max;
        assert_true(a[b].d == 1.0f / is);
        for (int j = 0; j < QK_K; j++) {
            float v = is * xb[j] + 12582912.0f;
            int   iv;

            memcpy(&iv, &v, 4);
            iv = (iv & 0x007fffff) - 0x00400000;
            assert_int_equal(a[b].qs[j], iv < 127 ? iv : 127);
            assert_true(fabsf(a[b].d * a[b].qs[j] - xb[j])
                        <= fabsf(a[b].d) * 0.5f * 1.0001f);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;

            for (int j = 0; j < 16; j++) sum += a[b].qs[16 * g + j];
            assert_int_equal(a[b].bsums[g], sum);
        }
    }
    for (int64_t b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        float        amax = 0.0f, d, id;
        int          sum = 0;

        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        d = amax / 127.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        assert_int_equal(c[b].d, f32_to_f16(d));
        for (int j = 0; j < QK; j++) {
            assert_int_equal(c[b].qs[j], (int) roundf(xb[j] * id));
            sum += c[b].qs[j];
        }
        assert_int_equal(c[b].s, f32_to_f16((float) sum * d));
    }
done:
    free(x);
    free(a);
    free(c);
}


/* ---- backend ops against plain references ---- */

/* Embedding rows are exact; a repacked table (a tied output) too, with a
 * group and a tail of blocks. */
static void test_embed(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int32_t    tok[5] = { 3, 0, 16, 3, 9 };

    rng_state = 7;
    for (int ki = 0; ki < N_KINDS; ki++) {
        Kind    k = kinds[ki];
        TestMat e;
        float  *out;
        int64_t dim = k.layout == WL_X16 ? 544
                      : dtype_block(k.type) == QK_K ? 512
                      : quantized(k.type) ? 160 : 172;

        if (!kind_ok(I->vec, k)) continue;
        out = xmalloc(5 * 544 * sizeof(float));
        mat_make(&e, k.type, 17, dim);
        mat_layout(&e, k.layout, be);
        assert_int_equal(e.m.layout, k.layout);
        be->embed(be, out, &e.m, tok, 5);
        for (int i = 0; i < 5; i++) {
            assert_same_bits(kind_name(k), out + i * dim,
                             e.deq + tok[i] * dim,
                             (size_t) dim * sizeof(float));
        }
        free(out);
        mat_free(&e);
    }
    be->free(be);
}

/* repack rewrites exactly the quantized matrices whose rows hold a group,
 * into dtype.c's layout, once; tables without WL_X16 leave all alone. The
 * layout itself round-trips. */
static void test_repack(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    static const int64_t cols[] = { 64, 480, 512, 2112 };

    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int ci = 0; ci < 4; ci++) {
            DType   t = types[ti];
            Kind    x16 = { t, WL_X16 };
            bool    q = t == DT_Q8_0 || t == DT_Q4_0;
            bool    moves = q && vec_slot(t, WL_X16) >= 0
                            && kind_ok(I->vec, x16) && cols[ci] >= 512;
            size_t  bytes = dtype_row_bytes(t, cols[ci]) * 19;
            TestMat a, b;

            if (cols[ci] % dtype_block(t) != 0) continue;
            rng_state = 15 + (uint64_t) ci;
            mat_make(&a, t, 19, cols[ci]);
            rng_state = 15 + (uint64_t) ci;
            mat_make(&b, t, 19, cols[ci]);
            be->repack(be, &a.m);
            assert_int_equal(a.m.layout, moves ? WL_X16 : WL_ROWS);
            be->repack(be, &a.m);
            if (moves) mat_layout(&b, WL_X16, NULL);
            assert_same_bits(kind_name(x16), a.data, b.data, bytes);
            mat_free(&a);
            if (q && !moves) mat_layout(&b, WL_X16, NULL);
            for (int64_t r = 0; q && r < 19; r++) {
                size_t gb = dtype_row_bytes(t, X16 * QK);

                for (int64_t g = 0; g < cols[ci] / (X16 * QK); g++) {
                    size_t    off = (size_t) r * b.m.row_bytes + g * gb;
                    BlockQ8_0 blocks[X16];  /* room for either type */

                    x16_unpack_group(t, (char *) b.data + off, blocks);
                    assert_same_bits("x16 round trip", blocks,
                                     (char *) b.plain + off, gb);
                }
            }
            mat_free(&b);
        }
    }
    be->free(be);
}

static void test_matmul(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    static const int64_t shapes[][3] = {    /* n, rows, cols */
        { 1, 1, 32 }, { 3, 172, 64 }, { 5, 64, 172 }, { 7, 33, 96 },
        { 70, 67, 320 }, { 2, 40, MAX_COLS }, { 64, 256, 2048 },
        { 5, 33, 768 },
    };
    Backend   *ref = be_new("ref", 2);

    rng_state = 9;
    for (int ki = 0; ki < N_KINDS; ki++) {
        Kind k = kinds[ki];

        if (!kind_ok(I->vec, k)) continue;
        for (int si = 0; si < 8; si++) {
            int64_t n = shapes[si][0], rows = shapes[si][1];
            int64_t cols = shapes[si][2];
            TestMat w;
            float  *x, *got, *want;
            char    what[64];

            if (cols % dtype_block(k.type) != 0) continue;
            x = xmalloc((size_t) (n * cols) * sizeof(float));
            got = xmalloc((size_t) (n * rows) * sizeof(float));
            want = xmalloc((size_t) (n * rows) * sizeof(float));
            mat_make(&w, k.type, rows, cols);
            mat_layout(&w, k.layout, be);
            fill(x, n * cols, 1.0f);
            be->matmul(be, got, x, n, &w.m);
            matmul_plain(want, x, n, &w);
            snprintf(what, sizeof(what), "matmul %s %ldx%ldx%ld",
                     kind_name(k), (long) n, (long) rows, (long) cols);
            assert_nmse(what, got, want, n * rows, NMSE_F32);
            if (kind_ref(I->vec, k)) {
                /* on ref.c's gemm: ref's bits, conversion included */
                ref->matmul(ref, want, x, n, &w.m);
                assert_same_bits(what, got, want,
                                 (size_t) (n * rows) * sizeof(float));
            }
            mat_free(&w);
            free(x);
            free(got);
            free(want);
        }
    }
    ref->free(ref);
    be->free(be);
}

/* Row i of a batch of n equals row i alone, bit for bit, for n = 1..70 and
 * 512; 1, 2 and 3 threads agree. Rows not a multiple of any tile and cols
 * longer than a K block with a partial last block. */
static void test_matmul_invariance(void **state) {
    const Isa *I = *state;
    Backend   *be[3] = { be_new(I->isa, 1), be_new(I->isa, 2),
                         be_new(I->isa, 3) };
    int64_t    rows = 35, cols = MAX_COLS, nmax = 512;
    float     *x = xmalloc((size_t) (nmax * cols) * sizeof(float));
    float     *alone = xmalloc((size_t) (nmax * rows) * sizeof(float));
    float     *got = xmalloc((size_t) (nmax * rows) * sizeof(float));

    rng_state = 10;
    fill(x, nmax * cols, 1.0f);
    for (int ki = 0; ki < N_KINDS; ki++) {
        TestMat w;
        /* the new types (kinds 7..) run ref.c's scalar gemm on every set
           for now: fewer batch sizes, and the K-quants shorter rows */
        bool    slow = ki >= 7;
        int64_t k = dtype_block(kinds[ki].type) == QK_K ? 1024 : cols;

        if (!kind_ok(I->vec, kinds[ki])) continue;
        mat_make(&w, kinds[ki].type, rows, k);
        mat_layout(&w, kinds[ki].layout, be[0]);
        assert_int_equal(w.m.layout, kinds[ki].layout);
        for (int64_t i = 0; i < nmax; i++) {
            be[1]->matmul(be[1], alone + i * rows, x + i * k, 1, &w.m);
        }
        for (int64_t n = 1; n <= 71; n++) {
            int64_t nn = n == 71 ? nmax : n;

            if (slow && n > 8 && n != 33 && n < 70) continue;
            for (int t = 0; t < 3; t++) {
                if (t != 1 && n != 70 && n != 71) continue;
                memset(got, 0, (size_t) (nn * rows) * sizeof(float));
                be[t]->matmul(be[t], got, x, nn, &w.m);
                assert_same_bits(kind_name(kinds[ki]), got, alone,
                                 (size_t) (nn * rows) * sizeof(float));
            }
        }
        mat_free(&w);
    }
    for (int t = 0; t < 3; t++) be[t]->free(be[t]);
    free(x);
    free(alone);
    free(got);
}

/* matmul_n over 2 and 3 matrices equals separate matmul calls bit for bit,
 * including a mixed-type and a mixed-layout set (run one by one inside). */
static void test_matmul_fused(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int64_t    n = 9, cols = 768;
    int64_t    rows[3] = { 320, 64, 64 };
    /* a Q4_K_M file's Q4_K and Q6_K share their Q8_K activations */
    static const Kind mixed[4][3] = {
        { { DT_F16, WL_ROWS }, { DT_Q8_0, WL_ROWS }, { DT_F32, WL_ROWS } },
        { { DT_Q8_0, WL_X16 }, { DT_Q8_0, WL_ROWS }, { DT_Q8_0, WL_X16 } },
        { { DT_Q4_K, WL_ROWS }, { DT_Q6_K, WL_ROWS }, { DT_Q4_K, WL_ROWS } },
        { { DT_Q4_1, WL_ROWS }, { DT_Q5_1, WL_ROWS }, { DT_Q4_K, WL_ROWS } },
    };
    float     *x = xmalloc((size_t) (n * cols) * sizeof(float));
    float     *got[3], *want[3];

    rng_state = 12;
    fill(x, n * cols, 1.0f);
    for (int i = 0; i < 3; i++) {
        got[i] = xmalloc((size_t) (n * rows[i]) * sizeof(float));
        want[i] = xmalloc((size_t) (n * rows[i]) * sizeof(float));
    }
    for (int ci = 0; ci < N_KINDS + 4; ci++) {
        TestMat       w[3];
        const Matrix *ws[3];
        Kind          k[3];
        bool          ok = true;
        int64_t       kc = 544;     /* a group and a tail of Q8_0 blocks */

        for (int i = 0; i < 3; i++) {
            k[i] = ci < N_KINDS ? kinds[ci] : mixed[ci - N_KINDS][i];
            ok = ok && kind_ok(I->vec, k[i]);
            kc = dtype_block(k[i].type) == QK_K ? cols : kc;
        }
        if (!ok) continue;
        for (int i = 0; i < 3; i++) {
            mat_make(&w[i], k[i].type, rows[i], kc);
            mat_layout(&w[i], k[i].layout, be);
            ws[i] = &w[i].m;
            be->matmul(be, want[i], x, n, ws[i]);
        }
        for (int count = 2; count <= 3; count++) {
            for (int i = 0; i < count; i++) {
                memset(got[i], 0, (size_t) (n * rows[i]) * sizeof(float));
            }
            be->matmul_n(be, got, x, n, ws, count);
            for (int i = 0; i < count; i++) {
                assert_same_bits("matmul_n", got[i], want[i],
                                 (size_t) (n * rows[i]) * sizeof(float));
            }
        }
        for (int i = 0; i < 3; i++) mat_free(&w[i]);
    }
    for (int i = 0; i < 3; i++) {
        free(got[i]);
        free(want[i]);
    }
    free(x);
    be->free(be);
}


/* ---- main ---- */

static const Case cases[] = {
    { "gemm tiles", test_gemm },
    { "quantize_q8_0 exact", test_quantize },
    { "to_f16 exact", test_to_f16 },
    { "dequantize exact", test_dequantize },
    { "new types' dequantizers", test_dequantize_def },
    { "quantize_q8_K, q8_1 as ggml", test_quantize_xq },
    { "embed", test_embed },
    { "repack", test_repack },
    { "matmul", test_matmul },
    { "matmul batch and thread invariance", test_matmul_invariance },
    { "matmul_n fused equals separate", test_matmul_fused },
};

int main(void) {
    return kernels_run("kernels", cases, sizeof(cases) / sizeof(cases[0]));
}

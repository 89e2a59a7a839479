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

static const DType types[5] = { DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0 };

/* The weight forms a matmul reads: every type as stored, then the
 * quantized ones repacked (WL_X16), which only some tables read. */
typedef struct {
    DType   type;
    WLayout layout;
} Kind;

static const Kind kinds[7] = {
    { DT_F32, WL_ROWS }, { DT_F16, WL_ROWS }, { DT_BF16, WL_ROWS },
    { DT_Q8_0, WL_ROWS }, { DT_Q4_0, WL_ROWS },
    { DT_Q8_0, WL_X16 }, { DT_Q4_0, WL_X16 },
};


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
        quantize_row(t, src, row, cols);
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

/* True when table v reads kind k. */
static bool kind_ok(const CpuVec *v, Kind k) {
    return v->mm[vec_slot(k.type, k.layout)].gemm != NULL;
}

static const char *kind_name(Kind k) {
    if (k.layout == WL_ROWS) return dtype_name(k.type);
    return k.type == DT_Q8_0 ? "q8_0/x16" : "q4_0/x16";
}

/* The values a matmul of type t really multiplies: quantized weight types
 * quantize the activations to Q8_0 first (ref.c's rounding). */
static void x_effective(DType t, const float *x, float *y, int64_t n,
                        int64_t cols)
{
    BlockQ8_0 *q;

    if (t != DT_Q8_0 && t != DT_Q4_0) {
        memcpy(y, x, (size_t) (n * cols) * sizeof(float));
        return;
    }
    q = xmalloc((size_t) (cols / QK) * sizeof(BlockQ8_0));
    for (int64_t r = 0; r < n; r++) {
        cpu_vec_ref.quantize_q8_0(x + r * cols, q, cols);
        dequantize_row(DT_Q8_0, q, y + r * cols, cols);
    }
    free(q);
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
    int    s = vec_slot(wk.type, wk.layout);
    size_t ld;

    if (v->mm[s].conv != NULL) {
        ld = v->mm[s].x_bytes(k);
        for (int64_t r = 0; r < n; r++) v->mm[s].conv(x + r * k, y + r * ld, k);
    } else if (v->mm[s].x_form == DT_Q8_0) {
        ld = dtype_row_bytes(DT_Q8_0, k);
        for (int64_t r = 0; r < n; r++) {
            v->quantize_q8_0(x + r * k, (BlockQ8_0 *) (y + r * ld), k);
        }
    } else if (v->mm[s].x_form == DT_F16) {
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
    for (int ki0 = 0; ki0 < 7; ki0++) {
        Kind           wk = kinds[ki0], plain = { wk.type, WL_ROWS };
        DType          t = wk.type;
        int            s = vec_slot(t, wk.layout), sr = vec_slot(t, WL_ROWS);
        bool           q = t == DT_Q8_0 || t == DT_Q4_0;
        const int64_t *ks = wk.layout == WL_X16 ? ks_x : q ? ks_q : ks_f;
        int            nk = q ? 7 : 13, mr = I->vec->mm[s].mr;

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
                    I->vec->mm[s].gemm(k, 1, 1, xv + i * ldv, ldv,
                                       (char *) w.data + j * w.m.row_bytes,
                                       w.m.row_bytes, &one[i * GW + j], 1);
                }
            }
            assert_nmse(what, one, want, mr * GW, NMSE_F32);
            for (int mi = 0, m = 0; m < mr; mi++) {
                m = ms[mi] < mr ? ms[mi] : mr;

                for (size_t ni = 0; ni < sizeof(nrs) / sizeof(nrs[0]); ni++) {
                    I->vec->mm[s].gemm(k, m, nrs[ni], xv, ldv, w.data,
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
    int64_t    k = 1024 + 64;

    rng_state = 4;
    for (int ti = 0; ti < 5; ti++) {
        TestMat w;
        float  *y = xmalloc((size_t) k * sizeof(float));

        mat_make(&w, types[ti], 1, k);
        for (int64_t n = dtype_block(types[ti]); n <= k;
             n += dtype_block(types[ti]) * (n < 64 ? 1 : 31)) {
            I->vec->dequantize(types[ti], w.data, y, n);
            assert_same_bits(dtype_name(types[ti]), y, w.deq,
                             (size_t) n * sizeof(float));
        }
        free(y);
        mat_free(&w);
    }
}


/* ---- backend ops against plain references ---- */

/* Embedding rows are exact; a repacked table (a tied output) too, with a
 * group and a tail of blocks. */
static void test_embed(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int32_t    tok[5] = { 3, 0, 16, 3, 9 };

    rng_state = 7;
    for (int ki = 0; ki < 7; ki++) {
        Kind    k = kinds[ki];
        TestMat e;
        float  *out;
        int64_t dim = k.layout == WL_X16 ? 544
                      : k.type == DT_Q8_0 || k.type == DT_Q4_0 ? 160 : 172;

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

    for (int ti = 0; ti < 5; ti++) {
        for (int ci = 0; ci < 4; ci++) {
            DType   t = types[ti];
            Kind    x16 = { t, WL_X16 };
            bool    q = t == DT_Q8_0 || t == DT_Q4_0;
            bool    moves = q && kind_ok(I->vec, x16) && cols[ci] >= 512;
            size_t  bytes = dtype_row_bytes(t, cols[ci]) * 19;
            TestMat a, b;

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
    };

    rng_state = 9;
    for (int ki = 0; ki < 7; ki++) {
        Kind k = kinds[ki];

        if (!kind_ok(I->vec, k)) continue;
        for (int si = 0; si < 7; si++) {
            int64_t n = shapes[si][0], rows = shapes[si][1];
            int64_t cols = shapes[si][2];
            TestMat w;
            float  *x, *got, *want;
            char    what[64];

            if ((k.type == DT_Q8_0 || k.type == DT_Q4_0) && cols % QK) {
                continue;
            }
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
            mat_free(&w);
            free(x);
            free(got);
            free(want);
        }
    }
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
    for (int ki = 0; ki < 7; ki++) {
        TestMat w;

        if (!kind_ok(I->vec, kinds[ki])) continue;
        mat_make(&w, kinds[ki].type, rows, cols);
        mat_layout(&w, kinds[ki].layout, be[0]);
        assert_int_equal(w.m.layout, kinds[ki].layout);
        for (int64_t i = 0; i < nmax; i++) {
            be[1]->matmul(be[1], alone + i * rows, x + i * cols, 1, &w.m);
        }
        for (int64_t n = 1; n <= 71; n++) {
            int64_t nn = n == 71 ? nmax : n;

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
    int64_t    n = 9, cols = 544;
    int64_t    rows[3] = { 320, 64, 64 };
    static const Kind mixed[2][3] = {
        { { DT_F16, WL_ROWS }, { DT_Q8_0, WL_ROWS }, { DT_F32, WL_ROWS } },
        { { DT_Q8_0, WL_X16 }, { DT_Q8_0, WL_ROWS }, { DT_Q8_0, WL_X16 } },
    };
    float     *x = xmalloc((size_t) (n * cols) * sizeof(float));
    float     *got[3], *want[3];

    rng_state = 12;
    fill(x, n * cols, 1.0f);
    for (int i = 0; i < 3; i++) {
        got[i] = xmalloc((size_t) (n * rows[i]) * sizeof(float));
        want[i] = xmalloc((size_t) (n * rows[i]) * sizeof(float));
    }
    for (int ci = 0; ci < 9; ci++) {
        TestMat       w[3];
        const Matrix *ws[3];
        Kind          k[3];
        bool          ok = true;

        for (int i = 0; i < 3; i++) {
            k[i] = ci < 7 ? kinds[ci] : mixed[ci - 7][i];
            ok = ok && kind_ok(I->vec, k[i]);
        }
        if (!ok) continue;
        for (int i = 0; i < 3; i++) {
            mat_make(&w[i], k[i].type, rows[i], cols);
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


/* ---- the types llama-quantize writes (K-quants, Q4_1..IQ4_XS) ---- */

static const DType qtypes[10] = {
    DT_Q2_K, DT_Q3_K, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_IQ4_XS,
    DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_IQ4_NL,
};

/* Random blocks for n elements of type t: any bytes make a valid block
 * once its f16 scales are sane, so every bit pattern of the quants, the
 * packed sub-block scales and the high bits gets exercised. dtype.c has
 * no quantizer for these types (llama-quantize writes them). */
static void random_blocks(DType t, void *row, int64_t n) {
    size_t   bs = dtype_row_bytes(t, dtype_block(t));
    size_t   d = 0, m = bs;                 /* offsets of d and the min */
    uint8_t *p = row;

    switch (t) {
    case DT_Q2_K:   d = offsetof(BlockQ2_K, d);
                    m = offsetof(BlockQ2_K, dmin); break;
    case DT_Q3_K:   d = offsetof(BlockQ3_K, d); break;
    case DT_Q4_K:
    case DT_Q5_K:   m = 2; break;
    case DT_Q6_K:   d = offsetof(BlockQ6_K, d); break;
    case DT_Q4_1:
    case DT_Q5_1:   m = 2; break;
    default:        break;
    }
    for (int64_t b = 0; b < n / dtype_block(t); b++, p += bs) {
        uint16_t h;

        for (size_t i = 0; i < bs; i++) p[i] = (uint8_t) rng_next();
        h = f32_to_f16(0.001f + 0.01f * (rng_f() + 1.0f));
        memcpy(p + d, &h, 2);
        if (m < bs) {
            h = f32_to_f16(0.005f * (rng_f() + 1.0f));
            memcpy(p + m, &h, 2);
        }
    }
}

/* n activation rows of k as x_form f, as cpu_backend.c converts them for
 * ref's gemms: Q8_K and Q8_1 by dtype.c's quantizers, Q8_0 by ref.c's
 * (which rounds unlike dtype.c's ggml reference); the row stride. */
static size_t x_quantize(DType f, const float *x, int64_t n, int64_t k,
                         char *y)
{
    size_t ld = dtype_row_bytes(f, k);

    for (int64_t r = 0; r < n; r++) {
        if (f == DT_Q8_0) {
            cpu_vec_ref.quantize_q8_0(x + r * k, (BlockQ8_0 *) (y + r * ld),
                                      k);
        } else {
            quantize_row(f, x + r * k, y + r * ld, k);
        }
    }
    return ld;
}

/* Each table's own gemm of these types against ref.c's, as test_gemm:
 * close to ref.c, and every tile shape equal bit for bit to 1x1 tiles.
 * A table without its own gemm for a type runs ref's (vec_gemm): skipped. */
static void test_gemm_quants(void **state) {
    const Isa *I = *state;
    /* the 32-element block types also get odd block counts (a half
       step of the 64-element SIMD step at the end) */
    static const int64_t ks[] = { 256, 512, 768, 2304, 5632, 96, 1056 };
    static const int     nrs[] = { 1, 2, 3, 4, 5, 8, 13, 48, GW };
    int64_t kmax = 5632;
    int     mmax = 16;
    float  *x = xmalloc((size_t) (mmax * kmax) * sizeof(float));
    char   *xv = xmalloc((size_t) (mmax * kmax) * 2 + 4096);
    float  *want = xmalloc(mmax * GW * sizeof(float));
    float  *one = xmalloc(mmax * GW * sizeof(float));
    float  *got = xmalloc(mmax * GW * sizeof(float));

    rng_state = 13;
    fill(x, mmax * kmax, 1.0f);
    for (int ti = 0; ti < 10; ti++) {
        DType          t = qtypes[ti];
        int            s = vec_slot(t, WL_ROWS);
        const CpuGemm *g = &I->vec->mm[s], *r = &cpu_vec_ref.mm[s];
        int            mr = g->mr < mmax ? g->mr : mmax;

        if (g->gemm == NULL || I->vec == &cpu_vec_ref) continue;
        assert_int_equal(g->conv == NULL ? g->x_form : r->x_form, r->x_form);
        for (int ki = 0; ki < (dtype_block(t) == QK ? 7 : 5); ki++) {
            int64_t k = ks[ki];
            size_t  rb = dtype_row_bytes(t, k), ldr, ldv;
            char   *w = xmalloc(GW * rb), *xr = xmalloc((size_t) (mr * k) * 2 + 4096);
            char    what[64];

            for (int j = 0; j < GW; j++) random_blocks(t, w + j * rb, k);
            ldr = x_quantize(r->x_form, x, mr, k, xr);
            if (g->conv != NULL) {
                ldv = g->x_bytes(k);
                for (int i = 0; i < mr; i++) {
                    g->conv(x + i * k, xv + i * ldv, k);
                }
            } else {
                ldv = x_quantize(g->x_form, x, mr, k, xv);
            }
            snprintf(what, sizeof(what), "gemm %s k=%ld", dtype_name(t),
                     (long) k);
            r->gemm(k, mr, GW, xr, ldr, w, rb, want, GW);
            for (int i = 0; i < mr; i++) {
                for (int j = 0; j < GW; j++) {
                    g->gemm(k, 1, 1, xv + i * ldv, ldv, w + j * rb, rb,
                            &one[i * GW + j], 1);
                }
            }
            assert_nmse(what, one, want, mr * GW, NMSE_F32);
            for (int m = 1; m <= mr; m++) {
                for (size_t ni = 0; ni < sizeof(nrs) / sizeof(nrs[0]); ni++) {
                    memset(got, 0, mmax * GW * sizeof(float));
                    g->gemm(k, m, nrs[ni], xv, ldv, w, rb, got, GW);
                    for (int i = 0; i < m; i++) {
                        assert_same_bits(what, got + i * GW, one + i * GW,
                                         (size_t) nrs[ni] * sizeof(float));
                    }
                }
            }
            free(w);
            free(xr);
        }
    }
    free(x);
    free(xv);
    free(want);
    free(one);
    free(got);
}

/* Through the backend, as test_matmul_invariance: row i of a batch of n
 * equals row i alone bit for bit, for 1, 2 and 3 threads, and is close
 * to ref's backend. */
static void test_matmul_quants(void **state) {
    const Isa *I = *state;
    Backend   *be[3] = { be_new(I->isa, 1), be_new(I->isa, 2),
                         be_new(I->isa, 3) };
    Backend   *ref = be_new("ref", 1);
    int64_t    rows = 37, cols = 2048, nmax = 80;
    float     *x = xmalloc((size_t) (nmax * cols) * sizeof(float));
    float     *alone = xmalloc((size_t) (nmax * rows) * sizeof(float));
    float     *want = xmalloc((size_t) (nmax * rows) * sizeof(float));
    float     *got = xmalloc((size_t) (nmax * rows) * sizeof(float));

    rng_state = 14;
    fill(x, nmax * cols, 1.0f);
    for (int ti = 0; ti < 10; ti++) {
        DType  t = qtypes[ti];
        size_t rb = dtype_row_bytes(t, cols);
        char  *d = xmalloc(rows * rb);
        Matrix m = { t, rows, cols, rb, d, WL_ROWS };

        for (int j = 0; j < rows; j++) random_blocks(t, d + j * rb, cols);
        for (int64_t i = 0; i < nmax; i++) {
            be[1]->matmul(be[1], alone + i * rows, x + i * cols, 1, &m);
        }
        ref->matmul(ref, want, x, nmax, &m);
        assert_nmse(dtype_name(t), alone, want, nmax * rows, NMSE_F32);
        for (int64_t n = 1; n <= nmax; n += n < 9 ? 1 : 7) {
            for (int th = 0; th < 3; th++) {
                if (th != 1 && n < 50) continue;
                memset(got, 0, (size_t) (n * rows) * sizeof(float));
                be[th]->matmul(be[th], got, x, n, &m);
                assert_same_bits(dtype_name(t), got, alone,
                                 (size_t) (n * rows) * sizeof(float));
            }
        }
        free(d);
    }
    for (int th = 0; th < 3; th++) be[th]->free(be[th]);
    ref->free(ref);
    free(x);
    free(alone);
    free(want);
    free(got);
}


/* ---- main ---- */

static const Case cases[] = {
    { "gemm tiles", test_gemm },
    { "quantize_q8_0 exact", test_quantize },
    { "to_f16 exact", test_to_f16 },
    { "dequantize exact", test_dequantize },
    { "embed", test_embed },
    { "repack", test_repack },
    { "matmul", test_matmul },
    { "matmul batch and thread invariance", test_matmul_invariance },
    { "matmul_n fused equals separate", test_matmul_fused },
    { "gemm tiles, K-quants and llama-quantize types", test_gemm_quants },
    { "matmul invariance, K-quants and llama-quantize types",
      test_matmul_quants },
};

int main(void) {
    return kernels_run("kernels", cases, sizeof(cases) / sizeof(cases[0]));
}

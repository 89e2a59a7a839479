/* test_kernels_kq.c -- the gemms of ggml's other block types (K-quants,
 * IQ4_NL, IQ4_XS, Q4_1, Q5_0, Q5_1) in every CpuVec table that has its
 * own: against ref.c by normalized MSE, and batch invariance bit for bit
 * (every output of every tile shape equals the output computed alone),
 * then through the backend with 1..3 threads and batches of 1..70 rows.
 *
 * Weights are random bytes with sane f16 scales (make-model cannot write
 * these types: llama-quantize does), so every bit pattern of the packed
 * values, scales and mins comes up. Activations take the form the table
 * asks for, from the reference quantizers. */

#include "kernels_util.h"

/* A type and where its f16 scale (and min, or -1) sit in a block. */
typedef struct {
    DType t;
    int   d_off, m_off;
} KType;

static const KType ktypes[] = {
    { DT_Q4_K, 0, 2 }, { DT_Q6_K, 208, -1 }, { DT_Q5_K, 0, 2 },
    { DT_Q3_K, 108, -1 }, { DT_Q2_K, 80, 82 }, { DT_IQ4_XS, 0, -1 },
    { DT_Q5_0, 0, -1 }, { DT_IQ4_NL, 0, -1 }, { DT_Q4_1, 0, 2 },
    { DT_Q5_1, 0, 2 },
};

#define N_KTYPES (sizeof(ktypes) / sizeof(ktypes[0]))
#define GW 37                   // weight rows
#define GM 64                   // activation rows

/* rows x cols weights of kt: random bytes, scales in [1e-3, 1e-2), mins
 * of either sign. */
static char *kt_make(const KType *kt, int64_t rows, int64_t cols) {
    size_t  rb = dtype_row_bytes(kt->t, cols);
    size_t  bs = dtype_row_bytes(kt->t, dtype_block(kt->t));
    char   *w = xmalloc((size_t) rows * rb);

    for (size_t i = 0; i < (size_t) rows * rb; i++) {
        w[i] = (char) rng_next();
    }
    for (size_t b = 0; b < (size_t) rows * rb / bs; b++) {
        uint16_t d = f32_to_f16(0.001f + 0.0045f * (rng_f() + 1.0f));
        uint16_t m = f32_to_f16(0.01f * rng_f());

        memcpy(w + b * bs + kt->d_off, &d, 2);
        if (kt->m_off >= 0) memcpy(w + b * bs + kt->m_off, &m, 2);
    }
    return w;
}

/* n activation rows as gemm entry g reads them; returns the row stride. */
static size_t kt_x(const CpuVec *v, const CpuGemm *g, const float *x,
                   int64_t n, int64_t k, char *y)
{
    size_t ld = g->conv != NULL ? g->x_bytes(k)
                                : dtype_row_bytes(g->x_form, k);

    for (int64_t r = 0; r < n; r++) {
        char *o = y + r * ld;

        if (g->conv != NULL) {
            g->conv(x + r * k, o, k);
        } else if (g->x_form == DT_Q8_K) {
            quantize_row_q8_K_ref(x + r * k, (BlockQ8_K *) o, k);
        } else if (g->x_form == DT_Q8_1) {
            quantize_row_q8_1_ref(x + r * k, (BlockQ8_1 *) o, k);
        } else {
            v->quantize_q8_0(x + r * k, (BlockQ8_0 *) o, k);
        }
    }
    return ld;
}

/* Every tile up to GM activation rows against 1..GW weight rows: each
 * output equals itself computed alone, bit for bit, and all are close to
 * ref.c. */
static void test_kq_gemm(void **state) {
    const Isa *I = *state;
    static const int64_t ks_k[] = { 256, 512, 2048, 5632 };
    static const int64_t ks_b[] = { 32, 64, 160, 1056, 2112 };
    static const int     nrs[] = { 1, 2, 3, 5, 8, 17, GW };
    static const int     ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 57, GM };
    int64_t kmax = 5632;
    float  *x = xmalloc(GM * kmax * sizeof(float));
    char   *xv = xmalloc(GM * (size_t) kmax * 2 + 4096);
    char   *xr = xmalloc(GM * (size_t) kmax * 2 + 4096);
    float  *want = xmalloc(GM * GW * sizeof(float));
    float  *one = xmalloc(GM * GW * sizeof(float));
    float  *got = xmalloc(GM * GW * sizeof(float));

    rng_state = 7;
    fill(x, GM * kmax, 1.0f);
    for (size_t ti = 0; ti < N_KTYPES; ti++) {
        const KType   *kt = &ktypes[ti];
        int            s = vec_slot(kt->t, WL_ROWS);
        const CpuGemm *g = &I->vec->mm[s], *gr = &cpu_vec_ref.mm[s];
        bool           kq = dtype_block(kt->t) == QK_K;

        if (g->gemm == NULL) continue;
        for (int ki = 0; ki < (kq ? 4 : 5); ki++) {
            int64_t k = kq ? ks_k[ki] : ks_b[ki];
            size_t  rb = dtype_row_bytes(kt->t, k);
            char   *w = kt_make(kt, GW, k);
            size_t  ldv = kt_x(I->vec, g, x, GM, k, xv);
            size_t  ldr = kt_x(&cpu_vec_ref, gr, x, GM, k, xr);
            char    what[64];

            snprintf(what, sizeof(what), "gemm %s k=%ld",
                     dtype_name(kt->t), (long) k);
            gr->gemm(k, GM, GW, xr, ldr, w, rb, want, GW);
            for (int i = 0; i < GM; i++) {
                for (int j = 0; j < GW; j++) {
                    g->gemm(k, 1, 1, xv + i * ldv, ldv, w + j * rb, rb,
                            &one[i * GW + j], 1);
                }
            }
            assert_nmse(what, one, want, GM * GW, NMSE_F32);
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++) {
                int m = ms[mi] < g->mr ? ms[mi] : g->mr;

                for (size_t ni = 0; ni < sizeof(nrs) / sizeof(nrs[0]); ni++) {
                    g->gemm(k, m, nrs[ni], xv, ldv, w, rb, got, GW);
                    for (int i = 0; i < m; i++) {
                        assert_same_bits(what, got + i * GW, one + i * GW,
                                         (size_t) nrs[ni] * sizeof(float));
                    }
                }
            }
            free(w);
        }
    }
    free(x);
    free(xv);
    free(xr);
    free(want);
    free(one);
    free(got);
}

/* Through the backend: a row of a batch equals that row
 * alone (n = 1, 2, 3, 5, 9, 70), with 1, 2 and 3 threads, and a Q4_K and a Q6_K matrix run
 * fused (a Q4_K_M file's pair) equal them run apart. */
static void test_kq_matmul(void **state) {
    const Isa *I = *state;
    int64_t    k = 2048, rows = 72;
    float     *x = xmalloc(70 * k * sizeof(float));
    float     *one = xmalloc(70 * rows * sizeof(float));
    float     *got = xmalloc(70 * rows * sizeof(float));
    Backend   *bes[3];

    rng_state = 11;
    fill(x, 70 * k, 1.0f);
    for (int t = 0; t < 3; t++) bes[t] = be_new(I->isa, t + 1);
    for (size_t ti = 0; ti < N_KTYPES; ti++) {
        const KType *kt = &ktypes[ti];
        char        *w = kt_make(kt, rows, k);
        Matrix       m = { kt->t, rows, k, dtype_row_bytes(kt->t, k), w,
                           WL_ROWS };

        for (int64_t r = 0; r < 70; r++) {
            bes[0]->matmul(bes[0], one + r * rows, x + r * k, 1, &m);
        }
        for (int t = 0; t < 3; t++) {
            static const int64_t ns[] = { 1, 2, 3, 5, 9, 70 };

            for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                int64_t n = ns[ni];

                memset(got, 0, (size_t) (n * rows) * sizeof(float));
                bes[t]->matmul(bes[t], got, x, n, &m);
                assert_same_bits(dtype_name(kt->t), got, one,
                                 (size_t) (n * rows) * sizeof(float));
            }
        }
        free(w);
    }
    {
        char         *w4 = kt_make(&ktypes[0], rows, k);
        char         *w6 = kt_make(&ktypes[1], rows, k);
        Matrix        m4 = { DT_Q4_K, rows, k, dtype_row_bytes(DT_Q4_K, k),
                             w4, WL_ROWS };
        Matrix        m6 = { DT_Q6_K, rows, k, dtype_row_bytes(DT_Q6_K, k),
                             w6, WL_ROWS };
        const Matrix *ws[2] = { &m4, &m6 };
        float        *outs[2] = { got, got + 35 * rows };

        bes[1]->matmul(bes[1], one, x, 35, &m4);
        bes[1]->matmul(bes[1], one + 35 * rows, x, 35, &m6);
        bes[1]->matmul_n(bes[1], outs, x, 35, ws, 2);
        assert_same_bits("matmul_n q4_K+q6_K", got, one,
                         (size_t) (70 * rows) * sizeof(float));
        free(w4);
        free(w6);
    }
    for (int t = 0; t < 3; t++) bes[t]->free(bes[t]);
    free(x);
    free(one);
    free(got);
}

/* A table's own Q8_K conversion must give quantize_row_q8_K_ref's bits:
 * random rows of several magnitudes, an all-zero super-block, +-max both
 * present (the first sets the sign), values landing on .5 after scaling,
 * tiny values. */
static void test_q8k_conv(void **state) {
    const Isa     *I = *state;
    const CpuGemm *g = &I->vec->mm[vec_slot(DT_Q4_K, WL_ROWS)];
    int64_t        k = 8 * QK_K;
    float         *x = xmalloc((size_t) k * sizeof(float));
    BlockQ8_K     *got = xmalloc((size_t) (k / QK_K) * sizeof(BlockQ8_K));
    BlockQ8_K     *want = xmalloc((size_t) (k / QK_K) * sizeof(BlockQ8_K));

    if (g->conv == NULL || g->x_form != DT_Q8_K) goto out;
    rng_state = 5;
    for (int r = 0; r < 50; r++) {
        fill(x, k, r % 5 == 0 ? 1e-30f : r % 3 == 0 ? 100.0f : 1.0f);
        memset(x + QK_K, 0, QK_K * sizeof(float));
        x[2 * QK_K + 17] = -2.0f;
        x[2 * QK_K + 200] = 2.0f;
        x[3 * QK_K + 5] = 2.0f;
        x[3 * QK_K + 6] = -2.0f;
        for (int j = 0; j < QK_K; j++) {
            /* q = -127 x / 127 = -x: halves everywhere */
            x[4 * QK_K + j] = j == 0 ? 127.0f : (float) (j % 50) - 24.5f;
        }
        memset(got, 0x55, (size_t) (k / QK_K) * sizeof(BlockQ8_K));
        g->conv(x, got, k);
        quantize_row_q8_K_ref(x, want, k);
        assert_same_bits("q8_K conv", got, want,
                         (size_t) (k / QK_K) * sizeof(BlockQ8_K));
    }
out:
    free(x);
    free(got);
    free(want);
}

static const Case cases[] = {
    { "q8_K conversion exact", test_q8k_conv },
    { "k-type gemm tiles", test_kq_gemm },
    { "k-type matmul batch and thread invariance", test_kq_matmul },
};

int main(void) {
    return kernels_run("kernels_kq", cases, sizeof(cases) / sizeof(cases[0]));
}

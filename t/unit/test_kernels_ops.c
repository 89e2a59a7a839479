/* test_kernels_ops.c -- the CPU kernels (kernels/cpu/) off the matmul
 * path: the attention and elementwise CpuVec primitives against ref.c, and
 * the backend's rmsnorm, add_bias/add, rope, swiglu, kv_store and paged
 * attention against plain double-precision references, for each
 * instruction set this CPU has. test_kernels.c does the matmul path;
 * kernels_util.h holds what both use.
 *
 * Inputs come from one fixed seed. Sizes cover 1, the vector widths -1/0/+1
 * (8 and 16 floats), odd head sizes and lengths, and arrays long enough
 * for several blocks. Results are compared by normalized MSE against the
 * reference, as ggml's test-backend-ops does. Invariance is checked bit for
 * bit: an elementwise result does not depend on the element's offset, a
 * key's score not on its place in a block, a token's attention not on its
 * batch, and 1, 2 and 3 threads agree. An ISA the CPU (or the build) lacks
 * is reported as one TAP skip with the reason. */

#include "kernels_util.h"


/* ---- CpuVec primitives against ref.c ---- */

/* The attention helpers: single-row dot/axpy against ref.c, then the block
 * kernels (or their fallback) against the single-row ones; a key's score
 * must not depend on where in a block it sits. */
static void test_attn_prims(void **state) {
    const Isa  *I = *state;
    static const int hds[] = { 8, 15, 16, 17, 64, 128 };
    int64_t     nk = 40;
    float      *q = xmalloc(128 * sizeof(float));
    uint16_t   *k = xmalloc((size_t) nk * 128 * 2);
    float      *p = xmalloc((size_t) nk * sizeof(float));

    rng_state = 5;
    for (int hi = 0; hi < 6; hi++) {
        int   hd = hds[hi];
        float y0[128], y1[128], s0[40], s1[40], s2[40], max0 = -INFINITY;

        fill(q, hd, 1.0f);
        fill(p, nk, 1.0f);
        for (int64_t i = 0; i < nk * hd; i++) k[i] = f32_to_f16(rng_f());
        for (int64_t r = 0; r < nk; r++) {
            s0[r] = cpu_vec_ref.dot_f16(k + r * hd, q, hd) * 0.125f;
            s1[r] = I->vec->dot_f16(k + r * hd, q, hd) * 0.125f;
            max0 = s0[r] > max0 ? s0[r] : max0;
        }
        assert_nmse("dot_f16", s1, s0, nk, NMSE_F32);
        if (I->vec->scores_f16 != NULL) {
            float m = I->vec->scores_f16(s2, q, k, nk, hd, 0.125f);

            assert_nmse("scores_f16", s2, s0, nk, NMSE_F32);
            assert_true(fabsf(m - max0) <= 1e-5f * fabsf(max0));
            for (int64_t off = 1; off < nk; off += 7) {
                float m2 = I->vec->scores_f16(s1, q, k + off * hd, nk - off,
                                              hd, 0.125f);
                assert_same_bits("scores_f16 position", s1, s2 + off,
                                 (size_t) (nk - off) * sizeof(float));
                (void) m2;
            }
        }

        fill(y0, hd, 1.0f);
        memcpy(y1, y0, (size_t) hd * sizeof(float));
        for (int64_t r = 0; r < nk; r++) {
            cpu_vec_ref.axpy_f16(y0, p[r], k + r * hd, hd);
            I->vec->axpy_f16(y1, p[r], k + r * hd, hd);
        }
        assert_nmse("axpy_f16", y1, y0, hd, NMSE_F32);
        if (I->vec->mix_f16 != NULL) {
            float y2[128], y3[128], y4[128];

            fill(y2, hd, 1.0f);
            memcpy(y3, y2, (size_t) hd * sizeof(float));
            memcpy(y4, y2, (size_t) hd * sizeof(float));
            for (int64_t r = 0; r < nk; r++) {
                cpu_vec_ref.axpy_f16(y4, p[r], k + r * hd, hd);
            }
            I->vec->mix_f16(y2, p, k, nk, hd);
            assert_nmse("mix_f16", y2, y4, hd, NMSE_F32);
            /* the same n and inputs give the same bits */
            I->vec->mix_f16(y3, p, k, nk, hd);
            assert_same_bits("mix_f16 repeat", y2, y3,
                             (size_t) hd * sizeof(float));
        }
    }
    free(q);
    free(k);
    free(p);
}

/* Elementwise and reduction primitives. Elementwise results must not
 * depend on an element's offset (body or tail): checked by running on
 * every suffix of the array. */
/* ggml's gelu, in double: ref.c's must land on it through the f16
 * roundings (an f16 ulp apart at most, where double and float tanh round
 * the gelu to neighbouring f16 values). */
static double gelu_plain(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * x
                                 * (1.0 + 0.044715 * x * x)));
}

/* gelu_mul and tanh_scale of every table against ref.c over n elements,
 * ref.c against plain double formulas, and an element's bits not
 * depending on its offset. Inputs cover the clamps at +-10 and tanh's two
 * regimes (|x| below and above 0.625). */
static void gelu_tanh_case(const Isa *I, const float *x, const float *u,
                           int64_t n)
{
    float a[5000], b[5000];

    I->vec->gelu_mul(a, x, u, n);
    cpu_vec_ref.gelu_mul(b, x, u, n);
    assert_nmse("gelu_mul", a, b, n, 1e-7);
    for (int64_t i = 0; i < n; i++) {
        double xh = f16_to_f32(f32_to_f16(x[i]));
        double w = x[i] <= -10.0f ? 0.0 : x[i] >= 10.0f ? (double) x[i] * u[i]
                   : f16_to_f32(f32_to_f16((float) gelu_plain(xh))) * u[i];

        assert_true(fabs(b[i] - w) <= 1e-3 * fabs(w) + 1e-6);
    }
    I->vec->tanh_scale(a, x, 0.2f, 3.0f, n);
    cpu_vec_ref.tanh_scale(b, x, 0.2f, 3.0f, n);
    assert_nmse("tanh_scale", a, b, n, NMSE_F32);
    for (int64_t i = 0; i < n; i++) {
        assert_true(fabs(b[i] - 3.0 * tanh(x[i] * 0.2f)) <= 1e-6);
    }
}

static void gelu_tanh_offsets(const Isa *I, const float *x, const float *u) {
    float a[300], b[300], c[300], d[300];

    I->vec->gelu_mul(a, x, u, 300);
    I->vec->tanh_scale(c, x, 0.5f, 2.0f, 300);
    for (int64_t off = 1; off < 40; off++) {
        I->vec->gelu_mul(b, x + off, u + off, 300 - off);
        assert_same_bits("gelu_mul offset", b, a + off,
                         (size_t) (300 - off) * sizeof(float));
        I->vec->tanh_scale(d, x + off, 0.5f, 2.0f, 300 - off);
        assert_same_bits("tanh_scale offset", d, c + off,
                         (size_t) (300 - off) * sizeof(float));
    }
}

static void test_elementwise(void **state) {
    const Isa *I = *state;
    static const int64_t ns[] = { 1, 7, 8, 9, 15, 16, 17, 64, 172, 5000 };
    int64_t    nmax = 5000;
    float     *x = xmalloc((size_t) nmax * sizeof(float));
    float     *u = xmalloc((size_t) nmax * sizeof(float));
    float     *w = xmalloc((size_t) nmax * sizeof(float));
    float     *a = xmalloc((size_t) nmax * sizeof(float));
    float     *b = xmalloc((size_t) nmax * sizeof(float));
    float     *c = xmalloc((size_t) nmax * sizeof(float));

    rng_state = 6;
    fill(x, nmax, 8.0f);
    fill(u, nmax, 1.0f);
    fill(w, nmax, 1.0f);
    x[0] = -100.0f;                 /* exp overflow inside silu */
    x[1] = 100.0f;
    for (int ni = 0; ni < 10; ni++) {
        int64_t n = ns[ni];
        float   sa, sb, mx;

        sa = I->vec->sum_sq(x, n);
        sb = cpu_vec_ref.sum_sq(x, n);
        assert_nmse("sum_sq", &sa, &sb, 1, NMSE_F32);

        I->vec->scale_mul(a, x, 0.37f, w, n);
        cpu_vec_ref.scale_mul(b, x, 0.37f, w, n);
        assert_same_bits("scale_mul", a, b, (size_t) n * sizeof(float));

        I->vec->silu_mul(a, x, u, n);
        cpu_vec_ref.silu_mul(b, x, u, n);
        assert_nmse("silu_mul", a, b, n, NMSE_F32);

        mx = x[0];
        for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
        sa = I->vec->exp_sum(a, x, mx, n);
        sb = cpu_vec_ref.exp_sum(b, x, mx, n);
        assert_nmse("exp_sum values", a, b, n, NMSE_F32);
        assert_nmse("exp_sum sum", &sa, &sb, 1, NMSE_F32);

        memcpy(a, x, (size_t) n * sizeof(float));
        memcpy(b, x, (size_t) n * sizeof(float));
        I->vec->add(a, u, n);
        cpu_vec_ref.add(b, u, n);
        assert_same_bits("add", a, b, (size_t) n * sizeof(float));
        I->vec->scale(a, 1.7f, n);
        cpu_vec_ref.scale(b, 1.7f, n);
        assert_same_bits("scale", a, b, (size_t) n * sizeof(float));
        gelu_tanh_case(I, x, u, n);
    }

    I->vec->silu_mul(a, x, u, 300);
    I->vec->exp_sum(c, x, 100.0f, 300);
    gelu_tanh_offsets(I, x, u);
    for (int64_t off = 1; off < 40; off++) {
        I->vec->silu_mul(b, x + off, u + off, 300 - off);
        assert_same_bits("silu_mul offset", b, a + off,
                         (size_t) (300 - off) * sizeof(float));
        I->vec->exp_sum(b, x + off, 100.0f, 300 - off);
        assert_same_bits("exp_sum offset", b, c + off,
                         (size_t) (300 - off) * sizeof(float));
    }
    free(x);
    free(u);
    free(w);
    free(a);
    free(b);
    free(c);
}


/* ---- backend ops against plain references ---- */

static void test_rmsnorm(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    static const int64_t dims[] = { 1, 16, 17, 64, 2048 };

    rng_state = 8;
    for (int di = 0; di < 5; di++) {
        int64_t dim = dims[di], n = 70;
        float  *x = xmalloc((size_t) (n * dim) * sizeof(float));
        float  *w = xmalloc((size_t) dim * sizeof(float));
        float  *got = xmalloc((size_t) (n * dim) * sizeof(float));
        float  *want = xmalloc((size_t) (n * dim) * sizeof(float));

        fill(x, n * dim, 3.0f);
        fill(w, dim, 1.0f);
        for (int64_t r = 0; r < n; r++) {
            double ss = 0.0;

            for (int64_t i = 0; i < dim; i++) {
                ss += (double) x[r * dim + i] * x[r * dim + i];
            }
            ss = 1.0 / sqrt(ss / (double) dim + 1e-5);
            for (int64_t i = 0; i < dim; i++) {
                want[r * dim + i] = (float) (x[r * dim + i] * ss * w[i]);
            }
        }
        be->rmsnorm(be, got, x, w, n, dim, 1e-5f);
        assert_nmse("rmsnorm", got, want, n * dim, NMSE_F32);
        for (int64_t r = 0; r < n; r += 23) {
            be->rmsnorm(be, want, x + r * dim, w, 1, dim, 1e-5f);
            assert_same_bits("rmsnorm alone", want, got + r * dim,
                             (size_t) dim * sizeof(float));
        }
        be->rmsnorm(be, x, x, w, n, dim, 1e-5f);    /* in place */
        assert_same_bits("rmsnorm in place", x, got,
                         (size_t) (n * dim) * sizeof(float));
        free(x);
        free(w);
        free(got);
        free(want);
    }
    be->free(be);
}

static void test_add_bias(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int64_t    n = 300, dim = 172;
    float     *x = xmalloc((size_t) (n * dim) * sizeof(float));
    float     *y = xmalloc((size_t) (n * dim) * sizeof(float));
    float     *want = xmalloc((size_t) (n * dim) * sizeof(float));

    rng_state = 11;
    fill(x, n * dim, 1.0f);
    fill(y, n * dim, 1.0f);
    for (int64_t i = 0; i < n * dim; i++) want[i] = x[i] + y[i % dim];
    be->add_bias(be, x, y, n, dim);
    assert_same_bits("add_bias", x, want, (size_t) (n * dim) * sizeof(float));
    for (int64_t i = 0; i < n * dim; i++) want[i] = x[i] + y[i];
    be->add(be, x, y, n, dim);
    assert_same_bits("add", x, want, (size_t) (n * dim) * sizeof(float));
    free(x);
    free(y);
    free(want);
    be->free(be);
}

/* The plain rotation, angles computed as kernels.h documents (ggml's
 * theta by repeated multiplication; YaRN's ramp between the correction
 * dims, written out from ggml's formula). */
static void rope_plain(float *x, int64_t n, int n_heads, int hd,
                       const int32_t *pos, const RopeParams *p)
{
    int    half = p->n_rot / 2;
    float  ts = powf(p->freq_base, -2.0f / (float) p->n_rot);
    double lo = 0, hi = 0, ms = p->attn_factor;

    if (p->ext_factor != 0.0f) {
        lo = floor(p->n_rot * log(p->n_ctx_orig / (p->beta_fast * 2 * M_PI))
                   / (2 * log(p->freq_base)));
        hi = ceil(p->n_rot * log(p->n_ctx_orig / (p->beta_slow * 2 * M_PI))
                  / (2 * log(p->freq_base)));
        lo = lo > 0 ? lo : 0;
        hi = hi < p->n_rot - 1 ? hi : p->n_rot - 1;
        ms *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
    }
    for (int64_t t = 0; t < n; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (t * n_heads + h) * hd, theta = (float) pos[t];

            for (int i = 0; i < half; i++) {
                float  ff = p->freq_factors ? p->freq_factors[i] : 1.0f;
                double ex = theta / ff, th = p->freq_scale * ex;
                int    i0 = p->mode == ROPE_NEOX ? i : 2 * i;
                int    i1 = p->mode == ROPE_NEOX ? i + half : 2 * i + 1;
                double c, s, x0 = v[i0], x1 = v[i1];

                if (p->ext_factor != 0.0f) {
                    double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
                    double mix = (1 - (y < 0 ? 0 : y > 1 ? 1 : y))
                                 * p->ext_factor;

                    th = th * (1 - mix) + ex * mix;
                }
                c = cos(th) * ms;
                s = sin(th) * ms;
                v[i0] = (float) (x0 * c - x1 * s);
                v[i1] = (float) (x0 * s + x1 * c);
                theta *= ts;
            }
        }
    }
}

static void test_rope(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int64_t    n = 100;
    int        heads = 4, hd = 64;
    int32_t    pos[100];
    float      ff[32];
    float     *x = xmalloc((size_t) (n * heads * hd) * sizeof(float));
    float     *want = xmalloc((size_t) (n * heads * hd) * sizeof(float));
    float     *one = xmalloc((size_t) (heads * hd) * sizeof(float));

    rng_state = 12;
    for (int i = 0; i < n; i++) pos[i] = (int32_t) (rng_next() % 600);
    for (int i = 0; i < 32; i++) ff[i] = 1.0f + (float) i * 0.25f;
    /* plain, partial, linear scaling and factors; then YaRN (x4 over a
       trained 64, the ramp inside the rotated dims) with a magnitude */
    for (int v = 0; v < 6; v++) {
        RopeParams p = { v & 1 ? ROPE_NEOX : ROPE_NORM, v < 2 ? 64 : 48,
                         10000.0f, v == 3 ? 0.5f : v >= 4 ? 0.25f : 1.0f,
                         v == 2 || v == 3 ? ff : NULL,
                         v >= 4 ? 1.0f : 0.0f, v == 5 ? 0.9f : 1.0f,
                         32.0f, 1.0f, 64 };

        fill(x, n * heads * hd, 1.0f);
        memcpy(want, x, (size_t) (n * heads * hd) * sizeof(float));
        memcpy(one, x + 37 * heads * hd, (size_t) (heads * hd) * sizeof(float));
        be->rope(be, x, n, heads, hd, pos, &p);
        rope_plain(want, n, heads, hd, pos, &p);
        assert_nmse("rope", x, want, n * heads * hd, 1e-9);
        be->rope(be, one, 1, heads, hd, pos + 37, &p);
        assert_same_bits("rope alone", one, x + 37 * heads * hd,
                         (size_t) (heads * hd) * sizeof(float));
    }
    free(x);
    free(want);
    free(one);
    be->free(be);
}

static void test_swiglu(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int64_t    ffn = 172, n = 200;
    float     *g = xmalloc((size_t) (n * ffn) * sizeof(float));
    float     *u = xmalloc((size_t) (n * ffn) * sizeof(float));
    float     *got = xmalloc((size_t) (n * ffn) * sizeof(float));
    float     *want = xmalloc((size_t) (n * ffn) * sizeof(float));

    rng_state = 13;
    fill(g, n * ffn, 6.0f);
    fill(u, n * ffn, 1.0f);
    for (int64_t i = 0; i < n * ffn; i++) {
        want[i] = (float) (g[i] / (1.0 + exp(-(double) g[i])) * u[i]);
    }
    be->swiglu(be, got, g, u, n * ffn);
    assert_nmse("swiglu", got, want, n * ffn, NMSE_F32);
    for (int64_t t = 0; t < n; t += 13) {
        float one[172];

        be->swiglu(be, one, g + t * ffn, u + t * ffn, ffn);
        assert_same_bits("swiglu alone", one, got + t * ffn, sizeof(one));
    }
    be->swiglu(be, g, g, u, n * ffn);            /* in place */
    assert_same_bits("swiglu in place", g, got,
                     (size_t) (n * ffn) * sizeof(float));
    free(g);
    free(u);
    free(got);
    free(want);
    be->free(be);
}

/* The backend's geglu, softcap and scale over a batch split across
 * threads: what the table computes over the whole, element for element
 * (ref.c's gelu_mul is checked against ggml's formula above), the same
 * bits for a row alone, and in place. */
static void test_geglu_softcap(void **state) {
    const Isa *I = *state;
    Backend   *be = be_new(I->isa, 2);
    int64_t    ffn = 172, n = 200, N = n * ffn;
    float     *g = xmalloc((size_t) N * sizeof(float));
    float     *u = xmalloc((size_t) N * sizeof(float));
    float     *got = xmalloc((size_t) N * sizeof(float));
    float     *want = xmalloc((size_t) N * sizeof(float));
    float      one[172];

    rng_state = 15;
    fill(g, N, 12.0f);
    fill(u, N, 1.0f);
    I->vec->gelu_mul(want, g, u, N);
    be->geglu(be, got, g, u, N);
    assert_same_bits("geglu", got, want, (size_t) N * sizeof(float));
    be->geglu(be, one, g + 13 * ffn, u + 13 * ffn, ffn);
    assert_same_bits("geglu alone", one, got + 13 * ffn, sizeof(one));

    memcpy(got, g, (size_t) N * sizeof(float));
    be->softcap(be, got, N, 5.0f);
    I->vec->tanh_scale(want, g, 1.0f / 5.0f, 5.0f, N);
    assert_same_bits("softcap", got, want, (size_t) N * sizeof(float));
    for (int64_t i = 0; i < N; i += 97) {
        assert_true(fabs(got[i] - 5.0 * tanh(g[i] / 5.0)) <= 1e-5);
    }
    memcpy(got, g, (size_t) N * sizeof(float));
    be->scale(be, got, N, 0.125f);
    for (int64_t i = 0; i < N; i++) assert_true(got[i] == g[i] * 0.125f);
    free(g);
    free(u);
    free(got);
    free(want);
    be->free(be);
}

/* Three sequences in one paged pool with shuffled physical blocks, GQA
 * (8 query heads on 2 KV heads). All positions are stored by one batch,
 * then the batch attends; each token's result must match a double
 * reference over the f16 cache, equal its result alone, and not depend on
 * the thread count. */
typedef struct {
    int   hd, bs;
    int   window;       // AttnParams's, 0 = none
    float softcap;      //   and 0 = none
} AttnShape;

static void attn_case(const Isa *I, Backend *be[3], AttnShape sh) {
    int      heads = 8, kvh = 2, hd = sh.hd, bs = sh.bs;
    int      lens[3] = { 1, 150, 301 };
    int64_t  n = 452, qd = (int64_t) heads * hd, kvd = (int64_t) kvh * hd;
    int64_t  nblk = 0;
    int32_t *bt[3], *perm, pos[452];
    const int32_t *tbt[452];
    KVLayer  kv;
    float   *q = xmalloc((size_t) (n * qd) * sizeof(float));
    float   *k = xmalloc((size_t) (n * kvd) * sizeof(float));
    float   *v = xmalloc((size_t) (n * kvd) * sizeof(float));
    float   *out = xmalloc((size_t) (n * qd) * sizeof(float));
    float   *want = xmalloc((size_t) (n * qd) * sizeof(float));
    float   *one = xmalloc((size_t) qd * sizeof(float));
    double  *sc = xmalloc(512 * sizeof(double));
    int64_t  t = 0;
    AttnParams ap = { 0.3f, sh.softcap, sh.window };

    for (int s = 0; s < 3; s++) nblk += (lens[s] + bs - 1) / bs;
    perm = xmalloc((size_t) (nblk + 3) * sizeof(int32_t));
    for (int64_t i = 0; i < nblk + 3; i++) perm[i] = (int32_t) i;
    for (int64_t i = nblk + 2; i > 0; i--) {
        int64_t j = (int64_t) (rng_next() % (uint64_t) (i + 1));
        int32_t tmp = perm[i];

        perm[i] = perm[j];
        perm[j] = tmp;
    }
    kv = (KVLayer) { kvh, hd, bs, nblk + 3, NULL, NULL };
    kv.k = xmalloc((size_t) ((nblk + 3) * kvh * bs * hd) * 2);
    kv.v = xmalloc((size_t) ((nblk + 3) * kvh * bs * hd) * 2);
    /* unused slots hold NaN: reading one would poison the result */
    memset(kv.k, 0xff, (size_t) ((nblk + 3) * kvh * bs * hd) * 2);
    memset(kv.v, 0xff, (size_t) ((nblk + 3) * kvh * bs * hd) * 2);
    for (int s = 0, b = 0; s < 3; s++) {
        bt[s] = perm + b;
        b += (lens[s] + bs - 1) / bs;
    }
    /* tokens of the three sequences interleaved, each in position order */
    for (int p = 0; t < n; p++) {
        for (int s = 0; s < 3; s++) {
            if (p < lens[s]) {
                pos[t] = p;
                tbt[t++] = bt[s];
            }
        }
    }
    fill(q, n * qd, 1.0f);
    fill(k, n * kvd, 1.0f);
    fill(v, n * kvd, 1.0f);
    {
        TokenBatch b = { n, pos, tbt };

        be[1]->kv_store(be[1], &kv, k, v, &b);
        be[1]->attention(be[1], out, q, heads, &kv, &b, &ap);
    }
    for (int64_t i = 0; i < n; i++) {
        for (int g = 0; g < kvh; g++) {
            int32_t blk = tbt[i][pos[i] / bs];
            size_t  off = (((size_t) blk * kvh + g) * bs + pos[i] % bs) * hd;

            for (int d = 0; d < hd; d++) {
                assert_int_equal(kv.k[off + d],
                                 f32_to_f16(k[i * kvd + g * hd + d]));
                assert_int_equal(kv.v[off + d],
                                 f32_to_f16(v[i * kvd + g * hd + d]));
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        for (int h = 0; h < heads; h++) {
            int     g = h / (heads / kvh);
            double  max = -INFINITY, sum = 0.0, acc[256] = { 0 };
            int     first = sh.window > 0 && pos[i] + 1 > sh.window
                            ? pos[i] + 1 - sh.window : 0;

            for (int p = first; p <= pos[i]; p++) {
                size_t off = (((size_t) tbt[i][p / bs] * kvh + g) * bs
                              + p % bs) * hd;
                double s = 0.0;

                for (int d = 0; d < hd; d++) {
                    s += (double) q[i * qd + h * hd + d]
                         * f16_to_f32(kv.k[off + d]);
                }
                sc[p] = (double) 0.3f * s;
                if (sh.softcap > 0.0f) sc[p] = sh.softcap * tanh(sc[p]);
                max = sc[p] > max ? sc[p] : max;
            }
            for (int p = first; p <= pos[i]; p++) {
                size_t off = (((size_t) tbt[i][p / bs] * kvh + g) * bs
                              + p % bs) * hd;
                double e = exp(sc[p] - max);

                sum += e;
                for (int d = 0; d < hd; d++) {
                    acc[d] += e * f16_to_f32(kv.v[off + d]);
                }
            }
            for (int d = 0; d < hd; d++) {
                want[i * qd + h * hd + d] = (float) (acc[d] / sum);
            }
        }
    }
    assert_nmse("attention", out, want, n * qd, NMSE_F32);

    for (int bi = 0; bi < 3; bi += 2) {
        float     *o2 = xmalloc((size_t) (n * qd) * sizeof(float));
        TokenBatch b = { n, pos, tbt };

        be[bi]->attention(be[bi], o2, q, heads, &kv, &b, &ap);
        assert_same_bits("attention threads", o2, out,
                         (size_t) (n * qd) * sizeof(float));
        free(o2);
    }
    for (int64_t i = 0; i < n; i += 17) {
        TokenBatch b = { 1, pos + i, tbt + i };

        be[1]->attention(be[1], one, q + i * qd, heads, &kv, &b, &ap);
        assert_same_bits("attention alone", one, out + i * qd,
                         (size_t) qd * sizeof(float));
    }
    (void) I;
    free(q);
    free(k);
    free(v);
    free(out);
    free(want);
    free(one);
    free(sc);
    free(perm);
    free(kv.k);
    free(kv.v);
}

static void test_attention(void **state) {
    const Isa *I = *state;
    Backend   *be[3] = { be_new(I->isa, 1), be_new(I->isa, 2),
                         be_new(I->isa, 3) };
    /* plain; sliding windows that start mid-block, shorter and longer
       than a block; soft-capping, alone and with a window */
    static const AttnShape shapes[] = {
        { 64, 16, 0, 0.0f }, { 8, 7, 0, 0.0f }, { 80, 32, 0, 0.0f },
        { 64, 16, 37, 0.0f }, { 8, 7, 5, 0.0f }, { 80, 32, 0, 2.0f },
        { 17, 16, 100, 1.5f },
    };

    rng_state = 14;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        attn_case(I, be, shapes[i]);
    }
    for (int t = 0; t < 3; t++) be[t]->free(be[t]);
}


/* ---- main ---- */

static const Case cases[] = {
    { "attention primitives", test_attn_prims },
    { "elementwise primitives", test_elementwise },
    { "rmsnorm", test_rmsnorm },
    { "add_bias, add", test_add_bias },
    { "rope", test_rope },
    { "swiglu", test_swiglu },
    { "geglu, softcap, scale", test_geglu_softcap },
    { "kv_store, paged attention", test_attention },
};

int main(void) {
    return kernels_run("kernels_ops", cases,
                       sizeof(cases) / sizeof(cases[0]));
}

/* avx2_ops.c -- the avx2 kernel set's kernels other than matmul:
 * conversions, attention over f16 keys and values, and the elementwise
 * kernels (norms, SwiGLU, softmax, residuals). avx2.c holds the matmul and
 * the table that names these.
 */

#include "avx2.h"

/* ---- conversions ---------------------------------------------------------- */

void avx2_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(
            _mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    /* vcvtps2ph rounds like f32_to_f16, so the tail gives the same bits */
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

void avx2_dequantize(DType t, const void *row, float *y, int64_t n) {
    const uint16_t *h = row;
    int64_t         i = 0;

    switch (t) {
    case DT_F16:
    case DT_BF16:
        for (; i + 8 <= n; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *) (h + i));

            _mm256_storeu_ps(y + i, t == DT_F16 ? _mm256_cvtph_ps(v)
                : _mm256_castsi256_ps(_mm256_slli_epi32(
                      _mm256_cvtepu16_epi32(v), 16)));
        }
        for (; i < n; i++) {
            y[i] = t == DT_F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
        }
        return;
    default:
        /* embedding rows only: one row per token, the scalar path is
           exact and fast enough */
        dequantize_row(t, row, y, n);
        return;
    }
}


/* ---- attention ------------------------------------------------------------- */

float avx2_dot_f16(const uint16_t *a, const float *b, int64_t n) {
    __m256  acc = _mm256_setzero_ps();
    int64_t i = 0;
    float   s;

    for (; i + 8 <= n; i += 8) {
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(
            (const __m128i *) (a + i))), _mm256_loadu_ps(b + i), acc);
    }
    s = hsum(acc);
    for (; i < n; i++) s += f16_to_f32(a[i]) * b[i];
    return s;
}

void avx2_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256  va = _mm256_set1_ps(a);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *) (x + i))),
            _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}


/* Sums of 8 vectors as one: lane r is the sum of a[r]'s 8 lanes, by the
 * same tree for every r ((0+1)+(2+3)) + ((4+5)+(6+7)), so a key's score
 * does not depend on its place among the 8. */
INLINE __m256 hsum8(const __m256 a[8]) {
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);

    /* s0123 holds keys 0-3 of lanes 0-3 low, of lanes 4-7 high */
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                         _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* Scores of 8 keys at once, one accumulator per key (dot_f16 row by row
 * waited on one FMA chain per key). Keys past nr read the zero row. */
INLINE __m256 scores8(const float *q, const uint16_t *k, int nr, int64_t hd)
{
    static const uint16_t zero[8];
    __m256 acc[8];

#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);

#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint16_t *kr = r < nr ? k + r * hd + d : zero;

            acc[r] = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *) kr)), acc[r]);
        }
    }
    return hsum8(acc);
}

/* Heads whose width is not a multiple of 8 go row by row through dot_f16,
 * which depends on nothing but the row either. */
float avx2_scores_f16(float *s, const float *q, const uint16_t *k,
                      int64_t n, int64_t hd, float scale) {
    __m256  vs = _mm256_set1_ps(scale), vmax = _mm256_set1_ps(-INFINITY);
    float   max = -INFINITY, out[8];
    int64_t r0 = 0;

    if (hd % 8 != 0) {
        for (int64_t r = 0; r < n; r++) {
            s[r] = avx2_dot_f16(k + r * hd, q, hd) * scale;
            max = s[r] > max ? s[r] : max;
        }
        return max;
    }
    for (; r0 + 8 <= n; r0 += 8) {
        __m256 sc = _mm256_mul_ps(scores8(q, k + r0 * hd, 8, hd), vs);

        _mm256_storeu_ps(s + r0, sc);
        vmax = _mm256_max_ps(vmax, sc);
    }
    _mm256_storeu_ps(out, vmax);
    for (int i = 0; i < 8; i++) max = out[i] > max ? out[i] : max;
    if (r0 < n) {
        int nr = (int) (n - r0);

        _mm256_storeu_ps(out, _mm256_mul_ps(scores8(q, k + r0 * hd, nr, hd),
                                            vs));
        for (int i = 0; i < nr; i++) {
            s[r0 + i] = out[i];
            max = out[i] > max ? out[i] : max;
        }
    }
    return max;
}

/* NC * 8 columns of mix_f16 from d0: even rows into one set of NC
 * accumulators (which starts from y), odd rows into another, added at the
 * end: one set made every row wait on the FMA latency. */
INLINE void mix_cols(const int NC, float *y, const float *p,
                     const uint16_t *v, int64_t n, int64_t hd)
{
    __m256  a0[4], a1[4];
    int64_t r = 0;

#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        a0[c] = _mm256_loadu_ps(y + c * 8);
        a1[c] = _mm256_setzero_ps();
    }
    for (; r + 2 <= n; r += 2) {
        __m256          p0 = _mm256_set1_ps(p[r]);
        __m256          p1 = _mm256_set1_ps(p[r + 1]);
        const uint16_t *v0 = v + r * hd, *v1 = v0 + hd;

#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            a0[c] = _mm256_fmadd_ps(p0, _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *) (v0 + c * 8))), a0[c]);
            a1[c] = _mm256_fmadd_ps(p1, _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *) (v1 + c * 8))), a1[c]);
        }
    }
    if (r < n) {
        __m256 p0 = _mm256_set1_ps(p[r]);

#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            a0[c] = _mm256_fmadd_ps(p0, _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *) (v + r * hd + c * 8))), a0[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < NC; c++) {
        _mm256_storeu_ps(y + c * 8, _mm256_add_ps(a0[c], a1[c]));
    }
}

/* 32 columns at a time, then 8, 16 or 24. Heads whose width is not a
 * multiple of 8 go row by row through axpy_f16. The order depends only on
 * n, as vec.h asks. */
void avx2_mix_f16(float *y, const float *p, const uint16_t *v, int64_t n,
                  int64_t hd) {
    int64_t d0 = 0;

    if (hd % 8 != 0) {
        for (int64_t r = 0; r < n; r++) avx2_axpy_f16(y, p[r], v + r * hd, hd);
        return;
    }
    for (; d0 + 32 <= hd; d0 += 32) mix_cols(4, y + d0, p, v + d0, n, hd);
    switch ((hd - d0) / 8) {
    case 3: mix_cols(3, y + d0, p, v + d0, n, hd); break;
    case 2: mix_cols(2, y + d0, p, v + d0, n, hd); break;
    case 1: mix_cols(1, y + d0, p, v + d0, n, hd); break;
    }
}

/* ---- elementwise ------------------------------------------------------------ */

float avx2_sum_sq(const float *x, int64_t n) {
    __m256  acc = _mm256_setzero_ps();
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);

        acc = _mm256_fmadd_ps(v, v, acc);
    }
    if (i < n) {
        __m256 v = _mm256_maskload_ps(x + i, tail8(n - i));

        acc = _mm256_fmadd_ps(v, v, acc);
    }
    return hsum(acc);
}

/* (x * s) * w, ref.c's order, so the result is bit-exact with it. */
void avx2_scale_mul(float *y, const float *x, float s, const float *w,
                    int64_t n) {
    __m256  vs = _mm256_set1_ps(s);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(
            _mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    }
    for (; i < n; i++) y[i] = x[i] * s * w[i];
}

INLINE __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));

    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                        e)), u);
}

/* The tail is the vector formula on masked loads: an element gets the same
 * bits wherever a batch puts it. */
void avx2_silu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, silu_mul8(_mm256_loadu_ps(g + i),
                                          _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        __m256i m = tail8(n - i);

        _mm256_maskstore_ps(y + i, m, silu_mul8(_mm256_maskload_ps(g + i, m),
                                                _mm256_maskload_ps(u + i, m)));
    }
}

float avx2_exp_sum(float *y, const float *x, float max, int64_t n) {
    __m256  vm = _mm256_set1_ps(max), acc = _mm256_setzero_ps();
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));

        _mm256_storeu_ps(y + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        __m256i m = tail8(n - i);
        __m256  e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vm));

        _mm256_maskstore_ps(y + i, m, e);
        acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
    }
    return hsum(acc);
}

void avx2_add(float *y, const float *x, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_loadu_ps(x + i)));
    }
    for (; i < n; i++) y[i] += x[i];
}

void avx2_scale(float *y, float s, int64_t n) {
    __m256  vs = _mm256_set1_ps(s);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
    }
    for (; i < n; i++) y[i] *= s;
}



/* ---- GeGLU and soft-capping ------------------------------------------------ */

/* tanh within a few ulp: Cephes' odd polynomial below |x| = 0.625, where
 * 1 - 2 / (e^2x + 1) would lose bits to cancellation, that formula above
 * (exp8's clamp makes it exactly +-1 far out). */
INLINE __m256 tanh8(__m256 x) {
    __m256 z = _mm256_mul_ps(x, x), p, small, e, big, ax;

    p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    e = exp8(_mm256_add_ps(x, x));
    big = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(
        _mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(
        ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

/* ref.c's gelu_mul: gate and gelu rounded to f16 (the table ggml reads),
 * 0 at or below -10, the identity at or above 10. The tanh differs from
 * libm's by an ulp or two, which the f16 rounding nearly always hides. */
INLINE __m256 gelu_mul8(__m256 g, __m256 u) {
    __m256 xh = _mm256_cvtph_ps(_mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    __m256 in = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(
        0.79788456080286535587989211986876f), xh), _mm256_add_ps(
        _mm256_set1_ps(1.0f), _mm256_mul_ps(_mm256_mul_ps(
        _mm256_set1_ps(0.044715f), xh), xh)));
    __m256 gl = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), xh),
                              _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(in)));
    __m256 r;

    gl = _mm256_cvtph_ps(_mm256_cvtps_ph(gl, _MM_FROUND_TO_NEAREST_INT));
    r = _mm256_mul_ps(gl, u);
    r = _mm256_blendv_ps(r, _mm256_mul_ps(g, u), _mm256_cmp_ps(
        g, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
    return _mm256_andnot_ps(_mm256_cmp_ps(g, _mm256_set1_ps(-10.0f),
                                          _CMP_LE_OQ), r);
}

void avx2_gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, gelu_mul8(_mm256_loadu_ps(g + i),
                                          _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        __m256i m = tail8(n - i);

        _mm256_maskstore_ps(y + i, m, gelu_mul8(_mm256_maskload_ps(g + i, m),
                                                _mm256_maskload_ps(u + i, m)));
    }
}

void avx2_tanh_scale(float *y, const float *x, float s_in, float s_out,
                     int64_t n)
{
    __m256  vi = _mm256_set1_ps(s_in), vo = _mm256_set1_ps(s_out);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(vo, tanh8(_mm256_mul_ps(
            _mm256_loadu_ps(x + i), vi))));
    }
    if (i < n) {
        __m256i m = tail8(n - i);

        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(vo, tanh8(_mm256_mul_ps(
            _mm256_maskload_ps(x + i, m), vi))));
    }
}

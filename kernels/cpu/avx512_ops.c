/* avx512_ops.c -- the avx512 kernel set's kernels other than matmul:
 * conversions, attention over f16 keys and values, and the elementwise
 * kernels (norms, SwiGLU, softmax, residuals). avx512.c holds the matmul and
 * the table that names these.
 *
 * Elementwise kernels use a masked last step rather than a scalar tail: the
 * vector exp is not the libm one, and an element must not change bits when
 * it moves between body and tail.
 */

#include "avx512.h"

/* ---- conversions ---------------------------------------------------------- */

void avx512_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256((__m256i *) (y + i), _mm512_cvtps_ph(
            _mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT
                                    | _MM_FROUND_NO_EXC));
    }
    /* vcvtps2ph rounds like f32_to_f16, so the tail gives the same bits */
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

void avx512_dequantize(DType t, const void *row, float *y, int64_t n) {
    const uint16_t *h = row;
    int64_t         i = 0;

    switch (t) {
    case DT_F16:
    case DT_BF16:
        for (; i + 16 <= n; i += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *) (h + i));

            _mm512_storeu_ps(y + i, t == DT_F16 ? _mm512_cvtph_ps(v)
                : _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(v), 16)));
        }
        for (; i < n; i++) {
            y[i] = t == DT_F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
        }
        return;
    case DT_Q8_0:
        for (int64_t b = 0; b < n / QK; b++) {
            const BlockQ8_0 *q = (const BlockQ8_0 *) row + b;
            __m512 d = _mm512_set1_ps(f16_to_f32(q->d));

            for (int j = 0; j < QK; j += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *) (q->qs + j));

                _mm512_storeu_ps(y + b * QK + j, _mm512_mul_ps(d,
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))));
            }
        }
        return;
    default:
        /* f32 is a copy; q4_0 rows are only ever embeddings of tiny
           test models, so the scalar path is fast enough */
        dequantize_row(t, row, y, n);
        return;
    }
}


/* ---- attention ------------------------------------------------------------- */

float avx512_dot_f16(const uint16_t *a, const float *b, int64_t n) {
    __m512  acc = _mm512_setzero_ps();
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(
            (const __m256i *) (a + i))), _mm512_loadu_ps(b + i), acc);
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);

        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m,
            a + i)), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return hsum(acc);
}

void avx512_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m512  va = _mm512_set1_ps(a);
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *) (x + i))),
            _mm512_loadu_ps(y + i)));
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);

        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_cvtph_ps(
            _mm256_maskz_loadu_epi16(m, x + i)), _mm512_maskz_loadu_ps(m,
            y + i)));
    }
}

/* Scores of 16 keys (nr of them valid) as one vector: one accumulator per
 * key, summed by four hsum4, so a key's score does not depend on which
 * group or position it is in. FULL (16 keys, hd % 16 == 0) is the same
 * body with every mask constant, which lets the compiler drop them. */
INLINE __m512 scores16(const int FULL, const float *q, const uint16_t *k,
                       int nr, int64_t hd)
{
    __m512 acc[16], sc;

#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
        __mmask16 m = FULL || hd - d >= 16 ? 0xffff : tail16(hd - d);
        __m512    qv = _mm512_maskz_loadu_ps(m, q + d);

#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) {
            /* rows past nr load nothing (mask 0), so never fault */
            __mmask16 mr = FULL || r < nr ? m : 0;

            acc[r] = _mm512_fmadd_ps(qv, _mm512_cvtph_ps(
                _mm256_maskz_loadu_epi16(mr, k + r * hd + d)), acc[r]);
        }
    }
    sc = _mm512_insertf32x4(_mm512_castps128_ps512(
             hsum4(acc[0], acc[1], acc[2], acc[3])),
             hsum4(acc[4], acc[5], acc[6], acc[7]), 1);
    sc = _mm512_insertf32x4(sc, hsum4(acc[8], acc[9], acc[10], acc[11]), 2);
    return _mm512_insertf32x4(sc, hsum4(acc[12], acc[13], acc[14], acc[15]),
                              3);
}

float avx512_scores_f16(float *s, const float *q, const uint16_t *k,
                        int64_t n, int64_t hd, float scale) {
    __m512  vmax = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    int64_t r0 = 0;

    if (hd % 16 == 0) {
        for (; r0 + 16 <= n; r0 += 16) {
            __m512 sc = _mm512_mul_ps(scores16(1, q, k + r0 * hd, 16, hd), vs);

            _mm512_storeu_ps(s + r0, sc);
            vmax = _mm512_max_ps(vmax, sc);
        }
    }
    for (; r0 < n; r0 += 16) {
        int    nr = n - r0 < 16 ? (int) (n - r0) : 16;
        __m512 sc = _mm512_mul_ps(scores16(0, q, k + r0 * hd, nr, hd), vs);

        _mm512_mask_storeu_ps(s + r0, tail16(nr), sc);
        vmax = _mm512_mask_max_ps(vmax, tail16(nr), vmax, sc);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* 64 columns at a time. Each row adds into one of two sets of four
 * accumulators, even rows into the first (which starts from y), odd rows
 * into the second, and the sets are added at the end: with one set every
 * row waited on the FMA latency. The order depends only on n, as vec.h
 * asks. */
void avx512_mix_f16(float *y, const float *p, const uint16_t *v, int64_t n,
                    int64_t hd) {
    for (int64_t d0 = 0; d0 < hd; d0 += 64) {
        __mmask16 m[4];
        __m512    a0[4], a1[4];
        int64_t   r = 0;

#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            int64_t left = hd - d0 - c * 16;

            m[c] = left >= 16 ? 0xffff : left > 0 ? tail16(left) : 0;
            a0[c] = _mm512_maskz_loadu_ps(m[c], y + d0 + c * 16);
            a1[c] = _mm512_setzero_ps();
        }
        for (; r + 2 <= n; r += 2) {
            __m512          p0 = _mm512_set1_ps(p[r]);
            __m512          p1 = _mm512_set1_ps(p[r + 1]);
            const uint16_t *v0 = v + r * hd + d0, *v1 = v0 + hd;

#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                a0[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(
                    _mm256_maskz_loadu_epi16(m[c], v0 + c * 16)), a0[c]);
                a1[c] = _mm512_fmadd_ps(p1, _mm512_cvtph_ps(
                    _mm256_maskz_loadu_epi16(m[c], v1 + c * 16)), a1[c]);
            }
        }
        if (r < n) {
            __m512 p0 = _mm512_set1_ps(p[r]);

#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                a0[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(
                    _mm256_maskz_loadu_epi16(m[c], v + r * hd + d0 + c * 16)),
                    a0[c]);
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm512_mask_storeu_ps(y + d0 + c * 16, m[c],
                                  _mm512_add_ps(a0[c], a1[c]));
        }
    }
}


/* ---- elementwise ------------------------------------------------------------ */

float avx512_sum_sq(const float *x, int64_t n) {
    __m512  acc = _mm512_setzero_ps();
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);

        acc = _mm512_fmadd_ps(v, v, acc);
    }
    if (i < n) {
        __m512 v = _mm512_maskz_loadu_ps(tail16(n - i), x + i);

        acc = _mm512_fmadd_ps(v, v, acc);
    }
    return hsum(acc);
}

/* (x * s) * w, ref.c's order, so the result is bit-exact with it. */
void avx512_scale_mul(float *y, const float *x, float s, const float *w,
                      int64_t n) {
    __m512  vs = _mm512_set1_ps(s);
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(
            _mm512_loadu_ps(x + i), vs), _mm512_loadu_ps(w + i)));
    }
    for (; i < n; i++) y[i] = x[i] * s * w[i];
}

INLINE __m512 silu_mul16(__m512 g, __m512 u) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));

    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                        e)), u);
}

void avx512_silu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, silu_mul16(_mm512_loadu_ps(g + i),
                                           _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);

        _mm512_mask_storeu_ps(y + i, m, silu_mul16(
            _mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

float avx512_exp_sum(float *y, const float *x, float max, int64_t n) {
    __m512  vm = _mm512_set1_ps(max), acc = _mm512_setzero_ps();
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));

        _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);
        __m512    e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm));

        _mm512_mask_storeu_ps(y + i, m, e);
        acc = _mm512_mask_add_ps(acc, m, acc, e);
    }
    return hsum(acc);
}

void avx512_add(float *y, const float *x, int64_t n) {
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i),
                                              _mm512_loadu_ps(x + i)));
    }
    for (; i < n; i++) y[i] += x[i];
}

void avx512_scale(float *y, float s, int64_t n) {
    __m512  vs = _mm512_set1_ps(s);
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), vs));
    }
    for (; i < n; i++) y[i] *= s;
}



/* ---- GeGLU and soft-capping ------------------------------------------------ */

/* avx2_ops.c's tanh8 and gelu_mul8, 16 lanes wide. */
INLINE __m512 tanh16(__m512 x) {
    __m512 z = _mm512_mul_ps(x, x), p, small, e, big;

    p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    e = exp16(_mm512_add_ps(x, x));
    big = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(
        _mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(
        _mm512_abs_ps(x), _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
}

INLINE __m512 gelu_mul16(__m512 g, __m512 u) {
    __m512 xh = _mm512_cvtph_ps(_mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    __m512 in = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(
        0.79788456080286535587989211986876f), xh), _mm512_add_ps(
        _mm512_set1_ps(1.0f), _mm512_mul_ps(_mm512_mul_ps(
        _mm512_set1_ps(0.044715f), xh), xh)));
    __m512 gl = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), xh),
                              _mm512_add_ps(_mm512_set1_ps(1.0f),
                                            tanh16(in)));
    __m512 r;

    gl = _mm512_cvtph_ps(_mm512_cvtps_ph(gl, _MM_FROUND_TO_NEAREST_INT));
    r = _mm512_mul_ps(gl, u);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_set1_ps(10.0f),
                                                _CMP_GE_OQ), r,
                             _mm512_mul_ps(g, u));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, _mm512_set1_ps(-10.0f),
                                                   _CMP_LE_OQ), r,
                                _mm512_setzero_ps());
}

void avx512_gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, gelu_mul16(_mm512_loadu_ps(g + i),
                                           _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);

        _mm512_mask_storeu_ps(y + i, m, gelu_mul16(
            _mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void avx512_tanh_scale(float *y, const float *x, float s_in, float s_out,
                       int64_t n)
{
    __m512  vi = _mm512_set1_ps(s_in), vo = _mm512_set1_ps(s_out);
    int64_t i = 0;

    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_mul_ps(vo, tanh16(_mm512_mul_ps(
            _mm512_loadu_ps(x + i), vi))));
    }
    if (i < n) {
        __mmask16 m = tail16(n - i);

        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(vo, tanh16(
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vi))));
    }
}

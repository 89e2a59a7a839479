/* avx512.h -- what the two halves of the avx512 kernel set share: the
 * reductions and the vector exp, inline, so that both files compute the
 * same bits the same way, and the functions avx512_ops.c gives the table.
 * Private to avx512.c and avx512_ops.c, which are compiled for this
 * instruction set (Makefile, ISA_avx512); nothing else may include it. */

#ifndef OMNI_AVX512_H
#define OMNI_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "vec.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- reductions and exp --------------------------------------------------- */

/* Sum of the 16 lanes, tree (l, l+8), (l, l+4), (l, l+2), (l, l+1). */
INLINE float hsum(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a),
                          _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));

    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* [hsum(a), hsum(b), hsum(c), hsum(d)] with exactly hsum's pairs. */
INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44),
                              _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44),
                              _mm512_shuffle_f32x4(c, d, 0xee));
    /* 128-bit lane q now holds the 4 partial sums of output q */
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88),
                             _mm512_shuffle_f32x4(ab, cd, 0xdd));

    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        s));
}

INLINE __mmask16 tail16(int64_t n) {
    return (__mmask16) ((1u << n) - 1);
}

/* e^x to about 1 ulp: x = n ln2 + r, |r| <= ln2/2, a degree 6 polynomial
 * (Cephes expf) for e^r and vscalefps for 2^n, which also handles the
 * underflow to 0 and overflow to inf the clamp leaves. */
INLINE __m512 exp16(__m512 x) {
    __m512 n, r, p;

    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)),
                      _mm512_set1_ps(-104.0f));
    n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r),
                        _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* avx512_kq.c: the K-quant and IQ4_XS gemms (Q8_K activations), their
 * tile shape. */
#define KQ_ROWS 8               /* activation rows per tile (table mr) */
void avx512_gemm_q2_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx512_gemm_q3_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx512_gemm_q4_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx512_gemm_q5_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx512_gemm_q6_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx512_gemm_iq4_xs(int64_t k, int mr, int nr, const void *x, size_t ldx,
                        const void *w, size_t ldw, float *out, size_t ldo);

/* avx512_ops.c: conversions, attention and the elementwise kernels. */
void avx512_to_f16(const float *x, uint16_t *y, int64_t n);
void avx512_dequantize(DType t, const void *row, float *y, int64_t n);
float avx512_dot_f16(const uint16_t *a, const float *b, int64_t n);
void avx512_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
float avx512_scores_f16(float *s, const float *q, const uint16_t *k,
                        int64_t n, int64_t hd, float scale);
void avx512_mix_f16(float *y, const float *p, const uint16_t *v, int64_t n,
                    int64_t hd);
float avx512_sum_sq(const float *x, int64_t n);
void avx512_scale_mul(float *y, const float *x, float s, const float *w,
                      int64_t n);
void avx512_silu_mul(float *y, const float *g, const float *u, int64_t n);
float avx512_exp_sum(float *y, const float *x, float max, int64_t n);
void avx512_add(float *y, const float *x, int64_t n);
void avx512_scale(float *y, float s, int64_t n);
void avx512_gelu_mul(float *y, const float *g, const float *u, int64_t n);
void avx512_tanh_scale(float *y, const float *x, float s_in, float s_out,
                   int64_t n);

#endif

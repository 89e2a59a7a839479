/* avx2.h -- what the files of the avx2 kernel set share: the reductions
 * and the vector exp, inline, so that all files compute the same bits the
 * same way, and the functions avx2_kq.c and avx2_ops.c give the table.
 * Private to avx2.c, avx2_kq.c and avx2_ops.c, which are compiled for this
 * instruction set (Makefile, ISA_avx2); nothing else may include it. */

#ifndef OMNI_AVX2_H
#define OMNI_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "vec.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- reductions and exp --------------------------------------------------- */

/* Sum of the 8 lanes, tree (l, l+4), (l, l+2), (l, l+1). */
INLINE float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));

    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

/* Mask of the first n (< 8) lanes for vmaskmovps. */
INLINE __m256i tail8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int) n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* e^x to about 1 ulp on [-87.3, 88.3] (Cephes expf), 2^n built in the
 * exponent field. Clamped there: below, results that would be f32
 * subnormals come out as about 1e-38; above, inf arrives a little early.
 * Neither matters to softmax (x <= 0) or silu. */
INLINE __m256 exp8(__m256 x) {
    __m256  n, r, p;
    __m256i e;

    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)),
                      _mm256_set1_ps(-87.3f));
    n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r),
                        _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                           _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* avx2_kq.c: gemms of the K-quants, IQ4_XS (Q8_K activations), Q5_0,
 * IQ4_NL (Q8_0), Q4_1 and Q5_1 (Q8_1). */
/* Q8_K activations as quantize_row_q8_K_ref writes them, bit for bit. */
void avx2_q8k_conv(const float *x, void *y, int64_t k);
size_t avx2_q8k_bytes(int64_t k);
void avx2_gemm_q2_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q3_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q4_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q5_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q6_K(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_iq4_xs(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q5_0(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_iq4_nl(int64_t k, int mr, int nr, const void *x, size_t ldx,
                      const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q4_1(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);
void avx2_gemm_q5_1(int64_t k, int mr, int nr, const void *x, size_t ldx,
                    const void *w, size_t ldw, float *out, size_t ldo);

/* avx2_ops.c: conversions, attention and the elementwise kernels. */
void avx2_to_f16(const float *x, uint16_t *y, int64_t n);
void avx2_dequantize(DType t, const void *row, float *y, int64_t n);
float avx2_dot_f16(const uint16_t *a, const float *b, int64_t n);
void avx2_axpy_f16(float *y, float a, const uint16_t *x, int64_t n);
float avx2_scores_f16(float *s, const float *q, const uint16_t *k,
                      int64_t n, int64_t hd, float scale);
void avx2_mix_f16(float *y, const float *p, const uint16_t *v, int64_t n,
                  int64_t hd);
float avx2_sum_sq(const float *x, int64_t n);
void avx2_scale_mul(float *y, const float *x, float s, const float *w,
                    int64_t n);
void avx2_silu_mul(float *y, const float *g, const float *u, int64_t n);
float avx2_exp_sum(float *y, const float *x, float max, int64_t n);
void avx2_add(float *y, const float *x, int64_t n);
void avx2_scale(float *y, float s, int64_t n);
void avx2_gelu_mul(float *y, const float *g, const float *u, int64_t n);
void avx2_tanh_scale(float *y, const float *x, float s_in, float s_out,
                   int64_t n);

#endif

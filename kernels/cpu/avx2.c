/* avx2.c -- the CpuVec table for AVX2 with FMA and F16C.
 *
 * The same design as avx512.c at half the width and with half the
 * registers (16 ymm), so see that file for the reasoning; what differs:
 *
 *   f32, f16, bf16 weights: 8 elements per step, 2 accumulators per output
 *     (decode walks one row with two FMA chains), 3x2 tiles: 12
 *     accumulators, 2 weight vectors, 1 activation vector.
 *   q8_0, q4_0 weights: one block (32 elements) per step. Without VNNI
 *     the int8 dot is vpmaddubsw, unsigned x signed with a saturating
 *     16-bit pair sum, so both operands must stay below 128 in magnitude:
 *     the weights enter as |w| and the activations take the sign of w
 *     (vpsignb), ggml's trick. q4_0 becomes signed (q - 8) first, so both
 *     types share the pair step: sign, maddubs, madd to int32, convert,
 *     scale (activation x weight), FMA. Activations are quantized once per
 *     call to a private layout (xq_conv): per block the 32 bytes, then the
 *     scale spread over 8 floats. 2x2 tiles.
 *
 * No K blocking: this is the fallback for CPUs without AVX-512, kept
 * simple. Tails run the same vector step on zero-padded copies, and every
 * output is summed by one tree (hsum), so all tile shapes give the same
 * bits, as vec.h requires. */

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "vec.h"

#define INLINE static inline __attribute__((always_inline))

enum { T_F32, T_F16, T_BF16, T_Q8, T_Q4 };

#define F_MR    3
#define F_NR    2
#define F_ACC   2
#define Q_MR    2
#define Q_NR    2
#define MR_MAX  3
#define NR_MAX  2

INLINE int t_nr(const int T)   { return T <= T_BF16 ? F_NR : Q_NR; }
INLINE int t_acc(const int T)  { return T <= T_BF16 ? F_ACC : 1; }
INLINE int t_step(const int T) { return T <= T_BF16 ? 8 : 32; }


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


/* ---- matmul: one step of each weight type ---------------------------------- */

typedef struct {
    __m256  f;              // f types: 8 weights
    __m256i a, q;           // q types: |w| and w (signed), 32 bytes
    __m256  d;              //   and the block scale
} WOp;

typedef struct {
    __m256  f;              // f types: 8 activations
    __m256i q;              // q types: 32 signed bytes
    __m256  d;              //   and the block scale
} XOp;

INLINE WOp load_w(const int T, const char *w, int64_t s) {
    WOp o;

    if (T == T_F32) {
        o.f = _mm256_loadu_ps((const float *) w + s * 8);
    } else if (T == T_F16 || T == T_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *) ((const uint16_t *) w
                                                       + s * 8));

        o.f = T == T_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
        uint16_t d;

        if (T == T_Q8) {
            const BlockQ8_0 *b = (const BlockQ8_0 *) w + s;

            o.q = _mm256_loadu_si256((const __m256i *) b->qs);
            d = b->d;
        } else {
            /* elements 0..15 low nibbles, 16..31 high, made signed */
            const BlockQ4_0 *b = (const BlockQ4_0 *) w + s;
            __m128i          v = _mm_loadu_si128((const __m128i *) b->qs);
            __m256i          q = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);

            o.q = _mm256_sub_epi8(_mm256_and_si256(q, _mm256_set1_epi8(15)),
                                  _mm256_set1_epi8(8));
            d = b->d;
        }
        o.a = _mm256_sign_epi8(o.q, o.q);
        o.d = _mm256_cvtph_ps(_mm_set1_epi16((short) d));
    }
    return o;
}

INLINE XOp load_x(const int T, const char *x, int64_t s) {
    XOp o;

    if (T <= T_BF16) {
        o.f = _mm256_loadu_ps((const float *) x + s * 8);
        /* one load per row and step, not one per FMA (see avx512.c) */
        __asm__("" : "+x"(o.f));
    } else {
        o.q = _mm256_loadu_si256((const __m256i *) (x + s * 64));
        o.d = _mm256_loadu_ps((const float *) (x + s * 64 + 32));
    }
    return o;
}

INLINE __m256 madd(const int T, XOp x, WOp w, __m256 acc) {
    __m256i p;

    if (T <= T_BF16) return _mm256_fmadd_ps(x.f, w.f, acc);
    /* |w| * (x with w's sign) = w * x, at most 2 * 128 * 127 per pair */
    p = _mm256_maddubs_epi16(w.a, _mm256_sign_epi8(x.q, w.q));
    p = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(x.d, w.d),
                           acc);
}


/* ---- matmul: the tile body -------------------------------------------------- */

INLINE void tile_step(const int T, const int MR, const int NR,
                      const char *x, size_t ldx, const char *w, size_t ldw,
                      int64_t s, __m256 acc[MR_MAX][NR_MAX])
{
    WOp wv[NR_MAX];

#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wv[j] = load_w(T, w + j * ldw, s);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        XOp xv = load_x(T, x + i * ldx, s);

#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = madd(T, xv, wv[j], acc[i][j]);
    }
}

/* out (MR, NR) = x (MR, k) . w (NR, k)^T. Every output: A accumulators,
 * step s into accumulator s % A, a tail (f types, k % 8 elements) as one
 * more step on zero-padded copies, the accumulators added, hsum. */
INLINE void tile(const int T, const int MR, const int NR, int64_t k,
                 const char *x, size_t ldx, const char *w, size_t ldw,
                 float *out, size_t ldo)
{
    const int step = t_step(T), A = t_acc(T);
    int64_t   ns = k / step, s = 0;
    int       rem = (int) (k % step);
    __m256    acc[2][MR_MAX][NR_MAX];

#pragma GCC unroll 2
    for (int a = 0; a < A; a++) {
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[a][i][j] = _mm256_setzero_ps();
        }
    }
    for (; s + A <= ns; s += A) {
#pragma GCC unroll 2
        for (int a = 0; a < A; a++) {
            tile_step(T, MR, NR, x, ldx, w, ldw, s + a, acc[a]);
        }
    }
    if (A == 2 && s < ns) tile_step(T, MR, NR, x, ldx, w, ldw, s, acc[0]);
    if (T <= T_BF16 && rem != 0) {
        /* 8 f32 activations and 8 weights of up to 4 bytes per row */
        float xp[MR_MAX][8], wp[NR_MAX][8];
        int   wb = T == T_F32 ? 4 : 2;

        memset(xp, 0, sizeof(xp));
        memset(wp, 0, sizeof(wp));
        for (int i = 0; i < MR; i++) {
            memcpy(xp[i], x + i * ldx + ns * 32, (size_t) rem * 4);
        }
        for (int j = 0; j < NR; j++) {
            memcpy(wp[j], w + j * ldw + ns * 8 * wb, (size_t) rem * wb);
        }
        if (A == 1 || ns % 2 == 0) {
            tile_step(T, MR, NR, (char *) xp, 32, (char *) wp, 32, 0, acc[0]);
        } else {
            tile_step(T, MR, NR, (char *) xp, 32, (char *) wp, 32, 0,
                      acc[A - 1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            if (A == 2) acc[0][i][j] = _mm256_add_ps(acc[0][i][j],
                                                     acc[1][i][j]);
            out[i * ldo + j] = hsum(acc[0][i][j]);
        }
    }
}

/* out (mr, nr) for mr <= the type's MR and any nr: full tiles, then 1x1
 * tiles for a weight-row edge; one activation row (decode) runs 1x1 tiles
 * row after row, one sequential stream per thread. */
INLINE void gemm_any(const int T, int64_t k, int mr, int nr, const char *x,
                     size_t ldx, const char *w, size_t ldw, float *out,
                     size_t ldo)
{
    const int NR = t_nr(T);
    int       j = 0;

    if (mr > 1) {
        for (; j + NR <= nr; j += NR) {
            const char *wj = w + (size_t) j * ldw;

            switch (mr) {               /* MR_MAX cases */
            case 3: if (T <= T_BF16) tile(T, 3, NR, k, x, ldx, wj, ldw,
                                          out + j, ldo);
                    break;
            case 2: tile(T, 2, NR, k, x, ldx, wj, ldw, out + j, ldo); break;
            }
        }
    }
    for (; j < nr; j++) {
        for (int i = 0; i < mr; i++) {
            tile(T, 1, 1, k, x + i * ldx, ldx, w + (size_t) j * ldw, ldw,
                 out + i * ldo + j, ldo);
        }
    }
}

#define GEMM_FN(name, T)                                                      \
static void name(int64_t k, int mr, int nr, const void *x, size_t ldx,       \
                 const void *w, size_t ldw, float *out, size_t ldo) {        \
    gemm_any(T, k, mr, nr, x, ldx, w, ldw, out, ldo);                         \
}

GEMM_FN(gemm_f32, T_F32)
GEMM_FN(gemm_f16, T_F16)
GEMM_FN(gemm_bf16, T_BF16)
GEMM_FN(gemm_q8_0, T_Q8)
GEMM_FN(gemm_q4_0, T_Q4)


/* ---- activation conversion ------------------------------------------------ */

/* Quantizes 32 floats exactly as ref.c does (see avx512.c); returns the f16
 * scale, q gets the bytes in order. */
INLINE uint16_t quant_block(const float *x, __m256i *q) {
    __m256  v[4], m = _mm256_setzero_ps();
    __m256  sign = _mm256_set1_ps(-0.0f);
    __m128  h;
    __m256i i0, i1, i2, i3;
    float   amax, id;

    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + j * 8);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    amax = _mm_cvtss_f32(h);
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
    i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], _mm256_set1_ps(id)));
    i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], _mm256_set1_ps(id)));
    i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], _mm256_set1_ps(id)));
    i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], _mm256_set1_ps(id)));
    /* the packs work per 128-bit lane; the permute restores the order */
    *q = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(i0, i1),
                           _mm256_packs_epi32(i2, i3)),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return f32_to_f16(amax / 127.0f);
}

static void quantize_q8_0(const float *x, BlockQ8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++) {
        __m256i q;

        y[b].d = quant_block(x + b * QK, &q);
        _mm256_storeu_si256((__m256i *) y[b].qs, q);
    }
}

static size_t xq_bytes(int64_t k) {
    return (size_t) (k / QK) * 64;
}

static void xq_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t b = 0; b < k / QK; b++, o += 64) {
        __m256i q;
        float   d = f16_to_f32(quant_block(x + b * QK, &q));

        _mm256_storeu_si256((__m256i *) o, q);
        _mm256_storeu_ps((float *) (o + 32), _mm256_set1_ps(d));
    }
}


/* ---- conversions ---------------------------------------------------------- */

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(
            _mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    /* vcvtps2ph rounds like f32_to_f16, so the tail gives the same bits */
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static void dequantize(DType t, const void *row, float *y, int64_t n) {
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

static float dot_f16(const uint16_t *a, const float *b, int64_t n) {
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

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    __m256  va = _mm256_set1_ps(a);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *) (x + i))),
            _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}


/* ---- elementwise ------------------------------------------------------------ */

static float sum_sq(const float *x, int64_t n) {
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
static void scale_mul(float *y, const float *x, float s, const float *w,
                      int64_t n)
{
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
static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
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

static float exp_sum(float *y, const float *x, float max, int64_t n) {
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

static void add(float *y, const float *x, int64_t n) {
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_loadu_ps(x + i)));
    }
    for (; i < n; i++) y[i] += x[i];
}

static void scale(float *y, float s, int64_t n) {
    __m256  vs = _mm256_set1_ps(s);
    int64_t i = 0;

    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vs));
    }
    for (; i < n; i++) y[i] *= s;
}

const CpuVec cpu_vec_avx2 = {
    .name = "avx2",
    .mm = {
        { DT_F32,  gemm_f32,  F_MR, F_NR, NULL, NULL },
        { DT_F32,  gemm_f16,  F_MR, F_NR, NULL, NULL },
        { DT_F32,  gemm_bf16, F_MR, F_NR, NULL, NULL },
        { DT_Q8_0, gemm_q8_0, Q_MR, Q_NR, xq_conv, xq_bytes },
        { DT_Q8_0, gemm_q4_0, Q_MR, Q_NR, xq_conv, xq_bytes },
    },
    .quantize_q8_0 = quantize_q8_0,
    .to_f16 = to_f16,
    .dequantize = dequantize,
    .dot_f16 = dot_f16,
    .axpy_f16 = axpy_f16,
    .sum_sq = sum_sq,
    .scale_mul = scale_mul,
    .silu_mul = silu_mul,
    .exp_sum = exp_sum,
    .add = add,
    .scale = scale,
};

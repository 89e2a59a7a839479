/* neon.c -- the CpuVec table for AArch64: Advanced SIMD (NEON) with the
 * Armv8.2 dot-product instructions (SDOT).
 *
 * The design of avx2.c at 128 bits, with 32 vector registers instead of
 * 16; see avx512.c for the reasoning behind it. What differs:
 *
 *   f32, f16, bf16 weights: 4 elements per step (f16 widened by FCVTL, bf16
 *     by a 16-bit shift), 2 accumulators per output so that decode runs two
 *     FMA chains; 3x4 tiles: 24 accumulators, 4 weight vectors and 1
 *     activation vector, 29 of the 32 registers.
 *   q8_0, q4_0 weights: one block (32 elements) per step: two SDOTs of 16
 *     signed bytes each into one int32x4 (exact: at most 8 * 127 * 128 per
 *     lane), converted to f32 and multiplied into the output's accumulator
 *     by the product of the two block scales (one FMA). q4_0's nibbles are
 *     made signed (q - 8) first. SDOT multiplies signed by signed, so the
 *     activations are ref.c's own Q8_0 blocks: no private layout, no sign
 *     trick (avx2.c's vpmaddubsw needs one). 2x4 tiles.
 *
 * Every output is summed by one sequence whatever the tile it is in: the
 * same steps into the same accumulators, the k % 4 tail (f types) as one
 * more step on zero-padded copies, the accumulators added, then FADDP's
 * pairwise tree (vaddvq_f32). So all tile shapes give the same bits, as
 * vec.h requires. Elementwise tails run the vector formula on zero-padded
 * copies, so an element's bits do not depend on where a batch splits.
 *
 * Built with -march=armv8.2-a+dotprod (the Makefile's ISA_neon), so the
 * dispatcher picks this table only on CPUs that report asimddp
 * (cpu_backend.c): Neoverse N1 and later (AWS Graviton 2-4, Ampere Altra,
 * Azure Cobalt, Google Axion), Apple M1 and later. Cortex-A72 class CPUs
 * (Graviton 1, Raspberry Pi 4) run ref. A table without SDOT for those
 * would need a widening-multiply recipe of its own; not written yet.
 *
 * Tested bit for bit under qemu-user (t/engine/aarch64.t), never timed on
 * Arm hardware: no K blocking, no repacked layout (mm slots 5 and 6 stay
 * empty, so weights keep the file's layout), no attention block kernels.
 * Those are avx512.c's speed-ups and wait for a machine to measure them on. */

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "vec.h"

#define INLINE static inline __attribute__((always_inline))

enum { T_F32, T_F16, T_BF16, T_Q8, T_Q4 };

#define F_MR    3
#define F_NR    4
#define F_ACC   2
#define Q_MR    2
#define Q_NR    4
#define MR_MAX  3
#define NR_MAX  4

INLINE int t_nr(const int T)   { return T <= T_BF16 ? F_NR : Q_NR; }
INLINE int t_acc(const int T)  { return T <= T_BF16 ? F_ACC : 1; }
INLINE int t_step(const int T) { return T <= T_BF16 ? 4 : 32; }

/* f16 bits to f32 with FCVT: exact, as f16_to_f32. */
INLINE float h2f(uint16_t h) {
    __fp16 v;

    memcpy(&v, &h, sizeof(v));
    return (float) v;
}

INLINE float32x4_t load_f16(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

INLINE float32x4_t load_bf16(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}


/* ---- exp -------------------------------------------------------------------- */

/* e^x, avx2.c's exp8 (Cephes expf, about 1 ulp on [-87.3, 88.3], clamped
 * there) four lanes wide, with the same operations in the same order. */
INLINE float32x4_t exp4(float32x4_t x) {
    float32x4_t n, r, p;
    int32x4_t   e;

    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.3f)), vdupq_n_f32(-87.3f));
    n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504f)));
    r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* Lane i is all ones for i < n (n <= 4). */
INLINE uint32x4_t first_lanes(int64_t n) {
    static const uint32_t idx[4] = { 0, 1, 2, 3 };

    return vcltq_u32(vld1q_u32(idx), vdupq_n_u32((uint32_t) n));
}


/* ---- matmul: one step of each weight type ---------------------------------- */

typedef struct {
    float32x4_t f;          // f types: 4 weights
    int8x16_t   lo, hi;     // q types: elements 0..15 and 16..31, signed
    float       d;          //   and the block scale
} WOp;

typedef struct {
    float32x4_t f;          // f types: 4 activations
    int8x16_t   lo, hi;     // q types: a Q8_0 block's bytes
    float       d;          //   and its scale
} XOp;

INLINE WOp load_w(const int T, const char *w, int64_t s) {
    WOp o;

    memset(&o, 0, sizeof(o));
    if (T == T_F32) {
        o.f = vld1q_f32((const float *) w + s * 4);
    } else if (T == T_F16) {
        o.f = load_f16((const uint16_t *) w + s * 4);
    } else if (T == T_BF16) {
        o.f = load_bf16((const uint16_t *) w + s * 4);
    } else if (T == T_Q8) {
        const BlockQ8_0 *b = (const BlockQ8_0 *) w + s;

        o.lo = vld1q_s8(b->qs);
        o.hi = vld1q_s8(b->qs + 16);
        o.d = h2f(b->d);
    } else {
        /* elements 0..15 are the low nibbles, 16..31 the high ones */
        const BlockQ4_0 *b = (const BlockQ4_0 *) w + s;
        uint8x16_t       v = vld1q_u8(b->qs);

        o.lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))),
                        vdupq_n_s8(8));
        o.hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)),
                        vdupq_n_s8(8));
        o.d = h2f(b->d);
    }
    return o;
}

INLINE XOp load_x(const int T, const char *x, int64_t s) {
    XOp o;

    memset(&o, 0, sizeof(o));
    if (T <= T_BF16) {
        o.f = vld1q_f32((const float *) x + s * 4);
    } else {
        const BlockQ8_0 *b = (const BlockQ8_0 *) x + s;

        o.lo = vld1q_s8(b->qs);
        o.hi = vld1q_s8(b->qs + 16);
        o.d = h2f(b->d);
    }
    return o;
}

INLINE float32x4_t madd(const int T, XOp x, WOp w, float32x4_t acc) {
    int32x4_t p;

    if (T <= T_BF16) return vfmaq_f32(acc, x.f, w.f);
    p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), x.lo, w.lo), x.hi, w.hi);
    return vfmaq_f32(acc, vcvtq_f32_s32(p), vdupq_n_f32(x.d * w.d));
}


/* ---- matmul: the tile body -------------------------------------------------- */

INLINE void tile_step(const int T, const int MR, const int NR,
                      const char *x, size_t ldx, const char *w, size_t ldw,
                      int64_t s, float32x4_t acc[MR_MAX][NR_MAX])
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
 * step s into accumulator s % A, a tail (f types, k % 4 elements) as step
 * ns on zero-padded copies, the accumulators added, the lanes summed. */
INLINE void tile(const int T, const int MR, const int NR, int64_t k,
                 const char *x, size_t ldx, const char *w, size_t ldw,
                 float *out, size_t ldo)
{
    const int   step = t_step(T), A = t_acc(T);
    int64_t     ns = k / step, s = 0;
    int         rem = (int) (k % step);
    float32x4_t acc[2][MR_MAX][NR_MAX];

#pragma GCC unroll 2
    for (int a = 0; a < A; a++) {
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[a][i][j] = vdupq_n_f32(0.0f);
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
        /* 4 f32 activations and 4 weights of up to 4 bytes per row */
        float xp[MR_MAX][4], wp[NR_MAX][4];
        int   wb = T == T_F32 ? 4 : 2;

        memset(xp, 0, sizeof(xp));
        memset(wp, 0, sizeof(wp));
        for (int i = 0; i < MR; i++) {
            memcpy(xp[i], x + i * ldx + ns * 16, (size_t) rem * 4);
        }
        for (int j = 0; j < NR; j++) {
            memcpy(wp[j], w + j * ldw + ns * 4 * wb, (size_t) rem * wb);
        }
        /* step ns: into acc[ns % A], named by constants so that the
           accumulators stay in registers */
        if (A == 1 || ns % 2 == 0) {
            tile_step(T, MR, NR, (char *) xp, 16, (char *) wp, 16, 0, acc[0]);
        } else {
            tile_step(T, MR, NR, (char *) xp, 16, (char *) wp, 16, 0,
                      acc[A - 1]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            if (A == 2) acc[0][i][j] = vaddq_f32(acc[0][i][j], acc[1][i][j]);
            out[i * ldo + j] = vaddvq_f32(acc[0][i][j]);
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


/* ---- conversions ---------------------------------------------------------- */

/* Exactly ref.c's quantization: the largest |x| (a max is exact in any
 * order), q = x * (127 / amax) rounded to nearest even (FCVTNS, rintf's
 * rounding), the scale through f32_to_f16. */
static void quantize_q8_0(const float *x, BlockQ8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++, x += QK) {
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        float       amax, id;

        for (int j = 0; j < 8; j++) {
            v[j] = vld1q_f32(x + j * 4);
            m = vmaxq_f32(m, vabsq_f32(v[j]));
        }
        amax = vmaxvq_f32(m);
        id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 8; j += 2) {
            int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(v[j], id));
            int32x4_t c = vcvtnq_s32_f32(vmulq_n_f32(v[j + 1], id));

            vst1_s8(y[b].qs + j * 4, vqmovn_s16(vcombine_s16(vqmovn_s32(a),
                                                             vqmovn_s32(c))));
        }
        y[b].d = f32_to_f16(amax / 127.0f);
    }
}

/* FCVT rounds to nearest even, as f32_to_f16 does (NaN payloads aside), so
 * the scalar tail gives the same bits. */
static void to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    }
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static void dequantize(DType t, const void *row, float *y, int64_t n) {
    const uint16_t *h = row;
    int64_t         i = 0;

    switch (t) {
    case DT_F16:
    case DT_BF16:
        for (; i + 4 <= n; i += 4) {
            vst1q_f32(y + i, t == DT_F16 ? load_f16(h + i) : load_bf16(h + i));
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
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t     i = 0;
    float       s;

    for (; i + 4 <= n; i += 4) {
        acc = vfmaq_f32(acc, load_f16(a + i), vld1q_f32(b + i));
    }
    s = vaddvq_f32(acc);
    for (; i < n; i++) s += f16_to_f32(a[i]) * b[i];
    return s;
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_f16(x + i), a));
    }
    for (; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}


/* ---- elementwise ------------------------------------------------------------ */

static float sum_sq(const float *x, int64_t n) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    int64_t     i = 0;

    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);

        acc = vfmaq_f32(acc, v, v);
    }
    if (i < n) {
        float       p[4] = { 0 };
        float32x4_t v;

        memcpy(p, x + i, (size_t) (n - i) * sizeof(float));
        v = vld1q_f32(p);
        acc = vfmaq_f32(acc, v, v);
    }
    return vaddvq_f32(acc);
}

/* (x * s) * w, ref.c's order, so the result is bit-exact with it. */
static void scale_mul(float *y, const float *x, float s, const float *w,
                      int64_t n)
{
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), s),
                                   vld1q_f32(w + i)));
    }
    for (; i < n; i++) y[i] = x[i] * s * w[i];
}

INLINE float32x4_t silu_mul4(float32x4_t g, float32x4_t u) {
    float32x4_t e = exp4(vsubq_f32(vdupq_n_f32(0.0f), g));

    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

/* The tail is the vector formula on zero-padded copies: an element gets
 * the same bits wherever a batch puts it. */
static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, silu_mul4(vld1q_f32(g + i), vld1q_f32(u + i)));
    }
    if (i < n) {
        float gp[4] = { 0 }, up[4] = { 0 }, yp[4];

        memcpy(gp, g + i, (size_t) (n - i) * sizeof(float));
        memcpy(up, u + i, (size_t) (n - i) * sizeof(float));
        vst1q_f32(yp, silu_mul4(vld1q_f32(gp), vld1q_f32(up)));
        memcpy(y + i, yp, (size_t) (n - i) * sizeof(float));
    }
}

static float exp_sum(float *y, const float *x, float max, int64_t n) {
    float32x4_t vm = vdupq_n_f32(max), acc = vdupq_n_f32(0.0f);
    int64_t     i = 0;

    for (; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vm));

        vst1q_f32(y + i, e);
        acc = vaddq_f32(acc, e);
    }
    if (i < n) {
        float       xp[4] = { 0 }, yp[4];
        float32x4_t e;

        memcpy(xp, x + i, (size_t) (n - i) * sizeof(float));
        e = exp4(vsubq_f32(vld1q_f32(xp), vm));
        vst1q_f32(yp, e);
        memcpy(y + i, yp, (size_t) (n - i) * sizeof(float));
        /* the padding lanes hold e^-max: keep them out of the sum */
        acc = vaddq_f32(acc, vreinterpretq_f32_u32(vandq_u32(
            vreinterpretq_u32_f32(e), first_lanes(n - i))));
    }
    return vaddvq_f32(acc);
}

static void add(float *y, const float *x, int64_t n) {
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    }
    for (; i < n; i++) y[i] += x[i];
}

static void scale(float *y, float s, int64_t n) {
    int64_t i = 0;

    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), s));
    }
    for (; i < n; i++) y[i] *= s;
}

const CpuVec cpu_vec_neon = {
    .name = "neon",
    .mm = {
        { DT_F32,  gemm_f32,  F_MR, F_NR, NULL, NULL },
        { DT_F32,  gemm_f16,  F_MR, F_NR, NULL, NULL },
        { DT_F32,  gemm_bf16, F_MR, F_NR, NULL, NULL },
        { DT_Q8_0, gemm_q8_0, Q_MR, Q_NR, NULL, NULL },
        { DT_Q8_0, gemm_q4_0, Q_MR, Q_NR, NULL, NULL },
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
    /* GeGLU and soft-capping are rare and cheap next to matmul: scalar */
    .gelu_mul = ref_gelu_mul,
    .tanh_scale = ref_tanh_scale,
};

/* ref.c -- the scalar reference kernels.
 *
 * Plain C with one accumulator per output, in index order: slow, obviously
 * right, and the yardstick every SIMD table is tested against. It is also a
 * working backend ("--isa ref") for CPUs without AVX2, and the fallback of
 * every other table for the weight types it has no gemm for (vec_gemm).
 * Quantized dot products follow ggml's scalar (generic) vec_dot of each
 * type, so results agree with llama.cpp's: exact int32 sums per block or
 * sub-block against activations quantized to ggml's vec_dot_type, scaled
 * and accumulated in f32 in ggml's order (noted per type below). */

#include <math.h>

#include "vec.h"

static float dot_f32(const float *x, const float *w, int64_t k) {
    float s = 0.0f;

    for (int64_t i = 0; i < k; i++) s += x[i] * w[i];
    return s;
}

static float dot_f16w(const float *x, const uint16_t *w, int64_t k) {
    float s = 0.0f;

    for (int64_t i = 0; i < k; i++) s += x[i] * f16_to_f32(w[i]);
    return s;
}

static float dot_bf16w(const float *x, const uint16_t *w, int64_t k) {
    float s = 0.0f;

    for (int64_t i = 0; i < k; i++) s += x[i] * bf16_to_f32(w[i]);
    return s;
}

static float dot_q8_0(const BlockQ8_0 *x, const BlockQ8_0 *w, int64_t k) {
    float s = 0.0f;

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        for (int j = 0; j < QK; j++) is += x[b].qs[j] * w[b].qs[j];
        s += (float) is * (f16_to_f32(x[b].d) * f16_to_f32(w[b].d));
    }
    return s;
}

static float dot_q4_0(const BlockQ8_0 *x, const BlockQ4_0 *w, int64_t k) {
    float s = 0.0f;

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        for (int j = 0; j < QK / 2; j++) {
            is += x[b].qs[j] * ((w[b].qs[j] & 0x0f) - 8);
            is += x[b].qs[j + QK / 2] * ((w[b].qs[j] >> 4) - 8);
        }
        s += (float) is * (f16_to_f32(x[b].d) * f16_to_f32(w[b].d));
    }
    return s;
}

/* Q4_1 and Q5_1 read Q8_1 activations, whose s = d_x * sum(q_x) carries
 * the min: sum over the block of (d q + m) d_x q_x = d d_x sum(q q_x) +
 * m s. Per block, in f32: (d d_x) * isum + m * s, then added to the
 * total (ggml's order). */
static float dot_q4_1(const BlockQ8_1 *x, const BlockQ4_1 *w, int64_t k) {
    float s = 0.0f;

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        for (int j = 0; j < QK / 2; j++) {
            is += x[b].qs[j] * (w[b].qs[j] & 0x0f);
            is += x[b].qs[j + QK / 2] * (w[b].qs[j] >> 4);
        }
        s += (f16_to_f32(w[b].d) * f16_to_f32(x[b].d)) * (float) is
             + f16_to_f32(w[b].m) * f16_to_f32(x[b].s);
    }
    return s;
}

static float dot_q5_1(const BlockQ8_1 *x, const BlockQ5_1 *w, int64_t k) {
    float s = 0.0f;
    int   q[QK];

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        q5_values(w[b].qs, w[b].qh, q);
        for (int j = 0; j < QK; j++) is += x[b].qs[j] * q[j];
        s += (f16_to_f32(w[b].d) * f16_to_f32(x[b].d)) * (float) is
             + f16_to_f32(w[b].m) * f16_to_f32(x[b].s);
    }
    return s;
}

/* Q5_0 and IQ4_NL read Q8_0 activations, as Q4_0 does: an int32 sum per
 * block times the product of the two scales. */
static float dot_q5_0(const BlockQ8_0 *x, const BlockQ5_0 *w, int64_t k) {
    float s = 0.0f;
    int   q[QK];

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        q5_values(w[b].qs, w[b].qh, q);
        for (int j = 0; j < QK; j++) is += x[b].qs[j] * (q[j] - 16);
        s += (f16_to_f32(w[b].d) * f16_to_f32(x[b].d)) * (float) is;
    }
    return s;
}

static float dot_iq4_nl(const BlockQ8_0 *x, const BlockIQ4_NL *w,
                        int64_t k)
{
    float s = 0.0f;

    for (int64_t b = 0; b < k / QK; b++) {
        int32_t is = 0;

        for (int j = 0; j < QK / 2; j++) {
            is += x[b].qs[j] * iq4nl_values[w[b].qs[j] & 0x0f];
            is += x[b].qs[j + QK / 2] * iq4nl_values[w[b].qs[j] >> 4];
        }
        s += (f16_to_f32(x[b].d) * f16_to_f32(w[b].d)) * (float) is;
    }
    return s;
}

/* The K-quants read Q8_K activations (f32 d_x, sums of q_x per 16), so a
 * min costs one product per 16 elements: sum (d sc q - dmin mn) d_x q_x =
 * d d_x sum(sc q q_x) - dmin d_x sum(mn bsum). */

/* Q2_K, per super-block: the scaled int32 sum isum and the min term
 * msum, then total += (d d_x) * isum - (dmin d_x) * msum. */
static float dot_q2_K(const BlockQ8_K *x, const BlockQ2_K *w, int64_t k) {
    float  s = 0.0f;
    KBlock kb;

    for (int64_t b = 0; b < k / QK_K; b++) {
        int32_t is = 0, ms = 0;

        kblock_unpack(DT_Q2_K, &w[b], &kb);
        for (int i = 0; i < QK_K / 16; i++) {
            int32_t sub = 0;

            for (int l = 16 * i; l < 16 * i + 16; l++) {
                sub += x[b].qs[l] * kb.q[l];
            }
            is += kb.sc[i] * sub;
            ms += kb.mn[i] * x[b].bsums[i];
        }
        s += (x[b].d * kb.d) * (float) is - (x[b].d * kb.dmin) * (float) ms;
    }
    return s;
}

/* Q3_K..Q6_K keep 8 f32 lanes, as ggml's scalar code does: per
 * super-block, lane l gets (d d_x) * the int32 sum over elements e = l
 * mod 8 of sc q q_x; the min terms (Q4_K, Q5_K) go to a separate total,
 * which the lanes are added to in order at the end. */
static float dot_k_lanes(DType t, const BlockQ8_K *x, const void *w,
                         int64_t k)
{
    size_t bs = dtype_row_bytes(t, QK_K);
    float  lanes[8] = { 0 }, s = 0.0f;
    KBlock kb;

    for (int64_t b = 0; b < k / QK_K; b++) {
        int32_t acc[8] = { 0 }, ms = 0;

        kblock_unpack(t, (const char *) w + b * bs, &kb);
        for (int e = 0; e < QK_K; e++) {
            acc[e % 8] += kb.sc[e / 16] * (x[b].qs[e] * kb.q[e]);
        }
        for (int l = 0; l < 8; l++) lanes[l] += (kb.d * x[b].d) * (float) acc[l];
        if (t == DT_Q4_K || t == DT_Q5_K) {
            for (int i = 0; i < QK_K / 16; i++) ms += x[b].bsums[i] * kb.mn[i];
            s -= (kb.dmin * x[b].d) * (float) ms;
        }
    }
    for (int l = 0; l < 8; l++) s += lanes[l];
    return s;
}

static float dot_q3_K(const BlockQ8_K *x, const BlockQ3_K *w, int64_t k) {
    return dot_k_lanes(DT_Q3_K, x, w, k);
}

static float dot_q4_K(const BlockQ8_K *x, const BlockQ4_K *w, int64_t k) {
    return dot_k_lanes(DT_Q4_K, x, w, k);
}

static float dot_q5_K(const BlockQ8_K *x, const BlockQ5_K *w, int64_t k) {
    return dot_k_lanes(DT_Q5_K, x, w, k);
}

static float dot_q6_K(const BlockQ8_K *x, const BlockQ6_K *w, int64_t k) {
    return dot_k_lanes(DT_Q6_K, x, w, k);
}

/* IQ4_XS: an int32 sum per 32-element sub-block, total += ((d d_x) *
 * sc) * isum. */
static float dot_iq4_xs(const BlockQ8_K *x, const BlockIQ4_XS *w,
                        int64_t k)
{
    float s = 0.0f;

    for (int64_t b = 0; b < k / QK_K; b++) {
        float d = f16_to_f32(w[b].d) * x[b].d;

        for (int j = 0; j < QK_K / 32; j++) {
            const uint8_t *qs = w[b].qs + 16 * j;
            const int8_t  *qx = x[b].qs + 32 * j;
            int32_t        is = 0;

            for (int l = 0; l < 16; l++) {
                is += qx[l] * iq4nl_values[qs[l] & 0x0f];
                is += qx[l + 16] * iq4nl_values[qs[l] >> 4];
            }
            s += (d * (float) iq4xs_scale(&w[b], j)) * (float) is;
        }
    }
    return s;
}

/* One tile driver for every type: the dot function is the only variant. */
#define REF_GEMM(fname, xt, wt, dot)                                          \
static void fname(int64_t k, int mr, int nr, const void *x, size_t ldx,      \
                  const void *w, size_t ldw, float *out, size_t ldo) {       \
    for (int i = 0; i < mr; i++) {                                            \
        for (int j = 0; j < nr; j++) {                                        \
            out[i * ldo + j] = dot((const xt *) ((const char *) x + i * ldx), \
                                   (const wt *) ((const char *) w + j * ldw), \
                                   k);                                        \
        }                                                                     \
    }                                                                         \
}

REF_GEMM(gemm_f32, float, float, dot_f32)
REF_GEMM(gemm_f16, float, uint16_t, dot_f16w)
REF_GEMM(gemm_bf16, float, uint16_t, dot_bf16w)
REF_GEMM(gemm_q8_0, BlockQ8_0, BlockQ8_0, dot_q8_0)
REF_GEMM(gemm_q4_0, BlockQ8_0, BlockQ4_0, dot_q4_0)
REF_GEMM(gemm_q4_1, BlockQ8_1, BlockQ4_1, dot_q4_1)
REF_GEMM(gemm_q5_0, BlockQ8_0, BlockQ5_0, dot_q5_0)
REF_GEMM(gemm_q5_1, BlockQ8_1, BlockQ5_1, dot_q5_1)
REF_GEMM(gemm_q2_K, BlockQ8_K, BlockQ2_K, dot_q2_K)
REF_GEMM(gemm_q3_K, BlockQ8_K, BlockQ3_K, dot_q3_K)
REF_GEMM(gemm_q4_K, BlockQ8_K, BlockQ4_K, dot_q4_K)
REF_GEMM(gemm_q5_K, BlockQ8_K, BlockQ5_K, dot_q5_K)
REF_GEMM(gemm_q6_K, BlockQ8_K, BlockQ6_K, dot_q6_K)
REF_GEMM(gemm_iq4_nl, BlockQ8_0, BlockIQ4_NL, dot_iq4_nl)
REF_GEMM(gemm_iq4_xs, BlockQ8_K, BlockIQ4_XS, dot_iq4_xs)

static void quantize_q8_0(const float *x, BlockQ8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++, x += QK) {
        float amax = 0.0f, id;

        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = f32_to_f16(amax / 127.0f);
        for (int j = 0; j < QK; j++) y[b].qs[j] = (int8_t) rintf(x[j] * id);
    }
}

static void to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f32_to_f16(x[i]);
}

static float dot_f16(const uint16_t *a, const float *b, int64_t n) {
    return dot_f16w(b, a, n);
}

static void axpy_f16(float *y, float a, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * f16_to_f32(x[i]);
}

static float sum_sq(const float *x, int64_t n) {
    float s = 0.0f;

    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
    return s;
}

static void scale_mul(float *y, const float *x, float s, const float *w,
                      int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float exp_sum(float *y, const float *x, float max, int64_t n) {
    float s = 0.0f;

    for (int64_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - max);
        s += y[i];
    }
    return s;
}

static void add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void scale(float *y, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= s;
}

/* ggml's gelu (tanh approximation) with its constants and order of
 * operations, so that through the f16 rounding below we land on the
 * entries of its table. */
static float gelu_tanh(float x) {
    const float a = 0.044715f, s2pi = 0.79788456080286535587989211986876f;

    return 0.5f * x * (1.0f + tanhf(s2pi * x * (1.0f + a * x * x)));
}

/* ggml's CPU geglu reads gelu from a table indexed by the f16 bits of g
 * (entries rounded to f16), clamped outside [-10, 10]; computing the entry
 * on the fly gives its values without the 128 KiB table. */
void ref_gelu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];

        if (x <= -10.0f) {
            y[i] = 0.0f;
        } else if (x >= 10.0f) {
            y[i] = x * u[i];
        } else {
            float xh = f16_to_f32(f32_to_f16(x));

            y[i] = f16_to_f32(f32_to_f16(gelu_tanh(xh))) * u[i];
        }
    }
}

void ref_tanh_scale(float *y, const float *x, float s_in, float s_out,
                    int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = s_out * tanhf(x[i] * s_in);
}

const CpuVec cpu_vec_ref = {
    .name = "ref",
    .mm = {
        { DT_F32,  gemm_f32,  1, 1 },
        { DT_F32,  gemm_f16,  1, 1 },
        { DT_F32,  gemm_bf16, 1, 1 },
        { DT_Q8_0, gemm_q8_0, 1, 1 },
        { DT_Q8_0, gemm_q4_0, 1, 1 },
        [7]  = { DT_Q8_1, gemm_q4_1,   1, 1 },
        [8]  = { DT_Q8_0, gemm_q5_0,   1, 1 },
        [9]  = { DT_Q8_1, gemm_q5_1,   1, 1 },
        [10] = { DT_Q8_K, gemm_q2_K,   1, 1 },
        [11] = { DT_Q8_K, gemm_q3_K,   1, 1 },
        [12] = { DT_Q8_K, gemm_q4_K,   1, 1 },
        [13] = { DT_Q8_K, gemm_q5_K,   1, 1 },
        [14] = { DT_Q8_K, gemm_q6_K,   1, 1 },
        [15] = { DT_Q8_0, gemm_iq4_nl, 1, 1 },
        [16] = { DT_Q8_K, gemm_iq4_xs, 1, 1 },
    },
    .quantize_q8_0 = quantize_q8_0,
    .to_f16 = to_f16,
    .dequantize = dequantize_row,
    .dot_f16 = dot_f16,
    .axpy_f16 = axpy_f16,
    .sum_sq = sum_sq,
    .scale_mul = scale_mul,
    .silu_mul = silu_mul,
    .exp_sum = exp_sum,
    .add = add,
    .scale = scale,
    .gelu_mul = ref_gelu_mul,
    .tanh_scale = ref_tanh_scale,
};

/* ref.c -- the scalar reference kernels.
 *
 * Plain C with one accumulator per output, in index order: slow, obviously
 * right, and the yardstick every SIMD table is tested against. It is also a
 * working backend ("--isa ref") for CPUs without AVX2. Quantized dot
 * products follow ggml: an exact int32 sum per block, scaled by both block
 * scales and accumulated in f32. */

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

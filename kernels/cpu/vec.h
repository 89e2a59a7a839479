/* vec.h -- the CPU kernels' per-ISA primitives.
 *
 * The CPU backend (cpu_backend.c) owns threads and work splitting; the
 * arithmetic lives in one CpuVec table per instruction set: ref.c (scalar,
 * the reference, kept forever), avx2.c and avx512.c (x86-64), neon.c
 * (aarch64). Each ISA file is built
 * with its own -m flags and exports one table; cpu_backend.c picks one at
 * startup from what the CPU reports. The tables share these signatures, so
 * the kernel tests run every table against ref.c.
 *
 * Matmul works in panels: gemm computes an (mr x nr) block of outputs from
 * mr activation rows (at most the table's mr) and any number nr of weight
 * rows, reading both in place; the table tiles and blocks the panel itself.
 * Activations are first converted, one row at a time, to the form the table
 * asks for (f32 rows as given, Q8_0 blocks, or a table's private layout
 * through conv), so the conversion too is the same for a token whatever
 * batch it is in.
 *
 * Batch invariance: for a given k, gemm must compute out[i][j] with the same
 * operations in the same order for every mr, nr and position in the tile.
 * SIMD bodies achieve this by giving every output its own accumulators and
 * the same reduction tree; their tails run the same vector step on masked or
 * zero-padded operands. Elementwise primitives must give an element the same
 * bits whether it lands in the vector body or in the tail, because the
 * backend splits flattened batches at arbitrary points. */

#ifndef OMNI_CPU_VEC_H
#define OMNI_CPU_VEC_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define GEMM_MR_MAX 256         // most activation rows a table asks for

/* out[i * ldo + j] = x_i . w_j for i < mr, j < nr; x_i at x + i*ldx bytes,
 * w_j at w + j*ldw bytes, k elements each (k % 32 == 0 for quantized). */
typedef void (*GemmFn)(int64_t k, int mr, int nr, const void *x, size_t ldx,
                       const void *w, size_t ldw, float *out, size_t ldo);

/* Converts one activation row of k floats to a table's private form. */
typedef void (*XConvFn)(const float *x, void *y, int64_t k);

typedef struct {
    const char *name;               // "ref", "avx2", "avx512", "neon"

    /* Per weight type and layout: the activation form (DT_F32, DT_F16 or
     * DT_Q8_0) the gemm reads, the gemm itself, and the tile shape it is
     * fastest at. */
    struct {
        DType   x_form;
        GemmFn  gemm;
        int     mr;                 // activation rows per call, <= GEMM_MR_MAX
        int     nr;                 // weight rows of its tile: calls should
                                    //   start at multiples of nr
        /* (optional) private activation form: conv writes one row of k
         * elements, x_bytes(k) is its size. NULL means x_form. */
        XConvFn conv;
        size_t  (*x_bytes)(int64_t k);
    } mm[7];                        // indexed by vec_slot(); a table
                                    //   reads a WL_X16 layout when it
                                    //   fills its slot (gemm != NULL)

    /* y = x as Q8_0 blocks (k % 32 == 0): d = max|x| / 127, q = round to
     * nearest even of x * 127 / max|x|. */
    void  (*quantize_q8_0)(const float *x, BlockQ8_0 *y, int64_t k);
    /* y = x as f16, round to nearest even. */
    void  (*to_f16)(const float *x, uint16_t *y, int64_t n);
    /* Converts a weight row of type t to f32 (embedding lookups). */
    void  (*dequantize)(DType t, const void *row, float *y, int64_t n);

    /* Attention helpers over one head's f16 keys/values. */
    float (*dot_f16)(const uint16_t *a, const float *b, int64_t n);
    void  (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n);
    /* (optional) s[r] = scale * (q . k_r) for the n rows k_r = k + r*hd,
     * returns the largest s[r]. NULL means dot_f16 row by row. */
    float (*scores_f16)(float *s, const float *q, const uint16_t *k,
                        int64_t n, int64_t hd, float scale);
    /* (optional) y (hd,) += sum of p[r] * v_r for r < n, v_r = v + r*hd,
     * in an order that depends only on n. NULL means axpy_f16 row by
     * row. */
    void  (*mix_f16)(float *y, const float *p, const uint16_t *v, int64_t n,
                     int64_t hd);

    float (*sum_sq)(const float *x, int64_t n);           // sum of x^2
    void  (*scale_mul)(float *y, const float *x, float s, const float *w,
                       int64_t n);                        // y = x*s*w
    void  (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
    /* y = exp(x - max), returns the sum of y (softmax numerator). */
    float (*exp_sum)(float *y, const float *x, float max, int64_t n);
    void  (*add)(float *y, const float *x, int64_t n);    // y += x
    void  (*scale)(float *y, float s, int64_t n);         // y *= s
    /* y = gelu(g) * u, gelu through f16 as kernels.h's geglu says. */
    void  (*gelu_mul)(float *y, const float *g, const float *u, int64_t n);
    /* y = s_out * tanh(x * s_in) (soft-capping); y may equal x. */
    void  (*tanh_scale)(float *y, const float *x, float s_in, float s_out,
                        int64_t n);
} CpuVec;

/* Dense slot of a weight type and layout in CpuVec.mm, or -1 when
 * unsupported. */
static inline int vec_slot(DType t, WLayout l) {
    switch (t) {
    case DT_F32:  return l == WL_ROWS ? 0 : -1;
    case DT_F16:  return l == WL_ROWS ? 1 : -1;
    case DT_BF16: return l == WL_ROWS ? 2 : -1;
    case DT_Q8_0: return l == WL_ROWS ? 3 : 5;
    case DT_Q4_0: return l == WL_ROWS ? 4 : 6;
    default:      break;
    }
    return -1;
}

/* ref.c's scalar gelu_mul and tanh_scale, which tables without a vector
 * version name (neon). */
void ref_gelu_mul(float *y, const float *g, const float *u, int64_t n);
void ref_tanh_scale(float *y, const float *x, float s_in, float s_out,
                    int64_t n);

extern const CpuVec cpu_vec_ref;
extern const CpuVec cpu_vec_avx2;
extern const CpuVec cpu_vec_avx512;
extern const CpuVec cpu_vec_neon;

#endif

/* vec.h -- the CPU kernels' per-ISA primitives.
 *
 * The CPU backend (cpu_backend.c) owns threads and work splitting; the
 * arithmetic lives in one CpuVec table per instruction set: ref.c (scalar,
 * the reference, kept forever), avx2.c and avx512.c. Each ISA file is built
 * with its own -m flags and exports one table; cpu_backend.c picks one at
 * startup from what the CPU reports. The tables share these signatures, so
 * the kernel tests run every table against ref.c.
 *
 * Matmul works in tiles: gemm computes an (mr x nr) block of outputs from mr
 * activation rows and nr weight rows, reading both in place. Activations are
 * first converted, one row at a time, to the form the table asks for in
 * x_form (f32 for float weights, Q8_0 blocks for quantized ones), so the
 * conversion too is the same for a token whatever batch it is in.
 *
 * Batch invariance: for a given k, gemm must compute out[i][j] with the same
 * operations in the same order for every mr, nr and position in the tile.
 * SIMD bodies achieve this by giving every output its own accumulators and
 * the same reduction; tails use the same scalar order everywhere. */

#ifndef OMNI_CPU_VEC_H
#define OMNI_CPU_VEC_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define GEMM_MR_MAX 8           // largest tile the driver asks for, x rows
#define GEMM_NR_MAX 8           //   and weight rows

/* out[i * ldo + j] = x_i . w_j for i < mr, j < nr; x_i at x + i*ldx bytes,
 * w_j at w + j*ldw bytes, k elements each (k % 32 == 0 for quantized). */
typedef void (*GemmFn)(int64_t k, int mr, int nr, const void *x, size_t ldx,
                       const void *w, size_t ldw, float *out, size_t ldo);

typedef struct {
    const char *name;               // "ref", "avx2", "avx512"

    /* Per weight type: the activation form (DT_F32, DT_F16 or DT_Q8_0) the
     * gemm reads, the gemm itself, and the tile shape it is fastest at. */
    struct {
        DType  x_form;
        GemmFn gemm;
        int    mr, nr;              // preferred tile, <= GEMM_*_MAX
    } mm[5];                        // indexed by vec_dtype_slot()

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

    float (*sum_sq)(const float *x, int64_t n);           // sum of x^2
    void  (*scale_mul)(float *y, const float *x, float s, const float *w,
                       int64_t n);                        // y = x*s*w
    void  (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
    /* y = exp(x - max), returns the sum of y (softmax numerator). */
    float (*exp_sum)(float *y, const float *x, float max, int64_t n);
    void  (*add)(float *y, const float *x, int64_t n);    // y += x
    void  (*scale)(float *y, float s, int64_t n);         // y *= s
} CpuVec;

/* Dense slot of a weight type in CpuVec.mm, or -1 when unsupported. */
static inline int vec_dtype_slot(DType t) {
    switch (t) {
    case DT_F32:  return 0;
    case DT_F16:  return 1;
    case DT_BF16: return 2;
    case DT_Q8_0: return 3;
    case DT_Q4_0: return 4;
    }
    return -1;
}

extern const CpuVec cpu_vec_ref;
extern const CpuVec cpu_vec_avx2;
extern const CpuVec cpu_vec_avx512;

#endif

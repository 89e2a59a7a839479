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
 * asks for (f32 rows as given, f16, Q8_0, Q8_1 or Q8_K blocks, or a table's
 * private layout through conv), so the conversion too is the same for a
 * token whatever batch it is in.
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
 * w_j at w + j*ldw bytes, k elements each (a multiple of the weight
 * type's block). */
typedef void (*GemmFn)(int64_t k, int mr, int nr, const void *x, size_t ldx,
                       const void *w, size_t ldw, float *out, size_t ldo);

/* Converts one activation row of k floats to a table's private form. */
typedef void (*XConvFn)(const float *x, void *y, int64_t k);

/* How a table multiplies one weight type and layout: the activation form
 * (DT_F32, DT_F16, DT_Q8_0, DT_Q8_1 or DT_Q8_K) its gemm reads, the gemm,
 * and the tile shape it is fastest at. gemm NULL means the table leaves
 * the slot to ref.c's entry (vec_gemm), or, for a WL_X16 slot, that it
 * does not read that layout (matrices stay as stored). */
typedef struct {
    DType   x_form;
    GemmFn  gemm;
    int     mr;                     // activation rows per call, <= GEMM_MR_MAX
    int     nr;                     // weight rows of its tile: calls should
                                    //   start at multiples of nr
    /* (optional) private activation form: conv writes one row of k
     * elements, x_bytes(k) is its size. NULL means x_form, converted by
     * the table's quantize_q8_0 or to_f16, or by dtype.c's reference
     * quantizers for Q8_1 and Q8_K. */
    XConvFn conv;
    size_t  (*x_bytes)(int64_t k);
} CpuGemm;

#define VEC_SLOTS 17                // weight types and layouts, vec_slot()

typedef struct {
    const char *name;               // "ref", "avx2", "avx512", "neon"

    CpuGemm mm[VEC_SLOTS];          // indexed by vec_slot()

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
 * unsupported. Only Q8_0 and Q4_0 have a WL_X16 layout. */
static inline int vec_slot(DType t, WLayout l) {
    if (l == WL_X16) return t == DT_Q8_0 ? 5 : t == DT_Q4_0 ? 6 : -1;
    switch (t) {
    case DT_F32:    return 0;
    case DT_F16:    return 1;
    case DT_BF16:   return 2;
    case DT_Q8_0:   return 3;
    case DT_Q4_0:   return 4;
    case DT_Q4_1:   return 7;
    case DT_Q5_0:   return 8;
    case DT_Q5_1:   return 9;
    case DT_Q2_K:   return 10;
    case DT_Q3_K:   return 11;
    case DT_Q4_K:   return 12;
    case DT_Q5_K:   return 13;
    case DT_Q6_K:   return 14;
    case DT_IQ4_NL: return 15;
    case DT_IQ4_XS: return 16;
    default:        break;
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

/* The entry that multiplies slot s for table v: v's own, or ref.c's where
 * v has no gemm for a stored (WL_ROWS) slot, so every set runs every type
 * (at the scalar speed until it gets its own kernel). A WL_X16 slot is v's
 * own: gemm NULL there means v does not read the layout. NULL for s < 0
 * (vec_slot's unsupported type). */
static inline const CpuGemm *vec_gemm(const CpuVec *v, int s) {
    if (s < 0 || s >= VEC_SLOTS) return NULL;
    if (v->mm[s].gemm != NULL || s == vec_slot(DT_Q8_0, WL_X16)
        || s == vec_slot(DT_Q4_0, WL_X16))
    {
        return &v->mm[s];
    }
    return &cpu_vec_ref.mm[s];
}

#endif

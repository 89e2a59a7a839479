/* dtype.h -- the weight types the kernels run, their block layouts, and
 * scalar conversions.
 *
 * Type ids are ggml's, so a GGUF tensor's type field maps to DType directly.
 * Quantized types store blocks of 32 weights with one f16 scale:
 *
 *   Q8_0: w = d * q,        q int8                      (34 bytes / 32)
 *   Q4_0: w = d * (q - 8),  q in 0..15, two per byte:   (18 bytes / 32)
 *         byte j holds element j (low nibble) and element j+16 (high).
 *
 * The scalar f16/bf16 conversions here are exact (round to nearest even)
 * and are the reference the SIMD paths are tested against.
 *
 * A quantized matrix is either read as stored (WL_ROWS) or, once a backend
 * has repacked it in place, in groups of 16 blocks (WL_X16), the same bytes
 * rearranged so that one 64-byte vector load holds 4 weights of each of 16
 * blocks. A row of nb blocks holds nb / 16 groups, then its last nb % 16
 * blocks as stored. A group of 16 blocks b0..b15 is
 *
 *   16 f16 scales d(b0) .. d(b15)                           32 bytes
 *   Q8_0: 8 chunks c = 0..7 of 64 bytes, byte 4i+t of chunk c holding
 *         qs[4c+t] of block bi as unsigned: q + 128     512 bytes (544)
 *   Q4_0: 4 chunks c = 0..3 of 64 bytes, byte 4i+t of chunk c holding
 *         byte qs[4c+t] of block bi (elements 4c+t and 16+4c+t)
 *                                                       256 bytes (288)
 *
 * so a group takes the bytes of its 16 blocks and a row keeps its size. */

#ifndef OMNI_DTYPE_H
#define OMNI_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DT_F32    = 0,
    DT_F16    = 1,
    DT_Q4_0   = 2,
    DT_Q4_1   = 3,
    DT_Q5_0   = 6,
    DT_Q5_1   = 7,
    DT_Q8_0   = 8,
    DT_Q8_1   = 9,              // activations only (Q4_1/Q5_1 dot products)
    DT_Q2_K   = 10,
    DT_Q3_K   = 11,
    DT_Q4_K   = 12,
    DT_Q5_K   = 13,
    DT_Q6_K   = 14,
    DT_Q8_K   = 15,             // activations only (K-quant dot products)
    DT_IQ4_NL = 20,
    DT_IQ4_XS = 23,
    DT_BF16   = 30,
} DType;

#define QK 32                       // elements per quantized block
#define QK_K 256                    // elements per K-quant super-block
#define K_SCALE_SIZE 12             // Q4_K/Q5_K packed 6-bit scales, mins

typedef struct {
    uint16_t d;                     // f16 scale
    int8_t   qs[QK];
} BlockQ8_0;

typedef struct {
    uint16_t d;                     // f16 scale
    uint8_t  qs[QK / 2];
} BlockQ4_0;

/* The other ggml block layouts, byte for byte (ggml-common.h); what each
 * field means is in dtype.c's dequantizers, the definition of the type. */
typedef struct {
    uint16_t d, m;                  // f16 scale and min: w = d * q + m
    uint8_t  qs[QK / 2];            // as Q4_0
} BlockQ4_1;

typedef struct {
    uint16_t d;
    uint8_t  qh[4];                 // bit j: fifth bit of element j
    uint8_t  qs[QK / 2];            // low nibbles, as Q4_0; w = d*(q - 16)
} BlockQ5_0;

typedef struct {
    uint16_t d, m;                  // w = d * q + m
    uint8_t  qh[4];
    uint8_t  qs[QK / 2];
} BlockQ5_1;

typedef struct {
    uint16_t d;                     // f16 scale
    uint16_t s;                     // f16 of d * sum(qs)
    int8_t   qs[QK];
} BlockQ8_1;

typedef struct {
    uint8_t  scales[QK_K / 16];     // low nibble scale, high nibble min
    uint8_t  qs[QK_K / 4];
    uint16_t d, dmin;
} BlockQ2_K;

typedef struct {
    uint8_t  hmask[QK_K / 8];
    uint8_t  qs[QK_K / 4];
    uint8_t  scales[12];            // 16 6-bit scales
    uint16_t d;
} BlockQ3_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t  scales[K_SCALE_SIZE];  // 8 6-bit scales and 8 6-bit mins
    uint8_t  qs[QK_K / 2];
} BlockQ4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t  scales[K_SCALE_SIZE];
    uint8_t  qh[QK_K / 8];
    uint8_t  qs[QK_K / 2];
} BlockQ5_K;

typedef struct {
    uint8_t  ql[QK_K / 2];
    uint8_t  qh[QK_K / 4];
    int8_t   scales[QK_K / 16];
    uint16_t d;
} BlockQ6_K;

typedef struct {
    float    d;                     // f32 scale, unlike every other block
    int8_t   qs[QK_K];
    int16_t  bsums[QK_K / 16];      // sums of qs in groups of 16
} BlockQ8_K;

typedef struct {
    uint16_t d;
    uint8_t  qs[QK / 2];            // indices into the IQ4_NL table
} BlockIQ4_NL;

typedef struct {
    uint16_t d;
    uint16_t scales_h;              // 2 high bits of 8 6-bit scales
    uint8_t  scales_l[QK_K / 64];   // 4 low bits of 8 scales
    uint8_t  qs[QK_K / 2];
} BlockIQ4_XS;

typedef enum {
    WL_ROWS = 0,                    // blocks one after another, as in GGUF
    WL_X16,                         // groups of 16 interleaved blocks
} WLayout;

#define X16 16                      // blocks per WL_X16 group

_Static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");
_Static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");
_Static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block must be 20 bytes");
_Static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");
_Static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");
_Static_assert(sizeof(BlockQ8_1) == 36, "Q8_1 block must be 36 bytes");
_Static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block must be 84 bytes");
_Static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block must be 110 bytes");
_Static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");
_Static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");
_Static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");
_Static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block must be 292 bytes");
_Static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block must be 18 bytes");
_Static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block must be 136 bytes");

/* True for the ggml type ids in DType. */
bool        dtype_supported(uint32_t type);
const char *dtype_name(DType t);
/* Bytes of a row of n elements (n a multiple of the block size). */
size_t      dtype_row_bytes(DType t, int64_t n);
/* Elements per block: 1 or QK. */
int64_t     dtype_block(DType t);

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;

    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000 | (man << 13));
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0) return f32_from_bits(sign);
    /* subnormal: value = man * 2^-24, exact in f32 */
    return (sign ? -1.0f : 1.0f) * (float) man * 5.9604644775390625e-8f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffff;

    if (a >= 0x7f800000) {                       /* inf or nan */
        return (uint16_t) (sign | 0x7c00 | (a > 0x7f800000 ? 0x200 : 0));
    }
    if (a >= 0x477ff000) return (uint16_t) (sign | 0x7c00);   /* overflow */
    if (a < 0x38800000) {                        /* subnormal or zero */
        /* adding 0.5 makes the FPU round to 2^-24 units (nearest even);
           a carry into bit 10 is the smallest normal, which is right */
        float s = f32_from_bits(a) + 0.5f;
        return (uint16_t) (sign | (f32_bits(s) - 0x3f000000));
    }
    /* normal: rebias and round to nearest even on the 13 dropped bits */
    a += ((uint32_t) (15 - 127) << 23) + 0xfff + ((a >> 13) & 1);
    return (uint16_t) (sign | (a >> 13));
}

static inline float bf16_to_f32(uint16_t h) {
    return f32_from_bits((uint32_t) h << 16);
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);

    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t) ((u >> 16) | 64);
    return (uint16_t) ((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* Reference quantizers (ggml's rounding), used to write model files. */
void quantize_row_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t k);
void quantize_row_q4_0_ref(const float *x, BlockQ4_0 *y, int64_t k);
/* Stores a row of n f32 values as type t (the reference rounding); the
 * inverse of dequantize_row. */
void quantize_row(DType t, const float *src, void *dst, int64_t n);
/* Converts a row of n elements of type t to f32. */
void dequantize_row(DType t, const void *row, float *out, int64_t n);

/* Rewrites a row of n elements of type t (Q8_0 or Q4_0, n % 32 == 0) in
 * place from WL_ROWS to WL_X16. Can't fail. */
void x16_pack_row(DType t, void *row, int64_t n);
/* Writes the 16 blocks (WL_ROWS) that a WL_X16 group of type t holds. */
void x16_unpack_group(DType t, const void *group, void *blocks);

#endif

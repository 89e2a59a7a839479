/* dtype.h -- the weight types the kernels run, their block layouts, and
 * scalar conversions.
 *
 * Type ids are ggml's, so a GGUF tensor's type field maps to DType directly,
 * and so are the block layouts, byte for byte (ggml-common.h). Blocks of 32
 * weights with f16 scales (d, and m where there is a min):
 *
 *   Q8_0:   w = d * q,          q int8                  (34 bytes / 32)
 *   Q4_0:   w = d * (q - 8),    q in 0..15, two per byte:   (18 / 32)
 *           byte j holds element j (low nibble) and element j+16 (high).
 *   Q4_1:   w = d * q + m,      q in 0..15 as Q4_0          (20 / 32)
 *   Q5_0:   w = d * (q - 16),   q in 0..31: low nibbles as Q4_0, bit j of
 *           the 32-bit qh is element j's fifth bit          (22 / 32)
 *   Q5_1:   w = d * q + m,      q as Q5_0                   (24 / 32)
 *   IQ4_NL: w = d * iq4nl_values[q], q in 0..15 as Q4_0     (18 / 32)
 *
 * K-quants: super-blocks of QK_K = 256 weights in sub-blocks of 16 or 32,
 * each sub-block with its own small integer scale (and min) that the f16
 * super-block scale d (and dmin) multiplies:
 *
 *   Q2_K:   16 sub-blocks of 16: w = d * sc * q - dmin * mn, q in 0..3,
 *           scales[i] = sc | mn << 4                        (84 / 256)
 *   Q3_K:   16 of 16: w = d * (sc - 32) * (q - 4 * !hbit), q in 0..3 plus
 *           a high bit in hmask, 6-bit sc packed in 12 bytes (110 / 256)
 *   Q4_K:   8 of 32: w = d * sc * q - dmin * mn, q in 0..15, 6-bit sc
 *           and mn packed in 12 bytes                       (144 / 256)
 *   Q5_K:   as Q4_K, q in 0..31 with a fifth bit in qh     (176 / 256)
 *   Q6_K:   16 of 16: w = d * sc * (q - 32), sc int8, q in 0..63 from a
 *           nibble in ql and 2 bits in qh                   (210 / 256)
 *   IQ4_XS: 8 of 32: w = d * (sc - 32) * iq4nl_values[q], 6-bit sc
 *           split into scales_l and scales_h                (136 / 256)
 *
 * dtype.c's dequantizers spell out which element sits in which bits; they
 * are the definition of each type. Activations are quantized for a dot
 * product to the form ggml pairs with the weight type (its vec_dot_type):
 * Q8_0 for Q8_0, Q4_0, Q5_0, IQ4_NL; Q8_1 (Q8_0 plus s = d * sum q) for
 * Q4_1, Q5_1; Q8_K (f32 d, int8 q, sums per 16) for the K-quants and IQ4_XS.
 *
 * The scalar f16/bf16 conversions here are exact (round to nearest even)
 * and are the reference the SIMD paths are tested against.
 *
 * A Q8_0 or Q4_0 matrix is either read as stored (WL_ROWS) or, once a
 * backend has repacked it in place, in groups of 16 blocks (WL_X16), the
 * same bytes rearranged so that one 64-byte vector load holds 4 weights of
 * each of 16 blocks; the other types are always read as stored. A row of
 * nb blocks holds nb / 16 groups, then its last nb % 16 blocks as stored.
 * A group of 16 blocks b0..b15 is
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

/* The CUDA backend's .cu files include this as C++. */
#ifdef __cplusplus
#define OMNI_STATIC_ASSERT static_assert
extern "C" {
#else
#define OMNI_STATIC_ASSERT _Static_assert
#endif

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

/* The other ggml block layouts (see the top of this file). */
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

OMNI_STATIC_ASSERT(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ4_1) == 20, "Q4_1 block must be 20 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ8_1) == 36, "Q8_1 block must be 36 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ2_K) == 84, "Q2_K block must be 84 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ3_K) == 110, "Q3_K block must be 110 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockQ8_K) == 292, "Q8_K block must be 292 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block must be 18 bytes");
OMNI_STATIC_ASSERT(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block must be 136 bytes");

/* True for the weight types the kernels run: every DType but the
 * activation-only Q8_1 and Q8_K. */
bool        dtype_supported(uint32_t type);
/* ggml's name of t ("q4_K"), or "unknown". */
const char *dtype_name(DType t);
/* Bytes of a row of n elements (n a multiple of the block size); 0 for an
 * id that is not a DType. */
size_t      dtype_row_bytes(DType t, int64_t n);
/* Elements per block: 1, QK or QK_K; 0 for an id that is not a DType. */
int64_t     dtype_block(DType t);

/* The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
extern const int8_t iq4nl_values[16];

/* Sub-block j (0..7) of a Q4_K/Q5_K super-block: its 6-bit scale and min.
 * The first four keep theirs in the low 6 bits of bytes j and j+4; the
 * last four in a nibble of byte j+4 with their top 2 bits in the spare
 * high bits of bytes j-4 and j. */
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Scale i (0..15) of a Q3_K super-block, offset removed (-32..31): its low
 * nibble is in byte i (i < 8, low) or i-8 (high), its top 2 bits in byte
 * 8 + i%4 at bit 2*(i/4). */
static inline int q3k_scale(const uint8_t *s, int i) {
    int lo = i < 8 ? s[i] & 0x0f : s[i - 8] >> 4;
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;

    return (lo | hi << 4) - 32;
}

/* Sub-block j (0..7) of an IQ4_XS super-block: its scale, offset removed
 * (-32..31). */
static inline int iq4xs_scale(const BlockIQ4_XS *b, int j) {
    int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
    int hi = (b->scales_h >> (2 * j)) & 3;

    return (lo | hi << 4) - 32;
}

/* The 5-bit values q[0..31] of a Q5_0/Q5_1 block: nibble j (low, then
 * high for j + 16) with bit j of qh (the 32 bits little-endian) on top. */
static inline void q5_values(const uint8_t *qs, const uint8_t *qh, int *q) {
    uint32_t h = (uint32_t) qh[0] | (uint32_t) qh[1] << 8
                 | (uint32_t) qh[2] << 16 | (uint32_t) qh[3] << 24;

    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 0x0f) | (int) ((h >> j) & 1) << 4;
        q[j + QK / 2] = (qs[j] >> 4) | (int) ((h >> (j + 16)) & 1) << 4;
    }
}

/* A Q2_K..Q6_K super-block unpacked to one form, element e being
 * w = (d * sc[e/16]) * q[e] - dmin * mn[e/16], the order of operations of
 * ggml's dequantizers. Q4_K/Q5_K repeat each 32-element scale and min
 * twice; Q3_K and Q6_K have no min (dmin and mn 0). */
typedef struct {
    float   d, dmin;
    int8_t  q[QK_K];                // Q2_K 0..3, Q3_K -4..3, Q4_K 0..15,
                                    //   Q5_K 0..31, Q6_K -32..31
    int8_t  sc[QK_K / 16];          // Q3_K -32..31, Q6_K int8, else 0..63
    uint8_t mn[QK_K / 16];
} KBlock;

/* Unpacks super-block blk of K-quant type t (Q2_K..Q6_K) into kb. Can't
 * fail. */
void kblock_unpack(DType t, const void *blk, KBlock *kb);

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

/* Reference quantizers (ggml's rounding): the weight forms make-model
 * writes, and the activation forms of the Q4_1/Q5_1 (Q8_1) and K-quant
 * (Q8_K) dot products, which every kernel set uses, so a token's
 * activations are the same bits on every set and in every batch. */
void quantize_row_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t k);
void quantize_row_q4_0_ref(const float *x, BlockQ4_0 *y, int64_t k);
/* d = max|x| / 127, q = roundf(x / d) (halves away from zero), s = f16 of
 * d * sum q; k % 32 == 0. */
void quantize_row_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t k);
/* With m the value of largest magnitude and s = -127 / m: q = nearest(s *
 * x) (halves to even, at most 127), d = 1 / s in f32, bsums per 16; an
 * all-zero super-block is all zeros. k % 256 == 0. */
void quantize_row_q8_K_ref(const float *x, BlockQ8_K *y, int64_t k);
/* Stores a row of n f32 values as type t (the reference rounding); the
 * inverse of dequantize_row. Returns 0, or -1 when t has no quantizer here
 * (the K-quants, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS: llama-quantize writes
 * those), leaving dst untouched. */
int  quantize_row(DType t, const float *src, void *dst, int64_t n);
/* Converts a row of n elements of type t to f32; every DType. */
void dequantize_row(DType t, const void *row, float *out, int64_t n);

/* Rewrites a row of n elements of type t (Q8_0 or Q4_0, n % 32 == 0) in
 * place from WL_ROWS to WL_X16. Can't fail. */
void x16_pack_row(DType t, void *row, int64_t n);
/* Writes the 16 blocks (WL_ROWS) that a WL_X16 group of type t holds. */
void x16_unpack_group(DType t, const void *group, void *blocks);

#ifdef __cplusplus
}
#endif

#endif

/* dtype.c -- type facts, reference quantizers and row conversion. The
 * quantizers follow ggml's reference rounding, so files written by
 * make-model hold the blocks llama.cpp's own quantizer would produce, and
 * activations quantized for a dot product are those ggml's would read.
 *
 * The dequantizers are the definition of each type (they compute each
 * value with the operations, in the order, of ggml's); the K-quants go
 * through one unpacked form, KBlock, which ref.c's dot products read too.
 * They are written for clarity, one element at a time: they serve
 * embedding rows and tests, never a matmul. */

#include <math.h>

#include "dtype.h"

/* Type facts, one row per DType. */
static const struct {
    DType       t;
    const char *name;               // ggml's
    int64_t     block;              // elements per block
    size_t      bytes;              // bytes per block
    bool        weight;             // a weight type the kernels run
} types[] = {
    { DT_F32,    "f32",    1,    4,                   true },
    { DT_F16,    "f16",    1,    2,                   true },
    { DT_BF16,   "bf16",   1,    2,                   true },
    { DT_Q8_0,   "q8_0",   QK,   sizeof(BlockQ8_0),   true },
    { DT_Q4_0,   "q4_0",   QK,   sizeof(BlockQ4_0),   true },
    { DT_Q4_1,   "q4_1",   QK,   sizeof(BlockQ4_1),   true },
    { DT_Q5_0,   "q5_0",   QK,   sizeof(BlockQ5_0),   true },
    { DT_Q5_1,   "q5_1",   QK,   sizeof(BlockQ5_1),   true },
    { DT_Q8_1,   "q8_1",   QK,   sizeof(BlockQ8_1),   false },
    { DT_Q2_K,   "q2_K",   QK_K, sizeof(BlockQ2_K),   true },
    { DT_Q3_K,   "q3_K",   QK_K, sizeof(BlockQ3_K),   true },
    { DT_Q4_K,   "q4_K",   QK_K, sizeof(BlockQ4_K),   true },
    { DT_Q5_K,   "q5_K",   QK_K, sizeof(BlockQ5_K),   true },
    { DT_Q6_K,   "q6_K",   QK_K, sizeof(BlockQ6_K),   true },
    { DT_Q8_K,   "q8_K",   QK_K, sizeof(BlockQ8_K),   false },
    { DT_IQ4_NL, "iq4_nl", QK,   sizeof(BlockIQ4_NL), true },
    { DT_IQ4_XS, "iq4_xs", QK_K, sizeof(BlockIQ4_XS), true },
};

#define N_TYPES (sizeof(types) / sizeof(types[0]))

const int8_t iq4nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10,
    1, 13, 25, 38, 53, 69, 89, 113,
};

static int type_index(uint32_t t) {
    for (size_t i = 0; i < N_TYPES; i++) {
        if ((uint32_t) types[i].t == t) return (int) i;
    }
    return -1;
}

bool dtype_supported(uint32_t type) {
    int i = type_index(type);

    return i >= 0 && types[i].weight;
}

const char *dtype_name(DType t) {
    int i = type_index(t);

    return i >= 0 ? types[i].name : "unknown";
}

int64_t dtype_block(DType t) {
    int i = type_index(t);

    return i >= 0 ? types[i].block : 0;
}

size_t dtype_row_bytes(DType t, int64_t n) {
    int i = type_index(t);

    return i >= 0 ? (size_t) (n / types[i].block) * types[i].bytes : 0;
}

void quantize_row_q8_0_ref(const float *x, BlockQ8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++, x += QK) {
        float amax = 0.0f, d, id;

        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        d = amax / 127.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK; j++) y[b].qs[j] = (int8_t) roundf(x[j] * id);
    }
}

void quantize_row_q4_0_ref(const float *x, BlockQ4_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++, x += QK) {
        float amax = 0.0f, max = 0.0f, d, id;

        /* the signed value of largest magnitude maps to -8, so the full
           range -8..7 is used on the side that needs it */
        for (int j = 0; j < QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        d = max / -8.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK / 2; j++) {
            int q0 = (int) (x[j] * id + 8.5f);
            int q1 = (int) (x[j + QK / 2] * id + 8.5f);

            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[b].qs[j] = (uint8_t) (q0 | (q1 << 4));
        }
    }
}

void quantize_row_q8_1_ref(const float *x, BlockQ8_1 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++, x += QK) {
        float amax = 0.0f, d, id;
        int   sum = 0;

        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        d = amax / 127.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < QK; j++) {
            y[b].qs[j] = (int8_t) roundf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].s = f32_to_f16((float) sum * d);
    }
}

void quantize_row_q8_K_ref(const float *x, BlockQ8_K *y, int64_t k) {
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        float amax = 0.0f, max = 0.0f, is;

        memset(&y[b], 0, sizeof(y[b]));
        for (int j = 0; j < QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        if (amax == 0.0f) continue;
        /* ggml scales by -127 (not -128) so that q never needs the -128
           its IQ kernels cannot take; rintf rounds halves to even, as
           ggml's nearest_int does */
        is = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = (int) rintf(is * x[j]);

            y[b].qs[j] = (int8_t) (v < 127 ? v : 127);
            y[b].bsums[j / 16] = (int16_t) (y[b].bsums[j / 16] + y[b].qs[j]);
        }
        y[b].d = 1.0f / is;
    }
}

int quantize_row(DType t, const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;

    switch (t) {
    case DT_F32:
        memcpy(dst, src, (size_t) n * 4);
        return 0;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_f16(src[i]);
        return 0;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
        return 0;
    case DT_Q8_0:
        quantize_row_q8_0_ref(src, dst, n);
        return 0;
    case DT_Q4_0:
        quantize_row_q4_0_ref(src, dst, n);
        return 0;
    case DT_Q8_1:
        quantize_row_q8_1_ref(src, dst, n);
        return 0;
    case DT_Q8_K:
        quantize_row_q8_K_ref(src, dst, n);
        return 0;
    default:
        return -1;
    }
}


/* ---- dequantizers: the definition of each type ---- */

static void deq_q8_0(const BlockQ8_0 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d);

        for (int j = 0; j < QK; j++) y[j] = d * x[b].qs[j];
    }
}

static void deq_q8_1(const BlockQ8_1 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d);

        for (int j = 0; j < QK; j++) y[j] = d * x[b].qs[j];
    }
}

static void deq_q4_0(const BlockQ4_0 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d);

        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * ((x[b].qs[j] & 0x0f) - 8);
            y[j + QK / 2] = d * ((x[b].qs[j] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const BlockQ4_1 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);

        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (x[b].qs[j] & 0x0f) + m;
            y[j + QK / 2] = d * (x[b].qs[j] >> 4) + m;
        }
    }
}

static void deq_q5_0(const BlockQ5_0 *x, float *y, int64_t nb) {
    int q[QK];

    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d);

        q5_values(x[b].qs, x[b].qh, q);
        for (int j = 0; j < QK; j++) y[j] = d * (q[j] - 16);
    }
}

static void deq_q5_1(const BlockQ5_1 *x, float *y, int64_t nb) {
    int q[QK];

    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d), m = f16_to_f32(x[b].m);

        q5_values(x[b].qs, x[b].qh, q);
        for (int j = 0; j < QK; j++) y[j] = d * q[j] + m;
    }
}

static void deq_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK) {
        float d = f16_to_f32(x[b].d);

        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * iq4nl_values[x[b].qs[j] & 0x0f];
            y[j + QK / 2] = d * iq4nl_values[x[b].qs[j] >> 4];
        }
    }
}

/* Q2_K and Q3_K: each 128 elements take 32 bytes of qs, element 32s + l
 * of them (s = 0..3) in bits 2s..2s+1 of byte l. Q3_K: bit e/32 of
 * hmask[e%32] set means q, clear q - 4. */
static void unpack_q2_K(const BlockQ2_K *x, KBlock *kb) {
    kb->d = f16_to_f32(x->d);
    kb->dmin = f16_to_f32(x->dmin);
    for (int e = 0; e < QK_K; e++) {
        kb->q[e] = (int8_t) ((x->qs[e / 128 * 32 + e % 32] >> (e % 128 / 32 * 2))
                             & 3);
    }
    for (int i = 0; i < QK_K / 16; i++) {
        kb->sc[i] = (int8_t) (x->scales[i] & 0x0f);
        kb->mn[i] = x->scales[i] >> 4;
    }
}

static void unpack_q3_K(const BlockQ3_K *x, KBlock *kb) {
    kb->d = f16_to_f32(x->d);
    kb->dmin = 0.0f;
    for (int e = 0; e < QK_K; e++) {
        int q = (x->qs[e / 128 * 32 + e % 32] >> (e % 128 / 32 * 2)) & 3;
        int hi = (x->hmask[e % 32] >> (e / 32)) & 1;

        kb->q[e] = (int8_t) (q - (hi ? 0 : 4));
    }
    for (int i = 0; i < QK_K / 16; i++) {
        kb->sc[i] = (int8_t) q3k_scale(x->scales, i);
        kb->mn[i] = 0;
    }
}

/* Q4_K and Q5_K: each 64 elements take 32 bytes of qs, the first 32 in
 * the low nibbles; Q5_K's fifth bit of element e is bit e/32 of
 * qh[e%32]. */
static void unpack_q45_K(const uint8_t *scales, const uint8_t *qs,
                         const uint8_t *qh, KBlock *kb)
{
    for (int e = 0; e < QK_K; e++) {
        int byte = qs[e / 64 * 32 + e % 32];
        int q = e % 64 < 32 ? byte & 0x0f : byte >> 4;

        if (qh != NULL) q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
        kb->q[e] = (int8_t) q;
    }
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, mn;

        k4_scale_min(scales, j, &sc, &mn);
        kb->sc[2 * j] = kb->sc[2 * j + 1] = (int8_t) sc;
        kb->mn[2 * j] = kb->mn[2 * j + 1] = (uint8_t) mn;
    }
}

/* Q6_K: each 128 elements take 64 bytes of ql and 32 of qh; element
 * 32s + l (s = 0..3) has its low nibble in ql[l + 32 (s & 1)] (low for
 * s < 2, high after) and its top 2 bits at bit 2s of qh[l]. */
static void unpack_q6_K(const BlockQ6_K *x, KBlock *kb) {
    kb->d = f16_to_f32(x->d);
    kb->dmin = 0.0f;
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, s = e % 128 / 32, l = e % 32;
        int lo = x->ql[64 * h + l + 32 * (s & 1)];
        int q = (s < 2 ? lo & 0x0f : lo >> 4)
                | ((x->qh[32 * h + l] >> (2 * s)) & 3) << 4;

        kb->q[e] = (int8_t) (q - 32);
    }
    for (int i = 0; i < QK_K / 16; i++) {
        kb->sc[i] = x->scales[i];
        kb->mn[i] = 0;
    }
}

void kblock_unpack(DType t, const void *blk, KBlock *kb) {
    const BlockQ4_K *q4 = blk;
    const BlockQ5_K *q5 = blk;

    switch (t) {
    case DT_Q2_K: unpack_q2_K(blk, kb); return;
    case DT_Q3_K: unpack_q3_K(blk, kb); return;
    case DT_Q4_K:
        kb->d = f16_to_f32(q4->d);
        kb->dmin = f16_to_f32(q4->dmin);
        unpack_q45_K(q4->scales, q4->qs, NULL, kb);
        return;
    case DT_Q5_K:
        kb->d = f16_to_f32(q5->d);
        kb->dmin = f16_to_f32(q5->dmin);
        unpack_q45_K(q5->scales, q5->qs, q5->qh, kb);
        return;
    case DT_Q6_K: unpack_q6_K(blk, kb); return;
    default:
        memset(kb, 0, sizeof(*kb));
        return;
    }
}

static void deq_kquant(DType t, const void *row, float *y, int64_t nb) {
    size_t bs = dtype_row_bytes(t, QK_K);
    KBlock kb;

    for (int64_t b = 0; b < nb; b++, y += QK_K) {
        kblock_unpack(t, (const char *) row + b * bs, &kb);
        for (int e = 0; e < QK_K; e++) {
            y[e] = kb.d * kb.sc[e / 16] * kb.q[e] - kb.dmin * kb.mn[e / 16];
        }
    }
}

static void deq_q8_K(const BlockQ8_K *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += QK_K) {
        for (int j = 0; j < QK_K; j++) y[j] = x[b].d * x[b].qs[j];
    }
}

/* IQ4_XS: sub-block j of 32 as an IQ4_NL block of 16 bytes at qs + 16j. */
static void deq_iq4_xs(const BlockIQ4_XS *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = f16_to_f32(x[b].d);

        for (int j = 0; j < QK_K / 32; j++, y += 32) {
            const uint8_t *qs = x[b].qs + 16 * j;
            float          dl = d * iq4xs_scale(&x[b], j);

            for (int l = 0; l < 16; l++) {
                y[l] = dl * iq4nl_values[qs[l] & 0x0f];
                y[l + 16] = dl * iq4nl_values[qs[l] >> 4];
            }
        }
    }
}

void dequantize_row(DType t, const void *row, float *out, int64_t n) {
    const uint16_t *h = row;
    int64_t         nb = n / (dtype_block(t) > 0 ? dtype_block(t) : 1);

    switch (t) {
    case DT_F32:    memcpy(out, row, (size_t) n * 4); return;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(h[i]);
        return;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(h[i]);
        return;
    case DT_Q8_0:   deq_q8_0(row, out, nb); return;
    case DT_Q8_1:   deq_q8_1(row, out, nb); return;
    case DT_Q4_0:   deq_q4_0(row, out, nb); return;
    case DT_Q4_1:   deq_q4_1(row, out, nb); return;
    case DT_Q5_0:   deq_q5_0(row, out, nb); return;
    case DT_Q5_1:   deq_q5_1(row, out, nb); return;
    case DT_IQ4_NL: deq_iq4_nl(row, out, nb); return;
    case DT_Q2_K:
    case DT_Q3_K:
    case DT_Q4_K:
    case DT_Q5_K:
    case DT_Q6_K:   deq_kquant(t, row, out, nb); return;
    case DT_Q8_K:   deq_q8_K(row, out, nb); return;
    case DT_IQ4_XS: deq_iq4_xs(row, out, nb); return;
    }
}

/* One group: scales first, then chunk c's 4-byte lane i from bytes
 * 4c..4c+3 of block i (Q8_0 biased by 128, which makes the weights the
 * unsigned operand of vpdpbusd and costs the kernel nothing). The group is
 * assembled in a copy, as it overlaps the blocks it is made of; moving
 * 4-byte words, a 1B Q8_0 model takes 0.06 s on 2 threads (0.18 byte by
 * byte). */
static void x16_pack_group(DType t, void *group) {
    uint8_t  g[X16 * sizeof(BlockQ8_0)];
    size_t   bs = t == DT_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
    int      chunks = t == DT_Q8_0 ? QK / 4 : QK / 8;
    uint32_t bias = t == DT_Q8_0 ? 0x80808080u : 0;
    uint8_t *in = group;

    for (int i = 0; i < X16; i++) {
        const uint8_t *b = in + (size_t) i * bs;

        memcpy(g + 2 * i, b, 2);
        for (int c = 0; c < chunks; c++) {
            uint32_t q;

            memcpy(&q, b + 2 + 4 * c, 4);
            q ^= bias;
            memcpy(g + 32 + 64 * c + 4 * i, &q, 4);
        }
    }
    memcpy(group, g, X16 * bs);
}

void x16_pack_row(DType t, void *row, int64_t n) {
    size_t gb = X16 * (t == DT_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));

    for (int64_t g = 0; g < n / QK / X16; g++) {
        x16_pack_group(t, (char *) row + (size_t) g * gb);
    }
}

void x16_unpack_group(DType t, const void *group, void *blocks) {
    size_t         bs = t == DT_Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
    int            chunks = t == DT_Q8_0 ? QK / 4 : QK / 8;
    uint32_t       bias = t == DT_Q8_0 ? 0x80808080u : 0;
    const uint8_t *g = group;

    for (int i = 0; i < X16; i++) {
        uint8_t *b = (uint8_t *) blocks + (size_t) i * bs;

        memcpy(b, g + 2 * i, 2);
        for (int c = 0; c < chunks; c++) {
            uint32_t q;

            memcpy(&q, g + 32 + 64 * c + 4 * i, 4);
            q ^= bias;
            memcpy(b + 2 + 4 * c, &q, 4);
        }
    }
}

/* dtype.c -- type facts, reference quantizers and row conversion. The
 * quantizers follow ggml's reference rounding, so files written by
 * make-model hold the blocks llama.cpp's own quantizer would produce. */

#include <math.h>

#include "dtype.h"

bool dtype_supported(uint32_t type) {
    return type == DT_F32 || type == DT_F16 || type == DT_BF16
           || type == DT_Q8_0 || type == DT_Q4_0;
}

const char *dtype_name(DType t) {
    switch (t) {
    case DT_F32:  return "f32";
    case DT_F16:  return "f16";
    case DT_BF16: return "bf16";
    case DT_Q8_0: return "q8_0";
    case DT_Q4_0: return "q4_0";
    default:      break;
    }
    return "unknown";
}

int64_t dtype_block(DType t) {
    return t == DT_Q8_0 || t == DT_Q4_0 ? QK : 1;
}

size_t dtype_row_bytes(DType t, int64_t n) {
    switch (t) {
    case DT_F32:  return (size_t) n * 4;
    case DT_F16:
    case DT_BF16: return (size_t) n * 2;
    case DT_Q8_0: return (size_t) (n / QK) * sizeof(BlockQ8_0);
    case DT_Q4_0: return (size_t) (n / QK) * sizeof(BlockQ4_0);
    default:      break;
    }
    return 0;
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

void quantize_row(DType t, const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;

    switch (t) {
    case DT_F32:
        memcpy(dst, src, (size_t) n * 4);
        return;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_f16(src[i]);
        return;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
        return;
    case DT_Q8_0:
        quantize_row_q8_0_ref(src, dst, n);
        return;
    case DT_Q4_0:
        quantize_row_q4_0_ref(src, dst, n);
        return;
    default:
        return;
    }
}

void dequantize_row(DType t, const void *row, float *out, int64_t n) {
    const uint16_t  *h = row;
    const BlockQ8_0 *q8 = row;
    const BlockQ4_0 *q4 = row;

    switch (t) {
    case DT_F32:
        memcpy(out, row, (size_t) n * 4);
        return;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(h[i]);
        return;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(h[i]);
        return;
    case DT_Q8_0:
        for (int64_t b = 0; b < n / QK; b++) {
            float d = f16_to_f32(q8[b].d);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * q8[b].qs[j];
        }
        return;
    case DT_Q4_0:
        for (int64_t b = 0; b < n / QK; b++) {
            float d = f16_to_f32(q4[b].d);
            for (int j = 0; j < QK / 2; j++) {
                out[b * QK + j] = d * ((q4[b].qs[j] & 0x0f) - 8);
                out[b * QK + j + QK / 2] = d * ((q4[b].qs[j] >> 4) - 8);
            }
        }
        return;
    default:
        return;
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

/* avx2_kq.c -- the avx2 set's gemms for ggml's other block types: the
 * K-quants (Q2_K..Q6_K) and IQ4_XS on Q8_K activations, Q5_0 and IQ4_NL on
 * Q8_0, Q4_1 and Q5_1 on Q8_1. avx2.c's table points at them (avx2.h);
 * this file is compiled with the avx2 flags (Makefile, ISA_avx2).
 *
 * The arithmetic is ggml's AVX2 vec_dot of each type, so sums agree with
 * llama.cpp's: weights are made unsigned bytes (vpmaddubsw's unsigned
 * operand) or, where they are signed (IQ4_*, Q5_0), taken as |w| with the
 * activations given w's sign; pair sums stay below 2^15 (at most 2 * 63 *
 * 127). The K-quants then multiply the int16 pairs by their sub-block's
 * scale (vpmaddwd) and add into one int32 vector per super-block, exact.
 * What a super-block's offset or min owes comes from the activations'
 * bsums, one vpmaddwd per super-block: Q3_K's -4 and Q6_K's -32 go into
 * the int32 sum (ggml's q8sclsub), the mins of Q2_K, Q4_K and Q5_K into a
 * second f32 term. Per super-block, in f32: acc = (d_x d) * sumi + acc,
 * then acc = (-(d_x dmin)) * msum + acc; at the end one hsum. The 32-blocks
 * (Q5_0, IQ4_NL, Q4_1, Q5_1) end each block in f32 as ggml's do: acc =
 * (d_x d) * sumi + acc, plus a scalar m * s total for the Q8_1 types.
 * Compared with ref.c (ggml's generic code) only the f32 order differs:
 * ref scales per lane or per sub-block where these scale the exact
 * super-block sum, so the two agree to f32 rounding (the tests hold them
 * to NMSE 1e-10, t/unit/test_kernels_kq.c). Q8_K activations are
 * quantized here (avx2_q8k_conv) to quantize_row_q8_K_ref's bits: the
 * scalar quantizer was 3% of a Q4_K_M prefill.
 *
 * Tiles: an output's operations depend only on its weight row and its
 * activation row, never on the tile, so batch invariance is by
 * construction: a tile of R activation rows against one weight row
 * decodes each weight chunk once and runs it against the R rows (the
 * integer work per 32 weights and row is one vpmaddubsw, one vpmaddwd, one
 * vpaddd), each row with its own accumulators. Decode (one row) streams
 * the weight rows once; batches run activation tiles of KQ_ROWS rows (L1)
 * against panels of weight rows that fit L2. Measured on Zen (one
 * thread, weights in L2, k 2048, 64 rows): Q4_K 55-60 GMAC/s, Q6_K 53-58;
 * 8-row tiles ran no faster, as the per-row integer work, not the weight
 * decoding, is the bound. */

#include "avx2.h"

#define KQ_ROWS  4              /* activation rows of a tile */
#define PANEL_KQ (128 << 10)    /* bytes of weight rows kept in L2 */

/* The weight types: K-quants (and IQ4_XS) on Q8_K, then the 32-blocks. */
enum { K_Q2, K_Q3, K_Q4, K_Q5, K_Q6, K_IQ4XS, B_Q5_0, B_IQ4NL, B_Q4_1,
       B_Q5_1 };


/* f16 to f32 with F16C (exact, as dtype.h's f16_to_f32). */
INLINE float f16s(uint16_t h) {
    return _cvtsh_ss(h);
}

/* The f16 at byte p (of a block: any alignment). */
INLINE float f16_at(const void *p) {
    uint16_t h;

    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}


/* ---- K-quant super-blocks ------------------------------------------------ */

/* What a weight super-block needs before its chunks: the scales in the
 * form its scale step shuffles, the multipliers of the activations' bsums
 * (bias), and its f32 scales. */
typedef struct {
    __m256i sc;             // scales, per type (see kq_prep)
    __m256i bias;           // 16 int16: times bsums[0..15]
    float   d, dmin;
    const uint8_t *b;       // the block
} KPrep;

INLINE size_t kq_block_bytes(const int t) {
    switch (t) {
    case K_Q2: return sizeof(BlockQ2_K);
    case K_Q3: return sizeof(BlockQ3_K);
    case K_Q4: return sizeof(BlockQ4_K);
    case K_Q5: return sizeof(BlockQ5_K);
    case K_Q6: return sizeof(BlockQ6_K);
    default:   return sizeof(BlockIQ4_XS);
    }
}

/* Bytes 0,0,1,1,..: each byte of the low 8 twice (mins per 32 against
 * bsums per 16). */
INLINE __m128i dup_bytes(__m128i v) {
    return _mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5,
                                             5, 6, 6, 7, 7));
}

/* Q4_K/Q5_K's 12 bytes of 6-bit scales and mins as 8 scale bytes then 8
 * min bytes (ggml's utmp shuffle). */
INLINE __m128i k4_scales(const uint8_t *s) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f;
    const uint32_t kmask3 = 0x03030303;
    uint32_t       u[4], aux;

    memcpy(u, s, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    aux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = aux;
    u[0] &= kmask1;
    /* built in a register: a 16-byte load of the four words just stored
       would miss store forwarding */
    return _mm_set_epi32((int) u[3], (int) u[2], (int) u[1], (int) u[0]);
}

/* Q3_K's 16 6-bit scales as bytes, offset removed (ggml's aux shuffle). */
INLINE __m128i k3_scales(const uint8_t *s) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t       a[4], t;

    memcpy(a, s, 12);
    t = a[2];
    a[2] = ((a[0] >> 4) & kmask2) | (((t >> 4) & kmask1) << 4);
    a[3] = ((a[1] >> 4) & kmask2) | (((t >> 6) & kmask1) << 4);
    a[0] = (a[0] & kmask2) | (((t >> 0) & kmask1) << 4);
    a[1] = (a[1] & kmask2) | (((t >> 2) & kmask1) << 4);
    return _mm_sub_epi8(_mm_set_epi32((int) a[3], (int) a[2], (int) a[1],
                                      (int) a[0]), _mm_set1_epi8(32));
}

/* sc: Q4_K/Q5_K the 8 scales as int16 in both halves; Q2_K the 16 scale
 * bytes in both halves; Q3_K/Q6_K the 16 signed scale bytes, twice;
 * IQ4_XS unused. */
INLINE KPrep kq_prep(const int t, const uint8_t *b) {
    KPrep p;

    p.b = b;
    p.dmin = 0.0f;
    p.bias = _mm256_setzero_si256();
    if (t == K_Q4 || t == K_Q5) {
        const BlockQ4_K *q = (const BlockQ4_K *) b;
        __m128i          sm = k4_scales(q->scales);

        p.d = f16s(q->d);
        p.dmin = f16s(q->dmin);
        p.sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        p.bias = _mm256_cvtepu8_epi16(dup_bytes(_mm_srli_si128(sm, 8)));
    } else if (t == K_Q6) {
        const BlockQ6_K *q = (const BlockQ6_K *) b;
        __m128i          s = _mm_loadu_si128((const __m128i *) q->scales);

        p.d = f16s(q->d);
        p.sc = _mm256_broadcastsi128_si256(s);
        p.bias = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s), 5);
    } else if (t == K_Q3) {
        const BlockQ3_K *q = (const BlockQ3_K *) b;
        __m128i          s = k3_scales(q->scales);

        p.d = f16s(q->d);
        p.sc = _mm256_broadcastsi128_si256(s);
        p.bias = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s), 2);
    } else if (t == K_Q2) {
        const BlockQ2_K *q = (const BlockQ2_K *) b;
        __m128i          s = _mm_loadu_si128((const __m128i *) q->scales);
        __m128i          m4 = _mm_set1_epi8(15);

        p.d = f16s(q->d);
        p.dmin = f16s(q->dmin);
        p.sc = _mm256_broadcastsi128_si256(_mm_and_si128(s, m4));
        p.bias = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    } else {
        const BlockIQ4_XS *q = (const BlockIQ4_XS *) b;

        p.d = f16s(q->d);
        p.sc = _mm256_setzero_si256();
    }
    return p;
}

/* The 16 int16 multipliers of chunk c (elements 32c..32c+31): pair lane l
 * covers elements 2l, 2l+1, so lanes 0-7 take the scale of the first 16
 * elements and lanes 8-15 that of the second. */
INLINE __m256i kq_scale(const int t, const KPrep *p, int c) {
    if (t == K_Q4 || t == K_Q5) {
        /* scale c as int16 (bytes 2c, 2c+1) in every lane */
        __m256i s = _mm256_set1_epi16((short) (0x0100 * (2 * c + 1) + 2 * c));

        return _mm256_shuffle_epi8(p->sc, s);
    }
    if (t == K_IQ4XS) {
        return _mm256_set1_epi16((short) iq4xs_scale(
            (const BlockIQ4_XS *) p->b, c));
    }
    /* scale 2c in the low half, 2c + 1 in the high one, widened */
    __m128i s = _mm_shuffle_epi8(_mm256_castsi256_si128(p->sc),
                                 _mm_setr_epi8(2 * c, 2 * c, 2 * c, 2 * c,
                                               2 * c, 2 * c, 2 * c, 2 * c,
                                               2 * c + 1, 2 * c + 1,
                                               2 * c + 1, 2 * c + 1,
                                               2 * c + 1, 2 * c + 1,
                                               2 * c + 1, 2 * c + 1));

    return t == K_Q2 ? _mm256_cvtepu8_epi16(s) : _mm256_cvtepi8_epi16(s);
}

/* Two bits at bit 2s of 32 bytes at qs, as bytes 0..3. */
INLINE __m256i bits2(const uint8_t *qs, int s) {
    __m256i v = _mm256_loadu_si256((const __m256i *) qs);

    return _mm256_and_si256(_mm256_srli_epi16(v, 2 * s),
                            _mm256_set1_epi8(3));
}

/* Bit s of 32 bytes at h, moved to bit pos. */
INLINE __m256i bit_at(const uint8_t *h, int s, int pos) {
    __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *) h),
                                 _mm256_set1_epi8((char) (1 << s)));

    return s < pos ? _mm256_slli_epi16(v, pos - s)
                   : _mm256_srli_epi16(v, s - pos);
}

/* The 32 weights of chunk c as bytes: unsigned (0..63, the offset left to
 * bias) for the K-quants, signed for IQ4_XS. */
INLINE __m256i kq_chunk(const int t, const KPrep *p, int c) {
    const __m256i m4 = _mm256_set1_epi8(15);

    if (t == K_Q4 || t == K_Q5) {
        const uint8_t *qs = t == K_Q4 ? ((const BlockQ4_K *) p->b)->qs
                                      : ((const BlockQ5_K *) p->b)->qs;
        __m256i v = _mm256_loadu_si256((const __m256i *) (qs + 32 * (c / 2)));
        __m256i q = c % 2 == 0 ? _mm256_and_si256(v, m4)
                               : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);

        if (t == K_Q5) {
            q = _mm256_or_si256(q, bit_at(((const BlockQ5_K *) p->b)->qh,
                                          c, 4));
        }
        return q;
    }
    if (t == K_Q6) {
        const BlockQ6_K *b = (const BlockQ6_K *) p->b;
        int              h = c / 4, s = c % 4;
        __m256i          lo = _mm256_loadu_si256((const __m256i *)
                                                 (b->ql + 64 * h + 32 * (s & 1)));

        lo = s < 2 ? _mm256_and_si256(lo, m4)
                   : _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4);
        return _mm256_or_si256(lo, _mm256_slli_epi16(
            bits2(b->qh + 32 * h, s), 4));
    }
    if (t == K_Q3) {
        const BlockQ3_K *b = (const BlockQ3_K *) p->b;

        return _mm256_or_si256(bits2(b->qs + 32 * (c / 4), c % 4),
                               bit_at(b->hmask, c, 2));
    }
    if (t == K_Q2) {
        const BlockQ2_K *b = (const BlockQ2_K *) p->b;

        return bits2(b->qs + 32 * (c / 4), c % 4);
    }
    {
        const BlockIQ4_XS *b = (const BlockIQ4_XS *) p->b;
        __m128i v = _mm_loadu_si128((const __m128i *) (b->qs + 16 * c));
        __m256i i = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
                                     m4);

        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *) iq4nl_values)), i);
    }
}

/* One weight row (nb super-blocks at w) against rows activation rows at x,
 * ldx apart: out[i * ldo] for i < rows. */
INLINE void kq_tile(const int t, const int rows, int64_t nb, const char *x,
                    size_t ldx, const uint8_t *w, float *out, size_t ldo)
{
    const size_t bs = kq_block_bytes(t);
    __m256       acc[KQ_ROWS];

#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        KPrep   p = kq_prep(t, w + b * bs);
        __m256i sumi[KQ_ROWS];

#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) sumi[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < QK_K / 32; c++) {
            __m256i q = kq_chunk(t, &p, c), sc = kq_scale(t, &p, c);
            __m256i qa = t == K_IQ4XS ? _mm256_sign_epi8(q, q) : q;

#pragma GCC unroll 8
            for (int i = 0; i < rows; i++) {
                const BlockQ8_K *xb = (const BlockQ8_K *) (x + i * ldx) + b;
                __m256i          xq = _mm256_loadu_si256((const __m256i *)
                                                         (xb->qs + 32 * c));

                if (t == K_IQ4XS) xq = _mm256_sign_epi8(xq, q);
                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(
                    _mm256_maddubs_epi16(qa, xq), sc));
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
            const BlockQ8_K *xb = (const BlockQ8_K *) (x + i * ldx) + b;
            __m256i          ms = _mm256_madd_epi16(p.bias, _mm256_loadu_si256(
                                      (const __m256i *) xb->bsums));

            if (t == K_Q3 || t == K_Q6) sumi[i] = _mm256_sub_epi32(sumi[i], ms);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(xb->d * p.d),
                                     _mm256_cvtepi32_ps(sumi[i]), acc[i]);
            if (t == K_Q2 || t == K_Q4 || t == K_Q5) {
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-(xb->d * p.dmin)),
                                         _mm256_cvtepi32_ps(ms), acc[i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) out[i * ldo] = hsum(acc[i]);
}


/* ---- Q8_K activations ---------------------------------------------------- */

/* Largest |x| of the 256 values at x. */
INLINE float amax256(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256       m = _mm256_setzero_ps();
    __m128       h;

    for (int j = 0; j < QK_K / 8; j++) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * j)));
    }
    h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* quantize_row_q8_K_ref's bits, vectorized: the first value of largest
 * magnitude sets is = -127 / max; q = nearest even of is * x (vcvtps2dq
 * in the default rounding mode is rintf), at most 127; bsums per 16; d =
 * 1 / is. */
void avx2_q8k_conv(const float *x, void *y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    BlockQ8_K   *yb = y;

    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        float   amax = amax256(x), is;
        int     first = 0;
        __m256i lim = _mm256_set1_epi32(127);

        if (amax == 0.0f) {
            memset(&yb[b], 0, sizeof(yb[b]));
            continue;
        }
        for (int j = 0; j < QK_K / 8; j++) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(
                _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * j)),
                _mm256_set1_ps(amax), _CMP_EQ_OQ));

            if (hit != 0) {
                first = 8 * j + __builtin_ctz((unsigned) hit);
                break;
            }
        }
        is = -127.0f / x[first];
        for (int c = 0; c < QK_K / 32; c++) {
            const float *xc = x + 32 * c;
            __m256i      i0, i1, i2, i3, q, s;
            __m256       vs = _mm256_set1_ps(is);

            i0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs,
                     _mm256_loadu_ps(xc))), lim);
            i1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs,
                     _mm256_loadu_ps(xc + 8))), lim);
            i2 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs,
                     _mm256_loadu_ps(xc + 16))), lim);
            i3 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs,
                     _mm256_loadu_ps(xc + 24))), lim);
            /* the packs work per 128-bit lane; the permute restores order */
            q = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(i0, i1),
                                   _mm256_packs_epi32(i2, i3)),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *) (yb[b].qs + 32 * c), q);
            /* sums of 16: pairs, quads, then the two halves of each lane */
            s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                  _mm256_set1_epi16(1));
            s = _mm256_add_epi32(s, _mm256_srli_si256(s, 8));
            s = _mm256_add_epi32(s, _mm256_srli_si256(s, 4));
            yb[b].bsums[2 * c] = (int16_t) _mm256_extract_epi32(s, 0);
            yb[b].bsums[2 * c + 1] = (int16_t) _mm256_extract_epi32(s, 4);
        }
        yb[b].d = 1.0f / is;
    }
}

size_t avx2_q8k_bytes(int64_t k) {
    return dtype_row_bytes(DT_Q8_K, k);
}


/* ---- 32-element blocks ------------------------------------------------------ */

INLINE size_t b32_block_bytes(const int t) {
    switch (t) {
    case B_Q5_0:  return sizeof(BlockQ5_0);
    case B_IQ4NL: return sizeof(BlockIQ4_NL);
    case B_Q4_1:  return sizeof(BlockQ4_1);
    default:      return sizeof(BlockQ5_1);
    }
}

/* Bytes of the activation block a 32-block type reads (Q8_0 or Q8_1). */
INLINE size_t b32_x_bytes(const int t) {
    return t == B_Q4_1 || t == B_Q5_1 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
}

/* Byte i all ones where bit i of the 4 bytes at h is set (ggml's
 * bytes_from_bits_32). */
INLINE __m256i bytes_from_bits(const uint8_t *h) {
    uint32_t u;
    __m256i  v;

    memcpy(&u, h, 4);
    v = _mm256_shuffle_epi8(_mm256_set1_epi32((int) u), _mm256_set_epi64x(
        0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* The 16 bytes at qs as 32 nibbles: elements 0..15 the low ones, 16..31
 * the high ones. */
INLINE __m256i nibbles(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *) qs);

    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
                            _mm256_set1_epi8(15));
}

/* The 32 weights of block b as bytes: signed for Q5_0 (q - 16, made by
 * setting the high nibble where the fifth bit is clear) and IQ4_NL,
 * unsigned for Q4_1 and Q5_1 (the min goes through the activations' s). */
INLINE __m256i b32_values(const int t, const uint8_t *b) {
    if (t == B_Q5_0) {
        const BlockQ5_0 *q = (const BlockQ5_0 *) b;

        return _mm256_or_si256(nibbles(q->qs), _mm256_andnot_si256(
            bytes_from_bits(q->qh), _mm256_set1_epi8((char) 0xf0)));
    }
    if (t == B_IQ4NL) {
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *) iq4nl_values)),
            nibbles(((const BlockIQ4_NL *) b)->qs));
    }
    if (t == B_Q4_1) return nibbles(((const BlockQ4_1 *) b)->qs);
    {
        const BlockQ5_1 *q = (const BlockQ5_1 *) b;

        return _mm256_or_si256(nibbles(q->qs), _mm256_and_si256(
            bytes_from_bits(q->qh), _mm256_set1_epi8(0x10)));
    }
}

/* One weight row of nb 32-blocks against rows activation rows, as
 * kq_tile: per block acc = (d d_x) * sumi + acc; Q4_1 and Q5_1 add m * s
 * to a scalar total, added to the hsum at the end. */
INLINE void b32_tile(const int t, const int rows, int64_t nb, const char *x,
                     size_t ldx, const uint8_t *w, float *out, size_t ldo)
{
    const size_t  bs = b32_block_bytes(t), xs = b32_x_bytes(t);
    const bool    sgn = t == B_Q5_0 || t == B_IQ4NL;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256        acc[KQ_ROWS];
    float         summs[KQ_ROWS];

#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
        acc[i] = _mm256_setzero_ps();
        summs[i] = 0.0f;
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * bs;
        __m256i        q = b32_values(t, wb);
        __m256i        qa = sgn ? _mm256_sign_epi8(q, q) : q;
        float          d = f16_at(wb);

#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
            const char *xb = x + i * ldx + b * xs;
            __m256i     xq = _mm256_loadu_si256((const __m256i *)
                                                (xb + xs - QK));
            float       dx = f16_at(xb);
            __m256i     p;

            if (sgn) xq = _mm256_sign_epi8(xq, q);
            p = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, xq), ones);
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx),
                                     _mm256_cvtepi32_ps(p), acc[i]);
            if (!sgn) {
                summs[i] += f16_at(wb + 2) * f16_at(xb + 2);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) out[i * ldo] = hsum(acc[i]) + summs[i];
}


/* ---- tiles and the cache blocking ---------------------------------------- */

INLINE void tile_of(const int t, const int rows, int64_t k, const char *x,
                    size_t ldx, const uint8_t *w, float *out, size_t ldo)
{
    if (t <= K_IQ4XS) {
        kq_tile(t, rows, k / QK_K, x, ldx, w, out, ldo);
    } else {
        b32_tile(t, rows, k / QK, x, ldx, w, out, ldo);
    }
}

/* The gemm of a type: decode runs the weight rows front to back; batches
 * run panels of weight rows (L2) against tiles of KQ_ROWS activation rows
 * (L1), the rows past the last full tile in a tile of their own (same
 * operations per output). */
INLINE void gemm_of(const int t, int64_t k, int mr, int nr, const char *x,
                    size_t ldx, const char *w, size_t ldw, float *out,
                    size_t ldo)
{
    int panel = (int) (PANEL_KQ / ldw);

    if (mr == 1) {
        for (int j = 0; j < nr; j++) {
            tile_of(t, 1, k, x, ldx, (const uint8_t *) w + (size_t) j * ldw,
                    out + j, ldo);
        }
        return;
    }
    panel = panel < 1 ? 1 : panel;
    for (int p0 = 0; p0 < nr; p0 += panel) {
        int pn = nr - p0 < panel ? nr - p0 : panel;

        for (int i0 = 0; i0 < mr; i0 += KQ_ROWS) {
            int         m = mr - i0 < KQ_ROWS ? mr - i0 : KQ_ROWS;
            const char *xi = x + (size_t) i0 * ldx;
            float      *oi = out + (size_t) i0 * ldo + p0;

            for (int j = 0; j < pn; j++) {
                const uint8_t *wj = (const uint8_t *) w
                                    + (size_t) (p0 + j) * ldw;

                switch (m) {            /* KQ_ROWS cases */
                case 4:  tile_of(t, 4, k, xi, ldx, wj, oi + j, ldo); break;
                case 3:  tile_of(t, 3, k, xi, ldx, wj, oi + j, ldo); break;
                case 2:  tile_of(t, 2, k, xi, ldx, wj, oi + j, ldo); break;
                default: tile_of(t, 1, k, xi, ldx, wj, oi + j, ldo); break;
                }
            }
        }
    }
}

#define GEMM_OF(name, t)                                                      \
void name(int64_t k, int mr, int nr, const void *x, size_t ldx,              \
          const void *w, size_t ldw, float *out, size_t ldo) {               \
    gemm_of(t, k, mr, nr, x, ldx, w, ldw, out, ldo);                          \
}

GEMM_OF(avx2_gemm_q2_K, K_Q2)
GEMM_OF(avx2_gemm_q3_K, K_Q3)
GEMM_OF(avx2_gemm_q4_K, K_Q4)
GEMM_OF(avx2_gemm_q5_K, K_Q5)
GEMM_OF(avx2_gemm_q6_K, K_Q6)
GEMM_OF(avx2_gemm_iq4_xs, K_IQ4XS)
GEMM_OF(avx2_gemm_q5_0, B_Q5_0)
GEMM_OF(avx2_gemm_iq4_nl, B_IQ4NL)
GEMM_OF(avx2_gemm_q4_1, B_Q4_1)
GEMM_OF(avx2_gemm_q5_1, B_Q5_1)

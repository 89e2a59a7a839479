/* avx512_kq.c -- the avx512 set's gemms of the K-quants (Q2_K..Q6_K) and
 * IQ4_XS, against Q8_K activations as dtype.c's quantize_row_q8_K_ref
 * writes them (the same bits on every set). avx512.c holds the table that
 * names them.
 *
 * One register-tiled body, ktile(), instantiated per type (kt, a
 * compile-time constant) and tile height. A tile is rows activation rows
 * against one weight row; it walks k one super-block (256 elements) at a
 * time and per super-block:
 *
 *   1. unpacks the weight row's sub-block scales to int16 (kw_prep);
 *   2. per output: starts an int32 vector, from the bsums term where the
 *      weights carry an offset (Q6_K's -32, Q3_K's -4, IQ4_XS's biased
 *      table: the values are made unsigned, the offset times the sum of
 *      the activations per sub-block is taken off exactly);
 *   3. in 4 steps of 64 elements: 64 unsigned weight values (kw_q) and
 *      their scales (kw_sc); per activation row, 64 signed bytes; per
 *      output vpmaddubsw (u8 x s8 -> s16 pairs, which cannot saturate
 *      for values below 64) and vpdpwssd with the scales: exact
 *      int32 sums of sc * q * x. IQ4_XS values reach 241 once biased, so
 *      it runs vpdpbusd and multiplies by the scale in int32 instead;
 *   4. per output: acc += float(isum) * (d_x * d), and for the types with
 *      a min acc += float(msum) * (d_x * -dmin), msum being the exact
 *      int32 sum of mn * bsum.
 *
 * At the end each output's 16 float lanes are summed by hsum's tree.
 * Every output thus gets the same operations in the same order for any
 * tile shape and position, which is vec.h's batch invariance; the integer
 * sums are exact, so results differ from ref.c (and ggml) only in the
 * order of the float accumulation (ref.c keeps ggml's scalar 8 lanes, ggml's
 * AVX2 code 8 lanes of a different split: the same per-super-block products,
 * summed differently).
 *
 * A tile is up to KQ_ROWS activation rows against one weight row: the
 * weight unpacking (scales, nibbles, high bits) is most of the work per
 * weight row and the activations are one load per row and step, so tiles
 * are tall; the activations of a tile (8 x 292 bytes per super-block)
 * stay in L1 and the chunk of weight rows a call gets comes from L2 per
 * tile. Measured per super-block and output, one thread, weights hot (a
 * loaded 2-core Zen 5, so +-15%): q4_K 4x2 tiles 2.4-2.9 ns, 4x3 3.0,
 * 6x2 2.3, 8x2 2.6, 8x1 2.1-2.3, 10x1 and 12x1 4.3-6 (spills); q6_K
 * likewise 2.0-2.6, 2.9, 2.2, 1.9, 1.7-1.8. Decode (one activation row)
 * is the 1x1 tile, one weight row after the other, a single sequential
 * stream per thread as in avx512.c: q4_K 4.2 ns per super-block (35 GB/s
 * hot) once the 6-bit scales were unpacked in vector lanes (6.6 ns with
 * ggml's scalar shuffle through the stack), q6_K 3.3-4.2 ns (50-63
 * GB/s). */

#include "avx512.h"

enum { K_Q2, K_Q3, K_Q4, K_Q5, K_Q6, K_IQ4XS };

#define XK_D     0              /* offsets in a BlockQ8_K */
#define XK_QS    4
#define XK_BSUMS 260


/* ---- per weight row and super-block ---------------------------------------- */

/* A weight super-block ready for its steps. */
typedef struct {
    const uint8_t *b;           // the block as stored
    __m512i        sc;          // int16 sub-block scales, vpermw source
                                //   (IQ4_XS: int32, vpermd source)
    __m256i        corr;        // int16 per 16 activations: the offset term
                                //   (x the bsums into isum) or the mins
    __m512         d, dmin;     // d and -dmin, broadcast
} KW;

INLINE bool kt_min(const int kt) {
    return kt == K_Q2 || kt == K_Q4 || kt == K_Q5;
}

INLINE size_t kt_bytes(const int kt) {
    switch (kt) {
    case K_Q2: return sizeof(BlockQ2_K);
    case K_Q3: return sizeof(BlockQ3_K);
    case K_Q4: return sizeof(BlockQ4_K);
    case K_Q5: return sizeof(BlockQ5_K);
    case K_Q6: return sizeof(BlockQ6_K);
    default:   return sizeof(BlockIQ4_XS);
    }
}

INLINE __m512 f16_bcast(const uint8_t *p) {
    uint16_t h;

    memcpy(&h, p, 2);
    return _mm512_set1_ps(_cvtsh_ss(h));
}

/* Q4_K/Q5_K's 12 scale bytes (at s, readable to s + 16) as 8 scales then
 * 8 mins, one per byte: ggml's shuffle of the packed 6-bit fields (see
 * k4_scale_min) on the words u0, u1, u2, in vector lanes. */
INLINE __m128i k4_scales(const uint8_t *s) {
    __m128i u = _mm_loadu_si128((const __m128i *) s);
    /* [u0, u2, u1, u2] low bits, [u0, u0, u1, u1] the top 2 of the first
       4 scales and mins, which the last 4 take as their bits 4, 5 */
    __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(u, 0x98),
                               _mm_setr_epi32(0, 0, 0, 4));
    __m128i b = _mm_srli_epi32(_mm_shuffle_epi32(u, 0x50), 2);

    return _mm_ternarylogic_epi32(
        _mm_and_si128(a, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f,
                                        0x0f0f0f0f)),
        b, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030), 0xf8);
}

/* Q3_K's 16 scales, offset removed (ggml's shuffle; see q3k_scale). */
INLINE __m128i k3_scales(const uint8_t *s) {
    uint32_t a[3];
    __m128i  v;

    memcpy(a, s, 12);
    v = _mm_setr_epi32(
        (int) ((a[0] & 0x0f0f0f0f) | ((a[2] >> 0) & 0x03030303) << 4),
        (int) ((a[1] & 0x0f0f0f0f) | ((a[2] >> 2) & 0x03030303) << 4),
        (int) (((a[0] >> 4) & 0x0f0f0f0f) | ((a[2] >> 4) & 0x03030303) << 4),
        (int) (((a[1] >> 4) & 0x0f0f0f0f) | ((a[2] >> 6) & 0x03030303) << 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

INLINE void kw_prep(const int kt, const uint8_t *b, KW *o) {
    o->b = b;
    o->dmin = _mm512_setzero_ps();
    if (kt == K_Q4 || kt == K_Q5) {
        __m128i ms = k4_scales(b + 4);

        o->d = f16_bcast(b);
        o->dmin = _mm512_sub_ps(_mm512_setzero_ps(), f16_bcast(b + 2));
        o->sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(ms));
        /* each min covers two bsums */
        o->corr = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(ms, ms));
    } else if (kt == K_Q6) {
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(
            (const __m128i *) ((const BlockQ6_K *) b)->scales));

        o->d = f16_bcast(b + offsetof(BlockQ6_K, d));
        o->sc = _mm512_castsi256_si512(sc);
        o->corr = _mm256_sub_epi16(_mm256_setzero_si256(),
                                   _mm256_slli_epi16(sc, 5));   /* -32 sc */
    } else if (kt == K_Q3) {
        __m256i sc = _mm256_cvtepi8_epi16(k3_scales(b + 96));

        o->d = f16_bcast(b + offsetof(BlockQ3_K, d));
        o->sc = _mm512_castsi256_si512(sc);
        o->corr = _mm256_sub_epi16(_mm256_setzero_si256(),
                                   _mm256_slli_epi16(sc, 2));   /* -4 sc */
    } else if (kt == K_Q2) {
        __m128i s = _mm_loadu_si128((const __m128i *) b);

        o->d = f16_bcast(b + offsetof(BlockQ2_K, d));
        o->dmin = _mm512_sub_ps(_mm512_setzero_ps(),
                                f16_bcast(b + offsetof(BlockQ2_K, dmin)));
        o->sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(
            _mm_and_si128(s, _mm_set1_epi8(0x0f))));
        o->corr = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4),
                                                     _mm_set1_epi8(0x0f)));
    } else {
        /* IQ4_XS: scale j = (low nibble j of scales_l | 2 bits j of
           scales_h << 4) - 32, as int32 lane j */
        const BlockIQ4_XS *q = (const BlockIQ4_XS *) b;
        uint32_t           l;
        __m256i            sc, s16;

        memcpy(&l, q->scales_l, 4);
        sc = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int) l),
                                 _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                              _mm256_set1_epi32(0x0f));
        sc = _mm256_or_si256(sc, _mm256_slli_epi32(_mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(q->scales_h),
                              _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
            _mm256_set1_epi32(3)), 4));
        sc = _mm256_sub_epi32(sc, _mm256_set1_epi32(32));
        o->d = f16_bcast(b);
        o->sc = _mm512_castsi256_si512(sc);
        /* both int16 halves of lane j = scale j, for its two bsums; the
           biased values are 128 too high: -128 sc */
        s16 = _mm256_shuffle_epi8(sc, _mm256_setr_epi8(
            0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
            0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
        o->corr = _mm256_sub_epi16(_mm256_setzero_si256(),
                                   _mm256_slli_epi16(s16, 7));
    }
}

/* Elements 64t..64t+63 of the super-block as unsigned bytes: q, or q
 * plus the offset that corr takes off. */
INLINE __m512i kw_q(const int kt, const KW *w, int t) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);

    if (kt == K_Q4 || kt == K_Q5) {
        /* bytes 32t..32t+31 of qs: low nibbles are sub-block 2t, high
           ones 2t+1 */
        const uint8_t *qs = w->b + (kt == K_Q4 ? offsetof(BlockQ4_K, qs)
                                               : offsetof(BlockQ5_K, qs));
        __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(
            (const __m256i *) (qs + 32 * t)));

        v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xffff0000, v, 4), m4);
        if (kt == K_Q5) {
            /* fifth bit: bit 2t (low half) or 2t+1 of qh[l] */
            __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                (const __m256i *) ((const BlockQ5_K *) w->b)->qh));
            __m512i bit = _mm512_inserti64x4(
                _mm512_set1_epi8((char) (1 << (2 * t))),
                _mm256_set1_epi8((char) (1 << (2 * t + 1))), 1);

            v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(h, bit), v,
                                     _mm512_set1_epi8(16));
        }
        return v;
    }
    if (kt == K_Q6) {
        /* half h = t/2 of the block: ql's 64 bytes hold its elements
           0..63 in the low nibbles and 64..127 in the high ones; bits
           2s, 2s+1 of qh[l] top element 32s + l, moved to bits 4, 5 */
        const BlockQ6_K *q = (const BlockQ6_K *) w->b;
        __m512i ql = _mm512_loadu_si512(q->ql + 64 * (t / 2));
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
            (const __m256i *) (q->qh + 32 * (t / 2))));
        __m512i lo, hi;

        if (t % 2 == 0) {
            lo = _mm512_and_si512(ql, m4);
            hi = _mm512_sllv_epi64(qh, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2,
                                                         2));
        } else {
            lo = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
            hi = _mm512_srlv_epi64(qh, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2,
                                                         2));
        }
        /* (hi & 0x30) | lo */
        return _mm512_ternarylogic_epi32(hi, _mm512_set1_epi8(0x30), lo, 0xea);
    }
    if (kt == K_Q2 || kt == K_Q3) {
        /* half h = t/2: element 32s + l in bits 2s, 2s+1 of qs[32h + l],
           s = 2 (t%2) for the low 32 and 2 (t%2) + 1 for the high */
        const uint8_t *qs = w->b + (kt == K_Q2 ? offsetof(BlockQ2_K, qs)
                                               : offsetof(BlockQ3_K, qs));
        __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(
            (const __m256i *) (qs + 32 * (t / 2))));
        int64_t s0 = 4 * (t % 2), s1 = s0 + 2;

        v = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(
                                 s0, s0, s0, s0, s1, s1, s1, s1)),
                             _mm512_set1_epi8(3));
        if (kt == K_Q3) {
            /* hmask bit e/32 set: q, clear: q - 4; stored as q + 4 */
            __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                (const __m256i *) ((const BlockQ3_K *) w->b)->hmask));
            __m512i bit = _mm512_inserti64x4(
                _mm512_set1_epi8((char) (1 << (2 * t))),
                _mm256_set1_epi8((char) (1 << (2 * t + 1))), 1);

            v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(h, bit), v,
                                     _mm512_set1_epi8(4));
        }
        return v;
    }
    {
        /* IQ4_XS: sub-blocks 2t, 2t+1 are bytes 32t..32t+31 of qs, each
           16 bytes low nibbles (elements 0..15) then high; values looked
           up as iq4nl_values + 128 */
        const BlockIQ4_XS *q = (const BlockIQ4_XS *) w->b;
        __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256(
            (const __m256i *) (q->qs + 32 * t)));
        __m512i lut = _mm512_broadcast_i32x4(_mm_xor_si128(
            _mm_loadu_si128((const __m128i *) iq4nl_values),
            _mm_set1_epi8((char) 0x80)));

        v = _mm512_shuffle_i64x2(v, v, 0x50);       /* lanes 0, 0, 1, 1 */
        v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00, v, 4), m4);
        return _mm512_shuffle_epi8(lut, v);
    }
}

/* The scales of step t's 32 int16 pairs (IQ4_XS: 16 int32 lanes). */
INLINE __m512i kw_sc(const int kt, const KW *w, int t) {
    if (kt == K_Q4 || kt == K_Q5) {
        /* sub-block 2t for the low 32 elements, 2t+1 for the high */
        return _mm512_permutexvar_epi16(_mm512_inserti64x4(
            _mm512_set1_epi16((short) (2 * t)),
            _mm256_set1_epi16((short) (2 * t + 1)), 1), w->sc);
    }
    if (kt == K_IQ4XS) {
        return _mm512_permutexvar_epi32(_mm512_inserti64x4(
            _mm512_set1_epi32(2 * t), _mm256_set1_epi32(2 * t + 1), 1), w->sc);
    }
    /* 16-element sub-blocks: 4t + q for 128-bit lane q */
    return _mm512_permutexvar_epi16(_mm512_setr_epi32(
        (4 * t) * 0x10001, (4 * t) * 0x10001, (4 * t) * 0x10001,
        (4 * t) * 0x10001, (4 * t + 1) * 0x10001, (4 * t + 1) * 0x10001,
        (4 * t + 1) * 0x10001, (4 * t + 1) * 0x10001, (4 * t + 2) * 0x10001,
        (4 * t + 2) * 0x10001, (4 * t + 2) * 0x10001, (4 * t + 2) * 0x10001,
        (4 * t + 3) * 0x10001, (4 * t + 3) * 0x10001, (4 * t + 3) * 0x10001,
        (4 * t + 3) * 0x10001), w->sc);
}

/* isum += step t's products of weights q (scales sc) and activations x. */
INLINE __m512i kdot(const int kt, __m512i isum, __m512i q, __m512i sc,
                    __m512i x)
{
    if (kt == K_IQ4XS) {
        return _mm512_add_epi32(isum, _mm512_mullo_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, x), sc));
    }
    return _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q, x), sc);
}


/* ---- the tile body ---------------------------------------------------------- */

/* The 8 int32 sums of corr times the bsums of the Q8_K block xb: the
 * offset term of isum, or the mins' msum. */
INLINE __m256i kbsums(const char *xb, const KW *w) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)
                                                (xb + XK_BSUMS)), w->corr);
}

/* out (rows, 1) of x (rows, nb Q8_K blocks) . w (nb blocks)^T, the
 * outputs ldo floats apart. */
INLINE void ktile(const int kt, const int rows, int64_t nb, const char *x,
                  size_t ldx, const char *w, float *out, size_t ldo)
{
    const size_t bs = kt_bytes(kt);
    __m512       acc[KQ_ROWS];

#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const char *xb = x + b * sizeof(BlockQ8_K);
        __m512i     is[KQ_ROWS];
        KW          kw;

        kw_prep(kt, (const uint8_t *) w + b * bs, &kw);
#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
            is[i] = kt_min(kt) ? _mm512_setzero_si512()
                               : _mm512_zextsi256_si512(kbsums(xb + i * ldx,
                                                               &kw));
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            __m512i wq = kw_q(kt, &kw, t), wsc = kw_sc(kt, &kw, t);

#pragma GCC unroll 8
            for (int i = 0; i < rows; i++) {
                is[i] = kdot(kt, is[i], wq, wsc, _mm512_loadu_si512(
                                 xb + i * ldx + XK_QS + 64 * t));
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
            float  d;
            __m512 xd;

            memcpy(&d, xb + i * ldx + XK_D, 4);
            xd = _mm512_set1_ps(d);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[i]),
                                     _mm512_mul_ps(xd, kw.d), acc[i]);
            if (kt_min(kt)) {
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(
                        _mm512_zextsi256_si512(kbsums(xb + i * ldx, &kw))),
                    _mm512_mul_ps(xd, kw.dmin), acc[i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) out[i * ldo] = hsum(acc[i]);
}

/* out (mr, nr) for mr <= KQ_ROWS: one (mr x 1) tile per weight row, which
 * is unpacked once for all the activation rows. Decode (mr 1) thus reads
 * one weight row after the other, a single sequential stream per thread,
 * as avx512.c does. */
INLINE void kgemm(const int kt, int64_t k, int mr, int nr, const char *x,
                  size_t ldx, const char *w, size_t ldw, float *out,
                  size_t ldo)
{
    int64_t nb = k / QK_K;

    for (int j = 0; j < nr; j++) {
        const char *wj = w + j * ldw;

#define KQ_CASE(r) case r: ktile(kt, r, nb, x, ldx, wj, out + j, ldo); break;
        switch (mr) {                   /* cases 1..KQ_ROWS */
        KQ_CASE(8) KQ_CASE(7) KQ_CASE(6) KQ_CASE(5) KQ_CASE(4) KQ_CASE(3)
        KQ_CASE(2) KQ_CASE(1)
        }
#undef KQ_CASE
    }
}

_Static_assert(KQ_ROWS == 8, "kgemm's switch covers 1..KQ_ROWS rows");

#define KGEMM_FN(name, kt)                                                    \
void name(int64_t k, int mr, int nr, const void *x, size_t ldx,              \
          const void *w, size_t ldw, float *out, size_t ldo) {               \
    kgemm(kt, k, mr, nr, x, ldx, w, ldw, out, ldo);                           \
}

KGEMM_FN(avx512_gemm_q2_K, K_Q2)
KGEMM_FN(avx512_gemm_q3_K, K_Q3)
KGEMM_FN(avx512_gemm_q4_K, K_Q4)
KGEMM_FN(avx512_gemm_q5_K, K_Q5)
KGEMM_FN(avx512_gemm_q6_K, K_Q6)
KGEMM_FN(avx512_gemm_iq4_xs, K_IQ4XS)

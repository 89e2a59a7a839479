/* avx512.c -- the CpuVec table for AVX-512 F/BW/VL/DQ/VNNI with FMA and F16C.
 * This file holds the matmul and the table; avx512_ops.c the other kernels,
 * avx512.h what the two share.
 *
 * Matmul is one register-tiled body, tile(), instantiated per weight type
 * (wtype, a compile-time constant: T_F32 .. T_Q4X) and tile shape. A tile
 * is rows activation rows against cols weight rows, the (rows x cols)
 * block of outputs; it keeps zmm accumulators per output (two for f types,
 * one for q types, see "the tile body") and walks k in steps; per step it
 * loads cols weight operands, then for each of its rows loads that
 * activation row's operand and updates cols accumulators. gemm_any()
 * runs tiles over panels of weight rows and blocks of k for the caches,
 * and decode (one activation row) row after row; repacked q weights with
 * more rows stream instead (gemm_stream). Only the step differs between
 * types:
 *
 *   f32, f16, bf16 weights: 16 elements per step, activations stay f32.
 *     f16 widens with vcvtph2ps, bf16 with a zero-extend and shift; one FMA
 *     per output. Keeping activations f32 (llama.cpp rounds them to f16)
 *     costs one load instead of a conversion and loses no precision.
 *   q8_0, q4_0 weights: 64 elements (two blocks) per step. Activations are
 *     quantized to Q8_0 once per call and laid out for this loop (xq_conv):
 *     per step 64 signed bytes, then -128 * (sum of each group of four) as
 *     16 int32, then the two block scales spread over 8 lanes each. Weights
 *     become unsigned by adding 128 (q8_0: xor 0x80; q4_0: nibble + 120), so
 *     one vpdpbusd starting from the correction gives the exact signed dot
 *     of every group of four. Then per output: convert, multiply the scales
 *     (activation x weight), FMA. The pair work is 4 instructions per 64
 *     weights; llama.cpp's AVX-512 q8_0 path spends about 5 per 32.
 *   q5_0, iq4_nl weights: the q4_0 step with other values: q5_0 adds each
 *     element's fifth bit (qh, a byte mask of the step) and 112, iq4_nl
 *     looks its nibbles up in iq4nl_values + 128 (vpshufb).
 *   q4_1, q5_1 weights: the same step over Q8_1 activations (their ggml
 *     pairing; dtype.c's rounding), laid out by xq1_conv with the blocks'
 *     s = d * sum q appended, and one more FMA per output adds m * s.
 *   The K-quants and iq4_xs (256-element super-blocks, Q8_K activations)
 *     have their own body in avx512_kq.c.
 *   q8_0, q4_0 weights repacked at load (WL_X16, see dtype.h): 512
 *     elements (a group of 16 blocks) per step. A 64-byte load holds 4
 *     weights of each of the 16 blocks, already unsigned, so 8 vpdpbusd
 *     leave every block's exact dot in its own int32 lane, and the 16
 *     weight scales are one vcvtph2ps: about 24 instructions per 544 bytes
 *     of q8_0 where the step above spends about 17 per 68 on loads,
 *     shuffles and the scale spreading. Activations get the matching
 *     layout (xg_conv). Measured on the 1B shapes with 2 threads, stored
 *     layout -> repacked, alternating runs: q8_0 decode 36-51 -> 42-58
 *     GB/s from DRAM (the read probe gave 46-62), 80-101 -> 102-166 GB/s
 *     from cache, prefill 380-460 -> 660-850 GFLOP/s; q4_0 prefill
 *     doubles, its decode stays about 40 GB/s. The blocks past a row's
 *     last group stay as stored and run the step above.
 *
 * Tails are the same step with masked (f) or zero-extended (q) operands, so
 * the tail of a row is computed identically in every tile. The final
 * horizontal sum always uses one tree, pairing lanes (l, l+8), (l, l+4),
 * (l, l+2), (l, l+1); hsum() does it for one accumulator and hsum4() for
 * four at once with the same pairs, so every output of every tile shape
 * gets the same bits: the batch invariance contract of vec.h. */

#include "avx512.h"

/* The q types of 32-element blocks (T_Q8 .. T_Q51) share the step and
 * the tile; the repacked ones come last. */
enum { T_F32, T_F16, T_BF16, T_Q8, T_Q4, T_Q5, T_IQ4, T_Q41, T_Q51, T_Q8X,
       T_Q4X };

#define XQ_STEP 192             /* bytes per 64 elements of converted x */
#define XQ1_STEP 256            /* the same, Q8_1 (with the sums s) */
#define XG_STEP 640             /* bytes per 512 elements (a WL_X16 group) */


/* ---- matmul: one step of each weight type ---------------------------------- */

/* A weight step: f (16 floats) or q (64 unsigned bytes) with d, each
 * block's scale on its 8 lanes, and m (Q4_1, Q5_1: the mins likewise).
 * Unused members compile away. */
typedef struct {
    __m512  f;
    __m512i q;
    __m512  d, m;
} WOp;

/* An activation step: f (16 floats) or q (64 signed bytes), c (the
 * correction for the +128 bias of the weights), d (scales) and s (Q8_1's
 * d * sum q of each block, in lanes 0 and 8, zero elsewhere). */
typedef struct {
    __m512  f;
    __m512i q, c;
    __m512  d, s;
} XOp;

INLINE bool t_q8_1(const int wtype) {
    return wtype == T_Q41 || wtype == T_Q51;
}

/* The two block scales of a step as [d0 x8, d1 x8]; d1 = 0 when half. */
INLINE __m512 block_scales(uint16_t d0, uint16_t d1) {
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int) (d0 | (uint32_t) d1 << 16)));

    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0,
                                                   1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(f));
}

/* Step s of a weight row; rem != 0 marks the last, partial step of rem
 * elements (f types) or one block (q types). */
INLINE WOp load_w(const int wtype, const char *w, int64_t s, int rem) {
    WOp o;

    if (wtype == T_F32) {
        const float *p = (const float *) w + s * 16;

        o.f = rem ? _mm512_maskz_loadu_ps(tail16(rem), p) : _mm512_loadu_ps(p);
    } else if (wtype == T_F16 || wtype == T_BF16) {
        const uint16_t *p = (const uint16_t *) w + s * 16;
        __m256i h = rem ? _mm256_maskz_loadu_epi16(tail16(rem), p)
                        : _mm256_loadu_si256((const __m256i *) p);

        if (wtype == T_F16) {
            o.f = _mm512_cvtph_ps(h);
        } else {
            o.f = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
    } else if (wtype == T_Q8) {
        const BlockQ8_0 *b = (const BlockQ8_0 *) w + s * 2;
        __m256i lo = _mm256_loadu_si256((const __m256i *) b[0].qs);
        __m512i q = rem ? _mm512_zextsi256_si512(lo)
                        : _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                              _mm256_loadu_si256((const __m256i *) b[1].qs), 1);

        o.q = _mm512_xor_si512(q, _mm512_set1_epi8((char) 0x80));
        o.d = block_scales(b[0].d, rem ? 0 : b[1].d);
    } else {
        /* T_Q4, T_Q5, T_IQ4, T_Q41, T_Q51 as quarters: block 0 low nibbles
           (elements 0..15), high nibbles (16..31), then block 1 likewise;
           the fifth bits of element n of block b are bit n of its qh,
           so of the step the mask bit 32b + n. Values become unsigned
           by adding 128 (the activations' correction takes it off) */
        const bool   q5 = wtype == T_Q5 || wtype == T_Q51;
        const size_t bsz = wtype == T_Q5 ? sizeof(BlockQ5_0)
                           : wtype == T_Q41 ? sizeof(BlockQ4_1)
                           : wtype == T_Q51 ? sizeof(BlockQ5_1)
                           : sizeof(BlockQ4_0);
        const size_t qs = bsz - QK / 2, dm = t_q8_1(wtype) ? 2 : 0;
        const char  *b0 = w + s * 2 * bsz, *b1 = b0 + bsz;
        __m128i      lo = _mm_loadu_si128((const __m128i *) (b0 + qs));
        __m128i      hi = rem ? _mm_setzero_si128()
                              : _mm_loadu_si128((const __m128i *) (b1 + qs));
        __m512i      q = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(lo),
                                                     0xff00, hi);
        uint16_t     d0, d1 = 0, m0 = 0, m1 = 0;

        q = _mm512_mask_srli_epi16(q, 0xff00ff00, q, 4);
        q = _mm512_and_si512(q, _mm512_set1_epi8(0x0f));
        if (wtype == T_IQ4) {
            q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(
                    _mm_loadu_si128((const __m128i *) iq4nl_values),
                    _mm_set1_epi8((char) 0x80))), q);
        } else {
            /* q - 8 (Q4_0), q - 16 (Q5_0), q (Q4_1, Q5_1); + 128 */
            q = _mm512_add_epi8(q, _mm512_set1_epi8(
                (char) (wtype == T_Q4 ? 120 : wtype == T_Q5 ? 112 : 128)));
        }
        if (q5) {
            uint32_t h0, h1 = 0;

            memcpy(&h0, b0 + qs - 4, 4);
            if (!rem) memcpy(&h1, b1 + qs - 4, 4);
            q = _mm512_mask_add_epi8(q, (__mmask64) h0 | (__mmask64) h1 << 32,
                                     q, _mm512_set1_epi8(16));
        }
        memcpy(&d0, b0, 2);
        if (!rem) memcpy(&d1, b1, 2);
        if (t_q8_1(wtype)) {
            memcpy(&m0, b0 + dm, 2);
            if (!rem) memcpy(&m1, b1 + dm, 2);
            o.m = block_scales(m0, m1);
        }
        o.q = q;
        o.d = block_scales(d0, d1);
    }
    return o;
}

INLINE XOp load_x(const int wtype, const char *x, int64_t s, int rem) {
    XOp o;

    if (wtype <= T_BF16) {
        const float *p = (const float *) x + s * 16;

        o.f = rem ? _mm512_maskz_loadu_ps(tail16(rem), p) : _mm512_loadu_ps(p);
        /* one load per row and step: GCC would otherwise fold the load
           into every FMA that uses it, doubling the load traffic */
        __asm__("" : "+v"(o.f));
    } else {
        /* converted rows are whole steps, zero-padded: rem needs nothing */
        const char *p = x + s * (t_q8_1(wtype) ? XQ1_STEP : XQ_STEP);

        o.q = _mm512_loadu_si512(p);
        o.c = _mm512_loadu_si512(p + 64);
        o.d = _mm512_loadu_ps((const float *) (p + 128));
        if (t_q8_1(wtype)) o.s = _mm512_loadu_ps((const float *) (p + 192));
    }
    return o;
}

INLINE __m512 madd(const int wtype, XOp x, WOp w, __m512 acc) {
    __m512i p;

    if (wtype <= T_BF16) return _mm512_fmadd_ps(x.f, w.f, acc);
    p = _mm512_dpbusd_epi32(x.c, w.q, x.q);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(x.d, w.d), acc);
    /* Q4_1, Q5_1: each block's m * s, in lanes 0 and 8 */
    return t_q8_1(wtype) ? _mm512_fmadd_ps(x.s, w.m, acc) : acc;
}


/* ---- matmul: the tile body -------------------------------------------------- */

/* Tiles and blocking, all measured with 2 threads on Zen 5 (see
 * bench/bench_kernels.c):
 *
 * f types keep 2 accumulators per output, steps alternating between them:
 * decode reads one weight row at a time, and with a single FMA chain (4
 * cycles per 16 weights) it reached 45 GB/s at k = 2048 and 31 at 5632;
 * with two, 50 and 37. The price is registers: 4x3 outputs x 2 = 24
 * accumulators, where one accumulator allowed 6x4 tiles, about 8% faster
 * in prefill; decode is worth more (each token reads every weight). A
 * 4x3 tile also reuses each activation load less, which is why k is
 * blocked below. q types stay at one accumulator (their chain advances 64
 * weights per FMA) and take 4x4 tiles, 10-30% faster than 6x3, 3x5, 3x4.
 * Repacked q types (512 weights per FMA) too: 4x4 keeps 16 int32 sums and
 * spills some of its 16 float accumulators once per group, and still beat
 * 4x3, 3x4, 2x4, 6x4, 4x6 and 8x4 by 15-45% in prefill (2048x2048 at
 * n = 512: 5.1 ms against 5.9-9.1).
 *
 * A call covers up to mr activation rows against any number of weight
 * rows. Batches walk them in panels of PANEL rows; within a panel k is cut
 * into blocks of K_BLOCK elements, so one block of the activation tile stays
 * in L1 while every weight tile of the panel streams past it. Between blocks
 * the accumulators themselves (not sums) are parked in a stack scratch,
 * so a blocked output sees exactly the operations of an unblocked one:
 * decode runs rows whole and still gets the same bits. Without blocks the
 * 4x3 f16 tile fell from 365 to 251 GFLOP/s at k = 5632 (activations from
 * L2); with them 275-280. Summing per block instead would have tied decode
 * to the blocks too, and one call per row and block cost it 15%. */
#define F_ROWS  4               /* tile shapes, see the top of the file */
#define F_COLS  3
#define F_ACC   2               /* accumulators per output */
#define Q_ROWS  4
#define Q_COLS  4
#define Q_ACC   1
#define X_ROWS  4
#define X_COLS  4
#define K_BLOCK 1024            /* elements per K block (multiple of 512) */
#define PANEL   48              /* weight rows per panel (multiple of 12) */
#define ACC_MAX 2
#define X_CALL_ROWS GEMM_MR_MAX /* activation rows per call, repacked q */
#define X_BLOCK (384 << 10)     /* bytes of activations kept in L2 */
#define X_K_BLOCK 2048          /* elements per k block (multiple of 512) */
#define X_PARK_ROWS 64          /* most activation rows per block of k */
#define TILE_PARK_SLOTS (COLS_MAX * ROWS_MAX * ACC_MAX)

INLINE int t_rows(const int wtype) {
    return wtype <= T_BF16 ? F_ROWS : wtype < T_Q8X ? Q_ROWS : X_ROWS;
}
INLINE int t_cols(const int wtype) {
    return wtype <= T_BF16 ? F_COLS : wtype < T_Q8X ? Q_COLS : X_COLS;
}
INLINE int t_acc(const int wtype)  { return wtype <= T_BF16 ? F_ACC : Q_ACC; }
INLINE int t_step(const int wtype) {
    return wtype <= T_BF16 ? 16 : wtype < T_Q8X ? 64 : 512;
}
/* The type whose steps run the tail of a WL_X16 row (its blocks past the
 * last group are stored as usual). */
INLINE int t_base(const int wtype) {
    return wtype == T_Q8X ? T_Q8 : wtype == T_Q4X ? T_Q4 : wtype;
}

#define ROWS_MAX 4              /* of F_ROWS, Q_ROWS and X_ROWS */
#define COLS_MAX 4              /* of F_COLS, Q_COLS and X_COLS */

/* Parked accumulators of a panel: (PANEL, ROWS_MAX, ACC_MAX) vectors, slot
 * (weight row, activation row, accumulator). */
#define PARK_SLOT(j, i, a) (((j) * ROWS_MAX + (i)) * ACC_MAX + (a))

_Static_assert(F_ROWS <= ROWS_MAX && Q_ROWS <= ROWS_MAX && X_ROWS <= ROWS_MAX
               && F_ACC <= ACC_MAX && Q_ACC <= ACC_MAX, "park too small");
_Static_assert(PANEL % F_COLS == 0 && PANEL % Q_COLS == 0
               && PANEL % X_COLS == 0,
               "panels must hold whole tiles");
_Static_assert(K_BLOCK % (16 * 2 * ACC_MAX) == 0 && K_BLOCK % 512 == 0,
               "K blocks must start a round of accumulators and a group");

/* Chunk c (0..7) of a WL_X16 weight group: 64 unsigned bytes whose lane
 * i holds 4 weights of block i; *xc is the activation chunk that matches.
 * q4_0 keeps two chunks in 64 bytes, low nibbles (elements 4c'..4c'+3 of
 * each block) and high ones (16+4c'..), taken one after the other: the
 * sums are exact integers, so their order changes no bit. */
INLINE __m512i load_wchunk(const int wtype, const char *w, int c, int *xc) {
    __m512i v;

    if (wtype == T_Q8X) {
        *xc = c;
        return _mm512_loadu_si512(w + 32 + 64 * c);
    }
    v = _mm512_loadu_si512(w + 32 + 64 * (c / 2));
    *xc = c / 2 + 4 * (c % 2);
    if (c % 2) v = _mm512_srli_epi16(v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* Group g of an (rows x cols) tile of WL_X16 rows: per output, 8 vpdpbusd
 * into one int32 vector that starts from the activation's correction and
 * ends with the exact dot of block i in lane i; then one convert, one
 * multiply of the 16 scale pairs, one FMA, in this order for every tile
 * shape. The stored correction is -128 * sum(x) per block, which cancels
 * the +128 of q8_0 weights; q4_0 nibbles are q + 8, so it is shifted
 * right by 4 to -8 * sum(x), exactly. */
INLINE void group_step(const int wtype, const int rows, const int cols,
                       const char *x, size_t ldx, const char *w, size_t ldw,
                       int64_t g, __m512 acc[ROWS_MAX][COLS_MAX],
                       const char *prefetch)
{
    /* vpdpbusd's latency would serialize a small tile's 8 steps per
       output: split them over n_chains chains, added at the end (exact in
       int32, so no bit changes) */
    const int    n_chains = rows * cols <= 2 ? 4 : rows * cols <= 8 ? 2 : 1;
    const size_t group_bytes = X16 * (wtype == T_Q8X ? sizeof(BlockQ8_0)
                                        : sizeof(BlockQ4_0));
    __m512i      p[4][ROWS_MAX][COLS_MAX];
    __m512       wd[COLS_MAX];

    x += g * XG_STEP;
    w += g * group_bytes;
    if (prefetch != NULL) {
#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
            for (size_t o = 0; o < group_bytes + 63; o += 64) {
                _mm_prefetch(prefetch + g * group_bytes + j * ldw + o,
                             _MM_HINT_T0);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
        __m512i c = _mm512_loadu_si512(x + i * ldx + 512);

        if (wtype == T_Q4X) c = _mm512_srai_epi32(c, 4);
#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
            p[0][i][j] = c;
#pragma GCC unroll 4
            for (int q = 1; q < n_chains; q++) {
                p[q][i][j] = _mm512_setzero_si512();
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m512i wq[COLS_MAX];
        int     xc = 0;

#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
            wq[j] = load_wchunk(wtype, w + j * ldw, c, &xc);
        }
#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
            __m512i xq = _mm512_loadu_si512(x + i * ldx + 64 * xc);

#pragma GCC unroll 8
            for (int j = 0; j < cols; j++) {
                p[c % n_chains][i][j] =
                    _mm512_dpbusd_epi32(p[c % n_chains][i][j], wq[j], xq);
            }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < cols; j++) {
        wd[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)
                                                   (w + j * ldw)));
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
        __m512 xd = _mm512_loadu_ps((const float *) (x + i * ldx + 576));

#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
#pragma GCC unroll 4
            for (int q = 1; q < n_chains; q++) {
                p[0][i][j] = _mm512_add_epi32(p[0][i][j], p[q][i][j]);
            }
            acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[0][i][j]),
                                        _mm512_mul_ps(xd, wd[j]), acc[i][j]);
        }
    }
}

INLINE void tile_step(const int wtype, const int rows, const int cols,
                      const char *x, size_t ldx, const char *w, size_t ldw,
                      int64_t s, int rem, __m512 acc[ROWS_MAX][COLS_MAX],
                      const char *prefetch)
{
    WOp wv[COLS_MAX];

    if (wtype >= T_Q8X) {
        group_step(wtype, rows, cols, x, ldx, w, ldw, s, acc, prefetch);
        return;
    }
#pragma GCC unroll 8
    for (int j = 0; j < cols; j++) wv[j] = load_w(wtype, w + j * ldw, s, rem);
#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
        XOp xv = load_x(wtype, x + i * ldx, s, rem);

#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
            acc[i][j] = madd(wtype, xv, wv[j], acc[i][j]);
        }
    }
}

/* out (rows, cols) of x (rows, k) . w (cols, k)^T over the elements [k0, k1).
 * Every output has n_acc accumulators; step s goes into accumulator
 * s % n_acc, the tail step (k % step elements) into the next one after the
 * last full step (WL_X16 rows: the steps of the stored blocks after the
 * last group, all into the one accumulator); at k1 == k they are added
 * pairwise and summed by the fixed tree.
 * k0 > 0 resumes from parked, k1 < k parks there (parked: this tile's slot
 * PARK_SLOT(0, 0, 0)). A repacked tile given prefetch (the next weight
 * rows) prefetches cols rows of ldw bytes there, the part each group step
 * reads of its own rows. */
INLINE void tile(const int wtype, const int rows, const int cols, int64_t k,
                 int64_t k0, int64_t k1, const char *x, size_t ldx,
                 const char *w, size_t ldw, float *out, size_t ldo,
                 __m512 *parked, const char *prefetch)
{
    const int step = t_step(wtype), n_acc = t_acc(wtype);
    int64_t   s = k0 / step, s1 = k1 / step, ns = k / step;
    int       rem = (int) (k % step);
    __m512    acc[ACC_MAX][ROWS_MAX][COLS_MAX];

#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
#pragma GCC unroll 2
            for (int a = 0; a < n_acc; a++) {
                acc[a][i][j] = k0 == 0 ? _mm512_setzero_ps()
                                       : parked[PARK_SLOT(j, i, a)];
            }
        }
    }
    /* blocks start at multiples of A steps, so s % A == a below */
    for (; s + n_acc <= s1; s += n_acc) {
#pragma GCC unroll 2
        for (int a = 0; a < n_acc; a++) {
            tile_step(wtype, rows, cols, x, ldx, w, ldw, s + a, 0, acc[a],
                      prefetch);
        }
    }
    if (n_acc == 2 && s < s1) {
        tile_step(wtype, rows, cols, x, ldx, w, ldw, s, 0, acc[0], NULL);
    }
    if (k1 < k) {
#pragma GCC unroll 8
        for (int i = 0; i < rows; i++) {
#pragma GCC unroll 8
            for (int j = 0; j < cols; j++) {
#pragma GCC unroll 2
                for (int a = 0; a < n_acc; a++) {
                    parked[PARK_SLOT(j, i, a)] = acc[a][i][j];
                }
            }
        }
        return;
    }
    if (rem != 0 && wtype >= T_Q8X) {
        const char *xt = x + ns * XG_STEP;
        const char *wt = w + ns * X16 * (wtype == T_Q8X ? sizeof(BlockQ8_0)
                                                    : sizeof(BlockQ4_0));

        for (int e = 0; e < rem; e += 64) {
            tile_step(t_base(wtype), rows, cols, xt, ldx, wt, ldw, e / 64,
                      rem - e < 64 ? 32 : 0, acc[0], NULL);
        }
    } else if (rem != 0) {
        if (n_acc == 1 || ns % 2 == 0) {
            tile_step(wtype, rows, cols, x, ldx, w, ldw, ns, rem, acc[0],
                      NULL);
        } else {
            tile_step(wtype, rows, cols, x, ldx, w, ldw, ns, rem,
                      acc[n_acc - 1], NULL);
        }
    }

#pragma GCC unroll 8
    for (int i = 0; i < rows; i++) {
#pragma GCC unroll 8
        for (int j = 0; j < cols; j++) {
            if (n_acc == 2) acc[0][i][j] = _mm512_add_ps(acc[0][i][j],
                                                     acc[1][i][j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < cols; j += 4) {
            __m512 z = _mm512_setzero_ps();
            __m128 r = hsum4(acc[0][i][j], j + 1 < cols ? acc[0][i][j + 1] : z,
                             j + 2 < cols ? acc[0][i][j + 2] : z,
                             j + 3 < cols ? acc[0][i][j + 3] : z);

            if (cols == 1) {
                out[i * ldo] = hsum(acc[0][i][0]);
            } else {
                _mm_mask_storeu_ps(out + i * ldo + j,
                                   (__mmask8) ((1u << (cols - j < 4 ? cols - j
                                                                  : 4)) - 1),
                                   r);
            }
        }
    }
}

/* One (mr x cols) tile, or its 1x1 pieces at a weight-row edge (nr < cols,
 * only at the end of a matrix): a 1x1 tile computes each output exactly as
 * the big one does. */
INLINE void tile_any(const int wtype, int64_t k, int64_t k0, int64_t k1,
                     int mr, int nr, const char *x, size_t ldx, const char *w,
                     size_t ldw, float *out, size_t ldo, __m512 *parked)
{
    const int cols = t_cols(wtype);

    if (nr == cols) {
        switch (mr) {                   /* ROWS_MAX cases */
        case 4: tile(wtype, 4, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, NULL);
                return;
        case 3: tile(wtype, 3, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, NULL);
                return;
        case 2: tile(wtype, 2, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, NULL);
                return;
        case 1: tile(wtype, 1, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, NULL);
                return;
        }
    }
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) {
            tile(wtype, 1, 1, k, k0, k1, x + i * ldx, ldx, w + j * ldw, ldw,
                 out + i * ldo + j, ldo, parked + PARK_SLOT(j, i, 0), NULL);
        }
    }
}

/* A tile's park slots when there are blocks of k (parked not NULL). */
#define TILE_PARK(parked, i)  ((parked) != NULL                            \
                               ? (parked) + (i) / X_ROWS * TILE_PARK_SLOTS   \
                               : NULL)

/* Repacked q types with more than one activation row: X_COLS weight rows at
 * a time, whole k, against every row of a block of activations that fits
 * in L2 (X_BLOCK), in (X_ROWS x X_COLS) tiles. The weight rows come from
 * memory once per block, front to back, and serve the block's other tiles from
 * L1, while the tiles prefetch the next X_COLS rows. Measured on the 1B
 * shapes, 2 threads, weights from DRAM, against the panels above (each
 * 4-row tile of activations re-reading the panel): 4 rows 118-131 ->
 * 155-221 GMAC/s (the read bandwidth, as for one row), 16 rows 204-268 ->
 * 329-459, 512 rows 322-411 -> 456-553. Every output runs the one tile
 * body, so the bits are those of any shape. */
INLINE void stream_rows(const int wtype, const int cols, int64_t k, int64_t k0,
                        int64_t k1, int mr, const char *x, size_t ldx,
                        const char *w, size_t ldw, float *out, size_t ldo,
                        __m512 *parked)
{
    /* the next rows, fetched while these compute: the hardware prefetcher
       alone held cols rows side by side to ~20 GB/s. Every tile asks, not
       only the first: requests the first could not keep in flight are
       asked again (16 rows: 336-365 -> 404-459 GMAC/s; fetching two row
       sets ahead was slower) */
    const char *prefetch = w + cols * ldw;
    int         i = 0;

    for (; i + X_ROWS <= mr; i += X_ROWS) {
        tile(wtype, X_ROWS, cols, k, k0, k1, x + i * ldx, ldx, w, ldw,
             out + i * ldo, ldo, TILE_PARK(parked, i), prefetch);
    }
    switch (mr - i) {                   /* X_ROWS - 1 cases */
    case 3: tile(wtype, 3, cols, k, k0, k1, x + i * ldx, ldx, w, ldw,
                 out + i * ldo, ldo, TILE_PARK(parked, i), prefetch);
            break;
    case 2: tile(wtype, 2, cols, k, k0, k1, x + i * ldx, ldx, w, ldw,
                 out + i * ldo, ldo, TILE_PARK(parked, i), prefetch);
            break;
    case 1: tile(wtype, 1, cols, k, k0, k1, x + i * ldx, ldx, w, ldw,
                 out + i * ldo, ldo, TILE_PARK(parked, i), prefetch);
            break;
    }
}

/* Rows longer than X_K_BLOCK elements go in blocks of k, every tile parking
 * its accumulators between them, so that cols rows and a tile of activations
 * stay in L1 (whole 5632-element rows did not: 292 GMAC/s at 16 rows where
 * 2048-element ones reached 351-371). */
INLINE void gemm_stream(const int wtype, int64_t k, int mr, int nr,
                        const char *x, size_t ldx, const char *w, size_t ldw,
                        float *out, size_t ldo)
{
    __m512  park[X_PARK_ROWS / X_ROWS * TILE_PARK_SLOTS];
    __m512 *parked = k > X_K_BLOCK ? park : NULL;
    int     xb = (int) (X_BLOCK / ldx) / X_ROWS * X_ROWS;

    xb = xb < X_ROWS ? X_ROWS : xb;
    xb = parked != NULL && xb > X_PARK_ROWS ? X_PARK_ROWS : xb;
    for (int i0 = 0; i0 < mr; i0 += xb) {
        int         m = mr - i0 < xb ? mr - i0 : xb;
        const char *xi = x + (size_t) i0 * ldx;
        float      *oi = out + (size_t) i0 * ldo;

        for (int j = 0; j < nr; j += X_COLS) {
            const char *wj = w + (size_t) j * ldw;

            for (int64_t k0 = 0; k0 < k; k0 += X_K_BLOCK) {
                int64_t k1 = k - k0 <= X_K_BLOCK ? k : k0 + X_K_BLOCK;

                if (nr - j >= X_COLS) {
                    stream_rows(wtype, X_COLS, k, k0, k1, m, xi, ldx, wj, ldw,
                                oi + j, ldo, parked);
                    continue;
                }
                /* the last rows one at a time, each in its own park
                   slots, as tile_any's 1x1 pieces */
                for (int r = 0; r < nr - j; r++) {
                    stream_rows(wtype, 1, k, k0, k1, m, xi, ldx,
                                wj + (size_t) r * ldw, ldw, oi + j + r, ldo,
                                parked != NULL ? parked + PARK_SLOT(r, 0, 0)
                                               : NULL);
                }
            }
        }
    }
}

/* The gemm of one weight type: out (mr, nr) for mr <= the table's mr (the
 * type's rows; X_CALL_ROWS for repacked q types, which stream) and any
 * nr. One activation row (decode) runs 1x1 tiles over whole rows, one
 * weight row after the other, so each thread reads a single sequential
 * stream:
 * measured, streaming 4 rows side by side reached 37 GB/s (f16) and 25
 * GB/s (q8_0), one at a time 44 and 40; software prefetch on top changed
 * nothing measurable for one row (it does for four, see gemm_stream). */
INLINE void gemm_any(const int wtype, int64_t k, int mr, int nr, const char *x,
                     size_t ldx, const char *w, size_t ldw, float *out,
                     size_t ldo)
{
    const int cols = t_cols(wtype);
    __m512    park[PANEL * ROWS_MAX * ACC_MAX];

    if (wtype >= T_Q8X && mr > 1) {
        gemm_stream(wtype, k, mr, nr, x, ldx, w, ldw, out, ldo);
        return;
    }
    if (mr == 1) {
        for (int j = 0; j < nr; j++) {
            tile(wtype, 1, 1, k, 0, k, x, ldx, w + j * ldw, ldw, out + j, ldo,
                 NULL, NULL);
        }
        return;
    }
    for (int p0 = 0; p0 < nr; p0 += PANEL) {
        int pn = nr - p0 < PANEL ? nr - p0 : PANEL;

        for (int64_t k0 = 0; k0 < k; k0 += K_BLOCK) {
            int64_t k1 = k - k0 <= K_BLOCK ? k : k0 + K_BLOCK;

            for (int j = 0; j < pn; j += cols) {
                tile_any(wtype, k, k0, k1, mr, pn - j < cols ? pn - j : cols,
                         x, ldx, w + (size_t) (p0 + j) * ldw, ldw,
                         out + p0 + j, ldo,
                         park + PARK_SLOT(j, 0, 0));
            }
        }
    }
}

#define GEMM_FN(name, wtype)                                                  \
static void name(int64_t k, int mr, int nr, const void *x, size_t ldx,       \
                 const void *w, size_t ldw, float *out, size_t ldo) {        \
    gemm_any(wtype, k, mr, nr, x, ldx, w, ldw, out, ldo);                     \
}

GEMM_FN(gemm_f32, T_F32)
GEMM_FN(gemm_f16, T_F16)
GEMM_FN(gemm_bf16, T_BF16)
GEMM_FN(gemm_q8_0, T_Q8)
GEMM_FN(gemm_q4_0, T_Q4)
GEMM_FN(gemm_q5_0, T_Q5)
GEMM_FN(gemm_iq4_nl, T_IQ4)
GEMM_FN(gemm_q4_1, T_Q41)
GEMM_FN(gemm_q5_1, T_Q51)
GEMM_FN(gemm_q8_0x, T_Q8X)
GEMM_FN(gemm_q4_0x, T_Q4X)


/* ---- activation conversion ------------------------------------------------ */

/* Quantizes 32 floats exactly as ref.c does: amax and the scale in scalar
 * f32, q = x * (127 / amax) rounded to nearest even (the MXCSR default).
 * Returns the f16 scale; q gets the 32 bytes. */
INLINE uint16_t quant_block(const float *x, __m256i *q) {
    __m512  a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float   amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a),
                                                      _mm512_abs_ps(b)));
    __m512  id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m128i qa = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id)));
    __m128i qb = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, id)));

    *q = _mm256_set_m128i(qb, qa);
    return f32_to_f16(amax / 127.0f);
}

static void quantize_q8_0(const float *x, BlockQ8_0 *y, int64_t k) {
    for (int64_t b = 0; b < k / QK; b++) {
        __m256i q;

        y[b].d = quant_block(x + b * QK, &q);
        _mm256_storeu_si256((__m256i *) y[b].qs, q);
    }
}

static size_t xq_bytes(int64_t k) {
    return (size_t) ((k + 63) / 64) * XQ_STEP;
}

/* The q-weight activation layout (see the top of the file): per 64
 * elements, the signed bytes, -128 * sum of each group of four (cancels
 * the +128 on the weights), the scales as floats. A last half step is
 * zero-padded, which makes it contribute nothing. */
static void xq_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t e = 0; e < k; e += 64, o += XQ_STEP) {
        __m256i  q0, q1 = _mm256_setzero_si256();
        float    d0 = f16_to_f32(quant_block(x + e, &q0)), d1 = 0.0f;
        __m512i  q, c;

        if (e + 32 < k) d1 = f16_to_f32(quant_block(x + e + 32, &q1));
        q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
        c = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                _mm512_set1_epi8((char) 0x80), q);
        _mm512_storeu_si512(o, q);
        _mm512_storeu_si512(o + 64, _mm512_sub_epi32(_mm512_setzero_si512(),
                                                     c));
        _mm512_storeu_ps(o + 128, _mm512_insertf32x8(_mm512_set1_ps(d0),
                                                     _mm256_set1_ps(d1), 1));
    }
}

static size_t xq1_bytes(int64_t k) {
    return (size_t) ((k + 63) / 64) * XQ1_STEP;
}

/* The Q4_1/Q5_1 activation layout: xq_conv's, of blocks quantized to
 * Q8_1 by dtype.c (its rounding differs from Q8_0's), then per step the
 * two blocks' s (d * sum q) in lanes 0 and 8 of 16 floats. */
static void xq1_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t e = 0; e < k; e += 64, o += XQ1_STEP) {
        BlockQ8_1 b[2];
        float     d[16] = { 0 }, sv[16] = { 0 };
        __m512i   q, c;

        memset(b, 0, sizeof(b));
        quantize_row_q8_1_ref(x + e, b, k - e < 64 ? QK : 2 * QK);
        for (int i = 0; i < 2; i++) {
            for (int l = 0; l < 8; l++) d[8 * i + l] = f16_to_f32(b[i].d);
            sv[8 * i] = f16_to_f32(b[i].s);
        }
        q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)
                                                      b[0].qs)),
            _mm256_loadu_si256((const __m256i *) b[1].qs), 1);
        c = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                _mm512_set1_epi8((char) 0x80), q);
        _mm512_storeu_si512(o, q);
        _mm512_storeu_si512(o + 64, _mm512_sub_epi32(_mm512_setzero_si512(),
                                                     c));
        memcpy(o + 128, d, sizeof(d));
        memcpy(o + 192, sv, sizeof(sv));
    }
}

static size_t xg_bytes(int64_t k) {
    return (size_t) (k / 512) * XG_STEP + xq_bytes(k % 512);
}

/* The WL_X16 activation layout: per group of 512 elements, chunk c's lane
 * i holding elements 4c..4c+3 of block i, then -128 * sum of each block
 * (int32) and the 16 block scales (f32); the elements past the last group
 * as xq_conv writes them. The blocks are quantized as everywhere else. */
static void xg_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t g = 0; g < k / 512; g++, o += XG_STEP) {
        int32_t q[X16][8], c[X16];
        float   d[X16];

        for (int i = 0; i < X16; i++) {
            __m256i v;

            d[i] = f16_to_f32(quant_block(x + g * 512 + i * QK, &v));
            _mm256_storeu_si256((__m256i *) q[i], v);
            c[i] = -128 * _mm512_reduce_add_epi32(_mm512_madd_epi16(
                _mm512_cvtepi8_epi16(v), _mm512_set1_epi16(1)));
        }
        for (int ch = 0; ch < 8; ch++) {
            for (int i = 0; i < X16; i++) {
                memcpy(o + 64 * ch + 4 * i, &q[i][ch], 4);
            }
        }
        memcpy(o + 512, c, sizeof(c));
        memcpy(o + 576, d, sizeof(d));
    }
    xq_conv(x + k / 512 * 512, o, k % 512);
}


const CpuVec cpu_vec_avx512 = {
    .name = "avx512",
    .mm = {
        { DT_F32,  gemm_f32,  F_ROWS, F_COLS, NULL, NULL },
        { DT_F32,  gemm_f16,  F_ROWS, F_COLS, NULL, NULL },
        { DT_F32,  gemm_bf16, F_ROWS, F_COLS, NULL, NULL },
        { DT_Q8_0, gemm_q8_0, Q_ROWS, Q_COLS, xq_conv, xq_bytes },
        { DT_Q8_0, gemm_q4_0, Q_ROWS, Q_COLS, xq_conv, xq_bytes },
        { DT_Q8_0, gemm_q8_0x, X_CALL_ROWS, X_COLS, xg_conv, xg_bytes },
        { DT_Q8_0, gemm_q4_0x, X_CALL_ROWS, X_COLS, xg_conv, xg_bytes },
        [7]  = { DT_Q8_1, gemm_q4_1, Q_ROWS, Q_COLS, xq1_conv, xq1_bytes },
        [8]  = { DT_Q8_0, gemm_q5_0, Q_ROWS, Q_COLS, xq_conv, xq_bytes },
        [9]  = { DT_Q8_1, gemm_q5_1, Q_ROWS, Q_COLS, xq1_conv, xq1_bytes },
        [10] = { DT_Q8_K, avx512_gemm_q2_K, KQ_ROWS, 1, NULL, NULL },
        [11] = { DT_Q8_K, avx512_gemm_q3_K, KQ_ROWS, 1, NULL, NULL },
        [12] = { DT_Q8_K, avx512_gemm_q4_K, KQ_ROWS, 1, NULL, NULL },
        [13] = { DT_Q8_K, avx512_gemm_q5_K, KQ_ROWS, 1, NULL, NULL },
        [14] = { DT_Q8_K, avx512_gemm_q6_K, KQ_ROWS, 1, NULL, NULL },
        [15] = { DT_Q8_0, gemm_iq4_nl, Q_ROWS, Q_COLS, xq_conv, xq_bytes },
        [16] = { DT_Q8_K, avx512_gemm_iq4_xs, KQ_ROWS, 1, NULL, NULL },
    },
    .quantize_q8_0 = quantize_q8_0,
    .to_f16 = avx512_to_f16,
    .dequantize = avx512_dequantize,
    .dot_f16 = avx512_dot_f16,
    .axpy_f16 = avx512_axpy_f16,
    .scores_f16 = avx512_scores_f16,
    .mix_f16 = avx512_mix_f16,
    .sum_sq = avx512_sum_sq,
    .scale_mul = avx512_scale_mul,
    .silu_mul = avx512_silu_mul,
    .exp_sum = avx512_exp_sum,
    .add = avx512_add,
    .scale = avx512_scale,
    .gelu_mul = avx512_gelu_mul,
    .tanh_scale = avx512_tanh_scale,
};

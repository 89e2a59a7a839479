/* avx2.c -- the CpuVec table for AVX2 with FMA and F16C.
 * This file holds the matmul of the f types, Q8_0 and Q4_0, and the
 * table; avx2_kq.c the gemms of the other block types (K-quants, IQ4_*,
 * Q4_1, Q5_0, Q5_1); avx2_ops.c the other kernels; avx2.h what they
 * share.
 *
 * The same design as avx512.c (see that file for the reasoning) at half
 * the width, with 16 ymm registers and no VNNI. What differs:
 *
 *   f32, f16, bf16 weights: 8 elements per step, one accumulator per
 *     output, 4x3 tiles: 12 accumulators, 3 weight vectors, 1 activation
 *     vector, 7 loads per 12 FMAs (3x2 tiles with two accumulators each
 *     ran 5 per 6: F16 prefill of the 1B model 15-35% slower); decode
 *     runs 1x3 tiles, so three chains of FMAs hide the latency. f16
 *     widens with vcvtph2ps, bf16 with a zero-extend and a shift.
 *   q8_0, q4_0 weights as stored: one block (32 elements) per step.
 *     Without VNNI the int8 dot is vpmaddubsw, unsigned x signed with a
 *     saturating 16-bit pair sum, so both operands must stay below 128 in
 *     magnitude: the weights enter as |w| and the activations take the
 *     sign of w (vpsignb), ggml's recipe. q4_0 becomes signed (q - 8)
 *     first, so both types share the pair step: sign, maddubs, madd to
 *     int32, convert, scale (activation x weight), FMA. Activations are
 *     quantized once per call to a private layout (xq_conv): per block the
 *     32 bytes, then the scale spread over 8 floats. 2x2 tiles.
 *   q8_0, q4_0 weights repacked at load into avx512.c's WL_X16 groups
 *     (dtype.h): one layout for both sets, so a model file and the tests
 *     know one. A group is read as two halves of 8 blocks; a 32-byte load
 *     holds 4 weights of each of 8 blocks, and the dot products stay
 *     per block in the 8 int32 lanes across a half's 8 loads, so the
 *     convert, the scale multiply and the FMA run once per 256 weights
 *     instead of once per 32. q8_0 keeps the sign recipe (the +128 bias of
 *     the layout is one xor per weight load, shared by the tile's rows):
 *     per 32 weights and row sign, maddubs, madd, add. q4_0 needs no sign
 *     at all: its nibbles (q + 8, 0..15) are maddubs' unsigned operand as
 *     stored, pair sums stay within 2 * 15 * 127, so a half's 8 maddubs
 *     add up in int16 and one madd widens them; the activation side
 *     carries -8 * sum(x) per block to take the 8 back out (xg_conv).
 *     Measured on Zen 3 in L1, 4x1 tiles: the sign recipe ran 55-58
 *     GMAC/s a core, splitting q8_0 weights into two nibble streams (two
 *     maddubs and two int16 adds per 32, no madd) 48-52, splitting the
 *     activations instead 37-40: vpsignb, vpmaddubsw, vpmaddwd, FMA and
 *     the converts share the same two pipes there, and the int16 adds did
 *     not run free beside them.
 *
 * Batches: f types and stored q types run a weight panel that fits L2
 * against tiles of activation rows, k in blocks; repacked q types with
 * more than one row stream (gemm_stream): four weight rows at a time, the
 * next four prefetched, against every row of an L2-sized block of
 * activations in (4 x 1) tiles, so weights come from memory once per
 * block and each activation tile is read once per four weight rows.
 *
 * Tails run the same vector step on zero-padded copies, accumulators are
 * parked (not summed) between blocks of k, and every output is summed by
 * one tree (hsum), so all tile shapes give the same bits, as vec.h
 * requires. */

#include "avx2.h"

enum { T_F32, T_F16, T_BF16, T_Q8, T_Q4, T_Q8X, T_Q4X };

#define XQ_BLOCK 64             /* bytes per block of converted x (stored q) */
#define XG_HALF  320            /* bytes per half group of converted x */
#define XG_STEP  (2 * XG_HALF)  /* bytes per 512 elements (a WL_X16 group) */

/* Tiles and blocking (measured with 2 threads on Zen 3, see the figures
 * in README "Kernels"):
 *
 * A register tile is rows activation rows against cols weight rows: the
 * (rows x cols) block of outputs, one accumulator each. F_ROWS x F_COLS
 * tiles for f types, Q_ROWS x Q_COLS for stored q types, X_ROWS x X_COLS
 * for repacked ones. PANEL_L2 bytes of weight rows (at most PANEL_MAX
 * rows) make a panel that stays in L2 while every tile of activation rows
 * runs against it, k cut into blocks of K_BLOCK elements so that a tile's
 * activations stay in L1. Repacked q types stream X_STREAM weight rows at
 * a time against X_BLOCK bytes of activations (L2), k in blocks of
 * X_K_BLOCK elements (X_STREAM rows and a tile of activations in L1). */
#define F_ROWS  4
#define F_COLS  3
#define Q_ROWS  2
#define Q_COLS  2
#define X_ROWS  4
#define X_COLS  1
#define X_STREAM 4              /* weight rows a stream holds in L1 */
#define K_BLOCK 1024            /* elements per K block (multiple of 16) */
#define PANEL_L2 (160 << 10)    /* bytes of weights in a panel */
#define PANEL_MAX 48            /* most rows in a panel (multiple of 6) */
#define X_BLOCK (160 << 10)     /* bytes of activations kept in L2 */
#define X_K_BLOCK 2048          /* elements per k block (multiple of 512) */
#define X_PARK_ROWS 64          /* most activation rows per block of k */
#define ROWS_MAX 4              /* of F_ROWS, Q_ROWS and X_ROWS */
#define COLS_MAX 3              /* of F_COLS, Q_COLS and X_COLS */

/* Parked accumulators: slot (weight row j, activation row i) of a panel;
 * a stream's tile of X_ROWS rows takes X_STREAM weight rows' worth
 * (X_TILE_PARK_SLOTS vectors). */
#define PARK_SLOT(j, i)     ((j) * ROWS_MAX + (i))
#define X_TILE_PARK_SLOTS   (X_STREAM * ROWS_MAX)

_Static_assert(F_ROWS <= ROWS_MAX && Q_ROWS <= ROWS_MAX && X_ROWS <= ROWS_MAX
               && F_COLS <= COLS_MAX && Q_COLS <= COLS_MAX
               && X_COLS <= COLS_MAX,
               "tile arrays too small");
_Static_assert(K_BLOCK % 32 == 0, "K blocks must start a block");
_Static_assert(PANEL_MAX % F_COLS == 0 && PANEL_MAX % Q_COLS == 0
               && X_STREAM % X_COLS == 0 && X_K_BLOCK % 512 == 0,
               "tiles must fit");

INLINE int t_rows(const int wtype) {
    return wtype <= T_BF16 ? F_ROWS : wtype <= T_Q4 ? Q_ROWS : X_ROWS;
}
INLINE int t_cols(const int wtype) {
    return wtype <= T_BF16 ? F_COLS : wtype <= T_Q4 ? Q_COLS : X_COLS;
}
INLINE int t_step(const int wtype) {
    return wtype <= T_BF16 ? 8 : wtype <= T_Q4 ? 32 : 512;
}
/* The type whose steps run the tail of a WL_X16 row (its blocks past the
 * last group are stored as usual). */
INLINE int t_base(const int wtype) {
    return wtype == T_Q8X ? T_Q8 : wtype == T_Q4X ? T_Q4 : wtype;
}
/* Bytes of a WL_X16 group. */
INLINE size_t t_group(const int wtype) {
    return X16 * (wtype == T_Q8X ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
}


/* ---- matmul: one step of each weight type ---------------------------------- */

typedef struct {
    __m256  f;              // f types: 8 weights
    __m256i a, q;           // q types: |w| and w (signed), 32 bytes
    __m256  d;              //   and the block scale
} WOp;

typedef struct {
    __m256  f;              // f types: 8 activations
    __m256i q;              // q types: 32 signed bytes
    __m256  d;              //   and the block scale
} XOp;

INLINE WOp load_w(const int wtype, const char *w, int64_t s) {
    WOp o;

    if (wtype == T_F32) {
        o.f = _mm256_loadu_ps((const float *) w + s * 8);
    } else if (wtype == T_F16 || wtype == T_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *) ((const uint16_t *) w
                                                       + s * 8));

        o.f = wtype == T_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
        uint16_t d;

        if (wtype == T_Q8) {
            const BlockQ8_0 *b = (const BlockQ8_0 *) w + s;

            o.q = _mm256_loadu_si256((const __m256i *) b->qs);
            d = b->d;
        } else {
            /* elements 0..15 low nibbles, 16..31 high, made signed */
            const BlockQ4_0 *b = (const BlockQ4_0 *) w + s;
            __m128i          v = _mm_loadu_si128((const __m128i *) b->qs);
            __m256i          q = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);

            o.q = _mm256_sub_epi8(_mm256_and_si256(q, _mm256_set1_epi8(15)),
                                  _mm256_set1_epi8(8));
            d = b->d;
        }
        o.a = _mm256_sign_epi8(o.q, o.q);
        o.d = _mm256_cvtph_ps(_mm_set1_epi16((short) d));
    }
    return o;
}

INLINE XOp load_x(const int wtype, const char *x, int64_t s) {
    XOp o;

    if (wtype <= T_BF16) {
        o.f = _mm256_loadu_ps((const float *) x + s * 8);
        /* one load per row and step, not one per FMA (see avx512.c) */
        __asm__("" : "+x"(o.f));
    } else {
        o.q = _mm256_loadu_si256((const __m256i *) (x + s * XQ_BLOCK));
        o.d = _mm256_loadu_ps((const float *) (x + s * XQ_BLOCK + 32));
    }
    return o;
}

INLINE __m256 madd(const int wtype, XOp x, WOp w, __m256 acc) {
    __m256i p;

    if (wtype <= T_BF16) return _mm256_fmadd_ps(x.f, w.f, acc);
    /* |w| * (x with w's sign) = w * x, at most 2 * 128 * 127 per pair */
    p = _mm256_maddubs_epi16(w.a, _mm256_sign_epi8(x.q, w.q));
    p = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(x.d, w.d),
                           acc);
}

INLINE void tile_step(const int wtype, const int rows, const int cols,
                      const char *x, size_t ldx, const char *w, size_t ldw,
                      int64_t s, __m256 acc[ROWS_MAX][COLS_MAX])
{
    WOp wv[COLS_MAX];

#pragma GCC unroll 4
    for (int j = 0; j < cols; j++) wv[j] = load_w(wtype, w + j * ldw, s);
#pragma GCC unroll 4
    for (int i = 0; i < rows; i++) {
        XOp xv = load_x(wtype, x + i * ldx, s);

#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            acc[i][j] = madd(wtype, xv, wv[j], acc[i][j]);
        }
    }
}


/* ---- matmul: half groups of repacked q rows ----------------------------- */

/* Half h (blocks 8h..8h+7) of group g of an (rows x cols) tile of WL_X16 rows.
 * Per output one int32 vector ends with the exact dot of block 8h+i in
 * lane i; then one convert, one multiply of the 8 scale pairs, one FMA,
 * in this order for every tile shape.
 *
 * q8_0: chunk c's 32 bytes (4 weights of each of the 8 blocks, +128) are
 * made signed (xor) and absolute once for the tile's rows; per row, the
 * activations take the weights' sign, maddubs, madd to int32, add.
 * q4_0: chunk c's low nibbles (elements 4c..4c+3) meet activation chunk
 * c, its high nibbles (16+4c..) chunk c + 4; the 8 maddubs of a half add
 * in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15), one madd widens them, and
 * the activation's -8 * sum(x) per block cancels the nibbles' +8.
 * Integer sums are exact, so their order changes no bit. The first half
 * of a tile given prefetch prefetches its rows' group at prefetch. */
INLINE void half_step(const int wtype, const int rows, const int cols,
                      const char *x, size_t ldx, const char *w, size_t ldw,
                      int64_t g, int h, __m256 acc[ROWS_MAX][COLS_MAX],
                      const char *prefetch)
{
    const size_t  group_bytes = t_group(wtype);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i       p[ROWS_MAX][COLS_MAX];
    __m256        wd[COLS_MAX];

    x += g * XG_STEP + h * XG_HALF;
    w += g * group_bytes;
    if (prefetch != NULL && h == 0) {
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            for (size_t o = 0; o < group_bytes + 63; o += 64) {
                _mm_prefetch(prefetch + g * group_bytes + j * ldw + o,
                             _MM_HINT_T0);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < rows; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) p[i][j] = _mm256_setzero_si256();
    }
    if (wtype == T_Q8X) {
        for (int c = 0; c < 8; c++) {
            __m256i ws[COLS_MAX], wa[COLS_MAX];

#pragma GCC unroll 4
            for (int j = 0; j < cols; j++) {
                ws[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)
                            (w + j * ldw + 32 + 64 * c + 32 * h)),
                        _mm256_set1_epi8((char) 0x80));
                wa[j] = _mm256_sign_epi8(ws[j], ws[j]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < rows; i++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)
                                                (x + i * ldx + 32 * c));

#pragma GCC unroll 4
                for (int j = 0; j < cols; j++) {
                    p[i][j] = _mm256_add_epi32(p[i][j], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(wa[j],
                                             _mm256_sign_epi8(xv, ws[j])),
                        ones));
                }
            }
        }
    } else {
        const __m256i m = _mm256_set1_epi8(15);

        for (int c = 0; c < 4; c++) {
            __m256i lo[COLS_MAX], hi[COLS_MAX];

#pragma GCC unroll 4
            for (int j = 0; j < cols; j++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)
                                               (w + j * ldw + 32 + 64 * c
                                                + 32 * h));

                lo[j] = _mm256_and_si256(v, m);
                hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            }
#pragma GCC unroll 4
            for (int i = 0; i < rows; i++) {
                __m256i xa = _mm256_loadu_si256((const __m256i *)
                                                (x + i * ldx + 32 * c));
                __m256i xb = _mm256_loadu_si256((const __m256i *)
                                                (x + i * ldx + 32 * c + 128));

#pragma GCC unroll 4
                for (int j = 0; j < cols; j++) {
                    p[i][j] = _mm256_add_epi16(p[i][j],
                                               _mm256_maddubs_epi16(lo[j], xa));
                    p[i][j] = _mm256_add_epi16(p[i][j],
                                               _mm256_maddubs_epi16(hi[j], xb));
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < rows; i++) {
            __m256i c = _mm256_loadu_si256((const __m256i *)
                                           (x + i * ldx + 256));

#pragma GCC unroll 4
            for (int j = 0; j < cols; j++) {
                p[i][j] = _mm256_add_epi32(_mm256_madd_epi16(p[i][j], ones),
                                           c);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < cols; j++) {
        wd[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)
                                                (w + j * ldw + 16 * h)));
    }
#pragma GCC unroll 4
    for (int i = 0; i < rows; i++) {
        __m256 xd = _mm256_loadu_ps((const float *) (x + i * ldx + 288));

#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[i][j]),
                                        _mm256_mul_ps(xd, wd[j]), acc[i][j]);
        }
    }
}


/* ---- matmul: the tile body -------------------------------------------------- */

/* out (rows, cols) of x (rows, k) . w (cols, k)^T over the elements [k0, k1).
 * Every output has one accumulator: the steps in order, then the tail
 * (f types: k % 8 elements, zero-padded; WL_X16 rows: the stored blocks
 * after the last group), summed at k1 == k by the fixed tree.
 * k0 > 0 resumes from parked, k1 < k parks there (parked: this tile's slot
 * PARK_SLOT(0, 0)). A repacked tile given prefetch (the weight rows to
 * come) prefetches its cols rows' groups there. */
INLINE void tile(const int wtype, const int rows, const int cols, int64_t k,
                 int64_t k0, int64_t k1, const char *x, size_t ldx,
                 const char *w, size_t ldw, float *out, size_t ldo,
                 __m256 *parked, const char *prefetch)
{
    const int step = t_step(wtype);
    int64_t   s = k0 / step, s1 = k1 / step, ns = k / step;
    int       rem = (int) (k % step);
    __m256    acc[ROWS_MAX][COLS_MAX];

#pragma GCC unroll 4
    for (int i = 0; i < rows; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            acc[i][j] = k0 == 0 ? _mm256_setzero_ps()
                                : parked[PARK_SLOT(j, i)];
        }
    }
    if (wtype >= T_Q8X) {
        for (; s < s1; s++) {
            half_step(wtype, rows, cols, x, ldx, w, ldw, s, 0, acc, prefetch);
            half_step(wtype, rows, cols, x, ldx, w, ldw, s, 1, acc, prefetch);
        }
    } else {
#pragma GCC unroll 2
        for (; s < s1; s++) {
            tile_step(wtype, rows, cols, x, ldx, w, ldw, s, acc);
        }
    }
    if (k1 < k) {
#pragma GCC unroll 4
        for (int i = 0; i < rows; i++) {
#pragma GCC unroll 4
            for (int j = 0; j < cols; j++) parked[PARK_SLOT(j, i)] = acc[i][j];
        }
        return;
    }
    if (wtype >= T_Q8X) {
        const char *xt = x + ns * XG_STEP, *wt = w + ns * t_group(wtype);

        for (int b = 0; b < rem / QK; b++) {
            tile_step(t_base(wtype), rows, cols, xt, ldx, wt, ldw, b, acc);
        }
    } else if (wtype <= T_BF16 && rem != 0) {
        /* 8 f32 activations and 8 weights of up to 4 bytes per row */
        float xp[ROWS_MAX][8], wp[COLS_MAX][8];
        int   wb = wtype == T_F32 ? 4 : 2;

        memset(xp, 0, sizeof(xp));
        memset(wp, 0, sizeof(wp));
        for (int i = 0; i < rows; i++) {
            memcpy(xp[i], x + i * ldx + ns * 32, (size_t) rem * 4);
        }
        for (int j = 0; j < cols; j++) {
            memcpy(wp[j], w + j * ldw + ns * 8 * wb, (size_t) rem * wb);
        }
        tile_step(wtype, rows, cols, (char *) xp, 32, (char *) wp, 32, 0, acc);
    }
#pragma GCC unroll 4
    for (int i = 0; i < rows; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) out[i * ldo + j] = hsum(acc[i][j]);
    }
}

/* One (mr x cols) tile, mr <= the type's rows, or its 1x1 pieces at a
 * weight-row edge (nr < cols): a 1x1 tile computes each output exactly as
 * the big one does. */
INLINE void tile_any(const int wtype, int64_t k, int64_t k0, int64_t k1,
                     int mr, int nr, const char *x, size_t ldx, const char *w,
                     size_t ldw, float *out, size_t ldo, __m256 *parked,
                     const char *prefetch)
{
    const int cols = t_cols(wtype);

    if (nr == cols) {
        switch (mr) {                   /* ROWS_MAX cases */
        case 4: if (t_rows(wtype) >= 4) {
                    tile(wtype, 4, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                         parked, prefetch);
                }
                return;
        case 3: if (t_rows(wtype) >= 3) {
                    tile(wtype, 3, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                         parked, prefetch);
                }
                return;
        case 2: tile(wtype, 2, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, prefetch);
                return;
        case 1: tile(wtype, 1, cols, k, k0, k1, x, ldx, w, ldw, out, ldo,
                     parked, prefetch);
                return;
        }
    }
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) {
            tile(wtype, 1, 1, k, k0, k1, x + i * ldx, ldx, w + j * ldw, ldw,
                 out + i * ldo + j, ldo, parked + PARK_SLOT(j, i), prefetch);
        }
    }
}


/* ---- matmul: blocking for the caches ---------------------------------------- */

/* f types and stored q types with more than one activation row: panels
 * of weight rows that fit L2 (PANEL_L2 bytes, at most PANEL_MAX rows),
 * each run against every tile of activation rows in turn, k in blocks of
 * K_BLOCK so that the tile's block of activations stays in L1 while the
 * panel's weight tiles stream past it from L2. Between blocks the
 * accumulators themselves (not sums) are parked, so a blocked output
 * sees exactly the operations of an unblocked one. */
INLINE void gemm_panels(const int wtype, int64_t k, int mr, int nr,
                        const char *x, size_t ldx, const char *w, size_t ldw,
                        float *out, size_t ldo)
{
    const int rows = t_rows(wtype), cols = t_cols(wtype);
    __m256    park[PANEL_MAX * ROWS_MAX];
    int       panel = (int) (PANEL_L2 / ldw) / cols * cols;

    panel = panel < cols ? cols : panel > PANEL_MAX ? PANEL_MAX : panel;
    for (int p0 = 0; p0 < nr; p0 += panel) {
        int pn = nr - p0 < panel ? nr - p0 : panel;

        for (int i0 = 0; i0 < mr; i0 += rows) {
            int m = mr - i0 < rows ? mr - i0 : rows;

            for (int64_t k0 = 0; k0 < k; k0 += K_BLOCK) {
                int64_t k1 = k - k0 <= K_BLOCK ? k : k0 + K_BLOCK;

                for (int j = 0; j < pn; j += cols) {
                    tile_any(wtype, k, k0, k1, m,
                             pn - j < cols ? pn - j : cols,
                             x + (size_t) i0 * ldx, ldx,
                             w + (size_t) (p0 + j) * ldw, ldw,
                             out + (size_t) i0 * ldo + p0 + j, ldo,
                             park + PARK_SLOT(j, 0), NULL);
                }
            }
        }
    }
}

/* Repacked q types, activation rows i .. i + m of a block against the
 * X_STREAM weight rows (or fewer, ns, at the end of a matrix) at w over
 * [k0, k1): (X_ROWS x X_COLS) tiles, the activation tile outer, so each is
 * read from L2 once per X_STREAM weight rows while those stay in L1. The
 * first tile prefetches the rows X_STREAM further on (the others would
 * only ask again for lines already on their way). parked: the block's
 * park (NULL: k is not blocked). */
INLINE void stream_rows(const int wtype, int64_t k, int64_t k0, int64_t k1,
                        int m, int ns, const char *x, size_t ldx,
                        const char *w, size_t ldw, float *out, size_t ldo,
                        __m256 *parked)
{
    for (int i = 0; i < m; i += X_ROWS) {
        int     mi = m - i < X_ROWS ? m - i : X_ROWS;
        __m256 *pt = parked != NULL
                     ? parked + i / X_ROWS * X_TILE_PARK_SLOTS : NULL;

        for (int j = 0; j < ns; j += X_COLS) {
            tile_any(wtype, k, k0, k1, mi, ns - j < X_COLS ? ns - j : X_COLS,
                     x + (size_t) i * ldx, ldx, w + (size_t) j * ldw, ldw,
                     out + (size_t) i * ldo + j, ldo,
                     pt != NULL ? pt + PARK_SLOT(j, 0) : NULL,
                     i == 0 ? w + (size_t) (j + X_STREAM) * ldw : NULL);
        }
    }
}

/* Repacked q types with more than one activation row: X_STREAM weight rows
 * at a time against every row of a block of activations that fits in L2
 * (X_BLOCK). The weight rows come from memory once per block, front to
 * back, while the tiles prefetch the next X_STREAM; rows longer than
 * X_K_BLOCK elements go in blocks of k, every tile parking its
 * accumulators between them, so the rows and an activation tile stay in
 * L1. Every output runs the one tile body, so the bits are those of any
 * shape. */
INLINE void gemm_stream(const int wtype, int64_t k, int mr, int nr,
                        const char *x, size_t ldx, const char *w, size_t ldw,
                        float *out, size_t ldo)
{
    __m256  park[X_PARK_ROWS / X_ROWS * X_TILE_PARK_SLOTS];
    __m256 *parked = k > X_K_BLOCK ? park : NULL;
    int     xb = (int) (X_BLOCK / ldx) / X_ROWS * X_ROWS;

    xb = xb < X_ROWS ? X_ROWS : xb;
    xb = parked != NULL && xb > X_PARK_ROWS ? X_PARK_ROWS : xb;
    for (int i0 = 0; i0 < mr; i0 += xb) {
        int         m = mr - i0 < xb ? mr - i0 : xb;
        const char *xi = x + (size_t) i0 * ldx;
        float      *oi = out + (size_t) i0 * ldo;

        for (int j = 0; j < nr; j += X_STREAM) {
            int ns = nr - j < X_STREAM ? nr - j : X_STREAM;

            for (int64_t k0 = 0; k0 < k; k0 += X_K_BLOCK) {
                int64_t k1 = k - k0 <= X_K_BLOCK ? k : k0 + X_K_BLOCK;

                stream_rows(wtype, k, k0, k1, m, ns, xi, ldx,
                            w + (size_t) j * ldw, ldw, oi + j, ldo, parked);
            }
        }
    }
}

/* The gemm of one weight type: out (mr, nr) for any mr <= GEMM_MR_MAX and
 * nr. One activation row (decode) runs tiles over whole rows, front to
 * back. */
INLINE void gemm_any(const int wtype, int64_t k, int mr, int nr, const char *x,
                     size_t ldx, const char *w, size_t ldw, float *out,
                     size_t ldo)
{
    if (mr == 1) {
        /* f types and stored q types: (1 x cols) tiles, cols rows' chains of
         * FMAs at once (one row at a time waited on the FMA latency: f16
         * decode of the 1B model ran 9-11 tokens/s, 11-13.5 now); repacked
         * rows one at a time (two at once slowed q8_0 decode by 20%). */
        const int cols = wtype <= T_Q4 ? t_cols(wtype) : 1;
        int       j = 0;

        for (; j + cols <= nr; j += cols) {
            tile(wtype, 1, cols, k, 0, k, x, ldx, w + (size_t) j * ldw, ldw,
                 out + j, ldo, NULL, NULL);
        }
        for (; j < nr; j++) {
            tile(wtype, 1, 1, k, 0, k, x, ldx, w + (size_t) j * ldw, ldw,
                 out + j, ldo, NULL, NULL);
        }
    } else if (wtype >= T_Q8X) {
        gemm_stream(wtype, k, mr, nr, x, ldx, w, ldw, out, ldo);
    } else {
        gemm_panels(wtype, k, mr, nr, x, ldx, w, ldw, out, ldo);
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
GEMM_FN(gemm_q8_0x, T_Q8X)
GEMM_FN(gemm_q4_0x, T_Q4X)


/* ---- activation conversion ------------------------------------------------ */

/* Quantizes 32 floats exactly as ref.c does (see avx512.c); returns the f16
 * scale, q gets the bytes in order. */
INLINE uint16_t quant_block(const float *x, __m256i *q) {
    __m256  v[4], m = _mm256_setzero_ps();
    __m256  sign = _mm256_set1_ps(-0.0f);
    __m128  h;
    __m256i i0, i1, i2, i3;
    float   amax, id;

    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + j * 8);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    amax = _mm_cvtss_f32(h);
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
    i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], _mm256_set1_ps(id)));
    i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], _mm256_set1_ps(id)));
    i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], _mm256_set1_ps(id)));
    i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], _mm256_set1_ps(id)));
    /* the packs work per 128-bit lane; the permute restores the order */
    *q = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(i0, i1),
                           _mm256_packs_epi32(i2, i3)),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
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
    return (size_t) (k / QK) * XQ_BLOCK;
}

/* The stored-q activation layout: per block the 32 signed bytes, then the
 * scale spread over 8 floats. */
static void xq_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t b = 0; b < k / QK; b++, o += XQ_BLOCK) {
        __m256i q;
        float   d = f16_to_f32(quant_block(x + b * QK, &q));

        _mm256_storeu_si256((__m256i *) o, q);
        _mm256_storeu_ps((float *) (o + 32), _mm256_set1_ps(d));
    }
}

static size_t xg_bytes(int64_t k) {
    return (size_t) (k / 512) * XG_STEP + xq_bytes(k % 512);
}

/* The WL_X16 activation layout: per group of 512 elements two halves,
 * each 8 chunks of 32 bytes (chunk c's lane i holding elements 4c..4c+3
 * of block 8h + i), then -8 * sum of each block (int32, for q4_0) and the
 * 8 block scales (f32); the elements past the last group as xq_conv
 * writes them. The blocks are quantized as everywhere else. */
static void xg_conv(const float *x, void *y, int64_t k) {
    char *o = y;

    for (int64_t g = 0; g < k / 512; g++) {
        for (int h = 0; h < 2; h++, o += XG_HALF) {
            int32_t q[8][8], c[8];
            float   d[8];

            for (int i = 0; i < 8; i++) {
                __m256i v, s;

                d[i] = f16_to_f32(quant_block(x + g * 512 + (8 * h + i) * QK,
                                              &v));
                _mm256_storeu_si256((__m256i *) q[i], v);
                /* sum of the 32 bytes: widen to 16 bits, add pairs */
                s = _mm256_madd_epi16(_mm256_maddubs_epi16(
                        _mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
                s = _mm256_add_epi32(s, _mm256_srli_si256(s, 8));
                s = _mm256_add_epi32(s, _mm256_srli_si256(s, 4));
                c[i] = -8 * (_mm256_extract_epi32(s, 0)
                             + _mm256_extract_epi32(s, 4));
            }
            for (int ch = 0; ch < 8; ch++) {
                for (int i = 0; i < 8; i++) {
                    memcpy(o + 32 * ch + 4 * i, &q[i][ch], 4);
                }
            }
            memcpy(o + 256, c, sizeof(c));
            memcpy(o + 288, d, sizeof(d));
        }
    }
    xq_conv(x + k / 512 * 512, o, k % 512);
}


const CpuVec cpu_vec_avx2 = {
    .name = "avx2",
    .mm = {
        { DT_F32,  gemm_f32,  GEMM_MR_MAX, F_COLS, NULL, NULL },
        { DT_F32,  gemm_f16,  GEMM_MR_MAX, F_COLS, NULL, NULL },
        { DT_F32,  gemm_bf16, GEMM_MR_MAX, F_COLS, NULL, NULL },
        { DT_Q8_0, gemm_q8_0, GEMM_MR_MAX, Q_COLS, xq_conv, xq_bytes },
        { DT_Q8_0, gemm_q4_0, GEMM_MR_MAX, Q_COLS, xq_conv, xq_bytes },
        { DT_Q8_0, gemm_q8_0x, GEMM_MR_MAX, X_STREAM, xg_conv, xg_bytes },
        { DT_Q8_0, gemm_q4_0x, GEMM_MR_MAX, X_STREAM, xg_conv, xg_bytes },
        [7]  = { DT_Q8_1, avx2_gemm_q4_1,   GEMM_MR_MAX, 1, NULL, NULL },
        [8]  = { DT_Q8_0, avx2_gemm_q5_0,   GEMM_MR_MAX, 1, NULL, NULL },
        [9]  = { DT_Q8_1, avx2_gemm_q5_1,   GEMM_MR_MAX, 1, NULL, NULL },
        [10] = { DT_Q8_K, avx2_gemm_q2_K,   GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
        [11] = { DT_Q8_K, avx2_gemm_q3_K,   GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
        [12] = { DT_Q8_K, avx2_gemm_q4_K,   GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
        [13] = { DT_Q8_K, avx2_gemm_q5_K,   GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
        [14] = { DT_Q8_K, avx2_gemm_q6_K,   GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
        [15] = { DT_Q8_0, avx2_gemm_iq4_nl, GEMM_MR_MAX, 1, NULL, NULL },
        [16] = { DT_Q8_K, avx2_gemm_iq4_xs, GEMM_MR_MAX, 1, avx2_q8k_conv,
                 avx2_q8k_bytes },
    },
    .quantize_q8_0 = quantize_q8_0,
    .to_f16 = avx2_to_f16,
    .dequantize = avx2_dequantize,
    .dot_f16 = avx2_dot_f16,
    .axpy_f16 = avx2_axpy_f16,
    .scores_f16 = avx2_scores_f16,
    .mix_f16 = avx2_mix_f16,
    .sum_sq = avx2_sum_sq,
    .scale_mul = avx2_scale_mul,
    .silu_mul = avx2_silu_mul,
    .exp_sum = avx2_exp_sum,
    .add = avx2_add,
    .scale = avx2_scale,
    .gelu_mul = avx2_gelu_mul,
    .tanh_scale = avx2_tanh_scale,
};

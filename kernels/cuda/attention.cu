/* attention.cu -- paged causal attention (flash-decoding split), as
 * cpu_backend.c's attn_one computes it.
 *
 * For token t and query head h, the context first..pos (first = 0, or
 * pos - window + 1 with a window) is cut at multiples of w->chunk absolute
 * positions; piece i covers i*chunk .. i*chunk + chunk - 1, clipped to the
 * context. Two kernels:
 *
 *   attn_piece_kernel  grid (n, n_heads, max_splits), ATT_THREADS each:
 *                      one piece of one (t, h) into w->part at [t][h][i]:
 *                      head_dim floats of sum exp(s - m) * v, then m (the
 *                      piece's max score) and the sum of exp(s - m). A
 *                      piece outside the context writes m = -inf, sum 0.
 *   attn_merge_kernel  grid (n, n_heads): the pieces of (t, h) in split
 *                      order, each rescaled by exp(m_i - M), divided by
 *                      the rescaled sum.
 *
 * Cutting at fixed absolute positions keeps a token's arithmetic the same
 * whatever else is in the batch (kernels.h's batch invariance), and gives
 * a long decode context many blocks to spread over the SMs.
 *
 * Inside a piece the positions go by in tiles of ATT_TILE from the piece's
 * start. Each warp takes tile positions w, w + ATT_WARPS, ...: its 32 lanes
 * read one key row together (coalesced, head_dim contiguous), each a
 * fixed share of the dot product with q (held in shared memory), then the
 * warp's xor butterfly sums it. Warp 0 then takes the tile's max and sum of
 * exps over its 64 scores (two per lane, then the butterfly), keeping a
 * running max M and sum L across tiles (online softmax: the previous tiles
 * are rescaled by exp(M_old - M)). The values are mixed the same way, each
 * warp accumulating its positions' rows with lanes owning fixed dims; the
 * warps' accumulators are added in warp order at the end. Every sum
 * therefore has a fixed shape given by the token's own positions.
 *
 * Scores follow the CPU: s = scale * (q . k), then softcap * tanh(s) when
 * softcap > 0; softmax over what that leaves. Keys and values are f16,
 * computed on in f32. head_dim <= ATT_MAX_HD, which the backend checks at
 * creation; an even head_dim reads rows as half2.
 *
 * Rejected: keeping a whole piece's scores in shared memory (two exact
 * passes) ties shared memory to chunk, which the plan picks from max_ctx;
 * atomics to merge pieces would make the order, and so the bits, vary. */

#include <math.h>

#include "cuda_common.h"
#include "cuda_ops.h"

#define ATT_WARPS   4
#define ATT_THREADS (ATT_WARPS * WARP_SIZE)
#define ATT_TILE    64              // positions per tile: two per lane of
                                    //   warp 0 in tile_softmax
#define ATT_MAX_HD  256
#define ATT_ACC     (ATT_MAX_HD / WARP_SIZE)    // accumulator slots a lane

static_assert(ATT_TILE == 2 * WARP_SIZE, "tile_softmax takes two per lane");

/* Everything both kernels read, by value. */
typedef struct {
    const float    *q;              // (n, n_heads, head_dim)
    const uint16_t *k, *v;          // the layer's KV pool (KVLayer)
    const int32_t  *pos, *seq;      // (n,) CuBatch
    const int32_t  *tables;         // (n_seqs, table_stride)
    int             table_stride;
    int             n_heads, n_kv_heads, head_dim, block_size;
    float           scale, softcap;
    int             window;
    float          *part;           // (n, n_heads, max_splits, head_dim + 2)
    int             chunk, max_splits;
} AttnArgs;

/* The first and last position token t attends to. */
static __device__ __forceinline__ void attn_range(const AttnArgs *a,
                                                  int64_t t, int *first,
                                                  int *last)
{
    int p = a->pos[t];

    *last = p;
    *first = a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
}

/* Row of kv head kvh at position p of the pool base, through block table
 * bt: cpu_backend.c's kv_offset. */
static __device__ __forceinline__ const uint16_t *
kv_row(const AttnArgs *a, const uint16_t *base, const int32_t *bt, int kvh,
       int p)
{
    int32_t blk = bt[p / a->block_size];

    return base + (((size_t) blk * a->n_kv_heads + (size_t) kvh)
                   * a->block_size + (size_t) (p % a->block_size))
                  * a->head_dim;
}

/* q . k over the warp, the same bits in every lane: lane l takes pairs
 * (or, for an odd head_dim, elements) l, l + 32, ... in order. */
static __device__ __forceinline__ float row_dot(const float *q_s,
                                                const uint16_t *k, int hd,
                                                int lane)
{
    float s = 0.0f;

    if (hd % 2 == 0) {
        const __half2 *k2 = (const __half2 *) k;
        const float2  *q2 = (const float2 *) q_s;

        for (int i = lane; i < hd / 2; i += WARP_SIZE) {
            float2 kf = __half22float2(__ldg(&k2[i]));

            s += q2[i].x * kf.x + q2[i].y * kf.y;
        }
    } else {
        for (int d = lane; d < hd; d += WARP_SIZE) {
            s += q_s[d] * f16_load(&k[d]);
        }
    }
    return warp_sum(s);
}

/* The dim accumulator slot j of a lane holds (see row_axpy). */
static __device__ __forceinline__ int acc_dim(int j, int lane, int hd) {
    if (hd % 2 == 0) return 2 * (lane + WARP_SIZE * (j / 2)) + j % 2;
    return lane + WARP_SIZE * j;
}

/* acc += e * v over the lane's dims: pair lane + 32 * (j / 2), half j % 2
 * for an even head_dim, else element lane + 32 * j. */
static __device__ __forceinline__ void row_axpy(float *acc, float e,
                                                const uint16_t *v, int hd,
                                                int lane)
{
    if (hd % 2 == 0) {
        const __half2 *v2 = (const __half2 *) v;

#pragma unroll
        for (int j = 0; j < ATT_ACC; j += 2) {
            int i = lane + WARP_SIZE * (j / 2);

            if (i < hd / 2) {
                float2 vf = __half22float2(__ldg(&v2[i]));

                acc[j] += e * vf.x;
                acc[j + 1] += e * vf.y;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < ATT_ACC; j++) {
            int d = lane + WARP_SIZE * j;

            if (d < hd) acc[j] += e * f16_load(&v[d]);
        }
    }
}

/* Warp 0's step over a tile's nt scores in w_s: the new running max m,
 * w_s turned into exp(s - m), the running sum l rescaled and extended.
 * stat_s gets m and the factor the previous tiles' sums take, for the
 * other warps. */
static __device__ __forceinline__ void tile_softmax(float *w_s, int nt,
                                                    float *m, float *l,
                                                    float *stat_s, int lane)
{
    int   i0 = lane, i1 = lane + WARP_SIZE;
    float s0 = i0 < nt ? w_s[i0] : -INFINITY;
    float s1 = i1 < nt ? w_s[i1] : -INFINITY;
    float mnew = fmaxf(*m, warp_max(fmaxf(s0, s1)));
    float corr = *m == -INFINITY ? 0.0f : expf(*m - mnew);
    float e0 = i0 < nt ? expf(s0 - mnew) : 0.0f;
    float e1 = i1 < nt ? expf(s1 - mnew) : 0.0f;

    w_s[i0] = e0;
    w_s[i1] = e1;
    *l = *l * corr + warp_sum(e0 + e1);
    *m = mnew;
    if (lane == 0) {
        stat_s[0] = mnew;
        stat_s[1] = corr;
    }
}

/* Scores of tile positions p0 + j, j < nt, into w_s: warp w takes j = w,
 * w + ATT_WARPS, ... */
static __device__ __forceinline__ void tile_scores(const AttnArgs *a,
                                                   const float *q_s,
                                                   const int32_t *bt, int kvh,
                                                   int p0, int nt, float *w_s)
{
    int lane = threadIdx.x % WARP_SIZE, w = threadIdx.x / WARP_SIZE;

    for (int j = w; j < nt; j += ATT_WARPS) {
        float s = row_dot(q_s, kv_row(a, a->k, bt, kvh, p0 + j),
                          a->head_dim, lane) * a->scale;

        if (a->softcap > 0.0f) s = a->softcap * tanhf(s);
        if (lane == 0) w_s[j] = s;
    }
}

/* grid (n, n_heads, max_splits): piece blockIdx.z of token blockIdx.x,
 * query head blockIdx.y. */
static __global__ void attn_piece_kernel(AttnArgs a) {
    __shared__ __align__(16) float q_s[ATT_MAX_HD];
    __shared__ float w_s[ATT_TILE];                 // scores, then weights
    __shared__ float acc_s[ATT_WARPS][ATT_MAX_HD];
    __shared__ float stat_s[2];                     // running max, rescale
    int64_t t = blockIdx.x;
    int     h = blockIdx.y, split = blockIdx.z, hd = a.head_dim;
    int     lane = threadIdx.x % WARP_SIZE, w = threadIdx.x / WARP_SIZE;
    int     kvh = h / (a.n_heads / a.n_kv_heads), first, last, lo, hi;
    float  *part = a.part + ((t * a.n_heads + h) * a.max_splits + split)
                            * (int64_t) (hd + 2);
    const int32_t *bt;
    float   m = -INFINITY, l = 0.0f, acc[ATT_ACC];

    attn_range(&a, t, &first, &last);
    lo = max(first, split * a.chunk);
    hi = min(last, split * a.chunk + a.chunk - 1);
    if (lo > hi) {                  // the whole block agrees: no barrier
        if (threadIdx.x == 0) {     //   is skipped by part of it
            part[hd] = -INFINITY;
            part[hd + 1] = 0.0f;
        }
        return;
    }
    bt = a.tables + (int64_t) a.seq[t] * a.table_stride;
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) {
        q_s[d] = a.q[(t * a.n_heads + h) * hd + d];
    }
#pragma unroll
    for (int j = 0; j < ATT_ACC; j++) acc[j] = 0.0f;
    __syncthreads();

    for (int p0 = lo; p0 <= hi; p0 += ATT_TILE) {
        int   nt = min(ATT_TILE, hi - p0 + 1);
        float corr;

        tile_scores(&a, q_s, bt, kvh, p0, nt, w_s);
        __syncthreads();
        if (w == 0) tile_softmax(w_s, nt, &m, &l, stat_s, lane);
        __syncthreads();
        corr = stat_s[1];
#pragma unroll
        for (int j = 0; j < ATT_ACC; j++) acc[j] *= corr;
        for (int j = w; j < nt; j += ATT_WARPS) {
            row_axpy(acc, w_s[j], kv_row(&a, a.v, bt, kvh, p0 + j), hd, lane);
        }
        __syncthreads();            // w_s, stat_s are the next tile's
    }

#pragma unroll
    for (int j = 0; j < ATT_ACC; j++) {
        int d = acc_dim(j, lane, hd);

        if (d < hd) acc_s[w][d] = acc[j];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) {
        float s = acc_s[0][d];

        for (int i = 1; i < ATT_WARPS; i++) s += acc_s[i][d];
        part[d] = s;
    }
    if (threadIdx.x == 0) {         // warp 0 kept m and l
        part[hd] = m;
        part[hd + 1] = l;
    }
}

/* grid (n, n_heads): the pieces of (t, h) that hold its context, in split
 * order (the others are empty markers, which add nothing). Each thread
 * recomputes M, L and the factors for its dims: a few expf per piece,
 * the same bits in every thread. */
static __global__ void attn_merge_kernel(AttnArgs a, float *out) {
    int64_t      t = blockIdx.x;
    int          h = blockIdx.y, hd = a.head_dim, first, last, s0, s1;
    const float *base = a.part + (t * a.n_heads + h) * a.max_splits
                                 * (int64_t) (hd + 2);
    float        mx = -INFINITY, sum = 0.0f, inv;

    attn_range(&a, t, &first, &last);
    s0 = first / a.chunk;
    s1 = min(last / a.chunk, a.max_splits - 1);
    for (int s = s0; s <= s1; s++) mx = fmaxf(mx, base[s * (hd + 2) + hd]);
    for (int s = s0; s <= s1; s++) {
        const float *pc = base + s * (hd + 2);

        sum += pc[hd + 1] * expf(pc[hd] - mx);
    }
    inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;

        for (int s = s0; s <= s1; s++) {
            const float *pc = base + s * (hd + 2);

            o += pc[d] * expf(pc[hd] - mx);
        }
        out[(t * a.n_heads + h) * hd + d] = o * inv;
    }
}

void cu_attention(cudaStream_t st, float *out, const float *q, int n_heads,
                  const KVLayer *kv, const CuBatch *b, const AttnParams *p,
                  const CuAttnWork *w)
{
    AttnArgs a;

    if (b->n <= 0 || n_heads <= 0 || w->max_splits <= 0) return;
    a.q = q;
    a.k = kv->k;
    a.v = kv->v;
    a.pos = b->pos;
    a.seq = b->seq;
    a.tables = b->tables;
    a.table_stride = b->table_stride;
    a.n_heads = n_heads;
    a.n_kv_heads = kv->n_kv_heads;
    a.head_dim = kv->head_dim;
    a.block_size = kv->block_size;
    a.scale = p->scale;
    a.softcap = p->softcap;
    a.window = p->window;
    a.part = w->part;
    a.chunk = w->chunk;
    a.max_splits = w->max_splits;
    attn_piece_kernel<<<dim3((unsigned) b->n, (unsigned) n_heads,
                             (unsigned) w->max_splits),
                        ATT_THREADS, 0, st>>>(a);
    attn_merge_kernel<<<dim3((unsigned) b->n, (unsigned) n_heads),
                        ATT_THREADS, 0, st>>>(a, out);
}

/* ops.cu -- the CUDA backend's small ops: embedding, rmsnorm, the
 * elementwise ops, RoPE, the KV store, gather and argmax.
 *
 * Each follows the CPU backend (cpu_backend.c, ref.c), which defines the
 * semantics; results may differ from it in the last bits (the GPU's expf,
 * tanhf, cosf and fused multiply-adds), never in what is computed.
 *
 * Batch invariance: no kernel's arithmetic for an element depends on n.
 * Elementwise kernels touch each element once; rmsnorm runs one block of a
 * fixed RMS_THREADS per row and reduces through block_sum's fixed tree;
 * RoPE computes a token's angles from its own position only; argmax is an
 * exact comparison, so its order does not matter.
 *
 * Launchers only enqueue on the stream (no allocation, no sync, no host
 * reads of device memory) so that a decode step can be captured into a
 * CUDA graph. Grids depend only on the sizes passed in; a launch with
 * nothing to do is skipped, as CUDA refuses an empty grid. */

#include <math.h>
#include <stddef.h>

#include "cuda_common.h"
#include "cuda_ops.h"

#define ROW_THREADS  256            // threads per row-shaped block (embed,
                                    //   kv_store, gather): one column each
#define RMS_THREADS  256            // rmsnorm: fixes its reduction tree
#define ROPE_THREADS 256
#define ARGMAX_THREADS 1024         // a 150k vocabulary: ~150 per thread


/* ---- embed --------------------------------------------------------------- */

/* Element e of a row of type t, as dtype.c's dequantizers compute it
 * (d * q in f32, exact for these types). Types the backend does not
 * upload give NaN, so a missed check shows. */
static __device__ float embed_elem(const uint8_t *row, DType t, int64_t e) {
    switch (t) {
    case DT_F32:
        return ((const float *) row)[e];
    case DT_F16:
        return f16_load((const uint16_t *) row + e);
    case DT_BF16:
        return bf16_load((const uint16_t *) row + e);
    case DT_Q8_0: {
        const uint8_t *b = row + e / QK * sizeof(BlockQ8_0);
        int8_t         q = (int8_t) b[offsetof(BlockQ8_0, qs) + e % QK];

        return f16_load((const uint16_t *) b) * (float) q;
    }
    case DT_Q4_0: {
        const uint8_t *b = row + e / QK * sizeof(BlockQ4_0);
        int            j = (int) (e % QK);
        uint8_t        byte = b[offsetof(BlockQ4_0, qs) + j % (QK / 2)];
        int            q = j < QK / 2 ? byte & 0x0f : byte >> 4;

        return f16_load((const uint16_t *) b) * (float) (q - 8);
    }
    default:
        return __int_as_float(0x7fc00000);
    }
}

/* grid (n, ceil(dim / ROW_THREADS)): token blockIdx.x, one column per
 * thread. */
static __global__ void embed_kernel(float *out, const uint8_t *data,
                                    size_t row_bytes, DType t,
                                    const int32_t *tokens, int64_t dim)
{
    int64_t i = blockIdx.x;
    int64_t e = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;

    if (e >= dim) return;
    out[i * dim + e] = embed_elem(data + (size_t) tokens[i] * row_bytes, t, e);
}

void cu_embed(cudaStream_t st, float *out, const Matrix *table,
              const int32_t *tokens, int64_t n)
{
    int64_t dim = table->cols;
    dim3    grid((unsigned) n, (unsigned) ((dim + ROW_THREADS - 1)
                                           / ROW_THREADS));

    if (n <= 0 || dim <= 0) return;
    embed_kernel<<<grid, ROW_THREADS, 0, st>>>(
        out, (const uint8_t *) table->data, table->row_bytes, table->type,
        tokens, dim);
}


/* ---- rmsnorm ------------------------------------------------------------- */

/* grid (n): one block of RMS_THREADS per row. Thread i sums x^2 over
 * columns i, i + RMS_THREADS, ... in order, then block_sum's tree. Each
 * thread writes only the columns it read, after the barrier inside
 * block_sum, so out may equal x. */
static __global__ void rmsnorm_kernel(float *out, const float *x,
                                      const float *w, int64_t dim, float eps)
{
    __shared__ float red[RMS_THREADS / WARP_SIZE];
    const float     *xr = x + (int64_t) blockIdx.x * dim;
    float           *yr = out + (int64_t) blockIdx.x * dim;
    float            s = 0.0f, r;

    for (int64_t i = threadIdx.x; i < dim; i += RMS_THREADS) s += xr[i] * xr[i];
    s = block_sum(s, red);
    r = 1.0f / sqrtf(s / (float) dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += RMS_THREADS) {
        yr[i] = xr[i] * r * w[i];
    }
}

void cu_rmsnorm(cudaStream_t st, float *out, const float *x,
                const float *weight, int64_t n, int64_t dim, float eps)
{
    if (n <= 0 || dim <= 0) return;
    rmsnorm_kernel<<<(unsigned) n, RMS_THREADS, 0, st>>>(out, x, weight, dim,
                                                         eps);
}


/* ---- elementwise --------------------------------------------------------- */

static __global__ void add_bias_kernel(float *x, const float *bias,
                                       int64_t count, int64_t dim)
{
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) x[i] += bias[i % dim];
}

void cu_add_bias(cudaStream_t st, float *x, const float *bias, int64_t n,
                 int64_t dim)
{
    if (n <= 0 || dim <= 0) return;
    add_bias_kernel<<<ew_blocks(n * dim), EW_THREADS, 0, st>>>(x, bias,
                                                               n * dim, dim);
}

static __global__ void add_kernel(float *x, const float *y, int64_t count) {
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) x[i] += y[i];
}

void cu_add(cudaStream_t st, float *x, const float *y, int64_t count) {
    if (count <= 0) return;
    add_kernel<<<ew_blocks(count), EW_THREADS, 0, st>>>(x, y, count);
}

/* ref.c's silu_mul: g / (1 + e^-g) * u. out may equal gate. */
static __global__ void swiglu_kernel(float *out, const float *gate,
                                     const float *up, int64_t count)
{
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) {
        float g = gate[i];

        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cu_swiglu(cudaStream_t st, float *out, const float *gate,
               const float *up, int64_t count)
{
    if (count <= 0) return;
    swiglu_kernel<<<ew_blocks(count), EW_THREADS, 0, st>>>(out, gate, up,
                                                           count);
}

/* ggml's gelu (tanh approximation), its constants and order of
 * operations: what its f16 table holds before rounding. */
static __device__ float gelu_tanh(float x) {
    const float a = 0.044715f, s2pi = 0.79788456080286535587989211986876f;

    return 0.5f * x * (1.0f + tanhf(s2pi * x * (1.0f + a * x * x)));
}

/* gelu(x) as an entry of ggml's f16 table, computed on the fly: x
 * rounded to f16, gelu rounded to f16; the (unrounded) x at or above 10,
 * where the table is not read. NaN takes the table path and stays NaN. */
static __device__ float gelu_f16(float x) {
    float xh;

    if (x >= 10.0f) return x;
    xh = __half2float(__float2half_rn(x));
    return __half2float(__float2half_rn(gelu_tanh(xh)));
}

/* ref.c's gelu_mul: 0 at or below -10 (not 0 * up, which an infinite up
 * would make NaN), else gelu_f16(gate) * up. out may equal gate. */
static __global__ void geglu_kernel(float *out, const float *gate,
                                    const float *up, int64_t count)
{
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) {
        float x = gate[i];

        out[i] = x <= -10.0f ? 0.0f : gelu_f16(x) * up[i];
    }
}

void cu_geglu(cudaStream_t st, float *out, const float *gate,
              const float *up, int64_t count)
{
    if (count <= 0) return;
    geglu_kernel<<<ew_blocks(count), EW_THREADS, 0, st>>>(out, gate, up,
                                                          count);
}

/* cap * tanh(x * (1/cap)), ggml's order: the reciprocal once, on the
 * host, as the CPU does. */
static __global__ void softcap_kernel(float *x, int64_t count, float inv,
                                      float cap)
{
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) {
        x[i] = cap * tanhf(x[i] * inv);
    }
}

void cu_softcap(cudaStream_t st, float *x, int64_t count, float cap) {
    if (count <= 0) return;
    softcap_kernel<<<ew_blocks(count), EW_THREADS, 0, st>>>(x, count,
                                                            1.0f / cap, cap);
}

static __global__ void scale_kernel(float *x, int64_t count, float s) {
    for (int64_t i = EW_FIRST; i < count; i += EW_STRIDE) x[i] *= s;
}

void cu_scale(cudaStream_t st, float *x, int64_t count, float s) {
    if (count <= 0) return;
    scale_kernel<<<ew_blocks(count), EW_THREADS, 0, st>>>(x, count, s);
}


/* ---- rope ---------------------------------------------------------------- */

/* RopeParams reduced on the host to what the kernel reads: the scalars
 * cpu_backend.c's rope_angles derives per call, computed with the same
 * host libm calls so they are the CPU's bits. */
typedef struct {
    int          neox;          // ROPE_NEOX: halves, else adjacent pairs
    int          half;          // n_rot / 2 pairs rotated
    int          n_heads, head_dim;
    float        theta_scale;   // freq_base^(-2 / n_rot)
    float        freq_scale;
    float        ext_factor;
    float        mscale;        // attn_factor, YaRN-corrected
    float        corr_lo, corr_hi;  // YaRN correction dims
    const float *freq_factors;  // (half,) device, or NULL
} RopeArgs;

/* cos and sin of pair i at position pos, as rope_angles: theta by the
 * CPU's repeated multiplication (bit for bit the CPU's theta, where
 * powf would differ by an ulp per step), then freq_factors, linear
 * scaling and the YaRN ramp. */
static __device__ __forceinline__ void rope_pair_angle(const RopeArgs *a,
                                                       float pos, int i,
                                                       float *cs, float *sn)
{
    float theta = pos, ff, extrap, th;

    for (int k = 0; k < i; k++) theta *= a->theta_scale;
    ff = a->freq_factors != NULL ? a->freq_factors[i] : 1.0f;
    extrap = theta / ff;
    th = a->freq_scale * extrap;
    if (a->ext_factor != 0.0f) {
        float y = ((float) i - a->corr_lo)
                  / fmaxf(0.001f, a->corr_hi - a->corr_lo);
        float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * a->ext_factor;

        th = th * (1.0f - mix) + extrap * mix;
    }
    *cs = cosf(th) * a->mscale;
    *sn = sinf(th) * a->mscale;
}

/* grid (n): one block per token. Its half angles go to shared memory
 * (dynamic, 2 * half floats), then the block rotates every head's pairs;
 * dims from n_rot on are left as they are. */
static __global__ void rope_kernel(float *x, const int32_t *pos, RopeArgs a) {
    extern __shared__ float angles[];
    float  *cs = angles, *sn = angles + a.half;
    int64_t t = blockIdx.x;

    for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
        rope_pair_angle(&a, (float) pos[t], i, &cs[i], &sn[i]);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < a.n_heads * a.half; j += blockDim.x) {
        int    h = j / a.half, i = j % a.half;
        float *v = x + (t * a.n_heads + h) * a.head_dim;
        int    i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + a.half : 2 * i + 1;
        float  x0 = v[i0], x1 = v[i1];

        v[i0] = x0 * cs[i] - x1 * sn[i];
        v[i1] = x0 * sn[i] + x1 * cs[i];
    }
}

/* cpu_backend.c's rope_corr_dims: the pairs where the rotation count over
 * n_ctx_orig positions crosses beta_fast and beta_slow. */
static void rope_corr_dims(const RopeParams *p, float *lo, float *hi) {
    float n = (float) p->n_rot, two_pi = 2.0f * 3.14159265358979323846f;
    float l = n * logf((float) p->n_ctx_orig / (p->beta_fast * two_pi))
              / (2.0f * logf(p->freq_base));
    float h = n * logf((float) p->n_ctx_orig / (p->beta_slow * two_pi))
              / (2.0f * logf(p->freq_base));

    *lo = fmaxf(0.0f, floorf(l));
    *hi = fminf(n - 1.0f, ceilf(h));
}

void cu_rope(cudaStream_t st, float *x, int64_t n, int n_heads,
             int head_dim, const int32_t *pos, const RopeParams *p)
{
    RopeArgs a;

    a.neox = p->mode == ROPE_NEOX;
    a.half = p->n_rot / 2;
    a.n_heads = n_heads;
    a.head_dim = head_dim;
    a.theta_scale = powf(p->freq_base, -2.0f / (float) p->n_rot);
    a.freq_scale = p->freq_scale;
    a.ext_factor = p->ext_factor;
    a.mscale = p->attn_factor;
    a.corr_lo = 0.0f;
    a.corr_hi = 0.0f;
    a.freq_factors = p->freq_factors;
    if (p->ext_factor != 0.0f) {
        a.mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        rope_corr_dims(p, &a.corr_lo, &a.corr_hi);
    }
    if (n <= 0 || n_heads <= 0 || a.half <= 0) return;
    rope_kernel<<<(unsigned) n, ROPE_THREADS,
                  2 * (size_t) a.half * sizeof(float), st>>>(x, pos, a);
}


/* ---- KV store and gather ------------------------------------------------- */

/* grid (n, ceil(kv_dim / ROW_THREADS)): element e of token blockIdx.x's
 * k and v rows (head e / head_dim) to its slot, as cpu_kv_store and
 * kv_offset: block tables[seq * stride + pos / block_size], slot pos %
 * block_size, layout (n_blocks, n_kv_heads, block_size, head_dim). */
static __global__ void kv_store_kernel(uint16_t *kc, uint16_t *vc,
                                       const float *k, const float *v,
                                       const int32_t *pos, const int32_t *seq,
                                       const int32_t *tables, int stride,
                                       int n_kv_heads, int block_size,
                                       int head_dim)
{
    int64_t t = blockIdx.x, kv_dim = (int64_t) n_kv_heads * head_dim;
    int64_t e = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;
    int32_t p, blk;
    size_t  off;

    if (e >= kv_dim) return;
    p = pos[t];
    blk = tables[(int64_t) seq[t] * stride + p / block_size];
    off = (((size_t) blk * n_kv_heads + (size_t) (e / head_dim)) * block_size
           + (size_t) (p % block_size)) * head_dim + (size_t) (e % head_dim);
    kc[off] = f16_round(k[t * kv_dim + e]);
    vc[off] = f16_round(v[t * kv_dim + e]);
}

void cu_kv_store(cudaStream_t st, const KVLayer *kv, const float *k,
                 const float *v, const CuBatch *b)
{
    int64_t kv_dim = (int64_t) kv->n_kv_heads * kv->head_dim;
    dim3    grid((unsigned) b->n,
                 (unsigned) ((kv_dim + ROW_THREADS - 1) / ROW_THREADS));

    if (b->n <= 0 || kv_dim <= 0) return;
    kv_store_kernel<<<grid, ROW_THREADS, 0, st>>>(
        kv->k, kv->v, k, v, b->pos, b->seq, b->tables, b->table_stride,
        kv->n_kv_heads, kv->block_size, kv->head_dim);
}

/* grid (n_out, ceil(dim / ROW_THREADS)). */
static __global__ void gather_kernel(float *out, const float *x,
                                     const int32_t *idx, int64_t dim)
{
    int64_t r = blockIdx.x;
    int64_t e = (int64_t) blockIdx.y * blockDim.x + threadIdx.x;

    if (e < dim) out[r * dim + e] = x[(int64_t) idx[r] * dim + e];
}

void cu_gather(cudaStream_t st, float *out, const float *x,
               const CuBatch *b, int64_t dim)
{
    dim3 grid((unsigned) b->n_out,
              (unsigned) ((dim + ROW_THREADS - 1) / ROW_THREADS));

    if (b->n_out <= 0 || dim <= 0) return;
    gather_kernel<<<grid, ROW_THREADS, 0, st>>>(out, x, b->out_idx, dim);
}


/* ---- argmax -------------------------------------------------------------- */

/* A candidate is (value, index), index -1 for none; NaN is never a
 * candidate. (v, i) beats (bv, bi) when higher, or equal and lower: the
 * sampler's total order, so the result is the same whatever order
 * candidates meet in. */
static __device__ __forceinline__ bool am_better(float v, int i, float bv,
                                                 int bi)
{
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

/* grid (n): one block of ARGMAX_THREADS per row. Each thread scans its
 * strided columns (indices rising, so > keeps the lowest of equals), then
 * warps and the block's warps combine with am_better. A row without a
 * non-NaN value gives 0. */
static __global__ void argmax_kernel(int32_t *ids, const float *logits,
                                     int64_t n_vocab)
{
    __shared__ float vs[ARGMAX_THREADS / WARP_SIZE];
    __shared__ int   is[ARGMAX_THREADS / WARP_SIZE];
    const float     *row = logits + (int64_t) blockIdx.x * n_vocab;
    float            bv = 0.0f;
    int              bi = -1;

    for (int64_t i = threadIdx.x; i < n_vocab; i += ARGMAX_THREADS) {
        float v = row[i];

        if (!isnan(v) && (bi < 0 || v > bv)) {
            bv = v;
            bi = (int) i;
        }
    }
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(FULL_MASK, bv, o);
        int   i = __shfl_xor_sync(FULL_MASK, bi, o);

        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    if (threadIdx.x % WARP_SIZE == 0) {
        vs[threadIdx.x / WARP_SIZE] = bv;
        is[threadIdx.x / WARP_SIZE] = bi;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < ARGMAX_THREADS / WARP_SIZE; w++) {
        if (am_better(vs[w], is[w], bv, bi)) {
            bv = vs[w];
            bi = is[w];
        }
    }
    ids[blockIdx.x] = bi < 0 ? 0 : bi;
}

void cu_argmax(cudaStream_t st, int32_t *ids, const float *logits,
               int64_t n, int64_t n_vocab)
{
    if (n <= 0 || n_vocab <= 0) return;
    argmax_kernel<<<(unsigned) n, ARGMAX_THREADS, 0, st>>>(ids, logits,
                                                           n_vocab);
}

/* matmul.cu -- out (n, rows) = x (n, cols) . w^T on the device: our own
 * kernels for F32, Q8_0 and Q4_0 weights, cuBLASLt for F16 and BF16.
 *
 * Batch invariance (kernels.h) is the rule everything here bends to: an
 * output element out[t][r] must come out bit for bit the same whatever n
 * is and whichever tokens share x. Both paths get there by making the
 * sequence of floating-point operations behind one element a function of
 * the weight's shape alone.
 *
 * Our kernels (F32, Q8_0, Q4_0). A warp owns MV_ROWS weight rows and a
 * tile of T tokens, T in {1, 2, 4, 8} picked from n (the smallest that
 * holds n, 8 beyond that; a partial tile repeats its last token and drops
 * the copies). The row is walked in steps of 128 elements; in a step, lane
 * l takes the 4 elements 4l .. 4l+3, so lane l always sees the same
 * elements, in increasing step order, whatever T, MV_ROWS or the grid are.
 * Per group of 4 it forms s = w0*x0, then fma(w1, x1, s), fma(w2, x2, s),
 * fma(w3, x3, s) (a quantized w is the integer q, or q - 8 for Q4_0, made
 * exact in f32), and folds s into its accumulator: acc = fma(d, s, acc)
 * with d the block's f16 scale, acc = acc + s for F32. The 32 lane sums
 * are then added by a fixed xor-shuffle tree (16, 8, 4, 2, 1). Every
 * operation is an explicit __fmul_rn/__fmaf_rn/__fadd_rn, so the compiler
 * cannot contract or reorder differently in the T instantiations: the
 * tokens of a tile share weight loads, never arithmetic.
 *
 * Quantized rows are 2-byte aligned only (a Q8_0 block is 34 bytes), so a
 * warp stages 32 blocks of each of its rows at a time into shared memory,
 * with 16-byte loads when the matrix allows (data and row stride multiples
 * of 16: true whenever cols is a multiple of 256) and halfword loads
 * otherwise, the next 32 blocks in flight in registers while it computes
 * on these. How the bytes arrive does not change what is computed.
 *
 * cuBLASLt (F16, BF16). x is rounded to the weight's type (round to
 * nearest even) in a scratch buffer, then one GEMM with f32 accumulation
 * (CUBLAS_COMPUTE_32F) and f32 output. Its reduction order depends on the
 * algorithm, so the algorithm is chosen once per weight shape, at upload,
 * with split-K forced to 1 and no reduction scheme, and checked to be valid
 * for both n = 1 and n = max_tokens; every call then runs it for any n.
 * In column-major terms out^T (rows, n) = W (rows, cols) . x^T (cols, n):
 * W's row-major storage is column-major (cols, rows) with ld = its row
 * stride, read transposed (TRANSA = T); x's row-major (n, cols) is
 * column-major (cols, n) with ld = cols, read as is (TRANSB = N); out's
 * row-major (n, rows) is column-major (rows, n) with ld = rows. That is
 * the "TN" GEMM, the layout cuBLAS covers best, with the weight rows as M.
 *
 * Launches only: no allocation, synchronisation or host read of device
 * memory in cu_matmul, so a decode step can be captured into a graph. */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_ops.h"

#define MV_WARPS        4           // warps per block of our kernels
#define MV_ROWS         2           // weight rows per warp: they share the
                                    //   activation loads
#define MV_TILE         8           // most tokens per weight read
#define MV_ROWS_PER_CTA (MV_WARPS * MV_ROWS)
#define MV_MAX_GRID_Y   65535       // row groups go on grid y

#define MM_WORKSPACE    ((size_t) 32 << 20)     // cuBLASLt workspace bytes
#define MM_MAX_ALGOS    64          // weight shapes (a model has ~10)
#define MM_HEURISTICS   16          // heuristic results tried per shape
#define MM_OUT_ALIGN    4           // alignment out must have (cu_matmul):
                                    //   any f32 row, so one algorithm
                                    //   serves every output offset

/* The algorithm chosen for one F16/BF16 weight shape. align is the weight
 * pointer's alignment, which the heuristic was told: a matrix at a
 * different offset may need another algorithm. */
typedef struct {
    DType                type;
    int64_t              rows, cols;
    size_t               row_bytes;
    unsigned             align;
    cublasLtMatmulAlgo_t algo;
} MmAlgo;

struct CuMatmul {
    cublasLtHandle_t     lt;
    cublasLtMatmulDesc_t op;            // TRANSA = T, f32 compute and scale
    void                *ws;            // (MM_WORKSPACE,) bytes, owned
    uint16_t            *xh;            // (max_tokens, max_cols) x as f16
                                        //   or bf16, owned
    int64_t              max_tokens;
    int64_t              max_cols;
    int                  n_algos;
    MmAlgo               algos[MM_MAX_ALGOS];
};

/* The three matrix layouts of one GEMM, in caller storage so that a call
 * builds them without allocating. */
typedef struct {
    cublasLtMatrixLayoutOpaque_t w;     // (cols, rows), ld = row stride
    cublasLtMatrixLayoutOpaque_t x;     // (cols, n), ld = cols
    cublasLtMatrixLayoutOpaque_t out;   // (rows, n), ld = rows, f32
} MmLayouts;


/* ---- Our kernels: shared pieces ------------------------------------------ */

/* 4 floats at p; vec says p is 16-byte aligned. Elements at or past left
 * read as 0 (only an F32 row whose length is not a multiple of 4 has a
 * short group, and it never takes the vector path). */
static __device__ __forceinline__ float4 mv_load4(const float *p, int vec,
                                                  int64_t left)
{
    float4 v;

    if (vec) return __ldg((const float4 *) p);
    v.x = __ldg(p);
    v.y = left > 1 ? __ldg(p + 1) : 0.0f;
    v.z = left > 2 ? __ldg(p + 2) : 0.0f;
    v.w = left > 3 ? __ldg(p + 3) : 0.0f;
    return v;
}

/* The one dot product of a group of 4, in a fixed order. */
static __device__ __forceinline__ float mv_dot4(float4 w, float4 x) {
    float s = __fmul_rn(w.x, x.x);

    s = __fmaf_rn(w.y, x.y, s);
    s = __fmaf_rn(w.z, x.z, s);
    return __fmaf_rn(w.w, x.w, s);
}

/* Sum over the warp by a fixed tree. Lanes i and i^m add the same two
 * values (in swapped order, which IEEE addition does not see), so every
 * lane ends with the same bits. */
static __device__ __forceinline__ float mv_warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) {
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));
    }
    return v;
}

/* Reduces the warp's accumulators and stores those of real rows and
 * tokens; lane i * T + t stores (row r0 + i, token t0 + t). */
template <int T>
static __device__ __forceinline__ void mv_store(float *out,
                                                float (&acc)[MV_ROWS][T],
                                                int64_t r0, int64_t t0,
                                                int64_t rows, int64_t n,
                                                int lane)
{
#pragma unroll
    for (int i = 0; i < MV_ROWS; i++) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            float v = mv_warp_sum(acc[i][t]);

            if (lane == i * T + t && r0 + i < rows && t0 + t < n) {
                out[(t0 + t) * rows + r0 + i] = v;
            }
        }
    }
}

/* The activation rows of the tile starting at t0; past n, the last token
 * again (computed, never stored), so the loops need no guards. */
template <int T>
static __device__ __forceinline__ void mv_x_rows(const float *(&xr)[T],
                                                 const float *x, int64_t t0,
                                                 int64_t n, int64_t cols)
{
#pragma unroll
    for (int t = 0; t < T; t++) xr[t] = x + min(t0 + t, n - 1) * cols;
}


/* ---- Our kernels: F32 ---------------------------------------------------- */

/* Grid (token tiles, row groups), MV_WARPS warps per block; warp w of row
 * group g owns rows (g * MV_WARPS + w) * MV_ROWS + 0 .. MV_ROWS-1 (rows
 * past the end repeat the last one, unstored). vec: w, x and both row
 * strides 16-byte aligned. */
template <int T>
static __global__ void __launch_bounds__(MV_WARPS * 32)
mv_f32(float *out, const float *x, const char *w, int64_t n, int64_t rows,
       int64_t cols, size_t row_bytes, int vec)
{
    int          lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t      r0 = ((int64_t) blockIdx.y * MV_WARPS + warp) * MV_ROWS;
    int64_t      t0 = (int64_t) blockIdx.x * T;
    const float *wr[MV_ROWS], *xr[T];
    float        acc[MV_ROWS][T];

    if (r0 >= rows) return;                 // the whole warp: no shuffles
#pragma unroll
    for (int i = 0; i < MV_ROWS; i++) {
        wr[i] = (const float *) (w + (size_t) min(r0 + i, rows - 1)
                                     * row_bytes);
#pragma unroll
        for (int t = 0; t < T; t++) acc[i][t] = 0.0f;
    }
    mv_x_rows<T>(xr, x, t0, n, cols);

#pragma unroll 2
    for (int64_t e = 4 * lane; e < cols; e += 128) {
        float4 wv[MV_ROWS];

#pragma unroll
        for (int i = 0; i < MV_ROWS; i++) {
            wv[i] = mv_load4(wr[i] + e, vec, cols - e);
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            float4 xv = mv_load4(xr[t] + e, vec, cols - e);

#pragma unroll
            for (int i = 0; i < MV_ROWS; i++) {
                acc[i][t] = __fadd_rn(acc[i][t], mv_dot4(wv[i], xv));
            }
        }
    }
    mv_store<T>(out, acc, r0, t0, rows, n, lane);
}


/* ---- Our kernels: Q8_0 and Q4_0 ------------------------------------------ */

/* What differs between the quantized types: block bytes, the uint4 loads
 * per lane that stage 32 blocks, and the 4 weights (as exact floats) and
 * scale of elements sub .. sub+3 of a block b in shared memory. */
struct MvQ8_0 {
    static constexpr int BLOCK = 34;
    static constexpr int NVEC = (32 * BLOCK / 16 + 31) / 32;

    static __device__ __forceinline__ float4 weights(const uint8_t *b,
                                                     int sub, float *d)
    {
        /* qs starts at byte 2: halfword loads, the block is 2-aligned */
        unsigned lo = *(const uint16_t *) (b + 2 + sub);
        unsigned hi = *(const uint16_t *) (b + 4 + sub);

        *d = __half2float(__ushort_as_half(*(const uint16_t *) b));
        return make_float4((float) (int8_t) (lo & 0xff),
                           (float) (int8_t) (lo >> 8),
                           (float) (int8_t) (hi & 0xff),
                           (float) (int8_t) (hi >> 8));
    }
};

struct MvQ4_0 {
    static constexpr int BLOCK = 18;
    static constexpr int NVEC = (32 * BLOCK / 16 + 31) / 32;

    /* element j < 16 is the low nibble of byte j, j >= 16 the high nibble
     * of byte j - 16 */
    static __device__ __forceinline__ float4 weights(const uint8_t *b,
                                                     int sub, float *d)
    {
        int      sh = sub >= 16 ? 4 : 0;
        unsigned lo = *(const uint16_t *) (b + 2 + (sub & 15));
        unsigned hi = *(const uint16_t *) (b + 4 + (sub & 15));

        *d = __half2float(__ushort_as_half(*(const uint16_t *) b));
        return make_float4((float) ((int) ((lo >> sh) & 15) - 8),
                           (float) ((int) ((lo >> (8 + sh)) & 15) - 8),
                           (float) ((int) ((hi >> sh) & 15) - 8),
                           (float) ((int) ((hi >> (8 + sh)) & 15) - 8));
    }
};

/* Starts the 16-byte loads of a chunk: lane l holds uint4s l, l + 32, ...
 * of the first nvec. */
template <int NVEC>
static __device__ __forceinline__ void mv_stage_load(uint4 (&reg)[NVEC],
                                                     const uint8_t *src,
                                                     int nvec, int lane)
{
#pragma unroll
    for (int k = 0; k < NVEC; k++) {
        if (lane + 32 * k < nvec) {
            reg[k] = __ldg((const uint4 *) src + lane + 32 * k);
        }
    }
}

/* Puts a chunk of bytes bytes into shared memory: the nvec uint4s loaded
 * by mv_stage_load, then the rest (a partial last chunk, or a whole chunk
 * of an unaligned matrix) by halfwords straight from src. */
template <int NVEC>
static __device__ __forceinline__ void mv_stage_store(uint8_t *sm,
                                                      const uint4 (&reg)[NVEC],
                                                      const uint8_t *src,
                                                      int nvec, int bytes,
                                                      int lane)
{
#pragma unroll
    for (int k = 0; k < NVEC; k++) {
        if (lane + 32 * k < nvec) ((uint4 *) sm)[lane + 32 * k] = reg[k];
    }
    for (int o = 16 * nvec + 2 * lane; o < bytes; o += 64) {
        *(uint16_t *) (sm + o) = __ldg((const unsigned short *) (src + o));
    }
}

/* Bytes and 16-byte loads of chunk c (32 blocks, fewer at the end) of a
 * row of nb blocks. */
template <class Q>
static __device__ __forceinline__ int mv_chunk(int64_t nb, int64_t c,
                                               int wvec, int *nvec)
{
    int bytes = (int) min((int64_t) 32, nb - 32 * c) * Q::BLOCK;

    *nvec = wvec ? bytes / 16 : 0;
    return bytes;
}

/* One chunk of the warp's rows against the tile, from shared memory:
 * step s covers blocks 4s .. 4s+3 of the chunk, lane l elements
 * 4 (l % 8) .. +3 of block 4s + l / 8 (so the x loads of a step are 512
 * contiguous bytes). */
template <int T, class Q>
static __device__ __forceinline__ void mv_q_chunk(
    float (&acc)[MV_ROWS][T], const uint8_t (*sm)[32 * Q::BLOCK],
    const float *(&xr)[T], int64_t c, int kb, int xvec, int lane)
{
    int sub = 4 * (lane & 7);

#pragma unroll
    for (int s = 0; s < 8; s++) {
        int     bb = 4 * s + (lane >> 3);
        int64_t e = (32 * c + bb) * 32 + sub;
        float4  wv[MV_ROWS];
        float   d[MV_ROWS];

        if (bb >= kb) break;
#pragma unroll
        for (int i = 0; i < MV_ROWS; i++) {
            wv[i] = Q::weights(sm[i] + bb * Q::BLOCK, sub, &d[i]);
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            float4 xv = mv_load4(xr[t] + e, xvec, 4);

#pragma unroll
            for (int i = 0; i < MV_ROWS; i++) {
                acc[i][t] = __fmaf_rn(d[i], mv_dot4(wv[i], xv), acc[i][t]);
            }
        }
    }
}

/* Grid and rows as mv_f32; cols a multiple of 32. wvec: w and the row
 * stride 16-byte aligned; xvec: x 16-byte aligned. Each warp stages 32
 * blocks of each of its rows at a time in its own shared memory (only
 * __syncwarp between the writes and the reads), the next chunk's loads in
 * flight while it computes. */
template <int T, class Q>
static __global__ void __launch_bounds__(MV_WARPS * 32)
mv_q(float *out, const float *x, const uint8_t *w, int64_t n, int64_t rows,
     int64_t cols, size_t row_bytes, int wvec, int xvec)
{
    __shared__ __align__(16) uint8_t sm[MV_WARPS][MV_ROWS][32 * Q::BLOCK];
    int            lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t        r0 = ((int64_t) blockIdx.y * MV_WARPS + warp) * MV_ROWS;
    int64_t        t0 = (int64_t) blockIdx.x * T;
    int64_t        nb = cols / 32, nchunks = (nb + 31) / 32;
    const uint8_t *wr[MV_ROWS];
    const float   *xr[T];
    float          acc[MV_ROWS][T];
    uint4          reg[MV_ROWS][Q::NVEC];
    int            nvec, bytes;

    if (r0 >= rows) return;                 // the whole warp
#pragma unroll
    for (int i = 0; i < MV_ROWS; i++) {
        wr[i] = w + (size_t) min(r0 + i, rows - 1) * row_bytes;
#pragma unroll
        for (int t = 0; t < T; t++) acc[i][t] = 0.0f;
    }
    mv_x_rows<T>(xr, x, t0, n, cols);

    bytes = mv_chunk<Q>(nb, 0, wvec, &nvec);
#pragma unroll
    for (int i = 0; i < MV_ROWS; i++) mv_stage_load(reg[i], wr[i], nvec, lane);

    for (int64_t c = 0; c < nchunks; c++) {
        size_t off = (size_t) c * 32 * Q::BLOCK;
        int    kb = bytes / Q::BLOCK;

        __syncwarp();                       // chunk c-1 is read
#pragma unroll
        for (int i = 0; i < MV_ROWS; i++) {
            mv_stage_store(sm[warp][i], reg[i], wr[i] + off, nvec, bytes,
                           lane);
        }
        __syncwarp();                       // chunk c is written
        if (c + 1 < nchunks) {
            bytes = mv_chunk<Q>(nb, c + 1, wvec, &nvec);
#pragma unroll
            for (int i = 0; i < MV_ROWS; i++) {
                mv_stage_load(reg[i], wr[i] + off + 32 * Q::BLOCK, nvec,
                              lane);
            }
        }
        mv_q_chunk<T, Q>(acc, sm[warp], xr, c, kb, xvec, lane);
    }
    mv_store<T>(out, acc, r0, t0, rows, n, lane);
}


/* ---- Our kernels: launch ------------------------------------------------- */

static int aligned16(const void *p) {
    return ((uintptr_t) p & 15) == 0;
}

/* Tokens per weight read: the smallest of 1, 2, 4, 8 that holds n, and 8
 * beyond. Changes only which tokens share loads, never the arithmetic. */
static int mv_tile(int64_t n) {
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : MV_TILE;
}

template <int T>
static void mv_launch_t(cudaStream_t st, float *out, const float *x,
                        int64_t n, const Matrix *w)
{
    dim3   grid((unsigned) ((n + T - 1) / T),
                (unsigned) ((w->rows + MV_ROWS_PER_CTA - 1)
                            / MV_ROWS_PER_CTA));
    int    wvec = aligned16(w->data) && w->row_bytes % 16 == 0;
    int    xvec = aligned16(x);
    const uint8_t *wd = (const uint8_t *) w->data;

    switch (w->type) {
    case DT_F32:
        mv_f32<T><<<grid, MV_WARPS * 32, 0, st>>>(
            out, x, (const char *) wd, n, w->rows, w->cols, w->row_bytes,
            wvec && xvec && w->cols % 4 == 0);
        break;
    case DT_Q8_0:
        mv_q<T, MvQ8_0><<<grid, MV_WARPS * 32, 0, st>>>(
            out, x, wd, n, w->rows, w->cols, w->row_bytes, wvec, xvec);
        break;
    case DT_Q4_0:
        mv_q<T, MvQ4_0><<<grid, MV_WARPS * 32, 0, st>>>(
            out, x, wd, n, w->rows, w->cols, w->row_bytes, wvec, xvec);
        break;
    default:
        break;
    }
}

static void mv_launch(cudaStream_t st, float *out, const float *x,
                      int64_t n, const Matrix *w)
{
    switch (mv_tile(n)) {
    case 1:  mv_launch_t<1>(st, out, x, n, w); break;
    case 2:  mv_launch_t<2>(st, out, x, n, w); break;
    case 4:  mv_launch_t<4>(st, out, x, n, w); break;
    default: mv_launch_t<MV_TILE>(st, out, x, n, w); break;
    }
}


/* ---- cuBLASLt: F16 and BF16 ---------------------------------------------- */

/* x (count,) f32 to f16 or bf16, round to nearest even. */
static __global__ void mm_round_x(uint16_t *dst, const float *x,
                                  int64_t count, int bf16)
{
    int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t) gridDim.x * blockDim.x;

    for (; i < count; i += stride) {
        dst[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i]))
                      : __half_as_ushort(__float2half_rn(x[i]));
    }
}

static void mm_round_launch(cudaStream_t st, uint16_t *dst, const float *x,
                            int64_t count, int bf16)
{
    int64_t blocks = (count + 255) / 256;

    if (blocks > 4096) blocks = 4096;       // grid-stride beyond
    mm_round_x<<<(unsigned) blocks, 256, 0, st>>>(dst, x, count, bf16);
}

static cublasStatus_t mm_layouts(MmLayouts *l, const Matrix *w, int64_t n) {
    cudaDataType   t = w->type == DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t s;

    s = cublasLtMatrixLayoutInit(&l->w, t, (uint64_t) w->cols,
                                 (uint64_t) w->rows,
                                 (int64_t) (w->row_bytes / 2));
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutInit(&l->x, t, (uint64_t) w->cols,
                                     (uint64_t) n, w->cols);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutInit(&l->out, CUDA_R_32F, (uint64_t) w->rows,
                                     (uint64_t) n, w->rows);
    }
    return s;
}

/* The largest power of two up to 256 dividing p: what the heuristic may
 * assume of the weight pointer. */
static unsigned mm_align(const void *p) {
    unsigned a = 256;

    while (a > 1 && (uintptr_t) p % a != 0) a >>= 1;
    return a;
}

static MmAlgo *mm_find(CuMatmul *mm, const Matrix *w) {
    unsigned align = mm_align(w->data);

    for (int i = 0; i < mm->n_algos; i++) {
        MmAlgo *a = &mm->algos[i];

        if (a->type == w->type && a->rows == w->rows && a->cols == w->cols
            && a->row_bytes == w->row_bytes && a->align == align)
        {
            return a;
        }
    }
    return NULL;
}

/* Runs the GEMM of w on the scratch copy of x; D and C are out. */
static cublasStatus_t mm_gemm(CuMatmul *mm, cudaStream_t st, float *out,
                              int64_t n, const Matrix *w,
                              const cublasLtMatmulAlgo_t *algo)
{
    const float    one = 1.0f, zero = 0.0f;
    MmLayouts      l;
    cublasStatus_t s = mm_layouts(&l, w, n);

    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return cublasLtMatmul(mm->lt, mm->op, &one, w->data, &l.w, mm->xh, &l.x,
                          &zero, out, &l.out, out, &l.out, algo, mm->ws,
                          MM_WORKSPACE, st);
}

/* Forces algo to one K split without reduction and checks it for the
 * GEMM of w at n. */
static cublasStatus_t mm_check(CuMatmul *mm, const Matrix *w, int64_t n,
                               cublasLtMatmulAlgo_t *algo)
{
    int32_t                         splits = 1;
    uint32_t                        scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t r;
    MmLayouts                       l;
    cublasStatus_t                  s;

    s = cublasLtMatmulAlgoConfigSetAttribute(
        algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoConfigSetAttribute(
            algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
            sizeof(scheme));
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = mm_layouts(&l, w, n);
    if (s == CUBLAS_STATUS_SUCCESS) {
        memset(&r, 0, sizeof(r));
        s = cublasLtMatmulAlgoCheck(mm->lt, mm->op, &l.w, &l.x, &l.out,
                                    &l.out, algo, &r);
    }
    if (s == CUBLAS_STATUS_SUCCESS && r.workspaceSize > MM_WORKSPACE) {
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return s;
}

/* Sets one preference attribute unless an earlier step failed (*s). */
static void mm_pref(cublasLtMatmulPreference_t p,
                    cublasLtMatmulPreferenceAttributes_t attr, const void *v,
                    size_t size, cublasStatus_t *s)
{
    if (*s == CUBLAS_STATUS_SUCCESS) {
        *s = cublasLtMatmulPreferenceSetAttribute(p, attr, v, size);
    }
}

/* The heuristic's candidates for w at n = max_tokens, best first. Told
 * the pointer alignments (scratch 256, out MM_OUT_ALIGN, the weight's
 * own) and the workspace; with only_none, also to offer no split-K
 * reduction. Returns the status, *got the count. */
static cublasStatus_t mm_candidates(CuMatmul *mm, const Matrix *w,
                                    int only_none,
                                    cublasLtMatmulHeuristicResult_t *res,
                                    int *got)
{
    cublasLtMatmulPreference_t p = NULL;
    uint64_t                   ws = MM_WORKSPACE;
    uint32_t                   al_w = mm_align(w->data), al_x = 256;
    uint32_t                   al_out = MM_OUT_ALIGN;
    uint32_t                   mask = CUBLASLT_REDUCTION_SCHEME_NONE;
    MmLayouts                  l;
    cublasStatus_t             s;

    *got = 0;
    s = mm_layouts(&l, w, mm->max_tokens);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&p);
    mm_pref(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws), &s);
    mm_pref(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w,
            sizeof(al_w), &s);
    mm_pref(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_x,
            sizeof(al_x), &s);
    mm_pref(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_out,
            sizeof(al_out), &s);
    mm_pref(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_out,
            sizeof(al_out), &s);
    if (only_none) {
        mm_pref(p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                sizeof(mask), &s);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoGetHeuristic(mm->lt, mm->op, &l.w, &l.x,
                                           &l.out, &l.out, p, MM_HEURISTICS,
                                           res, got);
    }
    if (p != NULL) cublasLtMatmulPreferenceDestroy(p);
    return s;
}

/* A trial of algo at load time (legacy stream, synchronised): x gets a
 * fixed pattern, the GEMM runs at n = max_tokens and then at n = 1, and
 * token 0's outputs must be the same bits both times. An algorithm whose
 * schedule follows the problem size (a K split or stream-K sized by n)
 * fails this and is passed over, so batch invariance is checked on the
 * device rather than assumed. It also loads the kernel before any graph
 * capture, and an algorithm that checks but cannot launch fails here, not
 * in a decode step. *same says whether the bits matched. */
static cublasStatus_t mm_trial(CuMatmul *mm, const Matrix *w,
                               const cublasLtMatmulAlgo_t *algo,
                               cudaError_t *ce, bool *same)
{
    size_t         nx = (size_t) mm->max_tokens * (size_t) w->cols;
    size_t         rb = (size_t) w->rows * sizeof(float);
    uint16_t      *hx = (uint16_t *) malloc(nx * sizeof(uint16_t));
    float         *all = (float *) malloc(rb), *one = (float *) malloc(rb);
    float         *out = NULL;
    cublasStatus_t s = CUBLAS_STATUS_ALLOC_FAILED;

    *same = false;
    *ce = cudaSuccess;
    if (hx == NULL || all == NULL || one == NULL) goto done;
    for (size_t i = 0; i < nx; i++) {
        float v = (float) ((uint32_t) (i * 2654435761u) >> 21) / 1024.0f
                  - 1.0f;

        hx[i] = w->type == DT_F16 ? f32_to_f16(v)
                                  : (uint16_t) (f32_bits(v) >> 16);
    }
    *ce = cudaMemcpy(mm->xh, hx, nx * sizeof(uint16_t),
                     cudaMemcpyHostToDevice);
    if (*ce == cudaSuccess) {
        *ce = cudaMalloc((void **) &out, rb * (size_t) mm->max_tokens);
    }
    if (*ce != cudaSuccess) goto done;
    s = mm_gemm(mm, 0, out, mm->max_tokens, w, algo);
    if (s == CUBLAS_STATUS_SUCCESS
        && (*ce = cudaStreamSynchronize(0)) == cudaSuccess
        && (*ce = cudaMemcpy(all, out, rb, cudaMemcpyDeviceToHost))
           == cudaSuccess)
    {
        s = mm_gemm(mm, 0, out, 1, w, algo);
    }
    if (s == CUBLAS_STATUS_SUCCESS && *ce == cudaSuccess
        && (*ce = cudaStreamSynchronize(0)) == cudaSuccess
        && (*ce = cudaMemcpy(one, out, rb, cudaMemcpyDeviceToHost))
           == cudaSuccess)
    {
        *same = memcmp(one, all, rb) == 0;
    }

done:
    if (out != NULL) cudaFree(out);
    free(hx);
    free(all);
    free(one);
    return s;
}

/* The first candidate that runs with one K split at both n = 1 and
 * n = max_tokens and gives token 0 the same bits at both (mm_trial): first
 * among those the heuristic offers without split-K reduction, then among
 * all (split-K forced off). *ce reports a CUDA failure of the trials;
 * CUBLAS_STATUS_NOT_SUPPORTED means no candidate was batch-invariant. */
static cublasStatus_t mm_pick(CuMatmul *mm, const Matrix *w,
                              cublasLtMatmulAlgo_t *algo, cudaError_t *ce)
{
    cublasLtMatmulHeuristicResult_t res[MM_HEURISTICS];
    cublasStatus_t                  s = CUBLAS_STATUS_NOT_SUPPORTED;
    bool                            same;

    *ce = cudaSuccess;
    for (int only_none = 1; only_none >= 0; only_none--) {
        int            got = 0;
        cublasStatus_t hs = mm_candidates(mm, w, only_none, res, &got);

        if (hs != CUBLAS_STATUS_SUCCESS) s = hs;
        for (int i = 0; i < got; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            *algo = res[i].algo;
            s = mm_check(mm, w, mm->max_tokens, algo);
            if (s == CUBLAS_STATUS_SUCCESS) s = mm_check(mm, w, 1, algo);
            if (s != CUBLAS_STATUS_SUCCESS) continue;
            s = mm_trial(mm, w, algo, ce, &same);
            if (*ce != cudaSuccess) return s;
            if (s == CUBLAS_STATUS_SUCCESS && same) return s;
            s = CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    return s;
}


/* ---- The interface ------------------------------------------------------- */

static void mm_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;

    if (err == NULL || errlen == 0) return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A bug in the caller or a failure mid-step: there is no error return. */
static void mm_die(const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "omni cuda: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static size_t mm_scratch_bytes(int64_t max_tokens, int64_t max_cols) {
    size_t b = (size_t) max_tokens * (size_t) max_cols * sizeof(uint16_t);

    return (b + 255) & ~(size_t) 255;
}

size_t cu_matmul_bytes(int64_t max_tokens, int64_t max_cols) {
    return mm_scratch_bytes(max_tokens, max_cols) + MM_WORKSPACE;
}

int cu_matmul_supports(DType t) {
    return t == DT_F32 || t == DT_F16 || t == DT_BF16 || t == DT_Q8_0
           || t == DT_Q4_0;
}

CuMatmul *cu_matmul_new(int64_t max_tokens, int64_t max_cols, char *err,
                        size_t errlen)
{
    CuMatmul      *mm;
    cudaError_t    ce;
    cublasStatus_t s;
    int32_t        ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    size_t         xb = mm_scratch_bytes(max_tokens, max_cols);

    if (max_tokens < 1 || max_cols < 1) {
        mm_err(err, errlen, "matmul: bad sizes (%lld tokens, %lld columns)",
               (long long) max_tokens, (long long) max_cols);
        return NULL;
    }
    mm = (CuMatmul *) calloc(1, sizeof(*mm));
    if (mm == NULL) {
        mm_err(err, errlen, "matmul: out of host memory");
        return NULL;
    }
    mm->max_tokens = max_tokens;
    mm->max_cols = max_cols;

    ce = cudaMalloc((void **) &mm->xh, xb);
    if (ce != cudaSuccess) {
        mm_err(err, errlen, "matmul: cudaMalloc(%zu bytes of activations): "
               "%s", xb, cudaGetErrorString(ce));
        goto fail;
    }
    ce = cudaMalloc(&mm->ws, MM_WORKSPACE);
    if (ce != cudaSuccess) {
        mm_err(err, errlen, "matmul: cudaMalloc(%zu bytes of cuBLASLt "
               "workspace): %s", MM_WORKSPACE, cudaGetErrorString(ce));
        goto fail;
    }
    s = cublasLtCreate(&mm->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        mm->lt = NULL;
        mm_err(err, errlen, "matmul: cublasLtCreate: %s",
               cublasLtGetStatusString(s));
        goto fail;
    }
    s = cublasLtMatmulDescCreate(&mm->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS) {
        mm->op = NULL;
    } else {
        s = cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                           &ta, sizeof(ta));
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(mm->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &tb, sizeof(tb));
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        mm_err(err, errlen, "matmul: cublasLtMatmulDesc: %s",
               cublasLtGetStatusString(s));
        goto fail;
    }
    return mm;

fail:
    cu_matmul_free(mm);
    return NULL;
}

void cu_matmul_free(CuMatmul *mm) {
    if (mm == NULL) return;
    if (mm->op != NULL) cublasLtMatmulDescDestroy(mm->op);
    if (mm->lt != NULL) cublasLtDestroy(mm->lt);
    if (mm->ws != NULL) cudaFree(mm->ws);
    if (mm->xh != NULL) cudaFree(mm->xh);
    free(mm);
}

/* The shape checks every type needs; -1 with err set. */
static int mm_check_shape(CuMatmul *mm, const Matrix *w, char *err,
                          size_t errlen)
{
    int64_t blk = w->type == DT_Q8_0 || w->type == DT_Q4_0 ? QK : 1;
    size_t  esz = w->type == DT_F32 ? 4 : 2;   // alignment a row needs

    if (w->layout != WL_ROWS) {
        mm_err(err, errlen, "CUDA matmul reads %s weights only as stored "
               "(not repacked)", dtype_name(w->type));
        return -1;
    }
    if (w->rows < 1 || w->cols < 1 || w->cols % blk != 0
        || w->row_bytes < dtype_row_bytes(w->type, w->cols)
        || w->row_bytes % esz != 0 || (uintptr_t) w->data % esz != 0)
    {
        mm_err(err, errlen, "matmul: bad %s matrix %lldx%lld (row stride "
               "%zu)", dtype_name(w->type), (long long) w->rows,
               (long long) w->cols, w->row_bytes);
        return -1;
    }
    if ((w->rows + MV_ROWS_PER_CTA - 1) / MV_ROWS_PER_CTA > MV_MAX_GRID_Y) {
        mm_err(err, errlen, "matmul: %lld rows are too many",
               (long long) w->rows);
        return -1;
    }
    if ((w->type == DT_F16 || w->type == DT_BF16) && w->cols > mm->max_cols) {
        mm_err(err, errlen, "matmul: %lld columns, more than the %lld "
               "planned", (long long) w->cols, (long long) mm->max_cols);
        return -1;
    }
    return 0;
}

int cu_matmul_prepare(CuMatmul *mm, const Matrix *w, char *err,
                      size_t errlen)
{
    MmAlgo        *a;
    cudaError_t    ce = cudaSuccess;
    cublasStatus_t s;

    if (!cu_matmul_supports(w->type)) {
        mm_err(err, errlen, "CUDA matmul does not run %s weights",
               dtype_name(w->type));
        return -1;
    }
    if (mm_check_shape(mm, w, err, errlen) != 0) return -1;
    if (w->type != DT_F16 && w->type != DT_BF16) return 0;
    if (mm_find(mm, w) != NULL) return 0;
    if (mm->n_algos == MM_MAX_ALGOS) {
        mm_err(err, errlen, "matmul: more than %d F16/BF16 weight shapes",
               MM_MAX_ALGOS);
        return -1;
    }

    a = &mm->algos[mm->n_algos];
    s = mm_pick(mm, w, &a->algo, &ce);
    if (ce != cudaSuccess) {
        mm_err(err, errlen, "matmul: cuBLASLt trial run for %s %lldx%lld "
               "failed: %s", dtype_name(w->type), (long long) w->rows,
               (long long) w->cols, cudaGetErrorString(ce));
        return -1;
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        mm_err(err, errlen, "matmul: no cuBLASLt algorithm for %s %lldx%lld "
               "without split-K that gives a token the same result at any "
               "batch size (status %s)", dtype_name(w->type),
               (long long) w->rows, (long long) w->cols,
               cublasLtGetStatusName(s));
        return -1;
    }
    a->type = w->type;
    a->rows = w->rows;
    a->cols = w->cols;
    a->row_bytes = w->row_bytes;
    a->align = mm_align(w->data);
    mm->n_algos++;
    return 0;
}

void cu_matmul(CuMatmul *mm, cudaStream_t st, float *out, const float *x,
               int64_t n, const Matrix *w)
{
    const MmAlgo  *a;
    cublasStatus_t s;

    if (n <= 0) return;
    if (w->type == DT_F32 || w->type == DT_Q8_0 || w->type == DT_Q4_0) {
        mv_launch(st, out, x, n, w);
        return;
    }

    a = mm_find(mm, w);
    if (a == NULL || n > mm->max_tokens
        || ((uintptr_t) out & (MM_OUT_ALIGN - 1)) != 0)
    {
        mm_die("cu_matmul: %s %lldx%lld at n = %lld: %s", dtype_name(w->type),
               (long long) w->rows, (long long) w->cols, (long long) n,
               a == NULL ? "not prepared (or not a CUDA matmul type)"
               : n > mm->max_tokens ? "more tokens than planned"
               : "out is not 4-byte aligned");
    }
    mm_round_launch(st, mm->xh, x, n * w->cols, w->type == DT_BF16);
    s = mm_gemm(mm, st, out, n, w, &a->algo);
    if (s != CUBLAS_STATUS_SUCCESS) {
        mm_die("cu_matmul: cublasLtMatmul for %s %lldx%lld at n = %lld: %s",
               dtype_name(w->type), (long long) w->rows,
               (long long) w->cols, (long long) n, cublasLtGetStatusName(s));
    }
}

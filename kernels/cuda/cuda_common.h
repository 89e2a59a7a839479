/* cuda_common.h -- device helpers that ops.cu and attention.cu share: the
 * fixed reduction trees batch invariance rests on, f16/bf16 loads, and the
 * launch shape of flat elementwise kernels.
 *
 * Every reduction here combines values in an order fixed by the block size
 * alone (a per-thread partial, then an xor butterfly 16, 8, 4, 2, 1 within
 * the warp, then warps added in index order), never by how many rows or
 * tokens a launch covers, and never through float atomics. The butterfly
 * leaves the same bits in every lane (a + b == b + a in IEEE arithmetic),
 * so no broadcast is needed afterwards. */

#ifndef OMNI_CUDA_COMMON_H
#define OMNI_CUDA_COMMON_H

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define WARP_SIZE   32
#define FULL_MASK   0xffffffffu

#define EW_THREADS  256             // threads per block of flat kernels
#define EW_MAX_BLOCKS (1 << 20)     // beyond this a flat kernel strides

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    }
    return v;
}

/* The sum of v over the block (blockDim.x a multiple of 32, at most 1024),
 * the same bits in every thread. red holds one float per warp; the
 * trailing barrier lets the caller reuse it and write what it read. */
static __device__ __forceinline__ float block_sum(float v, float *red) {
    int   nw = blockDim.x / WARP_SIZE;
    float s;

    v = warp_sum(v);
    if (threadIdx.x % WARP_SIZE == 0) red[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    s = red[0];
    for (int i = 1; i < nw; i++) s += red[i];
    __syncthreads();
    return s;
}

static __device__ __forceinline__ float f16_load(const uint16_t *p) {
    return __half2float(__ushort_as_half(*p));
}

static __device__ __forceinline__ uint16_t f16_round(float f) {
    return __half_as_ushort(__float2half_rn(f));
}

static __device__ __forceinline__ float bf16_load(const uint16_t *p) {
    return __bfloat162float(__ushort_as_bfloat16(*p));
}

/* Blocks of EW_THREADS for a flat kernel over count elements (count > 0),
 * capped: the kernels stride over what one pass does not cover. */
static inline unsigned ew_blocks(int64_t count) {
    int64_t b = (count + EW_THREADS - 1) / EW_THREADS;

    return (unsigned) (b < EW_MAX_BLOCKS ? b : EW_MAX_BLOCKS);
}

/* Element i of a flat kernel's grid-stride loop, and its stride. */
#define EW_FIRST ((int64_t) blockIdx.x * blockDim.x + threadIdx.x)
#define EW_STRIDE ((int64_t) gridDim.x * blockDim.x)

#endif

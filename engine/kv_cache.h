/* kv_cache.h -- the paged KV cache: a pool of fixed-size blocks shared by
 * every sequence.
 *
 * Each block holds block_size tokens' keys and values for every layer, in
 * f16. A sequence owns a block table (logical block -> physical block); the
 * attention kernel reads through it, so a sequence grows one block at a time
 * and never needs contiguous memory. Blocks come from a free stack: alloc
 * and free are O(1).
 *
 * Memory: n_blocks * n_layers * 2 * block_size * kv_dim * 2 bytes, allocated
 * once at init. */

#ifndef OMNI_KV_CACHE_H
#define OMNI_KV_CACHE_H

#include <stdint.h>

#include "kernels.h"
#include "log.h"

typedef struct {
    int       n_layers;
    int       block_size;       // tokens per block
    int64_t   n_blocks;
    KVLayer  *layers;           // (n_layers,) views into mem, owned array
    uint16_t *mem;              // all K and V storage, owned
    int32_t  *free_stack;       // (n_blocks,) free block ids, owned
    int64_t   n_free;
} KVCache;

/* Allocates n_blocks blocks of block_size tokens for the given shape.
 * Returns -1 with err set when memory runs out. */
int     kv_init(KVCache *kv, int n_layers, int n_kv_heads, int head_dim,
                int block_size, int64_t n_blocks, Err *err);
void    kv_free(KVCache *kv);
/* Takes a free block; -1 when none is left. */
int32_t kv_alloc_block(KVCache *kv);
/* Returns a block to the pool. */
void    kv_release_block(KVCache *kv, int32_t block);

#endif

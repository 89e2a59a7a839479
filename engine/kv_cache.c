/* kv_cache.c -- see kv_cache.h. The free list is a stack so recently freed
 * (cache-warm) blocks are reused first. */

#include <stdlib.h>

#include "kv_cache.h"

int kv_init(KVCache *kv, int n_layers, int n_kv_heads, int head_dim,
            int block_size, int64_t n_blocks, Err *err)
{
    size_t per_layer = (size_t) n_blocks * (size_t) n_kv_heads
                       * (size_t) block_size * (size_t) head_dim;

    kv->n_layers = n_layers;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->layers = calloc((size_t) n_layers, sizeof(KVLayer));
    kv->mem = malloc(per_layer * 2 * (size_t) n_layers * sizeof(uint16_t));
    kv->free_stack = malloc((size_t) n_blocks * sizeof(int32_t));
    if (kv->layers == NULL || kv->mem == NULL || kv->free_stack == NULL) {
        kv_free(kv);
        return err_set(err, "out of memory allocating a KV cache of %.1f MiB",
                       per_layer * 4.0 * n_layers / (1 << 20));
    }
    for (int l = 0; l < n_layers; l++) {
        KVLayer *L = &kv->layers[l];

        L->n_kv_heads = n_kv_heads;
        L->head_dim = head_dim;
        L->block_size = block_size;
        L->n_blocks = n_blocks;
        L->k = kv->mem + (size_t) l * 2 * per_layer;
        L->v = L->k + per_layer;
    }
    /* block 0 on top of the stack */
    for (int64_t i = 0; i < n_blocks; i++) {
        kv->free_stack[i] = (int32_t) (n_blocks - 1 - i);
    }
    kv->n_free = n_blocks;
    return 0;
}

void kv_free(KVCache *kv) {
    free(kv->layers);
    free(kv->mem);
    free(kv->free_stack);
    kv->layers = NULL;
    kv->mem = NULL;
    kv->free_stack = NULL;
    kv->n_free = 0;
}

int32_t kv_alloc_block(KVCache *kv) {
    return kv->n_free > 0 ? kv->free_stack[--kv->n_free] : -1;
}

void kv_release_block(KVCache *kv, int32_t block) {
    kv->free_stack[kv->n_free++] = block;
}

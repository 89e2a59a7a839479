/* kv_cache.h -- the paged KV cache: a pool of fixed-size blocks shared by
 * every sequence, with reference counts and an automatic prefix cache.
 *
 * Each block holds block_size tokens' keys and values for every layer, in
 * f16. A sequence owns a block table (logical block -> physical block); the
 * attention kernel reads through it, so a sequence grows one block at a time
 * and never needs contiguous memory.
 *
 * A block is in one of three states:
 *   free      ref 0, not cached: on the free stack
 *   used      ref > 0: in the block table of ref sequences
 *   cached    ref 0, but published in the prefix cache: on the LRU list,
 *             reused by a lookup or evicted (oldest first) when the free
 *             stack is empty
 * A used block may also be published (it is then findable by lookups and
 * becomes "cached" when its last reference goes).
 *
 * Prefix cache: a full block is identified by a hash chain, hash(parent
 * block's hash, the block's block_size tokens, salt), so a block matches
 * only when every token before it matches too; different salts never
 * share. Lookups compare the stored parent hash and tokens as well as the
 * hash, so a match needs a 64-bit collision between two parent chains to be
 * wrong.
 *
 * Memory: n_blocks * n_layers * 2 * block_size * kv_dim * 2 bytes for K/V
 * plus about n_blocks * (block_size * 4 + 52) bytes of bookkeeping,
 * allocated once at init; nothing allocates afterwards. Not thread-safe:
 * the scheduler's thread alone calls it.
 *
 * Misuse (a block id out of range; kv_ref, kv_release_block or kv_publish
 * on a block that is not used) is logged and ignored, so one sequence's
 * bookkeeping bug cannot corrupt blocks other sequences hold. */

#ifndef OMNI_KV_CACHE_H
#define OMNI_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "log.h"

typedef struct {
    int32_t  ref;               // sequences holding the block
    int32_t  lru_prev;          // LRU list links (cached blocks), -1 ends
    int32_t  lru_next;
    int32_t  hash_next;         // next block in the same hash bucket, -1
    uint64_t hash;              // chain hash, when published
    uint64_t parent;            // parent's chain hash, when published
    bool     published;         // findable by kv_lookup
} KVBlockMeta;

typedef struct {
    int       n_layers;
    int       block_size;       // tokens per block
    int64_t   n_blocks;
    KVLayer  *layers;           // (n_layers,) views into mem, owned array
    uint16_t *mem;              // all K and V storage, owned: host memory,
                                //   or be's (a device backend's)
    Backend  *be;               // whose memory mem is; NULL: malloc's
    int32_t  *free_stack;       // (n_blocks,) free block ids, owned
    int64_t   n_free;
    KVBlockMeta *meta;          // (n_blocks,), owned
    int32_t  *tokens;           // (n_blocks, block_size) tokens of
                                //   published blocks, owned
    int32_t  *buckets;          // (n_buckets,) hash table heads, -1; owned
    int64_t   n_buckets;        // power of two >= n_blocks
    int32_t   lru_head;         // oldest cached block, -1 when none
    int32_t   lru_tail;         // newest
    int64_t   n_cached;         // blocks in the cached state
    int64_t   n_used;           // blocks in the used state
    uint64_t  evictions;        // cached blocks reused for new data
    uint64_t  unpublished;      // published blocks no longer findable
                                //   (evicted, or dropped by
                                //   kv_evict_all): while it stays, every
                                //   hash kv_find found is still there
} KVCache;

/* Allocates n_blocks blocks of block_size tokens for the given shape,
 * the K/V storage where be's ops read it (be->alloc; host memory when be
 * is NULL or has none; the bookkeeping is always host memory). Returns -1
 * with err set when memory runs out. */
int      kv_init(KVCache *kv, int n_layers, int n_kv_heads, int head_dim,
                 int block_size, int64_t n_blocks, Backend *be, Err *err);
void     kv_free(KVCache *kv);

/* Bytes one block takes (K and V, every layer); for sizing from a memory
 * budget. */
uint64_t kv_block_bytes(int n_layers, int n_kv_heads, int head_dim,
                        int block_size);
/* Blocks of block_bytes that fit in a device budget with left bytes still
 * free, after reserved bytes for what else must come out of it (the
 * activations): 0 when none do. */
int64_t  kv_blocks_fit(int64_t left, uint64_t reserved, uint64_t block_bytes);

/* Takes a block for new data, ref 1: the free stack first, else the least
 * recently used cached block (unpublished first, so it leaves the cache).
 * -1 when every block is used. */
int32_t  kv_alloc_block(KVCache *kv);
/* Adds a reference to a used block (sharing it with another sequence). */
void     kv_ref(KVCache *kv, int32_t block);
/* Drops a reference; at 0 the block becomes cached (published) or free. */
void     kv_release_block(KVCache *kv, int32_t block);

/* The chain hash of a full block: parent is the previous block's hash, or
 * kv_root_hash(salt) for the first block of a sequence. */
uint64_t kv_root_hash(const void *salt, size_t salt_len);
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n);

/* Finds a published block with this hash, parent hash and tokens
 * (block_size of them). On a hit takes a reference (a cached block
 * becomes used) and returns it; -1 on a miss. */
int32_t  kv_lookup(KVCache *kv, uint64_t hash, uint64_t parent,
                   const int32_t *tokens);
/* Whether a block with this chain hash is published (used or cached),
 * without touching it: no reference, no LRU move. For a caller that
 * remembers hashes (the prefix index, thinker/prefix_index.h) and asks
 * whether they are still held; a 64-bit collision could make it say yes
 * wrongly, which costs that caller a routing hint, nothing else. Returns
 * the block, or -1. O(1) expected; can't fail. */
int32_t  kv_find(const KVCache *kv, uint64_t hash);
/* Makes a used, full block findable: the sequence holding it has written
 * all block_size tokens' K/V (tokens is copied). When an identical block is
 * already published this one is left unpublished (one copy is enough); a
 * block already published stays as it is. */
void     kv_publish(KVCache *kv, int32_t block, uint64_t hash,
                    uint64_t parent, const int32_t *tokens);

/* Evicts every cached block (they become free). For tests and for a
 * stage that wants to drop its cache. */
void     kv_evict_all(KVCache *kv);

#endif

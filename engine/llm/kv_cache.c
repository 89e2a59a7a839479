/* kv_cache.c -- the paged KV cache's block pool and prefix cache; see
 * kv_cache.h for the three states a block goes through.
 *
 * Three structures index the blocks. All are arrays of block ids sized at
 * kv_init, so nothing allocates afterwards:
 *
 *   free stack   free blocks. A stack, so the most recently freed block
 *                (still warm in the CPU caches) is reused first.
 *   LRU list     cached blocks, doubly linked through meta[].lru_*, oldest
 *                at lru_head. A last release appends; a lookup hit or an
 *                eviction unlinks. All O(1).
 *   hash table   published blocks (used or cached), chained through
 *                meta[].hash_next from buckets[hash & (n_buckets - 1)].
 *                n_buckets is a power of two >= n_blocks, so chains hold
 *                under one block on average and lookup and unpublish are
 *                O(1) expected. Open addressing was rejected: every
 *                eviction is a deletion, which needs tombstones or
 *                backward shifts there, while a chain costs 4 bytes a
 *                block.
 *
 * Invariants (the unit tests check them after every operation):
 *
 *   n_free + n_cached + n_used == n_blocks
 *   on the free stack   <=>  ref == 0 && !published
 *   on the LRU list     <=>  ref == 0 && published
 *   in the hash table   <=>  published
 *
 * A call that would break them (an id out of range, releasing a block that
 * is not used, referencing or publishing one that is not used) is a caller
 * bug. It is logged and ignored rather than asserted: the pool is shared by
 * every sequence, and one sequence's bookkeeping bug must not corrupt the
 * others' blocks or take the stage down.
 *
 * The chain hash is xxHash64's round over 64-bit lanes (two tokens each)
 * with splitmix64's finalizer. It is not cryptographic: lookups compare
 * parent hash and tokens too, so a collision costs a miss, never a wrong
 * hit. It depends only on the token values and salt bytes (read as
 * little-endian), never on the host or the process, so engines can
 * publish the hashes they hold and a router can compare them. */

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cache.h"

// ---------------------------------------------------------------------------
// Hashing

#define HASH_P1 0x9E3779B185EBCA87ULL
#define HASH_P2 0xC2B2AE3D27D4EB4FULL
#define HASH_P3 0x165667B19E3779F9ULL

static inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

/* xxHash64's accumulator round: folds one 64-bit lane into acc. */
static inline uint64_t hash_round(uint64_t acc, uint64_t lane) {
    acc += lane * HASH_P2;
    acc = rotl64(acc, 31);
    return acc * HASH_P1;
}

/* splitmix64's finalizer: each input bit flips each output bit with
 * probability close to 1/2, so the low bits index buckets well. */
static inline uint64_t hash_final(uint64_t h) {
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return h;
}

/* The salt's length goes in first, so "a" and "a\0" differ. An empty salt
 * (or NULL) gives one fixed root shared by every unsalted request. */
uint64_t kv_root_hash(const void *salt, size_t salt_len) {
    const uint8_t *p = salt;
    uint64_t       acc = hash_round(HASH_P3, (uint64_t) salt_len);
    size_t         i = 0;

    for (; i + 8 <= salt_len; i += 8) {
        uint64_t lane = 0;

        for (int j = 7; j >= 0; j--) lane = (lane << 8) | p[i + j];
        acc = hash_round(acc, lane);
    }
    if (i < salt_len) {
        uint64_t lane = 0;

        for (size_t j = salt_len; j > i; j--) lane = (lane << 8) | p[j - 1];
        acc = hash_round(acc, lane);
    }
    return hash_final(acc);
}

/* Two tokens per lane, one round each: a 16-token block is 9 rounds. */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t acc = hash_round(parent ^ HASH_P1, (uint64_t) n);
    int      i = 0;

    for (; i + 2 <= n; i += 2) {
        acc = hash_round(acc, (uint64_t) (uint32_t) tokens[i]
                              | (uint64_t) (uint32_t) tokens[i + 1] << 32);
    }
    if (i < n) acc = hash_round(acc, (uint64_t) (uint32_t) tokens[i]);
    return hash_final(acc);
}

// ---------------------------------------------------------------------------
// Pool setup

int64_t kv_blocks_fit(int64_t left, uint64_t reserved, uint64_t block_bytes)
{
    if (left < 0 || block_bytes == 0 || (uint64_t) left <= reserved) {
        return 0;
    }
    return (int64_t) (((uint64_t) left - reserved) / block_bytes);
}

uint64_t kv_block_bytes(int n_layers, int n_kv_heads, int head_dim,
                        int block_size)
{
    return (uint64_t) n_layers * 2 * (uint64_t) block_size
           * (uint64_t) n_kv_heads * (uint64_t) head_dim * sizeof(uint16_t);
}

/* Lays the per-layer K and V views over kv->mem. */
static void layers_init(KVCache *kv, int n_kv_heads, int head_dim,
                        size_t per_layer)
{
    for (int l = 0; l < kv->n_layers; l++) {
        KVLayer *L = &kv->layers[l];

        L->n_kv_heads = n_kv_heads;
        L->head_dim = head_dim;
        L->block_size = kv->block_size;
        L->n_blocks = kv->n_blocks;
        L->k = kv->mem + (size_t) l * 2 * per_layer;
        L->v = L->k + per_layer;
    }
}

/* Every block free (block 0 on top of the stack), nothing published. */
static void pool_reset(KVCache *kv) {
    for (int64_t i = 0; i < kv->n_blocks; i++) {
        KVBlockMeta *m = &kv->meta[i];

        kv->free_stack[i] = (int32_t) (kv->n_blocks - 1 - i);
        m->ref = 0;
        m->lru_prev = m->lru_next = m->hash_next = -1;
        m->hash = m->parent = 0;
        m->published = false;
    }
    for (int64_t i = 0; i < kv->n_buckets; i++) kv->buckets[i] = -1;
    kv->n_free = kv->n_blocks;
    kv->n_cached = kv->n_used = 0;
    kv->lru_head = kv->lru_tail = -1;
    kv->evictions = 0;
    kv->unpublished = 0;
}

int kv_init(KVCache *kv, int n_layers, int n_kv_heads, int head_dim,
            int block_size, int64_t n_blocks, Backend *be, Err *err)
{
    size_t per_layer, bytes;

    memset(kv, 0, sizeof(*kv));
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0
        || n_blocks <= 0 || n_blocks > INT32_MAX)
    {
        return err_set(err, "invalid KV cache shape (%d layers, %d kv heads, "
                       "head dim %d, block size %d, %" PRId64 " blocks)",
                       n_layers, n_kv_heads, head_dim, block_size, n_blocks);
    }
    per_layer = (size_t) n_blocks * (size_t) n_kv_heads
                * (size_t) block_size * (size_t) head_dim;
    kv->n_layers = n_layers;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_buckets = 1;
    while (kv->n_buckets < n_blocks) kv->n_buckets *= 2;

    bytes = per_layer * 2 * (size_t) n_layers * sizeof(uint16_t);
    kv->be = be != NULL && be->alloc != NULL ? be : NULL;
    kv->layers = calloc((size_t) n_layers, sizeof(KVLayer));
    kv->mem = kv->be != NULL ? kv->be->alloc(kv->be, bytes) : malloc(bytes);
    kv->free_stack = malloc((size_t) n_blocks * sizeof(int32_t));
    kv->meta = malloc((size_t) n_blocks * sizeof(KVBlockMeta));
    kv->tokens = malloc((size_t) n_blocks * (size_t) block_size
                        * sizeof(int32_t));
    kv->buckets = malloc((size_t) kv->n_buckets * sizeof(int32_t));
    if (kv->layers == NULL || kv->mem == NULL || kv->free_stack == NULL
        || kv->meta == NULL || kv->tokens == NULL || kv->buckets == NULL)
    {
        kv_free(kv);
        return err_set(err, "out of %s memory allocating a KV cache of %.1f "
                       "MiB", be != NULL && be->alloc != NULL ? "device"
                       : "host", (double) bytes / (1 << 20));
    }
    layers_init(kv, n_kv_heads, head_dim, per_layer);
    pool_reset(kv);
    return 0;
}

/* Safe on a zeroed or half-initialised cache, and twice. */
void kv_free(KVCache *kv) {
    free(kv->layers);
    if (kv->be != NULL) {
        kv->be->release(kv->be, kv->mem);
    } else {
        free(kv->mem);
    }
    free(kv->free_stack);
    free(kv->meta);
    free(kv->tokens);
    free(kv->buckets);
    memset(kv, 0, sizeof(*kv));
    kv->lru_head = kv->lru_tail = -1;
}

// ---------------------------------------------------------------------------
// LRU list and hash table

static void lru_append(KVCache *kv, int32_t b) {
    KVBlockMeta *m = &kv->meta[b];

    m->lru_prev = kv->lru_tail;
    m->lru_next = -1;
    if (kv->lru_tail >= 0) kv->meta[kv->lru_tail].lru_next = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
}

static void lru_unlink(KVCache *kv, int32_t b) {
    KVBlockMeta *m = &kv->meta[b];

    if (m->lru_prev >= 0) kv->meta[m->lru_prev].lru_next = m->lru_next;
    else kv->lru_head = m->lru_next;
    if (m->lru_next >= 0) kv->meta[m->lru_next].lru_prev = m->lru_prev;
    else kv->lru_tail = m->lru_prev;
    m->lru_prev = m->lru_next = -1;
}

static int32_t *bucket(const KVCache *kv, uint64_t hash) {
    return &kv->buckets[hash & (uint64_t) (kv->n_buckets - 1)];
}

/* The published block with this hash, parent and tokens, or -1. */
static int32_t find(KVCache *kv, uint64_t hash, uint64_t parent,
                    const int32_t *tokens)
{
    size_t bytes = (size_t) kv->block_size * sizeof(int32_t);

    for (int32_t b = *bucket(kv, hash); b >= 0; b = kv->meta[b].hash_next) {
        const KVBlockMeta *m = &kv->meta[b];

        if (m->hash == hash && m->parent == parent
            && memcmp(kv->tokens + (size_t) b * kv->block_size, tokens,
                      bytes) == 0)
        {
            return b;
        }
    }
    return -1;
}

/* Removes a published block from its chain: a walk of its (short) bucket
 * to find the predecessor, the price of singly linked chains. */
static void unpublish(KVCache *kv, int32_t b) {
    int32_t *link = bucket(kv, kv->meta[b].hash);

    while (*link != b) link = &kv->meta[*link].hash_next;
    *link = kv->meta[b].hash_next;
    kv->meta[b].hash_next = -1;
    kv->meta[b].published = false;
    kv->unpublished++;
}

/* True (after logging) when b is not a block of this cache, or is not in
 * the used state though op needs it to be. */
static bool bad_block(const KVCache *kv, int32_t b, const char *op) {
    if (b < 0 || b >= kv->n_blocks) {
        log_msg(LOG_ERROR, "kv cache: %s of block %" PRId32 ", out of range",
                op, b);
        return true;
    }
    if (kv->meta[b].ref <= 0) {
        log_msg(LOG_ERROR, "kv cache: %s of block %" PRId32 ", which is not "
                "in use", op, b);
        return true;
    }
    return false;
}

// ---------------------------------------------------------------------------
// Block lifecycle

int32_t kv_alloc_block(KVCache *kv) {
    int32_t b;

    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else if (kv->lru_head >= 0) {
        b = kv->lru_head;
        lru_unlink(kv, b);
        unpublish(kv, b);
        kv->n_cached--;
        kv->evictions++;
    } else {
        return -1;
    }
    kv->meta[b].ref = 1;
    kv->n_used++;
    return b;
}

void kv_ref(KVCache *kv, int32_t block) {
    if (bad_block(kv, block, "reference")) return;
    kv->meta[block].ref++;
}

void kv_release_block(KVCache *kv, int32_t block) {
    KVBlockMeta *m;

    if (bad_block(kv, block, "release")) return;
    m = &kv->meta[block];
    if (--m->ref > 0) return;
    kv->n_used--;
    if (m->published) {
        lru_append(kv, block);
        kv->n_cached++;
    } else {
        kv->free_stack[kv->n_free++] = block;
    }
}

int32_t kv_find(const KVCache *kv, uint64_t hash) {
    if (kv->buckets == NULL) return -1;
    for (int32_t b = *bucket(kv, hash); b >= 0; b = kv->meta[b].hash_next) {
        if (kv->meta[b].hash == hash) return b;
    }
    return -1;
}

int32_t kv_lookup(KVCache *kv, uint64_t hash, uint64_t parent,
                  const int32_t *tokens)
{
    int32_t b = find(kv, hash, parent, tokens);

    if (b < 0) return -1;
    if (kv->meta[b].ref == 0) {
        lru_unlink(kv, b);
        kv->n_cached--;
        kv->n_used++;
    }
    kv->meta[b].ref++;
    return b;
}

void kv_publish(KVCache *kv, int32_t block, uint64_t hash, uint64_t parent,
                const int32_t *tokens)
{
    KVBlockMeta *m;
    int32_t     *head;

    if (bad_block(kv, block, "publish")) return;
    m = &kv->meta[block];
    if (m->published || find(kv, hash, parent, tokens) >= 0) return;
    memcpy(kv->tokens + (size_t) block * kv->block_size, tokens,
           (size_t) kv->block_size * sizeof(int32_t));
    m->hash = hash;
    m->parent = parent;
    m->published = true;
    head = bucket(kv, hash);
    m->hash_next = *head;
    *head = block;
}

void kv_evict_all(KVCache *kv) {
    while (kv->lru_head >= 0) {
        int32_t b = kv->lru_head;

        lru_unlink(kv, b);
        unpublish(kv, b);
        kv->n_cached--;
        kv->free_stack[kv->n_free++] = b;
    }
}

/* test_kv_cache.c -- the block pool and the prefix cache: every block
 * handed out once, reference counts, publish and lookup (hash, parent and
 * tokens all checked), LRU eviction order, and a randomized run against a
 * model of the block states that checks the invariants after every
 * operation. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kv_cache.h"

#define BS 4                    /* block size of the small test caches */

/* A small cache: 1 layer, 1 kv head, head dim 2. */
static void small_cache(KVCache *kv, int64_t n_blocks) {
    Err err;

    assert_int_equal(kv_init(kv, 1, 1, 2, BS, n_blocks, NULL, &err), 0);
}

/* Walks every structure and checks the invariants of kv_cache.c. */
static void check_pool(const KVCache *kv) {
    int64_t n_ref = 0, n_pub = 0, n_lru = 0, n_chain = 0;

    assert_int_equal(kv->n_free + kv->n_cached + kv->n_used, kv->n_blocks);
    for (int64_t b = 0; b < kv->n_blocks; b++) {
        assert_true(kv->meta[b].ref >= 0);
        n_ref += kv->meta[b].ref > 0;
        n_pub += kv->meta[b].published;
    }
    assert_int_equal(n_ref, kv->n_used);
    for (int64_t i = 0; i < kv->n_free; i++) {
        int32_t b = kv->free_stack[i];

        assert_int_equal(kv->meta[b].ref, 0);
        assert_false(kv->meta[b].published);
    }
    for (int32_t b = kv->lru_head, prev = -1; b >= 0;
         prev = b, b = kv->meta[b].lru_next)
    {
        assert_int_equal(kv->meta[b].lru_prev, prev);
        assert_int_equal(kv->meta[b].ref, 0);
        assert_true(kv->meta[b].published);
        assert_true(++n_lru <= kv->n_blocks);
        if (kv->meta[b].lru_next < 0) assert_int_equal(kv->lru_tail, b);
    }
    assert_int_equal(n_lru, kv->n_cached);
    for (int64_t i = 0; i < kv->n_buckets; i++) {
        for (int32_t b = kv->buckets[i]; b >= 0; b = kv->meta[b].hash_next) {
            assert_true(kv->meta[b].published);
            assert_int_equal(kv->meta[b].hash & (kv->n_buckets - 1), i);
            assert_true(++n_chain <= kv->n_blocks);
        }
    }
    assert_int_equal(n_chain, n_pub);
}

static void test_alloc_release(void **state) {
    KVCache kv;
    Err     err;
    int32_t got[64];
    uint8_t seen[64] = { 0 };

    (void) state;
    assert_int_equal(kv_init(&kv, 3, 2, 8, 16, 64, NULL, &err), 0);
    for (int i = 0; i < 64; i++) {
        got[i] = kv_alloc_block(&kv);
        assert_true(got[i] >= 0 && got[i] < 64);
        assert_int_equal(seen[got[i]]++, 0);
    }
    assert_int_equal(kv_alloc_block(&kv), -1);
    assert_int_equal(kv.n_used, 64);
    kv_release_block(&kv, got[10]);
    kv_release_block(&kv, got[20]);
    assert_int_equal(kv.n_free, 2);
    assert_int_equal(kv_alloc_block(&kv), got[20]);
    assert_int_equal(kv_alloc_block(&kv), got[10]);
    assert_int_equal(kv_alloc_block(&kv), -1);
    check_pool(&kv);
    kv_free(&kv);
}

/* Writing every element of every layer's K and V through the views touches
 * each byte of the one allocation exactly once (ASan checks the bounds). */
static void test_layer_views(void **state) {
    KVCache kv;
    Err     err;
    size_t  per = (size_t) 5 * 2 * 16 * 8;      /* blocks*heads*bs*hd */

    (void) state;
    assert_int_equal(kv_init(&kv, 4, 2, 8, 16, 5, NULL, &err), 0);
    memset(kv.mem, 0, per * 2 * 4 * sizeof(uint16_t));
    for (int l = 0; l < 4; l++) {
        for (size_t i = 0; i < per; i++) {
            kv.layers[l].k[i] += 1;
            kv.layers[l].v[i] += 1;
        }
    }
    for (size_t i = 0; i < per * 2 * 4; i++) assert_int_equal(kv.mem[i], 1);
    assert_int_equal(kv_block_bytes(4, 2, 8, 16) * 5,
                     per * 2 * 4 * sizeof(uint16_t));
    kv_free(&kv);
}

static void test_init_invalid(void **state) {
    KVCache kv;
    Err     err;

    (void) state;
    assert_int_equal(kv_init(&kv, 1, 1, 2, BS, 0, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "invalid KV cache shape"));
    assert_int_equal(kv_init(&kv, 1, 1, 2, 0, 8, NULL, &err), -1);
    kv_free(&kv);                               /* harmless after a failure */
}

static void test_refcount(void **state) {
    KVCache kv;
    int32_t b;

    (void) state;
    small_cache(&kv, 4);
    b = kv_alloc_block(&kv);
    kv_ref(&kv, b);
    kv_ref(&kv, b);
    assert_int_equal(kv.meta[b].ref, 3);
    kv_release_block(&kv, b);
    kv_release_block(&kv, b);
    assert_int_equal(kv.n_used, 1);
    assert_int_equal(kv.n_free, 3);
    kv_release_block(&kv, b);
    assert_int_equal(kv.n_used, 0);
    assert_int_equal(kv.n_free, 4);
    assert_int_equal(kv.n_cached, 0);
    check_pool(&kv);
    kv_free(&kv);
}

static void test_hash(void **state) {
    int32_t  t[BS] = { 1, 2, 3, 4 }, u[BS] = { 1, 2, 3, 5 };
    uint64_t root = kv_root_hash(NULL, 0);

    (void) state;
    assert_true(root == kv_root_hash("", 0));
    assert_true(root != kv_root_hash("a", 1));
    assert_true(kv_root_hash("a", 1) != kv_root_hash("a\0", 2));
    assert_true(kv_root_hash("user-1", 6) != kv_root_hash("user-2", 6));
    assert_true(kv_root_hash("0123456789", 10)
                != kv_root_hash("0123456788", 10));
    assert_true(kv_block_hash(root, t, BS) == kv_block_hash(root, t, BS));
    assert_true(kv_block_hash(root, t, BS) != kv_block_hash(root, u, BS));
    assert_true(kv_block_hash(root, t, BS) != kv_block_hash(root + 1, t, BS));
    assert_true(kv_block_hash(root, t, 3) != kv_block_hash(root, t, BS));

    /* Pinned values: the hash depends on nothing but its input, so engines
     * on different hosts agree on it. A change here changes what every
     * engine reports to the router. */
    assert_true(root == 0xa6ab8ea3ce8aa6f0ULL);
    assert_true(kv_block_hash(root, t, BS) == 0x63ba3d6f2197ec64ULL);
}

/* A three-block chain of tokens under one salt, as a sequence would
 * publish it. */
typedef struct {
    int32_t  tokens[3][BS];
    uint64_t parent[3], hash[3];
} Chain;

static void chain_init(Chain *c, const char *salt, int32_t first) {
    uint64_t h = kv_root_hash(salt, strlen(salt));

    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < BS; j++) c->tokens[i][j] = first + i * BS + j;
        c->parent[i] = h;
        h = c->hash[i] = kv_block_hash(h, c->tokens[i], BS);
    }
}

static void test_publish_lookup(void **state) {
    KVCache kv;
    Chain   a, salted;
    int32_t blk[3], wrong[BS];

    (void) state;
    small_cache(&kv, 8);
    chain_init(&a, "", 100);
    chain_init(&salted, "tenant", 100);
    for (int i = 0; i < 3; i++) {
        blk[i] = kv_alloc_block(&kv);
        assert_int_equal(kv_lookup(&kv, a.hash[i], a.parent[i],
                                   a.tokens[i]), -1);
        kv_publish(&kv, blk[i], a.hash[i], a.parent[i], a.tokens[i]);
    }
    /* hit: a used block gains a reference */
    assert_int_equal(kv_lookup(&kv, a.hash[1], a.parent[1], a.tokens[1]),
                     blk[1]);
    assert_int_equal(kv.meta[blk[1]].ref, 2);
    kv_release_block(&kv, blk[1]);

    /* block 1's tokens after a different block 0: a different parent */
    assert_int_equal(kv_lookup(&kv, kv_block_hash(a.hash[0] ^ 1, a.tokens[1],
                                                  BS),
                               a.hash[0] ^ 1, a.tokens[1]), -1);
    /* the same hash and parent but other tokens (a forged collision) */
    memcpy(wrong, a.tokens[1], sizeof(wrong));
    wrong[2]++;
    assert_int_equal(kv_lookup(&kv, a.hash[1], a.parent[1], wrong), -1);
    /* the right tokens and hash, a wrong stored parent */
    assert_int_equal(kv_lookup(&kv, a.hash[1], a.parent[1] + 1, a.tokens[1]),
                     -1);
    /* the same tokens under another salt: every block misses */
    for (int i = 0; i < 3; i++) {
        assert_true(salted.hash[i] != a.hash[i]);
        assert_int_equal(kv_lookup(&kv, salted.hash[i], salted.parent[i],
                                   salted.tokens[i]), -1);
    }
    assert_int_equal(kv.n_used, 3);
    assert_int_equal(kv.n_free, 5);
    check_pool(&kv);
    kv_free(&kv);
}

static void test_cached_on_last_release(void **state) {
    KVCache kv;
    Chain   a;
    int32_t b;

    (void) state;
    small_cache(&kv, 4);
    chain_init(&a, "", 1);
    b = kv_alloc_block(&kv);
    kv_ref(&kv, b);
    kv_publish(&kv, b, a.hash[0], a.parent[0], a.tokens[0]);
    kv_release_block(&kv, b);
    assert_int_equal(kv.n_used, 1);
    assert_int_equal(kv.n_cached, 0);
    kv_release_block(&kv, b);
    assert_int_equal(kv.n_used, 0);
    assert_int_equal(kv.n_cached, 1);
    assert_int_equal(kv.n_free, 3);
    check_pool(&kv);

    /* a hit on the cached block makes it used again, off the LRU list */
    assert_int_equal(kv_lookup(&kv, a.hash[0], a.parent[0], a.tokens[0]), b);
    assert_int_equal(kv.n_used, 1);
    assert_int_equal(kv.n_cached, 0);
    assert_int_equal(kv.lru_head, -1);
    check_pool(&kv);
    kv_release_block(&kv, b);
    assert_int_equal(kv.n_cached, 1);
    kv_free(&kv);
}

/* Blocks 0..3 published and released in the order 2, 0, 3, 1; a lookup
 * of 0 and its release make it the newest. Evictions then go 2, 3, 1, 0. */
static void test_lru_order(void **state) {
    KVCache kv;
    Chain   c[4];
    int32_t blk[4];
    int     order[4] = { 2, 0, 3, 1 }, evict[4] = { 2, 3, 1, 0 };

    (void) state;
    small_cache(&kv, 4);
    for (int i = 0; i < 4; i++) {
        chain_init(&c[i], "", 10 * i);
        blk[i] = kv_alloc_block(&kv);
        kv_publish(&kv, blk[i], c[i].hash[0], c[i].parent[0],
                   c[i].tokens[0]);
    }
    for (int i = 0; i < 4; i++) kv_release_block(&kv, blk[order[i]]);
    assert_int_equal(kv.n_cached, 4);
    assert_int_equal(kv_lookup(&kv, c[0].hash[0], c[0].parent[0],
                               c[0].tokens[0]), blk[0]);
    kv_release_block(&kv, blk[0]);
    check_pool(&kv);
    for (int i = 0; i < 4; i++) {
        int k = evict[i];

        assert_int_equal(kv_alloc_block(&kv), blk[k]);
        assert_int_equal(kv.evictions, (uint64_t) i + 1);
        /* evicted means unpublished: its content is gone */
        assert_int_equal(kv_lookup(&kv, c[k].hash[0], c[k].parent[0],
                                   c[k].tokens[0]), -1);
        check_pool(&kv);
    }
    assert_int_equal(kv_alloc_block(&kv), -1);
    assert_int_equal(kv.n_used, 4);
    kv_free(&kv);
}

/* Two sequences compute the same block: the second copy stays
 * unpublished, and is freed, not cached, on release. */
static void test_double_publish(void **state) {
    KVCache kv;
    Chain   a;
    int32_t b1, b2;

    (void) state;
    small_cache(&kv, 4);
    chain_init(&a, "", 5);
    b1 = kv_alloc_block(&kv);
    b2 = kv_alloc_block(&kv);
    kv_publish(&kv, b1, a.hash[0], a.parent[0], a.tokens[0]);
    kv_publish(&kv, b2, a.hash[0], a.parent[0], a.tokens[0]);
    kv_publish(&kv, b1, a.hash[0], a.parent[0], a.tokens[0]);
    assert_true(kv.meta[b1].published);
    assert_false(kv.meta[b2].published);
    check_pool(&kv);
    kv_release_block(&kv, b2);
    kv_release_block(&kv, b1);
    assert_int_equal(kv.n_cached, 1);
    assert_int_equal(kv.n_free, 3);
    assert_int_equal(kv_lookup(&kv, a.hash[0], a.parent[0], a.tokens[0]), b1);
    check_pool(&kv);
    kv_free(&kv);
}

static void test_evict_all(void **state) {
    KVCache kv;
    Chain   a;
    int32_t blk[3], keep;

    (void) state;
    small_cache(&kv, 8);
    chain_init(&a, "s", 0);
    for (int i = 0; i < 3; i++) {
        blk[i] = kv_alloc_block(&kv);
        kv_publish(&kv, blk[i], a.hash[i], a.parent[i], a.tokens[i]);
    }
    keep = blk[2];
    kv_release_block(&kv, blk[0]);
    kv_release_block(&kv, blk[1]);
    assert_int_equal(kv.n_cached, 2);
    kv_evict_all(&kv);
    assert_int_equal(kv.n_cached, 0);
    assert_int_equal(kv.n_free, 7);
    assert_int_equal(kv.n_used, 1);
    assert_int_equal(kv.evictions, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kv_lookup(&kv, a.hash[i], a.parent[i], a.tokens[i]),
                         -1);
    }
    /* a used published block is not evicted, and stays findable */
    assert_int_equal(kv_lookup(&kv, a.hash[2], a.parent[2], a.tokens[2]),
                     keep);
    check_pool(&kv);
    kv_free(&kv);
}

/* Misuse is logged and ignored: the pool stays consistent. */
static void test_misuse(void **state) {
    KVCache kv;
    Chain   a;
    int32_t b;

    (void) state;
    log_set_level((LogLevel) (LOG_ERROR + 1));      /* expected errors */
    small_cache(&kv, 4);
    chain_init(&a, "", 0);
    b = kv_alloc_block(&kv);
    kv_release_block(&kv, b);
    kv_release_block(&kv, b);                   /* double release */
    kv_ref(&kv, b);                             /* ref of a free block */
    kv_publish(&kv, b, a.hash[0], a.parent[0], a.tokens[0]);
    kv_release_block(&kv, -1);
    kv_release_block(&kv, 4);
    kv_ref(&kv, 1000);
    log_set_level(LOG_WARN);
    assert_int_equal(kv.n_free, 4);
    assert_int_equal(kv.meta[b].ref, 0);
    assert_false(kv.meta[b].published);
    check_pool(&kv);
    kv_free(&kv);
}

// ---------------------------------------------------------------------------
// Randomized run against a model

#define SN    16                /* blocks */
#define SC    40                /* distinct block contents */
#define SOPS  40000

typedef struct {
    uint64_t parent, hash;
    int32_t  tokens[BS];
} Content;

typedef struct {
    int      ref[SN];
    bool     pub[SN];
    int      content[SN];       // valid when pub
    uint64_t stamp[SN];         // when it became cached
    uint64_t clock;
    int      hits;              // lookups that found a block
} Model;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Contents built to look alike: 1 differs from 0 in its parent, 2 in one
 * token, 3 shares 0's hash (a forged collision) and parent but not its
 * tokens, 4 shares 0's hash and tokens but not its parent. */
static void contents_init(Content *c, uint64_t *rng) {
    for (int i = 0; i < SC; i++) {
        c[i].parent = rng_next(rng);
        for (int j = 0; j < BS; j++) {
            c[i].tokens[j] = (int32_t) (rng_next(rng) % 50);
        }
    }
    c[1] = c[0];
    c[1].parent ^= 1;
    c[2] = c[0];
    c[2].tokens[BS - 1] += 1;
    for (int i = 0; i < SC; i++) {
        c[i].hash = kv_block_hash(c[i].parent, c[i].tokens, BS);
    }
    c[3] = c[0];
    c[3].tokens[0] += 1;
    c[4] = c[0];
    c[4].parent ^= 2;
}

static int model_count(const Model *m, int which) {
    int n = 0;

    for (int b = 0; b < SN; b++) {
        bool used = m->ref[b] > 0, cached = !used && m->pub[b];

        n += which == 0 ? (!used && !m->pub[b]) : which == 1 ? cached : used;
    }
    return n;
}

static int model_pick_used(const Model *m, uint64_t *rng) {
    int start = (int) (rng_next(rng) % SN);

    for (int i = 0; i < SN; i++) {
        int b = (start + i) % SN;

        if (m->ref[b] > 0) return b;
    }
    return -1;
}

static void stress_alloc(KVCache *kv, Model *m) {
    int32_t b = kv_alloc_block(kv);
    int     oldest = -1;

    for (int i = 0; i < SN; i++) {
        if (m->ref[i] == 0 && m->pub[i]
            && (oldest < 0 || m->stamp[i] < m->stamp[oldest]))
        {
            oldest = i;
        }
    }
    if (model_count(m, 0) > 0) {
        assert_true(b >= 0 && b < SN);
        assert_int_equal(m->ref[b], 0);         /* never a used block */
        assert_false(m->pub[b]);                /* free before cached */
    } else if (oldest >= 0) {
        assert_int_equal(b, oldest);
    } else {
        assert_int_equal(b, -1);
        return;
    }
    m->ref[b] = 1;
    m->pub[b] = false;
}

static void stress_release(KVCache *kv, Model *m, uint64_t *rng) {
    int b = model_pick_used(m, rng);

    if (b < 0) return;
    kv_release_block(kv, b);
    if (--m->ref[b] == 0 && m->pub[b]) m->stamp[b] = ++m->clock;
}

static void stress_publish(KVCache *kv, Model *m, const Content *c,
                           uint64_t *rng)
{
    int b = model_pick_used(m, rng), k = (int) (rng_next(rng) % SC);
    bool dup = false;

    if (b < 0) return;
    kv_publish(kv, b, c[k].hash, c[k].parent, c[k].tokens);
    for (int i = 0; i < SN; i++) dup |= m->pub[i] && m->content[i] == k;
    if (m->pub[b] || dup) return;
    m->pub[b] = true;
    m->content[b] = k;
}

static void stress_lookup(KVCache *kv, Model *m, const Content *c,
                          uint64_t *rng)
{
    int     k = (int) (rng_next(rng) % SC), want = -1;
    int32_t b = kv_lookup(kv, c[k].hash, c[k].parent, c[k].tokens);

    for (int i = 0; i < SN; i++) {
        if (m->pub[i] && m->content[i] == k) want = i;
    }
    assert_int_equal(b, want);
    if (b >= 0) {
        m->ref[b]++;
        m->hits++;
    }
}

static void stress_check(const KVCache *kv, const Model *m) {
    assert_int_equal(kv->n_free, model_count(m, 0));
    assert_int_equal(kv->n_cached, model_count(m, 1));
    assert_int_equal(kv->n_used, model_count(m, 2));
    for (int b = 0; b < SN; b++) {
        assert_int_equal(kv->meta[b].ref, m->ref[b]);
        assert_int_equal(kv->meta[b].published, m->pub[b]);
    }
    check_pool(kv);
}

static void test_stress(void **state) {
    KVCache  kv;
    Model    m;
    Content  c[SC];
    uint64_t rng = 0x9E3779B97F4A7C15ULL;

    /* Per mille, cumulative: alloc, release, ref, publish, lookup; the
     * rest is evict_all. Phases of 500 operations alternate between
     * filling the pool (so allocations must evict) and draining it (so
     * blocks go back to the free stack and the LRU list). */
    static const unsigned mix[2][5] = {
        { 350, 500, 550, 750, 998 },
        { 100, 500, 530, 730, 998 },
    };

    (void) state;
    memset(&m, 0, sizeof(m));
    contents_init(c, &rng);
    small_cache(&kv, SN);
    for (int op = 0; op < SOPS; op++) {
        const unsigned *t = mix[(op / 500) % 2];
        unsigned        r = (unsigned) (rng_next(&rng) % 1000);

        if (r < t[0]) {
            stress_alloc(&kv, &m);
        } else if (r < t[1]) {
            stress_release(&kv, &m, &rng);
        } else if (r < t[2]) {
            int b = model_pick_used(&m, &rng);

            if (b >= 0) {
                kv_ref(&kv, b);
                m.ref[b]++;
            }
        } else if (r < t[3]) {
            stress_publish(&kv, &m, c, &rng);
        } else if (r < t[4]) {
            stress_lookup(&kv, &m, c, &rng);
        } else {
            kv_evict_all(&kv);
            for (int b = 0; b < SN; b++) {
                if (m.ref[b] == 0) m.pub[b] = false;
            }
        }
        stress_check(&kv, &m);
    }
    /* the run reached the interesting paths */
    assert_true(m.hits > 1000);
    assert_true(kv.evictions > 1000);

    /* release everything: only free and cached blocks remain */
    for (int b = 0; b < SN; b++) {
        while (m.ref[b] > 0) {
            kv_release_block(&kv, b);
            m.ref[b]--;
        }
    }
    assert_int_equal(kv.n_used, 0);
    assert_int_equal(kv.n_free + kv.n_cached, SN);
    check_pool(&kv);
    kv_free(&kv);
}

/* A pool sized from a device budget: whole blocks of what is left after
 * the reserve, none when the reserve takes it all. */
static void test_blocks_fit(void **state) {
    (void) state;
    assert_int_equal(kv_blocks_fit(1000, 100, 300), 3);
    assert_int_equal(kv_blocks_fit(1000, 1000, 1), 0);
    assert_int_equal(kv_blocks_fit(1000, 2000, 1), 0);
    assert_int_equal(kv_blocks_fit(-5, 0, 1), 0);
    assert_int_equal(kv_blocks_fit(1000, 0, 0), 0);
    assert_true(kv_blocks_fit(100LL << 30, 1ULL << 30, 2u << 20)
                == (int64_t) ((99ULL << 30) / (2u << 20)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_fit),
        cmocka_unit_test(test_alloc_release),
        cmocka_unit_test(test_layer_views),
        cmocka_unit_test(test_init_invalid),
        cmocka_unit_test(test_refcount),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_publish_lookup),
        cmocka_unit_test(test_cached_on_last_release),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_double_publish),
        cmocka_unit_test(test_evict_all),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_stress),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("kv_cache", tests, NULL, NULL);
}

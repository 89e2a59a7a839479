/* test_prefix_index.c -- the prefix index's states (thinker/prefix_index.c)
 * against a real KV cache small enough that filling it evicts: pending
 * keys become held when their anchor block is published, and go when
 * their request ends first or they wait too long; held keys go (DEL) when
 * their block is evicted, and only then; a full table drops its oldest
 * entry; a key added again is younger; a resend repeats every held key.
 * Every operation the index sends is recorded and checked in order. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kv_cache.h"
#include "prefix_index.h"

#define BS       4
#define N_BLOCKS 6
#define MAX_OPS  64

typedef struct {
    PidxOp   op;
    OmniPkey key;
    int32_t  tokens;
} Rec;

typedef struct {
    KVCache      kv;
    PrefixIndex *x;
    Rec          ops[MAX_OPS];
    int          n_ops;
    int          seen;          // ops already checked
} Fix;

static void record(void *ud, PidxOp op, OmniPkey key, int32_t tokens) {
    Fix *f = ud;

    assert_true(f->n_ops < MAX_OPS);
    f->ops[f->n_ops++] = (Rec) { op, key, tokens };
}

static Fix *fix_new(int64_t cap) {
    Fix *f = calloc(1, sizeof(*f));
    Err  err;

    assert_non_null(f);
    if (kv_init(&f->kv, 1, 1, 2, BS, N_BLOCKS, NULL, &err) != 0) {
        fail_msg("%s", err.msg);
    }
    f->x = pidx_new(cap, record, f, &err);
    if (f->x == NULL) fail_msg("%s", err.msg);
    return f;
}

static void fix_free(Fix *f) {
    assert_int_equal(f->seen, f->n_ops);        // every op was checked
    pidx_free(f->x);
    kv_free(&f->kv);
    free(f);
}

static OmniPkey key(int i) {
    OmniPkey k = { 0x1000 + (uint64_t) i,
                   0x9e3779b97f4a7c15ULL * (uint64_t) i };

    return k;
}

static PrefixKey pk(int i, uint64_t anchor, int32_t tokens) {
    PrefixKey p = { key(i), anchor, tokens, 0 };

    return p;
}

/* A block published under hash (the tokens only have to differ), then
 * released: cached, so evictable. */
static int32_t cached_block(Fix *f, uint64_t hash) {
    int32_t b = kv_alloc_block(&f->kv);
    int32_t t[BS] = { (int32_t) hash, 1, 2, 3 };

    assert_true(b >= 0);
    kv_publish(&f->kv, b, hash, 0, t);
    kv_release_block(&f->kv, b);
    return b;
}

/* Takes every block (evicting every cached one), then frees them. */
static void evict_all_by_use(Fix *f) {
    int32_t b[N_BLOCKS];

    for (int i = 0; i < N_BLOCKS; i++) {
        b[i] = kv_alloc_block(&f->kv);
        assert_true(b[i] >= 0);
    }
    for (int i = 0; i < N_BLOCKS; i++) kv_release_block(&f->kv, b[i]);
}

static void expect_op(Fix *f, PidxOp op, int k, int32_t tokens) {
    const Rec *r;

    assert_true(f->seen < f->n_ops);
    r = &f->ops[f->seen++];
    assert_int_equal(r->op, op);
    assert_true(r->key.hi == key(k).hi && r->key.lo == key(k).lo);
    if (op == PIDX_SET) assert_int_equal(r->tokens, tokens);
}

static void expect_none(Fix *f) {
    assert_int_equal(f->n_ops, f->seen);
}

static void expect_counts(Fix *f, int64_t held, int64_t pending) {
    PidxCounts c;

    pidx_counts(f->x, &c);
    assert_int_equal(c.held, held);
    assert_int_equal(c.pending, pending);
}


/* ---- Tests --------------------------------------------------------------- */

/* pending -> held when the anchor is published; -> gone (DEL) when it is
 * evicted; a sync without evictions keeps it. */
static void test_held_then_evicted(void **state) {
    Fix      *f = fix_new(16);
    PrefixKey k[2] = { pk(1, 111, 4), pk(2, 222, 8) };

    (void) state;
    pidx_add(f->x, 7, k, 2, 0.0);
    pidx_sync(f->x, &f->kv, 0.1);
    expect_none(f);
    expect_counts(f, 0, 2);
    cached_block(f, 111);
    pidx_sync(f->x, &f->kv, 0.2);
    expect_op(f, PIDX_SET, 1, 4);
    expect_counts(f, 1, 1);
    cached_block(f, 222);
    pidx_sync(f->x, &f->kv, 0.3);
    expect_op(f, PIDX_SET, 2, 8);
    pidx_sync(f->x, &f->kv, 0.4);
    expect_none(f);
    expect_counts(f, 2, 0);

    evict_all_by_use(f);
    assert_true(f->kv.evictions >= 2);
    pidx_sync(f->x, &f->kv, 0.5);
    expect_op(f, PIDX_DEL, 1, 0);
    expect_op(f, PIDX_DEL, 2, 0);
    expect_counts(f, 0, 0);
    fix_free(f);
}

/* One of two held keys evicted: only its DEL. */
static void test_partial_eviction(void **state) {
    Fix      *f = fix_new(16);
    PrefixKey k[2] = { pk(1, 111, 4), pk(2, 222, 4) };
    int32_t   b, held[N_BLOCKS];

    (void) state;
    pidx_add(f->x, 1, k, 2, 0.0);
    cached_block(f, 111);
    b = kv_alloc_block(&f->kv);             // 222 stays used: not evictable
    kv_publish(&f->kv, b, 222, 0, (int32_t[BS]) { 9, 9, 9, 9 });
    pidx_sync(f->x, &f->kv, 0.1);
    expect_op(f, PIDX_SET, 1, 4);
    expect_op(f, PIDX_SET, 2, 4);
    for (int i = 0; i < N_BLOCKS - 1; i++) {
        held[i] = kv_alloc_block(&f->kv);
        assert_true(held[i] >= 0);
    }
    pidx_sync(f->x, &f->kv, 0.2);
    expect_op(f, PIDX_DEL, 1, 0);
    expect_counts(f, 1, 0);
    for (int i = 0; i < N_BLOCKS - 1; i++) {
        kv_release_block(&f->kv, held[i]);
    }
    kv_release_block(&f->kv, b);
    fix_free(f);
}

/* A pending key whose request ends goes at the next sync, unless its
 * anchor is published by then; another request's end does not touch it. */
static void test_request_end(void **state) {
    Fix      *f = fix_new(16);
    PrefixKey a = pk(1, 111, 4), b = pk(2, 222, 4);

    (void) state;
    pidx_add(f->x, 10, &a, 1, 0.0);
    pidx_add(f->x, 11, &b, 1, 0.0);
    pidx_end(f->x, 10);
    pidx_end(f->x, 99);
    pidx_sync(f->x, &f->kv, 0.1);
    expect_none(f);
    expect_counts(f, 0, 1);

    cached_block(f, 222);
    pidx_end(f->x, 11);
    pidx_sync(f->x, &f->kv, 0.2);
    expect_op(f, PIDX_SET, 2, 4);
    expect_counts(f, 1, 0);

    /* added again by request 13 after 10 ended: 13 owns it now */
    pidx_add(f->x, 13, &a, 1, 1.0);
    pidx_end(f->x, 10);
    pidx_sync(f->x, &f->kv, 1.1);
    expect_counts(f, 1, 1);
    fix_free(f);
}

static void test_pending_timeout(void **state) {
    Fix      *f = fix_new(16);
    PrefixKey a = pk(1, 111, 4);

    (void) state;
    pidx_add(f->x, 1, &a, 1, 0.0);
    pidx_sync(f->x, &f->kv, PIDX_PENDING_MAX_S - 1);
    expect_counts(f, 0, 1);
    pidx_sync(f->x, &f->kv, PIDX_PENDING_MAX_S + 1);
    expect_counts(f, 0, 0);
    expect_none(f);
    fix_free(f);
}

/* Full: the least recently seen entry goes, a held one with a DEL. A key
 * added again is seen again; a held key added again stays held and sends
 * nothing. */
static void test_full(void **state) {
    Fix      *f = fix_new(3);
    PrefixKey k[5] = { pk(1, 111, 4), pk(2, 222, 4), pk(3, 333, 4),
                       pk(4, 444, 4), pk(5, 555, 4) };

    (void) state;
    cached_block(f, 111);
    pidx_add(f->x, 1, k, 3, 0.0);
    pidx_sync(f->x, &f->kv, 0.1);
    expect_op(f, PIDX_SET, 1, 4);
    pidx_add(f->x, 2, &k[0], 1, 0.2);       // 1 is the youngest now
    expect_none(f);
    pidx_add(f->x, 2, &k[3], 1, 0.3);       // 2 (pending) goes quietly
    expect_none(f);
    pidx_add(f->x, 2, &k[4], 1, 0.4);       // 3 (pending) goes
    expect_none(f);
    expect_counts(f, 1, 2);
    pidx_add(f->x, 3, &k[1], 1, 0.5);       // 1 (held) goes: DEL
    expect_op(f, PIDX_DEL, 1, 0);
    expect_counts(f, 0, 3);
    fix_free(f);
}

static void test_resend(void **state) {
    Fix      *f = fix_new(8);
    PrefixKey k[3] = { pk(1, 111, 4), pk(2, 222, 8), pk(3, 333, 12) };

    (void) state;
    cached_block(f, 111);
    cached_block(f, 333);
    pidx_add(f->x, 1, k, 3, 0.0);
    pidx_sync(f->x, &f->kv, 0.1);
    expect_op(f, PIDX_SET, 1, 4);
    expect_op(f, PIDX_SET, 3, 12);
    pidx_resend(f->x);
    expect_op(f, PIDX_SET, 1, 4);
    expect_op(f, PIDX_SET, 3, 12);
    expect_counts(f, 2, 1);
    {
        PidxCounts c;

        pidx_counts(f->x, &c);
        assert_int_equal(c.published, 2);   // a resend is not a publish
        assert_int_equal(c.removed, 0);
    }
    fix_free(f);
}

/* kv_find: a hash published, used or cached; none after eviction; no
 * reference taken (the LRU order and the states stay). */
static void test_kv_find(void **state) {
    Fix    *f = fix_new(4);
    int32_t b = cached_block(f, 77);
    int64_t cached = f->kv.n_cached;

    (void) state;
    assert_int_equal(kv_find(&f->kv, 77), b);
    assert_int_equal(kv_find(&f->kv, 78), -1);
    assert_int_equal(f->kv.n_cached, cached);
    assert_int_equal(f->kv.meta[b].ref, 0);
    assert_int_equal(f->kv.unpublished, 0);
    kv_evict_all(&f->kv);
    assert_int_equal(kv_find(&f->kv, 77), -1);
    assert_int_equal(f->kv.unpublished, 1);
    fix_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_then_evicted),
        cmocka_unit_test(test_partial_eviction),
        cmocka_unit_test(test_request_end),
        cmocka_unit_test(test_pending_timeout),
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_resend),
        cmocka_unit_test(test_kv_find),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("prefix_index", tests, NULL, NULL);
}

/* prefix_index.c -- the index of prefix keys the KV cache holds; the states
 * and when they change are in prefix_index.h.
 *
 * Storage: cap entries in one array, and three lists through it, all by
 * index (-1 ends), so nothing allocates after pidx_new:
 *
 *   buckets    key -> entry, chained through .hnext from
 *              buckets[key.lo & mask] (the key is an XXH3 hash: its low
 *              bits index well); mask + 1 is a power of two >= cap
 *   age list   every entry in use, least recently seen first (.prev,
 *              .next): the victim when the table is full
 *   pending    the pending entries (.pprev, .pnext), so a sync walks only
 *              them; held entries are walked only when a block was
 *              unpublished
 *   free       unused entries, through .next
 *
 * Rejected: checking every held entry at every sync (O(entries) every 50
 * ms while nothing is evicted), and asking the KV cache which hashes an
 * eviction removed (it would have to remember them for us, in the step
 * loop). */

#include <stdlib.h>

#include "prefix_index.h"

typedef enum { E_FREE, E_PENDING, E_HELD } EntryState;

typedef struct {
    OmniPkey   key;
    uint64_t   anchor;
    uint64_t   req;             // the request that added it last
    double     seen;            // when it was added last
    int32_t    tokens;
    int32_t    hnext;           // bucket chain
    int32_t    prev, next;      // age list (next: free list when free)
    int32_t    pprev, pnext;    // pending list
    uint8_t    state;           // EntryState
    bool       ended;           // pending, and its request ended
} Entry;

typedef struct {
    int32_t head, tail;
} List;

struct PrefixIndex {
    Entry     *e;               // (cap,) owned
    int32_t   *buckets;         // (mask + 1,) owned
    uint64_t   mask;
    int64_t    cap;
    int32_t    free;            // free list head
    List       age;             // oldest first
    List       pending;         // oldest first
    uint64_t   unpublished;     // kv->unpublished at the last held check
    PidxCounts counts;
    PidxOpFn  *fn;
    void      *ud;
};


/* ---- Lists -------------------------------------------------------------- */

static void age_unlink(PrefixIndex *x, int32_t i) {
    Entry *e = &x->e[i];

    if (e->prev >= 0) x->e[e->prev].next = e->next;
    else x->age.head = e->next;
    if (e->next >= 0) x->e[e->next].prev = e->prev;
    else x->age.tail = e->prev;
}

static void age_append(PrefixIndex *x, int32_t i) {
    Entry *e = &x->e[i];

    e->prev = x->age.tail;
    e->next = -1;
    if (x->age.tail >= 0) x->e[x->age.tail].next = i;
    else x->age.head = i;
    x->age.tail = i;
}

static void pending_unlink(PrefixIndex *x, int32_t i) {
    Entry *e = &x->e[i];

    if (e->pprev >= 0) x->e[e->pprev].pnext = e->pnext;
    else x->pending.head = e->pnext;
    if (e->pnext >= 0) x->e[e->pnext].pprev = e->pprev;
    else x->pending.tail = e->pprev;
    e->pprev = e->pnext = -1;
}

static void pending_append(PrefixIndex *x, int32_t i) {
    Entry *e = &x->e[i];

    e->pprev = x->pending.tail;
    e->pnext = -1;
    if (x->pending.tail >= 0) x->e[x->pending.tail].pnext = i;
    else x->pending.head = i;
    x->pending.tail = i;
}

static int32_t *bucket(PrefixIndex *x, OmniPkey k) {
    return &x->buckets[k.lo & x->mask];
}

static int32_t find(PrefixIndex *x, OmniPkey k) {
    for (int32_t i = *bucket(x, k); i >= 0; i = x->e[i].hnext) {
        if (x->e[i].key.hi == k.hi && x->e[i].key.lo == k.lo) return i;
    }
    return -1;
}


/* ---- Setup -------------------------------------------------------------- */

PrefixIndex *pidx_new(int64_t cap, PidxOpFn *fn, void *ud, Err *err) {
    PrefixIndex *x;

    if (cap < 1 || cap > INT32_MAX / 2) {
        err_set(err, "prefix index: %" PRId64 " entries is out of range",
                cap);
        return NULL;
    }
    x = calloc(1, sizeof(*x));
    if (x == NULL) goto oom;
    x->mask = 1;
    while ((int64_t) x->mask < cap) x->mask *= 2;
    x->e = calloc((size_t) cap, sizeof(Entry));
    x->buckets = malloc((size_t) x->mask * sizeof(int32_t));
    if (x->e == NULL || x->buckets == NULL) goto oom;
    for (uint64_t b = 0; b < x->mask; b++) x->buckets[b] = -1;
    x->mask--;
    for (int64_t i = 0; i < cap; i++) {
        x->e[i].next = i + 1 < cap ? (int32_t) (i + 1) : -1;
    }
    x->cap = cap;
    x->free = 0;
    x->age = (List) { -1, -1 };
    x->pending = (List) { -1, -1 };
    x->fn = fn;
    x->ud = ud;
    return x;

oom:
    pidx_free(x);
    err_set(err, "out of memory for a prefix index of %" PRId64 " entries",
            cap);
    return NULL;
}

void pidx_free(PrefixIndex *x) {
    if (x == NULL) return;
    free(x->e);
    free(x->buckets);
    free(x);
}


/* ---- Entries ------------------------------------------------------------ */

static void send(PrefixIndex *x, PidxOp op, const Entry *e) {
    if (op == PIDX_SET) x->counts.published++;
    else x->counts.removed++;
    x->fn(x->ud, op, e->key, e->tokens);
}

/* Takes entry i out of everything (a held one with a DEL) and frees it. */
static void drop(PrefixIndex *x, int32_t i) {
    Entry   *e = &x->e[i];
    int32_t *link = bucket(x, e->key);

    if (e->state == E_HELD) {
        send(x, PIDX_DEL, e);
        x->counts.held--;
    } else {
        pending_unlink(x, i);
        x->counts.pending--;
    }
    while (*link != i) link = &x->e[*link].hnext;
    *link = e->hnext;
    age_unlink(x, i);
    e->state = E_FREE;
    e->next = x->free;
    x->free = i;
}

/* A free entry for k, pending: the oldest entry goes when none is free. */
static int32_t take(PrefixIndex *x, OmniPkey k) {
    int32_t i, *head;

    if (x->free < 0) drop(x, x->age.head);
    i = x->free;
    x->free = x->e[i].next;
    head = bucket(x, k);
    x->e[i].key = k;
    x->e[i].hnext = *head;
    *head = i;
    x->e[i].state = E_PENDING;
    pending_append(x, i);
    age_append(x, i);
    x->counts.pending++;
    return i;
}

void pidx_add(PrefixIndex *x, uint64_t req, const PrefixKey *keys, int n,
              double now)
{
    for (int k = 0; k < n; k++) {
        int32_t i = find(x, keys[k].key);
        Entry  *e;

        if (i < 0) {
            i = take(x, keys[k].key);
        } else {
            age_unlink(x, i);
            age_append(x, i);
        }
        e = &x->e[i];
        e->seen = now;
        if (e->state == E_PENDING) {
            e->anchor = keys[k].anchor;
            e->tokens = keys[k].tokens;
            e->req = req;
            e->ended = false;
        }
    }
}

void pidx_end(PrefixIndex *x, uint64_t req) {
    for (int32_t i = x->pending.head; i >= 0; i = x->e[i].pnext) {
        if (x->e[i].req == req) x->e[i].ended = true;
    }
}


/* ---- Sync --------------------------------------------------------------- */

/* Pending entries whose anchor is published become held; those that
 * will never be (request over) or waited too long go. */
static void sync_pending(PrefixIndex *x, const KVCache *kv, double now) {
    int32_t i = x->pending.head, next;

    for (; i >= 0; i = next) {
        Entry *e = &x->e[i];

        next = e->pnext;
        if (kv_find(kv, e->anchor) >= 0) {
            pending_unlink(x, i);
            e->state = E_HELD;
            x->counts.pending--;
            x->counts.held++;
            send(x, PIDX_SET, e);
        } else if (e->ended || now - e->seen > PIDX_PENDING_MAX_S) {
            drop(x, i);
        }
    }
}

/* Held entries whose anchor is gone go, with a DEL. */
static void sync_held(PrefixIndex *x, const KVCache *kv) {
    int32_t i = x->age.head, next;

    for (; i >= 0; i = next) {
        next = x->e[i].next;
        if (x->e[i].state == E_HELD && kv_find(kv, x->e[i].anchor) < 0) {
            drop(x, i);
        }
    }
}

void pidx_sync(PrefixIndex *x, const KVCache *kv, double now) {
    if (kv->unpublished != x->unpublished) {
        sync_held(x, kv);
        x->unpublished = kv->unpublished;
    }
    sync_pending(x, kv, now);
}

void pidx_resend(const PrefixIndex *x) {
    for (int32_t i = x->age.head; i >= 0; i = x->e[i].next) {
        if (x->e[i].state == E_HELD) {
            x->fn(x->ud, PIDX_SET, x->e[i].key, x->e[i].tokens);
        }
    }
}

void pidx_counts(const PrefixIndex *x, PidxCounts *c) {
    *c = x->counts;
}

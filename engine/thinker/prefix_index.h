/* prefix_index.h -- which prefix keys (proto/prefix_key.h) the thinker's
 * KV cache holds: the index the publisher (prefix_pub.h) mirrors to Redis.
 *
 * Each entry is a key, its anchor (the chain hash of the last KV block of
 * the prefix it names, llm/prefix_keys.h), the tokens it names, and a
 * state:
 *
 *   pending   added by a request at submit; its blocks are not computed
 *             (or not known to be) yet
 *   held      its anchor block is published in the KV cache: a SET went
 *             out for it
 *
 * and the index moves them along in pidx_sync, which the thinker calls
 * between steps (rate-limited):
 *
 *   pending -> held    the anchor is published now          SET
 *   held -> gone       the anchor is no longer published    DEL
 *                      (checked only when the cache's unpublished counter
 *                      moved: without evictions nothing held can go)
 *   pending -> gone    its request ended and the anchor is not published
 *                      (the prompt never ran, or was evicted already), or
 *                      it waited PIDX_PENDING_MAX_S
 *
 * A full table makes room by dropping its oldest entry (by last seen:
 * added, or added again by a later request), with a DEL if it was held.
 *
 * Operations go out through a callback as they are decided, in order. The
 * index never fails and never allocates after pidx_new: cap entries and a
 * power-of-two bucket array, about 80 bytes an entry. Single-threaded:
 * the stage's main thread calls everything. */

#ifndef OMNI_PREFIX_INDEX_H
#define OMNI_PREFIX_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_cache.h"
#include "log.h"
#include "prefix_keys.h"

#define PIDX_PENDING_MAX_S 120.0    // a pending key waits this long at most

typedef enum { PIDX_SET, PIDX_DEL } PidxOp;

/* Where operations go: op, the key, and for a SET the tokens it names. */
typedef void PidxOpFn(void *ud, PidxOp op, OmniPkey key, int32_t tokens);

typedef struct PrefixIndex PrefixIndex;

typedef struct {
    int64_t  held;              // entries held now
    int64_t  pending;           // entries pending now
    uint64_t published;         // SETs sent so far
    uint64_t removed;           // DELs sent so far
} PidxCounts;

/* An index of cap entries (>= 1) sending its operations to fn(ud, ...).
 * Returns NULL with err set when memory runs out. */
PrefixIndex *pidx_new(int64_t cap, PidxOpFn *fn, void *ud, Err *err);
void         pidx_free(PrefixIndex *x);

/* Request req's keys (n of them, prefix_keys.h) are pending from now
 * (seconds, a monotonic clock): new ones are added, those already there
 * are seen again (their age starts over; a pending one takes req and the
 * anchor given). */
void pidx_add(PrefixIndex *x, uint64_t req, const PrefixKey *keys, int n,
              double now);

/* Request req ended (finished, failed or cancelled): its pending keys go
 * at the next pidx_sync unless their anchor is published by then. */
void pidx_end(PrefixIndex *x, uint64_t req);

/* Moves entries along against kv (see the top). O(pending), plus
 * O(entries) when kv->unpublished moved since the last call. */
void pidx_sync(PrefixIndex *x, const KVCache *kv, double now);

/* Sends a SET for every held entry again, oldest first: after the
 * publisher lost operations (its queue was full), it starts its mirror
 * over from these. */
void pidx_resend(const PrefixIndex *x);

void pidx_counts(const PrefixIndex *x, PidxCounts *c);

#endif

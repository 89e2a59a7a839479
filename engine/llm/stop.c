/* stop.c -- stop strings over streamed text; the contract is in stop.h.
 *
 * Each feed works on held + new text, assembled in the caller's out buffer
 * (the contract cap >= len + STOP_MAX_LEN makes room, since the held tail is
 * shorter than STOP_MAX_LEN), so no buffer of our own grows with the input.
 * Then, in that text:
 *
 *   1. the stop string that completes first ends the stream: the text
 *      before it is released, the rest dropped. "First" is by end
 *      position, as if the text had arrived byte by byte, so the result
 *      does not depend on how the text was cut into pieces: with stops
 *      "abcd" and "bc", "abcd" releases "a" whether it comes whole or not.
 *      Two stops completing at the same byte: the longer one wins.
 *   2. otherwise the earliest position from which the rest of the text is a
 *      proper prefix of some stop string starts the held tail; everything
 *      before it is released. No stop string can begin before that point:
 *      it would be a full match (step 1) or a prefix (this step).
 *
 * The held tail is therefore shorter than the longest stop string. Cost per
 * feed: memmem per stop string over the text, plus at most
 * (longest stop) * (stops) prefix comparisons for the tail, most of which
 * fail on their first byte. */

#include <assert.h>
#include <string.h>

#include "stop.h"


int stop_init(StopMatcher *m, const char *const *strs, int n, Err *err) {
    memset(m, 0, sizeof(*m));
    if (n < 0 || n > STOP_MAX) {
        return err_set(err, "stop: at most %d sequences, got %d",
                       STOP_MAX, n);
    }
    for (int i = 0; i < n; i++) {
        size_t len = strs != NULL && strs[i] != NULL ? strlen(strs[i]) : 0;

        if (len == 0) {
            return err_set(err, "stop: sequence %d is empty", i);
        }
        if (len > STOP_MAX_LEN - 1) {
            return err_set(err, "stop: sequence %d is %zu bytes, at most %d",
                           i, len, STOP_MAX_LEN - 1);
        }
        memcpy(m->str[i], strs[i], len + 1);
        m->len[i] = len;
    }
    m->n = n;
    return 0;
}

/* Where the text to release ends, when a stop string occurs in t[0..n):
 * the start of the stop string that completes first, the longer one when
 * two complete at the same byte; n when none occurs. */
static size_t find_full(const StopMatcher *m, const char *t, size_t n) {
    size_t best = n, best_end = n + 1;

    for (int i = 0; i < m->n; i++) {
        const char *p = memmem(t, n, m->str[i], m->len[i]);
        size_t      at, end;

        if (p == NULL) continue;
        at = (size_t) (p - t);
        end = at + m->len[i];
        if (end < best_end || (end == best_end && at < best)) {
            best = at;
            best_end = end;
        }
    }
    return best;
}

/* Start of the earliest tail of t[0..n) that is a proper prefix of some
 * stop string, or n when no stop string can begin in t. */
static size_t find_partial(const StopMatcher *m, const char *t, size_t n) {
    size_t longest = 0;

    for (int i = 0; i < m->n; i++) {
        if (m->len[i] > longest) longest = m->len[i];
    }
    for (size_t j = n > longest ? n - longest + 1 : 0; j < n; j++) {
        for (int i = 0; i < m->n; i++) {
            if (n - j < m->len[i] && memcmp(t + j, m->str[i], n - j) == 0) {
                return j;
            }
        }
    }
    return n;
}

size_t stop_feed(StopMatcher *m, const char *text, size_t len, char *out,
                 size_t cap) {
    size_t n, cut;

    if (m->stopped) return 0;

    /* caller contract, see stop.h; held text is < STOP_MAX_LEN bytes */
    assert(cap >= m->n_held + len);
    memcpy(out, m->held, m->n_held);
    if (len > 0) memcpy(out + m->n_held, text, len);
    n = m->n_held + len;
    m->n_held = 0;

    cut = find_full(m, out, n);
    if (cut < n) {
        m->stopped = true;
        return cut;
    }
    cut = find_partial(m, out, n);
    m->n_held = n - cut;
    memcpy(m->held, out + cut, m->n_held);
    return cut;
}

size_t stop_flush(StopMatcher *m, char *out, size_t cap) {
    size_t n = m->n_held;

    if (m->stopped) return 0;
    assert(cap >= n);
    memcpy(out, m->held, n);
    m->n_held = 0;
    return n;
}

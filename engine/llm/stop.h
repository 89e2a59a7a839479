/* stop.h -- stop strings over streamed text.
 *
 * Generated text arrives in pieces; a stop string may span pieces. The
 * matcher releases text only when no stop string can still begin inside it,
 * so a stop string is never emitted, not even its first bytes, and text
 * that turned out not to be a stop is released unchanged and in order. The
 * held-back tail is bounded by the longest stop string. The stream ends at
 * the first byte that completes a stop string, so the result does not
 * depend on how the text is cut into pieces.
 *
 * Text is UTF-8; a release never splits a character (held text ends at
 * character boundaries because stop strings are whole UTF-8 strings and the
 * input comes from the detokenizer, which emits whole characters). */

#ifndef OMNI_STOP_H
#define OMNI_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "log.h"
#include "params.h"


typedef struct {
    int    n;                               // stop strings
    char   str[STOP_MAX][STOP_MAX_LEN];
    size_t len[STOP_MAX];
    char   held[STOP_MAX_LEN];              // text not yet released
    size_t n_held;
    bool   stopped;                         // a stop string matched
} StopMatcher;

/* Sets up the matcher for n stop strings (copied; strs may be freed after).
 * n == 0 is valid: everything is released as it arrives. Returns 0, or -1
 * with err naming the `stop` parameter when there are too many strings, one
 * is empty, or one is longer than STOP_MAX_LEN - 1 bytes. */
int    stop_init(StopMatcher *m, const char *const *strs, int n, Err *err);

/* Feeds len bytes of new text. Writes the text that is now safe to emit to
 * out (cap >= len + STOP_MAX_LEN; a smaller buffer is a caller bug) and
 * returns its length. Once a stop string matches, m->stopped is set, the
 * text before it is released and everything after is discarded; later
 * feeds return 0. Never allocates. Can't fail. */
size_t stop_feed(StopMatcher *m, const char *text, size_t len, char *out,
                 size_t cap);

/* End of stream without a stop: writes the held tail to out
 * (cap >= STOP_MAX_LEN) and returns its length; 0 after a stop. Can't
 * fail. */
size_t stop_flush(StopMatcher *m, char *out, size_t cap);

#endif

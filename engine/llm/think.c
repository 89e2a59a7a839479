/* think.c -- the reasoning splitter; see think.h.
 *
 * A byte at a time, a switch over the state: the input is a token's text,
 * a few bytes, so a byte loop costs nothing next to the forward pass, and
 * it makes tags cut across tokens the same case as tags within one.
 * Output collects in the caller's scratch as one run of one kind; the run
 * goes out when the kind changes and at the end of the feed. Everything
 * emitted was either in the input or in the hold, so a run never exceeds
 * n + THINK_HOLD bytes. */

#include <string.h>

#include "think.h"

#define TAG_OPEN   "<think>"
#define TAG_CLOSE  "</think>"

typedef struct {
    char        *buf;       // scratch, the caller's
    size_t       len;       // bytes of the current run
    TextKind     kind;
    ThinkEmitFn  emit;
    void        *ud;
    int          rc;        // the first nonzero emit return
} Run;

static void run_flush(Run *r) {
    if (r->len > 0 && r->rc == 0) r->rc = r->emit(r->ud, r->kind, r->buf,
                                                  r->len);
    r->len = 0;
}

static void run_put(Run *r, TextKind kind, const char *s, size_t n) {
    if (n == 0) return;
    if (r->kind != kind) {
        run_flush(r);
        r->kind = kind;
    }
    memcpy(r->buf + r->len, s, n);
    r->len += n;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

void think_start(ThinkSplit *t, bool on) {
    memset(t, 0, sizeof(*t));
    t->st = on ? THINK_OPEN : THINK_OFF;
}

/* OPEN: hold what may still be <think>. */
static void feed_open(ThinkSplit *t, Run *r, char c) {
    t->hold[t->n_hold++] = c;
    if (memcmp(t->hold, TAG_OPEN, (size_t) t->n_hold) != 0) {
        run_put(r, TEXT_CONTENT, t->hold, (size_t) t->n_hold);
        t->n_hold = 0;
        t->n_open = 0;
        t->st = THINK_CONTENT;
    } else if (t->n_hold == (int) strlen(TAG_OPEN)) {
        t->n_hold = 0;
        t->n_reasoning += t->n_open;
        t->n_open = 0;
        t->touched = true;
        t->lead = true;
        t->st = THINK_IN;
    }
}

/* IN: the held whitespace and partial tag are reasoning after all (the
 * whitespace only when some reasoning was out before it). */
static void release_hold(ThinkSplit *t, Run *r) {
    if (!t->lead) run_put(r, TEXT_REASONING, t->hold, (size_t) t->n_ws);
    if (t->n_hold > t->n_ws) {
        run_put(r, TEXT_REASONING, t->hold + t->n_ws,
                (size_t) (t->n_hold - t->n_ws));
        t->lead = false;
    }
    t->n_hold = t->n_ws = 0;
}

/* IN: hold whitespace and what may be </think>; drop both at </think>. */
static void feed_in(ThinkSplit *t, Run *r, char c) {
    int ntag = t->n_hold - t->n_ws;

    if (ntag > 0) {
        if (c == TAG_CLOSE[ntag]) {
            t->hold[t->n_hold++] = c;
            if (ntag + 1 == (int) strlen(TAG_CLOSE)) {
                t->n_hold = t->n_ws = 0;
                t->st = THINK_AFTER;
            }
            return;
        }
        release_hold(t, r);             // not the tag: text, then c anew
    }
    if (c == '<') {
        t->hold[t->n_hold++] = c;
    } else if (is_ws(c)) {
        if (t->n_hold + (int) strlen(TAG_CLOSE) >= THINK_HOLD) {
            release_hold(t, r);         // a long run: passed on
        }
        t->hold[t->n_hold++] = c;
        t->n_ws++;
    } else {
        release_hold(t, r);
        run_put(r, TEXT_REASONING, &c, 1);
        t->lead = false;
    }
}

int think_feed(ThinkSplit *t, const char *s, size_t n, char *scratch,
               ThinkEmitFn emit, void *ud)
{
    Run r = { scratch, 0, TEXT_CONTENT, emit, ud, 0 };

    if (t->st == THINK_IN) t->touched = true;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];

        switch (t->st) {
        case THINK_OPEN:
            feed_open(t, &r, c);
            break;
        case THINK_IN:
            feed_in(t, &r, c);
            break;
        case THINK_AFTER:
            if (c == '\n') break;
            t->st = THINK_CONTENT;
            run_put(&r, TEXT_CONTENT, &c, 1);
            break;
        case THINK_OFF:
        case THINK_CONTENT:
            run_put(&r, TEXT_CONTENT, s + i, n - i);   // the rest, at once
            i = n;
            break;
        }
    }
    run_flush(&r);
    return r.rc;
}

int think_flush(ThinkSplit *t, char *scratch, ThinkEmitFn emit, void *ud) {
    Run r = { scratch, 0, TEXT_CONTENT, emit, ud, 0 };

    if (t->st == THINK_OPEN) {
        run_put(&r, TEXT_CONTENT, t->hold, (size_t) t->n_hold);
        t->st = THINK_CONTENT;
    } else if (t->st == THINK_IN && t->n_hold > t->n_ws) {
        release_hold(t, &r);            // a partial tag is text after all
    }
    t->n_hold = t->n_ws = 0;
    run_flush(&r);
    return r.rc;
}

void think_token(ThinkSplit *t) {
    if (t->touched) {
        t->n_reasoning++;
    } else if (t->st == THINK_OPEN) {
        t->n_open++;
    }
    t->touched = t->st == THINK_IN;
}

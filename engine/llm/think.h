/* think.h -- splits a thinking model's output into reasoning and answer.
 *
 * A thinking chat template (Qwen3's, chat.h) makes the model open its
 * answer with its reasoning between tags:
 *
 *   <think>\nLet me see... 2 + 2 is 4.\n</think>\n\nThe answer is 4.
 *
 * The splitter reads that text as it streams, in pieces cut anywhere (a tag
 * may come in several tokens, or share one with text), and passes it on as
 * runs of one kind: reasoning (the text between the tags, without the
 * whitespace that opens and closes it) and content (what follows
 * </think>, without its leading newlines). Only a leading <think> opens
 * reasoning: output that starts otherwise is all content, as is
 * everything after the first </think>. A sequence that ends while
 * reasoning (max_tokens) leaves everything it said in reasoning.
 *
 * To see a tag or the whitespace before </think> through a cut, the
 * splitter holds a few bytes back (at most THINK_HOLD); the runs it emits
 * are the input's bytes minus the tags and the whitespace named above, in
 * order, so no UTF-8 character is ever split (tags and whitespace are
 * ASCII). A run of whitespace inside the reasoning longer than the hold is
 * passed on in pieces and so is kept even when </think> follows it.
 *
 * It also counts the tokens spent reasoning: call think_token once after
 * each token's text was fed. A token counts when the splitter was inside
 * the reasoning at any point of its text, so the ones that spell <think>
 * and </think> count; tokens fed before a leading "<th..." is decided
 * count once it proves to be <think>.
 *
 * Nothing is allocated; a ThinkSplit is plain state. */

#ifndef OMNI_THINK_H
#define OMNI_THINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define THINK_HOLD  64          // bytes held back at most

typedef enum {
    TEXT_CONTENT = 0,           // the answer
    TEXT_REASONING = 1,         // the model's reasoning
} TextKind;

/* Receives one run; a nonzero return is passed back to the feeder. */
typedef int (*ThinkEmitFn)(void *ud, TextKind kind, const char *text,
                           size_t len);

typedef enum {
    THINK_OFF = 0,              // not splitting: everything is content
    THINK_OPEN,                 // nothing decided: is it <think>?
    THINK_IN,                   // inside the reasoning
    THINK_AFTER,                // after </think>: newlines dropped
    THINK_CONTENT,              // the answer
} ThinkState;

typedef struct {
    ThinkState st;
    char       hold[THINK_HOLD];    // bytes held back: in OPEN a prefix of
                                    //   <think>; in IN whitespace then a
                                    //   prefix of </think>
    int        n_hold;
    int        n_ws;                // in IN: of hold, the whitespace
    bool       lead;                // in IN: no reasoning out yet
    bool       touched;             // this token's text was in reasoning
    int64_t    n_open;              // tokens fed in OPEN, undecided
    int64_t    n_reasoning;         // tokens that were reasoning
} ThinkSplit;

/* Readies t for a new sequence: splitting when on, else everything is
 * content. Can't fail. */
void think_start(ThinkSplit *t, bool on);

/* Feeds n bytes of output. Calls emit for each run, in order, with bytes
 * copied into scratch (at least n + THINK_HOLD bytes, the caller's); a run
 * is never empty. Returns 0, or the first nonzero emit return (the rest of
 * the input is then still consumed, its runs not emitted). */
int  think_feed(ThinkSplit *t, const char *s, size_t n, char *scratch,
                ThinkEmitFn emit, void *ud);

/* Ends the output: emits what is held back (a partial tag is text after
 * all; whitespace that would have closed the reasoning is dropped). Call
 * once, after the last feed. scratch as think_feed's with n = 0. */
int  think_flush(ThinkSplit *t, char *scratch, ThinkEmitFn emit, void *ud);

/* Counts the token whose text (possibly none) was just fed. Can't fail. */
void think_token(ThinkSplit *t);

#endif

/* decode.h -- one decode step: what a sequence does with its logits.
 *
 *   sample -> end of generation (an EOS token ends the sequence unless
 *   ignored; it is not taken, not counted) -> accept (penalties) ->
 *   detokenize (whole UTF-8 characters only) -> stop strings -> reasoning
 *   split (think.h, when asked) -> emit -> limits (max_tokens, a full
 *   context)
 *
 * and, once the sequence has ended, the tail: the bytes the detokenizer and
 * the stop matcher still hold back. The `generate` CLI (one sequence) and
 * the serving scheduler (many, batched) both run exactly this code, so
 * their text agrees by construction; before it existed the two kept the
 * same checks in step by comment.
 *
 * A Decoder is one sequence's state. decode_init allocates everything it
 * will ever need (the sampler's scratch, sized to the vocabulary, and the
 * text scratch); decode_start readies it for a new sequence without
 * allocating, so a scheduler keeps one per slot and the step loop never
 * allocates. Text goes out through a callback, called only with n > 0
 * bytes, valid for the call only, each run marked as content or reasoning
 * (always content unless the sequence splits reasoning). Stop strings
 * match the text before the split: a stop string inside the reasoning
 * ends the sequence there. */

#ifndef OMNI_DECODE_H
#define OMNI_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "params.h"
#include "sampler.h"
#include "stop.h"
#include "think.h"
#include "tokenizer.h"

/* One token's text plus what the detokenizer may hold back. The
 * detokenizer drops characters that do not fit whole, so this cap is part
 * of the output's definition: every decoder uses this one. */
#define DECODE_PIECE_CAP  (4096 + STOP_MAX_LEN)

/* What the step decided. Every value but DECODE_MORE ends the sequence. */
typedef enum {
    DECODE_MORE,        // the token was taken; run it and decode the next
    DECODE_EOS,         // end of generation: the token is not taken
    DECODE_STOP,        // a stop string matched (the token is taken)
    DECODE_CANCEL,      // the emit callback asked to stop (token taken)
    DECODE_LENGTH       // max_tokens, or no room left to run the token
} DecodeEnd;

/* Receives generated text of one kind; a nonzero return cancels the
 * sequence. */
typedef ThinkEmitFn DecodeEmitFn;

typedef struct {
    int64_t max_tokens;     // tokens to take at most; -1: no limit but
                            //   the context
    int64_t n_ctx;          // prompt + taken tokens the sequence may run;
                            //   the token that would sit at position n_ctx
                            //   is taken and emitted, then ends it
    bool    ignore_eos;     // take end-of-generation tokens as text
    bool    think;          // split a leading <think>...</think> off as
                            //   reasoning (think.h)
} DecodeLimits;

typedef struct {
    const Tokenizer *tk;        // borrowed
    Sampler          smp;       // its scratch owned, from decode_init
    Detok            detok;
    StopMatcher      stop;      // a copy of decode_start's
    DecodeLimits     lim;
    int64_t          n_prompt;
    int64_t          n_gen;     // tokens taken so far
    char            *piece;     // (DECODE_PIECE_CAP,) detokenizer output,
                                //   owned
    char            *text;      // (DECODE_PIECE_CAP + STOP_MAX_LEN,) stop
                                //   matcher output, owned
    ThinkSplit       think;     // reasoning split; its n_reasoning counts
    char            *split;     // (DECODE_PIECE_CAP + STOP_MAX_LEN +
                                //   THINK_HOLD,) its runs, owned
} Decoder;

/* Allocates d's scratch for a vocabulary of n_vocab tokens; tk is borrowed
 * and must outlive d. Returns 0, or -1 with err set (out of memory); on
 * failure d owns nothing. Release with decode_free. */
int       decode_init(Decoder *d, const Tokenizer *tk, int32_t n_vocab,
                      Err *err);

/* Frees d's scratch. Safe on a zeroed or already freed Decoder. */
void      decode_free(Decoder *d);

/* Readies d for a new sequence of n_prompt prompt tokens: sampler
 * reseeded with sp (copied), stop a validated matcher (stop_init; copied),
 * detokenizer and counts cleared. Allocates nothing. Returns 0, or -1 with
 * err naming the bad sampling parameter, d's sampler then unchanged. */
int       decode_start(Decoder *d, const SamplerParams *sp,
                       const StopMatcher *stop, const DecodeLimits *lim,
                       int64_t n_prompt, Err *err);

/* The step after sampling: decides what token tok (already sampled from
 * d->smp) does to the sequence, in the order at the top of this file, and
 * emits the text it completes. *tok* is taken (counted, accepted by the
 * sampler) unless the result is DECODE_EOS. Never allocates. Can't fail. */
DecodeEnd decode_take(Decoder *d, int32_t tok, DecodeEmitFn emit, void *ud);

/* The whole step: samples from logits (n_vocab,; modified in place, see
 * sampler_sample), stores the token in *tok and returns decode_take's
 * verdict. Never allocates. Can't fail. */
DecodeEnd decode_token(Decoder *d, float *logits, int32_t *tok,
                       DecodeEmitFn emit, void *ud);

/* Ends the sequence's text: emits what the detokenizer and the stop matcher
 * still hold, unless a stop string ended it, then what the reasoning split
 * holds (think_flush). Call once, after the step
 * that did not return DECODE_MORE (or when the caller stops early). Never
 * allocates. Can't fail; emit's return is ignored. */
void      decode_finish(Decoder *d, DecodeEmitFn emit, void *ud);

#endif

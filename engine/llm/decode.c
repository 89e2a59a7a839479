/* decode.c -- one decode step; see decode.h.
 *
 * The order of the checks is the contract both callers rely on: an
 * end-of-generation token ends the sequence before it is counted; any
 * other token is counted and streamed first, and only then may a stop
 * string, the token limit or a full context end the sequence (so the last
 * token's text is out before the verdict). */

#include <stdlib.h>
#include <string.h>

#include "decode.h"

#define DECODE_TEXT_CAP  (DECODE_PIECE_CAP + STOP_MAX_LEN)  // stop_feed's
                                                            //   out cap


int decode_init(Decoder *d, const Tokenizer *tk, int32_t n_vocab, Err *err)
{
    SamplerParams def;

    memset(d, 0, sizeof(*d));
    d->tk = tk;
    sampler_params_default(&def);
    if (sampler_init(&d->smp, &def, n_vocab, err) != 0) return -1;
    d->piece = malloc(DECODE_PIECE_CAP);
    d->text = malloc(DECODE_TEXT_CAP);
    d->split = malloc(DECODE_TEXT_CAP + THINK_HOLD);
    if (d->piece == NULL || d->text == NULL || d->split == NULL) {
        decode_free(d);
        return err_set(err, "out of memory");
    }
    return 0;
}

void decode_free(Decoder *d) {
    sampler_free(&d->smp);
    free(d->piece);
    free(d->text);
    free(d->split);
    d->piece = d->text = d->split = NULL;
}

int decode_start(Decoder *d, const SamplerParams *sp, const StopMatcher *stop,
                 const DecodeLimits *lim, int64_t n_prompt, Err *err)
{
    if (sampler_set_params(&d->smp, sp, err) != 0) return -1;
    detok_init(&d->detok);
    d->stop = *stop;
    d->lim = *lim;
    d->n_prompt = n_prompt;
    d->n_gen = 0;
    think_start(&d->think, lim->think);
    return 0;
}

DecodeEnd decode_take(Decoder *d, int32_t tok, DecodeEmitFn emit, void *ud)
{
    size_t n;
    int    rc;

    if (!d->lim.ignore_eos && tokenizer_is_eog(d->tk, tok)) return DECODE_EOS;
    sampler_accept(&d->smp, tok);
    d->n_gen++;
    n = detok_push(&d->detok, d->tk, tok, d->piece, DECODE_PIECE_CAP);
    n = stop_feed(&d->stop, d->piece, n, d->text, DECODE_TEXT_CAP);
    rc = n > 0 ? think_feed(&d->think, d->text, n, d->split, emit, ud) : 0;
    think_token(&d->think);
    if (rc != 0) return DECODE_CANCEL;
    if (d->stop.stopped) return DECODE_STOP;
    if ((d->lim.max_tokens >= 0 && d->n_gen >= d->lim.max_tokens)
        || d->n_prompt + d->n_gen > d->lim.n_ctx)
    {
        return DECODE_LENGTH;
    }
    return DECODE_MORE;
}

DecodeEnd decode_token(Decoder *d, float *logits, int32_t *tok,
                       DecodeEmitFn emit, void *ud)
{
    *tok = sampler_sample(&d->smp, logits);
    return decode_take(d, *tok, emit, ud);
}

void decode_finish(Decoder *d, DecodeEmitFn emit, void *ud) {
    size_t n = 0;

    if (!d->stop.stopped) {
        n = detok_flush(&d->detok, d->piece, DECODE_PIECE_CAP);
        n = stop_feed(&d->stop, d->piece, n, d->text, DECODE_TEXT_CAP);
        if (!d->stop.stopped) {
            n += stop_flush(&d->stop, d->text + n, DECODE_TEXT_CAP - n);
        }
    }
    if (n > 0) think_feed(&d->think, d->text, n, d->split, emit, ud);
    think_flush(&d->think, d->split, emit, ud);
}

/* asr_ps.c -- asr.h with pocketsphinx (5prealpha, Debian's): the en-US
 * acoustic model, its general trigram language model and the CMU
 * dictionary, continuous decoding with pocketsphinx's own voice activity
 * detection.
 *
 * Settings, measured on the test recordings (JFK's 11 s, pocketsphinx-
 * testdata's LibriVox sentences; README, "Audio in"): an utterance ends
 * after a second of silence (-vad_postspeech 100 frames; the default half
 * second cut JFK's phrases in two and raised its word error rate from 41%
 * to 55%, since the language model then loses the words before the cut);
 * everything else is pocketsphinx's default.
 *
 * Dither: pocketsphinx's features degenerate on runs of exact zeros (the
 * log of a zero energy), which synthesized speech and digital silence
 * have. pocketsphinx's own -dither draws from sphinxbase's generator,
 * which is one global state: shared by every decoder of the process and
 * carried from one request to the next, so the same audio would not give
 * the same words. We add our own instead: +-1 LSB from a generator reset
 * at every stream, so a stream's words depend on its audio only. For
 * the same reason every stream starts from the cepstral mean the models
 * loaded with: pocketsphinx adapts it utterance by utterance and keeps
 * it from one stream to the next (the same file twice gave different
 * words). */

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pocketsphinx.h>
#include <sphinxbase/cmn.h>
#include <sphinxbase/feat.h>

#include "asr.h"

#define PIECE       4096        // samples dithered and fed at once

struct Asr {
    ps_decoder_t *ps;           // owned
    cmd_ln_t     *cfg;          // owned
    logmath_t    *lmath;        // borrowed from ps
    double        frate;        // frames per second (-frate)
    cmn_t        *cmn;          // borrowed from ps: the live cepstral
                                //   mean; as it was after loading:
    mfcc_t       *cmn0;         //   its mean and sum, (2 * veclen,),
    int32         cmn0_frames;  //   owned, and its frame count
    bool          open;         // an utterance is started
    bool          in_utt;       // speech seen since the utterance began
    uint64_t      utt_samples;  // samples fed since then
    uint32_t      rng;          // the dither's state
    int16_t       buf[PIECE];   // dithered samples
    AsrWord       words[ASR_MAX_WORDS];
    char          desc[320];
};


/* ---- Models ------------------------------------------------------------- */

/* dir/name, checked to exist; into out (cap bytes). */
static int model_file(const char *dir, const char *name, char *out,
                      size_t cap, Err *err)
{
    if ((size_t) snprintf(out, cap, "%s/%s", dir, name) >= cap) {
        return err_set(err, "model path too long: %s/%s", dir, name);
    }
    if (access(out, R_OK) != 0) {
        return err_set(err, "pocketsphinx model file %s is missing or "
                       "unreadable (install pocketsphinx-en-us, or give "
                       "--listener-model DIR)", out);
    }
    return 0;
}

Asr *asr_new(const AsrConfig *cfg, Err *err) {
    const char *dir = cfg->model_dir != NULL ? cfg->model_dir
                                             : ASR_DEFAULT_MODEL;
    char        hmm[256], lm[256], dict[256];
    Asr        *a;

    if (model_file(dir, "en-us", hmm, sizeof(hmm), err) != 0
        || model_file(dir, "en-us.lm.bin", lm, sizeof(lm), err) != 0
        || model_file(dir, "cmudict-en-us.dict", dict, sizeof(dict), err)
        != 0)
        return NULL;
    if ((a = calloc(1, sizeof(*a))) == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    a->cfg = cmd_ln_init(NULL, ps_args(), TRUE, "-hmm", hmm, "-lm", lm,
                         "-dict", dict, "-vad_postspeech", "100",
                         "-logfn", "/dev/null", NULL);
    if (a->cfg == NULL || (a->ps = ps_init(a->cfg)) == NULL) {
        err_set(err, "pocketsphinx could not load the models in %s", dir);
        asr_free(a);
        return NULL;
    }
    a->lmath = ps_get_logmath(a->ps);
    a->cmn = ps_get_feat(a->ps)->cmn_struct;
    if (a->cmn != NULL) {
        size_t n = (size_t) a->cmn->veclen;

        if ((a->cmn0 = calloc(2 * n, sizeof(mfcc_t))) == NULL) {
            err_set(err, "out of memory");
            asr_free(a);
            return NULL;
        }
        memcpy(a->cmn0, a->cmn->cmn_mean, n * sizeof(mfcc_t));
        memcpy(a->cmn0 + n, a->cmn->sum, n * sizeof(mfcc_t));
        a->cmn0_frames = a->cmn->nframe;
    }
    a->frate = (double) cmd_ln_int32_r(a->cfg, "-frate");
    if (a->frate <= 0) a->frate = 100;
    snprintf(a->desc, sizeof(a->desc), "pocketsphinx en-us (%s)", dir);
    return a;
}

const char *asr_describe(const Asr *a) {
    return a->desc;
}

void asr_free(Asr *a) {
    if (a == NULL) return;
    if (a->ps != NULL) ps_free(a->ps);
    if (a->cfg != NULL) cmd_ln_free_r(a->cfg);
    free(a->cmn0);
    free(a);
}


/* ---- Utterances --------------------------------------------------------- */

/* A dictionary word without its pronunciation variant ("read(2)"), or
 * NULL for a filler (<s>, </s>, <sil>, [NOISE], ...). */
static const char *word_of(const char *w, char *out) {
    size_t n;

    if (w == NULL || w[0] == '<' || w[0] == '[' || w[0] == '+') return NULL;
    n = strcspn(w, "(");
    if (n == 0) return NULL;
    if (n >= ASR_MAX_WORD) n = ASR_MAX_WORD - 1;
    memcpy(out, w, n);
    out[n] = '\0';
    return out;
}

/* Ends the utterance and hands its words on (none: nothing is sent). */
static int utt_end(Asr *a, AsrSegmentFn fn, void *ud, Err *err) {
    AsrSegment seg = { 0 };
    double     sum = 0;
    int        n = 0;

    a->open = false;
    if (ps_end_utt(a->ps) < 0) return err_set(err, "pocketsphinx: cannot "
                                              "end the utterance");
    for (ps_seg_t *s = ps_seg_iter(a->ps); s != NULL; s = ps_seg_next(s)) {
        AsrWord *w = &a->words[n];
        int      sf, ef;

        if (n == ASR_MAX_WORDS) {           // past a 30 s cut: can't be
            ps_seg_free(s);
            break;
        }
        if (word_of(ps_seg_word(s), w->word) == NULL) continue;
        ps_seg_frames(s, &sf, &ef);
        w->start = sf / a->frate;
        w->end = (ef + 1) / a->frate;
        w->logprob = logmath_log_to_ln(a->lmath,
                                       ps_seg_prob(s, NULL, NULL, NULL));
        sum += w->logprob;
        n++;
    }
    a->in_utt = false;
    a->utt_samples = 0;
    if (n == 0) return 0;
    seg.words = a->words;
    seg.n_words = n;
    seg.start = a->words[0].start;
    seg.end = a->words[n - 1].end;
    seg.avg_logprob = sum / n;
    return fn(ud, &seg, err);
}

/* A stream abandoned mid-way (a corrupt file, a cancel) left its
 * utterance open: pocketsphinx refuses to start another until it ends. */
int asr_begin(Asr *a, Err *err) {
    if (a->open) {
        a->open = false;
        (void) ps_end_utt(a->ps);
    }
    a->in_utt = false;
    a->utt_samples = 0;
    a->rng = 0x2545f491u;
    if (a->cmn != NULL) {
        size_t n = (size_t) a->cmn->veclen;

        memcpy(a->cmn->cmn_mean, a->cmn0, n * sizeof(mfcc_t));
        memcpy(a->cmn->sum, a->cmn0 + n, n * sizeof(mfcc_t));
        a->cmn->nframe = a->cmn0_frames;
    }
    if (ps_start_stream(a->ps) < 0 || ps_start_utt(a->ps) < 0) {
        return err_set(err, "pocketsphinx: cannot start a stream");
    }
    a->open = true;
    return 0;
}

/* n <= PIECE samples of in into a->buf, +-1 LSB each (see the top). */
static void dither(Asr *a, const int16_t *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int v;

        a->rng = a->rng * 1664525u + 1013904223u;
        v = in[i] + (int) ((a->rng >> 16) % 3) - 1;
        a->buf[i] = (int16_t) (v < INT16_MIN ? INT16_MIN
                               : v > INT16_MAX ? INT16_MAX : v);
    }
}

int asr_feed(Asr *a, const int16_t *pcm, size_t n, AsrSegmentFn fn,
             void *ud, Err *err)
{
    const uint64_t max = (uint64_t) ASR_MAX_UTT_SECONDS * ASR_RATE;

    while (n > 0) {
        size_t k = n < PIECE ? n : PIECE;
        bool   speech;

        dither(a, pcm, k);
        if (ps_process_raw(a->ps, a->buf, k, FALSE, FALSE) < 0) {
            return err_set(err, "pocketsphinx: cannot process the audio");
        }
        pcm += k;
        n -= k;
        speech = ps_get_in_speech(a->ps) != 0;
        if (speech && !a->in_utt) a->in_utt = true;
        if (a->in_utt) a->utt_samples += k;
        if (a->in_utt && (!speech || a->utt_samples >= max)) {
            if (utt_end(a, fn, ud, err) != 0) return -1;
            if (ps_start_utt(a->ps) < 0) {
                return err_set(err, "pocketsphinx: cannot start an "
                               "utterance");
            }
            a->open = true;
        }
    }
    return 0;
}

int asr_finish(Asr *a, AsrSegmentFn fn, void *ud, Err *err) {
    return utt_end(a, fn, ud, err);
}

/* asr.h -- the recogniser seam: 16 kHz mono speech in, utterances with
 * word timings out. The listener's core (lscore.h) sees only this header;
 * asr_ps.c implements it with pocketsphinx's general US-English models
 * (pocketsphinx-en-us). A neural recogniser takes the listener over by
 * implementing these six functions in a file of its own and being linked
 * instead: nothing above this header changes.
 *
 * An Asr is one recogniser instance: its models, its search, its state.
 * One thread at a time uses it (the listener gives each worker slot its
 * own); different instances run at once on different threads.
 *
 * A stream is one audio input: asr_begin, asr_feed as often as pieces of
 * audio come, asr_finish. Utterances are cut by the recogniser's voice
 * activity detection (a second of silence ends one) and at
 * ASR_MAX_UTT_SECONDS of speech at the latest, so each segment's words are
 * known a moment after they were said, however long the input. Each
 * utterance with at least one word goes to the caller's AsrSegmentFn the
 * moment it ends. Times are seconds from the start of the stream. */

#ifndef OMNI_ASR_H
#define OMNI_ASR_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"

#define ASR_RATE            16000   // the samples asr_feed takes, Hz
#define ASR_MAX_UTT_SECONDS 30      // speech cut into segments at most this
                                    //   long (Whisper's window, too)
#define ASR_MAX_WORDS       512     // words kept of one segment
#define ASR_MAX_WORD        48      // bytes of one word, NUL included

/* The default models: Debian's pocketsphinx-en-us. */
#define ASR_DEFAULT_MODEL   "/usr/share/pocketsphinx/model/en-us"

typedef struct {
    char   word[ASR_MAX_WORD];  // lower case, no pronunciation variant
    double start, end;          // seconds from the start of the stream
    double logprob;             // natural log of the word's posterior
} AsrWord;

typedef struct {
    double         start, end;  // the first word's start, the last's end
    double         avg_logprob; // mean of the words' logprob
    const AsrWord *words;       // (n_words,) borrowed for the call
    int            n_words;     // >= 1
} AsrSegment;

/* Receives one finished utterance. Returns 0, or -1 to stop the stream:
 * the asr_feed or asr_finish that called it returns -1 with err as the
 * callback left it. */
typedef int (*AsrSegmentFn)(void *ud, const AsrSegment *seg, Err *err);

typedef struct {
    const char *model_dir;      // holds en-us/, en-us.lm.bin and
                                //   cmudict-en-us.dict; NULL: the default
} AsrConfig;

typedef struct Asr Asr;

/* Loads the models (about a second and 100 MB for pocketsphinx's
 * en-US). Not thread-safe against another asr_new: create every
 * instance from one thread. Returns the instance, or NULL with err set
 * (naming the file that is missing or bad). */
Asr  *asr_new(const AsrConfig *cfg, Err *err);

/* What recognises: "pocketsphinx en-us (DIR)", for logs. */
const char *asr_describe(const Asr *a);

/* A new stream; any earlier one is abandoned. Returns 0, or -1 with err. */
int   asr_begin(Asr *a, Err *err);

/* n samples of the stream at ASR_RATE. Returns 0, or -1 with err set (a
 * recogniser failure, or the callback's). */
int   asr_feed(Asr *a, const int16_t *pcm, size_t n, AsrSegmentFn fn,
               void *ud, Err *err);

/* The stream is over: its last utterance goes to fn. Returns 0, or -1
 * with err set. */
int   asr_finish(Asr *a, AsrSegmentFn fn, void *ud, Err *err);

void  asr_free(Asr *a);

#endif

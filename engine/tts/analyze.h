/* analyze.h -- the talker's half of text to speech: Flite's front end
 * (tokenizing, normalizing numbers and abbreviations, the lexicon and
 * letter-to-sound rules, stress), text in, Units out. */

#ifndef OMNI_ANALYZE_H
#define OMNI_ANALYZE_H

#include <stddef.h>

#include "log.h"
#include "units.h"

typedef struct TtsAnalyzer TtsAnalyzer;

/* An analyzer (tts_init first). One thread at a time. Returns it, or NULL
 * with err set; freed with tts_analyzer_free. */
TtsAnalyzer *tts_analyzer_new(Err *err);
void         tts_analyzer_free(TtsAnalyzer *a);

/* Analyses len bytes of UTF-8 text (any text: what Flite cannot say is
 * dropped or spelled, never a crash) into u (the caller frees it). A text
 * with nothing to say gives 0 words. Returns 0, or -1 with err set. */
int tts_analyze(TtsAnalyzer *a, const char *text, size_t len, Units *u,
                Err *err);

#endif

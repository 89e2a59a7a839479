/* tts_impl.h -- what the files of tts/ share and nobody else sees: Flite's
 * headers and the voices' registration functions (Flite ships no header for
 * them), the phone set every voice speaks, and the byte form's writer,
 * which the analyzer uses too (it builds a chunk's byte form and decodes it,
 * so what it hands out has passed the same checks as what the voicebox
 * receives). */

#ifndef OMNI_TTS_IMPL_H
#define OMNI_TTS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flite/flite.h>

#include "synth.h"
#include "units.h"

cst_voice *register_cmu_us_rms(const char *voxdir);
cst_voice *register_cmu_us_slt(const char *voxdir);
cst_voice *register_cmu_us_awb(const char *voxdir);
cst_voice *register_cmu_us_kal16(const char *voxdir);

/* Flite's front end alone (tokens to segments); in libflite, no header. */
cst_utterance *utt_synth_text2segs(cst_utterance *u);

/* usenglish's phone set: the four voices share it (tts_init checks). */
extern const cst_phoneset us_phoneset;

/* The Flite voice behind a TtsVoice (synth.c). */
cst_voice *tts_flite_voice(const TtsVoice *v);

/* Resets the calling thread's rand() to its starting seed (noise.c): each
 * chunk's noise excitation then depends on its units alone. */
void tts_noise_reset(void);

/* Limits of the byte form's fields (units.c describes the format). */
#define UNITS_MAX_TEXT    255       // bytes of a word as written
#define UNITS_MAX_PUNC    255       // bytes of prepunc, of punc
#define UNITS_MAX_PHONES  4096      // bytes of a word's phones
#define UNITS_HEADER      8

/* Writing a byte form: units_begin, units_put per word, units_finish.
 * units_put returns -1 for a word that breaks a field's limit (nothing
 * written) or does not fit; after one that did not fit (bytes or words)
 * the writer is full and refuses every later word, so what was written is
 * a whole prefix, and units_finish makes it a valid chunk. */
typedef struct {
    uint8_t *buf;
    size_t   cap;
    size_t   len;
    int      n_words;
    bool     full;
} UnitsWriter;

void units_begin(UnitsWriter *w, uint8_t *buf, size_t cap);
int  units_put(UnitsWriter *w, const char *text, const char *phones,
               const char *prepunc, const char *punc);
long units_finish(UnitsWriter *w, bool last);

/* Whether name (n bytes) is a phone of the set that may be spoken in a
 * word (not a silence); *vowel gets whether it takes a stress digit. */
bool units_phone_known(const char *name, size_t n, bool *vowel);

#endif

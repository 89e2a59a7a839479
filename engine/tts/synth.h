/* synth.h -- the voicebox's half of text to speech: Units to PCM with
 * Flite's waveform synthesis (flite_do_synth over utt_synth_tokens with
 * each word's phones given), streamed through Flite's audio streaming
 * callback as it is produced, at the voice's native rate (16 kHz).
 *
 * Each chunk is its own utterance, which Flite begins and ends with
 * silence (175-255 ms before the first sound, ~0.35 s at every join):
 * synthesis trims it by the utterance's phone timings, known before the
 * first sample is out, leaving a short natural pause at joins.
 *
 * Voices are registered once per process (tts_init) and shared read-only
 * by every thread; synthesis of different chunks runs on several threads
 * at once (the recipe checked it: bit-identical, helgrind clean). */

#ifndef OMNI_SYNTH_H
#define OMNI_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "units.h"

typedef struct TtsVoice TtsVoice;

/* Flite and its voices (rms, slt, awb, kal16), once per process, before
 * any thread uses them. Returns 0, or -1 with err set. */
int             tts_init(Err *err);

/* The voice named as speech.h's VoiceInfo.flite ("rms", ...), or NULL. */
const TtsVoice *tts_voice(const char *flite_name);
int             tts_voice_rate(const TtsVoice *v);  // Hz

/* Receives n > 0 samples (borrowed for the call). Returns 0, or -1 to
 * stop synthesis (tts_synth then fails with "output refused"). */
typedef int (*TtsPcmSink)(void *ud, const int16_t *pcm, size_t n);

typedef struct {
    float speed;                // 0.25..4; durations scaled by 1/speed
    bool  first;                // the request's first chunk: no silence
                                //   before the first sound
    bool  last;                 // its last: no silence after the last
    bool  keep_silence;         // no trimming: Flite's output as it is
                                //   (tests compare it with Flite's own)
} TtsSynthOpts;

/* Synthesizes u with voice v, the samples to sink as Flite streams them.
 * Returns the samples sent, or -1 with err set. */
long tts_synth(const TtsVoice *v, const Units *u, const TtsSynthOpts *o,
               TtsPcmSink sink, void *ud, Err *err);

#endif

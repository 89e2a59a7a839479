/* speech.h -- what a request asks of speech out: the voice, the audio
 * format, the speed and the chunking mode; and the table of voice names.
 *
 * The voice table is here, below the stages, because the frontend refuses
 * an unknown voice (400, param "voice") before any stage sees the request,
 * and the voicebox maps the same row to its synthesizer's voice. A row
 * names a voice as clients do (OpenAI's built-in names, and our own Flite
 * names for those who want one exactly) and says which Flite voice speaks
 * it. */

#ifndef OMNI_SPEECH_H
#define OMNI_SPEECH_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    AUDIO_MP3 = 0,                  // OpenAI's default for /v1/audio/speech
    AUDIO_OPUS,                     // Ogg Opus
    AUDIO_AAC,                      // ADTS
    AUDIO_FLAC,
    AUDIO_WAV,                      // 44-byte header, sizes 0xFFFFFFFF
    AUDIO_PCM,                      // s16le, 24 kHz, mono, no header
    AUDIO_N_FORMATS,
} AudioFormat;

typedef enum {
    SPEECH_LATENCY = 0,             // a small first chunk, then short ones
    SPEECH_QUALITY,                 // clause or sentence chunks
} SpeechMode;

#define SPEECH_RATE        24000    // every format's sample rate, Hz
#define SPEECH_MIN_SPEED   0.25
#define SPEECH_MAX_SPEED   4.0
#define SPEECH_MAX_INPUT   4096     // characters of /v1/audio/speech input
#define SPEECH_MAX_ID      64       // bytes of an audio id

typedef struct {
    const char *name;               // as a client sends it: "alloy"
    const char *flite;              // the Flite voice: "rms", "slt", ...
} VoiceInfo;

typedef struct {
    bool            on;             // speech out was asked for ("audio")
    const VoiceInfo *voice;         // a row of the voice table (static)
    AudioFormat     format;
    float           speed;          // [0.25, 4]; 1 normal
    SpeechMode      mode;
    const char     *id;             // chat: the id the answer's transcript
                                    //   is kept under; NULL: none
} SpeechParams;

/* The voice table row for name, or NULL when there is none. */
const VoiceInfo *speech_voice(const char *name);

/* The table itself: *n gets its row count. For docs, errors and tests. */
const VoiceInfo *speech_voices(size_t *n);

/* Whether name is a text-to-speech model a /v1/audio/speech request may
 * name besides the served model: OpenAI's "tts-1", "tts-1-hd" and
 * "gpt-4o-mini-tts" (so that SDK code written for OpenAI runs unchanged)
 * and "flite", what speaks them all here. */
bool speech_model(const char *name);

/* The format called name ("mp3", "opus", "aac", "flac", "wav", "pcm"), or
 * -1. speech_format_name is its inverse. */
int         speech_format(const char *name);
const char *speech_format_name(AudioFormat f);

#endif

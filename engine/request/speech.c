/* speech.c -- the voice and format tables of speech.h. */

#include <string.h>

#include "speech.h"

/* OpenAI's thirteen built-in names, spread over the four Flite voices that
 * are worth hearing (the recipe's WER: rms 12-13%, awb 19%, slt 19-20%,
 * kal16 22%; kal at 8 kHz, 45%, is left out), the clearest voice taking
 * the most names; then each Flite voice by its own name. */
static const VoiceInfo VOICES[] = {
    { "alloy",   "rms" },   { "ash",     "awb" },   { "ballad",  "kal16" },
    { "coral",   "slt" },   { "echo",    "rms" },   { "fable",   "awb" },
    { "nova",    "slt" },   { "onyx",    "rms" },   { "sage",    "slt" },
    { "shimmer", "slt" },   { "verse",   "awb" },   { "marin",   "slt" },
    { "cedar",   "rms" },
    { "rms",     "rms" },   { "slt",     "slt" },   { "awb",     "awb" },
    { "kal16",   "kal16" },
};

static const char *const FORMATS[AUDIO_N_FORMATS] = {
    [AUDIO_MP3] = "mp3", [AUDIO_OPUS] = "opus", [AUDIO_AAC] = "aac",
    [AUDIO_FLAC] = "flac", [AUDIO_WAV] = "wav", [AUDIO_PCM] = "pcm",
};

const VoiceInfo *speech_voice(const char *name) {
    for (size_t i = 0; i < sizeof(VOICES) / sizeof(VOICES[0]); i++) {
        if (strcmp(VOICES[i].name, name) == 0) return &VOICES[i];
    }
    return NULL;
}

const VoiceInfo *speech_voices(size_t *n) {
    *n = sizeof(VOICES) / sizeof(VOICES[0]);
    return VOICES;
}

int speech_format(const char *name) {
    for (int i = 0; i < AUDIO_N_FORMATS; i++) {
        if (strcmp(FORMATS[i], name) == 0) return i;
    }
    return -1;
}

const char *speech_format_name(AudioFormat f) {
    return (unsigned) f < AUDIO_N_FORMATS ? FORMATS[f] : "?";
}

bool speech_model(const char *name) {
    static const char *const MODELS[] = {
        "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "flite",
    };

    for (size_t i = 0; i < sizeof(MODELS) / sizeof(MODELS[0]); i++) {
        if (strcmp(MODELS[i], name) == 0) return true;
    }
    return false;
}

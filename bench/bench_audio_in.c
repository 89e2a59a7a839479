/* bench_audio_in.c -- the audio-input decoders' speed on this CPU, to
 * 16 kHz mono as the listener reads them. Reports; never asserts.
 *
 *   build/bench/bench_audio_in [SECONDS]   (default 30 s of audio)
 *
 * Input: bench_audio's speech-like signal (a 140 Hz buzz with harmonics,
 * gated into 200 ms syllables, plus a little noise), encoded by the
 * engine's own encoders at 24 kHz (mp3, flac, opus, wav), and as 16-bit
 * WAV at 16 kHz mono (no resampling: parse and copy) and 44.1 kHz stereo
 * (the commonest upload). Per file: decode speed as a multiple of real
 * time, best of 3 after a warm-up run, reading 4096 samples at a time. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "encode.h"
#include "log.h"

typedef struct {
    uint8_t *p;
    size_t   n, cap;
} Buf;

static int buf_sink(void *ud, const uint8_t *p, size_t n) {
    Buf *b = ud;

    if (b->n + n > b->cap) {
        uint8_t *q = realloc(b->p, (b->n + n) * 2);

        if (q == NULL) {
            return -1;
        }
        b->p = q;
        b->cap = (b->n + n) * 2;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}

static double speechlike_at(double t, uint32_t *x) {
    double v = 0;

    for (int h = 1; h <= 8; h++) {
        v += sin(2 * M_PI * 140 * h * t) / h;
    }
    v *= fmod(t, 0.25) < 0.2 ? 0.15 : 0.0;
    *x = *x * 1664525u + 1013904223u;
    return v + ((double) (*x >> 8) / (1 << 24) - 0.5) * 0.01;
}

/* An engine encoding of seconds of the signal at 24 kHz. */
static Buf engine_file(AudioFormat f, double seconds) {
    size_t        n = (size_t) (seconds * SPEECH_RATE);
    int16_t      *s = malloc(n * sizeof(*s));
    uint32_t      x = 12345;
    Buf           b = { 0 };
    Err           err;
    AudioEncoder *e;

    if (s == NULL) {
        return b;
    }
    for (size_t i = 0; i < n; i++) {
        s[i] = (int16_t) lrint(speechlike_at((double) i / SPEECH_RATE, &x)
                               * 32767);
    }
    e = audio_encoder_open(f, SPEECH_RATE, buf_sink, &b, &err);
    if (e == NULL || audio_encoder_write(e, s, n, &err) != 0
        || audio_encoder_finish(e, &err) != 0) {
        fprintf(stderr, "bench_audio_in: %s\n", err.msg);
        free(b.p);
        b = (Buf) { 0 };
    }
    audio_encoder_free(e);
    free(s);
    return b;
}

static void put_le(Buf *b, uint32_t v, int bytes) {
    uint8_t p[4] = { (uint8_t) v, (uint8_t) (v >> 8), (uint8_t) (v >> 16),
                     (uint8_t) (v >> 24) };

    buf_sink(b, p, (size_t) bytes);
}

/* A 16-bit WAV of seconds of the signal at rate, on ch equal channels. */
static Buf wav_file(int rate, int ch, double seconds) {
    size_t   n = (size_t) (seconds * rate);
    uint32_t x = 12345, data = (uint32_t) (n * (size_t) ch * 2);
    Buf      b = { 0 };

    buf_sink(&b, (const uint8_t *) "RIFF", 4);
    put_le(&b, 36 + data, 4);
    buf_sink(&b, (const uint8_t *) "WAVEfmt ", 8);
    put_le(&b, 16, 4);
    put_le(&b, 1, 2);
    put_le(&b, (uint32_t) ch, 2);
    put_le(&b, (uint32_t) rate, 4);
    put_le(&b, (uint32_t) (rate * ch * 2), 4);
    put_le(&b, (uint32_t) (ch * 2), 2);
    put_le(&b, 16, 2);
    buf_sink(&b, (const uint8_t *) "data", 4);
    put_le(&b, data, 4);
    for (size_t i = 0; i < n; i++) {
        int16_t v = (int16_t) lrint(speechlike_at((double) i / rate, &x)
                                    * 32767);

        for (int c = 0; c < ch; c++) {
            put_le(&b, (uint16_t) v, 2);
        }
    }
    return b;
}

/* Decodes b to the end; returns seconds taken (0 on failure) and sets
 * *out to the samples given. */
static double decode_run(const Buf *b, uint64_t *out) {
    static int16_t pcm[4096];
    double         t0 = clock_now_s();
    Err            err;
    bool           oom;
    ssize_t        k;
    AudioDecoder  *d = audio_decoder_open(b->p, b->n, AUDIO_IN_AUTO, 16000,
                                          &err, &oom);

    if (d == NULL) {
        fprintf(stderr, "bench_audio_in: %s\n", err.msg);
        return 0;
    }
    while ((k = audio_decoder_read(d, pcm, 4096, &err, &oom)) > 0) {
    }
    *out = audio_decoder_samples(d);
    audio_decoder_free(d);
    if (k < 0) {
        fprintf(stderr, "bench_audio_in: %s\n", err.msg);
        return 0;
    }
    return clock_now_s() - t0;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 30;
    struct {
        const char *name;
        Buf         b;
    } files[] = {
        { "mp3 24k mono (engine)", engine_file(AUDIO_MP3, seconds) },
        { "flac 24k mono (engine)", engine_file(AUDIO_FLAC, seconds) },
        { "opus 24k mono (engine)", engine_file(AUDIO_OPUS, seconds) },
        { "wav 24k mono (engine)", engine_file(AUDIO_WAV, seconds) },
        { "wav 16k mono s16", wav_file(16000, 1, seconds) },
        { "wav 44.1k stereo s16", wav_file(44100, 2, seconds) },
    };

    if (seconds <= 0) {
        fprintf(stderr, "usage: bench_audio_in [SECONDS]\n");
        return 2;
    }
    printf("# %.0f s of speech-like audio each, decoded to 16 kHz mono, "
           "best of 3\n", seconds);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        uint64_t n = 0;
        double   best = 0, t;

        if (files[i].b.p == NULL || decode_run(&files[i].b, &n) == 0) {
            return 1;
        }
        for (int r = 0; r < 3; r++) {
            t = decode_run(&files[i].b, &n);
            best = r == 0 || t < best ? t : best;
        }
        printf("%-24s %8zu bytes  %7.0fx real time  (%llu samples)\n",
               files[i].name, files[i].b.n, seconds / best,
               (unsigned long long) n);
        free(files[i].b.p);
    }
    return 0;
}

/* bench_audio.c -- the audio encoders' and the resampler's speed, and
 * each format's first-byte delay, on this CPU. Reports; never asserts.
 *
 *   build/bench/bench_audio [SECONDS]      (default 30 s of audio)
 *
 * Input: a speech-like 24 kHz signal (a 140 Hz buzz with harmonics, gated
 * into 200 ms syllables, plus a little noise), fed in 20 ms pieces as the
 * voicebox will. Per format: encode speed as a multiple of real time
 * (best of 3, after a warm-up run), the bytes the sink got at open (the
 * header, before any sample), and the samples written before the first
 * sink call after open (the first audio bytes). The resampler: 16 kHz ->
 * 24 kHz speed, and the input held before its first output. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encode.h"
#include "log.h"
#include "resample.h"

#define PIECE 480                   // 20 ms at 24 kHz

typedef struct {
    size_t bytes, calls;
} Count;

static int count_sink(void *ud, const uint8_t *p, size_t n) {
    Count *c = ud;

    c->bytes += n;
    c->calls++;
    return 0;
}

static int16_t *speechlike(size_t n, int rate) {
    int16_t  *s = malloc(n * sizeof(*s));
    uint32_t  x = 12345;

    for (size_t i = 0; s != NULL && i < n; i++) {
        double t = (double) i / rate, v = 0;

        for (int h = 1; h <= 8; h++) {
            v += sin(2 * M_PI * 140 * h * t) / h;
        }
        v *= fmod(t, 0.25) < 0.2 ? 0.15 : 0.0;
        x = x * 1664525u + 1013904223u;
        v += ((double) (x >> 8) / (1 << 24) - 0.5) * 0.01;
        s[i] = (int16_t) lrint(v * 32767);
    }
    return s;
}

/* Encodes n samples; returns seconds taken, 0 on failure. */
static double encode_run(AudioFormat f, const int16_t *s, size_t n,
                         size_t *head, size_t *first) {
    Count         c = { 0 };
    Err           err;
    double        t0 = clock_now_s();
    AudioEncoder *e = audio_encoder_open(f, SPEECH_RATE, count_sink, &c,
                                         &err);

    if (e == NULL) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    *head = c.bytes;
    *first = 0;
    for (size_t at = 0; at < n; at += PIECE) {
        size_t calls = c.calls;

        if (audio_encoder_write(e, s + at, n - at < PIECE ? n - at : PIECE,
                                &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            audio_encoder_free(e);
            return 0;
        }
        if (*first == 0 && c.calls > calls) {
            *first = at + PIECE;
        }
    }
    if (audio_encoder_finish(e, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
    }
    audio_encoder_free(e);
    return clock_now_s() - t0;
}

static void bench_resample(double seconds) {
    size_t     n = (size_t) (seconds * 16000), got, held = 0;
    int16_t   *in = speechlike(n, 16000);
    int16_t    out[4096 + 512];
    Err        err;
    Resampler *r = resample_new(16000, SPEECH_RATE, &err);
    double     t0 = clock_now_s();

    for (size_t at = 0; r != NULL && at < n; at += 320) {
        if (resample_process(r, in + at, 320, out, sizeof(out) / 2, &got,
                             &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            break;
        }
        held = held == 0 && got > 0 ? at + 320 : held;
    }
    printf("resample 16->24 kHz  %7.0fx real time  first output after %zu "
           "input samples (%.0f ms), fed 20 ms at a time\n",
           seconds / (clock_now_s() - t0), held, held / 16.0);
    resample_free(r);
    free(in);
}

int main(int argc, char **argv) {
    double   seconds = argc > 1 ? atof(argv[1]) : 30;
    size_t   n = (size_t) (seconds * SPEECH_RATE), head, first;
    int16_t *s = speechlike(n, SPEECH_RATE);

    if (s == NULL || seconds <= 0) {
        fprintf(stderr, "usage: bench_audio [SECONDS]\n");
        return 2;
    }
    log_set_level(LOG_ERROR);
    printf("# %.0f s of 24 kHz speech-like audio, 20 ms pieces; built with "
           "%s\n", seconds, __VERSION__);
    for (int f = 0; f < AUDIO_N_FORMATS; f++) {
        double best = 1e9;

        encode_run(f, s, n / 10, &head, &first);                // warm-up
        for (int k = 0; k < 3; k++) {
            double t = encode_run(f, s, n, &head, &first);

            best = t > 0 && t < best ? t : best;
        }
        printf("%-4s  %7.0fx real time  header at open %3zu bytes  first "
               "audio bytes after %5zu samples (%.0f ms)\n",
               speech_format_name(f), seconds / best, head, first,
               first / 24.0);
    }
    bench_resample(seconds);
    free(s);
    return 0;
}

/* audio_probe.c -- decodes an audio file with an independent decoder and
 * prints what it holds, for tests that check the audio nginx returns.
 *
 *   build/tools/audio_probe FORMAT FILE [RATE]
 *
 * FORMAT is mp3 (libmpg123), opus (libopusfile), aac (ADTS, libfaad),
 * flac or wav (libsndfile), or pcm (raw s16le mono at RATE Hz, default
 * 24000); FILE "-" reads stdin. On success it prints one JSON line and
 * exits 0:
 *
 *   {"format":"mp3","rate":24000,"channels":1,"samples":36288,
 *    "seconds":1.512000,"rms":0.212345,"peak":0.501953}
 *
 * rate is the stream's own (for Opus, the input rate its header states;
 * Opus always decodes at 48 kHz, and samples is counted at rate); samples
 * are per channel, after the decoder's own trimming (Opus pre-skip), and
 * include codec priming and padding (mp3 and aac add up to ~2 frames);
 * rms and peak are of the first channel, as fractions of full scale. A
 * file it cannot decode (bad bytes, wrong format, no audio frame in an mp3
 * or aac file) gives a message on stderr and exit status 1; bad usage,
 * exit 2. Files are read whole, up to 256 MiB. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio_decode.h"

#define PROBE_MAX (256u << 20)

/* Reads f to its end into *p (malloc'd); returns its length or -1. */
static long read_all(FILE *f, uint8_t **p) {
    size_t   cap = 1 << 16, n = 0, got;
    uint8_t *b = malloc(cap), *nb;

    while (b != NULL && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            if (cap >= PROBE_MAX || (nb = realloc(b, cap * 2)) == NULL) {
                free(b);
                return -1;
            }
            b = nb;
            cap *= 2;
        }
    }
    if (b == NULL || ferror(f)) {
        free(b);
        return -1;
    }
    *p = b;
    return (long) n;
}

int main(int argc, char **argv) {
    AudioDecoded  d;
    uint8_t      *p;
    double        rms, peak;
    char          why[256];
    FILE         *f;
    long          n;
    int           rate = 24000;

    if (argc < 3 || argc > 4 || (argc == 4 && (rate = atoi(argv[3])) <= 0)) {
        fprintf(stderr, "usage: audio_probe mp3|opus|aac|flac|wav|pcm "
                "FILE|- [PCM_RATE]\n");
        return 2;
    }
    f = strcmp(argv[2], "-") == 0 ? stdin : fopen(argv[2], "rb");
    if (f == NULL) {
        perror(argv[2]);
        return 1;
    }
    n = read_all(f, &p);
    if (f != stdin) {
        fclose(f);
    }
    if (n < 0) {
        fprintf(stderr, "audio_probe: %s: cannot read (or over 256 MiB)\n",
                argv[2]);
        return 1;
    }
    if (audio_decode(argv[1], p, (size_t) n, rate, &d, why,
                     sizeof(why)) != 0) {
        fprintf(stderr, "audio_probe: %s: %s\n", argv[2], why);
        free(p);
        return 1;
    }
    audio_decoded_level(&d, &rms, &peak);
    printf("{\"format\":\"%s\",\"rate\":%d,\"channels\":%d,\"samples\":%zu,"
           "\"seconds\":%.6f,\"rms\":%.6f,\"peak\":%.6f}\n", argv[1], d.rate,
           d.channels, d.samples, (double) d.samples / d.rate, rms, peak);
    audio_decoded_free(&d);
    free(p);
    return 0;
}

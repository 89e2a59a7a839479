/* asr.c -- transcribes speech with pocketsphinx, for the intelligibility
 * measurement of `make bench` (word error rate of our voices).
 *
 *   asr [--rate HZ] FILE...
 *
 * Each FILE holds raw s16le mono samples at HZ (default 24000, what the
 * engine's "pcm" format is); "-" is stdin. Prints one line per file: the
 * words pocketsphinx heard, lower case, space-separated ("" for none).
 * Audio is resampled to the acoustic model's 16 kHz with soxr (HQ, as the
 * engine's own resampler) and decoded as one utterance with the en-US
 * acoustic model, its general language model and dictionary
 * (pocketsphinx-en-us), with dither on: our synthesized voices emit runs
 * of exact zeros, on which pocketsphinx's features degenerate without it
 * (the TTS recipe measured that). The dither's generator is seeded, so a
 * run is repeatable.
 *
 * A measuring tool, not part of the engine: it exits 1 with a message on
 * any error. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pocketsphinx.h>
#include <soxr.h>

#define MODEL_DIR  "/usr/share/pocketsphinx/model/en-us"
#define ASR_RATE   16000
#define MAX_BYTES  (256u << 20)

static void die(const char *what, const char *detail) {
    fprintf(stderr, "asr: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    exit(1);
}

/* The whole of f, malloc'd; *n gets its length. */
static char *slurp(FILE *f, size_t *n) {
    size_t cap = 1 << 20, len = 0;
    char  *p = malloc(cap);

    while (p != NULL) {
        size_t got = fread(p + len, 1, cap - len, f);

        len += got;
        if (got == 0) break;
        if (len == cap) {
            if (cap >= MAX_BYTES) die("input too large", NULL);
            cap *= 2;
            p = realloc(p, cap);
        }
    }
    if (p == NULL) die("out of memory", NULL);
    *n = len;
    return p;
}

/* in (n samples at rate) -> 16 kHz, malloc'd; *out_n gets its length. */
static int16_t *to_16k(const int16_t *in, size_t n, double rate,
                       size_t *out_n) {
    soxr_io_spec_t   io = soxr_io_spec(SOXR_INT16_I, SOXR_INT16_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    size_t           cap = (size_t) ((double) n * ASR_RATE / rate) + 64;
    int16_t         *out = malloc(cap * sizeof(int16_t));
    soxr_error_t     e;

    if (out == NULL) die("out of memory", NULL);
    if (rate == ASR_RATE) {
        memcpy(out, in, n * sizeof(int16_t));
        *out_n = n;
        return out;
    }
    e = soxr_oneshot(rate, ASR_RATE, 1, in, n, NULL, out, cap, out_n, &io,
                     &q, NULL);
    if (e != NULL) die("soxr", e);
    return out;
}

static void print_hyp(const char *hyp) {
    for (const char *c = hyp ? hyp : ""; *c; c++) {
        putchar(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    }
    putchar('\n');
}

int main(int argc, char **argv) {
    double        rate = 24000;
    int           i = 1;
    cmd_ln_t     *cfg;
    ps_decoder_t *ps;

    if (argc > 2 && strcmp(argv[1], "--rate") == 0) {
        rate = atof(argv[2]);
        i = 3;
    }
    if (i >= argc || rate < 8000 || rate > 192000) {
        die("usage: asr [--rate HZ] FILE...", NULL);
    }
    cfg = cmd_ln_init(NULL, ps_args(), TRUE, "-hmm", MODEL_DIR "/en-us",
                      "-lm", MODEL_DIR "/en-us.lm.bin", "-dict",
                      MODEL_DIR "/cmudict-en-us.dict", "-dither", "yes",
                      "-seed", "1", "-logfn", "/dev/null", NULL);
    if (cfg == NULL || (ps = ps_init(cfg)) == NULL) {
        die("cannot load the pocketsphinx en-US model from " MODEL_DIR,
            NULL);
    }
    for (; i < argc; i++) {
        FILE    *f = strcmp(argv[i], "-") == 0 ? stdin : fopen(argv[i], "rb");
        size_t   n, n16;
        char    *raw;
        int16_t *pcm;
        int32    score;

        if (f == NULL) die("cannot open", argv[i]);
        raw = slurp(f, &n);
        if (f != stdin) fclose(f);
        pcm = to_16k((const int16_t *) raw, n / 2, rate, &n16);
        if (ps_start_utt(ps) < 0
            || ps_process_raw(ps, pcm, n16, FALSE, TRUE) < 0
            || ps_end_utt(ps) < 0)
        {
            die("pocketsphinx could not decode", argv[i]);
        }
        print_hyp(ps_get_hyp(ps, &score));
        free(pcm);
        free(raw);
    }
    ps_free(ps);
    cmd_ln_free_r(cfg);
    return 0;
}

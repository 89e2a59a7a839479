/* bench_voicebox.c -- the voicebox core (engine/voicebox/vbcore.h) alone:
 * for each format, one request of six units chunks (a 26-word passage cut
 * as latency mode would) on one slot, its real-time factor (wall time from
 * the first chunk in to DONE, over the audio's length: synthesis,
 * resampling and encoding together) and its time from the first units
 * chunk in to the first encoded byte out. Medians of 5 runs; reports,
 * never asserts.
 *
 *   make build/bench/bench_voicebox && build/bench/bench_voicebox [voice] */

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "vbcore.h"

#define N_CHUNKS 6
#define N_RUNS   5

static const char *TEXT[N_CHUNKS] = {
    "The quick brown fox", "jumps over the lazy dog,", "and then it runs",
    "far away into the forest.", "Nobody saw it again",
    "for a very long time.",
};

/* Chunk i's units in a pool block. */
static int put_units(Pool *p, TtsAnalyzer *a, int i, PoolRef *r, Err *err) {
    Units u;
    int   b = pool_alloc(p, 1, 0);
    long  n;

    if (b < 0) return err_set(err, "pool full");
    if (tts_analyze(a, TEXT[i], strlen(TEXT[i]), &u, err) != 0) return -1;
    u.last = i == N_CHUNKS - 1;
    n = units_encode(&u, pool_block(p, (uint32_t) b), p->block_size);
    units_free(&u);
    if (n < 0) return err_set(err, "units do not fit a block");
    *r = (PoolRef) { (uint32_t) b, 0, (uint32_t) n };
    return 0;
}

/* One request in format f; *first_ms and *rtf get its timings. */
static int run_once(Pool *p, TtsAnalyzer *a, const VoiceInfo *vi,
                    AudioFormat f, double *first_ms, double *rtf, Err *err)
{
    VbConfig     cfg = { 1, 8, p, 1, NULL, NULL };
    SpeechParams sp = { .on = true, .voice = vi, .format = f, .speed = 1.0f };
    OmniDone     d = { 0 };
    PoolRef      refs[N_CHUNKS];
    VbCore      *c;
    double       t0, t1 = -1;
    VbOut        o = { 0 };

    for (int i = 0; i < N_CHUNKS; i++) {
        if (put_units(p, a, i, &refs[i], err) != 0) return -1;
    }
    if ((c = vb_new(&cfg, err)) == NULL) return -1;
    if (vb_submit(c, 1, &sp, err) != 0) goto fail;
    t0 = clock_now_s();
    for (int i = 0; i < N_CHUNKS; i++) vb_units(c, 1, refs[i]);
    vb_input_done(c, 1, &d);
    for (;;) {
        struct pollfd pf = { vb_wake_fd(c), POLLIN, 0 };

        (void) poll(&pf, 1, 10000);
        while (vb_next(c, &o) && o.kind <= VB_OUT_BLOCK) {
            if (o.kind != VB_OUT_BLOCK) continue;
            if (t1 < 0) t1 = clock_now_s();
            (void) pool_unref(p, o.ref.block);
        }
        if (o.kind > VB_OUT_BLOCK) break;
    }
    if (o.kind != VB_OUT_DONE) {
        err_set(err, "%s", o.kind == VB_OUT_ERROR ? o.msg : "not done");
        goto fail;
    }
    *first_ms = (t1 - t0) * 1e3;
    *rtf = (clock_now_s() - t0) / (o.done.audio_ms / 1e3);
    vb_free(c);
    return 0;

fail:
    vb_free(c);
    return -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const VoiceInfo *vi = speech_voice(argc > 1 ? argv[1] : "alloy");
    TtsAnalyzer     *a;
    Pool             p;
    Err              err;

    if (vi == NULL) {
        fprintf(stderr, "bench_voicebox: no voice %s\n", argv[1]);
        return 1;
    }
    if (tts_init(&err) != 0 || pool_create(&p, 256, 32768, &err) != 0
        || (a = tts_analyzer_new(&err)) == NULL)
    {
        fprintf(stderr, "bench_voicebox: %s\n", err.msg);
        return 1;
    }
    printf("voice %s (flite %s), %d chunks, 1 slot, median of %d\n",
           vi->name, vi->flite, N_CHUNKS, N_RUNS);
    for (int f = 0; f < AUDIO_N_FORMATS; f++) {
        double first[N_RUNS], rtf[N_RUNS];

        for (int k = 0; k < N_RUNS; k++) {
            if (run_once(&p, a, vi, (AudioFormat) f, &first[k], &rtf[k],
                         &err) != 0)
            {
                fprintf(stderr, "bench_voicebox: %s: %s\n",
                        speech_format_name((AudioFormat) f), err.msg);
                return 1;
            }
        }
        qsort(first, N_RUNS, sizeof(double), cmp_double);
        qsort(rtf, N_RUNS, sizeof(double), cmp_double);
        printf("%-5s first byte %6.1f ms   RTF %.4f\n",
               speech_format_name((AudioFormat) f), first[N_RUNS / 2],
               rtf[N_RUNS / 2]);
    }
    tts_analyzer_free(a);
    pool_destroy(&p);
    return 0;
}

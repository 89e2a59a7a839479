/* test_tts_synth.c -- speech units to PCM (engine/tts/synth.c, with the
 * analyzer in front):
 *
 *   - the talker/voicebox split is exact: analyse, encode, decode and
 *     synthesize with trimming off (TtsSynthOpts.keep_silence) gives
 *     bit-identical samples to Flite's flite_text_to_wave on the whole
 *     text, for 12 sentences and each of the four voices;
 *   - "no no no" keeps its three words;
 *   - trimming: the trimmed chunk is a slice of Flite's output that cuts
 *     no sound (no cut sample reaches QUIET, -35 dBFS), starts within
 *     15 ms of its first sample above SOUND (-50 dBFS: 5 ms of guard that
 *     synthesis keeps, then 10 ms) (texts that begin
 *     with a vowel: a stop's closure is silence that belongs to the
 *     phone, and is kept); a join keeps the pause its punctuation asks,
 *     the last chunk a short tail (measured from the last sample above
 *     LOUD, so the last phone's fade counts as pause);
 *   - speed 2 gives about half the samples of speed 1, 0.5 about double;
 *   - two threads synthesizing at once give what one at a time gives;
 *   - a sink that refuses stops synthesis with a clear error.
 *
 * It also prints the measurements engine/tts/README.md quotes. */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "analyze.h"
#include "log.h"
#include "tts_impl.h"

#define SOUND  100          // |sample| from here is not silence (-50 dBFS)
#define QUIET  600          // a cut below this cut no sound (-35 dBFS)
#define LOUD   1500         // the end of a chunk's last sound (-27 dBFS)

static const char *VOICES[] = { "rms", "slt", "awb", "kal16" };

static const char *SENTENCES[] = {
    "Once upon a time, there was a little girl named Lily.",
    "She liked to play outside in the sun with her red ball.",
    "No no no, said the dog.",
    "It cost $3.50 in 1999, and Dr. Smith paid it on Jan. 5th.",
    "\"Where are you going?\" asked Tom.",
    "The quick brown fox jumps over the lazy dog!",
    "Mr. and Mrs. Brown live at 42 Elm St. with 3 cats.",
    "Wait -- is that really you; or am I dreaming?",
    "I read the book, then I read it again.",
    "The meeting is at 10:30 a.m. on the 2nd floor.",
    "Hello world",
    "Tim's mom said: \"Be home by 6, please.\"",
};
#define N_SENTENCES (sizeof(SENTENCES) / sizeof(*SENTENCES))

typedef struct {
    int16_t *pcm;
    size_t   n, cap;
    int      calls;
    int      refuse_after;  // calls; 0: never refuse
} Pcm;

static int collect(void *ud, const int16_t *pcm, size_t n) {
    Pcm *p = ud;

    if (p->refuse_after > 0 && p->calls >= p->refuse_after) return -1;
    p->calls++;
    if (p->n + n > p->cap) {
        p->cap = (p->n + n) * 2;
        p->pcm = realloc(p->pcm, p->cap * sizeof(int16_t));
        assert_non_null(p->pcm);
    }
    memcpy(p->pcm + p->n, pcm, n * sizeof(int16_t));
    p->n += n;
    return 0;
}

/* text through the whole path: analyse, encode, decode, synthesize. */
static Pcm say(const char *voice, const char *text, TtsSynthOpts o) {
    static uint8_t bytes[UNITS_MAX_BYTES];
    TtsAnalyzer   *a;
    Units          u, back;
    Pcm            p = { 0 };
    Err            err;
    long           n, sent;

    assert_non_null(a = tts_analyzer_new(&err));
    assert_int_equal(tts_analyze(a, text, strlen(text), &u, &err), 0);
    tts_analyzer_free(a);
    u.last = o.last;
    assert_true((n = units_encode(&u, bytes, sizeof(bytes))) > 0);
    if (units_decode(&back, bytes, (size_t) n, &err) < 0) fail_msg("%s", err.msg);
    sent = tts_synth(tts_voice(voice), &back, &o, collect, &p, &err);
    if (sent < 0) fail_msg("%s: %s", text, err.msg);
    assert_int_equal((size_t) sent, p.n);
    units_free(&u);
    units_free(&back);
    return p;
}

static const TtsSynthOpts UNTRIMMED = { 1.0f, true, true, true };

static int setup(void **state) {
    Err err;

    if (tts_init(&err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------

static void test_split_is_exact(void **state) {
    for (size_t v = 0; v < 4; v++) {
        for (size_t i = 0; i < N_SENTENCES; i++) {
            cst_wave *w;
            Pcm       p = say(VOICES[v], SENTENCES[i], UNTRIMMED);

            srand(1);       // tts_synth starts each chunk's noise so
            w = flite_text_to_wave(SENTENCES[i],
                                   tts_flite_voice(tts_voice(VOICES[v])));

            if (p.n != (size_t) w->num_samples
                || memcmp(p.pcm, w->samples, p.n * sizeof(int16_t)) != 0)
                fail_msg("%s: \"%s\": %zu samples, flite %d, differ",
                         VOICES[v], SENTENCES[i], p.n, w->num_samples);
            assert_int_equal(w->sample_rate,
                             tts_voice_rate(tts_voice(VOICES[v])));
            delete_wave(w);
            free(p.pcm);
        }
    }
}

static void test_no_no_no(void **state) {
    TtsAnalyzer *a;
    Units        u;
    Err          err;
    Pcm          one, three;

    assert_non_null(a = tts_analyzer_new(&err));
    assert_int_equal(tts_analyze(a, "no no no", 8, &u, &err), 0);
    assert_int_equal(u.n_words, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(u.words[i].text, "no");
        assert_string_equal(u.words[i].phones, "n ow1");
    }
    assert_int_equal(u.n_phones, 6);
    units_free(&u);
    tts_analyzer_free(a);
    one = say("rms", "no", (TtsSynthOpts) { 1.0f, true, true, false });
    three = say("rms", "no no no", (TtsSynthOpts) { 1.0f, true, true, false });
    assert_true(three.n > 2 * one.n);
    free(one.pcm);
    free(three.pcm);
}

static size_t first_sound(const Pcm *p) {
    size_t i = 0;

    while (i < p->n && abs(p->pcm[i]) < SOUND) i++;
    return i;
}

static size_t last_loud(const Pcm *p) {
    size_t i = p->n;

    while (i > 0 && abs(p->pcm[i - 1]) < LOUD) i--;
    return i;
}

/* Where t lies in u: t is a slice of u, or a slice of u's end followed by
 * zeros (the pause synthesis adds when Flite's own is shorter). */
static size_t slice_at(const Pcm *u, const Pcm *t) {
    for (size_t off = 0; off < u->n; off++) {
        size_t m = t->n < u->n - off ? t->n : u->n - off, z = m;

        if (memcmp(u->pcm + off, t->pcm, m * sizeof(int16_t)) != 0) continue;
        while (z < t->n && t->pcm[z] == 0) z++;
        if (z == t->n) return off;
    }
    fail_msg("trimmed output is not a slice of Flite's");
    return 0;
}

static void check_trim(const char *voice, const char *text, bool last,
                       int min_tail_ms, int max_tail_ms) {
    int    rate = tts_voice_rate(tts_voice(voice));
    Pcm    u = say(voice, text, UNTRIMMED);
    Pcm    t = say(voice, text, (TtsSynthOpts) { 1.0f, true, last, false });
    size_t off = slice_at(&u, &t), tail;

    for (size_t i = 0; i < off; i++)
        if (abs(u.pcm[i]) >= QUIET)
            fail_msg("%s \"%s\": sample %zu of the cut lead is %d", voice,
                     text, i, u.pcm[i]);
    for (size_t i = off + t.n; i < u.n; i++)     // none when padded
        if (abs(u.pcm[i]) >= QUIET)
            fail_msg("%s \"%s\": sample %zu of the cut tail is %d", voice,
                     text, i, u.pcm[i]);
    if (first_sound(&t) > (size_t) rate * 15 / 1000)   // 5 ms guard + 10
        fail_msg("%s \"%s\": first sound at %zu ms", voice, text,
                 first_sound(&t) * 1000 / rate);
    tail = (t.n - last_loud(&t)) * 1000 / rate;
    if (tail < (size_t) min_tail_ms || tail > (size_t) max_tail_ms)
        fail_msg("%s \"%s\": %zu ms after the last sound (want %d..%d)",
                 voice, text, tail, min_tail_ms, max_tail_ms);
    free(u.pcm);
    free(t.pcm);
}

static void test_trimming(void **state) {
    for (size_t v = 0; v < 4; v++) {
        // the last chunk: a short tail (50 ms kept after the last phone)
        check_trim(VOICES[v], "Anna saw a bee.", true, 20, 110);
        // (each text ends in a sonorant: a final stop's burst can be quieter
        // than LOUD). Joins: 250 ms after a sentence, 120 after a clause, 60 between
        // words (plus the last phone's own fade, up to ~60 ms)
        check_trim(VOICES[v], "Anna was happy.", false, 200, 330);
        check_trim(VOICES[v], "Every day was fun,", false, 90, 200);
        check_trim(VOICES[v], "I ran home to", false, 30, 140);
    }
}

static void test_speed(void **state) {
    const char *text = "She liked to play outside in the sun with her ball.";

    for (size_t v = 0; v < 4; v++) {
        TtsSynthOpts o = { 1.0f, true, true, false };
        Pcm          n1 = say(VOICES[v], text, o), n2, n05;
        double       r2, r05;

        o.speed = 2.0f;
        n2 = say(VOICES[v], text, o);
        o.speed = 0.5f;
        n05 = say(VOICES[v], text, o);
        r2 = (double) n2.n / n1.n;
        r05 = (double) n05.n / n1.n;
        if (r2 < 0.42 || r2 > 0.58 || r05 < 1.75 || r05 > 2.25)
            fail_msg("%s: speed 2 gives %.2fx, speed 0.5 %.2fx the samples",
                     VOICES[v], r2, r05);
        free(n1.pcm);
        free(n2.pcm);
        free(n05.pcm);
    }
}

static void test_bad_speed_and_refusal(void **state) {
    Units        u = { 0 };
    TtsSynthOpts o = { 8.0f, true, true, false };
    Pcm          p = { .refuse_after = 1 };
    Err          err;

    assert_int_equal(tts_synth(tts_voice("rms"), &u, &o, collect, &p, &err),
                     -1);
    assert_non_null(strstr(err.msg, "speed 8"));
    o.speed = 0;
    assert_int_equal(tts_synth(tts_voice("rms"), &u, &o, collect, &p, &err),
                     -1);
    assert_null(tts_voice("nope"));
    // nothing to say: no samples, no error
    o.speed = 1;
    assert_int_equal(tts_synth(tts_voice("rms"), &u, &o, collect, &p, &err),
                     0);
    free(p.pcm);
    p = (Pcm) { .refuse_after = 1 };
    {
        TtsAnalyzer *a = tts_analyzer_new(&err);

        assert_int_equal(tts_analyze(a, SENTENCES[0], strlen(SENTENCES[0]),
                                     &u, &err), 0);
        tts_analyzer_free(a);
    }
    assert_int_equal(tts_synth(tts_voice("slt"), &u, &o, collect, &p, &err),
                     -1);
    assert_string_equal(err.msg, "tts: output refused");
    units_free(&u);
    free(p.pcm);
}

// ---------------------------------------------------------------------------
// Threads

typedef struct {
    const char *voice;
    Pcm         out[N_SENTENCES];
} Job;

static void *run_job(void *arg) {
    Job *j = arg;

    for (size_t i = 0; i < N_SENTENCES; i++)
        j->out[i] = say(j->voice, SENTENCES[i],
                        (TtsSynthOpts) { 1.0f, i == 0, false, false });
    return NULL;
}

static void test_threads(void **state) {
    // two threads on one voice, two on two others: all at once
    static Job  alone[4] = { { .voice = "rms" }, { .voice = "rms" },
                              { .voice = "slt" }, { .voice = "kal16" } };
    static Job  both[4] = { { .voice = "rms" }, { .voice = "rms" },
                              { .voice = "slt" }, { .voice = "kal16" } };
    pthread_t   th[4];

    for (int k = 0; k < 4; k++) run_job(&alone[k]);
    for (int k = 0; k < 4; k++)
        assert_int_equal(pthread_create(&th[k], NULL, run_job, &both[k]), 0);
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < N_SENTENCES; i++) {
            assert_int_equal(both[k].out[i].n, alone[k].out[i].n);
            assert_memory_equal(both[k].out[i].pcm, alone[k].out[i].pcm,
                                alone[k].out[i].n * sizeof(int16_t));
            free(both[k].out[i].pcm);
            free(alone[k].out[i].pcm);
        }
}

// ---------------------------------------------------------------------------
// Measurements (printed, for the README; only sanity is asserted)

typedef struct {
    double t0, first;       // clock at start, at the first samples
} Clock;

static int first_sample(void *ud, const int16_t *pcm, size_t n) {
    Clock *c = ud;

    if (c->first == 0) c->first = clock_now_s() - c->t0;
    return 0;
}

static void test_measure(void **state) {
    const char *chunk = "Once upon a time,";
    Err         err;

    for (size_t v = 0; v < 4; v++) {
        const TtsVoice *voice = tts_voice(VOICES[v]);
        TtsAnalyzer    *a = tts_analyzer_new(&err);
        double          audio = 0, busy = 0, ttfs[9];
        size_t          trimmed = 0, total = 0;
        Units           u;

        for (size_t i = 0; i < N_SENTENCES; i++) {
            TtsSynthOpts o = { 1.0f, true, true, false };
            double       t0 = clock_now_s();
            Pcm          p = say(VOICES[v], SENTENCES[i], o);
            Pcm          q = say(VOICES[v], SENTENCES[i], UNTRIMMED);

            busy += clock_now_s() - t0;
            audio += (double) (p.n + q.n) / tts_voice_rate(voice);
            trimmed += q.n - p.n;
            total += q.n;
            free(p.pcm);
            free(q.pcm);
        }
        assert_int_equal(tts_analyze(a, chunk, strlen(chunk), &u, &err), 0);
        for (int r = 0; r < 9; r++) {
            TtsSynthOpts o = { 1.0f, true, false, false };
            Clock        c = { clock_now_s(), 0 };

            assert_true(tts_synth(voice, &u, &o, first_sample, &c, &err) > 0);
            ttfs[r] = c.first;
        }
        for (int i = 1; i < 9; i++)         // the median, by insertion
            for (int k = i; k > 0 && ttfs[k - 1] > ttfs[k]; k--) {
                double t = ttfs[k];

                ttfs[k] = ttfs[k - 1];
                ttfs[k - 1] = t;
            }
        printf("# %-5s rtf %.4f (analysis + synthesis, both passes), "
               "first samples of \"%s\" after %.1f ms (synthesis, median "
               "of 9), silence trimmed %.0f%% (%.0f ms per sentence)\n",
               VOICES[v], busy / audio, chunk, ttfs[4] * 1e3,
               100.0 * trimmed / total,
               1e3 * trimmed / tts_voice_rate(voice) / N_SENTENCES);
        units_free(&u);
        tts_analyzer_free(a);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_is_exact),
        cmocka_unit_test(test_no_no_no),
        cmocka_unit_test(test_trimming),
        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_bad_speed_and_refusal),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_measure),
    };

    return cmocka_run_group_tests(tests, setup, NULL);
}

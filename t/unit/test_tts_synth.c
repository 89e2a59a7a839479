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
 *   - any chunk units_decode accepts (random words of random phones)
 *     synthesizes with every voice at any speed: Flite never exit()s;
 *   - speed 2 gives about half the samples of speed 1, 0.5 about double,
 *     and the median pitch stays within 10%;
 *   - two threads synthesizing at once give what one at a time gives;
 *   - a sink that refuses stops synthesis with a clear error; a chunk
 *     built by hand with an unknown phone is refused, not synthesized.
 *
 * It also prints the measurements engine/tts/README.md quotes. */

#include <math.h>
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
#include "test_tts.h"

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
    static _Thread_local uint8_t bytes[UNITS_MAX_BYTES];   // threads say()
    TtsAnalyzer                 *a;
    Units                        u, back;
    Pcm                          p = { 0 };
    Err                          err;
    long                         n, sent;

    assert_non_null(a = tts_analyzer_new(&err));
    assert_int_equal(tts_analyze(a, text, strlen(text), &u, &err), 0);
    tts_analyzer_free(a);
    u.last = o.last;
    assert_true((n = units_encode(&u, bytes, sizeof(bytes))) > 0);
    if (units_decode(&back, bytes, (size_t) n, &err) < 0)
        fail_msg("%s", err.msg);
    sent = tts_synth(tts_voice(voice), &back, &o, collect, &p, &err);
    if (sent < 0) fail_msg("%s: %s", text, err.msg);
    assert_int_equal((size_t) sent, p.n);
    units_free(&u);
    units_free(&back);
    return p;
}

static const TtsSynthOpts UNTRIMMED = { 1.0f, true, true, true };

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

static void check_trim(const char *voice, const char *text, float speed,
                       bool last, int min_tail_ms, int max_tail_ms) {
    int    rate = tts_voice_rate(tts_voice(voice));
    Pcm    u = say(voice, text, (TtsSynthOpts) { speed, true, true, true });
    Pcm    t = say(voice, text, (TtsSynthOpts) { speed, true, last, false });
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
        check_trim(VOICES[v], "Anna saw a bee.", 1.0f, true, 20, 110);
        check_trim(VOICES[v], "Anna saw a bee.", 2.0f, true, 20, 110);
        // (at half speed the last phone's fade, counted as tail, doubles)
        check_trim(VOICES[v], "Anna saw a bee.", 0.5f, true, 20, 220);
        // (each text ends in a sonorant: a final stop's burst can be
        // quieter than LOUD). Joins: 250 ms after a sentence, 120 after a
        // clause, 60 between words (plus the last phone's fade, ~60 ms)
        check_trim(VOICES[v], "Anna was happy.", 1.0f, false, 200, 330);
        check_trim(VOICES[v], "Every day was fun,", 1.0f, false, 90, 200);
        check_trim(VOICES[v], "I ran home to", 1.0f, false, 30, 140);
    }
}

/* The median pitch of p's voiced 40 ms frames (Hz): per frame, the lag
 * of the normalized autocorrelation's peak between 70 and 400 Hz, where
 * that peak is above 0.6. Enough to tell a pitch shift from none. */
static double median_f0(const Pcm *p, int rate) {
    static double f0[4096];
    int           n = 0, win = rate / 25;

    for (size_t at = 0; at + (size_t) win * 2 < p->n && n < 4096;
         at += (size_t) win / 2) {
        const int16_t *x = p->pcm + at;
        double         best = 0, e0 = 0;
        int            lag = 0;

        for (int i = 0; i < win; i++) e0 += (double) x[i] * x[i];
        if (e0 < 1e6 * win / 100) continue;         // too quiet
        for (int l = rate / 400; l <= rate / 70; l++) {
            double c = 0, e1 = 0;

            for (int i = 0; i < win; i++) {
                c += (double) x[i] * x[i + l];
                e1 += (double) x[i + l] * x[i + l];
            }
            if (c / sqrt(e0 * e1 + 1) > best) {
                best = c / sqrt(e0 * e1 + 1);
                lag = l;
            }
        }
        if (best > 0.6) f0[n++] = (double) rate / lag;
    }
    assert_true(n > 5);
    for (int i = 1; i < n; i++)                     // insertion sort
        for (int k = i; k > 0 && f0[k - 1] > f0[k]; k--) {
            double t = f0[k];

            f0[k] = f0[k - 1];
            f0[k - 1] = t;
        }
    return f0[n / 2];
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
        {   // durations change, pitch does not (within 10%)
            int    rate = tts_voice_rate(tts_voice(VOICES[v]));
            double f1 = median_f0(&n1, rate), f2 = median_f0(&n2, rate);
            double f05 = median_f0(&n05, rate);

            printf("# %-5s speed 2: %.2fx the samples, 0.5: %.2fx; median "
                   "pitch %.0f Hz at 1, %.0f at 2, %.0f at 0.5\n", VOICES[v],
                   r2, r05, f1, f2, f05);
            assert_true(fabs(f2 / f1 - 1) < 0.1 && fabs(f05 / f1 - 1) < 0.1);
        }
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
    {   // a chunk built by hand, not decoded: its phones are checked too
        UnitWord w = { "cat", "k ae1 zz", "", "" };
        Units    bad = { &w, 1, 3, false, NULL };

        o.speed = 1;
        assert_int_equal(tts_synth(tts_voice("rms"), &bad, &o, collect, &p,
                                   &err), -1);
        assert_string_equal(err.msg, "tts: word 0: unknown phone 'zz'");
    }
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

/* Any chunk that units_decode accepts can be synthesized: random words
 * of random phones (with or without vowels, any stress), random
 * punctuation, through every voice. Flite never exit()s, nothing crashes. */
static void test_any_units(void **state) {
    const cst_phoneset *ps = &us_phoneset;
    static uint8_t      bytes[UNITS_MAX_BYTES];
    unsigned            seed = 99;

    for (int r = 0; r < 24; r++) {
        char        text[40][16], phones[40][128], pre[40][4], punc[40][4];
        UnitWord    w[40];
        Units       u = { w, 1 + rand_r(&seed) % 40, 0, false, NULL }, back;
        Err         err;
        long        n;

        for (int i = 0; i < u.n_words; i++) {
            int  np = rand_r(&seed) % 9, o = 0;

            snprintf(text[i], sizeof(text[i]), "w%d", rand_r(&seed) % 1000);
            snprintf(pre[i], sizeof(pre[i]), "%s", rand_r(&seed) % 4 ? ""
                     : "\"");
            snprintf(punc[i], sizeof(punc[i]), "%c",
                     ".,?!;: x"[rand_r(&seed) % 8]);
            if (punc[i][0] == ' ' || punc[i][0] == 'x') punc[i][0] = '\0';
            phones[i][0] = '\0';
            for (int k = 0; k < np; k++) {
                const char *ph = ps->phonenames[rand_r(&seed) % ps->num_phones];
                bool        vowel;

                if (!units_phone_known(ph, strlen(ph), &vowel)) continue;
                o += snprintf(phones[i] + o, sizeof(phones[i]) - (size_t) o,
                              "%s%s%s", o > 0 ? " " : "", ph,
                              vowel ? (rand_r(&seed) % 2 ? "1" : "0") : "");
            }
            w[i] = (UnitWord) { text[i], phones[i], pre[i], punc[i] };
        }
        assert_true((n = units_encode(&u, bytes, sizeof(bytes))) > 0);
        if (units_decode(&back, bytes, (size_t) n, &err) < 0)
            fail_msg("%s", err.msg);
        for (size_t v = 0; v < 4; v++) {
            Pcm          p = { 0 };
            TtsSynthOpts o = { 0.5f + (float) (rand_r(&seed) % 8) / 2,
                               r % 2 == 0, r % 3 == 0, false };

            if (tts_synth(tts_voice(VOICES[v]), &back, &o, collect, &p,
                          &err) < 0)
                fail_msg("%s: %s", VOICES[v], err.msg);
            free(p.pcm);
        }
        units_free(&back);
    }
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
        double          audio = 0, busy = 0, ttfs[9], t_an;
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
        t_an = clock_now_s();
        assert_int_equal(tts_analyze(a, chunk, strlen(chunk), &u, &err), 0);
        t_an = clock_now_s() - t_an;
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
               "\"%s\": analysis %.1f ms, first samples after %.1f ms "
               "(synthesis, median of 9), silence trimmed %.0f%% (%.0f ms "
               "per sentence)\n",
               VOICES[v], busy / audio, chunk, t_an * 1e3, ttfs[4] * 1e3,
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
        cmocka_unit_test(test_any_units),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_measure),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, NULL);
}

/* test_listener.c -- the listener core (engine/listener/lscore.h), driven
 * as the stage's loop drives it but without processes: a pool from
 * pool_create, the audio in its blocks as the frontend puts it there,
 * the outbox read on its eventfd. The speech is Flite's (tts/), made
 * here, so the test needs no recording; real recordings are
 * t/engine/listen.t's.
 *
 *   - a transcription: TRANSCRIPT segments in order (input, text = its
 *     words, times inside the audio and increasing, words only when
 *     asked), most of the sentence's words heard, DONE's input_audio_ms
 *     the audio's length; the same audio twice, on either slot, gives
 *     the same segments;
 *   - two inputs: segments of each, input_audio_ms their sum;
 *   - bad audio: 400 naming the input's param (not audio, no samples,
 *     over max_audio_seconds);
 *   - bytes: fewer or more than declared fail the request;
 *   - a cancel in mid-recognition ends with CANCELLED, promptly;
 *   - the byte budget refuses a request with 503 while another is held,
 *     never the only one;
 *   - one slot runs one request at a time;
 *   - a stop ends every held request with an ERROR. */

#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <yajl/yajl_tree.h>

#include "analyze.h"
#include "lscore.h"
#include "synth.h"

#define BLOCKS      64
#define BLOCK_SIZE  4096

static const char *SENTENCE = "the quick brown fox jumps over the lazy dog "
                              "and the cat sat on the mat";

typedef struct {
    uint8_t *p;                 // malloc'd
    size_t   n, cap;
} Buf;

typedef struct {
    char     *seg[64];          // the segments' JSON, malloc'd
    int       n_seg;
    OmniDone  done;
    LsOutKind end;
    int       status;
    char      param[64];
    char      msg[ERR_MAX];
    bool      started, over;
    double    t_over;
} Got;

static Pool pool;

static void buf_put(Buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static int keep(void *ud, const int16_t *pcm, size_t n) {
    buf_put(ud, pcm, n * sizeof(*pcm));
    return 0;
}

static void le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t) (v >> (8 * i));
}

/* text spoken by Flite's rms voice (16 kHz), `times` times over, as a
 * 16-bit mono WAV file. */
static Buf speech_wav(const char *text, int times) {
    static uint8_t hdr[44] = "RIFF....WAVEfmt \x10\0\0\0\x01\0\x01\0"
                             "\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data....";
    TtsAnalyzer *a;
    TtsSynthOpts o = { .speed = 1.0f, .first = true, .last = true };
    Units        u;
    Err          err;
    Buf          pcm = { 0 }, wav = { 0 };

    assert_int_equal(tts_init(&err), 0);
    a = tts_analyzer_new(&err);
    assert_non_null(a);
    assert_int_equal(tts_analyze(a, text, strlen(text), &u, &err), 0);
    assert_true(tts_synth(tts_voice("rms"), &u, &o, keep, &pcm, &err) > 0);
    units_free(&u);
    tts_analyzer_free(a);
    le32(hdr + 4, (uint32_t) (36 + pcm.n * times));
    le32(hdr + 40, (uint32_t) (pcm.n * times));
    buf_put(&wav, hdr, sizeof(hdr));
    for (int i = 0; i < times; i++) buf_put(&wav, pcm.p, pcm.n);
    free(pcm.p);
    return wav;
}

static double wav_ms(const Buf *w) {
    return (double) (w->n - 44) / 2 / 16.0;
}

static OmniRequest request(const char *json) {
    OmniRequest r;
    ReqError    e;

    if (request_parse(&r, json, strlen(json), &e) != 0) {
        fail_msg("%s: %s", e.param, e.err.msg);
    }
    return r;
}

/* A transcription of one input of n bytes (words: timings wanted). */
static OmniRequest transcription(size_t n, bool words, double max_s) {
    char json[256];

    snprintf(json, sizeof(json), "{\"transcribe\":{\"language\":\"en\","
             "\"words\":%s},\"audio_in\":[{\"format\":\"auto\",\"bytes\":"
             "%zu,\"param\":\"file\"}],\"max_audio_seconds\":%g}",
             words ? "true" : "false", n, max_s);
    return request(json);
}

static LsCore *core(int slots, uint64_t max_bytes, OmniStats *st) {
    LsConfig cfg = { slots, 16, max_bytes, &pool, { NULL }, st };
    Err      err;
    LsCore  *c = ls_new(&cfg, &err);

    if (c == NULL) fail_msg("ls_new: %s", err.msg);
    return c;
}

/* Submits request id for json-described audio; 0 or the refusal's
 * status. */
static int submit(LsCore *c, uint64_t id, OmniRequest r) {
    LsRefusal why;
    int       rc = ls_submit(c, id, &r, &why);

    request_free(&r);
    return rc == 0 ? 0 : why.status;
}

/* The bytes of data through pool blocks, as the frontend sends them. */
static void send_bytes(LsCore *c, uint64_t id, const uint8_t *data,
                       size_t n) {
    for (size_t off = 0; off < n; off += BLOCK_SIZE) {
        int      b = pool_alloc(&pool, 0, id);
        uint32_t k = n - off < BLOCK_SIZE ? (uint32_t) (n - off)
                                          : BLOCK_SIZE;

        assert_true(b >= 0);
        memcpy(pool_block(&pool, (uint32_t) b), data + off, k);
        ls_audio(c, id, (PoolRef) { (uint32_t) b, 0, k });
    }
}

static void send_all(LsCore *c, uint64_t id, const Buf *w) {
    send_bytes(c, id, w->p, w->n);
    ls_input_done(c, id);
}

/* Reads the outbox as the loop would until requests 1..n are over. */
static void drain(LsCore *c, Got *got, int n) {
    int over = 0;

    for (int i = 0; i < n; i++) over += got[i].over;
    while (over < n) {
        struct pollfd pf = { ls_wake_fd(c), POLLIN, 0 };
        LsOut         o;

        assert_true(poll(&pf, 1, 60000) == 1);
        while (ls_next(c, &o)) {
            Got *g = &got[o.id - 1];

            assert_false(g->over);
            if (o.kind == LS_OUT_STARTED) {
                g->started = true;
            } else if (o.kind == LS_OUT_SEGMENT) {
                assert_true(g->n_seg < 64);
                g->seg[g->n_seg] = strndup(o.json, o.len);
                g->n_seg++;
            } else {
                g->end = o.kind;
                g->done = o.done;
                if (o.kind == LS_OUT_ERROR) {
                    g->status = o.status;
                    snprintf(g->param, sizeof(g->param), "%s", o.param);
                    snprintf(g->msg, sizeof(g->msg), "%s", o.msg);
                }
                g->over = true;
                g->t_over = clock_now_s();
                over++;
            }
        }
    }
}

static void got_free(Got *g, int n) {
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < g[i].n_seg; k++) free(g[i].seg[k]);
        memset(&g[i], 0, sizeof(g[i]));
    }
}

static void assert_pool_empty(void) {
    PoolStats st;

    pool_stats(&pool, &st);
    assert_int_equal(st.used, 0);
}

static yajl_val get(yajl_val v, const char *key, yajl_type t) {
    const char *path[] = { key, NULL };

    return yajl_tree_get(v, path, t);
}

/* Checks the segments of g: each one input's, text its words' (when
 * words), times increasing within [0, ms]. Returns every text joined. */
static char *check_segments(const Got *g, bool words, double ms) {
    static char all[4096];
    double      last = 0;

    all[0] = '\0';
    for (int k = 0; k < g->n_seg; k++) {
        char     err[128], joined[1024] = "";
        yajl_val v = yajl_tree_parse(g->seg[k], err, sizeof(err));
        yajl_val text, w;
        double   s, e;

        if (v == NULL) fail_msg("segment %d: %s: %s", k, err, g->seg[k]);
        assert_non_null(get(v, "input", yajl_t_number));
        text = get(v, "text", yajl_t_string);
        assert_non_null(text);
        s = YAJL_GET_DOUBLE(get(v, "start", yajl_t_number));
        e = YAJL_GET_DOUBLE(get(v, "end", yajl_t_number));
        assert_true(s >= last - 0.005 && s <= e && e <= ms / 1e3 + 0.05);
        assert_non_null(get(v, "avg_logprob", yajl_t_number));
        last = s;
        w = get(v, "words", yajl_t_array);
        if (!words) assert_null(w);
        for (size_t i = 0; words && w != NULL && i < w->u.array.len; i++) {
            yajl_val x = w->u.array.values[i];
            double   ws = YAJL_GET_DOUBLE(get(x, "start", yajl_t_number));
            double   we = YAJL_GET_DOUBLE(get(x, "end", yajl_t_number));

            assert_true(ws >= s - 0.005 && we <= e + 0.005 && ws <= we);
            snprintf(joined + strlen(joined), sizeof(joined) - strlen(joined),
                     "%s%s", i > 0 ? " " : "",
                     YAJL_GET_STRING(get(x, "word", yajl_t_string)));
        }
        if (words) {
            assert_non_null(w);
            assert_string_equal(joined, YAJL_GET_STRING(text));
        }
        snprintf(all + strlen(all), sizeof(all) - strlen(all), "%s%s",
                 k > 0 ? " " : "", YAJL_GET_STRING(text));
        yajl_tree_free(v);
    }
    return all;
}

/* How many of ref's words hyp has, in order (a longest common
 * subsequence of words): a recall that ignores insertions. */
static int words_heard(const char *ref, const char *hyp) {
    char  r[512], h[4096], *rw[64], *hw[256], *sv;
    int   nr = 0, nh = 0, lcs[65][257];

    snprintf(r, sizeof(r), "%s", ref);
    snprintf(h, sizeof(h), "%s", hyp);
    for (char *t = strtok_r(r, " ", &sv); t && nr < 64;
         t = strtok_r(NULL, " ", &sv)) rw[nr++] = t;
    for (char *t = strtok_r(h, " ", &sv); t && nh < 256;
         t = strtok_r(NULL, " ", &sv)) hw[nh++] = t;
    for (int i = 0; i <= nr; i++) {
        for (int j = 0; j <= nh; j++) {
            lcs[i][j] = i == 0 || j == 0 ? 0
                : strcmp(rw[i - 1], hw[j - 1]) == 0 ? lcs[i - 1][j - 1] + 1
                : lcs[i - 1][j] > lcs[i][j - 1] ? lcs[i - 1][j]
                                                : lcs[i][j - 1];
        }
    }
    return lcs[nr][nh];
}

static void test_transcribe(void **state) {
    Buf       w = speech_wav(SENTENCE, 1);
    OmniStats st = { 0 };
    LsCore   *c = core(2, 64 << 20, &st);
    Got       g[3] = { 0 };
    char     *text;
    int       heard;

    (void) state;
    for (uint64_t id = 1; id <= 3; id++) {
        assert_int_equal(submit(c, id, transcription(w.n, id != 3, 600)), 0);
        send_all(c, id, &w);
    }
    drain(c, g, 3);
    for (int i = 0; i < 3; i++) {
        if (g[i].end != LS_OUT_DONE) fail_msg("%d: %s", i, g[i].msg);
        assert_true(g[i].started);
        assert_true(g[i].n_seg >= 1);
        assert_true(abs((int) g[i].done.input_audio_ms
                        - (int) wav_ms(&w)) <= 1);
    }
    text = check_segments(&g[0], true, wav_ms(&w));
    heard = words_heard(SENTENCE, text);
    print_message("heard: %s (%d of 18 words)\n", text, heard);
    assert_true(heard >= 12);
    /* the same audio on either slot: the same segments */
    assert_int_equal(g[1].n_seg, g[0].n_seg);
    for (int k = 0; k < g[0].n_seg; k++) {
        assert_string_equal(g[1].seg[k], g[0].seg[k]);
    }
    assert_string_equal(check_segments(&g[2], false, wav_ms(&w)), text);
    assert_true(atomic_load(&st.listener.segments) >= 3);
    assert_true(atomic_load(&st.listener.words) >= 3u * 12);
    assert_true(atomic_load(&st.listener.audio_ms) + 3
                >= (uint64_t) (3 * wav_ms(&w)));
    assert_int_equal(atomic_load(&st.listener.slots), 2);
    assert_int_equal(atomic_load(&st.listener.slots_busy), 0);
    assert_int_equal(ls_held(c), 0);
    ls_free(c);
    got_free(g, 3);
    assert_pool_empty();
    free(w.p);
}

static void test_two_inputs(void **state) {
    Buf         a = speech_wav("hello there", 1);
    Buf         b = speech_wav("the cat sat on the mat", 1);
    LsCore     *c = core(1, 64 << 20, NULL);
    Got         g[1] = { 0 };
    char        json[512];
    bool        seen[2] = { false, false };

    (void) state;
    snprintf(json, sizeof(json), "{\"messages\":[{\"role\":\"user\","
             "\"content\":[{\"type\":\"input_audio\",\"index\":0},"
             "{\"type\":\"input_audio\",\"index\":1}]}],\"audio_in\":["
             "{\"format\":\"wav\",\"bytes\":%zu,\"param\":\"a\"},"
             "{\"format\":\"wav\",\"bytes\":%zu,\"param\":\"b\"}]}",
             a.n, b.n);
    assert_int_equal(submit(c, 1, request(json)), 0);
    send_bytes(c, 1, a.p, a.n);
    send_bytes(c, 1, b.p, b.n);
    ls_input_done(c, 1);
    drain(c, g, 1);
    if (g[0].end != LS_OUT_DONE) fail_msg("%s", g[0].msg);
    for (int k = 0; k < g[0].n_seg; k++) {
        seen[strstr(g[0].seg[k], "\"input\":1") != NULL] = true;
    }
    assert_true(seen[0] && seen[1]);
    assert_true(abs((int) g[0].done.input_audio_ms
                    - (int) (wav_ms(&a) + wav_ms(&b))) <= 2);
    ls_free(c);
    got_free(g, 1);
    free(a.p);
    free(b.p);
}

static void test_bad_audio(void **state) {
    static const char text[] = "this is text, not a sound file at all; "
                               "nothing in it is audio of any kind.";
    Buf     w = speech_wav(SENTENCE, 1);
    Buf     empty = { 0 };
    LsCore *c = core(1, 64 << 20, NULL);
    Got     g[3] = { 0 };

    (void) state;
    buf_put(&empty, w.p, 44);
    le32(empty.p + 4, 36);
    le32(empty.p + 40, 0);
    assert_int_equal(submit(c, 1, transcription(sizeof(text) - 1, false,
                                                600)), 0);
    send_bytes(c, 1, (const uint8_t *) text, sizeof(text) - 1);
    ls_input_done(c, 1);
    assert_int_equal(submit(c, 2, transcription(empty.n, false, 600)), 0);
    send_all(c, 2, &empty);
    assert_int_equal(submit(c, 3, transcription(w.n, false, 0.5)), 0);
    send_all(c, 3, &w);
    drain(c, g, 3);
    for (int i = 0; i < 3; i++) {
        print_message("%d: %d %s\n", i, g[i].status, g[i].msg);
        assert_int_equal(g[i].end, LS_OUT_ERROR);
        assert_int_equal(g[i].status, 400);
        assert_string_equal(g[i].param, "file");
    }
    assert_non_null(strstr(g[1].msg, "no audio"));
    assert_non_null(strstr(g[2].msg, "0.5 seconds"));
    ls_free(c);
    got_free(g, 3);
    assert_pool_empty();
    free(w.p);
    free(empty.p);
}

static void test_bytes_mismatch(void **state) {
    Buf     w = speech_wav("hello", 1);
    LsCore *c = core(1, 64 << 20, NULL);
    Got     g[2] = { 0 };

    (void) state;
    assert_int_equal(submit(c, 1, transcription(w.n + 10, false, 600)), 0);
    send_all(c, 1, &w);                     // 10 bytes short
    assert_int_equal(submit(c, 2, transcription(w.n - 10, false, 600)), 0);
    send_all(c, 2, &w);                     // 10 bytes over
    drain(c, g, 2);
    assert_int_equal(g[0].end, LS_OUT_ERROR);
    assert_int_equal(g[0].status, 500);
    assert_non_null(strstr(g[0].msg, "ended before"));
    assert_int_equal(g[1].end, LS_OUT_ERROR);
    assert_non_null(strstr(g[1].msg, "more audio bytes"));
    ls_free(c);
    got_free(g, 2);
    assert_pool_empty();
    free(w.p);
}

static void test_cancel(void **state) {
    Buf     w = speech_wav(SENTENCE, 8);        // ~30 s: seconds of work
    LsCore *c = core(1, 64 << 20, NULL);
    Got     g[1] = { 0 };
    double  t0;

    (void) state;
    assert_int_equal(submit(c, 1, transcription(w.n, false, 600)), 0);
    send_all(c, 1, &w);
    while (!g[0].started) {                     // wait for the worker
        LsOut o;
        struct pollfd pf = { ls_wake_fd(c), POLLIN, 0 };

        assert_true(poll(&pf, 1, 10000) == 1);
        while (ls_next(c, &o)) {
            assert_int_equal(o.kind, LS_OUT_STARTED);
            g[0].started = true;
        }
    }
    t0 = clock_now_s();
    assert_true(ls_cancel(c, 1));
    assert_false(ls_cancel(c, 99));             // unknown: ack at once
    drain(c, g, 1);
    assert_int_equal(g[0].end, LS_OUT_CANCELLED);
    print_message("cancelled in %.3f s\n", g[0].t_over - t0);
    assert_true(g[0].t_over - t0 < 2.0);
    assert_int_equal(ls_held(c), 0);
    ls_free(c);
    got_free(g, 1);
    assert_pool_empty();
    free(w.p);
}

static void test_budget(void **state) {
    Buf     w = speech_wav("hello", 1), w2 = speech_wav("hello", 2);
    LsCore *c = core(1, w.n + w.n / 2, NULL);   // one request's bytes
    Got     g[3] = { 0 };

    (void) state;
    assert_int_equal(submit(c, 1, transcription(w.n, false, 600)), 0);
    assert_int_equal(submit(c, 2, transcription(w.n, false, 600)), 503);
    send_all(c, 1, &w);
    drain(c, g, 1);
    assert_int_equal(g[0].end, LS_OUT_DONE);
    /* alone, a request over the budget still goes */
    assert_true(w2.n > w.n + w.n / 2);
    assert_int_equal(submit(c, 3, transcription(w2.n, false, 600)), 0);
    send_all(c, 3, &w2);
    g[1].over = true;                           // id 2 was refused
    drain(c, g, 3);
    assert_int_equal(g[2].end, LS_OUT_DONE);
    ls_free(c);
    got_free(g, 3);
    assert_pool_empty();
    free(w.p);
    free(w2.p);
}

static void test_one_slot(void **state) {
    Buf     w = speech_wav("hello there how are you", 1);
    LsCore *c = core(1, 64 << 20, NULL);
    int     running = 0, most = 0, over = 0;

    (void) state;
    for (uint64_t id = 1; id <= 3; id++) {
        assert_int_equal(submit(c, id, transcription(w.n, false, 600)), 0);
        send_all(c, id, &w);
    }
    while (over < 3) {
        struct pollfd pf = { ls_wake_fd(c), POLLIN, 0 };
        LsOut         o;

        assert_true(poll(&pf, 1, 60000) == 1);
        while (ls_next(c, &o)) {
            if (o.kind == LS_OUT_STARTED) running++;
            if (o.kind == LS_OUT_DONE) running--, over++;
            assert_true(o.kind != LS_OUT_ERROR);
            most = running > most ? running : most;
        }
    }
    assert_int_equal(most, 1);
    ls_free(c);
    assert_pool_empty();
    free(w.p);
}

static void test_stop(void **state) {
    Buf     w = speech_wav(SENTENCE, 4);
    LsCore *c = core(1, 64 << 20, NULL);
    Got     g[2] = { 0 };

    (void) state;
    assert_int_equal(submit(c, 1, transcription(w.n, false, 600)), 0);
    send_all(c, 1, &w);
    assert_int_equal(submit(c, 2, transcription(w.n, false, 600)), 0);
    send_bytes(c, 2, w.p, w.n / 2);             // still receiving
    ls_stop(c, "stopping for the test");
    drain(c, g, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(g[i].end, LS_OUT_ERROR);
        assert_string_equal(g[i].msg, "stopping for the test");
    }
    ls_free(c);
    got_free(g, 2);
    assert_pool_empty();
    free(w.p);
}

static int setup(void **state) {
    Err err;

    (void) state;
    return pool_create(&pool, BLOCKS, BLOCK_SIZE, &err);
}

static int teardown(void **state) {
    (void) state;
    pool_destroy(&pool);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transcribe),
        cmocka_unit_test(test_two_inputs),
        cmocka_unit_test(test_bad_audio),
        cmocka_unit_test(test_bytes_mismatch),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_one_slot),
        cmocka_unit_test(test_stop),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, teardown);
}

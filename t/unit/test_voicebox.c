/* test_voicebox.c -- the voicebox core (engine/voicebox/vbcore.h), driven
 * as the stage's loop drives it but without processes: a pool from
 * pool_create, units from Flite's front end (tts/analyze.h) in their byte
 * form, the outbox read on its eventfd.
 *
 *   - a 3-chunk request in every format comes out as that format's file
 *     (container magic; decoded by t/tools/audio_decode.c, which shares
 *     no code with the encoders: as long as DONE's audio_ms says, and not
 *     silent) with DONE's counts;
 *   - the PCM streamed chunk by chunk equals the same chunks synthesized
 *     one after the other and resampled in one go;
 *   - a cancel in mid-synthesis ends with CANCELLED and the pool empty;
 *   - slots bound the concurrency (N+3 requests, at most N at once);
 *   - a full pool stalls the worker, not the loop, until a block is freed.
 *
 * The last three use a synthesizer of their own (VbConfig.synth) that
 * makes a tone and records who runs when. */

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "../tools/audio_decode.h"
#include "analyze.h"
#include "resample.h"
#include "vbcore.h"

#define BLOCKS      64
#define BLOCK_SIZE  4096

static const char *TEXTS[3] = {
    "Hello there,", "how are you", "doing today?",
};

typedef struct {
    uint8_t  *bytes;            // the file so far, malloc'd
    size_t    n;
    OmniDone  done;
    VbOutKind end;
    char      msg[ERR_MAX];     // VB_OUT_ERROR's
    bool      started, over;
} Got;

/* The units of TEXTS[i] in a pool block; last marks the third. */
static PoolRef put_units(Pool *p, int i) {
    TtsAnalyzer *a;
    Units        u;
    Err          err;
    PoolRef      r = { 0, 0, 0 };
    long         n;
    int          b = pool_alloc(p, 1, 0);

    assert_true(b >= 0);
    a = tts_analyzer_new(&err);
    assert_non_null(a);
    assert_int_equal(tts_analyze(a, TEXTS[i], strlen(TEXTS[i]), &u, &err), 0);
    u.last = i == 2;
    n = units_encode(&u, pool_block(p, (uint32_t) b), p->block_size);
    assert_true(n > 0);
    units_free(&u);
    tts_analyzer_free(a);
    r.block = (uint32_t) b;
    r.length = (uint32_t) n;
    return r;
}

/* Reads the outbox as the loop would until every request in got[] (ids
 * 1..n) is over; blocks are appended and unreferenced. */
static void drain(VbCore *c, Pool *p, Got *got, int n) {
    int over = 0;

    for (int i = 0; i < n; i++) over += got[i].over;
    while (over < n) {
        struct pollfd pf = { vb_wake_fd(c), POLLIN, 0 };
        VbOut         o;

        assert_true(poll(&pf, 1, 30000) == 1);
        while (vb_next(c, &o)) {
            Got *g = &got[o.id - 1];

            assert_false(g->over);
            if (o.kind == VB_OUT_STARTED) {
                g->started = true;
            } else if (o.kind == VB_OUT_BLOCK) {
                g->bytes = realloc(g->bytes, g->n + o.ref.length);
                memcpy(g->bytes + g->n, (uint8_t *) pool_block(p, o.ref.block)
                       + o.ref.offset, o.ref.length);
                g->n += o.ref.length;
                assert_int_equal(pool_unref(p, o.ref.block), 1);
            } else {
                g->end = o.kind;
                g->done = o.done;
                if (o.kind == VB_OUT_ERROR) {
                    snprintf(g->msg, sizeof(g->msg), "%s", o.msg);
                }
                g->over = true;
                over++;
            }
        }
    }
}

static VbCore *core(Pool *p, int slots, VbSynth synth, OmniStats *st) {
    VbConfig cfg = { slots, 64, p, 7, synth, st };
    Err      err;
    VbCore  *c = vb_new(&cfg, &err);

    assert_non_null(c);
    return c;
}

static SpeechParams params(AudioFormat f) {
    SpeechParams sp = { true, speech_voice("alloy"), f, 1.0f, SPEECH_LATENCY,
                        NULL };

    assert_non_null(sp.voice);
    return sp;
}

static void assert_pool_empty(Pool *p) {
    PoolStats st;

    pool_stats(p, &st);
    assert_int_equal(st.used, 0);
}

/* Request id's n chunks (TEXTS[0..n)), then its input's end. */
static void feed(VbCore *c, Pool *p, uint64_t id, int n, const OmniDone *d) {
    for (int i = 0; i < n; i++) vb_units(c, id, put_units(p, i));
    vb_input_done(c, id, d);
}

/* Each of the n requests ended with DONE; frees what they got. */
static void expect_done(Got *g, int n) {
    for (int i = 0; i < n; i++) {
        assert_int_equal(g[i].end, VB_OUT_DONE);
        free(g[i].bytes);
        g[i].bytes = NULL;
    }
}

/* One request of 3 chunks in format f, read whole. */
static Got speak(Pool *p, AudioFormat f) {
    VbCore      *c = core(p, 2, NULL, NULL);
    SpeechParams sp = params(f);
    OmniDone     d = { .prompt_tokens = 7, .audio_tokens = 21 };
    Got          g = { 0 };
    Err          err;

    assert_int_equal(vb_submit(c, 1, &sp, &err), 0);
    feed(c, p, 1, 3, &d);
    drain(c, p, &g, 1);
    vb_free(c);
    if (g.end != VB_OUT_DONE) fail_msg("%s: %s", speech_format_name(f), g.msg);
    assert_true(g.started);
    assert_int_equal(g.done.prompt_tokens, 7);
    assert_int_equal(g.done.audio_tokens, 21);
    assert_true(g.done.audio_ms > 1000 && g.done.audio_ms < 6000);
    assert_pool_empty(p);
    return g;
}

/* g decodes as format f to mono audio of about audio_ms (the codecs' own
 * priming and padding aside), and not silence. */
static void expect_decodes(AudioFormat f, const Got *g) {
    AudioDecoded d;
    char         why[256];
    double       rms, peak, ms;

    if (audio_decode(speech_format_name(f), g->bytes, g->n, SPEECH_RATE, &d,
                     why, sizeof(why)) != 0)
    {
        fail_msg("%s: %s", speech_format_name(f), why);
    }
    assert_int_equal(d.channels, 1);
    ms = (double) d.pcm_frames * 1000.0 / d.pcm_rate;
    if (ms < g->done.audio_ms - 10.0 || ms > g->done.audio_ms + 150.0) {
        fail_msg("%s: %.1f ms decoded, %u ms sent", speech_format_name(f),
                 ms, g->done.audio_ms);
    }
    audio_decoded_level(&d, &rms, &peak);
    assert_true(rms > 0.01);
    audio_decoded_free(&d);
}

static void test_formats(void **state) {
    Pool *p = *state;

    for (int f = 0; f < AUDIO_N_FORMATS; f++) {
        Got      g = speak(p, (AudioFormat) f);
        uint8_t *b = g.bytes;

        assert_true(g.n > 100);
        switch ((AudioFormat) f) {
        case AUDIO_MP3:     // an ID3 tag or a frame sync
            assert_true(memcmp(b, "ID3", 3) == 0
                        || (b[0] == 0xFF && (b[1] & 0xE0) == 0xE0));
            break;
        case AUDIO_OPUS:
            assert_memory_equal(b, "OggS", 4);
            assert_memory_equal(b + 28, "OpusHead", 8);
            break;
        case AUDIO_AAC:     // ADTS sync
            assert_true(b[0] == 0xFF && (b[1] & 0xF6) == 0xF0);
            break;
        case AUDIO_FLAC:
            assert_memory_equal(b, "fLaC", 4);
            break;
        case AUDIO_WAV:
            assert_memory_equal(b, "RIFF", 4);
            assert_memory_equal(b + 8, "WAVE", 4);
            break;
        case AUDIO_PCM:     // whole samples, audio_ms of them
            assert_int_equal(g.n % 2, 0);
            assert_int_equal(g.n / 2 * 1000 / SPEECH_RATE, g.done.audio_ms);
            break;
        default:
            fail();
        }
        expect_decodes((AudioFormat) f, &g);
        free(g.bytes);
    }
}

/* A units block that does not decode fails its request, with the chunk
 * named; a request failed by the loop (vb_error) ends with its message;
 * the others go on. */
static void test_errors(void **state) {
    Pool        *p = *state;
    VbCore      *c = core(p, 2, NULL, NULL);
    SpeechParams sp = params(AUDIO_WAV);
    OmniDone     d = { 0 };
    Got          g[3] = { { 0 } };
    PoolRef      bad = put_units(p, 0);
    Err          err;

    memset(pool_block(p, bad.block), 0xA5, bad.length);
    for (uint64_t id = 1; id <= 3; id++) {
        assert_int_equal(vb_submit(c, id, &sp, &err), 0);
    }
    assert_int_equal(vb_submit(c, 2, &sp, &err), -1);     // held already
    vb_units(c, 1, bad);
    vb_input_done(c, 1, &d);
    assert_true(vb_error(c, 2, "input frame type 9 is not units"));
    feed(c, p, 3, 3, &d);
    drain(c, p, g, 3);
    assert_int_equal(g[0].end, VB_OUT_ERROR);
    if (strstr(g[0].msg, "units chunk 1: ") == NULL) fail_msg("%s", g[0].msg);
    assert_int_equal(g[1].end, VB_OUT_ERROR);
    assert_string_equal(g[1].msg, "input frame type 9 is not units");
    expect_done(&g[2], 1);
    assert_int_equal(vb_held(c), 0);
    vb_free(c);
    assert_pool_empty(p);
    free(g[0].bytes);
    free(g[1].bytes);
}

typedef struct {
    int16_t *pcm;
    size_t   n;
} Pcm;

static int keep_pcm(void *ud, const int16_t *pcm, size_t n) {
    Pcm *o = ud;

    o->pcm = realloc(o->pcm, (o->n + n) * sizeof(*pcm));
    memcpy(o->pcm + o->n, pcm, n * sizeof(*pcm));
    o->n += n;
    return 0;
}

/* Streamed PCM == the three chunks synthesized with the same flags, then
 * resampled at once. */
static void test_stream_equals_whole(void **state) {
    Pool           *p = *state;
    Got             g = speak(p, AUDIO_PCM);
    const TtsVoice *v = tts_voice(speech_voice("alloy")->flite);
    Pcm             in = { 0 };
    Resampler      *rs;
    int16_t        *out;
    size_t          cap, n, m;
    Err             err;

    for (int i = 0; i < 3; i++) {
        PoolRef      r = put_units(p, i);
        TtsSynthOpts o = { .speed = 1.0f, .first = i == 0, .last = i == 2 };
        Units        u;

        assert_int_equal(units_decode(&u, pool_block(p, r.block), r.length,
                                      &err), 0);
        assert_true(tts_synth(v, &u, &o, keep_pcm, &in, &err) > 0);
        units_free(&u);
        pool_unref(p, r.block);
    }
    rs = resample_new(tts_voice_rate(v), SPEECH_RATE, &err);
    cap = resample_out_max(rs, in.n) + 8192;
    out = malloc(cap * sizeof(*out));
    assert_int_equal(resample_process(rs, in.pcm, in.n, out, cap, &n, &err),
                     0);
    assert_int_equal(resample_flush(rs, out + n, cap - n, &m, &err), 0);
    assert_int_equal(g.n, (n + m) * 2);
    assert_memory_equal(g.bytes, out, g.n);
    resample_free(rs);
    free(out);
    free(in.pcm);
    free(g.bytes);
}

/* ---- A synthesizer of our own: a tone, with a gate and a census -------- */

static _Atomic int running, most, gate_open = 1, entered;
static _Atomic int allow = 1 << 30;         // calls that may start
static _Atomic int firsts[64], n_firsts;    // opts->first, in call order
static _Atomic long tone_samples = 1600;    // per sink call

static long tone_synth(const TtsVoice *v, const Units *u,
                       const TtsSynthOpts *o, TtsPcmSink sink, void *ud,
                       Err *err)
{
    static const int16_t zero[16000];
    int  now = atomic_fetch_add(&running, 1) + 1, m = atomic_load(&most);
    int  turn = atomic_fetch_add(&entered, 1), slot;
    long sent = 0;

    while (now > m && !atomic_compare_exchange_weak(&most, &m, now)) {}
    while (turn >= atomic_load(&allow)) usleep(1000);
    slot = atomic_fetch_add(&n_firsts, 1);
    if (slot < 64) atomic_store(&firsts[slot], o->first);
    for (int i = 0; i < 10 || !atomic_load(&gate_open); i++) {
        long k = atomic_load(&tone_samples);

        if (sink(ud, zero, (size_t) k) != 0) {
            atomic_fetch_sub(&running, 1);
            return err_set(err, "output refused");
        }
        sent += k;
        usleep(1000);
    }
    atomic_fetch_sub(&running, 1);
    return sent;
}

static void test_cancel_mid_synthesis(void **state) {
    Pool        *p = *state;
    VbCore      *c = core(p, 2, tone_synth, NULL);
    SpeechParams sp = params(AUDIO_PCM);
    Got          g = { 0 };
    Err          err;

    atomic_store(&gate_open, 0);
    atomic_store(&entered, 0);
    assert_int_equal(vb_submit(c, 1, &sp, &err), 0);
    for (int i = 0; i < 3; i++) vb_units(c, 1, put_units(p, i));
    while (atomic_load(&entered) == 0) usleep(1000);
    assert_true(vb_cancel(c, 1));
    drain(c, p, &g, 1);
    assert_int_equal(g.end, VB_OUT_CANCELLED);
    assert_int_equal(vb_held(c), 0);
    assert_false(vb_cancel(c, 1));
    atomic_store(&gate_open, 1);
    vb_free(c);
    assert_pool_empty(p);
    free(g.bytes);
}

static void test_slots_bound(void **state) {
    Pool        *p = *state;
    OmniStats    st = { 0 };
    VbCore      *c = core(p, 2, tone_synth, &st);
    SpeechParams sp = params(AUDIO_PCM);
    OmniDone     d = { 0 };
    Got          g[5] = { { 0 } };
    Err          err;

    atomic_store(&most, 0);
    for (uint64_t id = 1; id <= 5; id++) {
        assert_int_equal(vb_submit(c, id, &sp, &err), 0);
        feed(c, p, id, 3, &d);
    }
    drain(c, p, g, 5);
    expect_done(g, 5);
    assert_int_equal(atomic_load(&most), 2);
    assert_int_equal(atomic_load(&st.voicebox.chunks), 15);
    assert_int_equal(atomic_load(&st.voicebox.slots), 2);
    vb_free(c);
    assert_pool_empty(p);
}

/* One slot; A and C queued, A's first chunk done (A is back in the
 * queue for its second), then B arrives while C's first runs: B's first
 * chunk goes before A's second. */
static void test_first_chunks_first(void **state) {
    Pool        *p = *state;
    VbCore      *c = core(p, 1, tone_synth, NULL);
    SpeechParams sp = params(AUDIO_PCM);
    OmniDone     d = { 0 };
    Got          g[3] = { { 0 } };
    uint64_t     order[3] = { 1, 3, 2 };
    Err          err;

    atomic_store(&entered, 0);
    atomic_store(&n_firsts, 0);
    atomic_store(&allow, 1);
    for (int k = 0; k < 3; k++) {
        if (k == 2) {
            while (atomic_load(&entered) < 2) usleep(1000);
        }
        assert_int_equal(vb_submit(c, order[k], &sp, &err), 0);
        feed(c, p, order[k], k == 2 ? 1 : 3, &d);
    }
    atomic_store(&allow, 1 << 30);
    drain(c, p, g, 3);
    assert_int_equal(atomic_load(&n_firsts), 7);
    for (int i = 0; i < 7; i++) assert_int_equal(firsts[i], i < 3);
    expect_done(g, 3);
    vb_free(c);
    assert_pool_empty(p);
}

/* A paused request runs no chunk until resumed. */
static void test_pause(void **state) {
    Pool        *p = *state;
    VbCore      *c = core(p, 2, tone_synth, NULL);
    SpeechParams sp = params(AUDIO_PCM);
    OmniDone     d = { 0 };
    Got          g = { 0 };
    VbOut        o;
    Err          err;

    atomic_store(&entered, 0);
    assert_int_equal(vb_submit(c, 1, &sp, &err), 0);
    vb_pause(c, 1, true);
    feed(c, p, 1, 3, &d);
    usleep(50000);
    assert_int_equal(atomic_load(&entered), 0);
    assert_false(vb_next(c, &o));
    vb_pause(c, 1, false);
    drain(c, p, &g, 1);
    expect_done(&g, 1);
    assert_int_equal(atomic_load(&entered), 3);
    vb_free(c);
    assert_pool_empty(p);
}

/* With 4 blocks and nobody reading, the worker fills them and waits; the
 * loop's vb_next does not; freeing blocks lets it finish. */
static void test_full_pool(void **state) {
    Pool         small;
    VbCore      *c;
    SpeechParams sp = params(AUDIO_PCM);
    OmniDone     d = { 0 };
    PoolStats    ps;
    Got          g = { 0 };
    Err          err;
    double       t0;
    VbOut        o;

    (void) state;
    assert_int_equal(pool_create(&small, 5, BLOCK_SIZE, &err), 0);
    c = core(&small, 1, tone_synth, NULL);
    assert_int_equal(vb_submit(c, 1, &sp, &err), 0);
    feed(c, &small, 1, 1, &d);
    for (int i = 0; i < 2000; i++) {
        pool_stats(&small, &ps);
        if (ps.waiters > 0) break;
        usleep(1000);
    }
    assert_int_equal(ps.free, 0);
    assert_true(ps.waiters > 0);
    t0 = clock_now_s();
    while (vb_next(c, &o)) {    // what is out: STARTED and full blocks
        if (o.kind == VB_OUT_STARTED) g.started = true;
        else break;
    }
    assert_true(clock_now_s() - t0 < 0.05);
    assert_int_equal(o.kind, VB_OUT_BLOCK);
    assert_int_equal(pool_unref(&small, o.ref.block), 1);
    drain(c, &small, &g, 1);
    expect_done(&g, 1);
    vb_free(c);
    assert_pool_empty(&small);
    pool_destroy(&small);
}

static int setup(void **state) {
    static Pool p;
    Err         err;

    if (tts_init(&err) != 0) return -1;
    if (pool_create(&p, BLOCKS, BLOCK_SIZE, &err) != 0) return -1;
    *state = &p;
    return 0;
}

static int teardown(void **state) {
    pool_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_stream_equals_whole),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cancel_mid_synthesis),
        cmocka_unit_test(test_slots_bound),
        cmocka_unit_test(test_first_chunks_first),
        cmocka_unit_test(test_pause),
        cmocka_unit_test(test_full_pool),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, teardown);
}

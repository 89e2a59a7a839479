/* voicebox.c -- the voicebox stage's row (voicebox.h): the skeleton's
 * callbacks over the core (vbcore.h), which does the work on its workers.
 *
 * The loop only moves things: a SUBMIT opens the request's codecs, INPUT
 * BLOCKs (the talker's units) and the INPUT DONE go to the core, and
 * whenever the core's eventfd is readable the loop sends what the workers
 * made: STARTED, the audio blocks (EVENT BLOCK, in order), then DONE,
 * ERROR or CANCELLED. It never synthesizes and never waits: there is no
 * step, the stage is always idle as the skeleton sees it.
 *
 * Warm-up (start, before READY): every Flite voice synthesizes a short
 * sentence once, and every codec encodes it once, so the first request
 * pays for no voice loading, no lazily built tables and no first-use
 * page faults. */

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analyze.h"
#include "encode.h"
#include "request.h"
#include "resample.h"
#include "vbcore.h"
#include "voicebox.h"

#define VB_WARM_TEXT "Hello, how are you?"

typedef struct {
    Stage   *st;            // borrowed
    VbCore  *core;          // owned
    int      max_requests;
} Voicebox;


/* ---- Warm-up ------------------------------------------------------------ */

typedef struct {
    int16_t *pcm;           // (cap,) the sentence at 16 kHz, owned
    size_t   n, cap;
} WarmPcm;

static int warm_keep(void *ud, const int16_t *pcm, size_t n) {
    WarmPcm *w = ud;

    if (w->n + n > w->cap) return -1;
    memcpy(w->pcm + w->n, pcm, n * sizeof(*pcm));
    w->n += n;
    return 0;
}

static int warm_drop(void *ud, const uint8_t *p, size_t n) {
    (void) ud;
    (void) p;
    (void) n;
    return 0;
}

/* Encodes w's PCM (resampled to SPEECH_RATE) once in every format. */
static int warm_codecs(const WarmPcm *w, int rate, Err *err) {
    Resampler    *rs = resample_new(rate, SPEECH_RATE, err);
    size_t        cap = rs != NULL ? resample_out_max(rs, w->n) : 0, n = 0;
    int16_t      *out = rs != NULL ? malloc(cap * sizeof(*out)) : NULL;
    int           rc = -1;

    if (rs != NULL && out == NULL) err_set(err, "out of memory");
    if (out != NULL
        && resample_process(rs, w->pcm, w->n, out, cap, &n, err) == 0)
    {
        rc = 0;
        for (int f = 0; f < AUDIO_N_FORMATS && rc == 0; f++) {
            AudioEncoder *e = audio_encoder_open((AudioFormat) f,
                                                 SPEECH_RATE, warm_drop,
                                                 NULL, err);

            rc = e != NULL && audio_encoder_write(e, out, n, err) == 0
                 && audio_encoder_finish(e, err) == 0 ? 0 : -1;
            if (rc != 0) err_prefix(err, "%s", speech_format_name(f));
            audio_encoder_free(e);
        }
    }
    free(out);
    resample_free(rs);
    return rc;
}

/* Synthesizes VB_WARM_TEXT in each voice of the table, then encodes the
 * last one in each format; one log line with the time. */
static int warm_up(Err *err) {
    static const char *voices[] = { "rms", "slt", "awb", "kal16" };
    TtsAnalyzer       *a = tts_analyzer_new(err);
    TtsSynthOpts       o = { .speed = 1.0f, .first = true, .last = true };
    WarmPcm            w = { NULL, 0, 16000 * 10 };
    Units              u;
    double             t0 = clock_now_s();
    int                rc = -1, rate = 0;

    if (a == NULL) return err_prefix(err, "warm-up");
    if (tts_analyze(a, VB_WARM_TEXT, strlen(VB_WARM_TEXT), &u, err) != 0) {
        tts_analyzer_free(a);
        return err_prefix(err, "warm-up");
    }
    w.pcm = malloc(w.cap * sizeof(*w.pcm));
    for (size_t i = 0; w.pcm != NULL && i < 4; i++) {
        const TtsVoice *v = tts_voice(voices[i]);

        w.n = 0;
        if (v == NULL) {
            err_set(err, "voice %s is not registered", voices[i]);
            goto out;
        }
        if (tts_synth(v, &u, &o, warm_keep, &w, err) < 0) {
            err_prefix(err, "voice %s", voices[i]);
            goto out;
        }
        rate = tts_voice_rate(v);
    }
    if (w.pcm == NULL) err_set(err, "out of memory");
    else rc = warm_codecs(&w, rate, err);
out:
    free(w.pcm);
    units_free(&u);
    tts_analyzer_free(a);
    if (rc != 0) return err_prefix(err, "warm-up");
    log_msg(LOG_INFO, "voicebox: warm-up (4 voices, %d formats) in %.3f s",
            (int) AUDIO_N_FORMATS, clock_now_s() - t0);
    return 0;
}


/* ---- The row ------------------------------------------------------------ */

static void vbox_fail(Stage *s, uint64_t id, int status, const char *code,
                      const char *msg)
{
    log_msg(LOG_WARN, "voicebox: request %" PRIu64 ": %s", id, msg);
    stage_error(s, id, status, status < 500 ? "invalid_request_error"
                                            : "server_error", NULL, code,
                msg);
}

static void vbox_submit(Stage *s, uint64_t id, const char *json, size_t len) {
    Voicebox    *vb = s->ud;
    OmniRequest  req;
    ReqError     re;
    Err          err;

    if (vb_held(vb->core) >= vb->max_requests) {
        vbox_fail(s, id, 503, "overloaded", "the voicebox is at its "
                  "request limit; retry later");
        return;
    }
    if (request_parse(&req, json, len, &re) != 0) {
        vbox_fail(s, id, 500, NULL, re.err.msg);
        return;
    }
    if (!req.speech.on) {
        vbox_fail(s, id, 500, NULL, "the voicebox got a request without "
                  "\"audio\"");
    } else if (vb_submit(vb->core, id, &req.speech, &err) != 0) {
        vbox_fail(s, id, 500, NULL, err.msg);
    }
    request_free(&req);
}

/* A BLOCK inner frame's descriptor (stage_channel.h), checked. */
static int vbox_ref(Stage *s, const uint8_t *p, size_t n, PoolRef *r,
                    Err *err)
{
    if (n != STAGE_BLOCK_LEN) {
        return err_set(err, "a BLOCK of %zu bytes (not %d)", n,
                       STAGE_BLOCK_LEN);
    }
    *r = pool_ref_read(p);
    return pool_check(&s->pool, *r, err);
}

static void vbox_input(Stage *s, uint64_t id, uint8_t type, const uint8_t *p,
                       size_t n)
{
    Voicebox *vb = s->ud;
    OmniDone  d;
    PoolRef   r;
    Err       err;

    if (type == OMNI_F_STAGE_BLOCK) {
        /* the skeleton checked it already; one that fails here holds no
         * reference we could drop */
        if (vbox_ref(s, p, n, &r, &err) == 0) {
            vb_units(vb->core, id, r);
            return;
        }
    } else if (type == OMNI_F_DONE && n == OMNI_DONE_LEN
               && omni_done_decode(&d, p) == 0)
    {
        vb_input_done(vb->core, id, &d);
        return;
    } else {
        err_set(&err, "input frame type %u (%zu bytes) is not units",
                type, n);
    }
    vb_error(vb->core, id, err.msg);       // logged when its ERROR goes
}

static void vbox_cancel(Stage *s, uint64_t id) {
    Voicebox *vb = s->ud;

    if (!vb_cancel(vb->core, id)) stage_cancelled(s, id);
}

static void vbox_pause(Stage *s, uint64_t id, bool paused) {
    Voicebox *vb = s->ud;

    vb_pause(vb->core, id, paused);
}

static bool vbox_idle(Stage *s) {
    (void) s;
    return true;
}

static void vbox_step(Stage *s) {
    (void) s;
}

/* Sends what the workers made. */
static void vbox_wake(Stage *s) {
    Voicebox *vb = s->ud;
    VbOut     o;

    while (vb_next(vb->core, &o)) {
        switch (o.kind) {
        case VB_OUT_STARTED:   stage_started(s, o.id); break;
        case VB_OUT_BLOCK:     stage_block(s, o.id, o.ref); break;
        case VB_OUT_DONE:      stage_done(s, o.id, &o.done); break;
        case VB_OUT_CANCELLED: stage_cancelled(s, o.id); break;
        case VB_OUT_ERROR:
            vbox_fail(s, o.id, 500, NULL, o.msg);
            break;
        }
    }
}

/* --voicebox-slots, or one per CPU and at least 2. */
static int vbox_slots(const ServeConfig *cfg) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    if (cfg->voicebox_slots > 0) return cfg->voicebox_slots;
    return n > 2 ? (int) n : 2;
}

static int vbox_start(Stage *s, const ServeConfig *cfg, Err *err) {
    Voicebox *vb = calloc(1, sizeof(*vb));
    VbConfig  vc = { 0 };

    if (vb == NULL) return err_set(err, "out of memory");
    s->ud = vb;
    vb->st = s;
    vb->max_requests = cfg->max_queue > 0 ? cfg->max_queue : 1024;
    if (!s->has_pool) {
        return err_set(err, "voicebox: no shared pool on fd %d",
                       STAGE_POOL_FD);
    }
    if (tts_init(err) != 0 || warm_up(err) != 0) {
        return err_prefix(err, "voicebox");
    }
    vc.slots = vbox_slots(cfg);
    vc.max_requests = vb->max_requests;
    vc.pool = &s->pool;
    vc.owner = s->owner;
    vc.stats = s->stats;
    vb->core = vb_new(&vc, err);
    if (vb->core == NULL) return -1;
    s->wake_fd = vb_wake_fd(vb->core);
    log_msg(LOG_INFO, "voicebox: %d slots, pool of %u blocks of %u bytes",
            vc.slots, s->pool.n_blocks, s->pool.block_size);
    return stage_ready(s, "voicebox", "", err);
}

/* Every request still held ends with an ERROR (those cancelled with
 * CANCELLED), after the blocks already made. */
static void vbox_stop(Stage *s) {
    Voicebox *vb = s->ud;

    if (vb == NULL) return;
    if (vb->core != NULL) {
        vb_stop(vb->core, "the engine's voicebox stage is stopping");
        vbox_wake(s);
        vb_free(vb->core);
    }
    free(vb);
    s->ud = NULL;
    s->wake_fd = -1;
}

const StageOps voicebox_stage = {
    .name = "voicebox",
    .start = vbox_start,
    .submit = vbox_submit,
    .cancel = vbox_cancel,
    .input = vbox_input,
    .pause = vbox_pause,
    .idle = vbox_idle,
    .step = vbox_step,
    .wake = vbox_wake,
    .stop = vbox_stop,
};

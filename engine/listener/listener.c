/* listener.c -- the listener stage's row (listener.h): the skeleton's
 * callbacks over the core (lscore.h), which does the work on its workers.
 *
 * The loop only moves things: a SUBMIT opens the request in the core,
 * INPUT BLOCKs (the client's audio, which the frontend copied into the
 * pool) are copied into it and let go of, the INPUT DONE queues it, and
 * whenever the core's eventfd is readable the loop sends what the
 * workers made: STARTED, TRANSCRIPT events, then DONE, ERROR or
 * CANCELLED. It never decodes and never waits.
 *
 * Warm-up (start, before READY): a sentence synthesized with Flite is
 * encoded in every input format (wav, mp3, flac, opus), each file is
 * decoded back, and every slot's recogniser hears it, which must give at
 * least one word: the first request pays for no model page faults, no
 * lazily built tables, and a broken model or decoder fails the start
 * (the frontend logs why and restarts it) instead of every request. */

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analyze.h"
#include "decoder.h"
#include "encode.h"
#include "listener.h"
#include "lscore.h"
#include "request.h"
#include "resample.h"
#include "synth.h"

#define LS_WARM_TEXT    "Hello, how are you today?"
#define LS_WARM_MAX     (16000 * 10)    // samples of it we keep, at most

typedef struct {
    Stage   *st;            // borrowed
    LsCore  *core;          // owned
} Listener;


/* ---- Warm-up ------------------------------------------------------------ */

typedef struct {
    int16_t *pcm;           // (cap,) owned
    size_t   n, cap;
} Pcm;

typedef struct {
    uint8_t *p;             // (cap,) owned
    size_t   n, cap;
} Bytes;

static int keep_pcm(void *ud, const int16_t *pcm, size_t n) {
    Pcm *b = ud;

    if (b->n + n > b->cap) return -1;
    memcpy(b->pcm + b->n, pcm, n * sizeof(*pcm));
    b->n += n;
    return 0;
}

static int keep_bytes(void *ud, const uint8_t *p, size_t n) {
    Bytes *b = ud;

    if (b->n + n > b->cap) {
        size_t   cap = (b->n + n) * 2;
        uint8_t *q = realloc(b->p, cap);

        if (q == NULL) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}

/* The warm-up sentence at SPEECH_RATE (what the encoders take), into *out
 * (malloc'd). Returns 0, or -1 with err set. */
static int warm_speech(Pcm *out, Err *err) {
    TtsAnalyzer    *a = tts_analyzer_new(err);
    const TtsVoice *v = tts_voice("rms");
    TtsSynthOpts    o = { .speed = 1.0f, .first = true, .last = true };
    Pcm             raw = { malloc(LS_WARM_MAX * sizeof(int16_t)), 0,
                            LS_WARM_MAX };
    Resampler      *rs = NULL;
    Units           u;
    int             rc = -1;

    if (a == NULL) return -1;
    if (tts_analyze(a, LS_WARM_TEXT, strlen(LS_WARM_TEXT), &u, err) != 0) {
        tts_analyzer_free(a);
        free(raw.pcm);
        return -1;
    }
    if (raw.pcm == NULL || v == NULL) {
        err_set(err, raw.pcm == NULL ? "out of memory"
                                     : "voice rms is not registered");
    } else if (tts_synth(v, &u, &o, keep_pcm, &raw, err) >= 0
               && (rs = resample_new(tts_voice_rate(v), SPEECH_RATE, err))
                  != NULL)
    {
        out->cap = resample_out_max(rs, raw.n);
        out->pcm = malloc(out->cap * sizeof(int16_t));
        if (out->pcm == NULL) err_set(err, "out of memory");
        else rc = resample_process(rs, raw.pcm, raw.n, out->pcm, out->cap,
                                   &out->n, err);
    }
    resample_free(rs);
    units_free(&u);
    tts_analyzer_free(a);
    free(raw.pcm);
    return rc;
}

/* pcm encoded as fmt, decoded back at ASR_RATE into *heard (malloc'd).
 * Returns 0, or -1 with err set. */
static int warm_format(const Pcm *pcm, AudioFormat fmt, Pcm *heard,
                       Err *err)
{
    Bytes         file = { 0 };
    AudioEncoder *e = audio_encoder_open(fmt, SPEECH_RATE, keep_bytes,
                                         &file, err);
    AudioDecoder *d = NULL;
    bool          oom = false;
    ssize_t       k = 0;
    int           rc = -1;

    if (e != NULL && audio_encoder_write(e, pcm->pcm, pcm->n, err) == 0
        && audio_encoder_finish(e, err) == 0)
    {
        d = audio_decoder_open(file.p, file.n, AUDIO_IN_AUTO, ASR_RATE, err,
                               &oom);
    }
    heard->cap = LS_WARM_MAX;
    heard->n = 0;
    if (d != NULL && (heard->pcm = malloc(LS_WARM_MAX * sizeof(int16_t)))
                     == NULL)
        err_set(err, "out of memory");
    while (heard->pcm != NULL && heard->n < heard->cap
           && (k = audio_decoder_read(d, heard->pcm + heard->n,
                                      heard->cap - heard->n, err, &oom)) > 0)
        heard->n += (size_t) k;
    if (heard->pcm != NULL && k >= 0) {
        rc = heard->n > 0 ? 0 : err_set(err, "decoded to no samples");
    }
    if (rc != 0) err_prefix(err, "%s", speech_format_name(fmt));
    audio_decoder_free(d);
    audio_encoder_free(e);
    free(file.p);
    return rc;
}

static int warm_up(LsCore *core, Err *err) {
    static const AudioFormat fmts[] = { AUDIO_WAV, AUDIO_MP3, AUDIO_FLAC,
                                        AUDIO_OPUS };
    Pcm    speech = { 0 }, heard = { 0 };
    char   words[256];
    double t0 = clock_now_s();
    int    rc;

    if (warm_speech(&speech, err) != 0) return err_prefix(err, "warm-up");
    rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(fmts) / sizeof(fmts[0]); i++) {
        free(heard.pcm);
        heard.pcm = NULL;
        rc = warm_format(&speech, fmts[i], &heard, err);
    }
    if (rc == 0) rc = ls_warm(core, heard.pcm, heard.n, words,
                              sizeof(words), err);
    free(heard.pcm);
    free(speech.pcm);
    if (rc != 0) return err_prefix(err, "warm-up");
    log_msg(LOG_INFO, "listener: warm-up (4 formats, every slot) in %.3f s "
            "heard \"%s\" in \"%s\"", clock_now_s() - t0, words,
            LS_WARM_TEXT);
    return 0;
}


/* ---- The row ------------------------------------------------------------ */

static void lsn_fail(Stage *s, uint64_t id, int status, const char *param,
                     const char *code, const char *msg)
{
    log_msg(status < 500 ? LOG_INFO : LOG_WARN, "listener: request %" PRIu64
            ": %s%s%s", id, param != NULL && param[0] != '\0' ? param : "",
            param != NULL && param[0] != '\0' ? ": " : "", msg);
    stage_error(s, id, status, status < 500 ? "invalid_request_error"
                                            : "server_error",
                param != NULL && param[0] != '\0' ? param : NULL, code, msg);
}

static void lsn_submit(Stage *s, uint64_t id, const char *json, size_t len)
{
    Listener   *ln = s->ud;
    OmniRequest req;
    ReqError    re;
    LsRefusal   why;

    if (request_parse(&req, json, len, &re) != 0) {
        lsn_fail(s, id, 500, NULL, NULL, re.err.msg);
        return;
    }
    if (ls_submit(ln->core, id, &req, &why) != 0) {
        lsn_fail(s, id, why.status, NULL, why.code, why.err.msg);
    }
    request_free(&req);
}

/* The skeleton checked the frame: a BLOCK is a valid descriptor whose
 * reference is ours now, a DONE is whole (stage.h). */
static void lsn_input(Stage *s, uint64_t id, uint8_t type, const uint8_t *p,
                      size_t n)
{
    Listener *ln = s->ud;
    Err       err;

    if (type == OMNI_F_STAGE_BLOCK) {
        ls_audio(ln->core, id, pool_ref_read(p));
    } else if (type == OMNI_F_DONE) {
        ls_input_done(ln->core, id);
    } else {
        err_set(&err, "input frame type %u (%zu bytes) is not audio", type,
                n);
        ls_error(ln->core, id, err.msg);    // logged when its ERROR goes
    }
}

static void lsn_cancel(Stage *s, uint64_t id) {
    Listener *ln = s->ud;

    if (!ls_cancel(ln->core, id)) stage_cancelled(s, id);
}

static bool lsn_idle(Stage *s) {
    (void) s;
    return true;
}

static void lsn_step(Stage *s) {
    (void) s;
}

/* Sends what the workers made. */
static void lsn_wake(Stage *s) {
    Listener *ln = s->ud;
    LsOut     o;

    while (ls_next(ln->core, &o)) {
        switch (o.kind) {
        case LS_OUT_STARTED:   stage_started(s, o.id); break;
        case LS_OUT_SEGMENT:
            stage_event(s, o.id, OMNI_F_TRANSCRIPT, o.json, o.len);
            break;
        case LS_OUT_DONE:      stage_done(s, o.id, &o.done); break;
        case LS_OUT_CANCELLED: stage_cancelled(s, o.id); break;
        case LS_OUT_ERROR:
            lsn_fail(s, o.id, o.status, o.param, o.code, o.msg);
            break;
        }
    }
}

/* --listener-slots, or one per CPU, at least 1 and at most 4: each slot
 * holds a recogniser of ~100 MB. */
static int lsn_slots(const ServeConfig *cfg) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    if (cfg->listener_slots > 0) return cfg->listener_slots;
    return n < 1 ? 1 : n > 4 ? 4 : (int) n;
}

static int lsn_start(Stage *s, const ServeConfig *cfg, Err *err) {
    Listener *ln = calloc(1, sizeof(*ln));
    LsConfig  lc = { 0 };

    if (ln == NULL) return err_set(err, "out of memory");
    s->ud = ln;
    ln->st = s;
    if (!s->has_pool) {
        return err_set(err, "listener: no shared pool on fd %d",
                       STAGE_POOL_FD);
    }
    lc.slots = lsn_slots(cfg);
    lc.max_requests = cfg->max_queue > 0 ? cfg->max_queue : 1024;
    lc.max_bytes = (uint64_t) (cfg->listener_buffer_mib > 0
                               ? cfg->listener_buffer_mib : 256) << 20;
    lc.pool = &s->pool;
    lc.asr.model_dir = cfg->listener_model;
    lc.stats = s->stats;
    if ((ln->core = ls_new(&lc, err)) == NULL) {
        return err_prefix(err, "listener");
    }
    if (tts_init(err) != 0 || warm_up(ln->core, err) != 0) {
        return err_prefix(err, "listener");
    }
    s->wake_fd = ls_wake_fd(ln->core);
    log_msg(LOG_INFO, "listener: %s, %d slots, %" PRIu64 " MiB of audio "
            "held at most", ls_describe(ln->core), lc.slots,
            lc.max_bytes >> 20);
    return stage_ready(s, "listener", "", err);
}

/* Every request still held ends with an ERROR (those cancelled with
 * CANCELLED), after the segments already made. */
static void lsn_stop(Stage *s) {
    Listener *ln = s->ud;

    if (ln == NULL) return;
    if (ln->core != NULL) {
        ls_stop(ln->core, "the engine's listener stage is stopping");
        lsn_wake(s);
        ls_free(ln->core);
    }
    free(ln);
    s->ud = NULL;
    s->wake_fd = -1;
}

const StageOps listener_stage = {
    .name = "listener",
    .start = lsn_start,
    .submit = lsn_submit,
    .cancel = lsn_cancel,
    .input = lsn_input,
    .idle = lsn_idle,
    .step = lsn_step,
    .wake = lsn_wake,
    .stop = lsn_stop,
};

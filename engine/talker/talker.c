/* talker.c -- the talker stage: the stage skeleton's row (stage.h) around
 * the talker's logic (talk.h). This file maps frames to talk_* calls and
 * talk's events to frames, starts Flite, and keeps the stats page; what
 * happens to text is talk.c's.
 *
 * Startup: Flite and its voices (tts_init), one analyzer, the shared pool
 * (the skeleton attached it from STAGE_POOL_FD; without it the talker has
 * nowhere to put its chunks and refuses to start), then READY with id
 * "flite".
 *
 * The page: requests_running counts the requests with something to say
 * now, requests_waiting those held that wait (for text from the thinker,
 * for a free pool block, or paused); the talker's counters (TalkerStats)
 * add up across restarts. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "chunker.h"
#include "request.h"
#include "synth.h"
#include "talk.h"
#include "talker.h"

typedef struct {
    Stage    *st;               // borrowed: the skeleton running it
    Talk      talk;
    bool      talk_up;
    uint64_t  pub_chunks;       // talk's counters already added to the
    uint64_t  pub_words;        //   page
    uint64_t  pub_phones;
} Talker;


/* ---- Events out --------------------------------------------------------- */

static void ev_block(void *ud, uint64_t id, PoolRef r) {
    stage_block(ud, id, r);
}

static void ev_done(void *ud, uint64_t id, const OmniDone *d) {
    stage_done(ud, id, d);
}

static void ev_error(void *ud, uint64_t id, int status, const char *type,
                     const char *param, const char *code, const char *msg)
{
    stage_error(ud, id, status, type, param, code, msg);
}

/* The page's gauges now, and the counters' growth since the last call. */
static void publish(Talker *tk) {
    OmniStats *s = tk->st->stats;
    Talk      *t = &tk->talk;
    int        held, ready;

    if (s == NULL) return;
    talk_counts(t, &held, &ready);
    atomic_store_explicit(&s->requests_running, ready, memory_order_relaxed);
    atomic_store_explicit(&s->requests_waiting, held - ready,
                          memory_order_relaxed);
    atomic_fetch_add_explicit(&s->talker.chunks, t->chunks - tk->pub_chunks,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->talker.words, t->words - tk->pub_words,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->talker.phones, t->phones - tk->pub_phones,
                              memory_order_relaxed);
    tk->pub_chunks = t->chunks;
    tk->pub_words = t->words;
    tk->pub_phones = t->phones;
}


/* ---- Frames in ---------------------------------------------------------- */

static void talker_submit(Stage *s, uint64_t id, const char *json,
                          size_t len)
{
    Talker     *tk = s->ud;
    OmniRequest r;
    ReqError    e;

    if (request_parse(&r, json, len, &e) != 0) {
        stage_error(s, id, e.status, e.status < 500 ? "invalid_request_error"
                    : "server_error", e.param[0] != '\0' ? e.param : NULL,
                    NULL, e.err.msg);
        return;
    }
    stage_started(s, id);
    talk_submit(&tk->talk, id, &r);
    request_free(&r);
    publish(tk);
}

/* INPUT: the thinker's TEXT, its DONE (the text is over; its counts are
 * the thinker's and stay the frontend's business). Anything else is the
 * frontend's mistake: the request fails, and a BLOCK's reference, which is
 * ours now, is dropped. */
static void talker_input(Stage *s, uint64_t id, uint8_t type,
                         const uint8_t *p, size_t n)
{
    Talker *tk = s->ud;
    char    msg[96];

    switch (type) {
    case OMNI_F_TEXT:
        talk_text(&tk->talk, id, (const char *) p, n);
        break;
    case OMNI_F_DONE:
        talk_end(&tk->talk, id);
        break;
    default:
        if (type == OMNI_F_STAGE_BLOCK && n >= sizeof(PoolRef)) {
            pool_unref(&s->pool, omni_rd32(p));
        }
        snprintf(msg, sizeof(msg), "the talker takes text, not input "
                 "frames of type %u", (unsigned) type);
        talk_fail(&tk->talk, id, 500, "talker_protocol", msg);
        break;
    }
    publish(tk);
}

static void talker_pause(Stage *s, uint64_t id, bool paused) {
    Talker *tk = s->ud;

    talk_pause(&tk->talk, id, paused);
}

/* A CANCEL: nothing of a request outlives a step (talk.h), so it is
 * acknowledged at once, held or not. */
static void talker_cancel(Stage *s, uint64_t id) {
    Talker *tk = s->ud;

    talk_cancel(&tk->talk, id);
    stage_cancelled(s, id);
    publish(tk);
}

static bool talker_idle(Stage *s) {
    return talk_idle(&((Talker *) s->ud)->talk);
}

static void talker_step(Stage *s) {
    Talker *tk = s->ud;

    talk_step(&tk->talk);
    publish(tk);
}


/* ---- Startup and stop --------------------------------------------------- */

/* Runs both chunking modes over a sample text and analyses every chunk
 * into its byte form, so that the first request pays no first-use costs
 * (Flite's lexicon pages, the letter-to-sound rules); the frontend reports
 * ready only once every stage is. Logs the time taken. */
static int warm_up(Talk *t, Err *err) {
    static const char text[] = "Hello, how are you? It is 3:30 on May 4th, "
                               "and Dr. Smith paid $12.50 for two books.";
    uint8_t  buf[UNITS_MAX_BYTES];
    double   t0 = stage_clock_us();
    int      chunks = 0;

    for (int m = SPEECH_LATENCY; m <= SPEECH_QUALITY; m++) {
        ChunkPolicy p = { (SpeechMode) m, t->cfg.first_words,
                          t->cfg.chunk_words, t->cfg.quality_words };
        Chunker    *c = malloc(sizeof(*c));
        const char *at;
        size_t      n;

        if (c == NULL) return err_set(err, "out of memory");
        chunker_init(c, &p);
        chunker_push(c, text, sizeof(text) - 1);
        chunker_end(c);
        while ((n = chunker_next(c, &at)) > 0) {
            Units u;
            long  len;

            if (tts_analyze(t->an, at, n, &u, err) != 0) {
                free(c);
                return err_prefix(err, "talker warm-up");
            }
            len = units_encode(&u, buf, sizeof(buf));
            units_free(&u);
            if (len < 0) {
                free(c);
                return err_set(err, "talker warm-up: a chunk did not fit");
            }
            chunker_take(c, n);
            chunks++;
        }
        free(c);
    }
    log_msg(LOG_INFO, "talker: warm-up, %d chunks in both modes, %.1f ms",
            chunks, (stage_clock_us() - t0) / 1e3);
    return 0;
}

static int talker_start(Stage *s, const ServeConfig *cfg, Err *err) {
    Talker    *tk = calloc(1, sizeof(*tk));
    TalkEvents ev = { s, ev_block, ev_done, ev_error };
    TalkConfig tc = {
        .first_words = cfg->speech_first_words,
        .chunk_words = cfg->speech_chunk_words,
        .quality_words = cfg->speech_quality_words,
        .max_requests = cfg->max_seqs + cfg->max_queue,
        .pool = &s->pool,
        .owner = s->owner,
    };

    if (tk == NULL) return err_set(err, "out of memory");
    s->ud = tk;
    tk->st = s;
    if (!s->has_pool) {
        return err_set(err, "talker: no shared pool (fd %d): the talker "
                       "has nowhere to put its chunks", STAGE_POOL_FD);
    }
    if (tts_init(err) != 0 || talk_init(&tk->talk, &tc, &ev, err) != 0) {
        return -1;
    }
    tk->talk_up = true;
    if (warm_up(&tk->talk, err) != 0) return -1;
    if (stage_ready(s, "flite", "", err) != 0) return -1;
    log_msg(LOG_INFO, "talker: ready (chunks of %d/%d words, %d in quality "
            "mode; %d requests at most)", tk->talk.cfg.first_words,
            tk->talk.cfg.chunk_words, tk->talk.cfg.quality_words,
            tc.max_requests);
    return 0;
}

static void talker_stop(Stage *s) {
    Talker *tk = s->ud;

    if (tk == NULL) return;
    if (tk->talk_up) {
        talk_free(&tk->talk, "the engine's talker stage is stopping");
    }
    free(tk);
    s->ud = NULL;
}

const StageOps talker_stage = {
    .name = "talker",
    .start = talker_start,
    .submit = talker_submit,
    .cancel = talker_cancel,
    .input = talker_input,
    .pause = talker_pause,
    .idle = talker_idle,
    .step = talker_step,
    .stop = talker_stop,
};

/* talk.c -- the talker's logic: per-request text queues and Chunkers, the
 * step that turns chunks into units in pool blocks (talk.h says what and
 * why; talker.c is the stage row around it).
 *
 * Requests are a singly linked list (held ones only; at most max_requests,
 * which is hundreds): every lookup is O(n), as the thinker's scheduler
 * keeps its sequences, and a step scans it a few times. Rejected: a hash
 * of ids, which buys nothing at these sizes.
 *
 * Each request's `ready` is kept up to date by refresh() after anything
 * that changes its text (SUBMIT, INPUT, a chunk taken), so talk_idle and
 * the step's picks do not rescan Chunker buffers. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "talk.h"

struct TalkReq {
    uint64_t  id;
    TalkReq  *next;
    Chunker   ch;               // the text being cut (CHUNKER_MAX bytes)
    char     *q;                // (q_cap,) text the Chunker could not take
    size_t    q_head, q_len;    //   yet: q[q_head .. q_head + q_len);
    size_t    q_cap;            //   owned, at most TALK_INPUT_MAX
    bool      ended;            // the input is over (Chunker ended once q
                                //   is empty)
    bool      paused;
    bool      ready;            // a chunk is cut, or only DONE is left
    uint32_t  words;            // analysed so far
    uint32_t  phones;
};


/* ---- Requests ----------------------------------------------------------- */

static TalkReq *find(Talk *t, uint64_t id) {
    TalkReq *rq = t->reqs;

    while (rq != NULL && rq->id != id) rq = rq->next;
    return rq;
}

static void req_remove(Talk *t, TalkReq *rq) {
    TalkReq **pp = &t->reqs;

    while (*pp != rq) pp = &(*pp)->next;
    *pp = rq->next;
    if (t->cursor == rq) t->cursor = rq->next;
    t->n_reqs--;
    free(rq->q);
    free(rq);
}

/* Moves queued text into the Chunker as far as it takes it, ends the
 * Chunker once the input is over and all of it is in, and says whether a
 * step has something to do for rq. */
static void refresh(TalkReq *rq) {
    const char *text;

    if (rq->q_len > 0) {
        size_t k = chunker_push(&rq->ch, rq->q + rq->q_head, rq->q_len);

        rq->q_head += k;
        rq->q_len -= k;
        if (rq->q_len == 0) rq->q_head = 0;
    }
    if (rq->q_len == 0 && rq->ended && !rq->ch.ended) chunker_end(&rq->ch);
    rq->ready = chunker_next(&rq->ch, &text) > 0 || chunker_done(&rq->ch);
}

/* Ends rq with an ERROR and drops it. */
static void req_fail(Talk *t, TalkReq *rq, int status, const char *code,
                     const char *msg)
{
    log_msg(LOG_WARN, "talker: request %" PRIu64 ": %s", rq->id, msg);
    t->ev.error(t->ev.ud, rq->id, status, status < 500
                ? "invalid_request_error" : "server_error", NULL, code, msg);
    req_remove(t, rq);
}

/* Queues n bytes of text for rq: straight into its Chunker while nothing
 * waits before them, the rest into its queue, grown (doubling) up to
 * TALK_INPUT_MAX. Returns 0, or -1 after failing rq (overrun, out of
 * memory). */
static int req_queue(Talk *t, TalkReq *rq, const char *s, size_t n) {
    char   msg[160];
    size_t cap = rq->q_cap;

    if (rq->q_len == 0) {
        size_t k = chunker_push(&rq->ch, s, n);

        s += k;
        n -= k;
    }
    if (n == 0) return 0;
    if (rq->q_len + n > TALK_INPUT_MAX) {
        snprintf(msg, sizeof(msg), "the text to speak ran more than %u "
                 "bytes ahead of the speech", TALK_INPUT_MAX + CHUNKER_MAX);
        req_fail(t, rq, 500, "talker_overrun", msg);
        return -1;
    }
    if (rq->q_head > 0) {
        memmove(rq->q, rq->q + rq->q_head, rq->q_len);
        rq->q_head = 0;
    }
    while (cap < rq->q_len + n) cap = cap == 0 ? 4096 : 2 * cap;
    if (cap > TALK_INPUT_MAX) cap = TALK_INPUT_MAX;
    if (cap != rq->q_cap) {
        char *q = realloc(rq->q, cap);

        if (q == NULL) {
            req_fail(t, rq, 503, "out_of_memory", "the talker is out of "
                     "memory");
            return -1;
        }
        rq->q = q;
        rq->q_cap = cap;
    }
    memcpy(rq->q + rq->q_len, s, n);
    rq->q_len += n;
    return 0;
}


/* ---- Requests in -------------------------------------------------------- */

int talk_init(Talk *t, const TalkConfig *cfg, const TalkEvents *ev,
              Err *err)
{
    memset(t, 0, sizeof(*t));
    if (cfg->max_requests < 1 || cfg->pool == NULL) {
        return err_set(err, "talker: needs a pool and max_requests >= 1");
    }
    t->cfg = *cfg;
    if (t->cfg.first_words <= 0) t->cfg.first_words = 4;
    if (t->cfg.chunk_words <= 0) t->cfg.chunk_words = 12;
    if (t->cfg.quality_words <= 0) t->cfg.quality_words = 40;
    t->ev = *ev;
    t->an = tts_analyzer_new(err);
    return t->an != NULL ? 0 : -1;
}

void talk_free(Talk *t, const char *msg) {
    while (t->reqs != NULL) req_fail(t, t->reqs, 503, "engine_shutdown", msg);
    if (t->an != NULL) tts_analyzer_free(t->an);
    memset(t, 0, sizeof(*t));
}

static void refuse(Talk *t, uint64_t id, int status, const char *param,
                   const char *code, const char *msg)
{
    t->ev.error(t->ev.ud, id, status, status < 500 ? "invalid_request_error"
                : "server_error", param, code, msg);
}

void talk_submit(Talk *t, uint64_t id, const OmniRequest *r) {
    const TalkConfig *c = &t->cfg;
    ChunkPolicy       p = { r->speech.mode, c->first_words, c->chunk_words,
                            c->quality_words };
    TalkReq          *rq;
    char              msg[96];

    if (!r->speech.on) {
        refuse(t, id, 400, "audio", NULL, "the talker speaks only requests "
               "with \"audio\"");
        return;
    }
    if (t->n_reqs >= c->max_requests || find(t, id) != NULL) {
        snprintf(msg, sizeof(msg), "the server is overloaded: the talker "
                 "holds %d requests", t->n_reqs);
        refuse(t, id, 503, NULL, "overloaded", msg);
        return;
    }
    if ((rq = calloc(1, sizeof(*rq))) == NULL) {
        refuse(t, id, 503, NULL, "out_of_memory", "the talker is out of "
               "memory");
        return;
    }
    chunker_init(&rq->ch, &p);
    rq->id = id;
    rq->next = t->reqs;
    t->reqs = rq;
    t->n_reqs++;
    if (r->input != NULL) {     // spoken as it is: all of it, and no more
        if (req_queue(t, rq, r->input, r->input_len) != 0) return;
        rq->ended = true;
    }
    refresh(rq);
}

void talk_text(Talk *t, uint64_t id, const char *s, size_t n) {
    TalkReq *rq = find(t, id);

    if (rq == NULL) return;
    if (rq->ended) {
        req_fail(t, rq, 500, "talker_protocol", "the talker got text after "
                 "the request's input had ended");
        return;
    }
    if (req_queue(t, rq, s, n) == 0) refresh(rq);
}

void talk_end(Talk *t, uint64_t id) {
    TalkReq *rq = find(t, id);

    if (rq == NULL) return;
    rq->ended = true;
    refresh(rq);
}

void talk_pause(Talk *t, uint64_t id, bool paused) {
    TalkReq *rq = find(t, id);

    if (rq != NULL) rq->paused = paused;
}

void talk_fail(Talk *t, uint64_t id, int status, const char *code,
               const char *msg)
{
    TalkReq *rq = find(t, id);

    if (rq != NULL) req_fail(t, rq, status, code, msg);
}

bool talk_cancel(Talk *t, uint64_t id) {
    TalkReq *rq = find(t, id);

    if (rq == NULL) return false;
    req_remove(t, rq);
    return true;
}


/* ---- Steps -------------------------------------------------------------- */

/* DONE: the words read and the phones produced. */
static void finish(Talk *t, TalkReq *rq) {
    OmniDone d;

    memset(&d, 0, sizeof(d));
    d.prompt_tokens = rq->words;
    d.audio_tokens = rq->phones;
    d.finish = OMNI_FINISH_STOP;
    t->ev.done(t->ev.ud, rq->id, &d);
    req_remove(t, rq);
}

/* Units u into block b: sent on, or dropped when there is nothing to say
 * in them. Returns 0, or -1 when they do not fit the block (b is then
 * still the caller's). */
static int send_units(Talk *t, TalkReq *rq, const Units *u, int b) {
    Pool    *pool = t->cfg.pool;
    size_t   cap = pool->block_size < UNITS_MAX_BYTES ? pool->block_size
                                                      : UNITS_MAX_BYTES;
    long     len;
    PoolRef  r;

    if (u->n_phones == 0) {     // "...": nothing to say, nothing to send
        pool_unref(pool, (uint32_t) b);
        return 0;
    }
    len = units_encode(u, pool_block(pool, (uint32_t) b), cap);
    if (len < 0) return -1;
    rq->words += (uint32_t) u->n_words;
    rq->phones += (uint32_t) u->n_phones;
    t->chunks++;
    t->words += (uint64_t) u->n_words;
    t->phones += (uint64_t) u->n_phones;
    r.block = (uint32_t) b;
    r.offset = 0;
    r.length = (uint32_t) len;
    t->ev.block(t->ev.ud, rq->id, r);
    return 0;
}

/* rq's turn: its next chunk analysed into a block and sent, or its DONE.
 * A full pool leaves the chunk where it is (t->pool_full). */
static void turn(Talk *t, TalkReq *rq) {
    const char *text;
    size_t      n = chunker_next(&rq->ch, &text);
    Units       u;
    Err         err;
    char        msg[sizeof(err.msg) + 32];
    int         b;

    if (n == 0) {
        if (chunker_done(&rq->ch)) finish(t, rq);
        else rq->ready = false;
        return;
    }
    b = pool_alloc(t->cfg.pool, t->cfg.owner, rq->id);
    if (b < 0) {
        t->pool_full = true;
        return;
    }
    if (tts_analyze(t->an, text, n, &u, &err) != 0) {
        pool_unref(t->cfg.pool, (uint32_t) b);
        snprintf(msg, sizeof(msg), "text analysis failed: %s", err.msg);
        req_fail(t, rq, 500, "talker_failed", msg);
        return;
    }
    chunker_take(&rq->ch, n);
    refresh(rq);
    u.last = chunker_done(&rq->ch);
    if (send_units(t, rq, &u, b) != 0) {
        pool_unref(t->cfg.pool, (uint32_t) b);
        snprintf(msg, sizeof(msg), "a chunk of %d words does not fit a "
                 "pool block of %u bytes", u.n_words,
                 t->cfg.pool->block_size);
        req_fail(t, rq, 500, "talker_failed", msg);
    } else if (chunker_done(&rq->ch)) {
        finish(t, rq);
    }
    units_free(&u);
}

static bool can_turn(const TalkReq *rq) {
    return rq->ready && !rq->paused;
}

/* The next request to take a turn: one that has sent nothing yet when
 * there is one (its first chunk is what its client waits for), else the
 * next ready one round-robin from the cursor. NULL: none. */
static TalkReq *pick(Talk *t) {
    TalkReq *rq, *start = t->cursor != NULL ? t->cursor : t->reqs;

    for (rq = t->reqs; rq != NULL; rq = rq->next) {
        if (can_turn(rq) && rq->ch.chunks == 0) return rq;
    }
    rq = start;
    for (int i = 0; rq != NULL && i < t->n_reqs; i++) {
        if (can_turn(rq)) return rq;
        rq = rq->next != NULL ? rq->next : t->reqs;
    }
    return NULL;
}

void talk_step(Talk *t) {
    TalkReq *rq;

    t->pool_full = false;
    for (int i = 0; i < TALK_STEP_CHUNKS && !t->pool_full; i++) {
        if ((rq = pick(t)) == NULL) break;
        t->cursor = rq->next;           // before the turn may free rq
        turn(t, rq);
    }
}

bool talk_idle(const Talk *t) {
    PoolStats st;

    for (const TalkReq *rq = t->reqs; rq != NULL; rq = rq->next) {
        if (!can_turn(rq)) continue;
        if (!t->pool_full) return false;
        pool_stats(t->cfg.pool, &st);
        return st.free == 0;
    }
    return true;
}

void talk_counts(const Talk *t, int *held, int *ready) {
    *held = t->n_reqs;
    *ready = 0;
    for (const TalkReq *rq = t->reqs; rq != NULL; rq = rq->next) {
        *ready += can_turn(rq);
    }
}

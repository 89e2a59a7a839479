/* route.c -- a request's way through the stages: which stages serve it
 * (its route), what each stage's events become (client frames, or INPUT
 * for the next stage), the DONE merged from every stage's counts, flow
 * control, and cancels that travel backwards and end with the request's
 * pool blocks reclaimed.
 *
 * Separate from stages.c (a row is a process: start, channel, heartbeat,
 * death) and conn.c (a connection's state machine): this is the star's
 * routing. Stages never talk to each other; every frame passes here.
 *
 *   text                       thinker
 *   chat/prompt with "audio"   thinker -> talker -> voicebox
 *   "input" (speech)           talker -> voicebox
 *   "transcribe"               listener
 *   chat with "audio_in"       listener -> then one of the first two
 *
 * The listener is a hop of its own kind: the frontend feeds it (the
 * client's AUDIO_IN bytes, audio_in.c), its TRANSCRIPTs go to the client
 * when it is the only hop, and on a chat route they are what the user
 * said: the hops after it get their SUBMIT at its DONE, with the JSON
 * that carries those texts (Route.deferred).
 *
 * Along a route, a hop's TEXT goes to the client when the hop is the
 * thinker, and as INPUT TEXT to the next hop when there is one; a BLOCK
 * goes as INPUT BLOCK to the next hop (its pool reference with it), or
 * from the last hop to the client as AUDIO frames, after which the block
 * is unref'd here; a DONE ends the hop's part: INPUT DONE to the next hop,
 * or from the last hop the client's one DONE, with the counts of every
 * hop merged. An ERROR from any hop ends the request: CANCEL to the hops
 * still working.
 *
 * Ownership of blocks: exactly one reference travels with a BLOCK; an
 * event this file drops (unknown id, a hop that is done) unrefs it. A
 * cancelled request's blocks are reclaimed only once every hop it was
 * cancelled at answered CANCELLED or died (CancelRec), since a live stage
 * may still touch them until then. */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend_impl.h"

#define FLOW_HIGH  (1u << 20)           // client output that pauses the
#define FLOW_LOW   (256u << 10)         //   last hop, and resumes it


/* ---- Routes ------------------------------------------------------------- */

static Stage *row(Frontend *fe, int i) {
    return &fe->stages[i];
}

/* The listener's row, or NULL in a build without it. */
static Stage *listener_row(Frontend *fe) {
#ifdef OMNI_HAVE_SPEECH
    return row(fe, STAGES_LISTENER);
#else
    (void) fe;
    return NULL;
#endif
}

/* The route r takes, into rt. Returns false when it needs stages this
 * build lacks (speech without OMNI_HAVE_SPEECH): the caller refuses. */
bool route_build(Frontend *fe, const OmniRequest *r, Route *rt) {
    memset(rt, 0, sizeof(*rt));
    if (r->n_audio_in > 0) {
#ifdef OMNI_HAVE_SPEECH
        rt->hop[rt->n++] = row(fe, STAGES_LISTENER);
        if (r->transcribe) return true;
        rt->deferred = 1;
#else
        return false;
#endif
    }
    if (r->input == NULL) rt->hop[rt->n++] = row(fe, STAGES_THINKER);
    if (r->speech.on) {
#ifdef OMNI_HAVE_SPEECH
        rt->hop[rt->n++] = row(fe, STAGES_TALKER);
        rt->hop[rt->n++] = row(fe, STAGES_VOICEBOX);
#else
        return false;
#endif
    }
    return rt->n > 0;
}

/* Whether every hop takes requests now; else why not (health's words for
 * the first that does not). */
bool route_live(const Frontend *fe, const Route *rt, char *why, size_t cap) {
    for (int i = 0; i < rt->n; i++) {
        if (!stages_live(fe, rt->hop[i])) {
            stages_health(fe, rt->hop[i], why, cap);
            return false;
        }
    }
    return true;
}

bool route_has(const Route *rt, const Stage *s) {
    for (int i = 0; i < rt->n; i++) {
        if (rt->hop[i] == s) return true;
    }
    return false;
}

/* The hop s is on c's route, or -1. */
static int hop_of(const Route *rt, const Stage *s) {
    for (int i = 0; i < rt->n; i++) {
        if (rt->hop[i] == s) return i;
    }
    return -1;
}

/* Hops from..to-1 get the request JSON: each parses what it needs (the
 * talker its voice and mode, the voicebox its format and speed). */
static void submit_hops(Frontend *fe, Conn *c, int from, int to,
                        const char *json, size_t len)
{
    for (int i = from; i < to; i++) {
        c->route.working |= 1u << c->route.hop[i]->row;
    }
    for (int i = from; i < to; i++) {
        stages_send(fe, c->route.hop[i], OMNI_F_STAGE_SUBMIT, c->id, json,
                    len);
    }
}

/* Every hop gets the request at the start, bar the deferred ones. */
void route_submit(Frontend *fe, Conn *c, const char *json, size_t len) {
    submit_hops(fe, c, 0, c->route.deferred > 0 ? c->route.deferred
                                                : c->route.n, json, len);
}

/* The listener of a chat route is done: the other hops get the request
 * with what it heard. Returns 0, or -1 out of memory. */
static int submit_deferred(Frontend *fe, Conn *c) {
    size_t len;
    char  *json = audio_in_json(c, &len);

    if (json == NULL) return -1;
    submit_hops(fe, c, c->route.deferred, c->route.n, json, len);
    free(json);
    return 0;
}


/* ---- Blocks ------------------------------------------------------------- */

/* Drops the reference a BLOCK event carried (checked on arrival). */
static void block_drop(Frontend *fe, const uint8_t *b) {
    pool_unref(&fe->pool, omni_rd32(b));
}

/* The last hop's block is audio in the request's format: AUDIO frames of
 * at most OMNI_MAX_AUDIO bytes each, then the block goes back. Returns 0,
 * or -1 when out of memory. */
static int block_to_client(Frontend *fe, Conn *c, const uint8_t *b) {
    PoolRef        r = pool_ref_read(b);
    const uint8_t *p = (const uint8_t *) pool_block(&fe->pool, r.block)
                       + r.offset;
    int            rc = 0;

    for (uint32_t off = 0; off < r.length && rc == 0; off += OMNI_MAX_AUDIO) {
        uint32_t n = r.length - off < OMNI_MAX_AUDIO ? r.length - off
                                                     : OMNI_MAX_AUDIO;

        rc = frame_put(&c->wr, OMNI_F_AUDIO, p + off, n);
    }
    pool_unref(&fe->pool, r.block);
    if (rc == 0 && r.length > 0 && c->t_audio == 0) {
        c->t_audio = clock_now_s();
        hist_observe(&fe->metrics.ttfa, c->t_audio - c->t_arrive, 1);
    }
    return rc;
}

/* Passes an inner frame on to hop i + 1 as INPUT; a BLOCK's reference
 * goes with it, or is dropped when the frame cannot go. */
static void to_next(Frontend *fe, Conn *c, int i, uint8_t type,
                    const uint8_t *body, uint32_t len)
{
    Stage  *next = c->route.hop[i + 1];
    uint8_t pre[8 + OMNI_FRAME_HDR];

    omni_wr64(pre, c->id);
    omni_hdr_encode(pre + 8, type, len);
    if (next->sp.fd < 0
        || frame_put2(&next->wr, OMNI_F_STAGE_INPUT, pre, sizeof(pre), body,
                      len) != 0)
    {
        if (next->sp.fd >= 0) {
            log_msg(LOG_ERROR, "out of memory queueing INPUT for the %s",
                    next->kind->name);
        }
        if (type == OMNI_F_STAGE_BLOCK) block_drop(fe, body);
        return;
    }
    stages_flush(fe, next);
}


/* ---- Events ------------------------------------------------------------- */

/* A hop's DONE: the first hop's is the base (the thinker's counts, or for
 * speech input the talker's, whose prompt_tokens are the words it read);
 * later hops add what only they know: the talker its phones
 * (audio_tokens), the voicebox the milliseconds it sent (audio_ms). */
static void merge_done(Route *rt, const OmniDone *d, bool listener) {
    if (listener) {
        rt->done.input_audio_ms = d->input_audio_ms;
        if (rt->n > 1) return;          // the counts are the next hop's
    }
    if (!rt->has_done) {
        uint32_t heard = rt->done.input_audio_ms;

        rt->done = *d;
        rt->done.input_audio_ms = heard > 0 ? heard : d->input_audio_ms;
        rt->has_done = true;
        return;
    }
    if (d->audio_tokens > 0) rt->done.audio_tokens = d->audio_tokens;
    if (d->audio_ms > 0) rt->done.audio_ms = d->audio_ms;
}

/* A spoken chat answer's text is kept under its audio id, for a later
 * turn that refers to it. A text that cannot be kept (over the store's
 * bounds, or cut short by our memory) is logged: a later reference to it
 * gets 400 not found. */
static void keep_transcript(Frontend *fe, Conn *c) {
    Err err;

    if (c->keep_id[0] == '\0') return;
    if (c->said.oom) {
        log_msg(LOG_WARN, "request %" PRIu64 ": the transcript of audio id "
                "%s is over %u bytes or out of memory: not kept", c->id,
                c->keep_id, TRANSCRIPTS_MAX_BYTES);
    } else if (transcripts_put(&fe->transcripts, c->keep_id,
                               c->said.p != NULL ? c->said.p : "",
                               c->said.len, clock_now_s(), &err) != 0)
    {
        log_msg(LOG_WARN, "request %" PRIu64 ": transcript of audio id %s "
                "not kept: %s", c->id, c->keep_id, err.msg);
    }
}

/* Ends c with the merged DONE. */
static void finish(Frontend *fe, Conn *c) {
    uint8_t      b[OMNI_DONE_LEN];
    OmniFrameHdr h = { .type = OMNI_F_DONE, .len = OMNI_DONE_LEN };

    keep_transcript(fe, c);
    omni_done_encode(b, &c->route.done);
    fe->metrics.audio_ms += c->route.done.audio_ms;
    if (frame_put(&c->wr, OMNI_F_DONE, b, sizeof(b)) != 0) {
        log_msg(LOG_ERROR, "out of memory queueing an event");
        conn_gone(fe, c);
        return;
    }
    stages_count_end(fe, c, &h, b);
    conn_end(fe, c);
}

/* Output queued for c: flush, then flow control, then the last resort. */
static void after_output(Frontend *fe, Conn *c) {
    conn_flush(fe, c);
    if (c->fd < 0) return;
    route_flow(fe, c);
    if (frame_writer_pending(&c->wr) > CONN_MAX_PENDING) {
        log_msg(LOG_WARN, "request %" PRIu64 ": the client is more than %u "
                "MiB behind; cancelling it", c->id, CONN_MAX_PENDING >> 20);
        conn_gone(fe, c);
    }
}

/* After queueing output for c (rc: frame_put's): on, or c is dropped. */
static void queued(Frontend *fe, Conn *c, int rc, const char *what) {
    if (rc != 0) {
        log_msg(LOG_ERROR, "out of memory queueing %s", what);
        conn_gone(fe, c);
        return;
    }
    after_output(fe, c);
}

/* An ERROR from a hop: the client gets it, and every hop still working a
 * CANCEL, the failed hop too: INPUT frames queued to it before its ERROR
 * reached us may still carry pool references, and only its CANCELLED,
 * which follows them on its channel, says it has dropped them. (Reclaimed
 * at once, such a block went back to the pool while the stage still had
 * its descriptor coming, and the stage exited on a free block.) */
static void hop_error(Frontend *fe, Conn *c, const OmniFrameHdr *h,
                      const uint8_t *body)
{
    if (frame_put(&c->wr, h->type, body, h->len) != 0) {
        conn_gone(fe, c);
        return;
    }
    route_cancel(fe, c, 0);
    stages_count_end(fe, c, h, body);
    conn_end(fe, c);
}

/* The listener of a chat route: TRANSCRIPTs are what the user said, kept
 * (audio_in.c); its DONE submits the rest of the route; its ERROR ends
 * the request as any hop's does. */
static void listener_event(Frontend *fe, Conn *c, Stage *s,
                           const OmniFrameHdr *h, const uint8_t *body)
{
    OmniDone d;

    switch (h->type) {
    case OMNI_F_TRANSCRIPT:
        if (audio_in_heard(c, body, h->len) != 0) {
            route_cancel(fe, c, 0);
            conn_error(fe, c, 503, NULL, "out_of_memory", "out of memory "
                       "keeping the transcript of the audio input");
        }
        return;
    case OMNI_F_DONE:
        c->route.working &= ~(1u << s->row);
        omni_done_decode(&d, body);
        merge_done(&c->route, &d, true);
        if (submit_deferred(fe, c) != 0) {
            route_cancel(fe, c, 0);
            conn_error(fe, c, 503, NULL, "out_of_memory", "out of memory "
                       "passing the transcript of the audio input on");
        }
        return;
    case OMNI_F_STAGE_BLOCK:            // the listener sends none
        block_drop(fe, body);
        return;
    case OMNI_F_ERROR:
        hop_error(fe, c, h, body);
        return;
    default:                            // TEXT, AUDIO: not the listener's
        return;
    }
}

/* An event (checked: a valid client frame, or a BLOCK pool_check took)
 * from stage s for request id. */
void route_event(Frontend *fe, Stage *s, uint64_t id, const OmniFrameHdr *h,
                 const uint8_t *body)
{
    Conn    *c = conn_find(fe, id);
    Route   *rt;
    int      i;
    bool     last;
    OmniDone d;

    if (c == NULL || (i = hop_of(&c->route, s)) < 0
        || !(c->route.working & (1u << s->row)))
    {                                   // cancelled: the CANCEL crossed it
        if (h->type == OMNI_F_STAGE_BLOCK) block_drop(fe, body);
        return;
    }
    rt = &c->route;
    last = i == rt->n - 1;
    if (rt->deferred > 0 && i == 0) {
        listener_event(fe, c, s, h, body);
        return;
    }
    switch (h->type) {
    case OMNI_F_TRANSCRIPT:             // a transcription's: to the client
        if (c->t_first == 0) {
            c->t_first = clock_now_s();
            hist_observe(&fe->metrics.ttft, c->t_first - c->t_arrive, 1);
        }
        queued(fe, c, frame_put(&c->wr, h->type, body, h->len),
               "a transcript");
        return;
    case OMNI_F_REASONING:              // the thinker's: never spoken
        if (c->t_first == 0) {
            c->t_first = clock_now_s();
            hist_observe(&fe->metrics.ttft, c->t_first - c->t_arrive, 1);
        }
        queued(fe, c, frame_put(&c->wr, h->type, body, h->len),
               "reasoning");
        return;
    case OMNI_F_TEXT:
        if (!last) to_next(fe, c, i, h->type, body, h->len);
        if (s != row(fe, STAGES_THINKER)) return;
        if (c->keep_id[0] != '\0'
            && c->said.len + h->len > TRANSCRIPTS_MAX_BYTES)
        {
            c->said.oom = true;         // the store could not take it
        } else if (c->keep_id[0] != '\0') {
            tb_printf(&c->said, "%.*s", (int) h->len, (const char *) body);
        }
        if (c->t_first == 0) {
            c->t_first = clock_now_s();
            hist_observe(&fe->metrics.ttft, c->t_first - c->t_arrive, 1);
        }
        queued(fe, c, frame_put(&c->wr, h->type, body, h->len), "text");
        return;
    case OMNI_F_STAGE_BLOCK:
        if (!last) {
            to_next(fe, c, i, h->type, body, h->len);
            return;
        }
        queued(fe, c, block_to_client(fe, c, body), "audio");
        return;
    case OMNI_F_DONE:
        rt->working &= ~(1u << s->row);
        omni_done_decode(&d, body);
        merge_done(rt, &d, s == listener_row(fe));
        if (last) {
            finish(fe, c);
        } else {
            to_next(fe, c, i, h->type, body, h->len);
        }
        return;
    default:                            // ERROR
        hop_error(fe, c, h, body);
    }
}

/* PAUSE the last hop while the client is more than FLOW_HIGH behind,
 * RESUME it below FLOW_LOW: a slow reader then holds a window of the
 * pool, not all of it. */
void route_flow(Frontend *fe, Conn *c) {
    Route  *rt = &c->route;
    Stage  *last;
    size_t  pending;

    if (c->state != CONN_ACTIVE || rt->n < 2) return;
    last = rt->hop[rt->n - 1];
    if (!(rt->working & (1u << last->row))) return;
    pending = frame_writer_pending(&c->wr);
    if (!rt->paused && pending > FLOW_HIGH) {
        rt->paused = true;
        stages_send(fe, last, OMNI_F_STAGE_PAUSE, c->id, NULL, 0);
    } else if (rt->paused && pending < FLOW_LOW) {
        rt->paused = false;
        stages_send(fe, last, OMNI_F_STAGE_RESUME, c->id, NULL, 0);
    }
}


/* ---- Cancels ------------------------------------------------------------ */

/* Reclaims the blocks of a cancelled request nobody holds any more. Blocks
 * found are a leak unless a stage died with them. */
static void reclaim(Frontend *fe, const CancelRec *r) {
    int n = pool_reclaim_request(&fe->pool, r->id);

    if (n > 0 && r->dead == 0) {
        log_msg(LOG_WARN, "request %" PRIu64 ": %d pool blocks were still "
                "held after every stage dropped it (a leak); reclaimed",
                r->id, n);
    }
}

/* Reclaims the blocks of each dead stage no pending cancel waits on, and
 * lets it restart (stages_timers starts a DOWN row only without
 * reclaim_pending: a new process reuses the owner tag). */
static void reclaim_owners(Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        Stage *s = row(fe, i);
        int    n;

        if (!s->reclaim_pending) continue;
        for (CancelRec *r = fe->cancels; r != NULL; r = r->next) {
            if (r->dead & (1u << s->row)) goto next;
        }
        s->reclaim_pending = false;
        n = pool_reclaim_owner(&fe->pool, (uint16_t) (s->row + 1));
        if (n > 0) {
            log_msg(LOG_INFO, "reclaimed %d pool blocks of the dead %s "
                    "stage", n, s->kind->name);
        }
next:   ;
    }
}

/* Takes the rows in `answered` off every record; records that wait on no
 * one are done: their blocks are reclaimed. */
static void records_answered(Frontend *fe, uint64_t id, uint32_t answered,
                             bool any_id)
{
    CancelRec **pp = &fe->cancels;

    while (*pp != NULL) {
        CancelRec *r = *pp;

        if (any_id || r->id == id) r->waiting &= ~answered;
        if (r->waiting != 0) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        reclaim(fe, r);
        free(r);
    }
    reclaim_owners(fe);
}

/* c is over for its stages (client gone, a hop failed, or a hop died:
 * dead names its row): CANCEL to every hop still working; the blocks are
 * reclaimed once all answered. */
void route_cancel(Frontend *fe, Conn *c, uint32_t dead) {
    Route     *rt = &c->route;
    CancelRec *r = calloc(1, sizeof(*r));

    if (r == NULL) {                    // blocks then wait for an owner
        log_msg(LOG_ERROR, "out of memory recording cancelled request %"
                PRIu64, c->id);         //   reclaim: a leak until then
    } else {
        r->id = c->id;
        r->dead = dead;
        r->next = fe->cancels;
        fe->cancels = r;
    }
    rt->working &= ~dead;
    for (int i = 0; i < rt->n; i++) {
        Stage *s = rt->hop[i];

        if (!(rt->working & (1u << s->row)) || s->sp.fd < 0) continue;
        if (r != NULL) r->waiting |= 1u << s->row;
        stages_send(fe, s, OMNI_F_STAGE_CANCEL, c->id, NULL, 0);
    }
    rt->working = 0;
    if (r != NULL && r->waiting == 0) records_answered(fe, r->id, 0, false);
}

/* CANCELLED from s. */
void route_acked(Frontend *fe, Stage *s, uint64_t id) {
    records_answered(fe, id, 1u << s->row, false);
}

/* s was reaped (its requests failed already, with CANCEL sent to their
 * other hops): it answers for every record, and its blocks wait for the
 * records that name it dead. */
void route_stage_died(Frontend *fe, Stage *s) {
    s->reclaim_pending = true;
    records_answered(fe, 0, 1u << s->row, true);
}

/* At exit: the pool goes with the frontend; the records are freed. */
void route_free(Frontend *fe) {
    while (fe->cancels != NULL) {
        CancelRec *r = fe->cancels;

        fe->cancels = r->next;
        free(r);
    }
}

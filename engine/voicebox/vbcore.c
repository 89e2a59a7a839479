/* vbcore.c -- the voicebox core's scheduling (vbcore.h): the held
 * requests, the two run queues, the workers and the outbox. What a worker
 * does with a chunk is vbpipe.c's.
 *
 * Lookups by id walk the held list: O(requests held), which is bounded by
 * max_requests and small next to a chunk's synthesis (milliseconds); a
 * hash would pay off only at thousands of concurrent speakers.
 *
 * A request's life: vb_submit (IDLE) -> units or input done make it
 * QUEUED -> a worker takes it (RUNNING) for one chunk or its finish ->
 * IDLE or QUEUED again, or ENDED (DONE, ERROR, CANCELLED) on the ended
 * list -> vb_next reports the end, frees its codecs and the VbReq. Only
 * vb_next frees a request, and only after the outbox entries that name
 * it: the outbox is drained before the ended list, and a request is put
 * on the ended list only after its last entry. */

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "vbcore_impl.h"


/* ---- Queues (under mu) -------------------------------------------------- */

static void efd_kick(VbCore *c) {
    uint64_t one = 1;

    while (write(c->efd, &one, sizeof(one)) < 0 && errno == EINTR) {}
}

static void q_append(VbReq **q, VbReq *r) {
    r->qnext = NULL;
    while (*q != NULL) q = &(*q)->qnext;
    *q = r;
}

static void q_remove(VbReq **q, VbReq *r) {
    for (; *q != NULL; q = &(*q)->qnext) {
        if (*q == r) {
            *q = r->qnext;
            return;
        }
    }
}

/* Queues r for a worker if it has work and may run now. */
static void vb_kick(VbCore *c, VbReq *r) {
    if (r->state != VB_IDLE || r->paused || atomic_load(&r->stop)) return;
    if (r->pend_n == 0 && !r->input_done) return;
    r->state = VB_QUEUED;
    q_append(r->chunks == 0 && r->pend_n > 0 ? &c->first_q : &c->next_q, r);
    pthread_cond_signal(&c->cv);
}

/* r is over: to the ended list for vb_next. */
static void vb_end(VbCore *c, VbReq *r, VbOutKind kind) {
    if (r->state == VB_QUEUED) {
        q_remove(&c->first_q, r);
        q_remove(&c->next_q, r);
    }
    r->state = VB_ENDED;
    r->end = kind;
    r->qnext = NULL;
    if (c->ended_tail != NULL) c->ended_tail->qnext = r;
    else c->ended = r;
    c->ended_tail = r;
    efd_kick(c);
}

/* Fails r from the loop: it ends at once unless a worker has it, which
 * stops at its next sink call and ends it then. */
static void vb_fail(VbCore *c, VbReq *r, VbOutKind kind) {
    atomic_store(&r->stop, true);
    r->end = kind;
    if (r->state != VB_RUNNING) vb_end(c, r, kind);
}

void vb_post(VbCore *c, VbReq *r, VbOutKind kind, PoolRef ref) {
    VbEntry *e;

    pthread_mutex_lock(&c->mu);
    /* every entry is a block this stage holds, or the STARTED of a held
     * request: box_cap = n_blocks + max_requests is never reached */
    assert(c->box_n < c->box_cap);
    e = &c->box[(c->box_head + c->box_n++) % c->box_cap];
    e->kind = kind;
    e->r = r;
    e->ref = ref;
    efd_kick(c);
    pthread_mutex_unlock(&c->mu);
}

static VbReq *vb_find(VbCore *c, uint64_t id) {
    VbReq *r;

    for (r = c->held; r != NULL; r = r->next) {
        if (r->id == id && r->state != VB_ENDED) return r;
    }
    return NULL;
}

/* The counters: a chunk synthesized, a request's audio reported. */
static void stats_chunk(VbCore *c) {
    if (c->cfg.stats != NULL) atomic_fetch_add(&c->cfg.stats->voicebox.chunks,
                                               1);
}

static void stats_audio(VbCore *c, uint32_t ms) {
    if (c->cfg.stats != NULL) {
        atomic_fetch_add(&c->cfg.stats->voicebox.audio_ms, ms);
    }
}

/* The generic gauges: waiting = queued for a first chunk, running = the
 * other held requests. Under mu. */
static void stats_gauges(VbCore *c) {
    OmniStats *s = c->cfg.stats;
    int64_t    waiting = 0;

    if (s == NULL) return;
    for (VbReq *r = c->first_q; r != NULL; r = r->qnext) waiting++;
    atomic_store(&s->requests_waiting, waiting);
    atomic_store(&s->requests_running, c->n_held - waiting);
    atomic_store(&s->voicebox.slots_busy, c->busy);
}


/* ---- Workers ------------------------------------------------------------ */

/* The next request a worker should run: first chunks first. Under mu. */
static VbReq *vb_pick(VbCore *c) {
    VbReq **q = c->first_q != NULL ? &c->first_q : &c->next_q;
    VbReq  *r = *q;

    if (r != NULL) *q = r->qnext;
    return r;
}

/* One turn of a worker on r, RUNNING: its next chunk, or its finish. */
static void vb_run(VbWorker *w, VbReq *r) {
    VbCore *c = w->core;
    PoolRef ref = { 0, 0, 0 };
    bool    chunk = r->pend_n > 0, last, post_started = !r->started;
    long    n = 0;

    if (chunk) {
        ref = r->pend[r->pend_head];
        r->pend_head = (r->pend_head + 1) % VB_MAX_PENDING;
        r->pend_n--;
    }
    last = r->input_done && r->pend_n == 0;
    r->started = true;
    c->busy++;
    stats_gauges(c);
    pthread_mutex_unlock(&c->mu);

    if (post_started) vb_post(c, r, VB_OUT_STARTED, ref);
    if (r->enc == NULL && vbpipe_open(r) != 0) {
        if (chunk) (void) pool_unref(c->pool, ref.block);
        n = -1;
    } else {
        n = chunk ? vbpipe_chunk(w, r, ref, last) : vbpipe_finish(w, r);
    }
    if (chunk && n >= 0) stats_chunk(c);

    pthread_mutex_lock(&c->mu);
    c->busy--;
    r->state = VB_IDLE;
    if (atomic_load(&r->stop)) vb_end(c, r, r->end);  // cancel, error
    else if (n < 0) vb_end(c, r, VB_OUT_ERROR);
    else if (!chunk) vb_end(c, r, VB_OUT_DONE);
    else vb_kick(c, r);
    stats_gauges(c);
}

static void *vb_worker(void *arg) {
    VbWorker *w = arg;
    VbCore   *c = w->core;
    VbReq    *r = NULL;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->quit && (r = vb_pick(c)) == NULL) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        if (c->quit) break;
        r->state = VB_RUNNING;
        vb_run(w, r);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}


/* ---- The loop's side ---------------------------------------------------- */

/* The worker buffer's size: the most VB_PIECE samples of any voice of
 * the table resample to. Returns 0, or -1 with err set. */
static int vb_out_cap(VbCore *c, Err *err) {
    const VoiceInfo *vi;
    size_t           n;

    vi = speech_voices(&n);
    for (size_t i = 0; i < n; i++) {
        const TtsVoice *v = tts_voice(vi[i].flite);
        Resampler      *rs;
        size_t          k;

        if (v == NULL) {
            return err_set(err, "voice %s (%s) is not registered",
                           vi[i].name, vi[i].flite);
        }
        rs = resample_new(tts_voice_rate(v), SPEECH_RATE, err);
        if (rs == NULL) return -1;
        k = resample_out_max(rs, VB_PIECE);
        c->out_cap = k > c->out_cap ? k : c->out_cap;
        resample_free(rs);
    }
    return 0;
}

VbCore *vb_new(const VbConfig *cfg, Err *err) {
    VbCore *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->pool = cfg->pool;
    c->synth = cfg->synth != NULL ? cfg->synth : tts_synth;
    c->efd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (cfg->slots < 1 || cfg->max_requests < 1) {
        err_set(err, "voicebox: slots (%d) and max requests (%d) must be "
                ">= 1", cfg->slots, cfg->max_requests);
        goto fail;
    }
    if (vb_out_cap(c, err) != 0) goto fail;
    c->box_cap = (int) c->pool->n_blocks + cfg->max_requests;
    c->box = calloc((size_t) c->box_cap, sizeof(*c->box));
    c->workers = calloc((size_t) cfg->slots, sizeof(*c->workers));
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->box == NULL || c->workers == NULL || c->efd < 0) {
        err_set(err, "voicebox: %s", c->efd < 0 ? strerror(errno)
                                                : "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->slots; i++) {
        VbWorker *w = &c->workers[i];

        w->core = c;
        w->out = malloc(c->out_cap * sizeof(int16_t));
        if (w->out == NULL) {
            err_set(err, "out of memory");
            goto fail;
        }
        if (pthread_create(&w->th, NULL, vb_worker, w) != 0) {
            free(w->out);
            w->out = NULL;
            err_set(err, "voicebox: cannot start worker %d", i);
            goto fail;
        }
        c->n_started++;
    }
    if (cfg->stats != NULL) atomic_store(&cfg->stats->voicebox.slots,
                                         cfg->slots);
    return c;

fail:
    vb_free(c);
    return NULL;
}

int vb_submit(VbCore *c, uint64_t id, const SpeechParams *sp, Err *err) {
    VbReq *r;
    int    rc = 0;

    pthread_mutex_lock(&c->mu);
    if (vb_find(c, id) != NULL) rc = err_set(err, "request %" PRIu64
                                             " is already held", id);
    else if (c->n_held >= c->cfg.max_requests) rc = err_set(err, "the "
             "voicebox holds %d requests, its most", c->n_held);
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) return -1;
    r = calloc(1, sizeof(*r));
    if (r == NULL) return err_set(err, "out of memory");
    r->core = c;
    r->id = id;
    r->voice = tts_voice(sp->voice != NULL ? sp->voice->flite : "");
    r->speed = sp->speed;
    r->format = sp->format;
    r->blk = -1;
    if (r->voice == NULL) {
        free(r);
        return err_set(err, "voice \"%s\" has no synthesizer voice",
                       sp->voice != NULL ? sp->voice->name : "");
    }
    if ((unsigned) sp->format >= AUDIO_N_FORMATS) {
        free(r);
        return err_set(err, "audio format %d is not one of ours",
                       (int) sp->format);
    }
    pthread_mutex_lock(&c->mu);
    r->next = c->held;
    c->held = r;
    c->n_held++;
    stats_gauges(c);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void vb_units(VbCore *c, uint64_t id, PoolRef ref) {
    VbReq *r;

    pthread_mutex_lock(&c->mu);
    r = vb_find(c, id);
    if (r != NULL && atomic_load(&r->stop)) r = NULL;
    if (r != NULL && r->pend_n == VB_MAX_PENDING) {
        err_set(&r->fail, "more than %d units chunks waiting for "
                "synthesis", VB_MAX_PENDING);
        vb_fail(c, r, VB_OUT_ERROR);
        r = NULL;
    }
    if (r == NULL) {
        pthread_mutex_unlock(&c->mu);
        (void) pool_unref(c->pool, ref.block);
        return;
    }
    r->pend[(r->pend_head + r->pend_n++) % VB_MAX_PENDING] = ref;
    vb_kick(c, r);
    pthread_mutex_unlock(&c->mu);
}

void vb_input_done(VbCore *c, uint64_t id, const OmniDone *d) {
    VbReq *r;

    pthread_mutex_lock(&c->mu);
    r = vb_find(c, id);
    if (r != NULL && !r->input_done) {
        r->input_done = true;
        r->done.prompt_tokens = d->prompt_tokens;
        r->done.audio_tokens = d->audio_tokens;
        r->done.finish = d->finish;
        vb_kick(c, r);
    }
    pthread_mutex_unlock(&c->mu);
}

void vb_pause(VbCore *c, uint64_t id, bool paused) {
    VbReq *r;

    pthread_mutex_lock(&c->mu);
    r = vb_find(c, id);
    if (r != NULL) {
        r->paused = paused;
        if (paused && r->state == VB_QUEUED) {
            q_remove(&c->first_q, r);
            q_remove(&c->next_q, r);
            r->state = VB_IDLE;
        }
        vb_kick(c, r);
        stats_gauges(c);
    }
    pthread_mutex_unlock(&c->mu);
}

bool vb_cancel(VbCore *c, uint64_t id) {
    VbReq *r;

    pthread_mutex_lock(&c->mu);
    r = vb_find(c, id);
    if (r != NULL) vb_fail(c, r, VB_OUT_CANCELLED);
    pthread_mutex_unlock(&c->mu);
    return r != NULL;
}

bool vb_error(VbCore *c, uint64_t id, const char *msg) {
    VbReq *r;

    pthread_mutex_lock(&c->mu);
    r = vb_find(c, id);
    if (r != NULL && !atomic_load(&r->stop)) {
        err_set(&r->fail, "%s", msg);
        vb_fail(c, r, VB_OUT_ERROR);
    }
    pthread_mutex_unlock(&c->mu);
    return r != NULL;
}

int vb_wake_fd(const VbCore *c) {
    return c->efd;
}

int vb_held(const VbCore *c) {
    return c->n_held;
}

/* r has ended and its entries are out: drop what it holds, unlink it,
 * and fill o with its end. Under mu. */
static void vb_reap(VbCore *c, VbReq *r, VbOut *o) {
    VbReq **p;

    for (; r->pend_n > 0; r->pend_n--) {
        (void) pool_unref(c->pool, r->pend[r->pend_head].block);
        r->pend_head = (r->pend_head + 1) % VB_MAX_PENDING;
    }
    vbpipe_close(r);
    for (p = &c->held; *p != r; p = &(*p)->next) {}
    *p = r->next;
    c->n_held--;
    o->kind = r->end;
    o->id = r->id;
    if (r->end == VB_OUT_DONE) o->done = r->done;
    if (r->end == VB_OUT_ERROR) {
        memcpy(c->msg, r->fail.msg[0] != '\0' ? r->fail.msg : r->err.msg,
               sizeof(c->msg));
        o->msg = c->msg;
    }
    stats_audio(c, r->done.audio_ms);
    free(r);
    stats_gauges(c);
}

bool vb_next(VbCore *c, VbOut *o) {
    uint64_t drain;
    bool     got = false;

    pthread_mutex_lock(&c->mu);
    while (!got && c->box_n > 0) {
        VbEntry *e = &c->box[c->box_head];

        c->box_head = (c->box_head + 1) % c->box_cap;
        c->box_n--;
        if (atomic_load(&e->r->stop)) {
            if (e->kind == VB_OUT_BLOCK) (void) pool_unref(c->pool,
                                                           e->ref.block);
            continue;
        }
        o->kind = e->kind;
        o->id = e->r->id;
        o->ref = e->ref;
        got = true;
    }
    if (!got && c->ended != NULL) {
        VbReq *r = c->ended;

        c->ended = r->qnext;
        if (c->ended == NULL) c->ended_tail = NULL;
        vb_reap(c, r, o);
        got = true;
    }
    if (!got) (void) read(c->efd, &drain, sizeof(drain));
    pthread_mutex_unlock(&c->mu);
    return got;
}

/* Joins the workers; every request still held is stopped. */
static void vb_join(VbCore *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    for (VbReq *r = c->held; r != NULL; r = r->next) {
        if (r->state == VB_ENDED || atomic_load(&r->stop)) continue;
        atomic_store(&r->stop, true);
        err_set(&r->fail, "%s", why);
        r->end = VB_OUT_ERROR;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_started; i++) pthread_join(c->workers[i].th,
                                                        NULL);
    c->n_started = 0;
    pthread_mutex_lock(&c->mu);
    for (VbReq *r = c->held; r != NULL; r = r->next) {
        if (r->state != VB_ENDED) vb_end(c, r, r->end);
    }
    pthread_mutex_unlock(&c->mu);
}

void vb_stop(VbCore *c, const char *why) {
    vb_join(c, why);
}

void vb_free(VbCore *c) {
    VbOut o;

    if (c == NULL) return;
    vb_join(c, "the voicebox is stopping");
    while (vb_next(c, &o)) {
        if (o.kind == VB_OUT_BLOCK) (void) pool_unref(c->pool, o.ref.block);
    }
    for (int i = 0; i < c->cfg.slots && c->workers != NULL; i++) {
        free(c->workers[i].out);
    }
    free(c->workers);
    free(c->box);
    if (c->efd >= 0) close(c->efd);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

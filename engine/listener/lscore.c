/* lscore.c -- the listener core's scheduling (lscore.h): the held
 * requests, the run queue, the workers and the outbox. What a worker does
 * with a request is lswork.c's.
 *
 * Lookups by id walk the held list: O(requests held), bounded by
 * max_requests and nothing next to a second of recognition.
 *
 * A request's life: ls_submit (RECEIVING) -> ls_audio copies its bytes
 * -> ls_input_done queues it (QUEUED) -> a worker takes it (RUNNING) and
 * runs it to its end -> ENDED: its end (DONE, ERROR, CANCELLED) joins the
 * outbox -> ls_next reports the end and frees it. One FIFO carries
 * every entry, ends included, so the loop sees what happened in the order
 * it happened (a request's DONE before the STARTED of the one its slot
 * takes next), and a request is freed only after the entries that name
 * it. */

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "lscore_impl.h"


/* ---- Queues (under mu) -------------------------------------------------- */

static void efd_kick(LsCore *c) {
    uint64_t one = 1;

    while (write(c->efd, &one, sizeof(one)) < 0 && errno == EINTR) {}
}

static void runq_remove(LsCore *c, LsReq *r) {
    LsReq *prev = NULL;

    for (LsReq *q = c->runq; q != NULL; prev = q, q = q->qnext) {
        if (q != r) continue;
        if (prev != NULL) prev->qnext = r->qnext;
        else c->runq = r->qnext;
        if (c->runq_tail == r) c->runq_tail = prev;
        return;
    }
}

/* Appends an entry (under mu). The caller made sure of room. */
static void box_put(LsCore *c, LsReq *r, LsOutKind kind, char *json,
                    size_t len)
{
    LsEntry *e = &c->box[(c->box_head + c->box_n++) % c->box_cap];

    assert(c->box_n <= c->box_cap);
    e->r = r;
    e->kind = kind;
    e->json = json;
    e->len = len;
    efd_kick(c);
}

/* r is over: its end goes to the outbox, for ls_next. An end always has
 * room: box_cap leaves one per request held. */
static void ls_end(LsCore *c, LsReq *r, LsOutKind kind) {
    if (r->state == LS_QUEUED) runq_remove(c, r);
    r->state = LS_ENDED;
    r->end = kind;
    box_put(c, r, kind, NULL, 0);
}

/* Fails r from the loop: it ends at once unless a worker has it, which
 * sees the stop flag after its piece and ends it then. */
static void ls_fail(LsCore *c, LsReq *r, LsOutKind kind) {
    atomic_store(&r->stop, true);
    r->end = kind;
    pthread_cond_broadcast(&c->room);   // a worker waiting to post
    if (r->state != LS_RUNNING) ls_end(c, r, kind);
}

/* Sets r's ERROR: a 500 of ours (the loop's failures and stops). */
static void fail_500(LsReq *r, const char *msg) {
    r->status = 500;
    r->param[0] = '\0';
    r->code = NULL;
    err_set(&r->fail, "%s", msg);
}

static LsReq *ls_find(LsCore *c, uint64_t id) {
    for (LsReq *r = c->held; r != NULL; r = r->next) {
        if (r->id == id && r->state != LS_ENDED) return r;
    }
    return NULL;
}

/* The generic gauges: waiting = receiving or queued, running = on a
 * worker. Under mu. */
static void stats_gauges(LsCore *c) {
    OmniStats *s = c->cfg.stats;

    if (s == NULL) return;
    atomic_store(&s->requests_waiting, c->n_held - c->busy);
    atomic_store(&s->requests_running, c->busy);
    atomic_store(&s->listener.slots_busy, c->busy);
}

int ls_post(LsCore *c, LsReq *r, LsOutKind kind, char *json, size_t len) {
    pthread_mutex_lock(&c->mu);
    while (c->box_data == LS_BOX && !atomic_load(&r->stop)) {
        pthread_cond_wait(&c->room, &c->mu);
    }
    if (atomic_load(&r->stop)) {
        pthread_mutex_unlock(&c->mu);
        free(json);
        return -1;
    }
    c->box_data++;
    box_put(c, r, kind, json, len);
    pthread_mutex_unlock(&c->mu);
    return 0;
}


/* ---- Workers ------------------------------------------------------------ */

static void *ls_worker(void *arg) {
    LsWorker *w = arg;
    LsCore   *c = w->core;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        LsReq *r;
        int    rc;

        while (!c->quit && c->runq == NULL) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        if (c->quit) break;
        r = c->runq;
        c->runq = r->qnext;
        if (c->runq == NULL) c->runq_tail = NULL;
        r->state = LS_RUNNING;
        c->busy++;
        stats_gauges(c);
        pthread_mutex_unlock(&c->mu);

        rc = ls_post(c, r, LS_OUT_STARTED, NULL, 0) == 0 ? ls_work(w, r)
                                                         : -1;

        pthread_mutex_lock(&c->mu);
        c->busy--;
        if (atomic_load(&r->stop)) {
            ls_end(c, r, r->end);               // cancel, loop's error
        } else if (rc != 0) {
            r->status = r->w_status;
            memcpy(r->param, r->w_param, sizeof(r->param));
            r->code = r->w_code;
            r->fail = r->w_err;
            ls_end(c, r, LS_OUT_ERROR);
        } else {
            ls_end(c, r, LS_OUT_DONE);
        }
        stats_gauges(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}


/* ---- The loop's side ---------------------------------------------------- */

/* Frees the workers' recognisers and buffers (after the join). */
static void workers_free(LsCore *c) {
    for (int i = 0; c->workers != NULL && i < c->cfg.slots; i++) {
        asr_free(c->workers[i].asr);
        free(c->workers[i].seg);
    }
    free(c->workers);
    c->workers = NULL;
}

LsCore *ls_new(const LsConfig *cfg, Err *err) {
    LsCore *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->efd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->room, NULL);
    if (cfg->slots < 1 || cfg->max_requests < 1) {
        err_set(err, "listener: slots (%d) and max requests (%d) must be "
                ">= 1", cfg->slots, cfg->max_requests);
        goto fail;
    }
    c->workers = calloc((size_t) cfg->slots, sizeof(*c->workers));
    c->box_cap = LS_BOX + cfg->max_requests;
    c->box = calloc((size_t) c->box_cap, sizeof(*c->box));
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->workers == NULL || c->box == NULL || c->efd < 0) {
        err_set(err, "listener: %s", c->efd < 0 ? strerror(errno)
                                                : "out of memory");
        goto fail;
    }
    for (int i = 0; i < cfg->slots; i++) {      // one at a time: asr.h
        LsWorker *w = &c->workers[i];

        w->core = c;
        if ((w->seg = malloc(OMNI_MAX_TEXT)) == NULL) {
            err_set(err, "out of memory");
            goto fail;
        }
        if ((w->asr = asr_new(&cfg->asr, err)) == NULL) goto fail;
    }
    for (int i = 0; i < cfg->slots; i++) {
        if (pthread_create(&c->workers[i].th, NULL, ls_worker,
                           &c->workers[i]) != 0) {
            err_set(err, "listener: cannot start worker %d", i);
            goto fail;
        }
        c->n_started++;
    }
    if (cfg->stats != NULL) atomic_store(&cfg->stats->listener.slots,
                                         cfg->slots);
    return c;

fail:
    ls_free(c);
    return NULL;
}

typedef struct {
    char   *out;            // (cap,) the words heard, space-separated
    size_t  cap, at;
    int     words;
} Heard;

static int warm_segment(void *ud, const AsrSegment *seg, Err *err) {
    Heard *h = ud;

    (void) err;
    for (int i = 0; i < seg->n_words; i++, h->words++) {
        int n = snprintf(h->out + h->at, h->cap - h->at, "%s%s",
                         h->at > 0 ? " " : "", seg->words[i].word);

        if (n > 0 && (size_t) n < h->cap - h->at) h->at += (size_t) n;
    }
    return 0;
}

/* The workers wait on an empty queue while this runs: no request exists
 * before READY, so nothing else touches their recognisers. */
int ls_warm(LsCore *c, const int16_t *pcm, size_t n, char *heard,
            size_t cap, Err *err)
{
    for (int i = 0; i < c->cfg.slots; i++) {
        Asr  *a = c->workers[i].asr;
        Heard h = { heard, cap, 0, 0 };

        heard[0] = '\0';
        if (asr_begin(a, err) != 0
            || asr_feed(a, pcm, n, warm_segment, &h, err) != 0
            || asr_finish(a, warm_segment, &h, err) != 0)
            return err_prefix(err, "slot %d", i);
        if (h.words == 0) {
            return err_set(err, "slot %d heard no word in %zu samples of "
                           "speech", i, n);
        }
    }
    return 0;
}

const char *ls_describe(const LsCore *c) {
    return asr_describe(c->workers[0].asr);
}

/* A new LsReq for r's inputs, its buffer allocated; NULL out of memory. */
static LsReq *req_new(LsCore *c, uint64_t id, const OmniRequest *r) {
    LsReq *q = calloc(1, sizeof(*q));

    if (q == NULL) return NULL;
    q->core = c;
    q->id = id;
    q->total = r->audio_in_bytes;
    q->max_seconds = r->max_audio_seconds;
    q->words = r->words;
    q->in = calloc((size_t) r->n_audio_in, sizeof(*q->in));
    q->buf = malloc(q->total > 0 ? q->total : 1);
    if (q->in == NULL || q->buf == NULL) {
        free(q->in);
        free(q->buf);
        free(q);
        return NULL;
    }
    q->n_in = r->n_audio_in;
    for (int k = 0; k < q->n_in; k++) {
        q->in[k].format = r->audio_in[k].format;
        q->in[k].bytes = r->audio_in[k].bytes;
        snprintf(q->in[k].param, sizeof(q->in[k].param), "%s",
                 r->audio_in[k].param);
    }
    return q;
}

int ls_submit(LsCore *c, uint64_t id, const OmniRequest *r,
              LsRefusal *why)
{
    LsReq *q;

    why->status = 503;
    why->code = "overloaded";
    if (r->n_audio_in < 1) {
        why->status = 500;
        why->code = NULL;
        return err_set(&why->err, "the listener got a request without "
                       "audio_in");
    }
    pthread_mutex_lock(&c->mu);
    if (ls_find(c, id) != NULL) {
        why->status = 500;
        why->code = NULL;
        err_set(&why->err, "request %" PRIu64 " is already held", id);
    } else if (c->n_held >= c->cfg.max_requests) {
        err_set(&why->err, "the listener holds %d requests, its most; "
                "retry later", c->n_held);
    } else if (c->n_held > 0
               && c->bytes_held + r->audio_in_bytes > c->cfg.max_bytes) {
        err_set(&why->err, "the listener holds %" PRIu64 " MiB of audio "
                "and this request would take it over its %" PRIu64
                " MiB; retry later", c->bytes_held >> 20,
                c->cfg.max_bytes >> 20);
    } else {
        why->status = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (why->status != 0) return -1;
    if ((q = req_new(c, id, r)) == NULL) {
        why->code = "out_of_memory";
        return err_set(&why->err, "out of memory for %" PRIu64 " bytes of "
                       "audio", r->audio_in_bytes);
    }
    pthread_mutex_lock(&c->mu);
    q->next = c->held;
    c->held = q;
    c->n_held++;
    c->bytes_held += q->total;
    stats_gauges(c);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* The loop alone writes a RECEIVING request's buffer, and a worker reads
 * it only once QUEUED (ordered by mu), so the copy needs no lock. */
void ls_audio(LsCore *c, uint64_t id, PoolRef ref) {
    const uint8_t *p = (const uint8_t *) pool_block(c->cfg.pool, ref.block)
                       + ref.offset;
    LsReq         *r;

    pthread_mutex_lock(&c->mu);
    r = ls_find(c, id);
    if (r != NULL && (atomic_load(&r->stop) || r->state != LS_RECEIVING)) {
        r = NULL;
    }
    if (r != NULL && ref.length > r->total - r->got) {
        fail_500(r, "more audio bytes than audio_in declares");
        ls_fail(c, r, LS_OUT_ERROR);
        r = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (r != NULL) {
        memcpy(r->buf + r->got, p, ref.length);
        r->got += ref.length;
    }
    (void) pool_unref(c->cfg.pool, ref.block);
}

void ls_input_done(LsCore *c, uint64_t id) {
    LsReq *r;

    pthread_mutex_lock(&c->mu);
    r = ls_find(c, id);
    if (r != NULL && r->state == LS_RECEIVING && !atomic_load(&r->stop)) {
        if (r->got != r->total) {
            fail_500(r, "the audio ended before the bytes audio_in "
                     "declares");
            ls_fail(c, r, LS_OUT_ERROR);
        } else {
            r->state = LS_QUEUED;
            r->qnext = NULL;
            if (c->runq_tail != NULL) c->runq_tail->qnext = r;
            else c->runq = r;
            c->runq_tail = r;
            pthread_cond_signal(&c->cv);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

bool ls_cancel(LsCore *c, uint64_t id) {
    LsReq *r;

    pthread_mutex_lock(&c->mu);
    r = ls_find(c, id);
    if (r != NULL) ls_fail(c, r, LS_OUT_CANCELLED);
    pthread_mutex_unlock(&c->mu);
    return r != NULL;
}

bool ls_error(LsCore *c, uint64_t id, const char *msg) {
    LsReq *r;

    pthread_mutex_lock(&c->mu);
    r = ls_find(c, id);
    if (r != NULL && !atomic_load(&r->stop)) {
        fail_500(r, msg);
        ls_fail(c, r, LS_OUT_ERROR);
    }
    pthread_mutex_unlock(&c->mu);
    return r != NULL;
}

int ls_wake_fd(const LsCore *c) {
    return c->efd;
}

int ls_held(const LsCore *c) {
    return c->n_held;
}

/* r has ended and its entries are out: unlink it and fill o with its
 * end. Under mu. */
static void ls_reap(LsCore *c, LsReq *r, LsOut *o) {
    LsReq **p;

    for (p = &c->held; *p != r; p = &(*p)->next) {}
    *p = r->next;
    c->n_held--;
    c->bytes_held -= r->total;
    o->kind = r->end;
    o->id = r->id;
    if (r->end == LS_OUT_DONE) {
        memset(&o->done, 0, sizeof(o->done));
        o->done.input_audio_ms = (uint32_t) (r->samples * 1000 / ASR_RATE);
    }
    if (r->end == LS_OUT_ERROR) {
        memcpy(c->msg, r->fail.msg, sizeof(c->msg));
        memcpy(c->param, r->param, sizeof(c->param));
        o->status = r->status;
        o->param = c->param;
        o->code = r->code;
        o->msg = c->msg;
    }
    free(r->buf);
    free(r->in);
    free(r);
    stats_gauges(c);
}

bool ls_next(LsCore *c, LsOut *o) {
    uint64_t drain;
    bool     got = false;

    pthread_mutex_lock(&c->mu);
    free(c->last_json);
    c->last_json = NULL;
    while (!got && c->box_n > 0) {
        LsEntry e = c->box[c->box_head];

        c->box_head = (c->box_head + 1) % c->box_cap;
        c->box_n--;
        if (e.kind == LS_OUT_STARTED || e.kind == LS_OUT_SEGMENT) {
            c->box_data--;
            pthread_cond_broadcast(&c->room);
            if (atomic_load(&e.r->stop)) {      // cancelled since
                free(e.json);
                continue;
            }
            o->kind = e.kind;
            o->id = e.r->id;
            o->json = c->last_json = e.json;
            o->len = e.len;
        } else {
            ls_reap(c, e.r, o);
        }
        got = true;
    }
    if (!got) (void) read(c->efd, &drain, sizeof(drain));
    pthread_mutex_unlock(&c->mu);
    return got;
}

/* Joins the workers; every request still held is stopped. */
static void ls_join(LsCore *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    for (LsReq *r = c->held; r != NULL; r = r->next) {
        if (r->state == LS_ENDED || atomic_load(&r->stop)) continue;
        fail_500(r, why);
        atomic_store(&r->stop, true);
        r->end = LS_OUT_ERROR;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_cond_broadcast(&c->room);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_started; i++) {
        pthread_join(c->workers[i].th, NULL);
    }
    c->n_started = 0;
    pthread_mutex_lock(&c->mu);
    for (LsReq *r = c->held; r != NULL; r = r->next) {
        if (r->state != LS_ENDED) ls_end(c, r, r->end);
    }
    pthread_mutex_unlock(&c->mu);
}

void ls_stop(LsCore *c, const char *why) {
    ls_join(c, why);
}

void ls_free(LsCore *c) {
    LsOut o;

    if (c == NULL) return;
    ls_join(c, "the listener is stopping");
    while (ls_next(c, &o)) {}
    free(c->last_json);
    free(c->box);
    workers_free(c);
    if (c->efd >= 0) close(c->efd);
    pthread_cond_destroy(&c->room);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

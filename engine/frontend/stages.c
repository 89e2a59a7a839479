/* stages.c -- the frontend's table of stage processes: for each row,
 * starting the process (supervisor.h does the fork+exec), its channel
 * (SUBMIT and CANCEL out; READY, STARTED and EVENT in), watching its
 * heartbeat, killing it when it hangs, failing its requests and
 * restarting it when it dies, and what health says of it.
 *
 * Separate from the connections (conn.c) because a row is a process with
 * a lifecycle of its own (frontend.c's opening comment tells it), and from
 * the loop (frontend.c) so that a new stage is a row here and not a
 * change there. Which rows a request goes through, and what their events
 * become, is route.c's. */

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "frontend_impl.h"

#define GONE_KILL_S       2.0           // channel closed, process alive
#define FAILS_TO_REPORT   3             // failed starts before health
                                        //   blames the stage


/* ---- The thinker's row -------------------------------------------------- */

/* The name requests must use: the configured one (serve_model_name); the
 * stage's READY confirms it. */
static void thinker_init(Stage *s, const ServeConfig *cfg) {
    ThinkerReady *t = &s->ready.thinker;

    t->max_model_len = cfg->ctx;
    serve_model_name(cfg, t->model_id, sizeof(t->model_id));
}

static void thinker_ready(Stage *s, yajl_val v, char *desc, size_t cap) {
    ThinkerReady *t = &s->ready.thinker;
    const char   *idp[] = { "id", NULL };
    const char   *np[] = { "max_model_len", NULL };
    const char   *kp[] = { "kernels", NULL };
    const char   *mp[] = { "max_piece_bytes", NULL };
    const char   *wp[] = { "ws_free", NULL };
    yajl_val      id, n, k, mpv, wsv;

    id = yajl_tree_get(v, idp, yajl_t_string);
    n = yajl_tree_get(v, np, yajl_t_number);
    k = yajl_tree_get(v, kp, yajl_t_string);
    if (k != NULL) {
        snprintf(t->kernels, sizeof(t->kernels), "%s", YAJL_GET_STRING(k));
    }
    if (id != NULL) {
        snprintf(t->model_id, sizeof(t->model_id), "%s",
                 YAJL_GET_STRING(id));
    }
    if (n != NULL && YAJL_IS_INTEGER(n)) {
        t->max_model_len = YAJL_GET_INTEGER(n);
    }
    /* no bound (max_piece 0) unless READY states one in full */
    mpv = yajl_tree_get(v, mp, yajl_t_number);
    wsv = yajl_tree_get(v, wp, yajl_t_any);
    t->bound.max_piece = 0;
    if (mpv != NULL && YAJL_IS_INTEGER(mpv) && YAJL_GET_INTEGER(mpv) >= 0
        && YAJL_GET_INTEGER(mpv) <= UINT32_MAX
        && (YAJL_IS_TRUE(wsv) || YAJL_IS_FALSE(wsv)))
    {
        t->bound.max_piece = (uint32_t) YAJL_GET_INTEGER(mpv);
        t->bound.ws_free = YAJL_IS_TRUE(wsv);
    }
    snprintf(desc, cap, "model %s, context %" PRId64 ", kernels %s, prompt "
             "bound %" PRIu32 " bytes a token%s", t->model_id,
             t->max_model_len, t->kernels, t->bound.max_piece,
             t->bound.ws_free ? " (whitespace free)" : "");
}

#ifdef OMNI_HAVE_SPEECH
/* ---- The talker's, the voicebox's and the listener's rows ---------------
 * Their READY carries no more than their id. */

static void speech_init(Stage *s, const ServeConfig *cfg) {
    (void) s;
    (void) cfg;
}

static void speech_ready(Stage *s, yajl_val v, char *desc, size_t cap) {
    const char *idp[] = { "id", NULL };
    yajl_val    id = yajl_tree_get(v, idp, yajl_t_string);

    (void) s;
    snprintf(desc, cap, "%s", id != NULL ? YAJL_GET_STRING(id) : "(no id)");
}
#endif

static const StageKind STAGE_KINDS[STAGES_N] = {
    [STAGES_THINKER] = { "thinker", thinker_init, thinker_ready,
                         sup_reset_thinker, metrics_thinker },
#ifdef OMNI_HAVE_SPEECH
    [STAGES_TALKER] = { "talker", speech_init, speech_ready, sup_reset_none,
                        metrics_talker },
    [STAGES_VOICEBOX] = { "voicebox", speech_init, speech_ready,
                          sup_reset_voicebox, metrics_voicebox },
    [STAGES_LISTENER] = { "listener", speech_init, speech_ready,
                          sup_reset_listener, metrics_listener },
#endif
};

/* ---- The table ---------------------------------------------------------- */

/* Sets up every row: its page and argv (sup_init: the pool's fd and the
 * row's owner tag, row + 1, go on its command line), its channel buffers,
 * its READY defaults. argv (the serve options) is borrowed for the
 * frontend's life. Returns 0, or -1 with err set and nothing left to free. */
int stages_init(Frontend *fe, int argc, char **argv, Err *err) {
    for (int i = 0; i < STAGES_N; i++) {
        Stage           *s = &fe->stages[i];
        const StageKind *k = &STAGE_KINDS[i];

        memset(s, 0, sizeof(*s));
        s->kind = k;
        s->row = i;
        s->s_chan = (Source) { SRC_STAGE, s };
        s->s_err = (Source) { SRC_STAGE_ERR, s };
        s->st = STAGE_DOWN;
        s->gone_kill_at = INFINITY;
        s->watch_at = INFINITY;
        k->init(s, fe->cfg);
        if (sup_init(&s->sp, k->name, k->reset, fe->pool.fd,
                     (uint16_t) (i + 1), argc, argv, err) != 0)
        {
            while (i-- > 0) sup_free(&fe->stages[i].sp);
            return -1;
        }
        frame_reader_init(&s->rd, OMNI_DIR_STAGE);
        frame_writer_init(&s->wr);
    }
    return 0;
}

/* After the loop: every stage has been reaped unless the loop broke out on
 * an error, in which case it is killed and waited for here. */
void stages_free(Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        Stage *s = &fe->stages[i];

        if (s->sp.pid > 0) {
            kill(s->sp.pid, SIGKILL);
            while (!sup_reap(&s->sp)) usleep(10000);
        }
        sup_free(&s->sp);
        frame_reader_free(&s->rd);
        frame_writer_free(&s->wr);
    }
}

/* Whether any stage process is still there (not reaped). */
bool stages_running(const Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        if (fe->stages[i].sp.pid > 0) return true;
    }
    return false;
}


/* ---- Talking to a stage ------------------------------------------------- */

static void channel_closed(Frontend *fe, Stage *s);

/* Queues SUBMIT or CANCEL (payload: u64 id [+ the request JSON]). A stage
 * that is not up gets nothing: its requests are failed when it is reaped. */
void stages_send(Frontend *fe, Stage *s, uint8_t type, uint64_t id,
                 const void *body, size_t len)
{
    uint8_t idb[8];

    if (s->sp.fd < 0) return;
    omni_wr64(idb, id);
    if (frame_put2(&s->wr, type, idb, 8, body, len) != 0) {
        log_msg(LOG_ERROR, "out of memory queueing a frame for the %s",
                s->kind->name);
        return;
    }
    stages_flush(fe, s);
}

void stages_flush(Frontend *fe, Stage *s) {
    if (s->sp.fd < 0) return;
    if (frame_flush(&s->wr, s->sp.fd) != 0) {
        channel_closed(fe, s);
        return;
    }
    frontend_ep_set(fe, s->sp.fd, &s->events,
                    EPOLLIN | (frame_writer_pending(&s->wr) > 0 ? EPOLLOUT
                                                                : 0),
                    &s->s_chan);
}

/* The channel closed or failed: stop using it. The requests on it are
 * failed when the process is reaped; a process that stays is killed. */
static void channel_closed(Frontend *fe, Stage *s) {
    if (s->sp.fd < 0) return;
    epoll_ctl(fe->ep, EPOLL_CTL_DEL, s->sp.fd, NULL);
    sup_close_channel(&s->sp);
    s->events = 0;
    if (s->sp.pid > 0) {
        s->st = STAGE_GONE;
        s->gone_kill_at = clock_now_s() + GONE_KILL_S;
    }
}

/* Shutdown: every channel is closed, so every stage exits on EOF; the
 * frontend's stop_kill_at governs from now on, not gone_kill_at. */
void stages_stop(Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        channel_closed(fe, &fe->stages[i]);
        fe->stages[i].gone_kill_at = INFINITY;
    }
}


/* ---- Liveness -----------------------------------------------------------
 * Silence counts from the stage's last heartbeat, or from its READY when
 * it has not beaten since (sup_silence). */

double stages_silence(const Stage *s, double now, double *in_step) {
    return sup_silence(&s->sp, s->ready_at, now, in_step);
}

/* Whether the stage takes requests now: READY and not silent. Computed
 * from the page at the moment of asking, whatever the timers saw. */
bool stages_live(const Frontend *fe, const Stage *s) {
    return s->st == STAGE_READY && !s->hang_killed
           && stages_silence(s, clock_now_s(), NULL)
              < fe->cfg->stage_unready_s;
}

/* What health says of a silent stage. */
static void silence_reason(const Frontend *fe, const Stage *s, char *why,
                           size_t cap)
{
    double in_step, silence = stages_silence(s, clock_now_s(), &in_step);
    char   step[64] = "", kill[96];

    if (in_step >= 0) {
        snprintf(step, sizeof(step), " (one step has run for %.1f s)",
                 in_step);
    }
    if (s->hang_killed) {
        snprintf(kill, sizeof(kill), "; killed, restarting");
    } else if (fe->cfg->stage_kill_s > 0) {
        snprintf(kill, sizeof(kill), "; it is killed and restarted at %g s",
                 fe->cfg->stage_kill_s);
    } else {
        snprintf(kill, sizeof(kill), "; it is not killed "
                 "(--stage-kill-after 0)");
    }
    snprintf(why, cap, "the %s stage (pid %d) has been silent for "
             "%.1f s%s%s", s->kind->name, (int) s->sp.pid, silence, step,
             kill);
}

/* 200 "ready", or 503 and why not, in the words health and refused
 * requests both use. */
int stages_health(const Frontend *fe, const Stage *s, char *why, size_t cap)
{
    const StageProc *sp = &s->sp;
    const char      *name = s->kind->name;

    if (stages_live(fe, s)) {
        snprintf(why, cap, "ready");
        return 200;
    }
    if (s->st == STAGE_READY) {
        silence_reason(fe, s, why, cap);
        return 503;
    }
    if (sp->fails >= FAILS_TO_REPORT) {
        snprintf(why, cap, "the %s stage failed %d times before it was "
                 "ready (last: %s%s%s); retrying", name, sp->fails,
                 sp->exit_desc, sp->last_line[0] ? ": " : "",
                 sp->last_line);
    } else if (sp->exit_desc[0] != '\0') {
        snprintf(why, cap, "the %s stage is restarting", name);
    } else if (s->row == STAGES_THINKER) {
        snprintf(why, cap, "the model is loading");
    } else {
        snprintf(why, cap, "the %s stage is starting", name);
    }
    return 503;
}


/* ---- Frames from a stage ------------------------------------------------ */

void stages_kill(Stage *s, const char *why) {
    if (s->sp.pid <= 0) return;
    log_msg(LOG_ERROR, "%s stage (pid %d) %s; killing it", s->kind->name,
            (int) s->sp.pid, why);
    kill(s->sp.pid, SIGKILL);
}

/* Metrics for a request's last event. */
void stages_count_end(Frontend *fe, Conn *c, const OmniFrameHdr *h,
                      const uint8_t *body)
{
    OmniDone  d;
    OmniError e = { 0 };
    double    t = clock_now_s();

    if (h->type == OMNI_F_ERROR) {
        omni_error_decode(&e, body, h->len);
        metrics_error(&fe->metrics, e.status, e.code, e.code_len);
        return;
    }
    omni_done_decode(&d, body);
    fe->metrics.success[d.finish == OMNI_FINISH_LENGTH]++;
    if (c->t_first == 0 && d.completion_tokens > 0) {
        c->t_first = t;
        hist_observe(&fe->metrics.ttft, t - c->t_arrive, 1);
    }
    if (d.completion_tokens > 1) {
        hist_observe(&fe->metrics.itl,
                     (t - c->t_first) / (d.completion_tokens - 1),
                     d.completion_tokens - 1);
    }
}

/* Checks the client frame inside an EVENT, or a BLOCK (its descriptor
 * against the pool); a stage that sends a malformed one is broken, and the
 * client must not see it. */
static bool event_valid(const Frontend *fe, const OmniFrameHdr *h,
                        const uint8_t *body, size_t len)
{
    OmniDone  d;
    OmniError e;
    Err       err;
    PoolRef   r;

    if (h->type == OMNI_F_STAGE_BLOCK) {
        if (h->len != len || len != STAGE_BLOCK_LEN
            || omni_rd32(body + 12) != 0)
        {
            return false;
        }
        r = pool_ref_read(body);
        return pool_check(&fe->pool, r, &err) == 0;
    }
    if (omni_frame_check(h, OMNI_DIR_TO_CLIENT) != NULL || h->len != len) {
        return false;
    }
    switch (h->type) {
    case OMNI_F_TEXT:
    case OMNI_F_REASONING:
    case OMNI_F_TRANSCRIPT: return h->len > 0;
    case OMNI_F_DONE:  return omni_done_decode(&d, body) == 0;
    case OMNI_F_ERROR: return omni_error_decode(&e, body, len) == 0;
    default:           return false;
    }
}

/* Checked here, routed by route.c. */
static void on_event(Frontend *fe, Stage *s, const uint8_t *p, size_t len) {
    OmniFrameHdr h;

    if (len < 8 + OMNI_FRAME_HDR) {
        stages_kill(s, "sent a truncated EVENT");
        return;
    }
    omni_hdr_decode(&h, p + 8);
    if (!event_valid(fe, &h, p + 16, len - 16)) {
        stages_kill(s, "sent an invalid event");
        return;
    }
    route_event(fe, s, omni_rd64(p), &h, p + 16);
}

/* Whether every stage is READY: a candidate takes over then. */
static bool all_ready(const Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        if (fe->stages[i].st != STAGE_READY) return false;
    }
    return true;
}

/* READY's payload is JSON for every stage; what it holds is the kind's
 * (StageKind.ready). */
static void on_ready(Frontend *fe, Stage *s, const uint8_t *p, size_t len) {
    char    *json = malloc(len + 1);
    char     desc[384];
    yajl_val v;

    if (json == NULL) return;
    memcpy(json, p, len);
    json[len] = '\0';
    v = yajl_tree_parse(json, NULL, 0);
    free(json);
    s->kind->ready(s, v, desc, sizeof(desc));
    yajl_tree_free(v);
    s->st = STAGE_READY;
    s->was_ready = true;
    s->ready_at = clock_now_s();
    s->sp.fails = 0;
    s->silent = false;
    s->watch_at = s->ready_at + fe->cfg->stage_unready_s;
    log_msg(LOG_INFO, "%s stage (pid %d) ready: %s", s->kind->name,
            (int) s->sp.pid, desc);
    if (fe->candidate && fe->phase == PHASE_RUN && all_ready(fe)) {
        listen_takeover(fe);
    }
}

static void on_started(Frontend *fe, Stage *s, const uint8_t *p, size_t len)
{
    Conn *c = len == 8 ? conn_find(fe, omni_rd64(p)) : NULL;

    /* the queue is the first hop's: a later hop starts when fed */
    if (c != NULL && c->route.n > 0 && c->route.hop[0] == s) {
        hist_observe(&fe->metrics.queue, clock_now_s() - c->t_submit, 1);
    }
}

static void stage_frame(Frontend *fe, Stage *s) {
    const uint8_t *p = s->rd.payload;
    size_t         len = s->rd.hdr.len;

    switch (s->rd.hdr.type) {
    case OMNI_F_STAGE_READY:   on_ready(fe, s, p, len);   break;
    case OMNI_F_STAGE_STARTED: on_started(fe, s, p, len); break;
    case OMNI_F_STAGE_EVENT:   on_event(fe, s, p, len);   break;
    case OMNI_F_STAGE_CANCELLED:
        if (len == 8) {
            route_acked(fe, s, omni_rd64(p));
        } else {
            stages_kill(s, "sent a CANCELLED without a request id");
        }
        break;
    default:
        stages_kill(s, "sent an unexpected frame type");
    }
}

/* Reads and handles every frame the channel holds now. */
void stages_read(Frontend *fe, Stage *s) {
    FrameStatus st;
    bool        eof;

    while (s->sp.fd >= 0) {
        eof = false;
        st = frame_read_fd(&s->rd, s->sp.fd, &eof);
        if (st == FRAME_READY) {
            stage_frame(fe, s);
            frame_reader_next(&s->rd);
            continue;
        }
        if (st == FRAME_BAD || st == FRAME_NOMEM) {
            stages_kill(s, st == FRAME_BAD ? s->rd.error
                                           : "sent a frame too large to hold");
            channel_closed(fe, s);
        } else if (eof) {
            channel_closed(fe, s);
        }
        return;
    }
}


/* ---- Supervision -------------------------------------------------------- */

void stages_start(Frontend *fe, Stage *s) {
    const char *name = s->kind->name;
    uint32_t    ev = 0;
    Err         err;

    frame_reader_free(&s->rd);
    frame_writer_free(&s->wr);
    frame_reader_init(&s->rd, OMNI_DIR_STAGE);
    frame_writer_init(&s->wr);
    if (sup_start(&s->sp, &err) != 0) {
        int delay = sup_backoff(&s->sp, -1);

        snprintf(s->sp.exit_desc, sizeof(s->sp.exit_desc),
                 "could not start");
        log_msg(LOG_ERROR, "starting the %s stage: %s; retrying in %d ms",
                name, err.msg, delay);
        s->restart_at = clock_now_s() + delay / 1e3;
        return;
    }
    s->st = STAGE_LOADING;
    s->was_ready = false;
    s->silent = false;
    s->hang_killed = false;
    s->gone_kill_at = INFINITY;
    s->events = 0;
    frontend_ep_set(fe, s->sp.fd, &s->events, EPOLLIN, &s->s_chan);
    frontend_ep_set(fe, s->sp.err_fd, &ev, EPOLLIN, &s->s_err);
    log_msg(LOG_INFO, "started the %s stage (pid %d)", name,
            (int) s->sp.pid);
}

/* The process has been reaped: fail what was in flight on it and, unless
 * shutting down, schedule the next start. Frames it wrote before dying
 * are handled first (a DONE may be among them). */
static void stage_died(Frontend *fe, Stage *s) {
    const char *name = s->kind->name;
    char        msg[224];
    int64_t     failed = 0;
    double      t = clock_now_s();
    int         delay;

    stages_read(fe, s);
    channel_closed(fe, s);
    sup_read_stderr(&s->sp);
    snprintf(msg, sizeof(msg), "the %s stage exited (%s%s%s); retry", name,
             s->sp.exit_desc, s->hang_killed ? ": " : "",
             s->hang_killed ? s->kill_why : "");
    for (Conn *c = fe->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->state == CONN_ACTIVE && route_has(&c->route, s)) {
            route_cancel(fe, c, 1u << s->row);
            conn_error(fe, c, 503, NULL, "stage_failed", msg);
            failed++;
        }
    }
    s->st = STAGE_DOWN;
    route_stage_died(fe, s);
    if (fe->phase != PHASE_RUN) {
        log_msg(LOG_INFO, "%s stage exited (%s)", name, s->sp.exit_desc);
        return;
    }
    delay = sup_backoff(&s->sp, s->was_ready ? t - s->ready_at : -1);
    atomic_fetch_add_explicit(&s->sp.stats->stage_restarts, 1,
                              memory_order_relaxed);
    s->restart_at = t + delay / 1e3;
    log_msg(LOG_WARN, "%s stage exited (%s)%s%s; %" PRId64 " requests "
            "failed; restarting in %d ms", name, s->sp.exit_desc,
            s->was_ready ? "" : " before it was ready: ",
            s->was_ready ? "" : s->sp.last_line, failed, delay);
}

/* SIGCHLD: collects every stage that ended. */
void stages_reap(Frontend *fe) {
    for (int i = 0; i < STAGES_N; i++) {
        if (sup_reap(&fe->stages[i].sp)) stage_died(fe, &fe->stages[i]);
    }
}

/* The heartbeat check behind the timers: logs the stage going silent and
 * coming back, and kills it once silent for cfg->stage_kill_s (0: never).
 * Returns the time of the next check: the silence deadline while the
 * stage beats, a short poll while it is silent (to see it come back). */
static double stage_watch(Frontend *fe, Stage *s, double now) {
    const ServeConfig *cfg = fe->cfg;
    const char        *name = s->kind->name;
    double             in_step, silence;
    char               why[96];

    if (s->st != STAGE_READY || s->hang_killed) return INFINITY;
    silence = stages_silence(s, now, &in_step);
    if (silence < cfg->stage_unready_s) {
        if (s->silent) {
            log_msg(LOG_INFO, "%s stage (pid %d) is beating again; ready",
                    name, (int) s->sp.pid);
        }
        s->silent = false;
        return now + cfg->stage_unready_s - silence;
    }
    if (!s->silent) {
        log_msg(LOG_WARN, "%s stage (pid %d) silent for %.1f s%s; not "
                "ready", name, (int) s->sp.pid, silence,
                in_step >= 0 ? " in one step" : "");
        s->silent = true;
    }
    if (cfg->stage_kill_s > 0 && silence >= cfg->stage_kill_s) {
        snprintf(s->kill_why, sizeof(s->kill_why), "killed after %.1f s "
                 "without a heartbeat%s", silence,
                 in_step >= 0 ? ", in one step" : "");
        s->hang_killed = true;
        atomic_fetch_add_explicit(&s->sp.stats->stage_hang_kills, 1,
                                  memory_order_relaxed);
        snprintf(why, sizeof(why), "has been silent for %.1f s%s", silence,
                 in_step >= 0 ? " in one step" : "");
        stages_kill(s, why);
        return INFINITY;
    }
    return now + STAGE_BEAT_MS / 1e3;
}


/* ---- Timers ------------------------------------------------------------- */

/* The nearest of the stages' deadlines (restart, kill after EOF, the
 * heartbeat check), INFINITY when none is armed. */
double stages_deadline(const Frontend *fe) {
    double next = INFINITY;

    for (int i = 0; i < STAGES_N; i++) {
        const Stage *s = &fe->stages[i];

        if (fe->phase == PHASE_RUN && s->st == STAGE_DOWN
            && !s->reclaim_pending)
        {
            next = fmin(next, s->restart_at);
        }
        if (s->st == STAGE_GONE) next = fmin(next, s->gone_kill_at);
        next = fmin(next, s->watch_at);
    }
    return next;
}

void stages_timers(Frontend *fe, double now) {
    for (int i = 0; i < STAGES_N; i++) {
        Stage *s = &fe->stages[i];

        if (fe->phase == PHASE_RUN && s->st == STAGE_DOWN
            && now >= s->restart_at && !s->reclaim_pending)
        {
            stages_start(fe, s);
        }
        if (now >= s->watch_at || s->st != STAGE_READY) {
            s->watch_at = stage_watch(fe, s, now);
        }
        if (s->st == STAGE_GONE && now >= s->gone_kill_at) {
            stages_kill(s, "closed its channel but did not exit");
            s->gone_kill_at = INFINITY;
        }
    }
}

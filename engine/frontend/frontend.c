/* frontend.c -- the frontend process of `omni-engine serve`: the Unix
 * socket server, routing requests through the stages (route.c) and their
 * events back, supervising the stages, and answering health, models
 * and metrics.
 *
 * Four files share the work (frontend_impl.h holds what they share):
 * this one sets up and tears down, runs the loop, its timers and signals,
 * shuts down and answers the control frames; conn.c the connections and
 * their requests; stages.c the table of stage processes; listen.c the
 * socket, the lock file and the takeover.
 *
 * One thread, one epoll loop, every descriptor non-blocking. Sources:
 *
 *   listener        accept; paused for a moment when descriptors run out
 *   signalfd        SIGCHLD (reap a stage), SIGTERM/SIGINT (shut down),
 *                   SIGUSR2 (a candidate gives up its replacement)
 *   stage channel   frames from a stage: READY, STARTED, EVENT
 *   stage stderr    copied to ours; its last line explains a failed start
 *   connections     one per request or control exchange
 *
 * Timers (stage restart, drain deadline, kill deadlines) are a handful of
 * deadlines folded into epoll_wait's timeout; a timer heap would buy
 * nothing at this count.
 *
 * A connection: READ (waiting for its one frame; it gets --read-timeout
 * seconds, then a 408 error, so a client that connects and sends nothing
 * does not hold a descriptor for good) -> ACTIVE for a REQUEST
 * (in the id table; the stage's events for it are forwarded) -> CLOSING
 * (its last frame is queued; closed once flushed). Control frames and
 * refused requests go from READ to CLOSING at once. A client that closes
 * or fails while ACTIVE is a cancel: CANCEL goes to every stage of its
 * route still working on it (route.c) and the connection is freed. Each connection's queued output is bounded
 * (CONN_MAX_PENDING): a client that stops reading is cancelled and dropped
 * rather than allowed to grow our memory.
 *
 * Each stage in the table (stages.c; one row per kind of stage) gets the
 * requests whose route (route.c) passes through it, and lives
 * on its own: DOWN (no process; restart_at) -> LOADING (started) -> READY
 * -> GONE (its channel hit EOF, the process is not reaped yet) -> DOWN.
 * Requests in flight are failed when the process is reaped, not at EOF:
 * EOF usually comes first, and the error should say how the stage ended.
 * A stage that closes its channel but lives on is killed after
 * GONE_KILL_S.
 *
 * A READY stage is watched through its heartbeat (stage_channel.h): silent for
 * cfg->stage_unready_s it is not ready (health 503 saying for how long,
 * new requests refused, the requests it holds wait), and it is ready again
 * as soon as it beats; silent for cfg->stage_kill_s it is killed (SIGKILL)
 * and handled as any stage that died: its requests (those routed to it,
 * no others) get 503 stage_failed and it is restarted. The check costs no
 * wakeup while the stage beats: the next deadline is the last beat plus
 * the threshold.
 *
 * A request whose prompt cannot fit the context by the thinker's prompt
 * bound (stage_channel.h; READY announces it) is refused here, after the parse,
 * so the stage never spends a tokenization on it.
 *
 * Shutdown (SIGTERM/SIGINT): RUN -> DRAIN (the socket file is removed if
 * it is still ours, so nothing new can connect; connections already queued
 * in the listen backlog are accepted and served, and requests in flight
 * may finish, for cfg->drain_s) -> FINISH (listener closed; the rest get
 * 503 engine_shutdown, the stage channels are closed so the stages exit,
 * SIGKILL after STOP_KILL_S) -> return. A second signal skips the drain.
 *
 * Replacement (--replace, how nginx swaps engines without an outage): when
 * another engine holds --lock-file, this one starts beside it on private
 * names, <socket>.next and <lock-file>.next, and once every stage is READY
 * renames both over the public ones and sends the old engine SIGTERM. From
 * the rename on, every connect() reaches us; the old engine sees that the
 * socket path no longer names the file it bound (device, inode and ctime
 * compared), leaves it alone, and drains as above.
 *
 * Freeing: a connection closed while one epoll batch is handled may have
 * another event later in the same batch, so closing marks it (fd -1) and
 * parks it on a list that is freed after the batch. */


#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <yajl/yajl_gen.h>

#include "frontend_impl.h"

#define MAX_EVENTS        64
#define STOP_KILL_S       5.0           // shutdown: stage exit, flushes
#define PARSE_NICE        10            // the parse thread's nice value,
                                        //   above ours


/* Sets fd's epoll interest to events, adding fd when it is not in the set
 * yet; *cur is the mask registered now. EPOLLHUP and EPOLLERR are always
 * reported, whatever the mask. */
void frontend_ep_set(Frontend *fe, int fd, uint32_t *cur, uint32_t events,
                     void *src)
{
    struct epoll_event ev = { .events = events, .data.ptr = src };

    if (*cur == events) return;
    if (epoll_ctl(fe->ep, EPOLL_CTL_MOD, fd, &ev) != 0
        && epoll_ctl(fe->ep, EPOLL_CTL_ADD, fd, &ev) != 0)
    {
        log_msg(LOG_ERROR, "epoll_ctl on fd %d: %s", fd, strerror(errno));
    }
    *cur = events;
}


/* ---- Control replies ---------------------------------------------------- */

/* 200 "ready" when every stage is, or 503 and why not: the first stage
 * that is not ready, in the words a request refused by it gets. */
static int health(const Frontend *fe, char *why, size_t cap) {
    if (fe->phase == PHASE_FINISH) {
        snprintf(why, cap, "the engine is shutting down");
        return 503;
    }
    for (int i = 0; i < STAGES_N; i++) {
        if (stages_health(fe, &fe->stages[i], why, cap) != 200) return 503;
    }
    return 200;
}

static void reply_health(Frontend *fe, Conn *c) {
    uint8_t buf[2 + 1024];
    int     status = health(fe, (char *) buf + 2, sizeof(buf) - 2);

    omni_wr16(buf, (uint16_t) status);
    if (frame_put(&c->wr, OMNI_F_HEALTH_R, buf, 2 + strlen((char *) buf + 2))
        != 0)
    {
        conn_gone(fe, c);
        return;
    }
    conn_end(fe, c);
}

static void reply_models(Frontend *fe, Conn *c) {
    yajl_gen             g = yajl_gen_alloc(NULL);
    const unsigned char *out;
    size_t               len;
    int                  rc = -1;

#define KEY(s) yajl_gen_string(g, (const unsigned char *) (s), strlen(s))
    if (g != NULL) {
        yajl_gen_map_open(g);
        KEY("data");
        yajl_gen_array_open(g);
        yajl_gen_map_open(g);
        KEY("id");
        KEY(fe_model(fe)->model_id);
        KEY("created");
        yajl_gen_integer(g, fe->created);
        KEY("owned_by");
        KEY("ngx_omni");
        KEY("max_model_len");
        yajl_gen_integer(g, fe_model(fe)->max_model_len);
        yajl_gen_map_close(g);
        yajl_gen_array_close(g);
        yajl_gen_map_close(g);
        if (yajl_gen_get_buf(g, &out, &len) == yajl_gen_status_ok) {
            rc = frame_put(&c->wr, OMNI_F_MODELS_R, out, len);
        }
        yajl_gen_free(g);
    }
#undef KEY
    if (rc != 0) {
        conn_gone(fe, c);
        return;
    }
    conn_end(fe, c);
}

static void reply_metrics(Frontend *fe, Conn *c) {
    TextBuf       tb;
    MetricsGauges g;
    MetricsStage  ms[STAGES_N];
    double        t = clock_now_s();
    int           rc = -1;

    for (int i = 0; i < STAGES_N; i++) {
        const Stage *s = &fe->stages[i];

        ms[i].name = s->kind->name;
        ms[i].render = s->kind->render;
        ms[i].stats = s->sp.stats;
        ms[i].ready = stages_live(fe, s);
        ms[i].heartbeat_age = s->st == STAGE_READY
                              ? stages_silence(s, t, NULL) : 0;
        ms[i].rss = s->sp.pid > 0 ? metrics_rss(s->sp.pid) : -1;
    }
    g.model = fe_model(fe)->model_id;
    g.kernels = fe_model(fe)->kernels;
    g.stages = ms;
    g.n_stages = STAGES_N;
    g.connections = fe->n_conns;
    pool_stats(&fe->pool, &g.pool);
    g.rss_frontend = metrics_rss(0);
    tb_init(&tb);
    metrics_render(&tb, &fe->metrics, &g);
    if (!tb.oom && tb.len <= OMNI_MAX_REPLY) {
        rc = frame_put(&c->wr, OMNI_F_METRICS_R, tb.p, tb.len);
    }
    tb_free(&tb);
    if (rc != 0) {
        conn_gone(fe, c);
        return;
    }
    conn_end(fe, c);
}

/* The control frames: everything but a REQUEST. */
void frontend_reply(Frontend *fe, Conn *c) {
    switch (c->rd.hdr.type) {
    case OMNI_F_HEALTH:  reply_health(fe, c);  break;
    case OMNI_F_MODELS:  reply_models(fe, c);  break;
    case OMNI_F_METRICS: reply_metrics(fe, c); break;
    default:
        /* frame_feed checked the type for this direction */
        conn_error(fe, c, 400, NULL, NULL, "unexpected frame type");
    }
}


/* ---- Shutdown and signals ----------------------------------------------- */

/* Nothing in flight: no request at the stage, none on the parse thread,
 * none still arriving (a client that connected before the socket file
 * went, or before our replacement took it, may still be writing a large
 * frame; the read timeout bounds the wait for it). */
static bool drained(const Frontend *fe) {
    if (fe->n_active > 0 || fe->rhead != NULL) return false;
    for (const Conn *c = fe->conns; c != NULL; c = c->next) {
        if (c->fd >= 0 && c->state == CONN_PARSING) return false;
    }
    return true;
}

/* Ends what is still running; connections that never sent their frame
 * are closed, so an idle client cannot hold up the exit. */
static void finish_begin(Frontend *fe) {
    fe->phase = PHASE_FINISH;
    listen_backlog(fe);
    listen_close(fe);
    for (Conn *c = fe->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->state == CONN_ACTIVE || c->state == CONN_PARSING) {
            conn_error(fe, c, 503, NULL, "engine_shutdown",
                       "the engine is shutting down");
        } else if (c->state == CONN_READ) {
            conn_close(fe, c);
        }
    }
    fe->stop_kill_at = clock_now_s() + STOP_KILL_S;
    fe->clients_until = fe->stop_kill_at;
    stages_stop(fe);                    // each stage exits on EOF
}

/* The listener stays open while draining: with the socket file gone (or
 * passed on to our replacement) nothing new can connect, and what was
 * already queued is served (listen_backlog). */
void frontend_stop(Frontend *fe, const char *why) {
    if (fe->phase != PHASE_RUN) {
        log_msg(LOG_WARN, "second %s: not waiting for requests in flight",
                why);
        if (fe->phase == PHASE_DRAIN) finish_begin(fe);
        return;
    }
    log_msg(LOG_WARN, "%s: draining %" PRId64 " requests (at most %d s)",
            why, fe->n_active, fe->cfg->drain_s);
    listen_unlink(fe);
    fe->phase = PHASE_DRAIN;
    fe->drain_until = clock_now_s() + fe->cfg->drain_s;
}

static void on_signal(Frontend *fe) {
    struct signalfd_siginfo si;

    while (read(fe->sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) {
            stages_reap(fe);
        } else if (si.ssi_signo == SIGUSR2) {
            /* "give up the replacement": the loop handles signals and the
               takeover one at a time, so a candidate that gets it never
               takes over, and an engine that took over first ignores it */
            if (fe->candidate) {
                frontend_stop(fe, "told to give up the replacement");
            } else {
                log_msg(LOG_INFO, "SIGUSR2 ignored: this engine is live, "
                        "not a candidate");
            }
        } else {
            frontend_stop(fe, strsignal((int) si.ssi_signo));
        }
    }
}

/* Blocks the signals the loop takes through signalfd (the stage gets
 * them unblocked again before exec) and ignores SIGPIPE, so a client that
 * went away shows up as EPIPE on write. */
static int signals_open(Frontend *fe, Err *err) {
    sigset_t set;
    uint32_t ev = 0;

    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR2);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) {
        return err_set(err, "sigprocmask: %s", strerror(errno));
    }
    fe->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fe->sfd < 0) return err_set(err, "signalfd: %s", strerror(errno));
    frontend_ep_set(fe, fe->sfd, &ev, EPOLLIN, &fe->s_signal);
    return 0;
}


/* ---- The loop ----------------------------------------------------------- */

/* Milliseconds until the nearest deadline, -1 when there is none. */
static int next_timeout(const Frontend *fe) {
    double next = fmin(stages_deadline(fe), audio_in_deadline(fe));
    double t = clock_now_s();

    if (fe->listen_paused) next = fmin(next, fe->listen_resume);
    if (fe->phase == PHASE_DRAIN) next = fmin(next, fe->drain_until);
    if (fe->phase == PHASE_FINISH) next = fmin(next, fe->stop_kill_at);
    if (fe->phase == PHASE_FINISH && fe->n_conns > 0 && t < fe->clients_until)
    {
        next = fmin(next, fe->clients_until);
    }
    if (fe->rhead != NULL) {
        next = fmin(next, fe->rhead->t_accept + fe->cfg->read_timeout_s);
    }
    if (isinf(next)) return -1;
    return next <= t ? 0 : (int) ceil((next - t) * 1e3);
}

static void run_timers(Frontend *fe) {
    double t = clock_now_s();

    stages_timers(fe, t);
    audio_in_retry(fe);
    if (fe->listen_paused && t >= fe->listen_resume) listen_pause(fe, false);
    while (fe->rhead != NULL
           && t >= fe->rhead->t_accept + fe->cfg->read_timeout_s)
    {
        char why[128];

        snprintf(why, sizeof(why), "no complete request frame within %d s",
                 fe->cfg->read_timeout_s);
        log_msg(LOG_INFO, "connection closed: %s", why);
        conn_error(fe, fe->rhead, 408, NULL, "request_timeout", why);
    }
    if (fe->phase == PHASE_DRAIN) {
        if (t >= fe->drain_until) {
            finish_begin(fe);
        } else if (drained(fe)) {
            listen_backlog(fe);         // what is queued is served too
            if (drained(fe)) finish_begin(fe);
        }
    }
    if (fe->phase == PHASE_FINISH && stages_running(fe)
        && t >= fe->stop_kill_at)
    {
        for (int i = 0; i < STAGES_N; i++) {
            stages_kill(&fe->stages[i],
                        "did not exit after its channel closed");
        }
        fe->stop_kill_at = INFINITY;
    }
}

/* Done once every stage is reaped and every client has its last bytes, or
 * the deadline passed for the clients (a client that does not read its
 * error does not hold up the exit). */
static bool finished(const Frontend *fe) {
    return fe->phase == PHASE_FINISH && !stages_running(fe)
           && (fe->n_conns == 0 || clock_now_s() >= fe->clients_until);
}

static void dispatch(Frontend *fe, struct epoll_event *ev) {
    Source *s = ev->data.ptr;

    switch (s->kind) {
    case SRC_LISTEN:
        if (fe->lfd >= 0) listen_accept(fe);
        break;
    case SRC_SIGNAL:
        on_signal(fe);
        break;
    case SRC_STAGE:
        if (ev->events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
            stages_read(fe, s->stage);
        }
        if (ev->events & EPOLLOUT) stages_flush(fe, s->stage);
        break;
    case SRC_STAGE_ERR:
        /* at EOF sup_read_stderr closes err_fd, which also takes it out
           of the epoll set (no other descriptor refers to that pipe end) */
        sup_read_stderr(&s->stage->sp);
        break;
    case SRC_PARSED:
        conn_on_parsed(fe);
        break;
    case SRC_CONN:
        if (((Conn *) s)->fd >= 0) conn_on_event(fe, (Conn *) s, ev->events);
        break;
    }
}

static void loop(Frontend *fe) {
    struct epoll_event evs[MAX_EVENTS];

    while (!finished(fe)) {
        int n = epoll_wait(fe->ep, evs, MAX_EVENTS, next_timeout(fe));

        if (n < 0 && errno != EINTR) {
            log_msg(LOG_ERROR, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) dispatch(fe, &evs[i]);
        conn_free_dead(fe);
        run_timers(fe);
        conn_free_dead(fe);
    }
}



/* ---- The parse thread ---------------------------------------------------
 * Started after the signal mask is set, which it inherits: signals stay
 * with signalfd. */

static int parse_open(Frontend *fe, Err *err) {
    uint32_t ev = 0;

    if (workq_init(&fe->pq, PARSE_NICE, err) != 0) return -1;
    fe->pq_up = true;
    frontend_ep_set(fe, fe->pq.efd, &ev, EPOLLIN, &fe->s_parsed);
    return 0;
}


/* ---- Setup and teardown ------------------------------------------------- */

static void frontend_init(Frontend *fe, const ServeConfig *cfg) {
    memset(fe, 0, sizeof(*fe));
    fe->cfg = cfg;
    fe->ep = fe->lfd = fe->sfd = fe->lock_fd = -1;
    fe->s_listen.kind = SRC_LISTEN;
    fe->s_signal.kind = SRC_SIGNAL;
    fe->s_parsed.kind = SRC_PARSED;
    fe->next_id = 1;
    fe->created = (long long) time(NULL);
    metrics_init(&fe->metrics);
}

/* After the loop: the stages have been reaped unless the loop broke out
 * on an error, in which case they are killed and waited for here. */
static void frontend_free(Frontend *fe) {
    if (fe->pq_up) {
        workq_stop(&fe->pq);
        while (fe->conns != NULL) conn_close(fe, fe->conns);
        conn_on_parsed(fe);
        workq_free(&fe->pq);
    }
    while (fe->conns != NULL) conn_close(fe, fe->conns);
    conn_free_dead(fe);
    listen_close(fe);
    listen_unlink(fe);
    stages_free(fe);
    route_free(fe);
    transcripts_free(&fe->transcripts);
    pool_destroy(&fe->pool);
    if (fe->sfd >= 0) close(fe->sfd);
    if (fe->ep >= 0) close(fe->ep);
    if (fe->lock_fd >= 0) close(fe->lock_fd);   // last: the socket is gone
}

int frontend_run(const ServeConfig *cfg, int argc, char **argv, Err *err) {
    Frontend *fe = malloc(sizeof(*fe));
    int       rc = -1;

    if (fe == NULL) return err_set(err, "out of memory");
    frontend_init(fe, cfg);
    if (pool_create(&fe->pool, (uint32_t) cfg->pool_blocks,
                    (uint32_t) cfg->pool_block_kib << 10, err) != 0)
    {
        free(fe);
        return -1;
    }
    if (transcripts_init(&fe->transcripts, TRANSCRIPTS_MAX_ENTRIES,
                         TRANSCRIPTS_MAX_BYTES, err) != 0)
    {
        pool_destroy(&fe->pool);
        free(fe);
        return -1;
    }
    if (stages_init(fe, argc, argv, err) != 0) {
        transcripts_free(&fe->transcripts);
        pool_destroy(&fe->pool);
        free(fe);
        return -1;
    }
    fe->ep = epoll_create1(EPOLL_CLOEXEC);
    if (fe->ep < 0) {
        err_set(err, "epoll_create1: %s", strerror(errno));
    } else if (signals_open(fe, err) == 0 && parse_open(fe, err) == 0
               && listen_lock(fe, err) == 0 && listen_open(fe, err) == 0)
    {
        log_msg(LOG_INFO, "serving %s on %s", fe_model(fe)->model_id,
                fe->laddr.sun_path);
        for (int i = 0; i < STAGES_N; i++) stages_start(fe, &fe->stages[i]);
        loop(fe);
        rc = 0;
    }
    frontend_free(fe);
    free(fe);
    return rc;
}

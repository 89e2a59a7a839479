/* frontend.c -- the frontend process of `omni-engine serve`: the Unix
 * socket server, routing requests to the thinker stage and its events
 * back, supervising the stage, and answering health, models and metrics.
 *
 * One thread, one epoll loop, every descriptor non-blocking. Sources:
 *
 *   listener        accept; paused for a moment when descriptors run out
 *   signalfd        SIGCHLD (reap the stage), SIGTERM/SIGINT (shut down),
 *                   SIGUSR2 (a candidate gives up its replacement)
 *   stage channel   frames from the thinker: READY, STARTED, EVENT
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
 * or fails while ACTIVE is a cancel: CANCEL goes to the stage and the
 * connection is freed. Each connection's queued output is bounded
 * (CONN_MAX_PENDING): a client that stops reading is cancelled and dropped
 * rather than allowed to grow our memory.
 *
 * The stage: DOWN (no process; restart_at) -> LOADING (started) -> READY
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
 * and handled as any stage that died: its requests get 503 stage_failed
 * and it is restarted. The check costs no wakeup while the stage beats:
 * the next deadline is the last beat plus the threshold.
 *
 * A request whose prompt cannot fit the context by the stage's prompt
 * bound (stage_channel.h; READY announces it) is refused here, after the parse,
 * so the stage never spends a tokenization on it.
 *
 * Shutdown (SIGTERM/SIGINT): RUN -> DRAIN (the socket file is removed if
 * it is still ours, so nothing new can connect; connections already queued
 * in the listen backlog are accepted and served, and requests in flight
 * may finish, for cfg->drain_s) -> FINISH (listener closed; the rest get
 * 503 engine_shutdown, the stage channel is closed so the stage exits,
 * SIGKILL after STOP_KILL_S) -> return. A second signal skips the drain.
 *
 * Replacement (--replace, how nginx swaps engines without an outage): when
 * another engine holds --lock-file, this one starts beside it on private
 * names, <socket>.next and <lock-file>.next, and at its stage's first READY
 * renames both over the public ones and sends the old engine SIGTERM. From
 * the rename on, every connect() reaches us; the old engine sees that the
 * socket path no longer names the file it bound (device, inode and ctime
 * compared), leaves it alone, and drains as above.
 *
 * Freeing: a connection closed while one epoll batch is handled may have
 * another event later in the same batch, so closing marks it (fd -1) and
 * parks it on a list that is freed after the batch. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "frame.h"
#include "metrics.h"
#include "request.h"
#include "serve.h"
#include "stage_channel.h"
#include "supervisor.h"
#include "workq.h"

#define CONN_MAX_PENDING  (8u << 20)    // queued output per client
#define ID_BUCKETS        4096          // request id table (power of 2)
#define MAX_EVENTS        64
#define GONE_KILL_S       2.0           // channel closed, process alive
#define STOP_KILL_S       5.0           // shutdown: stage exit, flushes
#define LISTEN_PAUSE_S    0.1           // after EMFILE and friends
#define FAILS_TO_REPORT   3             // failed starts before health
                                        //   blames the stage
#define PARSE_INLINE_MAX  (16u << 10)   // larger REQUESTs: parse thread
#define PARSE_NICE        10            // its nice value, above ours

typedef enum {
    SRC_LISTEN,
    SRC_SIGNAL,
    SRC_STAGE,
    SRC_STAGE_ERR,
    SRC_PARSED,
    SRC_CONN,
} SrcKind;

/* What an epoll event's data.ptr points at: the first member of each
 * event source. */
typedef struct {
    SrcKind kind;
} Source;

typedef enum {
    CONN_READ,                  // waiting for the one frame
    CONN_PARSING,               // its REQUEST is on the parse thread
    CONN_ACTIVE,                // request at the stage
    CONN_CLOSING,               // last frame queued; close when flushed
} ConnState;

/* A REQUEST's parse (parse_request), wherever it ran. */
typedef struct {
    int          rc;            // request_parse's
    ReqError     e;             // when rc != 0
    OmniRequest  req;           // when rc == 0; freed by request_checked
    uint64_t     bytes;         // what the prompt bound counts of the text
} Parsed;

struct Conn;

/* One parse on the parse thread. json is the connection's reader payload,
 * which stays put while the job is out (conn_close leaves the reader to
 * on_parsed). */
typedef struct {
    WorkJob      w;             // first: the queue's view of the job
    struct Conn *c;             // borrowed
    const char  *json;          // (len,) view into c->rd.payload
    size_t       len;
    PromptBound  bound;         // a copy: the thread reads no Frontend
    Parsed       out;
} ParseJob;

typedef struct Conn {
    Source       src;           // SRC_CONN
    int          fd;            // -1 once closed (freed after the batch)
    ConnState    state;
    uint32_t     events;        // epoll mask registered now
    FrameReader  rd;            // OMNI_DIR_TO_ENGINE
    FrameWriter  wr;
    uint64_t     id;            // request id, 0 before submission
    double       t_arrive;      // REQUEST read (monotonic s), 0: none
    double       t_submit;      // SUBMIT queued to the stage
    double       t_first;       // first TEXT forwarded, 0: none yet
    double       t_accept;      // accepted (monotonic s)
    struct Conn *prev, *next;   // every open connection
    struct Conn *rprev, *rnext; // in READ, oldest first: one timeout for
                                //   all, so the head's deadline is next
    struct Conn *hnext;         // chain in the id table
    ParseJob    *job;           // its parse, while out (owned)
} Conn;

typedef enum {
    STAGE_DOWN,
    STAGE_LOADING,
    STAGE_READY,
    STAGE_GONE,
} StageState;

typedef enum {
    PHASE_RUN,
    PHASE_DRAIN,
    PHASE_FINISH,
} Phase;

typedef struct {
    const ServeConfig *cfg;     // borrowed
    int          ep;            // epoll, owned
    int          lfd;           // listener, -1 once closed
    struct sockaddr_un laddr;   // where lfd is bound: cfg->socket_path, or
                                //   <socket>.next until a takeover
    bool         l_linked;      // laddr's file is still to be removed
    dev_t        l_dev;         // that file, as bound: a path that names
    ino_t        l_ino;         //   another file (or the same inode
    struct timespec l_ctime;    //   number reused) is not ours to remove
    bool         candidate;     // --replace beside a live engine: take
                                //   its place at the first READY
    char         lock_next[PATH_MAX];   // <lock-file>.next, a candidate's
    int          sfd;           // signalfd, owned
    int          lock_fd;       // cfg->lock_file (lock_next while a
                                //   candidate), locked; -1: none
    Source       s_listen, s_signal, s_stage, s_stage_err, s_parsed;
    WorkQ        pq;            // the parse thread (large requests)
    bool         pq_up;         // it started
    bool         listen_paused;
    double       listen_resume;

    /* the thinker stage */
    StageProc    sp;
    StageState   st;
    bool         was_ready;     // this process said READY
    FrameReader  srd;           // OMNI_DIR_STAGE
    FrameWriter  swr;
    uint32_t     sevents;       // epoll mask on sp.fd
    double       ready_at;
    double       restart_at;
    double       gone_kill_at;  // INFINITY when not armed
    char         model_id[256]; // served name (READY's id wins)
    char         kernels[16];   // the stage's kernel set (READY's)
    int64_t      max_model_len;
    PromptBound  bound;         // READY's; max_piece 0 until then
    bool         silent;        // READY, but no heartbeat for
                                //   cfg->stage_unready_s
    bool         hang_killed;   // we killed this process for its silence
    char         kill_why[96];  //   and why, for its requests' errors
    double       watch_at;      // next heartbeat check, INFINITY: none
    long long    created;       // unix time the frontend started

    /* connections */
    Conn        *conns;         // list of open connections
    Conn        *rhead, *rtail; // connections in READ, by accept time
    Conn        *dead;          // closed in this batch, freed after it
    int64_t      n_conns;
    int64_t      n_active;      // in CONN_ACTIVE
    Conn        *ids[ID_BUCKETS];
    uint64_t     next_id;

    Metrics      metrics;
    Phase        phase;
    double       drain_until;
    double       stop_kill_at;  // the stage is killed then; INFINITY once
                                //   it was
    double       clients_until; // FINISH waits this long for clients to
                                //   take their last bytes
} Frontend;

/* Sets fd's epoll interest to events, adding fd when it is not in the set
 * yet; *cur is the mask registered now. EPOLLHUP and EPOLLERR are always
 * reported, whatever the mask. */
static void ep_set(Frontend *fe, int fd, uint32_t *cur, uint32_t events,
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


/* ---- Request id table ---------------------------------------------------
 * Chained buckets by id; ids are sequential, so the low bits spread them
 * evenly and a chain is about n_active / ID_BUCKETS long. */

static Conn **id_slot(Frontend *fe, uint64_t id) {
    return &fe->ids[id & (ID_BUCKETS - 1)];
}

static Conn *id_find(Frontend *fe, uint64_t id) {
    Conn *c = *id_slot(fe, id);

    while (c != NULL && c->id != id) c = c->hnext;
    return c;
}

static void id_del(Frontend *fe, Conn *c) {
    Conn **pp = id_slot(fe, c->id);

    while (*pp != NULL && *pp != c) pp = &(*pp)->hnext;
    if (*pp == c) *pp = c->hnext;
    c->hnext = NULL;
}


/* ---- Talking to the stage ----------------------------------------------- */

static void stage_flush(Frontend *fe);

/* Queues SUBMIT or CANCEL (payload: u64 id [+ the request JSON]). A stage
 * that is not up gets nothing: its requests are failed when it is reaped. */
static void stage_send(Frontend *fe, uint8_t type, uint64_t id,
                       const void *body, size_t len)
{
    uint8_t idb[8];

    if (fe->sp.fd < 0) return;
    omni_wr64(idb, id);
    if (frame_put2(&fe->swr, type, idb, 8, body, len) != 0) {
        log_msg(LOG_ERROR, "out of memory queueing a frame for the thinker");
        return;
    }
    stage_flush(fe);
}


/* ---- Connections -------------------------------------------------------- */

/* Takes c off the READ list (the deadline no longer applies). */
static void read_leave(Frontend *fe, Conn *c) {
    if (c->state != CONN_READ) return;
    if (c->rprev != NULL) c->rprev->rnext = c->rnext;
    else fe->rhead = c->rnext;
    if (c->rnext != NULL) c->rnext->rprev = c->rprev;
    else fe->rtail = c->rprev;
    c->rprev = c->rnext = NULL;
}

/* Frees a closed connection's reader and parks it for free_dead. */
static void conn_release(Frontend *fe, Conn *c) {
    frame_reader_free(&c->rd);
    c->next = fe->dead;
    fe->dead = c;
}

static void conn_close(Frontend *fe, Conn *c) {
    if (c->fd < 0) return;
    read_leave(fe, c);
    if (c->state == CONN_ACTIVE) {
        id_del(fe, c);
        fe->n_active--;
    }
    epoll_ctl(fe->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev != NULL) c->prev->next = c->next;
    else fe->conns = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
    fe->n_conns--;
    frame_writer_free(&c->wr);
    if (c->job != NULL) return;         // on_parsed releases it
    conn_release(fe, c);
}

/* The client went away (EOF, reset, write error): a request in flight is
 * cancelled at the stage. */
static void conn_gone(Frontend *fe, Conn *c) {
    if (c->state == CONN_ACTIVE) {
        stage_send(fe, OMNI_F_STAGE_CANCEL, c->id, NULL, 0);
        fe->metrics.cancelled++;
        log_msg(LOG_DEBUG, "request %" PRIu64 " cancelled by its client",
                c->id);
    }
    conn_close(fe, c);
}

/* Writes what the socket takes; closes a CLOSING connection once its
 * output is out, and keeps the epoll mask in step with what is pending. */
static void conn_flush(Frontend *fe, Conn *c) {
    uint32_t ev;

    if (frame_flush(&c->wr, c->fd) != 0) {
        conn_gone(fe, c);
        return;
    }
    if (c->state == CONN_CLOSING && frame_writer_pending(&c->wr) == 0) {
        conn_close(fe, c);
        return;
    }
    ev = c->state == CONN_CLOSING ? 0 : EPOLLIN;
    if (frame_writer_pending(&c->wr) > 0) ev |= EPOLLOUT;
    ep_set(fe, c->fd, &c->events, ev, c);
}

/* The exchange is over: leave the id table, flush, close. */
static void conn_end(Frontend *fe, Conn *c) {
    if (c->t_arrive > 0) {
        hist_observe(&fe->metrics.e2e, clock_now_s() - c->t_arrive, 1);
    }
    if (c->state == CONN_ACTIVE) {
        id_del(fe, c);
        fe->n_active--;
    }
    read_leave(fe, c);
    c->state = CONN_CLOSING;
    conn_flush(fe, c);
}

/* Sends an ERROR event built here and ends the exchange. param and code
 * may be NULL. */
static void conn_error(Frontend *fe, Conn *c, int status, const char *param,
                       const char *code, const char *msg)
{
    uint8_t   buf[OMNI_MAX_ERROR];
    OmniError e;
    size_t    len;

    omni_error_set(&e, status, status < 500 ? "invalid_request_error"
                                            : "server_error",
                   param, code, msg);
    len = omni_error_encode(buf, &e);
    metrics_error(&fe->metrics, status, code, e.code_len);
    if (frame_put(&c->wr, OMNI_F_ERROR, buf, len) != 0) {
        conn_gone(fe, c);
        return;
    }
    conn_end(fe, c);
}

static void conn_accept(Frontend *fe, int fd) {
    Conn *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        log_msg(LOG_ERROR, "out of memory accepting a connection");
        close(fd);
        return;
    }
    c->src.kind = SRC_CONN;
    c->fd = fd;
    c->state = CONN_READ;
    c->t_accept = clock_now_s();
    c->rprev = fe->rtail;
    if (fe->rtail != NULL) fe->rtail->rnext = c;
    else fe->rhead = c;
    fe->rtail = c;
    frame_reader_init(&c->rd, OMNI_DIR_TO_ENGINE);
    frame_writer_init(&c->wr);
    c->next = fe->conns;
    if (fe->conns != NULL) fe->conns->prev = c;
    fe->conns = c;
    fe->n_conns++;
    ep_set(fe, fd, &c->events, EPOLLIN, c);
}


/* ---- Stage liveness -------------------------------------------------------
 * Silence counts from the stage's last heartbeat, or from its READY when
 * it has not beaten since (sup_silence). */

static double stage_silence(const Frontend *fe, double now, double *in_step)
{
    return sup_silence(&fe->sp, fe->ready_at, now, in_step);
}

/* Whether the stage takes requests now: READY and not silent. Computed
 * from the page at the moment of asking, whatever the timers saw. */
static bool stage_live(const Frontend *fe) {
    return fe->st == STAGE_READY && !fe->hang_killed
           && stage_silence(fe, clock_now_s(), NULL)
              < fe->cfg->stage_unready_s;
}

/* What health says of a silent stage. */
static void silence_reason(const Frontend *fe, char *why, size_t cap) {
    double in_step, silence = stage_silence(fe, clock_now_s(), &in_step);
    char   step[64] = "", kill[96];

    if (in_step >= 0) {
        snprintf(step, sizeof(step), " (one step has run for %.1f s)",
                 in_step);
    }
    if (fe->hang_killed) {
        snprintf(kill, sizeof(kill), "; killed, restarting");
    } else if (fe->cfg->stage_kill_s > 0) {
        snprintf(kill, sizeof(kill), "; it is killed and restarted at %g s",
                 fe->cfg->stage_kill_s);
    } else {
        snprintf(kill, sizeof(kill), "; it is not killed "
                 "(--stage-kill-after 0)");
    }
    snprintf(why, cap, "the thinker stage (pid %d) has been silent for "
             "%.1f s%s%s", (int) fe->sp.pid, silence, step, kill);
}


/* ---- Control replies ---------------------------------------------------- */

/* 200 "ready", or 503 and why not, in the words health and refused
 * requests both use. */
static int health(const Frontend *fe, char *why, size_t cap) {
    const StageProc *sp = &fe->sp;

    if (fe->phase == PHASE_FINISH) {
        snprintf(why, cap, "the engine is shutting down");
        return 503;
    }
    if (stage_live(fe)) {
        snprintf(why, cap, "ready");
        return 200;
    }
    if (fe->st == STAGE_READY) {
        silence_reason(fe, why, cap);
        return 503;
    }
    if (sp->fails >= FAILS_TO_REPORT) {
        snprintf(why, cap, "the thinker stage failed %d times before it was "
                 "ready (last: %s%s%s); retrying", sp->fails, sp->exit_desc,
                 sp->last_line[0] ? ": " : "", sp->last_line);
    } else if (sp->exit_desc[0] != '\0') {
        snprintf(why, cap, "the thinker stage is restarting");
    } else {
        snprintf(why, cap, "the model is loading");
    }
    return 503;
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
        KEY(fe->model_id);
        KEY("created");
        yajl_gen_integer(g, fe->created);
        KEY("owned_by");
        KEY("ngx_omni");
        KEY("max_model_len");
        yajl_gen_integer(g, fe->max_model_len);
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
    int           rc = -1;

    g.model = fe->model_id;
    g.kernels = fe->kernels;
    g.stage_ready = stage_live(fe);
    g.heartbeat_age = fe->st == STAGE_READY
                      ? stage_silence(fe, clock_now_s(), NULL) : 0;
    g.connections = fe->n_conns;
    g.rss_frontend = metrics_rss(0);
    g.rss_thinker = fe->sp.pid > 0 ? metrics_rss(fe->sp.pid) : -1;
    tb_init(&tb);
    metrics_render(&tb, &fe->metrics, fe->sp.stats, &g);
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


/* ---- Requests ----------------------------------------------------------- */

/* What the frontend needs from a REQUEST, computed on the loop's thread or
 * on the parse thread: the parse, and the bytes the prompt bound counts
 * in the prompt, or in every message's content trimmed as some templates
 * trim it (the template's own text is not counted, so this stays below
 * the thinker's bound on the rendered text). */
static void parse_request(const char *json, size_t len, const PromptBound *b,
                          Parsed *p)
{
    const OmniRequest *r = &p->req;

    p->bytes = 0;
    p->rc = request_parse(&p->req, json, len, &p->e);
    if (p->rc != 0 || b->max_piece == 0) return;
    if (!r->chat) p->bytes = prompt_bound_bytes(b, r->prompt, r->prompt_len);
    /* system messages are not counted: a template may drop some (Gemma's
       drops those after the last user turn), and the bound must stay a
       lower bound; the thinker counts the rendered prompt */
    for (int i = 0; r->chat && i < r->n_msgs; i++) {
        const char *s = r->msgs[i].content;
        size_t      n;

        if (strcmp(r->msgs[i].role, "system") == 0) continue;
        n = strlen(s);

        while (n > 0 && prompt_bound_space(*s)) s++, n--;
        while (n > 0 && prompt_bound_space(s[n - 1])) n--;
        p->bytes += prompt_bound_bytes(b, s, n);
    }
}

static void parse_job_run(WorkJob *w) {
    ParseJob *j = (ParseJob *) w;

    parse_request(j->json, j->len, &j->bound, &j->out);
}

/* Refuses c with 400 context_length_exceeded, as the stage would have,
 * when the prompt bound says the prompt cannot fit. */
static bool prompt_too_long(Frontend *fe, Conn *c, const Parsed *p) {
    int64_t least = prompt_bound_tokens(&fe->bound, p->bytes);
    const char *param = p->req.chat ? "messages" : "prompt";
    char        msg[200];

    if (fe->bound.max_piece == 0 || least < fe->max_model_len) return false;
    snprintf(msg, sizeof(msg), PROMPT_TOO_LONG_FMT, fe->max_model_len,
             param, "at least ", least, param);
    conn_error(fe, c, 400, param, "context_length_exceeded", msg);
    return true;
}

/* The checks after the parse, then the stage gets the request. Frees what
 * p holds. */
static void request_checked(Frontend *fe, Conn *c, Parsed *p) {
    const char *json = (const char *) c->rd.payload;
    size_t      len = c->rd.hdr.len;
    char        why[1024];

    if (p->rc != 0) {
        conn_error(fe, c, p->e.status, p->e.param[0] ? p->e.param : NULL,
                   NULL, p->e.err.msg);
        return;
    }
    if (p->req.model != NULL && strcmp(p->req.model, fe->model_id) != 0) {
        snprintf(why, sizeof(why), "The model `%.200s` does not exist or "
                 "you do not have access to it.", p->req.model);
        request_free(&p->req);
        conn_error(fe, c, 404, "model", "model_not_found", why);
        return;
    }
    if (prompt_too_long(fe, c, p)) {
        request_free(&p->req);
        return;
    }
    request_free(&p->req);
    /* while draining, what reaches us was queued before the socket file
       went (or passed to our replacement): it is served like the rest */
    if (fe->phase == PHASE_FINISH) {    // the parse thread took a while
        conn_error(fe, c, 503, NULL, "engine_shutdown",
                   "the engine is shutting down");
        return;
    }
    if (!stage_live(fe)) {
        health(fe, why, sizeof(why));
        conn_error(fe, c, 503, NULL, "engine_not_ready", why);
        return;
    }
    c->id = fe->next_id++;
    c->state = CONN_ACTIVE;
    c->hnext = *id_slot(fe, c->id);
    *id_slot(fe, c->id) = c;
    fe->n_active++;
    c->t_submit = clock_now_s();
    stage_send(fe, OMNI_F_STAGE_SUBMIT, c->id, json, len);
}

/* Validates the REQUEST (so a client mistake is answered here, without a
 * round trip to the stage) and hands it to the stage. The stage parses it
 * again; parsing is microseconds next to one forward pass for the usual
 * request, and keeping the frontend free of model state is worth that.
 * A request over PARSE_INLINE_MAX bytes is parsed on the parse thread
 * (workq.h) instead: a megabyte of JSON takes milliseconds, during which
 * no stream would get its tokens. The connection waits in CONN_PARSING;
 * on_parsed takes it from there. */
static void request_start(Frontend *fe, Conn *c) {
    size_t    len = c->rd.hdr.len;
    ParseJob *j;
    Parsed    p;

    c->t_arrive = clock_now_s();
    read_leave(fe, c);
    if (fe->phase == PHASE_FINISH) {
        conn_error(fe, c, 503, NULL, "engine_shutdown",
                   "the engine is shutting down");
        return;
    }
    if (len > PARSE_INLINE_MAX && fe->pq_up
        && (j = calloc(1, sizeof(*j))) != NULL)
    {
        j->w.run = parse_job_run;
        j->c = c;
        j->json = (const char *) c->rd.payload;
        j->len = len;
        j->bound = fe->bound;
        c->job = j;
        c->state = CONN_PARSING;
        ep_set(fe, c->fd, &c->events, EPOLLIN, c);
        workq_push(&fe->pq, &j->w);
        return;
    }
    parse_request((const char *) c->rd.payload, len, &fe->bound, &p);
    request_checked(fe, c, &p);
}

/* Parses are done: each connection still waiting goes on; one closed
 * meanwhile is freed now (its reader held the JSON the parse read); one
 * answered meanwhile (shutdown, a protocol error) is left as it is. */
static void on_parsed(Frontend *fe) {
    WorkJob *w = workq_done(&fe->pq), *next;

    for (; w != NULL; w = next) {
        ParseJob *j = (ParseJob *) w;
        Conn     *c = j->c;

        next = w->next;
        c->job = NULL;
        if (c->fd >= 0 && c->state == CONN_PARSING && w->ran) {
            request_checked(fe, c, &j->out);
        } else {
            if (w->ran && j->out.rc == 0) request_free(&j->out.req);
            if (c->fd < 0) conn_release(fe, c);
        }
        free(j);
    }
}

static void conn_frame(Frontend *fe, Conn *c) {
    switch (c->rd.hdr.type) {
    case OMNI_F_REQUEST: request_start(fe, c); break;
    case OMNI_F_HEALTH:  reply_health(fe, c);  break;
    case OMNI_F_MODELS:  reply_models(fe, c);  break;
    case OMNI_F_METRICS: reply_metrics(fe, c); break;
    default:
        /* frame_feed checked the type for this direction */
        conn_error(fe, c, 400, NULL, NULL, "unexpected frame type");
    }
}

/* After its one frame a client only waits; anything it sends then is a
 * protocol error, and EOF is a cancel. */
static void conn_read_after(Frontend *fe, Conn *c) {
    uint8_t b[256];
    ssize_t n = read(c->fd, b, sizeof(b));

    if (n > 0) {
        if (c->state == CONN_ACTIVE) {
            stage_send(fe, OMNI_F_STAGE_CANCEL, c->id, NULL, 0);
        }
        conn_error(fe, c, 400, NULL, NULL,
                   "one frame per connection: unexpected data after it");
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        conn_gone(fe, c);
    }
}

static void conn_read(Frontend *fe, Conn *c) {
    FrameStatus st;
    bool        eof = false;

    if (c->state != CONN_READ) {
        conn_read_after(fe, c);
        return;
    }
    st = frame_read_fd(&c->rd, c->fd, &eof);
    switch (st) {
    case FRAME_READY:
        if (frame_reader_buffered(&c->rd) > 0) {
            conn_error(fe, c, 400, NULL, NULL,
                       "one frame per connection: unexpected data after it");
        } else {
            conn_frame(fe, c);
        }
        break;
    case FRAME_BAD:
        log_msg(LOG_INFO, "client sent an invalid frame: %s", c->rd.error);
        conn_error(fe, c, 400, NULL, NULL, c->rd.error);
        break;
    case FRAME_NOMEM:
        conn_error(fe, c, 503, NULL, "out_of_memory",
                   "out of memory reading the request");
        break;
    case FRAME_MORE:
        if (eof) conn_gone(fe, c);
        break;
    }
}

static void on_conn(Frontend *fe, Conn *c, uint32_t ev) {
    if (ev & EPOLLIN) conn_read(fe, c);
    if (c->fd >= 0 && (ev & EPOLLOUT)) conn_flush(fe, c);
    if (c->fd >= 0 && (ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN)) {
        conn_gone(fe, c);
    }
}


/* ---- Events from the stage ---------------------------------------------- */

static void stage_kill(Frontend *fe, const char *why) {
    if (fe->sp.pid <= 0) return;
    log_msg(LOG_ERROR, "thinker stage (pid %d) %s; killing it",
            (int) fe->sp.pid, why);
    kill(fe->sp.pid, SIGKILL);
}

/* Metrics for a request's last event. */
static void count_end(Frontend *fe, Conn *c, const OmniFrameHdr *h,
                      const uint8_t *body)
{
    OmniDone  d;
    OmniError e;
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

/* Checks the client frame inside an EVENT; a stage that sends a malformed
 * one is broken, and the client must not see it. */
static bool event_valid(const OmniFrameHdr *h, const uint8_t *body,
                        size_t len)
{
    OmniDone  d;
    OmniError e;

    if (omni_frame_check(h, OMNI_DIR_TO_CLIENT) != NULL || h->len != len) {
        return false;
    }
    switch (h->type) {
    case OMNI_F_TEXT:  return h->len > 0;
    case OMNI_F_DONE:  return omni_done_decode(&d, body) == 0;
    case OMNI_F_ERROR: return omni_error_decode(&e, body, len) == 0;
    default:           return false;
    }
}

static void on_event(Frontend *fe, const uint8_t *p, size_t len) {
    OmniFrameHdr h;
    Conn        *c;
    uint64_t     id;

    if (len < 8 + OMNI_FRAME_HDR) {
        stage_kill(fe, "sent a truncated EVENT");
        return;
    }
    id = omni_rd64(p);
    omni_hdr_decode(&h, p + 8);
    if (!event_valid(&h, p + 16, len - 16)) {
        stage_kill(fe, "sent an invalid event");
        return;
    }
    c = id_find(fe, id);
    if (c == NULL) return;              // cancelled; the CANCEL crossed it
    if (h.type == OMNI_F_TEXT && c->t_first == 0) {
        c->t_first = clock_now_s();
        hist_observe(&fe->metrics.ttft, c->t_first - c->t_arrive, 1);
    }
    if (frame_put(&c->wr, h.type, p + 16, h.len) != 0) {
        log_msg(LOG_ERROR, "out of memory queueing an event");
        conn_gone(fe, c);
        return;
    }
    if (h.type != OMNI_F_TEXT) {
        count_end(fe, c, &h, p + 16);
        conn_end(fe, c);
        return;
    }
    conn_flush(fe, c);
    if (c->fd >= 0 && frame_writer_pending(&c->wr) > CONN_MAX_PENDING) {
        log_msg(LOG_WARN, "request %" PRIu64 ": the client is more than %u "
                "MiB behind; cancelling it", id, CONN_MAX_PENDING >> 20);
        conn_gone(fe, c);
    }
}

static void takeover(Frontend *fe);

static void on_ready(Frontend *fe, const uint8_t *p, size_t len) {
    char      *s = malloc(len + 1);
    yajl_val   v, id, n, k;
    const char *idp[] = { "id", NULL };
    const char *np[] = { "max_model_len", NULL };
    const char *kp[] = { "kernels", NULL };
    const char *mp[] = { "max_piece_bytes", NULL };
    const char *wp[] = { "ws_free", NULL };
    yajl_val   mpv, wsv;

    if (s == NULL) return;
    memcpy(s, p, len);
    s[len] = '\0';
    v = yajl_tree_parse(s, NULL, 0);
    free(s);
    id = yajl_tree_get(v, idp, yajl_t_string);
    n = yajl_tree_get(v, np, yajl_t_number);
    k = yajl_tree_get(v, kp, yajl_t_string);
    if (k != NULL) {
        snprintf(fe->kernels, sizeof(fe->kernels), "%s", YAJL_GET_STRING(k));
    }
    if (id != NULL) {
        snprintf(fe->model_id, sizeof(fe->model_id), "%s",
                 YAJL_GET_STRING(id));
    }
    if (n != NULL && YAJL_IS_INTEGER(n)) {
        fe->max_model_len = YAJL_GET_INTEGER(n);
    }
    /* no bound (max_piece 0) unless READY states one in full */
    mpv = yajl_tree_get(v, mp, yajl_t_number);
    wsv = yajl_tree_get(v, wp, yajl_t_any);
    fe->bound.max_piece = 0;
    if (mpv != NULL && YAJL_IS_INTEGER(mpv) && YAJL_GET_INTEGER(mpv) >= 0
        && YAJL_GET_INTEGER(mpv) <= UINT32_MAX
        && (YAJL_IS_TRUE(wsv) || YAJL_IS_FALSE(wsv)))
    {
        fe->bound.max_piece = (uint32_t) YAJL_GET_INTEGER(mpv);
        fe->bound.ws_free = YAJL_IS_TRUE(wsv);
    }
    yajl_tree_free(v);
    fe->st = STAGE_READY;
    fe->was_ready = true;
    fe->ready_at = clock_now_s();
    fe->sp.fails = 0;
    fe->silent = false;
    fe->watch_at = fe->ready_at + fe->cfg->stage_unready_s;
    log_msg(LOG_INFO, "thinker stage (pid %d) ready: model %s, context %"
            PRId64 ", kernels %s, prompt bound %" PRIu32 " bytes a token%s",
            (int) fe->sp.pid, fe->model_id, fe->max_model_len, fe->kernels,
            fe->bound.max_piece, fe->bound.ws_free ? " (whitespace free)"
                                                   : "");
    if (fe->candidate && fe->phase == PHASE_RUN) takeover(fe);
}

static void on_started(Frontend *fe, const uint8_t *p, size_t len) {
    Conn *c = len == 8 ? id_find(fe, omni_rd64(p)) : NULL;

    if (c != NULL) {
        hist_observe(&fe->metrics.queue, clock_now_s() - c->t_submit, 1);
    }
}

static void stage_frame(Frontend *fe) {
    const uint8_t *p = fe->srd.payload;
    size_t         len = fe->srd.hdr.len;

    switch (fe->srd.hdr.type) {
    case OMNI_F_STAGE_READY:   on_ready(fe, p, len);   break;
    case OMNI_F_STAGE_STARTED: on_started(fe, p, len); break;
    case OMNI_F_STAGE_EVENT:   on_event(fe, p, len);   break;
    default:
        stage_kill(fe, "sent an unexpected frame type");
    }
}

/* The channel closed or failed: stop using it. The requests on it are
 * failed when the process is reaped; a process that stays is killed. */
static void stage_channel_closed(Frontend *fe) {
    if (fe->sp.fd < 0) return;
    epoll_ctl(fe->ep, EPOLL_CTL_DEL, fe->sp.fd, NULL);
    sup_close_channel(&fe->sp);
    fe->sevents = 0;
    if (fe->sp.pid > 0) {
        fe->st = STAGE_GONE;
        fe->gone_kill_at = clock_now_s() + GONE_KILL_S;
    }
}

/* Reads and handles every frame the channel holds now. */
static void stage_read(Frontend *fe) {
    FrameStatus st;
    bool        eof;

    while (fe->sp.fd >= 0) {
        eof = false;
        st = frame_read_fd(&fe->srd, fe->sp.fd, &eof);
        if (st == FRAME_READY) {
            stage_frame(fe);
            frame_reader_next(&fe->srd);
            continue;
        }
        if (st == FRAME_BAD || st == FRAME_NOMEM) {
            stage_kill(fe, st == FRAME_BAD ? fe->srd.error
                                           : "sent a frame too large to hold");
            stage_channel_closed(fe);
        } else if (eof) {
            stage_channel_closed(fe);
        }
        return;
    }
}

static void stage_flush(Frontend *fe) {
    if (fe->sp.fd < 0) return;
    if (frame_flush(&fe->swr, fe->sp.fd) != 0) {
        stage_channel_closed(fe);
        return;
    }
    ep_set(fe, fe->sp.fd, &fe->sevents,
           EPOLLIN | (frame_writer_pending(&fe->swr) > 0 ? EPOLLOUT : 0),
           &fe->s_stage);
}


/* ---- Stage supervision -------------------------------------------------- */

static void stage_start(Frontend *fe) {
    Err err;

    frame_reader_free(&fe->srd);
    frame_writer_free(&fe->swr);
    frame_reader_init(&fe->srd, OMNI_DIR_STAGE);
    frame_writer_init(&fe->swr);
    if (sup_start(&fe->sp, &err) != 0) {
        int delay = sup_backoff(&fe->sp, -1);

        snprintf(fe->sp.exit_desc, sizeof(fe->sp.exit_desc),
                 "could not start");
        log_msg(LOG_ERROR, "starting the thinker stage: %s; retrying in %d "
                "ms", err.msg, delay);
        fe->restart_at = clock_now_s() + delay / 1e3;
        return;
    }
    fe->st = STAGE_LOADING;
    fe->was_ready = false;
    fe->silent = false;
    fe->hang_killed = false;
    fe->gone_kill_at = INFINITY;
    fe->sevents = 0;
    ep_set(fe, fe->sp.fd, &fe->sevents, EPOLLIN, &fe->s_stage);
    {
        uint32_t ev = 0;

        ep_set(fe, fe->sp.err_fd, &ev, EPOLLIN, &fe->s_stage_err);
    }
    log_msg(LOG_INFO, "started the thinker stage (pid %d)", (int) fe->sp.pid);
}

/* The process has been reaped: fail what was in flight on it and, unless
 * shutting down, schedule the next start. Frames it wrote before dying
 * are handled first (a DONE may be among them). */
static void stage_died(Frontend *fe) {
    char    msg[224];
    int64_t failed = 0;
    double  t = clock_now_s();
    int     delay;

    stage_read(fe);
    stage_channel_closed(fe);
    sup_read_stderr(&fe->sp);
    snprintf(msg, sizeof(msg), "the thinker stage exited (%s%s%s); retry",
             fe->sp.exit_desc, fe->hang_killed ? ": " : "",
             fe->hang_killed ? fe->kill_why : "");
    for (Conn *c = fe->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->state == CONN_ACTIVE) {
            conn_error(fe, c, 503, NULL, "stage_failed", msg);
            failed++;
        }
    }
    fe->st = STAGE_DOWN;
    if (fe->phase != PHASE_RUN) {
        log_msg(LOG_INFO, "thinker stage exited (%s)", fe->sp.exit_desc);
        return;
    }
    delay = sup_backoff(&fe->sp, fe->was_ready ? t - fe->ready_at : -1);
    atomic_fetch_add_explicit(&fe->sp.stats->stage_restarts, 1,
                              memory_order_relaxed);
    fe->restart_at = t + delay / 1e3;
    log_msg(LOG_WARN, "thinker stage exited (%s)%s%s; %" PRId64 " requests "
            "failed; restarting in %d ms", fe->sp.exit_desc,
            fe->was_ready ? "" : " before it was ready: ",
            fe->was_ready ? "" : fe->sp.last_line, failed, delay);
}

/* The heartbeat check behind the timers: logs the stage going silent and
 * coming back, and kills it once silent for cfg->stage_kill_s (0: never).
 * Returns the time of the next check: the silence deadline while the
 * stage beats, a short poll while it is silent (to see it come back). */
static double stage_watch(Frontend *fe, double now) {
    const ServeConfig *cfg = fe->cfg;
    double             in_step, silence;
    char               why[96];

    if (fe->st != STAGE_READY || fe->hang_killed) return INFINITY;
    silence = stage_silence(fe, now, &in_step);
    if (silence < cfg->stage_unready_s) {
        if (fe->silent) {
            log_msg(LOG_INFO, "thinker stage (pid %d) is beating again; "
                    "ready", (int) fe->sp.pid);
        }
        fe->silent = false;
        return now + cfg->stage_unready_s - silence;
    }
    if (!fe->silent) {
        log_msg(LOG_WARN, "thinker stage (pid %d) silent for %.1f s%s; not "
                "ready", (int) fe->sp.pid, silence,
                in_step >= 0 ? " in one step" : "");
        fe->silent = true;
    }
    if (cfg->stage_kill_s > 0 && silence >= cfg->stage_kill_s) {
        snprintf(fe->kill_why, sizeof(fe->kill_why), "killed after %.1f s "
                 "without a heartbeat%s", silence,
                 in_step >= 0 ? ", in one step" : "");
        fe->hang_killed = true;
        atomic_fetch_add_explicit(&fe->sp.stats->stage_hang_kills, 1,
                                  memory_order_relaxed);
        snprintf(why, sizeof(why), "has been silent for %.1f s%s", silence,
                 in_step >= 0 ? " in one step" : "");
        stage_kill(fe, why);
        return INFINITY;
    }
    return now + STAGE_BEAT_MS / 1e3;
}

/* At EOF sup_read_stderr closes err_fd, which also takes it out of the
 * epoll set (no other descriptor refers to that pipe end). */
static void on_stage_err(Frontend *fe) {
    sup_read_stderr(&fe->sp);
}


/* ---- Listener ----------------------------------------------------------- */

/* A live engine answers connect(); a stale socket file refuses it and is
 * removed. A path that exists but is not a socket is left alone. */
static int listen_check(const char *path, Err *err) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    struct stat        sb;
    int                fd, rc;

    if (lstat(path, &sb) != 0) {
        return errno == ENOENT ? 0 : err_set(err, "%s: %s", path,
                                             strerror(errno));
    }
    if (!S_ISSOCK(sb.st_mode)) {
        return err_set(err, "%s exists and is not a socket", path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_set(err, "socket: %s", strerror(errno));
    memcpy(a.sun_path, path, strlen(path) + 1);
    rc = connect(fd, (struct sockaddr *) &a, sizeof(a));
    close(fd);
    if (rc == 0) {
        return err_set(err, "%s: another engine is serving on this socket",
                       path);
    }
    if (errno != ECONNREFUSED) return err_set(err, "%s: %s", path,
                                              strerror(errno));
    if (unlink(path) != 0) {
        return err_set(err, "%s: removing the stale socket: %s", path,
                       strerror(errno));
    }
    log_msg(LOG_INFO, "removed the stale socket %s", path);
    return 0;
}

/* Remembers which file the socket path names: ours, just after bind or
 * rename. */
static void listen_mark(Frontend *fe) {
    struct stat sb;

    fe->l_linked = lstat(fe->laddr.sun_path, &sb) == 0;
    if (!fe->l_linked) {
        log_msg(LOG_WARN, "%s: %s", fe->laddr.sun_path, strerror(errno));
        return;
    }
    fe->l_dev = sb.st_dev;
    fe->l_ino = sb.st_ino;
    fe->l_ctime = sb.st_ctim;
}

/* Whether the socket path still names the file we bound. After a
 * replacement took over it names that engine's; the ctime tells a reused
 * inode number apart (rename and bind both set it). */
static bool listen_owns_path(const Frontend *fe) {
    struct stat sb;

    return lstat(fe->laddr.sun_path, &sb) == 0 && sb.st_dev == fe->l_dev
           && sb.st_ino == fe->l_ino
           && sb.st_ctim.tv_sec == fe->l_ctime.tv_sec
           && sb.st_ctim.tv_nsec == fe->l_ctime.tv_nsec;
}

/* Binds cfg->socket_path, or <socket>.next for a candidate. The socket file
 * is created under a umask of at least 0117, so its mode is at most 0660:
 * whoever may connect is the engine's user or group, whatever umask we
 * were started with. There is a window between the check and bind in
 * which a second engine could start; bind then fails for one of them
 * (EADDRINUSE), which is the right outcome. */
static int listen_open(Frontend *fe, Err *err) {
    const char *path = fe->cfg->socket_path;
    const char *sfx = fe->candidate ? ".next" : "";
    size_t      cap = sizeof(fe->laddr.sun_path);
    uint32_t    ev = 0;
    mode_t      mask;
    int         rc;

    fe->laddr.sun_family = AF_UNIX;
    if (strlen(path) + strlen(sfx) >= cap) {
        return err_set(err, "%s%s: socket path too long (at most %zu bytes)",
                       path, sfx, cap - 1);
    }
    memcpy(fe->laddr.sun_path, path, strlen(path));
    memcpy(fe->laddr.sun_path + strlen(path), sfx, strlen(sfx) + 1);
    if (listen_check(fe->laddr.sun_path, err) != 0) return -1;
    fe->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fe->lfd < 0) return err_set(err, "socket: %s", strerror(errno));
    mask = umask(0);
    umask(mask | 0117);
    rc = bind(fe->lfd, (struct sockaddr *) &fe->laddr, sizeof(fe->laddr));
    umask(mask);
    if (rc != 0 || listen(fe->lfd, SOMAXCONN) != 0) {
        err_set(err, "%s: %s", fe->laddr.sun_path, strerror(errno));
        close(fe->lfd);
        fe->lfd = -1;
        return -1;
    }
    listen_mark(fe);
    ep_set(fe, fe->lfd, &ev, EPOLLIN, &fe->s_listen);
    return 0;
}

/* Stops accepting; what is still queued is reset. The file stays. */
static void listen_close(Frontend *fe) {
    if (fe->lfd < 0) return;
    close(fe->lfd);
    fe->lfd = -1;
    fe->listen_paused = false;
}

/* Removes the socket file, once, if the path still names it: after a
 * takeover it names the engine that replaced us, and removing it would cut
 * that engine off from nginx. (A replacement renames over the path before
 * it signals us, so the check and unlink cannot straddle that rename
 * unless something else stops us at the same moment.) */
static void listen_unlink(Frontend *fe) {
    if (!fe->l_linked) return;
    fe->l_linked = false;
    if (!listen_owns_path(fe)) {
        log_msg(LOG_INFO, "%s is another engine's socket now; left in place",
                fe->laddr.sun_path);
        return;
    }
    if (unlink(fe->laddr.sun_path) != 0) {
        log_msg(LOG_WARN, "removing %s: %s", fe->laddr.sun_path,
                strerror(errno));
    }
}

/* Out of descriptors: stop accepting for a moment instead of spinning on
 * a listener that stays readable. */
static void listen_pause(Frontend *fe, bool pause) {
    struct epoll_event ev = { .events = pause ? 0 : EPOLLIN,
                              .data.ptr = &fe->s_listen };

    if (fe->lfd < 0) return;
    epoll_ctl(fe->ep, EPOLL_CTL_MOD, fe->lfd, &ev);
    fe->listen_paused = pause;
    fe->listen_resume = clock_now_s() + LISTEN_PAUSE_S;
}

static void on_listen(Frontend *fe) {
    for (;;) {
        int fd = accept4(fe->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd >= 0) {
            conn_accept(fe, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
            || errno == ENOMEM)
        {
            log_msg(LOG_WARN, "accept: %s; pausing for %g s", strerror(errno),
                    LISTEN_PAUSE_S);
            listen_pause(fe, true);
        }
        return;
    }
}

/* Accepts what is queued, then reads what every connection still waiting
 * for its frame has sent. While draining: nginx writes its request right
 * after connect(), so a request queued in the backlog or just accepted is
 * answered (served while draining, 503 engine_shutdown after) instead of
 * being reset when the drain ends with nothing in flight. */
static void listen_backlog(Frontend *fe) {
    while (fe->lfd >= 0) {
        int fd = accept4(fe->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break;
        }
        conn_accept(fe, fd);
    }
    for (Conn *c = fe->rhead, *next; c != NULL; c = next) {
        next = c->rnext;                // conn_read takes c off the list
        conn_read(fe, c);
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
    stage_channel_closed(fe);           // the stage exits on EOF
    fe->gone_kill_at = INFINITY;        // stop_kill_at governs now
}

/* The listener stays open while draining: with the socket file gone (or
 * passed on to our replacement) nothing new can connect, and what was
 * already queued is served (listen_backlog). */
static void stop_begin(Frontend *fe, const char *why) {
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
            if (sup_reap(&fe->sp)) stage_died(fe);
        } else if (si.ssi_signo == SIGUSR2) {
            /* "give up the replacement": the loop handles signals and the
               takeover one at a time, so a candidate that gets it never
               takes over, and an engine that took over first ignores it */
            if (fe->candidate) {
                stop_begin(fe, "told to give up the replacement");
            } else {
                log_msg(LOG_INFO, "SIGUSR2 ignored: this engine is live, "
                        "not a candidate");
            }
        } else {
            stop_begin(fe, strsignal((int) si.ssi_signo));
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
    ep_set(fe, fe->sfd, &ev, EPOLLIN, &fe->s_signal);
    return 0;
}


/* ---- The loop ----------------------------------------------------------- */

/* Milliseconds until the nearest deadline, -1 when there is none. */
static int next_timeout(const Frontend *fe) {
    double next = INFINITY, t = clock_now_s();

    if (fe->phase == PHASE_RUN && fe->st == STAGE_DOWN) next = fe->restart_at;
    if (fe->st == STAGE_GONE) next = fmin(next, fe->gone_kill_at);
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
    next = fmin(next, fe->watch_at);
    if (isinf(next)) return -1;
    return next <= t ? 0 : (int) ceil((next - t) * 1e3);
}

static void run_timers(Frontend *fe) {
    double t = clock_now_s();

    if (fe->phase == PHASE_RUN && fe->st == STAGE_DOWN && t >= fe->restart_at)
    {
        stage_start(fe);
    }
    if (t >= fe->watch_at || fe->st != STAGE_READY) {
        fe->watch_at = stage_watch(fe, t);
    }
    if (fe->st == STAGE_GONE && t >= fe->gone_kill_at) {
        stage_kill(fe, "closed its channel but did not exit");
        fe->gone_kill_at = INFINITY;
    }
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
    if (fe->phase == PHASE_FINISH && fe->sp.pid > 0 && t >= fe->stop_kill_at)
    {
        stage_kill(fe, "did not exit after its channel closed");
        fe->stop_kill_at = INFINITY;
    }
}

/* Done once the stage is reaped and every client has its last bytes, or
 * the deadline passed for the clients (a client that does not read its
 * error does not hold up the exit). */
static bool finished(const Frontend *fe) {
    return fe->phase == PHASE_FINISH && fe->sp.pid == 0
           && (fe->n_conns == 0 || clock_now_s() >= fe->clients_until);
}

static void dispatch(Frontend *fe, struct epoll_event *ev) {
    Source *s = ev->data.ptr;

    switch (s->kind) {
    case SRC_LISTEN:
        if (fe->lfd >= 0) on_listen(fe);
        break;
    case SRC_SIGNAL:
        on_signal(fe);
        break;
    case SRC_STAGE:
        if (ev->events & (EPOLLIN | EPOLLHUP | EPOLLERR)) stage_read(fe);
        if (ev->events & EPOLLOUT) stage_flush(fe);
        break;
    case SRC_STAGE_ERR:
        on_stage_err(fe);
        break;
    case SRC_PARSED:
        on_parsed(fe);
        break;
    case SRC_CONN:
        if (((Conn *) s)->fd >= 0) on_conn(fe, (Conn *) s, ev->events);
        break;
    }
}

static void free_dead(Frontend *fe) {
    while (fe->dead != NULL) {
        Conn *c = fe->dead;

        fe->dead = c->next;
        free(c);
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
        free_dead(fe);
        run_timers(fe);
        free_dead(fe);
    }
}


/* ---- The parse thread ---------------------------------------------------
 * Started after the signal mask is set, which it inherits: signals stay
 * with signalfd. */

static int parse_open(Frontend *fe, Err *err) {
    uint32_t ev = 0;

    if (workq_init(&fe->pq, PARSE_NICE, err) != 0) return -1;
    fe->pq_up = true;
    ep_set(fe, fe->pq.efd, &ev, EPOLLIN, &fe->s_parsed);
    return 0;
}


/* ---- The lock file ------------------------------------------------------ */

/* One engine per lock file: an fcntl write lock on cfg->lock_file, taken
 * before the socket is touched and held until the process ends, when the
 * kernel drops it however we die. This is how nginx's omni_engine
 * directive supervises us: F_GETLK tells it in one call whether an engine
 * lives and its pid, where a pid file could name a dead or reused pid.
 * The descriptor is CLOEXEC so the stage never inherits it, and nothing
 * else in this process may open the file: closing any descriptor of it
 * would drop the lock (POSIX record-lock semantics). The pid written into
 * the file is for people; programs ask F_GETLK.
 *
 * With --replace, a held lock is not the end: the candidate locks
 * <lock-file>.next instead (one candidate at a time) and, at takeover,
 * renames it over the lock file. The lock belongs to the inode, so from
 * that instant F_GETLK on the path names the new engine, and the old one
 * keeps its lock on a file no path reaches until it exits. */

/* The pid holding a lock on path, 0 if none. Never used on a file this
 * process locks (see above). */
static pid_t lock_holder(const char *path) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    int          fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) return 0;
    if (fcntl(fd, F_GETLK, &fl) != 0) fl.l_type = F_UNLCK;
    close(fd);
    return fl.l_type == F_UNLCK ? 0 : fl.l_pid;
}

/* Locks path (created 0600) into *fd. Returns 0, -1 with err set, or 1
 * when another process holds it (err then says who). */
static int lock_try(const char *path, int *fd, Err *err) {
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    pid_t        pid;
    int          e;

    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0) return err_set(err, "%s: %s", path, strerror(errno));
    if (fcntl(*fd, F_SETLK, &fl) == 0) {
        if (ftruncate(*fd, 0) == 0) dprintf(*fd, "%d\n", (int) getpid());
        return 0;
    }
    e = errno;
    close(*fd);
    *fd = -1;
    if (e != EAGAIN && e != EACCES) {
        return err_set(err, "%s: locking: %s", path, strerror(e));
    }
    pid = lock_holder(path);
    if (pid > 0) err_set(err, "another engine (pid %d) holds %s", (int) pid,
                         path);
    else err_set(err, "another engine held %s a moment ago", path);
    return 1;
}

static int lock_take(Frontend *fe, Err *err) {
    const char *path = fe->cfg->lock_file;
    int         rc;

    if (path == NULL) return 0;
    rc = lock_try(path, &fe->lock_fd, err);
    if (rc <= 0 || !fe->cfg->replace) return rc == 0 ? 0 : -1;
    if ((size_t) snprintf(fe->lock_next, sizeof(fe->lock_next), "%s.next",
                          path) >= sizeof(fe->lock_next))
    {
        return err_set(err, "%s: path too long", path);
    }
    log_msg(LOG_INFO, "%s: starting beside it, in its place once ready",
            err->msg);
    if (lock_try(fe->lock_next, &fe->lock_fd, err) != 0) {
        return err_prefix(err, "another replacement is starting");
    }
    fe->candidate = true;
    return 0;
}


/* ---- Replacement -------------------------------------------------------- */

/* A candidate's stage is ready: take the live engine's place. The socket
 * first: rename(2) is atomic, so every connect() from now on reaches us
 * and none finds the path missing, while what is queued at the old engine
 * stays there and is served by it. Then the lock, so that F_GETLK on
 * --lock-file names us (and a second engine is refused by us). Then the
 * old engine, found by its lock before the renames, is told to drain.
 * If the socket cannot be renamed the old engine keeps serving and we
 * shut down: we can serve no one. */
static void takeover(Frontend *fe) {
    const ServeConfig *cfg = fe->cfg;
    pid_t              old = lock_holder(cfg->lock_file);
    char               from[sizeof(fe->laddr.sun_path)];

    memcpy(from, fe->laddr.sun_path, sizeof(from));
    if (rename(from, cfg->socket_path) != 0) {
        log_msg(LOG_ERROR, "taking over %s: renaming %s: %s",
                cfg->socket_path, from, strerror(errno));
        stop_begin(fe, "could not take over the socket");
        return;
    }
    snprintf(fe->laddr.sun_path, sizeof(fe->laddr.sun_path), "%s",
             cfg->socket_path);
    listen_mark(fe);                    // the rename set a new ctime
    if (rename(fe->lock_next, cfg->lock_file) != 0) {
        log_msg(LOG_ERROR, "taking over %s: renaming %s: %s", cfg->lock_file,
                fe->lock_next, strerror(errno));
    }
    fe->candidate = false;
    if (old <= 0) {
        log_msg(LOG_INFO, "serving on %s (the engine before is gone)",
                cfg->socket_path);
        return;
    }
    log_msg(LOG_INFO, "serving on %s in place of pid %d, which drains and "
            "exits", cfg->socket_path, (int) old);
    if (kill(old, SIGTERM) != 0) {
        log_msg(LOG_WARN, "kill(%d, SIGTERM): %s", (int) old,
                strerror(errno));
    }
}


/* ---- Setup and teardown ------------------------------------------------- */

/* The name requests must use: the configured one (main.c fills it in from
 * the file name when not given); the stage's READY confirms it. */
static void frontend_init(Frontend *fe, const ServeConfig *cfg) {
    memset(fe, 0, sizeof(*fe));
    fe->cfg = cfg;
    fe->ep = fe->lfd = fe->sfd = fe->lock_fd = -1;
    fe->s_listen.kind = SRC_LISTEN;
    fe->s_signal.kind = SRC_SIGNAL;
    fe->s_stage.kind = SRC_STAGE;
    fe->s_stage_err.kind = SRC_STAGE_ERR;
    fe->s_parsed.kind = SRC_PARSED;
    fe->st = STAGE_DOWN;
    fe->gone_kill_at = INFINITY;
    fe->watch_at = INFINITY;
    fe->next_id = 1;
    fe->created = (long long) time(NULL);
    fe->max_model_len = cfg->ctx;
    serve_model_name(cfg, fe->model_id, sizeof(fe->model_id));
    frame_reader_init(&fe->srd, OMNI_DIR_STAGE);
    frame_writer_init(&fe->swr);
    metrics_init(&fe->metrics);
}

/* After the loop: the stage has been reaped unless the loop broke out on
 * an error, in which case it is killed and waited for here. */
static void frontend_free(Frontend *fe) {
    if (fe->pq_up) {
        workq_stop(&fe->pq);
        while (fe->conns != NULL) conn_close(fe, fe->conns);
        on_parsed(fe);
        workq_free(&fe->pq);
    }
    while (fe->conns != NULL) conn_close(fe, fe->conns);
    free_dead(fe);
    listen_close(fe);
    listen_unlink(fe);
    if (fe->sp.pid > 0) {
        kill(fe->sp.pid, SIGKILL);
        while (!sup_reap(&fe->sp)) usleep(10000);
    }
    sup_free(&fe->sp);
    frame_reader_free(&fe->srd);
    frame_writer_free(&fe->swr);
    if (fe->sfd >= 0) close(fe->sfd);
    if (fe->ep >= 0) close(fe->ep);
    if (fe->lock_fd >= 0) close(fe->lock_fd);   // last: the socket is gone
}

int frontend_run(const ServeConfig *cfg, int argc, char **argv, Err *err) {
    Frontend *fe = malloc(sizeof(*fe));
    int       rc = -1;

    if (fe == NULL) return err_set(err, "out of memory");
    frontend_init(fe, cfg);
    if (sup_init(&fe->sp, "thinker", argc, argv, err) != 0) {
        free(fe);
        return -1;
    }
    fe->ep = epoll_create1(EPOLL_CLOEXEC);
    if (fe->ep < 0) {
        err_set(err, "epoll_create1: %s", strerror(errno));
    } else if (signals_open(fe, err) == 0 && parse_open(fe, err) == 0
               && lock_take(fe, err) == 0 && listen_open(fe, err) == 0)
    {
        log_msg(LOG_INFO, "serving %s on %s", fe->model_id,
                fe->laddr.sun_path);
        stage_start(fe);
        loop(fe);
        rc = 0;
    }
    frontend_free(fe);
    free(fe);
    return rc;
}

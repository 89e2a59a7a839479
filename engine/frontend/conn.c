/* conn.c -- the frontend's client connections: accepting, reading the one
 * frame, writing and closing, the request id table, and a REQUEST's way
 * to its stage (the parse, here or on the parse thread, the checks a
 * client mistake fails, the submission) with the errors sent to clients.
 *
 * Separate from the loop (frontend.c) and the stages (stages.c): this is
 * everything that happens to one connection, and the state machine it
 * follows (READ -> PARSING -> ACTIVE -> CLOSING, in frontend.c's opening
 * comment) is all here. A closed connection is parked on fe->dead and
 * freed after the epoll batch (conn_free_dead). */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "frontend_impl.h"

#define PARSE_INLINE_MAX  (16u << 10)   // larger REQUESTs: parse thread


/* ---- Request id table ---------------------------------------------------
 * Chained buckets by id; ids are sequential, so the low bits spread them
 * evenly and a chain is about n_active / ID_BUCKETS long. */

static Conn **id_slot(Frontend *fe, uint64_t id) {
    return &fe->ids[id & (ID_BUCKETS - 1)];
}

Conn *conn_find(Frontend *fe, uint64_t id) {
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

/* Frees a closed connection's reader and parks it for conn_free_dead. */
static void conn_release(Frontend *fe, Conn *c) {
    frame_reader_free(&c->rd);
    tb_free(&c->said);
    c->next = fe->dead;
    fe->dead = c;
}

void conn_close(Frontend *fe, Conn *c) {
    if (c->fd < 0) return;
    read_leave(fe, c);
    if (c->state == CONN_ACTIVE) {
        id_del(fe, c);
        fe->n_active--;
    }
    audio_in_free(fe, c);
    epoll_ctl(fe->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev != NULL) c->prev->next = c->next;
    else fe->conns = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
    fe->n_conns--;
    frame_writer_free(&c->wr);
    if (c->job != NULL) return;         // conn_on_parsed releases it
    conn_release(fe, c);
}

/* The client went away (EOF, reset, write error): a request in flight is
 * cancelled at every stage of its route still working on it. */
void conn_gone(Frontend *fe, Conn *c) {
    if (c->state == CONN_ACTIVE) {
        route_cancel(fe, c, 0);
        fe->metrics.cancelled++;
        log_msg(LOG_DEBUG, "request %" PRIu64 " cancelled by its client",
                c->id);
    }
    conn_close(fe, c);
}

/* Writes what the socket takes; closes a CLOSING connection once its
 * output is out, and keeps the epoll mask in step with what is pending. */
void conn_flush(Frontend *fe, Conn *c) {
    uint32_t ev;

    if (frame_flush(&c->wr, c->fd) != 0) {
        conn_gone(fe, c);
        return;
    }
    if (c->state == CONN_CLOSING && frame_writer_pending(&c->wr) == 0) {
        conn_close(fe, c);
        return;
    }
    route_flow(fe, c);
    ev = c->state == CONN_CLOSING || c->audio_stalled ? 0 : EPOLLIN;
    if (frame_writer_pending(&c->wr) > 0) ev |= EPOLLOUT;
    frontend_ep_set(fe, c->fd, &c->events, ev, c);
}

/* The exchange is over: leave the id table, flush, close. */
void conn_end(Frontend *fe, Conn *c) {
    if (c->t_arrive > 0) {
        hist_observe(&fe->metrics.e2e, clock_now_s() - c->t_arrive, 1);
    }
    if (c->state == CONN_ACTIVE) {
        id_del(fe, c);
        fe->n_active--;
    }
    audio_in_free(fe, c);
    read_leave(fe, c);
    c->state = CONN_CLOSING;
    conn_flush(fe, c);
}

/* Sends an ERROR event built here and ends the exchange. param and code
 * may be NULL. */
void conn_error(Frontend *fe, Conn *c, int status, const char *param,
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

void conn_accept(Frontend *fe, int fd) {
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
    tb_init(&c->said);
    c->next = fe->conns;
    if (fe->conns != NULL) fe->conns->prev = c;
    fe->conns = c;
    fe->n_conns++;
    frontend_ep_set(fe, fd, &c->events, EPOLLIN, c);
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
    const ThinkerReady *m = fe_model(fe);
    int64_t             least = prompt_bound_tokens(&m->bound, p->bytes);
    const char         *param = p->req.chat ? "messages" : "prompt";
    char                msg[200];

    if (m->bound.max_piece == 0 || least < m->max_model_len) return false;
    snprintf(msg, sizeof(msg), PROMPT_TOO_LONG_FMT, m->max_model_len,
             param, "at least ", least, param);
    conn_error(fe, c, 400, param, "context_length_exceeded", msg);
    return true;
}

/* Speech out or audio in without the talker, voicebox and listener
 * stages in this build (OMNI_HAVE_SPEECH) is refused by name rather than
 * sent to the thinker. */
static bool speech_refused(Frontend *fe, Conn *c, bool routed,
                           const OmniRequest *r)
{
    if (routed) return false;
    if (r->n_audio_in > 0) {
        conn_error(fe, c, 501, r->audio_in[0].param[0] != '\0'
                                   ? r->audio_in[0].param : NULL,
                   "audio_input_unavailable", "audio input is not "
                   "available: this engine was built without the listener "
                   "stage");
        return true;
    }
    conn_error(fe, c, 501, "audio", "speech_unavailable", "speech output "
               "is not available: this engine was built without the talker "
               "and voicebox stages");
    return true;
}

/* The request JSON the stages get: the client's, or with the transcripts
 * of the spoken answers its messages refer to attached (transcripts.h),
 * then in *owned (malloc'd, the caller frees it). Returns false when it
 * refused c: an unknown or expired audio id (400), out of memory (503). */
static bool with_transcripts(Frontend *fe, Conn *c, const OmniRequest *r,
                             const char **json, size_t *len, char **owned)
{
    double t = clock_now_s();
    int    missing = -1;
    long   n;
    char   param[64], why[128];

    *owned = NULL;
    n = transcripts_attach(&fe->transcripts, r, *json, *len, t, NULL, 0,
                           &missing);
    if (n == 0) return true;
    if (n > 0 && (*owned = malloc((size_t) n)) != NULL) {
        transcripts_attach(&fe->transcripts, r, *json, *len, t, *owned,
                           (size_t) n, &missing);
        *json = *owned;
        *len = (size_t) n;
        return true;
    }
    if (n > 0) {
        conn_error(fe, c, 503, NULL, "out_of_memory", "out of memory "
                   "attaching the transcripts of earlier spoken answers");
    } else if (missing < 0) {
        conn_error(fe, c, 500, NULL, NULL, "the request JSON has no "
                   "closing brace after its parse (a bug)");
    } else {
        snprintf(param, sizeof(param), "messages[%d].audio.id", missing);
        snprintf(why, sizeof(why), "Audio with id '%.64s' not found.",
                 r->audio_ids[missing]);
        conn_error(fe, c, 400, param, NULL, why);
    }
    return false;
}

/* After the REQUEST is submitted: its audio follows in AUDIO_IN frames
 * (audio_in.c), or nothing may follow. */
static void request_follow(Frontend *fe, Conn *c) {
    if (c->audio_left > 0) {
        frame_reader_next(&c->rd);
        audio_in_read(fe, c);
    } else if (frame_reader_buffered(&c->rd) > 0) {
        route_cancel(fe, c, 0);
        conn_error(fe, c, 400, NULL, NULL,
                   "one frame per connection: unexpected data after it");
    }
}

static void request_checked(Frontend *fe, Conn *c, Parsed *p) {
    const char *json = (const char *) c->rd.payload;
    size_t      len = c->rd.hdr.len;
    char        why[1024], *owned = NULL;
    Route       rt;
    bool        routed;

    if (p->rc != 0) {
        conn_error(fe, c, p->e.status, p->e.param[0] ? p->e.param : NULL,
                   NULL, p->e.err.msg);
        return;
    }
    if (p->req.model != NULL
        && strcmp(p->req.model, fe_model(fe)->model_id) != 0
        && !(p->req.input != NULL && speech_model(p->req.model)))
    {
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
    routed = route_build(fe, &p->req, &rt);
    if (speech_refused(fe, c, routed, &p->req)
        || !with_transcripts(fe, c, &p->req, &json, &len, &owned))
    {
        request_free(&p->req);
        return;
    }
    if (p->req.speech.on && p->req.speech.id != NULL) {
        snprintf(c->keep_id, sizeof(c->keep_id), "%s", p->req.speech.id);
    }
    if (audio_in_start(fe, c, &p->req, json, len) != 0) {
        request_free(&p->req);
        free(owned);
        conn_error(fe, c, 503, NULL, "out_of_memory", "out of memory "
                   "setting up the audio input");
        return;
    }
    request_free(&p->req);
    /* while draining, what reaches us was queued before the socket file
       went (or passed to our replacement): it is served like the rest */
    if (fe->phase == PHASE_FINISH) {    // the parse thread took a while
        free(owned);
        conn_error(fe, c, 503, NULL, "engine_shutdown",
                   "the engine is shutting down");
        return;
    }
    if (!route_live(fe, &rt, why, sizeof(why))) {
        free(owned);
        conn_error(fe, c, 503, NULL, "engine_not_ready", why);
        return;
    }
    c->id = fe->next_id++;
    c->route = rt;
    c->state = CONN_ACTIVE;
    c->hnext = *id_slot(fe, c->id);
    *id_slot(fe, c->id) = c;
    fe->n_active++;
    c->t_submit = clock_now_s();
    route_submit(fe, c, json, len);
    free(owned);
    request_follow(fe, c);
}

/* Validates the REQUEST (so a client mistake is answered here, without a
 * round trip to the stage) and hands it to the stage. The stage parses it
 * again; parsing is microseconds next to one forward pass for the usual
 * request, and keeping the frontend free of model state is worth that.
 * A request over PARSE_INLINE_MAX bytes is parsed on the parse thread
 * (workq.h) instead: a megabyte of JSON takes milliseconds, during which
 * no stream would get its tokens. The connection waits in CONN_PARSING;
 * conn_on_parsed takes it from there. */
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
        j->bound = fe_model(fe)->bound;
        c->job = j;
        c->state = CONN_PARSING;
        /* not reading meanwhile: AUDIO_IN frames may follow the REQUEST,
           and the reader holds the JSON the parse reads */
        frontend_ep_set(fe, c->fd, &c->events, 0, c);
        workq_push(&fe->pq, &j->w);
        return;
    }
    parse_request((const char *) c->rd.payload, len, &fe_model(fe)->bound,
                  &p);
    request_checked(fe, c, &p);
}

/* Parses are done: each connection still waiting goes on; one closed
 * meanwhile is freed now (its reader held the JSON the parse read); one
 * answered meanwhile (shutdown, a protocol error) is left as it is. */
void conn_on_parsed(Frontend *fe) {
    WorkJob *w = workq_done(&fe->pq), *next;

    for (; w != NULL; w = next) {
        ParseJob *j = (ParseJob *) w;
        Conn     *c = j->c;

        next = w->next;
        c->job = NULL;
        if (c->fd >= 0 && c->state == CONN_PARSING && w->ran) {
            request_checked(fe, c, &j->out);
            if (c->fd >= 0 && c->state == CONN_ACTIVE) conn_flush(fe, c);
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
    default:             frontend_reply(fe, c); break;
    }
}

/* After its one frame a client only waits; anything it sends then is a
 * protocol error, and EOF is a cancel. */
static void conn_read_after(Frontend *fe, Conn *c) {
    uint8_t b[256];
    ssize_t n = read(c->fd, b, sizeof(b));

    if (n > 0) {
        if (c->state == CONN_ACTIVE) route_cancel(fe, c, 0);
        conn_error(fe, c, 400, NULL, NULL,
                   "one frame per connection: unexpected data after it");
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        conn_gone(fe, c);
    }
}

void conn_read(Frontend *fe, Conn *c) {
    FrameStatus st;
    bool        eof = false;

    if (c->state == CONN_ACTIVE && (c->audio_left > 0 || c->audio_stalled))
    {
        audio_in_read(fe, c);
        return;
    }
    if (c->state != CONN_READ) {
        conn_read_after(fe, c);
        return;
    }
    st = frame_read_fd(&c->rd, c->fd, &eof);
    switch (st) {
    case FRAME_READY:
        if (c->rd.hdr.type == OMNI_F_AUDIO_IN) {
            conn_error(fe, c, 400, NULL, NULL, "an AUDIO_IN frame before "
                       "a REQUEST with audio_in");
        } else if (c->rd.hdr.type != OMNI_F_REQUEST
                   && frame_reader_buffered(&c->rd) > 0) {
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

void conn_on_event(Frontend *fe, Conn *c, uint32_t ev) {
    if (ev & EPOLLIN) conn_read(fe, c);
    if (c->fd >= 0 && (ev & EPOLLOUT)) conn_flush(fe, c);
    if (c->fd >= 0 && (ev & (EPOLLERR | EPOLLHUP)) && !(ev & EPOLLIN)) {
        conn_gone(fe, c);
    }
}

/* Frees the connections closed in this epoll batch (see conn_close). */
void conn_free_dead(Frontend *fe) {
    while (fe->dead != NULL) {
        Conn *c = fe->dead;

        fe->dead = c->next;
        free(c);
    }
}

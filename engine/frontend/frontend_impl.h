/* frontend_impl.h -- the frontend's shared state, seen only by its own
 * files: frontend.c (setup, the loop, timers, signals, shutdown, control
 * replies), conn.c (client connections and their requests), stages.c (the
 * table of stage processes and their channels) and listen.c (the socket,
 * the lock file, replacement). frontend.c's opening comment tells how the
 * pieces move; this header holds the structs they share and the functions
 * one file calls in another, each prefixed with its file's name.
 *
 * One thread runs all of it (the parse thread sees only a ParseJob), so
 * nothing here is locked. */

#ifndef OMNI_FRONTEND_IMPL_H
#define OMNI_FRONTEND_IMPL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <yajl/yajl_tree.h>

#include "frame.h"
#include "metrics.h"
#include "pool.h"
#include "request.h"
#include "serve.h"
#include "stage_channel.h"
#include "supervisor.h"
#include "transcripts.h"
#include "workq.h"

#define ID_BUCKETS        4096          // request id table (power of 2)
#define CONN_MAX_PENDING  (8u << 20)    // queued output per client: past
                                        //   it the request is cancelled

typedef enum {
    SRC_LISTEN,
    SRC_SIGNAL,
    SRC_STAGE,
    SRC_STAGE_ERR,
    SRC_PARSED,
    SRC_CONN,
} SrcKind;

struct Stage;

/* What an epoll event's data.ptr points at: the first member of each
 * event source, or a member of its stage's row. */
typedef struct {
    SrcKind       kind;
    struct Stage *stage;        // SRC_STAGE, SRC_STAGE_ERR: whose; else
                                //   NULL
} Source;

typedef enum {
    CONN_READ,                  // waiting for the one frame
    CONN_PARSING,               // its REQUEST is on the parse thread
    CONN_ACTIVE,                // request at the stage
    CONN_CLOSING,               // last frame queued; close when flushed
} ConnState;

/* A REQUEST's parse (conn.c's parse_request), wherever it ran. */
typedef struct {
    int          rc;            // request_parse's
    ReqError     e;             // when rc != 0
    OmniRequest  req;           // when rc == 0; freed by request_checked
    uint64_t     bytes;         // what the prompt bound counts of the text
} Parsed;

struct Conn;

/* The stages a request passes through, in order (route.c): the thinker
 * alone for text; thinker, talker, voicebox for a chat or prompt with
 * "audio"; talker, voicebox for "input"; the listener first for a
 * request with "audio_in", alone for a transcription. Bits are row indices
 * (Stage.row), so a stage's death finds its requests by one test. */
#define ROUTE_MAX 4

typedef struct {
    struct Stage *hop[ROUTE_MAX];   // borrowed rows
    int           n;
    int           deferred;     // hops from this index on get their SUBMIT
                                //   at hop 0's DONE (the listener's, with
                                //   what it heard); 0: all at the start
    uint32_t      working;      // rows that hold the request and have not
                                //   ended their part (DONE) yet
    bool          paused;       // PAUSE sent to the last hop
    bool          has_done;     // done holds the first hop's DONE
    OmniDone      done;         // counts merged from every hop's DONE
} Route;

/* A request cancelled at stages that have not answered yet: its blocks
 * are reclaimed (pool_reclaim_request) once every one of them answered
 * CANCELLED or died. */
typedef struct CancelRec {
    uint64_t          id;
    uint32_t          waiting;  // rows still to answer
    uint32_t          dead;     // rows whose death failed it: their
                                //   blocks are reclaimed by owner after
    struct CancelRec *next;
} CancelRec;

/* One parse on the parse thread. json is the connection's reader payload,
 * which stays put while the job is out (conn_close leaves the reader to
 * conn_on_parsed). */
typedef struct {
    WorkJob      w;             // first: the queue's view of the job
    struct Conn *c;             // borrowed
    const char  *json;          // (len,) view into c->rd.payload
    size_t       len;
    PromptBound  bound;         // a copy: the thread reads no Frontend
    Parsed       out;
} ParseJob;

typedef struct Conn {
    Source        src;          // SRC_CONN
    int           fd;           // -1 once closed (freed after the batch)
    ConnState     state;
    uint32_t      events;       // epoll mask registered now
    FrameReader   rd;           // OMNI_DIR_TO_ENGINE
    FrameWriter   wr;
    uint64_t      id;           // request id, 0 before submission
    Route         route;        // where its request goes; n 0 before
                                //   submission
    double        t_arrive;     // REQUEST read (monotonic s), 0: none
    double        t_submit;     // SUBMIT queued to the stage
    double        t_first;      // first TEXT forwarded, 0: none yet
    double        t_audio;      // first AUDIO forwarded, 0: none yet
    double        t_accept;     // accepted (monotonic s)
    struct Conn  *prev, *next;  // every open connection
    struct Conn  *rprev, *rnext;// in READ, oldest first: one timeout for
                                //   all, so the head's deadline is next
    struct Conn  *hnext;        // chain in the id table
    ParseJob     *job;          // its parse, while out (owned)
    char          keep_id[SPEECH_MAX_ID + 1]; // a spoken chat answer's
                                //   audio id: its text is kept under it
                                //   at DONE (transcripts.h); "": none
    TextBuf       said;         // that text so far (owned)
    /* audio in (audio_in.c) */
    uint64_t      audio_left;   // AUDIO_IN bytes still to come
    uint32_t      audio_off;    // of the current AUDIO_IN frame, bytes in
                                //   the pool already
    bool          audio_stalled;// the pool is full: not reading
    char         *json;         // the request JSON, kept for the hops
    size_t        json_len;     //   after the listener (owned)
    TextBuf      *heard;        // (n_heard,) each input's transcript so
    int           n_heard;      //   far (owned)
} Conn;


/* ---- The table of stages ------------------------------------------------
 * One row per kind of stage process the frontend runs: the thinker, and
 * with speech (OMNI_HAVE_SPEECH: the talker and voicebox are linked in)
 * the talker and the voicebox. A row is a constant part (StageKind: the name, and what is the
 * kind's own in READY, the page's gauges and the metrics) and the process
 * it supervises (Stage). Adding a stage is a row in stages.c's table and
 * its three functions; requests reach it through route.c. */

typedef enum {
    STAGE_DOWN,
    STAGE_LOADING,
    STAGE_READY,
    STAGE_GONE,
} StageState;

/* What the thinker's READY says: the served model. The id and context
 * hold the configured values until the first READY. */
typedef struct {
    char         model_id[256]; // served name (READY's id wins)
    char         kernels[16];   // the stage's kernel set, "" until READY
    int64_t      max_model_len;
    PromptBound  bound;         // max_piece 0 until READY states one
} ThinkerReady;

typedef struct Stage Stage;

typedef struct {
    const char       *name;     // "thinker": exec'd as `omni-engine stage
                                //   NAME`, and named in logs, health and
                                //   the metrics' help texts
    /* Sets s->ready before the first READY. */
    void            (*init)(Stage *s, const ServeConfig *cfg);
    /* Takes READY's fields (v, parsed JSON) into s->ready and describes
     * them for the "ready:" log line (desc, cap bytes). */
    void            (*ready)(Stage *s, yajl_val v, char *desc, size_t cap);
    SupResetFn       *reset;    // zeroes its part of the page's gauges
    MetricsRenderFn  *render;   // renders its part of the page
} StageKind;

struct Stage {
    Source           s_chan;    // SRC_STAGE: its channel
    int              row;       // its index in the table; owner tag row+1
    Source           s_err;     // SRC_STAGE_ERR: its stderr
    const StageKind *kind;      // its row's constant part (static)
    StageProc        sp;
    StageState       st;
    bool             was_ready; // this process said READY
    FrameReader      rd;        // OMNI_DIR_STAGE
    FrameWriter      wr;
    uint32_t         events;    // epoll mask on sp.fd
    double           ready_at;
    double           restart_at;
    double           gone_kill_at;  // INFINITY when not armed
    bool             silent;    // READY, but no heartbeat for
                                //   cfg->stage_unready_s
    bool             hang_killed;   // we killed this process for its
    char             kill_why[96];  //   silence, and why (its requests'
                                    //   errors say it)
    double           watch_at;  // next heartbeat check, INFINITY: none
    bool             reclaim_pending;   // died; its blocks are reclaimed
                                        //   (and it restarts) once the
                                        //   stages its requests were
                                        //   cancelled at have answered
    union {
        ThinkerReady thinker;
    } ready;                    // what its READY said, by kind
};

enum {
    STAGES_THINKER,
#ifdef OMNI_HAVE_SPEECH
    STAGES_TALKER,
    STAGES_VOICEBOX,
    STAGES_LISTENER,
#endif
    STAGES_N,
};


/* ---- The frontend ------------------------------------------------------- */

typedef enum {
    PHASE_RUN,
    PHASE_DRAIN,
    PHASE_FINISH,
} Phase;

typedef struct Frontend {
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
                                //   its place once every stage is READY
    char         lock_next[PATH_MAX];   // <lock-file>.next, a candidate's
    int          sfd;           // signalfd, owned
    int          lock_fd;       // cfg->lock_file (lock_next while a
                                //   candidate), locked; -1: none
    Source       s_listen, s_signal, s_parsed;
    WorkQ        pq;            // the parse thread (large requests)
    bool         pq_up;         // it started
    bool         listen_paused;
    double       listen_resume;
    long long    created;       // unix time the frontend started

    Stage        stages[STAGES_N];  // the table of stages
    Pool         pool;          // shared memory for the stages' bulk data
                                //   (units, audio), given to each at
                                //   STAGE_POOL_FD; owned
    CancelRec   *cancels;       // cancelled, not yet answered everywhere
    Transcripts  transcripts;   // spoken answers' text by audio id

    /* connections */
    Conn        *conns;         // list of open connections
    Conn        *rhead, *rtail; // connections in READ, by accept time
    Conn        *dead;          // closed in this batch, freed after it
    int64_t      n_conns;
    int          n_audio_stalled;   // uploads waiting for pool blocks
    int64_t      n_active;      // in CONN_ACTIVE
    Conn        *ids[ID_BUCKETS];
    uint64_t     next_id;

    Metrics      metrics;
    Phase        phase;
    double       drain_until;
    double       stop_kill_at;  // the stages are killed then; INFINITY
                                //   once they were
    double       clients_until; // FINISH waits this long for clients to
                                //   take their last bytes
} Frontend;

/* The thinker's row and what its READY said: the served model. */
static inline Stage *fe_thinker(Frontend *fe) {
    return &fe->stages[STAGES_THINKER];
}

static inline const ThinkerReady *fe_model(const Frontend *fe) {
    return &fe->stages[STAGES_THINKER].ready.thinker;
}


/* ---- frontend.c --------------------------------------------------------- */

void frontend_ep_set(Frontend *fe, int fd, uint32_t *cur, uint32_t events,
                     void *src);
void frontend_reply(Frontend *fe, Conn *c);     // HEALTH, MODELS, METRICS
void frontend_stop(Frontend *fe, const char *why);

/* ---- conn.c ------------------------------------------------------------- */

Conn *conn_find(Frontend *fe, uint64_t id);
void  conn_accept(Frontend *fe, int fd);
void  conn_close(Frontend *fe, Conn *c);
void  conn_gone(Frontend *fe, Conn *c);
void  conn_flush(Frontend *fe, Conn *c);
void  conn_end(Frontend *fe, Conn *c);
void  conn_error(Frontend *fe, Conn *c, int status, const char *param,
                 const char *code, const char *msg);
void  conn_read(Frontend *fe, Conn *c);
void  conn_on_event(Frontend *fe, Conn *c, uint32_t ev);
void  conn_on_parsed(Frontend *fe);
void  conn_free_dead(Frontend *fe);

/* ---- stages.c ----------------------------------------------------------- */

int    stages_init(Frontend *fe, int argc, char **argv, Err *err);
void   stages_free(Frontend *fe);
void   stages_count_end(Frontend *fe, Conn *c, const OmniFrameHdr *h,
                        const uint8_t *body);
void   stages_send(Frontend *fe, Stage *s, uint8_t type, uint64_t id,
                   const void *body, size_t len);
void   stages_read(Frontend *fe, Stage *s);
void   stages_flush(Frontend *fe, Stage *s);
void   stages_start(Frontend *fe, Stage *s);
void   stages_kill(Stage *s, const char *why);
void   stages_reap(Frontend *fe);
void   stages_stop(Frontend *fe);
bool   stages_running(const Frontend *fe);
bool   stages_live(const Frontend *fe, const Stage *s);
double stages_silence(const Stage *s, double now, double *in_step);
int    stages_health(const Frontend *fe, const Stage *s, char *why,
                     size_t cap);
double stages_deadline(const Frontend *fe);
void   stages_timers(Frontend *fe, double now);

/* ---- route.c ------------------------------------------------------------ */

bool route_build(Frontend *fe, const OmniRequest *r, Route *rt);
bool route_live(const Frontend *fe, const Route *rt, char *why, size_t cap);
bool route_has(const Route *rt, const Stage *s);
void route_submit(Frontend *fe, Conn *c, const char *json, size_t len);
void route_cancel(Frontend *fe, Conn *c, uint32_t dead);
void route_event(Frontend *fe, Stage *s, uint64_t id, const OmniFrameHdr *h,
                 const uint8_t *body);
void route_acked(Frontend *fe, Stage *s, uint64_t id);
void route_stage_died(Frontend *fe, Stage *s);
void route_flow(Frontend *fe, Conn *c);
void route_free(Frontend *fe);

/* ---- audio_in.c --------------------------------------------------------- */

int    audio_in_start(Frontend *fe, Conn *c, const OmniRequest *r,
                      const char *json, size_t len);
void   audio_in_read(Frontend *fe, Conn *c);
void   audio_in_retry(Frontend *fe);
double audio_in_deadline(const Frontend *fe);
int    audio_in_heard(Conn *c, const uint8_t *body, uint32_t len);
char  *audio_in_json(const Conn *c, size_t *len);
void   audio_in_free(Frontend *fe, Conn *c);

/* ---- listen.c ----------------------------------------------------------- */

int  listen_lock(Frontend *fe, Err *err);
int  listen_open(Frontend *fe, Err *err);
void listen_close(Frontend *fe);
void listen_unlink(Frontend *fe);
void listen_pause(Frontend *fe, bool pause);
void listen_accept(Frontend *fe);
void listen_backlog(Frontend *fe);
void listen_takeover(Frontend *fe);

#endif

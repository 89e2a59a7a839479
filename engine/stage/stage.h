/* stage.h -- the stage process skeleton: everything a stage does that is
 * not its own logic.
 *
 * A stage (the thinker today; the talker and the voicebox next) is a
 * process the frontend starts with one end of the channel on ipc_fd and
 * the statistics page on stats_fd (stage_channel.h). What every stage does
 * with them is here, once: the signals it ignores, the page it maps and
 * whose generic part it keeps (pid, heartbeat, step timings), the frames
 * it reads (SUBMIT, CANCEL) and writes (READY, STARTED, EVENT), the loop
 * that polls, reads, steps, flushes and beats, and the end at EOF.
 *
 * What a stage is, is one StageOps row: a name and a few callbacks the
 * loop calls on its thread. So a new stage is one file of stage logic and
 * one row in main.c's table of stages; it never sees a frame or a poll.
 *
 * The loop, single-threaded:
 *
 *   poll      ipc_fd for SUBMIT/CANCEL (and POLLOUT while output waits),
 *             and wake_fd when the stage set one;
 *             timeout 0 while the stage has work, STAGE_BEAT_MS when
 *             idle or backlogged (so the heartbeat goes on)
 *   wake      ops->wake when wake_fd is readable
 *   read      every whole frame available: ops->submit, ops->cancel
 *   step      ops->step once, unless idle or backlogged, timed
 *   tick      ops->tick, when the stage has timers
 *   flush     as much output as the socket takes
 *
 * Output is bounded: past STAGE_WRITE_HIGH bytes unsent the loop stops
 * stepping and waits for the frontend to drain (it always does), so a
 * stalled reader costs no memory growth. */

#ifndef OMNI_STAGE_H
#define OMNI_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "log.h"
#include "pool.h"
#include "serve.h"
#include "stage_channel.h"

#define STAGE_WRITE_HIGH (8u << 20)     // unsent output that pauses steps

typedef struct Stage Stage;

/* One kind of stage. Every callback runs on the loop's thread and gets the
 * Stage; its own state is s->ud. */
typedef struct {
    const char *name;               // "thinker": `stage NAME`, log lines
    /* Builds the stage's state into s->ud (owned by the stage) and ends
     * with stage_ready. Returns 0, or -1 with err set: a startup failure,
     * the process exits. s->stats is mapped already (or NULL). */
    int  (*start)(Stage *s, const ServeConfig *cfg, Err *err);
    /* A SUBMIT: json (len bytes, not NUL-terminated) is borrowed until the
     * call returns. Every request ends with one DONE or ERROR event,
     * except a cancelled one. */
    void (*submit)(Stage *s, uint64_t id, const char *json, size_t len);
    /* A CANCEL: drop request id; send nothing more for it, and call
     * stage_cancelled(s, id) once nothing of it is held (at once, or
     * later when a worker thread lets go). Unknown ids: ack at once. */
    void (*cancel)(Stage *s, uint64_t id);
    /* (optional) An INPUT: the inner frame (type, n bytes at p, borrowed
     * for the call) for request id. A BLOCK has been checked (pool_check)
     * and its reference is the stage's now: it passes it on or drops it.
     * NULL: the stage takes no input, and an INPUT is a protocol error. */
    void (*input)(Stage *s, uint64_t id, uint8_t type, const uint8_t *p,
                  size_t n);
    /* (optional) PAUSE (paused true) and RESUME for request id. */
    void (*pause)(Stage *s, uint64_t id, bool paused);
    /* True when there is nothing to step. */
    bool (*idle)(Stage *s);
    /* One step of work; its events queued with the stage_* calls below. */
    void (*step)(Stage *s);
    /* (optional) s->wake_fd is readable; NULL means the stage sets none. */
    void (*wake)(Stage *s);
    /* (optional) Called at every turn of the loop, after the step: often
     * while busy, at least every STAGE_BEAT_MS when idle, for the stage's
     * own timers (it rate-limits itself). NULL: the stage has none. */
    void (*tick)(Stage *s);
    /* The loop is over (EOF, a fatal error, or a failed start, so the
     * state may be half built or s->ud NULL): end every request still
     * held with an ERROR event, then free s->ud. Output is flushed once
     * more after it. */
    void (*stop)(Stage *s);
} StageOps;

struct Stage {
    const StageOps *ops;            // borrowed, static
    void           *ud;             // the stage's state, owned by it
    int             fd;             // ipc_fd, non-blocking
    int             wake_fd;        // polled for POLLIN when >= 0; the
                                    //   stage's (it closes it); -1: none
    OmniStats      *stats;          // mapped page, or NULL without one
    Pool            pool;           // attached from STAGE_POOL_FD;
    bool            has_pool;       //   false without one
    uint16_t        owner;          // this stage's tag on blocks it
                                    //   allocates (the frontend's row
                                    //   number, given on the command line)
    FrameReader     rd;
    FrameWriter     wr;
    bool            nomem;          // the writer could not grow: fatal
};

/* Runs the stage ops on ipc_fd and stats_fd (< 0: no page) until ipc_fd
 * reaches EOF: ignores SIGTERM/SIGINT/SIGPIPE (a terminal's ^C reaches
 * the whole process group; the frontend decides how a stage ends), maps
 * the page, ops->start, the loop, ops->stop. Returns 0 at EOF (or when
 * the frontend hung up on a write), -1 with err set when the stage could
 * not start or the frontend broke the protocol (a bug there: the stage
 * exits and is restarted). Nothing is left to free either way. */
int  stage_main(const StageOps *ops, const ServeConfig *cfg, int ipc_fd,
                int stats_fd, Err *err);

/* READY: {"id":"<id, JSON-escaped>"<more>}, where more is the stage's
 * own members, each with its leading comma ("" for none). The first
 * heartbeat goes with it. Returns 0, or -1 with err set (out of memory).
 * id is at most 255 bytes (serve_model_name's cap). */
int  stage_ready(Stage *s, const char *id, const char *more, Err *err);

/* Events out. STARTED: request id was first scheduled. The others wrap
 * a client frame (type, n bytes of payload p) in an EVENT. Out of memory
 * sets s->nomem, which ends the loop. They can't otherwise fail. */
void stage_started(Stage *s, uint64_t id);
void stage_event(Stage *s, uint64_t id, uint8_t type, const void *p,
                 size_t n);
void stage_done(Stage *s, uint64_t id, const OmniDone *d);
/* An EVENT carrying a BLOCK: r's one reference goes with it. Loop thread
 * only (workers hand their blocks to the loop). */
void stage_block(Stage *s, uint64_t id, PoolRef r);
/* CANCELLED: nothing of request id is held any more. */
void stage_cancelled(Stage *s, uint64_t id);
/* An ERROR event; omni_error_set cuts the strings, at character
 * boundaries, to fit the frame. param and code may be NULL. */
void stage_error(Stage *s, uint64_t id, int status, const char *type,
                 const char *param, const char *code, const char *msg);

#endif

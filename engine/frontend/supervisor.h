/* supervisor.h -- the process side of a stage: its shared statistics page,
 * starting it by fork+exec, capturing its stderr, reaping it, and the
 * restart backoff.
 *
 * This file knows nothing of frames or epoll: the frontend registers the
 * descriptors it hands out (fd, err_fd) and decides when to call what. The
 * split keeps process plumbing (fd numbering in the child, signal state,
 * exit statuses) apart from request routing. */

#ifndef OMNI_SUPERVISOR_H
#define OMNI_SUPERVISOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "stage_channel.h"

#define SUP_BACKOFF_MIN_MS  100     // first restart delay
#define SUP_BACKOFF_MAX_MS  5000    // doubling stops here
#define SUP_STABLE_S        30.0    // ready this long: backoff resets

/* Zeroes a kind of stage's own gauges in the page (its member of the
 * union), as sup_reap does the gauges every stage has. Can't fail. */
typedef void SupResetFn(OmniStats *st);

/* The thinker's: its KV block gauges. */
void sup_reset_thinker(OmniStats *st);
/* A kind with no gauges of its own. */
void sup_reset_none(OmniStats *st);
void sup_reset_voicebox(OmniStats *st);
void sup_reset_listener(OmniStats *st);

typedef struct {
    const char *kind;               // "thinker", borrowed (static)
    SupResetFn *reset;              // the kind's own gauges
    char      **argv;               // exec argv, NULL-terminated; the
                                    //   array owned, strings borrowed
                                    //   but for owner_arg
    char        owner_arg[8];       // --stage-owner's value
    int         pool_fd;            // the pool's memfd, borrowed; -1: none
    int         stats_fd;           // memfd with one OmniStats, owned
    OmniStats  *stats;              // shared mapping of stats_fd, owned
    pid_t       pid;                // the process, 0 when none
    int         fd;                 // our end of its channel (non-blocking),
                                    //   -1 when closed
    int         err_fd;             // read end of its stderr (non-blocking),
                                    //   -1 when closed
    int         backoff_ms;         // delay before the next start
    int         fails;              // exits in a row before READY
    char        exit_desc[64];      // how the last process ended:
                                    //   "status 1", "signal 9"
    char        last_line[256];     // the last line it wrote to stderr
    char        line[256];          // the line being read from err_fd
    size_t      line_len;
} StageProc;

/* Creates the statistics page (memfd, mapped shared, magic set) and the
 * argv a start will exec:
 *   omni-engine stage <kind> --ipc-fd 3 --stats-fd 4 --pool-fd 5
 *       --stage-owner <owner> <argv[0..argc)>
 * (without the pool's two options when pool_fd < 0). kind, argv and
 * pool_fd are borrowed and must outlive sp; reset zeroes the kind's own
 * gauges when a process is reaped. Returns 0, or -1 with err set. */
int  sup_init(StageProc *sp, const char *kind, SupResetFn *reset,
              int pool_fd, uint16_t owner, int argc, char **argv, Err *err);

/* Unmaps and closes what sup_init made, and any descriptor still open.
 * The process must have been reaped first (pid == 0). */
void sup_free(StageProc *sp);

/* Starts the process: a socketpair for its channel and a pipe for its
 * stderr, then fork; the child gets the channel on fd 3 and the page on
 * fd 4, the pool on fd 5 (when there is one), every other descriptor
 * closed, signals unblocked and at their
 * defaults, and execs /proc/self/exe. Sets pid, fd and err_fd. Returns 0,
 * or -1 with err set (nothing is left open then). */
int  sup_start(StageProc *sp, Err *err);

/* Closes our end of the channel (the stage exits when it sees EOF). */
void sup_close_channel(StageProc *sp);

/* Collects the process if it has ended, without blocking. Returns true
 * when it has: exit_desc tells how, pid is 0, and the page's gauges, every
 * stage's and the kind's own (reset), are zeroed (no stage is there to
 * update them). */
bool sup_reap(StageProc *sp);

/* Reads what is waiting on err_fd, copies it to our stderr and remembers
 * its last complete line. Returns false at EOF or on an error (err_fd is
 * closed then), true while it stays open. */
bool sup_read_stderr(StageProc *sp);

/* The restart policy, called once per ended process. ready_s is how long
 * it had been ready, or < 0 when it never said READY (that counts as a
 * failure in a row). Returns the delay before the next start in ms:
 * SUP_BACKOFF_MIN_MS doubling to SUP_BACKOFF_MAX_MS, back to the minimum
 * after a process stayed ready for SUP_STABLE_S. Can't fail. */
int  sup_backoff(StageProc *sp, double ready_s);

/* Seconds the stage has gone without a heartbeat at monotonic time now
 * (stage_channel.h), counting from `since` (its READY) when it has not beaten
 * after that: a page reset at its start reads 0. *in_step (may be NULL)
 * gets how long the step in progress has run, or -1 between steps. Reads
 * the page only; can't fail. */
double sup_silence(const StageProc *sp, double since, double now,
                   double *in_step);

#endif

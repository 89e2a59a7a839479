/* workq.h -- one helper thread that runs jobs for an event loop.
 *
 * Some per-request work grows with the request's size: parsing a large
 * JSON body, rendering and tokenizing a long prompt. Done on an event
 * loop's thread, one large request stalls every other client of that loop
 * (the frontend's streams, the thinker's step loop) for as long as it
 * takes. The loops do small requests themselves and hand large ones to a
 * WorkQ: the thread runs each job's run() in FIFO order, puts it on the
 * done list and makes an eventfd readable; the loop, when epoll or poll
 * reports that descriptor, takes the done jobs and finishes them.
 *
 * The thread may run at a lower priority (a higher nice value) than the
 * loop, so that on a busy machine the loop's short, latency-bound work
 * goes first and the large requests take what is left: they are the ones
 * whose answer was going to be slow anyway.
 *
 * Ownership: a job belongs to the loop except between workq_push and
 * workq_done, when only run() touches it. run() must not touch anything
 * else the loop may change meanwhile; it works on what the job holds. */

#ifndef OMNI_WORKQ_H
#define OMNI_WORKQ_H

#include <pthread.h>
#include <stdbool.h>

#include "log.h"

typedef struct WorkJob WorkJob;

struct WorkJob {
    WorkJob *next;                  // queue link
    void   (*run)(WorkJob *j);      // called on the helper thread
    bool     ran;                   // run() was called (false for jobs
                                    //   handed back by workq_stop)
};

typedef struct {
    pthread_t        th;
    pthread_mutex_t  mu;            // guards everything below
    pthread_cond_t   cv;            // todo grew, or stop
    WorkJob         *todo, *todo_tail;  // FIFO, waiting for the thread
    WorkJob         *done, *done_tail;  // FIFO, waiting for the loop
    int              efd;           // eventfd: readable while done is not
                                    //   empty (owned)
    int              nice;          // added to the thread's nice value
    bool             stop;
    bool             started;       // th exists (workq_stop joins it)
} WorkQ;

/* Starts the thread at nice value `nice` relative to the process (a
 * failure to lower its priority is not an error). q->efd is what the loop
 * watches for readability. Returns 0, or -1 with err set (nothing is left
 * to free then). */
int      workq_init(WorkQ *q, int nice, Err *err);

/* Queues j (j->run set by the caller). Can't fail. */
void     workq_push(WorkQ *q, WorkJob *j);

/* Takes every done job, oldest first, as a list linked by next (NULL when
 * none), and drains the eventfd. Can't fail. */
WorkJob *workq_done(WorkQ *q);

/* Stops the thread after the job it is running, if any, and waits for it;
 * jobs it had not started are moved to the done list with ran false, so
 * one last workq_done returns every job still out. */
void     workq_stop(WorkQ *q);

/* After workq_stop and the last workq_done: frees what init made. */
void     workq_free(WorkQ *q);

#endif

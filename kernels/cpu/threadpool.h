/* threadpool.h -- a persistent pool for the CPU kernels.
 *
 * tp_run(pool, fn, arg, n) calls fn(arg, item, ith) once for every item in
 * [0, n), each item claimed from a shared counter by whichever thread gets
 * there first; the caller is thread 0 and claims items too. So a job
 * finishes even when no worker gets the CPU (the host is oversubscribed,
 * nginx workers share the cores): it then runs at one thread's speed rather
 * than waiting for a descheduled worker to wake up. fn must not depend on
 * which thread runs an item except through ith (per-thread scratch).
 *
 * Workers spin briefly between jobs, because a decode step issues a few
 * hundred short jobs back to back and a futex round trip per job would
 * cost more than the work; after TP_SPIN_NS without a job they sleep on a
 * futex, so an idle server costs no CPU. One caller at a time: the pool
 * belongs to one backend. */

#ifndef OMNI_THREADPOOL_H
#define OMNI_THREADPOOL_H

#include <stdint.h>

typedef void (*TpFn)(void *arg, int64_t item, int ith);

typedef struct ThreadPool ThreadPool;

/* Starts nth-1 workers. Returns NULL when a thread cannot be created. */
ThreadPool *tp_new(int nth);
/* Stops and joins the workers, frees the pool. */
void        tp_free(ThreadPool *tp);
int         tp_size(const ThreadPool *tp);
/* Runs fn on items 0..n_items-1 and returns when all are done. */
void        tp_run(ThreadPool *tp, TpFn fn, void *arg, int64_t n_items);

#endif

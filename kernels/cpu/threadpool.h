/* threadpool.h -- a persistent fork-join pool for the CPU kernels.
 *
 * tp_run(pool, fn, arg) runs fn(arg, ith, nth) on every thread, the caller
 * being thread 0, and returns when all have finished. Workers spin briefly
 * between jobs, because a decode step issues a few hundred short jobs back
 * to back and a futex round trip per job would cost more than the work;
 * after TP_SPIN_NS without a job they sleep on a futex, so an idle server
 * costs no CPU. One caller at a time: the pool belongs to one backend. */

#ifndef OMNI_THREADPOOL_H
#define OMNI_THREADPOOL_H

typedef void (*TpFn)(void *arg, int ith, int nth);

typedef struct ThreadPool ThreadPool;

/* Starts nth-1 workers. Returns NULL when a thread cannot be created. */
ThreadPool *tp_new(int nth);
/* Stops and joins the workers, frees the pool. */
void        tp_free(ThreadPool *tp);
int         tp_size(const ThreadPool *tp);
void        tp_run(ThreadPool *tp, TpFn fn, void *arg);

#endif

/* threadpool.c -- see threadpool.h.
 *
 * Protocol: the caller publishes fn/arg, sets pending = nth - 1 and bumps
 * gen (release). A worker that sees gen change (acquire) runs its share and
 * decrements pending (release); the caller waits for pending == 0
 * (acquire). gen is written only by the caller, pending is decremented only
 * by workers once per job. Sleepers are counted so the caller issues the
 * futex wake only when someone sleeps. */

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"

#define TP_SPIN_NS  2000000         /* 2 ms of spinning before sleeping */

typedef struct {
    ThreadPool *tp;
    int         ith;
    pthread_t   thread;
} Worker;

struct ThreadPool {
    int             nth;
    Worker         *workers;        // (nth - 1,), owned
    TpFn            fn;
    void           *arg;
    _Atomic uint32_t gen;           // job generation, written by the caller
    _Atomic int      pending;       // workers still running the job
    _Atomic int      sleepers;      // workers blocked in futex wait
    _Atomic int      stop;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *) addr, FUTEX_WAIT_PRIVATE, val, NULL,
            NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *) addr, FUTEX_WAKE_PRIVATE, INT32_MAX,
            NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* Waits until gen differs from seen: spins first, then sleeps. */
static uint32_t wait_job(ThreadPool *tp, uint32_t seen) {
    uint64_t start = 0;
    uint32_t g;

    for (unsigned i = 0;; i++) {
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if ((i & 1023) != 1023) continue;
        if (start == 0) {
            start = now_ns();
        } else if (now_ns() - start > TP_SPIN_NS) {
            atomic_fetch_add(&tp->sleepers, 1);
            futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->sleepers, 1);
        }
    }
}

static void *worker_main(void *p) {
    Worker     *w = p;
    ThreadPool *tp = w->tp;
    uint32_t    seen = 0;

    for (;;) {
        seen = wait_job(tp, seen);
        if (atomic_load(&tp->stop)) break;
        tp->fn(tp->arg, w->ith, tp->nth);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
    }
    return NULL;
}

ThreadPool *tp_new(int nth) {
    ThreadPool *tp = calloc(1, sizeof(*tp));

    if (tp == NULL) return NULL;
    tp->nth = nth < 1 ? 1 : nth;
    tp->workers = calloc((size_t) tp->nth, sizeof(Worker));
    if (tp->workers == NULL) {
        free(tp);
        return NULL;
    }
    for (int i = 1; i < tp->nth; i++) {
        Worker *w = &tp->workers[i - 1];

        w->tp = tp;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            tp->nth = i;            /* join only those started */
            tp_free(tp);
            return NULL;
        }
    }
    return tp;
}

void tp_free(ThreadPool *tp) {
    if (tp == NULL) return;
    atomic_store(&tp->stop, 1);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    futex_wake_all(&tp->gen);
    for (int i = 1; i < tp->nth; i++) pthread_join(tp->workers[i - 1].thread,
                                                   NULL);
    free(tp->workers);
    free(tp);
}

int tp_size(const ThreadPool *tp) {
    return tp->nth;
}

void tp_run(ThreadPool *tp, TpFn fn, void *arg) {
    if (tp->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->nth - 1, memory_order_relaxed);
    /* seq_cst on both: a worker that registers as a sleeper after our load
       of sleepers must then see the new gen in its futex compare */
    atomic_fetch_add(&tp->gen, 1);
    if (atomic_load(&tp->sleepers) > 0) futex_wake_all(&tp->gen);

    fn(arg, 0, tp->nth);

    while (atomic_load_explicit(&tp->pending, memory_order_acquire) != 0) {
        cpu_relax();
    }
}

/* threadpool.c -- see threadpool.h.
 *
 * Protocol. The caller publishes fn/arg/n_items, resets the item counter,
 * stores state = gen << 32 (release) and then bumps gen. A worker that sees
 * the new gen enters the job by incrementing the active count in state,
 * but only while state still carries that gen and is not CLOSED (a CAS, so
 * a late worker can never enter the next job by mistake). Inside, every
 * thread claims items from `next` until none are left. When the caller
 * finds no items left it sets CLOSED, so no further worker enters, and
 * waits for the active count to reach zero: only workers already running a
 * claimed item are waited for, never one that has not been scheduled.
 *
 * Writers: fn/arg/n_items/gen only by the caller between jobs; state's gen
 * and CLOSED by the caller, its count by workers (+1 on entry, -1 with
 * release on exit, which publishes their outputs to the caller's acquire).
 * Sleepers are counted so the caller issues a futex wake only when someone
 * sleeps. */

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"

#define TP_SPIN_NS  2000000         /* 2 ms of spinning before sleeping */
#define TP_CLOSED   ((uint64_t) 1 << 31)
#define TP_COUNT    (TP_CLOSED - 1)

typedef struct {
    ThreadPool *tp;
    int         ith;
    pthread_t   thread;
} Worker;

/* Fields that different threads write live on different cache lines: gen
 * (read by spinning workers), next (claimed by all), state (entries and
 * exits). */
struct ThreadPool {
    int                nth;
    Worker            *workers;     // (nth - 1,), owned
    _Atomic int        sleepers;    // workers blocked in futex wait
    _Atomic int        stop;
    _Alignas(64) TpFn  fn;          // the job, written before gen
    void              *arg;
    int64_t            n_items;
    _Atomic uint32_t   gen;         // job generation, written by the caller
    _Alignas(64) _Atomic int64_t  next;    // next unclaimed item
    _Alignas(64) _Atomic uint64_t state;   // gen << 32 | CLOSED | active
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

/* Joins job g unless it is already closed or replaced. */
static bool enter_job(ThreadPool *tp, uint32_t g) {
    uint64_t s = atomic_load_explicit(&tp->state, memory_order_acquire);

    for (;;) {
        if ((uint32_t) (s >> 32) != g || (s & TP_CLOSED)) return false;
        if (atomic_compare_exchange_weak_explicit(&tp->state, &s, s + 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire))
        {
            return true;
        }
    }
}

static void claim_items(ThreadPool *tp, int ith) {
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&tp->next, 1,
                                              memory_order_relaxed);
        if (i >= tp->n_items) return;
        tp->fn(tp->arg, i, ith);
    }
}

static void *worker_main(void *p) {
    Worker     *w = p;
    ThreadPool *tp = w->tp;
    uint32_t    seen = 0;

    for (;;) {
        seen = wait_job(tp, seen);
        if (atomic_load(&tp->stop)) break;
        if (!enter_job(tp, seen)) continue;
        claim_items(tp, w->ith);
        atomic_fetch_sub_explicit(&tp->state, 1, memory_order_release);
    }
    return NULL;
}

ThreadPool *tp_new(int nth) {
    ThreadPool *tp = aligned_alloc(64, sizeof(*tp));

    if (tp == NULL) return NULL;
    memset(tp, 0, sizeof(*tp));
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
    atomic_fetch_add(&tp->gen, 1);
    futex_wake_all(&tp->gen);
    for (int i = 1; i < tp->nth; i++) {
        pthread_join(tp->workers[i - 1].thread, NULL);
    }
    free(tp->workers);
    free(tp);
}

int tp_size(const ThreadPool *tp) {
    return tp->nth;
}

void tp_run(ThreadPool *tp, TpFn fn, void *arg, int64_t n_items) {
    uint32_t g;

    if (tp->nth == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++) fn(arg, i, 0);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    tp->n_items = n_items;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    g = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&tp->state, (uint64_t) g << 32,
                          memory_order_release);
    /* seq_cst on both: a worker that registers as a sleeper after our load
       of sleepers must then see the new gen in its futex compare */
    atomic_store(&tp->gen, g);
    if (atomic_load(&tp->sleepers) > 0) futex_wake_all(&tp->gen);

    claim_items(tp, 0);

    atomic_fetch_or_explicit(&tp->state, TP_CLOSED, memory_order_acq_rel);
    while ((atomic_load_explicit(&tp->state, memory_order_acquire) & TP_COUNT)
           != 0)
    {
        cpu_relax();
    }
}

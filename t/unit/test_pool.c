/* test_pool.c -- the shared-memory pool of engine/base/pool.c: blocks run
 * out and come back; references counted across fork()ed processes that
 * map the inherited memfd; a producer waiting on a full pool is woken by
 * a free in another thread or process; two processes of two threads each
 * alloc and free for a second and no block is ever handed out twice; a
 * SIGKILLed process's blocks and a cancelled request's come back; attach
 * refuses what is not a pool; descriptors out of range are refused.
 *
 * Child processes never return into cmocka: they report through their
 * exit status (0 good, else the number of the check that failed). */

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "pool.h"

#define NB  8                       // blocks of the small pools
#define BS  4096                    // their size

static Pool new_pool(uint32_t n_blocks) {
    Pool p;
    Err  err;

    assert_int_equal(pool_create(&p, n_blocks, BS, &err), 0);
    return p;
}

static uint64_t state_of(const Pool *p, uint32_t b) {
    return atomic_load(&p->slots[b].state);
}

/* Takes every free block (owner 0, request 1). */
static void fill(Pool *p) {
    while (pool_alloc(p, 0, 1) >= 0) {}
}

/* The child's exit status, or -1 when a signal ended it. */
static int reap(pid_t pid) {
    int st;

    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Polls until n producers wait on p (any process), for up to 5 s. */
static void until_waiters(const Pool *p, uint32_t n) {
    PoolStats st;

    for (int i = 0; i < 5000; i++) {
        pool_stats(p, &st);
        if (st.waiters == n) return;
        usleep(1000);
    }
    fail_msg("%u producers never waited", n);
}

static void test_create_refuses(void **state) {
    static const uint32_t bad[][2] = {
        { 0, BS }, { POOL_MAX_BLOCKS + 1, BS }, { NB, 0 }, { NB, 100 },
        { NB, POOL_MAX_BLOCK + POOL_ALIGN },
    };
    Pool p;
    Err  err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(pool_create(&p, bad[i][0], bad[i][1], &err), -1);
        assert_non_null(strstr(err.msg, "shared-memory pool: "));
        assert_int_equal(p.fd, -1);
    }
}

static void test_alloc_until_full(void **state) {
    Pool      p = new_pool(NB);
    PoolStats st;
    int       seen[NB] = { 0 }, b;

    for (int i = 0; i < NB; i++) {
        b = pool_alloc(&p, 3, 42);
        assert_in_range(b, 0, NB - 1);
        assert_int_equal(seen[b]++, 0);
        assert_int_equal(POOL_REFS(state_of(&p, b)), 1);
        assert_int_equal(POOL_OWNER(state_of(&p, b)), 3);
        memset(pool_block(&p, b), 0xA5, BS);     // the whole block is mapped
    }
    assert_int_equal(pool_alloc(&p, 3, 42), -1);
    pool_stats(&p, &st);
    assert_int_equal(st.n_blocks, NB);
    assert_int_equal(st.free, 0);
    assert_int_equal(st.used, NB);
    assert_ptr_equal((uint8_t *) pool_block(&p, 1),
                     (uint8_t *) pool_block(&p, 0) + BS);
    assert_null(pool_block(&p, NB));

    assert_int_equal(pool_unref(&p, 5), 1);
    pool_stats(&p, &st);
    assert_int_equal(st.free, 1);
    assert_int_equal(pool_alloc(&p, 4, 43), 5);
    assert_int_equal(pool_alloc(&p, 4, 43), -1);
    pool_destroy(&p);
}

static void test_refcount(void **state) {
    Pool p = new_pool(NB);
    int  b = pool_alloc(&p, 1, 1);

    assert_int_equal(pool_ref(&p, b), 0);
    assert_int_equal(pool_ref(&p, b), 0);
    assert_int_equal(POOL_REFS(state_of(&p, b)), 3);
    assert_int_equal(pool_unref(&p, b), 0);
    assert_int_equal(pool_unref(&p, b), 0);
    assert_int_equal(pool_unref(&p, b), 1);     // the last unref frees
    assert_int_equal(POOL_REFS(state_of(&p, b)), 0);
    assert_int_equal(pool_unref(&p, b), -1);    // double unref: no change
    assert_int_equal(pool_ref(&p, b), -1);      // a free block
    assert_int_equal(POOL_REFS(state_of(&p, b)), 0);
    assert_int_equal(pool_ref(&p, NB), -1);
    assert_int_equal(pool_unref(&p, NB), -1);

    b = pool_alloc(&p, 1, 1);
    for (uint32_t i = 1; i < POOL_MAX_REFS; i++) {
        assert_int_equal(pool_ref(&p, b), 0);
    }
    assert_int_equal(pool_ref(&p, b), -1);      // saturated, not wrapped
    assert_int_equal(POOL_REFS(state_of(&p, b)), POOL_MAX_REFS);
    assert_int_equal(POOL_OWNER(state_of(&p, b)), 1);
    pool_destroy(&p);
}

static void test_wait_timeout(void **state) {
    Pool   p = new_pool(NB);
    double t0;

    assert_int_equal(pool_wait(&p, 0), 0);      // free blocks: at once
    fill(&p);
    t0 = clock_now_s();
    assert_int_equal(pool_wait(&p, 50), -1);
    assert_true(clock_now_s() - t0 >= 0.045);
    pool_destroy(&p);
}

/* Waits up to 10 s; woken by a free, it returns well before (a free
 * that does not wake leaves it asleep until the timeout). */
typedef struct {
    Pool        *p;
    int          rc;
    double       waited;            // seconds
    _Atomic int  done;
} Waiter;

static void *waiter_main(void *arg) {
    Waiter *w = arg;
    double  t0 = clock_now_s();

    w->rc = pool_wait(w->p, 10000);
    w->waited = clock_now_s() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

static void test_wait_thread(void **state) {
    Pool      p = new_pool(NB);
    Waiter    w = { .p = &p, .rc = 99 };
    pthread_t th;

    fill(&p);
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    until_waiters(&p, 1);
    usleep(20000);
    assert_int_equal(atomic_load(&w.done), 0);  // still asleep: pool full
    assert_int_equal(pool_unref(&p, 6), 1);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, 0);
    assert_true(w.waited < 5);
    assert_int_equal(pool_alloc(&p, 0, 1), 6);
    pool_destroy(&p);
}

/* A forked producer waits on the inherited mapping; the parent frees. */
static void test_wait_process(void **state) {
    Pool  p = new_pool(NB);
    pid_t pid;

    fill(&p);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        double t0 = clock_now_s();

        if (pool_wait(&p, 10000) != 0) _exit(2);
        if (clock_now_s() - t0 > 5) _exit(3);          // not woken
        _exit(pool_alloc(&p, 7, 77) == 2 ? 0 : 4);
    }
    until_waiters(&p, 1);
    assert_int_equal(pool_unref(&p, 2), 1);
    assert_int_equal(reap(pid), 0);
    assert_int_equal(POOL_OWNER(state_of(&p, 2)), 7);
    assert_int_equal(POOL_REFS(state_of(&p, 2)), 1);
    pool_destroy(&p);
}

/* The child maps the memfd afresh, as a stage does after exec, and adds
 * two references and drops one: the parent sees two, and the bytes. */
static int child_refs(int fd, int b) {
    Pool  q;
    Err   err;
    char *d;

    if (pool_attach(&q, fd, &err) != 0) return 2;
    d = pool_block(&q, (uint32_t) b);
    if (strcmp(d, "from the parent") != 0) return 3;
    if (pool_ref(&q, (uint32_t) b) != 0 || pool_ref(&q, (uint32_t) b) != 0) {
        return 4;
    }
    if (pool_unref(&q, (uint32_t) b) != 0) return 5;
    strcpy(d, "from the child");
    pool_detach(&q);
    return 0;
}

static void test_refs_across_fork(void **state) {
    Pool  p = new_pool(NB);
    int   b = pool_alloc(&p, 0, 9);
    pid_t pid;

    strcpy(pool_block(&p, b), "from the parent");
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_refs(p.fd, b));
    assert_int_equal(reap(pid), 0);
    assert_int_equal(POOL_REFS(state_of(&p, b)), 2);
    assert_string_equal(pool_block(&p, b), "from the child");
    assert_int_equal(pool_unref(&p, b), 0);
    assert_int_equal(pool_unref(&p, b), 1);
    assert_int_equal(pool_unref(&p, b), -1);
    pool_destroy(&p);
}

/* ---- Concurrency: 2 processes x 2 threads for about a second ---------- */

#define CONC_BLOCKS  3              // fewer than the workers: fought over
#define CONC_SECONDS 1.0

typedef struct {
    Pool     *p;
    uint16_t  id;                   // 1..4: owner tag and request id
    long      ops;
    long      errors;               // invariant violations seen
} Worker;

/* Each holder stamps its id at both ends of the block, yields, and checks
 * that nobody else wrote there before it lets go. */
static void *worker_main(void *arg) {
    Worker   *w = arg;
    double    end = clock_now_s() + CONC_SECONDS;
    size_t    last = BS / sizeof(uint64_t) - 1;

    while (clock_now_s() < end) {
        int                b = pool_alloc(w->p, w->id, w->id);
        volatile uint64_t *d;
        uint64_t           s;

        if (b < 0) {
            pool_wait(w->p, 100);
            continue;
        }
        s = state_of(w->p, (uint32_t) b);
        w->errors += POOL_REFS(s) != 1 || POOL_OWNER(s) != w->id;
        d = pool_block(w->p, (uint32_t) b);
        d[0] = w->id;
        d[last] = w->id;
        if (w->ops % 3 == 0) {
            w->errors += pool_ref(w->p, (uint32_t) b) != 0;
            sched_yield();
            w->errors += pool_unref(w->p, (uint32_t) b) != 0;
        }
        sched_yield();
        w->errors += d[0] != w->id || d[last] != w->id;
        w->errors += pool_unref(w->p, (uint32_t) b) != 1;
        w->ops++;
    }
    return NULL;
}

/* Two workers with ids first and first + 1; their errors, or -1 when one
 * did nothing at all. */
static long run_two(Pool *p, uint16_t first) {
    Worker    w[2] = { { p, first, 0, 0 }, { p, (uint16_t) (first + 1), 0,
                                              0 } };
    pthread_t th[2];

    for (int i = 0; i < 2; i++) {
        if (pthread_create(&th[i], NULL, worker_main, &w[i]) != 0) return -1;
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    if (w[0].ops == 0 || w[1].ops == 0) return -1;
    return w[0].errors + w[1].errors;
}

static void test_concurrent(void **state) {
    Pool      p = new_pool(CONC_BLOCKS);
    PoolStats st;
    pid_t     pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) _exit(run_two(&p, 3) == 0 ? 0 : 2);
    assert_int_equal(run_two(&p, 1), 0);
    assert_int_equal(reap(pid), 0);
    pool_stats(&p, &st);
    assert_int_equal(st.free, CONC_BLOCKS);
    assert_int_equal(st.waiters, 0);
    pool_destroy(&p);
}

/* ---- Reclaim ----------------------------------------------------------- */

/* The child allocates three blocks as owner 5 (one with three refs), says
 * which over the pipe, and waits to be killed. */
static int child_hold(int fd, int wr) {
    Pool q;
    Err  err;
    int  b[3];

    if (pool_attach(&q, fd, &err) != 0) return 2;
    for (int i = 0; i < 3; i++) b[i] = pool_alloc(&q, 5, 200 + (i == 2));
    if (b[0] < 0 || b[1] < 0 || b[2] < 0) return 3;
    if (pool_ref(&q, (uint32_t) b[0]) != 0
        || pool_ref(&q, (uint32_t) b[0]) != 0)
    {
        return 4;
    }
    if (write(wr, b, sizeof(b)) != (ssize_t) sizeof(b)) return 5;
    for (;;) pause();
}

static void test_reclaim_killed(void **state) {
    Pool      p = new_pool(NB);
    PoolStats st;
    Waiter    w = { .p = &p, .rc = 99 };
    pthread_t th;
    int       mine = pool_alloc(&p, 0, 100), fds[2], b[3];
    pid_t     pid;

    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_hold(p.fd, fds[1]));
    assert_int_equal(read(fds[0], b, sizeof(b)), sizeof(b));
    assert_int_equal(pool_ref(&p, (uint32_t) b[1]), 0);  // the parent's too
    fill(&p);
    assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
    until_waiters(&p, 1);

    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(reap(pid), -1);
    pool_stats(&p, &st);
    assert_int_equal(st.used, NB);              // death alone frees nothing
    assert_int_equal(pool_reclaim_owner(&p, 5), 3);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, 0);                  // the reclaim woke it
    assert_true(w.waited < 5);
    pool_stats(&p, &st);
    assert_int_equal(st.free, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(POOL_REFS(state_of(&p, (uint32_t) b[i])), 0);
    }
    assert_int_equal(POOL_REFS(state_of(&p, (uint32_t) mine)), 1);
    assert_int_equal(pool_unref(&p, (uint32_t) b[1]), -1);
    assert_int_equal(pool_reclaim_owner(&p, 5), 0);
    close(fds[0]);
    close(fds[1]);
    pool_destroy(&p);
}

static void test_reclaim_request(void **state) {
    Pool p = new_pool(4);
    int  a = pool_alloc(&p, 1, 10), b = pool_alloc(&p, 2, 11);
    int  c = pool_alloc(&p, 3, 10), none = pool_alloc(&p, 1, 0);

    strcpy(pool_block(&p, b), "request 11");
    assert_int_equal(pool_ref(&p, c), 0);
    assert_int_equal(pool_reclaim_request(&p, 10), 2);
    assert_int_equal(POOL_REFS(state_of(&p, a)), 0);
    assert_int_equal(POOL_REFS(state_of(&p, c)), 0);
    assert_int_equal(POOL_REFS(state_of(&p, b)), 1);
    assert_string_equal(pool_block(&p, b), "request 11");
    assert_int_equal(pool_reclaim_request(&p, 10), 0);
    assert_int_equal(pool_reclaim_request(&p, 0), 0);   // 0: no request
    assert_int_equal(POOL_REFS(state_of(&p, none)), 1);

    /* a freed block taken again by request 12 is not request 10's */
    assert_int_equal(pool_alloc(&p, 1, 12), a);
    assert_int_equal(pool_reclaim_request(&p, 10), 0);
    assert_int_equal(pool_reclaim_request(&p, 12), 1);
    assert_int_equal(pool_reclaim_request(&p, 11), 1);
    pool_destroy(&p);
}

/* ---- What attach refuses ----------------------------------------------- */

/* A memfd of size bytes starting with *h, sealed against shrinking when
 * seal is true. The caller closes it. */
static int fake_pool(const PoolHeader *h, size_t size, bool seal) {
    int fd = memfd_create("fake-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t) size), 0);
    if (size >= sizeof(*h)) {
        assert_int_equal(pwrite(fd, h, sizeof(*h), 0), sizeof(*h));
    }
    if (seal) assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return fd;
}

static void expect_refused(int fd, const char *why) {
    Pool p;
    Err  err;

    assert_int_equal(pool_attach(&p, fd, &err), -1);
    if (strstr(err.msg, why) == NULL) fail_msg("\"%s\" lacks \"%s\"",
                                               err.msg, why);
    assert_null(p.hdr);
}

static void test_attach_refuses(void **state) {
    Pool       p = new_pool(NB), q;
    PoolHeader h = *p.hdr;
    Err        err;
    int        fds[2], fd;

    expect_refused(-1, "Bad file descriptor");
    assert_int_equal(pipe(fds), 0);
    expect_refused(fds[0], "not a memfd");
    close(fds[0]);
    close(fds[1]);

    struct { const char *why; size_t size; bool seal; PoolHeader h; } c[] = {
        { "too small",    sizeof(h) - 1, true, h },
        { "bad magic",    p.size, true, h },
        { "version 2",    p.size, true, h },
        { "0 blocks",     p.size, true, h },
        { "blocks of 100 bytes", p.size, true, h },
        { "bytes need",   p.size - BS, true, h },     // truncated
        { "bytes need",   p.size + BS, true, h },
        { "not sealed",   p.size, false, h },
    };
    c[1].h.magic ^= 1;
    c[2].h.version = 2;
    c[3].h.n_blocks = 0;
    c[4].h.block_size = 100;
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        fd = fake_pool(&c[i].h, c[i].size, c[i].seal);
        expect_refused(fd, c[i].why);
        close(fd);
    }

    /* the same header, whole and sealed, is accepted */
    fd = fake_pool(&h, p.size, true);
    assert_int_equal(pool_attach(&q, fd, &err), 0);
    assert_int_equal(q.n_blocks, NB);
    assert_int_equal(q.block_size, BS);
    pool_detach(&q);
    close(fd);

    /* and the real one can be neither shrunk nor grown */
    assert_int_equal(ftruncate(p.fd, (off_t) p.size - BS), -1);
    assert_int_equal(ftruncate(p.fd, (off_t) p.size + BS), -1);
    pool_destroy(&p);
}

static void test_check(void **state) {
    static const PoolRef bad[] = {
        { NB, 0, 1 }, { UINT32_MAX, 0, 0 }, { 0, BS + 1, 0 }, { 0, 1, BS },
        { 0, 1, UINT32_MAX }, { 0, UINT32_MAX, 1 }, { 0, 0, BS + 1 },
    };
    Pool p = new_pool(NB);
    Err  err;

    assert_int_equal(pool_alloc(&p, 1, 1), 0);
    assert_int_equal(pool_check(&p, (PoolRef) { 0, 0, BS }, &err), 0);
    assert_int_equal(pool_check(&p, (PoolRef) { 0, BS, 0 }, &err), 0);
    assert_int_equal(pool_check(&p, (PoolRef) { 0, 100, BS - 100 }, &err),
                     0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(pool_check(&p, bad[i], &err), -1);
        assert_non_null(strstr(err.msg, "pool block "));
    }
    assert_int_equal(pool_check(&p, (PoolRef) { 1, 0, 1 }, &err), -1);
    assert_string_equal(err.msg, "pool block 1 is free");
    pool_destroy(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_refuses),
        cmocka_unit_test(test_alloc_until_full),
        cmocka_unit_test(test_refcount),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_wait_thread),
        cmocka_unit_test(test_wait_process),
        cmocka_unit_test(test_refs_across_fork),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_reclaim_killed),
        cmocka_unit_test(test_reclaim_request),
        cmocka_unit_test(test_attach_refuses),
        cmocka_unit_test(test_check),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}

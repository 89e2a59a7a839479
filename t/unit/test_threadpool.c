/* test_threadpool.c -- every item of every job runs exactly once, whatever
 * the thread count, including jobs smaller than the pool and pools pinned
 * to one CPU (where workers rarely get to run and the caller must finish
 * jobs alone). */

#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "threadpool.h"

#define MAX_ITEMS 257

typedef struct {
    _Atomic int count[MAX_ITEMS];
    _Atomic int bad_ith;
    int         nth;
} Job;

static void bump(void *p, int64_t item, int ith) {
    Job *j = p;

    if (ith < 0 || ith >= j->nth) atomic_fetch_add(&j->bad_ith, 1);
    atomic_fetch_add(&j->count[item], 1);
}

static void run_many(int nth) {
    ThreadPool *tp = tp_new(nth);
    Job        *j = calloc(1, sizeof(*j));
    uint64_t    seed = 1;

    assert_non_null(tp);
    assert_non_null(j);
    assert_int_equal(tp_size(tp), nth);
    j->nth = nth;
    for (int rep = 0; rep < 3000; rep++) {
        int64_t n;

        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        n = 1 + (int64_t) ((seed >> 33) % MAX_ITEMS);
        for (int64_t i = 0; i < n; i++) atomic_store(&j->count[i], 0);
        tp_run(tp, bump, j, n);
        for (int64_t i = 0; i < n; i++) {
            if (atomic_load(&j->count[i]) != 1) {
                fail_msg("nth %d job %d: item %ld ran %d times", nth, rep,
                         (long) i, atomic_load(&j->count[i]));
            }
        }
    }
    assert_int_equal(atomic_load(&j->bad_ith), 0);
    tp_free(tp);
    free(j);
}

static void test_items_once(void **state) {
    (void) state;
    for (int nth = 1; nth <= 5; nth++) run_many(nth);
}

static void test_one_cpu(void **state) {
    cpu_set_t old, one;

    (void) state;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &old)) {
            CPU_SET(c, &one);
            break;
        }
    }
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    run_many(4);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_once),
        cmocka_unit_test(test_one_cpu),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("threadpool", tests, NULL, NULL);
}

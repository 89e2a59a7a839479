/* test_workq.c -- the helper thread of engine/base/workq.c: every job runs once,
 * on the helper thread, and comes back in push order through the done list
 * with the eventfd readable; jobs not started when the queue stops come
 * back not run; the thread's nice value is raised. Also built under
 * ThreadSanitizer (the loop and the thread share the job lists). */

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <cmocka.h>

#include "workq.h"

#define N_JOBS 2000

typedef struct {
    WorkJob          w;             // first
    int              seq;
    int              runs;
    pthread_t        on;            // the thread that ran it
    int              nice;          // its nice value then
    _Atomic int     *gate;          // when set, run waits until *gate
    _Atomic int      started;
} Job;

static void job_run(WorkJob *w) {
    Job *j = (Job *) w;

    atomic_store(&j->started, 1);
    while (j->gate != NULL && atomic_load(j->gate) == 0) usleep(1000);
    j->runs++;
    j->on = pthread_self();
    j->nice = getpriority(PRIO_PROCESS, (id_t) gettid());
}

/* Takes done jobs until n have come back, waiting on the eventfd as an
 * event loop would; checks the order. */
static int collect(WorkQ *q, Job *jobs, int n, int *next_seq) {
    int got = 0;

    while (got < n) {
        struct pollfd p = { q->efd, POLLIN, 0 };

        assert_true(poll(&p, 1, 10000) == 1);
        for (WorkJob *w = workq_done(q); w != NULL; w = w->next) {
            Job *j = (Job *) w;

            assert_ptr_equal(j, &jobs[*next_seq]);
            assert_int_equal(j->seq, *next_seq);
            (*next_seq)++;
            got++;
        }
    }
    return got;
}

static void test_runs_in_order(void **state) {
    WorkQ q;
    Err   err;
    Job  *jobs = calloc(N_JOBS, sizeof(*jobs));
    int   next = 0, base = getpriority(PRIO_PROCESS, 0);

    assert_non_null(jobs);
    assert_int_equal(workq_init(&q, 5, &err), 0);
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i].w.run = job_run;
        jobs[i].seq = i;
        workq_push(&q, &jobs[i].w);
        if (i % 100 == 99) collect(&q, jobs, 50, &next);   // interleaved
    }
    collect(&q, jobs, N_JOBS - next, &next);
    for (int i = 0; i < N_JOBS; i++) {
        assert_int_equal(jobs[i].runs, 1);
        assert_true(jobs[i].w.ran);
        assert_false(pthread_equal(jobs[i].on, pthread_self()));
        assert_int_equal(jobs[i].nice, base + 5 > 19 ? 19 : base + 5);
    }
    assert_null(workq_done(&q));
    workq_stop(&q);
    assert_null(workq_done(&q));
    workq_free(&q);
    free(jobs);
}

static void *open_gate(void *gate) {
    usleep(50000);
    atomic_store((_Atomic int *) gate, 1);
    return NULL;
}

/* The first job holds the thread until after workq_stop was called: the
 * other four come back unrun, in order. */
static void test_stop_returns_pending(void **state) {
    WorkQ        q;
    Err          err;
    Job          jobs[5];
    _Atomic int  gate = 0;
    int          n = 0;
    pthread_t    opener;

    memset(jobs, 0, sizeof(jobs));
    assert_int_equal(workq_init(&q, 0, &err), 0);
    jobs[0].gate = &gate;
    for (int i = 0; i < 5; i++) {
        jobs[i].w.run = job_run;
        jobs[i].seq = i;
        workq_push(&q, &jobs[i].w);
    }
    while (atomic_load(&jobs[0].started) == 0) usleep(1000);
    assert_int_equal(pthread_create(&opener, NULL, open_gate, &gate), 0);
    workq_stop(&q);                     // job 0 ends after this began
    pthread_join(opener, NULL);
    for (WorkJob *w = workq_done(&q); w != NULL; w = w->next) {
        Job *j = (Job *) w;

        assert_ptr_equal(j, &jobs[n]);
        assert_int_equal(w->ran, n == 0);
        assert_int_equal(j->runs, n == 0);
        n++;
    }
    assert_int_equal(n, 5);
    workq_free(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_in_order),
        cmocka_unit_test(test_stop_returns_pending),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("workq", tests, NULL, NULL);
}

/* workq.c -- the helper thread of workq.h.
 *
 * One mutex guards both lists; the thread holds it only to take a job and
 * to hand one back, never while a job runs, so a push from the loop waits
 * at most for a few pointer moves. The eventfd is written after the job is
 * on the done list, so a loop that wakes on it always finds the job (it
 * may find more: one eventfd count per job is not needed, the loop takes
 * the whole list at once). */

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "workq.h"

static void *thread_main(void *arg) {
    WorkQ   *q = arg;
    WorkJob *j;
    uint64_t one = 1;
    int      cur;

    /* Linux keeps a nice value per thread: setpriority on our own tid
       lowers this thread only. Failing to costs fairness, nothing else. */
    if (q->nice != 0) {
        errno = 0;
        cur = getpriority(PRIO_PROCESS, (id_t) gettid());
        if (errno == 0) {
            setpriority(PRIO_PROCESS, (id_t) gettid(), cur + q->nice);
        }
    }
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->todo == NULL && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (q->stop) break;
        j = q->todo;
        q->todo = j->next;
        if (q->todo == NULL) q->todo_tail = NULL;
        pthread_mutex_unlock(&q->mu);

        j->run(j);
        j->ran = true;
        j->next = NULL;

        pthread_mutex_lock(&q->mu);
        if (q->done_tail != NULL) q->done_tail->next = j;
        else q->done = j;
        q->done_tail = j;
        /* cannot fill (2^64 - 2): the loop drains it on every wakeup */
        if (write(q->efd, &one, sizeof(one)) < 0) {}
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int workq_init(WorkQ *q, int nice, Err *err) {
    int rc;

    memset(q, 0, sizeof(*q));
    q->nice = nice;
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->efd < 0) return err_set(err, "eventfd: %s", strerror(errno));
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    rc = pthread_create(&q->th, NULL, thread_main, q);
    if (rc != 0) {
        workq_free(q);
        return err_set(err, "starting a helper thread: %s", strerror(rc));
    }
    q->started = true;
    return 0;
}

void workq_push(WorkQ *q, WorkJob *j) {
    j->next = NULL;
    j->ran = false;
    pthread_mutex_lock(&q->mu);
    if (q->todo_tail != NULL) q->todo_tail->next = j;
    else q->todo = j;
    q->todo_tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

WorkJob *workq_done(WorkQ *q) {
    WorkJob *list;
    uint64_t n;

    if (read(q->efd, &n, sizeof(n)) < 0) {}    // EAGAIN: nothing counted
    pthread_mutex_lock(&q->mu);
    list = q->done;
    q->done = q->done_tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return list;
}

void workq_stop(WorkQ *q) {
    if (!q->started) return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    q->started = false;
    if (q->todo != NULL) {                  // not run: handed back as done
        if (q->done_tail != NULL) q->done_tail->next = q->todo;
        else q->done = q->todo;
        q->done_tail = q->todo_tail;
        q->todo = q->todo_tail = NULL;
    }
}

void workq_free(WorkQ *q) {
    if (q->efd >= 0) close(q->efd);
    q->efd = -1;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

/* membw.c -- memory read bandwidth, the denominator of the decode roofline.
 *
 *   membw [threads] [reps]
 *
 * Each thread streams its share of a 1 GiB buffer (far beyond any last-level
 * cache) summing 64-bit words, which compilers vectorise into wide loads; the
 * sum is kept so the loads cannot be removed. Prints JSON with every
 * repetition and the median in GB/s (1e9 bytes). Reports, never asserts. */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BYTES ((size_t) 1 << 30)

typedef struct {
    const uint64_t *p;
    size_t          n;          // words
    uint64_t        sum;
} Part;

static void *reader(void *arg) {
    Part    *t = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;

    for (size_t i = 0; i + 4 <= t->n; i += 4) {
        s0 += t->p[i];
        s1 += t->p[i + 1];
        s2 += t->p[i + 2];
        s3 += t->p[i + 3];
    }
    t->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int        nth = argc > 1 ? atoi(argv[1]) : 0;
    int        reps = argc > 2 ? atoi(argv[2]) : 5;
    uint64_t  *buf = aligned_alloc(64, BYTES), total = 0;
    double     gbs[64];
    pthread_t  th[256];
    Part       part[256];

    if (nth <= 0) nth = (int) sysconf(_SC_NPROCESSORS_ONLN);
    if (nth > 256) nth = 256;
    if (reps < 1 || reps > 64) reps = 5;
    if (buf == NULL) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    memset(buf, 1, BYTES);
    for (int r = 0; r < reps + 1; r++) {
        size_t words = BYTES / 8, per = words / (size_t) nth;
        double t0 = now_s();

        for (int i = 0; i < nth; i++) {
            part[i] = (Part) { buf + (size_t) i * per, per, 0 };
            pthread_create(&th[i], NULL, reader, &part[i]);
        }
        for (int i = 0; i < nth; i++) {
            pthread_join(th[i], NULL);
            total += part[i].sum;
        }
        if (r > 0) gbs[r - 1] = (double) BYTES / (now_s() - t0) / 1e9;
    }
    printf("{\"threads\": %d, \"bytes\": %zu, \"gb_per_s\": [", nth, BYTES);
    for (int r = 0; r < reps; r++) printf(r ? ", %.2f" : "%.2f", gbs[r]);
    qsort(gbs, (size_t) reps, sizeof(double), cmp);
    printf("], \"median\": %.2f, \"check\": %llu}\n", gbs[reps / 2],
           (unsigned long long) (total & 0xff));
    free(buf);
    return 0;
}

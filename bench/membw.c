/* membw.c -- memory read bandwidth, the denominator of the decode roofline.
 *
 *   membw [threads] [reps]
 *
 * Streams a 1 GiB buffer with membw.h's probe (the one bench_kernels uses,
 * after one warm-up pass). Prints JSON with every
 * repetition and the median in GB/s (1e9 bytes). Reports, never asserts. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "membw.h"

#define BYTES ((size_t) 1 << 30)


static int cmp(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int        nth = argc > 1 ? atoi(argv[1]) : 0;
    int        reps = argc > 2 ? atoi(argv[2]) : 5;
    uint64_t  *buf = aligned_alloc(64, BYTES), total = 0;
    double     gbs[64];

    if (nth <= 0) nth = (int) sysconf(_SC_NPROCESSORS_ONLN);
    if (nth > 64) nth = 64;
    if (reps < 1 || reps > 64) reps = 5;
    if (buf == NULL) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    memset(buf, 1, BYTES);
    for (int r = 0; r < reps + 1; r++) {
        double g = membw_pass(buf, BYTES, nth, &total);

        if (r > 0) gbs[r - 1] = g;
    }
    printf("{\"threads\": %d, \"bytes\": %zu, \"gb_per_s\": [", nth, BYTES);
    for (int r = 0; r < reps; r++) printf(r ? ", %.2f" : "%.2f", gbs[r]);
    qsort(gbs, (size_t) reps, sizeof(double), cmp);
    printf("], \"median\": %.2f, \"check\": %llu}\n", gbs[reps / 2],
           (unsigned long long) (total & 0xff));
    free(buf);
    return 0;
}

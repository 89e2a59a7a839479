/* membw.h -- one memory read bandwidth probe for the benchmarks (membw and
 * bench_kernels): nth threads each stream their share of a buffer far
 * larger than any last-level cache, summing 64-bit words (xor-paired so the
 * compiler emits wide loads and cannot drop them). Header-only: each
 * benchmark is a single program. */

#ifndef OMNI_MEMBW_H
#define OMNI_MEMBW_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t          n;          // words
    uint64_t        sum;
} MembwPart;

static inline void *membw_read(void *arg) {
    MembwPart *a = arg;
    uint64_t   s0 = 0, s1 = 0, s2 = 0, s3 = 0;

    for (size_t i = 0; i + 8 <= a->n; i += 8) {
        s0 += a->p[i] ^ a->p[i + 4];
        s1 += a->p[i + 1] ^ a->p[i + 5];
        s2 += a->p[i + 2] ^ a->p[i + 6];
        s3 += a->p[i + 3] ^ a->p[i + 7];
    }
    a->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* GB/s (1e9 bytes) of one pass over bytes of buf with nth <= 64 threads,
 * the caller being one of them; *sum keeps the loads observable. */
static inline double membw_pass(const uint64_t *buf, size_t bytes, int nth,
                                uint64_t *sum)
{
    size_t          per = bytes / 8 / (size_t) nth;
    pthread_t       th[64];
    MembwPart       a[64];
    struct timespec t0, t1;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < nth; i++) {
        a[i] = (MembwPart) { buf + (size_t) i * per, per, 0 };
        if (i > 0) pthread_create(&th[i], NULL, membw_read, &a[i]);
    }
    membw_read(&a[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < nth; i++) *sum += a[i].sum;
    return (double) (per * 8 * (size_t) nth)
           / ((double) (t1.tv_sec - t0.tv_sec)
              + (double) (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 1e9;
}

#endif

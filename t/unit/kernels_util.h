/* kernels_util.h -- what the two kernel test programs share: the seeded
 * generator, the comparisons (normalized MSE, bit for bit), the instruction
 * sets this build has and the backend for one, and the runner that repeats
 * each case for every set. test_kernels.c tests the matmul path (the
 * conversions it reads, weights, gemm, matmul); test_kernels_ops.c the
 * other kernels (attention, elementwise, norms, rope, swiglu). Header-only,
 * as testutil.h: each test program is one translation unit plus libomni, so
 * each has its own rng_state, which every case seeds. */

#ifndef OMNI_KERNELS_UTIL_H
#define OMNI_KERNELS_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "vec.h"

#define NMSE_F32    1e-10       // f32 arithmetic, different order
#define MAX_TOK     512
#define MAX_COLS    2112        // longer than every table's K block
#define MAX_CTX     640


/* ---- helpers ---- */

static uint64_t rng_state;

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float rng_f(void) {
    return (float) ((double) (rng_next() >> 40) / (double) (1 << 23) - 1.0);
}

static inline void fill(float *x, int64_t n, float amp) {
    for (int64_t i = 0; i < n; i++) x[i] = amp * rng_f();
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);

    assert_non_null(p);
    return p;
}

static inline double nmse(const float *a, const float *b, int64_t n) {
    double num = 0.0, den = 0.0;

    for (int64_t i = 0; i < n; i++) {
        double d = (double) a[i] - (double) b[i];

        num += d * d;
        den += (double) b[i] * b[i];
    }
    return den > 0.0 ? num / den : num;
}

static inline void assert_nmse(const char *what, const float *got,
                               const float *want, int64_t n, double tol)
{
    double e = nmse(got, want, n);

    if (!(e <= tol)) fail_msg("%s: nmse %.3g > %.3g", what, e, tol);
}

static inline void assert_same_bits(const char *what, const void *a,
                                    const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes) != 0) fail_msg("%s: bits differ", what);
}


/* ---- the ISA under test ---- */

typedef struct {
    const char   *isa;
    const CpuVec *vec;
} Isa;

static Isa isas[] = {
    { "ref", &cpu_vec_ref },
#ifdef OMNI_HAVE_AVX2
    { "avx2", &cpu_vec_avx2 },
#endif
#ifdef OMNI_HAVE_AVX512
    { "avx512", &cpu_vec_avx512 },
#endif
#ifdef OMNI_HAVE_NEON
    { "neon", &cpu_vec_neon },
#endif
};

static inline Backend *be_new(const char *isa, int nth) {
    BackendConfig cfg = { .n_threads = nth, .isa = isa,
        .max_tokens = MAX_TOK, .max_cols = MAX_COLS, .max_ctx = MAX_CTX };
    char          err[256];
    Backend      *be = backend_cpu_new(&cfg, err, sizeof(err));

    if (be == NULL) fail_msg("backend_cpu_new(%s): %s", isa, err);
    return be;
}


/* ---- the runner ---- */

static inline void skipped(void **state) {
    (void) state;
}

typedef struct {
    const char      *name;
    CMUnitTestFunction fn;
} Case;

/* Runs every case once per instruction set, as the TAP group named group;
 * a set the CPU or the build lacks is one skip with the reason. Returns
 * cmocka's result. */
static inline int kernels_run(const char *group, const Case *cases,
                              size_t n_cases)
{
    static const char *all[] = { "ref", "avx2", "avx512", "neon" };
    struct CMUnitTest *tests = xmalloc(4 * n_cases * sizeof(*tests));
    char             (*names)[160] = xmalloc(4 * n_cases * sizeof(*names));
    size_t             nt = 0;
    int                rc;

    for (int a = 0; a < 4; a++) {
        BackendConfig cfg = { .n_threads = 1, .isa = all[a],
        .max_tokens = 1, .max_cols = 64, .max_ctx = 1 };
        char          err[128];
        Backend      *be = backend_cpu_new(&cfg, err, sizeof(err));
        Isa          *I = NULL;

        for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
            if (strcmp(isas[i].isa, all[a]) == 0) I = &isas[i];
        }
        if (be == NULL || I == NULL) {
            /* cmocka 1.1.5 prints its own skips as "not ok"; a passing
               test whose name carries the directive is a proper TAP skip */
            snprintf(names[nt], sizeof(names[nt]), "%s kernels # SKIP %s",
                     all[a], be == NULL ? err : "not in this build");
            tests[nt] = (struct CMUnitTest) { names[nt], skipped, NULL,
                                              NULL, NULL };
            nt++;
            if (be != NULL) be->free(be);
            continue;
        }
        be->free(be);
        for (size_t c = 0; c < n_cases; c++) {
            snprintf(names[nt], sizeof(names[nt]), "%s: %s", all[a],
                     cases[c].name);
            tests[nt] = (struct CMUnitTest) { names[nt], cases[c].fn, NULL,
                                              NULL, I };
            nt++;
        }
    }
    cmocka_set_message_output(CM_OUTPUT_TAP);
    rc = _cmocka_run_group_tests(group, tests, nt, NULL, NULL);
    free(tests);
    free(names);
    return rc;
}

#endif

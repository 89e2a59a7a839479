/* test_kernel_set.c -- which CPU kernel set a CPU gets (cpu_kernel_set).
 *
 * The choice takes the CPU's features as an argument, so every kind of
 * CPU is covered here whatever this machine has: "auto" takes the widest
 * set the features allow and always ends at the scalar one; a named set
 * the features do not allow is an error, never a silent substitute. The
 * backend built on this machine must then run the set the choice names
 * for this machine's own features. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"

#define AVX2_SET   (CPU_AVX2 | CPU_FMA | CPU_F16C)
#define AVX512_SET (AVX2_SET | CPU_AVX512F | CPU_AVX512BW | CPU_AVX512VL \
                    | CPU_AVX512DQ | CPU_AVX512VNNI)
#define NEON_SET   (CPU_NEON | CPU_DOTPROD)

#ifdef OMNI_HAVE_AVX512
#define WIDE_512 "avx512"
#else
#define WIDE_512 WIDE_2
#endif
#ifdef OMNI_HAVE_AVX2
#define WIDE_2 "avx2"
#else
#define WIDE_2 "ref"
#endif
/* a build has the x86-64 sets or the aarch64 one, never both */
#ifdef OMNI_HAVE_NEON
#define WIDE_NEON "neon"
#else
#define WIDE_NEON "ref"
#endif
#if defined(OMNI_HAVE_AVX2) || defined(OMNI_HAVE_AVX512)
#define WIDEST WIDE_512
#else
#define WIDEST WIDE_NEON
#endif

static void expect_set(const char *isa, unsigned f, const char *want) {
    char        err[128] = "";
    const char *got = cpu_kernel_set(isa, f, err, sizeof(err));

    if (got == NULL || strcmp(got, want) != 0) {
        fail_msg("isa %s, features 0x%x: got %s (%s), want %s",
                 isa == NULL ? "NULL" : isa, f, got == NULL ? "NULL" : got,
                 err, want);
    }
}

static void expect_refused(const char *isa, unsigned f, const char *msg) {
    char        err[128] = "";
    const char *got = cpu_kernel_set(isa, f, err, sizeof(err));

    if (got != NULL) {
        fail_msg("isa %s, features 0x%x: got %s, want an error", isa, f, got);
    }
    if (strstr(err, msg) == NULL) {
        fail_msg("isa %s, features 0x%x: error '%s' lacks '%s'", isa, f, err,
                 msg);
    }
}

/* "auto" over CPUs from SSE2-only to AVX-512 with VNNI, and each partial
 * set in between; over aarch64 CPUs with and without the dot product
 * (Advanced SIMD itself is part of every aarch64 CPU, but the bit is still
 * checked). */
static void test_auto(void **state) {
    static const struct {
        const char *cpu;
        unsigned    f;
        const char *want;
    } cases[] = {
        { "nothing but SSE2 (x86-64 baseline)", 0,             "ref" },
        { "AVX2 without FMA",          CPU_AVX2 | CPU_F16C,    "ref" },
        { "AVX2 without F16C",         CPU_AVX2 | CPU_FMA,     "ref" },
        { "FMA and F16C, no AVX2",     CPU_FMA | CPU_F16C,     "ref" },
        { "AVX2 + FMA + F16C (Zen 2/3, Alder Lake)", AVX2_SET, WIDE_2 },
        { "AVX-512 without VNNI (Skylake-X)",
          AVX512_SET & ~CPU_AVX512VNNI,                        WIDE_2 },
        { "AVX-512 without BW",  AVX512_SET & ~CPU_AVX512BW,   WIDE_2 },
        { "AVX-512 without F16C", AVX512_SET & ~CPU_F16C,      "ref" },
        { "AVX-512 with VNNI (Ice Lake, Zen 4/5)", AVX512_SET, WIDE_512 },
        { "aarch64, Advanced SIMD only (Cortex-A72, Graviton 1)",
          CPU_NEON,                                            "ref" },
        { "aarch64, dot product without Advanced SIMD", CPU_DOTPROD, "ref" },
        { "aarch64 with the dot product (Neoverse N1, Graviton 2-4)",
          NEON_SET,                                            WIDE_NEON },
        { "every bit set",       ~0u,                          WIDEST },
    };

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        print_message("# %s\n", cases[i].cpu);
        expect_set("auto", cases[i].f, cases[i].want);
        expect_set(NULL, cases[i].f, cases[i].want);
    }
}

/* A named set runs only where the CPU has what it needs. */
static void test_named(void **state) {
    (void) state;
    expect_set("ref", 0, "ref");
    expect_set("ref", AVX512_SET, "ref");
#ifdef OMNI_HAVE_AVX2
    expect_set("avx2", AVX2_SET, "avx2");
    expect_set("avx2", AVX512_SET, "avx2");
    expect_refused("avx2", 0, "needs CPU features this CPU lacks");
    expect_refused("avx2", CPU_AVX2 | CPU_FMA, "lacks");
#else
    expect_refused("avx2", AVX2_SET, "not in this build");
#endif
#ifdef OMNI_HAVE_AVX512
    expect_set("avx512", AVX512_SET, "avx512");
    expect_refused("avx512", AVX2_SET, "needs CPU features this CPU lacks");
    expect_refused("avx512", AVX512_SET & ~CPU_AVX512VNNI, "lacks");
#else
    expect_refused("avx512", AVX512_SET, "not in this build");
#endif
#ifdef OMNI_HAVE_NEON
    expect_set("neon", NEON_SET, "neon");
    expect_set("neon", ~0u, "neon");
    expect_refused("neon", CPU_NEON, "needs CPU features this CPU lacks");
    expect_refused("neon", AVX512_SET, "lacks");
#else
    expect_refused("neon", NEON_SET, "not in this build");
#endif
    expect_refused("sse9", ~0u, "'sse9' is not in this build");
}

/* The backend runs what the choice names for this CPU, and refuses what it
 * refuses. */
static void test_backend_follows(void **state) {
    static const char *isas[] = { "auto", "ref", "avx2", "avx512", "neon" };
    unsigned           f = cpu_features();

    (void) state;
    for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
        BackendConfig cfg = { .n_threads = 1, .isa = isas[i],
        .max_tokens = 1, .max_cols = 64, .max_ctx = 16 };
        char          e1[128] = "", e2[128] = "";
        const char   *want = cpu_kernel_set(isas[i], f, e1, sizeof(e1));
        Backend      *be = backend_cpu_new(&cfg, e2, sizeof(e2));

        if (want == NULL) {
            assert_null(be);
            assert_string_equal(e1, e2);
            continue;
        }
        if (be == NULL) fail_msg("%s: %s", isas[i], e2);
        assert_string_equal(be->name, want);
        print_message("# this CPU: --isa %s runs %s\n", isas[i], be->name);
        be->free(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_named),
        cmocka_unit_test(test_backend_follows),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("kernel_set", tests, NULL, NULL);
}

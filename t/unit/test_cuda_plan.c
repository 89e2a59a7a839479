/* test_cuda_plan.c -- what the CUDA backend decides without a device, and
 * how a backend is chosen:
 *
 *   - the memory budget from --gpu-memory-fraction and what the device
 *     reports (kernels/cuda/plan.c);
 *   - attention's split of a context (pieces of a multiple of 32
 *     positions, at most 32 of them, covering max_ctx);
 *   - the decode-graph cache: a size recorded on its second sighting,
 *     replayed after, keyed by the buffers, least recently used dropped;
 *   - backend_new's choice: "cpu", "cuda" and "auto" against a missing
 *     plugin, a plugin without the entry point, one that finds no device
 *     and one that works (build/t/fake-*.so, t/unit/fake_cuda_plugin.c),
 *     and the real plugin where make built one.
 *
 * Every plugin here is named by OMNI_CUDA_LIB, which backend_new loads
 * without first looking for the driver (that check is for the plugin
 * beside the executable: t/engine/cuda.t sees its "no NVIDIA driver").
 *
 * Runs everywhere: nothing here touches a GPU. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "plan.h"
#include "testutil.h"

#define GIB (1ull << 30)

static char fakes[4096];        /* directory of the fake plugins */


/* ---- Memory ---------------------------------------------------------- */

static void test_budget(void **state) {
    uint64_t b;
    char     err[256];

    (void) state;
    /* 0 is the default 0.9, less the context's reserve */
    assert_int_equal(cuda_plan_budget(140 * GIB, 139 * GIB, 0, &b, err,
                                      sizeof(err)), 0);
    assert_true(b == (uint64_t) (0.9 * (double) (140 * GIB))
                     - CUDA_RESERVE_BYTES);
    assert_int_equal(cuda_plan_budget(80 * GIB, 80 * GIB, 0.5, &b, err,
                                      sizeof(err)), 0);
    assert_true(b == 40 * GIB - CUDA_RESERVE_BYTES);

    /* another process holds memory: the numbers are in the message */
    assert_int_equal(cuda_plan_budget(80 * GIB, 20 * GIB, 0.9, &b, err,
                                      sizeof(err)), -1);
    assert_non_null(strstr(err, "72.0 GiB"));
    assert_non_null(strstr(err, "only 20.0 GiB are free"));
    assert_true(b == 0);

    /* out of range, and too small to hold the context */
    assert_int_equal(cuda_plan_budget(80 * GIB, 80 * GIB, 1.5, &b, err,
                                      sizeof(err)), -1);
    assert_non_null(strstr(err, "at most 1"));
    assert_int_equal(cuda_plan_budget(80 * GIB, 80 * GIB, -0.1, &b, err,
                                      sizeof(err)), -1);
    assert_int_equal(cuda_plan_budget(GIB / 2, GIB / 2, 1.0, &b, err,
                                      sizeof(err)), -1);
    assert_non_null(strstr(err, "CUDA context"));
}

/* ---- Attention ------------------------------------------------------- */

static void test_attn_shape(void **state) {
    static const int64_t ctxs[] = { 1, 255, 256, 257, 4096, 8192, 8193,
                                    10000, 32768, 131072, 1 << 20 };
    int                  chunk, splits;

    (void) state;
    cuda_attn_shape(4096, &chunk, &splits);
    assert_int_equal(chunk, 256);
    assert_int_equal(splits, 16);
    cuda_attn_shape(32768, &chunk, &splits);
    assert_int_equal(chunk, 1024);
    assert_int_equal(splits, 32);
    for (size_t i = 0; i < sizeof(ctxs) / sizeof(ctxs[0]); i++) {
        cuda_attn_shape(ctxs[i], &chunk, &splits);
        assert_true(chunk >= CUDA_ATTN_MIN_CHUNK && chunk % 32 == 0);
        assert_true(splits >= 1 && splits <= CUDA_ATTN_MAX_SPLITS);
        assert_true((int64_t) chunk * splits >= ctxs[i]);
        assert_true((int64_t) chunk * (splits - 1) < ctxs[i]);
    }
    assert_true(cuda_attn_bytes(512, 32, 128, 16)
                == 512ull * 32 * 16 * 130 * 4);
}


/* ---- Decode graphs --------------------------------------------------- */

static GraphAction plan(GraphCache *g, int64_t n, uint64_t bufs, int *slot,
                        bool *evicted)
{
    return graph_plan(g, n, n, bufs, slot, evicted);
}

static void test_graph_sightings(void **state) {
    GraphCache g;
    int        slot, s2;
    bool       ev;

    (void) state;
    graph_cache_init(&g, 64);
    /* prefills and mixed steps never */
    assert_int_equal(graph_plan(&g, 8, 1, 7, &slot, &ev), GRAPH_RUN);
    assert_int_equal(graph_plan(&g, 8, 1, 7, &slot, &ev), GRAPH_RUN);
    assert_int_equal(plan(&g, 65, 7, &slot, &ev), GRAPH_RUN);
    assert_int_equal(plan(&g, 0, 7, &slot, &ev), GRAPH_RUN);
    /* a decode size: run, record, replay */
    assert_int_equal(plan(&g, 4, 7, &slot, &ev), GRAPH_RUN);
    assert_int_equal(slot, -1);
    assert_int_equal(plan(&g, 4, 7, &slot, &ev), GRAPH_CAPTURE);
    assert_false(ev);
    assert_int_equal(plan(&g, 4, 7, &s2, &ev), GRAPH_REPLAY);
    assert_int_equal(s2, slot);
    assert_int_equal(plan(&g, 4, 7, &s2, &ev), GRAPH_REPLAY);
    /* other buffers (another RunState) get their own recording */
    assert_int_equal(plan(&g, 4, 9, &s2, &ev), GRAPH_CAPTURE);
    assert_int_not_equal(s2, slot);
    assert_int_equal(plan(&g, 4, 9, &s2, &ev), GRAPH_REPLAY);
    assert_true(g.captures == 2 && g.replays == 3);

    /* a failed capture is forgotten and earned again */
    graph_drop(&g, slot);
    assert_int_equal(plan(&g, 4, 7, &slot, &ev), GRAPH_RUN);
    assert_int_equal(plan(&g, 4, 7, &slot, &ev), GRAPH_CAPTURE);

    /* graphs off */
    graph_cache_init(&g, 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(plan(&g, 1, 7, &slot, &ev), GRAPH_RUN);
    }
}

static void test_graph_lru(void **state) {
    GraphCache g;
    int        slot, first;
    bool       ev;

    (void) state;
    graph_cache_init(&g, 1000);             /* clamped to MAX_BATCH */
    assert_int_equal(g.max_batch, CUDA_GRAPH_MAX_BATCH);
    for (int n = 1; n <= CUDA_GRAPH_SLOTS; n++) {
        plan(&g, n, 1, &slot, &ev);
        assert_int_equal(plan(&g, n, 1, &slot, &ev), GRAPH_CAPTURE);
        assert_false(ev);
    }
    /* touch size 1 so size 2 is the oldest */
    assert_int_equal(plan(&g, 1, 1, &first, &ev), GRAPH_REPLAY);
    plan(&g, 40, 1, &slot, &ev);
    assert_int_equal(plan(&g, 40, 1, &slot, &ev), GRAPH_CAPTURE);
    assert_true(ev);
    assert_int_equal(g.evictions, 1);
    assert_int_not_equal(slot, first);
    /* size 1 survived, size 2 went and must be seen twice again */
    assert_int_equal(plan(&g, 1, 1, &slot, &ev), GRAPH_REPLAY);
    assert_int_equal(plan(&g, 2, 1, &slot, &ev), GRAPH_RUN);
    assert_int_equal(plan(&g, 2, 1, &slot, &ev), GRAPH_CAPTURE);
    assert_true(ev);
}


/* ---- Choosing a backend ---------------------------------------------- */

static BackendConfig config(const char *backend) {
    BackendConfig c = { .backend = backend, .n_threads = 1, .isa = "ref",
                        .max_tokens = 4, .max_out = 1, .max_cols = 64,
                        .max_ctx = 64, .block_size = 16, .n_heads = 2,
                        .head_dim = 32, .n_vocab = 64 };
    return c;
}

static Backend *choose(const char *backend, const char *lib, char *note,
                       char *err)
{
    BackendConfig c = config(backend);
    Backend      *be;

    setenv("OMNI_CUDA_LIB", lib, 1);
    err[0] = '\0';
    be = backend_new(&c, err, 512);
    strcpy(note, c.note);
    return be;
}

static void test_choice(void **state) {
    char     lib[4200], note[256], err[512];
    Backend *be;

    (void) state;
    /* cpu never looks for the plugin */
    be = choose("cpu", "/nonexistent/omni-cuda.so", note, err);
    assert_non_null(be);
    assert_string_equal(be->name, "ref");
    assert_string_equal(note, "");
    be->free(be);
    assert_null(choose("gpu", "/nonexistent/omni-cuda.so", note, err));
    assert_non_null(strstr(err, "must be auto, cpu or cuda"));

    /* no plugin: cuda fails naming it, auto runs on the CPU and says why */
    assert_null(choose("cuda", "/nonexistent/omni-cuda.so", note, err));
    assert_non_null(strstr(err, "CUDA backend: /nonexistent/omni-cuda.so"));
    assert_non_null(strstr(err, "not found"));
    be = choose("auto", "/nonexistent/omni-cuda.so", note, err);
    assert_non_null(be);
    assert_string_equal(be->name, "ref");
    assert_non_null(strstr(note, "not found"));
    assert_non_null(strstr(note, "running on the CPU"));
    be->free(be);

    /* a library that is not our plugin */
    snprintf(lib, sizeof(lib), "%s/fake-noentry.so", fakes);
    assert_null(choose("cuda", lib, note, err));
    assert_non_null(strstr(err, "has no omni_cuda_backend_new"));

    /* the plugin finds no device */
    setenv("FAKE_CUDA", "nodevice", 1);
    snprintf(lib, sizeof(lib), "%s/fake-cuda.so", fakes);
    assert_null(choose("cuda", lib, note, err));
    assert_string_equal(err, "CUDA backend: no CUDA device (fake)");
    be = choose("auto", lib, note, err);
    assert_non_null(be);
    assert_string_equal(note, "no CUDA backend (no CUDA device (fake)): "
                        "running on the CPU");
    be->free(be);

    /* it does: both cuda and auto take it, silently */
    unsetenv("FAKE_CUDA");
    for (int i = 0; i < 2; i++) {
        be = choose(i ? "auto" : "cuda", lib, note, err);
        assert_non_null(be);
        assert_string_equal(be->name, "fake-cuda");
        assert_string_equal(note, "");
        be->free(be);
    }
}

/* The plugin make built, if it did: on a machine without a device it must
 * say what is missing; with one it comes up. */
static __attribute__((unused)) void test_real_plugin(void **state) {
    char     note[256], err[512];
    Backend *be;
    const char *lib;

    (void) state;
    unsetenv("OMNI_CUDA_LIB");
    use_built_cuda_plugin();
    lib = getenv("OMNI_CUDA_LIB");
    if (lib == NULL) skip();
    be = choose("cuda", lib, note, err);
    if (be != NULL) {
        assert_non_null(strstr(be->name, "cuda-sm_"));
        be->free(be);
        return;
    }
    assert_non_null(strstr(err, "CUDA backend: "));
    assert_true(strstr(err, "driver") != NULL || strstr(err, "device") != NULL
                || strstr(err, "cannot load") != NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_attn_shape),
        cmocka_unit_test(test_graph_sightings),
        cmocka_unit_test(test_graph_lru),
        cmocka_unit_test(test_choice),
#if !defined(__SANITIZE_ADDRESS__)
        /* loading and unloading the real plugin leaves libstdc++'s
           emergency pool behind, which LeakSanitizer reports as a leak:
           only the plain build runs it */
        cmocka_unit_test(test_real_plugin),
#endif
    };
    char    exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char   *slash;

    /* build/t/X finds build/t/fake-*.so; build/asan/t/X too */
    exe[n > 0 ? n : 0] = '\0';
    slash = strrchr(exe, '/');
    if (slash != NULL) *slash = '\0';
    snprintf(fakes, sizeof(fakes), "%s", exe);
    if (strstr(exe, "/asan/t") != NULL || strstr(exe, "/tsan/t") != NULL) {
        snprintf(fakes, sizeof(fakes), "%s/../../t", exe);
    }
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("cuda_plan", tests, NULL, NULL);
}

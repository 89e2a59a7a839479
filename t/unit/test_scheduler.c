/* test_scheduler.c -- continuous batching is exact: every request run
 * through the scheduler, batched with others, cut into chunks, preempted
 * and recomputed, or served from the prefix cache, produces the text and
 * token count that generate.c's single-sequence gen_run produces alone.
 *
 * Everything runs in-process on the real model (stories260K, or
 * $OMNI_MODEL) and the CPU backend; requests arrive at different steps,
 * some before the first. After every scenario the pool must be clean: no
 * sequence running or waiting, no block referenced, every block free or
 * cached. Also: cancels at random points, seeded sampling, and the
 * refusals (prompt too long, empty, bad parameter, full queue). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "generate.h"
#include "kernels.h"
#include "model.h"
#include "scheduler.h"
#include "tokenizer.h"

#define CTX         160         // tokens per sequence: small, so some
                                //   requests fill it
#define BS          16
#define N_REQ       64
#define MAX_IDS     600
#define TEXT_MAX    8192
#define GEN_BATCH   64
#define MAX_BATCH   256         // the largest max_batch_tokens used

static const char *model_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m != NULL && *m != '\0' ? m : "../shared/models/stories260K.gguf";
}


/* ---- Fixture: one model, tokenizer, backend and reference runner ------- */

typedef struct {
    int32_t     toks[CTX + 8];
    int64_t     n;
    int64_t     max_tokens;         // -1: until EOS or the context is full
    const char *stop[STOP_MAX];
    int         n_stop;
    float       temperature;
    uint64_t    seed;
    const char *salt;
    char        ref[TEXT_MAX];      // what gen_run produced alone
    size_t      ref_len;
    int64_t     ref_gen;
    int         ref_finish;         // OmniFinish
} Req;

typedef struct {
    bool     started, done, error;
    char     text[TEXT_MAX];
    size_t   len;
    OmniDone d;
    int      status;
    char     code[64], param[64];
} Result;

typedef struct {
    Model      m;
    Tokenizer *tk;
    Backend   *be;
    Generator  g;
    Req        reqs[N_REQ];         // the mixed set
    Req        shared[N_REQ];       // the long-shared-prefix set
    Result     res[MAX_IDS];
} Fix;

static Fix *fx;

static void encode(const char *text, Req *r) {
    Err err;

    r->n = tokenizer_encode(fx->tk, text, strlen(text), true, false, r->toks,
                            CTX + 8, &err);
    assert_true(r->n > 0 && r->n <= CTX + 8);
}

static int ref_emit(void *ud, TextKind kind, const char *t, size_t n) {
    Req *r = ud;

    assert_int_equal(kind, TEXT_CONTENT);
    assert_true(r->ref_len + n <= TEXT_MAX);
    memcpy(r->ref + r->ref_len, t, n);
    r->ref_len += n;
    return 0;
}

static void req_sampling(const Req *r, SamplerParams *p) {
    sampler_params_default(p);
    p->temperature = r->temperature;
    p->seed = r->seed;
}

/* Runs r alone through generate.c: the answer the scheduler must match. */
static void reference(Req *r) {
    GenParams gp = { 0 };
    GenStats  st;
    Err       err;

    gp.max_tokens = r->max_tokens < 0 ? INT64_MAX : r->max_tokens;
    req_sampling(r, &gp.sampling);
    memcpy(gp.stop, r->stop, sizeof(gp.stop));
    gp.n_stop = r->n_stop;
    r->ref_len = 0;
    if (gen_run(&fx->g, r->toks, r->n, &gp, ref_emit, r, &st, &err) != 0) {
        fail_msg("gen_run: %s", err.msg);
    }
    r->ref_gen = st.n_gen;
    r->ref_finish = strcmp(st.finish, "stop") == 0 ? OMNI_FINISH_STOP
                                                   : OMNI_FINISH_LENGTH;
}

static const char *words[] = {
    "Once", "upon", "a", "time", "there", "was", "little", "girl", "named",
    "Lily", "she", "liked", "to", "play", "in", "the", "park", "with", "her",
    "dog", "one", "day", "they", "found", "big", "red", "ball", "and", "ran",
    "home", "happy", "Tom", "sun", "tree", "bird", "sang", "mom", "said",
};

static uint64_t rng_state = 42;

static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t) (rng_state >> 33) % n;
}

/* A prompt of n_words words after an opening. */
static void random_text(char *buf, size_t cap, const char *open, int n_words)
{
    size_t len = (size_t) snprintf(buf, cap, "%s", open);

    for (int i = 0; i < n_words && len + 16 < cap; i++) {
        const char *w = words[rnd(sizeof(words) / sizeof(words[0]))];

        len += (size_t) snprintf(buf + len, cap - len, "%s%s",
                                 len > 0 ? " " : "", w);
    }
}

/* The mixed set: prompt lengths 1..~100 tokens, max_tokens from 1 to the
 * whole context, a few with stop strings. */
static void make_mixed(void) {
    char text[1024];

    for (int i = 0; i < N_REQ; i++) {
        Req *r = &fx->reqs[i];

        memset(r, 0, sizeof(*r));
        random_text(text, sizeof(text), "", (int) rnd(i % 8 == 0 ? 90 : 30));
        encode(text, r);
        r->max_tokens = i % 9 == 4 ? -1 : 1 + (int64_t) rnd(80);
        if (i % 5 == 2) {
            r->stop[r->n_stop++] = ".";
        } else if (i % 7 == 3) {
            r->stop[r->n_stop++] = "the";
            r->stop[r->n_stop++] = " girl";
        }
        reference(r);
    }
}

/* A long common opening (about 100 tokens), different endings. */
static void make_shared(void) {
    char text[2048];
    char open[1024];

    rng_state = 7;
    random_text(open, sizeof(open), "Once upon a time", 80);
    for (int i = 0; i < N_REQ; i++) {
        Req *r = &fx->shared[i];

        memset(r, 0, sizeof(*r));
        random_text(text, sizeof(text), open, 1 + (int) rnd(12));
        encode(text, r);
        r->max_tokens = 1 + (int64_t) rnd(30);
        reference(r);
    }
}

static int setup(void **state) {
    BackendConfig bc = { 0 };
    char          err[ERR_MAX];
    Err           e;
    int64_t       wide;

    fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    if (model_load(&fx->m, model_path(), GGUF_COPY, &e) != 0) {
        fail_msg("%s", e.msg);
    }
    fx->tk = tokenizer_new(&fx->m.gguf, &e);
    assert_non_null(fx->tk);
    wide = fx->m.c.ffn_dim > fx->m.c.dim ? fx->m.c.ffn_dim : fx->m.c.dim;
    if (wide < (int64_t) fx->m.c.n_heads * fx->m.c.head_dim) {
        wide = (int64_t) fx->m.c.n_heads * fx->m.c.head_dim;
    }
    bc.n_threads = 2;
    bc.isa = "auto";
    bc.max_tokens = MAX_BATCH;
    bc.max_cols = wide;
    bc.max_ctx = CTX;
    fx->be = backend_cpu_new(&bc, err, sizeof(err));
    if (fx->be == NULL) fail_msg("%s", err);
    model_repack(&fx->m, fx->be);
    if (gen_init(&fx->g, &fx->m, fx->tk, fx->be, CTX, GEN_BATCH, &e) != 0) {
        fail_msg("%s", e.msg);
    }
    make_mixed();
    make_shared();
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    gen_free(&fx->g);
    fx->be->free(fx->be);
    tokenizer_free(fx->tk);
    model_free(&fx->m);
    free(fx);
    return 0;
}


/* ---- Events into results ------------------------------------------------ */

static Result *result(uint64_t id) {
    assert_true(id >= 1 && id < MAX_IDS);
    return &fx->res[id];
}

static void on_started(void *ud, uint64_t id) {
    Result *r = result(id);

    assert_false(r->started);
    r->started = true;
}

static void on_text(void *ud, uint64_t id, bool reasoning, const char *s,
                    size_t n)
{
    Result *r = result(id);

    assert_true(r->started && !r->done && n > 0);
    assert_false(reasoning);                // no thinking template here
    assert_true(r->len + n <= TEXT_MAX);
    memcpy(r->text + r->len, s, n);
    r->len += n;
}

static void on_done(void *ud, uint64_t id, const OmniDone *d) {
    Result *r = result(id);

    assert_true(r->started && !r->done && !r->error);
    r->done = true;
    r->d = *d;
}

static void on_error(void *ud, uint64_t id, int status, const char *type,
                     const char *param, const char *code, const char *msg)
{
    Result *r = result(id);

    assert_false(r->done || r->error);
    assert_non_null(type);
    assert_non_null(msg);
    r->error = true;
    r->status = status;
    snprintf(r->code, sizeof(r->code), "%s", code != NULL ? code : "");
    snprintf(r->param, sizeof(r->param), "%s", param != NULL ? param : "");
}

static Scheduler *make_sched(int64_t n_blocks, int max_seqs,
                             int64_t max_batch, bool prefix, int max_queue,
                             OmniStats *stats)
{
    SchedConfig c = {
        .max_batch_tokens = max_batch, .max_seqs = max_seqs,
        .max_queue = max_queue, .block_size = BS, .n_blocks = n_blocks,
        .max_ctx = CTX, .prefix_cache = prefix,
    };
    SchedEvents ev = { NULL, on_started, on_text, on_done, on_error };
    Scheduler  *s;
    Err         err;

    memset(fx->res, 0, sizeof(fx->res));
    s = sched_new(&fx->m, fx->tk, fx->be, &c, &ev, stats, &err);
    if (s == NULL) fail_msg("sched_new: %s", err.msg);
    return s;
}

static int submit(Scheduler *s, uint64_t id, const Req *r) {
    SeqParams p = { 0 };

    p.max_tokens = r->max_tokens;
    req_sampling(r, &p.sampling);
    memcpy(p.stop, r->stop, sizeof(p.stop));
    p.n_stop = r->n_stop;
    p.cache_salt = r->salt;
    p.cache_salt_len = r->salt != NULL ? strlen(r->salt) : 0;
    return sched_submit(s, id, r->toks, r->n, &p);
}

/* Nothing running or waiting, no block referenced: every block is free or
 * cached. */
static void check_clean(Scheduler *s, int64_t n_blocks) {
    SchedCounts c;

    assert_true(sched_idle(s));
    sched_counts(s, &c);
    assert_int_equal(c.running, 0);
    assert_int_equal(c.waiting, 0);
    assert_int_equal(c.blocks_used, 0);
    assert_int_equal(c.blocks_free + c.blocks_cached, n_blocks);
}

static void check_same(uint64_t id, const Req *r) {
    Result *res = result(id);

    assert_true(res->done);
    if (res->len != r->ref_len || memcmp(res->text, r->ref, r->ref_len) != 0
        || res->d.completion_tokens != r->ref_gen
        || res->d.finish != r->ref_finish)
    {
        fail_msg("request %d: batched %u tokens (finish %d) \"%.*s\", alone "
                 "%d tokens (finish %d) \"%.*s\"", (int) id,
                 res->d.completion_tokens, res->d.finish, (int) res->len,
                 res->text, (int) r->ref_gen, r->ref_finish,
                 (int) r->ref_len, r->ref);
    }
    assert_int_equal(res->d.prompt_tokens, r->n);
}

/* Runs the requests, request i (id i + 1) arriving before step arrive[i];
 * steps until everything is done. Returns the steps taken. */
static int run_all(Scheduler *s, const Req *reqs, const int *arrive, int n)
{
    int step = 0, left = n;

    while (left > 0 || !sched_idle(s)) {
        for (int i = 0; i < n; i++) {
            if (arrive[i] != step) continue;
            assert_int_equal(submit(s, (uint64_t) i + 1, &reqs[i]), 0);
            left--;
        }
        sched_step(s);
        assert_true(++step < 100000);
    }
    return step;
}

/* A quarter before the first step, the rest while others run. */
static void arrivals(int *arrive, int n) {
    for (int i = 0; i < n; i++) arrive[i] = i < n / 4 ? 0 : (int) rnd(60);
}

static void batch_exact(int64_t n_blocks, int max_seqs, int64_t max_batch,
                        bool prefix, bool want_preempt)
{
    OmniStats   st = { .magic = STATS_MAGIC };
    int         arrive[N_REQ];
    Scheduler  *s = make_sched(n_blocks, max_seqs, max_batch, prefix, 1024,
                               &st);
    SchedCounts c;
    int         steps;

    arrivals(arrive, N_REQ);
    steps = run_all(s, fx->reqs, arrive, N_REQ);
    for (int i = 0; i < N_REQ; i++) check_same((uint64_t) i + 1, &fx->reqs[i]);
    check_clean(s, n_blocks);
    sched_counts(s, &c);
    if (want_preempt) assert_true(c.preemptions > 0);
    assert_int_equal(st.requests_running, 0);
    assert_int_equal(st.thinker.kv_blocks_used, 0);
    assert_int_equal(st.thinker.steps, (uint64_t) steps);
    print_message("# blocks %d, max_seqs %d, budget %d, prefix %d: %d steps, "
                  "%.1f tokens/step, %d preemptions\n", (int) n_blocks,
                  max_seqs, (int) max_batch, prefix, steps,
                  (double) st.thinker.step_tokens / (double) st.thinker.steps,
                  (int) c.preemptions);
    sched_free(s);
}


/* ---- Tests -------------------------------------------------------------- */

static void test_batch_prefix_cache(void **state) {
    batch_exact(64 * 10, 64, 256, true, false);
}

static void test_batch_no_prefix_cache(void **state) {
    batch_exact(64 * 10, 64, 256, false, false);
}

/* 12 blocks: little more than one full context (10), for 16 sequences. */
static void test_batch_preemption(void **state) {
    batch_exact(12, 16, 64, true, true);
    batch_exact(12, 16, 64, false, true);
}

/* Small budget: every prompt is cut into many chunks. */
static void test_batch_small_budget(void **state) {
    batch_exact(64 * 10, 8, 8, true, false);
}

static int64_t lcp(const Req *a, const Req *b) {
    int64_t i = 0;

    while (i < a->n && i < b->n && a->toks[i] == b->toks[i]) i++;
    return i;
}

/* The first request runs alone; the others share its long opening, so
 * each finds at least those full blocks cached, and their outputs equal
 * cold runs. A different salt shares nothing. */
static void test_shared_prefix(void **state) {
    OmniStats  st = { .magic = STATS_MAGIC };
    int        arrive[N_REQ];
    Scheduler *s = make_sched(64 * 10, 32, 128, true, 1024, &st);
    uint64_t   hits = 0, prompt = 0, gen = 0;
    Req        salted = fx->shared[0];

    for (int i = 0; i < N_REQ; i++) arrive[i] = i == 0 ? 0 : 20 + (int) rnd(40);
    run_all(s, fx->shared, arrive, N_REQ);
    assert_int_equal(result(1)->d.cached_tokens, 0);
    for (int i = 0; i < N_REQ; i++) {
        const Req *r = &fx->shared[i];
        Result    *res = result((uint64_t) i + 1);
        int64_t    common = lcp(r, &fx->shared[0]);

        if (common > r->n - 1) common = r->n - 1;
        check_same((uint64_t) i + 1, r);
        if (i > 0) assert_true(res->d.cached_tokens >= common / BS * BS);
        assert_true(res->d.cached_tokens < res->d.prompt_tokens);
        assert_true(res->d.cached_tokens % BS == 0);
        hits += res->d.cached_tokens;
        prompt += res->d.prompt_tokens;
        gen += res->d.completion_tokens;
    }
    assert_true(hits > (uint64_t) 50 * N_REQ);
    assert_int_equal(st.thinker.prefix_cache_hits, hits);
    assert_int_equal(st.thinker.prefix_cache_queries, prompt);
    assert_int_equal(st.thinker.prompt_tokens, prompt);
    assert_int_equal(st.thinker.generation_tokens, gen);
    check_clean(s, 64 * 10);

    salted.salt = "tenant-7";
    memset(result(1), 0, sizeof(Result));
    assert_int_equal(submit(s, 1, &salted), 0);
    while (!sched_idle(s)) sched_step(s);
    check_same(1, &salted);
    assert_int_equal(result(1)->d.cached_tokens, 0);
    check_clean(s, 64 * 10);
    sched_free(s);
}

/* 500 requests over the mixed set, half cancelled at random points
 * (queued or running); the rest still equal their references, and the
 * pool ends clean. */
static void test_cancel(void **state) {
    enum { N = 500 };
    Scheduler *s = make_sched(40, 16, 64, true, 1024, NULL);
    bool       gone[N + 1] = { false };
    int        next = 0, n_cancel = 0;

    while (next < N || !sched_idle(s)) {
        for (int k = 0; k < 4 && next < N; k++, next++) {
            assert_int_equal(submit(s, (uint64_t) next + 1,
                                    &fx->reqs[next % N_REQ]), 0);
        }
        for (int k = 0; k < 3; k++) {
            int id = 1 + (int) rnd((uint32_t) next);

            if (gone[id] || result((uint64_t) id)->done || rnd(2)) continue;
            sched_cancel(s, (uint64_t) id);
            gone[id] = true;
            n_cancel++;
        }
        sched_step(s);
    }
    sched_cancel(s, 99999);     // unknown: ignored
    for (int id = 1; id <= N; id++) {
        if (!gone[id]) check_same((uint64_t) id, &fx->reqs[(id - 1) % N_REQ]);
        else assert_false(result((uint64_t) id)->done);
    }
    print_message("# %d of %d cancelled\n", n_cancel, N);
    assert_true(n_cancel > N / 4);
    check_clean(s, 40);
    sched_free(s);
}

/* Temperature 0.8 with a seed per request: the same draws in a batch as
 * alone. */
static void test_seeded_sampling(void **state) {
    enum { N = 32 };
    static Req reqs[N];
    int        arrive[N];
    Scheduler *s;

    for (int i = 0; i < N; i++) {
        reqs[i] = fx->reqs[i];
        reqs[i].temperature = 0.8f;
        reqs[i].seed = 1000 + (uint64_t) i;
        reference(&reqs[i]);
    }
    s = make_sched(64 * 10, 16, 64, true, 1024, NULL);
    arrivals(arrive, N);
    run_all(s, reqs, arrive, N);
    for (int i = 0; i < N; i++) check_same((uint64_t) i + 1, &reqs[i]);
    check_clean(s, 64 * 10);
    sched_free(s);
}

static void test_refusals(void **state) {
    Scheduler *s = make_sched(64 * 10, 4, 64, true, 4, NULL);
    Req        r = fx->reqs[0];
    SeqParams  p = { 0 };
    int32_t    toks[CTX];

    /* the prompt fills the context: no room to generate */
    for (int i = 0; i < CTX; i++) toks[i] = 100 + i % 50;
    sampler_params_default(&p.sampling);
    p.max_tokens = 4;
    assert_int_equal(sched_submit(s, 1, toks, CTX, &p), -1);
    assert_true(result(1)->error);
    assert_int_equal(result(1)->status, 400);
    assert_string_equal(result(1)->code, "context_length_exceeded");
    assert_string_equal(result(1)->param, "messages");
    assert_int_equal(sched_submit(s, 2, toks, CTX - 1, &p), 0);

    assert_int_equal(sched_submit(s, 3, toks, 0, &p), -1);
    assert_int_equal(result(3)->status, 400);

    p.sampling.top_p = 0;
    assert_int_equal(sched_submit(s, 4, toks, 8, &p), -1);
    assert_int_equal(result(4)->status, 400);
    assert_string_equal(result(4)->param, "top_p");
    p.sampling.top_p = 1;
    p.stop[0] = "";
    p.n_stop = 1;
    assert_int_equal(sched_submit(s, 5, toks, 8, &p), -1);
    assert_string_equal(result(5)->param, "stop");
    p.n_stop = 0;
    p.max_tokens = 0;
    assert_int_equal(sched_submit(s, 6, toks, 8, &p), -1);
    assert_string_equal(result(6)->param, "max_tokens");

    /* queue of 4: 2 and three more fill it, the next is refused */
    for (int id = 7; id <= 9; id++) assert_int_equal(submit(s, id, &r), 0);
    assert_int_equal(submit(s, 10, &r), -1);
    assert_int_equal(result(10)->status, 503);
    assert_string_equal(result(10)->code, "overloaded");
    for (int id = 1; id <= 10; id++) {
        assert_false(result((uint64_t) id)->started);
    }

    /* after a step they are admitted and the queue has room again */
    sched_step(s);
    assert_int_equal(submit(s, 11, &r), 0);
    sched_abort_all(s, "stopping");
    for (int id = 7; id <= 11; id++) {
        if (id == 10) continue;             // refused above
        assert_true(result((uint64_t) id)->error);
        assert_int_equal(result((uint64_t) id)->status, 503);
        assert_string_equal(result((uint64_t) id)->code, "engine_shutdown");
    }
    check_clean(s, 64 * 10);
    sched_free(s);
}

static void test_bad_config(void **state) {
    SchedConfig c = {
        .max_batch_tokens = 4, .max_seqs = 8, .max_queue = 4,
        .block_size = BS, .n_blocks = 64, .max_ctx = CTX, .prefix_cache = 1,
    };
    SchedEvents ev = { 0 };
    Err         err;

    assert_null(sched_new(&fx->m, fx->tk, fx->be, &c, &ev, NULL, &err));
    assert_non_null(strstr(err.msg, "max_batch_tokens"));
    c.max_batch_tokens = 8;
    c.n_blocks = CTX / BS - 1;
    assert_null(sched_new(&fx->m, fx->tk, fx->be, &c, &ev, NULL, &err));
    assert_non_null(strstr(err.msg, "blocks"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_prefix_cache),
        cmocka_unit_test(test_batch_no_prefix_cache),
        cmocka_unit_test(test_batch_preemption),
        cmocka_unit_test(test_batch_small_budget),
        cmocka_unit_test(test_shared_prefix),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_seeded_sampling),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_bad_config),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("scheduler", tests, setup, teardown);
}

/* test_sampler.c -- next-token sampling (engine/llm/sampler.c).
 *
 * Draw counts come from fixed seeds, so every statistical bound below is
 * deterministic: a chi-square bound that passes once passes forever. The
 * large-vocabulary cases check the heap selection and the adaptive top-p
 * prefix against a reference that sorts the whole vocabulary with qsort. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sampler.h"

#define N_BIG   150000      // a Qwen-sized vocabulary
#define DRAWS   100000


/* ---- helpers ---- */

static void init_ok(Sampler *s, const SamplerParams *p, int32_t n_vocab) {
    Err err;

    if (sampler_init(s, p, n_vocab, &err) != 0) fail_msg("%s", err.msg);
}

/* Samples from a copy of logits (sampler_sample modifies its input). */
static int32_t sample_copy(Sampler *s, const float *logits, int32_t n) {
    float buf[64];

    assert_true(n <= 64);
    memcpy(buf, logits, (size_t) n * sizeof(float));
    return sampler_sample(s, buf);
}

/* Draws DRAWS tokens without penalties and counts them. */
static void histogram(const SamplerParams *p, const float *logits, int32_t n,
                      int *counts) {
    Sampler s;

    init_ok(&s, p, n);
    memset(counts, 0, (size_t) n * sizeof(int));
    for (int i = 0; i < DRAWS; i++) counts[sample_copy(&s, logits, n)]++;
    sampler_free(&s);
}

/* Pearson's chi-square of counts against probabilities prob (zeros must
 * never be drawn). */
static double chi_square(const int *counts, const double *prob, int32_t n) {
    double chi = 0.0;

    for (int32_t i = 0; i < n; i++) {
        double e = prob[i] * DRAWS, d = counts[i] - e;

        if (prob[i] == 0.0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        chi += d * d / e;
    }
    return chi;
}

static void log_probs(const double *prob, float *logits, int32_t n) {
    for (int32_t i = 0; i < n; i++) logits[i] = (float) log(prob[i]);
}

/* Expects a -1 whose message starts with "param:". */
static void expect_bad(const SamplerParams *p, const char *param) {
    Sampler s;
    Err     err;
    size_t  n = strlen(param);

    assert_int_equal(sampler_init(&s, p, 1000, &err), -1);
    if (strncmp(err.msg, param, n) != 0 || err.msg[n] != ':') {
        fail_msg("expected an error naming %s, got \"%s\"", param, err.msg);
    }
    assert_null(s.counts);
}

static void fill_random(float *logits, int32_t n, unsigned seed, float scale) {
    for (int32_t i = 0; i < n; i++) {
        logits[i] = scale * ((float) rand_r(&seed) / (float) RAND_MAX);
    }
}


/* ---- reference for large vocabularies ---- */

static const float *ref_logits;

static int by_logit(const void *a, const void *b) {
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;

    if (ref_logits[x] != ref_logits[y]) {
        return ref_logits[x] > ref_logits[y] ? -1 : 1;
    }
    return x < y ? -1 : 1;
}

/* rank[id] = position of id in the full best-first order. */
static void ref_rank(const float *logits, int32_t n, int32_t *order,
                     int32_t *rank) {
    for (int32_t i = 0; i < n; i++) order[i] = i;
    ref_logits = logits;
    qsort(order, (size_t) n, sizeof(*order), by_logit);
    for (int32_t i = 0; i < n; i++) rank[order[i]] = i;
}

/* Length of the top-p nucleus of the best-first order, computed as the
 * sampler defines it (softmax before temperature, float terms). */
static int32_t ref_nucleus(const float *logits, const int32_t *order,
                           int32_t n, float top_p) {
    float  max = logits[order[0]];
    double sum = 0.0, cum = 0.0;

    for (int32_t i = 0; i < n; i++) sum += expf(logits[order[i]] - max);
    for (int32_t i = 0; i < n; i++) {
        cum += expf(logits[order[i]] - max) / sum;
        if (cum >= top_p) return i + 1;
    }
    return n;
}


/* ---- parameters ---- */

static void test_defaults(void **state) {
    SamplerParams p;

    memset(&p, 0xff, sizeof(p));
    sampler_params_default(&p);
    assert_true(p.temperature == 1.0f);
    assert_true(p.top_p == 1.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.min_p == 0.0f);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_int_equal(p.seed, 0);
    assert_int_equal(p.n_bias, 0);
}

static void test_invalid_params(void **state) {
    static const struct { const char *param; float v; } floats[] = {
        { "temperature", -0.01f }, { "temperature", 2.01f },
        { "temperature", NAN },    { "top_p", 0.0f },
        { "top_p", 1.01f },        { "top_p", -1.0f },
        { "top_p", NAN },          { "min_p", -0.1f },
        { "min_p", 1.1f },         { "presence_penalty", 2.5f },
        { "presence_penalty", -2.01f }, { "frequency_penalty", 3.0f },
        { "frequency_penalty", -2.5f }, { "frequency_penalty", NAN },
    };
    SamplerParams p;

    for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
        const char *name = floats[i].param;

        sampler_params_default(&p);
        if (strcmp(name, "temperature") == 0) p.temperature = floats[i].v;
        if (strcmp(name, "top_p") == 0) p.top_p = floats[i].v;
        if (strcmp(name, "min_p") == 0) p.min_p = floats[i].v;
        if (strcmp(name, "presence_penalty") == 0) {
            p.presence_penalty = floats[i].v;
        }
        if (strcmp(name, "frequency_penalty") == 0) {
            p.frequency_penalty = floats[i].v;
        }
        expect_bad(&p, name);
    }

    sampler_params_default(&p);
    p.top_k = -1;
    expect_bad(&p, "top_k");

    sampler_params_default(&p);
    p.n_bias = 1;
    p.bias[0] = (LogitBias) { -1, 1.0f };
    expect_bad(&p, "logit_bias");
    p.bias[0] = (LogitBias) { 1000, 1.0f };            /* n_vocab is 1000 */
    expect_bad(&p, "logit_bias");
    p.bias[0] = (LogitBias) { 5, 100.5f };
    expect_bad(&p, "logit_bias");
    p.bias[0] = (LogitBias) { 5, -101.0f };
    expect_bad(&p, "logit_bias");
    p.bias[0] = (LogitBias) { 5, NAN };
    expect_bad(&p, "logit_bias");
    p.n_bias = SAMPLER_MAX_BIAS + 1;
    expect_bad(&p, "logit_bias");
    p.n_bias = -1;
    expect_bad(&p, "logit_bias");
}

static void test_boundary_params_accepted(void **state) {
    SamplerParams p;
    Sampler       s;
    Err           err;

    sampler_params_default(&p);
    p.temperature = 2.0f;
    p.top_p = 1.0f;
    p.top_k = 5000;                     /* more than the vocabulary: off */
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.n_bias = SAMPLER_MAX_BIAS;
    for (int i = 0; i < SAMPLER_MAX_BIAS; i++) {
        p.bias[i] = (LogitBias) { i, i % 2 ? 100.0f : -100.0f };
    }
    init_ok(&s, &p, 1000);
    sampler_free(&s);
    sampler_free(&s);                   /* idempotent */

    p.temperature = 0.0f;
    p.top_p = 0.0001f;
    p.min_p = 0.0f;
    init_ok(&s, &p, 1000);
    sampler_free(&s);

    assert_int_equal(sampler_init(&s, &p, 0, &err), -1);
    assert_non_null(strstr(err.msg, "vocabulary"));
}

static void test_set_params(void **state) {
    SamplerParams p, bad;
    Sampler       s;
    Err           err;
    float         logits[8] = { 0 };
    int32_t       first[20];

    sampler_params_default(&p);
    p.seed = 7;
    init_ok(&s, &p, 8);
    for (int i = 0; i < 20; i++) first[i] = sample_copy(&s, logits, 8);
    sampler_accept(&s, 3);

    /* a bad update fails and changes nothing */
    bad = p;
    bad.top_p = 0.0f;
    assert_int_equal(sampler_set_params(&s, &bad, &err), -1);
    assert_string_equal(err.msg, "top_p: must be in (0, 1], got 0");
    assert_int_equal(s.counts[3], 1);

    /* a good one reseeds and clears the counts */
    assert_int_equal(sampler_set_params(&s, &p, &err), 0);
    assert_int_equal(s.counts[3], 0);
    assert_int_equal(s.n_seen, 0);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(sample_copy(&s, logits, 8), first[i]);
    }
    sampler_free(&s);
}


/* ---- greedy ---- */

static void test_greedy(void **state) {
    float         logits[6] = { 0.5f, 2.0f, -1.0f, 3.0f, 3.0f, 1.0f };
    SamplerParams p;
    Sampler       s;

    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.top_k = 2;                        /* ignored when greedy */
    p.top_p = 0.1f;
    init_ok(&s, &p, 6);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(sample_copy(&s, logits, 6), 3);  /* lowest of tie */
    }
    logits[1] = 3.5f;
    assert_int_equal(sample_copy(&s, logits, 6), 1);
    /* NaN never wins, at id 0 either (as the CUDA argmax); all NaN: 0 */
    logits[0] = NAN;
    logits[1] = NAN;
    assert_int_equal(sample_copy(&s, logits, 6), 3);
    for (int i = 0; i < 6; i++) logits[i] = NAN;
    assert_int_equal(sample_copy(&s, logits, 6), 0);
    sampler_free(&s);
}

static void test_top_k_1_is_greedy(void **state) {
    static const float temps[] = { 0.05f, 0.7f, 1.0f, 2.0f };
    SamplerParams      p;
    Sampler            s;
    float              logits[64];

    for (size_t t = 0; t < sizeof(temps) / sizeof(temps[0]); t++) {
        sampler_params_default(&p);
        p.temperature = temps[t];
        p.top_k = 1;
        p.seed = t;
        init_ok(&s, &p, 64);
        for (unsigned trial = 0; trial < 200; trial++) {
            int32_t best = 0;

            fill_random(logits, 64, trial, 4.0f);
            if (trial % 2) logits[40] = logits[17] = 9.0f;   /* a tie */
            for (int32_t i = 1; i < 64; i++) {
                if (logits[i] > logits[best]) best = i;
            }
            assert_int_equal(sample_copy(&s, logits, 64), best);
        }
        sampler_free(&s);
    }
}


/* ---- seeds ---- */

static void test_seed_reproducible(void **state) {
    SamplerParams p;
    Sampler       a, b, c;
    float         logits[32] = { 0 };
    int           differ = 0;

    sampler_params_default(&p);
    p.seed = 42;
    init_ok(&a, &p, 32);
    init_ok(&b, &p, 32);
    p.seed = 43;
    init_ok(&c, &p, 32);
    for (int i = 0; i < 1000; i++) {
        int32_t x = sample_copy(&a, logits, 32);

        assert_int_equal(x, sample_copy(&b, logits, 32));
        differ += x != sample_copy(&c, logits, 32);
    }
    /* two independent uniform streams over 32 tokens agree ~1/32 */
    assert_true(differ > 900);

    /* reset replays the same stream */
    sampler_reset(&b);
    sampler_free(&c);
    p.seed = 42;
    init_ok(&c, &p, 32);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(sample_copy(&b, logits, 32),
                         sample_copy(&c, logits, 32));
    }
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
}

/* One RNG draw per sample, whatever survives the filters, so two samplers
 * with the same seed stay in step even when their filters differ. */
static void test_one_draw_per_sample(void **state) {
    SamplerParams p;
    Sampler       a, b;
    float         logits[16];

    fill_random(logits, 16, 3, 2.0f);
    sampler_params_default(&p);
    p.seed = 99;
    init_ok(&a, &p, 16);
    p.top_k = 1;
    p.min_p = 0.5f;
    init_ok(&b, &p, 16);
    for (int i = 0; i < 50; i++) {
        sample_copy(&a, logits, 16);
        sample_copy(&b, logits, 16);
    }
    assert_memory_equal(a.rng, b.rng, sizeof(a.rng));
    sampler_free(&a);
    sampler_free(&b);
}


/* ---- distributions ---- */

static void test_distribution(void **state) {
    double        prob[5] = { 0.4, 0.25, 0.2, 0.1, 0.05 };
    float         logits[5];
    int           counts[5];
    SamplerParams p;

    log_probs(prob, logits, 5);
    sampler_params_default(&p);
    p.seed = 1;
    histogram(&p, logits, 5, counts);
    /* df = 4: P(chi2 > 25) < 1e-4 */
    assert_true(chi_square(counts, prob, 5) < 25.0);
}

static void test_temperature(void **state) {
    double        prob[4] = { 0.4, 0.3, 0.2, 0.1 }, want[4], sum = 0.0;
    float         logits[4];
    int           counts[4];
    SamplerParams p;

    log_probs(prob, logits, 4);
    sampler_params_default(&p);

    /* T = 0.5 squares the probabilities (then renormalises) */
    for (int i = 0; i < 4; i++) sum += prob[i] * prob[i];
    for (int i = 0; i < 4; i++) want[i] = prob[i] * prob[i] / sum;
    p.temperature = 0.5f;
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, want, 4) < 25.0);

    /* T = 2 takes square roots: flatter */
    sum = 0.0;
    for (int i = 0; i < 4; i++) sum += sqrt(prob[i]);
    for (int i = 0; i < 4; i++) want[i] = sqrt(prob[i]) / sum;
    p.temperature = 2.0f;
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, want, 4) < 25.0);
}

static void test_top_k(void **state) {
    double        prob[5] = { 0.1, 0.4, 0.05, 0.3, 0.15 };
    double        want[5] = { 0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85 };
    float         logits[5];
    int           counts[5];
    SamplerParams p;

    log_probs(prob, logits, 5);
    sampler_params_default(&p);
    p.top_k = 3;
    p.seed = 5;
    histogram(&p, logits, 5, counts);
    assert_true(chi_square(counts, want, 5) < 25.0);
}

/* top-p and min-p judge the probabilities before temperature. */
static void test_top_p_min_p(void **state) {
    double        prob[4] = { 0.15, 0.5, 0.05, 0.3 };
    double        two[4] = { 0, 0.5 / 0.8, 0, 0.3 / 0.8 };
    double        three[4] = { 0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95 };
    float         logits[4];
    int           counts[4];
    SamplerParams p;

    log_probs(prob, logits, 4);
    sampler_params_default(&p);
    p.top_p = 0.75f;                    /* 0.5 + 0.3 */
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, two, 4) < 25.0);
    p.top_p = 0.85f;                    /* 0.5 + 0.3 + 0.15 */
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, three, 4) < 25.0);

    /* at T = 2 the same three survive, flattened */
    p.temperature = 2.0f;
    histogram(&p, logits, 4, counts);
    assert_int_equal(counts[2], 0);
    assert_true(counts[0] > DRAWS / 5);

    /* close probabilities share one logit bucket: the edge is sorted */
    {
        double close[4] = { 0.251, 0.247, 0.250, 0.252 };
        double want[4] = { 0.251 / 0.753, 0, 0.250 / 0.753, 0.252 / 0.753 };
        double tie[4] = { 0.5, 0.5, 0, 0 };

        log_probs(close, logits, 4);
        sampler_params_default(&p);
        p.top_p = 0.6f;
        histogram(&p, logits, 4, counts);
        assert_true(chi_square(counts, want, 4) < 25.0);

        /* equal logits: the lowest ids make the nucleus */
        for (int i = 0; i < 4; i++) logits[i] = 0.0f;
        p.top_p = 0.5f;
        histogram(&p, logits, 4, counts);
        assert_true(chi_square(counts, tie, 4) < 25.0);
        log_probs(prob, logits, 4);
    }

    sampler_params_default(&p);
    p.min_p = 0.5f;                     /* p >= 0.25 */
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, two, 4) < 25.0);
    p.min_p = 0.25f;                    /* p >= 0.125 */
    histogram(&p, logits, 4, counts);
    assert_true(chi_square(counts, three, 4) < 25.0);
    p.min_p = 1.0f;                     /* only the best */
    histogram(&p, logits, 4, counts);
    assert_int_equal(counts[1], DRAWS);

    /* exactly min_p times the best stays, a hair less goes; after top-k
       (sorted candidates) and without (unsorted) */
    {
        double edge[4] = { 0, 1.0 / 1.5, 0.5 / 1.5, 0 };

        logits[0] = logf(0.5f) - 0.01f;
        logits[1] = 0.0f;
        logits[2] = logf(0.5f);
        logits[3] = -5.0f;
        sampler_params_default(&p);
        p.min_p = 0.5f;
        histogram(&p, logits, 4, counts);
        assert_true(chi_square(counts, edge, 4) < 25.0);
        p.top_k = 3;
        histogram(&p, logits, 4, counts);
        assert_true(chi_square(counts, edge, 4) < 25.0);
    }
}


/* ---- large vocabulary ---- */

typedef struct {
    float   *logits;    // (N_BIG,)
    float   *work;      // (N_BIG,) copy handed to the sampler
    int32_t *order;     // (N_BIG,) reference best-first order
    int32_t *rank;      // (N_BIG,) position in order
} Big;

static int big_setup(void **state) {
    Big *b = calloc(1, sizeof(*b));

    b->logits = malloc(N_BIG * sizeof(float));
    b->work = malloc(N_BIG * sizeof(float));
    b->order = malloc(N_BIG * sizeof(int32_t));
    b->rank = malloc(N_BIG * sizeof(int32_t));
    *state = b;
    return 0;
}

static int big_teardown(void **state) {
    Big *b = *state;

    free(b->logits);
    free(b->work);
    free(b->order);
    free(b->rank);
    free(b);
    return 0;
}

/* Draws n tokens with p and returns the largest reference rank drawn. */
static int32_t big_draws(Big *b, const SamplerParams *p, int n) {
    Sampler s;
    int32_t worst = 0;

    init_ok(&s, p, N_BIG);
    for (int i = 0; i < n; i++) {
        int32_t t;

        memcpy(b->work, b->logits, N_BIG * sizeof(float));
        t = sampler_sample(&s, b->work);
        if (b->rank[t] > worst) worst = b->rank[t];
    }
    sampler_free(&s);
    return worst;
}

static void test_big_top_k(void **state) {
    Big          *b = *state;
    SamplerParams p;

    /* coarse logits: many exact ties, so the id tie-break matters */
    fill_random(b->logits, N_BIG, 77, 8.0f);
    for (int32_t i = 0; i < N_BIG; i++) {
        b->logits[i] = roundf(b->logits[i] * 64.0f) / 64.0f;
    }
    ref_rank(b->logits, N_BIG, b->order, b->rank);

    sampler_params_default(&p);
    p.top_k = 40;
    p.temperature = 2.0f;
    /* flat enough that all of the 40 show up, not fewer */
    assert_int_equal(big_draws(b, &p, 1000), 39);

    p.top_k = 1;
    memcpy(b->work, b->logits, N_BIG * sizeof(float));
    {
        Sampler s;

        init_ok(&s, &p, N_BIG);
        assert_int_equal(sampler_sample(&s, b->work), b->order[0]);
        sampler_free(&s);
    }
}

/* A flat distribution puts the nucleus across dozens of logit buckets;
 * draws must stay inside the nucleus and reach deep into it. */
static void test_big_top_p(void **state) {
    Big          *b = *state;
    SamplerParams p;
    int32_t       nucleus, worst;

    fill_random(b->logits, N_BIG, 78, 3.0f);
    ref_rank(b->logits, N_BIG, b->order, b->rank);
    sampler_params_default(&p);
    p.top_p = 0.9f;
    nucleus = ref_nucleus(b->logits, b->order, N_BIG, p.top_p);
    assert_true(nucleus > 256 * 8);
    worst = big_draws(b, &p, 200);
    assert_true(worst < nucleus);
    assert_true(worst > nucleus / 2);

    /* a peaked distribution (geometric, ratio e^-0.05, in a scrambled
       order): the nucleus fits in the first prefix */
    for (int32_t i = 0; i < N_BIG; i++) {
        b->logits[i] = -0.05f * (float) (((int64_t) i * 7919) % N_BIG);
    }
    ref_rank(b->logits, N_BIG, b->order, b->rank);
    p.top_p = 0.5f;
    nucleus = ref_nucleus(b->logits, b->order, N_BIG, p.top_p);
    assert_true(nucleus < 256);
    assert_true(big_draws(b, &p, 200) < nucleus);

    /* 100 equal favourites scattered through the vocabulary: the nucleus
       of 0.5 is exactly the 50 with the lowest ids */
    for (int32_t i = 0; i < N_BIG; i++) b->logits[i] = -50.0f;
    for (int32_t i = 0; i < 100; i++) b->logits[(i * 7919) % N_BIG] = 0.0f;
    ref_rank(b->logits, N_BIG, b->order, b->rank);
    p.top_p = 0.5f;
    assert_int_equal(big_draws(b, &p, 400), 49);

    /* top-k then top-p over the k */
    p.top_k = 100;
    p.top_p = 0.95f;
    assert_true(big_draws(b, &p, 200) < 100);

    /* all logits equal: one edge bucket holding the whole vocabulary, and
       the nucleus is the lowest ids */
    for (int32_t i = 0; i < N_BIG; i++) b->logits[i] = 1.5f;
    ref_rank(b->logits, N_BIG, b->order, b->rank);
    sampler_params_default(&p);
    p.top_p = 0.25f;
    worst = big_draws(b, &p, 10);
    assert_true(worst < N_BIG / 4 + 1);
    assert_true(worst > N_BIG / 8);
}

static void test_big_min_p(void **state) {
    Big          *b = *state;
    SamplerParams p;
    int32_t       keep = 0;
    float         cut;

    fill_random(b->logits, N_BIG, 80, 20.0f);
    ref_rank(b->logits, N_BIG, b->order, b->rank);
    sampler_params_default(&p);
    p.min_p = 0.05f;
    cut = b->logits[b->order[0]] + logf(p.min_p);
    while (keep < N_BIG && b->logits[b->order[keep]] >= cut) keep++;
    assert_true(keep > 1000);
    assert_true(big_draws(b, &p, 200) < keep);
}

/* All -inf: still a valid token, the lowest id. */
static void test_degenerate_logits(void **state) {
    SamplerParams p;
    Sampler       s;
    float         logits[8];

    sampler_params_default(&p);
    p.top_p = 0.5f;
    p.min_p = 0.1f;
    init_ok(&s, &p, 8);
    for (int i = 0; i < 8; i++) logits[i] = -INFINITY;
    assert_int_equal(sampler_sample(&s, logits), 0);
    sampler_free(&s);

    sampler_params_default(&p);
    init_ok(&s, &p, 8);
    for (int i = 0; i < 8; i++) logits[i] = -INFINITY;
    logits[6] = 0.0f;
    assert_int_equal(sampler_sample(&s, logits), 6);
    sampler_free(&s);
}


/* ---- penalties and bias ---- */

static void test_penalties(void **state) {
    float         logits[4] = { 1.0f, 0.9f, 0.0f, -1.0f };
    SamplerParams p;
    Sampler       s;

    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.frequency_penalty = 0.06f;
    init_ok(&s, &p, 4);
    sampler_accept(&s, 0);
    assert_int_equal(sample_copy(&s, logits, 4), 0);   /* 1.0 - 0.06 */
    sampler_accept(&s, 0);
    assert_int_equal(sample_copy(&s, logits, 4), 1);   /* 1.0 - 0.12 */
    assert_int_equal(s.counts[0], 2);

    /* the logits handed in carry the penalty afterwards */
    {
        float l[4] = { 1.0f, 0.9f, 0.0f, -1.0f };

        sampler_sample(&s, l);
        assert_float_equal(l[0], 1.0f - 0.12f, 1e-6);
        assert_float_equal(l[1], 0.9f, 0.0);
    }
    sampler_reset(&s);
    assert_int_equal(sample_copy(&s, logits, 4), 0);
    sampler_free(&s);

    /* presence counts once, however often the token came */
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.presence_penalty = 0.2f;
    init_ok(&s, &p, 4);
    sampler_accept(&s, 1);
    assert_int_equal(sample_copy(&s, logits, 4), 0);
    sampler_accept(&s, 0);
    for (int i = 0; i < 5; i++) sampler_accept(&s, 1);
    assert_int_equal(sample_copy(&s, logits, 4), 0);   /* 0.8 vs 0.7 */
    sampler_accept(&s, -1);                            /* ignored */
    sampler_accept(&s, 4);
    assert_int_equal(s.n_seen, 2);
    sampler_free(&s);

    /* negative penalties favour repetition */
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = -0.5f;
    init_ok(&s, &p, 4);
    sampler_accept(&s, 3);
    assert_int_equal(sample_copy(&s, logits, 4), 3);   /* -1 + 2 + 0.5 */
    sampler_free(&s);
}

static void test_logit_bias(void **state) {
    float         logits[8] = { 0, 0, 0, 5.0f, 0, 0, 0, 0 };
    int           counts[8];
    SamplerParams p;
    Sampler       s;

    /* -100 bans the favourite, even at T = 2 */
    sampler_params_default(&p);
    p.temperature = 2.0f;
    p.n_bias = 1;
    p.bias[0] = (LogitBias) { 3, -100.0f };
    histogram(&p, logits, 8, counts);
    assert_int_equal(counts[3], 0);
    for (int i = 0; i < 8; i++) {
        if (i != 3) assert_true(counts[i] > DRAWS / 8);
    }

    /* +100 forces a token */
    p.bias[0] = (LogitBias) { 6, 100.0f };
    histogram(&p, logits, 8, counts);
    assert_int_equal(counts[6], DRAWS);

    /* and greedy sees the bias */
    p.temperature = 0.0f;
    p.n_bias = 2;
    p.bias[0] = (LogitBias) { 3, -10.0f };
    p.bias[1] = (LogitBias) { 7, 0.5f };
    init_ok(&s, &p, 8);
    assert_int_equal(sample_copy(&s, logits, 8), 7);
    sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_invalid_params),
        cmocka_unit_test(test_boundary_params_accepted),
        cmocka_unit_test(test_set_params),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_top_k_1_is_greedy),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_one_draw_per_sample),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p_min_p),
        cmocka_unit_test_setup_teardown(test_big_top_k, big_setup,
                                        big_teardown),
        cmocka_unit_test_setup_teardown(test_big_top_p, big_setup,
                                        big_teardown),
        cmocka_unit_test_setup_teardown(test_big_min_p, big_setup,
                                        big_teardown),
        cmocka_unit_test(test_degenerate_logits),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logit_bias),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}

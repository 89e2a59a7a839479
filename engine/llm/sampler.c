/* sampler.c -- the next token from logits; the chain is described in
 * sampler.h.
 *
 * Candidates are token ids in s->idx[0..n). Every stage narrows n; top-k and
 * top-p also leave idx[0..n) sorted best first. "Best" is a total order:
 * higher logit first, lower id on equal logits, so the result never depends
 * on the sort algorithm or the machine.
 *
 * Selection is a bounded heap kept in the front of idx itself (no extra
 * scratch): a min-heap of the k best seen so far whose root is the worst of
 * them; a later candidate only touches the heap when it beats the root. That
 * is O(n log k) at worst and close to O(n) on real logits, against
 * O(n log n) for a full sort -- the difference that matters at 150k tokens
 * and k = 40.
 *
 * top-p without top-k needs the nucleus, not an order. One pass sums the
 * probability mass in logit buckets (1/32 logit wide) below the maximum;
 * the bucket where the running mass crosses top_p is the edge. Everything
 * above it is in, everything below out, and only the edge bucket is
 * sorted, lazily: its best 256 first, eight times more if the walk needs
 * them. O(n_vocab) plus a sort of a few tokens on real logits. Rejected:
 * sorting the vocabulary (O(n log n), ~50 ms at 150k on a flat
 * distribution), and a growing sorted prefix as llama.cpp does (the same
 * O(n log n) when the nucleus is large). Pathological logits, thousands
 * of them within 1/32 of each other at the edge, still cost a sort of that
 * bucket; the result is exact either way.
 *
 * Probabilities are computed with the maximum logit subtracted and summed in
 * double, so a 150k-token softmax neither overflows nor loses its tail. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

#define TOP_P_BUCKETS       1024    // logit buckets below the max, + 1 tail
#define TOP_P_BUCKET_SCALE  32.0f   // buckets per logit unit: 32 units
#define TOP_P_FIRST_K       256     // first prefix sorted in the edge bucket
#define TOP_P_GROWTH        8       // its growth when the nucleus is larger


/* ---- RNG: xoshiro256**, seeded by splitmix64 (Blackman and Vigna) ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) {
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static void rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;

    /* splitmix64 never yields four zero words, the one state xoshiro must
       not start from */
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}


/* ---- parameters ---- */

/* -1 with "name: must be between lo and hi, got v" unless lo <= v <= hi.
 * NaN fails every comparison, so it is rejected too. */
static int check_range(const char *name, float v, float lo, float hi,
                       Err *err) {
    if (v >= lo && v <= hi) return 0;
    return err_set(err, "%s: must be between %g and %g, got %g",
                   name, lo, hi, v);
}

static int check_bias(const SamplerParams *p, int32_t n_vocab, Err *err) {
    if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS) {
        return err_set(err, "logit_bias: at most %d entries, got %d",
                       SAMPLER_MAX_BIAS, (int) p->n_bias);
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        const LogitBias *b = &p->bias[i];

        if (b->token < 0 || b->token >= n_vocab) {
            return err_set(err, "logit_bias: token %d is out of range "
                           "(the vocabulary has %d tokens)",
                           (int) b->token, (int) n_vocab);
        }
        if (!(b->bias >= -100.0f && b->bias <= 100.0f)) {
            return err_set(err, "logit_bias: bias for token %d must be "
                           "between -100 and 100, got %g",
                           (int) b->token, b->bias);
        }
    }
    return 0;
}

/* Checks every parameter; the message names the first bad one the way the
 * OpenAI API spells it. */
static int params_check(const SamplerParams *p, int32_t n_vocab, Err *err) {
    if (check_range("temperature", p->temperature, 0.0f, 2.0f, err) != 0) {
        return -1;
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return err_set(err, "top_p: must be in (0, 1], got %g", p->top_p);
    }
    if (p->top_k < 0) {
        return err_set(err, "top_k: must be >= 0, got %d", (int) p->top_k);
    }
    if (check_range("min_p", p->min_p, 0.0f, 1.0f, err) != 0
        || check_range("presence_penalty", p->presence_penalty,
                       -2.0f, 2.0f, err) != 0
        || check_range("frequency_penalty", p->frequency_penalty,
                       -2.0f, 2.0f, err) != 0)
    {
        return -1;
    }
    return check_bias(p, n_vocab, err);
}


/* ---- lifecycle ---- */

int sampler_init(Sampler *s, const SamplerParams *p, int32_t n_vocab,
                 Err *err) {
    size_t n = (size_t) n_vocab;

    memset(s, 0, sizeof(*s));
    if (n_vocab <= 0) {
        return err_set(err, "sampler: vocabulary size %d is not positive",
                       (int) n_vocab);
    }
    if (params_check(p, n_vocab, err) != 0) return -1;

    s->n_vocab = n_vocab;
    s->counts = calloc(n, sizeof(*s->counts));
    s->seen = malloc(n * sizeof(*s->seen));
    s->idx = malloc(n * sizeof(*s->idx));
    s->prob = malloc(n * sizeof(*s->prob));
    if (s->counts == NULL || s->seen == NULL || s->idx == NULL
        || s->prob == NULL)
    {
        sampler_free(s);
        return err_set(err, "sampler: out of memory for %d tokens",
                       (int) n_vocab);
    }
    s->p = *p;
    rng_seed(s->rng, p->seed);
    return 0;
}

int sampler_set_params(Sampler *s, const SamplerParams *p, Err *err) {
    if (params_check(p, s->n_vocab, err) != 0) return -1;
    s->p = *p;
    sampler_reset(s);
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->counts);
    free(s->seen);
    free(s->idx);
    free(s->prob);
    s->counts = s->seen = s->idx = NULL;
    s->prob = NULL;
    s->n_seen = 0;
}

void sampler_reset(Sampler *s) {
    for (int32_t i = 0; i < s->n_seen; i++) s->counts[s->seen[i]] = 0;
    s->n_seen = 0;
    rng_seed(s->rng, s->p.seed);
}

void sampler_accept(Sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab) return;
    if (s->counts[token]++ == 0) s->seen[s->n_seen++] = token;
}


/* ---- logit adjustments ---- */

/* OpenAI's penalties: logit -= presence * (count > 0) + frequency * count,
 * over the tokens this sequence generated. O(distinct tokens seen). */
static void apply_penalties(const Sampler *s, float *logits) {
    float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;

    if (pres == 0.0f && freq == 0.0f) return;
    for (int32_t i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];

        logits[t] -= pres + freq * (float) s->counts[t];
    }
}

static void apply_bias(const Sampler *s, float *logits) {
    for (int32_t i = 0; i < s->p.n_bias; i++) {
        logits[s->p.bias[i].token] += s->p.bias[i].bias;
    }
}

/* Lowest id among the highest logits; NaN never wins, not even at id 0
 * (a CUDA backend's device argmax picks the same; a row with nothing but
 * NaN gives 0). The maximum lives in a local: comparing against
 * logits[best] makes every iteration wait for the previous one's load (5x
 * slower at 150k). */
static int32_t argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    float   max = -INFINITY;

    for (int32_t i = 0; i < n; i++) {
        if (logits[i] > max) {
            max = logits[i];
            best = i;
        }
    }
    return best;
}


/* ---- candidate selection ---- */

/* The total order of the file comment: a is better than b. */
static bool better(const float *logits, int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

/* Restores the heap below i in h[0..n): every parent is worse than its
 * children, so h[0] is the worst candidate kept. */
static void sift_down(const float *logits, int32_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t worst = i, l = 2 * i + 1, r = l + 1, t;

        if (l < n && better(logits, h[worst], h[l])) worst = l;
        if (r < n && better(logits, h[worst], h[r])) worst = r;
        if (worst == i) return;
        t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Moves the k best of idx[0..n) to idx[0..k), sorted best first; the rest
 * of idx stays a permutation of the other candidates. 1 <= k <= n. */
static void select_top(const float *logits, int32_t *idx, int32_t n,
                       int32_t k) {
    int32_t t;
    float   root;

    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(logits, idx, k, i);

    /* most candidates lose to the root on the logit alone; the cached
       root logit keeps that test free of a dependent load */
    root = logits[idx[0]];
    for (int32_t j = k; j < n; j++) {
        if (logits[idx[j]] < root || !better(logits, idx[j], idx[0])) {
            continue;
        }
        t = idx[0];
        idx[0] = idx[j];
        idx[j] = t;
        sift_down(logits, idx, k, 0);
        root = logits[idx[0]];
    }

    /* heap sort: the worst goes to the end each time, so the front ends up
       best first */
    for (int32_t m = k - 1; m > 0; m--) {
        t = idx[0];
        idx[0] = idx[m];
        idx[m] = t;
        sift_down(logits, idx, m, 0);
    }
}

/* exp(x) for x <= 0, flushed to 0 below the float range instead of taking
 * libm's slow underflow path (which also sets errno). */
static float weight(float x) {
    return x > -87.0f ? expf(x) : 0.0f;
}

static float max_logit(const float *logits, const int32_t *idx, int32_t n,
                       bool sorted) {
    float m = logits[idx[0]];

    if (sorted) return m;
    for (int32_t i = 1; i < n; i++) {
        if (logits[idx[i]] > m) m = logits[idx[i]];
    }
    return m;
}

/* Length of the best-first prefix of idx[0..n) whose weights
 * exp(logit - max), added to cum, reach target; n when they never do. An
 * unsorted idx is sorted lazily: the best TOP_P_FIRST_K first, then
 * TOP_P_GROWTH times more whenever the walk runs past them (the first k stay
 * in place, so the running sum carries over). */
static int32_t nucleus_prefix(const float *logits, int32_t *idx, int32_t n,
                              bool sorted, float max, double cum,
                              double target) {
    int32_t k = sorted || n < TOP_P_FIRST_K ? n : TOP_P_FIRST_K, i = 0;

    for (;;) {
        if (!sorted) select_top(logits, idx, n, k);
        for (; i < k; i++) {
            cum += weight(logits[idx[i]] - max);
            if (cum >= target) return i + 1;
        }
        if (k == n) return n;   /* rounding kept cum just below target */
        k = (int32_t) ((int64_t) k * TOP_P_GROWTH < n
                       ? (int64_t) k * TOP_P_GROWTH : n);
    }
}

/* top-p after top-k: the candidates are already sorted. */
static int32_t top_p_sorted(Sampler *s, const float *logits, int32_t n) {
    float  max = logits[s->idx[0]];
    double sum = 0.0;

    for (int32_t j = 0; j < n; j++) sum += weight(logits[s->idx[j]] - max);
    return nucleus_prefix(logits, s->idx, n, true, max, 0.0,
                          s->p.top_p * sum);
}

/* Bucket of a logit: TOP_P_BUCKET_SCALE buckets per unit below the max,
 * the last one (TOP_P_BUCKETS) for everything lower, -inf and NaN. A
 * lower bucket only holds strictly higher logits. */
static int bucket_of(float max, float logit) {
    float d = (max - logit) * TOP_P_BUCKET_SCALE;

    return d < (float) TOP_P_BUCKETS ? (int) d : TOP_P_BUCKETS;
}

/* top-p over the whole vocabulary, idx still the identity. One pass sums
 * the weight of each logit bucket; the bucket where the running sum
 * crosses top_p is the edge. Tokens above it are in the nucleus whatever
 * their order, so only the edge bucket is sorted, and only as far as the
 * walk needs. The nucleus is idx[0..result): unsorted, then the sorted
 * part of the edge. */
static int32_t top_p_buckets(Sampler *s, const float *logits) {
    int32_t *idx = s->idx, n = s->n_vocab, n_above = 0, n_edge = 0, edge;
    float    max = max_logit(logits, idx, n, false);
    double   mass[TOP_P_BUCKETS + 1] = { 0 }, sum = 0.0, cum = 0.0, target;

    if (!(max > -INFINITY)) return 1;       /* all -inf: token 0 */
    for (int32_t t = 0; t < n; t++) {
        double w = weight(logits[t] - max);

        mass[bucket_of(max, logits[t])] += w;
        sum += w;
    }
    target = s->p.top_p * sum;
    for (edge = 0; edge < TOP_P_BUCKETS && cum + mass[edge] < target; edge++) {
        cum += mass[edge];
    }

    /* tokens above the edge to the front, edge tokens to the back; the
       writes never pass the token being read, so idx needs no copy */
    for (int32_t t = 0; t < n; t++) {
        int b = bucket_of(max, logits[t]);

        if (b < edge) idx[n_above++] = t;
        else if (b == edge) idx[n - 1 - n_edge++] = t;
    }
    if (n_edge == 0) return n_above;
    memmove(idx + n_above, idx + n - n_edge, (size_t) n_edge * sizeof(*idx));
    return n_above + nucleus_prefix(logits, idx + n_above, n_edge, false,
                                    max, cum, target);
}

/* Keeps the candidates whose probability is at least min_p times the
 * largest one, i.e. logit >= max + log(min_p); the best always stays.
 * A sorted candidate list is cut, an unsorted one compacted in order. */
static int32_t apply_min_p(Sampler *s, const float *logits, int32_t n,
                           bool sorted) {
    int32_t *idx = s->idx;
    float    cut = max_logit(logits, idx, n, sorted) + logf(s->p.min_p);
    int32_t  m = 0;

    if (sorted) {
        for (m = 1; m < n && logits[idx[m]] >= cut; m++) { }
        return m;
    }
    for (int32_t i = 0; i < n; i++) {
        if (logits[idx[i]] >= cut) idx[m++] = idx[i];
    }
    return m > 0 ? m : 1;       /* only if every logit is NaN */
}

/* Softmax of the candidates at the temperature, then one draw. */
static int32_t draw(Sampler *s, const float *logits, int32_t n, bool sorted) {
    const int32_t *idx = s->idx;
    float          inv_t = 1.0f / s->p.temperature;
    float          max = max_logit(logits, idx, n, sorted);
    double         sum = 0.0, cum = 0.0, r = rng_uniform(s->rng);
    int32_t        last = 0;

    if (!(max > -INFINITY)) return idx[0];
    for (int32_t i = 0; i < n; i++) {
        s->prob[i] = weight((logits[idx[i]] - max) * inv_t);
        sum += s->prob[i];
    }
    r *= sum;
    for (int32_t i = 0; i < n; i++) {
        if (!(s->prob[i] > 0.0f)) continue;
        cum += s->prob[i];
        last = i;
        if (cum > r) return idx[i];
    }
    return idx[last];           /* r landed in the rounding of the sum */
}

bool sampler_is_greedy(const Sampler *s) {
    return s->p.temperature == 0.0f && s->p.n_bias == 0
           && s->p.presence_penalty == 0.0f
           && s->p.frequency_penalty == 0.0f;
}

int32_t sampler_sample(Sampler *s, float *logits) {
    int32_t n = s->n_vocab;
    bool    sorted = false;

    apply_bias(s, logits);
    apply_penalties(s, logits);
    if (s->p.temperature == 0.0f) return argmax(logits, n);

    for (int32_t i = 0; i < n; i++) s->idx[i] = i;
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(logits, s->idx, n, s->p.top_k);
        n = s->p.top_k;
        sorted = true;
    }
    if (s->p.top_p < 1.0f) {
        n = sorted ? top_p_sorted(s, logits, n) : top_p_buckets(s, logits);
    }
    if (s->p.min_p > 0.0f) n = apply_min_p(s, logits, n, sorted);
    return draw(s, logits, n, sorted);
}

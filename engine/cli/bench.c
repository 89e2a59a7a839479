/* bench.c -- see bench.h. Tokens are drawn from a fixed-seed generator so
 * every run feeds the same ids; their values do not affect the timing. */

#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kv_cache.h"

#define BENCH_BLOCK 16

typedef struct {
    KVCache         kv;
    RunState        rs;
    int32_t        *tokens;     // (n,) random ids, owned
    int32_t        *pos;        // (n,), owned
    const int32_t **tables;     // (n,), owned
    int32_t        *table;      // block table, owned
} BenchState;

static void bench_state_free(BenchState *s) {
    kv_free(&s->kv);
    runstate_free(&s->rs);
    free(s->tokens);
    free(s->pos);
    free(s->tables);
    free(s->table);
}

static int bench_state_init(BenchState *s, const Model *m, int64_t n,
                            Err *err)
{
    const ModelConfig *c = &m->c;
    int64_t            nb = (n + BENCH_BLOCK - 1) / BENCH_BLOCK;
    uint64_t           x = 42;

    memset(s, 0, sizeof(*s));
    if (kv_init(&s->kv, c->n_layers, c->n_kv_heads, c->head_dim, BENCH_BLOCK,
                nb, err) != 0
        || runstate_init(&s->rs, c, n, 1, err) != 0)
    {
        bench_state_free(s);
        return -1;
    }
    s->tokens = malloc((size_t) n * sizeof(int32_t));
    s->pos = malloc((size_t) n * sizeof(int32_t));
    s->tables = malloc((size_t) n * sizeof(int32_t *));
    s->table = malloc((size_t) nb * sizeof(int32_t));
    if (!s->tokens || !s->pos || !s->tables || !s->table) {
        bench_state_free(s);
        return err_set(err, "out of memory");
    }
    for (int64_t i = 0; i < nb; i++) s->table[i] = kv_alloc_block(&s->kv);
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        s->tokens[i] = (int32_t) ((x >> 33) % (uint64_t) c->n_vocab);
        s->pos[i] = (int32_t) i;
        s->tables[i] = s->table;
    }
    return 0;
}

/* One forward of tokens [i0, i0+n) at their positions; logits of the last. */
static void step(const Model *m, Backend *be, BenchState *s, int64_t i0,
                 int64_t n)
{
    TokenBatch b = { n, s->pos + i0, s->tables + i0 };
    int32_t    last = (int32_t) (n - 1);

    model_forward(m, be, &s->kv, &s->rs, s->tokens + i0, &b, &last, 1);
}

static double time_pp(const Model *m, Backend *be, BenchState *s, int64_t n) {
    double t0 = clock_now_s();

    step(m, be, s, 0, n);
    return n / (clock_now_s() - t0);
}

static double time_tg(const Model *m, Backend *be, BenchState *s, int64_t n) {
    double t0 = clock_now_s();

    for (int64_t i = 0; i < n; i++) step(m, be, s, i, 1);
    return n / (clock_now_s() - t0);
}

int bench_run(const Model *m, Backend *be, const BenchParams *p,
              BenchResult *r, Err *err)
{
    BenchState s;
    int64_t    n = p->n_prompt > p->n_gen ? p->n_prompt : p->n_gen;
    int        reps = p->reps < 1 ? 1 : p->reps > 16 ? 16 : p->reps;

    memset(r, 0, sizeof(*r));
    if (bench_state_init(&s, m, n, err) != 0) return -1;
    r->reps = reps;
    if (p->n_prompt > 0) {
        time_pp(m, be, &s, p->n_prompt);                /* warm-up */
        for (int i = 0; i < reps; i++) {
            r->pp_tps[i] = time_pp(m, be, &s, p->n_prompt);
        }
    }
    if (p->n_gen > 0) {
        time_tg(m, be, &s, p->n_gen < 16 ? p->n_gen : 16);   /* warm-up */
        for (int i = 0; i < reps; i++) {
            r->tg_tps[i] = time_tg(m, be, &s, p->n_gen);
        }
    }
    bench_state_free(&s);
    return 0;
}

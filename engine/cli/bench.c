/* bench.c -- see bench.h. Tokens are drawn from a fixed-seed generator so
 * every run feeds the same ids; their values do not affect the timing.
 *
 * On a device backend each step ends the way a serving step does, with
 * its token ids picked by the device's argmax, so the device's
 * asynchronous work is inside the time; a host backend's step is done
 * when model_forward returns. */

#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kv_cache.h"

typedef struct {
    KVCache          kv;
    RunState         rs;
    int64_t          n_seqs;    // sequences decoding together (tg)
    int64_t          len;       // positions each sequence holds
    int32_t         *tokens;    // (len * n_seqs,) random ids, owned
    int32_t         *pos;       // (len * n_seqs,), owned
    const int32_t  **tables;    // (len * n_seqs,), owned
    int32_t         *table;     // (n_seqs, blocks per sequence), owned
    int32_t         *out_idx;   // (n_seqs,) 0, 1, ..., owned
    int32_t         *ids;       // (n_seqs,) device argmax results, owned
} BenchState;

static void bench_state_free(BenchState *s) {
    kv_free(&s->kv);
    runstate_free(&s->rs);
    free(s->tokens);
    free(s->pos);
    free(s->tables);
    free(s->table);
    free(s->out_idx);
    free(s->ids);
}

/* Sequence q's tokens at positions 0..len-1, step-major: step p's batch is
 * entries [p * n_seqs, (p + 1) * n_seqs), one token of each sequence. A
 * prefill uses sequence 0's, laid out the same way with n_seqs = 1. */
static int bench_state_init(BenchState *s, const Model *m, Backend *be,
                            int64_t len, int64_t n_seqs, int64_t max_tokens,
                            Err *err)
{
    const ModelConfig *c = &m->c;
    int64_t            nb = (len + BENCH_BLOCK - 1) / BENCH_BLOCK;
    int64_t            n = len * n_seqs;
    uint64_t           x = 42;

    memset(s, 0, sizeof(*s));
    s->n_seqs = n_seqs;
    s->len = len;
    if (kv_init(&s->kv, c->n_layers, c->n_kv_heads, c->head_dim, BENCH_BLOCK,
                nb * n_seqs, be, err) != 0
        || runstate_init(&s->rs, c, max_tokens, n_seqs, be, err) != 0)
    {
        bench_state_free(s);
        return -1;
    }
    s->tokens = malloc((size_t) n * sizeof(int32_t));
    s->pos = malloc((size_t) n * sizeof(int32_t));
    s->tables = malloc((size_t) n * sizeof(int32_t *));
    s->table = malloc((size_t) (nb * n_seqs) * sizeof(int32_t));
    s->out_idx = malloc((size_t) n_seqs * sizeof(int32_t));
    s->ids = malloc((size_t) n_seqs * sizeof(int32_t));
    if (!s->tokens || !s->pos || !s->tables || !s->table || !s->out_idx
        || !s->ids)
    {
        bench_state_free(s);
        return err_set(err, "out of memory");
    }
    for (int64_t i = 0; i < nb * n_seqs; i++) {
        s->table[i] = kv_alloc_block(&s->kv);
    }
    for (int64_t q = 0; q < n_seqs; q++) s->out_idx[q] = (int32_t) q;
    for (int64_t p = 0; p < len; p++) {
        for (int64_t q = 0; q < n_seqs; q++) {
            int64_t i = p * n_seqs + q;

            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            s->tokens[i] = (int32_t) ((x >> 33) % (uint64_t) c->n_vocab);
            s->pos[i] = (int32_t) p;
            s->tables[i] = s->table + q * nb;
        }
    }
    return 0;
}

/* The step's token ids, on a device (which waits for its work). */
static void take_ids(const Model *m, Backend *be, BenchState *s,
                     int64_t n_out)
{
    if (be->argmax != NULL) {
        be->argmax(be, s->ids, s->rs.logits, n_out, m->c.n_vocab);
    }
}

/* Prefill of sequence 0's first n tokens in one batch (n_seqs == 1). */
static double time_pp(const Model *m, Backend *be, BenchState *s, int64_t n) {
    double     t0 = clock_now_s();
    TokenBatch b = { n, s->pos, s->tables };
    int32_t    last = (int32_t) (n - 1);

    model_forward(m, be, &s->kv, &s->rs, s->tokens, &b, &last, 1);
    take_ids(m, be, s, 1);
    return n / (clock_now_s() - t0);
}

/* n decode steps of every sequence at once; tokens/s over all of them. */
static double time_tg(const Model *m, Backend *be, BenchState *s, int64_t n) {
    int64_t q = s->n_seqs;
    double  t0 = clock_now_s();

    for (int64_t p = 0; p < n; p++) {
        TokenBatch b = { q, s->pos + p * q, s->tables + p * q };

        model_forward(m, be, &s->kv, &s->rs, s->tokens + p * q, &b,
                      s->out_idx, q);
        take_ids(m, be, s, q);
    }
    return (double) (n * q) / (clock_now_s() - t0);
}

int bench_run(const Model *m, Backend *be, const BenchParams *p,
              BenchResult *r, Err *err)
{
    BenchState s;
    int64_t    q = p->batch < 1 ? 1 : p->batch;
    int        reps = p->reps < 1 ? 1 : p->reps > 16 ? 16 : p->reps;

    memset(r, 0, sizeof(*r));
    r->reps = reps;
    if (p->n_prompt > 0) {
        if (bench_state_init(&s, m, be, p->n_prompt, 1, p->n_prompt, err)
            != 0)
        {
            return -1;
        }
        time_pp(m, be, &s, p->n_prompt);                /* warm-up */
        for (int i = 0; i < reps; i++) {
            r->pp_tps[i] = time_pp(m, be, &s, p->n_prompt);
        }
        bench_state_free(&s);
    }
    if (p->n_gen > 0) {
        if (bench_state_init(&s, m, be, p->n_gen, q, q, err) != 0) return -1;
        time_tg(m, be, &s, p->n_gen < 16 ? p->n_gen : 16);   /* warm-up */
        for (int i = 0; i < reps; i++) {
            r->tg_tps[i] = time_tg(m, be, &s, p->n_gen);
        }
        bench_state_free(&s);
    }
    return 0;
}

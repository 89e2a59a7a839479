/* generate.c -- see generate.h. */

#include <stdlib.h>
#include <string.h>

#include "generate.h"

#define GEN_BLOCK_SIZE 16

int gen_init(Generator *g, const Model *m, const Tokenizer *tk, Backend *be,
             int64_t n_ctx, int64_t max_batch, Err *err)
{
    const ModelConfig *c = &m->c;
    int64_t            n_blocks;

    memset(g, 0, sizeof(*g));
    g->m = m;
    g->tk = tk;
    g->be = be;
    g->n_ctx = n_ctx;
    g->max_batch = max_batch;
    n_blocks = (n_ctx + GEN_BLOCK_SIZE - 1) / GEN_BLOCK_SIZE;
    if (kv_init(&g->kv, c->n_layers, c->n_kv_heads, c->head_dim,
                GEN_BLOCK_SIZE, n_blocks, err) != 0
        || runstate_init(&g->rs, c, max_batch, 1, err) != 0)
    {
        gen_free(g);
        return -1;
    }
    g->block_table = malloc((size_t) n_blocks * sizeof(int32_t));
    g->pos = malloc((size_t) max_batch * sizeof(int32_t));
    g->tables = malloc((size_t) max_batch * sizeof(int32_t *));
    /* one piece plus what the detokenizer and stop matcher may hold back */
    g->text_cap = 4096 + STOP_MAX_LEN;
    g->text = malloc(g->text_cap * 2);
    if (g->block_table == NULL || g->pos == NULL || g->tables == NULL
        || g->text == NULL)
    {
        gen_free(g);
        return err_set(err, "out of memory");
    }
    /* a single sequence owns the whole cache, block i at position i */
    for (int64_t i = 0; i < n_blocks; i++) {
        g->block_table[i] = kv_alloc_block(&g->kv);
    }
    return 0;
}

void gen_free(Generator *g) {
    kv_free(&g->kv);
    runstate_free(&g->rs);
    free(g->block_table);
    free(g->pos);
    free(g->tables);
    free(g->text);
    memset(g, 0, sizeof(*g));
}

/* Runs n tokens starting at position pos0; logits for the last one. */
static void forward(Generator *g, const int32_t *tokens, int64_t n,
                    int64_t pos0)
{
    TokenBatch b = { n, g->pos, g->tables };
    int32_t    last = (int32_t) (n - 1);

    for (int64_t i = 0; i < n; i++) {
        g->pos[i] = (int32_t) (pos0 + i);
        g->tables[i] = g->block_table;
    }
    model_forward(g->m, g->be, &g->kv, &g->rs, tokens, &b, &last, 1);
}

static void prefill(Generator *g, const int32_t *prompt, int64_t n) {
    for (int64_t i = 0; i < n; i += g->max_batch) {
        int64_t len = n - i < g->max_batch ? n - i : g->max_batch;

        forward(g, prompt + i, len, i);
    }
}

/* Pushes one token's text through detokenizer and stop matcher and emits
 * what is safe. Returns 1 when the stream must end (stop string matched or
 * the consumer cancelled). */
static int emit_token(Generator *g, Detok *d, StopMatcher *sm, int32_t tok,
                      GenEmitFn emit, void *ud)
{
    char  *piece = g->text, *out = g->text + g->text_cap;
    size_t n = detok_push(d, g->tk, tok, piece, g->text_cap);

    n = stop_feed(sm, piece, n, out, g->text_cap);
    if (n > 0 && emit(ud, out, n) != 0) return 1;
    return sm->stopped;
}

static void emit_tail(Generator *g, Detok *d, StopMatcher *sm, GenEmitFn emit,
                      void *ud)
{
    char  *piece = g->text, *out = g->text + g->text_cap;
    size_t n = detok_flush(d, piece, g->text_cap);

    n = stop_feed(sm, piece, n, out, g->text_cap);
    if (!sm->stopped) n += stop_flush(sm, out + n, g->text_cap - n);
    if (n > 0) emit(ud, out, n);
}

int gen_run(Generator *g, const int32_t *prompt, int64_t n_prompt,
            const GenParams *p, GenEmitFn emit, void *ud, GenStats *st,
            Err *err)
{
    Sampler     smp;
    StopMatcher sm;
    Detok       d;
    int64_t     pos = n_prompt;
    double      t0 = clock_now_s(), t1;
    int32_t     tok;

    memset(st, 0, sizeof(*st));
    st->n_prompt = n_prompt;
    st->finish = "length";
    if (n_prompt <= 0) return err_set(err, "the prompt is empty");
    if (n_prompt >= g->n_ctx) {
        return err_set(err, "the prompt has %" PRId64 " tokens, more than "
                       "the context of %" PRId64 " allows", n_prompt,
                       g->n_ctx);
    }
    if (stop_init(&sm, p->stop, p->n_stop, err) != 0
        || sampler_init(&smp, &p->sampling, g->m->c.n_vocab, err) != 0)
    {
        return -1;
    }
    detok_init(&d);

    prefill(g, prompt, n_prompt);
    t1 = clock_now_s();
    st->t_prefill = t1 - t0;

    while (st->n_gen < p->max_tokens) {
        tok = sampler_sample(&smp, g->rs.logits);
        if (tokenizer_is_eog(g->tk, tok)) {
            st->finish = "stop";
            break;
        }
        sampler_accept(&smp, tok);
        st->n_gen++;
        if (emit_token(g, &d, &sm, tok, emit, ud) != 0) {
            st->finish = "stop";
            break;
        }
        if (st->n_gen == p->max_tokens || pos >= g->n_ctx) break;
        forward(g, &tok, 1, pos++);
    }
    if (!sm.stopped) emit_tail(g, &d, &sm, emit, ud);
    st->t_decode = clock_now_s() - t1;
    sampler_free(&smp);
    return 0;
}

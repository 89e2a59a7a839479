/* generate.c -- see generate.h.
 *
 * The --top-logits report is written with yajl's generator (escaping,
 * UTF-8 validation), one line per step. It is a diagnostic: it allocates
 * its scratch (K candidates, a copy of the logits, the generator) once
 * before the first token and costs O(n_vocab) per step plus a line of
 * output. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_gen.h>

#include "generate.h"

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
                GEN_BLOCK_SIZE, n_blocks, be, err) != 0
        || runstate_init(&g->rs, c, max_batch, 1, be, err) != 0)
    {
        gen_free(g);
        return -1;
    }
    g->block_table = malloc((size_t) n_blocks * sizeof(int32_t));
    g->pos = malloc((size_t) max_batch * sizeof(int32_t));
    g->tables = malloc((size_t) max_batch * sizeof(int32_t *));
    if (g->block_table == NULL || g->pos == NULL || g->tables == NULL) {
        gen_free(g);
        return err_set(err, "out of memory");
    }
    if (decode_init(&g->dec, tk, c->n_vocab, err) != 0) {
        gen_free(g);
        return -1;
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
    decode_free(&g->dec);
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


/* ---- --top-logits ---------------------------------------------------- */

typedef struct {
    int32_t id;
    float   logit;
} Cand;

/* A piece rendered as "<0xXX>" per byte takes 6 bytes per byte; pieces
 * longer than DECODE_PIECE_CAP are reported as null. */
#define PIECE_BUF  (DECODE_PIECE_CAP * 2)

typedef struct {
    Cand    *top;           // (k,) best first, owned
    float   *raw;           // (n_vocab,) the step's logits as the model
                            //   gave them, owned
    char    *piece;         // (PIECE_BUF,) a token's piece, owned
    int32_t  k;             // kept: max(K, 2) when the vocabulary allows
    int32_t  k_out;         // reported: K
    yajl_gen j;             // owned
    FILE    *out;           // borrowed
} TopLog;

/* The order greedy picks by: higher logit, lower id on equal logits; NaN
 * is worse than any number (so a NaN kept early does not block the rest). */
static bool cand_better(float la, int32_t a, float lb, int32_t b) {
    return la > lb || (la == lb && a < b) || (isnan(lb) && !isnan(la));
}

/* The k best of logits[0..n) into top[0..k), best first, by insertion:
 * most logits lose to the worst kept one at the first comparison, so
 * O(n) on real logits, O(n k) at worst. */
static void top_collect(const float *logits, int32_t n, Cand *top, int32_t k)
{
    int32_t m = 0;

    for (int32_t i = 0; i < n; i++) {
        int32_t j;

        if (m == k && !cand_better(logits[i], i, top[k - 1].logit,
                                   top[k - 1].id))
        {
            continue;
        }
        j = m < k ? m++ : k - 1;
        for (; j > 0 && cand_better(logits[i], i, top[j - 1].logit,
                                    top[j - 1].id); j--)
        {
            top[j] = top[j - 1];
        }
        top[j] = (Cand) { i, logits[i] };
    }
}

static void json_key(yajl_gen j, const char *k) {
    yajl_gen_string(j, (const unsigned char *) k, strlen(k));
}

/* 9 significant digits tell any two floats apart; JSON has no inf/NaN. */
static void json_float(yajl_gen j, double x) {
    char buf[32];
    int  n;

    if (!isfinite(x)) {
        yajl_gen_null(j);
        return;
    }
    n = snprintf(buf, sizeof(buf), "%.9g", x);
    yajl_gen_number(j, buf, (size_t) n);
}

/* A token's bytes as a JSON string; "<0xXX>" per byte when they are not
 * valid UTF-8 on their own (a byte-fallback piece of a longer character):
 * yajl refuses such a string before writing anything. */
static void json_piece(const Tokenizer *tk, TopLog *t, int32_t id) {
    yajl_gen j = t->j;
    char    *buf = t->piece, hex[8];
    size_t   n = tokenizer_piece(tk, id, true, buf, DECODE_PIECE_CAP), o = 0;

    if (n > DECODE_PIECE_CAP) {
        yajl_gen_null(j);
        return;
    }
    if (yajl_gen_string(j, (unsigned char *) buf, n)
        != yajl_gen_invalid_string)
    {
        return;
    }
    /* 6 bytes per byte, in place: rendered from the end, so each byte is
       read before it is overwritten */
    if (n * 6 > PIECE_BUF) {
        yajl_gen_null(j);
        return;
    }
    o = n * 6;
    for (size_t i = n; i-- > 0; ) {
        snprintf(hex, sizeof(hex), "<0x%02X>", (unsigned char) buf[i]);
        memcpy(buf + i * 6, hex, 6);
    }
    yajl_gen_string(j, (unsigned char *) buf, o);
}

static void toplog_free(TopLog *t) {
    free(t->top);
    free(t->raw);
    free(t->piece);
    if (t->j != NULL) yajl_gen_free(t->j);
}

static int toplog_init(TopLog *t, const GenParams *p, int32_t n_vocab,
                       Err *err)
{
    memset(t, 0, sizeof(*t));
    if (p->top_logits == 0) return 0;
    if (p->top_logits < 0 || p->top_logits > n_vocab) {
        return err_set(err, "top logits: K must be between 0 and the "
                       "vocabulary size %d, got %d", (int) n_vocab,
                       (int) p->top_logits);
    }
    t->k_out = p->top_logits;
    t->k = t->k_out < 2 && n_vocab >= 2 ? 2 : t->k_out;
    t->out = p->top_out != NULL ? p->top_out : stderr;
    t->top = malloc((size_t) t->k * sizeof(Cand));
    t->raw = malloc((size_t) n_vocab * sizeof(float));
    t->piece = malloc(PIECE_BUF);
    t->j = yajl_gen_alloc(NULL);
    if (t->top == NULL || t->raw == NULL || t->piece == NULL || t->j == NULL)
    {
        toplog_free(t);
        memset(t, 0, sizeof(*t));
        return err_set(err, "out of memory");
    }
    yajl_gen_config(t->j, yajl_gen_validate_utf8, 1);
    return 0;
}

/* One step's line; top holds the step's best raw logits, tok was sampled
 * from them with raw logit tok_logit. */
static void toplog_write(const Tokenizer *tk, TopLog *t, int64_t step,
                         int64_t pos,
                         int32_t tok, float tok_logit)
{
    yajl_gen             j = t->j;
    const unsigned char *buf;
    size_t               len;

    yajl_gen_map_open(j);
    json_key(j, "step");
    yajl_gen_integer(j, step);
    json_key(j, "pos");
    yajl_gen_integer(j, pos);
    json_key(j, "token");
    yajl_gen_integer(j, tok);
    json_key(j, "piece");
    json_piece(tk, t, tok);
    json_key(j, "logit");
    json_float(j, tok_logit);
    json_key(j, "top");
    yajl_gen_array_open(j);
    for (int32_t i = 0; i < t->k_out; i++) {
        yajl_gen_map_open(j);
        json_key(j, "id");
        yajl_gen_integer(j, t->top[i].id);
        json_key(j, "piece");
        json_piece(tk, t, t->top[i].id);
        json_key(j, "logit");
        json_float(j, t->top[i].logit);
        yajl_gen_map_close(j);
    }
    yajl_gen_array_close(j);
    json_key(j, "margin");
    if (t->k >= 2) {
        json_float(j, (double) t->top[0].logit - (double) t->top[1].logit);
    } else {
        yajl_gen_null(j);
    }
    yajl_gen_map_close(j);
    yajl_gen_get_buf(j, &buf, &len);
    fwrite(buf, 1, len, t->out);
    fputc('\n', t->out);
    fflush(t->out);
    yajl_gen_reset(j, NULL);
    yajl_gen_clear(j);
}


/* Decodes from the prompt's logits until the step ends the sequence:
 * top-logits report (when asked) between sampling and the step proper,
 * which is why this loop samples itself rather than call decode_token. */
static DecodeEnd decode_loop(Generator *g, TopLog *tl, int64_t pos,
                             GenEmitFn emit, void *ud)
{
    int32_t   n_vocab = g->m->c.n_vocab, tok;
    DecodeEnd end;

    for (;;) {
        float *logits = runstate_logits_row(&g->rs, 0, n_vocab);

        if (tl->k > 0) {
            /* the sampler adds bias and penalties in place: look first */
            top_collect(logits, n_vocab, tl->top, tl->k);
            memcpy(tl->raw, logits, (size_t) n_vocab * sizeof(float));
        }
        tok = sampler_sample(&g->dec.smp, logits);
        if (tl->k > 0) {
            toplog_write(g->tk, tl, g->dec.n_gen, pos, tok, tl->raw[tok]);
        }
        end = decode_take(&g->dec, tok, emit, ud);
        if (end != DECODE_MORE) return end;
        forward(g, &tok, 1, pos++);
    }
}

int gen_run(Generator *g, const int32_t *prompt, int64_t n_prompt,
            const GenParams *p, GenEmitFn emit, void *ud, GenStats *st,
            Err *err)
{
    StopMatcher  sm;
    TopLog       tl;
    DecodeLimits lim = { p->max_tokens, g->n_ctx, false, false };
    double       t0 = clock_now_s(), t1;

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
        || toplog_init(&tl, p, g->m->c.n_vocab, err) != 0)
    {
        return -1;
    }
    if (decode_start(&g->dec, &p->sampling, &sm, &lim, n_prompt, err) != 0) {
        toplog_free(&tl);
        return -1;
    }

    prefill(g, prompt, n_prompt);
    t1 = clock_now_s();
    st->t_prefill = t1 - t0;

    /* max_tokens <= 0 asks for nothing (decode.h's -1 would be no limit) */
    if (p->max_tokens > 0
        && decode_loop(g, &tl, n_prompt, emit, ud) != DECODE_LENGTH)
    {
        st->finish = "stop";
    }
    decode_finish(&g->dec, emit, ud);
    st->n_gen = g->dec.n_gen;
    st->t_decode = clock_now_s() - t1;
    toplog_free(&tl);
    return 0;
}

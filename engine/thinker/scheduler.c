/* scheduler.c -- continuous batching over the paged KV cache; the policy is
 * described in scheduler.h, this file is how.
 *
 * State. A request is either queued (a Queued entry: its prompt copy and
 * validated parameters) or admitted (a Seq slot: tokens, block table,
 * decoder). Admitted slots are kept in run[],
 * oldest admission first; a preempted sequence keeps its place there, which
 * is what makes it resume ahead of anything admitted after it. The queue
 * is a doubly linked FIFO over a preallocated array of max_queue entries,
 * so a cancel unlinks in O(1) once found (a scan of at most max_queue).
 *
 * A step plans, then runs, then samples:
 *
 *   plan    every admitted sequence gets chunk = how many of its pending
 *           tokens [n_computed, n_tokens) run now. Pending 1 (decodes)
 *           first, then longer ones (prefill, recompute) oldest first, then
 *           queue admissions, while the token budget and the cap last.
 *           Blocks for a chunk are allocated as it is planned.
 *   run     one model_forward over the chunks laid out in run[] order;
 *           logits for each sequence whose chunk ends at its last token.
 *   sample  those sequences sample, stream text, maybe finish. Blocks that
 *           became full are published to the prefix cache.
 *
 * Preemption is the least wasteful that still guarantees progress: a
 * sequence that cannot get even one block for its chunk takes the blocks
 * of the newest admitted sequence holding any (unplanning its chunk if it
 * had one), and only newer sequences are ever victims. A chunk that gets
 * some blocks but not all simply runs shorter. So the oldest sequence can
 * always take the whole pool (which holds at least one full context) and
 * finishes; by induction every sequence does. Rejected: preempting up
 * front for a whole prefill chunk (recomputes more than needed), and
 * swapping K/V out to host memory (no bandwidth to spare on the CPU
 * path, and recompute is cheap once the prefix cache keeps full blocks).
 * New sequences are not admitted in a step where an admitted one stalled
 * for lack of blocks: they would take blocks the stalled one is owed.
 *
 * Output equals generate.c's token for token: both run decode.h's step
 * (the same sampler calls in the same order per sequence, the same end
 * checks, the same text scratch), and the kernels are batch-invariant.
 *
 * Allocation: everything in sched_new, except the queued prompt copies.
 * Queue entries keep their prompt buffer when they are recycled and
 * sched_submit grows it only when a longer prompt arrives, so steady
 * traffic allocates nothing and sched_step never allocates or frees. */

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "scheduler.h"

typedef struct {
    uint64_t       id;
    int32_t       *prompt;      // (cap,) owned; kept when the entry is
    int64_t        cap;         //   recycled, grown by submit
    int64_t        n_prompt;
    int64_t        max_tokens;
    SamplerParams  sampling;
    StopMatcher    stop;        // initialised (so validated) at submit
    bool           ignore_eos;
    bool           think;       // split reasoning off
    uint64_t       root;        // kv_root_hash of the cache salt
    int32_t        prev, next;  // FIFO links, or the free list (next); -1
} Queued;

typedef struct {
    bool         busy;
    uint64_t     id;
    int32_t     *tokens;        // (max_ctx + 1,) prompt then output, owned
    int64_t      n_tokens;
    int64_t      n_prompt;
    int64_t      n_computed;    // leading tokens whose K/V are cached
    int64_t      cached;        // prompt tokens hit at first admission
    int32_t     *table;         // (max_blocks,) block table, owned
    int64_t      n_blocks;      // entries of table held (one ref each)
    int64_t      n_hashed;      // leading blocks published or found
    uint64_t     root;          // chain hash before block 0 (salted)
    uint64_t     last_hash;     // chain hash of block n_hashed - 1
    bool         done;          // finished in this step's sampling
    bool         preempted;     // preempted in this step's planning
    int64_t      chunk;         // tokens planned for this step
    Decoder      dec;           // sampler, detokenizer, stop matcher,
                                //   counts; scratch from sched_new
} Seq;

struct Scheduler {
    const Model     *m;         // borrowed
    const Tokenizer *tk;        // borrowed
    Backend         *be;        // borrowed
    OmniStats       *stats;     // borrowed, may be NULL
    SchedConfig      cfg;
    SchedEvents      ev;
    int64_t          max_blocks;    // blocks one full context takes
    KVCache          kv;
    RunState         rs;            // max_batch_tokens in, max_seqs out
    Seq             *seqs;          // (max_seqs,) owned
    int32_t         *run;           // (max_seqs,) admitted slots, oldest
    int              n_run;         //   admission first
    Queued          *queue;         // (max_queue,) owned
    int32_t          q_head, q_tail, q_free;
    int              n_waiting;
    Sampler          check;         // validates sampling at submit
    int64_t          used;          // tokens planned this step
    bool             stalled;       // a planned sequence got no blocks
    int64_t          preemptions;
    int32_t         *b_tokens;      // (max_batch_tokens,) the step's batch
    int32_t         *b_pos;         // (max_batch_tokens,)
    const int32_t  **b_tables;      // (max_batch_tokens,)
    int32_t         *out_idx;       // (max_seqs,) batch rows with logits
    int32_t         *out_seq;       // (max_seqs,) their slots
    int32_t         *ids;           // (max_seqs,) a device argmax's picks
};

/* Where a sequence's text goes: decode.h's emit callback's ud. */
typedef struct {
    Scheduler *s;
    uint64_t   id;
} SeqOut;


/* ---- Events and statistics ------------------------------------------- */

static void stat_add(_Atomic uint64_t *c, uint64_t n) {
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static void stat_set(_Atomic int64_t *g, int64_t v) {
    atomic_store_explicit(g, v, memory_order_relaxed);
}

static void emit_error(Scheduler *s, uint64_t id, int status,
                       const char *type, const char *param, const char *code,
                       const char *msg)
{
    if (s->ev.error != NULL) {
        s->ev.error(s->ev.ud, id, status, type, param, code, msg);
    }
}

/* decode.h's emit callback: text to the text event. Never cancels. */
static int emit_text(void *ud, TextKind kind, const char *t, size_t n) {
    SeqOut *o = ud;

    if (o->s->ev.text != NULL) {
        o->s->ev.text(o->s->ev.ud, o->id, kind == TEXT_REASONING, t, n);
    }
    return 0;
}

/* The parameter an Err from the sampler or stop matcher names: its text up
 * to ": " when that is a plain identifier ("top_p: must be ..."), else "". */
static void err_param(const Err *e, char *param, size_t cap) {
    size_t n = strcspn(e->msg, ": ");

    param[0] = '\0';
    if (n == 0 || n >= cap || e->msg[n] != ':') return;
    for (size_t i = 0; i < n; i++) {
        char c = e->msg[i];

        if (!(c == '_' || (c >= 'a' && c <= 'z'))) return;
    }
    memcpy(param, e->msg, n);
    param[n] = '\0';
}

static void publish_gauges(Scheduler *s) {
    OmniStats *st = s->stats;

    if (st == NULL) return;
    stat_set(&st->requests_running, s->n_run);
    stat_set(&st->requests_waiting, s->n_waiting);
    stat_set(&st->thinker.kv_blocks_total, s->kv.n_blocks);
    stat_set(&st->thinker.kv_blocks_used, s->kv.n_used);
    stat_set(&st->thinker.kv_blocks_cached, s->kv.n_cached);
    stat_set(&st->thinker.kv_blocks_free, s->kv.n_free);
}


/* ---- Setup -------------------------------------------------------------- */

static int check_config(const SchedConfig *c, const Model *m,
                        int64_t max_blocks, Err *err)
{
    if (c->max_seqs < 1) return err_set(err, "max_seqs must be >= 1");
    if (c->max_batch_tokens < c->max_seqs) {
        return err_set(err, "max_batch_tokens (%" PRId64 ") must be >= "
                       "max_seqs (%d): every admitted sequence decodes one "
                       "token per step", c->max_batch_tokens, c->max_seqs);
    }
    if (c->max_queue < 1) return err_set(err, "max_queue must be >= 1");
    if (c->block_size < 1) return err_set(err, "block_size must be >= 1");
    if (c->max_ctx < 2 || c->max_ctx > m->c.n_ctx) {
        return err_set(err, "the context (%" PRId64 ") must be in 2..%d, "
                       "the model's", c->max_ctx, m->c.n_ctx);
    }
    if (c->n_blocks < max_blocks || c->n_blocks > INT32_MAX) {
        return err_set(err, "the KV pool has %" PRId64 " blocks; one "
                       "context of %" PRId64 " tokens needs %" PRId64,
                       c->n_blocks, c->max_ctx, max_blocks);
    }
    return 0;
}

static int alloc_seqs(Scheduler *s, Err *err) {
    SamplerParams def;
    int32_t       n_vocab = s->m->c.n_vocab;

    sampler_params_default(&def);
    if (sampler_init(&s->check, &def, n_vocab, err) != 0) return -1;
    for (int i = 0; i < s->cfg.max_seqs; i++) {
        Seq *q = &s->seqs[i];

        q->tokens = malloc((size_t) (s->cfg.max_ctx + 1) * sizeof(int32_t));
        q->table = malloc((size_t) s->max_blocks * sizeof(int32_t));
        if (q->tokens == NULL || q->table == NULL) {
            return err_set(err, "out of memory for sequence slots");
        }
        if (decode_init(&q->dec, s->tk, n_vocab, err) != 0) return -1;
    }
    for (int i = 0; i < s->cfg.max_queue; i++) {
        s->queue[i].next = i + 1 < s->cfg.max_queue ? i + 1 : -1;
    }
    s->q_free = 0;
    s->q_head = s->q_tail = -1;
    return 0;
}

Scheduler *sched_new(const Model *m, const Tokenizer *tk, Backend *be,
                     const SchedConfig *cfg, const SchedEvents *ev,
                     OmniStats *stats, Err *err)
{
    const ModelConfig *c = &m->c;
    Scheduler         *s;
    int64_t            max_blocks, nb = cfg->max_batch_tokens;

    max_blocks = cfg->block_size > 0
                 ? (cfg->max_ctx + cfg->block_size - 1) / cfg->block_size : 0;
    if (check_config(cfg, m, max_blocks, err) != 0) return NULL;
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    s->m = m;
    s->tk = tk;
    s->be = be;
    s->stats = stats;
    s->cfg = *cfg;
    s->ev = *ev;
    s->max_blocks = max_blocks;
    s->seqs = calloc((size_t) cfg->max_seqs, sizeof(Seq));
    s->run = calloc((size_t) cfg->max_seqs, sizeof(int32_t));
    s->queue = calloc((size_t) cfg->max_queue, sizeof(Queued));
    s->b_tokens = malloc((size_t) nb * sizeof(int32_t));
    s->b_pos = malloc((size_t) nb * sizeof(int32_t));
    s->b_tables = malloc((size_t) nb * sizeof(int32_t *));
    s->out_idx = malloc((size_t) cfg->max_seqs * sizeof(int32_t));
    s->out_seq = malloc((size_t) cfg->max_seqs * sizeof(int32_t));
    s->ids = malloc((size_t) cfg->max_seqs * sizeof(int32_t));
    if (s->seqs == NULL || s->run == NULL || s->queue == NULL
        || s->b_tokens == NULL || s->b_pos == NULL || s->b_tables == NULL
        || s->out_idx == NULL || s->out_seq == NULL || s->ids == NULL)
    {
        err_set(err, "out of memory");
        goto fail;
    }
    if (alloc_seqs(s, err) != 0
        || kv_init(&s->kv, c->n_layers, c->n_kv_heads, c->head_dim,
                   cfg->block_size, cfg->n_blocks, be, err) != 0
        || runstate_init(&s->rs, c, nb, cfg->max_seqs, be, err) != 0)
    {
        goto fail;
    }
    publish_gauges(s);
    return s;

fail:
    sched_free(s);
    return NULL;
}

void sched_free(Scheduler *s) {
    if (s == NULL) return;
    for (int i = 0; s->seqs != NULL && i < s->cfg.max_seqs; i++) {
        free(s->seqs[i].tokens);
        free(s->seqs[i].table);
        decode_free(&s->seqs[i].dec);
    }
    for (int i = 0; s->queue != NULL && i < s->cfg.max_queue; i++) {
        free(s->queue[i].prompt);
    }
    sampler_free(&s->check);
    kv_free(&s->kv);
    runstate_free(&s->rs);
    free(s->seqs);
    free(s->run);
    free(s->queue);
    free(s->b_tokens);
    free(s->b_pos);
    free(s->b_tables);
    free(s->out_idx);
    free(s->out_seq);
    free(s->ids);
    free(s);
}


/* ---- The waiting queue -------------------------------------------------- */

static void queue_unlink(Scheduler *s, int32_t i) {
    Queued *w = &s->queue[i];

    if (w->prev >= 0) s->queue[w->prev].next = w->next;
    else s->q_head = w->next;
    if (w->next >= 0) s->queue[w->next].prev = w->prev;
    else s->q_tail = w->prev;
    w->next = s->q_free;
    w->prev = -1;
    s->q_free = i;
    s->n_waiting--;
}

static void queue_append(Scheduler *s, int32_t i) {
    Queued *w = &s->queue[i];

    s->q_free = w->next;
    w->prev = s->q_tail;
    w->next = -1;
    if (s->q_tail >= 0) s->queue[s->q_tail].next = i;
    else s->q_head = i;
    s->q_tail = i;
    s->n_waiting++;
}

/* Validates what the request asks beyond its prompt into w. Returns 0, or
 * -1 after emitting the ERROR event. */
static int queued_params(Scheduler *s, Queued *w, uint64_t id,
                         const SeqParams *p)
{
    Err  err;
    char param[32];

    if (p->max_tokens == 0 || p->max_tokens < -1) {
        emit_error(s, id, 400, "invalid_request_error", "max_tokens", NULL,
                   "max_tokens: must be >= 1");
        return -1;
    }
    if (sampler_set_params(&s->check, &p->sampling, &err) != 0
        || stop_init(&w->stop, p->stop, p->n_stop, &err) != 0)
    {
        err_param(&err, param, sizeof(param));
        emit_error(s, id, 400, "invalid_request_error",
                   param[0] != '\0' ? param : NULL, NULL, err.msg);
        return -1;
    }
    w->id = id;
    w->max_tokens = p->max_tokens;
    w->sampling = p->sampling;
    w->ignore_eos = p->ignore_eos;
    w->think = p->think;
    w->root = kv_root_hash(p->cache_salt, p->cache_salt_len);
    return 0;
}

/* Refuses prompts that cannot run: empty, or with no room left to
 * generate in the context. Returns 0, or -1 after the ERROR event. */
static int check_prompt(Scheduler *s, uint64_t id, int64_t n,
                        const char *param)
{
    char msg[200];

    if (n <= 0) {
        emit_error(s, id, 400, "invalid_request_error", param, NULL,
                   "the prompt is empty");
        return -1;
    }
    if (n >= s->cfg.max_ctx) {
        snprintf(msg, sizeof(msg), PROMPT_TOO_LONG_FMT, s->cfg.max_ctx, param,
                 "", n, param);
        emit_error(s, id, 400, "invalid_request_error", param,
                   "context_length_exceeded", msg);
        return -1;
    }
    return 0;
}

int sched_submit(Scheduler *s, uint64_t id, const int32_t *prompt, int64_t n,
                 const SeqParams *p)
{
    Queued *w;
    char    msg[96];

    if (check_prompt(s, id, n, p->prompt_param != NULL ? p->prompt_param
                                                       : "messages") != 0)
    {
        return -1;
    }
    if (s->q_free < 0) {
        snprintf(msg, sizeof(msg), "the server is overloaded: %d requests "
                 "are waiting", s->n_waiting);
        emit_error(s, id, 503, "server_error", NULL, "overloaded", msg);
        return -1;
    }
    w = &s->queue[s->q_free];
    if (queued_params(s, w, id, p) != 0) return -1;
    if (w->cap < n) {
        int32_t *grown = realloc(w->prompt, (size_t) n * sizeof(int32_t));

        if (grown == NULL) {
            emit_error(s, id, 503, "server_error", NULL, NULL,
                       "out of memory queueing the prompt");
            return -1;
        }
        w->prompt = grown;
        w->cap = n;
    }
    memcpy(w->prompt, prompt, (size_t) n * sizeof(int32_t));
    w->n_prompt = n;
    queue_append(s, (int32_t) (w - s->queue));
    publish_gauges(s);
    return 0;
}


/* ---- Blocks --------------------------------------------------------------
 * A sequence holds table[0..n_blocks), one reference each. Blocks are
 * released last first: the LRU list then evicts a sequence's tail before
 * its head, and heads are what other requests share. */

static void seq_release(Scheduler *s, Seq *q) {
    while (q->n_blocks > 0) kv_release_block(&s->kv, q->table[--q->n_blocks]);
    q->n_computed = 0;
    q->n_hashed = 0;
    q->last_hash = q->root;
}

/* Takes shared references on the cached blocks that hold q's leading full
 * blocks of tokens [0, n_tokens - 1) (the last token always runs, for its
 * logits). q holds no blocks. Returns the tokens found. */
static int64_t prefix_attach(Scheduler *s, Seq *q) {
    int     bs = s->cfg.block_size;
    int64_t full = (q->n_tokens - 1) / bs;

    if (!s->cfg.prefix_cache) return 0;
    while (q->n_blocks < full) {
        const int32_t *t = q->tokens + q->n_blocks * bs;
        uint64_t       h = kv_block_hash(q->last_hash, t, bs);
        int32_t        b = kv_lookup(&s->kv, h, q->last_hash, t);

        if (b < 0) break;
        q->table[q->n_blocks++] = b;
        q->last_hash = h;
    }
    q->n_hashed = q->n_blocks;
    q->n_computed = q->n_blocks * bs;
    return q->n_computed;
}

/* Publishes the blocks of q that became full in this step. */
static void prefix_publish(Scheduler *s, Seq *q) {
    int bs = s->cfg.block_size;

    if (!s->cfg.prefix_cache) return;
    while ((q->n_hashed + 1) * bs <= q->n_computed) {
        const int32_t *t = q->tokens + q->n_hashed * bs;
        uint64_t       h = kv_block_hash(q->last_hash, t, bs);

        kv_publish(&s->kv, q->table[q->n_hashed], h, q->last_hash, t);
        q->last_hash = h;
        q->n_hashed++;
    }
}

/* Allocates what blocks it can for q's tokens up to end. Returns the end
 * the blocks q now holds reach (<= end). */
static int64_t seq_grow(Scheduler *s, Seq *q, int64_t end) {
    int     bs = s->cfg.block_size;
    int64_t need = (end + bs - 1) / bs;

    while (q->n_blocks < need) {
        int32_t b = kv_alloc_block(&s->kv);

        if (b < 0) break;
        q->table[q->n_blocks++] = b;
    }
    return q->n_blocks * bs < end ? q->n_blocks * bs : end;
}

/* Preempts the newest admitted sequence after run[k] that holds blocks:
 * releases them, unplans its chunk, and leaves it to be recomputed. Its
 * sampler, detokenizer and stop matcher are untouched, so its output is
 * unchanged. Returns false when there is none. */
static bool preempt_newer(Scheduler *s, int k) {
    for (int j = s->n_run - 1; j > k; j--) {
        Seq *v = &s->seqs[s->run[j]];

        if (v->n_blocks == 0) continue;
        s->used -= v->chunk;
        v->chunk = 0;
        v->preempted = true;
        seq_release(s, v);
        s->preemptions++;
        if (s->stats != NULL) stat_add(&s->stats->thinker.preemptions, 1);
        log_msg(LOG_DEBUG, "scheduler: preempted request %" PRIu64, v->id);
        return true;
    }
    return false;
}


/* ---- Planning ----------------------------------------------------------- */

/* Plans up to want pending tokens of run[k], preempting newer sequences
 * only when it would otherwise get none. A sequence preempted earlier in
 * this step waits for the next. One resuming from preemption that cannot
 * run lets go of the cached blocks it found again, so that it holds
 * nothing while it waits: it is then no victim (its preemption is not
 * counted twice) and those blocks stay evictable. Returns the tokens
 * planned. */
static int64_t plan_seq(Scheduler *s, int k, int64_t want) {
    Seq    *q = &s->seqs[s->run[k]];
    bool    resuming = q->n_blocks == 0;
    int64_t end, reach;

    if (q->preempted) {
        s->stalled = true;
        return 0;
    }
    if (resuming) prefix_attach(s, q);
    end = q->n_tokens - q->n_computed;
    end = q->n_computed + (end < want ? end : want);
    while ((reach = seq_grow(s, q, end)) <= q->n_computed) {
        if (!preempt_newer(s, k)) {
            if (resuming) seq_release(s, q);
            s->stalled = true;
            return 0;
        }
    }
    q->chunk = reach - q->n_computed;
    s->used += q->chunk;
    return q->chunk;
}

/* Moves the queue's head into a free slot if its first chunk gets blocks
 * without preempting anyone (newcomers never preempt). Returns false,
 * leaving it queued, when it does not. */
static bool admit_head(Scheduler *s) {
    Queued       *w = &s->queue[s->q_head];
    Seq          *q = NULL;
    int64_t       end;
    DecodeLimits  lim = { w->max_tokens, s->cfg.max_ctx, w->ignore_eos,
                          w->think };
    Err           err;

    for (int i = 0; q == NULL; i++) {
        if (!s->seqs[i].busy) q = &s->seqs[i];
    }
    memcpy(q->tokens, w->prompt, (size_t) w->n_prompt * sizeof(int32_t));
    q->n_tokens = q->n_prompt = w->n_prompt;
    q->n_blocks = 0;
    q->root = w->root;
    seq_release(s, q);
    q->cached = prefix_attach(s, q);
    end = q->n_computed + s->cfg.max_batch_tokens - s->used;
    end = seq_grow(s, q, end < q->n_tokens ? end : q->n_tokens);
    if (end <= q->n_computed) {
        seq_release(s, q);
        return false;
    }
    if (decode_start(&q->dec, &w->sampling, &w->stop, &lim, q->n_prompt,
                     &err) != 0)
    {
        /* validated at submit; believed unreachable */
        seq_release(s, q);
        emit_error(s, w->id, 500, "server_error", NULL, NULL, err.msg);
        queue_unlink(s, s->q_head);
        return true;
    }
    q->busy = true;
    q->id = w->id;
    q->done = false;
    q->chunk = end - q->n_computed;
    s->used += q->chunk;
    s->run[s->n_run++] = (int32_t) (q - s->seqs);
    queue_unlink(s, s->q_head);
    if (s->stats != NULL) {
        stat_add(&s->stats->thinker.prompt_tokens, (uint64_t) q->n_prompt);
        stat_add(&s->stats->thinker.prefix_cache_queries, (uint64_t) q->n_prompt);
        stat_add(&s->stats->thinker.prefix_cache_hits, (uint64_t) q->cached);
    }
    if (s->ev.started != NULL) s->ev.started(s->ev.ud, q->id);
    return true;
}

/* Decides every admitted sequence's chunk for this step (see the top of
 * the file), admitting from the queue with what is left. */
static void plan_step(Scheduler *s) {
    int64_t budget = s->cfg.max_batch_tokens;

    s->used = 0;
    s->stalled = false;
    for (int k = 0; k < s->n_run; k++) {
        s->seqs[s->run[k]].chunk = 0;
        s->seqs[s->run[k]].preempted = false;
    }
    for (int k = 0; k < s->n_run; k++) {
        Seq *q = &s->seqs[s->run[k]];

        if (q->n_tokens - q->n_computed == 1) plan_seq(s, k, 1);
    }
    for (int k = 0; k < s->n_run && s->used < budget; k++) {
        Seq *q = &s->seqs[s->run[k]];

        if (q->chunk == 0 && q->n_tokens - q->n_computed > 1) {
            plan_seq(s, k, budget - s->used);
        }
    }
    while (!s->stalled && s->q_head >= 0 && s->n_run < s->cfg.max_seqs
           && s->used < budget)
    {
        if (!admit_head(s)) break;
    }
}


/* ---- Sampling and text -------------------------------------------------- */

/* Ends q: the text still held back, DONE, and its blocks back to the
 * pool. run[] is compacted by the caller. */
static void seq_finish(Scheduler *s, Seq *q, OmniFinish finish) {
    SeqOut   o = { s, q->id };
    OmniDone d = { 0 };

    decode_finish(&q->dec, emit_text, &o);
    d.prompt_tokens = (uint32_t) q->n_prompt;
    d.cached_tokens = (uint32_t) q->cached;
    d.completion_tokens = (uint32_t) q->dec.n_gen;
    d.reasoning_tokens = (uint32_t) q->dec.think.n_reasoning;
    d.finish = (uint8_t) finish;
    d.seed = q->dec.smp.p.seed;
    if (s->ev.done != NULL) s->ev.done(s->ev.ud, q->id, &d);
    seq_release(s, q);
    q->busy = false;
    q->done = true;
}

/* Runs decode.h's step on output row o: a plain-greedy sequence takes the
 * device's argmax (ids, when the backend has one), any other samples the
 * row on the host. A taken token joins q's tokens (it runs in the next
 * step unless the sequence ended); an end of generation, a stop string or
 * a limit finishes q. */
static void seq_sample(Scheduler *s, Seq *q, int64_t o, const int32_t *ids)
{
    SeqOut    so = { s, q->id };
    int32_t   tok;
    DecodeEnd end;

    if (ids != NULL && sampler_is_greedy(&q->dec.smp)) {
        tok = ids[o];
        end = decode_take(&q->dec, tok, emit_text, &so);
    } else {
        end = decode_token(&q->dec,
                           runstate_logits_row(&s->rs, o, s->m->c.n_vocab),
                           &tok, emit_text, &so);
    }

    if (end != DECODE_EOS) {
        q->tokens[q->n_tokens++] = tok;
        if (s->stats != NULL) {
            stat_add(&s->stats->thinker.generation_tokens, 1);
        }
    }
    if (end != DECODE_MORE) {
        seq_finish(s, q, end == DECODE_LENGTH ? OMNI_FINISH_LENGTH
                                               : OMNI_FINISH_STOP);
    }
}


/* ---- The step ----------------------------------------------------------- */

/* Lays the planned chunks out as one batch in run[] order. A sequence whose
 * chunk ends at its last token gets a logits row (rows ascend with the
 * batch, as model_forward wants). Returns the tokens; *n_out the rows. */
static int64_t build_batch(Scheduler *s, int64_t *n_out) {
    int64_t n = 0, o = 0;

    for (int k = 0; k < s->n_run; k++) {
        Seq *q = &s->seqs[s->run[k]];

        for (int64_t p = q->n_computed; p < q->n_computed + q->chunk; p++) {
            s->b_tokens[n] = q->tokens[p];
            s->b_pos[n] = (int32_t) p;
            s->b_tables[n] = q->table;
            n++;
        }
        if (q->chunk > 0 && q->n_computed + q->chunk == q->n_tokens) {
            s->out_idx[o] = (int32_t) (n - 1);
            s->out_seq[o] = s->run[k];
            o++;
        }
    }
    *n_out = o;
    return n;
}

/* Drops the sequences that finished from run[], keeping the order. */
static void run_compact(Scheduler *s) {
    int j = 0;

    for (int k = 0; k < s->n_run; k++) {
        if (!s->seqs[s->run[k]].done) s->run[j++] = s->run[k];
    }
    s->n_run = j;
}

void sched_step(Scheduler *s) {
    int64_t    n, n_out, n_vocab = s->m->c.n_vocab;
    TokenBatch b;

    plan_step(s);
    n = build_batch(s, &n_out);
    if (n > 0) {
        b = (TokenBatch) { n, s->b_pos, s->b_tables };
        model_forward(s->m, s->be, &s->kv, &s->rs, s->b_tokens, &b,
                      s->out_idx, n_out);
        if (s->stats != NULL) {
            stat_add(&s->stats->thinker.steps, 1);
            stat_add(&s->stats->thinker.step_tokens, (uint64_t) n);
        }
    }
    for (int k = 0; k < s->n_run; k++) {
        Seq *q = &s->seqs[s->run[k]];

        q->n_computed += q->chunk;
        q->chunk = 0;
        prefix_publish(s, q);
    }
    if (n_out > 0 && s->be->argmax != NULL) {
        s->be->argmax(s->be, s->ids, s->rs.logits, n_out, n_vocab);
    }
    for (int64_t o = 0; o < n_out; o++) {
        seq_sample(s, &s->seqs[s->out_seq[o]], o,
                   s->be->argmax != NULL ? s->ids : NULL);
    }
    run_compact(s);
    publish_gauges(s);
}


/* ---- Cancel, shutdown, introspection ------------------------------------ */

void sched_cancel(Scheduler *s, uint64_t id) {
    for (int k = 0; k < s->n_run; k++) {
        Seq *q = &s->seqs[s->run[k]];

        if (q->id != id) continue;
        seq_release(s, q);
        q->busy = false;
        q->done = true;
        run_compact(s);
        publish_gauges(s);
        return;
    }
    for (int32_t i = s->q_head; i >= 0; i = s->queue[i].next) {
        if (s->queue[i].id != id) continue;
        queue_unlink(s, i);
        publish_gauges(s);
        return;
    }
}

bool sched_idle(const Scheduler *s) {
    return s->n_run == 0 && s->q_head < 0;
}

void sched_abort_all(Scheduler *s, const char *why) {
    for (int k = 0; k < s->n_run; k++) {
        Seq *q = &s->seqs[s->run[k]];

        emit_error(s, q->id, 503, "server_error", NULL, "engine_shutdown",
                   why);
        seq_release(s, q);
        q->busy = false;
    }
    s->n_run = 0;
    while (s->q_head >= 0) {
        emit_error(s, s->queue[s->q_head].id, 503, "server_error", NULL,
                   "engine_shutdown", why);
        queue_unlink(s, s->q_head);
    }
    publish_gauges(s);
}

void sched_counts(const Scheduler *s, SchedCounts *c) {
    c->running = s->n_run;
    c->waiting = s->n_waiting;
    c->preemptions = s->preemptions;
    c->blocks_used = s->kv.n_used;
    c->blocks_cached = s->kv.n_cached;
    c->blocks_free = s->kv.n_free;
}

const KVCache *sched_kv(const Scheduler *s) {
    return &s->kv;
}

/* thinker.c -- the thinker stage: the model, the scheduler, and the
 * preparation of requests for it. The process around it (the channel, the
 * stats page's generic part, the loop, the heartbeat) is the stage
 * skeleton's (stage.h); this file is the thinker's row, thinker_stage.
 *
 * Startup builds, in order: the model (copied into huge-page memory and
 * repacked for the backend, unless cfg->mmap maps it), the tokenizer, the
 * CPU backend, the scheduler with its KV pool. One warm-up forward pass
 * (its own one-block cache, so the scheduler's state and the counters are
 * untouched) brings the thread pool up and faults the weights in; then
 * READY goes out. Any failure before READY is a startup failure: the
 * process exits.
 *
 * Then the skeleton's loop calls in: a SUBMIT is parsed, checked, rendered
 * and tokenized, then queued (over PREP_INLINE_MAX bytes, on the helper
 * thread, queued when it comes back: the wake fd); a CANCEL frees at once;
 * a step is one scheduler step, its events queued as frames.
 *
 * With --redis (and the prefix cache on), a chat request's preparation
 * also names the prefixes of its conversation (llm/prefix_keys.h: keys,
 * the tokens each covers, the block that anchors it); at submit they go
 * into the prefix index (prefix_index.h), which the loop's tick syncs
 * with the KV cache every PREFIX_SYNC_S and whose SETs and DELs the
 * publisher thread (prefix_pub.h) writes to Redis. The step loop itself
 * does none of it.
 *
 * A prompt that cannot fit the context is refused before it costs a
 * full tokenization: first by the text bound (stage_channel.h's
 * PromptBound, one pass at most over the text), else by tokenizing it only
 * until it passes ctx tokens (tokenizer_encode_upto; the error then says
 * "at least").
 *
 * Requests are parsed again here although the frontend checked them: the
 * stage must not trust its input more than a parse costs, and the
 * frontend stays free of model state. */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "kernels.h"
#include "model.h"
#include "prefix_index.h"
#include "prefix_keys.h"
#include "prefix_pub.h"
#include "request.h"
#include "runtime.h"
#include "scheduler.h"
#include "stage.h"
#include "thinker.h"
#include "tokenizer.h"
#include "workq.h"

#define PREP_INLINE_MAX (16u << 10) // larger SUBMITs: the helper thread
#define PREP_NICE       5           // its nice value, above the loop's
#define DEFAULT_KV_MB   1024.0
#define PREFIX_SYNC_S   0.05        // the prefix index's sync, at most
#define PIDX_PER_BLOCK  4           // index entries per KV block,
#define PIDX_MIN        4096        //   within these
#define PIDX_MAX        (1 << 20)

/* One SUBMIT being prepared: parsed, checked, rendered, tokenized. */
typedef struct {
    uint64_t     id;
    const char  *json;              // (len,) borrowed
    size_t       len;
    OmniRequest  req;               // owned when parsed
    bool         parsed;
    int32_t     *toks;              // (ctx + 1,) the prompt's tokens
    char        *chat;              // (chat_cap,) rendered chat, grows
    size_t       chat_cap;
    size_t       chat_len;          // its length, for a chat request
    size_t      *ends;              // (REQ_MAX_MESSAGES,) where messages
                                    //   end, then their tokens; NULL: no
                                    //   prefix keys wanted
    PrefixKey    keys[OMNI_PKEY_MAX];   // the request's prefix keys
    int          n_keys;
    int64_t      n;                 // tokens, when status is 0
    int          status;            // 0: ready; else the ERROR's status
    char         param[64];         // the ERROR's param, "" for none
    const char  *code;              // the ERROR's code (static) or NULL
    char         msg[400];          // the ERROR's message
} Prep;

struct Thinker;

/* A Prep on the helper thread, owning its JSON copy and scratch. */
typedef struct PrepJob {
    WorkJob                w;       // first: the queue's view of the job
    const struct Thinker  *t;       // read-only from the thread
    char                  *json;    // owned copy
    Prep                   p;       // toks, chat and ends owned
    bool                   cancelled;
    struct PrepJob        *next;    // jobs out, newest first
} PrepJob;

typedef struct Thinker {
    const ServeConfig *cfg;         // borrowed
    Stage             *st;          // borrowed: the skeleton running it
    Runtime            rt;          // model, tokenizer, template, backend
    Scheduler         *sched;       // owned
    int64_t            ctx;         // tokens per sequence
    char               name[256];   // served model id
    PromptBound        bound;       // the tokenizer's text bound
    int32_t           *toks;        // (ctx + 1,) prompt scratch, owned
    char              *chat;        // rendered chat scratch, owned, grows
    size_t             chat_cap;
    WorkQ              wq;          // prepares large SUBMITs
    bool               wq_up;
    PrepJob           *jobs;        // out on wq, owned
    int                n_jobs;
    /* prefix routing; all NULL without --redis */
    Publisher         *pub;         // owned
    PrefixIndex       *pidx;        // owned; NULL too without the prefix
                                    //   cache (only the load is published)
    size_t            *ends;        // (REQ_MAX_MESSAGES,) inline prep's,
                                    //   owned when pidx
    double             next_sync;
    bool               pub_lost;    // a push failed: resend everything
    PidxCounts         shown;       // the counters the page has
} Thinker;


/* ---- Events out --------------------------------------------------------
 * The scheduler's events, whose ud is the Thinker, become the skeleton's
 * frames; a request's end also ends its pending prefix keys. */

static void ev_started(void *ud, uint64_t id) {
    stage_started(((Thinker *) ud)->st, id);
}

static void ev_text(void *ud, uint64_t id, bool reasoning, const char *s,
                    size_t n)
{
    stage_event(((Thinker *) ud)->st, id,
                reasoning ? OMNI_F_REASONING : OMNI_F_TEXT, s, n);
}

static void ev_done(void *ud, uint64_t id, const OmniDone *d) {
    Thinker *t = ud;

    if (t->pidx != NULL) pidx_end(t->pidx, id);
    stage_done(t->st, id, d);
}

static void ev_error(void *ud, uint64_t id, int status, const char *type,
                     const char *param, const char *code, const char *msg)
{
    Thinker *t = ud;

    if (t->pidx != NULL) pidx_end(t->pidx, id);
    stage_error(t->st, id, status, type, param, code, msg);
}


/* ---- Requests in --------------------------------------------------------
 * A SUBMIT is prepared (parsed, checked, rendered, tokenized), then the
 * scheduler takes it. Preparing costs time in proportion to the request's
 * bytes, so one over PREP_INLINE_MAX is prepared on the helper thread
 * (workq.h) while steps go on, and queued when it comes back (it may be
 * overtaken by smaller requests that arrived after it). Preparing reads
 * only what does not change after startup (the tokenizer, the template,
 * the name, ctx, the bound) and writes only its Prep, so the same code
 * runs on either thread; its ERROR is emitted by the loop. */

/* Sets p's outcome to an ERROR (400 invalid_request_error unless said). */
static void prep_fail(Prep *p, int status, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void prep_fail(Prep *p, int status, const char *param,
                      const char *code, const char *fmt, ...)
{
    va_list ap;

    p->status = status;
    snprintf(p->param, sizeof(p->param), "%s", param != NULL ? param : "");
    p->code = code;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
    va_end(ap);
}

/* The prompt's tokens into p->toks, or p's ERROR: a template that cannot
 * render it, a tokenizer failure, or a prompt that cannot fit, refused by
 * the bound before tokenizing or by tokenizing it only until it passes
 * ctx tokens. */
static void prep_tokens(const Thinker *t, Prep *p) {
    const OmniRequest *r = &p->req;
    const char        *param = r->chat ? "messages" : "prompt";
    const char        *text = r->prompt;
    size_t             len = r->prompt_len;
    int64_t            least, n;
    bool               at_least;
    Err                err;

    if (r->chat) {
        unsigned flags = CHAT_ADD_GEN | (r->thinking ? 0 : CHAT_NO_THINK);
        long     clen = runtime_render_chat(&t->rt, r->msgs, r->n_msgs, flags,
                                            &p->chat, &p->chat_cap, p->ends,
                                            &err);

        if (clen < 0) {
            prep_fail(p, 400, param, NULL, "%s", err.msg);
            return;
        }
        text = p->chat;
        len = (size_t) clen;
        p->chat_len = len;
    }
    least = prompt_bound_tokens(&t->bound,
                                prompt_bound_bytes(&t->bound, text, len))
            + (tokenizer_adds_bos(t->rt.tk) ? 1 : 0);
    n = least >= t->ctx ? least
        : tokenizer_encode_upto(t->rt.tk, text, len, true, r->chat, p->toks,
                                t->ctx, &err);
    at_least = least >= t->ctx || n > t->ctx;
    if (n < 0) {
        prep_fail(p, 400, param, NULL, "%s", err.msg);
        return;
    }
    if (n >= t->ctx) {
        prep_fail(p, 400, param, "context_length_exceeded",
                  PROMPT_TOO_LONG_FMT, t->ctx, param,
                  at_least ? "at least " : "", n, param);
        return;
    }
    p->n = n;
}

/* The prefix keys the request is to be published under (prefix_keys.h),
 * from the rendered chat and its tokens; none when the tokens cannot be
 * matched to the text (said at debug: it only costs routing a hint). */
static void prep_keys(const Thinker *t, Prep *p) {
    int n = pkeys_chain_len(&p->req);
    Err err;

    if (n == 0) return;
    if (pkeys_bytes_to_tokens(t->rt.tk, p->chat, p->chat_len, p->toks, p->n,
                              p->ends, n, &err) != 0)
    {
        log_msg(LOG_DEBUG, "thinker: request %" PRIu64 " publishes no "
                "prefix keys: %s", p->id, err.msg);
        return;
    }
    p->n_keys = pkeys_request(&p->req, p->ends, p->toks, p->n,
                              t->cfg->block_size, p->keys);
}

/* Parses and checks p->json, then tokenizes. Sets p->status (0: ready for
 * the scheduler, p->req and p->toks[0..n) hold it). */
static void prep_run(const Thinker *t, Prep *p) {
    ReqError e;

    p->status = 0;
    p->n_keys = 0;
    if (request_parse(&p->req, p->json, p->len, &e) != 0) {
        prep_fail(p, e.status, e.param, NULL, "%s", e.err.msg);
        return;
    }
    p->parsed = true;
    if (p->req.model != NULL && strcmp(p->req.model, t->name) != 0) {
        prep_fail(p, 404, "model", "model_not_found", "The model `%.200s` "
                  "does not exist or you do not have access to it.",
                  p->req.model);
        return;
    }
    if (p->req.input != NULL) {     // the frontend routes these elsewhere
        prep_fail(p, 400, "input", NULL, "input is text to speak; the "
                  "thinker takes messages or a prompt");
        return;
    }
    prep_tokens(t, p);
    if (p->status == 0 && p->ends != NULL && p->req.chat) prep_keys(t, p);
}

/* Queues a prepared request, or emits its ERROR; releases its request. */
static void prep_finish(Thinker *t, Prep *p) {
    const OmniRequest *r = &p->req;
    SeqParams          sp;

    if (p->status != 0) {
        stage_error(t->st, p->id, p->status, p->status < 500
                 ? "invalid_request_error" : "server_error",
                 p->param[0] != '\0' ? p->param : NULL, p->code, p->msg);
    } else {
        memset(&sp, 0, sizeof(sp));
        sp.max_tokens = r->max_tokens;
        sp.sampling = r->sampling;
        memcpy(sp.stop, r->stop, sizeof(sp.stop));
        sp.n_stop = r->n_stop;
        sp.ignore_eos = r->ignore_eos;
        sp.think = r->chat && r->thinking && chat_thinks(t->rt.tmpl);
        sp.cache_salt = r->cache_salt;
        sp.cache_salt_len = r->cache_salt_len;
        sp.prompt_param = r->chat ? "messages" : "prompt";
        if (sched_submit(t->sched, p->id, p->toks, p->n, &sp) == 0
            && p->n_keys > 0)
        {
            pidx_add(t->pidx, p->id, p->keys, p->n_keys, clock_now_s());
        }
    }
    if (p->parsed) request_free(&p->req);
    p->parsed = false;
}

static void prep_job_run(WorkJob *w) {
    PrepJob *j = (PrepJob *) w;

    prep_run(j->t, &j->p);
}

static void prep_job_free(PrepJob *j) {
    if (j->p.parsed) request_free(&j->p.req);
    free(j->p.toks);
    free(j->p.chat);
    free(j->p.ends);
    free(j->json);
    free(j);
}

/* A large SUBMIT goes to the helper thread with a copy of its JSON (the
 * frame reader's buffer takes the next frame at once). Returns false when
 * it could not be sent there: the caller prepares it inline. Past
 * max_queue + 1 jobs out, it is refused as by the scheduler's full queue
 * (a job holds a copy of its request). */
static bool prep_offload(Thinker *t, uint64_t id, const char *json,
                         size_t len)
{
    PrepJob *j;

    if (!t->wq_up || len <= PREP_INLINE_MAX) return false;
    if (t->n_jobs > t->cfg->max_queue) {
        char msg[96];

        snprintf(msg, sizeof(msg), "the server is overloaded: %d requests "
                 "are being prepared", t->n_jobs);
        stage_error(t->st, id, 503, "server_error", NULL, "overloaded",
                    msg);
        return true;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) return false;
    j->json = malloc(len);
    j->p.toks = malloc((size_t) (t->ctx + 1) * sizeof(int32_t));
    if (t->pidx != NULL) {
        j->p.ends = malloc(REQ_MAX_MESSAGES * sizeof(size_t));
    }
    if (j->json == NULL || j->p.toks == NULL
        || (t->pidx != NULL && j->p.ends == NULL))
    {
        prep_job_free(j);
        return false;
    }
    memcpy(j->json, json, len);
    j->w.run = prep_job_run;
    j->t = t;
    j->p.id = id;
    j->p.json = j->json;
    j->p.len = len;
    j->next = t->jobs;
    t->jobs = j;
    t->n_jobs++;
    workq_push(&t->wq, &j->w);
    return true;
}

/* Prepared jobs back from the helper thread: queued, unless cancelled
 * meanwhile (then dropped without a word, as a CANCEL wants). */
static void prep_done(Thinker *t) {
    WorkJob *w = workq_done(&t->wq), *next;

    for (; w != NULL; w = next) {
        PrepJob  *j = (PrepJob *) w;
        PrepJob **pp = &t->jobs;

        next = w->next;
        while (*pp != j) pp = &(*pp)->next;
        *pp = j->next;
        t->n_jobs--;
        if (!j->cancelled && w->ran) {
            prep_finish(t, &j->p);
        } else if (!j->cancelled) {
            stage_error(t->st, j->p.id, 503, "server_error", NULL,
                        "engine_shutdown", "the engine's thinker stage is "
                        "stopping");
        }
        prep_job_free(j);
    }
}

/* A CANCEL: wherever the request is, it goes without a word but the ack.
 * The thinker holds no pool block, and a prep job still out only reads
 * its own copy of the JSON, so nothing of the request is held that the
 * frontend could reclaim: the ack goes at once. */
static void thinker_cancel(Stage *s, uint64_t id) {
    Thinker *t = s->ud;

    for (PrepJob *j = t->jobs; j != NULL; j = j->next) {
        if (j->p.id == id) j->cancelled = true;
    }
    sched_cancel(t->sched, id);
    if (t->pidx != NULL) pidx_end(t->pidx, id);
    stage_cancelled(s, id);
}

static void thinker_submit(Stage *s, uint64_t id, const char *json,
                           size_t len)
{
    Thinker *t = s->ud;
    Prep     p = { .id = id, .json = json, .len = len, .toks = t->toks,
               .chat = t->chat, .chat_cap = t->chat_cap, .ends = t->ends };

    if (prep_offload(t, id, json, len)) return;
    prep_run(t, &p);
    t->chat = p.chat;                   // the scratch, maybe grown
    t->chat_cap = p.chat_cap;
    prep_finish(t, &p);
}

static bool thinker_idle(Stage *s) {
    return sched_idle(((Thinker *) s->ud)->sched);
}

static void thinker_step(Stage *s) {
    sched_step(((Thinker *) s->ud)->sched);
}

static void thinker_wake(Stage *s) {
    prep_done(s->ud);
}


/* ---- Prefix routing -----------------------------------------------------
 * The index decides, the publisher writes: operations go from one to the
 * other through the publisher's queue, and when one is lost (the queue
 * was full) everything held goes again after a RESET once there is room.
 * The counters on the stats page are the index's. */

static void prefix_op(void *ud, PidxOp op, OmniPkey key, int32_t tokens) {
    Thinker *t = ud;
    PubOp    o = { key, tokens, op == PIDX_SET ? PUB_SET : PUB_DEL };

    if (t->pub_lost || pub_push(t->pub, &o)) return;
    t->pub_lost = true;
    log_msg(LOG_DEBUG, "thinker: the prefix publisher's queue is full; "
            "everything held goes again");
}

/* RESET and every held key, once the queue has room for all of it. */
static void prefix_resend(Thinker *t) {
    PubOp      reset = { { 0, 0 }, 0, PUB_RESET };
    PidxCounts c;

    pidx_counts(t->pidx, &c);
    if (pub_room(t->pub) <= c.held) return;
    t->pub_lost = false;
    pub_push(t->pub, &reset);
    pidx_resend(t->pidx);
}

static void prefix_stats(Thinker *t) {
    OmniStats *s = t->st->stats;
    PidxCounts c;

    if (s == NULL) return;
    pidx_counts(t->pidx, &c);
    atomic_store_explicit(&s->thinker.prefix_keys_held, c.held,
                          memory_order_relaxed);
    atomic_fetch_add_explicit(&s->thinker.prefix_keys_published,
                              c.published - t->shown.published,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->thinker.prefix_keys_removed,
                              c.removed - t->shown.removed,
                              memory_order_relaxed);
    t->shown = c;
}

/* The loop's tick: the index syncs with the KV cache, at most every
 * PREFIX_SYNC_S. */
static void thinker_tick(Stage *s) {
    Thinker *t = s->ud;
    double   now;

    if (t->pidx == NULL) return;
    now = clock_now_s();
    if (now < t->next_sync) return;
    t->next_sync = now + PREFIX_SYNC_S;
    if (pub_want_resend(t->pub)) t->pub_lost = true;
    pidx_sync(t->pidx, sched_kv(t->sched), now);
    if (t->pub_lost) prefix_resend(t);
    prefix_stats(t);
}

/* With --redis: the publisher, and with the prefix cache the index (its
 * capacity PIDX_PER_BLOCK entries per KV block) and the inline
 * preparation's scratch. Redis being down is no failure here. */
static int start_prefixes(Thinker *t, Err *err) {
    const ServeConfig *cfg = t->cfg;
    OmniStats         *st = t->st->stats;
    char               route[300], pw[PUB_PASSWORD_MAX];
    PubConfig          pc = { 0 };
    int64_t            cap = PIDX_PER_BLOCK * sched_kv(t->sched)->n_blocks;

    if (cfg->redis == NULL) return 0;
    cap = cap < PIDX_MIN ? PIDX_MIN : cap > PIDX_MAX ? PIDX_MAX : cap;
    if (redis_addr_parse(cfg->redis, &pc.addr, err) != 0) {
        return err_prefix(err, "--redis");
    }
    if (cfg->redis_password_file != NULL) {
        if (redis_read_password(cfg->redis_password_file, pw, sizeof(pw),
                                err) != 0)
        {
            return err_prefix(err, "--redis-password-file");
        }
        pc.password = pw;
    }
    snprintf(route, sizeof(route), "%s%s", cfg->route_id ? "" : "unix:",
             cfg->route_id ? cfg->route_id : cfg->socket_path);
    pc.addr_text = cfg->redis;
    pc.user = cfg->redis_user;
    pc.db = cfg->redis_db;
    pc.ns = cfg->redis_namespace != NULL ? cfg->redis_namespace : "omni:";
    pc.route = route;
    pc.ttl_s = cfg->prefix_ttl_s;
    pc.max_seqs = cfg->max_seqs;
    pc.max_keys = cap;
    pc.stats = st;
    t->pub = pub_start(&pc, err);
    explicit_bzero(pw, sizeof(pw));
    if (t->pub == NULL) return -1;
    if (st != NULL) atomic_store(&st->thinker.prefix_publishing, 1);
    if (!cfg->prefix_cache) {
        log_msg(LOG_WARN, "thinker: --no-prefix-cache: only the load is "
                "published to redis, no prefix keys");
        return 0;
    }
    t->pidx = pidx_new(cap, prefix_op, t, err);
    t->ends = malloc(REQ_MAX_MESSAGES * sizeof(size_t));
    if (t->pidx == NULL) return -1;
    if (t->ends == NULL) return err_set(err, "out of memory");
    return 0;
}


/* ---- Startup ------------------------------------------------------------ */

static int load_model(Thinker *t, Err *err) {
    const ServeConfig *cfg = t->cfg;
    const ModelConfig *c = &t->rt.m.c;
    double             t0 = clock_now_s();

    if (runtime_load(&t->rt, cfg->model_path, cfg->mmap ? GGUF_MAP
                     : GGUF_COPY, err) != 0)
    {
        return -1;
    }
    if (t->rt.tmpl_unknown) {
        log_msg(LOG_WARN, "thinker: unrecognised chat template, using the "
                "plain format");
    }
    log_msg(LOG_INFO, "thinker: loaded %s (%d layers, dim %d, vocab %d, "
            "chat template %s) in %.2f s", cfg->model_path, c->n_layers,
            c->dim, c->n_vocab, chat_name(t->rt.tmpl), clock_now_s() - t0);
    return 0;
}

/* MiB of a device backend's budget the pool may take: whole blocks of
 * what is left after the weights, less the scheduler's activations and
 * the warm-up's own forward (one block, one token). */
static double device_pool_mb(Thinker *t, uint64_t block_bytes) {
    const ModelConfig *c = &t->rt.m.c;
    Backend           *be = t->rt.be;
    uint64_t           act = runstate_bytes(c, t->cfg->max_batch_tokens,
                                            t->cfg->max_seqs)
                             + runstate_bytes(c, 1, 1) + block_bytes;

    return (double) kv_blocks_fit(be->budget_left(be), act, block_bytes)
           * (double) block_bytes / 1048576.0;
}

/* Blocks in the pool: what cfg->kv_cache_mb holds (when 0: 1024 MiB on
 * the CPU, on a device what its memory budget has left), but no more than
 * max_seqs full contexts can use, and at least one full context (else the
 * longest request could never finish). */
static int pool_blocks(Thinker *t, int64_t *n_blocks, Err *err) {
    const ModelConfig *c = &t->rt.m.c;
    const ServeConfig *cfg = t->cfg;
    int                bs = cfg->block_size;
    uint64_t           bytes = kv_block_bytes(c->n_layers, c->n_kv_heads,
                                              c->head_dim, bs);
    bool               dev = t->rt.be->budget_left != NULL;
    double             mb = cfg->kv_cache_mb > 0 ? cfg->kv_cache_mb
                            : dev ? device_pool_mb(t, bytes) : DEFAULT_KV_MB;
    int64_t            per_ctx = (t->ctx + bs - 1) / bs;
    double             n = mb * 1048576.0 / (double) bytes;

    if (n > (double) per_ctx * cfg->max_seqs) {
        n = (double) per_ctx * cfg->max_seqs;
    }
    if (n > INT32_MAX) n = INT32_MAX;
    *n_blocks = (int64_t) n;
    if (*n_blocks < per_ctx && dev && cfg->kv_cache_mb == 0) {
        return err_set(err, "the GPU memory left after the weights (%.0f "
                       "MiB) holds %" PRId64 " KV blocks of %d tokens; one "
                       "context of %" PRId64 " tokens needs %" PRId64 ": "
                       "raise --gpu-memory-fraction or lower --ctx or "
                       "--max-batch-tokens", mb, *n_blocks, bs, t->ctx,
                       per_ctx);
    }
    if (*n_blocks < per_ctx) {
        return err_set(err, "--kv-cache-mb %g holds %" PRId64 " blocks of %d "
                       "tokens; one context of %" PRId64 " tokens needs %"
                       PRId64 " (%.1f MiB): raise --kv-cache-mb or lower "
                       "--ctx", mb, *n_blocks, bs, t->ctx, per_ctx,
                       (double) per_ctx * (double) bytes / 1048576.0);
    }
    log_msg(LOG_INFO, "thinker: KV pool of %" PRId64 " blocks of %d tokens, "
            "%.1f MiB (%.1f contexts of %" PRId64 " tokens)", *n_blocks, bs,
            (double) *n_blocks * (double) bytes / 1048576.0,
            (double) *n_blocks / (double) per_ctx, t->ctx);
    return 0;
}

static int make_scheduler(Thinker *t, Err *err) {
    const ServeConfig *cfg = t->cfg;
    SchedEvents        ev = { t, ev_started, ev_text, ev_done, ev_error };
    SchedConfig        sc;

    if (cfg->block_size < 1) return err_set(err, "--block-size must be >= 1");
    sc.max_batch_tokens = cfg->max_batch_tokens;
    sc.max_seqs = cfg->max_seqs;
    sc.max_queue = cfg->max_queue;
    sc.block_size = cfg->block_size;
    sc.max_ctx = t->ctx;
    sc.prefix_cache = cfg->prefix_cache;
    if (pool_blocks(t, &sc.n_blocks, err) != 0) return -1;
    t->sched = sched_new(&t->rt.m, t->rt.tk, t->rt.be, &sc, &ev, t->st->stats, err);
    return t->sched != NULL ? 0 : -1;
}

/* The thinker's gauges in the stats page, reset as the skeleton resets
 * the generic ones: a new stage starts from nothing. */
static void reset_stats(Thinker *t) {
    OmniStats *s = t->st->stats;

    if (s == NULL) return;
    atomic_store(&s->thinker.kv_blocks_used, 0);
    atomic_store(&s->thinker.kv_blocks_cached, 0);
    atomic_store(&s->thinker.kv_blocks_free, 0);
    atomic_store(&s->thinker.kv_blocks_total, 0);
    atomic_store(&s->thinker.prefix_publishing, 0);
    atomic_store(&s->thinker.prefix_keys_held, 0);
    atomic_store(&s->thinker.redis_up, 0);
}

/* The backend --backend asks for, sized for the scheduler's steps; a note
 * from "auto" (why not CUDA) is logged once. */
static int make_backend(Thinker *t, Err *err) {
    const ServeConfig *cfg = t->cfg;
    BackendConfig      bc = { 0 };

    bc.backend = cfg->backend;
    bc.n_threads = cfg->threads;
    bc.isa = cfg->isa;
    bc.max_tokens = cfg->max_batch_tokens;
    bc.max_out = cfg->max_seqs;
    bc.max_ctx = t->ctx;
    bc.block_size = cfg->block_size;
    bc.gpu_memory_fraction = cfg->gpu_memory_fraction;
    if (runtime_backend(&t->rt, &bc, err) != 0) return -1;
    if (bc.note[0] != '\0') log_msg(LOG_INFO, "thinker: %s", bc.note);
    return 0;
}

/* One forward pass of one token through a one-block cache of its own:
 * starts the thread pool and touches the weights before READY. */
static int warm_up(Thinker *t, Err *err) {
    const ModelConfig *c = &t->rt.m.c;
    KVCache            kv;
    RunState           rs;
    int32_t            tok = tokenizer_bos(t->rt.tk) >= 0 ? tokenizer_bos(t->rt.tk)
                                                       : 0;
    int32_t            pos = 0, table = 0, out = 0;
    const int32_t     *tables = &table;
    TokenBatch         b = { 1, &pos, &tables };
    double             t0 = clock_now_s();

    if (kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim,
                t->cfg->block_size, 1, t->rt.be, err) != 0)
    {
        return -1;
    }
    if (runstate_init(&rs, c, 1, 1, t->rt.be, err) != 0) {
        kv_free(&kv);
        return -1;
    }
    table = kv_alloc_block(&kv);
    model_forward(&t->rt.m, t->rt.be, &kv, &rs, &tok, &b, &out, 1);
    runstate_free(&rs);
    kv_free(&kv);
    log_msg(LOG_INFO, "thinker: warm-up forward in %.3f s",
            clock_now_s() - t0);
    return 0;
}

/* READY: {"id": name, "max_model_len": ctx, "kernels": set,
 * "max_piece_bytes": n, "ws_free": bool}. */
static int say_ready(Thinker *t, Err *err) {
    char more[160];

    snprintf(more, sizeof(more), ",\"max_model_len\":%" PRId64 ",\"kernels\":"
             "\"%s\",\"max_piece_bytes\":%" PRIu32 ",\"ws_free\":%s", t->ctx,
             t->rt.be->name, t->bound.max_piece,
             t->bound.ws_free ? "true" : "false");
    if (stage_ready(t->st, t->name, more, err) != 0) return -1;
    log_msg(LOG_INFO, "thinker: ready, serving \"%s\" with a context of %"
            PRId64 " tokens on the %s kernel set", t->name, t->ctx,
            t->rt.be->name);
    return 0;
}

/* The stage's start (stage.h): builds a Thinker into s->ud. */
static int thinker_start(Stage *s, const ServeConfig *cfg, Err *err) {
    Thinker *t = calloc(1, sizeof(*t));
    int64_t  n_ctx;

    if (t == NULL) return err_set(err, "out of memory");
    s->ud = t;
    t->st = s;
    t->cfg = cfg;
    serve_model_name(cfg, t->name, sizeof(t->name));
    if (load_model(t, err) != 0) return -1;
    n_ctx = t->rt.m.c.n_ctx;
    t->ctx = cfg->ctx > 0 ? cfg->ctx : n_ctx < RUNTIME_CTX_DEFAULT_MAX
                                       ? n_ctx : RUNTIME_CTX_DEFAULT_MAX;
    if (t->ctx > n_ctx) {
        return err_set(err, "--ctx %" PRId64 " is more than the model's "
                       "context of %" PRId64 " tokens", t->ctx, n_ctx);
    }
    tokenizer_text_bound(t->rt.tk, &t->bound.max_piece, &t->bound.ws_free);
    t->toks = malloc((size_t) (t->ctx + 1) * sizeof(int32_t));
    if (t->toks == NULL) return err_set(err, "out of memory");
    if (make_backend(t, err) != 0) return -1;
    reset_stats(t);
    if (make_scheduler(t, err) != 0 || start_prefixes(t, err) != 0
        || warm_up(t, err) != 0 || workq_init(&t->wq, PREP_NICE, err) != 0)
    {
        return -1;
    }
    t->wq_up = true;
    s->wake_fd = t->wq.efd;
    return say_ready(t, err);
}

/* The stage's stop (stage.h): what the helper thread prepared goes first,
 * then every request still held ends with an ERROR; then t is freed. */
static void thinker_stop(Stage *s) {
    Thinker *t = s->ud;

    if (t == NULL) return;
    if (t->wq_up) {
        workq_stop(&t->wq);
        prep_done(t);
        workq_free(&t->wq);
    }
    if (t->sched != NULL) {
        sched_abort_all(t->sched, "the engine's thinker stage is stopping");
    }
    pub_stop(t->pub);
    pidx_free(t->pidx);
    free(t->ends);
    sched_free(t->sched);
    runtime_free(&t->rt);
    free(t->toks);
    free(t->chat);
    free(t);
    s->ud = NULL;
}

const StageOps thinker_stage = {
    .name = "thinker",
    .start = thinker_start,
    .submit = thinker_submit,
    .cancel = thinker_cancel,
    .idle = thinker_idle,
    .step = thinker_step,
    .wake = thinker_wake,
    .tick = thinker_tick,
    .stop = thinker_stop,
};

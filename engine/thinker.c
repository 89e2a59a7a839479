/* thinker.c -- the thinker stage process: the model, the scheduler, and
 * the frontend channel of stage.h.
 *
 * Startup builds, in order: the model (copied into huge-page memory and
 * repacked for the backend, unless cfg->mmap maps it), the tokenizer, the
 * CPU backend, the scheduler with its KV pool, the stats page. One warm-up
 * forward pass (its own one-block cache, so the scheduler's state and the
 * counters are untouched) brings the thread pool up and faults the weights
 * in; then READY goes out. Any failure before READY is a startup failure:
 * thinker_main returns -1 and the process exits.
 *
 * Then one loop, single-threaded:
 *
 *   poll      ipc_fd for SUBMIT/CANCEL (and POLLOUT while output waits);
 *             timeout 0 while the scheduler has work, STAGE_BEAT_MS when
 *             idle (so the heartbeat goes on)
 *   read      every whole frame available: SUBMIT is parsed, checked,
 *             rendered and tokenized, then queued; CANCEL frees at once
 *   step      one scheduler step, its events queued as frames
 *   flush     as much output as the socket takes
 *
 * Each turn, each frame and each step writes the heartbeat in the stats
 * page (stage.h): the frontend's only evidence that this loop still runs.
 *
 * A prompt that cannot fit the context is refused before it costs a
 * full tokenization: first by the text bound (stage.h's PromptBound, one
 * pass at most over the text), else by tokenizing it only until it passes
 * ctx tokens (tokenizer_encode_upto; the error then says "at least").
 *
 * Output is bounded: past WRITE_HIGH bytes unsent the loop stops stepping
 * and waits for the frontend to drain (it always does), so a stalled
 * reader costs no memory growth. Requests are parsed again here although
 * the frontend checked them: the stage must not trust its input more than
 * a parse costs, and the frontend stays free of model state.
 *
 * EOF on ipc_fd means the frontend is gone or wants this stage gone:
 * every request is ended and thinker_main returns 0. SIGTERM and SIGINT
 * are ignored; a terminal's ^C reaches the whole process group and the
 * frontend decides how the stage ends. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "frame.h"
#include "kernels.h"
#include "model.h"
#include "request.h"
#include "scheduler.h"
#include "serve.h"
#include "stage.h"
#include "tokenizer.h"

#define WRITE_HIGH      (8u << 20)  // unsent output that pauses stepping
#define DEFAULT_KV_MB   1024.0
#define DEFAULT_CTX_MAX 4096

typedef struct {
    const ServeConfig *cfg;         // borrowed
    int                fd;          // ipc_fd, non-blocking
    Model              m;
    bool               m_loaded;
    Tokenizer         *tk;          // owned
    Backend           *be;          // owned
    Scheduler         *sched;       // owned
    OmniStats         *stats;       // mapped page, or NULL without stats_fd
    ChatTemplate       tmpl;
    int64_t            ctx;         // tokens per sequence
    char               name[256];   // served model id
    FrameReader        rd;
    FrameWriter        wr;
    bool               nomem;       // the writer could not grow
    PromptBound        bound;       // the tokenizer's text bound
    int32_t           *toks;        // (ctx + 1,) prompt scratch, owned
    char              *chat;        // rendered chat scratch, owned, grows
    size_t             chat_cap;
} Thinker;


/* ---- Events out --------------------------------------------------------
 * Scheduler events become STAGE_EVENT frames: u64 id, then the client
 * frame (header and payload) the frontend passes on unchanged. */

static void put_event(Thinker *t, uint64_t id, uint8_t type, const void *p,
                      size_t n)
{
    uint8_t pre[8 + OMNI_FRAME_HDR];

    omni_wr64(pre, id);
    omni_hdr_encode(pre + 8, type, (uint32_t) n);
    if (frame_put2(&t->wr, OMNI_F_STAGE_EVENT, pre, sizeof(pre), p, n) != 0) {
        t->nomem = true;
    }
}

static void ev_started(void *ud, uint64_t id) {
    Thinker *t = ud;
    uint8_t  b[8];

    omni_wr64(b, id);
    if (frame_put(&t->wr, OMNI_F_STAGE_STARTED, b, sizeof(b)) != 0) {
        t->nomem = true;
    }
}

static void ev_text(void *ud, uint64_t id, const char *s, size_t n) {
    put_event(ud, id, OMNI_F_TEXT, s, n);
}

static void ev_done(void *ud, uint64_t id, const OmniDone *d) {
    uint8_t b[OMNI_DONE_LEN];

    omni_done_encode(b, d);
    put_event(ud, id, OMNI_F_DONE, b, sizeof(b));
}

/* The message is cut, at a character boundary, to fit OMNI_MAX_ERROR. */
static void ev_error(void *ud, uint64_t id, int status, const char *type,
                     const char *param, const char *code, const char *msg)
{
    static const char *none = "";
    uint8_t   b[OMNI_MAX_ERROR];
    OmniError e;
    size_t    room;

    e.status = (uint16_t) status;
    e.type = type;
    e.type_len = strlen(type);
    e.param = param != NULL ? param : none;
    e.param_len = strlen(e.param);
    e.code = code != NULL ? code : none;
    e.code_len = strlen(e.code);
    e.message = msg;
    e.message_len = strlen(msg);
    room = OMNI_MAX_ERROR - omni_error_size(e.type_len, e.param_len,
                                            e.code_len, 0);
    if (e.message_len > room) {
        e.message_len = room;
        while (e.message_len > 0
               && ((uint8_t) msg[e.message_len] & 0xc0) == 0x80)
        {
            e.message_len--;
        }
    }
    put_event(ud, id, OMNI_F_ERROR, b, omni_error_encode(b, &e));
}


/* ---- Requests in -------------------------------------------------------- */

/* Renders r's messages with the model's template into t->chat. Returns
 * the length, or -1 with err set. */
static long render_chat(Thinker *t, const OmniRequest *r, Err *err) {
    long len = chat_render(t->tmpl, r->msgs, r->n_msgs, true, t->chat,
                           t->chat_cap, err);

    if (len >= 0 && (size_t) len >= t->chat_cap) {
        char *grown = realloc(t->chat, (size_t) len + 1);

        if (grown == NULL) return err_set(err, "out of memory");
        t->chat = grown;
        t->chat_cap = (size_t) len + 1;
        len = chat_render(t->tmpl, r->msgs, r->n_msgs, true, t->chat,
                          t->chat_cap, err);
    }
    return len;
}

/* The prompt's tokens into t->toks. Returns their count (< ctx), or -1
 * when the request was answered here with an ERROR: a template that cannot
 * render it, a tokenizer failure, or a prompt that cannot fit (refused by
 * the bound before tokenizing, or by the exact count that tokenizing into
 * ctx + 1 slots returns however long the text is). */
static int64_t prompt_tokens(Thinker *t, uint64_t id, const OmniRequest *r,
                             const char *param)
{
    const char *text = r->prompt;
    size_t      len = r->prompt_len;
    int64_t     least, n;
    Err         err;

    if (r->chat) {
        long clen = render_chat(t, r, &err);

        if (clen < 0) {
            ev_error(t, id, 400, "invalid_request_error", param, NULL,
                     err.msg);
            return -1;
        }
        text = t->chat;
        len = (size_t) clen;
    }
    least = prompt_bound_tokens(&t->bound,
                                prompt_bound_bytes(&t->bound, text, len))
            + (tokenizer_adds_bos(t->tk) ? 1 : 0);
    if (sched_check_length(t->sched, id, least, true, param) != 0) return -1;
    n = tokenizer_encode_upto(t->tk, text, len, true, r->chat, t->toks,
                              t->ctx, &err);
    if (n < 0) {
        ev_error(t, id, 400, "invalid_request_error", param, NULL, err.msg);
        return -1;
    }
    return sched_check_length(t->sched, id, n, n > t->ctx, param) == 0 ? n
                                                                       : -1;
}

/* Queues r as request id, or answers it with an ERROR. */
static void submit(Thinker *t, uint64_t id, const OmniRequest *r) {
    const char *param = r->chat ? "messages" : "prompt";
    int64_t     n = prompt_tokens(t, id, r, param);
    SeqParams   p;

    if (n < 0) return;
    memset(&p, 0, sizeof(p));
    p.max_tokens = r->max_tokens;
    p.sampling = r->sampling;
    memcpy(p.stop, r->stop, sizeof(p.stop));
    p.n_stop = r->n_stop;
    p.ignore_eos = r->ignore_eos;
    p.cache_salt = r->cache_salt;
    p.cache_salt_len = r->cache_salt_len;
    p.prompt_param = param;
    sched_submit(t->sched, id, t->toks, n, &p);
}

static void on_submit(Thinker *t, uint64_t id, const char *json, size_t len)
{
    OmniRequest r;
    ReqError    e;
    char        why[400];

    if (request_parse(&r, json, len, &e) != 0) {
        ev_error(t, id, 400, "invalid_request_error",
                 e.param[0] != '\0' ? e.param : NULL, NULL, e.err.msg);
        return;
    }
    if (r.model != NULL && strcmp(r.model, t->name) != 0) {
        snprintf(why, sizeof(why), "The model `%.200s` does not exist or "
                 "you do not have access to it.", r.model);
        ev_error(t, id, 404, "invalid_request_error", "model",
                 "model_not_found", why);
    } else {
        submit(t, id, &r);
    }
    request_free(&r);
}

/* ---- Liveness (stage.h) -------------------------------------------------- */

static void beat(Thinker *t) {
    if (t->stats == NULL) return;
    atomic_store_explicit(&t->stats->heartbeat_us, stage_clock_us(),
                          memory_order_relaxed);
}

/* One scheduler step between two beats, with its start published while it
 * runs (health tells a long step from a stalled loop) and the longest
 * step kept (what --stage-kill-after must stay above). */
static void step(Thinker *t) {
    OmniStats *st = t->stats;
    int64_t    t0 = stage_clock_us(), t1;

    if (st != NULL) {
        atomic_store_explicit(&st->heartbeat_us, t0, memory_order_relaxed);
        atomic_store_explicit(&st->step_start_us, t0, memory_order_relaxed);
    }
    sched_step(t->sched);
    if (st == NULL) return;
    t1 = stage_clock_us();
    atomic_store_explicit(&st->step_start_us, 0, memory_order_relaxed);
    atomic_store_explicit(&st->heartbeat_us, t1, memory_order_relaxed);
    if (t1 - t0 > atomic_load_explicit(&st->step_max_us,
                                       memory_order_relaxed))
    {
        atomic_store_explicit(&st->step_max_us, t1 - t0,
                              memory_order_relaxed);
    }
}

/* Handles every whole frame that can be read now. Returns 1 at EOF, 0
 * when more may come, -1 with err set when the frontend broke the
 * protocol (a bug there: this stage exits and is restarted). */
static int read_frames(Thinker *t, Err *err) {
    FrameStatus st;
    bool        eof;

    while ((st = frame_read_fd(&t->rd, t->fd, &eof)) == FRAME_READY) {
        const uint8_t *p = t->rd.payload;
        uint32_t       len = t->rd.hdr.len;

        if (len < 8) {
            return err_set(err, "frontend sent a stage frame of %u bytes, "
                           "without a request id", len);
        }
        switch (t->rd.hdr.type) {
        case OMNI_F_STAGE_SUBMIT:
            on_submit(t, omni_rd64(p), (const char *) p + 8, len - 8);
            break;
        case OMNI_F_STAGE_CANCEL:
            sched_cancel(t->sched, omni_rd64(p));
            break;
        default:
            return err_set(err, "frontend sent stage frame type %u, which "
                           "a stage does not take", t->rd.hdr.type);
        }
        frame_reader_next(&t->rd);
        beat(t);
    }
    if (st == FRAME_BAD) {
        return err_set(err, "frontend channel: %s", t->rd.error);
    }
    if (st == FRAME_NOMEM) {
        return err_set(err, "out of memory reading a frame");
    }
    return eof ? 1 : 0;
}


/* ---- Startup ------------------------------------------------------------ */

/* The served id: cfg->model_name, else the file name without directory
 * and ".gguf". */
static void served_name(const ServeConfig *cfg, char *out, size_t cap) {
    const char *base = strrchr(cfg->model_path, '/');
    size_t      n;

    if (cfg->model_name != NULL && cfg->model_name[0] != '\0') {
        snprintf(out, cap, "%s", cfg->model_name);
        return;
    }
    base = base != NULL ? base + 1 : cfg->model_path;
    n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0) n -= 5;
    snprintf(out, cap, "%.*s", (int) n, base);
}

static int load_model(Thinker *t, Err *err) {
    const ServeConfig *cfg = t->cfg;
    GGUFStr            tmpl = { NULL, 0 };
    bool               known;
    double             t0 = clock_now_s();

    if (model_load(&t->m, cfg->model_path, cfg->mmap ? GGUF_MAP : GGUF_COPY,
                   err) != 0)
    {
        return -1;
    }
    t->m_loaded = true;
    t->tk = tokenizer_new(&t->m.gguf, err);
    if (t->tk == NULL) return err_prefix(err, "%s", cfg->model_path);
    if (tokenizer_n_vocab(t->tk) != t->m.c.n_vocab) {
        return err_set(err, "%s: the tokenizer has %d tokens but the "
                       "embedding has %d rows", cfg->model_path,
                       tokenizer_n_vocab(t->tk), t->m.c.n_vocab);
    }
    gguf_get_str(&t->m.gguf, "tokenizer.chat_template", &tmpl, NULL);
    t->tmpl = chat_detect(tmpl.ptr, tmpl.len, &known);
    if (tmpl.len > 0 && !known) {
        log_msg(LOG_WARN, "thinker: unrecognised chat template, using the "
                "plain format");
    }
    log_msg(LOG_INFO, "thinker: loaded %s (%d layers, dim %d, vocab %d, "
            "chat template %s) in %.2f s", cfg->model_path, t->m.c.n_layers,
            t->m.c.dim, t->m.c.n_vocab, chat_name(t->tmpl),
            clock_now_s() - t0);
    return 0;
}

static int make_backend(Thinker *t, Err *err) {
    const ModelConfig *c = &t->m.c;
    BackendConfig      bc;
    char               msg[ERR_MAX];
    int64_t            wide = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;

    if (wide < (int64_t) c->n_heads * c->head_dim) {
        wide = (int64_t) c->n_heads * c->head_dim;
    }
    bc.n_threads = t->cfg->threads;
    bc.isa = t->cfg->isa;
    bc.max_tokens = t->cfg->max_batch_tokens;
    bc.max_cols = wide;
    bc.max_ctx = t->ctx;
    t->be = backend_cpu_new(&bc, msg, sizeof(msg));
    if (t->be == NULL) return err_set(err, "%s", msg);
    model_repack(&t->m, t->be);
    return 0;
}

/* Blocks in the pool: what cfg->kv_cache_mb holds (1024 MiB when 0), but
 * no more than max_seqs full contexts can use, and at least one full
 * context (else the longest request could never finish). */
static int pool_blocks(Thinker *t, int64_t *n_blocks, Err *err) {
    const ModelConfig *c = &t->m.c;
    const ServeConfig *cfg = t->cfg;
    int                bs = cfg->block_size;
    uint64_t           bytes = kv_block_bytes(c->n_layers, c->n_kv_heads,
                                              c->head_dim, bs);
    double             mb = cfg->kv_cache_mb > 0 ? cfg->kv_cache_mb
                                                 : DEFAULT_KV_MB;
    int64_t            per_ctx = (t->ctx + bs - 1) / bs;
    double             n = mb * 1048576.0 / (double) bytes;

    if (n > (double) per_ctx * cfg->max_seqs) {
        n = (double) per_ctx * cfg->max_seqs;
    }
    if (n > INT32_MAX) n = INT32_MAX;
    *n_blocks = (int64_t) n;
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
    t->sched = sched_new(&t->m, t->tk, t->be, &sc, &ev, t->stats, err);
    return t->sched != NULL ? 0 : -1;
}

/* Maps the frontend's stats page (stats_fd < 0: none). The frontend sized
 * it; a new stage resets the gauges and keeps the counters. */
static int map_stats(Thinker *t, int stats_fd, Err *err) {
    struct stat st;
    OmniStats  *s;

    if (stats_fd < 0) return 0;
    if (fstat(stats_fd, &st) != 0) {
        return err_set(err, "stats fd %d: %s", stats_fd, strerror(errno));
    }
    if ((size_t) st.st_size < sizeof(OmniStats)) {
        return err_set(err, "stats fd %d: %lld bytes, an OmniStats needs "
                       "%zu", stats_fd, (long long) st.st_size,
                       sizeof(OmniStats));
    }
    s = mmap(NULL, sizeof(OmniStats), PROT_READ | PROT_WRITE, MAP_SHARED,
             stats_fd, 0);
    if (s == MAP_FAILED) {
        return err_set(err, "stats fd %d: mmap: %s", stats_fd,
                       strerror(errno));
    }
    t->stats = s;
    if (s->magic != STATS_MAGIC) {
        return err_set(err, "stats fd %d: bad magic %#llx", stats_fd,
                       (unsigned long long) s->magic);
    }
    atomic_store(&s->requests_running, 0);
    atomic_store(&s->requests_waiting, 0);
    atomic_store(&s->kv_blocks_used, 0);
    atomic_store(&s->kv_blocks_cached, 0);
    atomic_store(&s->kv_blocks_free, 0);
    atomic_store(&s->kv_blocks_total, 0);
    atomic_store(&s->heartbeat_us, 0);
    atomic_store(&s->step_start_us, 0);
    atomic_store(&s->step_max_us, 0);
    atomic_store(&s->stage_pid, (int64_t) getpid());
    return 0;
}

/* One forward pass of one token through a one-block cache of its own:
 * starts the thread pool and touches the weights before READY. */
static int warm_up(Thinker *t, Err *err) {
    const ModelConfig *c = &t->m.c;
    KVCache            kv;
    RunState           rs;
    int32_t            tok = tokenizer_bos(t->tk) >= 0 ? tokenizer_bos(t->tk)
                                                       : 0;
    int32_t            pos = 0, table = 0, out = 0;
    const int32_t     *tables = &table;
    TokenBatch         b = { 1, &pos, &tables };
    double             t0 = clock_now_s();

    if (kv_init(&kv, c->n_layers, c->n_kv_heads, c->head_dim,
                t->cfg->block_size, 1, err) != 0)
    {
        return -1;
    }
    if (runstate_init(&rs, c, 1, 1, err) != 0) {
        kv_free(&kv);
        return -1;
    }
    table = kv_alloc_block(&kv);
    model_forward(&t->m, t->be, &kv, &rs, &tok, &b, &out, 1);
    runstate_free(&rs);
    kv_free(&kv);
    log_msg(LOG_INFO, "thinker: warm-up forward in %.3f s",
            clock_now_s() - t0);
    return 0;
}

/* READY: {"id": name, "max_model_len": ctx, "kernels": set,
 * "max_piece_bytes": n, "ws_free": bool}, the name JSON-escaped. The
 * first heartbeat goes out with it. */
static int say_ready(Thinker *t, Err *err) {
    char   buf[2 * sizeof(t->name) * 3 + 256];
    size_t n = 0;

    n += (size_t) snprintf(buf, sizeof(buf), "{\"id\":\"");
    for (const char *p = t->name; *p != '\0'; p++) {
        unsigned char ch = (unsigned char) *p;

        if (ch == '"' || ch == '\\') {
            buf[n++] = '\\';
            buf[n++] = (char) ch;
        } else if (ch < 0x20) {
            n += (size_t) snprintf(buf + n, sizeof(buf) - n, "\\u%04x", ch);
        } else {
            buf[n++] = (char) ch;
        }
    }
    n += (size_t) snprintf(buf + n, sizeof(buf) - n,
                           "\",\"max_model_len\":%" PRId64 ",\"kernels\":"
                           "\"%s\",\"max_piece_bytes\":%" PRIu32 ",\"ws_free\":"
                           "%s}", t->ctx, t->be->name, t->bound.max_piece,
                           t->bound.ws_free ? "true" : "false");
    beat(t);
    if (frame_put(&t->wr, OMNI_F_STAGE_READY, buf, n) != 0) {
        return err_set(err, "out of memory");
    }
    log_msg(LOG_INFO, "thinker: ready, serving \"%s\" with a context of %"
            PRId64 " tokens on the %s kernel set", t->name, t->ctx,
            t->be->name);
    return 0;
}

static int thinker_start(Thinker *t, int stats_fd, Err *err) {
    const ServeConfig *cfg = t->cfg;
    int64_t            n_ctx;

    served_name(cfg, t->name, sizeof(t->name));
    if (load_model(t, err) != 0) return -1;
    n_ctx = t->m.c.n_ctx;
    t->ctx = cfg->ctx > 0 ? cfg->ctx
                          : n_ctx < DEFAULT_CTX_MAX ? n_ctx : DEFAULT_CTX_MAX;
    if (t->ctx > n_ctx) {
        return err_set(err, "--ctx %" PRId64 " is more than the model's "
                       "context of %" PRId64 " tokens", t->ctx, n_ctx);
    }
    tokenizer_text_bound(t->tk, &t->bound.max_piece, &t->bound.ws_free);
    t->toks = malloc((size_t) (t->ctx + 1) * sizeof(int32_t));
    if (t->toks == NULL) return err_set(err, "out of memory");
    if (make_backend(t, err) != 0 || map_stats(t, stats_fd, err) != 0
        || make_scheduler(t, err) != 0 || warm_up(t, err) != 0)
    {
        return -1;
    }
    return say_ready(t, err);
}

static void thinker_free(Thinker *t) {
    sched_free(t->sched);
    if (t->be != NULL) t->be->free(t->be);
    if (t->stats != NULL) munmap(t->stats, sizeof(OmniStats));
    tokenizer_free(t->tk);
    if (t->m_loaded) model_free(&t->m);
    frame_reader_free(&t->rd);
    frame_writer_free(&t->wr);
    free(t->toks);
    free(t->chat);
}


/* ---- The loop ----------------------------------------------------------- */

/* Serves until EOF (returns 0) or a fatal channel error (-1, err set). */
static int serve(Thinker *t, Err *err) {
    for (;;) {
        size_t        pending = frame_writer_pending(&t->wr);
        bool          backlog = pending > WRITE_HIGH;
        struct pollfd p = { t->fd, POLLIN, 0 };
        int           rc;

        if (pending > 0) p.events |= POLLOUT;
        rc = poll(&p, 1, sched_idle(t->sched) || backlog ? STAGE_BEAT_MS
                                                         : 0);
        if (rc < 0 && errno != EINTR) {
            return err_set(err, "poll: %s", strerror(errno));
        }
        beat(t);
        if (rc > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            rc = read_frames(t, err);
            if (rc != 0) return rc > 0 ? 0 : -1;
        }
        if (!backlog && !sched_idle(t->sched)) step(t);
        if (t->nomem) return err_set(err, "out of memory queueing output");
        if (frame_flush(&t->wr, t->fd) != 0) {
            if (errno == EPIPE || errno == ECONNRESET) return 0;
            return err_set(err, "writing to the frontend: %s",
                           strerror(errno));
        }
    }
}

int thinker_main(const ServeConfig *cfg, int ipc_fd, int stats_fd, Err *err)
{
    Thinker t;
    int     rc, fl;

    memset(&t, 0, sizeof(t));
    t.cfg = cfg;
    t.fd = ipc_fd;
    frame_reader_init(&t.rd, OMNI_DIR_STAGE);
    frame_writer_init(&t.wr);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    fl = fcntl(ipc_fd, F_GETFL);
    if (fl < 0 || fcntl(ipc_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        err_set(err, "ipc fd %d: %s", ipc_fd, strerror(errno));
        thinker_free(&t);
        return -1;
    }
    rc = thinker_start(&t, stats_fd, err);
    if (rc == 0) rc = serve(&t, err);
    if (t.sched != NULL) {
        sched_abort_all(t.sched, "the engine's thinker stage is stopping");
        frame_flush(&t.wr, t.fd);
    }
    thinker_free(&t);
    return rc;
}

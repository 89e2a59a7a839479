/* metrics.c -- histograms, counters and the Prometheus text exposition;
 * see metrics.h for who counts what.
 *
 * Rendering builds the whole text in one TextBuf on every scrape. A scrape
 * is rare (seconds apart) and the text is a few KiB, so there is no cache
 * and no incremental update: each call reads the counters as they are. */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"

/* ---- Growable text ------------------------------------------------------ */

void tb_init(TextBuf *b) {
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

void tb_free(TextBuf *b) {
    free(b->p);
    tb_init(b);
}

static bool tb_reserve(TextBuf *b, size_t more) {
    size_t cap = b->cap ? b->cap : 4096;
    char  *p;

    if (b->oom) return false;
    while (cap - b->len <= more) cap *= 2;
    if (cap == b->cap) return true;
    p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void tb_printf(TextBuf *b, const char *fmt, ...) {
    va_list ap;
    int     n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !tb_reserve(b, (size_t) n + 1)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t) n;
}

/* ---- Histograms --------------------------------------------------------- */

/* vLLM's bounds, with finer steps at the low end: a small model on a CPU
 * produces tokens in about a millisecond. */
static const double TTFT_BOUNDS[] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
};
static const double ITL_BOUNDS[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
};
static const double E2E_BOUNDS[] = {
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
    7680.0,
};

#define COUNT(a) ((int) (sizeof(a) / sizeof((a)[0])))

void hist_init(Hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n = n < HIST_MAX_BUCKETS ? n : HIST_MAX_BUCKETS;
}

void hist_observe(Hist *h, double v, uint64_t k) {
    int i = 0;

    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i] += k;
    h->sum += v * (double) k;
    h->count += k;
}

/* ---- The frontend's metrics --------------------------------------------- */

void metrics_init(Metrics *m) {
    memset(m, 0, sizeof(*m));
    hist_init(&m->ttft, TTFT_BOUNDS, COUNT(TTFT_BOUNDS));
    hist_init(&m->itl, ITL_BOUNDS, COUNT(ITL_BOUNDS));
    hist_init(&m->e2e, E2E_BOUNDS, COUNT(E2E_BOUNDS));
    hist_init(&m->queue, E2E_BOUNDS, COUNT(E2E_BOUNDS));
    hist_init(&m->ttfa, TTFT_BOUNDS, COUNT(TTFT_BOUNDS));
}

/* Linear search: the table holds a handful of pairs, and an error is not
 * the hot path. Pairs beyond the table are folded into the last slot so a
 * stage sending many distinct codes cannot grow the exposition. */
void metrics_error(Metrics *m, int status, const char *code, size_t code_len)
{
    char        c[METRICS_CODE_MAX];
    ErrorCount *e;

    if (code == NULL) code_len = 0;
    if (code_len >= sizeof(c)) code_len = sizeof(c) - 1;
    if (code_len > 0) memcpy(c, code, code_len);
    c[code_len] = '\0';
    for (int i = 0; i < m->n_errors; i++) {
        e = &m->errors[i];
        if (e->status == status && strcmp(e->code, c) == 0) {
            e->n++;
            return;
        }
    }
    if (m->n_errors == METRICS_MAX_ERRORS - 1) {
        status = 0;
        strcpy(c, "other");
    }
    if (m->n_errors == METRICS_MAX_ERRORS) {
        m->errors[METRICS_MAX_ERRORS - 1].n++;
        return;
    }
    e = &m->errors[m->n_errors++];
    e->status = (uint16_t) status;
    memcpy(e->code, c, strlen(c) + 1);
    e->n = 1;
}

int64_t metrics_rss(int pid) {
    char  path[64];
    FILE *f;
    long  size, resident;
    int   ok;

    if (pid == 0) {
        snprintf(path, sizeof(path), "/proc/self/statm");
    } else {
        snprintf(path, sizeof(path), "/proc/%d/statm", pid);
    }
    f = fopen(path, "r");
    if (f == NULL) return -1;
    ok = fscanf(f, "%ld %ld", &size, &resident) == 2;
    fclose(f);
    return ok ? (int64_t) resident * sysconf(_SC_PAGESIZE) : -1;
}

/* ---- Rendering ---------------------------------------------------------- */

#define PFX "omni_engine_"

static void head(TextBuf *b, const char *name, const char *type,
                 const char *help)
{
    tb_printf(b, "# HELP " PFX "%s %s\n# TYPE " PFX "%s %s\n", name, help,
              name, type);
}

static void gauge(TextBuf *b, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    tb_printf(b, PFX "%s %.17g\n", name, v);
}

static void counter(TextBuf *b, const char *name, const char *help,
                    uint64_t v)
{
    head(b, name, "counter", help);
    tb_printf(b, PFX "%s %" PRIu64 "\n", name, v);
}

static void histogram(TextBuf *b, const char *name, const char *help,
                      const Hist *h)
{
    uint64_t cum = 0;

    head(b, name, "histogram", help);
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        tb_printf(b, PFX "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name,
                  h->bounds[i], cum);
    }
    tb_printf(b, PFX "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
    tb_printf(b, PFX "%s_sum %.17g\n", name, h->sum);
    tb_printf(b, PFX "%s_count %" PRIu64 "\n", name, h->count);
}

/* A label value with \, " and newline escaped as the format requires. */
static void label_value(TextBuf *b, const char *s) {
    for (; *s != '\0'; s++) {
        if (*s == '\\' || *s == '"') {
            tb_printf(b, "\\%c", *s);
        } else if (*s == '\n') {
            tb_printf(b, "\\n");
        } else {
            tb_printf(b, "%c", *s);
        }
    }
}

#define LOAD(f) atomic_load_explicit(&stats->f, memory_order_relaxed)

static void metrics_prefix(TextBuf *b, const OmniStats *stats);

void metrics_thinker(TextBuf *b, const OmniStats *stats) {
    int64_t total = LOAD(thinker.kv_blocks_total);
    int64_t used = LOAD(thinker.kv_blocks_used);

    gauge(b, "kv_cache_usage_perc", "Fraction of KV cache blocks in use by "
          "sequences (1 = full).", total > 0 ? (double) used / total : 0);
    head(b, "kv_cache_blocks", "gauge", "KV cache blocks by state.");
    tb_printf(b, PFX "kv_cache_blocks{state=\"free\"} %" PRId64 "\n"
              PFX "kv_cache_blocks{state=\"used\"} %" PRId64 "\n"
              PFX "kv_cache_blocks{state=\"cached\"} %" PRId64 "\n",
              LOAD(thinker.kv_blocks_free), used,
              LOAD(thinker.kv_blocks_cached));
    counter(b, "prefix_cache_queries_total", "Prompt tokens looked up in the "
            "prefix cache.", LOAD(thinker.prefix_cache_queries));
    counter(b, "prefix_cache_hits_total", "Prompt tokens found in the prefix "
            "cache.", LOAD(thinker.prefix_cache_hits));
    counter(b, "num_preemptions_total", "Sequences preempted (to be "
            "recomputed) when KV blocks ran out.", LOAD(thinker.preemptions));
    counter(b, "prompt_tokens_total", "Prompt tokens of admitted requests.",
            LOAD(thinker.prompt_tokens));
    counter(b, "generation_tokens_total", "Tokens generated.",
            LOAD(thinker.generation_tokens));
    counter(b, "steps_total", "Forward passes (scheduler steps).",
            LOAD(thinker.steps));
    counter(b, "step_tokens_total", "Tokens run in those forward passes.",
            LOAD(thinker.step_tokens));
    if (LOAD(thinker.prefix_publishing)) metrics_prefix(b, stats);
}

/* Prefix routing's, drawn with --redis only: without it there is nothing
 * to be up or down. */
static void metrics_prefix(TextBuf *b, const OmniStats *stats) {
    gauge(b, "prefix_keys_held", "Prefix keys (conversation prefixes) the "
          "KV cache holds and Redis is told of.",
          (double) LOAD(thinker.prefix_keys_held));
    counter(b, "prefix_keys_published_total", "Prefix keys published "
            "(their KV blocks were computed).",
            LOAD(thinker.prefix_keys_published));
    counter(b, "prefix_keys_removed_total", "Prefix keys removed (their KV "
            "blocks were evicted, or the index was full).",
            LOAD(thinker.prefix_keys_removed));
    gauge(b, "redis_up", "1 while the prefix publisher is connected to "
          "Redis.", (double) LOAD(thinker.redis_up));
    counter(b, "redis_errors_total", "Failed Redis connects and commands "
            "of the prefix publisher.", LOAD(thinker.redis_errors));
    counter(b, "prefix_resyncs_total", "Times every prefix key was written "
            "to Redis again (each connect, and after lost updates).",
            LOAD(thinker.prefix_resyncs));
}

/* The talker's counters (they add up over restarts: the page outlives
 * the process). */
void metrics_talker(TextBuf *b, const OmniStats *stats) {
    counter(b, "talker_chunks_total", "Speech-unit chunks the talker sent.",
            LOAD(talker.chunks));
    counter(b, "talker_words_total", "Words the talker analysed.",
            LOAD(talker.words));
    counter(b, "talker_phones_total", "Phones the talker produced (the "
            "requests' audio tokens).", LOAD(talker.phones));
}

void metrics_voicebox(TextBuf *b, const OmniStats *stats) {
    gauge(b, "voicebox_slots", "Requests the voicebox synthesizes at once "
          "at most (--voicebox-slots).", (double) LOAD(voicebox.slots));
    gauge(b, "voicebox_slots_busy", "Voicebox slots synthesizing now.",
          (double) LOAD(voicebox.slots_busy));
    counter(b, "voicebox_chunks_total", "Speech-unit chunks synthesized.",
            LOAD(voicebox.chunks));
}

void metrics_listener(TextBuf *b, const OmniStats *stats) {
    gauge(b, "listener_slots", "Audio inputs the listener recognises at "
          "once at most (--listener-slots).",
          (double) LOAD(listener.slots));
    gauge(b, "listener_slots_busy", "Listener slots recognising now.",
          (double) LOAD(listener.slots_busy));
    head(b, "listener_audio_seconds_total", "counter", "Seconds of input "
         "audio decoded.");
    tb_printf(b, PFX "listener_audio_seconds_total %.3f\n",
              (double) LOAD(listener.audio_ms) / 1e3);
    counter(b, "listener_segments_total", "Transcript segments (utterances)"
            " recognised.", LOAD(listener.segments));
    counter(b, "listener_words_total", "Words recognised.",
            LOAD(listener.words));
    counter(b, "listener_decode_errors_total", "Audio inputs refused as not "
            "audio, corrupt, empty or too long.",
            LOAD(listener.decode_errors));
}

/* One stage's value of a family rendered over every stage. */
typedef double StageValFn(const MetricsStage *s);

#define STAGE_VAL(fn, expr) \
    static double fn(const MetricsStage *s) { \
        const OmniStats *stats = s->stats; \
        (void) stats; \
        return (double) (expr); \
    }

STAGE_VAL(v_running, LOAD(requests_running))
STAGE_VAL(v_waiting, LOAD(requests_waiting))
STAGE_VAL(v_busy, LOAD(step_start_us) != 0)
STAGE_VAL(v_restarts, LOAD(stage_restarts))
STAGE_VAL(v_hang_kills, LOAD(stage_hang_kills))
STAGE_VAL(v_longest_step, LOAD(step_max_us) / 1e6)
STAGE_VAL(v_ready, s->ready ? 1 : 0)
STAGE_VAL(v_heartbeat_age, s->heartbeat_age)

#undef STAGE_VAL
#undef LOAD

/* One family over the stages: with one stage its line has no label and
 * its help (help_fmt, one %s) names the stage, as the exposition was with
 * the thinker alone; with more, one line per stage labelled
 * stage="NAME", and the help says "the labelled stage". paged: only the
 * stages with a page. */
static void stage_family(TextBuf *b, const MetricsGauges *g,
                         const char *name, const char *type,
                         const char *help_fmt, StageValFn *val, bool paged)
{
    char help[192];

    snprintf(help, sizeof(help), help_fmt,
             g->n_stages == 1 ? g->stages[0].name : "labelled");
    head(b, name, type, help);
    for (int i = 0; i < g->n_stages; i++) {
        const MetricsStage *s = &g->stages[i];

        if (paged && s->stats == NULL) continue;
        if (g->n_stages == 1) {
            tb_printf(b, PFX "%s %.17g\n", name, val(s));
            continue;
        }
        tb_printf(b, PFX "%s{stage=\"", name);
        label_value(b, s->name);
        tb_printf(b, "\"} %.17g\n", val(s));
    }
}

/* Whether any stage has a page: a family of page values is drawn then. */
static bool any_page(const MetricsGauges *g) {
    for (int i = 0; i < g->n_stages; i++) {
        if (g->stages[i].stats != NULL) return true;
    }
    return false;
}

/* The stages' pages: the queue gauges every stage has, each kind's own
 * part, then restarts and steps. */
static void render_stages(TextBuf *b, const MetricsGauges *g) {
    if (!any_page(g)) return;
    stage_family(b, g, "num_requests_running", "gauge", "Requests admitted "
                 "(for the thinker: to the batch, including preempted "
                 "ones; the %s stage).", v_running, true);
    stage_family(b, g, "num_requests_waiting", "gauge", "Requests queued, "
                 "not yet admitted (the %s stage).", v_waiting, true);
    for (int i = 0; i < g->n_stages; i++) {
        if (g->stages[i].stats != NULL) {
            g->stages[i].render(b, g->stages[i].stats);
        }
    }
    stage_family(b, g, "stage_busy", "gauge", "1 while the %s stage runs a "
                 "step.", v_busy, true);
    stage_family(b, g, "stage_restarts_total", "counter", "Times the %s "
                 "stage was restarted after it exited.", v_restarts, true);
    stage_family(b, g, "stage_hang_kills_total", "counter", "Times the %s "
                 "stage was killed for going without a heartbeat for "
                 "--stage-kill-after.", v_hang_kills, true);
    stage_family(b, g, "stage_longest_step_seconds", "gauge", "The longest "
                 "scheduler step of the running %s stage.", v_longest_step,
                 true);
}

/* The stages' liveness, as the frontend sees it. */
static void render_liveness(TextBuf *b, const MetricsGauges *g) {
    stage_family(b, g, "stage_ready", "gauge", "1 when the %s stage is "
                 "loaded and serving, and its heartbeat is recent.", v_ready,
                 false);
    stage_family(b, g, "stage_heartbeat_age_seconds", "gauge", "Time since "
                 "the ready %s stage's last heartbeat (0 when it is not "
                 "ready).", v_heartbeat_age, false);
}

static void render_outcomes(TextBuf *b, const Metrics *m) {
    head(b, "request_success_total", "counter", "Requests that finished, by "
         "finish reason.");
    tb_printf(b, PFX "request_success_total{finished_reason=\"stop\"} %"
              PRIu64 "\n" PFX "request_success_total{finished_reason="
              "\"length\"} %" PRIu64 "\n", m->success[0], m->success[1]);
    head(b, "request_errors_total", "counter", "Requests that ended with an "
         "error event, by HTTP status and error code.");
    for (int i = 0; i < m->n_errors; i++) {
        tb_printf(b, PFX "request_errors_total{status=\"%d\",code=\"",
                  m->errors[i].status);
        label_value(b, m->errors[i].code);
        tb_printf(b, "\"} %" PRIu64 "\n", m->errors[i].n);
    }
    counter(b, "requests_cancelled_total", "Requests cancelled because the "
            "client went away or stopped reading.", m->cancelled);
    histogram(b, "time_to_first_token_seconds", "Request arrival to the "
              "first text.", &m->ttft);
    histogram(b, "inter_token_latency_seconds", "Time between generated "
              "tokens (per-request mean, after the first).", &m->itl);
    histogram(b, "e2e_request_latency_seconds", "Request arrival to its "
              "last event.", &m->e2e);
    histogram(b, "request_queue_time_seconds", "Time a request waited to be "
              "scheduled.", &m->queue);
    histogram(b, "time_to_first_audio_seconds", "Request arrival to the "
              "first audio bytes sent (speech out).", &m->ttfa);
    counter(b, "audio_seconds_total", "Seconds of audio sent in finished "
            "requests.", m->audio_ms / 1000);
}

/* The shared-memory pool the stages pass units and audio through. */
static void render_pool(TextBuf *b, const PoolStats *p) {
    gauge(b, "pool_blocks_total", "Blocks in the shared-memory pool.",
          (double) p->n_blocks);
    gauge(b, "pool_blocks_used", "Pool blocks referenced now.",
          (double) p->used);
    gauge(b, "pool_waiters", "Stage producers waiting for a free pool "
          "block now.", (double) p->waiters);
}

void metrics_render(TextBuf *out, const Metrics *m, const MetricsGauges *g)
{
    head(out, "info", "gauge", "The served model and the kernel set the "
         "thinker chose (1).");
    tb_printf(out, PFX "info{model=\"");
    label_value(out, g->model);
    tb_printf(out, "\",kernels=\"");
    label_value(out, g->kernels);
    tb_printf(out, "\"} 1\n");
    render_stages(out, g);
    render_outcomes(out, m);
    render_liveness(out, g);
    gauge(out, "connections", "Open client connections.",
          (double) g->connections);
    render_pool(out, &g->pool);
    head(out, "resident_memory_bytes", "gauge", "Resident memory by "
         "process.");
    if (g->rss_frontend >= 0) {
        tb_printf(out, PFX "resident_memory_bytes{process=\"frontend\"} %"
                  PRId64 "\n", g->rss_frontend);
    }
    for (int i = 0; i < g->n_stages; i++) {
        if (g->stages[i].rss < 0) continue;
        tb_printf(out, PFX "resident_memory_bytes{process=\"");
        label_value(out, g->stages[i].name);
        tb_printf(out, "\"} %" PRId64 "\n", g->stages[i].rss);
    }
}

/* metrics.h -- the engine's Prometheus metrics: fixed-bucket histograms,
 * the frontend's own counters, and the text exposition (format 0.0.4) of
 * those plus the stage's OmniStats page.
 *
 * Who counts what: the stage counts what only it sees (tokens, prefix
 * cache, preemptions, KV blocks) in the shared OmniStats page (stage_channel.h);
 * the frontend counts what it sees pass by (request outcomes, latencies
 * measured on the events it forwards, connections). Rendering reads both,
 * so a scrape never has to ask the stage anything.
 *
 * Names follow vLLM's where one exists, with the prefix omni_engine_
 * instead of vllm: (colons are legal in Prometheus names but reserved by
 * convention for recording rules). Latencies are in seconds, memory in
 * bytes, the KV cache usage is a fraction in [0, 1] as vLLM's is. */

#ifndef OMNI_METRICS_H
#define OMNI_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "stage_channel.h"

/* ---- Growable text ------------------------------------------------------
 * A byte buffer that grows by doubling. A failed allocation sets oom and
 * makes every later append a no-op, so a renderer checks once at the end
 * instead of after every line. */

typedef struct {
    char   *p;              // (cap,) owned; NUL-terminated when len > 0
    size_t  len;
    size_t  cap;
    bool    oom;            // an append failed; contents are incomplete
} TextBuf;

void tb_init(TextBuf *b);
void tb_free(TextBuf *b);
void tb_printf(TextBuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- Histograms ---------------------------------------------------------
 * Fixed upper bounds chosen at init; counts are kept per bucket and made
 * cumulative only when rendered, so observe is a short scan and two adds.
 * The +Inf bucket is implicit (it equals count). */

#define HIST_MAX_BUCKETS 32

typedef struct {
    const double *bounds;                   // (n,) ascending, borrowed
                                            //   (static tables)
    int           n;
    uint64_t      counts[HIST_MAX_BUCKETS + 1]; // per bucket, last: > all
    double        sum;
    uint64_t      count;
} Hist;

void hist_init(Hist *h, const double *bounds, int n);
/* Adds k observations of value v (k > 1 spreads one measured mean over k
 * events, e.g. the inter-token gaps of one request). Can't fail. */
void hist_observe(Hist *h, double v, uint64_t k);

/* ---- The frontend's metrics --------------------------------------------- */

#define METRICS_MAX_ERRORS 32       // distinct (status, code) label pairs
#define METRICS_CODE_MAX   48

typedef struct {
    uint16_t status;
    char     code[METRICS_CODE_MAX];   // "" when the error carried none
    uint64_t n;
} ErrorCount;

typedef struct {
    uint64_t   success[2];          // by OmniFinish (stop, length)
    uint64_t   cancelled;           // client went away, or fell too far
                                    //   behind its output
    ErrorCount errors[METRICS_MAX_ERRORS];
    int        n_errors;            // the last slot collects the overflow
                                    //   under code "other"
    Hist       ttft;                // request arrival -> first text
    Hist       itl;                 // between tokens, after the first
    Hist       e2e;                 // request arrival -> DONE/ERROR
    Hist       queue;               // SUBMIT -> the stage's STARTED
    Hist       ttfa;                // request arrival -> first AUDIO
    uint64_t   audio_ms;            // audio sent in finished requests
} Metrics;

/* Renders a kind of stage's own part of the page (its member of the
 * union): the thinker's KV cache, prefix cache and tokens. */
typedef void MetricsRenderFn(TextBuf *b, const OmniStats *stats);

/* The thinker's. */
void metrics_thinker(TextBuf *b, const OmniStats *stats);
/* A kind whose page has no part of its own. */
void metrics_talker(TextBuf *b, const OmniStats *stats);
void metrics_voicebox(TextBuf *b, const OmniStats *stats);
void metrics_listener(TextBuf *b, const OmniStats *stats);

/* One stage, sampled at render time. */
typedef struct {
    const char      *name;          // "thinker": named in help texts and
                                    //   the process label, borrowed
    MetricsRenderFn *render;        // its own part of the page
    const OmniStats *stats;         // its page, NULL: none yet
    bool             ready;         // READY and beating
    double           heartbeat_age; // seconds since its last heartbeat; 0
                                    //   when not READY
    int64_t          rss;           // bytes, -1 when unknown (no process)
} MetricsStage;

/* Values sampled at render time. */
typedef struct {
    const char         *model;      // served model id
    const char         *kernels;    // the thinker's kernel set, "" until
                                    //   its first READY
    const MetricsStage *stages;     // (n_stages,) borrowed
    int                 n_stages;
    int64_t             connections;    // open client connections
    int64_t             rss_frontend;   // bytes, -1 when unknown
    PoolStats           pool;           // the shared-memory pool
} MetricsGauges;

/* Zeroes m and sets the histograms' buckets. Can't fail. */
void    metrics_init(Metrics *m);

/* Counts one ERROR sent to a client. code may be NULL or not terminated
 * (code_len bytes). Can't fail. */
void    metrics_error(Metrics *m, int status, const char *code,
                      size_t code_len);

/* Appends the whole exposition to out: the model, each stage's page (the
 * part every stage has, then its own through its render), the frontend's
 * counters, the pool, then each stage's liveness and memory. With one
 * stage the stage families carry no label (the lines as they were with
 * the thinker alone); with more, each line a stage="NAME" label.
 * Check out->oom afterwards. */
void    metrics_render(TextBuf *out, const Metrics *m, const MetricsGauges *g);

/* Resident set size of a process from /proc/<pid>/statm; pid 0 means this
 * process. Returns bytes, or -1 when it cannot be read. */
int64_t metrics_rss(int pid);

#endif

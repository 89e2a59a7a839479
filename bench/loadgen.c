/* loadgen.c -- a closed-loop load generator for streaming text servers.
 *
 *   loadgen (--omni SOCKET | --http HOST:PORT [--path P]) --prompts FILE
 *           [--concurrency C] [--requests N] [--max-tokens T]
 *           [--ignore-eos] [--model NAME] [--api-key KEY] [--warmup K]
 *           [--timeout S] [--duration S] [--expect-done] [--json OUT]
 *           [--audio VOICE [--audio-format F]] [--extra MEMBERS]
 *
 * It keeps C requests in flight until N have finished: each time one ends,
 * the next starts. With --duration S it starts no request after S seconds
 * (N, then, only bounds the count; default 2^20) and waits for those in
 * flight. Request i sends prompt i modulo the number of prompts
 * (FILE holds one prompt a line), greedy, max_tokens T. Two protocols:
 *
 *   --omni SOCKET     omni-engine's wire protocol (engine/proto/omni_proto.h) on a
 *                     Unix socket: REQUEST, then TEXT* and DONE or ERROR.
 *   --http HOST:PORT  HTTP/1.1 POST with "stream": true to an OpenAI-style
 *                     endpoint (default /v1/completions; a path containing
 *                     "chat/" sends messages instead of a prompt; llama-
 *                     server's native /completion works as well), answered
 *                     with Server-Sent Events, Content-Length, chunked or
 *                     close-delimited.
 *
 * Per request it records the time to first text (TTFT, from the start of
 * connect to the first nonempty text event), the gaps between text events
 * (inter-token latency; events read in one burst have gaps of about 0),
 * the end-to-end time and the generated tokens. Tokens are what the server
 * reports (DONE's completion_tokens; usage.completion_tokens, timings.
 * predicted_n or tokens_predicted in an SSE event); text events are
 * counted only when a server reports nothing, since an event may carry
 * less or more than one token.
 *
 * Speech (--audio VOICE): over HTTP, a path with "chat/" asks for text
 * and streamed pcm16 audio (modalities), any other path is taken for
 * /v1/audio/speech (the prompt is the input, --audio-format the
 * response_format, default pcm); over the omni protocol the request is
 * {"input", "audio": {voice, format}}. Audio arrives as AUDIO frames, an
 * audio/... body, delta.audio.data or speech.audio.delta events; the time to
 * its first byte (TTFA) and its bytes are recorded ("ttfa_ms",
 * "audio_bytes"). --extra adds raw JSON members to every body (a per-
 * request speech mode, stream_format...).
 *
 * --expect-done: an SSE stream that ends without "data: [DONE]" and without
 * an error event is a failed request ("stream ended without [DONE]").
 *
 * The result is one JSON object (stdout, or --json OUT): aggregate
 * generated tokens/s over the wall time from the first request's start to
 * the last one's end, TTFT/ITL/e2e percentiles in milliseconds, errors.
 * K warm-up requests (a built-in prompt that is in no file, so no prefix
 * cache is primed) run one at a time before the clock starts.
 *
 * Design: one thread, one epoll set, non-blocking sockets, C connection
 * slots allocated at start. Input buffers grow per connection up to a cap
 * (LG_MAX_EVENT), so a broken server cannot make it allocate without
 * bound; samples are kept in arrays sized from N and T. A benchmark tool,
 * not a server: bad arguments exit at startup; a failed request is counted,
 * its first messages kept, and the run goes on. The protocols' parsers are
 * in loadgen_proto.c (loadgen.h says why the split is there). */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "loadgen.h"

#define LG_READ_CHUNK  (64u << 10)
#define LG_WARMUP_PROMPT "Warm-up request: the lighthouse keeper counted " \
    "the ships that passed in the night and wrote their names in a book."

// --- small helpers ---------------------------------------------------------

_Noreturn void die(const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Makes room for n more bytes. Returns 0, or -1 past LG_MAX_EVENT. */
int buf_reserve(Buf *b, size_t n) {
    size_t cap;
    char  *p;

    if (b->len + n <= b->cap) return 0;
    if (b->len + n > LG_MAX_EVENT) return -1;
    cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    p = realloc(b->p, cap);
    if (p == NULL) die("out of memory");
    b->p = p;
    b->cap = cap;
    return 0;
}

int buf_append(Buf *b, const void *s, size_t n) {
    if (buf_reserve(b, n) != 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

void buf_consume(Buf *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

/* Appends s as a JSON string literal. */
void buf_json_str(Buf *b, const char *s) {
    char esc[8];

    buf_append(b, "\"", 1);
    for (; *s; s++) {
        unsigned char ch = (unsigned char) *s;
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char) ch;
            buf_append(b, esc, 2);
        } else if (ch < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", ch);
            buf_append(b, esc, 6);
        } else {
            buf_append(b, s, 1);
        }
    }
    buf_append(b, "\"", 1);
}

void buf_printf(Buf *b, const char *fmt, ...) {
    va_list ap;
    int     n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (buf_reserve(b, (size_t) n + 1) != 0) die("output too large");
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t) n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t) n;
}

// --- the event loop ---------------------------------------------------------

typedef struct {
    Config *cf;
    Stats  *st;
    Conn   *conns;          // (concurrency,) owned
    int     ep;             // epoll fd
    int     in_flight;
    int     done;           // requests ended, ok or not
} Loop;

/* Starts request req (-1: warm-up) in the free slot c. A request that
 * cannot even connect is ended at once as failed. */
static void conn_start(Loop *lp, Conn *c, int req) {
    const Config       *cf = lp->cf;
    struct epoll_event  ev;
    const char         *p;
    int                 rc;

    c->req = req;
    c->out_off = 0;
    c->in.len = c->line.len = c->data.len = 0;
    c->have_data = c->event_error = c->saw_done = false;
    c->expect_done = cf->expect_done;
    c->hstate = H_HEADERS;
    c->status = 0;
    c->chunked = false;
    c->remaining = -1;
    c->finished = c->failed = false;
    c->err[0] = '\0';
    c->t_first = c->t_last = c->t_audio = 0;
    c->audio_bytes = 0;
    c->raw_body = false;
    c->n_text = 0;
    c->tokens = c->prompt_tokens = c->cached_tokens = -1;

    p = req < 0 ? LG_WARMUP_PROMPT : cf->prompts[req % cf->n_prompts];
    request_build(c, cf, p);
    c->t_start = now_s();
    lp->in_flight++;

    c->fd = socket(cf->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK
                   | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket: %s", strerror(errno));
    rc = connect(c->fd, (struct sockaddr *) &cf->addr, cf->addr_len);
    if (rc != 0 && errno != EINPROGRESS) {
        conn_fail(c, "connect: %s", strerror(errno));
    }
    c->connecting = true;
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.ptr = c;
    if (epoll_ctl(lp->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        die("epoll_ctl: %s", strerror(errno));
    }
}

static void stats_error(Stats *st, const char *msg) {
    int i;

    st->n_errors++;
    for (i = 0; i < st->n_errmsg; i++) {
        if (strcmp(st->errmsg[i], msg) == 0) break;
    }
    if (i == st->n_errmsg) {
        if (i == LG_MAX_ERRMSG) return;
        snprintf(st->errmsg[i], sizeof(st->errmsg[i]), "%s", msg);
        st->n_errmsg++;
    }
    st->errcount[i]++;
}

/* Ends the request in slot c: records it and frees the slot. */
static void conn_end(Loop *lp, Conn *c, double t) {
    Stats  *st = lp->st;
    Result *r;

    if (!c->finished) conn_fail(c, "request ended without an answer");
    close(c->fd);
    c->fd = -1;
    lp->in_flight--;
    lp->done++;
    if (c->req < 0) {
        if (c->failed) die("warm-up request failed: %s", c->err);
        return;
    }
    r = &st->res[c->req];
    r->ok = !c->failed;
    r->e2e = t - c->t_start;
    r->ttft = c->t_first > 0 ? c->t_first - c->t_start : NAN;
    r->ttfa = c->t_audio > 0 ? c->t_audio - c->t_start : NAN;
    r->audio_bytes = c->audio_bytes;
    r->tokens = c->tokens >= 0 ? c->tokens : c->n_text;
    r->prompt_tokens = c->prompt_tokens;
    r->cached_tokens = c->cached_tokens;
    if (c->failed) stats_error(st, c->err);
}

/* Writes what is left of the request; on error fails the request. */
static void conn_write(Loop *lp, Conn *c) {
    struct epoll_event ev;
    int                err = 0;
    socklen_t          len = sizeof(err);
    ssize_t            n;

    if (c->connecting) {
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            conn_fail(c, "connect: %s", strerror(err));
            return;
        }
        c->connecting = false;
    }
    while (c->out_off < c->out.len) {
        n = write(c->fd, c->out.p + c->out_off, c->out.len - c->out_off);
        if (n < 0 && errno == EAGAIN) return;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            conn_fail(c, "write: %s", strerror(errno));
            return;
        }
        c->out_off += (size_t) n;
    }
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    epoll_ctl(lp->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Reads and parses what is there. Returns -1 when the request is over. */
static int conn_read(Loop *lp, Conn *c, double t) {
    ssize_t n;
    bool    eof = false;

    for (;;) {
        if (buf_reserve(&c->in, LG_READ_CHUNK) != 0) {
            conn_fail(c, "response too large");
            return -1;
        }
        n = read(c->fd, c->in.p + c->in.len, LG_READ_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n < 0) {
            conn_fail(c, "read: %s", strerror(errno));
            return -1;
        }
        if (n == 0) {
            eof = true;
            break;
        }
        c->in.len += (size_t) n;
        if (lp->cf->omni != NULL ? omni_parse(c, lp->st, t) != 0
                                 : http_parse(c, lp->st, t, false) != 0)
        {
            return -1;
        }
    }
    if (!eof) return 0;
    if (lp->cf->omni != NULL) {
        if (c->in.len > 0) conn_fail(c, "engine closed mid-frame");
        return -1;
    }
    http_parse(c, lp->st, t, true);
    return -1;
}

/* Runs n requests (first index first; -1: warm-up, one at a time) with up
 * to conc in flight; none starts after deadline (0: none). Returns the
 * number started. */
static int loop_run(Loop *lp, int first, int n, int conc, double deadline) {
    struct epoll_event evs[64];
    int                next = 0, k, i;
    double             t;

    lp->done = 0;
    while (next < n || lp->in_flight > 0) {
        if (deadline > 0 && now_s() >= deadline) n = next;
        for (i = 0; i < conc && next < n; i++) {
            if (lp->conns[i].fd >= 0) continue;
            conn_start(lp, &lp->conns[i], first < 0 ? -1 : first + next);
            next++;
            if (lp->conns[i].failed) conn_end(lp, &lp->conns[i], now_s());
        }
        k = epoll_wait(lp->ep, evs, 64, 100);
        if (k < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        t = now_s();
        for (i = 0; i < k; i++) {
            Conn *c = evs[i].data.ptr;
            if (c->fd < 0) continue;
            if ((evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                && !c->failed
                && c->out_off < c->out.len)
            {
                conn_write(lp, c);
            }
            if (!c->failed && !c->connecting
                && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
            {
                conn_read(lp, c, t);
            }
            if (c->failed || c->finished) conn_end(lp, c, t);
        }
        for (i = 0; i < conc; i++) {
            Conn *c = &lp->conns[i];
            if (c->fd >= 0 && t - c->t_start > lp->cf->timeout) {
                conn_fail(c, "timed out after %.0f s", lp->cf->timeout);
                conn_end(lp, c, t);
            }
        }
    }
    return next;
}

// --- report ------------------------------------------------------------------

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}

/* Percentile q (0..100) of n sorted values, nearest rank; NaN when n = 0. */
static double pct(const double *v, size_t n, double q) {
    size_t i;

    if (n == 0) return NAN;
    i = (size_t) ceil(q / 100.0 * (double) n);
    return v[i > 0 ? i - 1 : 0];
}

/* Writes "name": {"p50": .., "p90": .., "p99": .., "mean": ..} in ms
 * (null for an empty set). Sorts v. */
static void report_dist(Buf *b, const char *name, double *v, size_t n) {
    double sum = 0;

    if (n == 0) {
        buf_printf(b, "  \"%s\": null,\n", name);
        return;
    }
    qsort(v, n, sizeof(double), cmp_double);
    for (size_t i = 0; i < n; i++) sum += v[i];
    buf_printf(b, "  \"%s\": {\"p50\": %.3f, \"p90\": %.3f, \"p95\": %.3f, "
               "\"p99\": %.3f, \"mean\": %.3f, \"n\": %zu},\n", name,
               pct(v, n, 50) * 1e3, pct(v, n, 90) * 1e3, pct(v, n, 95) * 1e3,
               pct(v, n, 99) * 1e3, sum / n * 1e3, n);
}

static void report(const Config *cf, Stats *st, double wall) {
    Buf     b = {0};
    double *ttft = malloc(cf->requests * sizeof(double) + 1);
    double *e2e = malloc(cf->requests * sizeof(double) + 1);
    double *tpot = malloc(cf->requests * sizeof(double) + 1);
    double *ttfa = malloc(cf->requests * sizeof(double) + 1);
    size_t  n_ok = 0, n_ttft = 0, n_tpot = 0, n_ttfa = 0;
    int64_t tokens = 0, prompt = 0, cached = 0, audio = 0;
    FILE   *f;

    if (ttft == NULL || e2e == NULL || tpot == NULL || ttfa == NULL) {
        die("out of memory");
    }
    for (int i = 0; i < cf->requests; i++) {
        Result *r = &st->res[i];
        if (!r->ok) continue;
        tokens += r->tokens;
        if (r->prompt_tokens > 0) prompt += r->prompt_tokens;
        if (r->cached_tokens > 0) cached += r->cached_tokens;
        e2e[n_ok] = r->e2e;
        if (!isnan(r->ttft)) ttft[n_ttft++] = r->ttft;
        if (!isnan(r->ttfa)) ttfa[n_ttfa++] = r->ttfa;
        audio += r->audio_bytes;
        if (!isnan(r->ttft) && r->tokens > 1) {
            tpot[n_tpot++] = (r->e2e - r->ttft) / (double) (r->tokens - 1);
        }
        n_ok++;
    }

    buf_printf(&b, "{\n  \"target\": ");
    buf_json_str(&b, cf->omni != NULL ? cf->omni : cf->http);
    buf_printf(&b, ",\n  \"protocol\": \"%s\",\n", cf->omni ? "omni"
                                                           : "http");
    if (cf->http != NULL) {
        buf_printf(&b, "  \"path\": ");
        buf_json_str(&b, cf->path);
        buf_printf(&b, ",\n");
    }
    buf_printf(&b, "  \"concurrency\": %d,\n  \"requests\": %d,\n"
               "  \"max_tokens\": %d,\n  \"ignore_eos\": %s,\n"
               "  \"completed\": %zu,\n  \"errors\": %d,\n"
               "  \"wall_s\": %.4f,\n  \"completion_tokens\": %lld,\n"
               "  \"prompt_tokens\": %lld,\n  \"cached_tokens\": %lld,\n"
               "  \"tokens_per_s\": %.3f,\n  \"requests_per_s\": %.4f,\n",
               cf->concurrency, cf->requests, cf->max_tokens,
               cf->ignore_eos ? "true" : "false", n_ok, st->n_errors, wall,
               (long long) tokens, (long long) prompt, (long long) cached,
               wall > 0 ? tokens / wall : 0, wall > 0 ? n_ok / wall : 0);
    report_dist(&b, "ttft_ms", ttft, n_ttft);
    report_dist(&b, "itl_ms", st->itl, st->n_itl);
    report_dist(&b, "tpot_ms", tpot, n_tpot);
    report_dist(&b, "e2e_ms", e2e, n_ok);
    if (cf->audio_voice != NULL) {
        report_dist(&b, "ttfa_ms", ttfa, n_ttfa);
        buf_printf(&b, "  \"audio_bytes\": %lld,\n", (long long) audio);
    }
    buf_printf(&b, "  \"error_messages\": [");
    for (int i = 0; i < st->n_errmsg; i++) {
        buf_printf(&b, "%s{\"count\": %d, \"message\": ", i ? ", " : "",
                   st->errcount[i]);
        buf_json_str(&b, st->errmsg[i]);
        buf_printf(&b, "}");
    }
    buf_printf(&b, "]\n}\n");

    f = cf->json_out != NULL ? fopen(cf->json_out, "w") : stdout;
    if (f == NULL) die("%s: %s", cf->json_out, strerror(errno));
    fwrite(b.p, 1, b.len, f);
    if (f != stdout) fclose(f);
    fprintf(stderr, "loadgen: c=%d n=%d: %.2f tok/s, ttft p50 %.1f ms, "
            "itl p50 %.1f ms, %d errors\n", cf->concurrency, cf->requests,
            wall > 0 ? tokens / wall : 0, pct(ttft, n_ttft, 50) * 1e3,
            pct(st->itl, st->n_itl, 50) * 1e3, st->n_errors);
    free(ttft);
    free(e2e);
    free(tpot);
    free(ttfa);
    free(b.p);
}

// --- startup -----------------------------------------------------------------

static void usage(void) {
    fputs("usage: loadgen (--omni SOCKET | --http HOST:PORT [--path P]) "
          "--prompts FILE\n"
          "               [--concurrency C] [--requests N] [--max-tokens T] "
          "[--ignore-eos]\n"
          "               [--model NAME] [--api-key KEY] [--warmup K] "
          "[--timeout S] [--duration S]\n"
          "               [--expect-done] [--json OUT]\n"
          "               [--audio VOICE [--audio-format F]] "
          "[--extra '\"k\":v,...']\n", stderr);
    exit(2);
}

static void prompts_load(Config *cf) {
    FILE   *f = fopen(cf->prompts_file, "r");
    char   *line = NULL;
    size_t  cap = 0;
    ssize_t n;
    int     cap_p = 0;

    if (f == NULL) die("%s: %s", cf->prompts_file, strerror(errno));
    while ((n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) {
            line[--n] = '\0';
        }
        if (n == 0) continue;
        if (cf->n_prompts == cap_p) {
            cap_p = cap_p ? cap_p * 2 : 64;
            cf->prompts = realloc(cf->prompts, cap_p * sizeof(char *));
            if (cf->prompts == NULL) die("out of memory");
        }
        cf->prompts[cf->n_prompts++] = strdup(line);
    }
    free(line);
    fclose(f);
    if (cf->n_prompts == 0) die("%s: no prompts", cf->prompts_file);
}

static void target_resolve(Config *cf) {
    struct addrinfo hints = {0}, *ai;
    const char     *colon;
    int             rc;

    if (cf->omni != NULL) {
        struct sockaddr_un *un = (struct sockaddr_un *) &cf->addr;
        if (strlen(cf->omni) >= sizeof(un->sun_path)) {
            die("socket path too long: %s", cf->omni);
        }
        un->sun_family = AF_UNIX;
        strcpy(un->sun_path, cf->omni);
        cf->addr_len = sizeof(*un);
        return;
    }
    colon = strrchr(cf->http, ':');
    if (colon == NULL || (size_t) (colon - cf->http) >= sizeof(cf->host)) {
        die("--http wants HOST:PORT, not %s", cf->http);
    }
    memcpy(cf->host, cf->http, (size_t) (colon - cf->http));
    cf->host[colon - cf->http] = '\0';
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(cf->host, colon + 1, &hints, &ai);
    if (rc != 0) die("%s: %s", cf->http, gai_strerror(rc));
    memcpy(&cf->addr, ai->ai_addr, ai->ai_addrlen);
    cf->addr_len = ai->ai_addrlen;
    freeaddrinfo(ai);
    snprintf(cf->host, sizeof(cf->host), "%s", cf->http);
}

static void args_parse(Config *cf, int argc, char **argv) {
    cf->path = "/v1/completions";
    cf->concurrency = 1;
    cf->requests = 16;
    cf->max_tokens = 64;
    cf->timeout = 600;
    bool n_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ignore-eos") == 0) {
            cf->ignore_eos = true;
            continue;
        }
        if (strcmp(a, "--expect-done") == 0) {
            cf->expect_done = true;
            continue;
        }
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (strcmp(a, "--omni") == 0) cf->omni = v;
        else if (strcmp(a, "--http") == 0) cf->http = v;
        else if (strcmp(a, "--path") == 0) cf->path = v;
        else if (strcmp(a, "--model") == 0) cf->model = v;
        else if (strcmp(a, "--api-key") == 0) cf->api_key = v;
        else if (strcmp(a, "--prompts") == 0) cf->prompts_file = v;
        else if (strcmp(a, "--json") == 0) cf->json_out = v;
        else if (strcmp(a, "--concurrency") == 0) cf->concurrency = atoi(v);
        else if (strcmp(a, "--requests") == 0) cf->requests = atoi(v);
        else if (strcmp(a, "--max-tokens") == 0) cf->max_tokens = atoi(v);
        else if (strcmp(a, "--warmup") == 0) cf->warmup = atoi(v);
        else if (strcmp(a, "--timeout") == 0) cf->timeout = atof(v);
        else if (strcmp(a, "--audio") == 0) cf->audio_voice = v;
        else if (strcmp(a, "--audio-format") == 0) cf->audio_format = v;
        else if (strcmp(a, "--extra") == 0) cf->extra = v;
        else if (strcmp(a, "--duration") == 0) {
            cf->duration = atof(v);
            if (!n_given) cf->requests = 1 << 20;
        }
        else usage();
        if (strcmp(a, "--requests") == 0) n_given = true;
    }
    if ((cf->omni == NULL) == (cf->http == NULL) || cf->prompts_file == NULL
        || cf->concurrency < 1 || cf->concurrency > 4096 || cf->requests < 1
        || cf->max_tokens < 1 || cf->warmup < 0 || cf->timeout <= 0
        || cf->duration < 0)
    {
        usage();
    }
}

int main(int argc, char **argv) {
    Config cf = {0};
    Stats  st = {0};
    Loop   lp = {0};
    double t0, wall;

    args_parse(&cf, argc, argv);
    prompts_load(&cf);
    target_resolve(&cf);

    st.res = calloc((size_t) cf.requests, sizeof(Result));
    lp.conns = calloc((size_t) cf.concurrency, sizeof(Conn));
    if (st.res == NULL || lp.conns == NULL) die("out of memory");
    for (int i = 0; i < cf.concurrency; i++) lp.conns[i].fd = -1;
    lp.cf = &cf;
    lp.st = &st;
    lp.ep = epoll_create1(EPOLL_CLOEXEC);
    if (lp.ep < 0) die("epoll_create1: %s", strerror(errno));

    loop_run(&lp, -1, cf.warmup, 1, 0);
    st.recording = true;
    t0 = now_s();
    cf.requests = loop_run(&lp, 0, cf.requests, cf.concurrency,
                           cf.duration > 0 ? t0 + cf.duration : 0);
    wall = now_s() - t0;
    report(&cf, &st, wall);

    for (int i = 0; i < cf.concurrency; i++) {
        free(lp.conns[i].out.p);
        free(lp.conns[i].in.p);
        free(lp.conns[i].line.p);
        free(lp.conns[i].data.p);
    }
    for (int i = 0; i < cf.n_prompts; i++) free(cf.prompts[i]);
    free(cf.prompts);
    free(lp.conns);
    free(st.res);
    free(st.itl);
    close(lp.ep);
    return st.n_errors > 0 ? 3 : 0;
}

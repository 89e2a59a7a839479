/* loadgen.c -- a closed-loop load generator for streaming text servers.
 *
 *   loadgen (--omni SOCKET | --http HOST:PORT [--path P]) --prompts FILE
 *           [--concurrency C] [--requests N] [--max-tokens T]
 *           [--ignore-eos] [--model NAME] [--api-key KEY] [--warmup K]
 *           [--timeout S] [--duration S] [--expect-done] [--json OUT]
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
 * its first messages kept, and the run goes on. */

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
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <yajl/yajl_tree.h>

#include "omni_proto.h"

#define LG_MAX_EVENT   (4u << 20)   // bytes of one SSE event, one HTTP
                                    //   header block or one frame
#define LG_READ_CHUNK  (64u << 10)
#define LG_MAX_ERRMSG  4            // distinct error messages kept
#define LG_WARMUP_PROMPT "Warm-up request: the lighthouse keeper counted " \
    "the ships that passed in the night and wrote their names in a book."

// --- small helpers ---------------------------------------------------------

typedef struct {
    char   *p;          // (cap,) owned
    size_t  len;
    size_t  cap;
} Buf;

static void die(const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Makes room for n more bytes. Returns 0, or -1 past LG_MAX_EVENT. */
static int buf_reserve(Buf *b, size_t n) {
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

static int buf_append(Buf *b, const void *s, size_t n) {
    if (buf_reserve(b, n) != 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static void buf_consume(Buf *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

/* Appends s as a JSON string literal. */
static void buf_json_str(Buf *b, const char *s) {
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

static void buf_printf(Buf *b, const char *fmt, ...) {
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

// --- configuration and results ---------------------------------------------

typedef struct {
    const char *omni;           // socket path, or NULL
    const char *http;           // "host:port", or NULL
    const char *path;           // HTTP request path
    const char *model;          // "model" in the body, or NULL
    const char *api_key;        // Authorization: Bearer, or NULL
    const char *prompts_file;
    const char *json_out;       // NULL: stdout
    int         concurrency;
    int         requests;
    int         max_tokens;
    int         warmup;
    double      timeout;        // seconds per request
    double      duration;       // seconds; 0: run N requests
    bool        ignore_eos;
    bool        expect_done;    // SSE must end with [DONE]

    char      **prompts;        // (n_prompts,) owned
    int         n_prompts;
    struct sockaddr_storage addr;   // resolved target
    socklen_t   addr_len;
    char        host[256];
} Config;

typedef struct {
    bool    ok;
    double  ttft;               // seconds; first text event - start
    double  e2e;                // seconds; end - start
    int64_t tokens;             // generated tokens
    int64_t prompt_tokens;      // -1: not reported
    int64_t cached_tokens;      // -1: not reported
} Result;

typedef struct {
    Result *res;                // (requests,) owned
    double *itl;                // (itl_cap,) owned, seconds
    size_t  n_itl;
    size_t  itl_cap;
    int     n_errors;
    char    errmsg[LG_MAX_ERRMSG][256];
    int     errcount[LG_MAX_ERRMSG];
    int     n_errmsg;
    bool    recording;          // false during warm-up
} Stats;

// --- one connection --------------------------------------------------------

typedef enum {
    H_HEADERS,          // status line and headers
    H_BODY,             // Content-Length or close-delimited body
    H_CHUNK_SIZE,       // chunk-size line
    H_CHUNK_DATA,
    H_CHUNK_CRLF,       // the CRLF after a chunk's data
    H_TRAILER,          // after the last chunk, up to the empty line
    H_END,
} HttpState;

typedef struct {
    int       fd;               // -1: the slot is free
    int       req;              // request index; -1: warm-up
    bool      connecting;
    Buf       out;              // request bytes, owned
    size_t    out_off;          // bytes of out written
    Buf       in;               // bytes read and not yet consumed, owned

    HttpState hstate;
    int       status;           // HTTP status
    bool      chunked;
    int64_t   remaining;        // Content-Length or chunk bytes left;
                                //   -1: until EOF
    Buf       line;             // SSE line being assembled, owned
    Buf       data;             // SSE event data being assembled, owned
    bool      have_data;
    bool      event_error;      // the event came in an "error" field
    bool      saw_done;         // "data: [DONE]" seen
    bool      expect_done;      // --expect-done

    bool      finished;         // DONE frame, or a complete HTTP body
    bool      failed;
    char      err[256];         // why it failed
    double    t_start;
    double    t_first;          // 0: no text yet
    double    t_last;
    int64_t   n_text;           // text events
    int64_t   tokens;           // reported completion tokens, -1: none
    int64_t   prompt_tokens;
    int64_t   cached_tokens;
} Conn;

static void conn_fail(Conn *c, const char *fmt, ...) {
    va_list ap;

    if (c->failed) return;
    c->failed = true;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* A text event arrived at time t: records the inter-token gap. */
static void conn_text(Conn *c, Stats *st, double t) {
    if (c->t_first == 0) {
        c->t_first = t;
    } else if (st->recording && c->req >= 0) {
        if (st->n_itl == st->itl_cap) {
            st->itl_cap = st->itl_cap ? st->itl_cap * 2 : 4096;
            st->itl = realloc(st->itl, st->itl_cap * sizeof(double));
            if (st->itl == NULL) die("out of memory");
        }
        st->itl[st->n_itl++] = t - c->t_last;
    }
    c->t_last = t;
    c->n_text++;
}

// --- request bodies --------------------------------------------------------

/* The JSON body of a request for prompt p. */
static void body_build(Buf *b, const Config *cf, const char *p) {
    bool chat = cf->http != NULL && strstr(cf->path, "chat/") != NULL;

    buf_append(b, "{", 1);
    if (cf->model != NULL) {
        buf_append(b, "\"model\":", 8);
        buf_json_str(b, cf->model);
        buf_append(b, ",", 1);
    }
    if (chat) {
        buf_printf(b, "\"messages\":[{\"role\":\"user\",\"content\":");
        buf_json_str(b, p);
        buf_printf(b, "}]");
    } else {
        buf_printf(b, "\"prompt\":");
        buf_json_str(b, p);
    }
    buf_printf(b, ",\"max_tokens\":%d,\"temperature\":0", cf->max_tokens);
    if (cf->ignore_eos) buf_printf(b, ",\"ignore_eos\":true");
    if (cf->http != NULL) {
        /* n_predict and cache_prompt are llama-server's names; OpenAI-style
         * servers ignore unknown keys */
        buf_printf(b, ",\"n_predict\":%d,\"cache_prompt\":true,"
                   "\"stream\":true,\"stream_options\":"
                   "{\"include_usage\":true}", cf->max_tokens);
    }
    buf_append(b, "}", 1);
}

static void request_build(Conn *c, const Config *cf, const char *p) {
    Buf body = {0};

    body_build(&body, cf, p);
    c->out.len = 0;
    if (cf->omni != NULL) {
        if (buf_reserve(&c->out, OMNI_FRAME_HDR + body.len) != 0) {
            die("prompt too long");
        }
        omni_hdr_encode((uint8_t *) c->out.p, OMNI_F_REQUEST,
                        (uint32_t) body.len);
        c->out.len = OMNI_FRAME_HDR;
    } else {
        buf_printf(&c->out, "POST %s HTTP/1.1\r\nHost: %s\r\n"
                   "Content-Type: application/json\r\n"
                   "Accept: text/event-stream\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n",
                   cf->path, cf->host, body.len);
        if (cf->api_key != NULL) {
            buf_printf(&c->out, "Authorization: Bearer %s\r\n", cf->api_key);
        }
        buf_printf(&c->out, "\r\n");
    }
    if (buf_append(&c->out, body.p, body.len) != 0) die("prompt too long");
    free(body.p);
}

// --- the omni wire protocol ------------------------------------------------

/* Handles the frames in c->in. Returns 0, or -1 when the request is over
 * (finished or failed). */
static int omni_parse(Conn *c, Stats *st, double t) {
    OmniFrameHdr h;
    OmniDone     d;
    OmniError    e;
    const char  *bad;
    uint8_t     *p;

    while (c->in.len >= OMNI_FRAME_HDR) {
        p = (uint8_t *) c->in.p;
        omni_hdr_decode(&h, p);
        bad = omni_frame_check(&h, OMNI_DIR_TO_CLIENT);
        if (bad != NULL) {
            conn_fail(c, "engine sent a bad frame (type %u): %s", h.type,
                      bad);
            return -1;
        }
        if (c->in.len < OMNI_FRAME_HDR + (size_t) h.len) return 0;
        p += OMNI_FRAME_HDR;
        switch (h.type) {
        case OMNI_F_TEXT:
            if (h.len > 0) conn_text(c, st, t);
            break;
        case OMNI_F_DONE:
            if (omni_done_decode(&d, p) != 0) {
                conn_fail(c, "engine sent a bad DONE frame");
                return -1;
            }
            c->tokens = d.completion_tokens;
            c->prompt_tokens = d.prompt_tokens;
            c->cached_tokens = d.cached_tokens;
            c->finished = true;
            return -1;
        case OMNI_F_ERROR:
            if (omni_error_decode(&e, p, h.len) != 0) {
                conn_fail(c, "engine sent a bad ERROR frame");
            } else {
                conn_fail(c, "engine error %u %.*s: %.*s", e.status,
                          (int) e.type_len, e.type, (int) e.message_len,
                          e.message);
            }
            return -1;
        default:
            conn_fail(c, "engine sent unexpected frame type %u", h.type);
            return -1;
        }
        buf_consume(&c->in, OMNI_FRAME_HDR + h.len);
    }
    return 0;
}

// --- HTTP and Server-Sent Events -------------------------------------------

/* The integer at path in v, or -1. */
static int64_t json_int(yajl_val v, const char **path) {
    yajl_val n = yajl_tree_get(v, path, yajl_t_number);

    return n != NULL && YAJL_IS_INTEGER(n) ? YAJL_GET_INTEGER(n) : -1;
}

/* Handles one SSE event's data: text, usage, errors. */
static void sse_event(Conn *c, Stats *st, double t) {
    static const char *content[] = { "content", NULL };
    static const char *usage_ct[] = { "usage", "completion_tokens", NULL };
    static const char *usage_pt[] = { "usage", "prompt_tokens", NULL };
    static const char *usage_cached[] = { "usage", "prompt_tokens_details",
                                          "cached_tokens", NULL };
    static const char *predicted[] = { "timings", "predicted_n", NULL };
    static const char *tokens_pred[] = { "tokens_predicted", NULL };
    static const char *error[] = { "error", NULL };
    static const char *message[] = { "message", NULL };
    static const char *choices[] = { "choices", NULL };
    static const char *text[] = { "text", NULL };
    static const char *delta[] = { "delta", "content", NULL };
    char     ebuf[128];
    yajl_val v, s, ch, m;
    int64_t  n;

    if (buf_append(&c->data, "", 1) != 0) {
        conn_fail(c, "SSE event too large");
        return;
    }
    if (strcmp(c->data.p, "[DONE]") == 0) {
        c->saw_done = true;
        return;
    }
    if (c->saw_done) {
        conn_fail(c, "SSE event after [DONE]");
        return;
    }
    v = yajl_tree_parse(c->data.p, ebuf, sizeof(ebuf));
    if (v == NULL) {
        conn_fail(c, "SSE event is not JSON: %.80s", c->data.p);
        return;
    }
    m = yajl_tree_get(v, error, yajl_t_any);
    if (c->event_error || (m != NULL && !YAJL_IS_NULL(m))) {
        m = yajl_tree_get(v, error, yajl_t_object);
        s = m != NULL ? yajl_tree_get(m, message, yajl_t_string) : NULL;
        conn_fail(c, "server error event: %.200s",
                  s != NULL ? YAJL_GET_STRING(s) : c->data.p);
        yajl_tree_free(v);
        return;
    }

    s = yajl_tree_get(v, content, yajl_t_string);
    ch = yajl_tree_get(v, choices, yajl_t_array);
    if (s == NULL && ch != NULL && YAJL_GET_ARRAY(ch)->len > 0) {
        yajl_val c0 = YAJL_GET_ARRAY(ch)->values[0];
        s = yajl_tree_get(c0, text, yajl_t_string);
        if (s == NULL) s = yajl_tree_get(c0, delta, yajl_t_string);
    }
    if (s != NULL && YAJL_GET_STRING(s)[0] != '\0') conn_text(c, st, t);

    if ((n = json_int(v, usage_ct)) >= 0
        || (n = json_int(v, predicted)) >= 0
        || (n = json_int(v, tokens_pred)) >= 0)
    {
        c->tokens = n;
    }
    if ((n = json_int(v, usage_pt)) >= 0) c->prompt_tokens = n;
    if ((n = json_int(v, usage_cached)) >= 0) c->cached_tokens = n;
    yajl_tree_free(v);
}

/* Feeds n body bytes to the SSE parser: "data:" lines join with "\n"
 * into one event, an empty line ends it; other fields and comments are
 * ignored, but an "error:" field (llama-server's) is an error. */
static void sse_feed(Conn *c, Stats *st, const char *p, size_t n, double t) {
    const char *nl;
    size_t      k;
    char       *l;

    while (n > 0 && !c->failed) {
        nl = memchr(p, '\n', n);
        k = nl != NULL ? (size_t) (nl - p) : n;
        if (buf_append(&c->line, p, k) != 0) {
            conn_fail(c, "SSE line too long");
            return;
        }
        if (nl == NULL) return;
        p += k + 1;
        n -= k + 1;

        if (c->line.len > 0 && c->line.p[c->line.len - 1] == '\r') {
            c->line.len--;
        }
        l = c->line.p;
        k = c->line.len;
        if (k == 0) {
            if (c->have_data) sse_event(c, st, t);
            c->data.len = 0;
            c->have_data = false;
            c->event_error = false;
        } else if ((k >= 5 && memcmp(l, "data:", 5) == 0)
                   || (k >= 6 && memcmp(l, "error:", 6) == 0))
        {
            size_t f = l[0] == 'd' ? 5 : 6;
            if (l[0] == 'e') c->event_error = true;
            if (f < k && l[f] == ' ') f++;
            if (c->have_data && buf_append(&c->data, "\n", 1) != 0) {
                conn_fail(c, "SSE event too large");
            } else if (buf_append(&c->data, l + f, k - f) != 0) {
                conn_fail(c, "SSE event too large");
            }
            c->have_data = true;
        }
        c->line.len = 0;
    }
}

/* The value of header name in the block hdrs (NUL-terminated), or NULL.
 * Sets *len to its length. */
static const char *http_header(const char *hdrs, const char *name,
                               size_t *len)
{
    size_t      nl = strlen(name);
    const char *p = hdrs, *e;

    while ((p = strstr(p, "\r\n")) != NULL) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            p += nl + 1;
            while (*p == ' ' || *p == '\t') p++;
            e = strstr(p, "\r\n");
            *len = e != NULL ? (size_t) (e - p) : strlen(p);
            return p;
        }
    }
    return NULL;
}

/* Parses the status line and headers at the start of c->in. Returns 1 when
 * parsed (and consumed), 0 when more bytes are needed, -1 on error. */
static int http_headers(Conn *c) {
    const char *v;
    char       *end;
    size_t      n;

    if (buf_append(&c->in, "", 1) != 0) {
        conn_fail(c, "HTTP header too large");
        return -1;
    }
    c->in.len--;
    end = strstr(c->in.p, "\r\n\r\n");
    if (end == NULL) return 0;
    end[2] = '\0';
    if (sscanf(c->in.p, "HTTP/1.%*d %d", &c->status) != 1) {
        conn_fail(c, "bad HTTP status line");
        return -1;
    }
    c->remaining = -1;
    v = http_header(c->in.p, "Transfer-Encoding", &n);
    c->chunked = v != NULL && n >= 7 && strncasecmp(v, "chunked", 7) == 0;
    v = http_header(c->in.p, "Content-Length", &n);
    if (v != NULL && !c->chunked) c->remaining = strtoll(v, NULL, 10);
    c->hstate = c->chunked ? H_CHUNK_SIZE : H_BODY;
    buf_consume(&c->in, (size_t) (end + 4 - c->in.p));
    return 1;
}

/* Handles the bytes in c->in (eof: none will follow). Returns 0, or -1 when
 * the request is over. */
static int http_parse(Conn *c, Stats *st, double t, bool eof) {
    size_t  k;
    char   *nl;
    int     rc;

    for (;;) {
        if (c->failed) return -1;
        switch (c->hstate) {
        case H_HEADERS:
            rc = http_headers(c);
            if (rc == 0) goto more;
            if (rc < 0) return -1;
            break;
        case H_BODY:
            k = c->in.len;
            if (c->remaining >= 0 && (int64_t) k > c->remaining) {
                k = (size_t) c->remaining;
            }
            if (c->status == 200) sse_feed(c, st, c->in.p, k, t);
            else buf_append(&c->data, c->in.p, k);
            buf_consume(&c->in, k);
            if (c->remaining >= 0) c->remaining -= (int64_t) k;
            if (c->remaining == 0) c->hstate = H_END;
            else goto more;
            break;
        case H_CHUNK_SIZE:
        case H_TRAILER:
            nl = memchr(c->in.p, '\n', c->in.len);
            if (nl == NULL) goto more;
            k = (size_t) (nl - c->in.p) + 1;
            if (c->hstate == H_TRAILER) {
                if (k <= 2) c->hstate = H_END;
            } else {
                c->remaining = strtoll(c->in.p, NULL, 16);
                c->hstate = c->remaining > 0 ? H_CHUNK_DATA : H_TRAILER;
            }
            buf_consume(&c->in, k);
            break;
        case H_CHUNK_DATA:
            k = c->in.len < (size_t) c->remaining ? c->in.len
                                                  : (size_t) c->remaining;
            if (k == 0) goto more;
            if (c->status == 200) sse_feed(c, st, c->in.p, k, t);
            else buf_append(&c->data, c->in.p, k);
            buf_consume(&c->in, k);
            c->remaining -= (int64_t) k;
            if (c->remaining == 0) c->hstate = H_CHUNK_CRLF;
            break;
        case H_CHUNK_CRLF:
            nl = memchr(c->in.p, '\n', c->in.len);
            if (nl == NULL) goto more;
            buf_consume(&c->in, (size_t) (nl - c->in.p) + 1);
            c->hstate = H_CHUNK_SIZE;
            break;
        case H_END:
            goto end;
        }
    }

more:
    if (!eof) return 0;
    if (c->hstate != H_BODY || c->remaining > 0) {
        conn_fail(c, "server closed the connection mid-response");
        return -1;
    }

end:
    if (c->status == 200) {
        /* a last event without its empty line still counts */
        if (c->have_data) sse_event(c, st, t);
        if (c->expect_done && !c->saw_done && !c->failed) {
            conn_fail(c, "stream ended without [DONE]");
        }
        c->finished = !c->failed;
    } else {
        buf_append(&c->data, "", 1);
        conn_fail(c, "HTTP %d: %.200s", c->status, c->data.p);
    }
    return -1;
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
    c->t_first = c->t_last = 0;
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
    buf_printf(b, "  \"%s\": {\"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, "
               "\"mean\": %.3f, \"n\": %zu},\n", name, pct(v, n, 50) * 1e3,
               pct(v, n, 90) * 1e3, pct(v, n, 99) * 1e3, sum / n * 1e3, n);
}

static void report(const Config *cf, Stats *st, double wall) {
    Buf     b = {0};
    double *ttft = malloc(cf->requests * sizeof(double) + 1);
    double *e2e = malloc(cf->requests * sizeof(double) + 1);
    double *tpot = malloc(cf->requests * sizeof(double) + 1);
    size_t  n_ok = 0, n_ttft = 0, n_tpot = 0;
    int64_t tokens = 0, prompt = 0, cached = 0;
    FILE   *f;

    if (ttft == NULL || e2e == NULL || tpot == NULL) die("out of memory");
    for (int i = 0; i < cf->requests; i++) {
        Result *r = &st->res[i];
        if (!r->ok) continue;
        tokens += r->tokens;
        if (r->prompt_tokens > 0) prompt += r->prompt_tokens;
        if (r->cached_tokens > 0) cached += r->cached_tokens;
        e2e[n_ok] = r->e2e;
        if (!isnan(r->ttft)) ttft[n_ttft++] = r->ttft;
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
          "               [--expect-done] [--json OUT]\n", stderr);
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

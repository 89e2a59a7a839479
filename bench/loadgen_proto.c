/* loadgen_proto.c -- the load generator's two protocols, one connection
 * at a time: building the request, then parsing what comes back.
 *
 * Each parser is resumable: it handles whatever bytes are in c->in, keeps
 * its place in the Conn (a partial frame stays in c->in; HTTP keeps its
 * HttpState, the SSE line and event being assembled), and returns 0 to ask
 * for more. So a read may end anywhere, mid-frame or mid-line. Text events
 * go to conn_text, which keeps the inter-token gaps in Stats; the first
 * fault a request meets is kept in c->err by conn_fail. */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yajl/yajl_tree.h>

#include "loadgen.h"
#include "omni_proto.h"

// --- one connection --------------------------------------------------------

void conn_fail(Conn *c, const char *fmt, ...) {
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

/* n bytes of audio arrived at time t. */
static void conn_audio(Conn *c, double t, int64_t n) {
    if (n <= 0) return;
    if (c->t_audio == 0) c->t_audio = t;
    c->audio_bytes += n;
}

// --- request bodies --------------------------------------------------------

/* Speech out: /v1/audio/speech over HTTP; "input" + "audio" over the
 * omni protocol; a chat path gets modalities and streamed pcm16. */
static void body_audio(Buf *b, const Config *cf, bool chat) {
    const char *fmt = cf->audio_format ? cf->audio_format : "pcm";

    if (chat) {
        buf_printf(b, ",\"modalities\":[\"text\",\"audio\"],\"audio\":"
                   "{\"voice\":");
        buf_json_str(b, cf->audio_voice);
        buf_printf(b, ",\"format\":\"pcm16\"}");
    } else if (cf->http != NULL) {
        buf_printf(b, ",\"voice\":");
        buf_json_str(b, cf->audio_voice);
        buf_printf(b, ",\"response_format\":");
        buf_json_str(b, fmt);
    } else {
        buf_printf(b, ",\"audio\":{\"voice\":");
        buf_json_str(b, cf->audio_voice);
        buf_printf(b, ",\"format\":");
        buf_json_str(b, fmt);
        buf_printf(b, "}");
    }
}

/* The JSON body of a request for prompt p. */
static void body_build(Buf *b, const Config *cf, const char *p) {
    bool chat = cf->http != NULL && strstr(cf->path, "chat/") != NULL;
    bool speech = cf->audio_voice != NULL && !chat;

    buf_append(b, "{", 1);
    if (cf->model != NULL) {
        buf_append(b, "\"model\":", 8);
        buf_json_str(b, cf->model);
        buf_append(b, ",", 1);
    }
    if (speech) {
        buf_printf(b, "\"input\":");
        buf_json_str(b, p);
        body_audio(b, cf, false);
        if (cf->extra != NULL) buf_printf(b, ",%s", cf->extra);
        buf_append(b, "}", 1);
        return;
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
    if (cf->audio_voice != NULL) body_audio(b, cf, chat);
    if (cf->extra != NULL) buf_printf(b, ",%s", cf->extra);
    buf_append(b, "}", 1);
}

void request_build(Conn *c, const Config *cf, const char *p) {
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
int omni_parse(Conn *c, Stats *st, double t) {
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
        case OMNI_F_AUDIO:
            conn_audio(c, t, h.len);
            break;
        case OMNI_F_DONE:
            if (omni_done_decode(&d, p) != 0) {
                conn_fail(c, "engine sent a bad DONE frame");
                return -1;
            }
            c->tokens = d.completion_tokens + d.audio_tokens;
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

/* The bytes a base64 string decodes to. */
static int64_t b64_bytes(const char *s) {
    size_t n = s != NULL ? strlen(s) : 0;

    while (n > 0 && s[n - 1] == '=') n--;
    return (int64_t) (n * 3 / 4);
}

/* Handles one SSE event's data: text, audio, usage, errors. */
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
    static const char *type[] = { "type", NULL };
    static const char *speech_audio[] = { "audio", NULL };
    static const char *usage_out[] = { "usage", "output_tokens", NULL };
    static const char *usage_in[] = { "usage", "input_tokens", NULL };
    static const char *a_data[] = { "delta", "audio", "data", NULL };
    static const char *a_text[] = { "delta", "audio", "transcript", NULL };
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
        yajl_val a = yajl_tree_get(c0, a_data, yajl_t_string);

        if (a != NULL) conn_audio(c, t, b64_bytes(YAJL_GET_STRING(a)));
        s = yajl_tree_get(c0, text, yajl_t_string);
        if (s == NULL) s = yajl_tree_get(c0, delta, yajl_t_string);
        if (s == NULL) s = yajl_tree_get(c0, a_text, yajl_t_string);
    }
    if (s != NULL && YAJL_GET_STRING(s)[0] != '\0') conn_text(c, st, t);
    m = yajl_tree_get(v, type, yajl_t_string);
    if (m != NULL && YAJL_IS_STRING(m)
        && strcmp(m->u.string, "speech.audio.delta") == 0
        && (s = yajl_tree_get(v, speech_audio, yajl_t_string)) != NULL)
    {
        conn_audio(c, t, b64_bytes(YAJL_GET_STRING(s)));
    }
    if ((n = json_int(v, usage_out)) >= 0) c->tokens = n;
    if ((n = json_int(v, usage_in)) >= 0) c->prompt_tokens = n;

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
    v = http_header(c->in.p, "Content-Type", &n);
    c->raw_body = c->status == 200 && v != NULL && n >= 6
                  && strncasecmp(v, "audio/", 6) == 0;
    v = http_header(c->in.p, "Content-Length", &n);
    if (v != NULL && !c->chunked) c->remaining = strtoll(v, NULL, 10);
    c->hstate = c->chunked ? H_CHUNK_SIZE : H_BODY;
    buf_consume(&c->in, (size_t) (end + 4 - c->in.p));
    return 1;
}

/* Handles the bytes in c->in (eof: none will follow). Returns 0, or -1 when
 * the request is over. */
int http_parse(Conn *c, Stats *st, double t, bool eof) {
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
            if (c->raw_body) conn_audio(c, t, (int64_t) k);
            else if (c->status == 200) sse_feed(c, st, c->in.p, k, t);
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
            if (c->raw_body) conn_audio(c, t, (int64_t) k);
            else if (c->status == 200) sse_feed(c, st, c->in.p, k, t);
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



/*
 * Copyright (C) ngx_omni authors
 *
 * ngx_http_omni_openai.c -- the OpenAI API's JSON out. No I/O.
 *
 * chat.completion(.chunk) and text_completion objects, SSE events, error
 * objects and model lists, written with one escaper that also replaces
 * invalid UTF-8 (json_scan.h's definition, the one the request check
 * uses) by U+FFFD, so the output is valid JSON whatever bytes arrive (a
 * URL-decoded model id, an engine message); the x-omni-seed header.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_USAGE_FMT                                               \
    "{\"prompt_tokens\":%uD,\"completion_tokens\":%uL,"                       \
    "\"total_tokens\":%uL,"                                                   \
    "\"prompt_tokens_details\":{\"cached_tokens\":%uD,\"audio_tokens\":0},"   \
    "\"completion_tokens_details\":{\"reasoning_tokens\":%uD,"                \
    "\"audio_tokens\":%uD,\"accepted_prediction_tokens\":0,"                   \
    "\"rejected_prediction_tokens\":0"


static size_t ngx_http_omni_error_len(ngx_http_omni_error_t *err);
static u_char *ngx_http_omni_error_write(u_char *p,
    ngx_http_omni_error_t *err);


/* ---- response bodies ---- */

ngx_buf_t *
ngx_http_omni_error_json(ngx_http_request_t *r, ngx_http_omni_error_t *err)
{
    ngx_buf_t  *b;

    b = ngx_create_temp_buf(r->pool, ngx_http_omni_error_len(err) + 1);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_http_omni_error_write(b->last, err);
    *b->last++ = '\n';
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/*
 * SSE events (ngx_http_omni_error_event(), ngx_http_omni_chunk_*()) are
 * written into a buffer of ctx's free list (ngx_http_omni_event_buf())
 * and returned as its chain link, for ngx_http_omni_send_event(). NULL
 * means out of memory.
 */

ngx_chain_t *
ngx_http_omni_error_event(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = sizeof("data: \n\n") - 1 + ngx_http_omni_error_len(err);

    cl = ngx_http_omni_event_buf(r, ctx, size);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;

    b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    b->last = ngx_http_omni_error_write(b->last, err);
    *b->last++ = '\n';
    *b->last++ = '\n';

    return cl;
}


/* A chat stream's first chunk (completions have none). */

ngx_chain_t *
ngx_http_omni_chunk_role(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t  post = ngx_null_string;
    ngx_str_t  pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                "{\"role\":\"assistant\",\"content\":\"\","
                                "\"refusal\":null},\"logprobs\":null,"
                                "\"finish_reason\":null}]");
    ngx_str_t  spoken = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                   "{\"role\":\"assistant\",\"content\":null,"
                                   "\"refusal\":null},\"logprobs\":null,"
                                   "\"finish_reason\":null}]");

    /* a spoken answer's content stays null: its text is the transcript */

    return ngx_http_omni_event(r, ctx, ctx->req.audio ? &spoken : &pre,
                               NULL, 0, &post, 1);
}


ngx_chain_t *
ngx_http_omni_chunk_text(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    u_char *text, size_t len)
{
    ngx_str_t  chat_pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                     "{\"content\":\"");
    ngx_str_t  chat_post = ngx_string("\"},\"logprobs\":null,"
                                      "\"finish_reason\":null}]");
    ngx_str_t  text_pre = ngx_string("\"choices\":[{\"text\":\"");
    ngx_str_t  text_post = ngx_string("\",\"index\":0,\"logprobs\":null,"
                                      "\"finish_reason\":null}]");

    if (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_CHAT) {
        return ngx_http_omni_event(r, ctx, &chat_pre, text, len, &chat_post,
                                   1);
    }

    return ngx_http_omni_event(r, ctx, &text_pre, text, len, &text_post, 1);
}


/* A chat stream's reasoning (a thinking model's): delta.reasoning_content,
 * the field llama-server, vLLM and DeepSeek's API send. */

ngx_chain_t *
ngx_http_omni_chunk_reasoning(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *text, size_t len)
{
    ngx_str_t  pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                "{\"reasoning_content\":\"");
    ngx_str_t  post = ngx_string("\"},\"logprobs\":null,"
                                 "\"finish_reason\":null}]");

    return ngx_http_omni_event(r, ctx, &pre, text, len, &post, 1);
}


ngx_chain_t *
ngx_http_omni_chunk_finish(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t   reason;
    ngx_str_t   post = ngx_string("\"}]");
    ngx_str_t   chat_pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                      "{},\"logprobs\":null,"
                                      "\"finish_reason\":\"");
    ngx_str_t   text_pre = ngx_string("\"choices\":[{\"text\":\"\","
                                      "\"index\":0,\"logprobs\":null,"
                                      "\"finish_reason\":\"");

    reason = ngx_http_omni_finish(ctx);

    return ngx_http_omni_event(r, ctx,
                               ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_CHAT
                               ? &chat_pre : &text_pre,
                               reason.data, reason.len, &post, 1);
}


/* Built whether or not include_usage was asked: the caller decides. */

ngx_chain_t *
ngx_http_omni_chunk_usage(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char     buf[NGX_HTTP_OMNI_USAGE_LEN];
    ngx_str_t  usage;
    ngx_str_t  pre = ngx_string("\"choices\":[],\"usage\":");

    usage.data = buf;
    usage.len = ngx_http_omni_usage(buf, ctx) - buf;

    return ngx_http_omni_event(r, ctx, &pre, NULL, 0, &usage, 0);
}


ngx_chain_t *
ngx_http_omni_chunk_done(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_chain_t  *cl;

    cl = ngx_http_omni_event_buf(r, ctx, sizeof("data: [DONE]\n\n") - 1);
    if (cl == NULL) {
        return NULL;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, "data: [DONE]\n\n",
                               sizeof("data: [DONE]\n\n") - 1);

    return cl;
}


/*
 * chat.completion:
 *   {"id","object","created","model","choices":[{"index":0,"message":
 *   {"role":"assistant","content":TEXT[,"reasoning_content":REASONING],
 *   "refusal":null,"annotations":[]},"logprobs":null,"finish_reason":R}],
 *   "usage":{...}}\n
 *   (reasoning_content when a thinking model reasoned: REASONING frames)
 * text_completion:
 *   {... "choices":[{"text":TEXT,"index":0,"logprobs":null,
 *   "finish_reason":R}],"usage":{...}}\n
 */

ngx_buf_t *
ngx_http_omni_completion_json(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char      *text, *reasoning;
    size_t       len, rlen, size;
    ngx_str_t   *pre, *post, *object;
    ngx_buf_t   *b;
    ngx_str_t    chat_object = ngx_string("chat.completion");
    ngx_str_t    chat_pre = ngx_string("\"choices\":[{\"index\":0,"
                                       "\"message\":{\"role\":"
                                       "\"assistant\",\"content\":\"");
    ngx_str_t    chat_post = ngx_string("\",\"refusal\":null,"
                                        "\"annotations\":[]},"
                                        "\"logprobs\":null,"
                                        "\"finish_reason\":\"");
    ngx_str_t    mid = ngx_string("\",\"reasoning_content\":\"");
    ngx_str_t    text_object = ngx_string("text_completion");
    ngx_str_t    text_pre = ngx_string("\"choices\":[{\"text\":\"");
    ngx_str_t    text_post = ngx_string("\",\"index\":0,\"logprobs\":null,"
                                        "\"finish_reason\":\"");

    if (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_CHAT) {
        object = &chat_object;
        pre = &chat_pre;
        post = &chat_post;

    } else {
        object = &text_object;
        pre = &text_pre;
        post = &text_post;
    }

    text = ngx_http_omni_text(r, ctx->text, &len);
    if (text == NULL && len > 0) {
        return NULL;
    }

    reasoning = ngx_http_omni_text(r, ctx->reasoning, &rlen);
    if (reasoning == NULL && rlen > 0) {
        return NULL;
    }

    size = ngx_http_omni_head_len(ctx, object) + pre->len
           + ngx_http_omni_escape_len(text, len) + post->len
           + mid.len + ngx_http_omni_escape_len(reasoning, rlen)
           + NGX_HTTP_OMNI_END_LEN;

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_http_omni_head(b->last, ctx, object);
    b->last = ngx_cpymem(b->last, pre->data, pre->len);
    b->last = ngx_http_omni_escape(b->last, text, len);

    if (rlen) {
        b->last = ngx_cpymem(b->last, mid.data, mid.len);
        b->last = ngx_http_omni_escape(b->last, reasoning, rlen);
    }

    b->last = ngx_cpymem(b->last, post->data, post->len);
    b->last = ngx_http_omni_completion_end(b->last, ctx);
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/* A whole answer's end: REASON"}],"usage":{...}}\n, at most
 * NGX_HTTP_OMNI_END_LEN bytes. */

u_char *
ngx_http_omni_completion_end(u_char *p, ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t  reason;

    reason = ngx_http_omni_finish(ctx);

    p = ngx_cpymem(p, reason.data, reason.len);
    p = ngx_cpymem(p, "\"}],\"usage\":", sizeof("\"}],\"usage\":") - 1);
    p = ngx_http_omni_usage(p, ctx);
    *p++ = '}';
    *p++ = '\n';

    return p;
}


/*
 * One SSE event: "data: " head pre escaped(text) post
 * [,"usage":null] "}\n\n". The head (id, object, created, model) is the
 * same in every chunk of a response; usage_null adds "usage":null when
 * the client asked for include_usage.
 */

ngx_chain_t *
ngx_http_omni_event(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *pre, u_char *text, size_t len, ngx_str_t *post,
    ngx_uint_t usage_null)
{
    ngx_chain_t  *cl;

    cl = ngx_http_omni_event_start(r, ctx, pre,
                                   ngx_http_omni_escape_len(text, len), post);
    if (cl == NULL) {
        return NULL;
    }

    cl->buf->last = ngx_http_omni_escape(cl->buf->last, text, len);

    ngx_http_omni_event_end(ctx, cl->buf, post, usage_null);

    return cl;
}


/* An event's buffer: "data: " head pre written, room for size bytes of
 * its own and for ngx_http_omni_event_end()'s. */

ngx_chain_t *
ngx_http_omni_event_start(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *pre, size_t size, ngx_str_t *post)
{
    ngx_buf_t    *b;
    ngx_str_t    *object;
    ngx_chain_t  *cl;
    ngx_str_t     chunk = ngx_string("chat.completion.chunk");
    ngx_str_t     completion = ngx_string("text_completion");

    object = (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_CHAT)
             ? &chunk : &completion;

    size += sizeof("data: ") - 1 + ngx_http_omni_head_len(ctx, object)
            + pre->len + post->len + sizeof(",\"usage\":null") - 1
            + sizeof("}\n\n") - 1;

    cl = ngx_http_omni_event_buf(r, ctx, size);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;

    b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    b->last = ngx_http_omni_head(b->last, ctx, object);
    b->last = ngx_cpymem(b->last, pre->data, pre->len);

    return cl;
}


/* post [,"usage":null] }\n\n: usage_null adds "usage":null when the
 * client asked for include_usage. */

void
ngx_http_omni_event_end(ngx_http_omni_ctx_t *ctx, ngx_buf_t *b,
    ngx_str_t *post, ngx_uint_t usage_null)
{
    if (post->len) {
        b->last = ngx_cpymem(b->last, post->data, post->len);
    }

    if (usage_null && ctx->req.include_usage) {
        b->last = ngx_cpymem(b->last, ",\"usage\":null",
                             sizeof(",\"usage\":null") - 1);
    }

    b->last = ngx_cpymem(b->last, "}\n\n", sizeof("}\n\n") - 1);
}


size_t
ngx_http_omni_head_len(ngx_http_omni_ctx_t *ctx, ngx_str_t *object)
{
    return sizeof("{\"id\":\"\",\"object\":\"\",\"created\":,\"model\":\"\",")
           - 1 + ngx_http_omni_escape_len(ctx->id.data, ctx->id.len)
           + object->len + NGX_TIME_T_LEN
           + ngx_http_omni_escape_len(ctx->req.model.data,
                                      ctx->req.model.len);
}


/* {"id":ID,"object":OBJECT,"created":N,"model":MODEL,  (open object) */

u_char *
ngx_http_omni_head(u_char *p, ngx_http_omni_ctx_t *ctx, ngx_str_t *object)
{
    p = ngx_cpymem(p, "{\"id\":\"", sizeof("{\"id\":\"") - 1);
    p = ngx_http_omni_escape(p, ctx->id.data, ctx->id.len);
    p = ngx_sprintf(p, "\",\"object\":\"%V\",\"created\":%T,\"model\":\"",
                    object, ctx->created);
    p = ngx_http_omni_escape(p, ctx->req.model.data, ctx->req.model.len);
    *p++ = '"';
    *p++ = ',';

    return p;
}


ngx_str_t
ngx_http_omni_finish(ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t  stop = ngx_string("stop");
    ngx_str_t  length = ngx_string("length");

    return (ctx->usage.finish == OMNI_FINISH_LENGTH) ? length : stop;
}


/* usage: completion_tokens counts the text and the speech units (DONE's
 * audio_tokens) together, as OpenAI's audio answers do; text_tokens only
 * when the answer was spoken. At most NGX_HTTP_OMNI_USAGE_LEN bytes. */

u_char *
ngx_http_omni_usage(u_char *p, ngx_http_omni_ctx_t *ctx)
{
    uint64_t  completion;

    completion = (uint64_t) ctx->usage.completion_tokens
                 + ctx->usage.audio_tokens;

    p = ngx_sprintf(p, NGX_HTTP_OMNI_USAGE_FMT, ctx->usage.prompt_tokens,
                    completion, ctx->usage.prompt_tokens + completion,
                    ctx->usage.cached_tokens, ctx->usage.reasoning_tokens,
                    ctx->usage.audio_tokens);

    if (ctx->req.audio) {
        p = ngx_sprintf(p, ",\"text_tokens\":%uD",
                        ctx->usage.completion_tokens);
    }

    *p++ = '}';

    /* audio in: its seconds beside the tokens (our key; SDKs keep keys
     * they do not know) */

    if (ctx->req.audio_in) {
        p = ngx_cpymem(p, ",\"input_audio_seconds\":",
                       sizeof(",\"input_audio_seconds\":") - 1);
        p = ngx_http_omni_double(p, ctx->usage.input_audio_ms / 1000.0, 3);
    }

    *p++ = '}';

    return p;
}


u_char *
ngx_http_omni_double(u_char *p, double v, ngx_uint_t frac)
{
    u_char      *d;
    uint64_t     n, scale;
    ngx_uint_t   i;

    if (!(v > -1e15 && v < 1e15)) {
        v = 0;
    }

    for (scale = 1, i = 0; i < frac; i++) {
        scale *= 10;
    }

    if (v < 0) {
        n = (uint64_t) (-v * scale + 0.5);

        if (n) {
            *p++ = '-';
        }

    } else {
        n = (uint64_t) (v * scale + 0.5);
    }

    p = ngx_sprintf(p, "%uL.", n / scale);

    /* the decimals, then the zeros at their end dropped but one */

    d = p;
    n %= scale;

    for (i = frac; i > 0; i--) {
        d[i - 1] = (u_char) ('0' + n % 10);
        n /= 10;
    }

    for (i = frac; i > 1 && d[i - 1] == '0'; i--) { /* void */ }

    if (frac == 0) {
        d[0] = '0';
        i = 1;
    }

    return p + i;
}


/* The text gathered in chain (ctx->text, ctx->reasoning) for a
 * non-streaming answer, contiguous: escaping
 * needs whole UTF-8 characters, and a chain may split one. */

u_char *
ngx_http_omni_text(ngx_http_request_t *r, ngx_chain_t *chain,
    size_t *len)
{
    u_char       *p, *text;
    size_t        n;
    ngx_chain_t  *cl;

    n = 0;

    for (cl = chain; cl; cl = cl->next) {
        n += cl->buf->last - cl->buf->pos;
    }

    *len = n;

    if (n == 0) {
        return NULL;
    }

    if (chain->next == NULL) {
        return chain->buf->pos;
    }

    text = ngx_pnalloc(r->pool, n);
    if (text == NULL) {
        return NULL;
    }

    p = text;

    for (cl = chain; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    return text;
}


/* {"error":{"message":M,"type":T,"param":P|null,"code":C|null}} */

static size_t
ngx_http_omni_error_len(ngx_http_omni_error_t *err)
{
    return sizeof("{\"error\":{\"message\":\"\",\"type\":\"\","
                  "\"param\":null,\"code\":null}}") - 1
           + ngx_http_omni_escape_len(err->message.data, err->message.len)
           + sizeof("invalid_request_error") - 1
           + ngx_http_omni_escape_len(err->type.data, err->type.len)
           + ngx_http_omni_escape_len(err->param.data, err->param.len)
           + ngx_http_omni_escape_len(err->code.data, err->code.len);
}


static u_char *
ngx_http_omni_error_write(u_char *p, ngx_http_omni_error_t *err)
{
    ngx_str_t  *type;

    p = ngx_cpymem(p, "{\"error\":{\"message\":\"",
                   sizeof("{\"error\":{\"message\":\"") - 1);
    p = ngx_http_omni_escape(p, err->message.data, err->message.len);
    p = ngx_cpymem(p, "\",\"type\":\"", sizeof("\",\"type\":\"") - 1);

    type = err->type.len ? &err->type : ngx_http_omni_error_type(err->status);

    p = ngx_http_omni_escape(p, type->data, type->len);

    p = ngx_cpymem(p, "\",\"param\":", sizeof("\",\"param\":") - 1);

    if (err->param.len) {
        *p++ = '"';
        p = ngx_http_omni_escape(p, err->param.data, err->param.len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    p = ngx_cpymem(p, ",\"code\":", sizeof(",\"code\":") - 1);

    if (err->code.len) {
        *p++ = '"';
        p = ngx_http_omni_escape(p, err->code.data, err->code.len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    return ngx_cpymem(p, "}}", sizeof("}}") - 1);
}


/* ---- response headers ---- */

/*
 * x-omni-seed: the seed the response is sampled with, the client's or the
 * one drawn for it (ngx_http_omni_parse()), on streaming and whole
 * responses alike: sending it back as "seed" reproduces the text.
 */

ngx_int_t
ngx_http_omni_seed_header(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    static ngx_str_t  key = ngx_string("x-omni-seed");

    if (ctx->req.seed.len == 0) {
        return NGX_OK;
    }

    return ngx_http_omni_add_header(r, &key, &ctx->req.seed);
}


/* ---- JSON string escaping ---- */

/* Bytes s takes inside a JSON string: '"' '\\' and control characters
 * escaped, valid UTF-8 as it is, each invalid byte as U+FFFD. */

size_t
ngx_http_omni_escape_len(u_char *s, size_t len)
{
    size_t   n, k;
    u_char  *p, *last;

    n = 0;
    last = s + len;

    for (p = s; p < last; /* void */) {

        if (*p >= 0x80) {
            k = omni_utf8_char(p, last - p);
            n += k ? k : 3;
            p += k ? k : 1;
            continue;
        }

        switch (*p) {
        case '"':
        case '\\':
        case '\n':
        case '\r':
        case '\t':
        case '\b':
        case '\f':
            n += 2;
            break;

        default:
            n += (*p < 0x20) ? sizeof("\\u0000") - 1 : 1;
        }

        p++;
    }

    return n;
}


u_char *
ngx_http_omni_escape(u_char *dst, u_char *s, size_t len)
{
    size_t   k;
    u_char  *p, *last;

    static const u_char  hex[] = "0123456789abcdef";

    last = s + len;

    for (p = s; p < last; /* void */) {

        if (*p >= 0x80) {
            k = omni_utf8_char(p, last - p);

            if (k == 0) {
                *dst++ = 0xef; *dst++ = 0xbf; *dst++ = 0xbd;
                p++;
                continue;
            }

            dst = ngx_cpymem(dst, p, k);
            p += k;
            continue;
        }

        switch (*p) {
        case '"':  *dst++ = '\\'; *dst++ = '"'; break;
        case '\\': *dst++ = '\\'; *dst++ = '\\'; break;
        case '\n': *dst++ = '\\'; *dst++ = 'n'; break;
        case '\r': *dst++ = '\\'; *dst++ = 'r'; break;
        case '\t': *dst++ = '\\'; *dst++ = 't'; break;
        case '\b': *dst++ = '\\'; *dst++ = 'b'; break;
        case '\f': *dst++ = '\\'; *dst++ = 'f'; break;

        default:
            if (*p < 0x20) {
                dst = ngx_cpymem(dst, "\\u00", sizeof("\\u00") - 1);
                *dst++ = hex[*p >> 4];
                *dst++ = hex[*p & 0xf];

            } else {
                *dst++ = *p;
            }
        }

        p++;
    }

    return dst;
}

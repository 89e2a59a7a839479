
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_audio.c -- the engine's AUDIO frames out. Each AUDIO
 * payload is a slice of the encoded file in the format asked for
 * (omni_proto.h); nginx never decodes or encodes audio, it only moves
 * the bytes:
 *
 *   /v1/audio/speech, stream_format "audio": the bytes themselves, a
 *       chunk each, flushed (Content-Type per format);
 *   /v1/audio/speech, "sse": a speech.audio.delta event each (base64 of
 *       that payload alone, so each event decodes alone), then
 *       speech.audio.done with usage, then [DONE];
 *   chat, streaming (pcm16 only): delta.audio.data pieces of a multiple
 *       of 6 bytes (whole samples and whole base64 groups, so that the
 *       strings concatenate), the rest carried to the next AUDIO; the
 *       transcript (TEXT) as delta.audio.transcript; the id with the
 *       first delta.audio, expires_at with finish_reason;
 *   chat, non-streaming: gathered in r->pool (NGX_HTTP_OMNI_MAX_AUDIO),
 *       sent as message.audio.data at DONE; a WAV gets its real sizes.
 *
 * Apart from ngx_http_omni_sse.c and ngx_http_omni_openai.c (text out)
 * because audio has its own framing rules (base64 pieces, raw chunks,
 * the buffered answer) that text never needs.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


/* non-streaming gather buffers: a multiple of 3, so each full buffer is
 * whole base64 groups and the chain encodes buffer by buffer */
#define NGX_HTTP_OMNI_AUDIO_BUF   (3 * 65536)

#define NGX_HTTP_OMNI_WAV_HEADER  44
#define NGX_HTTP_OMNI_EXPIRES     3600      /* audio.expires_at - created */
#define NGX_HTTP_OMNI_PRE_MAX     256       /* a chunk's pre and post, with
                                               the audio id (38) */


static ngx_int_t ngx_http_omni_audio_raw(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_audio_delta(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_audio_speech_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
static ngx_int_t ngx_http_omni_audio_pieces(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_audio_piece(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *first, ngx_str_t *rest);
static ngx_int_t ngx_http_omni_audio_transcript(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_audio_chat_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
static ngx_str_t ngx_http_omni_audio_pre(ngx_http_omni_ctx_t *ctx,
    u_char *buf, char *key);
static u_char *ngx_http_omni_audio_base64(u_char *p,
    ngx_http_omni_ctx_t *ctx);
static void ngx_http_omni_audio_wav_sizes(ngx_http_omni_ctx_t *ctx);
static ngx_int_t ngx_http_omni_audio_send(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_chain_t *cl);


/* the Content-Type of each response_format (speech, raw bytes) */
static ngx_str_t  ngx_http_omni_audio_types[][2] = {
    { ngx_string("mp3"),  ngx_string("audio/mpeg") },
    { ngx_string("opus"), ngx_string("audio/opus") },
    { ngx_string("aac"),  ngx_string("audio/aac") },
    { ngx_string("flac"), ngx_string("audio/flac") },
    { ngx_string("wav"),  ngx_string("audio/wav") },
    { ngx_string("pcm"),  ngx_string("audio/pcm") },
    { ngx_null_string,    ngx_null_string }
};

static ngx_str_t  ngx_http_omni_audio_sse_type =
    ngx_string("text/event-stream; charset=utf-8");


ngx_int_t
ngx_http_omni_audio_header(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_uint_t  i;

    if (!ngx_http_omni_raw_audio(ctx)) {
        ngx_http_omni_set_content_type(r, &ngx_http_omni_audio_sse_type);
        return NGX_OK;
    }

    for (i = 0; ngx_http_omni_audio_types[i][0].len; i++) {
        if (ngx_http_omni_audio_types[i][0].len == ctx->req.format.len
            && ngx_strncmp(ngx_http_omni_audio_types[i][0].data,
                           ctx->req.format.data, ctx->req.format.len) == 0)
        {
            ngx_http_omni_set_content_type(r,
                                           &ngx_http_omni_audio_types[i][1]);
            return NGX_OK;
        }
    }

    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                  "omni audio format \"%V\" has no content type",
                  &ctx->req.format);

    return NGX_ERROR;
}


ngx_int_t
ngx_http_omni_audio_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_uint_t  speech;

    speech = (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_SPEECH);

    switch (ctx->frame.type) {

    case OMNI_F_AUDIO:
        if (!speech) {
            return ngx_http_omni_audio_pieces(r, ctx, payload);
        }

        return ctx->req.sse ? ngx_http_omni_audio_delta(r, ctx, payload)
                            : ngx_http_omni_audio_raw(r, ctx, payload);

    case OMNI_F_TEXT:

        /* speech has no text out: the engine may say what it speaks,
         * the client did not ask for it */

        return speech ? NGX_OK
                      : ngx_http_omni_audio_transcript(r, ctx, payload);

    default: /* OMNI_F_DONE */

        if (omni_done_decode(&ctx->usage, payload->data) != 0) {
            return ngx_http_omni_invalid_frame(r, ctx, "DONE");
        }

        ctx->usage_seen = 1;

        ctx->done = 1;
        ngx_http_omni_keepalive_stop(ctx);

        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "omni audio done: prompt %uD, audio tokens %uD, "
                       "%uD ms", ctx->usage.prompt_tokens,
                       ctx->usage.audio_tokens, ctx->usage.audio_ms);

        if (!speech) {
            return ngx_http_omni_audio_chat_done(r, ctx);
        }

        return ctx->req.sse ? ngx_http_omni_audio_speech_done(r, ctx)
                            : NGX_OK;
    }
}


/* ---- /v1/audio/speech ---- */

/* The bytes as they are: one chunk, flushed. */

static ngx_int_t
ngx_http_omni_audio_raw(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_chain_t  *cl;

    cl = ngx_http_omni_event_buf(r, ctx, payload->len);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, payload->data, payload->len);

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* data: {"type":"speech.audio.delta","audio":BASE64}\n\n */

static ngx_int_t
ngx_http_omni_audio_delta(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_str_t     b64;
    ngx_chain_t  *cl;

    static u_char  pre[] = "data: {\"type\":\"speech.audio.delta\","
                           "\"audio\":\"";
    static u_char  post[] = "\"}\n\n";

    cl = ngx_http_omni_event_buf(r, ctx,
                                 sizeof(pre) - 1
                                 + ngx_base64_encoded_length(payload->len)
                                 + sizeof(post) - 1);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, pre, sizeof(pre) - 1);

    b64.data = cl->buf->last;
    ngx_encode_base64(&b64, payload);

    cl->buf->last = ngx_cpymem(cl->buf->last + b64.len, post,
                               sizeof(post) - 1);

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* speech.audio.done with usage (input: the prompt tokens; output: the
 * speech units spoken), then [DONE] */

static ngx_int_t
ngx_http_omni_audio_speech_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx)
{
    ngx_chain_t  *cl;

    static u_char  fmt[] = "data: {\"type\":\"speech.audio.done\","
                           "\"usage\":{\"input_tokens\":%uD,"
                           "\"output_tokens\":%uD,\"total_tokens\":%uL}}"
                           "\n\n";

    cl = ngx_http_omni_event_buf(r, ctx, sizeof(fmt) + 3 * NGX_INT64_LEN);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->last = ngx_sprintf(cl->buf->last, (char *) fmt,
                                ctx->usage.prompt_tokens,
                                ctx->usage.audio_tokens,
                                (uint64_t) ctx->usage.prompt_tokens
                                + ctx->usage.audio_tokens);

    if (ngx_http_omni_audio_send(r, ctx, cl) != NGX_OK) {
        return NGX_ERROR;
    }

    cl = ngx_http_omni_chunk_done(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* ---- chat, streaming ---- */

/*
 * pcm16 in pieces of a multiple of 6 bytes: the bytes carried from the
 * last AUDIO (fewer than 6) and the payload's first ones make the first
 * group, the rest of the payload follows; what is short of a group is
 * carried again. Two sources, one piece: no copy of the payload.
 */

static ngx_int_t
ngx_http_omni_audio_pieces(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    size_t     k, send;
    ngx_int_t  rc;
    ngx_str_t  first, rest;

    if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    send = ctx->carry_len + payload->len;
    send -= send % 6;

    if (send == 0) {
        ngx_memcpy(ctx->carry + ctx->carry_len, payload->data,
                   payload->len);
        ctx->carry_len += payload->len;
        return NGX_OK;
    }

    k = 0;
    ngx_str_null(&first);

    if (ctx->carry_len) {
        k = 6 - ctx->carry_len;
        ngx_memcpy(ctx->carry + ctx->carry_len, payload->data, k);

        first.data = ctx->carry;
        first.len = 6;
        send -= 6;
    }

    rest.data = payload->data + k;
    rest.len = send;

    rc = ngx_http_omni_audio_piece(r, ctx, &first, &rest);

    /* the tail, fewer than 6 bytes, waits for the next AUDIO or DONE */

    k += send;
    ctx->carry_len = payload->len - k;
    ngx_memcpy(ctx->carry, payload->data + k, ctx->carry_len);

    return rc;
}


/* One delta.audio.data chunk: base64 of first then rest (first a
 * multiple of 3 bytes, or rest empty). */

static ngx_int_t
ngx_http_omni_audio_piece(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *first, ngx_str_t *rest)
{
    u_char        buf[NGX_HTTP_OMNI_PRE_MAX];
    ngx_str_t     pre, b64;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;
    ngx_str_t     post = ngx_string("\"}},\"logprobs\":null,"
                                    "\"finish_reason\":null}]");

    pre = ngx_http_omni_audio_pre(ctx, buf, "data");

    cl = ngx_http_omni_event_start(r, ctx, &pre,
                                   ngx_base64_encoded_length(first->len)
                                   + ngx_base64_encoded_length(rest->len),
                                   &post);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    b64.data = b->last;
    ngx_encode_base64(&b64, first);
    b->last += b64.len;

    b64.data = b->last;
    ngx_encode_base64(&b64, rest);
    b->last += b64.len;

    ngx_http_omni_event_end(ctx, b, &post, 1);

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* delta.audio.transcript: the TEXT of a spoken answer (content stays
 * null) */

static ngx_int_t
ngx_http_omni_audio_transcript(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload)
{
    u_char        buf[NGX_HTTP_OMNI_PRE_MAX];
    ngx_str_t     pre;
    ngx_chain_t  *cl;
    ngx_str_t     post = ngx_string("\"}},\"logprobs\":null,"
                                    "\"finish_reason\":null}]");

    if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    if (payload->len == 0) {
        return NGX_OK;
    }

    pre = ngx_http_omni_audio_pre(ctx, buf, "transcript");

    cl = ngx_http_omni_event(r, ctx, &pre, payload->data, payload->len,
                             &post, 1);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* DONE: the carried bytes as the last piece; expires_at with the finish
 * reason (and the id, if no audio went before); usage if asked; [DONE] */

static ngx_int_t
ngx_http_omni_audio_chat_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx)
{
    u_char        buf[NGX_HTTP_OMNI_PRE_MAX], *p;
    ngx_str_t     pre, post, rest, reason;
    ngx_chain_t  *cl;

    if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->carry_len) {
        pre.data = ctx->carry;
        pre.len = ctx->carry_len;
        ngx_str_null(&rest);

        if (ngx_http_omni_audio_piece(r, ctx, &pre, &rest) != NGX_OK) {
            return NGX_ERROR;
        }

        ctx->carry_len = 0;
    }

    pre = ngx_http_omni_audio_pre(ctx, buf, "expires_at");
    pre.len--;                                      /* no '"': a number */

    reason = ngx_http_omni_finish(ctx);

    p = buf + pre.len;
    post.data = p;
    post.len = ngx_sprintf(p, "%T}},\"logprobs\":null,\"finish_reason\":\"%V"
                           "\"}]", ctx->created + NGX_HTTP_OMNI_EXPIRES,
                           &reason)
               - p;

    cl = ngx_http_omni_event(r, ctx, &pre, NULL, 0, &post, 1);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_omni_audio_send(r, ctx, cl) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->req.include_usage) {
        cl = ngx_http_omni_chunk_usage(r, ctx);
        if (cl == NULL || ngx_http_omni_audio_send(r, ctx, cl) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    cl = ngx_http_omni_chunk_done(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_omni_audio_send(r, ctx, cl);
}


/* "choices":[{"index":0,"delta":{ then "content":null,"audio":{"id":ID,
 * the first time, else "audio":{ ; then "key":" (in buf, of
 * NGX_HTTP_OMNI_PRE_MAX bytes: at most 117 of them) */

static ngx_str_t
ngx_http_omni_audio_pre(ngx_http_omni_ctx_t *ctx, u_char *buf, char *key)
{
    u_char     *p;
    ngx_str_t   pre;

    p = ngx_cpymem(buf, "\"choices\":[{\"index\":0,\"delta\":{",
                   sizeof("\"choices\":[{\"index\":0,\"delta\":{") - 1);

    if (!ctx->audio_started) {
        ctx->audio_started = 1;
        p = ngx_sprintf(p, "\"content\":null,\"audio\":{\"id\":\"%V\",",
                        &ctx->req.audio_id);

    } else {
        p = ngx_cpymem(p, "\"audio\":{", sizeof("\"audio\":{") - 1);
    }

    p = ngx_sprintf(p, "\"%s\":\"", key);

    pre.data = buf;
    pre.len = p - buf;

    return pre;
}


/* ---- chat, non-streaming ---- */

ngx_int_t
ngx_http_omni_audio_gather(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload, ngx_http_omni_error_t *err)
{
    u_char       *p, *last;
    size_t        n;
    ngx_chain_t  *cl;

    if (payload->len > NGX_HTTP_OMNI_MAX_AUDIO - ctx->audio_len) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni chat audio over %uD bytes, the limit of a "
                      "non-streaming answer",
                      (uint32_t) NGX_HTTP_OMNI_MAX_AUDIO);

        err->status = NGX_HTTP_INTERNAL_SERVER_ERROR;
        ngx_str_set(&err->type, "server_error");
        ngx_str_null(&err->param);
        ngx_str_set(&err->code, "audio_too_long");
        ngx_str_set(&err->message, "The spoken answer is longer than a "
                    "non-streaming response holds (16 MiB of audio); ask "
                    "with \"stream\": true and audio.format \"pcm16\".");
        return NGX_DECLINED;
    }

    p = payload->data;
    last = p + payload->len;

    while (p < last) {
        cl = ctx->audio_last;

        if (cl == NULL || cl->buf->last == cl->buf->end) {
            cl = ngx_http_omni_chain_add(r, &ctx->audio, &ctx->audio_last,
                                         NGX_HTTP_OMNI_AUDIO_BUF);
            if (cl == NULL) {
                return NGX_ERROR;
            }
        }

        n = ngx_min((size_t) (last - p),
                    (size_t) (cl->buf->end - cl->buf->last));

        cl->buf->last = ngx_cpymem(cl->buf->last, p, n);
        p += n;
    }

    ctx->audio_len += payload->len;

    return NGX_OK;
}


/*
 * chat.completion with audio:
 *   {"id",... "choices":[{"index":0,"message":{"role":"assistant",
 *   "content":null,"refusal":null,"audio":{"id":ID,"data":BASE64,
 *   "expires_at":T,"transcript":TEXT},"annotations":[]},
 *   "logprobs":null,"finish_reason":R}],"usage":{...}}\n
 */

ngx_buf_t *
ngx_http_omni_audio_json(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char      *text;
    size_t       len, size;
    ngx_buf_t   *b;
    ngx_str_t    object = ngx_string("chat.completion");
    ngx_str_t    pre = ngx_string("\"choices\":[{\"index\":0,\"message\":"
                                  "{\"role\":\"assistant\",\"content\":null,"
                                  "\"refusal\":null,\"audio\":{\"id\":\"");
    ngx_str_t    tail = ngx_string("\"},\"annotations\":[]},"
                                   "\"logprobs\":null,\"finish_reason\":\"");

    text = ngx_http_omni_text(r, ctx->text, &len);
    if (text == NULL && len > 0) {
        return NULL;
    }

    ngx_http_omni_audio_wav_sizes(ctx);

    size = ngx_http_omni_head_len(ctx, &object) + pre.len
           + ctx->req.audio_id.len + sizeof("\",\"data\":\"") - 1
           + ngx_base64_encoded_length(ctx->audio_len)
           + sizeof("\",\"expires_at\":,\"transcript\":\"") - 1
           + NGX_TIME_T_LEN + ngx_http_omni_escape_len(text, len)
           + tail.len + NGX_HTTP_OMNI_END_LEN;

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_http_omni_head(b->last, ctx, &object);
    b->last = ngx_cpymem(b->last, pre.data, pre.len);
    b->last = ngx_cpymem(b->last, ctx->req.audio_id.data,
                         ctx->req.audio_id.len);
    b->last = ngx_cpymem(b->last, "\",\"data\":\"",
                         sizeof("\",\"data\":\"") - 1);
    b->last = ngx_http_omni_audio_base64(b->last, ctx);
    b->last = ngx_sprintf(b->last, "\",\"expires_at\":%T,\"transcript\":\"",
                          ctx->created + NGX_HTTP_OMNI_EXPIRES);
    b->last = ngx_http_omni_escape(b->last, text, len);
    b->last = ngx_cpymem(b->last, tail.data, tail.len);
    b->last = ngx_http_omni_completion_end(b->last, ctx);
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/* The gathered audio as one base64 string: every buffer but the last is
 * full, a multiple of 3 bytes, so the pieces join. */

static u_char *
ngx_http_omni_audio_base64(u_char *p, ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t     src, dst;
    ngx_chain_t  *cl;

    for (cl = ctx->audio; cl; cl = cl->next) {
        src.data = cl->buf->pos;
        src.len = cl->buf->last - cl->buf->pos;

        dst.data = p;
        ngx_encode_base64(&dst, &src);
        p += dst.len;
    }

    return p;
}


/* A streamed WAV's header says 0xFFFFFFFF for both sizes (the engine
 * does not know them); a whole one can say the truth: RIFF's (36 + data)
 * at 4, data's at 40. Only the canonical 44-byte header is patched. */

static void
ngx_http_omni_audio_wav_sizes(ngx_http_omni_ctx_t *ctx)
{
    u_char  *h;
    size_t   data;

    if (ctx->req.format.len != 3
        || ngx_strncmp(ctx->req.format.data, "wav", 3) != 0
        || ctx->audio_len < NGX_HTTP_OMNI_WAV_HEADER)
    {
        return;
    }

    h = ctx->audio->buf->pos;

    if (ngx_strncmp(h, "RIFF", 4) != 0 || ngx_strncmp(h + 36, "data", 4) != 0)
    {
        return;
    }

    data = ctx->audio_len - NGX_HTTP_OMNI_WAV_HEADER;

    omni_wr32(h + 4, (uint32_t) (36 + data));
    omni_wr32(h + 40, (uint32_t) data);
}


/* NGX_OK, or NGX_ERROR when the client is gone */

static ngx_int_t
ngx_http_omni_audio_send(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_chain_t *cl)
{
    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}

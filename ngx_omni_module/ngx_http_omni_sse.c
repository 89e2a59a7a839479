
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_sse.c -- a streaming response: its start (the first
 * frame that belongs to it sets the header, process_header's call), then
 * the upstream input filter reads the engine's frames (the resumable
 * parser of ngx_http_omni_upstream.c) and makes each an SSE event, sent
 * and flushed at once: the chat role chunk before the first text, a
 * chunk per TEXT (delta.content) and per REASONING (delta.reasoning_content),
 * at DONE the finish chunk, the usage chunk if asked for
 * and [DONE]; an ERROR, or a failure of the engine, as one error event
 * that ends the stream. Spoken responses' frames are
 * ngx_http_omni_audio.c's. Apart from ngx_http_omni_upstream.c, which
 * decides the response from the first frames, because this is the part
 * that runs per token.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


static ngx_int_t ngx_http_omni_stream_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_stream_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);


/*
 * A stream starts with the first frame that is part of it, left in the
 * buffer for the input filter: TEXT or DONE; AUDIO when the answer is
 * spoken; TRANSCRIPT (not TEXT) for a transcription. Speech has no text
 * out: a TEXT before its audio is read and dropped
 * (ngx_http_omni_header_frame()). NGX_OK: the header is set; NGX_AGAIN:
 * no whole frame header yet; NGX_DECLINED: the parser reads this frame;
 * NGX_ERROR.
 */

ngx_int_t
ngx_http_omni_stream_start(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    size_t                n;
    ngx_buf_t            *b;
    ngx_uint_t            stt;
    OmniFrameHdr          h;
    ngx_http_upstream_t  *u;

    static ngx_str_t  cache_key = ngx_string("Cache-Control");
    static ngx_str_t  cache_value = ngx_string("no-cache");
    static ngx_str_t  cache_stt = ngx_string("no-store");
    static ngx_str_t  sse_type = ngx_string("text/event-stream; "
                                            "charset=utf-8");

    u = r->upstream;
    b = &u->buffer;

    n = b->last - b->pos;

    if (n < OMNI_FRAME_HDR) {

        /* the upstream module reads on after b->last: what is left of
         * the buffer must hold the header's rest; a frame read whole
         * (a dropped TEXT) restarts the read timeout */

        if (b->pos != b->start) {
            ngx_memmove(b->start, b->pos, n);
            b->pos = b->start;
            b->last = b->start + n;

            if (n == 0) {
                ngx_add_timer(u->peer.connection->read,
                              u->conf->read_timeout);
            }
        }

        return NGX_AGAIN;
    }

    omni_hdr_decode(&h, b->pos);

    stt = (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_TRANSCRIPTION);

    if (omni_frame_check(&h, OMNI_DIR_TO_CLIENT) != NULL
        || !(h.type == OMNI_F_DONE
             || (h.type == OMNI_F_AUDIO && ngx_http_omni_spoken(ctx))
             || (h.type == OMNI_F_TRANSCRIPT && stt)
             || ((h.type == OMNI_F_TEXT || h.type == OMNI_F_REASONING)
                 && !stt
                 && ctx->endpoint->kind != NGX_HTTP_OMNI_KIND_SPEECH)))
    {
        return NGX_DECLINED;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni stream starts with frame type %ui",
                   (ngx_uint_t) h.type);

    u->headers_in.status_n = NGX_HTTP_OK;
    u->headers_in.content_length_n = -1;
    u->state->status = NGX_HTTP_OK;

    if (ngx_http_omni_spoken(ctx)) {
        if (ngx_http_omni_audio_header(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

    } else {
        ngx_http_omni_set_content_type(r, &sse_type);
    }

    if (ngx_http_omni_add_header(r, &cache_key,
                                 stt ? &cache_stt : &cache_value)
        != NGX_OK
        || ngx_http_omni_seed_header(r, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* The event stream: each frame becomes one SSE event, sent at once. */

ngx_int_t
ngx_http_omni_input_filter(void *data, ssize_t bytes)
{
    ngx_http_request_t  *r = data;

    u_char                *p;
    ngx_int_t              rc;
    ngx_buf_t             *b;
    ngx_str_t              payload;
    ngx_http_upstream_t   *u;
    ngx_http_omni_ctx_t   *ctx;

    u = r->upstream;
    b = &u->buffer;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    p = b->last;
    b->last += bytes;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni filter: %z bytes", bytes);

    if (ctx->done) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent %z bytes after its last frame",
                      bytes);
        return NGX_OK;
    }

    while (p < b->last) {

        rc = ngx_http_omni_parse_frame(r, ctx, &p, b->last, &payload);

        if (rc == NGX_AGAIN) {
            break;
        }

        if (rc == NGX_OK) {
            rc = ngx_http_omni_stream_frame(r, ctx, &payload);
        }

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_HTTP_UPSTREAM_INVALID_HEADER) {
            ngx_http_omni_count(r, NGX_HTTP_OMNI_M_UPSTREAM_ERROR);

            if (ngx_http_omni_stream_error(r, ctx, &ctx->err) == NGX_ERROR) {
                return NGX_ERROR;
            }
        }

        if (ctx->done) {

            /* the engine answered: it reads no more of an upload */

            ngx_http_omni_audio_in_stop(r, ctx);
            u->length = 0;
            break;
        }
    }

    return NGX_OK;
}


/* One frame of an event stream: NGX_OK, NGX_ERROR (the client is gone)
 * or NGX_HTTP_UPSTREAM_INVALID_HEADER. */

static ngx_int_t
ngx_http_omni_stream_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_chain_t            *cl;
    ngx_http_omni_error_t   err;

    if (ngx_http_omni_spoken(ctx)
        && (ctx->frame.type == OMNI_F_AUDIO || ctx->frame.type == OMNI_F_TEXT
            || ctx->frame.type == OMNI_F_DONE))
    {
        return ngx_http_omni_audio_frame(r, ctx, payload);
    }

    /* a spoken answer's reasoning is not part of it */

    if (ngx_http_omni_spoken(ctx) && ctx->frame.type == OMNI_F_REASONING) {
        return NGX_OK;
    }

    if (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_TRANSCRIPTION
        && ctx->frame.type != OMNI_F_ERROR)
    {
        return ngx_http_omni_transcript_frame(r, ctx, payload);
    }

    switch (ctx->frame.type) {

    case OMNI_F_TEXT:

        if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        if (payload->len == 0) {
            return NGX_OK;
        }

        cl = ngx_http_omni_chunk_text(r, ctx, payload->data, payload->len);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
               ? NGX_ERROR : NGX_OK;

    case OMNI_F_REASONING:

        /* a thinking model's reasoning, chat only (the engine sends it
         * for messages, never for a prompt) */

        if (ctx->endpoint->kind != NGX_HTTP_OMNI_KIND_CHAT) {
            break;
        }

        if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        cl = ngx_http_omni_chunk_reasoning(r, ctx, payload->data,
                                           payload->len);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
               ? NGX_ERROR : NGX_OK;

    case OMNI_F_DONE:
        return ngx_http_omni_stream_done(r, ctx, payload);

    case OMNI_F_ERROR:
        if (ngx_http_omni_error_frame(r, ctx, payload, &err) != NGX_OK) {
            return ngx_http_omni_invalid_frame(r, ctx, "ERROR");
        }

        return ngx_http_omni_stream_error(r, ctx, &err);
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "omni engine sent unexpected frame type %ui in a stream",
                  (ngx_uint_t) ctx->frame.type);

    return ngx_http_omni_invalid_frame(r, ctx, NULL);
}


/* A chat stream's first chunk, the role, before its first text or its
 * end: once. NGX_OK, or NGX_ERROR (no memory, the client is gone). */

ngx_int_t
ngx_http_omni_stream_role(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_chain_t  *cl;

    if (ctx->role_sent || ctx->endpoint->kind != NGX_HTTP_OMNI_KIND_CHAT) {
        return NGX_OK;
    }

    cl = ngx_http_omni_chunk_role(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    ctx->role_sent = 1;

    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}


/* DONE: the finish chunk, the usage chunk if asked for, [DONE] */

static ngx_int_t
ngx_http_omni_stream_done(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_chain_t  *cl;

    if (omni_done_decode(&ctx->usage, payload->data) != 0) {
        return ngx_http_omni_invalid_frame(r, ctx, "DONE");
    }

    ctx->usage_seen = 1;

    ctx->done = 1;
    ngx_http_omni_keepalive_stop(ctx);

    if (ngx_http_omni_stream_role(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    cl = ngx_http_omni_chunk_finish(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    if (ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ctx->req.include_usage) {
        cl = ngx_http_omni_chunk_usage(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        if (ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    cl = ngx_http_omni_chunk_done(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni stream done: prompt %uD, completion %uD, "
                   "finish %ui", ctx->usage.prompt_tokens,
                   ctx->usage.completion_tokens,
                   (ngx_uint_t) ctx->usage.finish);

    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}


/* An error after the stream began: one error event, then the stream
 * ends (the caller sets u->length 0, or finalize sends the last buffer). */

ngx_int_t
ngx_http_omni_stream_error(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    ngx_chain_t  *cl;

    ctx->done = 1;
    ngx_http_omni_keepalive_stop(ctx);

    if (ngx_http_omni_raw_audio(ctx)) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni audio cut after its start, the response ends "
                      "without its last chunk: %V", &err->message);
        return NGX_ERROR;
    }

    cl = ngx_http_omni_error_event(r, ctx, err);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}

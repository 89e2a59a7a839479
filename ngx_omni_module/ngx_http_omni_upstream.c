
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_upstream.c -- the engine, through nginx's upstream
 * machinery.
 *
 * create_request writes one frame: REQUEST with the engine's JSON, or an
 * empty MODELS, HEALTH or METRICS control frame; a request with audio in
 * is followed by its bytes, which the output filter of
 * ngx_http_omni_audio_in.c frames as AUDIO_IN. Frames coming back
 * (engine/proto/omni_proto.h) are read by one resumable parser: a frame may be
 * split across reads and one read may hold several; every header is
 * checked with omni_frame_check() before its payload is gathered.
 *
 * process_header decides the response from the first frames:
 *
 *   streaming request, first frame TEXT or DONE (AUDIO when spoken):
 *       200 text/event-stream, or the audio's type (speech);
 *       the frames stay in the buffer for the input filter
 *       (ngx_http_omni_sse.c), which turns each one into an SSE event
 *       sent and flushed at once;
 *   non-streaming request: TEXT is gathered, the body is built at DONE
 *       (so it has a Content-Length) or at ERROR (the engine's status);
 *   control frames: their one reply, made by the endpoint's reply
 *       function (its row's reply_frame and reply).
 *
 * A whole body made here goes out through u->out_bufs with u->length 0,
 * which makes the upstream module finish the request as soon as it is
 * sent. An engine that fails before the header leaves the response to
 * nginx's error page, which ngx_http_omni_output.c replaces by JSON; after
 * the header, by an SSE error event and a clean end.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_TEXT_BUF  4096


static ngx_int_t ngx_http_omni_create_request(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_reinit_request(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_process_header(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_header_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_gather(ngx_http_request_t *r,
    ngx_chain_t **chain, ngx_chain_t **last, ngx_str_t *text);
static ngx_int_t ngx_http_omni_input_filter_init(void *data);
static void ngx_http_omni_abort_request(ngx_http_request_t *r);
static void ngx_http_omni_finalize_request(ngx_http_request_t *r,
    ngx_int_t rc);


static ngx_str_t  ngx_http_omni_json_type =
    ngx_string("application/json");


ngx_int_t
ngx_http_omni_upstream_create(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf)
{
    ngx_http_upstream_t  *u;
    ngx_http_omni_ctx_t  *ctx;

    if (ngx_http_upstream_create(r) != NGX_OK) {
        return NGX_ERROR;
    }

    u = r->upstream;
    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    ngx_str_set(&u->schema, "omni://");
    u->output.tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    u->conf = &olcf->upstream;

    u->create_request = ngx_http_omni_create_request;
    u->reinit_request = ngx_http_omni_reinit_request;
    u->process_header = ngx_http_omni_process_header;
    u->abort_request = ngx_http_omni_abort_request;
    u->finalize_request = ngx_http_omni_finalize_request;

    u->input_filter_init = ngx_http_omni_input_filter_init;
    u->input_filter = ngx_http_omni_input_filter;
    u->input_filter_ctx = r;

    u->buffering = olcf->upstream.buffering;

    if (ctx->req.audio_in) {
        u->output.output_filter = ngx_http_omni_audio_in_filter;
        u->output.filter_ctx = r;

        /* an engine that answers before it has read all of an upload (an
         * ERROR) closes its end: the broken pipe of the next write is
         * expected, and what the engine said is read on the other side;
         * one that just closes is logged there ("upstream prematurely
         * closed connection") */

        u->peer.log_error = NGX_ERROR_INFO;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_create_request(ngx_http_request_t *r)
{
    uint8_t               type;
    ngx_buf_t            *b;
    ngx_str_t             payload;
    ngx_chain_t          *cl;
    ngx_http_omni_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    /* the endpoint's frame: a REQUEST carries what its body said, a
     * control frame nothing */

    type = (uint8_t) ctx->endpoint->frame;

    if (ctx->endpoint->parse) {
        payload = ctx->req.engine;

    } else {
        ngx_str_null(&payload);
    }

    b = ngx_create_temp_buf(r->pool, OMNI_FRAME_HDR);
    if (b == NULL) {
        return NGX_ERROR;
    }

    omni_hdr_encode(b->last, type, (uint32_t) payload.len);
    b->last += OMNI_FRAME_HDR;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    r->upstream->request_bufs = cl;

    if (payload.len) {
        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        /* start is where a retry on the next engine sends from again */

        b->start = payload.data;
        b->pos = payload.data;
        b->last = payload.data + payload.len;
        b->end = b->last;
        b->memory = 1;

        cl->next = ngx_alloc_chain_link(r->pool);
        if (cl->next == NULL) {
            return NGX_ERROR;
        }

        cl->next->buf = b;
        cl->next->next = NULL;

        if (ctx->req.audio_in
            && ngx_http_omni_audio_in_request(r, ctx, &cl->next->next)
               != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni request frame: type %ui, %uz bytes",
                   (ngx_uint_t) type, payload.len);

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_reinit_request(ngx_http_request_t *r)
{
    ngx_http_omni_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL) {
        return NGX_OK;
    }

    ctx->hdr_got = 0;
    ctx->payload_got = 0;
    ctx->role_sent = 0;
    ctx->done = 0;
    ctx->text = NULL;
    ctx->text_last = NULL;
    ctx->reasoning = NULL;
    ctx->reasoning_last = NULL;
    ctx->audio = NULL;
    ctx->audio_last = NULL;
    ctx->audio_len = 0;
    ctx->carry_len = 0;
    ctx->audio_started = 0;
    ctx->out = NULL;
    ctx->err.status = 0;

    /* the audio goes again from its start (the request chain is reset by
     * nginx); a transcript begun is dropped */

    ctx->up_off = 0;
    ctx->up_busy = NULL;
    ctx->up_stopped = 0;

    if (ctx->stt) {
        ctx->stt->segments.nelts = 0;
        ctx->stt->words.nelts = 0;
        ctx->stt->held = 0;
        ctx->stt->deltas = 0;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_process_header(ngx_http_request_t *r)
{
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_str_t             payload;
    ngx_http_upstream_t  *u;
    ngx_http_omni_ctx_t  *ctx;

    u = r->upstream;
    b = &u->buffer;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    for ( ;; ) {

        if (ctx->req.stream && ctx->hdr_got == 0) {
            rc = ngx_http_omni_stream_start(r, ctx);

            if (rc != NGX_DECLINED) {
                return rc;
            }
        }

        rc = ngx_http_omni_parse_frame(r, ctx, &b->pos, b->last, &payload);

        if (rc == NGX_AGAIN) {

            /* all bytes are consumed: the buffer is free again, and the
             * read timeout runs from this frame on (once the request is
             * all sent: during an upload the send timeout runs) */

            b->pos = b->start;
            b->last = b->start;

            if (u->request_body_sent) {
                ngx_add_timer(u->peer.connection->read,
                              u->conf->read_timeout);
            }

            return NGX_AGAIN;
        }

        if (rc != NGX_OK) {
            return rc;
        }

        rc = ngx_http_omni_header_frame(r, ctx, &payload);

        if (ctx->done) {

            /* the engine answered: it reads no more of an upload */

            ngx_http_omni_audio_in_stop(r, ctx);
        }

        if (rc != NGX_AGAIN) {
            return rc;
        }
    }
}


/*
 * One whole frame before the response header. NGX_AGAIN: read on;
 * NGX_OK: the response is set; NGX_HTTP_UPSTREAM_INVALID_HEADER;
 * NGX_ERROR.
 */

static ngx_int_t
ngx_http_omni_header_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_int_t                  rc;
    ngx_uint_t                 completion;
    ngx_http_omni_error_t      err;
    ngx_http_omni_endpoint_t  *ep;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni frame: type %ui, %uz bytes",
                   (ngx_uint_t) ctx->frame.type, payload->len);

    ep = ctx->endpoint;

    if (ep->reply && ctx->frame.type == ep->reply_frame) {
        ctx->done = 1;
        return ep->reply(r, ctx, payload);
    }

    completion = (ep->reply == NULL);

    switch (ctx->frame.type) {

    case OMNI_F_TRANSCRIPT:
        if (!completion || ep->kind != NGX_HTTP_OMNI_KIND_TRANSCRIPTION) {
            break;
        }

        rc = ngx_http_omni_transcript_gather(r, ctx, payload, &err);

        if (rc == NGX_DECLINED) {
            ctx->done = 1;
            return ngx_http_omni_reply_error(r, ctx, &err);
        }

        return (rc == NGX_OK) ? NGX_AGAIN : rc;

    case OMNI_F_TEXT:
        if (!completion || ep->kind == NGX_HTTP_OMNI_KIND_TRANSCRIPTION) {
            break;
        }

        if (ep->kind == NGX_HTTP_OMNI_KIND_SPEECH) {
            return NGX_AGAIN;
        }

        if (ngx_http_omni_gather(r, &ctx->text, &ctx->text_last, payload)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        return NGX_AGAIN;

    case OMNI_F_REASONING:

        /* a thinking model's reasoning: chat's reasoning_content; a
         * spoken answer has none (its text is the transcript) */

        if (!completion || ep->kind != NGX_HTTP_OMNI_KIND_CHAT) {
            break;
        }

        if (ctx->req.audio) {
            return NGX_AGAIN;
        }

        if (ngx_http_omni_gather(r, &ctx->reasoning, &ctx->reasoning_last,
                                 payload)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        return NGX_AGAIN;

    case OMNI_F_AUDIO:
        if (!completion || !ctx->req.audio || ctx->req.stream) {
            break;
        }

        rc = ngx_http_omni_audio_gather(r, ctx, payload, &err);

        if (rc == NGX_DECLINED) {
            ctx->done = 1;
            return ngx_http_omni_reply_error(r, ctx, &err);
        }

        return (rc == NGX_OK) ? NGX_AGAIN : NGX_ERROR;

    case OMNI_F_DONE:
        if (!completion) {
            break;
        }

        if (ep->kind == NGX_HTTP_OMNI_KIND_TRANSCRIPTION) {
            return ngx_http_omni_transcript_reply(r, ctx, payload);
        }

        if (omni_done_decode(&ctx->usage, payload->data) != 0) {
            return ngx_http_omni_invalid_frame(r, ctx, "DONE");
        }

        ctx->done = 1;
        ctx->usage_seen = 1;

        if (ngx_http_omni_seed_header(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        return ngx_http_omni_reply_buf(r, ctx, NGX_HTTP_OK,
                                       &ngx_http_omni_json_type,
                                       ctx->req.audio
                                       ? ngx_http_omni_audio_json(r, ctx)
                                       : ngx_http_omni_completion_json(r, ctx));

    case OMNI_F_ERROR:
        if (ngx_http_omni_error_frame(r, ctx, payload, &err) != NGX_OK) {
            return ngx_http_omni_invalid_frame(r, ctx, "ERROR");
        }

        ctx->done = 1;

        return ngx_http_omni_reply_error(r, ctx, &err);
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "omni engine sent unexpected frame type %ui",
                  (ngx_uint_t) ctx->frame.type);

    return ngx_http_omni_invalid_frame(r, ctx, NULL);
}


/* Non-streaming TEXT (or REASONING): appended to *chain, whose last link
 * is *last, in buffers of at least NGX_HTTP_OMNI_TEXT_BUF bytes. */

static ngx_int_t
ngx_http_omni_gather(ngx_http_request_t *r, ngx_chain_t **chain,
    ngx_chain_t **last, ngx_str_t *text)
{
    ngx_chain_t  *cl;

    if (text->len == 0) {
        return NGX_OK;
    }

    cl = *last;

    if (cl == NULL || (size_t) (cl->buf->end - cl->buf->last) < text->len) {
        cl = ngx_http_omni_chain_add(r, chain, last,
                                     ngx_max(text->len,
                                             NGX_HTTP_OMNI_TEXT_BUF));
        if (cl == NULL) {
            return NGX_ERROR;
        }
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, text->data, text->len);

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_reply(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_uint_t status, ngx_str_t *type, ngx_chain_t *body)
{
    off_t                 len;
    ngx_chain_t          *cl;
    ngx_http_upstream_t  *u;

    u = r->upstream;

    len = 0;

    for (cl = body; cl; cl = cl->next) {
        cl->buf->tag = u->output.tag;
        cl->buf->flush = 1;
        len += ngx_buf_size(cl->buf);
    }

    ctx->out = body;

    u->headers_in.status_n = status;
    u->headers_in.content_length_n = len;
    u->state->status = status;

    ngx_http_omni_set_content_type(r, type);

    if (ngx_http_omni_retry_after(r, status) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni response: %ui, %O bytes", status, len);

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_reply_buf(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_uint_t status, ngx_str_t *type, ngx_buf_t *b)
{
    ngx_chain_t  *cl;

    if (b == NULL) {
        return NGX_ERROR;
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    return ngx_http_omni_reply(r, ctx, status, type, cl);
}


ngx_int_t
ngx_http_omni_reply_error(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    return ngx_http_omni_reply_buf(r, ctx, err->status,
                                   &ngx_http_omni_json_type,
                                   ngx_http_omni_error_json(r, err));
}


/* The 502's JSON is the error page filter's, from ctx->err. */

ngx_int_t
ngx_http_omni_invalid_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    const char *what)
{
    if (what) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent invalid %s frame", what);
    }

    ngx_http_omni_engine_fault(NGX_HTTP_OMNI_ENGINE_INVALID, &ctx->err);

    return NGX_HTTP_UPSTREAM_INVALID_HEADER;
}


/* An ERROR frame, before the header or in a stream, as the OpenAI error
 * err (views into the payload), logged at info: the client's request was
 * refused, the engine did its job. NGX_ERROR: the payload is not an
 * ERROR's; the caller names the frame invalid. */

ngx_int_t
ngx_http_omni_error_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload, ngx_http_omni_error_t *err)
{
    ngx_memzero(err, sizeof(ngx_http_omni_error_t));

    if (ngx_http_omni_engine_error(payload->data, payload->len, err)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_omni_speech_error(ctx, err);

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "omni engine error %ui%s: \"%V\"", err->status,
                  ctx->header_sent ? " in a stream" : "", &err->message);

    return NGX_OK;
}


/*
 * Reads one frame from *pos up to last, advancing *pos. NGX_OK: a whole
 * frame, header in ctx->frame, payload in *payload (a view into the
 * caller's buffer or into ctx->payload, valid until the next call);
 * NGX_AGAIN: every byte is consumed and the frame is not whole yet;
 * NGX_HTTP_UPSTREAM_INVALID_HEADER: a header omni_frame_check() refuses;
 * NGX_ERROR.
 */

ngx_int_t
ngx_http_omni_parse_frame(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    u_char **pos, u_char *last, ngx_str_t *payload)
{
    size_t       n, len;
    ngx_buf_t   *b;
    const char  *msg;

    if (ctx->hdr_got < OMNI_FRAME_HDR) {
        n = ngx_min((size_t) (last - *pos), OMNI_FRAME_HDR - ctx->hdr_got);

        ngx_memcpy(ctx->hdr + ctx->hdr_got, *pos, n);
        ctx->hdr_got += n;
        *pos += n;

        if (ctx->hdr_got < OMNI_FRAME_HDR) {
            return NGX_AGAIN;
        }

        omni_hdr_decode(&ctx->frame, ctx->hdr);

        msg = omni_frame_check(&ctx->frame, OMNI_DIR_TO_CLIENT);

        if (msg != NULL) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "omni engine sent invalid frame: %s "
                          "(type %ui, length %uD)", msg,
                          (ngx_uint_t) ctx->frame.type, ctx->frame.len);

            return ngx_http_omni_invalid_frame(r, ctx, NULL);
        }

        ctx->payload_got = 0;
    }

    len = ctx->frame.len;

    if (ctx->payload_got == 0 && (size_t) (last - *pos) >= len) {

        /* the whole payload is here: used in place */

        payload->data = *pos;
        payload->len = len;

        *pos += len;
        ctx->hdr_got = 0;

        return NGX_OK;
    }

    b = ctx->payload;

    if (ctx->payload_got == 0) {

        /* the length is checked against the type's limit already */

        if (b == NULL || (size_t) (b->end - b->start) < len) {
            b = ngx_create_temp_buf(r->pool, len);
            if (b == NULL) {
                return NGX_ERROR;
            }

            ctx->payload = b;
        }

        b->pos = b->start;
        b->last = b->start;
    }

    n = ngx_min((size_t) (last - *pos), len - ctx->payload_got);

    b->last = ngx_cpymem(b->last, *pos, n);
    ctx->payload_got += n;
    *pos += n;

    if (ctx->payload_got < len) {
        return NGX_AGAIN;
    }

    payload->data = b->pos;
    payload->len = len;

    ctx->hdr_got = 0;
    ctx->payload_got = 0;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_input_filter_init(void *data)
{
    ngx_http_request_t  *r = data;

    ngx_http_upstream_t  *u;
    ngx_http_omni_ctx_t  *ctx;

    u = r->upstream;
    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    ctx->header_sent = 1;

    if (ctx->out) {

        /* a whole body: u->length 0 ends the request once it is sent */

        u->out_bufs = ctx->out;
        u->length = 0;

        return NGX_OK;
    }

    if (ngx_http_omni_raw_audio(ctx)) {

        /* audio bytes: no keep-alive comments; an engine that closes
         * before DONE is a premature close (a 502 to the upstream
         * module), which ends the response without its last chunk */

        u->length = NGX_MAX_OFF_T_VALUE;
        return NGX_OK;
    }

    /* an event stream: it ends at DONE or ERROR (u->length 0 then), or
     * when the engine closes (u->length -1: see finalize_request) */

    u->length = -1;

    ngx_http_omni_keepalive_start(r, ctx);

    return NGX_OK;
}


static void
ngx_http_omni_abort_request(ngx_http_request_t *r)
{
    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "abort http omni request");
    return;
}


/*
 * Called by the upstream module before it closes the engine connection
 * (closing it is how the engine learns of a cancel). rc 0 with the
 * stream unfinished means the engine closed without DONE.
 */

static void
ngx_http_omni_finalize_request(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_http_upstream_t    *u;
    ngx_http_omni_ctx_t    *ctx;
    ngx_http_omni_error_t   err;
    ngx_http_omni_fault_e   fault;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "finalize http omni request: %i", rc);

    u = r->upstream;
    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    ngx_http_omni_keepalive_stop(ctx);

    if (rc == NGX_HTTP_CLIENT_CLOSED_REQUEST
        || ((rc == NGX_ERROR || rc == NGX_DONE) && r->connection->error))
    {
        ngx_http_omni_count(r, NGX_HTTP_OMNI_M_CLIENT_ABORT);
        return;
    }

    if (!u->header_sent) {

        /* nginx's error page follows; output.c makes it JSON from
         * ctx->err */

        if (rc == NGX_HTTP_BAD_GATEWAY || rc == NGX_HTTP_GATEWAY_TIME_OUT) {
            ngx_http_omni_count(r, NGX_HTTP_OMNI_M_UPSTREAM_ERROR);

            if (ctx->err.status == 0) {

                if (rc == NGX_HTTP_GATEWAY_TIME_OUT) {
                    fault = NGX_HTTP_OMNI_ENGINE_TIMEOUT;

                } else if (u->request_sent) {

                    /* it took the request, then closed: it died */

                    fault = NGX_HTTP_OMNI_ENGINE_GONE;

                } else {
                    fault = NGX_HTTP_OMNI_ENGINE_DOWN;
                }

                ngx_http_omni_engine_fault(fault, &ctx->err);
            }
        }

        return;
    }

    if (ctx->done || !ctx->req.stream || rc == NGX_DONE || rc == NGX_ERROR) {
        return;
    }

    /* the stream stopped without DONE: the engine closed (rc 0), failed
     * or timed out */

    ngx_http_omni_count(r, NGX_HTTP_OMNI_M_UPSTREAM_ERROR);

    if (rc == 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine closed the stream before DONE");

        fault = NGX_HTTP_OMNI_ENGINE_CUT;

    } else if (rc == NGX_HTTP_GATEWAY_TIME_OUT) {
        fault = NGX_HTTP_OMNI_ENGINE_TIMEOUT;

    } else {
        fault = NGX_HTTP_OMNI_ENGINE_FAILED;
    }

    ngx_http_omni_engine_fault(fault, &err);

    if (ngx_http_omni_stream_error(r, ctx, &err) != NGX_OK) {
        return;
    }

    if (rc != 0) {

        /* the upstream module ends an errored response by closing the
         * connection: end the chunked body first, so the client sees a
         * whole response */

        (void) ngx_http_send_special(r, NGX_HTTP_LAST);
    }
}

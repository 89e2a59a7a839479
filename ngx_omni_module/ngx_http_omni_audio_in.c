
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_audio_in.c -- audio in: the inputs whose bytes follow
 * the REQUEST frame in AUDIO_IN frames (engine/proto/omni_proto.h), and
 * the framing on their way out.
 *
 * An input is a transcription's file part (ngx_http_omni_transcribe.c:
 * a region of the request body, in nginx's buffers or its temporary
 * file) or a chat input_audio part (its base64, decoded here into
 * r->pool). The engine's JSON names each ("audio_in": format, bytes,
 * param) and the bytes follow, the inputs one after the other.
 *
 * The request chain (create_request) is the REQUEST frame, then the
 * inputs' buffers as they are; the upstream's output filter, in place of
 * ngx_chain_writer(), cuts what ngx_output_chain() hands it into frames
 * of at most OMNI_MAX_AUDIO_IN bytes, each an 8-byte header and a view
 * of the bytes (the way ngx_http_grpc_module frames a request body as
 * DATA frames). Nothing is copied: the views point into the buffers, or
 * into the temporary file when sendfile is on; with it off,
 * ngx_output_chain() reads the file into one buffer of
 * client_body_buffer_size, which is freed again once its views are sent.
 * An upload so holds, beyond what nginx holds anyway, a few frame
 * headers and buffer views, whatever its size.
 *
 * The file's buffer covers the temporary file from its start, and the
 * filter drops the bytes before the audio (the parts before the file
 * part): nginx's retry on the next engine (ngx_http_upstream_reinit())
 * sends a request chain's file buffer again from offset 0, so a buffer
 * that started at the file part would be sent wrong.
 *
 * The engine may answer before it has all of the audio (an ERROR: bad
 * audio, the listener stage missing) and then closes; the upload stops:
 * at its answer (ngx_http_omni_audio_in_stop()), or at the write that
 * fails because it closed, which is then not an error of the request:
 * its answer, or its silence, is read on the other side.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_request.h"


/* OpenAI's input_audio formats and the engine's names of them */
static const char *const  ngx_http_omni_in_formats[][2] = {
    { "wav", "wav" },
    { "mp3", "mp3" },
    { "flac", "flac" },
    { "opus", "opus" },
    { "ogg", "opus" },
    { NULL, NULL }
};

#define NGX_HTTP_OMNI_AUDIO_INPUTS  16      /* engine's REQ_MAX_AUDIO_IN */


static ngx_int_t ngx_http_omni_audio_in_format(ngx_http_request_t *r,
    size_t i, size_t j, yajl_val ia, ngx_uint_t *k,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_base64(ngx_http_request_t *r, u_char *s,
    ngx_str_t *dst);
static ngx_chain_t *ngx_http_omni_up_header(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, size_t len);
static ngx_chain_t *ngx_http_omni_up_view(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_buf_t *b, off_t from, off_t to);
static void ngx_http_omni_up_consume(ngx_buf_t *b);


ngx_int_t
ngx_http_omni_audio_in_add(ngx_http_request_t *r, ngx_http_omni_req_t *req,
    char *format, char *param, ngx_chain_t *bufs, off_t skip, off_t bytes)
{
    ngx_chain_t               *cl;
    ngx_http_omni_audio_in_t  *in;

    if (req->audio_in == NULL) {
        req->audio_in = ngx_array_create(r->pool, 2,
                                         sizeof(ngx_http_omni_audio_in_t));
        if (req->audio_in == NULL) {
            return NGX_ERROR;
        }

        req->audio_last = &req->audio_bufs;
        req->audio_skip = skip;
    }

    in = ngx_array_push(req->audio_in);
    if (in == NULL) {
        return NGX_ERROR;
    }

    in->format = format;
    in->param = param;
    in->bytes = bytes;

    *req->audio_last = bufs;

    for (cl = bufs; cl->next; cl = cl->next) { /* void */ }

    req->audio_last = &cl->next;
    req->audio_bytes += bytes;

    return NGX_OK;
}


/*
 * {"type": "input_audio", "input_audio": {"data": BASE64, "format": F}},
 * part j of message i: the data decoded into r->pool, an input of req.
 * The engine gets the part as {"type": "input_audio", "index": k}
 * (ngx_http_omni_request.c), k its place among the inputs.
 */

ngx_int_t
ngx_http_omni_audio_in_part(ngx_http_request_t *r, size_t i, size_t j,
    yajl_val part, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    char         *param, *name;
    yajl_val      ia, data;
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_str_t     bytes;
    ngx_uint_t    k;
    ngx_chain_t  *cl;

    param = ngx_http_omni_param(r, "messages[%uz].content[%uz].input_audio",
                                i, j);
    if (param == NULL) {
        return NGX_ERROR;
    }

    ia = ngx_http_omni_member(part, "input_audio");

    if (ia == NULL) {
        return ngx_http_omni_invalid(r, err, param,
                                     "missing_required_parameter",
                                     "Missing required parameter: '%s'.",
                                     param);
    }

    if (!YAJL_IS_OBJECT(ia)) {
        return ngx_http_omni_invalid_type(r, err, param, "an object", ia);
    }

    if (req->audio_in && req->audio_in->nelts == NGX_HTTP_OMNI_AUDIO_INPUTS)
    {
        return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                     "Invalid '%s': a request takes at most "
                                     "%d input_audio parts.", param,
                                     NGX_HTTP_OMNI_AUDIO_INPUTS);
    }

    /* format first: it costs nothing to check */

    k = 0;

    rc = ngx_http_omni_audio_in_format(r, i, j, ia, &k, err);
    if (rc != NGX_OK) {
        return rc;
    }

    name = ngx_http_omni_param(r, "messages[%uz].content[%uz].input_audio"
                               ".data", i, j);
    if (name == NULL) {
        return NGX_ERROR;
    }

    data = ngx_http_omni_member(ia, "data");

    if (data == NULL) {
        return ngx_http_omni_invalid(r, err, name,
                                     "missing_required_parameter",
                                     "Missing required parameter: '%s'.",
                                     name);
    }

    if (!YAJL_IS_STRING(data)) {
        return ngx_http_omni_invalid_type(r, err, name, "a string", data);
    }

    switch (ngx_http_omni_base64(r, (u_char *) data->u.string, &bytes)) {

    case NGX_OK:
        break;

    case NGX_DECLINED:
        return ngx_http_omni_invalid(r, err, name, "invalid_value",
                                     "Invalid '%s': the audio must be the "
                                     "base64 of a whole file (RFC 4648, "
                                     "with or without '=' padding, no "
                                     "line breaks or data: prefix).", name);

    default:
        return NGX_ERROR;
    }

    if (bytes.len == 0) {
        return ngx_http_omni_invalid(r, err, name, "empty_string",
                                     "Invalid '%s': empty audio.", name);
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    /* start is where a retry on the next engine sends from again */

    b->start = bytes.data;
    b->pos = bytes.data;
    b->last = bytes.data + bytes.len;
    b->end = b->last;
    b->memory = 1;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni input_audio %s: %uz bytes (%s)", param, bytes.len,
                   ngx_http_omni_in_formats[k][1]);

    return ngx_http_omni_audio_in_add(r, req,
                                      (char *) ngx_http_omni_in_formats[k][1],
                                      param, cl, 0, (off_t) bytes.len);
}


/* input_audio.format: one of OpenAI's names, its row in *k */

static ngx_int_t
ngx_http_omni_audio_in_format(ngx_http_request_t *r, size_t i, size_t j,
    yajl_val ia, ngx_uint_t *k, ngx_http_omni_error_t *err)
{
    char      *name;
    yajl_val   format;

    name = ngx_http_omni_param(r, "messages[%uz].content[%uz].input_audio"
                               ".format", i, j);
    if (name == NULL) {
        return NGX_ERROR;
    }

    format = ngx_http_omni_member(ia, "format");

    if (format == NULL) {
        return ngx_http_omni_invalid(r, err, name,
                                     "missing_required_parameter",
                                     "Missing required parameter: '%s'.",
                                     name);
    }

    if (!YAJL_IS_STRING(format)) {
        return ngx_http_omni_invalid_type(r, err, name, "a string", format);
    }

    for (*k = 0; ngx_http_omni_in_formats[*k][0] != NULL; (*k)++) {
        if (ngx_strcmp(format->u.string, ngx_http_omni_in_formats[*k][0])
            == 0)
        {
            return NGX_OK;
        }
    }

    return ngx_http_omni_invalid(r, err, name, "invalid_value",
                                 "Invalid value for '%s': '%*s'. Supported "
                                 "values are: 'wav', 'mp3', 'flac', 'opus' "
                                 "and 'ogg'.", name,
                                 ngx_min(ngx_strlen(format->u.string), 40),
                                 format->u.string);
}


/* Standard base64 (RFC 4648 section 4) decoded into r->pool: '=' only at
 * the end, at most two, and then to a multiple of 4; without them any
 * length but 4n + 1. NGX_DECLINED: not base64. */

static ngx_int_t
ngx_http_omni_base64(ngx_http_request_t *r, u_char *s, ngx_str_t *dst)
{
    size_t     len, n, pad;
    ngx_str_t  src;

    len = ngx_strlen(s);

    for (n = 0; n < len && s[n] != '='; n++) { /* void */ }

    pad = len - n;

    if (pad > 2 || (pad && len % 4 != 0)) {
        return NGX_DECLINED;
    }

    for ( /* void */ ; n < len; n++) {
        if (s[n] != '=') {
            return NGX_DECLINED;
        }
    }

    src.data = s;
    src.len = len;

    dst->data = ngx_pnalloc(r->pool, ngx_base64_decoded_length(len) + 1);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    if (ngx_decode_base64(dst, &src) != NGX_OK) {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* "audio_in": [{"format", "bytes", "param"}, ...], "max_audio_seconds" */

ngx_uint_t
ngx_http_omni_gen_audio_in(ngx_http_request_t *r, yajl_gen g,
    ngx_http_omni_req_t *req)
{
    ngx_uint_t                 i, s;
    ngx_http_omni_audio_in_t  *in;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    in = req->audio_in->elts;

    s = ngx_http_omni_gen_str(g, "audio_in");
    s |= yajl_gen_array_open(g);

    for (i = 0; i < req->audio_in->nelts; i++) {
        s |= yajl_gen_map_open(g);
        s |= ngx_http_omni_gen_str(g, "format");
        s |= ngx_http_omni_gen_str(g, in[i].format);
        s |= ngx_http_omni_gen_str(g, "bytes");
        s |= yajl_gen_integer(g, (long long) in[i].bytes);
        s |= ngx_http_omni_gen_str(g, "param");
        s |= ngx_http_omni_gen_str(g, in[i].param);
        s |= yajl_gen_map_close(g);
    }

    s |= yajl_gen_array_close(g);

    s |= ngx_http_omni_gen_str(g, "max_audio_seconds");
    s |= yajl_gen_integer(g, (long long) olcf->max_audio_seconds);

    return s;
}


/* The request chain's audio: the inputs' buffers after *ll, as they
 * are; the output filter frames them. */

ngx_int_t
ngx_http_omni_audio_in_request(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_chain_t **ll)
{
    ngx_chain_t  *cl, *ln;

    for (cl = ctx->req.audio_bufs; cl; cl = cl->next) {
        ln = ngx_alloc_chain_link(r->pool);
        if (ln == NULL) {
            return NGX_ERROR;
        }

        ln->buf = cl->buf;
        *ll = ln;
        ll = &ln->next;
    }

    *ll = NULL;

    ctx->up_request = OMNI_FRAME_HDR + ctx->req.engine.len;
    ctx->up_off = 0;
    ctx->up_busy = NULL;
    ctx->up_stopped = 0;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni audio in: %ui inputs, %O bytes, %O skipped",
                   ctx->req.audio_in->nelts, ctx->req.audio_bytes,
                   ctx->req.audio_skip);

    return NGX_OK;
}


/*
 * The upstream's output filter for a request with audio in. The request
 * stream (what ngx_output_chain() passes, in order) is the REQUEST
 * frame (up_request bytes), audio_skip bytes not sent, the audio: the
 * frame goes as it is, the audio as AUDIO_IN frames. Each buffer passed
 * in is done once the last view of it is sent (its last_shadow), as in
 * ngx_http_grpc_body_output_filter().
 */

ngx_int_t
ngx_http_omni_audio_in_filter(void *data, ngx_chain_t *in)
{
    ngx_http_request_t  *r = data;

    off_t                 at, size, from, to, end, audio, audio_end;
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_chain_t          *out, **ll, *cl, *last;
    ngx_connection_t     *c;
    ngx_http_upstream_t  *u;
    ngx_http_omni_ctx_t  *ctx;

    u = r->upstream;
    c = u->peer.connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx->up_stopped) {
        for (cl = in; cl; cl = cl->next) {
            ngx_http_omni_up_consume(cl->buf);
        }

        return NGX_OK;
    }

    audio = ctx->up_request + ctx->req.audio_skip;
    audio_end = audio + ctx->req.audio_bytes;

    out = NULL;
    ll = &out;

    for ( /* void */ ; in; in = in->next) {
        b = in->buf;

        if (ngx_buf_special(b)) {
            continue;
        }

        size = ngx_buf_size(b);
        at = ctx->up_off;
        ctx->up_off += size;
        last = NULL;

        /* the REQUEST frame, as it is */

        to = ngx_min(at + size, ctx->up_request);

        if (at < to) {
            last = ngx_http_omni_up_view(r, ctx, b, 0, to - at);
            if (last == NULL) {
                return NGX_ERROR;
            }

            *ll = last;
            ll = &last->next;
        }

        /* the audio, in frames of at most OMNI_MAX_AUDIO_IN bytes */

        from = ngx_max(at, audio);
        end = ngx_min(at + size, audio_end);

        while (from < end) {
            to = ngx_min(end, from + (off_t) OMNI_MAX_AUDIO_IN);

            cl = ngx_http_omni_up_header(r, ctx, (size_t) (to - from));
            if (cl == NULL) {
                return NGX_ERROR;
            }

            *ll = cl;
            ll = &cl->next;

            last = ngx_http_omni_up_view(r, ctx, b, from - at, to - at);
            if (last == NULL) {
                return NGX_ERROR;
            }

            *ll = last;
            ll = &last->next;

            from = to;
        }

        if (last) {
            last->buf->last_shadow = 1;

        } else {

            /* bytes before the audio (or after it): not sent */

            ngx_http_omni_up_consume(b);
        }
    }

    *ll = NULL;

    rc = ngx_chain_writer(&u->writer, out);

    ngx_chain_update_chains(r->pool, &ctx->up_free, &ctx->up_busy, &out,
                            (ngx_buf_tag_t) &ngx_http_omni_audio_in_filter);

    for (cl = ctx->up_free; cl; cl = cl->next) {

        /* the buffers whose views are all sent are done */

        if (cl->buf->shadow) {
            if (cl->buf->last_shadow) {
                ngx_http_omni_up_consume(cl->buf->shadow);
            }

            cl->buf->shadow = NULL;
        }
    }

    if (rc == NGX_ERROR && c->write->error) {

        /* the engine closed: it answered before it read the rest (an
         * ERROR), or it died; the other side reads which */

        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "omni engine stopped reading the request after "
                      "%O of its %O bytes", ctx->up_off,
                      audio_end - ctx->req.audio_skip);

        ngx_http_omni_audio_in_stop(r, ctx);

        return NGX_OK;
    }

    return rc;
}


/* The engine answered (DONE or ERROR) or closed: the rest of the upload
 * is neither read from the temporary file nor sent. */

void
ngx_http_omni_audio_in_stop(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_http_upstream_t  *u;

    u = r->upstream;

    if (ctx->req.audio_in == NULL || ctx->up_stopped || u == NULL) {
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni audio in stops: %O of %O bytes passed",
                   ctx->up_off,
                   ctx->up_request + ctx->req.audio_skip
                   + ctx->req.audio_bytes);

    ctx->up_stopped = 1;

    u->writer.out = NULL;
    u->writer.last = &u->writer.out;
    u->output.in = NULL;
}


/* An AUDIO_IN header for a frame of len bytes, in a buffer of the free
 * list: its 8 bytes of memory stay with it (b->start) across uses. */

static ngx_chain_t *
ngx_http_omni_up_header(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    size_t len)
{
    u_char       *start, *end;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = ngx_chain_get_free_buf(r->pool, &ctx->up_free);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;
    start = b->start;
    end = b->end;

    if (start == NULL || end - start < OMNI_FRAME_HDR) {
        start = ngx_pnalloc(r->pool, OMNI_FRAME_HDR);
        if (start == NULL) {
            return NULL;
        }

        end = start + OMNI_FRAME_HDR;
    }

    ngx_memzero(b, sizeof(ngx_buf_t));

    b->start = start;
    b->end = end;
    b->pos = start;
    b->temporary = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_audio_in_filter;

    omni_hdr_encode(start, OMNI_F_AUDIO_IN, (uint32_t) len);
    b->last = start + OMNI_FRAME_HDR;

    return cl;
}


/* A view of bytes from..to of b (in memory or in a file), b its shadow. */

static ngx_chain_t *
ngx_http_omni_up_view(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_buf_t *b, off_t from, off_t to)
{
    u_char       *start, *end;
    ngx_buf_t    *v;
    ngx_chain_t  *cl;

    cl = ngx_chain_get_free_buf(r->pool, &ctx->up_free);
    if (cl == NULL) {
        return NULL;
    }

    v = cl->buf;
    start = v->start;
    end = v->end;

    ngx_memcpy(v, b, sizeof(ngx_buf_t));

    /* a header's memory, if it had some, is kept for a later header */

    v->start = start;
    v->end = end;

    if (ngx_buf_in_memory(b)) {
        v->pos = b->pos + from;
        v->last = b->pos + to;
        v->in_file = 0;

    } else {
        v->file_pos = b->file_pos + from;
        v->file_last = b->file_pos + to;
    }

    v->shadow = b;
    v->last_shadow = 0;
    v->last_buf = 0;
    v->last_in_chain = 0;
    v->flush = 0;
    v->recycled = 0;
    v->tag = (ngx_buf_tag_t) &ngx_http_omni_audio_in_filter;

    return cl;
}


static void
ngx_http_omni_up_consume(ngx_buf_t *b)
{
    b->pos = b->last;
    b->file_pos = b->file_last;
}


/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_body.c -- the request body of an endpoint that has one:
 * read whole into memory, never more than NGX_HTTP_OMNI_MAX_BODY, given
 * to the endpoint's parser (an endpoint that parses its body as it
 * arrives, the transcription's multipart, is told its end), then the
 * request goes to the engine. Apart from the handler
 * (ngx_http_omni_module.c), which decides whether a request goes on at
 * all, because this runs later, when nginx has read the body.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


static ngx_int_t ngx_http_omni_read_body(ngx_http_request_t *r,
    ngx_str_t *body, ngx_http_omni_error_t *err);
static void ngx_http_omni_admit(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_loc_conf_t *olcf);
static void ngx_http_omni_admit_end(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_int_t rc, ngx_http_omni_error_t *err);


void
ngx_http_omni_body_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_str_t                  body;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_error_t      err;
    ngx_http_omni_loc_conf_t  *olcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);
    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    if (ctx->endpoint->start) {

        /* parsed as it arrived (the endpoint's request body filter) */

        ngx_str_null(&body);
        rc = NGX_OK;

    } else {
        rc = ngx_http_omni_read_body(r, &body, &err);
    }

    if (rc == NGX_OK) {
        rc = ctx->endpoint->parse(r, ctx->endpoint, &body, &ctx->req, &err);
    }

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_OK && ctx->req.engine.len > OMNI_MAX_REQUEST) {
        err.status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
        ngx_str_set(&err.type, "invalid_request_error");
        ngx_str_set(&err.message, "The request is too large.");
        rc = NGX_DECLINED;
    }

    if (rc == NGX_DECLINED) {
        /* ngx_http_omni_read_body() or ngx_http_omni_parse() logged it */
        ngx_http_finalize_request(r, ngx_http_omni_send_error(r, &err));
        return;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni request: model \"%V\" stream:%ui engine %uz bytes",
                   &ctx->req.model, (ngx_uint_t) ctx->req.stream,
                   ctx->req.engine.len);

    ngx_http_omni_admit(r, ctx, olcf);
}


/*
 * What Redis must say before the engine gets the request, asked all at
 * once: a tokens limit's charge, the prefix route's lookup. The upstream
 * starts when the last answer is in; a refusal answers at once. The
 * reference ngx_http_read_client_request_body() took is the upstream's
 * then, or the answer's. While Redis is asked, the client is watched: one
 * that leaves ends the request, and the answers are dropped.
 */

static void
ngx_http_omni_admit(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_loc_conf_t *olcf)
{
    ngx_int_t              rc;
    ngx_http_omni_error_t  err;

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    /* a hold of this function's own: no answer can start the upstream
     * before every question is asked */

    ctx->waiting = 1;

    rc = ngx_http_omni_limit_admit(r, ctx, &err);

    if (rc == NGX_AGAIN) {
        ctx->waiting++;

    } else if (rc != NGX_OK) {
        ngx_http_omni_admit_end(r, ctx, rc, &err);
        return;
    }

    rc = ngx_http_omni_route_lookup(r, ctx, olcf);

    if (rc == NGX_AGAIN) {
        ctx->waiting++;

    } else if (rc != NGX_OK) {
        ngx_http_omni_admit_end(r, ctx, NGX_ERROR, NULL);
        return;
    }

    if (ctx->waiting > 1) {
        r->read_event_handler = ngx_http_test_reading;
        r->write_event_handler = ngx_http_request_empty_handler;
    }

    ngx_http_omni_admit_end(r, ctx, NGX_OK, NULL);
}


void
ngx_http_omni_admitted(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_int_t rc, ngx_http_omni_error_t *err)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_http_omni_admit_end(r, ctx, rc, err);

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_omni_admit_end(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_int_t rc, ngx_http_omni_error_t *err)
{
    ngx_http_omni_loc_conf_t  *olcf;

    if (ctx->admitted) {
        /* refused already: what else was asked no longer matters */
        return;
    }

    if (rc == NGX_ERROR) {
        ctx->admitted = 1;
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (rc == NGX_DECLINED) {
        ctx->admitted = 1;
        ngx_http_finalize_request(r, ngx_http_omni_send_error(r, err));
        return;
    }

    if (--ctx->waiting > 0) {
        return;
    }

    ctx->admitted = 1;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (ngx_http_omni_upstream_create(r, olcf) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_http_upstream_init(r);
}


/*
 * The request body as one string: the buffer itself when nginx kept it
 * in one, else a copy. r->request_body->bufs holds what nginx's body
 * filters saved: buffers in memory (r->header_in, rb->buf), or one buffer
 * of the temporary file (a body over client_body_buffer_size, or
 * client_body_in_file_only), and buffers with no data at all: the
 * last_buf that ends a chunked or HTTP/2 body, alone for an empty one.
 * No body at all (no length, an HTTP/2 request without DATA) is an empty
 * string: the parser answers 400 for it.
 *
 * NGX_OK; NGX_DECLINED with err filled: a body over NGX_HTTP_OMNI_MAX_BODY
 * (413), refused before it is copied, so that what a request holds in
 * memory stays bounded even with client_max_body_size 0; NGX_ERROR.
 */

static ngx_int_t
ngx_http_omni_read_body(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_omni_error_t *err)
{
    u_char       *p;
    off_t         len;
    size_t        size;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    ngx_str_null(body);

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return NGX_OK;
    }

    len = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        len += ngx_buf_size(cl->buf);
    }

    if (len > NGX_HTTP_OMNI_MAX_BODY) {
        /* a chunked body: its size is known only now */
        return ngx_http_omni_too_large(r, len, err);
    }

    cl = r->request_body->bufs;

    if (cl->next == NULL && ngx_buf_in_memory(cl->buf)) {
        body->data = cl->buf->pos;
        body->len = cl->buf->last - cl->buf->pos;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, len ? (size_t) len : 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    body->data = p;

    for ( /* void */ ; cl; cl = cl->next) {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
            continue;
        }

        if (!b->in_file) {
            /* last_buf or flush: no data, and no file to read */
            continue;
        }

        size = (size_t) (b->file_last - b->file_pos);

        n = ngx_read_file(b->file, p, size, b->file_pos);

        if (n == NGX_ERROR) {
            return NGX_ERROR;
        }

        if ((size_t) n != size) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          ngx_read_file_n " read only %z of %uz bytes "
                          "of the request body", n, size);
            return NGX_ERROR;
        }

        p += n;
    }

    body->len = p - body->data;

    return NGX_OK;
}


/* A body over NGX_HTTP_OMNI_MAX_BODY: 413, so that what a request holds in
 * memory stays bounded even with client_max_body_size 0. */

ngx_int_t
ngx_http_omni_too_large(ngx_http_request_t *r, off_t len,
    ngx_http_omni_error_t *err)
{
    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "client sent too large omni request body: %O bytes", len);

    err->status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
    ngx_str_set(&err->type, "invalid_request_error");
    ngx_str_set(&err->message, "The request body is too large.");

    return NGX_DECLINED;
}


/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_output.c -- what goes out to the client.
 *
 * Responses the module makes itself (errors found by the handler, SSE
 * events) go through the whole output filter chain. An event is one
 * buffer with flush set, so the write filter sends it at once instead of
 * waiting for postpone_output bytes; what the socket does not take stays
 * in r->out, and the upstream module's downstream write handler sends it
 * when the client is ready.
 *
 * Event buffers are recycled through a free list in ctx, as upstream's
 * non-buffered path recycles its own: a long stream's memory stays that
 * of its unsent events.
 *
 * A stream the engine is quiet on (a long prompt, a queue) gets the SSE
 * comment ": keep-alive" every omni_keepalive_interval, so proxies and
 * clients do not take it for dead. The timer lives in the request's ctx:
 * it is stopped when the upstream part ends and by a pool cleanup.
 *
 * The header and body filters give every response of an omni location
 * x-request-id, and replace nginx's own error pages there (a 413 for a
 * body over client_max_body_size, the 502 of an engine that cannot be
 * reached, ...) by OpenAI's error object, without error_page.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


/* event buffers grow in steps of this: one fits the events of about the
 * same size that follow, and each event a slow client has not taken yet
 * holds less than this beyond its bytes */
#define NGX_HTTP_OMNI_EVENT_ALIGN  128


static void ngx_http_omni_keepalive_handler(ngx_event_t *ev);
static void ngx_http_omni_keepalive_cleanup(void *data);
static ngx_int_t ngx_http_omni_header_filter(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_omni_replace_page(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_uint_t status);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


static ngx_str_t  ngx_http_omni_json_type = ngx_string("application/json");

static u_char  ngx_http_omni_keepalive_comment[] = ": keep-alive\n\n";


ngx_int_t
ngx_http_omni_send_header(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *content_type, off_t content_length)
{
    r->headers_out.status = status;

    ngx_http_omni_set_content_type(r, content_type);

    r->headers_out.content_length_n = content_length;

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    return ngx_http_send_header(r);
}


void
ngx_http_omni_set_content_type(ngx_http_request_t *r, ngx_str_t *type)
{
    u_char  *semi;

    r->headers_out.content_type = *type;

    /* the length of the part before ";" */

    semi = ngx_strlchr(type->data, type->data + type->len, ';');

    r->headers_out.content_type_len = semi ? (size_t) (semi - type->data)
                                           : type->len;
    r->headers_out.content_type_lowcase = NULL;
}


/*
 * Event buffers go round the nginx way (ngx_chain_update_chains()): an
 * event is built in a buffer taken from ctx->free, sent, kept in
 * ctx->busy while the client has not taken all of it, then returned to
 * ctx->free. A stream therefore holds as many buffers as it has events
 * unsent, one when the client keeps up, and a buffer's memory grows only
 * for an event larger than it; nothing is allocated per token.
 */

ngx_chain_t *
ngx_http_omni_event_buf(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    size_t size)
{
    u_char       *p;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = ngx_chain_get_free_buf(r->pool, &ctx->free);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;

    if ((size_t) (b->end - b->start) < size) {
        size = ngx_align(size, NGX_HTTP_OMNI_EVENT_ALIGN);

        p = ngx_pnalloc(r->pool, size);
        if (p == NULL) {
            return NULL;
        }

        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "omni event buffer: %uz bytes, was %uz", size,
                       (size_t) (b->end - b->start));

        if (b->start) {

            /* the old memory goes back only if it was a large block */

            (void) ngx_pfree(r->pool, b->start);
        }

        b->start = p;
        b->end = p + size;
        b->temporary = 1;
    }

    b->pos = b->start;
    b->last = b->start;
    b->sync = 0;
    b->flush = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return cl;
}


ngx_int_t
ngx_http_omni_send_event(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_chain_t *cl)
{
    off_t                      size;
    ngx_int_t                  rc;
    ngx_http_omni_loc_conf_t  *olcf;

    size = ngx_buf_size(cl->buf);

    rc = ngx_http_output_filter(r, cl);

    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &cl,
                            (ngx_buf_tag_t) &ngx_http_omni_module);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni event: %O bytes, rc %i", size, rc);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ctx->keepalive.handler && !ctx->done) {
        olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);
        ngx_add_timer(&ctx->keepalive, olcf->keepalive_interval);
    }

    return rc;
}


/* A new buffer of size bytes, linked after *last (or as *first): the
 * gathering of a non-streaming answer's text and audio. */

ngx_chain_t *
ngx_http_omni_chain_add(ngx_http_request_t *r, ngx_chain_t **first,
    ngx_chain_t **last, size_t size)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NULL;
    }

    cl->buf = b;
    cl->next = NULL;

    if (*last) {
        (*last)->next = cl;

    } else {
        *first = cl;
    }

    *last = cl;

    return cl;
}


ngx_int_t
ngx_http_omni_send_response(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *content_type, ngx_buf_t *b)
{
    ngx_int_t     rc;
    ngx_chain_t   out;

    rc = ngx_http_omni_send_header(r, status, content_type,
                                   b->last - b->pos);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


ngx_int_t
ngx_http_omni_send_error(ngx_http_request_t *r, ngx_http_omni_error_t *err)
{
    ngx_buf_t  *b;

    b = ngx_http_omni_error_json(r, err);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_omni_retry_after(r, err->status) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_omni_send_response(r, err->status,
                                       &ngx_http_omni_json_type, b);
}


ngx_int_t
ngx_http_omni_add_header(ngx_http_request_t *r, ngx_str_t *key,
    ngx_str_t *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key = *key;
    h->value = *value;
    h->lowcase_key = NULL;

    return NGX_OK;
}


void
ngx_http_omni_keepalive_start(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_pool_cleanup_t        *cln;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (olcf->keepalive_interval == 0 || ctx->keepalive.handler) {
        return;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return;
    }

    cln->handler = ngx_http_omni_keepalive_cleanup;
    cln->data = ctx;

    ctx->keepalive.handler = ngx_http_omni_keepalive_handler;
    ctx->keepalive.data = r;
    ctx->keepalive.log = r->connection->log;
    ctx->keepalive.cancelable = 1;

    ngx_add_timer(&ctx->keepalive, olcf->keepalive_interval);
}


void
ngx_http_omni_keepalive_stop(ngx_http_omni_ctx_t *ctx)
{
    if (ctx->keepalive.timer_set) {
        ngx_del_timer(&ctx->keepalive);
    }
}


static void
ngx_http_omni_keepalive_handler(ngx_event_t *ev)
{
    ngx_http_request_t  *r = ev->data;

    ngx_int_t                  rc;
    ngx_chain_t               *cl;
    ngx_connection_t          *c;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0, "omni keep-alive comment");

    cl = ngx_http_omni_event_buf(r, ctx,
                                 sizeof(ngx_http_omni_keepalive_comment) - 1);
    if (cl == NULL) {
        rc = NGX_ERROR;
        goto done;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, ngx_http_omni_keepalive_comment,
                               sizeof(ngx_http_omni_keepalive_comment) - 1);

    rc = ngx_http_omni_send_event(r, ctx, cl);

    if (rc == NGX_AGAIN) {
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

        if (ngx_handle_write_event(c->write, clcf->send_lowat) != NGX_OK) {
            rc = NGX_ERROR;
        }
    }

done:

    if (rc == NGX_ERROR) {

        /* the client is gone: the upstream cleanup closes the engine
         * connection, which cancels the sequence */

        ngx_http_omni_keepalive_stop(ctx);
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_run_posted_requests(c);
}


static void
ngx_http_omni_keepalive_cleanup(void *data)
{
    ngx_http_omni_ctx_t  *ctx = data;

    ngx_http_omni_keepalive_stop(ctx);
}


ngx_int_t
ngx_http_omni_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_omni_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_omni_body_filter;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_header_filter(ngx_http_request_t *r)
{
    ngx_str_t                   id;
    ngx_uint_t                  status;
    ngx_http_omni_ctx_t        *ctx;
    ngx_http_variable_value_t  *vv;
    ngx_http_omni_loc_conf_t   *olcf;
    ngx_http_omni_main_conf_t  *omcf;

    static ngx_str_t  id_key = ngx_string("x-request-id");

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (!olcf->enabled || r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx) {
        id = ctx->request_id;

    } else {
        omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

        vv = ngx_http_get_indexed_variable(r, omcf->request_id);
        if (vv == NULL || vv->not_found) {
            return NGX_ERROR;
        }

        id.data = vv->data;
        id.len = vv->len;
    }

    if (ngx_http_omni_add_header(r, &id_key, &id) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx && ngx_http_omni_route_header(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    status = r->err_status;

    if (status < NGX_HTTP_BAD_REQUEST) {
        return ngx_http_next_header_filter(r);
    }

    /* one of nginx's error pages (ngx_http_special_response_handler()) */

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_omni_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ctx->endpoint = ngx_http_omni_endpoint(r, olcf, NULL);
        ctx->request_id = id;

        ngx_http_set_ctx(r, ctx, ngx_http_omni_module);
    }

    if (ngx_http_omni_replace_page(r, ctx, status) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_next_header_filter(r);
}


/*
 * The page in ctx->page, and the headers for it: an OpenAI error, or the
 * endpoint's own page (omni_health, omni_metrics).
 */

static ngx_int_t
ngx_http_omni_replace_page(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_uint_t status)
{
    ngx_buf_t              *b;
    ngx_str_t               type;
    ngx_http_omni_error_t  *err, page;

    if (ctx->err.status) {
        err = &ctx->err;

    } else {
        err = &page;
        ngx_memzero(err, sizeof(ngx_http_omni_error_t));
        ngx_http_omni_status_error(status, err);
    }

    type = ngx_http_omni_json_type;

    if (ctx->endpoint && ctx->endpoint->page) {
        b = ctx->endpoint->page(r, err, status, &type);

    } else {
        b = ngx_http_omni_error_json(r, err);
    }

    if (b == NULL) {
        return NGX_ERROR;
    }

    b->last_buf = 1;
    b->last_in_chain = 1;

    ctx->page = ngx_alloc_chain_link(r->pool);
    if (ctx->page == NULL) {
        return NGX_ERROR;
    }

    ctx->page->buf = b;
    ctx->page->next = NULL;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni error page: %ui as %ui", status, err->status);

    r->err_status = err->status;
    r->headers_out.status = err->status;

    ngx_http_omni_set_content_type(r, &type);

    r->headers_out.content_length_n = b->last - b->pos;

    return ngx_http_omni_retry_after(r, err->status);
}


static ngx_int_t
ngx_http_omni_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_uint_t            last;
    ngx_chain_t          *cl, *page;
    ngx_http_omni_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL || ctx->page == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    /* nginx's page is dropped; ours goes out in its place */

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;

        if (cl->buf->last_buf) {
            last = 1;
        }
    }

    if (!last) {
        return NGX_OK;
    }

    page = ctx->page;
    ctx->page = NULL;

    return ngx_http_next_body_filter(r, page);
}

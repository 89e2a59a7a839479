
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_metrics.c -- the module's counters, shared by all
 * workers, and the responses of omni_metrics and omni_health: their
 * bodies, their endpoints' reply and error page functions.
 *
 * The counters live in one shared memory zone of fixed size that the
 * module adds itself when a location uses it; a reload keeps the zone and
 * so the counts. Every counter is an ngx_atomic_t bumped with
 * ngx_atomic_fetch_add(): no lock, and a reader may see one counter a
 * request ahead of another, which Prometheus does not mind.
 *
 * Requests are counted in the log phase, when their status is final, by
 * endpoint and status code; codes outside a fixed table are counted as
 * "other".
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_CODES     16      /* ngx_http_omni_codes, "other" */
#define NGX_HTTP_OMNI_SERIES    (NGX_HTTP_OMNI_ENDPOINTS + 1)
#define NGX_HTTP_OMNI_LINE_MAX  128     /* one requests_total line */


typedef struct {
    ngx_atomic_t                requests[NGX_HTTP_OMNI_SERIES]
                                        [NGX_HTTP_OMNI_CODES];
    ngx_atomic_t                counters[NGX_HTTP_OMNI_M_COUNTERS];
} ngx_http_omni_shm_t;


static ngx_int_t ngx_http_omni_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_http_omni_shm_t *ngx_http_omni_shm(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_log_handler(ngx_http_request_t *r);


static ngx_uint_t  ngx_http_omni_codes[NGX_HTTP_OMNI_CODES - 1] = {
    200, 400, 401, 403, 404, 405, 408, 413, 429, 499, 500, 501, 502, 503,
    504
};


/* the label of the last series, requests whose URI names no endpoint;
 * the others are the endpoints' own (ngx_http_omni_endpoints[]) */
static ngx_str_t  ngx_http_omni_unknown = ngx_string("unknown");

static ngx_str_t  ngx_http_omni_json_type = ngx_string("application/json");
static ngx_str_t  ngx_http_omni_metrics_type =
    ngx_string("text/plain; version=0.0.4; charset=utf-8");


static char  ngx_http_omni_metrics_head[] =
    "# HELP omni_nginx_requests_total Requests answered by ngx_omni_module,"
    " by endpoint and HTTP status.\n"
    "# TYPE omni_nginx_requests_total counter\n";

static char  ngx_http_omni_metrics_tail[] =
    "# HELP omni_nginx_client_aborts_total Requests whose client went away"
    " before the end; the engine connection was closed (cancel).\n"
    "# TYPE omni_nginx_client_aborts_total counter\n"
    "omni_nginx_client_aborts_total %uA\n"
    "# HELP omni_nginx_upstream_errors_total Engine failures: unreachable,"
    " timed out, invalid frames, a stream closed before DONE.\n"
    "# TYPE omni_nginx_upstream_errors_total counter\n"
    "omni_nginx_upstream_errors_total %uA\n"
    "# HELP omni_nginx_auth_failures_total Requests refused for a missing"
    " or wrong API key.\n"
    "# TYPE omni_nginx_auth_failures_total counter\n"
    "omni_nginx_auth_failures_total %uA\n"
    "# HELP omni_nginx_engine_up Whether the engine answered this scrape.\n"
    "# TYPE omni_nginx_engine_up gauge\n"
    "omni_nginx_engine_up %ui\n";


ngx_int_t
ngx_http_omni_metrics_add_zone(ngx_conf_t *cf)
{
    ngx_http_omni_main_conf_t  *omcf;

    static ngx_str_t  name = ngx_string("ngx_omni_metrics");

    omcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_omni_module);

    if (omcf->shm_zone) {
        return NGX_OK;
    }

    omcf->shm_zone = ngx_shared_memory_add(cf, &name, 8 * ngx_pagesize,
                                           &ngx_http_omni_module);
    if (omcf->shm_zone == NULL) {
        return NGX_ERROR;
    }

    omcf->shm_zone->init = ngx_http_omni_init_zone;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_slab_pool_t      *shpool;
    ngx_http_omni_shm_t  *sh;

    if (data) {
        /* a reload: the counters go on */
        shm_zone->data = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        shm_zone->data = shpool->data;
        return NGX_OK;
    }

    sh = ngx_slab_calloc(shpool, sizeof(ngx_http_omni_shm_t));
    if (sh == NULL) {
        return NGX_ERROR;
    }

    shpool->data = sh;
    shm_zone->data = sh;

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_metrics_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_omni_log_handler;

    return NGX_OK;
}


static ngx_http_omni_shm_t *
ngx_http_omni_shm(ngx_http_request_t *r)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    if (omcf->shm_zone == NULL) {
        return NULL;
    }

    return omcf->shm_zone->data;
}


void
ngx_http_omni_count(ngx_http_request_t *r, ngx_http_omni_counter_e c)
{
    ngx_http_omni_shm_t  *sh;

    sh = ngx_http_omni_shm(r);

    if (sh != NULL) {
        (void) ngx_atomic_fetch_add(&sh->counters[c], 1);
    }
}


static ngx_int_t
ngx_http_omni_log_handler(ngx_http_request_t *r)
{
    ngx_uint_t                 i, status, e;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_endpoint_t  *ep;
    ngx_http_omni_shm_t       *sh;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (!olcf->enabled || r != r->main) {
        return NGX_OK;
    }

    sh = ngx_http_omni_shm(r);
    if (sh == NULL) {
        return NGX_OK;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    ep = ctx ? ctx->endpoint : ngx_http_omni_endpoint(r, olcf, NULL);

    e = ep ? (ngx_uint_t) (ep - ngx_http_omni_endpoints)
           : NGX_HTTP_OMNI_ENDPOINTS;

    /* what $status says */
    status = r->err_status ? r->err_status : r->headers_out.status;

    for (i = 0; i < NGX_HTTP_OMNI_CODES - 1; i++) {
        if (ngx_http_omni_codes[i] == status) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&sh->requests[e][i], 1);

    return NGX_OK;
}


ngx_buf_t *
ngx_http_omni_metrics_text(ngx_http_request_t *r, ngx_uint_t engine_up)
{
    size_t                len;
    ngx_buf_t            *b;
    ngx_uint_t            e, i;
    ngx_atomic_uint_t     n, c[NGX_HTTP_OMNI_M_COUNTERS];
    ngx_http_omni_shm_t  *sh;

    sh = ngx_http_omni_shm(r);

    len = sizeof(ngx_http_omni_metrics_head) - 1
          + NGX_HTTP_OMNI_SERIES * NGX_HTTP_OMNI_CODES
            * NGX_HTTP_OMNI_LINE_MAX
          + sizeof(ngx_http_omni_metrics_tail) - 1
          + NGX_HTTP_OMNI_M_COUNTERS * NGX_ATOMIC_T_LEN + NGX_INT_T_LEN;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, ngx_http_omni_metrics_head,
                         sizeof(ngx_http_omni_metrics_head) - 1);

    ngx_memzero(c, sizeof(c));

    if (sh != NULL) {
        for (e = 0; e < NGX_HTTP_OMNI_SERIES; e++) {
            for (i = 0; i < NGX_HTTP_OMNI_CODES; i++) {
                n = sh->requests[e][i];

                if (n == 0) {
                    continue;
                }

                b->last = ngx_sprintf(b->last,
                                 "omni_nginx_requests_total{endpoint=\"%V\","
                                 "code=\"",
                                 e < NGX_HTTP_OMNI_ENDPOINTS
                                 ? &ngx_http_omni_endpoints[e].label
                                 : &ngx_http_omni_unknown);

                if (i < NGX_HTTP_OMNI_CODES - 1) {
                    b->last = ngx_sprintf(b->last, "%ui",
                                          ngx_http_omni_codes[i]);

                } else {
                    b->last = ngx_cpymem(b->last, "other",
                                         sizeof("other") - 1);
                }

                b->last = ngx_sprintf(b->last, "\"} %uA\n", n);
            }
        }

        for (i = 0; i < NGX_HTTP_OMNI_M_COUNTERS; i++) {
            c[i] = sh->counters[i];
        }
    }

    b->last = ngx_sprintf(b->last, ngx_http_omni_metrics_tail,
                          c[NGX_HTTP_OMNI_M_CLIENT_ABORT],
                          c[NGX_HTTP_OMNI_M_UPSTREAM_ERROR],
                          c[NGX_HTTP_OMNI_M_AUTH_FAILED],
                          engine_up);

    return b;
}


ngx_buf_t *
ngx_http_omni_health_json(ngx_http_request_t *r, ngx_uint_t ready,
    u_char *reason, size_t len)
{
    size_t      size;
    ngx_buf_t  *b;

    if (ready) {
        size = sizeof("{\"status\":\"ready\"}\n") - 1;

    } else {
        size = sizeof("{\"status\":\"not ready\",\"reason\":\"\"}\n") - 1
               + len + ngx_escape_json(NULL, reason, len);
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    if (ready) {
        b->last = ngx_cpymem(b->last, "{\"status\":\"ready\"}\n",
                             sizeof("{\"status\":\"ready\"}\n") - 1);
        return b;
    }

    b->last = ngx_cpymem(b->last, "{\"status\":\"not ready\",\"reason\":\"",
                         sizeof("{\"status\":\"not ready\",\"reason\":\"")
                         - 1);
    b->last = (u_char *) ngx_escape_json(b->last, reason, len);
    b->last = ngx_cpymem(b->last, "\"}\n", sizeof("\"}\n") - 1);

    return b;
}


/* HEALTH_R: u16 status (200 ready), then the reason */

ngx_int_t
ngx_http_omni_health_reply(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_uint_t  ok;

    if (payload->len < 2) {
        return ngx_http_omni_invalid_frame(r, ctx, "HEALTH_R");
    }

    ok = omni_rd16(payload->data) == NGX_HTTP_OK;

    return ngx_http_omni_reply_buf(r, ctx,
                                   ok ? NGX_HTTP_OK
                                      : NGX_HTTP_SERVICE_UNAVAILABLE,
                                   &ngx_http_omni_json_type,
                                   ngx_http_omni_health_json(r, ok,
                                                             payload->data + 2,
                                                             payload->len - 2));
}


/* METRICS_R: the engine's text, then the module's counters */

ngx_int_t
ngx_http_omni_metrics_reply(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    /* the payload may be a view into u->buffer, which is read into again
     * while the body goes out */

    b = ngx_create_temp_buf(r->pool, payload->len ? payload->len : 1);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->last = ngx_cpymem(b->last, payload->data, payload->len);

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;

    cl->next = ngx_alloc_chain_link(r->pool);
    if (cl->next == NULL) {
        return NGX_ERROR;
    }

    cl->next->buf = ngx_http_omni_metrics_text(r, 1);
    if (cl->next->buf == NULL) {
        return NGX_ERROR;
    }

    cl->next->next = NULL;

    return ngx_http_omni_reply(r, ctx, NGX_HTTP_OK,
                               &ngx_http_omni_metrics_type, cl);
}


/* omni_health's error page: not ready, with the error's words */

ngx_buf_t *
ngx_http_omni_health_page(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    ngx_uint_t status, ngx_str_t *type)
{
    if (err->status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
        err->status = NGX_HTTP_SERVICE_UNAVAILABLE;
    }

    return ngx_http_omni_health_json(r, 0, err->message.data,
                                     err->message.len);
}


/* omni_metrics' error page: when the engine cannot answer, the module's
 * counters, worth a scrape on their own; else the OpenAI error */

ngx_buf_t *
ngx_http_omni_metrics_page(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    ngx_uint_t status, ngx_str_t *type)
{
    if (status != NGX_HTTP_BAD_GATEWAY && status != NGX_HTTP_GATEWAY_TIME_OUT)
    {
        return ngx_http_omni_error_json(r, err);
    }

    err->status = NGX_HTTP_OK;
    *type = ngx_http_omni_metrics_type;

    return ngx_http_omni_metrics_text(r, 0);
}

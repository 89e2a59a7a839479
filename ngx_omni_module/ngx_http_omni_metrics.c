
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
#include "ngx_http_omni_redis.h"


#define NGX_HTTP_OMNI_CODES     16      /* ngx_http_omni_codes, "other" */
#define NGX_HTTP_OMNI_SERIES    (NGX_HTTP_OMNI_ENDPOINTS + 1)
#define NGX_HTTP_OMNI_LINE_MAX  128     /* one requests_total line */


/* Redis round trips (microseconds): a histogram's upper bounds */
#define NGX_HTTP_OMNI_RTT_BUCKETS  12

static uint64_t  ngx_http_omni_rtt_le[NGX_HTTP_OMNI_RTT_BUCKETS] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000,
    1000000
};

static char  *ngx_http_omni_rtt_le_text[NGX_HTTP_OMNI_RTT_BUCKETS] = {
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025", "0.05", "0.1", "0.25", "1"
};


typedef struct {
    ngx_atomic_t                requests[NGX_HTTP_OMNI_SERIES]
                                        [NGX_HTTP_OMNI_CODES];
    ngx_atomic_t                counters[NGX_HTTP_OMNI_M_COUNTERS];
    ngx_atomic_t                rtt[NGX_HTTP_OMNI_RTT_BUCKETS + 1];
                                        /* not cumulative; the last is
                                           +Inf's own */
    ngx_atomic_t                rtt_sum;        /* microseconds */
} ngx_http_omni_shm_t;


static ngx_int_t ngx_http_omni_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_http_omni_shm_t *ngx_http_omni_shm(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_log_handler(ngx_http_request_t *r);
static size_t ngx_http_omni_redis_metrics_len(ngx_http_omni_main_conf_t *omcf);
static u_char *ngx_http_omni_redis_metrics(u_char *p, ngx_http_omni_shm_t *sh,
    ngx_atomic_uint_t *c);


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


static char  ngx_http_omni_redis_head[] =
    "# HELP omni_nginx_redis_seconds Round trips to Redis (omni_redis),"
    " send to answer.\n"
    "# TYPE omni_nginx_redis_seconds histogram\n";

static char  ngx_http_omni_redis_tail[] =
    "# HELP omni_nginx_redis_up Workers connected to Redis.\n"
    "# TYPE omni_nginx_redis_up gauge\n"
    "omni_nginx_redis_up %A\n"
    "# HELP omni_nginx_redis_pending Redis commands sent and not yet"
    " answered.\n"
    "# TYPE omni_nginx_redis_pending gauge\n"
    "omni_nginx_redis_pending %A\n"
    "# HELP omni_nginx_redis_connects_total Connections to Redis made"
    " (handshake done).\n"
    "# TYPE omni_nginx_redis_connects_total counter\n"
    "omni_nginx_redis_connects_total %uA\n"
    "# HELP omni_nginx_redis_errors_total Redis commands that got no"
    " answer, or an error, by why.\n"
    "# TYPE omni_nginx_redis_errors_total counter\n"
    "omni_nginx_redis_errors_total{kind=\"down\"} %uA\n"
    "omni_nginx_redis_errors_total{kind=\"timeout\"} %uA\n"
    "omni_nginx_redis_errors_total{kind=\"busy\"} %uA\n"
    "omni_nginx_redis_errors_total{kind=\"reply\"} %uA\n"
    "# HELP omni_nginx_limit_fail_total Limit checks decided by"
    " omni_limit_fail because Redis did not answer.\n"
    "# TYPE omni_nginx_limit_fail_total counter\n"
    "omni_nginx_limit_fail_total{policy=\"open\"} %uA\n"
    "omni_nginx_limit_fail_total{policy=\"closed\"} %uA\n"
    "# HELP omni_nginx_route_total Requests of omni_prefix_route upstreams,"
    " by how the engine was chosen.\n"
    "# TYPE omni_nginx_route_total counter\n"
    "omni_nginx_route_total{result=\"hit\"} %uA\n"
    "omni_nginx_route_total{result=\"miss\"} %uA\n"
    "omni_nginx_route_total{result=\"fallback\"} %uA\n";


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
    ngx_http_omni_metric_add(ngx_http_get_module_main_conf(r,
                                                        ngx_http_omni_module),
                             c, 1);
}


void
ngx_http_omni_metric_add(ngx_http_omni_main_conf_t *omcf,
    ngx_http_omni_counter_e c, ngx_atomic_int_t delta)
{
    ngx_http_omni_shm_t  *sh;

    if (omcf->shm_zone == NULL || omcf->shm_zone->data == NULL) {
        return;
    }

    sh = omcf->shm_zone->data;

    (void) ngx_atomic_fetch_add(&sh->counters[c], delta);
}


void
ngx_http_omni_redis_observe(ngx_http_omni_main_conf_t *omcf, uint64_t us)
{
    ngx_uint_t            i;
    ngx_http_omni_shm_t  *sh;

    if (omcf->shm_zone == NULL || omcf->shm_zone->data == NULL) {
        return;
    }

    sh = omcf->shm_zone->data;

    for (i = 0; i < NGX_HTTP_OMNI_RTT_BUCKETS; i++) {
        if (us <= ngx_http_omni_rtt_le[i]) {
            break;
        }
    }

    (void) ngx_atomic_fetch_add(&sh->rtt[i], 1);
    (void) ngx_atomic_fetch_add(&sh->rtt_sum, (ngx_atomic_int_t) us);
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
    ngx_atomic_uint_t           n, c[NGX_HTTP_OMNI_M_COUNTERS];
    ngx_http_omni_shm_t        *sh;
    ngx_http_omni_main_conf_t  *omcf;

    sh = ngx_http_omni_shm(r);

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    len = sizeof(ngx_http_omni_metrics_head) - 1
          + NGX_HTTP_OMNI_SERIES * NGX_HTTP_OMNI_CODES
            * NGX_HTTP_OMNI_LINE_MAX
          + sizeof(ngx_http_omni_metrics_tail) - 1
          + NGX_HTTP_OMNI_M_COUNTERS * NGX_ATOMIC_T_LEN + NGX_INT_T_LEN
          + ngx_http_omni_redis_metrics_len(omcf);

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

    if (omcf->redis == NULL || omcf->redis->name.len == 0) {
        return b;
    }

    b->last = ngx_http_omni_redis_metrics(b->last, sh, c);
    b->last = ngx_http_omni_limit_metrics(b->last, omcf);

    return b;
}


/* Redis, limits and routing: only where omni_redis is configured */

static size_t
ngx_http_omni_redis_metrics_len(ngx_http_omni_main_conf_t *omcf)
{
    if (omcf->redis == NULL || omcf->redis->name.len == 0) {
        return 0;
    }

    return sizeof(ngx_http_omni_redis_head) - 1
           + (NGX_HTTP_OMNI_RTT_BUCKETS + 3) * NGX_HTTP_OMNI_LINE_MAX
           + sizeof(ngx_http_omni_redis_tail) - 1
           + NGX_HTTP_OMNI_M_COUNTERS * NGX_ATOMIC_T_LEN
           + ngx_http_omni_limit_metrics_len(omcf);
}


static u_char *
ngx_http_omni_redis_metrics(u_char *p, ngx_http_omni_shm_t *sh,
    ngx_atomic_uint_t *c)
{
    ngx_uint_t         i;
    ngx_atomic_uint_t  n, sum;

    p = ngx_cpymem(p, ngx_http_omni_redis_head,
                   sizeof(ngx_http_omni_redis_head) - 1);

    n = 0;

    for (i = 0; i <= NGX_HTTP_OMNI_RTT_BUCKETS; i++) {
        n += sh ? sh->rtt[i] : 0;

        p = ngx_sprintf(p, "omni_nginx_redis_seconds_bucket{le=\"%s\"} %uA\n",
                        i < NGX_HTTP_OMNI_RTT_BUCKETS
                        ? ngx_http_omni_rtt_le_text[i] : "+Inf", n);
    }

    sum = sh ? sh->rtt_sum : 0;

    p = ngx_sprintf(p, "omni_nginx_redis_seconds_sum %uA.%06uA\n"
                       "omni_nginx_redis_seconds_count %uA\n",
                    sum / 1000000, sum % 1000000, n);

    return ngx_sprintf(p, ngx_http_omni_redis_tail,
                       (ngx_atomic_int_t) c[NGX_HTTP_OMNI_M_REDIS_UP],
                       (ngx_atomic_int_t) c[NGX_HTTP_OMNI_M_REDIS_PENDING],
                       c[NGX_HTTP_OMNI_M_REDIS_CONNECTS],
                       c[NGX_HTTP_OMNI_M_REDIS_DOWN],
                       c[NGX_HTTP_OMNI_M_REDIS_TIMEOUT],
                       c[NGX_HTTP_OMNI_M_REDIS_BUSY],
                       c[NGX_HTTP_OMNI_M_REDIS_REPLY_ERROR],
                       c[NGX_HTTP_OMNI_M_LIMIT_FAIL_OPEN],
                       c[NGX_HTTP_OMNI_M_LIMIT_FAIL_CLOSED],
                       c[NGX_HTTP_OMNI_M_ROUTE_HIT],
                       c[NGX_HTTP_OMNI_M_ROUTE_MISS],
                       c[NGX_HTTP_OMNI_M_ROUTE_FALLBACK]);
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

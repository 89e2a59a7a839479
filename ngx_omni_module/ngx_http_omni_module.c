
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_module.c -- directives, configuration and the content
 * handler.
 *
 * One location with omni_pass serves the whole API under it: the handler
 * finds the request's row in the endpoint table (what follows the first
 * "/v1/" in the URI, or the location's omni_health / omni_metrics),
 * checks the method and the API key (ngx_http_omni_auth.c), has the body
 * of an endpoint that takes one read and parsed (ngx_http_omni_body.c,
 * the row's parser; a transcription's multipart body is parsed as it
 * arrives, ngx_http_omni_transcribe.c), then hands the request to nginx's
 * upstream machinery (ngx_http_omni_upstream.c). Client mistakes found here are
 * answered at once with OpenAI's error object; they never reach the
 * engine.
 *
 * Everything that differs between endpoints is a field of their row in
 * ngx_http_omni_endpoints[]: a new endpoint is a row and its functions.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_redis.h"


static ngx_int_t ngx_http_omni_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_check_request(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_loc_conf_t *olcf,
    ngx_http_omni_error_t *err);

static ngx_int_t ngx_http_omni_init(ngx_conf_t *cf);
static void *ngx_http_omni_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_omni_create_srv_conf(ngx_conf_t *cf);
static ngx_int_t ngx_http_omni_init_process(ngx_cycle_t *cycle);
static void ngx_http_omni_exit_process(ngx_cycle_t *cycle);
static void *ngx_http_omni_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_omni_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);

static char *ngx_http_omni_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_omni_endpoint_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_omni_api_keys(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_http_core_loc_conf_t *ngx_http_omni_enable(ngx_conf_t *cf,
    ngx_http_omni_loc_conf_t *olcf);


/* omni_max_audio_seconds: what the engine takes of an audio input */
static ngx_conf_num_bounds_t  ngx_http_omni_max_audio_seconds_bounds = {
    ngx_conf_check_num_bounds, 1, 86400
};


/* omni_limit_fail: what a limit does when Redis does not answer */
static ngx_conf_enum_t  ngx_http_omni_limit_fails[] = {
    { ngx_string("open"), 1 },
    { ngx_string("closed"), 0 },
    { ngx_null_string, 0 }
};


/* omni_speech_mode: the engine's "audio.mode" when a request names none */
static ngx_conf_enum_t  ngx_http_omni_speech_modes[] = {
    { ngx_string("latency"), NGX_HTTP_OMNI_SPEECH_LATENCY },
    { ngx_string("quality"), NGX_HTTP_OMNI_SPEECH_QUALITY },
    { ngx_null_string, 0 }
};


static ngx_command_t  ngx_http_omni_commands[] = {

    { ngx_string("omni_pass"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_omni_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_connect_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, upstream.connect_timeout),
      NULL },

    { ngx_string("omni_send_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, upstream.send_timeout),
      NULL },

    { ngx_string("omni_read_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, upstream.read_timeout),
      NULL },

    { ngx_string("omni_keepalive_interval"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, keepalive_interval),
      NULL },

    { ngx_string("omni_health_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, health_timeout),
      NULL },

    { ngx_string("omni_api_keys"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_omni_api_keys,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_speech_mode"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, speech_mode),
      &ngx_http_omni_speech_modes },

    { ngx_string("omni_max_audio_seconds"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, max_audio_seconds),
      &ngx_http_omni_max_audio_seconds_bounds },

    { ngx_string("omni_health"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_omni_endpoint_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_omni_endpoint_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_redis"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_omni_redis_directive,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_limit_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_omni_limit_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_limit"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_omni_limit,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("omni_limit_fail"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, limit_fail),
      &ngx_http_omni_limit_fails },

    { ngx_string("omni_route_header"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_omni_loc_conf_t, route_header),
      NULL },

    { ngx_string("omni_prefix_route"),
      NGX_HTTP_UPS_CONF|NGX_CONF_NOARGS|NGX_CONF_TAKE1,
      ngx_http_omni_prefix_route,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_omni_module_ctx = {
    ngx_http_omni_route_add_variables,     /* preconfiguration */
    ngx_http_omni_init,                    /* postconfiguration */

    ngx_http_omni_create_main_conf,        /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_omni_create_srv_conf,         /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_omni_create_loc_conf,         /* create location configuration */
    ngx_http_omni_merge_loc_conf           /* merge location configuration */
};


ngx_module_t  ngx_http_omni_module = {
    NGX_MODULE_V1,
    &ngx_http_omni_module_ctx,             /* module context */
    ngx_http_omni_commands,                /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_omni_init_process,            /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_omni_exit_process,            /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


static ngx_str_t  ngx_http_omni_request_id = ngx_string("request_id");


/*
 * The endpoints: a URI's path after "/v1/" or a directive names the row,
 * and the row says everything else. The order is that of the metrics'
 * series; the last series, "unknown", is for URIs that name none.
 */

ngx_http_omni_endpoint_t  ngx_http_omni_endpoints[NGX_HTTP_OMNI_ENDPOINTS] = {

    { ngx_string("chat/completions"), ngx_null_string,
      ngx_string("chat_completions"),
      NGX_HTTP_POST, ngx_string("POST"),
      NGX_HTTP_OMNI_KIND_CHAT, ngx_http_omni_parse,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_REQUEST, 0, NULL, NULL,
      ngx_string("chatcmpl-"), 0 },

    { ngx_string("completions"), ngx_null_string,
      ngx_string("completions"),
      NGX_HTTP_POST, ngx_string("POST"),
      NGX_HTTP_OMNI_KIND_COMPLETION, ngx_http_omni_parse,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_REQUEST, 0, NULL, NULL,
      ngx_string("cmpl-"), 0 },

    { ngx_string("models"), ngx_null_string,
      ngx_string("models"),
      NGX_HTTP_GET|NGX_HTTP_HEAD, ngx_string("GET, HEAD"),
      NGX_HTTP_OMNI_KIND_NONE, NULL,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_MODELS, OMNI_F_MODELS_R, ngx_http_omni_models_reply, NULL,
      ngx_null_string, 0 },

    { ngx_string("models/"), ngx_null_string,
      ngx_string("model"),
      NGX_HTTP_GET|NGX_HTTP_HEAD, ngx_string("GET, HEAD"),
      NGX_HTTP_OMNI_KIND_NONE, NULL,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_MODELS, OMNI_F_MODELS_R, ngx_http_omni_models_reply, NULL,
      ngx_null_string, 0 },

    { ngx_null_string, ngx_string("omni_health"),
      ngx_string("health"),
      NGX_HTTP_GET|NGX_HTTP_HEAD, ngx_string("GET, HEAD"),
      NGX_HTTP_OMNI_KIND_NONE, NULL,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_HEALTH, OMNI_F_HEALTH_R, ngx_http_omni_health_reply,
      ngx_http_omni_health_page,
      ngx_null_string, 1 },

    { ngx_null_string, ngx_string("omni_metrics"),
      ngx_string("metrics"),
      NGX_HTTP_GET|NGX_HTTP_HEAD, ngx_string("GET, HEAD"),
      NGX_HTTP_OMNI_KIND_NONE, NULL,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_METRICS, OMNI_F_METRICS_R, ngx_http_omni_metrics_reply,
      ngx_http_omni_metrics_page,
      ngx_null_string, 1 },

    { ngx_string("audio/speech"), ngx_null_string,
      ngx_string("audio_speech"),
      NGX_HTTP_POST, ngx_string("POST"),
      NGX_HTTP_OMNI_KIND_SPEECH, ngx_http_omni_parse,
      NULL, NGX_HTTP_OMNI_MAX_BODY,
      OMNI_F_REQUEST, 0, NULL, NULL,
      ngx_null_string, 0 },

    { ngx_string("audio/transcriptions"), ngx_null_string,
      ngx_string("audio_transcriptions"),
      NGX_HTTP_POST, ngx_string("POST"),
      NGX_HTTP_OMNI_KIND_TRANSCRIPTION, ngx_http_omni_transcribe_parse,
      ngx_http_omni_transcribe_start, NGX_HTTP_OMNI_MAX_UPLOAD,
      OMNI_F_REQUEST, 0, NULL, NULL,
      ngx_null_string, 0 }
};


static ngx_int_t
ngx_http_omni_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_error_t      err;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    ctx = ngx_http_omni_get_ctx(r, olcf);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    rc = ngx_http_omni_check_request(r, ctx, olcf, &err);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        rc = ngx_http_discard_request_body(r);

        if (rc != NGX_OK) {
            /* nginx answers instead (a 400 for a bad chunked body): not
             * with the WWW-Authenticate or Allow meant for err */
            ngx_http_clean_header(r);
            return rc;
        }

        return ngx_http_omni_send_error(r, &err);
    }

    if (ctx->endpoint->parse) {

        /* a body parsed whole is wanted in one buffer; one parsed as it
         * arrives stays where nginx puts it */

        if (ctx->endpoint->start == NULL) {
            r->request_body_in_single_buf = 1;
        }

        rc = ngx_http_read_client_request_body(r,
                                               ngx_http_omni_body_handler);

        if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
            return rc;
        }

        return NGX_DONE;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_omni_upstream_create(r, olcf) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->main->count++;

    ngx_http_upstream_init(r);

    return NGX_DONE;
}


ngx_http_omni_ctx_t *
ngx_http_omni_get_ctx(ngx_http_request_t *r, ngx_http_omni_loc_conf_t *olcf)
{
    u_char                     *p;
    ngx_http_omni_ctx_t        *ctx;
    ngx_http_variable_value_t  *vv;
    ngx_http_omni_main_conf_t  *omcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_omni_ctx_t));
        if (ctx == NULL) {
            return NULL;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_omni_module);
    }

    /*
     * set by ngx_pcalloc():
     *
     *     ctx->req = { 0 };
     *     ctx->hdr_got = 0;
     *     ctx->payload = NULL;
     *     ctx->text = NULL;
     *     ctx->out = NULL;
     *     ctx->err.status = 0;
     *     ctx->page = NULL;
     */

    ctx->endpoint = ngx_http_omni_endpoint(r, olcf, &ctx->model_id);
    ctx->created = ngx_time();

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    vv = ngx_http_get_indexed_variable(r, omcf->request_id);
    if (vv == NULL || vv->not_found) {
        return NULL;
    }

    ctx->request_id.len = vv->len;
    ctx->request_id.data = vv->data;

    if (ctx->endpoint == NULL || ctx->endpoint->id_prefix.len == 0) {
        return ctx;
    }

    /* "chatcmpl-" or "cmpl-", then the request id */

    p = ngx_pnalloc(r->pool, ctx->endpoint->id_prefix.len + vv->len);
    if (p == NULL) {
        return NULL;
    }

    ctx->id.data = p;

    p = ngx_cpymem(p, ctx->endpoint->id_prefix.data,
                   ctx->endpoint->id_prefix.len);
    p = ngx_cpymem(p, vv->data, vv->len);

    ctx->id.len = p - ctx->id.data;

    return ctx;
}


/*
 * The endpoint of a request: the location's own (omni_health,
 * omni_metrics), else the row whose path follows the first "/v1/" in the
 * URI. NULL when the URI names none. Can't fail.
 */

ngx_http_omni_endpoint_t *
ngx_http_omni_endpoint(ngx_http_request_t *r, ngx_http_omni_loc_conf_t *olcf,
    ngx_str_t *model_id)
{
    u_char                    *p, *last;
    ngx_str_t                  path;
    ngx_uint_t                 i;
    ngx_http_omni_endpoint_t  *ep;

    if (olcf->endpoint) {
        return olcf->endpoint;
    }

    p = ngx_strnstr(r->uri.data, "/v1/", r->uri.len);
    if (p == NULL) {
        return NULL;
    }

    last = r->uri.data + r->uri.len;

    path.data = p + sizeof("/v1/") - 1;
    path.len = last - path.data;

    for (i = 0; i < NGX_HTTP_OMNI_ENDPOINTS; i++) {
        ep = &ngx_http_omni_endpoints[i];

        if (ep->path.len == 0 || path.len < ep->path.len
            || ngx_strncmp(path.data, ep->path.data, ep->path.len) != 0)
        {
            continue;
        }

        if (ep->path.data[ep->path.len - 1] != '/') {

            if (path.len == ep->path.len) {
                return ep;
            }

            continue;
        }

        if (path.len == ep->path.len) {
            continue;
        }

        /* r->uri is decoded already: "a%2Fb" is "a/b" here */

        if (model_id) {
            model_id->data = path.data + ep->path.len;
            model_id->len = last - model_id->data;
        }

        return ep;
    }

    return NULL;
}


/*
 * Route, method and API key. NGX_OK: go on; NGX_DECLINED: answer with
 * err (the headers it needs are set); NGX_ERROR.
 */

static ngx_int_t
ngx_http_omni_check_request(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_loc_conf_t *olcf, ngx_http_omni_error_t *err)
{
    ngx_int_t                  rc;
    ngx_str_t                 *msg;
    ngx_http_omni_endpoint_t  *ep;

    static ngx_str_t  allow_key = ngx_string("Allow");

    ep = ctx->endpoint;

    if (ep == NULL) {
        msg = &err->message;

        msg->data = ngx_pnalloc(r->pool, sizeof("Invalid URL ( )") - 1
                                         + r->method_name.len + r->uri.len);
        if (msg->data == NULL) {
            return NGX_ERROR;
        }

        msg->len = ngx_sprintf(msg->data, "Invalid URL (%V %V)",
                               &r->method_name, &r->uri)
                   - msg->data;

        err->status = NGX_HTTP_NOT_FOUND;
        ngx_str_set(&err->type, "invalid_request_error");

        return NGX_DECLINED;
    }

    if (!(r->method & ep->methods)) {
        msg = &err->message;

        msg->data = ngx_pnalloc(r->pool,
                                sizeof("Invalid method for URL ( )") - 1
                                + r->method_name.len + r->uri.len);
        if (msg->data == NULL) {
            return NGX_ERROR;
        }

        msg->len = ngx_sprintf(msg->data, "Invalid method for URL (%V %V)",
                               &r->method_name, &r->uri)
                   - msg->data;

        err->status = NGX_HTTP_NOT_ALLOWED;
        ngx_str_set(&err->type, "invalid_request_error");

        if (ngx_http_omni_add_header(r, &allow_key, &ep->allow) != NGX_OK) {
            return NGX_ERROR;
        }

        return NGX_DECLINED;
    }

    if (ep->probe) {
        return NGX_OK;
    }

    rc = ngx_http_omni_auth(r, olcf, err);

    if (rc != NGX_OK) {

        /* only a refused key is an auth failure: NGX_ERROR is out of
         * memory, a 500 the handler returns and the error page filter
         * makes a server_error */

        if (rc == NGX_DECLINED) {
            ngx_http_omni_count(r, NGX_HTTP_OMNI_M_AUTH_FAILED);
        }

        return rc;
    }

    if (r->headers_in.content_length_n > ep->max_body) {
        /* refused before a byte of it is read (or written to a file) */
        return ngx_http_omni_too_large(r, r->headers_in.content_length_n,
                                       err);
    }

    if (ep->frame == 0) {
        msg = &err->message;

        msg->data = ngx_pnalloc(r->pool,
                                sizeof(" /v1/ is not implemented yet") - 1
                                + r->method_name.len + ep->path.len);
        if (msg->data == NULL) {
            return NGX_ERROR;
        }

        msg->len = ngx_sprintf(msg->data, "%V /v1/%V is not implemented yet",
                               &r->method_name, &ep->path)
                   - msg->data;

        err->status = NGX_HTTP_NOT_IMPLEMENTED;
        ngx_str_set(&err->type, "invalid_request_error");

        return NGX_DECLINED;
    }

    if (ep->start) {
        return ep->start(r, ctx, err);
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_init(ngx_conf_t *cf)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_omni_module);

    omcf->request_id = ngx_http_get_variable_index(cf,
                                                   &ngx_http_omni_request_id);
    if (omcf->request_id == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (ngx_http_omni_filter_init(cf) != NGX_OK
        || ngx_http_omni_transcribe_init(cf) != NGX_OK
        || ngx_http_omni_limit_init(cf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (omcf->redis && omcf->redis->name.len
        && ngx_http_omni_metrics_add_zone(cf) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return ngx_http_omni_metrics_init(cf);
}


static void *
ngx_http_omni_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_main_conf_t));
    if (omcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     omcf->shm_zone = NULL;
     */

    omcf->request_id = NGX_ERROR;

    return omcf;
}


static void *
ngx_http_omni_create_srv_conf(ngx_conf_t *cf)
{
    ngx_http_omni_srv_conf_t  *oscf;

    oscf = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_srv_conf_t));
    if (oscf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     oscf->prefix_route = 0;
     */

    return oscf;
}


static ngx_int_t
ngx_http_omni_init_process(ngx_cycle_t *cycle)
{
    return ngx_http_omni_redis_init_process(cycle);
}


static void
ngx_http_omni_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_omni_redis_exit_process(cycle);
}


static void *
ngx_http_omni_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_omni_loc_conf_t  *conf;

    conf = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_loc_conf_t));
    if (conf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     conf->upstream.next_upstream = 0;
     *     conf->upstream.hide_headers_hash = { NULL, 0 };
     *     conf->enabled = 0;
     *     conf->endpoint = NULL;
     *     conf->api_keys_file = { 0, NULL };
     */

    conf->upstream.local = NGX_CONF_UNSET_PTR;
    conf->upstream.socket_keepalive = NGX_CONF_UNSET;
    conf->upstream.next_upstream_tries = NGX_CONF_UNSET_UINT;
    conf->upstream.connect_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.send_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.read_timeout = NGX_CONF_UNSET_MSEC;
    conf->upstream.next_upstream_timeout = NGX_CONF_UNSET_MSEC;

    conf->upstream.buffer_size = NGX_CONF_UNSET_SIZE;

    conf->keepalive_interval = NGX_CONF_UNSET_MSEC;
    conf->health_timeout = NGX_CONF_UNSET_MSEC;
    conf->speech_mode = NGX_CONF_UNSET_UINT;
    conf->max_audio_seconds = NGX_CONF_UNSET;
    conf->api_keys = NGX_CONF_UNSET_PTR;
    conf->limits = NGX_CONF_UNSET_PTR;
    conf->limit_fail = NGX_CONF_UNSET_UINT;
    conf->route_header = NGX_CONF_UNSET;

    /* the hardcoded values */
    conf->upstream.cyclic_temp_file = 0;
    conf->upstream.ignore_client_abort = 0;
    conf->upstream.send_lowat = 0;
    conf->upstream.bufs.num = 0;
    conf->upstream.busy_buffers_size = 0;
    conf->upstream.max_temp_file_size = 0;
    conf->upstream.temp_file_write_size = 0;
    conf->upstream.intercept_errors = 0;
    conf->upstream.pass_request_headers = 0;
    conf->upstream.pass_request_body = 0;
    conf->upstream.force_ranges = 0;
    conf->upstream.pass_trailers = 0;

    /* an upload of audio goes on after the response began: a transcript
     * streams while the engine still reads its audio */
    conf->upstream.preserve_output = 1;

    /* tokens must reach the client as they are produced */
    conf->upstream.buffering = 0;

    ngx_str_set(&conf->upstream.module, "omni");

    return conf;
}


static char *
ngx_http_omni_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_omni_loc_conf_t *prev = parent;
    ngx_http_omni_loc_conf_t *conf = child;

    ngx_conf_merge_ptr_value(conf->upstream.local,
                              prev->upstream.local, NULL);

    ngx_conf_merge_value(conf->upstream.socket_keepalive,
                              prev->upstream.socket_keepalive, 0);

    ngx_conf_merge_uint_value(conf->upstream.next_upstream_tries,
                              prev->upstream.next_upstream_tries, 0);

    ngx_conf_merge_msec_value(conf->upstream.connect_timeout,
                              prev->upstream.connect_timeout, 60000);

    ngx_conf_merge_msec_value(conf->upstream.send_timeout,
                              prev->upstream.send_timeout, 60000);

    ngx_conf_merge_msec_value(conf->upstream.read_timeout,
                              prev->upstream.read_timeout, 60000);

    ngx_conf_merge_msec_value(conf->upstream.next_upstream_timeout,
                              prev->upstream.next_upstream_timeout, 0);

    ngx_conf_merge_size_value(conf->upstream.buffer_size,
                              prev->upstream.buffer_size,
                              (size_t) ngx_pagesize);

    /* an engine that refuses or times out: try the next one */
    ngx_conf_merge_bitmask_value(conf->upstream.next_upstream,
                              prev->upstream.next_upstream,
                              (NGX_CONF_BITMASK_SET
                               |NGX_HTTP_UPSTREAM_FT_ERROR
                               |NGX_HTTP_UPSTREAM_FT_TIMEOUT));

    ngx_conf_merge_msec_value(conf->keepalive_interval,
                              prev->keepalive_interval, 15000);

    ngx_conf_merge_msec_value(conf->health_timeout,
                              prev->health_timeout, 3000);

    ngx_conf_merge_uint_value(conf->speech_mode, prev->speech_mode,
                              NGX_HTTP_OMNI_SPEECH_LATENCY);

    ngx_conf_merge_value(conf->max_audio_seconds,
                              prev->max_audio_seconds, 600);

    if (conf->endpoint && conf->endpoint->probe) {
        /* a stopped engine still accepts (the kernel does it) and never
         * answers: a probe must not wait omni_read_timeout for that */

        conf->upstream.connect_timeout = conf->health_timeout;
        conf->upstream.send_timeout = conf->health_timeout;
        conf->upstream.read_timeout = conf->health_timeout;
    }

    ngx_conf_merge_ptr_value(conf->api_keys, prev->api_keys, NULL);

    ngx_conf_merge_ptr_value(conf->limits, prev->limits, NULL);

    ngx_conf_merge_uint_value(conf->limit_fail, prev->limit_fail, 1);

    ngx_conf_merge_value(conf->route_header, prev->route_header, 1);

    if (conf->api_keys_file.data == NULL) {
        conf->api_keys_file = prev->api_keys_file;
    }

    if (conf->upstream.upstream == NULL) {
        conf->upstream.upstream = prev->upstream.upstream;
    }

    if (conf->endpoint && conf->upstream.upstream == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" needs \"omni_pass\" in its location",
                           &conf->endpoint->directive);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_omni_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_loc_conf_t *olcf = conf;

    ngx_str_t                 *value;
    ngx_url_t                  u;
    ngx_http_core_loc_conf_t  *clcf;

    if (olcf->upstream.upstream) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = value[1];
    u.no_resolve = 1;

    olcf->upstream.upstream = ngx_http_upstream_add(cf, &u, 0);
    if (olcf->upstream.upstream == NULL) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_omni_enable(cf, olcf);
    if (clcf == NULL) {
        return NGX_CONF_ERROR;
    }

    if (clcf->name.len && clcf->name.data[clcf->name.len - 1] == '/') {
        clcf->auto_redirect = 1;
    }

    return NGX_CONF_OK;
}


/* omni_health and omni_metrics: the location is the endpoint whose row
 * names the directive */

static char *
ngx_http_omni_endpoint_slot(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_loc_conf_t *olcf = conf;

    ngx_uint_t  i;

    if (olcf->endpoint) {
        return "is duplicate";
    }

    for (i = 0; i < NGX_HTTP_OMNI_ENDPOINTS; i++) {
        if (ngx_http_omni_endpoints[i].directive.len == cmd->name.len
            && ngx_strncmp(ngx_http_omni_endpoints[i].directive.data,
                           cmd->name.data, cmd->name.len) == 0)
        {
            olcf->endpoint = &ngx_http_omni_endpoints[i];
            break;
        }
    }

    if (olcf->endpoint == NULL) {
        return "has no endpoint";
    }

    return ngx_http_omni_enable(cf, olcf) ? NGX_CONF_OK : NGX_CONF_ERROR;
}


/* The location is ours: our content handler, and the shared counters its
 * requests count into. Returns the core location conf, NULL on error. */

static ngx_http_core_loc_conf_t *
ngx_http_omni_enable(ngx_conf_t *cf, ngx_http_omni_loc_conf_t *olcf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    clcf->handler = ngx_http_omni_handler;

    olcf->enabled = 1;

    if (ngx_http_omni_metrics_add_zone(cf) != NGX_OK) {
        return NULL;
    }

    return clcf;
}


static char *
ngx_http_omni_api_keys(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_loc_conf_t *olcf = conf;

    ngx_str_t  *value;

    if (olcf->api_keys != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        olcf->api_keys = NULL;
        return NGX_CONF_OK;
    }

    olcf->api_keys_file = value[1];

    if (ngx_conf_full_name(cf->cycle, &olcf->api_keys_file, 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_omni_read_keys(cf, olcf);
}



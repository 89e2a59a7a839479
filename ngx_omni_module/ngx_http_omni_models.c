
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_models.c -- GET /v1/models and /v1/models/{id}: the
 * engine's MODELS_R reply made OpenAI's model list, or the one model the
 * URI names (404 model_not_found when the engine does not serve it).
 * Apart from ngx_http_omni_openai.c because it is yajl in and out (a
 * reply to rewrite), not the hand-written JSON of completions, and from
 * ngx_http_omni_upstream.c because it is one endpoint's answer.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


static ngx_int_t ngx_http_omni_models_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *json, size_t len, ngx_buf_t **out,
    ngx_http_omni_error_t *err);
static ngx_uint_t ngx_http_omni_gen_model(yajl_gen g, yajl_val m);
static ngx_int_t ngx_http_omni_model_missing(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);


static ngx_str_t  ngx_http_omni_models_type = ngx_string("application/json");


/* MODELS_R: OpenAI's model list, or the one model the URI names */

ngx_int_t
ngx_http_omni_models_reply(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *payload)
{
    ngx_buf_t              *b;
    ngx_int_t               rc;
    ngx_http_omni_error_t   err;

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    rc = ngx_http_omni_models_json(r, ctx, payload->data, payload->len,
                                   &b, &err);

    if (rc == NGX_DECLINED) {
        return ngx_http_omni_reply_error(r, ctx, &err);
    }

    if (rc != NGX_OK) {
        return ngx_http_omni_invalid_frame(r, ctx, "MODELS_R");
    }

    return ngx_http_omni_reply_buf(r, ctx, NGX_HTTP_OK,
                                   &ngx_http_omni_models_type, b);
}


/*
 * The engine's {"data":[{"id","created","owned_by","max_model_len"}]}
 * becomes {"object":"list","data":[{"id","object":"model","created",
 * "owned_by"}]}\n, or, when the URI named one, the one model object whose
 * id is ctx->model_id. A reply that is not that shape is the engine's
 * fault: logged, NGX_ERROR.
 */

static ngx_int_t
ngx_http_omni_models_json(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    u_char *json, size_t len, ngx_buf_t **out, ngx_http_omni_error_t *err)
{
    char                 *reason;
    u_char                ebuf[256];
    size_t                i, n;
    yajl_gen              g;
    yajl_val              root, data, m, id;
    ngx_int_t             rc;
    ngx_uint_t            s, syntax;
    ngx_buf_t            *b;
    const unsigned char  *buf;

    reason = ngx_http_omni_prescan(json, len, &syntax);
    if (reason != NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent invalid models reply: %s", reason);
        return NGX_ERROR;
    }

    ebuf[0] = '\0';

    root = ngx_http_omni_tree(r, json, len, ebuf, sizeof(ebuf));
    if (root == NULL) {
        if (ebuf[0] != '\0') {
            for (n = 0; ebuf[n] != '\0' && ebuf[n] != '\n'; n++) { /**/ }
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "omni engine sent invalid models reply: %*s",
                          n, ebuf);
        }

        return NGX_ERROR;
    }

    data = YAJL_IS_OBJECT(root) ? ngx_http_omni_member(root, "data") : NULL;

    if (data == NULL || !YAJL_IS_ARRAY(data)) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent models reply without \"data\"");
        yajl_tree_free(root);
        return NGX_ERROR;
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        yajl_tree_free(root);
        return NGX_ERROR;
    }

    rc = NGX_OK;
    s = 0;

    if (ctx->model_id.len) {
        rc = NGX_DECLINED;

        for (i = 0; i < data->u.array.len; i++) {
            m = data->u.array.values[i];
            id = YAJL_IS_OBJECT(m) ? ngx_http_omni_member(m, "id") : NULL;

            if (id != NULL && YAJL_IS_STRING(id)
                && ngx_strlen(id->u.string) == ctx->model_id.len
                && ngx_memcmp(id->u.string, ctx->model_id.data,
                              ctx->model_id.len) == 0)
            {
                s = ngx_http_omni_gen_model(g, m);
                rc = NGX_OK;
                break;
            }
        }

        if (rc == NGX_DECLINED) {
            rc = ngx_http_omni_model_missing(r, ctx, err);
        }

    } else {
        s = yajl_gen_map_open(g);
        s |= ngx_http_omni_gen_str(g, "object");
        s |= ngx_http_omni_gen_str(g, "list");
        s |= ngx_http_omni_gen_str(g, "data");
        s |= yajl_gen_array_open(g);

        for (i = 0; i < data->u.array.len; i++) {
            s |= ngx_http_omni_gen_model(g, data->u.array.values[i]);
        }

        s |= yajl_gen_array_close(g);
        s |= yajl_gen_map_close(g);
    }

    if (rc == NGX_OK && s == yajl_gen_status_ok) {
        s = yajl_gen_get_buf(g, &buf, &n);
    }

    if (rc == NGX_OK && s != yajl_gen_status_ok) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent invalid model entry");
        rc = NGX_ERROR;
    }

    if (rc == NGX_OK) {
        b = ngx_create_temp_buf(r->pool, n + 1);

        if (b == NULL) {
            rc = NGX_ERROR;

        } else {
            b->last = ngx_cpymem(b->last, buf, n);
            *b->last++ = '\n';
            b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;
            *out = b;
        }
    }

    yajl_gen_free(g);
    yajl_tree_free(root);

    return rc;
}


/* {"id","object":"model","created","owned_by"}; an entry without a string
 * id is invalid (yajl_gen_status_generation_complete stands for that). */

static ngx_uint_t
ngx_http_omni_gen_model(yajl_gen g, yajl_val m)
{
    yajl_val    id, v;
    ngx_uint_t  s;

    id = YAJL_IS_OBJECT(m) ? ngx_http_omni_member(m, "id") : NULL;

    if (id == NULL || !YAJL_IS_STRING(id)) {
        return yajl_gen_generation_complete;
    }

    s = yajl_gen_map_open(g);
    s |= ngx_http_omni_gen_str(g, "id");
    s |= ngx_http_omni_gen_value(g, id);
    s |= ngx_http_omni_gen_str(g, "object");
    s |= ngx_http_omni_gen_str(g, "model");
    s |= ngx_http_omni_gen_str(g, "created");

    v = ngx_http_omni_member(m, "created");

    if (v != NULL && YAJL_IS_NUMBER(v)) {
        s |= ngx_http_omni_gen_value(g, v);

    } else {
        s |= yajl_gen_integer(g, 0);
    }

    s |= ngx_http_omni_gen_str(g, "owned_by");

    v = ngx_http_omni_member(m, "owned_by");

    if (v != NULL && YAJL_IS_STRING(v)) {
        s |= ngx_http_omni_gen_value(g, v);

    } else {
        s |= ngx_http_omni_gen_str(g, "ngx_omni");
    }

    return s | yajl_gen_map_close(g);
}


/* 404, in OpenAI's words: "The model 'x' does not exist". */

static ngx_int_t
ngx_http_omni_model_missing(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, sizeof("The model '' does not exist") - 1
                             + ctx->model_id.len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    err->message.data = p;
    err->message.len = ngx_sprintf(p, "The model '%V' does not exist",
                                   &ctx->model_id)
                       - p;

    err->status = NGX_HTTP_NOT_FOUND;
    ngx_str_set(&err->type, "invalid_request_error");
    ngx_str_set(&err->param, "model");
    ngx_str_set(&err->code, "model_not_found");

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "client asked for unknown omni model \"%V\"",
                  &ctx->model_id);

    return NGX_DECLINED;
}

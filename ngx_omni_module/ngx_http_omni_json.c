
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_json.c -- yajl, as the module uses it.
 *
 * JSON comes in twice, as a client's request body and as the engine's
 * model list (MODELS_R), and goes out as the engine's request: both are
 * pre-scanned with the engine's own limits (engine/proto/json_scan.h:
 * depth, value count, UTF-8, U+0000), read with yajl's tree API and
 * written with yajl_gen. Kept apart from ngx_http_omni_request.c, which
 * decides what a request may say, because ngx_http_omni_openai.c reads
 * the engine's replies with the same helpers. No I/O.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_MAX_DEPTH     64          /* nesting levels; ours: 5 */
#define NGX_HTTP_OMNI_MAX_NODES     (1 << 18)   /* strings + structure */


/* The pre-scan with the module's limits; *at: where it stopped. */

OmniJsonScan
ngx_http_omni_json_scan(u_char *p, size_t len, size_t *at)
{
    return omni_json_scan((const char *) p, len, NGX_HTTP_OMNI_MAX_DEPTH,
                          NGX_HTTP_OMNI_MAX_NODES, at);
}


/*
 * The pre-scan of JSON from the engine (MODELS_R), in the words of our
 * logs.
 * Returns NULL, or why; *syntax is set when the body is not JSON at all.
 */

char *
ngx_http_omni_prescan(u_char *p, size_t len, ngx_uint_t *syntax)
{
    size_t  at;

    return ngx_http_omni_scan_reason(ngx_http_omni_json_scan(p, len, &at),
                                     syntax);
}


/* Why the pre-scan refused JSON: NULL when it did not; *syntax is set
 * when the bytes are not JSON at all, cleared for JSON over a limit,
 * whose reason is a whole sentence. */

char *
ngx_http_omni_scan_reason(OmniJsonScan rc, ngx_uint_t *syntax)
{
    *syntax = 1;

    switch (rc) {

    case OMNI_JSON_OK:
        return NULL;

    case OMNI_JSON_UTF8:
    case OMNI_JSON_SURROGATE:
        return "text that is not UTF-8";

    case OMNI_JSON_NUL:
        return "a NUL byte";

    case OMNI_JSON_COMMENT:
        return "comments are not JSON";

    case OMNI_JSON_U0000:
        *syntax = 0;
        return "Strings in the request may not contain U+0000.";

    case OMNI_JSON_DEEP:
        *syntax = 0;
        return "The request JSON nests deeper than 64 levels.";

    case OMNI_JSON_NODES:
        *syntax = 0;
        return "The request JSON has more than 262144 values.";
    }

    return "not JSON";
}


/* yajl's tree of len bytes of pre-scanned JSON; NULL with ebuf set when
 * yajl refuses it, NULL with ebuf empty when out of memory. */

yajl_val
ngx_http_omni_tree(ngx_http_request_t *r, u_char *json, size_t len,
    u_char *ebuf, size_t size)
{
    u_char    *copy;
    yajl_val   root;

    copy = ngx_pnalloc(r->pool, len + 1);
    if (copy == NULL) {
        return NULL;
    }

    if (len) {
        ngx_memcpy(copy, json, len);
    }

    copy[len] = '\0';

    root = yajl_tree_parse((const char *) copy, (char *) ebuf, size);

    ngx_pfree(r->pool, copy);

    if (root == NULL && ebuf[0] == '\0') {
        ngx_cpystrn(ebuf, (u_char *) "parse error", size);
    }

    return root;
}


/* The value of key in object o, the last one when repeated (as
 * JSON.parse does); NULL when absent or null. */

yajl_val
ngx_http_omni_member(yajl_val o, const char *key)
{
    size_t    i;
    yajl_val  v;

    v = NULL;

    for (i = 0; i < o->u.object.len; i++) {
        if (ngx_strcmp(o->u.object.keys[i], key) == 0) {
            v = o->u.object.values[i];
        }
    }

    return YAJL_IS_NULL(v) ? NULL : v;
}


/* A tree value as it came; recursion is bounded by the pre-scan's depth
 * limit, below yajl_gen's YAJL_MAX_DEPTH. */

ngx_uint_t
ngx_http_omni_gen_value(yajl_gen g, yajl_val v)
{
    size_t      i;
    ngx_uint_t  s;

    switch (v->type) {

    case yajl_t_string:
        return ngx_http_omni_gen_str(g, v->u.string);

    case yajl_t_number:
        return yajl_gen_number(g, v->u.number.r, ngx_strlen(v->u.number.r));

    case yajl_t_object:
        s = yajl_gen_map_open(g);

        for (i = 0; i < v->u.object.len; i++) {
            s |= ngx_http_omni_gen_str(g, v->u.object.keys[i]);
            s |= ngx_http_omni_gen_value(g, v->u.object.values[i]);
        }

        return s | yajl_gen_map_close(g);

    case yajl_t_array:
        s = yajl_gen_array_open(g);

        for (i = 0; i < v->u.array.len; i++) {
            s |= ngx_http_omni_gen_value(g, v->u.array.values[i]);
        }

        return s | yajl_gen_array_close(g);

    case yajl_t_true:
        return yajl_gen_bool(g, 1);

    case yajl_t_false:
        return yajl_gen_bool(g, 0);

    default:
        return yajl_gen_null(g);
    }
}


ngx_uint_t
ngx_http_omni_gen_str(yajl_gen g, const char *s)
{
    return yajl_gen_string(g, (const unsigned char *) s, ngx_strlen(s));
}

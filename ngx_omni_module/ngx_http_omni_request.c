
/*
 * Copyright (C) ngx_omni authors
 *
 * ngx_http_omni_request.c -- an OpenAI request body in, the engine's
 * request JSON out. No I/O.
 *
 * A chat or completions body is pre-scanned (yajl has no nesting limit,
 * its tree API takes a C string, and its UTF-8 check lets overlong forms
 * and surrogates through: engine/proto/json_scan.h, the engine's own check),
 * parsed with yajl's tree API, checked for what the module acts on or
 * refuses, and rewritten with yajl_gen into the engine's request JSON
 * (engine/request/request.h). Sampling fields are copied as given: the engine
 * checks their types and ranges and answers with an ERROR naming the
 * parameter. The seed is the exception: the module draws one when the
 * client sent none, so that it can report it in a response header before
 * the first token goes out.
 *
 * The pre-scan's limits, the tree and the yajl_gen helpers are
 * ngx_http_omni_json.c's, shared with ngx_http_omni_openai.c. This file
 * holds the way through (pre-scan, tree, checks in order, the engine's
 * JSON written) and the checks of the input itself (messages, prompt,
 * stream); ngx_http_omni_params.c the checks of the other fields and the
 * words of the 400s.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


#include "ngx_http_omni_module.h"
#include "ngx_http_omni_request.h"


static ngx_int_t ngx_http_omni_check_body(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_body_tree(ngx_http_request_t *r,
    ngx_str_t *body, yajl_val *root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_engine_request(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_messages(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_part(ngx_http_request_t *r,
    size_t i, size_t j, yajl_val m, yajl_val part, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_prompt(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_stream(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err);

static ngx_uint_t ngx_http_omni_gen_request(ngx_http_request_t *r,
    yajl_gen g, ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req);
static ngx_uint_t ngx_http_omni_gen_messages(yajl_gen g, yajl_val msgs);
static ngx_uint_t ngx_http_omni_gen_content(yajl_gen g, yajl_val content,
    ngx_uint_t *k);
static ngx_uint_t ngx_http_omni_is_part(yajl_val part, const char *type);

static ngx_int_t ngx_http_omni_scan(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_omni_error_t *err);


/* copied to the engine as given, when present and not null */
static const char *const  ngx_http_omni_sampling[] = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
    "ignore_eos",
    NULL
};


/* ---- request bodies ---- */

ngx_int_t
ngx_http_omni_parse(ngx_http_request_t *r, ngx_http_omni_endpoint_t *ep,
    ngx_str_t *body, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    yajl_val                 root;
    ngx_int_t                rc;
    ngx_http_omni_fields_t   f;

    ngx_memzero(req, sizeof(ngx_http_omni_req_t));
    ngx_memzero(&f, sizeof(ngx_http_omni_fields_t));

    rc = ngx_http_omni_body_tree(r, body, &root, err);
    if (rc != NGX_OK) {
        return rc;
    }

    /* the tree is malloc()ed by yajl: one exit frees it */

    rc = (ep->kind == NGX_HTTP_OMNI_KIND_SPEECH)
         ? ngx_http_omni_speech_check(r, root, &f, req, err)
         : ngx_http_omni_check_body(r, ep->kind, root, &f, req, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_engine_request(r, ep->kind, root, &f, req, err);
    }

    yajl_tree_free(root);

    return rc;
}


/* The body pre-scanned, then yajl's tree of it in *root, a JSON object;
 * the caller frees it with yajl_tree_free() when NGX_OK. */

static ngx_int_t
ngx_http_omni_body_tree(ngx_http_request_t *r, ngx_str_t *body,
    yajl_val *root, ngx_http_omni_error_t *err)
{
    u_char     ebuf[256];
    ngx_int_t  rc;

    rc = ngx_http_omni_scan(r, body, err);
    if (rc != NGX_OK) {
        return rc;
    }

    ebuf[0] = '\0';

    *root = ngx_http_omni_tree(r, body->data, body->len, ebuf, sizeof(ebuf));
    if (*root == NULL) {
        if (ebuf[0] == '\0') {
            return NGX_ERROR;
        }

        return ngx_http_omni_bad_json(r, ebuf, err);
    }

    if (YAJL_IS_OBJECT(*root)) {
        return NGX_OK;
    }

    rc = ngx_http_omni_invalid(r, err, NULL, "invalid_type",
                               "Invalid type for the request body: "
                               "expected a JSON object, but got %s "
                               "instead.", ngx_http_omni_type(*root));

    yajl_tree_free(*root);

    return rc;
}


/*
 * The pre-scan of a request body (json_scan.h, shared with the engine), as
 * 400 errors. Text that is not UTF-8 is named by the value it is in:
 * "Invalid 'messages[0].content': the text is not valid UTF-8 (bytes ED
 * A0 80 at offset 41).", the same words for every kind of bad sequence.
 */

static ngx_int_t
ngx_http_omni_scan(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_omni_error_t *err)
{
    char          *reason, *param, what[96];
    size_t         at;
    ngx_uint_t     syntax;
    OmniJsonScan   rc;

    at = 0;

    rc = ngx_http_omni_json_scan(body->data, body->len, &at);

    if (rc == OMNI_JSON_OK) {
        return NGX_OK;
    }

    if (rc == OMNI_JSON_UTF8 || rc == OMNI_JSON_SURROGATE) {
        param = ngx_pnalloc(r->pool, NGX_HTTP_OMNI_PARAM_MAX);
        if (param == NULL) {
            return NGX_ERROR;
        }

        omni_json_path((const char *) body->data, body->len, at, param,
                       NGX_HTTP_OMNI_PARAM_MAX);
        omni_json_utf8_what((const char *) body->data, body->len, rc, at,
                            what, sizeof(what));

        if (param[0] == '\0') {
            return ngx_http_omni_invalid(r, err, NULL, NULL,
                                         "Invalid request body: the text is "
                                         "not valid UTF-8 (%s).", what);
        }

        return ngx_http_omni_invalid(r, err, param, NULL,
                                     "Invalid '%s': the text is not valid "
                                     "UTF-8 (%s).", param, what);
    }

    reason = ngx_http_omni_scan_reason(rc, &syntax);

    if (syntax) {
        return ngx_http_omni_bad_json(r, (u_char *) reason, err);
    }

    return ngx_http_omni_invalid(r, err, NULL, NULL, "%s", reason);
}


static ngx_int_t
ngx_http_omni_check_body(ngx_http_request_t *r, ngx_http_omni_kind_e kind,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    ngx_int_t  rc;

    rc = ngx_http_omni_check_model(r, root, f, req, err);
    if (rc != NGX_OK) {
        return rc;
    }

    rc = (kind == NGX_HTTP_OMNI_KIND_CHAT)
         ? ngx_http_omni_check_messages(r, root, f, req, err)
         : ngx_http_omni_check_prompt(r, root, f, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_stream(r, root, req, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_choices(r, kind, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_max_tokens(r, kind, root, f, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_output(r, root, f, req, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_tools(r, root, err);
    }

    if (rc == NGX_OK && kind == NGX_HTTP_OMNI_KIND_COMPLETION) {
        rc = ngx_http_omni_check_legacy(r, root, err);
    }

    if (rc == NGX_OK && kind == NGX_HTTP_OMNI_KIND_CHAT) {
        rc = ngx_http_omni_check_thinking(r, root, f, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_salt(r, root, f, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_seed(r, root, f, req, err);
    }

    return rc;
}


/* model: a non-empty string, kept in req->model for the response. */

ngx_int_t
ngx_http_omni_check_model(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    ngx_str_t  model;

    f->model = ngx_http_omni_member(root, "model");

    if (f->model != NULL && !YAJL_IS_STRING(f->model)) {
        return ngx_http_omni_invalid_type(r, err, "model", "a string",
                                          f->model);
    }

    if (f->model == NULL || f->model->u.string[0] == '\0') {
        return ngx_http_omni_invalid(r, err, "model",
                                     "missing_required_parameter",
                                     "you must provide a model parameter");
    }

    model.len = ngx_strlen(f->model->u.string);
    model.data = (u_char *) f->model->u.string;

    req->model.len = model.len;
    req->model.data = ngx_pstrdup(r->pool, &model);

    return (req->model.data == NULL) ? NGX_ERROR : NGX_OK;
}


/* messages: a non-empty array; each message's role and content are the
 * engine's to check, but media content parts are the module's: image and
 * file parts are refused here, with the part's path, because the engine
 * only knows they are not text; input_audio parts are decoded into the
 * request's audio in. */

static ngx_int_t
ngx_http_omni_check_messages(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    size_t     i, j;
    yajl_val   v, m, c;
    ngx_int_t  rc;

    v = ngx_http_omni_member(root, "messages");

    if (v == NULL) {
        return ngx_http_omni_invalid(r, err, "messages",
                                     "missing_required_parameter",
                                     "Missing required parameter: "
                                     "'messages'.");
    }

    if (!YAJL_IS_ARRAY(v)) {
        return ngx_http_omni_invalid_type(r, err, "messages",
                                          "an array of objects", v);
    }

    if (v->u.array.len == 0) {
        return ngx_http_omni_invalid(r, err, "messages", "empty_array",
                                     "Invalid 'messages': empty array. "
                                     "Expected an array with minimum "
                                     "length 1, but got an empty array "
                                     "instead.");
    }

    for (i = 0; i < v->u.array.len; i++) {
        m = v->u.array.values[i];

        if (!YAJL_IS_OBJECT(m)) {
            continue;
        }

        c = ngx_http_omni_member(m, "content");

        if (c == NULL || !YAJL_IS_ARRAY(c)) {
            continue;
        }

        for (j = 0; j < c->u.array.len; j++) {
            rc = ngx_http_omni_check_part(r, i, j, m, c->u.array.values[j],
                                          req, err);
            if (rc != NGX_OK) {
                return rc;
            }
        }
    }

    f->input = v;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_check_part(ngx_http_request_t *r, size_t i, size_t j,
    yajl_val m, yajl_val part, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    char      *param;
    yajl_val   type, role;

    if (!YAJL_IS_OBJECT(part)) {
        return NGX_OK;
    }

    type = ngx_http_omni_member(part, "type");

    if (type == NULL || !YAJL_IS_STRING(type)
        || (ngx_strcmp(type->u.string, "image_url") != 0
            && ngx_strcmp(type->u.string, "input_audio") != 0
            && ngx_strcmp(type->u.string, "file") != 0))
    {
        return NGX_OK;
    }

    param = ngx_http_omni_param(r, "messages[%uz].content[%uz]", i, j);
    if (param == NULL) {
        return NGX_ERROR;
    }

    if (ngx_strcmp(type->u.string, "input_audio") == 0) {
        role = ngx_http_omni_member(m, "role");

        if (role == NULL || !YAJL_IS_STRING(role)
            || ngx_strcmp(role->u.string, "user") != 0)
        {
            return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                         "Invalid '%s': audio input is "
                                         "allowed in user messages only.",
                                         param);
        }

        return ngx_http_omni_audio_in_part(r, i, j, part, req, err);
    }

    return ngx_http_omni_invalid(r, err, param, "unsupported_value",
                                 "Unsupported value: content parts of type "
                                 "'%s' are not supported yet; only 'text' "
                                 "and 'input_audio' parts are.",
                                 type->u.string);
}


/* prompt: a string, or an array of exactly one string. */

static ngx_int_t
ngx_http_omni_check_prompt(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
{
    yajl_val  v, first;

    v = ngx_http_omni_member(root, "prompt");

    if (v == NULL) {
        return ngx_http_omni_invalid(r, err, "prompt",
                                     "missing_required_parameter",
                                     "Missing required parameter: "
                                     "'prompt'.");
    }

    if (YAJL_IS_STRING(v)) {
        f->input = v;
        return NGX_OK;
    }

    if (!YAJL_IS_ARRAY(v)) {
        return ngx_http_omni_invalid_type(r, err, "prompt", "a string", v);
    }

    if (v->u.array.len == 0) {
        return ngx_http_omni_invalid(r, err, "prompt", "empty_array",
                                     "Invalid 'prompt': empty array. "
                                     "Expected a string.");
    }

    first = v->u.array.values[0];

    if (YAJL_IS_NUMBER(first) || YAJL_IS_ARRAY(first)) {
        return ngx_http_omni_unsupported(r, err, "prompt",
                                         "Unsupported value: 'prompt' as "
                                         "token ids is not supported; send "
                                         "the prompt as a string.");
    }

    if (v->u.array.len > 1) {
        return ngx_http_omni_unsupported(r, err, "prompt",
                                         "Unsupported value: 'prompt' must "
                                         "be one string; several prompts in "
                                         "one request are not supported.");
    }

    if (!YAJL_IS_STRING(first)) {
        return ngx_http_omni_invalid_type(r, err, "prompt[0]", "a string",
                                          first);
    }

    f->input = first;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_check_stream(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    yajl_val    o;
    ngx_int_t   rc;
    ngx_uint_t  flag;

    flag = 0;

    rc = ngx_http_omni_bool(r, root, "stream", "stream", &flag, err);
    if (rc != NGX_OK) {
        return rc;
    }

    req->stream = flag;

    o = ngx_http_omni_member(root, "stream_options");

    if (o == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_OBJECT(o)) {
        return ngx_http_omni_invalid_type(r, err, "stream_options",
                                          "an object", o);
    }

    if (!req->stream) {
        return ngx_http_omni_invalid(r, err, "stream_options", NULL,
                                     "The 'stream_options' parameter is "
                                     "only allowed when 'stream' is "
                                     "enabled.");
    }

    flag = 0;

    rc = ngx_http_omni_bool(r, o, "include_usage",
                            "stream_options.include_usage", &flag, err);
    if (rc != NGX_OK) {
        return rc;
    }

    req->include_usage = flag;

    return NGX_OK;
}


/* ---- the engine request ---- */

/* the generator's text (s: its status so far) into req->engine, from the
 * request pool; over the wire protocol's REQUEST limit it is a 413 */

ngx_int_t
ngx_http_omni_engine_json(ngx_http_request_t *r, yajl_gen g, ngx_uint_t s,
    ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    size_t                len;
    ngx_int_t             rc;
    const unsigned char  *buf;

    buf = NULL;
    len = 0;

    if (s == yajl_gen_status_ok) {
        s = yajl_gen_get_buf(g, &buf, &len);
    }

    if (s != yajl_gen_status_ok) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "omni yajl_gen failed: %ui", s);
        return NGX_ERROR;
    }

    if (len > OMNI_MAX_REQUEST) {
        rc = ngx_http_omni_invalid(r, err, NULL, NULL,
                                   "The request is too large: %uz bytes "
                                   "for the engine, at most %uD.",
                                   len, (uint32_t) OMNI_MAX_REQUEST);
        err->status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
        return rc;
    }

    req->engine.data = ngx_pnalloc(r->pool, len);
    if (req->engine.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(req->engine.data, buf, len);
    req->engine.len = len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_engine_request(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    yajl_gen    g;
    ngx_int_t   rc;
    ngx_uint_t  s;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_ERROR;
    }

    s = ngx_http_omni_gen_request(r, g, kind, root, f, req);

    rc = ngx_http_omni_engine_json(r, g, s, req, err);

    yajl_gen_free(g);

    /* the names of its prefixes, for omni_prefix_route and nothing
     * else: the engine computes them from what it gets */

    if (rc == NGX_OK && kind == NGX_HTTP_OMNI_KIND_CHAT
        && ngx_http_omni_prefix_keys(r, req, f->model, &f->salt, f->input)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni request: stream:%ui usage:%ui seed:%V "
                   "engine json:%uz",
                   (ngx_uint_t) req->stream, (ngx_uint_t) req->include_usage,
                   &req->seed, req->engine.len);

    return rc;
}


/*
 * {"model", "messages" | "prompt", "max_tokens", sampling fields as given,
 *  "thinking" false when turned off, "cache_salt", "seed", "audio" when
 *  spoken, "audio_in" and
 *  "max_audio_seconds" with audio in}; speech: {"model", "input",
 *  "audio"}. The yajl_gen statuses are or-ed:
 * yajl_gen_status_ok is 0, so any failure leaves the result nonzero.
 */

static ngx_uint_t
ngx_http_omni_gen_request(ngx_http_request_t *r, yajl_gen g,
    ngx_http_omni_kind_e kind, yajl_val root, ngx_http_omni_fields_t *f,
    ngx_http_omni_req_t *req)
{
    yajl_val     v;
    ngx_uint_t   i, s;

    s = yajl_gen_map_open(g);

    s |= ngx_http_omni_gen_str(g, "model");
    s |= ngx_http_omni_gen_value(g, f->model);

    if (kind == NGX_HTTP_OMNI_KIND_SPEECH) {
        s |= ngx_http_omni_gen_str(g, "input");
        s |= ngx_http_omni_gen_value(g, f->input);
        s |= ngx_http_omni_gen_audio(g, &f->speech);
        s |= yajl_gen_map_close(g);

        return s;
    }

    if (f->speech.on) {
        s |= ngx_http_omni_gen_audio(g, &f->speech);
    }

    if (kind == NGX_HTTP_OMNI_KIND_CHAT) {
        s |= ngx_http_omni_gen_str(g, "messages");
        s |= ngx_http_omni_gen_messages(g, f->input);

    } else {
        s |= ngx_http_omni_gen_str(g, "prompt");
        s |= ngx_http_omni_gen_value(g, f->input);
    }

    if (f->max_tokens > 0) {
        s |= ngx_http_omni_gen_str(g, "max_tokens");
        s |= yajl_gen_integer(g, (long long) f->max_tokens);
    }

    for (i = 0; ngx_http_omni_sampling[i] != NULL; i++) {
        v = ngx_http_omni_member(root, ngx_http_omni_sampling[i]);

        if (v != NULL) {
            s |= ngx_http_omni_gen_str(g, ngx_http_omni_sampling[i]);
            s |= ngx_http_omni_gen_value(g, v);
        }
    }

    if (f->no_think) {
        s |= ngx_http_omni_gen_str(g, "thinking");
        s |= yajl_gen_bool(g, 0);
    }

    if (f->salt.len) {
        s |= ngx_http_omni_gen_str(g, "cache_salt");
        s |= yajl_gen_string(g, f->salt.data, f->salt.len);
    }

    s |= ngx_http_omni_gen_str(g, "seed");
    s |= yajl_gen_integer(g, (long long) f->seed);

    if (req->audio_in) {
        s |= ngx_http_omni_gen_audio_in(r, g, req);
    }

    s |= yajl_gen_map_close(g);

    return s;
}


/* Each message's role, content and audio as given (the engine maps
 * "developer" and joins text parts), but for input_audio parts; a message
 * that is not an object goes as it is, for the engine to name. */

static ngx_uint_t
ngx_http_omni_gen_messages(yajl_gen g, yajl_val msgs)
{
    size_t      i;
    yajl_val    m, v;
    ngx_uint_t  s, k;

    k = 0;
    s = yajl_gen_array_open(g);

    for (i = 0; i < msgs->u.array.len; i++) {
        m = msgs->u.array.values[i];

        if (!YAJL_IS_OBJECT(m)) {
            s |= ngx_http_omni_gen_value(g, m);
            continue;
        }

        s |= yajl_gen_map_open(g);

        v = ngx_http_omni_member(m, "role");

        if (v != NULL) {
            s |= ngx_http_omni_gen_str(g, "role");
            s |= ngx_http_omni_gen_value(g, v);
        }

        v = ngx_http_omni_member(m, "content");

        if (v != NULL) {
            s |= ngx_http_omni_gen_str(g, "content");
            s |= ngx_http_omni_gen_content(g, v, &k);
        }

        /* an earlier spoken answer, {"id": ...}: the engine puts its
         * transcript back */

        v = ngx_http_omni_member(m, "audio");

        if (v != NULL) {
            s |= ngx_http_omni_gen_str(g, "audio");
            s |= ngx_http_omni_gen_value(g, v);
        }

        s |= yajl_gen_map_close(g);
    }

    s |= yajl_gen_array_close(g);

    return s;
}


/* A message's content as given, its input_audio parts as
 * {"type": "input_audio", "index": k}: the k-th input of "audio_in", in
 * the order ngx_http_omni_check_messages() decoded them. */

static ngx_uint_t
ngx_http_omni_gen_content(yajl_gen g, yajl_val content, ngx_uint_t *k)
{
    size_t      j;
    yajl_val    part;
    ngx_uint_t  s;

    if (!YAJL_IS_ARRAY(content)) {
        return ngx_http_omni_gen_value(g, content);
    }

    s = yajl_gen_array_open(g);

    for (j = 0; j < content->u.array.len; j++) {
        part = content->u.array.values[j];

        if (!ngx_http_omni_is_part(part, "input_audio")) {
            s |= ngx_http_omni_gen_value(g, part);
            continue;
        }

        s |= yajl_gen_map_open(g);
        s |= ngx_http_omni_gen_str(g, "type");
        s |= ngx_http_omni_gen_str(g, "input_audio");
        s |= ngx_http_omni_gen_str(g, "index");
        s |= yajl_gen_integer(g, (long long) (*k)++);
        s |= yajl_gen_map_close(g);
    }

    return s | yajl_gen_array_close(g);
}


static ngx_uint_t
ngx_http_omni_is_part(yajl_val part, const char *type)
{
    yajl_val  t;

    if (!YAJL_IS_OBJECT(part)) {
        return 0;
    }

    t = ngx_http_omni_member(part, "type");

    return t != NULL && YAJL_IS_STRING(t) && ngx_strcmp(t->u.string, type) == 0;
}

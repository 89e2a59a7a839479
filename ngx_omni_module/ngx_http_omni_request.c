
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
 * ngx_http_omni_json.c's, shared with ngx_http_omni_openai.c.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_MAX_SALT      256         /* engine's REQ_MAX_SALT */
#define NGX_HTTP_OMNI_CLIP          40          /* client bytes quoted */
#define NGX_HTTP_OMNI_MSG_MAX       512         /* one error message */
#define NGX_HTTP_OMNI_PARAM_MAX     64

/* OpenAI's default for /v1/completions */
#define NGX_HTTP_OMNI_COMPLETIONS_MAX_TOKENS  16


/* What the checks found, for the engine request. */
typedef struct {
    yajl_val                    model;
    yajl_val                    input;      /* messages, or prompt string */
    yajl_val                    salt;       /* prompt_cache_key, or NULL */
    int64_t                     max_tokens; /* 0: none */
    int64_t                     seed;       /* the client's, or drawn */
} ngx_http_omni_fields_t;


static ngx_int_t ngx_http_omni_check_body(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_messages(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_part(ngx_http_request_t *r,
    size_t i, size_t j, yajl_val part, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_prompt(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_stream(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_max_tokens(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_choices(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_output(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_tools(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_legacy(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_salt(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_seed(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_int(ngx_http_request_t *r,
    char *param, yajl_val v, int64_t min, int64_t *out,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_bool(ngx_http_request_t *r, yajl_val o,
    char *key, char *param, ngx_uint_t *flag, ngx_http_omni_error_t *err);

static ngx_int_t ngx_http_omni_engine_request(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_uint_t ngx_http_omni_gen_request(yajl_gen g,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f);
static ngx_uint_t ngx_http_omni_gen_messages(yajl_gen g, yajl_val msgs);

static char *ngx_http_omni_type(yajl_val v);
static size_t ngx_http_omni_clip(const char *s, char **more);
static char *ngx_http_omni_param(ngx_http_request_t *r, char *fmt,
    size_t i, size_t j);
static ngx_int_t ngx_http_omni_scan(ngx_http_request_t *r, ngx_str_t *body,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_bad_json(ngx_http_request_t *r,
    u_char *why, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_invalid(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *code,
    const char *fmt, ...);
static ngx_int_t ngx_http_omni_invalid_type(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *want, yajl_val v);
static ngx_int_t ngx_http_omni_unsupported(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *why);


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
    u_char                   ebuf[256];
    yajl_val                 root;
    ngx_int_t                rc;
    ngx_http_omni_fields_t   f;

    ngx_memzero(req, sizeof(ngx_http_omni_req_t));
    ngx_memzero(&f, sizeof(ngx_http_omni_fields_t));

    rc = ngx_http_omni_scan(r, body, err);
    if (rc != NGX_OK) {
        return rc;
    }

    ebuf[0] = '\0';

    root = ngx_http_omni_tree(r, body->data, body->len, ebuf, sizeof(ebuf));
    if (root == NULL) {
        if (ebuf[0] == '\0') {
            return NGX_ERROR;
        }

        return ngx_http_omni_bad_json(r, ebuf, err);
    }

    /* the tree is malloc()ed by yajl: one exit frees it */

    rc = ngx_http_omni_check_body(r, ep->kind, root, &f, req, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_engine_request(r, ep->kind, root, &f, req, err);
    }

    yajl_tree_free(root);

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
    ngx_str_t  model;

    if (!YAJL_IS_OBJECT(root)) {
        return ngx_http_omni_invalid(r, err, NULL, "invalid_type",
                                     "Invalid type for the request body: "
                                     "expected a JSON object, but got %s "
                                     "instead.", ngx_http_omni_type(root));
    }

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
    if (req->model.data == NULL) {
        return NGX_ERROR;
    }

    rc = (kind == NGX_HTTP_OMNI_KIND_CHAT)
         ? ngx_http_omni_check_messages(r, root, f, err)
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
        rc = ngx_http_omni_check_output(r, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_tools(r, root, err);
    }

    if (rc == NGX_OK && kind == NGX_HTTP_OMNI_KIND_COMPLETION) {
        rc = ngx_http_omni_check_legacy(r, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_salt(r, root, f, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_seed(r, root, f, req, err);
    }

    return rc;
}


/* messages: a non-empty array; each message's role and content are the
 * engine's to check, but media content parts are refused here, with the
 * part's path, because the engine only knows they are not text. */

static ngx_int_t
ngx_http_omni_check_messages(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
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
            rc = ngx_http_omni_check_part(r, i, j, c->u.array.values[j], err);
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
    yajl_val part, ngx_http_omni_error_t *err)
{
    char      *param;
    yajl_val   type;

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

    return ngx_http_omni_invalid(r, err, param, "unsupported_value",
                                 "Unsupported value: content parts of type "
                                 "'%s' are not supported yet; only 'text' "
                                 "parts are.", type->u.string);
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


/* max_completion_tokens wins over max_tokens; both must be integers >= 1
 * when given. */

static ngx_int_t
ngx_http_omni_check_max_tokens(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
{
    yajl_val   v;
    ngx_int_t  rc;

    v = ngx_http_omni_member(root, "max_tokens");

    if (v != NULL) {
        rc = ngx_http_omni_check_int(r, "max_tokens", v, 1, &f->max_tokens,
                                     err);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    v = ngx_http_omni_member(root, "max_completion_tokens");

    if (v != NULL) {
        rc = ngx_http_omni_check_int(r, "max_completion_tokens", v, 1,
                                     &f->max_tokens, err);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    if (f->max_tokens == 0 && kind == NGX_HTTP_OMNI_KIND_COMPLETION) {
        f->max_tokens = NGX_HTTP_OMNI_COMPLETIONS_MAX_TOKENS;
    }

    return NGX_OK;
}


/* One choice, no logprobs: n, logprobs, top_logprobs. */

static ngx_int_t
ngx_http_omni_check_choices(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_error_t *err)
{
    char      *more;
    size_t     n;
    yajl_val   v;

    v = ngx_http_omni_member(root, "n");

    if (v != NULL) {
        if (!YAJL_IS_NUMBER(v)) {
            return ngx_http_omni_invalid_type(r, err, "n", "an integer", v);
        }

        if (strtod(v->u.number.r, NULL) != 1.0) {
            n = ngx_http_omni_clip(v->u.number.r, &more);
            return ngx_http_omni_invalid(r, err, "n", "unsupported_value",
                                         "Unsupported value: 'n' is %*s%s, "
                                         "but only n=1 is supported.",
                                         n, v->u.number.r, more);
        }
    }

    v = ngx_http_omni_member(root, "logprobs");

    /* chat: a boolean; completions: an integer 0..5, and any asks */

    if (v != NULL) {
        if (YAJL_IS_TRUE(v)
            || (YAJL_IS_NUMBER(v) && kind == NGX_HTTP_OMNI_KIND_COMPLETION))
        {
            return ngx_http_omni_unsupported(r, err, "logprobs", NULL);
        }

        if (!YAJL_IS_FALSE(v)) {
            return ngx_http_omni_invalid_type(r, err, "logprobs",
                                              kind == NGX_HTTP_OMNI_KIND_CHAT
                                              ? "a boolean" : "an integer",
                                              v);
        }
    }

    v = ngx_http_omni_member(root, "top_logprobs");

    if (v != NULL && kind == NGX_HTTP_OMNI_KIND_CHAT) {
        if (!YAJL_IS_NUMBER(v)) {
            return ngx_http_omni_invalid_type(r, err, "top_logprobs",
                                              "an integer", v);
        }

        if (strtod(v->u.number.r, NULL) != 0.0) {
            return ngx_http_omni_unsupported(r, err, "top_logprobs", NULL);
        }
    }

    return NGX_OK;
}


/* Text out only: modalities, audio, response_format. */

static ngx_int_t
ngx_http_omni_check_output(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_error_t *err)
{
    char      *param, *more;
    size_t     i, n;
    yajl_val   v, m;

    v = ngx_http_omni_member(root, "modalities");

    if (v != NULL && !YAJL_IS_ARRAY(v)) {
        return ngx_http_omni_invalid_type(r, err, "modalities",
                                          "an array of strings", v);
    }

    for (i = 0; v != NULL && i < v->u.array.len; i++) {
        m = v->u.array.values[i];

        if (YAJL_IS_STRING(m) && ngx_strcmp(m->u.string, "text") == 0) {
            continue;
        }

        if (YAJL_IS_STRING(m) && ngx_strcmp(m->u.string, "audio") == 0) {
            goto audio;
        }

        param = ngx_http_omni_param(r, "modalities[%uz]", i, 0);
        if (param == NULL) {
            return NGX_ERROR;
        }

        if (!YAJL_IS_STRING(m)) {
            return ngx_http_omni_invalid_type(r, err, param, "a string", m);
        }

        n = ngx_http_omni_clip(m->u.string, &more);

        return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                     "Invalid value: '%*s%s'. Supported "
                                     "values are: 'text' and 'audio'.",
                                     n, m->u.string, more);
    }

    if (ngx_http_omni_member(root, "audio") != NULL) {
        goto audio;
    }

    v = ngx_http_omni_member(root, "response_format");

    if (v == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_OBJECT(v)) {
        return ngx_http_omni_invalid_type(r, err, "response_format",
                                          "an object", v);
    }

    m = ngx_http_omni_member(v, "type");

    if (m != NULL && YAJL_IS_STRING(m) && ngx_strcmp(m->u.string, "text") == 0)
    {
        return NGX_OK;
    }

    return ngx_http_omni_unsupported(r, err, "response_format",
                                     "Unsupported value: 'response_format' "
                                     "must be of type 'text'; structured "
                                     "output is not supported yet.");

audio:

    return ngx_http_omni_unsupported(r, err, "modalities",
                                     "Unsupported value: audio output is "
                                     "not supported yet.");
}


/* No tool calling: tools/functions empty, tool_choice/function_call
 * "none". */

static ngx_int_t
ngx_http_omni_check_tools(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_error_t *err)
{
    char        *lists[] = { "tools", "functions" };
    char        *choices[] = { "tool_choice", "function_call" };
    yajl_val     v;
    ngx_uint_t   i;

    for (i = 0; i < 2; i++) {
        v = ngx_http_omni_member(root, lists[i]);

        if (v == NULL) {
            continue;
        }

        if (!YAJL_IS_ARRAY(v)) {
            return ngx_http_omni_invalid_type(r, err, lists[i], "an array",
                                              v);
        }

        if (v->u.array.len > 0) {
            return ngx_http_omni_invalid(r, err, lists[i],
                                         "unsupported_parameter",
                                         "Unsupported parameter: '%s': "
                                         "tool calling is not supported "
                                         "yet.", lists[i]);
        }
    }

    for (i = 0; i < 2; i++) {
        v = ngx_http_omni_member(root, choices[i]);

        if (v == NULL
            || (YAJL_IS_STRING(v) && ngx_strcmp(v->u.string, "none") == 0))
        {
            continue;
        }

        return ngx_http_omni_invalid(r, err, choices[i], "unsupported_value",
                                     "Unsupported value: '%s' must be "
                                     "'none'; tool calling is not supported "
                                     "yet.", choices[i]);
    }

    return NGX_OK;
}


/* /v1/completions only: echo, best_of, suffix. */

static ngx_int_t
ngx_http_omni_check_legacy(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_error_t *err)
{
    yajl_val    v;
    ngx_int_t   rc;
    ngx_uint_t  echo;

    echo = 0;

    rc = ngx_http_omni_bool(r, root, "echo", "echo", &echo, err);
    if (rc != NGX_OK) {
        return rc;
    }

    if (echo) {
        return ngx_http_omni_unsupported(r, err, "echo", NULL);
    }

    v = ngx_http_omni_member(root, "best_of");

    if (v != NULL) {
        if (!YAJL_IS_NUMBER(v)) {
            return ngx_http_omni_invalid_type(r, err, "best_of",
                                              "an integer", v);
        }

        if (strtod(v->u.number.r, NULL) > 1.0) {
            return ngx_http_omni_unsupported(r, err, "best_of",
                                             "Unsupported value: 'best_of' "
                                             "must be 1; only one "
                                             "completion is generated.");
        }
    }

    v = ngx_http_omni_member(root, "suffix");

    if (v != NULL) {
        if (!YAJL_IS_STRING(v)) {
            return ngx_http_omni_invalid_type(r, err, "suffix", "a string",
                                              v);
        }

        if (v->u.string[0] != '\0') {
            return ngx_http_omni_unsupported(r, err, "suffix", NULL);
        }
    }

    return NGX_OK;
}


/* prompt_cache_key becomes the engine's cache_salt: requests share
 * cached prefixes only when their keys are equal. "" means none. */

static ngx_int_t
ngx_http_omni_check_salt(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
{
    size_t    len;
    yajl_val  v;

    v = ngx_http_omni_member(root, "prompt_cache_key");

    if (v == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_STRING(v)) {
        return ngx_http_omni_invalid_type(r, err, "prompt_cache_key",
                                          "a string", v);
    }

    len = ngx_strlen(v->u.string);

    if (len > NGX_HTTP_OMNI_MAX_SALT) {
        return ngx_http_omni_invalid(r, err, "prompt_cache_key",
                                     "string_above_max_length",
                                     "Invalid 'prompt_cache_key': string too "
                                     "long. Expected a string with maximum "
                                     "length %d, but got a string with "
                                     "length %uz instead.",
                                     NGX_HTTP_OMNI_MAX_SALT, len);
    }

    if (len > 0) {
        f->salt = v;
    }

    return NGX_OK;
}


/*
 * seed: an integer >= 0, or, when absent, a fresh one (omni_seed_draw),
 * so that each request without one samples afresh as OpenAI's do.
 */

static ngx_int_t
ngx_http_omni_check_seed(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    uint64_t   v;
    yajl_val   seed;
    ngx_int_t  rc;

    seed = ngx_http_omni_member(root, "seed");

    if (seed != NULL) {
        rc = ngx_http_omni_check_int(r, "seed", seed, 0, &f->seed, err);
        if (rc != NGX_OK) {
            return rc;
        }

    } else {
        if (omni_seed_draw(&v) != 0) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, ngx_errno,
                          "omni: getrandom() failed, no seed for the request");
            return NGX_ERROR;
        }

        f->seed = (int64_t) v;
    }

    req->seed.data = ngx_pnalloc(r->pool, NGX_INT64_LEN);
    if (req->seed.data == NULL) {
        return NGX_ERROR;
    }

    req->seed.len = ngx_sprintf(req->seed.data, "%L", f->seed)
                    - req->seed.data;

    return NGX_OK;
}


/* An integer >= min. JSON has one number type: 3.0 and 3e2 are integers,
 * 2.5 is not. The raw text is read: yajl 2.1.0's integer flag is not
 * reliable. */

static ngx_int_t
ngx_http_omni_check_int(ngx_http_request_t *r, char *param, yajl_val v,
    int64_t min, int64_t *out, ngx_http_omni_error_t *err)
{
    char       *raw, *more;
    size_t      n;
    double      d;
    int64_t     i;
    ngx_int_t   beyond;     /* -1, +1: below, above every int64_t */
    ngx_uint_t  neg;

    if (!YAJL_IS_NUMBER(v)) {
        return ngx_http_omni_invalid_type(r, err, param, "an integer", v);
    }

    raw = v->u.number.r;
    n = ngx_http_omni_clip(raw, &more);
    beyond = 0;
    i = 0;

    if (strpbrk(raw, ".eE") != NULL) {
        d = strtod(raw, NULL);

        if (d < -9.2e18) {
            beyond = -1;

        } else if (d > 9.2e18) {
            beyond = 1;

        } else {
            i = (int64_t) d;

            if ((double) i != d) {
                return ngx_http_omni_invalid(r, err, param, "invalid_type",
                                             "Invalid type for '%s': "
                                             "expected an integer, but got "
                                             "a decimal number instead.",
                                             param);
            }
        }

    } else {
        /* ngx_atoof() takes digits only and fails on overflow */

        neg = (raw[0] == '-');
        i = ngx_atoof((u_char *) raw + neg, ngx_strlen(raw) - neg);

        if (i == NGX_ERROR) {
            beyond = neg ? -1 : 1;

        } else if (neg) {
            i = -i;
        }
    }

    if (beyond < 0 || (beyond == 0 && i < min)) {
        return ngx_http_omni_invalid(r, err, param, "integer_below_min_value",
                                     "Invalid '%s': integer below minimum "
                                     "value. Expected a value >= %L, but "
                                     "got %*s%s instead.",
                                     param, min, n, raw, more);
    }

    if (beyond > 0) {
        return ngx_http_omni_invalid(r, err, param, "integer_above_max_value",
                                     "Invalid '%s': integer above maximum "
                                     "value. Expected a value <= %L, but "
                                     "got %*s%s instead.",
                                     param, (int64_t) INT64_MAX,
                                     n, raw, more);
    }

    *out = i;

    return NGX_OK;
}


/* An optional boolean o.key; *flag is left alone when absent or null. */

static ngx_int_t
ngx_http_omni_bool(ngx_http_request_t *r, yajl_val o, char *key,
    char *param, ngx_uint_t *flag, ngx_http_omni_error_t *err)
{
    yajl_val  v;

    v = ngx_http_omni_member(o, key);

    if (v == NULL) {
        return NGX_OK;
    }

    if (YAJL_IS_TRUE(v)) {
        *flag = 1;
        return NGX_OK;
    }

    if (YAJL_IS_FALSE(v)) {
        *flag = 0;
        return NGX_OK;
    }

    return ngx_http_omni_invalid_type(r, err, param, "a boolean", v);
}


/* ---- the engine request ---- */

static ngx_int_t
ngx_http_omni_engine_request(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    size_t                len;
    yajl_gen              g;
    ngx_int_t             rc;
    ngx_uint_t            s;
    const unsigned char  *buf;

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_ERROR;
    }

    buf = NULL;
    len = 0;

    s = ngx_http_omni_gen_request(g, kind, root, f);

    if (s == yajl_gen_status_ok) {
        s = yajl_gen_get_buf(g, &buf, &len);
    }

    if (s != yajl_gen_status_ok) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "omni yajl_gen failed: %ui", s);
        rc = NGX_ERROR;

    } else if (len > OMNI_MAX_REQUEST) {
        rc = ngx_http_omni_invalid(r, err, NULL, NULL,
                                   "The request is too large: %uz bytes "
                                   "for the engine, at most %uD.",
                                   len, (uint32_t) OMNI_MAX_REQUEST);
        err->status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;

    } else {
        req->engine.data = ngx_pnalloc(r->pool, len);
        rc = (req->engine.data == NULL) ? NGX_ERROR : NGX_OK;

        if (rc == NGX_OK) {
            ngx_memcpy(req->engine.data, buf, len);
            req->engine.len = len;
        }
    }

    yajl_gen_free(g);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni request: stream:%ui usage:%ui seed:%V "
                   "engine json:%uz",
                   (ngx_uint_t) req->stream, (ngx_uint_t) req->include_usage,
                   &req->seed, req->engine.len);

    return rc;
}


/*
 * {"model", "messages" | "prompt", "max_tokens", sampling fields as given,
 *  "cache_salt", "seed"}. The yajl_gen statuses are or-ed: yajl_gen_status_ok is
 * 0, so any failure leaves the result nonzero.
 */

static ngx_uint_t
ngx_http_omni_gen_request(yajl_gen g, ngx_http_omni_kind_e kind,
    yajl_val root, ngx_http_omni_fields_t *f)
{
    yajl_val     v;
    ngx_uint_t   i, s;

    s = yajl_gen_map_open(g);

    s |= ngx_http_omni_gen_str(g, "model");
    s |= ngx_http_omni_gen_value(g, f->model);

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

    if (f->salt != NULL) {
        s |= ngx_http_omni_gen_str(g, "cache_salt");
        s |= ngx_http_omni_gen_value(g, f->salt);
    }

    s |= ngx_http_omni_gen_str(g, "seed");
    s |= yajl_gen_integer(g, (long long) f->seed);

    s |= yajl_gen_map_close(g);

    return s;
}


/* Each message's role and content as given (the engine maps "developer"
 * and joins text parts); a message that is not an object goes as it is,
 * for the engine to name. */

static ngx_uint_t
ngx_http_omni_gen_messages(yajl_gen g, yajl_val msgs)
{
    size_t      i;
    yajl_val    m, v;
    ngx_uint_t  s;

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
            s |= ngx_http_omni_gen_value(g, v);
        }

        s |= yajl_gen_map_close(g);
    }

    s |= yajl_gen_array_close(g);

    return s;
}


/* ---- tree helpers and errors ---- */

static char *
ngx_http_omni_type(yajl_val v)
{
    switch (v->type) {

    case yajl_t_string:
        return "a string";

    case yajl_t_number:
        return strpbrk(v->u.number.r, ".eE") ? "a number" : "an integer";

    case yajl_t_object:
        return "an object";

    case yajl_t_array:
        return "an array";

    case yajl_t_true:
    case yajl_t_false:
        return "a boolean";

    default:
        return "null";
    }
}


/* How many bytes of s (valid UTF-8) to quote back: at most
 * NGX_HTTP_OMNI_CLIP, cut at a character boundary; *more is "..." when
 * cut, else "". */

static size_t
ngx_http_omni_clip(const char *s, char **more)
{
    size_t  n;

    n = ngx_strnlen((u_char *) s, NGX_HTTP_OMNI_CLIP + 1);

    if (n <= NGX_HTTP_OMNI_CLIP) {
        *more = "";
        return n;
    }

    n = NGX_HTTP_OMNI_CLIP;

    while (n > 0 && ((u_char) s[n] & 0xc0) == 0x80) {
        n--;
    }

    *more = "...";

    return n;
}


/* A parameter path such as "messages[2].content[0]", NUL-terminated. */

static char *
ngx_http_omni_param(ngx_http_request_t *r, char *fmt, size_t i, size_t j)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, NGX_HTTP_OMNI_PARAM_MAX);
    if (p == NULL) {
        return NULL;
    }

    *ngx_slprintf(p, p + NGX_HTTP_OMNI_PARAM_MAX - 1, fmt, i, j) = '\0';

    return (char *) p;
}


/* why: the first line of yajl's message, or the pre-scan's. */

static ngx_int_t
ngx_http_omni_bad_json(ngx_http_request_t *r, u_char *why,
    ngx_http_omni_error_t *err)
{
    size_t  n;

    for (n = 0; why[n] != '\0' && why[n] != '\n'; n++) { /* void */ }

    while (n > 0 && (why[n - 1] == ' ' || why[n - 1] == '.')) {
        n--;
    }

    return ngx_http_omni_invalid(r, err, NULL, NULL,
                                 "We could not parse the JSON body of your "
                                 "request. (HINT: This likely means you "
                                 "aren't using your HTTP library correctly. "
                                 "The API expects a JSON payload, but what "
                                 "was sent was not valid JSON: %*s.)",
                                 n, why);
}


/* Fills err with a 400 invalid_request_error; param and code are static
 * or pool strings, NULL for JSON null. Returns NGX_DECLINED, or NGX_ERROR
 * when out of memory. */

static ngx_int_t
ngx_http_omni_invalid(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    char *param, char *code, const char *fmt, ...)
{
    u_char   *p, *last;
    va_list   args;

    p = ngx_pnalloc(r->pool, NGX_HTTP_OMNI_MSG_MAX);
    if (p == NULL) {
        return NGX_ERROR;
    }

    va_start(args, fmt);
    last = ngx_vslprintf(p, p + NGX_HTTP_OMNI_MSG_MAX, fmt, args);
    va_end(args);

    err->status = NGX_HTTP_BAD_REQUEST;
    ngx_str_set(&err->type, "invalid_request_error");

    err->param.data = (u_char *) param;
    err->param.len = (param != NULL) ? ngx_strlen(param) : 0;

    err->code.data = (u_char *) code;
    err->code.len = (code != NULL) ? ngx_strlen(code) : 0;

    err->message.data = p;
    err->message.len = last - p;

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "client sent invalid omni request: %V", &err->message);

    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_omni_invalid_type(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    char *param, char *want, yajl_val v)
{
    return ngx_http_omni_invalid(r, err, param, "invalid_type",
                                 "Invalid type for '%s': expected %s, but "
                                 "got %s instead.",
                                 param, want, ngx_http_omni_type(v));
}


/* why NULL: the parameter itself is not supported. */

static ngx_int_t
ngx_http_omni_unsupported(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    char *param, char *why)
{
    if (why == NULL) {
        return ngx_http_omni_invalid(r, err, param, "unsupported_parameter",
                                     "Unsupported parameter: '%s' is not "
                                     "supported yet.", param);
    }

    return ngx_http_omni_invalid(r, err, param, "unsupported_value", "%s",
                                 why);
}

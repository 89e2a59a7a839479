
/*
 * Copyright (C) ngx_omni authors
 *
 * ngx_http_omni_openai.c -- the OpenAI API's JSON, in and out. No I/O.
 *
 * In: a chat or completions body is pre-scanned (yajl has no nesting
 * limit, and its tree API takes a C string), parsed with yajl's tree API,
 * checked for what the module acts on or refuses, and rewritten with
 * yajl_gen into the engine's request JSON (engine/request.h). Sampling
 * fields are copied as given: the engine checks their types and ranges and
 * answers with an ERROR naming the parameter.
 *
 * Out: chat.completion(.chunk) and text_completion objects, SSE events,
 * error objects and model lists, written with one escaper that also
 * replaces invalid UTF-8 by U+FFFD, so the output is valid JSON whatever
 * bytes arrive (a URL-decoded model id, an engine message).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_MAX_DEPTH     64          /* nesting levels; ours: 5 */
#define NGX_HTTP_OMNI_MAX_NODES     (1 << 18)   /* strings + structure */
#define NGX_HTTP_OMNI_MAX_SALT      256         /* engine's REQ_MAX_SALT */
#define NGX_HTTP_OMNI_CLIP          40          /* client bytes quoted */
#define NGX_HTTP_OMNI_MSG_MAX       512         /* one error message */
#define NGX_HTTP_OMNI_PARAM_MAX     64

/* OpenAI's default for /v1/completions */
#define NGX_HTTP_OMNI_COMPLETIONS_MAX_TOKENS  16

#define NGX_HTTP_OMNI_USAGE_FMT                                               \
    "{\"prompt_tokens\":%uD,\"completion_tokens\":%uD,"                       \
    "\"total_tokens\":%uL,"                                                   \
    "\"prompt_tokens_details\":{\"cached_tokens\":%uD,\"audio_tokens\":0},"   \
    "\"completion_tokens_details\":{\"reasoning_tokens\":0,"                  \
    "\"audio_tokens\":0,\"accepted_prediction_tokens\":0,"                    \
    "\"rejected_prediction_tokens\":0}}"

/* an upper bound: each conversion is shorter than NGX_INT64_LEN */
#define NGX_HTTP_OMNI_USAGE_LEN                                               \
    (sizeof(NGX_HTTP_OMNI_USAGE_FMT) - 1 + 4 * NGX_INT64_LEN)


/* What the checks found, for the engine request. */
typedef struct {
    yajl_val                    model;
    yajl_val                    input;      /* messages, or prompt string */
    yajl_val                    salt;       /* prompt_cache_key, or NULL */
    int64_t                     max_tokens; /* 0: none */
} ngx_http_omni_fields_t;


static char *ngx_http_omni_prescan(u_char *p, size_t len,
    ngx_uint_t *syntax);
static yajl_val ngx_http_omni_tree(ngx_http_request_t *r, u_char *json,
    size_t len, u_char *ebuf, size_t size);
static ngx_int_t ngx_http_omni_check(ngx_http_request_t *r,
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
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
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_choices(ngx_http_request_t *r,
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_output(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_tools(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_legacy(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_salt(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_check_int(ngx_http_request_t *r,
    char *param, yajl_val v, int64_t min, int64_t *out,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_bool(ngx_http_request_t *r, yajl_val o,
    char *key, char *param, ngx_uint_t *flag, ngx_http_omni_error_t *err);

static ngx_int_t ngx_http_omni_engine_request(ngx_http_request_t *r,
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
static ngx_uint_t ngx_http_omni_gen_request(yajl_gen g,
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
    ngx_http_omni_fields_t *f);
static ngx_uint_t ngx_http_omni_gen_messages(yajl_gen g, yajl_val msgs);
static ngx_uint_t ngx_http_omni_gen_value(yajl_gen g, yajl_val v);
static ngx_uint_t ngx_http_omni_gen_str(yajl_gen g, const char *s);
static ngx_uint_t ngx_http_omni_gen_model(yajl_gen g, yajl_val m);

static yajl_val ngx_http_omni_member(yajl_val o, const char *key);
static char *ngx_http_omni_type(yajl_val v);
static size_t ngx_http_omni_clip(const char *s, char **more);
static char *ngx_http_omni_param(ngx_http_request_t *r, char *fmt,
    size_t i, size_t j);
static ngx_int_t ngx_http_omni_bad_json(ngx_http_request_t *r,
    u_char *why, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_invalid(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *code,
    const char *fmt, ...);
static ngx_int_t ngx_http_omni_invalid_type(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *want, yajl_val v);
static ngx_int_t ngx_http_omni_unsupported(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *why);

static ngx_buf_t *ngx_http_omni_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *pre, u_char *text, size_t len,
    ngx_str_t *post, ngx_uint_t usage_null);
static size_t ngx_http_omni_head_len(ngx_http_omni_ctx_t *ctx,
    ngx_str_t *object);
static u_char *ngx_http_omni_head(u_char *p, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *object);
static ngx_str_t ngx_http_omni_finish(ngx_http_omni_ctx_t *ctx);
static u_char *ngx_http_omni_text(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, size_t *len);
static size_t ngx_http_omni_error_len(ngx_http_omni_error_t *err);
static u_char *ngx_http_omni_error_write(u_char *p,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_model_missing(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
static size_t ngx_http_omni_utf8(u_char *p, u_char *last);
static size_t ngx_http_omni_escape_len(u_char *s, size_t len);
static u_char *ngx_http_omni_escape(u_char *dst, u_char *s, size_t len);


/* copied to the engine as given, when present and not null */
static const char *const  ngx_http_omni_sampling[] = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "stop",
    "ignore_eos",
    NULL
};


/* ---- request bodies ---- */

ngx_int_t
ngx_http_omni_parse(ngx_http_request_t *r, ngx_http_omni_endpoint_e endpoint,
    ngx_str_t *body, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    char                    *reason;
    u_char                   ebuf[256];
    yajl_val                 root;
    ngx_int_t                rc;
    ngx_uint_t               syntax;
    ngx_http_omni_fields_t   f;

    if (endpoint != NGX_HTTP_OMNI_CHAT
        && endpoint != NGX_HTTP_OMNI_COMPLETIONS)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "omni parse called for endpoint %d", (int) endpoint);
        return NGX_ERROR;
    }

    ngx_memzero(req, sizeof(ngx_http_omni_req_t));
    ngx_memzero(&f, sizeof(ngx_http_omni_fields_t));

    reason = ngx_http_omni_prescan(body->data, body->len, &syntax);

    if (reason != NULL) {
        if (syntax) {
            return ngx_http_omni_bad_json(r, (u_char *) reason, err);
        }

        return ngx_http_omni_invalid(r, err, NULL, NULL, "%s", reason);
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

    rc = ngx_http_omni_check(r, endpoint, root, &f, req, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_engine_request(r, endpoint, root, &f, req, err);
    }

    yajl_tree_free(root);

    return rc;
}


/*
 * One pass over the raw bytes, tracking strings as the JSON lexer does.
 * Refuses a NUL byte (yajl_tree_parse takes a C string and would accept
 * the prefix before it), "\u0000" (tree strings carry no length), comments
 * (yajl_tree_parse allows them), nesting deeper than
 * NGX_HTTP_OMNI_MAX_DEPTH (yajl_tree_free recurses) and more than
 * NGX_HTTP_OMNI_MAX_NODES values (a tree node costs ~50-90 bytes for as
 * little as two input bytes). Unbalanced brackets are yajl's to report.
 * Returns NULL, or why; *syntax is set when the body is not JSON at all.
 */

static char *
ngx_http_omni_prescan(u_char *p, size_t len, ngx_uint_t *syntax)
{
    u_char      c;
    size_t      i, nodes;
    ngx_int_t   depth;
    ngx_uint_t  in_str, esc;

    nodes = 0;
    depth = 0;
    in_str = 0;
    esc = 0;
    *syntax = 1;

    for (i = 0; i < len; i++) {
        c = p[i];

        if (c == '\0') {
            return "a NUL byte";
        }

        if (in_str) {
            if (esc) {
                esc = 0;

                if (c == 'u' && len - i > 4
                    && ngx_strncmp(&p[i + 1], "0000", 4) == 0)
                {
                    *syntax = 0;
                    return "Strings in the request may not contain U+0000.";
                }

            } else if (c == '\\') {
                esc = 1;

            } else if (c == '"') {
                in_str = 0;
            }

            continue;
        }

        switch (c) {

        case '/':
            return "comments are not JSON";

        case '[':
        case '{':
            if (++depth > NGX_HTTP_OMNI_MAX_DEPTH) {
                *syntax = 0;
                return "The request JSON nests deeper than 64 levels.";
            }
            break;

        case ']':
        case '}':
            depth--;
            continue;

        case '"':
            in_str = 1;
            break;

        case ',':
        case ':':
            break;

        default:
            continue;
        }

        if (++nodes > NGX_HTTP_OMNI_MAX_NODES) {
            *syntax = 0;
            return "The request JSON has more than 262144 values.";
        }
    }

    return NULL;
}


/* yajl's tree of len bytes of pre-scanned JSON; NULL with ebuf set when
 * yajl refuses it, NULL with ebuf empty when out of memory. */

static yajl_val
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


static ngx_int_t
ngx_http_omni_check(ngx_http_request_t *r, ngx_http_omni_endpoint_e endpoint,
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

    rc = (endpoint == NGX_HTTP_OMNI_CHAT)
         ? ngx_http_omni_check_messages(r, root, f, err)
         : ngx_http_omni_check_prompt(r, root, f, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_stream(r, root, req, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_choices(r, endpoint, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_max_tokens(r, endpoint, root, f, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_output(r, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_tools(r, root, err);
    }

    if (rc == NGX_OK && endpoint == NGX_HTTP_OMNI_COMPLETIONS) {
        rc = ngx_http_omni_check_legacy(r, root, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_check_salt(r, root, f, err);
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
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
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

    if (f->max_tokens == 0 && endpoint == NGX_HTTP_OMNI_COMPLETIONS) {
        f->max_tokens = NGX_HTTP_OMNI_COMPLETIONS_MAX_TOKENS;
    }

    return NGX_OK;
}


/* One choice, no logprobs: n, logprobs, top_logprobs. */

static ngx_int_t
ngx_http_omni_check_choices(ngx_http_request_t *r,
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
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
            || (YAJL_IS_NUMBER(v) && endpoint == NGX_HTTP_OMNI_COMPLETIONS))
        {
            return ngx_http_omni_unsupported(r, err, "logprobs", NULL);
        }

        if (!YAJL_IS_FALSE(v)) {
            return ngx_http_omni_invalid_type(r, err, "logprobs",
                                              endpoint == NGX_HTTP_OMNI_CHAT
                                              ? "a boolean" : "an integer",
                                              v);
        }
    }

    v = ngx_http_omni_member(root, "top_logprobs");

    if (v != NULL && endpoint == NGX_HTTP_OMNI_CHAT) {
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
    ngx_http_omni_endpoint_e endpoint, yajl_val root,
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

    s = ngx_http_omni_gen_request(g, endpoint, root, f);

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

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni request: stream:%ui usage:%ui engine json:%uz",
                   (ngx_uint_t) req->stream, (ngx_uint_t) req->include_usage,
                   req->engine.len);

    return rc;
}


/*
 * {"model", "messages" | "prompt", "max_tokens", sampling fields as given,
 *  "cache_salt"}. The yajl_gen statuses are or-ed: yajl_gen_status_ok is
 * 0, so any failure leaves the result nonzero.
 */

static ngx_uint_t
ngx_http_omni_gen_request(yajl_gen g, ngx_http_omni_endpoint_e endpoint,
    yajl_val root, ngx_http_omni_fields_t *f)
{
    yajl_val     v;
    ngx_uint_t   i, s;

    s = yajl_gen_map_open(g);

    s |= ngx_http_omni_gen_str(g, "model");
    s |= ngx_http_omni_gen_value(g, f->model);

    if (endpoint == NGX_HTTP_OMNI_CHAT) {
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


/* A tree value as it came; recursion is bounded by the pre-scan's depth
 * limit, below yajl_gen's YAJL_MAX_DEPTH. */

static ngx_uint_t
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


static ngx_uint_t
ngx_http_omni_gen_str(yajl_gen g, const char *s)
{
    return yajl_gen_string(g, (const unsigned char *) s, ngx_strlen(s));
}


/* ---- tree helpers and errors ---- */

/* The value of key in object o, the last one when repeated (as
 * JSON.parse does); NULL when absent or null. */

static yajl_val
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


/* ---- response bodies ---- */

ngx_buf_t *
ngx_http_omni_error_json(ngx_http_request_t *r, ngx_http_omni_error_t *err)
{
    ngx_buf_t  *b;

    b = ngx_create_temp_buf(r->pool, ngx_http_omni_error_len(err) + 1);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_http_omni_error_write(b->last, err);
    *b->last++ = '\n';
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


ngx_buf_t *
ngx_http_omni_error_event(ngx_http_request_t *r, ngx_http_omni_error_t *err)
{
    size_t      size;
    ngx_buf_t  *b;

    size = sizeof("data: \n\n") - 1 + ngx_http_omni_error_len(err);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    b->last = ngx_http_omni_error_write(b->last, err);
    *b->last++ = '\n';
    *b->last++ = '\n';
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/*
 * Completions have no role chunk: for them this returns an empty buffer,
 * marked sync so that sending it anyway is harmless (callers may skip it
 * when b->pos == b->last). NULL means out of memory, for both endpoints.
 */

ngx_buf_t *
ngx_http_omni_chunk_role(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_buf_t  *b;
    ngx_str_t   post = ngx_null_string;
    ngx_str_t   pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                 "{\"role\":\"assistant\",\"content\":\"\","
                                 "\"refusal\":null},\"logprobs\":null,"
                                 "\"finish_reason\":null}]");

    if (ctx->endpoint == NGX_HTTP_OMNI_CHAT) {
        return ngx_http_omni_event(r, ctx, &pre, NULL, 0, &post, 1);
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NULL;
    }

    b->sync = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


ngx_buf_t *
ngx_http_omni_chunk_text(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    u_char *text, size_t len)
{
    ngx_str_t  chat_pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                     "{\"content\":\"");
    ngx_str_t  chat_post = ngx_string("\"},\"logprobs\":null,"
                                      "\"finish_reason\":null}]");
    ngx_str_t  text_pre = ngx_string("\"choices\":[{\"text\":\"");
    ngx_str_t  text_post = ngx_string("\",\"index\":0,\"logprobs\":null,"
                                      "\"finish_reason\":null}]");

    if (ctx->endpoint == NGX_HTTP_OMNI_CHAT) {
        return ngx_http_omni_event(r, ctx, &chat_pre, text, len, &chat_post,
                                   1);
    }

    return ngx_http_omni_event(r, ctx, &text_pre, text, len, &text_post, 1);
}


ngx_buf_t *
ngx_http_omni_chunk_finish(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t   reason;
    ngx_str_t   post = ngx_string("\"}]");
    ngx_str_t   chat_pre = ngx_string("\"choices\":[{\"index\":0,\"delta\":"
                                      "{},\"logprobs\":null,"
                                      "\"finish_reason\":\"");
    ngx_str_t   text_pre = ngx_string("\"choices\":[{\"text\":\"\","
                                      "\"index\":0,\"logprobs\":null,"
                                      "\"finish_reason\":\"");

    reason = ngx_http_omni_finish(ctx);

    return ngx_http_omni_event(r, ctx,
                               (ctx->endpoint == NGX_HTTP_OMNI_CHAT)
                               ? &chat_pre : &text_pre,
                               reason.data, reason.len, &post, 1);
}


/* Built whether or not include_usage was asked: the caller decides. */

ngx_buf_t *
ngx_http_omni_chunk_usage(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char     *p;
    ngx_str_t   usage;
    ngx_str_t   pre = ngx_string("\"choices\":[],\"usage\":");

    p = ngx_pnalloc(r->pool, NGX_HTTP_OMNI_USAGE_LEN);
    if (p == NULL) {
        return NULL;
    }

    usage.data = p;
    usage.len = ngx_sprintf(p, NGX_HTTP_OMNI_USAGE_FMT,
                            ctx->usage.prompt_tokens,
                            ctx->usage.completion_tokens,
                            (uint64_t) ctx->usage.prompt_tokens
                            + ctx->usage.completion_tokens,
                            ctx->usage.cached_tokens)
                - p;

    return ngx_http_omni_event(r, ctx, &pre, NULL, 0, &usage, 0);
}


ngx_buf_t *
ngx_http_omni_chunk_done(ngx_http_request_t *r)
{
    ngx_buf_t  *b;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NULL;
    }

    b->pos = (u_char *) "data: [DONE]\n\n";
    b->last = b->pos + sizeof("data: [DONE]\n\n") - 1;
    b->memory = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/*
 * chat.completion:
 *   {"id","object","created","model","choices":[{"index":0,"message":
 *   {"role":"assistant","content":TEXT,"refusal":null,"annotations":[]},
 *   "logprobs":null,"finish_reason":R}],"usage":{...}}\n
 * text_completion:
 *   {... "choices":[{"text":TEXT,"index":0,"logprobs":null,
 *   "finish_reason":R}],"usage":{...}}\n
 */

ngx_buf_t *
ngx_http_omni_completion_json(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char      *text;
    size_t       len, size;
    ngx_str_t   *pre, *post, *object, reason;
    ngx_buf_t   *b;
    ngx_str_t    chat_object = ngx_string("chat.completion");
    ngx_str_t    chat_pre = ngx_string("\"choices\":[{\"index\":0,"
                                       "\"message\":{\"role\":"
                                       "\"assistant\",\"content\":\"");
    ngx_str_t    chat_post = ngx_string("\",\"refusal\":null,"
                                        "\"annotations\":[]},"
                                        "\"logprobs\":null,"
                                        "\"finish_reason\":\"");
    ngx_str_t    text_object = ngx_string("text_completion");
    ngx_str_t    text_pre = ngx_string("\"choices\":[{\"text\":\"");
    ngx_str_t    text_post = ngx_string("\",\"index\":0,\"logprobs\":null,"
                                        "\"finish_reason\":\"");

    if (ctx->endpoint == NGX_HTTP_OMNI_CHAT) {
        object = &chat_object;
        pre = &chat_pre;
        post = &chat_post;

    } else {
        object = &text_object;
        pre = &text_pre;
        post = &text_post;
    }

    text = ngx_http_omni_text(r, ctx, &len);
    if (text == NULL && len > 0) {
        return NULL;
    }

    reason = ngx_http_omni_finish(ctx);

    size = ngx_http_omni_head_len(ctx, object) + pre->len
           + ngx_http_omni_escape_len(text, len) + post->len + reason.len
           + sizeof("\"}],\"usage\":}\n") - 1 + NGX_HTTP_OMNI_USAGE_LEN;

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_http_omni_head(b->last, ctx, object);
    b->last = ngx_cpymem(b->last, pre->data, pre->len);
    b->last = ngx_http_omni_escape(b->last, text, len);
    b->last = ngx_cpymem(b->last, post->data, post->len);
    b->last = ngx_cpymem(b->last, reason.data, reason.len);
    b->last = ngx_cpymem(b->last, "\"}],\"usage\":",
                         sizeof("\"}],\"usage\":") - 1);
    b->last = ngx_sprintf(b->last, NGX_HTTP_OMNI_USAGE_FMT,
                          ctx->usage.prompt_tokens,
                          ctx->usage.completion_tokens,
                          (uint64_t) ctx->usage.prompt_tokens
                          + ctx->usage.completion_tokens,
                          ctx->usage.cached_tokens);
    *b->last++ = '}';
    *b->last++ = '\n';
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


/*
 * One SSE event: "data: " head pre escaped(text) post
 * [,"usage":null] "}\n\n". The head (id, object, created, model) is the
 * same in every chunk of a response; usage_null adds "usage":null when
 * the client asked for include_usage.
 */

static ngx_buf_t *
ngx_http_omni_event(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *pre, u_char *text, size_t len, ngx_str_t *post,
    ngx_uint_t usage_null)
{
    size_t      size;
    ngx_buf_t  *b;
    ngx_str_t  *object;
    ngx_str_t   chunk = ngx_string("chat.completion.chunk");
    ngx_str_t   completion = ngx_string("text_completion");

    object = (ctx->endpoint == NGX_HTTP_OMNI_CHAT) ? &chunk : &completion;
    usage_null = usage_null && ctx->req.include_usage;

    size = sizeof("data: ") - 1 + ngx_http_omni_head_len(ctx, object)
           + pre->len + ngx_http_omni_escape_len(text, len) + post->len
           + (usage_null ? sizeof(",\"usage\":null") - 1 : 0)
           + sizeof("}\n\n") - 1;

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    b->last = ngx_http_omni_head(b->last, ctx, object);
    b->last = ngx_cpymem(b->last, pre->data, pre->len);
    b->last = ngx_http_omni_escape(b->last, text, len);

    if (post->len) {
        b->last = ngx_cpymem(b->last, post->data, post->len);
    }

    if (usage_null) {
        b->last = ngx_cpymem(b->last, ",\"usage\":null",
                             sizeof(",\"usage\":null") - 1);
    }

    b->last = ngx_cpymem(b->last, "}\n\n", sizeof("}\n\n") - 1);
    b->tag = (ngx_buf_tag_t) &ngx_http_omni_module;

    return b;
}


static size_t
ngx_http_omni_head_len(ngx_http_omni_ctx_t *ctx, ngx_str_t *object)
{
    return sizeof("{\"id\":\"\",\"object\":\"\",\"created\":,\"model\":\"\",")
           - 1 + ngx_http_omni_escape_len(ctx->id.data, ctx->id.len)
           + object->len + NGX_TIME_T_LEN
           + ngx_http_omni_escape_len(ctx->req.model.data,
                                      ctx->req.model.len);
}


/* {"id":ID,"object":OBJECT,"created":N,"model":MODEL,  (open object) */

static u_char *
ngx_http_omni_head(u_char *p, ngx_http_omni_ctx_t *ctx, ngx_str_t *object)
{
    p = ngx_cpymem(p, "{\"id\":\"", sizeof("{\"id\":\"") - 1);
    p = ngx_http_omni_escape(p, ctx->id.data, ctx->id.len);
    p = ngx_sprintf(p, "\",\"object\":\"%V\",\"created\":%T,\"model\":\"",
                    object, ctx->created);
    p = ngx_http_omni_escape(p, ctx->req.model.data, ctx->req.model.len);
    *p++ = '"';
    *p++ = ',';

    return p;
}


static ngx_str_t
ngx_http_omni_finish(ngx_http_omni_ctx_t *ctx)
{
    ngx_str_t  stop = ngx_string("stop");
    ngx_str_t  length = ngx_string("length");

    return (ctx->usage.finish == OMNI_FINISH_LENGTH) ? length : stop;
}


/* The text gathered for a non-streaming answer, contiguous: escaping
 * needs whole UTF-8 characters, and a chain may split one. */

static u_char *
ngx_http_omni_text(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    size_t *len)
{
    u_char       *p, *text;
    size_t        n;
    ngx_chain_t  *cl;

    n = 0;

    for (cl = ctx->text; cl; cl = cl->next) {
        n += cl->buf->last - cl->buf->pos;
    }

    *len = n;

    if (n == 0) {
        return NULL;
    }

    if (ctx->text->next == NULL) {
        return ctx->text->buf->pos;
    }

    text = ngx_pnalloc(r->pool, n);
    if (text == NULL) {
        return NULL;
    }

    p = text;

    for (cl = ctx->text; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    return text;
}


/* {"error":{"message":M,"type":T,"param":P|null,"code":C|null}} */

static size_t
ngx_http_omni_error_len(ngx_http_omni_error_t *err)
{
    return sizeof("{\"error\":{\"message\":\"\",\"type\":\"\","
                  "\"param\":null,\"code\":null}}") - 1
           + ngx_http_omni_escape_len(err->message.data, err->message.len)
           + sizeof("invalid_request_error") - 1
           + ngx_http_omni_escape_len(err->type.data, err->type.len)
           + ngx_http_omni_escape_len(err->param.data, err->param.len)
           + ngx_http_omni_escape_len(err->code.data, err->code.len);
}


static u_char *
ngx_http_omni_error_write(u_char *p, ngx_http_omni_error_t *err)
{
    p = ngx_cpymem(p, "{\"error\":{\"message\":\"",
                   sizeof("{\"error\":{\"message\":\"") - 1);
    p = ngx_http_omni_escape(p, err->message.data, err->message.len);
    p = ngx_cpymem(p, "\",\"type\":\"", sizeof("\",\"type\":\"") - 1);

    if (err->type.len) {
        p = ngx_http_omni_escape(p, err->type.data, err->type.len);

    } else if (err->status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
        p = ngx_cpymem(p, "server_error", sizeof("server_error") - 1);

    } else {
        p = ngx_cpymem(p, "invalid_request_error",
                       sizeof("invalid_request_error") - 1);
    }

    p = ngx_cpymem(p, "\",\"param\":", sizeof("\",\"param\":") - 1);

    if (err->param.len) {
        *p++ = '"';
        p = ngx_http_omni_escape(p, err->param.data, err->param.len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    p = ngx_cpymem(p, ",\"code\":", sizeof(",\"code\":") - 1);

    if (err->code.len) {
        *p++ = '"';
        p = ngx_http_omni_escape(p, err->code.data, err->code.len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    return ngx_cpymem(p, "}}", sizeof("}}") - 1);
}


/* ---- engine replies ---- */

ngx_int_t
ngx_http_omni_engine_error(u_char *p, size_t len, ngx_http_omni_error_t *err)
{
    OmniError  e;

    if (omni_error_decode(&e, p, len) != 0) {
        return NGX_ERROR;
    }

    err->status = e.status;

    err->type.data = (u_char *) e.type;
    err->type.len = e.type_len;

    if (err->type.len == 0) {
        if (err->status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
            ngx_str_set(&err->type, "server_error");

        } else {
            ngx_str_set(&err->type, "invalid_request_error");
        }
    }

    err->param.data = (u_char *) e.param;
    err->param.len = e.param_len;
    err->code.data = (u_char *) e.code;
    err->code.len = e.code_len;
    err->message.data = (u_char *) e.message;
    err->message.len = e.message_len;

    return NGX_OK;
}


/*
 * The engine's {"data":[{"id","created","owned_by","max_model_len"}]}
 * becomes {"object":"list","data":[{"id","object":"model","created",
 * "owned_by"}]}\n, or for NGX_HTTP_OMNI_MODEL the one model object whose
 * id is ctx->model_id. A reply that is not that shape is the engine's
 * fault: logged, NGX_ERROR.
 */

ngx_int_t
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

    if (ctx->endpoint == NGX_HTTP_OMNI_MODEL) {
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


/* ---- JSON string escaping ---- */

/* The length of the valid UTF-8 sequence at p (1..4), 0 when invalid:
 * overlong forms, surrogates and code points above U+10FFFF are. */

static size_t
ngx_http_omni_utf8(u_char *p, u_char *last)
{
    u_char  c, lo, hi;
    size_t  i, n;

    c = p[0];

    if (c < 0x80) {
        return 1;
    }

    lo = 0x80;
    hi = 0xbf;

    if (c < 0xc2) {
        return 0;

    } else if (c < 0xe0) {
        n = 2;

    } else if (c < 0xf0) {
        n = 3;
        lo = (c == 0xe0) ? 0xa0 : 0x80;
        hi = (c == 0xed) ? 0x9f : 0xbf;

    } else if (c < 0xf5) {
        n = 4;
        lo = (c == 0xf0) ? 0x90 : 0x80;
        hi = (c == 0xf4) ? 0x8f : 0xbf;

    } else {
        return 0;
    }

    if ((size_t) (last - p) < n || p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 2; i < n; i++) {
        if (p[i] < 0x80 || p[i] > 0xbf) {
            return 0;
        }
    }

    return n;
}


/* Bytes s takes inside a JSON string: '"' '\\' and control characters
 * escaped, valid UTF-8 as it is, each invalid byte as U+FFFD. */

static size_t
ngx_http_omni_escape_len(u_char *s, size_t len)
{
    size_t   n, k;
    u_char  *p, *last;

    n = 0;
    last = s + len;

    for (p = s; p < last; /* void */) {

        if (*p >= 0x80) {
            k = ngx_http_omni_utf8(p, last);
            n += k ? k : 3;
            p += k ? k : 1;
            continue;
        }

        switch (*p) {
        case '"':
        case '\\':
        case '\n':
        case '\r':
        case '\t':
        case '\b':
        case '\f':
            n += 2;
            break;

        default:
            n += (*p < 0x20) ? sizeof("\\u0000") - 1 : 1;
        }

        p++;
    }

    return n;
}


static u_char *
ngx_http_omni_escape(u_char *dst, u_char *s, size_t len)
{
    size_t   k;
    u_char  *p, *last;

    static const u_char  hex[] = "0123456789abcdef";

    last = s + len;

    for (p = s; p < last; /* void */) {

        if (*p >= 0x80) {
            k = ngx_http_omni_utf8(p, last);

            if (k == 0) {
                *dst++ = 0xef; *dst++ = 0xbf; *dst++ = 0xbd;
                p++;
                continue;
            }

            dst = ngx_cpymem(dst, p, k);
            p += k;
            continue;
        }

        switch (*p) {
        case '"':  *dst++ = '\\'; *dst++ = '"'; break;
        case '\\': *dst++ = '\\'; *dst++ = '\\'; break;
        case '\n': *dst++ = '\\'; *dst++ = 'n'; break;
        case '\r': *dst++ = '\\'; *dst++ = 'r'; break;
        case '\t': *dst++ = '\\'; *dst++ = 't'; break;
        case '\b': *dst++ = '\\'; *dst++ = 'b'; break;
        case '\f': *dst++ = '\\'; *dst++ = 'f'; break;

        default:
            if (*p < 0x20) {
                dst = ngx_cpymem(dst, "\\u00", sizeof("\\u00") - 1);
                *dst++ = hex[*p >> 4];
                *dst++ = hex[*p & 0xf];

            } else {
                *dst++ = *p;
            }
        }

        p++;
    }

    return dst;
}

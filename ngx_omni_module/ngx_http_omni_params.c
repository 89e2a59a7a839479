
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_params.c -- the checks of a request body's fields other
 * than its input (n, logprobs, max tokens, modalities, tools,
 * response_format, the legacy completions fields, reasoning_effort and
 * chat_template_kwargs, prompt_cache_key, seed), and the words of every 400 a body gets: one sentence per kind
 * of mistake, the parameter named as OpenAI names it, the client's bytes
 * quoted at most NGX_HTTP_OMNI_CLIP of them. Apart from
 * ngx_http_omni_request.c so that it holds the way a body goes, and this
 * what each field may say. No I/O.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_request.h"


#define NGX_HTTP_OMNI_MAX_SALT      256         /* engine's REQ_MAX_SALT,
                                                   less a tenant's name */
#define NGX_HTTP_OMNI_CLIP          40          /* client bytes quoted */
#define NGX_HTTP_OMNI_MSG_MAX       512         /* one error message */

/* OpenAI's default for /v1/completions */
#define NGX_HTTP_OMNI_COMPLETIONS_MAX_TOKENS  16


static ngx_int_t ngx_http_omni_check_int(ngx_http_request_t *r,
    char *param, yajl_val v, int64_t min, int64_t *out,
    ngx_http_omni_error_t *err);
static size_t ngx_http_omni_clip(const char *s, char **more);


/* max_completion_tokens wins over max_tokens; both must be integers >= 1
 * when given. */

ngx_int_t
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

ngx_int_t
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


/* Text out, or text and audio (ngx_http_omni_check_chat_audio()):
 * modalities, audio, response_format. */

ngx_int_t
ngx_http_omni_check_output(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    char        *param, *more;
    size_t       i, n;
    yajl_val     v, m;
    ngx_int_t    rc;
    ngx_uint_t   audio;

    audio = 0;

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
            audio = 1;
            continue;
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

    rc = ngx_http_omni_check_chat_audio(r, root, audio, f, req, err);
    if (rc != NGX_OK) {
        return rc;
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
}


/* No tool calling: tools/functions empty, tool_choice/function_call
 * "none". */

ngx_int_t
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

ngx_int_t
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


/*
 * Thinking off: reasoning_effort "none" (OpenAI's field), or
 * chat_template_kwargs.enable_thinking false (vLLM's and llama-server's).
 * Either turns it off; the engine's "thinking" then renders a thinking
 * template's prompt so (engine/llm/chat.h). Templates that do not think
 * ignore it, as they ignore the other efforts. Other template kwargs are
 * ignored.
 */

ngx_int_t
ngx_http_omni_check_thinking(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
{
    char        *more;
    size_t       n;
    yajl_val     v, kw;
    ngx_uint_t   i;

    static const char  *efforts[] = {
        "none", "minimal", "low", "medium", "high", "xhigh", NULL
    };

    v = ngx_http_omni_member(root, "reasoning_effort");

    if (v != NULL) {
        if (!YAJL_IS_STRING(v)) {
            return ngx_http_omni_invalid_type(r, err, "reasoning_effort",
                                              "a string", v);
        }

        for (i = 0; efforts[i] != NULL; i++) {
            if (ngx_strcmp(v->u.string, efforts[i]) == 0) {
                break;
            }
        }

        if (efforts[i] == NULL) {
            n = ngx_http_omni_clip(v->u.string, &more);

            return ngx_http_omni_invalid(r, err, "reasoning_effort",
                                         "invalid_value",
                                         "Invalid value: '%*s%s'. Supported "
                                         "values are: 'none', 'minimal', "
                                         "'low', 'medium', 'high' and "
                                         "'xhigh'.", n, v->u.string, more);
        }

        if (i == 0) {
            f->no_think = 1;
        }
    }

    kw = ngx_http_omni_member(root, "chat_template_kwargs");

    if (kw == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_OBJECT(kw)) {
        return ngx_http_omni_invalid_type(r, err, "chat_template_kwargs",
                                          "an object", kw);
    }

    v = ngx_http_omni_member(kw, "enable_thinking");

    if (v == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v)) {
        return ngx_http_omni_invalid_type(r, err,
                                          "chat_template_kwargs"
                                          ".enable_thinking",
                                          "a boolean", v);
    }

    if (YAJL_IS_FALSE(v)) {
        f->no_think = 1;
    }

    return NGX_OK;
}


/* prompt_cache_key becomes the engine's cache_salt: requests share
 * cached prefixes only when their keys are equal. "" means none. With
 * omni_api_keys on, each API key is a tenant: its name ("key-" and 16 hex
 * digits of the key's SHA-1) goes first, so that two keys never share a
 * cached prefix (whose hits show in usage.cached_tokens and in the time
 * to first token) nor a routing key, whatever prompt_cache_key says. */

ngx_int_t
ngx_http_omni_check_salt(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err)
{
    u_char                    *p, tenant[NGX_HTTP_OMNI_TENANT_LEN];
    size_t                     len;
    yajl_val                   v;
    ngx_uint_t                 tenancy;
    ngx_http_omni_loc_conf_t  *olcf;

    ngx_str_null(&f->salt);

    v = ngx_http_omni_member(root, "prompt_cache_key");

    len = 0;

    if (v != NULL) {
        if (!YAJL_IS_STRING(v)) {
            return ngx_http_omni_invalid_type(r, err, "prompt_cache_key",
                                              "a string", v);
        }

        len = ngx_strlen(v->u.string);

        if (len > NGX_HTTP_OMNI_MAX_SALT) {
            return ngx_http_omni_invalid(r, err, "prompt_cache_key",
                                         "string_above_max_length",
                                         "Invalid 'prompt_cache_key': string "
                                         "too long. Expected a string with "
                                         "maximum length %d, but got a "
                                         "string with length %uz instead.",
                                         NGX_HTTP_OMNI_MAX_SALT, len);
        }
    }

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    tenancy = (ngx_http_omni_tenant(r, olcf, tenant) == NGX_OK);

    if (!tenancy && len == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, NGX_HTTP_OMNI_TENANT_LEN + 1 + len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    f->salt.data = p;

    if (tenancy) {
        p = ngx_cpymem(p, tenant, NGX_HTTP_OMNI_TENANT_LEN);

        if (len) {
            *p++ = ':';
        }
    }

    p = ngx_cpymem(p, v ? v->u.string : "", len);

    f->salt.len = p - f->salt.data;

    return NGX_OK;
}


/*
 * seed: an integer >= 0, or, when absent, a fresh one (omni_seed_draw),
 * so that each request without one samples afresh as OpenAI's do.
 */

ngx_int_t
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

ngx_int_t
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


/* ---- tree helpers and errors ---- */

char *
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

char *
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

ngx_int_t
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

ngx_int_t
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


ngx_int_t
ngx_http_omni_invalid_type(ngx_http_request_t *r, ngx_http_omni_error_t *err,
    char *param, char *want, yajl_val v)
{
    return ngx_http_omni_invalid(r, err, param, "invalid_type",
                                 "Invalid type for '%s': expected %s, but "
                                 "got %s instead.",
                                 param, want, ngx_http_omni_type(v));
}


/* why NULL: the parameter itself is not supported. */

ngx_int_t
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

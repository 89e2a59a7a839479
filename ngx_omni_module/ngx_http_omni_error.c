
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_error.c -- every OpenAI error the module makes of the
 * engine's answers and failures, and of nginx's own error pages, in one
 * place: the error type a status defaults to, the engine's failures
 * (down, gone, late, invalid, cut short, failed) by ngx_http_omni_fault_e,
 * the engine's ERROR frame, the words for an nginx error page, and the
 * one Retry-After rule. The client's own mistakes are worded where they
 * are found (ngx_http_omni_module.c, ngx_http_omni_request.c); how an
 * error is written out is ngx_http_omni_openai.c's. No I/O.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"


/*
 * The engine's failures, by ngx_http_omni_fault_e: the only place their
 * words are written. All are server_error; a 503 code engine_unavailable
 * tells a client to try again (Retry-After), the others have no code.
 */

typedef struct {
    ngx_uint_t                  status;
    ngx_str_t                   code;
    ngx_str_t                   message;
} ngx_http_omni_fault_t;


static ngx_http_omni_fault_t
    ngx_http_omni_faults[NGX_HTTP_OMNI_ENGINE_FAULTS] = {

    /* NGX_HTTP_OMNI_ENGINE_DOWN */
    { NGX_HTTP_SERVICE_UNAVAILABLE,
      ngx_string("engine_unavailable"),
      ngx_string("The engine is not available, please try again later.") },

    /* NGX_HTTP_OMNI_ENGINE_GONE */
    { NGX_HTTP_SERVICE_UNAVAILABLE,
      ngx_string("engine_unavailable"),
      ngx_string("The engine closed the connection before its answer was "
                 "complete, please try again later.") },

    /* NGX_HTTP_OMNI_ENGINE_TIMEOUT */
    { NGX_HTTP_GATEWAY_TIME_OUT,
      ngx_null_string,
      ngx_string("The engine did not answer in time.") },

    /* NGX_HTTP_OMNI_ENGINE_INVALID */
    { NGX_HTTP_BAD_GATEWAY,
      ngx_null_string,
      ngx_string("The engine sent an invalid response.") },

    /* NGX_HTTP_OMNI_ENGINE_CUT */
    { NGX_HTTP_BAD_GATEWAY,
      ngx_null_string,
      ngx_string("The engine closed the stream before the end.") },

    /* NGX_HTTP_OMNI_ENGINE_FAILED */
    { NGX_HTTP_BAD_GATEWAY,
      ngx_null_string,
      ngx_string("The engine failed during the stream.") }
};


static ngx_str_t  ngx_http_omni_server_error = ngx_string("server_error");
static ngx_str_t  ngx_http_omni_invalid_request =
    ngx_string("invalid_request_error");

static ngx_str_t  ngx_http_omni_retry_key = ngx_string("Retry-After");
static ngx_str_t  ngx_http_omni_retry_value = ngx_string("1");


/* The type of an error that names none: the server's fault from 500 up,
 * the client's below. */

ngx_str_t *
ngx_http_omni_error_type(ngx_uint_t status)
{
    return status >= NGX_HTTP_INTERNAL_SERVER_ERROR
           ? &ngx_http_omni_server_error : &ngx_http_omni_invalid_request;
}


void
ngx_http_omni_engine_fault(ngx_http_omni_fault_e fault,
    ngx_http_omni_error_t *err)
{
    ngx_http_omni_fault_t  *f;

    f = &ngx_http_omni_faults[fault];

    err->status = f->status;
    err->type = ngx_http_omni_server_error;
    ngx_str_null(&err->param);
    err->code = f->code;
    err->message = f->message;
}


ngx_int_t
ngx_http_omni_retry_after(ngx_http_request_t *r, ngx_uint_t status)
{
    if (status != NGX_HTTP_SERVICE_UNAVAILABLE) {
        return NGX_OK;
    }

    return ngx_http_omni_add_header(r, &ngx_http_omni_retry_key,
                                    &ngx_http_omni_retry_value);
}


/* An engine ERROR payload (omni_proto.h): its fields are views into p;
 * the engine may leave the type to us. */

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
        err->type = *ngx_http_omni_error_type(err->status);
    }

    err->param.data = (u_char *) e.param;
    err->param.len = e.param_len;
    err->code.data = (u_char *) e.code;
    err->code.len = e.code_len;
    err->message.data = (u_char *) e.message;
    err->message.len = e.message_len;

    return NGX_OK;
}


/* An error page nginx made, as an OpenAI error. */

void
ngx_http_omni_status_error(ngx_uint_t status, ngx_http_omni_error_t *err)
{
    err->status = status;
    err->type = *ngx_http_omni_error_type(status);

    switch (status) {

    case NGX_HTTP_BAD_REQUEST:
        ngx_str_set(&err->message, "The request could not be read.");
        break;

    case NGX_HTTP_UNAUTHORIZED:
    case NGX_HTTP_FORBIDDEN:
        ngx_str_set(&err->message, "Access denied.");
        break;

    case NGX_HTTP_NOT_FOUND:
        ngx_str_set(&err->message, "Not found.");
        break;

    case NGX_HTTP_NOT_ALLOWED:
        ngx_str_set(&err->message, "Method not allowed.");
        break;

    case NGX_HTTP_REQUEST_TIME_OUT:
        ngx_str_set(&err->message, "The request was not received in time.");
        break;

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        ngx_str_set(&err->message,
                    "The request body is too large "
                    "(client_max_body_size).");
        break;

    case NGX_HTTP_TOO_MANY_REQUESTS:
        ngx_str_set(&err->type, "requests");
        ngx_str_set(&err->code, "rate_limit_exceeded");
        ngx_str_set(&err->message, "Too many requests.");
        break;

    case NGX_HTTP_BAD_GATEWAY:
    case NGX_HTTP_SERVICE_UNAVAILABLE:
        ngx_http_omni_engine_fault(NGX_HTTP_OMNI_ENGINE_DOWN, err);
        break;

    case NGX_HTTP_GATEWAY_TIME_OUT:
        ngx_http_omni_engine_fault(NGX_HTTP_OMNI_ENGINE_TIMEOUT, err);
        break;

    default:
        if (status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
            ngx_str_set(&err->message, "The server had an internal error.");

        } else {
            ngx_str_set(&err->message, "The request was refused.");
        }

        break;
    }
}

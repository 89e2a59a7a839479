
/*
 * ngx_http_omni_module.h -- what the files of ngx_omni_module share.
 *
 *   ngx_http_omni_module.c    directives, configuration, the content
 *                             handler: method and URI dispatch, API keys,
 *                             request body, then the upstream (omni_pass)
 *   ngx_http_omni_request.c   OpenAI request bodies in: validated,
 *                             normalized into the engine's request JSON
 *   ngx_http_omni_upstream.c  upstream callbacks: the REQUEST or control
 *                             frame out, engine frames in (omni_proto.h),
 *                             turned into responses by the two below
 *   ngx_http_omni_openai.c    OpenAI JSON out: response bodies, SSE
 *                             chunks, errors, model lists
 *   ngx_http_omni_stream.c    unbuffered output: one event, one flush,
 *                             event buffers recycled; the idle keep-alive
 *                             comment
 *   ngx_http_omni_metrics.c   counters in shared memory (all workers),
 *                             omni_metrics and omni_health handlers
 *   ngx_omni_engine_module.c  CORE module: omni_engine, the sidecar that
 *                             nginx's master starts and keeps alive
 *
 * The wire protocol is ../engine/proto/omni_proto.h, included as it is.
 */


#ifndef _NGX_HTTP_OMNI_MODULE_H_INCLUDED_
#define _NGX_HTTP_OMNI_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "json_scan.h"
#include "omni_proto.h"


typedef enum {
    NGX_HTTP_OMNI_CHAT = 0,         /* POST /v1/chat/completions */
    NGX_HTTP_OMNI_COMPLETIONS,      /* POST /v1/completions */
    NGX_HTTP_OMNI_MODELS,           /* GET /v1/models */
    NGX_HTTP_OMNI_MODEL,            /* GET /v1/models/{id} */
    NGX_HTTP_OMNI_HEALTH,           /* omni_health location */
    NGX_HTTP_OMNI_METRICS,          /* omni_metrics location */
    NGX_HTTP_OMNI_SPEECH,           /* POST /v1/audio/speech: not built
                                       yet, answered 501 */
    NGX_HTTP_OMNI_ENDPOINTS
} ngx_http_omni_endpoint_e;


/* An OpenAI error, ready to be sent as JSON (before the response header)
 * or as an SSE error event (after it). Empty param/code are JSON null. */
typedef struct {
    ngx_uint_t                  status;
    ngx_str_t                   type;       /* "invalid_request_error" ... */
    ngx_str_t                   param;
    ngx_str_t                   code;
    ngx_str_t                   message;
} ngx_http_omni_error_t;


/* How the engine itself failed a request, as opposed to an ERROR frame
 * it sent: each has one OpenAI error (ngx_http_omni_engine_fault()). */
typedef enum {
    NGX_HTTP_OMNI_ENGINE_DOWN = 0,  /* 503: not reached */
    NGX_HTTP_OMNI_ENGINE_GONE,      /* 503: took the request, then closed */
    NGX_HTTP_OMNI_ENGINE_TIMEOUT,   /* 504: did not answer in time */
    NGX_HTTP_OMNI_ENGINE_INVALID,   /* 502: sent a frame it should not */
    NGX_HTTP_OMNI_ENGINE_CUT,       /* 502: closed a stream before DONE */
    NGX_HTTP_OMNI_ENGINE_FAILED,    /* 502: failed during a stream */
    NGX_HTTP_OMNI_ENGINE_FAULTS
} ngx_http_omni_fault_e;


/* What the OpenAI request body said, once parsed. */
typedef struct {
    ngx_str_t                   model;      /* as the client named it */
    ngx_str_t                   engine;     /* the request JSON for the
                                               engine (engine/request/request.h) */
    ngx_str_t                   seed;       /* decimal: the client's, or
                                               the one drawn for it */
    unsigned                    stream:1;
    unsigned                    include_usage:1;
} ngx_http_omni_req_t;


/* Per-request state. */
typedef struct {
    ngx_http_omni_endpoint_e    endpoint;
    ngx_http_omni_req_t         req;
    ngx_str_t                   model_id;   /* GET /v1/models/{id},
                                               URL-decoded */
    ngx_str_t                   id;         /* "chatcmpl-<request id>" or
                                               "cmpl-..." */
    time_t                      created;
    ngx_str_t                   request_id; /* $request_id, x-request-id */

    /* frame parsing state, upstream side */
    u_char                      hdr[OMNI_FRAME_HDR];
    size_t                      hdr_got;
    OmniFrameHdr                frame;
    ngx_buf_t                  *payload;    /* the frame being read, when
                                               it spans reads; reused */
    size_t                      payload_got;

    /* response state */
    unsigned                    header_sent:1;  /* HTTP header out */
    unsigned                    role_sent:1;    /* first chat chunk out */
    unsigned                    done:1;         /* DONE or ERROR seen */
    ngx_chain_t                *text;           /* non-streaming: text
                                                   gathered so far */
    ngx_chain_t                *text_last;      /* its last link */
    size_t                      text_len;
    OmniDone                    usage;
    ngx_chain_t                *out;            /* a whole body, made
                                                   before the header */
    ngx_chain_t                *free;           /* event buffers, sent */
    ngx_chain_t                *busy;           /* event buffers, being
                                                   sent */
    ngx_event_t                 keepalive;      /* idle SSE comment timer */

    /* an error page of nginx's, replaced by JSON (stream.c filters) */
    ngx_http_omni_error_t       err;            /* what the module knows
                                                   about it; status 0:
                                                   nothing */
    ngx_chain_t                *page;           /* the replacement body */
} ngx_http_omni_ctx_t;


typedef struct {
    ngx_http_upstream_conf_t    upstream;
    ngx_http_complex_value_t   *complex_pass;   /* omni_pass with variables,
                                                   unused: NULL */
    ngx_flag_t                  enabled;        /* the content handler here
                                                   is the module's */
    ngx_http_omni_endpoint_e    handler;        /* omni_health/omni_metrics
                                                   locations, else
                                                   NGX_HTTP_OMNI_ENDPOINTS */
    ngx_msec_t                  keepalive_interval;
                                                /* omni_keepalive_interval */
    ngx_msec_t                  health_timeout; /* omni_health_timeout */
    ngx_array_t                *api_keys;       /* of ngx_str_t, or NULL */
    ngx_str_t                   api_keys_file;
} ngx_http_omni_loc_conf_t;


typedef struct {
    ngx_shm_zone_t             *shm_zone;       /* the module's counters,
                                                   NULL until a location
                                                   uses the module */
    ngx_int_t                   request_id;     /* $request_id's index */
} ngx_http_omni_main_conf_t;


extern ngx_module_t  ngx_http_omni_module;


/* ngx_http_omni_request.c
 *
 * ngx_http_omni_parse() reads a chat or completions body (yajl), checks
 * that it is valid UTF-8 text (json_scan.h) and the fields the module acts
 * on (model, stream, stream_options, n, logprobs, max_completion_tokens /
 * max_tokens, modalities, tools, response_format, seed, ...) and writes
 * req->engine: the normalized request of engine/request/request.h with messages
 * or prompt, the seed (drawn when absent; req->seed) and the sampling
 * fields copied as given (the engine checks their types and ranges and
 * answers with an ERROR naming the param). Returns NGX_OK, NGX_DECLINED with err
 * filled (a 400), or NGX_ERROR (no memory). */
ngx_int_t ngx_http_omni_parse(ngx_http_request_t *r,
    ngx_http_omni_endpoint_e endpoint, ngx_str_t *body,
    ngx_http_omni_req_t *req, ngx_http_omni_error_t *err);

/* JSON in, for the request body and the engine's MODELS_R: the
 * pre-scan (NULL, or why the bytes are refused; *syntax: not JSON at
 * all); yajl's tree of them, freed by yajl_tree_free() (NULL: refused,
 * why in ebuf, or out of memory, ebuf empty); an object's member (NULL
 * when absent or null); a tree value or a C string added to a yajl_gen
 * (a yajl_gen_status). */
char *ngx_http_omni_prescan(u_char *p, size_t len, ngx_uint_t *syntax);
yajl_val ngx_http_omni_tree(ngx_http_request_t *r, u_char *json,
    size_t len, u_char *ebuf, size_t size);
yajl_val ngx_http_omni_member(yajl_val o, const char *key);
ngx_uint_t ngx_http_omni_gen_value(yajl_gen g, yajl_val v);
ngx_uint_t ngx_http_omni_gen_str(yajl_gen g, const char *s);


/* ngx_http_omni_openai.c
 *
 * Whole bodies, allocated from r->pool. */
ngx_buf_t *ngx_http_omni_error_json(ngx_http_request_t *r,
    ngx_http_omni_error_t *err);
ngx_buf_t *ngx_http_omni_completion_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);              /* non-streaming body from
                                               ctx->text and ctx->usage */
/* SSE events, in a buffer of ctx's free list (ngx_http_omni_event_buf()),
 * for ngx_http_omni_send_event(); NULL: no memory. */
ngx_chain_t *ngx_http_omni_error_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
                                            /* data: {"error":...}\n\n */
ngx_chain_t *ngx_http_omni_chunk_role(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_text(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *text, size_t len);
ngx_chain_t *ngx_http_omni_chunk_finish(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_usage(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);              /* data: [DONE]\n\n */
/* The engine's MODELS_R JSON as OpenAI's list (ctx->endpoint MODELS) or
 * one model (MODEL: ctx->model_id; NGX_DECLINED with err filled, a 404,
 * when the engine does not serve it). */
ngx_int_t ngx_http_omni_models_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *json, size_t len, ngx_buf_t **out,
    ngx_http_omni_error_t *err);
/* An engine ERROR payload as an OpenAI error (views into p). */
ngx_int_t ngx_http_omni_engine_error(u_char *p, size_t len,
    ngx_http_omni_error_t *err);
/* x-omni-seed on a chat or completions response about to start. */
ngx_int_t ngx_http_omni_seed_header(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);


/* ngx_http_omni_upstream.c */
/* Creates r->upstream with the module's callbacks (omni_pass). */
ngx_int_t ngx_http_omni_upstream_create(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf);


/* ngx_http_omni_stream.c */
ngx_int_t ngx_http_omni_send_header(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *content_type, off_t content_length);
/* An empty event buffer of at least size bytes, from ctx->free. */
ngx_chain_t *ngx_http_omni_event_buf(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, size_t size);
/* Sends the event cl (from ngx_http_omni_event_buf()) now and flushes;
 * its buffer goes back to ctx->free once written out. Arms the keep-alive
 * timer again. */
ngx_int_t ngx_http_omni_send_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_chain_t *cl);
/* A whole response: header, body b, last buffer. */
ngx_int_t ngx_http_omni_send_response(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *content_type, ngx_buf_t *b);
ngx_int_t ngx_http_omni_send_error(ngx_http_request_t *r,
    ngx_http_omni_error_t *err);
/* The OpenAI error of an engine failure: err's fields point at static
 * strings. */
void ngx_http_omni_engine_fault(ngx_http_omni_fault_e fault,
    ngx_http_omni_error_t *err);
/* Retry-After: 1 when status is 503, the answer of an engine that may be
 * back soon; nothing otherwise. */
ngx_int_t ngx_http_omni_retry_after(ngx_http_request_t *r, ngx_uint_t status);
/* Content-Type, with content_type_len the part before ";". */
void ngx_http_omni_set_content_type(ngx_http_request_t *r, ngx_str_t *type);
/* Adds a response header line; value must outlive the request. */
ngx_int_t ngx_http_omni_add_header(ngx_http_request_t *r, ngx_str_t *key,
    ngx_str_t *value);
/* Arms the SSE keep-alive comment (omni_keepalive_interval). */
void ngx_http_omni_keepalive_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
void ngx_http_omni_keepalive_stop(ngx_http_omni_ctx_t *ctx);
/* Header and body filters: x-request-id on every response of an omni
 * location, nginx's own error pages there replaced by OpenAI JSON. */
ngx_int_t ngx_http_omni_filter_init(ngx_conf_t *cf);


/* ngx_http_omni_metrics.c */
typedef enum {
    NGX_HTTP_OMNI_M_CLIENT_ABORT = 0,
    NGX_HTTP_OMNI_M_UPSTREAM_ERROR,
    NGX_HTTP_OMNI_M_AUTH_FAILED,
    NGX_HTTP_OMNI_M_COUNTERS
} ngx_http_omni_counter_e;

void ngx_http_omni_count(ngx_http_request_t *r, ngx_http_omni_counter_e c);
/* The module's counters as Prometheus text, appended after the engine's;
 * engine_up says whether the engine answered. */
ngx_buf_t *ngx_http_omni_metrics_text(ngx_http_request_t *r,
    ngx_uint_t engine_up);
/* {"status":"ready"} or {"status":"not ready","reason":...} */
ngx_buf_t *ngx_http_omni_health_json(ngx_http_request_t *r,
    ngx_uint_t ready, u_char *reason, size_t len);
/* Adds the counters' shared zone (once per configuration). */
ngx_int_t ngx_http_omni_metrics_add_zone(ngx_conf_t *cf);
/* Counts each request of an omni location by endpoint and status. */
ngx_int_t ngx_http_omni_metrics_init(ngx_conf_t *cf);

/* ngx_http_omni_module.c: the endpoint a URI names (also for requests
 * answered before the content handler, such as a 413). */
ngx_http_omni_endpoint_e ngx_http_omni_endpoint(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf, ngx_str_t *model_id);


#endif /* _NGX_HTTP_OMNI_MODULE_H_INCLUDED_ */

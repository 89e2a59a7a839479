
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_request.h -- what ngx_http_omni_request.c (the way a
 * body goes: pre-scan, tree, checks, the engine's JSON) and
 * ngx_http_omni_params.c (the checks of single fields, the 400s' words)
 * share. Private to the two: the rest of the module sees
 * ngx_http_omni_parse() only.
 *
 * Every check returns NGX_OK; NGX_DECLINED with err filled, a 400 logged
 * at info; or NGX_ERROR (no memory). Strings put in err are static or
 * from r->pool.
 */


#ifndef _NGX_HTTP_OMNI_REQUEST_H_INCLUDED_
#define _NGX_HTTP_OMNI_REQUEST_H_INCLUDED_


#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_PARAM_MAX     64


/* Speech out: the engine's "audio" object (engine/request/request.h).
 * Strings are static or views into the tree. */
typedef struct {
    char                       *voice;
    char                       *format;     /* the engine's name: "pcm" for
                                               chat's "pcm16" */
    char                       *mode;       /* "latency" or "quality" */
    yajl_val                    speed;      /* NULL: the engine's default */
    char                       *id;         /* chat: the minted audio id */
    unsigned                    on:1;
} ngx_http_omni_speech_t;


/* What the checks found, for the engine request. */
typedef struct {
    yajl_val                    model;
    yajl_val                    input;      /* messages, prompt string, or
                                               the text to speak */
    ngx_http_omni_speech_t      speech;
    ngx_str_t                   salt;       /* the engine's cache_salt:
                                               prompt_cache_key, behind
                                               the tenant's name when
                                               omni_api_keys is on; empty:
                                               none */
    int64_t                     max_tokens; /* 0: none */
    unsigned                    no_think:1; /* the engine's "thinking":
                                               false */
    int64_t                     seed;       /* the client's, or drawn */
} ngx_http_omni_fields_t;


ngx_int_t ngx_http_omni_check_max_tokens(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_choices(ngx_http_request_t *r,
    ngx_http_omni_kind_e kind, yajl_val root,
    ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_output(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_model(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);

/* ngx_http_omni_speech.c: /v1/audio/speech's body (model, input, voice,
 * response_format, speed, instructions, stream_format, speech_mode);
 * chat's audio out (audio is 1 when modalities
 * names it); the "audio" object of the engine's JSON (a yajl_gen
 * status). */
ngx_int_t ngx_http_omni_speech_check(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_chat_audio(ngx_http_request_t *r,
    yajl_val root, ngx_uint_t audio, ngx_http_omni_fields_t *f,
    ngx_http_omni_req_t *req, ngx_http_omni_error_t *err);
ngx_uint_t ngx_http_omni_gen_audio(yajl_gen g, ngx_http_omni_speech_t *sp);
/* ngx_http_omni_audio_in.c: an input_audio content part (part j of
 * message i), its base64 decoded into an input of req; the engine's
 * "audio_in" and "max_audio_seconds" members (a yajl_gen status). */
ngx_int_t ngx_http_omni_audio_in_part(ngx_http_request_t *r, size_t i,
    size_t j, yajl_val part, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
ngx_uint_t ngx_http_omni_gen_audio_in(ngx_http_request_t *r, yajl_gen g,
    ngx_http_omni_req_t *req);
/* ngx_http_omni_request.c: a generated engine request (s: the yajl_gen
 * status so far) into req->engine; a 413 over the REQUEST frame limit. */
ngx_int_t ngx_http_omni_engine_json(ngx_http_request_t *r, yajl_gen g,
    ngx_uint_t s, ngx_http_omni_req_t *req, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_tools(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_legacy(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_thinking(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_salt(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_check_seed(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_bool(ngx_http_request_t *r, yajl_val o,
    char *key, char *param, ngx_uint_t *flag, ngx_http_omni_error_t *err);
char *ngx_http_omni_type(yajl_val v);
char *ngx_http_omni_param(ngx_http_request_t *r, char *fmt,
    size_t i, size_t j);
ngx_int_t ngx_http_omni_bad_json(ngx_http_request_t *r,
    u_char *why, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_invalid(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *code,
    const char *fmt, ...);
ngx_int_t ngx_http_omni_invalid_type(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *want, yajl_val v);
ngx_int_t ngx_http_omni_unsupported(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, char *param, char *why);


#endif /* _NGX_HTTP_OMNI_REQUEST_H_INCLUDED_ */


/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_redis.h -- Redis, as the module's rate limits
 * (ngx_http_omni_limit.c) and prefix routing (ngx_http_omni_route.c) use
 * it: one connection per worker, hiredis's async API driven by nginx's
 * event loop (ngx_http_omni_redis.c).
 *
 * A call is one command on the worker's connection, answered at most once
 * through its handler: with the reply, or with a failure (Redis down,
 * slower than omni_redis's timeout, or in an outage that fails calls at
 * once). A call belongs to a request: when the request ends first, its
 * handler is never called (the reply, when it comes, is dropped). A call
 * without a request (r NULL) is sent and forgotten: its arguments are
 * copied, and only the metrics hear of its answer.
 */


#ifndef _NGX_HTTP_OMNI_REDIS_H_INCLUDED_
#define _NGX_HTTP_OMNI_REDIS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <hiredis/hiredis.h>

#include "ngx_http_omni_module.h"


/* A Lua script, run by EVALSHA (loaded at connect, again on NOSCRIPT):
 * a static of the file that uses it, registered at configuration time
 * with ngx_http_omni_redis_add_script(). */
typedef struct {
    ngx_str_t                       name;       /* for logs */
    ngx_str_t                       body;
    u_char                          sha1[40];   /* hex, computed at
                                                   registration */
} ngx_http_omni_redis_script_t;


/* omni_redis: where, who, how long. */
struct ngx_http_omni_redis_conf_s {
    ngx_str_t                       name;       /* as configured */
    ngx_str_t                       host;       /* numeric, NUL-terminated;
                                                   or the socket's path */
    int                             port;       /* 0: a Unix socket */
    ngx_str_t                       user;       /* empty: none */
    ngx_str_t                       password;   /* empty: no AUTH */
    ngx_int_t                       db;
    ngx_str_t                       ns;         /* key namespace, "omni:" */
    ngx_msec_t                      connect_timeout;
    ngx_msec_t                      timeout;
    ngx_array_t                     scripts;    /* of
                                                   ngx_http_omni_redis_script_t
                                                   * */
};


/* omni_redis's handler (http{}); scripts the configuration's users need
 * (NGX_ERROR: no memory; a script registered twice is kept once). */
char *ngx_http_omni_redis_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_omni_redis_add_script(ngx_conf_t *cf,
    ngx_http_omni_redis_script_t *script);

/* The worker's connection: opened at its start, closed at its exit. */
ngx_int_t ngx_http_omni_redis_init_process(ngx_cycle_t *cycle);
void ngx_http_omni_redis_exit_process(ngx_cycle_t *cycle);

/* The request's worker's Redis, NULL when omni_redis is not configured. */
ngx_http_omni_redis_t *ngx_http_omni_redis(ngx_http_request_t *r);
ngx_http_omni_redis_conf_t *ngx_http_omni_redis_conf(ngx_http_request_t *r);

/*
 * Sends one command (argc arguments; script non-NULL: EVALSHA of the
 * script with these arguments, which start with numkeys). NGX_OK: sent,
 * the handler will be called once, unless call->r ends first; r NULL:
 * sent and forgotten, the handler is never called. NGX_DECLINED: not
 * sent, call->fault says why (the handler is not called; the caller
 * decides at once). NGX_ERROR: no memory.
 */
ngx_int_t ngx_http_omni_redis_send(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_call_t *call, ngx_http_omni_redis_script_t *script,
    int argc, const char **argv, const size_t *argvlen);

/* The words of a fault, for logs: "down", "timed out", "busy". */
const char *ngx_http_omni_redis_fault_text(ngx_http_omni_redis_fault_e f);


#endif /* _NGX_HTTP_OMNI_REDIS_H_INCLUDED_ */

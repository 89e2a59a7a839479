
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_redis.c -- one Redis connection per worker: hiredis's
 * async API driven by nginx's event loop.
 *
 * The adapter. hiredis asks for read and write interest through five
 * hooks (addRead, delRead, addWrite, delWrite, cleanup), as its own
 * adapters for libevent or libuv do; here they are the events of an
 * ngx_connection_t around hiredis's socket. The events are
 * level-triggered: hiredis reads at most 16 KB per call, and with nginx's
 * usual edge-triggered epoll the rest of a larger reply would wait for
 * the next packet. hiredis owns the socket and closes it; nginx's
 * connection is only given back.
 *
 * The connection's life:
 *
 *   DOWN --connect--> HANDSHAKE --AUTH, SELECT, SCRIPT LOADs, PING--> READY
 *
 * and any failure (refused, lost, a handshake error such as a wrong
 * password, no answer within connect_timeout) back to DOWN, then a new
 * connect after a backoff of 50 ms doubling to 1 s. Calls are sent in
 * HANDSHAKE and READY (they queue behind the handshake and wait at most
 * their timeout); in DOWN they fail at once, so that no request waits for
 * a Redis that is not there.
 *
 * Slots. hiredis calls a command's callback exactly once (the reply, or
 * NULL when the connection goes) with a pointer it keeps until then. That
 * pointer is a slot of the worker's fixed table, never a request's
 * memory: a request that ends first detaches its call from the slot (a
 * pool cleanup), and the reply is dropped when it comes. The table's size
 * bounds what is in flight; a call finding it full fails at once (busy).
 *
 * Slowness. A call that times out is answered with a failure, but its
 * slot stays until Redis answers: while one is late, Redis is known to be
 * behind by more than the timeout, so new calls fail at once (busy)
 * instead of queueing behind it, and no request waits more than one
 * timeout. A reply to a late slot ends that; when none comes for 10 s the
 * connection is dropped and made again.
 *
 * Outages are logged once per cause: the first failure (at error, with
 * what failed and Redis's own words for a refused handshake), not the
 * reconnects and failed calls after it that fail for the same cause
 * (debug), but one that fails for another (the connection is back, AUTH
 * is now refused); the return at notice, with how long it lasted and how
 * many calls failed meanwhile. The causes: Redis gone (a connection
 * refused or lost: the reconnects refused after a loss are the same
 * outage), Redis slow (a timeout, a stall), and each error Redis answers,
 * by its words (NOAUTH, then WRONGPASS, are two).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_sha1.h>
#include <ngx_crc32.h>

#include <hiredis/async.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_redis.h"


#define NGX_HTTP_OMNI_REDIS_SLOTS        4096
#define NGX_HTTP_OMNI_REDIS_BACKOFF_MIN  50
#define NGX_HTTP_OMNI_REDIS_BACKOFF_MAX  1000
#define NGX_HTTP_OMNI_REDIS_STALL        10000


/* Why an outage is logged (ngx_http_omni_redis_fail()). */
typedef enum {
    NGX_HTTP_OMNI_REDIS_GONE = 0,   /* refused, lost, not connectable */
    NGX_HTTP_OMNI_REDIS_SLOW,       /* no answer in time */
    NGX_HTTP_OMNI_REDIS_REFUSED     /* an error reply, by its words */
} ngx_http_omni_redis_cause_e;


typedef enum {
    NGX_HTTP_OMNI_REDIS_STATE_DOWN = 0,
    NGX_HTTP_OMNI_REDIS_STATE_HANDSHAKE,
    NGX_HTTP_OMNI_REDIS_STATE_READY
} ngx_http_omni_redis_state_e;


struct ngx_http_omni_redis_slot_s {
    ngx_http_omni_redis_t          *redis;
    ngx_http_omni_redis_call_t     *call;       /* NULL: detached, or a
                                                   call without request */
    ngx_http_omni_redis_slot_t     *next;       /* the free list */
    ngx_event_t                     timer;
    uint64_t                        start;      /* microseconds */
    ngx_http_omni_redis_script_t   *script;     /* EVALSHA's */
    int                             argc;       /* the command, for a
                                                   NOSCRIPT's EVAL; 0:
                                                   gone with its request */
    const char                    **argv;       /* in the request's pool,
                                                   or copy */
    size_t                         *argvlen;
    void                           *copy;       /* a forgotten call's
                                                   command (ngx_alloc) */
    unsigned                        late:1;     /* timed out, unanswered */
    unsigned                        retried:1;  /* sent again as EVAL */
};


struct ngx_http_omni_redis_s {
    ngx_http_omni_redis_conf_t     *conf;
    ngx_http_omni_main_conf_t      *omcf;       /* the metrics */
    ngx_log_t                      *log;
    redisAsyncContext              *ac;
    ngx_connection_t               *c;
    ngx_http_omni_redis_state_e     state;
    ngx_uint_t                      handshake;  /* replies still due */
    ngx_event_t                     reconnect;
    ngx_event_t                     connect_timer;
    ngx_event_t                     stall;
    ngx_msec_t                      backoff;
    ngx_uint_t                      late;       /* late slots */
    ngx_http_omni_redis_slot_t     *slots;
    ngx_http_omni_redis_slot_t     *free;
    ngx_uint_t                      outage;     /* the causes logged
                                                   (1 << cause), not over;
                                                   0: none */
    uint32_t                        outage_crc; /* of the refusal's words
                                                   logged last */
    ngx_msec_t                      outage_start;
    ngx_uint_t                      outage_failed;
    ngx_uint_t                      up;         /* counted in the
                                                   metrics' gauge */
    ngx_uint_t                      exiting;
};


static void ngx_http_omni_redis_connect(ngx_http_omni_redis_t *redis);
static ngx_int_t ngx_http_omni_redis_handshake(ngx_http_omni_redis_t *redis);
static void ngx_http_omni_redis_handshake_reply(redisAsyncContext *ac,
    void *r, void *privdata);
static void ngx_http_omni_redis_drop(ngx_http_omni_redis_t *redis);
static void ngx_http_omni_redis_fail(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_cause_e cause, const char *fmt, ...);
static void ngx_http_omni_redis_back(ngx_http_omni_redis_t *redis);
static void ngx_http_omni_redis_set_up(ngx_http_omni_redis_t *redis,
    ngx_uint_t up);

static void ngx_http_omni_redis_on_connect(const redisAsyncContext *ac,
    int status);
static void ngx_http_omni_redis_on_disconnect(const redisAsyncContext *ac,
    int status);
static void ngx_http_omni_redis_add_read(void *data);
static void ngx_http_omni_redis_del_read(void *data);
static void ngx_http_omni_redis_add_write(void *data);
static void ngx_http_omni_redis_del_write(void *data);
static void ngx_http_omni_redis_cleanup(void *data);
static void ngx_http_omni_redis_read_handler(ngx_event_t *rev);
static void ngx_http_omni_redis_write_handler(ngx_event_t *wev);

static void ngx_http_omni_redis_reconnect_handler(ngx_event_t *ev);
static void ngx_http_omni_redis_connect_timeout(ngx_event_t *ev);
static void ngx_http_omni_redis_stall_handler(ngx_event_t *ev);
static void ngx_http_omni_redis_slot_timeout(ngx_event_t *ev);
static void ngx_http_omni_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static ngx_int_t ngx_http_omni_redis_noscript(ngx_http_omni_redis_slot_t *slot,
    redisReply *reply);
static void ngx_http_omni_redis_free_slot(ngx_http_omni_redis_slot_t *slot);
static void ngx_http_omni_redis_detach(void *data);
static ngx_int_t ngx_http_omni_redis_copy(ngx_http_omni_redis_slot_t *slot,
    int skip, int argc, const char **argv, const size_t *argvlen);
static void ngx_http_omni_redis_count(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_fault_e fault);
static uint64_t ngx_http_omni_redis_now(void);


static const char  *ngx_http_omni_redis_faults[] = {
    "answered", "down", "timed out", "busy"
};


/* omni_redis address [db=N] [user=NAME] [password=SECRET]
 *            [connect_timeout=TIME] [timeout=TIME] [namespace=PREFIX] */

char *
ngx_http_omni_redis_directive(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_omni_main_conf_t *omcf = conf;

    u_char                      *p;
    ngx_url_t                    u;
    ngx_str_t                   *value, s;
    ngx_int_t                    n;
    ngx_uint_t                   i;
    ngx_msec_t                   ms;
    ngx_http_omni_redis_conf_t  *rcf;

    rcf = omcf->redis;

    if (rcf != NULL && rcf->name.len) {
        return "is duplicate";
    }

    if (rcf == NULL) {
        rcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_redis_conf_t));
        if (rcf == NULL) {
            return NGX_CONF_ERROR;
        }

        omcf->redis = rcf;
    }

    value = cf->args->elts;

    rcf->name = value[1];
    rcf->db = 0;
    rcf->connect_timeout = 1000;
    rcf->timeout = 200;
    ngx_str_set(&rcf->ns, "omni:");

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "db=", 3) == 0) {
            n = ngx_atoi(value[i].data + 3, value[i].len - 3);
            if (n == NGX_ERROR || n > 65535) {
                goto invalid;
            }

            rcf->db = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "user=", 5) == 0) {
            if (value[i].len == 5) {
                goto invalid;
            }

            rcf->user.data = value[i].data + 5;
            rcf->user.len = value[i].len - 5;
            continue;
        }

        if (ngx_strncmp(value[i].data, "password=", 9) == 0) {
            if (value[i].len == 9) {
                goto invalid;
            }

            rcf->password.data = value[i].data + 9;
            rcf->password.len = value[i].len - 9;
            continue;
        }

        if (ngx_strncmp(value[i].data, "namespace=", 10) == 0) {
            if (value[i].len == 10) {
                goto invalid;
            }

            rcf->ns.data = value[i].data + 10;
            rcf->ns.len = value[i].len - 10;
            continue;
        }

        if (ngx_strncmp(value[i].data, "connect_timeout=", 16) == 0) {
            s.data = value[i].data + 16;
            s.len = value[i].len - 16;

            ms = ngx_parse_time(&s, 0);
            if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
                goto invalid;
            }

            rcf->connect_timeout = ms;
            continue;
        }

        if (ngx_strncmp(value[i].data, "timeout=", 8) == 0) {
            s.data = value[i].data + 8;
            s.len = value[i].len - 8;

            ms = ngx_parse_time(&s, 0);
            if (ms == (ngx_msec_t) NGX_ERROR || ms == 0) {
                goto invalid;
            }

            rcf->timeout = ms;
            continue;
        }

        goto invalid;
    }

    if (rcf->user.len && rcf->password.len == 0) {
        return "has \"user=\" without \"password=\"";
    }

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = value[1];
    u.default_port = 6379;

    /* a name is resolved now, once: hiredis's connect would resolve it
     * with a blocking getaddrinfo() in the worker */

    if (ngx_parse_url(cf->pool, &u) != NGX_OK) {
        if (u.err) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s in \"%V\" of \"omni_redis\"", u.err,
                               &u.url);
        }

        return NGX_CONF_ERROR;
    }

    if (u.naddrs == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "no address in \"%V\" of \"omni_redis\"", &u.url);
        return NGX_CONF_ERROR;
    }

    if (u.family == AF_UNIX) {
        /* "unix:/path": the path, NUL-terminated */

        p = ngx_pnalloc(cf->pool, u.url.len - 5 + 1);
        if (p == NULL) {
            return NGX_CONF_ERROR;
        }

        rcf->host.len = u.url.len - 5;
        rcf->host.data = p;
        ngx_memcpy(p, u.url.data + 5, rcf->host.len);
        p[rcf->host.len] = '\0';
        rcf->port = 0;

        return NGX_CONF_OK;
    }

    p = ngx_pnalloc(cf->pool, NGX_SOCKADDR_STRLEN + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    rcf->host.data = p;
    rcf->host.len = ngx_sock_ntop(u.addrs[0].sockaddr, u.addrs[0].socklen, p,
                                  NGX_SOCKADDR_STRLEN, 0);
    p[rcf->host.len] = '\0';
    rcf->port = (int) ngx_inet_get_port(u.addrs[0].sockaddr);

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" of \"omni_redis\"",
                       &value[i]);

    return NGX_CONF_ERROR;
}


ngx_int_t
ngx_http_omni_redis_add_script(ngx_conf_t *cf,
    ngx_http_omni_redis_script_t *script)
{
    u_char                         digest[20];
    ngx_uint_t                     i;
    ngx_sha1_t                     sha1;
    ngx_http_omni_main_conf_t     *omcf;
    ngx_http_omni_redis_conf_t    *rcf;
    ngx_http_omni_redis_script_t **sp;

    omcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_omni_module);

    rcf = omcf->redis;

    if (rcf == NULL) {
        /* omni_redis may come later in the configuration */

        rcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_redis_conf_t));
        if (rcf == NULL) {
            return NGX_ERROR;
        }

        omcf->redis = rcf;
    }

    if (rcf->scripts.elts == NULL
        && ngx_array_init(&rcf->scripts, cf->pool, 4,
                          sizeof(ngx_http_omni_redis_script_t *))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    sp = rcf->scripts.elts;

    for (i = 0; i < rcf->scripts.nelts; i++) {
        if (sp[i] == script) {
            return NGX_OK;
        }
    }

    /* Redis names a script by the SHA-1 of its text */

    ngx_sha1_init(&sha1);
    ngx_sha1_update(&sha1, script->body.data, script->body.len);
    ngx_sha1_final(digest, &sha1);

    ngx_hex_dump(script->sha1, digest, sizeof(digest));

    sp = ngx_array_push(&rcf->scripts);
    if (sp == NULL) {
        return NGX_ERROR;
    }

    *sp = script;

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_redis_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                   i;
    ngx_http_omni_redis_t       *redis;
    ngx_http_omni_main_conf_t   *omcf;
    ngx_http_omni_redis_slot_t  *slot;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    omcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_omni_module);

    if (omcf == NULL || omcf->redis == NULL || omcf->redis->name.len == 0) {
        return NGX_OK;
    }

    redis = ngx_pcalloc(cycle->pool, sizeof(ngx_http_omni_redis_t));
    if (redis == NULL) {
        return NGX_ERROR;
    }

    redis->slots = ngx_pcalloc(cycle->pool, NGX_HTTP_OMNI_REDIS_SLOTS
                                            * sizeof(ngx_http_omni_redis_slot_t));
    if (redis->slots == NULL) {
        return NGX_ERROR;
    }

    redis->conf = omcf->redis;
    redis->omcf = omcf;
    redis->log = cycle->log;
    redis->backoff = NGX_HTTP_OMNI_REDIS_BACKOFF_MIN;

    for (i = 0; i < NGX_HTTP_OMNI_REDIS_SLOTS; i++) {
        slot = &redis->slots[i];

        slot->redis = redis;
        slot->timer.handler = ngx_http_omni_redis_slot_timeout;
        slot->timer.data = slot;
        slot->timer.log = cycle->log;
        slot->timer.cancelable = 1;

        slot->next = (i + 1 < NGX_HTTP_OMNI_REDIS_SLOTS) ? slot + 1 : NULL;
    }

    redis->free = redis->slots;

    redis->reconnect.handler = ngx_http_omni_redis_reconnect_handler;
    redis->connect_timer.handler = ngx_http_omni_redis_connect_timeout;
    redis->stall.handler = ngx_http_omni_redis_stall_handler;

    redis->reconnect.data = redis;
    redis->connect_timer.data = redis;
    redis->stall.data = redis;

    redis->reconnect.log = cycle->log;
    redis->connect_timer.log = cycle->log;
    redis->stall.log = cycle->log;

    /* none of them keeps an exiting worker alive */
    redis->reconnect.cancelable = 1;
    redis->connect_timer.cancelable = 1;
    redis->stall.cancelable = 1;

    omcf->redis_worker = redis;

    ngx_http_omni_redis_connect(redis);

    return NGX_OK;
}


void
ngx_http_omni_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                   i;
    ngx_http_omni_redis_t       *redis;
    ngx_http_omni_main_conf_t   *omcf;
    ngx_http_omni_redis_slot_t  *slot;

    omcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_omni_module);

    if (omcf == NULL || omcf->redis_worker == NULL) {
        return;
    }

    redis = omcf->redis_worker;
    redis->exiting = 1;

    /* whatever requests are left get no answer from here: they are being
     * torn down with the worker */

    for (i = 0; i < NGX_HTTP_OMNI_REDIS_SLOTS; i++) {
        slot = &redis->slots[i];

        if (slot->call) {
            slot->call->slot = NULL;
            slot->call = NULL;
        }

        slot->argc = 0;
    }

    if (redis->ac) {
        redisAsyncFree(redis->ac);
    }

    if (redis->reconnect.timer_set) {
        ngx_del_timer(&redis->reconnect);
    }
}


ngx_http_omni_redis_t *
ngx_http_omni_redis(ngx_http_request_t *r)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    return omcf->redis_worker;
}


ngx_http_omni_redis_conf_t *
ngx_http_omni_redis_conf(ngx_http_request_t *r)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    return omcf->redis;
}


const char *
ngx_http_omni_redis_fault_text(ngx_http_omni_redis_fault_e f)
{
    return f < NGX_HTTP_OMNI_REDIS_FAULTS ? ngx_http_omni_redis_faults[f]
                                          : "failed";
}


/* ---- the connection ---------------------------------------------------- */


static void
ngx_http_omni_redis_connect(ngx_http_omni_redis_t *redis)
{
    redisAsyncContext           *ac;
    ngx_connection_t            *c;
    ngx_http_omni_redis_conf_t  *rcf;

    rcf = redis->conf;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, redis->log, 0,
                   "omni redis: connecting to %V", &rcf->name);

    if (rcf->port) {
        ac = redisAsyncConnect((char *) rcf->host.data, rcf->port);

    } else {
        ac = redisAsyncConnectUnix((char *) rcf->host.data);
    }

    if (ac == NULL) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "out of memory for a connection");
        goto again;
    }

    if (ac->err) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "connect() failed: %s", ac->errstr);
        redisAsyncFree(ac);
        goto again;
    }

    c = ngx_get_connection(ac->c.fd, redis->log);
    if (c == NULL) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "no free connection for it");
        redisAsyncFree(ac);
        goto again;
    }

    c->data = redis;
    c->read->handler = ngx_http_omni_redis_read_handler;
    c->write->handler = ngx_http_omni_redis_write_handler;
    c->read->log = redis->log;
    c->write->log = redis->log;

    redis->ac = ac;
    redis->c = c;
    redis->state = NGX_HTTP_OMNI_REDIS_STATE_HANDSHAKE;

    ac->data = redis;
    ac->ev.data = redis;
    ac->ev.addRead = ngx_http_omni_redis_add_read;
    ac->ev.delRead = ngx_http_omni_redis_del_read;
    ac->ev.addWrite = ngx_http_omni_redis_add_write;
    ac->ev.delWrite = ngx_http_omni_redis_del_write;
    ac->ev.cleanup = ngx_http_omni_redis_cleanup;

    redisAsyncSetConnectCallback(ac, ngx_http_omni_redis_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_omni_redis_on_disconnect);

    ngx_add_timer(&redis->connect_timer, rcf->connect_timeout);

    if (ngx_http_omni_redis_handshake(redis) != NGX_OK) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "the handshake could not be sent");
        ngx_http_omni_redis_drop(redis);
    }

    return;

again:

    ngx_add_timer(&redis->reconnect, redis->backoff);

    redis->backoff = ngx_min(redis->backoff * 2,
                             NGX_HTTP_OMNI_REDIS_BACKOFF_MAX);
}


/* The first commands, queued before the connection is even made: AUTH,
 * SELECT, a SCRIPT LOAD per script, PING (so that there is always one,
 * and the connect completes). The connection is READY when they have all
 * answered without error. */

static ngx_int_t
ngx_http_omni_redis_handshake(ngx_http_omni_redis_t *redis)
{
    int                             rc;
    char                            db[NGX_INT_T_LEN + 1];
    ngx_uint_t                      i;
    ngx_http_omni_redis_conf_t     *rcf;
    ngx_http_omni_redis_script_t  **sp;

    rcf = redis->conf;
    redis->handshake = 0;

    if (rcf->password.len) {
        if (rcf->user.len) {
            rc = redisAsyncCommand(redis->ac,
                                   ngx_http_omni_redis_handshake_reply,
                                   (void *) "AUTH", "AUTH %b %b",
                                   rcf->user.data, rcf->user.len,
                                   rcf->password.data, rcf->password.len);

        } else {
            rc = redisAsyncCommand(redis->ac,
                                   ngx_http_omni_redis_handshake_reply,
                                   (void *) "AUTH", "AUTH %b",
                                   rcf->password.data, rcf->password.len);
        }

        if (rc != REDIS_OK) {
            return NGX_ERROR;
        }

        redis->handshake++;
    }

    if (rcf->db) {
        *ngx_sprintf((u_char *) db, "%i", rcf->db) = '\0';

        if (redisAsyncCommand(redis->ac, ngx_http_omni_redis_handshake_reply,
                              (void *) "SELECT", "SELECT %s", db)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        redis->handshake++;
    }

    sp = rcf->scripts.elts;

    for (i = 0; i < rcf->scripts.nelts; i++) {
        if (redisAsyncCommand(redis->ac, ngx_http_omni_redis_handshake_reply,
                              (void *) "SCRIPT LOAD", "SCRIPT LOAD %b",
                              sp[i]->body.data, sp[i]->body.len)
            != REDIS_OK)
        {
            return NGX_ERROR;
        }

        redis->handshake++;
    }

    if (redisAsyncCommand(redis->ac, ngx_http_omni_redis_handshake_reply,
                          (void *) "PING", "PING")
        != REDIS_OK)
    {
        return NGX_ERROR;
    }

    redis->handshake++;

    return NGX_OK;
}


static void
ngx_http_omni_redis_handshake_reply(redisAsyncContext *ac, void *r,
    void *privdata)
{
    redisReply             *reply = r;
    ngx_http_omni_redis_t  *redis = ac->data;

    if (reply == NULL) {
        /* the connection went: its cleanup says so */
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_REFUSED,
                                 "%s was refused: %*s",
                                 (char *) privdata, (int) reply->len,
                                 reply->str);
        ngx_http_omni_redis_drop(redis);
        return;
    }

    if (--redis->handshake > 0) {
        return;
    }

    if (redis->connect_timer.timer_set) {
        ngx_del_timer(&redis->connect_timer);
    }

    redis->state = NGX_HTTP_OMNI_REDIS_STATE_READY;
    redis->backoff = NGX_HTTP_OMNI_REDIS_BACKOFF_MIN;

    ngx_http_omni_redis_set_up(redis, 1);
    ngx_http_omni_metric_add(redis->omcf, NGX_HTTP_OMNI_M_REDIS_CONNECTS, 1);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, redis->log, 0,
                   "omni redis: %V ready", &redis->conf->name);

    ngx_http_omni_redis_back(redis);
}


/* Gives the connection up: hiredis frees it (at once, or when the
 * callback it is in returns), its calls fail, its cleanup schedules the
 * next connect. Calls fail at once from here on. */

static void
ngx_http_omni_redis_drop(ngx_http_omni_redis_t *redis)
{
    redis->state = NGX_HTTP_OMNI_REDIS_STATE_DOWN;

    if (redis->ac) {
        redisAsyncFree(redis->ac);
    }
}


static void
ngx_http_omni_redis_fail(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_cause_e cause, const char *fmt, ...)
{
    u_char    *p, buf[NGX_MAX_ERROR_STR];
    va_list    args;
    uint32_t   crc;

    va_start(args, fmt);
    p = ngx_vslprintf(buf, buf + sizeof(buf), fmt, args);
    va_end(args);

    /* the same cause again (each reconnect refused, each call timed
     * out, the same refusal) says nothing new: logged at debug; another
     * (the connection came back but AUTH is refused now) is logged */

    crc = ngx_crc32_short(buf, p - buf);

    if ((redis->outage & (1 << cause))
        && (cause != NGX_HTTP_OMNI_REDIS_REFUSED || crc == redis->outage_crc))
    {
        ngx_log_debug3(NGX_LOG_DEBUG_HTTP, redis->log, 0,
                       "omni redis: %V: %*s (outage goes on)",
                       &redis->conf->name, p - buf, buf);
        return;
    }

    if (redis->outage == 0) {
        redis->outage_start = ngx_current_msec;
        redis->outage_failed = 0;
    }

    redis->outage |= 1 << cause;

    if (cause == NGX_HTTP_OMNI_REDIS_REFUSED) {
        redis->outage_crc = crc;
    }

    ngx_log_error(NGX_LOG_ERR, redis->log, 0,
                  "omni redis: %V: %*s; until it answers again, "
                  "omni_limit_fail decides limits and requests are not "
                  "routed by prefix (logged once per outage and cause)",
                  &redis->conf->name, p - buf, buf);
}


static void
ngx_http_omni_redis_back(ngx_http_omni_redis_t *redis)
{
    if (!redis->outage) {
        return;
    }

    redis->outage = 0;

    ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                  "omni redis: %V answers again after %M ms; %ui calls "
                  "failed meanwhile", &redis->conf->name,
                  (ngx_msec_t) (ngx_current_msec - redis->outage_start),
                  redis->outage_failed);
}


static void
ngx_http_omni_redis_set_up(ngx_http_omni_redis_t *redis, ngx_uint_t up)
{
    if (redis->up == up) {
        return;
    }

    redis->up = up;
    ngx_http_omni_metric_add(redis->omcf, NGX_HTTP_OMNI_M_REDIS_UP,
                             up ? 1 : -1);
}


/* ---- hiredis's hooks ---------------------------------------------------- */


static void
ngx_http_omni_redis_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_omni_redis_t  *redis = ac->data;

    if (status != REDIS_OK) {
        /* hiredis frees the context next: the cleanup reconnects */
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "connect() failed: %s", ac->errstr);
        redis->state = NGX_HTTP_OMNI_REDIS_STATE_DOWN;
    }
}


static void
ngx_http_omni_redis_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_omni_redis_t  *redis = ac->data;

    if (status != REDIS_OK && !redis->exiting) {
        ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_GONE,
                                 "the connection was lost: %s",
                                 ac->errstr);
    }
}


static void
ngx_http_omni_redis_add_read(void *data)
{
    ngx_http_omni_redis_t *redis = data;

    ngx_event_t  *rev;

    rev = redis->c->read;

    if (!rev->active
        && ngx_add_event(rev, NGX_READ_EVENT, NGX_LEVEL_EVENT) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, redis->log, 0,
                      "omni redis: could not add a read event");
    }
}


static void
ngx_http_omni_redis_del_read(void *data)
{
    ngx_http_omni_redis_t *redis = data;

    ngx_event_t  *rev;

    rev = redis->c->read;

    if (rev->active) {
        (void) ngx_del_event(rev, NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_omni_redis_add_write(void *data)
{
    ngx_http_omni_redis_t *redis = data;

    ngx_event_t  *wev;

    wev = redis->c->write;

    if (!wev->active
        && ngx_add_event(wev, NGX_WRITE_EVENT, NGX_LEVEL_EVENT) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, redis->log, 0,
                      "omni redis: could not add a write event");
    }
}


static void
ngx_http_omni_redis_del_write(void *data)
{
    ngx_http_omni_redis_t *redis = data;

    ngx_event_t  *wev;

    wev = redis->c->write;

    if (wev->active) {
        (void) ngx_del_event(wev, NGX_WRITE_EVENT, 0);
    }
}


/* hiredis is freeing the context (its pending callbacks have run) and
 * closes the socket next: nginx's connection goes back without closing
 * it, and the next connect is scheduled. */

static void
ngx_http_omni_redis_cleanup(void *data)
{
    ngx_http_omni_redis_t *redis = data;

    ngx_connection_t  *c;

    c = redis->c;

    if (c) {
        if (c->read->posted) {
            ngx_delete_posted_event(c->read);
        }

        if (c->write->posted) {
            ngx_delete_posted_event(c->write);
        }

        /* the socket is closed right after: epoll forgets it by itself */

        if (c->read->active) {
            (void) ngx_del_event(c->read, NGX_READ_EVENT, NGX_CLOSE_EVENT);
        }

        if (c->write->active) {
            (void) ngx_del_event(c->write, NGX_WRITE_EVENT, NGX_CLOSE_EVENT);
        }

        ngx_free_connection(c);
        c->fd = (ngx_socket_t) -1;

        redis->c = NULL;
    }

    redis->ac = NULL;
    redis->state = NGX_HTTP_OMNI_REDIS_STATE_DOWN;

    ngx_http_omni_redis_set_up(redis, 0);

    if (redis->connect_timer.timer_set) {
        ngx_del_timer(&redis->connect_timer);
    }

    if (redis->stall.timer_set) {
        ngx_del_timer(&redis->stall);
    }

    if (redis->exiting) {
        return;
    }

    ngx_add_timer(&redis->reconnect, redis->backoff);

    redis->backoff = ngx_min(redis->backoff * 2,
                             NGX_HTTP_OMNI_REDIS_BACKOFF_MAX);
}


static void
ngx_http_omni_redis_read_handler(ngx_event_t *rev)
{
    ngx_connection_t       *c;
    ngx_http_omni_redis_t  *redis;

    c = rev->data;
    redis = c->data;

    if (redis->ac) {
        redisAsyncHandleRead(redis->ac);
    }
}


static void
ngx_http_omni_redis_write_handler(ngx_event_t *wev)
{
    ngx_connection_t       *c;
    ngx_http_omni_redis_t  *redis;

    c = wev->data;
    redis = c->data;

    if (redis->ac) {
        redisAsyncHandleWrite(redis->ac);
    }
}


static void
ngx_http_omni_redis_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_omni_redis_t  *redis = ev->data;

    if (!redis->exiting && redis->ac == NULL) {
        ngx_http_omni_redis_connect(redis);
    }
}


static void
ngx_http_omni_redis_connect_timeout(ngx_event_t *ev)
{
    ngx_http_omni_redis_t  *redis = ev->data;

    ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_SLOW,
                             "no answer to the connection's first "
                             "commands within %M ms (connect_timeout)",
                             redis->conf->connect_timeout);
    ngx_http_omni_redis_drop(redis);
}


static void
ngx_http_omni_redis_stall_handler(ngx_event_t *ev)
{
    ngx_http_omni_redis_t  *redis = ev->data;

    if (redis->late == 0) {
        return;
    }

    ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_SLOW,
                             "%ui commands unanswered for %d ms, "
                             "connecting again", redis->late,
                             NGX_HTTP_OMNI_REDIS_STALL);
    ngx_http_omni_redis_drop(redis);
}


/* ---- calls -------------------------------------------------------------- */


ngx_int_t
ngx_http_omni_redis_send(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_call_t *call, ngx_http_omni_redis_script_t *script,
    int argc, const char **argv, const size_t *argvlen)
{
    int                          n;
    ngx_pool_cleanup_t          *cln;
    ngx_http_omni_redis_slot_t  *slot;

    call->slot = NULL;

    if (redis == NULL || redis->state == NGX_HTTP_OMNI_REDIS_STATE_DOWN) {
        call->fault = NGX_HTTP_OMNI_REDIS_DOWN;
        goto failed;
    }

    slot = redis->free;

    if (redis->late || slot == NULL) {
        call->fault = NGX_HTTP_OMNI_REDIS_BUSY;
        goto failed;
    }

    /* EVALSHA sha numkeys ...: two arguments more, which a NOSCRIPT turns
     * into EVAL body numkeys ... */

    n = argc + (script ? 2 : 0);
    cln = NULL;

    if (call->r) {
        slot->argv = ngx_palloc(call->r->pool, n * sizeof(char *));
        slot->argvlen = ngx_palloc(call->r->pool, n * sizeof(size_t));

        cln = ngx_pool_cleanup_add(call->r->pool, 0);

        if (slot->argv == NULL || slot->argvlen == NULL || cln == NULL) {
            return NGX_ERROR;
        }

        ngx_memcpy(slot->argv + (n - argc), argv, argc * sizeof(char *));
        ngx_memcpy(slot->argvlen + (n - argc), argvlen,
                   argc * sizeof(size_t));

    } else if (ngx_http_omni_redis_copy(slot, n - argc, argc, argv, argvlen)
               != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (script) {
        slot->argv[0] = "EVALSHA";
        slot->argvlen[0] = sizeof("EVALSHA") - 1;
        slot->argv[1] = (const char *) script->sha1;
        slot->argvlen[1] = sizeof(script->sha1);
    }

    if (redisAsyncCommandArgv(redis->ac, ngx_http_omni_redis_reply, slot, n,
                              slot->argv, slot->argvlen)
        != REDIS_OK)
    {
        /* the context is on its way out */

        if (slot->copy) {
            ngx_free(slot->copy);
            slot->copy = NULL;
        }

        call->fault = NGX_HTTP_OMNI_REDIS_DOWN;
        goto failed;
    }

    redis->free = slot->next;

    if (cln) {
        cln->handler = ngx_http_omni_redis_detach;
        cln->data = call;
    }

    slot->call = call->r ? call : NULL;
    slot->script = script;
    slot->argc = n;
    slot->late = 0;
    slot->retried = 0;
    slot->start = ngx_http_omni_redis_now();

    call->slot = call->r ? slot : NULL;

    ngx_add_timer(&slot->timer, redis->conf->timeout);

    ngx_http_omni_metric_add(redis->omcf, NGX_HTTP_OMNI_M_REDIS_PENDING, 1);

    return NGX_OK;

failed:

    ngx_http_omni_redis_count(redis, call->fault);

    return NGX_DECLINED;
}


/* A forgotten call's command, copied into one block the slot owns (its
 * caller's memory may go before Redis answers, and a NOSCRIPT sends it
 * again): skip free pointers first (EVALSHA's), then argc arguments. */

static ngx_int_t
ngx_http_omni_redis_copy(ngx_http_omni_redis_slot_t *slot, int skip,
    int argc, const char **argv, const size_t *argvlen)
{
    int      i, n;
    size_t   size;
    u_char  *p;

    n = skip + argc;
    size = n * (sizeof(char *) + sizeof(size_t));

    for (i = 0; i < argc; i++) {
        size += argvlen[i];
    }

    p = ngx_alloc(size, slot->redis->log);
    if (p == NULL) {
        return NGX_ERROR;
    }

    slot->copy = p;
    slot->argv = (const char **) p;
    slot->argvlen = (size_t *) (p + n * sizeof(char *));

    p += n * (sizeof(char *) + sizeof(size_t));

    for (i = 0; i < argc; i++) {
        slot->argv[skip + i] = (const char *) p;
        slot->argvlen[skip + i] = argvlen[i];
        p = ngx_cpymem(p, argv[i], argvlen[i]);
    }

    return NGX_OK;
}


static void
ngx_http_omni_redis_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply                   *reply = r;
    ngx_http_omni_redis_t        *redis;
    ngx_http_omni_redis_call_t   *call;
    ngx_http_omni_redis_slot_t   *slot = privdata;
    ngx_http_omni_redis_fault_e   fault;

    redis = slot->redis;

    if (slot->timer.timer_set) {
        ngx_del_timer(&slot->timer);
    }

    if (slot->late) {
        redis->late--;

        if (redis->late == 0 && redis->stall.timer_set) {
            ngx_del_timer(&redis->stall);
        }
    }

    fault = NGX_HTTP_OMNI_REDIS_OK;

    if (reply == NULL) {
        fault = NGX_HTTP_OMNI_REDIS_DOWN;

    } else {
        ngx_http_omni_redis_observe(redis->omcf,
                                    ngx_http_omni_redis_now() - slot->start);

        if (reply->type == REDIS_REPLY_ERROR) {

            if (ngx_http_omni_redis_noscript(slot, reply) == NGX_OK) {
                return;
            }

            ngx_http_omni_metric_add(redis->omcf,
                                     NGX_HTTP_OMNI_M_REDIS_REPLY_ERROR, 1);
            if (slot->script) {
                ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_REFUSED,
                                         "the script %V failed: %*s",
                                         &slot->script->name,
                                         (int) reply->len, reply->str);

            } else {
                ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_REFUSED,
                                         "a command failed: %*s",
                                         (int) reply->len, reply->str);
            }

        } else {
            ngx_http_omni_redis_back(redis);
        }
    }

    call = slot->call;

    ngx_http_omni_redis_free_slot(slot);

    if (call == NULL) {
        return;
    }

    call->slot = NULL;
    call->fault = fault;

    if (fault != NGX_HTTP_OMNI_REDIS_OK) {
        ngx_http_omni_redis_count(redis, fault);
    }

    call->handler(call, reply);
}


/* A script Redis does not have (a SCRIPT FLUSH, a failover to a replica
 * that never loaded it): the same call again as EVAL, which loads it.
 * NGX_OK: sent again, the slot waits on. */

static ngx_int_t
ngx_http_omni_redis_noscript(ngx_http_omni_redis_slot_t *slot,
    redisReply *reply)
{
    ngx_http_omni_redis_t  *redis;

    redis = slot->redis;

    if (slot->script == NULL || slot->retried || slot->argc == 0
        || reply->len < sizeof("NOSCRIPT") - 1
        || ngx_strncmp(reply->str, "NOSCRIPT", sizeof("NOSCRIPT") - 1) != 0
        || redis->ac == NULL)
    {
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_NOTICE, redis->log, 0,
                  "omni redis: %V does not have the script %V, "
                  "sending it again", &redis->conf->name, &slot->script->name);

    slot->argv[0] = "EVAL";
    slot->argvlen[0] = sizeof("EVAL") - 1;
    slot->argv[1] = (const char *) slot->script->body.data;
    slot->argvlen[1] = slot->script->body.len;

    if (redisAsyncCommandArgv(redis->ac, ngx_http_omni_redis_reply, slot,
                              slot->argc, slot->argv, slot->argvlen)
        != REDIS_OK)
    {
        return NGX_DECLINED;
    }

    slot->retried = 1;
    slot->late = 0;
    slot->start = ngx_http_omni_redis_now();

    if (slot->call) {
        ngx_add_timer(&slot->timer, redis->conf->timeout);
    }

    return NGX_OK;
}


static void
ngx_http_omni_redis_free_slot(ngx_http_omni_redis_slot_t *slot)
{
    ngx_http_omni_redis_t  *redis;

    redis = slot->redis;

    if (slot->copy) {
        ngx_free(slot->copy);
        slot->copy = NULL;
    }

    slot->call = NULL;
    slot->argc = 0;
    slot->late = 0;

    slot->next = redis->free;
    redis->free = slot;

    ngx_http_omni_metric_add(redis->omcf, NGX_HTTP_OMNI_M_REDIS_PENDING, -1);
}


/* The call's request ends before the answer: the slot waits on for it
 * alone, its timer running (a slot that times out still says Redis is
 * behind), and the request's arguments are not sent again. */

static void
ngx_http_omni_redis_detach(void *data)
{
    ngx_http_omni_redis_call_t *call = data;

    ngx_http_omni_redis_slot_t  *slot;

    slot = call->slot;

    if (slot == NULL) {
        return;
    }

    call->slot = NULL;

    slot->call = NULL;
    slot->argc = 0;
}


static void
ngx_http_omni_redis_slot_timeout(ngx_event_t *ev)
{
    ngx_http_omni_redis_slot_t *slot = ev->data;

    ngx_http_omni_redis_t       *redis;
    ngx_http_omni_redis_call_t  *call;

    redis = slot->redis;

    slot->late = 1;
    redis->late++;

    if (!redis->stall.timer_set) {
        ngx_add_timer(&redis->stall, NGX_HTTP_OMNI_REDIS_STALL);
    }

    ngx_http_omni_redis_fail(redis, NGX_HTTP_OMNI_REDIS_SLOW,
                             "no answer within %M ms (timeout)",
                             redis->conf->timeout);

    call = slot->call;

    if (call == NULL) {
        ngx_http_omni_redis_count(redis, NGX_HTTP_OMNI_REDIS_TIMEOUT);
        return;
    }

    /* the slot stays until Redis answers; the request goes on without */

    slot->call = NULL;
    slot->argc = 0;

    call->slot = NULL;
    call->fault = NGX_HTTP_OMNI_REDIS_TIMEOUT;

    ngx_http_omni_redis_count(redis, NGX_HTTP_OMNI_REDIS_TIMEOUT);

    call->handler(call, NULL);
}


static void
ngx_http_omni_redis_count(ngx_http_omni_redis_t *redis,
    ngx_http_omni_redis_fault_e fault)
{
    static ngx_uint_t  counters[] = {
        0,
        NGX_HTTP_OMNI_M_REDIS_DOWN,
        NGX_HTTP_OMNI_M_REDIS_TIMEOUT,
        NGX_HTTP_OMNI_M_REDIS_BUSY
    };

    if (redis == NULL || fault == NGX_HTTP_OMNI_REDIS_OK
        || fault >= NGX_HTTP_OMNI_REDIS_FAULTS)
    {
        return;
    }

    redis->outage_failed++;

    ngx_http_omni_metric_add(redis->omcf, counters[fault], 1);
}


static uint64_t
ngx_http_omni_redis_now(void)
{
    struct timespec  ts;

    (void) clock_gettime(CLOCK_MONOTONIC, &ts);

    return (uint64_t) ts.tv_sec * 1000000 + (uint64_t) ts.tv_nsec / 1000;
}

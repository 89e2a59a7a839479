
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_route.c -- prefix-aware routing: a chat request goes to
 * the engine whose KV cache already holds the longest beginning of its
 * conversation, so that a multi-turn chat does not pay for its whole
 * prompt again at every turn.
 *
 *   upstream engines {
 *       omni_prefix_route [max_waiting=N];
 *       server unix:/run/omni/a.sock;
 *       server unix:/run/omni/b.sock;
 *   }
 *
 * Engines publish in Redis the conversation prefixes their caches hold
 * (engine/proto/prefix_key.h: a key names the first i messages of a
 * model and cache salt; the engine keeps it while the KV blocks behind it
 * stay) and their load. Here the request's keys are computed from its
 * messages the way the engine computes them (no tokenizing), and one
 * MGET, pipelined with a limit's token charge, asks for every engine's
 * load and every (engine, key) pair. The engine holding the most
 * messages wins, the less loaded on a tie; it must be usable in nginx's
 * eyes (not down, not failed within fail_timeout, under max_conns) and
 * not overloaded (its thinker's waiting queue under max_waiting, 8 by
 * default). Otherwise, or when Redis does not answer in time, the
 * upstream's own round robin decides; a chosen engine that fails to
 * connect is left for the next as round robin leaves any (a fallback
 * then: the next does not hold the prefix).
 *
 * The outcome: "hit" (sent to a holder), "miss" (no engine holds any
 * prefix of it), "fallback" (a holder exists but cannot take it, or
 * Redis did not answer); in the $omni_prefix variable (and $omni_prefix_messages, $omni_prefix_tokens,
 * $omni_engine), the x-omni-route response header (with the engine that
 * answered) and omni_nginx_route_total.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "prefix_key.h"

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_redis.h"


#if (OMNI_PKEY_HEX != NGX_HTTP_OMNI_PKEY_HEX)
#error "NGX_HTTP_OMNI_PKEY_HEX is not prefix_key.h's OMNI_PKEY_HEX"
#endif


typedef struct {
    /* the round robin data must be first */
    ngx_http_upstream_rr_peer_data_t  rrp;
    ngx_http_request_t               *request;
    ngx_http_omni_ctx_t              *ctx;
    ngx_uint_t                        tried;    /* the chosen one was */
} ngx_http_omni_route_peer_data_t;


static ngx_int_t ngx_http_omni_route_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_omni_route_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_omni_route_get_peer(ngx_peer_connection_t *pc,
    void *data);
static ngx_http_upstream_rr_peer_t *ngx_http_omni_route_usable(
    ngx_http_upstream_rr_peers_t *peers, ngx_str_t *name, ngx_uint_t *index,
    time_t now);
static void ngx_http_omni_route_answer(ngx_http_omni_redis_call_t *call,
    redisReply *reply);
static void ngx_http_omni_route_choose(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, redisReply *reply);
static ngx_int_t ngx_http_omni_route_load(redisReply *reply,
    ngx_uint_t *running, ngx_uint_t *waiting);
static void ngx_http_omni_route_result(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_route_e result);
static ngx_int_t ngx_http_omni_route_key(ngx_http_omni_req_t *req,
    OmniPkey key, ngx_uint_t messages, ngx_uint_t total);
static ngx_int_t ngx_http_omni_route_content(yajl_val m, OmniPkey *prev);


static ngx_str_t  ngx_http_omni_route_results[] = {
    ngx_null_string,
    ngx_string("hit"),
    ngx_string("miss"),
    ngx_string("fallback")
};


/* omni_prefix_route [max_waiting=N]; in an upstream block, as hash */

char *
ngx_http_omni_prefix_route(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_srv_conf_t *oscf = conf;

    ngx_int_t                      n;
    ngx_str_t                     *value;
    ngx_uint_t                     i;
    ngx_http_upstream_srv_conf_t  *uscf;

    value = cf->args->elts;

    oscf->max_waiting = 8;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "max_waiting=", 12) == 0) {
            n = ngx_atoi(value[i].data + 12, value[i].len - 12);
            if (n == NGX_ERROR) {
                goto invalid;
            }

            oscf->max_waiting = n;
            continue;
        }

        goto invalid;
    }

    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (uscf->peer.init_upstream) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "load balancing method redefined");
    }

    uscf->flags = NGX_HTTP_UPSTREAM_CREATE
                  |NGX_HTTP_UPSTREAM_WEIGHT
                  |NGX_HTTP_UPSTREAM_MAX_CONNS
                  |NGX_HTTP_UPSTREAM_MAX_FAILS
                  |NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
                  |NGX_HTTP_UPSTREAM_DOWN;

    uscf->peer.init_upstream = ngx_http_omni_route_init_upstream;

    oscf->prefix_route = 1;

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" of \"omni_prefix_route\"",
                       &value[i]);

    return NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_omni_route_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_omni_main_conf_t  *omcf;

    omcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_omni_module);

    if (omcf->redis == NULL || omcf->redis->name.len == 0) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "\"omni_prefix_route\" in upstream \"%V\" needs "
                      "\"omni_redis\": engines publish their prefixes there",
                      &us->host);
        return NGX_ERROR;
    }

    if (ngx_http_upstream_init_round_robin(cf, us) != NGX_OK) {
        return NGX_ERROR;
    }

    us->peer.init = ngx_http_omni_route_init_peer;

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_route_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_omni_route_peer_data_t  *rp;

    rp = ngx_palloc(r->pool, sizeof(ngx_http_omni_route_peer_data_t));
    if (rp == NULL) {
        return NGX_ERROR;
    }

    r->upstream->peer.data = &rp->rrp;

    if (ngx_http_upstream_init_round_robin_peer(r, us) != NGX_OK) {
        return NGX_ERROR;
    }

    r->upstream->peer.get = ngx_http_omni_route_get_peer;

    rp->request = r;
    rp->ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);
    rp->tried = 0;

    return NGX_OK;
}


/* The first try goes to the chosen engine when it can still take it;
 * every other is round robin's (which skips the one tried). */

static ngx_int_t
ngx_http_omni_route_get_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_omni_route_peer_data_t  *rp = data;

    time_t                        now;
    uintptr_t                     m;
    ngx_uint_t                    n, p;
    ngx_http_omni_ctx_t          *ctx;
    ngx_http_upstream_rr_peer_t  *peer;

    ctx = rp->ctx;

    if (rp->tried) {

        /* the chosen engine failed (ngx_http_upstream_next()): the one
         * round robin gives now does not hold the prefix */

        if (ctx->route == NGX_HTTP_OMNI_ROUTE_HIT) {
            ngx_http_omni_route_result(rp->request, ctx,
                                       NGX_HTTP_OMNI_ROUTE_FALLBACK);
        }

        return ngx_http_upstream_get_round_robin_peer(pc, &rp->rrp);
    }

    if (ctx == NULL || ctx->route_engine.len == 0) {
        return ngx_http_upstream_get_round_robin_peer(pc, &rp->rrp);
    }

    rp->tried = 1;
    now = ngx_time();

    ngx_http_upstream_rr_peers_wlock(rp->rrp.peers);

    peer = ngx_http_omni_route_usable(rp->rrp.peers, &ctx->route_engine, &p,
                                      now);

    if (peer == NULL) {
        /* it went down or full since the lookup */

        ngx_http_upstream_rr_peers_unlock(rp->rrp.peers);

        ctx->route_engine.len = 0;
        ngx_http_omni_route_result(rp->request, ctx, NGX_HTTP_OMNI_ROUTE_FALLBACK);

        return ngx_http_upstream_get_round_robin_peer(pc, &rp->rrp);
    }

    rp->rrp.current = peer;

    pc->sockaddr = peer->sockaddr;
    pc->socklen = peer->socklen;
    pc->name = &peer->name;
    pc->cached = 0;
    pc->connection = NULL;

    peer->conns++;

    if (now - peer->checked > peer->fail_timeout) {
        peer->checked = now;
    }

    ngx_http_upstream_rr_peers_unlock(rp->rrp.peers);

    n = p / (8 * sizeof(uintptr_t));
    m = (uintptr_t) 1 << p % (8 * sizeof(uintptr_t));

    rp->rrp.tried[n] |= m;

    return NGX_OK;
}


/* The primary peer of that name when round robin would pick it now (not
 * down, not failed within fail_timeout, under max_conns); its index. The
 * peers are locked by the caller. */

static ngx_http_upstream_rr_peer_t *
ngx_http_omni_route_usable(ngx_http_upstream_rr_peers_t *peers,
    ngx_str_t *name, ngx_uint_t *index, time_t now)
{
    ngx_uint_t                    i;
    ngx_http_upstream_rr_peer_t  *peer;

    for (peer = peers->peer, i = 0; peer; peer = peer->next, i++) {

        if (peer->name.len != name->len
            || ngx_strncmp(peer->name.data, name->data, name->len) != 0)
        {
            continue;
        }

        if (peer->down
            || (peer->max_fails
                && peer->fails >= peer->max_fails
                && now - peer->checked <= peer->fail_timeout)
            || (peer->max_conns && peer->conns >= peer->max_conns))
        {
            return NULL;
        }

        *index = i;

        return peer;
    }

    return NULL;
}


/* ---- the request's keys -------------------------------------------------- */


/*
 * The prefix keys of a chat request (prefix_key.h), from its messages as
 * the engine will see them: req->prefix_keys, in order, each with the
 * number of messages it names; none past a message with audio. The
 * request's parser calls it with the fields it checked (the model, the
 * cache_salt it sends, the messages array). NGX_ERROR: no memory.
 */

ngx_int_t
ngx_http_omni_prefix_keys(ngx_http_request_t *r, ngx_http_omni_req_t *req,
    yajl_val model, ngx_str_t *salt, yajl_val msgs)
{
    size_t      n, i;
    OmniPkey    key;
    const char *m;

    req->prefix_keys = NULL;

    if (msgs == NULL || !YAJL_IS_ARRAY(msgs)) {
        return NGX_OK;
    }

    m = (model && YAJL_IS_STRING(model)) ? model->u.string : "";

    key = omni_pkey_root(m, ngx_strlen(m), (const char *) salt->data,
                         salt->len);

    /* how many messages the chain runs through: up to the first one
     * with audio, or one the engine will refuse */

    n = 0;

    for (i = 0; i < msgs->u.array.len; i++) {
        if (ngx_http_omni_route_content(msgs->u.array.values[i], NULL)
            != NGX_OK)
        {
            break;
        }

        n++;
    }

    if (n == 0) {
        return NGX_OK;
    }

    req->prefix_keys = ngx_array_create(r->pool,
                                        ngx_min(n, OMNI_PKEY_MAX),
                                        sizeof(ngx_http_omni_prefix_key_t));
    if (req->prefix_keys == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        (void) ngx_http_omni_route_content(msgs->u.array.values[i], &key);

        if (omni_pkey_used(i, n)
            && ngx_http_omni_route_key(req, key, i + 1, n) != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_route_key(ngx_http_omni_req_t *req, OmniPkey key,
    ngx_uint_t messages, ngx_uint_t total)
{
    ngx_http_omni_prefix_key_t  *k;

    k = ngx_array_push(req->prefix_keys);
    if (k == NULL) {
        return NGX_ERROR;
    }

    (void) omni_pkey_hex((char *) k->hex, key);
    k->messages = messages;

    return NGX_OK;
}


/*
 * Message m as the engine's chat template gets it: its role ("developer"
 * is "system") and content (a string; text parts joined with "\n"; none
 * for an assistant turn without). With prev, *prev becomes the next key
 * of the chain. NGX_DECLINED: the chain ends before m (audio, or a
 * message the engine refuses).
 */

static ngx_int_t
ngx_http_omni_route_content(yajl_val m, OmniPkey *prev)
{
    size_t         i, len, n;
    yajl_val       role, content, part, type, text;
    const char    *rs;
    OmniPkeyHash   h;

    if (!YAJL_IS_OBJECT(m) || ngx_http_omni_member(m, "audio") != NULL) {
        return NGX_DECLINED;
    }

    role = ngx_http_omni_member(m, "role");

    if (role == NULL || !YAJL_IS_STRING(role)) {
        return NGX_DECLINED;
    }

    rs = role->u.string;

    if (ngx_strcmp(rs, "developer") == 0) {
        rs = "system";

    } else if (ngx_strcmp(rs, "system") != 0 && ngx_strcmp(rs, "user") != 0
               && ngx_strcmp(rs, "assistant") != 0
               && ngx_strcmp(rs, "tool") != 0)
    {
        return NGX_DECLINED;
    }

    content = ngx_http_omni_member(m, "content");

    if (content == NULL) {
        if (ngx_strcmp(rs, "assistant") != 0) {
            return NGX_DECLINED;
        }

        if (prev) {
            *prev = omni_pkey_next(*prev, rs, ngx_strlen(rs), "", 0);
        }

        return NGX_OK;
    }

    if (YAJL_IS_STRING(content)) {
        if (prev) {
            *prev = omni_pkey_next(*prev, rs, ngx_strlen(rs),
                                   content->u.string,
                                   ngx_strlen(content->u.string));
        }

        return NGX_OK;
    }

    if (!YAJL_IS_ARRAY(content)) {
        return NGX_DECLINED;
    }

    /* text parts only, each {"type": "text", "text": "..."} */

    n = content->u.array.len;
    len = n ? n - 1 : 0;

    for (i = 0; i < n; i++) {
        part = content->u.array.values[i];

        /* a part that is not an object has no members to look up: a
         * number's union holds its value where an object's has keys */

        if (!YAJL_IS_OBJECT(part)) {
            return NGX_DECLINED;
        }

        type = ngx_http_omni_member(part, "type");
        text = ngx_http_omni_member(part, "text");

        if (type == NULL || !YAJL_IS_STRING(type)
            || ngx_strcmp(type->u.string, "text") != 0
            || text == NULL || !YAJL_IS_STRING(text))
        {
            return NGX_DECLINED;
        }

        len += ngx_strlen(text->u.string);
    }

    if (prev == NULL) {
        return NGX_OK;
    }

    omni_pkey_begin(&h, *prev, rs, ngx_strlen(rs), len);

    for (i = 0; i < n; i++) {
        if (i > 0) {
            omni_pkey_put(&h, "\n", 1);
        }

        text = ngx_http_omni_member(content->u.array.values[i], "text");
        omni_pkey_put(&h, text->u.string, ngx_strlen(text->u.string));
    }

    *prev = omni_pkey_digest(&h);

    return NGX_OK;
}


/* ---- the lookup ---------------------------------------------------------- */


/*
 * Before the upstream: which engine holds the longest prefix. NGX_OK:
 * nothing to ask (not a prefix-routed upstream, not a chat, or Redis
 * cannot be asked: decided already); NGX_AGAIN: asked,
 * ngx_http_omni_admitted() follows the answer; NGX_ERROR.
 */

ngx_int_t
ngx_http_omni_route_lookup(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_loc_conf_t *olcf)
{
    int                            argc;
    u_char                        *p;
    size_t                        *lens, size;
    ngx_int_t                      rc;
    ngx_uint_t                     i, j, npeers, nkeys;
    const char                   **argv;
    ngx_http_omni_srv_conf_t      *oscf;
    ngx_http_omni_redis_conf_t    *rcf;
    ngx_http_upstream_srv_conf_t  *uscf;
    ngx_http_upstream_rr_peer_t   *peer;
    ngx_http_upstream_rr_peers_t  *peers;
    ngx_http_omni_prefix_key_t    *keys;

    uscf = olcf->upstream.upstream;

    if (uscf == NULL || uscf->peer.init != ngx_http_omni_route_init_peer
        || ctx->endpoint->kind != NGX_HTTP_OMNI_KIND_CHAT)
    {
        return NGX_OK;
    }

    oscf = ngx_http_conf_upstream_srv_conf(uscf, ngx_http_omni_module);

    if (oscf == NULL || !oscf->prefix_route) {
        return NGX_OK;
    }

    if (ctx->req.prefix_keys == NULL || ctx->req.prefix_keys->nelts == 0) {
        ngx_http_omni_route_result(r, ctx, NGX_HTTP_OMNI_ROUTE_MISS);
        return NGX_OK;
    }

    rcf = ngx_http_omni_redis_conf(r);
    peers = uscf->peer.data;
    keys = ctx->req.prefix_keys->elts;
    nkeys = ctx->req.prefix_keys->nelts;

    /* MGET: every engine's load, then for each engine every key */

    ngx_http_upstream_rr_peers_rlock(peers);

    npeers = 0;
    size = 0;

    for (peer = peers->peer; peer; peer = peer->next) {
        npeers++;
        size += peer->name.len
                + (rcf->ns.len + sizeof("load:") - 1 + peer->name.len)
                + nkeys * (rcf->ns.len + sizeof("px::") - 1 + peer->name.len
                           + NGX_HTTP_OMNI_PKEY_HEX);
    }

    argc = 1 + npeers * (1 + nkeys);

    argv = ngx_palloc(r->pool, argc * sizeof(char *));
    lens = ngx_palloc(r->pool, argc * sizeof(size_t));
    p = ngx_pnalloc(r->pool, size);
    ctx->route_peers = ngx_palloc(r->pool, npeers * sizeof(ngx_str_t));

    if (argv == NULL || lens == NULL || p == NULL
        || ctx->route_peers == NULL)
    {
        ngx_http_upstream_rr_peers_unlock(peers);
        return NGX_ERROR;
    }

    argv[0] = "MGET";
    lens[0] = sizeof("MGET") - 1;

    for (peer = peers->peer, i = 0; peer; peer = peer->next, i++) {

        /* the name outlives a reload of the peers: copied */

        ctx->route_peers[i].data = p;
        ctx->route_peers[i].len = peer->name.len;
        p = ngx_cpymem(p, peer->name.data, peer->name.len);

        argv[1 + i] = (const char *) p;
        p = ngx_sprintf(p, "%Vload:%V", &rcf->ns, &peer->name);
        lens[1 + i] = p - (u_char *) argv[1 + i];

        for (j = 0; j < nkeys; j++) {
            argv[1 + npeers + i * nkeys + j] = (const char *) p;
            p = ngx_sprintf(p, "%Vpx:%V:", &rcf->ns, &peer->name);
            p = ngx_cpymem(p, keys[j].hex, NGX_HTTP_OMNI_PKEY_HEX);
            lens[1 + npeers + i * nkeys + j] =
                                   p - (u_char *) argv[1 + npeers + i * nkeys + j];
        }
    }

    ngx_http_upstream_rr_peers_unlock(peers);

    ctx->route_npeers = npeers;

    ctx->route_call.r = r;
    ctx->route_call.handler = ngx_http_omni_route_answer;
    ctx->route_call.data = ctx;

    rc = ngx_http_omni_redis_send(ngx_http_omni_redis(r), &ctx->route_call,
                                  NULL, argc, argv, lens);

    if (rc == NGX_DECLINED) {
        ngx_http_omni_route_result(r, ctx, NGX_HTTP_OMNI_ROUTE_FALLBACK);
        return NGX_OK;
    }

    return (rc == NGX_OK) ? NGX_AGAIN : NGX_ERROR;
}


static void
ngx_http_omni_route_answer(ngx_http_omni_redis_call_t *call,
    redisReply *reply)
{
    ngx_http_request_t   *r;
    ngx_http_omni_ctx_t  *ctx;

    r = call->r;
    ctx = call->data;

    ngx_http_omni_route_choose(r, ctx, reply);

    ngx_http_omni_admitted(r, ctx, NGX_OK, NULL);
}


/* The engine holding the most messages, usable and not overloaded; the
 * less loaded on a tie. */

static void
ngx_http_omni_route_choose(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    redisReply *reply)
{
    time_t                         now;
    ngx_int_t                      tokens;
    ngx_uint_t                     i, j, k, nkeys, best, best_load, held;
    ngx_uint_t                     running, waiting, index;
    redisReply                    *v;
    ngx_http_omni_loc_conf_t      *olcf;
    ngx_http_omni_srv_conf_t      *oscf;
    ngx_http_upstream_srv_conf_t  *uscf;
    ngx_http_upstream_rr_peers_t  *peers;
    ngx_http_omni_prefix_key_t    *keys;

    nkeys = ctx->req.prefix_keys->nelts;
    keys = ctx->req.prefix_keys->elts;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != ctx->route_npeers * (1 + nkeys))
    {
        ngx_http_omni_route_result(r, ctx, NGX_HTTP_OMNI_ROUTE_FALLBACK);
        return;
    }

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);
    uscf = olcf->upstream.upstream;
    oscf = ngx_http_conf_upstream_srv_conf(uscf, ngx_http_omni_module);
    peers = uscf->peer.data;
    now = ngx_time();

    best = ctx->route_npeers;
    best_load = 0;
    held = 0;
    tokens = 0;

    for (i = 0; i < ctx->route_npeers; i++) {

        /* its longest prefix held */

        for (k = nkeys; k > 0; k--) {
            v = reply->element[ctx->route_npeers + i * nkeys + k - 1];

            if (v->type == REDIS_REPLY_STRING) {
                break;
            }
        }

        if (k == 0 || keys[k - 1].messages < held) {
            continue;
        }

        running = 0;
        waiting = 0;

        /* an engine whose load has not been written for its 5 s is gone
         * (its prefixes outlive it until their TTL); one that queues
         * max_waiting requests would make this one wait */

        if (ngx_http_omni_route_load(reply->element[i], &running, &waiting)
            != NGX_OK
            || waiting >= oscf->max_waiting)
        {
            ctx->route_busy = 1;
            continue;
        }

        ngx_http_upstream_rr_peers_rlock(peers);
        j = (ngx_http_omni_route_usable(peers, &ctx->route_peers[i], &index,
                                        now) != NULL);
        ngx_http_upstream_rr_peers_unlock(peers);

        if (!j) {
            ctx->route_busy = 1;
            continue;
        }

        if (best < ctx->route_npeers && keys[k - 1].messages == held
            && running + waiting >= best_load)
        {
            continue;
        }

        best = i;
        best_load = running + waiting;
        held = keys[k - 1].messages;

        tokens = ngx_atoi((u_char *) v->str, v->len);
    }

    if (best == ctx->route_npeers) {
        ngx_http_omni_route_result(r, ctx, ctx->route_busy
                                           ? NGX_HTTP_OMNI_ROUTE_FALLBACK
                                           : NGX_HTTP_OMNI_ROUTE_MISS);
        return;
    }

    ctx->route_engine = ctx->route_peers[best];
    ctx->route_messages = held;
    ctx->route_tokens = (tokens > 0) ? (ngx_uint_t) tokens : 0;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni route: %V holds %ui messages, %i tokens",
                   &ctx->route_engine, held, tokens);

    ngx_http_omni_route_result(r, ctx, NGX_HTTP_OMNI_ROUTE_HIT);
}


/* "RUNNING WAITING MAX_SEQS" (prefix_key.h); NGX_DECLINED: not there, or
 * not that. */

static ngx_int_t
ngx_http_omni_route_load(redisReply *reply, ngx_uint_t *running,
    ngx_uint_t *waiting)
{
    u_char     *p, *last, *sp;
    ngx_int_t   n;

    if (reply->type != REDIS_REPLY_STRING) {
        return NGX_DECLINED;
    }

    p = (u_char *) reply->str;
    last = p + reply->len;

    sp = ngx_strlchr(p, last, ' ');
    if (sp == NULL) {
        return NGX_DECLINED;
    }

    n = ngx_atoi(p, sp - p);
    if (n == NGX_ERROR) {
        return NGX_DECLINED;
    }

    *running = n;

    p = sp + 1;
    sp = ngx_strlchr(p, last, ' ');

    n = ngx_atoi(p, (sp ? sp : last) - p);
    if (n == NGX_ERROR) {
        return NGX_DECLINED;
    }

    *waiting = n;

    return NGX_OK;
}


/* The outcome, once per request (a hit may become a fallback): counted,
 * and said in x-omni-route and the variables. */

static void
ngx_http_omni_route_result(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_route_e result)
{
    ngx_http_omni_counter_e     c;
    ngx_http_omni_main_conf_t  *omcf;

    if (ctx->route == result) {
        return;
    }

    c = (result == NGX_HTTP_OMNI_ROUTE_HIT) ? NGX_HTTP_OMNI_M_ROUTE_HIT
        : (result == NGX_HTTP_OMNI_ROUTE_MISS) ? NGX_HTTP_OMNI_M_ROUTE_MISS
        : NGX_HTTP_OMNI_M_ROUTE_FALLBACK;

    omcf = ngx_http_get_module_main_conf(r, ngx_http_omni_module);

    if (ctx->route == NGX_HTTP_OMNI_ROUTE_HIT) {
        /* a hit that could not be sent there after all: a fallback */
        ngx_http_omni_metric_add(omcf, NGX_HTTP_OMNI_M_ROUTE_HIT, -1);
    }

    ctx->route = result;

    if (result != NGX_HTTP_OMNI_ROUTE_HIT) {
        /* what a holder held, as x-omni-route says it: only for a hit */
        ctx->route_messages = 0;
        ctx->route_tokens = 0;
    }

    ngx_http_omni_metric_add(omcf, c, 1);
}


/*
 * x-omni-route on a routed chat response (the header filter calls it):
 * how the engine was chosen, which one answered, and what it held:
 *
 *   x-omni-route: hit; engine=unix:/run/omni/a.sock; messages=6; tokens=1184
 *   x-omni-route: miss; engine=unix:/run/omni/b.sock
 *
 * omni_route_header off leaves it out (engine addresses are the
 * platform's business, not always its clients').
 */

ngx_int_t
ngx_http_omni_route_header(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char                    *p;
    size_t                     len;
    ngx_str_t                  value, *engine;
    ngx_http_omni_loc_conf_t  *olcf;

    static ngx_str_t  key = ngx_string("x-omni-route");

    if (ctx->route == NGX_HTTP_OMNI_ROUTE_NONE) {
        return NGX_OK;
    }

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (!olcf->route_header) {
        return NGX_OK;
    }

    engine = (r->upstream && r->upstream->peer.name)
             ? r->upstream->peer.name : NULL;

    len = sizeof("fallback; engine=; messages=; tokens=") - 1
          + (engine ? engine->len : 0) + 2 * NGX_INT_T_LEN;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    value.data = p;

    p = ngx_cpymem(p, ngx_http_omni_route_results[ctx->route].data,
                   ngx_http_omni_route_results[ctx->route].len);

    if (engine) {
        p = ngx_sprintf(p, "; engine=%V", engine);
    }

    if (ctx->route == NGX_HTTP_OMNI_ROUTE_HIT) {
        p = ngx_sprintf(p, "; messages=%ui; tokens=%ui", ctx->route_messages,
                        ctx->route_tokens);
    }

    value.len = p - value.data;

    return ngx_http_omni_add_header(r, &key, &value);
}


/* ---- variables ------------------------------------------------------------ */


static ngx_int_t
ngx_http_omni_route_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    u_char               *p;
    ngx_http_omni_ctx_t  *ctx;
    ngx_http_upstream_t  *u;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL || ctx->route == NGX_HTTP_OMNI_ROUTE_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    switch (data) {

    case 0: /* $omni_prefix */
        v->data = ngx_http_omni_route_results[ctx->route].data;
        v->len = ngx_http_omni_route_results[ctx->route].len;
        return NGX_OK;

    case 1: /* $omni_engine: the one that answered */
        u = r->upstream;

        if (u == NULL || u->peer.name == NULL) {
            v->not_found = 1;
            return NGX_OK;
        }

        v->data = u->peer.name->data;
        v->len = u->peer.name->len;
        return NGX_OK;

    default: /* $omni_prefix_messages, $omni_prefix_tokens */
        p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
        if (p == NULL) {
            return NGX_ERROR;
        }

        v->data = p;
        v->len = ngx_sprintf(p, "%ui", data == 2 ? ctx->route_messages
                                                 : ctx->route_tokens)
                 - p;
        return NGX_OK;
    }
}


ngx_int_t
ngx_http_omni_route_add_variables(ngx_conf_t *cf)
{
    ngx_uint_t            i;
    ngx_http_variable_t  *var;

    static ngx_str_t  names[] = {
        ngx_string("omni_prefix"),
        ngx_string("omni_engine"),
        ngx_string("omni_prefix_messages"),
        ngx_string("omni_prefix_tokens")
    };

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        var = ngx_http_add_variable(cf, &names[i], NGX_HTTP_VAR_NOCACHEABLE);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = ngx_http_omni_route_variable;
        var->data = i;
    }

    return NGX_OK;
}

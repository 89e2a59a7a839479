
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_limit.c -- rate limits shared by every nginx of a fleet:
 * requests and tokens per second, minute, hour or day, per key, counted
 * in Redis (omni_redis) by one atomic script.
 *
 *   omni_limit_zone zone=NAME rate=N(r|t)/(s|m|h|d) [burst=N] [key=VALUE];
 *   omni_limit NAME ...;
 *   omni_limit_fail open | closed;
 *
 * A limit is a bucket of burst units (a whole period's rate by default)
 * that refills at its rate, continuously: the generic cell rate
 * algorithm, one number per key in Redis, the time at which the bucket
 * will be full again. A request takes one unit of each requests limit;
 * tokens are taken as they become known. All limits of a location are
 * checked by one script run, atomically, and a request refused by one is
 * charged to none. The script reads Redis's own clock (TIME), so nginx
 * instances with skewed clocks agree.
 *
 * When, in a request's life:
 *
 *   preaccess  (ngx_http_omni_limit_handler, like limit_req) one unit of
 *              each requests limit; a tokens limit only refuses when its
 *              bucket is empty. The request waits for the answer, its
 *              client watched (a client that leaves ends it).
 *   admission  (ngx_http_omni_limit_admit, once the body is parsed) the
 *              prompt's tokens, estimated as the engine request's bytes
 *              / 4; refused when the bucket does not hold them, and at
 *              once (no Redis) when the bucket could never hold them.
 *   the end    (the log phase) the estimate corrected by what the
 *              engine's DONE says: prompt and completion tokens,
 *              streaming or not. Sent and forgotten; a bucket may go into
 *              debt, which later requests wait out.
 *
 * The key is any nginx value (key=$binary_remote_addr); by default the
 * request's API key (its Bearer token, when omni_api_keys knows it). It
 * is hashed (SHA-1) before it goes anywhere: Redis never holds a key in
 * clear. An empty key is not limited, as limit_req does.
 *
 * Answers carry OpenAI's headers for the tightest requests limit and the
 * tightest tokens limit: x-ratelimit-{limit,remaining,reset}-requests and
 * -tokens; a refusal is a 429 with OpenAI's error (type "requests" or
 * "tokens", code rate_limit_exceeded) and retry-after / retry-after-ms.
 * When Redis does not answer (down, or slower than omni_redis's timeout),
 * omni_limit_fail decides: open lets the request through (no headers, no
 * charge), closed answers 503.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <ngx_sha1.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_redis.h"


typedef enum {
    NGX_HTTP_OMNI_LIMIT_REQUESTS = 0,
    NGX_HTTP_OMNI_LIMIT_TOKENS
} ngx_http_omni_limit_kind_e;


/* A zone's counters, shared by the workers and kept across reloads. */
typedef struct {
    ngx_atomic_t                   allowed;
    ngx_atomic_t                   refused;
} ngx_http_omni_limit_sh_t;


/* omni_limit_zone */
typedef struct {
    ngx_str_t                      name;
    ngx_http_omni_limit_kind_e     kind;
    ngx_uint_t                     rate;        /* units per period */
    ngx_msec_t                     period;
    ngx_uint_t                     burst;       /* the bucket's units */
    ngx_http_complex_value_t      *key;         /* NULL: the API key */
    ngx_str_t                      interval;    /* microseconds a unit
                                                   takes to come back, as
                                                   the script's argument */
    ngx_str_t                      capacity;    /* burst, as text */
    ngx_http_omni_limit_sh_t      *sh;
    ngx_shm_zone_t                *shm_zone;
} ngx_http_omni_limit_zone_t;


/* One limit as the script answered for it. */
typedef struct {
    ngx_http_omni_limit_zone_t    *zone;
    ngx_str_t                      key;         /* the Redis key */
    ngx_int_t                      remaining;
    ngx_msec_t                     reset;       /* until full again */
    ngx_msec_t                     retry;       /* until it would take
                                                   this request: refused
                                                   when not 0 */
} ngx_http_omni_limit_entry_t;


/* A request's limits (ctx->limit). */
struct ngx_http_omni_limit_s {
    ngx_http_omni_redis_call_t     call;
    ngx_http_omni_limit_entry_t   *entries;
    ngx_uint_t                     n;
    ngx_int_t                      charged;     /* tokens taken at
                                                   admission, -1: none */
    ngx_uint_t                     cost;        /* what was asked for */
    ngx_http_omni_limit_entry_t   *refused;
    ngx_table_elt_t               *tokens_h[3]; /* limit, remaining and
                                                   reset -tokens, to update
                                                   at admission */
    unsigned                       waiting:1;   /* preaccess: in Redis */
    unsigned                       checked:1;
    unsigned                       closed:1;    /* omni_limit_fail closed
                                                   decided: 503 */
    unsigned                       open:1;      /* ... open: no charges */
    unsigned                       tokens:1;    /* a tokens limit applies */
};


static ngx_int_t ngx_http_omni_limit_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_omni_limit_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_loc_conf_t *olcf);
static ngx_http_omni_limit_t *ngx_http_omni_limit_find(ngx_http_request_t *r);
static void ngx_http_omni_limit_cleanup(void *data);
static void ngx_http_omni_limit_checked(ngx_http_omni_redis_call_t *call,
    redisReply *reply);
static void ngx_http_omni_limit_charged(ngx_http_omni_redis_call_t *call,
    redisReply *reply);
static void ngx_http_omni_limit_refund(ngx_http_request_t *r,
    ngx_http_omni_limit_t *lim);
static ngx_int_t ngx_http_omni_limit_log_handler(ngx_http_request_t *r);
static ngx_uint_t ngx_http_omni_limit_of_kinds(ngx_http_omni_limit_t *lim,
    ngx_uint_t kinds);
static ngx_int_t ngx_http_omni_limit_send(ngx_http_request_t *r,
    ngx_http_omni_limit_t *lim, ngx_uint_t kinds, const char *mode,
    ngx_int_t cost, ngx_http_omni_redis_call_t *call);
static ngx_int_t ngx_http_omni_limit_read(ngx_http_omni_limit_t *lim,
    ngx_uint_t kinds, redisReply *reply);
static ngx_int_t ngx_http_omni_limit_failed(ngx_http_request_t *r,
    ngx_http_omni_limit_t *lim, ngx_http_omni_loc_conf_t *olcf);
static ngx_int_t ngx_http_omni_limit_headers(ngx_http_request_t *r,
    ngx_http_omni_limit_t *lim, ngx_uint_t kind);
static ngx_int_t ngx_http_omni_limit_refusal(ngx_http_request_t *r,
    ngx_http_omni_limit_t *lim, ngx_http_omni_limit_entry_t *e,
    ngx_uint_t too_large, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_limit_unavailable(ngx_http_request_t *r,
    ngx_http_omni_error_t *err);
static u_char *ngx_http_omni_limit_duration(u_char *p, ngx_msec_t ms);
static void ngx_http_omni_count_limit(ngx_http_omni_limit_zone_t *zone,
    ngx_uint_t allowed);
static ngx_int_t ngx_http_omni_limit_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);


/*
 * The script. KEYS: one per limit. ARGV[1]: "check" (all limits take
 * their cost, or none does: refused when one cannot; a cost of 0 only
 * asks that one unit be left) or "force" (they take it whatever it does
 * to them: corrections, which may be negative). Then three per limit:
 * microseconds per unit, the bucket's units, the cost. Answers
 * {ok, then per limit: units left, ms until full, ms until it would take
 * the cost (0: it would now)}. The arithmetic is on d, how far the
 * bucket's time is ahead of now, never on the times themselves: T is
 * fractional and now about 2^51 us, where a double's rounding would make
 * a bucket of exactly n units left read n - 1, or refuse a cost that fits
 * exactly.
 */

static ngx_http_omni_redis_script_t  ngx_http_omni_limit_script = {
    ngx_string("omni_limit"),
    ngx_string(
"local t = redis.call('TIME')\n"
"local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
"local force = ARGV[1] == 'force'\n"
"local ok = 1\n"
"local due, retry = {}, {}\n"
"for i = 1, #KEYS do\n"
"  local T = tonumber(ARGV[3 * i - 1])\n"
"  local cap = tonumber(ARGV[3 * i])\n"
"  local cost = tonumber(ARGV[3 * i + 1])\n"
"  local d = (tonumber(redis.call('GET', KEYS[i]) or '0') or 0) - now\n"
"  if d < 0 then d = 0 end\n"
"  due[i] = d\n"
"  local need = cost\n"
"  if need < 1 then need = 1 end\n"
"  local at = d + (need - cap) * T\n"
"  retry[i] = 0\n"
"  if at > 0 then\n"
"    retry[i] = math.ceil(at / 1000)\n"
"    if not force then ok = 0 end\n"
"  end\n"
"end\n"
"local out = {ok}\n"
"for i = 1, #KEYS do\n"
"  local T = tonumber(ARGV[3 * i - 1])\n"
"  local cap = tonumber(ARGV[3 * i])\n"
"  local cost = tonumber(ARGV[3 * i + 1])\n"
"  local d = due[i]\n"
"  if (ok == 1 or force) and cost ~= 0 then\n"
"    d = d + cost * T\n"
"    if d > 0 then\n"
"      redis.call('SET', KEYS[i], string.format('%.0f', now + d), 'PX',\n"
"                 math.ceil(d / 1000) + 1000)\n"
"    else\n"
"      d = 0\n"
"      redis.call('DEL', KEYS[i])\n"
"    end\n"
"    if ok == 1 then retry[i] = 0 end\n"
"  end\n"
"  local left = math.floor(cap - d / T + 1e-6)\n"
"  if left < 0 then left = 0 end\n"
"  out[3 * i - 1] = left\n"
"  out[3 * i] = math.ceil(d / 1000)\n"
"  out[3 * i + 1] = retry[i]\n"
"end\n"
"return out\n"),
    { 0 }
};


static ngx_str_t  ngx_http_omni_limit_kinds[] = {
    ngx_string("requests"), ngx_string("tokens")
};

/* OpenAI's words for a limit, by kind and period */
static char  *ngx_http_omni_limit_words[2][4] = {
    { "requests per sec (RPS)", "requests per min (RPM)",
      "requests per hour (RPH)", "requests per day (RPD)" },
    { "tokens per sec (TPS)", "tokens per min (TPM)",
      "tokens per hour (TPH)", "tokens per day (TPD)" }
};

static ngx_str_t  ngx_http_omni_limit_h[2][3] = {
    { ngx_string("x-ratelimit-limit-requests"),
      ngx_string("x-ratelimit-remaining-requests"),
      ngx_string("x-ratelimit-reset-requests") },
    { ngx_string("x-ratelimit-limit-tokens"),
      ngx_string("x-ratelimit-remaining-tokens"),
      ngx_string("x-ratelimit-reset-tokens") }
};


/* omni_limit_zone zone=NAME rate=N(r|t)/(s|m|h|d) [burst=N] [key=VALUE] */

char *
ngx_http_omni_limit_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_main_conf_t *omcf = conf;

    u_char                            *p, *last;
    ngx_int_t                          n;
    ngx_str_t                         *value, name, shm_name;
    ngx_uint_t                         i;
    ngx_shm_zone_t                    *shm_zone, **zp;
    ngx_http_omni_limit_zone_t        *zone;
    ngx_http_compile_complex_value_t   ccv;

    zone = ngx_pcalloc(cf->pool, sizeof(ngx_http_omni_limit_zone_t));
    if (zone == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    ngx_str_null(&name);

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
            name.data = value[i].data + 5;
            name.len = value[i].len - 5;

            if (name.len == 0) {
                goto invalid;
            }

            continue;
        }

        if (ngx_strncmp(value[i].data, "rate=", 5) == 0) {
            p = value[i].data + 5;
            last = value[i].data + value[i].len;

            if (last - p < 4 || last[-2] != '/') {
                goto invalid;
            }

            switch (last[-1]) {
            case 's':
                zone->period = 1000;
                break;
            case 'm':
                zone->period = 60 * 1000;
                break;
            case 'h':
                zone->period = 60 * 60 * 1000;
                break;
            case 'd':
                zone->period = 24 * 60 * 60 * 1000;
                break;
            default:
                goto invalid;
            }

            switch (last[-3]) {
            case 'r':
                zone->kind = NGX_HTTP_OMNI_LIMIT_REQUESTS;
                break;
            case 't':
                zone->kind = NGX_HTTP_OMNI_LIMIT_TOKENS;
                break;
            default:
                goto invalid;
            }

            n = ngx_atoi(p, last - 3 - p);
            if (n <= 0) {
                goto invalid;
            }

            zone->rate = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "burst=", 6) == 0) {
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (n <= 0) {
                goto invalid;
            }

            zone->burst = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "key=", 4) == 0) {
            if (value[i].len == 4) {
                goto invalid;
            }

            zone->key = ngx_palloc(cf->pool,
                                   sizeof(ngx_http_complex_value_t));
            if (zone->key == NULL) {
                return NGX_CONF_ERROR;
            }

            value[i].data += 4;
            value[i].len -= 4;

            ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

            ccv.cf = cf;
            ccv.value = &value[i];
            ccv.complex_value = zone->key;

            if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
                return NGX_CONF_ERROR;
            }

            continue;
        }

        goto invalid;
    }

    if (name.len == 0 || zone->rate == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must have \"zone=\" and \"rate=\"",
                           &cmd->name);
        return NGX_CONF_ERROR;
    }

    if (zone->burst == 0) {
        zone->burst = zone->rate;
    }

    zone->name = name;

    /* the script's arguments, once: a unit's microseconds (to 1 ns, so
     * that a high rate keeps its precision) and the bucket's size */

    zone->interval.data = ngx_pnalloc(cf->pool, NGX_INT64_LEN + 8);
    zone->capacity.data = ngx_pnalloc(cf->pool, NGX_INT_T_LEN);
    if (zone->interval.data == NULL || zone->capacity.data == NULL) {
        return NGX_CONF_ERROR;
    }

    zone->interval.len = ngx_sprintf(zone->interval.data, "%.3f",
                                     (double) zone->period * 1000.0
                                     / (double) zone->rate)
                         - zone->interval.data;
    zone->capacity.len = ngx_sprintf(zone->capacity.data, "%ui",
                                     zone->burst)
                         - zone->capacity.data;

    /* the counters: a shared zone of its own, found by the name */

    shm_name.len = sizeof("omni_limit:") - 1 + name.len;
    shm_name.data = ngx_pnalloc(cf->pool, shm_name.len);
    if (shm_name.data == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_sprintf(shm_name.data, "omni_limit:%V", &name);

    shm_zone = ngx_shared_memory_add(cf, &shm_name, 8 * ngx_pagesize,
                                     &ngx_http_omni_module);
    if (shm_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    if (shm_zone->data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "omni_limit_zone \"%V\" is duplicate", &name);
        return NGX_CONF_ERROR;
    }

    shm_zone->init = ngx_http_omni_limit_init_zone;
    shm_zone->data = zone;

    zone->shm_zone = shm_zone;

    if (omcf->limit_zones.elts == NULL
        && ngx_array_init(&omcf->limit_zones, cf->pool, 4,
                          sizeof(ngx_shm_zone_t *))
           != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    zp = ngx_array_push(&omcf->limit_zones);
    if (zp == NULL) {
        return NGX_CONF_ERROR;
    }

    *zp = shm_zone;

    if (ngx_http_omni_redis_add_script(cf, &ngx_http_omni_limit_script)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;

invalid:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\" of \"%V\"", &value[i],
                       &cmd->name);

    return NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_omni_limit_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    ngx_http_omni_limit_zone_t  *ozone = data;

    ngx_slab_pool_t             *shpool;
    ngx_http_omni_limit_zone_t  *zone;

    zone = shm_zone->data;

    if (ozone) {
        /* a reload: the counts go on */
        zone->sh = ozone->sh;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        zone->sh = shpool->data;
        return NGX_OK;
    }

    zone->sh = ngx_slab_calloc(shpool, sizeof(ngx_http_omni_limit_sh_t));
    if (zone->sh == NULL) {
        return NGX_ERROR;
    }

    shpool->data = zone->sh;

    return NGX_OK;
}


/* omni_limit NAME ... */

char *
ngx_http_omni_limit(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_omni_loc_conf_t *olcf = conf;

    ngx_str_t        *value, shm_name;
    ngx_uint_t        i, j;
    ngx_shm_zone_t  **zp;

    if (olcf->limits != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    olcf->limits = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                    sizeof(ngx_shm_zone_t *));
    if (olcf->limits == NULL) {
        return NGX_CONF_ERROR;
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {

        if (ngx_strcmp(value[i].data, "off") == 0 && cf->args->nelts == 2) {
            olcf->limits = NULL;
            return NGX_CONF_OK;
        }

        shm_name.len = sizeof("omni_limit:") - 1 + value[i].len;
        shm_name.data = ngx_pnalloc(cf->pool, shm_name.len);
        if (shm_name.data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_sprintf(shm_name.data, "omni_limit:%V", &value[i]);

        /* a zone defined later in the configuration is found then: one
         * never defined, by ngx_http_omni_limit_init() */

        zp = ngx_array_push(olcf->limits);
        if (zp == NULL) {
            return NGX_CONF_ERROR;
        }

        *zp = ngx_shared_memory_add(cf, &shm_name, 0, &ngx_http_omni_module);
        if (*zp == NULL) {
            return NGX_CONF_ERROR;
        }

        for (j = 0; j + 1 < olcf->limits->nelts; j++) {
            if (((ngx_shm_zone_t **) olcf->limits->elts)[j] == *zp) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "omni_limit \"%V\" is listed twice",
                                   &value[i]);
                return NGX_CONF_ERROR;
            }
        }
    }

    return NGX_CONF_OK;
}


ngx_int_t
ngx_http_omni_limit_init(ngx_conf_t *cf)
{
    ngx_uint_t                  i;
    ngx_shm_zone_t             *shm_zone;
    ngx_list_part_t            *part;
    ngx_http_handler_pt        *h;
    ngx_http_omni_main_conf_t  *omcf;
    ngx_http_core_main_conf_t  *cmcf;

    /* a name omni_limit gave that no omni_limit_zone defines would be
     * nginx's "zero size shared memory zone": said in our words */

    part = &cf->cycle->shared_memory.part;
    shm_zone = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            shm_zone = part->elts;
            i = 0;
        }

        if (shm_zone[i].tag != &ngx_http_omni_module
            || shm_zone[i].data != NULL
            || shm_zone[i].shm.name.len <= sizeof("omni_limit:") - 1
            || ngx_strncmp(shm_zone[i].shm.name.data, "omni_limit:",
                           sizeof("omni_limit:") - 1)
               != 0)
        {
            continue;
        }

        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "omni_limit \"%*s\": no \"omni_limit_zone zone=%*s\" "
                      "is defined",
                      shm_zone[i].shm.name.len - (sizeof("omni_limit:") - 1),
                      shm_zone[i].shm.name.data + sizeof("omni_limit:") - 1,
                      shm_zone[i].shm.name.len - (sizeof("omni_limit:") - 1),
                      shm_zone[i].shm.name.data + sizeof("omni_limit:") - 1);
        return NGX_ERROR;
    }

    omcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_omni_module);

    if (omcf->limit_zones.nelts == 0) {
        return NGX_OK;
    }

    if (omcf->redis == NULL || omcf->redis->name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"omni_limit_zone\" needs \"omni_redis\": the "
                           "limits are counted in Redis");
        return NGX_ERROR;
    }

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_omni_limit_handler;

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_omni_limit_log_handler;

    return NGX_OK;
}


/* ---- preaccess ---------------------------------------------------------- */


static ngx_int_t
ngx_http_omni_limit_handler(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_error_t      err;
    ngx_http_omni_limit_t     *lim;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (olcf->limits == NULL || r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_omni_get_ctx(r, olcf);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    lim = ctx->limit;

    if (lim == NULL && r->internal) {
        /* an internal redirect: checked once, in the first location */
        lim = ngx_http_omni_limit_find(r);
        ctx->limit = lim;
    }

    if (lim == NULL) {
        return ngx_http_omni_limit_start(r, ctx, olcf);
    }

    if (lim->waiting) {
        return NGX_AGAIN;
    }

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    if (lim->closed) {
        rc = ngx_http_omni_limit_unavailable(r, &err);

    } else if (lim->refused) {
        rc = ngx_http_omni_limit_refusal(r, lim, lim->refused, 0, &err);

    } else {
        return NGX_DECLINED;
    }

    if (rc != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_BAD_REQUEST;
    }

    ngx_http_finalize_request(r, ngx_http_omni_send_error(r, &err));

    return NGX_DONE;
}


/* The request's limits: their keys (hashed), then the check. */

static ngx_int_t
ngx_http_omni_limit_start(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_loc_conf_t *olcf)
{
    u_char                       *p, digest[20];
    ngx_int_t                     rc;
    ngx_str_t                     value;
    ngx_uint_t                    i, tokens;
    ngx_sha1_t                    sha1;
    ngx_shm_zone_t              **zones;
    ngx_pool_cleanup_t           *cln;
    ngx_http_omni_limit_t        *lim;
    ngx_http_omni_redis_conf_t   *rcf;
    ngx_http_omni_limit_zone_t   *zone;
    ngx_http_omni_limit_entry_t  *e;

    lim = ngx_pcalloc(r->pool, sizeof(ngx_http_omni_limit_t));
    if (lim == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    lim->entries = ngx_pcalloc(r->pool, olcf->limits->nelts
                                        * sizeof(ngx_http_omni_limit_entry_t));
    if (lim->entries == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    lim->charged = -1;
    ctx->limit = lim;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_omni_limit_cleanup;
    cln->data = lim;

    rcf = ngx_http_omni_redis_conf(r);

    /* tokens are counted only where the engine makes them */
    tokens = ctx->endpoint != NULL
             && (ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_CHAT
                 || ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_COMPLETION
                 || ctx->endpoint->kind == NGX_HTTP_OMNI_KIND_SPEECH);

    zones = olcf->limits->elts;

    for (i = 0; i < olcf->limits->nelts; i++) {
        zone = zones[i]->data;

        if (zone->kind == NGX_HTTP_OMNI_LIMIT_TOKENS && !tokens) {
            continue;
        }

        if (zone->key) {
            if (ngx_http_complex_value(r, zone->key, &value) != NGX_OK) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            if (value.len == 0) {
                continue;
            }

        } else if (ngx_http_omni_api_key(r, olcf, &value) != NGX_OK) {
            continue;
        }

        ngx_sha1_init(&sha1);
        ngx_sha1_update(&sha1, value.data, value.len);
        ngx_sha1_final(digest, &sha1);

        e = &lim->entries[lim->n++];
        e->zone = zone;

        e->key.len = rcf->ns.len + sizeof("limit::") - 1 + zone->name.len
                     + 2 * sizeof(digest);
        e->key.data = ngx_pnalloc(r->pool, e->key.len);
        if (e->key.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        p = ngx_sprintf(e->key.data, "%Vlimit:%V:", &rcf->ns, &zone->name);
        ngx_hex_dump(p, digest, sizeof(digest));

        if (zone->kind == NGX_HTTP_OMNI_LIMIT_TOKENS) {
            lim->tokens = 1;
        }
    }

    if (lim->n == 0) {
        return NGX_DECLINED;
    }

    lim->call.r = r;
    lim->call.handler = ngx_http_omni_limit_checked;
    lim->call.data = ctx;

    rc = ngx_http_omni_limit_send(r, lim, 3, "check", 1, &lim->call);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        rc = ngx_http_omni_limit_failed(r, lim, olcf);
        return (rc == NGX_OK) ? NGX_DECLINED
                              : ngx_http_omni_limit_handler(r);
    }

    /* wait for Redis, watching the client */

    lim->waiting = 1;

    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_request_empty_handler;

    return NGX_AGAIN;
}


/*
 * An internal redirect (error_page, try_files) resets the module's
 * context, not the request: the limits it checked and charged are found
 * again in the pool's cleanup list (as ngx_http_realip_module finds its
 * address), so that a request is checked once, as limit_req does, and
 * corrected once. NULL: none checked.
 */

static ngx_http_omni_limit_t *
ngx_http_omni_limit_find(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t  *cln;

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_omni_limit_cleanup) {
            return cln->data;
        }
    }

    return NULL;
}


static void
ngx_http_omni_limit_cleanup(void *data)
{
    /* nothing to release: a mark for ngx_http_omni_limit_find() */
}


static void
ngx_http_omni_limit_checked(ngx_http_omni_redis_call_t *call,
    redisReply *reply)
{
    ngx_connection_t          *c;
    ngx_http_request_t        *r;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_limit_t     *lim;
    ngx_http_omni_loc_conf_t  *olcf;

    r = call->r;
    ctx = call->data;
    lim = ctx->limit;

    /* the request may be freed by the phases run below (a refusal, an
     * error): its connection is kept for the posted requests */
    c = r->connection;

    lim->waiting = 0;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (ngx_http_omni_limit_read(lim, 3, reply) != NGX_OK) {
        (void) ngx_http_omni_limit_failed(r, lim, olcf);

    } else if (ngx_http_omni_limit_headers(r, lim,
                                           NGX_HTTP_OMNI_LIMIT_REQUESTS)
               != NGX_OK
               || ngx_http_omni_limit_headers(r, lim,
                                              NGX_HTTP_OMNI_LIMIT_TOKENS)
                  != NGX_OK)
    {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        ngx_http_run_posted_requests(c);
        return;
    }

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


/*
 * Redis did not answer: omni_limit_fail decides. Open: the request goes
 * on uncounted and uncharged (NGX_OK); closed: 503 (lim->closed,
 * NGX_DECLINED). Counted either way; the connection has logged the
 * outage.
 */

static ngx_int_t
ngx_http_omni_limit_failed(ngx_http_request_t *r, ngx_http_omni_limit_t *lim,
    ngx_http_omni_loc_conf_t *olcf)
{
    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni limit: redis %s, failing %s",
                   ngx_http_omni_redis_fault_text(lim->call.fault),
                   olcf->limit_fail ? "open" : "closed");

    if (olcf->limit_fail) {
        lim->open = 1;
        ngx_http_omni_count(r, NGX_HTTP_OMNI_M_LIMIT_FAIL_OPEN);
        return NGX_OK;
    }

    lim->closed = 1;
    ngx_http_omni_count(r, NGX_HTTP_OMNI_M_LIMIT_FAIL_CLOSED);

    return NGX_DECLINED;
}


/* ---- admission and the end ---------------------------------------------- */


/*
 * The prompt's tokens, once the body is parsed: NGX_OK (taken, or no
 * tokens limit); NGX_AGAIN: asked, ngx_http_omni_admitted() follows the
 * answer; NGX_DECLINED: refused, err filled (a 429, or the 503 of
 * omni_limit_fail closed); NGX_ERROR.
 */

ngx_int_t
ngx_http_omni_limit_admit(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    ngx_int_t                     rc;
    ngx_uint_t                    i, cost;
    ngx_http_omni_limit_t        *lim;
    ngx_http_omni_limit_entry_t  *e;
    ngx_http_omni_loc_conf_t     *olcf;

    lim = ctx->limit;

    if (lim == NULL || !lim->tokens || lim->open || !lim->checked
        || lim->charged >= 0)
    {
        /* none, or taken before an internal redirect */
        return NGX_OK;
    }

    /* about four bytes a token: corrected at the end */

    cost = (ctx->req.engine.len + 3) / 4;

    if (cost == 0) {
        return NGX_OK;
    }

    lim->cost = cost;

    for (i = 0; i < lim->n; i++) {
        e = &lim->entries[i];

        if (e->zone->kind == NGX_HTTP_OMNI_LIMIT_TOKENS
            && cost > e->zone->burst)
        {
            /* no wait would make room for it */
            ngx_http_omni_count_limit(e->zone, 0);
            ngx_http_omni_limit_refund(r, lim);
            return ngx_http_omni_limit_refusal(r, lim, e, 1, err) == NGX_OK
                   ? NGX_DECLINED : NGX_ERROR;
        }
    }

    lim->call.handler = ngx_http_omni_limit_charged;

    rc = ngx_http_omni_limit_send(r, lim, 1 << NGX_HTTP_OMNI_LIMIT_TOKENS,
                                  "check", cost, &lim->call);

    if (rc == NGX_OK) {
        /* sent: the request waits for ngx_http_omni_limit_charged() */
        return NGX_AGAIN;
    }

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    if (ngx_http_omni_limit_failed(r, lim, olcf) == NGX_OK) {
        return NGX_OK;
    }

    return ngx_http_omni_limit_unavailable(r, err) == NGX_OK ? NGX_DECLINED
                                                             : NGX_ERROR;
}


static void
ngx_http_omni_limit_charged(ngx_http_omni_redis_call_t *call,
    redisReply *reply)
{
    ngx_int_t                  rc;
    ngx_http_request_t        *r;
    ngx_http_omni_ctx_t       *ctx;
    ngx_http_omni_error_t      err;
    ngx_http_omni_limit_t     *lim;
    ngx_http_omni_loc_conf_t  *olcf;

    r = call->r;
    ctx = call->data;
    lim = ctx->limit;

    ngx_memzero(&err, sizeof(ngx_http_omni_error_t));

    rc = ngx_http_omni_limit_read(lim, 1 << NGX_HTTP_OMNI_LIMIT_TOKENS,
                                  reply);

    if (rc != NGX_OK) {
        olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

        if (ngx_http_omni_limit_failed(r, lim, olcf) == NGX_OK) {
            ngx_http_omni_admitted(r, ctx, NGX_OK, NULL);
            return;
        }

        rc = ngx_http_omni_limit_unavailable(r, &err);

    } else {
        if (!lim->refused) {
            lim->charged = lim->cost;
        }

        rc = ngx_http_omni_limit_headers(r, lim, NGX_HTTP_OMNI_LIMIT_TOKENS);

        if (rc == NGX_OK && !lim->refused) {
            ngx_http_omni_admitted(r, ctx, NGX_OK, NULL);
            return;
        }

        if (rc == NGX_OK) {
            ngx_http_omni_limit_refund(r, lim);
            rc = ngx_http_omni_limit_refusal(r, lim, lim->refused, 0, &err);
        }
    }

    ngx_http_omni_admitted(r, ctx, rc == NGX_OK ? NGX_DECLINED : NGX_ERROR,
                           &err);
}


/* Refused at admission: the unit each requests limit took in preaccess
 * is given back, so that a request refused by one limit is charged to
 * none. Sent and forgotten; when Redis does not take it, the unit stays
 * taken (fails closed: a client refused a little sooner, never one let
 * through more). */

static void
ngx_http_omni_limit_refund(ngx_http_request_t *r, ngx_http_omni_limit_t *lim)
{
    ngx_http_omni_redis_call_t  call;

    ngx_memzero(&call, sizeof(ngx_http_omni_redis_call_t));

    (void) ngx_http_omni_limit_send(r, lim, 1 << NGX_HTTP_OMNI_LIMIT_REQUESTS,
                                    "force", -1, &call);
}


/* The end: what the engine said the request cost, less what admission
 * took; a request without a DONE keeps its estimate. */

static ngx_int_t
ngx_http_omni_limit_log_handler(ngx_http_request_t *r)
{
    ngx_int_t                    used, delta;
    ngx_http_omni_ctx_t         *ctx;
    ngx_http_omni_limit_t       *lim;
    ngx_http_omni_redis_call_t   call;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL || r != r->main) {
        return NGX_OK;
    }

    /* after an internal redirect to a location without limits, the
     * estimate taken before it */

    lim = ctx->limit ? ctx->limit : ngx_http_omni_limit_find(r);

    if (lim == NULL || lim->charged < 0 || !ctx->usage_seen) {
        return NGX_OK;
    }

    used = (ngx_int_t) ctx->usage.prompt_tokens
           + (ngx_int_t) ctx->usage.completion_tokens;
    delta = used - lim->charged;

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni limit: %i tokens used, %i charged, %i more",
                   used, lim->charged, delta);

    if (delta == 0) {
        return NGX_OK;
    }

    ngx_memzero(&call, sizeof(ngx_http_omni_redis_call_t));

    /* sent and forgotten: the request is over */

    (void) ngx_http_omni_limit_send(r, lim, 1 << NGX_HTTP_OMNI_LIMIT_TOKENS,
                                    "force", delta, &call);

    return NGX_OK;
}


/* ---- the script's arguments and answers --------------------------------- */


/* How many of the request's limits are of the kinds whose bits are set
 * (1 << kind). */

static ngx_uint_t
ngx_http_omni_limit_of_kinds(ngx_http_omni_limit_t *lim, ngx_uint_t kinds)
{
    ngx_uint_t  i, n;

    n = 0;

    for (i = 0; i < lim->n; i++) {
        if (kinds & (1 << lim->entries[i].zone->kind)) {
            n++;
        }
    }

    return n;
}


/*
 * One run of the script over the request's limits of the kinds whose
 * bits are set (1 << kind), in mode, each limit taking cost; in preaccess
 * (both kinds) requests limits take 1, tokens limits 0 ("is one left").
 * call->r NULL: forgotten. Returns what ngx_http_omni_redis_send() does.
 */

static ngx_int_t
ngx_http_omni_limit_send(ngx_http_request_t *r, ngx_http_omni_limit_t *lim,
    ngx_uint_t kinds, const char *mode, ngx_int_t cost,
    ngx_http_omni_redis_call_t *call)
{
    int                           argc, k, nk;
    u_char                       *p;
    size_t                       *lens;
    ngx_uint_t                    i;
    const char                  **argv;
    ngx_http_omni_limit_entry_t  *e;

    nk = ngx_http_omni_limit_of_kinds(lim, kinds);

    if (nk == 0) {
        call->fault = NGX_HTTP_OMNI_REDIS_OK;
        return NGX_OK;
    }

    argc = 2 + nk * 4;

    argv = ngx_palloc(r->pool, argc * sizeof(char *));
    lens = ngx_palloc(r->pool, argc * sizeof(size_t));
    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN * (nk + 1));

    if (argv == NULL || lens == NULL || p == NULL) {
        return NGX_ERROR;
    }

    /* numkeys, the keys, the mode, three per limit */

    argv[0] = (const char *) p;
    lens[0] = ngx_sprintf(p, "%d", nk) - p;
    p += lens[0];

    argv[1 + nk] = mode;
    lens[1 + nk] = ngx_strlen(mode);

    k = 0;

    for (i = 0; i < lim->n; i++) {
        e = &lim->entries[i];

        if (!(kinds & (1 << e->zone->kind))) {
            continue;
        }

        argv[1 + k] = (const char *) e->key.data;
        lens[1 + k] = e->key.len;

        argv[2 + nk + 3 * k] = (const char *) e->zone->interval.data;
        lens[2 + nk + 3 * k] = e->zone->interval.len;
        argv[3 + nk + 3 * k] = (const char *) e->zone->capacity.data;
        lens[3 + nk + 3 * k] = e->zone->capacity.len;

        argv[4 + nk + 3 * k] = (const char *) p;
        lens[4 + nk + 3 * k] = ngx_sprintf(p, "%i",
                                           kinds != 3
                                           ? cost
                                           : (e->zone->kind
                                              == NGX_HTTP_OMNI_LIMIT_REQUESTS))
                               - p;
        p += lens[4 + nk + 3 * k];

        k++;
    }

    return ngx_http_omni_redis_send(ngx_http_omni_redis(r), call,
                                    &ngx_http_omni_limit_script, argc, argv,
                                    lens);
}


/* The script's answer for the limits of kinds, into their entries;
 * lim->refused: the first limit that refused. NGX_DECLINED: no usable
 * answer (none, an error, a shape not the script's). */

static ngx_int_t
ngx_http_omni_limit_read(ngx_http_omni_limit_t *lim, ngx_uint_t kinds,
    redisReply *reply)
{
    ngx_uint_t                    i, j, k, nk;
    redisReply                  **el;
    ngx_http_omni_limit_entry_t  *e;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
        return NGX_DECLINED;
    }

    nk = ngx_http_omni_limit_of_kinds(lim, kinds);

    if (reply->elements != 1 + 3 * nk) {
        return NGX_DECLINED;
    }

    el = reply->element;

    for (j = 0; j < reply->elements; j++) {
        if (el[j]->type != REDIS_REPLY_INTEGER || el[j]->integer < 0) {
            return NGX_DECLINED;
        }
    }

    lim->checked = 1;
    lim->refused = NULL;

    k = 0;

    for (i = 0; i < lim->n; i++) {
        e = &lim->entries[i];

        if (!(kinds & (1 << e->zone->kind))) {
            continue;
        }

        e->remaining = (ngx_int_t) el[1 + 3 * k]->integer;
        e->reset = (ngx_msec_t) el[2 + 3 * k]->integer;
        e->retry = (ngx_msec_t) el[3 + 3 * k]->integer;

        if (el[0]->integer == 0 && e->retry > 0 && lim->refused == NULL) {
            lim->refused = e;
        }

        k++;
    }

    if (el[0]->integer == 0 && lim->refused == NULL) {
        /* refused, yet none says why: not the script's answer */
        return NGX_DECLINED;
    }

    if (lim->refused) {
        ngx_http_omni_count_limit(lim->refused->zone, 0);

    } else {
        for (i = 0; i < lim->n; i++) {
            if (kinds & (1 << lim->entries[i].zone->kind)) {
                ngx_http_omni_count_limit(lim->entries[i].zone, 1);
            }
        }
    }

    return NGX_OK;
}


/* ---- answers ------------------------------------------------------------- */


/* x-ratelimit-*-KIND of the limit of that kind with the fewest units
 * left; the tokens trio is set again (updated) at admission. */

static ngx_int_t
ngx_http_omni_limit_headers(ngx_http_request_t *r, ngx_http_omni_limit_t *lim,
    ngx_uint_t kind)
{
    u_char                       *p;
    ngx_str_t                     v[3];
    ngx_uint_t                    i;
    ngx_table_elt_t              *h;
    ngx_http_omni_limit_entry_t  *e, *min;

    min = NULL;

    for (i = 0; i < lim->n; i++) {
        e = &lim->entries[i];

        if (e->zone->kind == kind
            && (min == NULL || e->remaining < min->remaining))
        {
            min = e;
        }
    }

    if (min == NULL) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, 3 * NGX_INT_T_LEN + 32);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v[0].data = p;
    v[0].len = ngx_sprintf(p, "%ui", min->zone->burst) - p;
    p += v[0].len;

    v[1].data = p;
    v[1].len = ngx_sprintf(p, "%i", min->remaining) - p;
    p += v[1].len;

    v[2].data = p;
    v[2].len = ngx_http_omni_limit_duration(p, min->reset) - p;

    for (i = 0; i < 3; i++) {

        h = (kind == NGX_HTTP_OMNI_LIMIT_TOKENS) ? lim->tokens_h[i] : NULL;

        if (h) {
            h->value = v[i];
            continue;
        }

        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        h->hash = 1;
        h->key = ngx_http_omni_limit_h[kind][i];
        h->value = v[i];
        h->lowcase_key = NULL;

        if (kind == NGX_HTTP_OMNI_LIMIT_TOKENS) {
            lim->tokens_h[i] = h;
        }
    }

    return NGX_OK;
}


/*
 * The 429 of limit e: OpenAI's words ("Rate limit reached for requests
 * per min (RPM) ..."), or, too_large, those of a request no wait would
 * let through; retry-after and retry-after-ms with it. NGX_ERROR: no
 * memory.
 */

static ngx_int_t
ngx_http_omni_limit_refusal(ngx_http_request_t *r, ngx_http_omni_limit_t *lim,
    ngx_http_omni_limit_entry_t *e, ngx_uint_t too_large,
    ngx_http_omni_error_t *err)
{
    u_char                      *p, *wait;
    size_t                       len;
    ngx_str_t                    v;
    ngx_uint_t                   period, asked;
    ngx_http_omni_limit_zone_t  *zone;

    static ngx_str_t  retry_key = ngx_string("retry-after");
    static ngx_str_t  retry_ms_key = ngx_string("retry-after-ms");
    static ngx_str_t  should_key = ngx_string("x-should-retry");
    static ngx_str_t  should_no = ngx_string("false");

    zone = e->zone;

    period = (zone->period == 1000) ? 0
             : (zone->period == 60000) ? 1
             : (zone->period == 3600000) ? 2 : 3;

    asked = (zone->kind == NGX_HTTP_OMNI_LIMIT_REQUESTS) ? 1 : lim->cost;

    len = sizeof("Request too large for  in omni_limit_zone \"\": Limit , "
                 "Used , Requested . Please try again in .") - 1
          + 32 + zone->name.len + 4 * NGX_INT_T_LEN + 32;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    err->message.data = p;

    if (too_large) {
        p = ngx_sprintf(p, "Request too large for %s in omni_limit_zone "
                        "\"%V\": Limit %ui, Requested %ui. The input is "
                        "too long for this limit: send a shorter one.",
                        ngx_http_omni_limit_words[zone->kind][period],
                        &zone->name, zone->burst, asked);

    } else {
        p = ngx_sprintf(p, "Rate limit reached for %s in omni_limit_zone "
                        "\"%V\": Limit %ui, Used %ui, Requested %ui. "
                        "Please try again in ",
                        ngx_http_omni_limit_words[zone->kind][period],
                        &zone->name, zone->burst,
                        zone->burst - ngx_min((ngx_uint_t) e->remaining,
                                              zone->burst),
                        asked);
        p = ngx_http_omni_limit_duration(p, e->retry);
        *p++ = '.';
    }

    err->message.len = p - err->message.data;
    err->status = NGX_HTTP_TOO_MANY_REQUESTS;
    err->type = ngx_http_omni_limit_kinds[zone->kind];
    ngx_str_set(&err->code, "rate_limit_exceeded");
    ngx_str_null(&err->param);

    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "omni limit: refused by omni_limit_zone \"%V\"%s",
                  &zone->name, too_large ? " (too large)" : "");

    if (too_large) {
        return ngx_http_omni_add_header(r, &should_key, &should_no);
    }

    wait = ngx_pnalloc(r->pool, 2 * NGX_INT_T_LEN);
    if (wait == NULL) {
        return NGX_ERROR;
    }

    v.data = wait;
    v.len = ngx_sprintf(wait, "%M", ngx_max((e->retry + 999) / 1000, 1))
            - wait;

    if (ngx_http_omni_add_header(r, &retry_key, &v) != NGX_OK) {
        return NGX_ERROR;
    }

    v.data = wait + v.len;
    v.len = ngx_sprintf(v.data, "%M", e->retry) - v.data;

    return ngx_http_omni_add_header(r, &retry_ms_key, &v);
}


/* omni_limit_fail closed: 503 (Retry-After 1, as for an engine that may
 * be back soon). */

static ngx_int_t
ngx_http_omni_limit_unavailable(ngx_http_request_t *r,
    ngx_http_omni_error_t *err)
{
    err->status = NGX_HTTP_SERVICE_UNAVAILABLE;
    ngx_str_set(&err->type, "server_error");
    ngx_str_set(&err->code, "rate_limit_unavailable");
    ngx_str_null(&err->param);
    ngx_str_set(&err->message, "The rate limiter is not available, please "
                               "try again later.");

    return NGX_OK;
}


/* A Go duration, as OpenAI's reset headers write it: "0s", "20ms",
 * "1.5s", "54s", "6m0s", "1h2m3.004s". */

static u_char *
ngx_http_omni_limit_duration(u_char *p, ngx_msec_t ms)
{
    ngx_msec_t  h, m, s, frac;

    if (ms < 1000) {
        return (ms == 0) ? ngx_cpymem(p, "0s", 2) : ngx_sprintf(p, "%Mms", ms);
    }

    h = ms / 3600000;
    m = ms / 60000 % 60;
    s = ms / 1000 % 60;
    frac = ms % 1000;

    if (h) {
        p = ngx_sprintf(p, "%Mh", h);
    }

    if (h || m) {
        p = ngx_sprintf(p, "%Mm", m);
    }

    p = ngx_sprintf(p, "%M", s);

    if (frac) {
        p = ngx_sprintf(p, ".%03M", frac);

        while (p[-1] == '0') {
            p--;
        }
    }

    *p++ = 's';

    return p;
}


/* ---- metrics -------------------------------------------------------------- */


static void
ngx_http_omni_count_limit(ngx_http_omni_limit_zone_t *zone,
    ngx_uint_t allowed)
{
    if (zone->sh == NULL) {
        return;
    }

    (void) ngx_atomic_fetch_add(allowed ? &zone->sh->allowed
                                        : &zone->sh->refused, 1);
}


static char  ngx_http_omni_limit_metrics_head[] =
    "# HELP omni_nginx_limit_total Limit checks by omni_limit_zone, allowed"
    " or refused (429).\n"
    "# TYPE omni_nginx_limit_total counter\n";


size_t
ngx_http_omni_limit_metrics_len(ngx_http_omni_main_conf_t *omcf)
{
    size_t                       len;
    ngx_uint_t                   i;
    ngx_shm_zone_t             **zp;
    ngx_http_omni_limit_zone_t  *zone;

    len = sizeof(ngx_http_omni_limit_metrics_head) - 1;
    zp = omcf->limit_zones.elts;

    for (i = 0; i < omcf->limit_zones.nelts; i++) {
        zone = zp[i]->data;
        len += 2 * (sizeof("omni_nginx_limit_total{zone=\"\","
                           "result=\"refused\"} \n") - 1
                    + 2 * zone->name.len + NGX_ATOMIC_T_LEN);
    }

    return len;
}


u_char *
ngx_http_omni_limit_metrics(u_char *p, ngx_http_omni_main_conf_t *omcf)
{
    ngx_uint_t                   i;
    ngx_shm_zone_t             **zp;
    ngx_http_omni_limit_zone_t  *zone;

    if (omcf->limit_zones.nelts == 0) {
        return p;
    }

    p = ngx_cpymem(p, ngx_http_omni_limit_metrics_head,
                   sizeof(ngx_http_omni_limit_metrics_head) - 1);

    zp = omcf->limit_zones.elts;

    for (i = 0; i < omcf->limit_zones.nelts; i++) {
        zone = zp[i]->data;

        if (zone->sh == NULL) {
            continue;
        }

        /* a zone name is a configuration token: escape what a label
         * cannot hold as it is */

        p = ngx_sprintf(p, "omni_nginx_limit_total{zone=\"");
        p = (u_char *) ngx_escape_json(p, zone->name.data, zone->name.len);
        p = ngx_sprintf(p, "\",result=\"allowed\"} %uA\n",
                        zone->sh->allowed);

        p = ngx_sprintf(p, "omni_nginx_limit_total{zone=\"");
        p = (u_char *) ngx_escape_json(p, zone->name.data, zone->name.len);
        p = ngx_sprintf(p, "\",result=\"refused\"} %uA\n",
                        zone->sh->refused);
    }

    return p;
}

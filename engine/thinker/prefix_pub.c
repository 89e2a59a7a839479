/* prefix_pub.c -- the publisher thread; what it writes and when is in
 * prefix_pub.h.
 *
 * Two sides share the queue, under one mutex: the stage's main thread
 * appends (pub_push, O(1), never waits for Redis), the publisher takes
 * everything queued at once into its drain buffer and works on that
 * without the lock. Everything else (the mirror, the connection, the
 * timers) is the thread's alone.
 *
 * The mirror is a hash set of the keys held, chained through arrays sized
 * at start like the prefix index's. An entry is live (held: a SET is
 * owed or done) or dead (a DEL is owed); changed entries wait on the
 * dirty list for the next flush, which writes them as one pipeline.
 * While a full resync is due (no connection, a failure, a RESET) the
 * dirty list stays empty: the resync writes everything anyway.
 *
 * A failure of any kind (connect, I/O, timeout, an error reply) closes
 * the connection and schedules a reconnect with a full resync, rather
 * than retrying the one command: after a timeout the connection's replies
 * can no longer be matched to its commands, and every other failure is
 * rare enough that one code path for all of them is worth more than the
 * writes a targeted retry would save. */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "prefix_pub.h"

#define PUB_PIPE        256         // commands per pipeline round trip
#define PUB_BACKOFF_MIN 0.1         // s, doubling
#define PUB_BACKOFF_MAX 5.0
#define PUB_SCAN_COUNT  "1000"
#define PUB_QUEUE_MIN   1024
#define PUB_NS_MAX      64
#define PUB_ROUTE_MAX   255
#define PUB_KEY_MAX     (PUB_NS_MAX + 3 + PUB_ROUTE_MAX + 1 + OMNI_PKEY_HEX)

typedef struct {
    OmniPkey key;
    int32_t  tokens;
    int32_t  hnext;             // bucket chain, -1 ends
    int32_t  dnext;             // dirty list, or the free list
    bool     used;
    bool     live;              // held; false: a DEL is owed
    bool     dirty;             // on the dirty list
} MEntry;

/* What failed, for the log line. */
typedef enum {
    F_NONE = 0, F_REFUSED, F_TIMEOUT, F_CLOSED, F_AUTH, F_REPLY, F_OTHER,
} Fail;

/* An outage is logged once, and again only if its class changes: Redis
 * unreachable (refused, timed out, closed: the usual restart goes through
 * several) or Redis refusing us (a wrong password: what to fix). */
static bool refusal(Fail f) {
    return f == F_AUTH || f == F_REPLY;
}

struct Publisher {
    PubConfig        c;             // its strings point into strs
    char            *strs;          // owned copies of c's strings
    char             password[PUB_PASSWORD_MAX];
    pthread_t        thread;
    bool             started;
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    /* under mu */
    PubOp           *q;             // (q_cap,) ring, owned
    int64_t          q_cap, q_head, q_n;
    bool             stop;
    /* from the thread to the main thread */
    atomic_bool      want_resend;
    /* the thread's */
    PubOp           *batch;         // (q_cap,) drained ops, owned
    MEntry          *m;             // (m_cap,) the mirror, owned
    int32_t         *buckets;       // (mask + 1,) owned
    uint64_t         mask;
    int64_t          m_cap;
    int32_t          m_free;        // free list through dnext
    int32_t          dirty_head, dirty_tail;
    int64_t          n_live;
    redisContext    *rc;            // NULL while disconnected
    bool             resync;        // everything is to be rewritten
    double           retry_at;      // next connect attempt
    double           backoff;
    double           next_refresh, next_load;
    Fail             logged;        // the outage's last log line; F_NONE:
                                    //   none logged, or up
    double           down_since;
    bool             ever_up;
    int              n_pipe;        // commands appended, replies unread
    char             key[PUB_KEY_MAX + 1];  // NS px:ROUTE: then the hex
    size_t           key_pfx;
    char             load_key[PUB_NS_MAX + 5 + PUB_ROUTE_MAX + 1];
    char             pattern[2 * (PUB_NS_MAX + 3 + PUB_ROUTE_MAX + 1)
                             + OMNI_PKEY_HEX + 1];
    char             ttl[16];       // ttl_s in decimal
};


/* ---- Configuration ------------------------------------------------------ */

int redis_addr_parse(const char *s, RedisAddr *a, Err *err) {
    const char *colon, *host;
    char       *end;
    long        port;
    size_t      hl;

    memset(a, 0, sizeof(*a));
    if (strncmp(s, "unix:", 5) == 0) {
        if (s[5] == '\0' || strlen(s + 5) >= sizeof(a->path)) {
            return err_set(err, "'%s': a Unix socket path of 1 to %zu bytes "
                           "after 'unix:'", s, sizeof(a->path) - 1);
        }
        a->unix_sock = true;
        snprintf(a->path, sizeof(a->path), "%s", s + 5);
        return 0;
    }
    colon = strrchr(s, ':');
    if (colon == NULL) {
        return err_set(err, "'%s' is neither unix:/path nor host:port", s);
    }
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port < 1
        || port > 65535)
    {
        return err_set(err, "'%s': the port must be 1..65535", s);
    }
    host = s;
    hl = (size_t) (colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        host++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof(a->host)) {
        return err_set(err, "'%s': the host must be 1 to %zu bytes", s,
                       sizeof(a->host) - 1);
    }
    memcpy(a->host, host, hl);
    a->port = (int) port;
    return 0;
}

int redis_read_password(const char *path, char *out, size_t cap, Err *err) {
    FILE  *f = fopen(path, "r");
    size_t n;

    if (f == NULL) return err_set(err, "%s: %s", path, strerror(errno));
    if (fgets(out, (int) cap, f) == NULL) out[0] = '\0';
    fclose(f);
    n = strcspn(out, "\r\n");
    if (out[n] == '\0' && n == cap - 1) {
        explicit_bzero(out, cap);
        return err_set(err, "%s: the password is longer than %zu bytes",
                       path, cap - 2);
    }
    out[n] = '\0';
    if (n == 0) return err_set(err, "%s: the first line is empty", path);
    return 0;
}

/* p->strs: one block holding copies of c's strings; c's pointers moved
 * to them. */
static int copy_strings(Publisher *p, const PubConfig *c, Err *err) {
    const char *src[] = { c->addr_text, c->user, c->ns, c->route };
    const char **dst[] = { &p->c.addr_text, &p->c.user, &p->c.ns,
                           &p->c.route };
    size_t       total = 0, at = 0;

    for (int i = 0; i < 4; i++) total += src[i] ? strlen(src[i]) + 1 : 0;
    p->strs = malloc(total + 1);
    if (p->strs == NULL) return err_set(err, "out of memory");
    for (int i = 0; i < 4; i++) {
        if (src[i] == NULL) continue;
        *dst[i] = p->strs + at;
        memcpy(p->strs + at, src[i], strlen(src[i]) + 1);
        at += strlen(src[i]) + 1;
    }
    if (c->password != NULL) {
        snprintf(p->password, sizeof(p->password), "%s", c->password);
        p->c.password = p->password;
    }
    return 0;
}

/* s with glob's special characters escaped, for SCAN MATCH. */
static void glob_escape(char *out, const char *s) {
    for (; *s != '\0'; s++) {
        if (strchr("*?[]\\", *s) != NULL) *out++ = '\\';
        *out++ = *s;
    }
    *out = '\0';
}

static int make_names(Publisher *p, Err *err) {
    const PubConfig *c = &p->c;
    size_t           n;

    if (strlen(c->ns) > PUB_NS_MAX || strlen(c->route) > PUB_ROUTE_MAX
        || c->route[0] == '\0')
    {
        return err_set(err, "the namespace must be at most %d bytes and the "
                       "route id 1 to %d", PUB_NS_MAX, PUB_ROUTE_MAX);
    }
    p->key_pfx = (size_t) snprintf(p->key, sizeof(p->key), "%spx:%s:",
                                   c->ns, c->route);
    snprintf(p->load_key, sizeof(p->load_key), "%sload:%s", c->ns,
             c->route);
    glob_escape(p->pattern, p->key);
    n = strlen(p->pattern);
    memset(p->pattern + n, '?', OMNI_PKEY_HEX);
    p->pattern[n + OMNI_PKEY_HEX] = '\0';
    snprintf(p->ttl, sizeof(p->ttl), "%d", c->ttl_s);
    return 0;
}


/* ---- The mirror --------------------------------------------------------- */

static int32_t *m_bucket(Publisher *p, OmniPkey k) {
    return &p->buckets[k.lo & p->mask];
}

static int32_t m_find(Publisher *p, OmniPkey k) {
    for (int32_t i = *m_bucket(p, k); i >= 0; i = p->m[i].hnext) {
        if (p->m[i].key.hi == k.hi && p->m[i].key.lo == k.lo) return i;
    }
    return -1;
}

/* A new entry for k, or -1 when the mirror is full. */
static int32_t m_take(Publisher *p, OmniPkey k) {
    int32_t i = p->m_free, *head;

    if (i < 0) return -1;
    p->m_free = p->m[i].dnext;
    head = m_bucket(p, k);
    p->m[i] = (MEntry) { .key = k, .hnext = *head, .dnext = -1,
                         .used = true };
    *head = i;
    return i;
}

/* Frees entry i, which is on no dirty list. */
static void m_release(Publisher *p, int32_t i) {
    int32_t *link = m_bucket(p, p->m[i].key);

    while (*link != i) link = &p->m[*link].hnext;
    *link = p->m[i].hnext;
    if (p->m[i].live) p->n_live--;
    p->m[i].used = false;
    p->m[i].dnext = p->m_free;
    p->m_free = i;
}

static void mark_dirty(Publisher *p, int32_t i) {
    if (p->resync || p->m[i].dirty) return;
    p->m[i].dirty = true;
    p->m[i].dnext = -1;
    if (p->dirty_tail >= 0) p->m[p->dirty_tail].dnext = i;
    else p->dirty_head = i;
    p->dirty_tail = i;
}

/* Empties the dirty list: a resync rewrites everything, so the dead
 * entries go and the live ones need nothing of their own. */
static void dirty_drop(Publisher *p) {
    int32_t i = p->dirty_head, next;

    for (; i >= 0; i = next) {
        next = p->m[i].dnext;
        p->m[i].dirty = false;
        if (!p->m[i].live) m_release(p, i);
    }
    p->dirty_head = p->dirty_tail = -1;
}

/* Every entry goes: a RESET. */
static void m_clear(Publisher *p) {
    dirty_drop(p);
    for (int64_t i = 0; i < p->m_cap; i++) {
        if (p->m[i].used) m_release(p, (int32_t) i);
    }
}

static void apply_set(Publisher *p, const PubOp *op) {
    int32_t i = m_find(p, op->key);

    if (i < 0 && (i = m_take(p, op->key)) < 0) {
        atomic_store(&p->want_resend, true);
        return;
    }
    if (!p->m[i].live) p->n_live++;
    p->m[i].live = true;
    p->m[i].tokens = op->tokens;
    mark_dirty(p, i);
}

static void apply_del(Publisher *p, const PubOp *op) {
    int32_t i = m_find(p, op->key);

    if (i < 0) return;
    if (p->resync) {                        // the resync's SCAN removes it
        m_release(p, i);
        return;
    }
    if (p->m[i].live) p->n_live--;
    p->m[i].live = false;
    mark_dirty(p, i);
}

static void apply(Publisher *p, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        const PubOp *op = &p->batch[k];

        switch (op->type) {
        case PUB_SET:   apply_set(p, op); break;
        case PUB_DEL:   apply_del(p, op); break;
        case PUB_RESET: m_clear(p); p->resync = true; break;
        }
    }
}


/* ---- Failures and the log ----------------------------------------------- */

static void stat_set(_Atomic int64_t *g, int64_t v) {
    atomic_store_explicit(g, v, memory_order_relaxed);
}

static void stat_add(_Atomic uint64_t *c, uint64_t n) {
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static const char *fail_words(Fail f) {
    static const char *w[] = {
        [F_NONE] = "", [F_REFUSED] = "cannot connect",
        [F_TIMEOUT] = "timed out", [F_CLOSED] = "connection closed",
        [F_AUTH] = "authentication failed", [F_REPLY] = "command refused",
        [F_OTHER] = "connection failed",
    };

    return w[f];
}

/* The kind of failure a context's error is. */
static Fail ctx_fail(const redisContext *rc) {
    const char *s = rc->errstr;

    if (rc->err == REDIS_ERR_EOF) return F_CLOSED;
    if (strstr(s, "refused") != NULL || strstr(s, "No such file") != NULL) {
        return F_REFUSED;
    }
    if (strstr(s, "timed out") != NULL
        || strstr(s, "temporarily unavailable") != NULL)
    {
        return F_TIMEOUT;
    }
    return F_OTHER;
}

/* Closes the connection after a failure and schedules the reconnect (and
 * its full resync). The log line goes out once per outage (see refusal):
 * what was being done, the kind, and detail (Redis's error, or the
 * system's). */
static void fail(Publisher *p, Fail kind, const char *doing,
                 const char *detail)
{
    double now = clock_now_s();

    if (kind == F_TIMEOUT || kind == F_CLOSED) {
        detail = NULL;                  // the kind says it all
    }
    if (p->logged == F_NONE || refusal(p->logged) != refusal(kind)) {
        if (p->logged == F_NONE) p->down_since = now;
        log_msg(refusal(kind) ? LOG_ERROR : LOG_WARN,
                "thinker: redis %s: %s: %s%s%s%s; prefix keys are not "
                "published until it works, retrying", p->c.addr_text,
                doing, fail_words(kind), detail ? " (\"" : "",
                detail ? detail : "", detail ? "\")" : "");
        p->logged = kind;
    }
    if (p->rc != NULL) redisFree(p->rc);
    p->rc = NULL;
    p->n_pipe = 0;
    dirty_drop(p);
    p->resync = true;
    p->retry_at = now + p->backoff;
    p->backoff = p->backoff * 2 < PUB_BACKOFF_MAX ? p->backoff * 2
                                                  : PUB_BACKOFF_MAX;
    if (p->c.stats != NULL) {
        stat_set(&p->c.stats->thinker.redis_up, 0);
        stat_add(&p->c.stats->thinker.redis_errors, 1);
    }
}

/* Whether reply (NULL: the context failed) is an answer rather than a
 * failure; on a failure, fails the connection (doing: what for). */
static bool reply_ok(Publisher *p, redisReply *reply, const char *doing) {
    if (reply == NULL) {
        fail(p, ctx_fail(p->rc), doing, p->rc->errstr);
        return false;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        bool auth = strncmp(reply->str, "NOAUTH", 6) == 0
                    || strncmp(reply->str, "WRONGPASS", 9) == 0
                    || strcmp(doing, "AUTH") == 0;

        fail(p, auth ? F_AUTH : F_REPLY, doing, reply->str);
        freeReplyObject(reply);
        return false;
    }
    return true;
}


/* ---- Commands ----------------------------------------------------------- */

/* One command, its reply returned (the caller frees it), or NULL after
 * the failure. */
static redisReply *command(Publisher *p, const char *doing, int argc,
                           const char **argv, const size_t *lens)
{
    redisReply *r = redisCommandArgv(p->rc, argc, argv, lens);

    return reply_ok(p, r, doing) ? r : NULL;
}

/* Reads the replies of the pipeline. Returns 0, or -1 after the
 * failure. */
static int pipe_finish(Publisher *p, const char *doing) {
    while (p->n_pipe > 0) {
        void *r = NULL;

        if (redisGetReply(p->rc, &r) != REDIS_OK) r = NULL;
        if (!reply_ok(p, r, doing)) return -1;
        freeReplyObject(r);
        p->n_pipe--;
    }
    return 0;
}

/* Appends a command to the pipeline, reading the replies every PUB_PIPE
 * commands. Returns 0, or -1 after a failure. */
static int pipe_add(Publisher *p, const char *doing, int argc,
                    const char **argv, const size_t *lens)
{
    if (redisAppendCommandArgv(p->rc, argc, argv, lens) != REDIS_OK) {
        fail(p, F_OTHER, doing, "out of memory");
        return -1;
    }
    return ++p->n_pipe < PUB_PIPE ? 0 : pipe_finish(p, doing);
}

/* Entry i's key name, in p->key (key_pfx + 32 bytes). */
static size_t key_of(Publisher *p, OmniPkey k) {
    omni_pkey_hex(p->key + p->key_pfx, k);
    return p->key_pfx + OMNI_PKEY_HEX;
}

static int add_set(Publisher *p, const MEntry *e, const char *doing) {
    char        tokens[16];
    const char *argv[5] = { "SET", p->key, tokens, "EX", p->ttl };
    size_t      lens[5] = { 3, key_of(p, e->key), 0, 2, strlen(p->ttl) };

    lens[2] = (size_t) snprintf(tokens, sizeof(tokens), "%d", e->tokens);
    return pipe_add(p, doing, 5, argv, lens);
}

static int add_unlink(Publisher *p, const MEntry *e, const char *doing) {
    const char *argv[2] = { "UNLINK", p->key };
    size_t      lens[2] = { 6, key_of(p, e->key) };

    return pipe_add(p, doing, 2, argv, lens);
}

/* SET (and so refresh) every live key. */
static int set_all(Publisher *p, const char *doing) {
    for (int64_t i = 0; i < p->m_cap; i++) {
        if (p->m[i].used && p->m[i].live
            && add_set(p, &p->m[i], doing) != 0)
        {
            return -1;
        }
    }
    return pipe_finish(p, doing);
}

/* Writes the dirty entries: SETs for live ones, UNLINKs for dead ones
 * (which then leave the mirror). */
static int flush(Publisher *p) {
    while (p->dirty_head >= 0) {
        int32_t i = p->dirty_head;
        MEntry *e = &p->m[i];
        int     rc;

        p->dirty_head = e->dnext;
        if (p->dirty_head < 0) p->dirty_tail = -1;
        e->dirty = false;
        rc = e->live ? add_set(p, e, "SET") : add_unlink(p, e, "UNLINK");
        if (!e->live) m_release(p, i);
        if (rc != 0) return -1;
    }
    return pipe_finish(p, "SET");
}

static int set_load(Publisher *p) {
    char        v[64];
    const char *argv[5] = { "SET", p->load_key, v, "EX", NULL };
    size_t      lens[5] = { 3, strlen(p->load_key), 0, 2, 0 };
    char        ttl[8];
    int64_t     run = 0, wait = 0;
    redisReply *r;

    if (p->c.stats != NULL) {
        run = atomic_load_explicit(&p->c.stats->requests_running,
                                   memory_order_relaxed);
        wait = atomic_load_explicit(&p->c.stats->requests_waiting,
                                    memory_order_relaxed);
    }
    lens[2] = (size_t) snprintf(v, sizeof(v), "%" PRId64 " %" PRId64 " %d",
                                run, wait, p->c.max_seqs);
    lens[4] = (size_t) snprintf(ttl, sizeof(ttl), "%d", PUB_LOAD_TTL_S);
    argv[4] = ttl;
    r = command(p, "SET load", 5, argv, lens);
    if (r == NULL) return -1;
    freeReplyObject(r);
    return 0;
}


/* ---- Connecting and the full resync ------------------------------------- */

/* Parses a key SCAN returned (our prefix, then 32 hex digits). */
static bool key_parse(const Publisher *p, const char *s, size_t n,
                      OmniPkey *k)
{
    uint64_t v[2] = { 0, 0 };

    if (n != p->key_pfx + OMNI_PKEY_HEX
        || memcmp(s, p->key, p->key_pfx) != 0)
    {
        return false;
    }
    s += p->key_pfx;
    for (int i = 0; i < OMNI_PKEY_HEX; i++) {
        char c = s[i];
        int  d = c >= '0' && c <= '9' ? c - '0'
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

        if (d < 0) return false;
        v[i / 16] = v[i / 16] << 4 | (uint64_t) d;
    }
    *k = (OmniPkey) { v[0], v[1] };
    return true;
}

/* UNLINKs n keys (argv[1..n]) in one command. */
static int unlink_keys(Publisher *p, const char **argv, size_t *lens,
                       int n)
{
    redisReply *r;

    if (n == 0) return 0;
    argv[0] = "UNLINK";
    lens[0] = 6;
    r = command(p, "UNLINK", n + 1, argv, lens);
    if (r == NULL) return -1;
    freeReplyObject(r);
    return 0;
}

/* UNLINKs the keys of one SCAN batch that the mirror does not hold, up to
 * PUB_PIPE a command. */
static int unlink_stale(Publisher *p, const redisReply *keys) {
    const char *argv[1 + PUB_PIPE];
    size_t      lens[1 + PUB_PIPE];
    int         n = 0;

    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        OmniPkey          key;
        int32_t           e;

        if (k->type != REDIS_REPLY_STRING) continue;
        if (key_parse(p, k->str, k->len, &key) && (e = m_find(p, key)) >= 0
            && p->m[e].live)
        {
            continue;
        }
        argv[1 + n] = k->str;
        lens[1 + n] = k->len;
        if (++n == PUB_PIPE) {
            if (unlink_keys(p, argv, lens, n) != 0) return -1;
            n = 0;
        }
    }
    return unlink_keys(p, argv, lens, n);
}

/* Every key of ours in Redis that the mirror does not hold goes: what an
 * earlier incarnation of this engine (or of this connection) left. */
static int scan_clean(Publisher *p) {
    char cursor[32] = "0";

    do {
        const char *argv[6] = { "SCAN", cursor, "MATCH", p->pattern,
                                "COUNT", PUB_SCAN_COUNT };
        size_t      lens[6] = { 4, strlen(cursor), 5, strlen(p->pattern), 5,
                                strlen(PUB_SCAN_COUNT) };
        redisReply *r = command(p, "SCAN", 6, argv, lens);
        int         rc;

        if (r == NULL) return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2
            || r->element[0]->type != REDIS_REPLY_STRING
            || r->element[1]->type != REDIS_REPLY_ARRAY)
        {
            freeReplyObject(r);
            fail(p, F_REPLY, "SCAN", "an unexpected reply");
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        rc = unlink_stale(p, r->element[1]);
        freeReplyObject(r);
        if (rc != 0) return -1;
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

static int resync_all(Publisher *p) {
    dirty_drop(p);
    if (scan_clean(p) != 0 || set_all(p, "SET") != 0) return -1;
    p->resync = false;
    if (p->c.stats != NULL) stat_add(&p->c.stats->thinker.prefix_resyncs, 1);
    return 0;
}

/* AUTH and SELECT as configured. Returns 0, or -1 after the failure. */
static int login(Publisher *p) {
    const char *argv[3];
    size_t      lens[3];
    char        db[16];
    int         n = 0;
    redisReply *r;

    if (p->c.password != NULL) {
        argv[n] = "AUTH";
        lens[n++] = 4;
        if (p->c.user != NULL) {
            argv[n] = p->c.user;
            lens[n++] = strlen(p->c.user);
        }
        argv[n] = p->c.password;
        lens[n++] = strlen(p->c.password);
        if ((r = command(p, "AUTH", n, argv, lens)) == NULL) return -1;
        freeReplyObject(r);
    }
    if (p->c.db > 0) {
        argv[0] = "SELECT";
        lens[0] = 6;
        argv[1] = db;
        lens[1] = (size_t) snprintf(db, sizeof(db), "%d", p->c.db);
        if ((r = command(p, "SELECT", 2, argv, lens)) == NULL) return -1;
        freeReplyObject(r);
    }
    return 0;
}

static void say_up(Publisher *p, double now) {
    if (p->logged != F_NONE) {
        log_msg(LOG_INFO, "thinker: redis %s is back after %.1f s; %" PRId64
                " prefix keys published again", p->c.addr_text,
                now - p->down_since, p->n_live);
    } else if (!p->ever_up) {
        log_msg(LOG_INFO, "thinker: publishing prefix keys to redis %s as "
                "%spx:%s:* (ttl %d s)", p->c.addr_text, p->c.ns,
                p->c.route, p->c.ttl_s);
    }
    p->logged = F_NONE;
    p->ever_up = true;
}

static void connect_redis(Publisher *p) {
    struct timeval tv = { PUB_TIMEOUT_MS / 1000,
                          (PUB_TIMEOUT_MS % 1000) * 1000 };
    double         now;

    p->rc = p->c.addr.unix_sock
            ? redisConnectUnixWithTimeout(p->c.addr.path, tv)
            : redisConnectWithTimeout(p->c.addr.host, p->c.addr.port, tv);
    if (p->rc == NULL) {
        fail(p, F_OTHER, "connecting", "out of memory");
        return;
    }
    if (p->rc->err != 0) {
        fail(p, ctx_fail(p->rc), "connecting", p->rc->errstr);
        return;
    }
    if (redisSetTimeout(p->rc, tv) != REDIS_OK) {
        fail(p, F_OTHER, "connecting", "cannot set the timeout");
        return;
    }
    if (login(p) != 0 || resync_all(p) != 0) return;
    now = clock_now_s();
    p->backoff = PUB_BACKOFF_MIN;
    p->next_refresh = now + p->c.ttl_s / 3.0;
    p->next_load = now;
    if (p->c.stats != NULL) stat_set(&p->c.stats->thinker.redis_up, 1);
    say_up(p, now);
}


/* ---- The thread --------------------------------------------------------- */

/* What is due now: connect, write what changed, refresh, the load. */
static void work(Publisher *p) {
    double now = clock_now_s();

    if (p->rc == NULL) {
        if (now < p->retry_at) return;
        connect_redis(p);
        if (p->rc == NULL) return;
    }
    if ((p->resync ? resync_all(p) : flush(p)) != 0) return;
    now = clock_now_s();
    if (now >= p->next_refresh) {
        if (set_all(p, "SET") != 0) return;
        p->next_refresh = now + p->c.ttl_s / 3.0;
    }
    if (now >= p->next_load) {
        if (set_load(p) != 0) return;
        p->next_load = now + 1.0;
    }
}

static double next_due(const Publisher *p) {
    if (p->rc == NULL) return p->retry_at;
    return p->next_refresh < p->next_load ? p->next_refresh : p->next_load;
}

/* Waits until something is queued, a timer is due or stop; takes what is
 * queued into p->batch. Returns how many; *stop whether to stop. */
static int64_t wait_drain(Publisher *p, bool *stop) {
    double          due = next_due(p);
    struct timespec ts = { (time_t) due,
                           (long) ((due - (double) (time_t) due) * 1e9) };
    int64_t         n;

    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->q_n == 0 && clock_now_s() < due) {
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    n = p->q_n;
    for (int64_t k = 0; k < n; k++) {
        p->batch[k] = p->q[(p->q_head + k) % p->q_cap];
    }
    p->q_head = (p->q_head + n) % p->q_cap;
    p->q_n = 0;
    *stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* The clean stop: what the mirror holds and the load key go, if Redis is
 * there to hear it. */
static void unpublish_all(Publisher *p) {
    const char *argv[2] = { "UNLINK", p->load_key };
    size_t      lens[2] = { 6, strlen(p->load_key) };

    if (p->rc == NULL) return;
    for (int64_t i = 0; i < p->m_cap; i++) {
        if (p->m[i].used && add_unlink(p, &p->m[i], "UNLINK") != 0) return;
    }
    if (pipe_add(p, "UNLINK", 2, argv, lens) != 0) return;
    if (pipe_finish(p, "UNLINK") == 0) {
        log_msg(LOG_INFO, "thinker: redis %s: %" PRId64 " prefix keys "
                "removed", p->c.addr_text, p->n_live);
    }
}

static void *pub_main(void *arg) {
    Publisher *p = arg;
    bool       stop = false;

    while (!stop) {
        apply(p, wait_drain(p, &stop));
        if (!stop) work(p);
    }
    unpublish_all(p);
    return NULL;
}


/* ---- The main thread's side --------------------------------------------- */

static int alloc_tables(Publisher *p, int64_t max_keys, Err *err) {
    p->q_cap = max_keys + PUB_QUEUE_MIN;
    p->m_cap = max_keys + p->q_cap;
    if (p->m_cap > INT32_MAX / 2) {
        return err_set(err, "prefix publisher: %" PRId64 " keys is too "
                       "many", max_keys);
    }
    p->mask = 1;
    while ((int64_t) p->mask < p->m_cap) p->mask *= 2;
    p->q = malloc((size_t) p->q_cap * sizeof(PubOp));
    p->batch = malloc((size_t) p->q_cap * sizeof(PubOp));
    p->m = calloc((size_t) p->m_cap, sizeof(MEntry));
    p->buckets = malloc((size_t) p->mask * sizeof(int32_t));
    if (p->q == NULL || p->batch == NULL || p->m == NULL
        || p->buckets == NULL)
    {
        return err_set(err, "out of memory for the prefix publisher");
    }
    for (uint64_t b = 0; b < p->mask; b++) p->buckets[b] = -1;
    p->mask--;
    for (int64_t i = 0; i < p->m_cap; i++) {
        p->m[i].dnext = i + 1 < p->m_cap ? (int32_t) (i + 1) : -1;
    }
    p->m_free = 0;
    p->dirty_head = p->dirty_tail = -1;
    return 0;
}

static void pub_free(Publisher *p) {
    if (p->rc != NULL) redisFree(p->rc);
    free(p->q);
    free(p->batch);
    free(p->m);
    free(p->buckets);
    free(p->strs);
    explicit_bzero(p->password, sizeof(p->password));
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

Publisher *pub_start(const PubConfig *c, Err *err) {
    Publisher         *p = calloc(1, sizeof(*p));
    pthread_condattr_t ca;
    int                rc;

    if (p == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->c = *c;
    p->backoff = PUB_BACKOFF_MIN;
    p->resync = true;
    if (copy_strings(p, c, err) != 0 || make_names(p, err) != 0
        || alloc_tables(p, c->max_keys, err) != 0)
    {
        pub_free(p);
        return NULL;
    }
    rc = pthread_create(&p->thread, NULL, pub_main, p);
    if (rc != 0) {
        err_set(err, "the prefix publisher's thread: %s", strerror(rc));
        pub_free(p);
        return NULL;
    }
    p->started = true;
    return p;
}

bool pub_push(Publisher *p, const PubOp *op) {
    bool ok;

    pthread_mutex_lock(&p->mu);
    ok = p->q_n < p->q_cap;
    if (ok) {
        p->q[(p->q_head + p->q_n) % p->q_cap] = *op;
        if (p->q_n++ == 0) pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

int64_t pub_room(Publisher *p) {
    int64_t n;

    pthread_mutex_lock(&p->mu);
    n = p->q_cap - p->q_n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

bool pub_want_resend(Publisher *p) {
    return atomic_exchange(&p->want_resend, false);
}

void pub_stop(Publisher *p) {
    if (p == NULL) return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    pub_free(p);
}

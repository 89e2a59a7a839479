/* test_prefix_pub.c -- the prefix publisher (thinker/prefix_pub.c): its
 * option parsers, a start and stop with no Redis there (errors counted,
 * nothing blocks), and, when redis-server is installed, the thread against
 * a Redis of the test's own on a Unix socket: a stale key of an earlier
 * incarnation deleted at connect, SETs with their TTL, the load key from
 * the stats page, a DEL, a RESET that drops what it does not repeat, and
 * the clean stop deleting everything. Also built with ThreadSanitizer
 * (the queue between the caller and the thread). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>

#include "prefix_pub.h"

static void nap(double s) {
    struct timespec ts = { (time_t) s, (long) ((s - (time_t) s) * 1e9) };

    nanosleep(&ts, NULL);
}


/* ---- Option parsers ------------------------------------------------------ */

static void test_addr(void **state) {
    static const char *bad[] = {
        "nope", "h:0", "h:65536", ":6379", "unix:", "h:12x", "h:", "[]:1",
    };
    RedisAddr a;
    Err       err;

    (void) state;
    assert_int_equal(redis_addr_parse("unix:/run/redis.sock", &a, &err), 0);
    assert_true(a.unix_sock);
    assert_string_equal(a.path, "/run/redis.sock");
    assert_int_equal(redis_addr_parse("127.0.0.1:6379", &a, &err), 0);
    assert_false(a.unix_sock);
    assert_string_equal(a.host, "127.0.0.1");
    assert_int_equal(a.port, 6379);
    assert_int_equal(redis_addr_parse("[::1]:7000", &a, &err), 0);
    assert_string_equal(a.host, "::1");
    assert_int_equal(a.port, 7000);
    assert_int_equal(redis_addr_parse("redis.internal:1", &a, &err), 0);
    assert_string_equal(a.host, "redis.internal");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (redis_addr_parse(bad[i], &a, &err) == 0) fail_msg("%s", bad[i]);
        assert_non_null(strstr(err.msg, bad[i]));
    }
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_password(void **state) {
    char path[64], pw[PUB_PASSWORD_MAX], big[PUB_PASSWORD_MAX + 8];
    Err  err;

    (void) state;
    snprintf(path, sizeof(path), "/tmp/omni-test-pw-%d", (int) getpid());
    write_file(path, "s3cret\r\nsecond line\n");
    assert_int_equal(redis_read_password(path, pw, sizeof(pw), &err), 0);
    assert_string_equal(pw, "s3cret");
    write_file(path, "\n");
    assert_int_equal(redis_read_password(path, pw, sizeof(pw), &err), -1);
    assert_non_null(strstr(err.msg, "empty"));
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    write_file(path, big);
    assert_int_equal(redis_read_password(path, pw, sizeof(pw), &err), -1);
    assert_non_null(strstr(err.msg, "longer"));
    unlink(path);
    assert_int_equal(redis_read_password(path, pw, sizeof(pw), &err), -1);
    assert_non_null(strstr(err.msg, path));
}


/* ---- The thread ------------------------------------------------------------ */

static PubConfig config(const char *addr, OmniStats *st) {
    PubConfig c = { 0 };
    Err       err;

    if (redis_addr_parse(addr, &c.addr, &err) != 0) fail_msg("%s", err.msg);
    c.addr_text = addr;
    c.ns = "t:";
    c.route = "r";
    c.ttl_s = 30;
    c.max_seqs = 7;
    c.max_keys = 16;
    c.stats = st;
    return c;
}

static PubOp op(uint8_t type, uint64_t k, int32_t tokens) {
    PubOp o = { { k, ~k }, tokens, type };

    return o;
}

/* Redis nowhere: the thread retries in the background, counts its
 * errors, takes operations all the same and stops at once. */
static void test_no_redis(void **state) {
    OmniStats  *st = calloc(1, sizeof(*st));
    char        addr[96];
    PubConfig   c;
    Publisher  *p;
    Err         err;
    PubOp       o = op(PUB_SET, 1, 16);
    double      t0;

    (void) state;
    snprintf(addr, sizeof(addr), "unix:/tmp/omni-test-none-%d.sock",
             (int) getpid());
    c = config(addr, st);
    p = pub_start(&c, &err);
    assert_non_null(p);
    for (int i = 0; i < 100; i++) assert_true(pub_push(p, &o));
    assert_true(pub_room(p) > 0);
    nap(0.8);                           // tries at 0, 0.1, 0.3, 0.7 s
    assert_int_equal(atomic_load(&st->thinker.redis_up), 0);
    assert_true(atomic_load(&st->thinker.redis_errors) >= 2);
    assert_false(pub_want_resend(p));
    t0 = clock_now_s();
    pub_stop(p);
    assert_true(clock_now_s() - t0 < 3.0);    // no wait for a timeout
    free(st);
}


/* ---- Against a Redis of the test's own ------------------------------------- */

typedef struct {
    pid_t         pid;
    char          dir[64], sock[96], addr[104];
    redisContext *c;            // the test's own connection
} Redis;

static bool have_redis(void) {
    return system("command -v redis-server >/dev/null 2>&1") == 0;
}

static void redis_start(Redis *r) {
    snprintf(r->dir, sizeof(r->dir), "/tmp/omni-test-redis-%d",
             (int) getpid());
    snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
    snprintf(r->addr, sizeof(r->addr), "unix:%s", r->sock);
    mkdir(r->dir, 0700);
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL) _exit(126);
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket",
               r->sock, "--save", "", "--appendonly", "no", "--dir", r->dir,
               (char *) NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        struct timeval tv = { 1, 0 };

        r->c = redisConnectUnixWithTimeout(r->sock, tv);
        if (r->c != NULL && r->c->err == 0) return;
        if (r->c != NULL) redisFree(r->c);
        r->c = NULL;
        nap(0.05);
    }
    fail_msg("redis-server did not start");
}

static void redis_stop(Redis *r) {
    char cmd[160];

    if (r->c != NULL) redisFree(r->c);
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
    assert_int_equal(system(cmd), 0);
}

/* GET name as a string ("" when absent). */
static void get(Redis *r, const char *name, char *out, size_t cap) {
    redisReply *rep = redisCommand(r->c, "GET %s", name);

    assert_non_null(rep);
    snprintf(out, cap, "%s", rep->type == REDIS_REPLY_STRING ? rep->str
                                                             : "");
    freeReplyObject(rep);
}

static long long ttl(Redis *r, const char *name) {
    redisReply *rep = redisCommand(r->c, "TTL %s", name);
    long long   t;

    assert_non_null(rep);
    t = rep->integer;
    freeReplyObject(rep);
    return t;
}

static const char *px(uint64_t k, char *buf) {
    OmniPkey key = { k, ~k };

    memcpy(buf, "t:px:r:", 7);
    omni_pkey_hex(buf + 7, key)[0] = '\0';
    return buf;
}

/* Waits (up to 5 s) for name to hold want ("" for gone). */
static void expect(Redis *r, const char *name, const char *want) {
    char got[64] = "?";

    for (int i = 0; i < 100 && strcmp(got, want) != 0; i++) {
        get(r, name, got, sizeof(got));
        if (strcmp(got, want) != 0) nap(0.05);
    }
    if (strcmp(got, want) != 0) {
        fail_msg("%s: '%s', not '%s'", name, got, want);
    }
}

static void push(Publisher *p, uint8_t type, uint64_t k, int32_t tokens) {
    PubOp o = op(type, k, tokens);

    assert_true(pub_push(p, &o));
}

static void test_live(void **state) {
    OmniStats  *st = calloc(1, sizeof(*st));
    Redis       r;
    PubConfig   c;
    Publisher  *p;
    Err         err;
    char        k[64];
    redisReply *rep;

    (void) state;
    if (!have_redis()) skip();
    redis_start(&r);
    rep = redisCommand(r.c, "SET %s 48", px(9, k));         // stale
    freeReplyObject(rep);
    rep = redisCommand(r.c, "SET t:px:other:x 1");           // not ours
    freeReplyObject(rep);
    atomic_store(&st->requests_running, 2);
    atomic_store(&st->requests_waiting, 1);
    c = config(r.addr, st);
    p = pub_start(&c, &err);
    assert_non_null(p);

    push(p, PUB_SET, 1, 16);
    push(p, PUB_SET, 2, 32);
    expect(&r, px(1, k), "16");
    expect(&r, px(2, k), "32");
    expect(&r, px(9, k), "");
    expect(&r, "t:px:other:x", "1");
    assert_true(ttl(&r, px(1, k)) > 25 && ttl(&r, px(1, k)) <= 30);
    expect(&r, "t:load:r", "2 1 7");
    assert_true(ttl(&r, "t:load:r") <= PUB_LOAD_TTL_S);
    assert_int_equal(atomic_load(&st->thinker.redis_up), 1);

    push(p, PUB_DEL, 1, 0);
    expect(&r, px(1, k), "");
    push(p, PUB_RESET, 0, 0);
    push(p, PUB_SET, 3, 48);
    expect(&r, px(3, k), "48");
    expect(&r, px(2, k), "");
    assert_true(atomic_load(&st->thinker.prefix_resyncs) >= 2);

    pub_stop(p);
    expect(&r, px(3, k), "");
    expect(&r, "t:load:r", "");
    expect(&r, "t:px:other:x", "1");
    assert_int_equal(atomic_load(&st->thinker.redis_errors), 0);
    redis_stop(&r);
    free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addr),
        cmocka_unit_test(test_password),
        cmocka_unit_test(test_no_redis),
        cmocka_unit_test(test_live),
    };

    log_set_level(LOG_ERROR);           // test_no_redis's outage: quiet
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("prefix_pub", tests, NULL, NULL);
}

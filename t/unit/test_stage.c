/* test_stage.c -- the stage skeleton (engine/stage/stage.c) without a
 * model: a toy stage, one StageOps row, run by stage_main on a thread and
 * driven over a socketpair the way the frontend drives a stage. Each job
 * the toy takes needs three steps (STARTED, TEXT echoing its JSON, DONE);
 * "fail" is refused at once with an ERROR whose message is too long for
 * one frame; "wake" is answered from the wake fd's handler, not a step;
 * "hold" is held, never stepped, until the stage stops. A CANCEL is acked
 * at once. INPUT is echoed: TEXT as a TEXT event, a BLOCK passed back on
 * (its reference with it), DONE as DONE; PAUSE and RESUME are recorded.
 * The statistics page is a memfd, and the pool a pool_create'd one, as
 * the frontend's. */

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "chan_util.h"

#include "json_scan.h"
#include "stage.h"

#define TOY_JOBS 8

typedef struct {
    uint64_t id[TOY_JOBS];          // FIFO of jobs, head first
    int      phase[TOY_JOBS];       // steps each has had
    char     text[TOY_JOBS][32];    // its JSON, to echo
    int      n;
    int      efd;                   // the wake fd, owned
    uint64_t woken;                 // the id "wake" asked for
    uint64_t held;                  // the id "hold" asked for, 0: none
    bool     stopped;               // stop ran
    uint16_t owner;                 // s->owner at start
    bool     has_pool;              // s->has_pool at start
    uint64_t paused;                // the id of the last PAUSE/RESUME
    bool     pause_on;              //   and which
} Toy;

static Toy toy;                     // the toy's state (s->ud)

static int toy_start(Stage *s, const ServeConfig *cfg, Err *err) {
    memset(&toy, 0, sizeof(toy));
    toy.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (toy.efd < 0) return err_set(err, "eventfd: %s", strerror(errno));
    s->ud = &toy;
    s->wake_fd = toy.efd;
    toy.owner = s->owner;
    toy.has_pool = s->has_pool;
    return stage_ready(s, "toy \"1\"\n", ",\"x\":1", err);
}

/* An ERROR message of n two-byte characters. Owned by the caller. */
static char *long_message(size_t n) {
    char *m = malloc(2 * n + 1);

    assert_non_null(m);
    for (size_t i = 0; i < n; i++) memcpy(m + 2 * i, "\xc3\xa9", 2);
    m[2 * n] = '\0';
    return m;
}

static void toy_submit(Stage *s, uint64_t id, const char *json, size_t len) {
    Toy     *t = s->ud;
    uint64_t one = 1;

    if (len == 4 && memcmp(json, "fail", 4) == 0) {
        char *m = long_message(OMNI_MAX_ERROR);

        stage_error(s, id, 400, "invalid_request_error", "prompt", NULL, m);
        free(m);
    } else if (len == 4 && memcmp(json, "wake", 4) == 0) {
        t->woken = id;
        assert_int_equal(write(t->efd, &one, sizeof(one)), sizeof(one));
    } else if (len == 4 && memcmp(json, "hold", 4) == 0) {
        t->held = id;
    } else {
        assert_true(t->n < TOY_JOBS && len < sizeof(t->text[0]));
        t->id[t->n] = id;
        t->phase[t->n] = 0;
        memcpy(t->text[t->n], json, len);
        t->text[t->n][len] = '\0';
        t->n++;
    }
}

static void toy_drop(Toy *t, int i) {
    memmove(&t->id[i], &t->id[i + 1], (size_t) (t->n - i - 1)
            * sizeof(t->id[0]));
    memmove(&t->phase[i], &t->phase[i + 1], (size_t) (t->n - i - 1)
            * sizeof(t->phase[0]));
    memmove(t->text[i], t->text[i + 1], (size_t) (t->n - i - 1)
            * sizeof(t->text[0]));
    t->n--;
}

static void toy_cancel(Stage *s, uint64_t id) {
    Toy *t = s->ud;

    for (int i = 0; i < t->n; i++) {
        if (t->id[i] == id) toy_drop(t, i--);
    }
    stage_cancelled(s, id);
}

static void toy_input(Stage *s, uint64_t id, uint8_t type, const uint8_t *p,
                      size_t n)
{
    OmniDone d = { 0 };

    switch (type) {
    case OMNI_F_TEXT:
        stage_event(s, id, OMNI_F_TEXT, p, n);
        break;
    case OMNI_F_STAGE_BLOCK:
        stage_block(s, id, (PoolRef) { omni_rd32(p), omni_rd32(p + 4),
                                       omni_rd32(p + 8) });
        break;
    default:
        assert_int_equal(omni_done_decode(&d, p), 0);
        d.audio_ms = 99;
        stage_done(s, id, &d);
    }
}

static void toy_pause(Stage *s, uint64_t id, bool paused) {
    Toy *t = s->ud;

    t->paused = id;
    t->pause_on = paused;
}

static bool toy_idle(Stage *s) {
    return ((Toy *) s->ud)->n == 0;
}

static void toy_step(Stage *s) {
    Toy     *t = s->ud;
    OmniDone d = { 1, 0, 2, OMNI_FINISH_STOP, 42, 0, 0, 0, 0 };

    switch (t->phase[0]++) {
    case 0:
        stage_started(s, t->id[0]);
        break;
    case 1:
        stage_event(s, t->id[0], OMNI_F_TEXT, t->text[0],
                    strlen(t->text[0]));
        break;
    default:
        stage_done(s, t->id[0], &d);
        toy_drop(t, 0);
    }
}

static void toy_wake(Stage *s) {
    Toy     *t = s->ud;
    uint64_t v;
    OmniDone d = { 0, 0, 0, OMNI_FINISH_LENGTH, 7, 0, 0, 0, 0 };

    assert_int_equal(read(t->efd, &v, sizeof(v)), sizeof(v));
    stage_done(s, t->woken, &d);
}

static void toy_stop(Stage *s) {
    Toy *t = s->ud;

    if (t == NULL) return;
    for (int i = 0; i < t->n; i++) {
        stage_error(s, t->id[i], 503, "server_error", NULL,
                    "engine_shutdown", "the toy stage is stopping");
    }
    t->n = 0;
    if (t->held != 0) {
        stage_error(s, t->held, 503, "server_error", NULL,
                    "engine_shutdown", "the toy stage is stopping");
    }
    close(t->efd);
    t->stopped = true;
    s->ud = NULL;
}

static const StageOps toy_stage = {
    .name = "toy",
    .start = toy_start,
    .submit = toy_submit,
    .cancel = toy_cancel,
    .input = toy_input,
    .pause = toy_pause,
    .idle = toy_idle,
    .step = toy_step,
    .wake = toy_wake,
    .stop = toy_stop,
};


/* ---- The frontend's side ----------------------------------------------- */

typedef struct {
    int        sv[2];               // [0]: the frontend's, [1]: the stage's
    int        stats_fd;            // memfd, or -1
    OmniStats *stats;               // mapped, or NULL
    Pool       pool;                // created when has_pool
    bool       has_pool;
    pthread_t  th;
    int        rc;                  // stage_main's
    Err        err;
} Rig;

static void *run_stage(void *arg) {
    Rig        *r = arg;
    ServeConfig cfg = { .model_path = "toy", .stage_owner = 3 };

    if (r->has_pool) cfg.pool_fd = r->pool.fd;

    r->rc = stage_main(&toy_stage, &cfg, r->sv[1], r->stats_fd, &r->err);
    return NULL;
}

/* A page as the frontend leaves it: counters kept from an earlier stage,
 * gauges stale. */
static void rig_run(Rig *r, bool with_stats, bool with_pool) {
    struct timeval tv = { 10, 0 };  // a stuck stage fails, not hangs
    Err            err;

    memset(r, 0, sizeof(*r));
    if (with_pool) {                // 4 blocks of 256 bytes
        assert_int_equal(pool_create(&r->pool, 4, 256, &err), 0);
        r->has_pool = true;
    }
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, r->sv), 0);
    setsockopt(r->sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    r->stats_fd = -1;
    if (with_stats) {
        r->stats_fd = memfd_create("stats", MFD_CLOEXEC);
        assert_true(r->stats_fd >= 0);
        assert_int_equal(ftruncate(r->stats_fd, sizeof(OmniStats)), 0);
        r->stats = mmap(NULL, sizeof(OmniStats), PROT_READ | PROT_WRITE,
                        MAP_SHARED, r->stats_fd, 0);
        assert_true(r->stats != MAP_FAILED);
        r->stats->magic = STATS_MAGIC;
        atomic_store(&r->stats->requests_running, 5);
        atomic_store(&r->stats->step_max_us, 1000000000);
        atomic_store(&r->stats->stage_restarts, 3);
    }
    assert_int_equal(pthread_create(&r->th, NULL, run_stage, r), 0);
}

static void rig_start(Rig *r, bool with_stats) {
    rig_run(r, with_stats, false);
}

static void rig_start_pool(Rig *r) {
    rig_run(r, false, true);
}

/* EOF to the stage, then waits for stage_main's return. */
static void rig_end(Rig *r) {
    shutdown(r->sv[0], SHUT_WR);
    pthread_join(r->th, NULL);
    close(r->sv[0]);
    close(r->sv[1]);
    if (r->stats != NULL) munmap(r->stats, sizeof(OmniStats));
    if (r->stats_fd >= 0) close(r->stats_fd);
    if (r->has_pool) pool_destroy(&r->pool);
}

/* The next frame from the stage (chan_util.h). */
static uint8_t next_frame(Rig *r, uint8_t *p, size_t cap, size_t *len) {
    return chan_frame(r->sv[0], p, cap, len);
}

/* The next frame must be an EVENT for id wrapping a client frame of type;
 * returns its payload (in buf) and length. */
static const uint8_t *next_event(Rig *r, uint64_t id, uint8_t type,
                                 uint8_t *buf, size_t cap, size_t *n)
{
    OmniFrameHdr inner;
    size_t       len;

    assert_int_equal(next_frame(r, buf, cap, &len), OMNI_F_STAGE_EVENT);
    assert_true(len >= 8 + OMNI_FRAME_HDR);
    assert_int_equal(omni_rd64(buf), id);
    omni_hdr_decode(&inner, buf + 8);
    assert_int_equal(inner.type, type);
    assert_int_equal(inner.len, len - 8 - OMNI_FRAME_HDR);
    *n = inner.len;
    return buf + 8 + OMNI_FRAME_HDR;
}

static void expect_ready(Rig *r) {
    static const char want[] = "{\"id\":\"toy \\\"1\\\"\\u000a\",\"x\":1}";
    uint8_t           buf[256];
    size_t            len;

    assert_int_equal(next_frame(r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_READY);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
}

/* Queues SUBMIT (json, or CANCEL when json is NULL) for id into out. */
static size_t put_frame(uint8_t *out, uint64_t id, const char *json) {
    size_t n = json != NULL ? strlen(json) : 0;

    omni_hdr_encode(out, json != NULL ? OMNI_F_STAGE_SUBMIT
                                      : OMNI_F_STAGE_CANCEL, (uint32_t) (8 + n));
    omni_wr64(out + OMNI_FRAME_HDR, id);
    if (n > 0) memcpy(out + OMNI_FRAME_HDR + 8, json, n);
    return OMNI_FRAME_HDR + 8 + n;
}

static void send_bytes(Rig *r, const uint8_t *p, size_t n) {
    assert_int_equal(write(r->sv[0], p, n), (ssize_t) n);
}

/* A job's three events, in order. */
static void expect_job(Rig *r, uint64_t id, const char *text) {
    uint8_t        buf[256];
    size_t         len;
    const uint8_t *p;
    OmniDone       d;

    assert_int_equal(next_frame(r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_STARTED);
    assert_int_equal(len, 8);
    assert_int_equal(omni_rd64(buf), id);
    p = next_event(r, id, OMNI_F_TEXT, buf, sizeof(buf), &len);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(p, text, len);
    p = next_event(r, id, OMNI_F_DONE, buf, sizeof(buf), &len);
    assert_int_equal(len, OMNI_DONE_LEN);
    assert_int_equal(omni_done_decode(&d, p), 0);
    assert_int_equal(d.completion_tokens, 2);
    assert_int_equal(d.seed, 42);
}


static void expect_cancelled(Rig *r, uint64_t id) {
    uint8_t buf[64];
    size_t  len;

    assert_int_equal(next_frame(r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_CANCELLED);
    assert_int_equal(len, 8);
    assert_int_equal(omni_rd64(buf), id);
}

/* Sends a frame of type for id: the id, then n bytes of body. */
static void send_frame(Rig *r, uint8_t type, uint64_t id, const void *body,
                       size_t n)
{
    uint8_t out[128];

    assert_true(OMNI_FRAME_HDR + 8 + n <= sizeof(out));
    omni_hdr_encode(out, type, (uint32_t) (8 + n));
    omni_wr64(out + OMNI_FRAME_HDR, id);
    if (n > 0) memcpy(out + OMNI_FRAME_HDR + 8, body, n);
    send_bytes(r, out, OMNI_FRAME_HDR + 8 + n);
}

/* An INPUT for id: the inner frame type with n bytes of p. */
static void send_input(Rig *r, uint64_t id, uint8_t type, const void *p,
                       size_t n)
{
    uint8_t in[96];

    assert_true(OMNI_FRAME_HDR + n <= sizeof(in));
    omni_hdr_encode(in, type, (uint32_t) n);
    if (n > 0) memcpy(in + OMNI_FRAME_HDR, p, n);
    send_frame(r, OMNI_F_STAGE_INPUT, id, in, OMNI_FRAME_HDR + n);
}

/* A BLOCK payload for ref r, with flags. */
static void block_bytes(uint8_t *b, PoolRef r, uint32_t flags) {
    omni_wr32(b, r.block);
    omni_wr32(b + 4, r.offset);
    omni_wr32(b + 8, r.length);
    omni_wr32(b + 12, flags);
}

/* The stage ends with a protocol error whose message is want. */
static void expect_protocol_error(Rig *r, const char *want) {
    pthread_join(r->th, NULL);
    assert_int_equal(r->rc, -1);
    assert_string_equal(r->err.msg, want);
    assert_true(toy.stopped);
    close(r->sv[0]);
    close(r->sv[1]);
    if (r->has_pool) pool_destroy(&r->pool);
}


/* ---- Tests ------------------------------------------------------------- */

/* READY, then a SUBMIT's events in order; EOF ends the stage cleanly; the
 * page holds the heartbeat and the stage's pid, its gauges reset, its
 * counters kept. */
static void test_submit_events_eof(void **state) {
    Rig     r;
    uint8_t out[64];

    rig_start(&r, true);
    expect_ready(&r);
    send_bytes(&r, out, put_frame(out, 7, "hello"));
    expect_job(&r, 7, "hello");
    rig_end(&r);
    assert_int_equal(r.rc, 0);
    assert_true(toy.stopped);
}

static void test_stats_page(void **state) {
    Rig     r;
    uint8_t out[64];
    int64_t before = stage_clock_us();

    rig_start(&r, true);
    expect_ready(&r);
    assert_true(atomic_load(&r.stats->heartbeat_us) >= before);
    assert_int_equal(atomic_load(&r.stats->stage_pid), getpid());
    assert_int_equal(atomic_load(&r.stats->requests_running), 0);
    assert_int_equal(atomic_load(&r.stats->stage_restarts), 3);
    send_bytes(&r, out, put_frame(out, 1, "x"));
    expect_job(&r, 1, "x");
    // three steps ran, each timed: none as long as the stale 1000 s
    assert_true(atomic_load(&r.stats->step_max_us) < 1000000000);
    assert_int_equal(atomic_load(&r.stats->step_start_us), 0);
    before = stage_clock_us();
    usleep(3 * STAGE_BEAT_MS * 1000);
    // idle, the loop still beats
    assert_true(atomic_load(&r.stats->heartbeat_us) > before);
    rig_end(&r);
    assert_int_equal(r.rc, 0);
}

/* Frames read together are handled before a step: the cancelled job never
 * runs. A job still held at EOF ends with the stop's ERROR. */
static void test_cancel_and_stop(void **state) {
    Rig            r;
    uint8_t        out[256], buf[256];
    size_t         n = 0, len;
    const uint8_t *p;
    OmniError      e = { 0 };

    rig_start(&r, false);
    expect_ready(&r);
    n += put_frame(out + n, 1, "one");
    n += put_frame(out + n, 3, "hold");
    n += put_frame(out + n, 2, "two");
    n += put_frame(out + n, 1, NULL);
    send_bytes(&r, out, n);
    expect_cancelled(&r, 1);
    expect_job(&r, 2, "two");
    shutdown(r.sv[0], SHUT_WR);
    p = next_event(&r, 3, OMNI_F_ERROR, buf, sizeof(buf), &len);
    assert_int_equal(omni_error_decode(&e, p, len), 0);
    assert_int_equal(e.status, 503);
    assert_int_equal(e.code_len, strlen("engine_shutdown"));
    assert_memory_equal(e.code, "engine_shutdown", e.code_len);
    pthread_join(r.th, NULL);
    // and nothing after it
    assert_int_equal(recv(r.sv[0], buf, 1, MSG_DONTWAIT), -1);
    assert_int_equal(errno, EAGAIN);
    close(r.sv[0]);
    close(r.sv[1]);
    assert_int_equal(r.rc, 0);
    assert_true(toy.stopped);
}

/* An ERROR too long for one frame is cut between characters. */
static void test_error_cut(void **state) {
    static uint8_t buf[OMNI_MAX_ERROR + 64];
    Rig            r;
    uint8_t        out[64];
    size_t         len;
    const uint8_t *p;
    OmniError      e = { 0 };

    rig_start(&r, false);
    expect_ready(&r);
    send_bytes(&r, out, put_frame(out, 9, "fail"));
    p = next_event(&r, 9, OMNI_F_ERROR, buf, sizeof(buf), &len);
    assert_true(len <= OMNI_MAX_ERROR);
    assert_int_equal(omni_error_decode(&e, p, len), 0);
    assert_int_equal(e.status, 400);
    assert_int_equal(e.param_len, 6);
    assert_int_equal(e.code_len, 0);
    assert_true(e.message_len > OMNI_MAX_ERROR - 64);
    assert_int_equal(e.message_len % 2, 0);   // whole characters only
    assert_int_equal(omni_utf8_cut(e.message, e.message_len), e.message_len);
    assert_memory_equal(e.message + e.message_len - 2, "\xc3\xa9", 2);
    rig_end(&r);
    assert_int_equal(r.rc, 0);
}

/* The stage's wake fd is polled and its handler's events go out. */
static void test_wake_fd(void **state) {
    uint8_t        out[64], buf[64];
    Rig            r;
    size_t         len;
    const uint8_t *p;
    OmniDone       d;

    rig_start(&r, false);
    expect_ready(&r);
    send_bytes(&r, out, put_frame(out, 11, "wake"));
    p = next_event(&r, 11, OMNI_F_DONE, buf, sizeof(buf), &len);
    assert_int_equal(omni_done_decode(&d, p), 0);
    assert_int_equal(d.seed, 7);
    rig_end(&r);
    assert_int_equal(r.rc, 0);
}

/* A frame without a request id is the frontend's bug: the stage ends with
 * an error naming it, and still stops. */
static void test_protocol_error(void **state) {
    Rig     r;
    uint8_t out[OMNI_FRAME_HDR + 4] = { 0 };

    rig_start(&r, false);
    expect_ready(&r);
    omni_hdr_encode(out, OMNI_F_STAGE_SUBMIT, 4);
    send_bytes(&r, out, sizeof(out));
    pthread_join(r.th, NULL);
    assert_int_equal(r.rc, -1);
    assert_string_equal(r.err.msg, "frontend sent a stage frame of 4 bytes, "
                        "without a request id");
    assert_true(toy.stopped);
    close(r.sv[0]);
    close(r.sv[1]);
}

/* The pool is attached and the owner tag set from the config; INPUT TEXT,
 * BLOCK and DONE reach ops->input, a BLOCK checked and its reference
 * passed back out with stage_block; PAUSE and RESUME reach ops->pause. */
static void test_input_block_pause(void **state) {
    Rig            r = { 0 };
    uint8_t        buf[128], b[STAGE_BLOCK_LEN];
    size_t         len;
    const uint8_t *p;
    OmniDone       d = { .prompt_tokens = 5 };
    PoolStats      ps;
    int            blk;

    rig_start_pool(&r);
    expect_ready(&r);
    assert_int_equal(toy.owner, 3);
    assert_true(toy.has_pool);
    send_input(&r, 4, OMNI_F_TEXT, "hi", 2);
    p = next_event(&r, 4, OMNI_F_TEXT, buf, sizeof(buf), &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, "hi", 2);

    blk = pool_alloc(&r.pool, 1, 4);
    assert_true(blk >= 0);
    block_bytes(b, (PoolRef) { (uint32_t) blk, 64, 100 }, 0);
    send_input(&r, 4, OMNI_F_STAGE_BLOCK, b, sizeof(b));
    p = next_event(&r, 4, OMNI_F_STAGE_BLOCK, buf, sizeof(buf), &len);
    assert_int_equal(len, STAGE_BLOCK_LEN);
    assert_memory_equal(p, b, STAGE_BLOCK_LEN);
    pool_stats(&r.pool, &ps);
    assert_int_equal(ps.used, 1);           // the one reference, passed on
    assert_int_equal(pool_unref(&r.pool, (uint32_t) blk), 1);

    send_frame(&r, OMNI_F_STAGE_PAUSE, 4, NULL, 0);
    omni_done_encode(buf, &d);
    send_input(&r, 4, OMNI_F_DONE, buf, OMNI_DONE_LEN);
    p = next_event(&r, 4, OMNI_F_DONE, buf, sizeof(buf), &len);
    assert_int_equal(omni_done_decode(&d, p), 0);
    assert_int_equal(d.prompt_tokens, 5);
    assert_int_equal(d.audio_ms, 99);
    // the PAUSE was read before the INPUT that the DONE answers
    assert_int_equal(toy.paused, 4);
    assert_true(toy.pause_on);
    send_frame(&r, OMNI_F_STAGE_RESUME, 4, NULL, 0);
    send_frame(&r, OMNI_F_STAGE_CANCEL, 4, NULL, 0);
    expect_cancelled(&r, 4);
    assert_false(toy.pause_on);
    rig_end(&r);
    assert_int_equal(r.rc, 0);
}

/* A BLOCK naming a free block is the frontend's bug: a protocol error
 * that names what is wrong, and ops->input never sees it. */
static void test_input_bad_block(void **state) {
    Rig     r = { 0 };
    uint8_t b[STAGE_BLOCK_LEN];

    rig_start_pool(&r);
    expect_ready(&r);
    block_bytes(b, (PoolRef) { 2, 0, 16 }, 0);
    send_input(&r, 5, OMNI_F_STAGE_BLOCK, b, sizeof(b));
    pthread_join(r.th, NULL);
    assert_int_equal(r.rc, -1);
    assert_non_null(strstr(r.err.msg, "frontend sent a bad INPUT BLOCK: "));
    assert_true(toy.stopped);
    close(r.sv[0]);
    close(r.sv[1]);
    pool_destroy(&r.pool);
}

/* A BLOCK to a stage without a pool, a BLOCK with flags, an inner frame
 * whose length lies, an inner type a stage does not take: each a
 * protocol error naming it. */
static void test_input_malformed(void **state) {
    Rig     r = { 0 };
    uint8_t b[STAGE_BLOCK_LEN], in[OMNI_FRAME_HDR + 4];
    int     blk;

    rig_start(&r, false);
    expect_ready(&r);
    block_bytes(b, (PoolRef) { 0, 0, 16 }, 0);
    send_input(&r, 5, OMNI_F_STAGE_BLOCK, b, sizeof(b));
    expect_protocol_error(&r, "frontend sent an INPUT BLOCK, but gave this "
                          "stage no pool");

    rig_start_pool(&r);
    expect_ready(&r);
    blk = pool_alloc(&r.pool, 1, 5);
    block_bytes(b, (PoolRef) { (uint32_t) blk, 0, 16 }, 1);
    send_input(&r, 5, OMNI_F_STAGE_BLOCK, b, sizeof(b));
    expect_protocol_error(&r, "frontend sent an INPUT BLOCK of 16 bytes "
                          "(flags 0x1)");

    rig_start(&r, false);
    expect_ready(&r);
    omni_hdr_encode(in, OMNI_F_TEXT, 9);
    memcpy(in + OMNI_FRAME_HDR, "abcd", 4);
    send_frame(&r, OMNI_F_STAGE_INPUT, 5, in, sizeof(in));
    expect_protocol_error(&r, "frontend sent an INPUT whose inner frame says "
                          "9 bytes and holds 4");

    rig_start(&r, false);
    expect_ready(&r);
    send_input(&r, 5, OMNI_F_AUDIO, "abcd", 4);
    expect_protocol_error(&r, "frontend sent an INPUT of inner type 17");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_events_eof),
        cmocka_unit_test(test_stats_page),
        cmocka_unit_test(test_cancel_and_stop),
        cmocka_unit_test(test_error_cut),
        cmocka_unit_test(test_wake_fd),
        cmocka_unit_test(test_protocol_error),
        cmocka_unit_test(test_input_block_pause),
        cmocka_unit_test(test_input_bad_block),
        cmocka_unit_test(test_input_malformed),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("stage", tests, NULL, NULL);
}

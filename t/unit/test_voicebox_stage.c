/* test_voicebox_stage.c -- the voicebox's stage row (voicebox.c) through
 * the real skeleton (stage_main on a socketpair, in a thread), as the
 * frontend drives it: READY after the warm-up; a SUBMIT, the talker's
 * units as INPUT BLOCKs and its INPUT DONE give STARTED, audio BLOCK
 * events (a WAV file, in order) and DONE with the talker's counts; a bad
 * input ends its request with a 500; a CANCEL of an unknown id is acked.
 * The core's own cases are test_voicebox.c's; this one is about the
 * frames. Separate so that test_voicebox, which runs under TSan too, links
 * only the core. */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

#include "chan_util.h"

#include "analyze.h"
#include "voicebox.h"

typedef struct {
    int         sv[2];              // [0]: the frontend's, [1]: the stage's
    Pool        pool;
    pthread_t   th;
    int         rc;
    Err         err;
} Rig;

static void *run_stage(void *arg) {
    Rig        *r = arg;
    ServeConfig cfg = { .model_path = "voicebox", .stage_owner = 3,
                        .pool_fd = r->pool.fd, .voicebox_slots = 2 };

    r->rc = stage_main(&voicebox_stage, &cfg, r->sv[1], -1, &r->err);
    return NULL;
}

/* The next frame from the stage (chan_util.h). */
static uint8_t next_frame(Rig *r, uint8_t *p, size_t cap, size_t *len) {
    return chan_frame(r->sv[0], p, cap, len);
}

/* A frame of type for id: the id, then n bytes of body (inner: an inner
 * frame's type, its header first). */
static void send_frame(Rig *r, uint8_t type, uint64_t id, int inner,
                       const void *body, size_t n)
{
    uint8_t out[512];
    size_t  k = OMNI_FRAME_HDR + 8;

    assert_true(k + OMNI_FRAME_HDR + n <= sizeof(out));
    if (inner >= 0) {
        omni_hdr_encode(out + k, (uint8_t) inner, (uint32_t) n);
        k += OMNI_FRAME_HDR;
    }
    memcpy(out + k, body, n);
    omni_hdr_encode(out, type, (uint32_t) (k + n - OMNI_FRAME_HDR));
    omni_wr64(out + OMNI_FRAME_HDR, id);
    assert_int_equal(write(r->sv[0], out, k + n), (ssize_t) (k + n));
}

/* The units of text in a pool block, as an INPUT BLOCK for id. */
static void send_units(Rig *r, uint64_t id, const char *text, bool last) {
    TtsAnalyzer *a;
    Units        u;
    Err          err;
    uint8_t      b[STAGE_BLOCK_LEN];
    int          blk = pool_alloc(&r->pool, 1, id);
    long         n;

    assert_true(blk >= 0);
    a = tts_analyzer_new(&err);
    assert_non_null(a);
    assert_int_equal(tts_analyze(a, text, strlen(text), &u, &err), 0);
    u.last = last;
    n = units_encode(&u, pool_block(&r->pool, (uint32_t) blk),
                     r->pool.block_size);
    assert_true(n > 0);
    units_free(&u);
    tts_analyzer_free(a);
    omni_wr32(b, (uint32_t) blk);
    omni_wr32(b + 4, 0);
    omni_wr32(b + 8, (uint32_t) n);
    omni_wr32(b + 12, 0);
    send_frame(r, OMNI_F_STAGE_INPUT, id, OMNI_F_STAGE_BLOCK, b, sizeof(b));
}

static void send_done(Rig *r, uint64_t id) {
    OmniDone d = { .prompt_tokens = 4, .audio_tokens = 13 };
    uint8_t  b[OMNI_DONE_LEN];

    omni_done_encode(b, &d);
    send_frame(r, OMNI_F_STAGE_INPUT, id, OMNI_F_DONE, b, sizeof(b));
}

/* The next EVENT's inner type for id; its payload into buf. */
static uint8_t next_event(Rig *r, uint64_t id, uint8_t *buf, size_t cap,
                          const uint8_t **p, size_t *n)
{
    OmniFrameHdr inner;
    size_t       len;

    assert_int_equal(next_frame(r, buf, cap, &len), OMNI_F_STAGE_EVENT);
    assert_int_equal(omni_rd64(buf), id);
    omni_hdr_decode(&inner, buf + 8);
    *p = buf + 8 + OMNI_FRAME_HDR;
    *n = inner.len;
    return inner.type;
}

static void test_stage(void **state) {
    static uint8_t buf[4096];
    struct timeval tv = { 30, 0 };
    Rig            r;
    Err            err;
    size_t         len, n, bytes = 0;
    const uint8_t *p;
    OmniDone       d;
    uint8_t        t;

    (void) state;
    memset(&r, 0, sizeof(r));
    assert_int_equal(pool_create(&r.pool, 64, 4096, &err), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, r.sv), 0);
    setsockopt(r.sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    assert_int_equal(pthread_create(&r.th, NULL, run_stage, &r), 0);
    assert_int_equal(next_frame(&r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_READY);

    /* one request: two chunks, then the talker's DONE */
    static const char json[] = "{\"input\":\"Hello there. Bye now.\","
        "\"audio\":{\"voice\":\"alloy\",\"format\":\"wav\"}}";
    send_frame(&r, OMNI_F_STAGE_SUBMIT, 5, -1, json, strlen(json));
    send_units(&r, 5, "Hello there.", false);
    send_units(&r, 5, "Bye now.", true);
    send_done(&r, 5);
    assert_int_equal(next_frame(&r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_STARTED);
    assert_int_equal(omni_rd64(buf), 5);
    while ((t = next_event(&r, 5, buf, sizeof(buf), &p, &n))
           == OMNI_F_STAGE_BLOCK)
    {
        PoolRef ref = { omni_rd32(p), omni_rd32(p + 4), omni_rd32(p + 8) };
        uint8_t *b = (uint8_t *) pool_block(&r.pool, ref.block) + ref.offset;

        assert_int_equal(n, STAGE_BLOCK_LEN);
        assert_int_equal(pool_check(&r.pool, ref, &err), 0);
        if (bytes == 0) assert_memory_equal(b, "RIFF", 4);
        bytes += ref.length;
        assert_int_equal(pool_unref(&r.pool, ref.block), 1);
    }
    assert_int_equal(t, OMNI_F_DONE);
    assert_int_equal(omni_done_decode(&d, p), 0);
    assert_int_equal(d.prompt_tokens, 4);
    assert_int_equal(d.audio_tokens, 13);
    assert_true(d.audio_ms > 500);
    /* the header, then audio_ms of 24 kHz s16 (audio_ms is rounded down) */
    assert_true(bytes >= 44 + (size_t) d.audio_ms * 48
                && bytes < 44 + (size_t) (d.audio_ms + 1) * 48);

    /* a TEXT input is not units: 500 for that request */
    send_frame(&r, OMNI_F_STAGE_SUBMIT, 6, -1, json, strlen(json));
    send_frame(&r, OMNI_F_STAGE_INPUT, 6, OMNI_F_TEXT, "hi", 2);
    assert_int_equal(next_event(&r, 6, buf, sizeof(buf), &p, &n),
                     OMNI_F_ERROR);

    /* a CANCEL for an id it does not hold: acked at once */
    send_frame(&r, OMNI_F_STAGE_CANCEL, 99, -1, "", 0);
    assert_int_equal(next_frame(&r, buf, sizeof(buf), &len),
                     OMNI_F_STAGE_CANCELLED);
    assert_int_equal(omni_rd64(buf), 99);

    shutdown(r.sv[0], SHUT_WR);
    pthread_join(r.th, NULL);
    assert_int_equal(r.rc, 0);
    close(r.sv[0]);
    close(r.sv[1]);
    {
        PoolStats st;

        pool_stats(&r.pool, &st);
        assert_int_equal(st.used, 0);
    }
    pool_destroy(&r.pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_talker.c -- the talker's logic (engine/talker/talk.c) with the real
 * chunker, analyzer and a real pool, without processes: requests and text
 * in, chunks of units out as pool blocks (decoded and checked here), DONE
 * counts, both modes, streaming byte by byte against the whole text,
 * cancel, a full pool, bounds and refusals; then the stage row
 * (talker.c) run by the skeleton on a thread, over a socketpair, as the
 * frontend drives it. */

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

#include "chan_util.h"

#include "request.h"
#include "synth.h"
#include "talk.h"
#include "talker.h"

#define MAX_OUT 256

static const char TEXT[] = "Hello there, my old friend. It is 3.50 dollars "
    "today; we counted twice! Would you like to hear a longer sentence, one "
    "that keeps going past the first few words and then a few more, just "
    "to see where it is cut?";

/* What the events delivered: each chunk's byte form (copied out of its
 * block), the DONE and the ERROR. Blocks are kept (held) until release. */
typedef struct {
    Pool     *pool;
    uint8_t  *chunk[MAX_OUT];
    size_t    len[MAX_OUT];
    uint32_t  block[MAX_OUT];
    bool      held[MAX_OUT];
    int       n;
    bool      hold;             // keep the blocks (a slow voicebox)
    int       n_done, n_error;
    OmniDone  done;
    int       status;
    char      code[64];
} Out;

static void ev_block(void *ud, uint64_t id, PoolRef r) {
    Out *o = ud;

    (void) id;
    assert_true(o->n < MAX_OUT);
    assert_int_equal(r.offset, 0);
    o->chunk[o->n] = malloc(r.length);
    memcpy(o->chunk[o->n], (uint8_t *) pool_block(o->pool, r.block),
           r.length);
    o->len[o->n] = r.length;
    o->block[o->n] = r.block;
    o->held[o->n] = o->hold;
    if (!o->hold) assert_int_equal(pool_unref(o->pool, r.block), 1);
    o->n++;
}

static void ev_done(void *ud, uint64_t id, const OmniDone *d) {
    Out *o = ud;

    (void) id;
    o->n_done++;
    o->done = *d;
}

static void ev_error(void *ud, uint64_t id, int status, const char *type,
                     const char *param, const char *code, const char *msg)
{
    Out *o = ud;

    (void) id, (void) type, (void) param, (void) msg;
    o->n_error++;
    o->status = status;
    snprintf(o->code, sizeof(o->code), "%s", code != NULL ? code : "");
}

static void release(Out *o) {
    for (int i = 0; i < o->n; i++) {
        if (o->held[i]) assert_int_equal(pool_unref(o->pool, o->block[i]), 1);
        o->held[i] = false;
    }
}

static void out_free(Out *o) {
    release(o);
    for (int i = 0; i < o->n; i++) free(o->chunk[i]);
    memset(o, 0, sizeof(*o));
}

typedef struct {
    Pool pool;
    Talk talk;
    Out  out;
} Fix;

static void fix_init(Fix *f, uint32_t n_blocks) {
    TalkConfig c = { 0, 0, 0, 8, &f->pool, 3 };
    TalkEvents ev = { &f->out, ev_block, ev_done, ev_error };
    Err        err;

    memset(f, 0, sizeof(*f));
    assert_int_equal(pool_create(&f->pool, n_blocks, UNITS_MAX_BYTES, &err),
                     0);
    f->out.pool = &f->pool;
    if (talk_init(&f->talk, &c, &ev, &err) != 0) fail_msg("%s", err.msg);
}

/* Frees everything; the pool must be empty: the talker holds nothing. */
static void fix_free(Fix *f) {
    PoolStats st;

    talk_free(&f->talk, "test over");
    out_free(&f->out);
    pool_stats(&f->pool, &st);
    assert_int_equal(st.used, 0);
    pool_destroy(&f->pool);
}

static void submit(Fix *f, uint64_t id, const char *json) {
    OmniRequest r;
    ReqError    e;

    if (request_parse(&r, json, strlen(json), &e) != 0) {
        fail_msg("%s", e.err.msg);
    }
    talk_submit(&f->talk, id, &r);
    request_free(&r);
}

static void speech(Fix *f, uint64_t id, const char *mode, const char *text) {
    char json[2048];

    snprintf(json, sizeof(json), "{\"input\": \"%s\", \"audio\": {\"voice\":"
             " \"alloy\", \"mode\": \"%s\"}}", text, mode);
    submit(f, id, json);
}

static void chat(Fix *f, uint64_t id, const char *mode) {
    char json[256];

    snprintf(json, sizeof(json), "{\"prompt\": \"Hi\", \"audio\": "
             "{\"voice\": \"slt\", \"mode\": \"%s\"}}", mode);
    submit(f, id, json);
}

static void run(Fix *f) {
    for (int i = 0; i < 1000 && !talk_idle(&f->talk); i++) {
        talk_step(&f->talk);
    }
}

/* Chunk i decoded: its words and phones added to *w and *ph. */
static Units decode(const Out *o, int i) {
    Units u;
    Err   err;

    if (units_decode(&u, o->chunk[i], o->len[i], &err) != 0) {
        fail_msg("chunk %d: %s", i, err.msg);
    }
    return u;
}

/* The chunks say the whole text in order, only the last is marked last,
 * and the DONE counts what they hold. Returns the words of chunk 0. */
static int check_chunks(const Out *o) {
    int   words = 0, phones = 0, first = 0;
    char  said[1024] = "";

    assert_int_equal(o->n_error, 0);
    assert_int_equal(o->n_done, 1);
    assert_true(o->n > 0);
    for (int i = 0; i < o->n; i++) {
        Units u = decode(o, i);

        if (i == 0) first = u.n_words;
        assert_int_equal(u.last, i == o->n - 1);
        for (int j = 0; j < u.n_words; j++) {
            strcat(said, u.words[j].text);
            strcat(said, " ");
        }
        words += u.n_words;
        phones += u.n_phones;
        units_free(&u);
    }
    assert_non_null(strstr(said, "hello there"));
    assert_non_null(strstr(said, "three point five zero dollars"));
    assert_non_null(strstr(said, "where it is cut"));
    assert_int_equal(o->done.prompt_tokens, words);
    assert_int_equal(o->done.audio_tokens, phones);
    assert_true(phones > words);
    return first;
}

static int setup(void **state) {
    Err err;

    (void) state;
    if (tts_init(&err) != 0) {
        fprintf(stderr, "tts_init: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Input spoken as it is, both modes: latency starts with a small chunk
 * and cuts more often than quality. */
static void test_modes(void **state) {
    Fix *f = malloc(sizeof(*f));
    int  n_latency;

    (void) state;
    fix_init(f, 8);
    speech(f, 1, "latency", TEXT);
    run(f);
    assert_true(check_chunks(&f->out) <= 4);
    n_latency = f->out.n;
    fix_free(f);

    fix_init(f, 8);
    speech(f, 1, "quality", TEXT);
    run(f);
    check_chunks(&f->out);
    assert_true(f->out.n < n_latency);
    assert_true(f->out.n >= 3);             // at least one per sentence
    fix_free(f);
    free(f);
}

/* The thinker's deltas byte by byte, stepped in between, give the same
 * chunks, byte for byte, as the whole input at once. */
static void test_streaming(void **state) {
    Fix *whole = malloc(sizeof(*whole)), *f = malloc(sizeof(*f));

    (void) state;
    for (int m = 0; m < 2; m++) {
        const char *mode = m == 0 ? "latency" : "quality";

        fix_init(whole, 8);
        speech(whole, 1, mode, TEXT);
        run(whole);
        fix_init(f, 8);
        chat(f, 7, mode);
        for (size_t i = 0; i < sizeof(TEXT) - 1; i++) {
            talk_text(&f->talk, 7, TEXT + i, 1);
            if (i % 3 == 0) talk_step(&f->talk);
        }
        talk_end(&f->talk, 7);
        run(f);
        check_chunks(&f->out);
        assert_int_equal(f->out.n, whole->out.n);
        for (int i = 0; i < f->out.n; i++) {
            assert_int_equal(f->out.len[i], whole->out.len[i]);
            assert_memory_equal(f->out.chunk[i], whole->out.chunk[i],
                                f->out.len[i]);
        }
        fix_free(whole);
        fix_free(f);
    }
    free(whole);
    free(f);
}

/* A pool of two blocks that the consumer keeps: two chunks go, then the
 * talker waits (idle, steps send nothing) without losing text; each block
 * freed lets one more go; the result is the same as with room. */
static void test_full_pool(void **state) {
    Fix *roomy = malloc(sizeof(*roomy)), *f = malloc(sizeof(*f));

    (void) state;
    fix_init(roomy, 8);
    speech(roomy, 1, "latency", TEXT);
    run(roomy);
    fix_init(f, 2);
    f->out.hold = true;
    speech(f, 1, "latency", TEXT);
    run(f);
    assert_int_equal(f->out.n, 2);
    assert_true(talk_idle(&f->talk));
    talk_step(&f->talk);
    assert_int_equal(f->out.n, 2);
    for (int k = 0; f->out.n_done == 0 && k < 100; k++) {
        int before = f->out.n;

        assert_int_equal(pool_unref(&f->pool, f->out.block[before - 2]), 1);
        f->out.held[before - 2] = false;
        assert_false(talk_idle(&f->talk));
        run(f);
        assert_true(f->out.n <= before + 1);
    }
    assert_int_equal(f->out.n, roomy->out.n);
    for (int i = 0; i < f->out.n; i++) {
        assert_memory_equal(f->out.chunk[i], roomy->out.chunk[i],
                            f->out.len[i]);
    }
    check_chunks(&f->out);
    fix_free(roomy);
    fix_free(f);
    free(roomy);
    free(f);
}

/* Cancel mid-way: nothing more is sent, the talker holds nothing (the
 * pool is empty once the consumer lets its blocks go: fix_free checks). */
static void test_cancel(void **state) {
    Fix *f = malloc(sizeof(*f));

    (void) state;
    fix_init(f, 3);
    f->out.hold = true;
    speech(f, 1, "latency", TEXT);
    chat(f, 2, "latency");
    talk_text(&f->talk, 2, "Some words that wait", 20);
    talk_step(&f->talk);
    assert_true(f->out.n >= 1);
    assert_true(talk_cancel(&f->talk, 1));
    assert_true(talk_cancel(&f->talk, 2));
    assert_false(talk_cancel(&f->talk, 2));
    assert_int_equal(f->talk.n_reqs, 0);
    int n = f->out.n;
    run(f);
    assert_int_equal(f->out.n, n);
    assert_int_equal(f->out.n_done + f->out.n_error, 0);
    fix_free(f);
    free(f);
}

/* Nothing to say: DONE with zero counts and no block. Refusals and the
 * input bound. */
static void test_edges(void **state) {
    Fix  *f = malloc(sizeof(*f));
    char *big = malloc(TALK_INPUT_MAX + CHUNKER_MAX + 1);

    (void) state;
    fix_init(f, 8);
    speech(f, 1, "latency", "...");
    run(f);
    assert_int_equal(f->out.n_done, 1);
    assert_int_equal(f->out.n, 0);
    assert_int_equal(f->out.done.prompt_tokens, 0);
    assert_int_equal(f->out.done.audio_tokens, 0);

    submit(f, 2, "{\"prompt\": \"Hi\"}");           // no "audio"
    assert_int_equal(f->out.status, 400);

    chat(f, 3, "latency");                           // text after the end
    talk_end(&f->talk, 3);
    talk_text(&f->talk, 3, "late", 4);
    assert_int_equal(f->out.status, 500);
    assert_string_equal(f->out.code, "talker_protocol");
    talk_text(&f->talk, 99, "nobody", 6);            // unknown: ignored

    /* the bound: more than the chunker and the queue hold, unstepped */
    memset(big, 'a', TALK_INPUT_MAX + CHUNKER_MAX + 1);
    for (size_t i = 5; i < TALK_INPUT_MAX + CHUNKER_MAX + 1; i += 6) {
        big[i] = ' ';
    }
    chat(f, 4, "latency");
    talk_text(&f->talk, 4, big, TALK_INPUT_MAX + CHUNKER_MAX);
    assert_int_equal(f->out.n_error, 2);
    talk_text(&f->talk, 4, big, 1);
    assert_int_equal(f->out.n_error, 3);
    assert_string_equal(f->out.code, "talker_overrun");
    assert_int_equal(f->talk.n_reqs, 0);

    /* at most max_requests (8) held */
    for (uint64_t id = 10; id < 19; id++) chat(f, id, "latency");
    assert_int_equal(f->talk.n_reqs, 8);
    assert_int_equal(f->out.status, 503);
    fix_free(f);
    free(big);
    free(f);
}


/* ---- The stage row, through the skeleton ------------------------------- */

typedef struct {
    int       sv[2];            // [0]: the frontend's, [1]: the stage's
    Pool      pool;
    pthread_t th;
    int       rc;
    Err       err;
} Rig;

static void *run_stage(void *arg) {
    Rig        *r = arg;
    ServeConfig cfg = { .model_path = "x", .max_seqs = 4, .max_queue = 4,
                        .pool_fd = r->pool.fd, .stage_owner = 2 };

    r->rc = stage_main(&talker_stage, &cfg, r->sv[1], -1, &r->err);
    return NULL;
}


/* The next frame: its type; for an EVENT, *id, the inner type in *inner
 * and its payload at buf + 8 + OMNI_FRAME_HDR. */
static uint8_t next_frame(Rig *r, uint8_t *buf, size_t cap, uint64_t *id,
                          uint8_t *inner)
{
    size_t       len;
    uint8_t      type = chan_frame(r->sv[0], buf, cap, &len);
    OmniFrameHdr in;

    if (len >= 8) *id = omni_rd64(buf);
    if (type == OMNI_F_STAGE_EVENT) {
        omni_hdr_decode(&in, buf + 8);
        *inner = in.type;
    }
    return type;
}

/* A frame of type for id: the id, then an inner frame (inner, n bytes of
 * p) when inner is not 0, else p as it is. */
static void send_frame(Rig *r, uint8_t type, uint64_t id, uint8_t inner,
                       const void *p, size_t n)
{
    uint8_t out[512];
    size_t  hdr = inner != 0 ? OMNI_FRAME_HDR : 0;

    assert_true(2 * OMNI_FRAME_HDR + 8 + n <= sizeof(out));
    omni_hdr_encode(out, type, (uint32_t) (8 + hdr + n));
    omni_wr64(out + OMNI_FRAME_HDR, id);
    if (inner != 0) omni_hdr_encode(out + OMNI_FRAME_HDR + 8, inner,
                                    (uint32_t) n);
    memcpy(out + OMNI_FRAME_HDR + 8 + hdr, p, n);
    assert_int_equal(write(r->sv[0], out, OMNI_FRAME_HDR + 8 + hdr + n),
                     (ssize_t) (OMNI_FRAME_HDR + 8 + hdr + n));
}

/* Frames until request id's DONE or ERROR: its blocks are checked and
 * dropped. Returns the inner type that ended it; *blocks counts them. */
static uint8_t drain(Rig *r, uint64_t id, int *blocks) {
    uint8_t  buf[1024], inner = 0, type;
    uint64_t got = 0;
    Err      err;

    *blocks = 0;
    for (;;) {
        type = next_frame(r, buf, sizeof(buf), &got, &inner);
        if (type != OMNI_F_STAGE_EVENT || got != id) continue;
        if (inner != OMNI_F_STAGE_BLOCK) return inner;
        const uint8_t *p = buf + 8 + OMNI_FRAME_HDR;
        PoolRef        ref = { omni_rd32(p), omni_rd32(p + 4),
                               omni_rd32(p + 8) };

        assert_int_equal(pool_check(&r->pool, ref, &err), 0);
        assert_int_equal(pool_unref(&r->pool, ref.block), 1);
        (*blocks)++;
    }
}

static void test_stage_row(void **state) {
    static const char speak[] = "{\"input\": \"Hello there, my old friend.\","
        " \"audio\": {\"voice\": \"ash\"}}";
    static const char talk[] = "{\"prompt\": \"Hi\", \"audio\": {\"voice\":"
        " \"ash\"}}";
    uint8_t   buf[1024], inner = 0, bad[16] = { 0 }, done[OMNI_DONE_LEN];
    uint64_t  id = 0;
    int       blocks, b;
    Rig       r;
    Err       err;
    PoolStats st;
    struct timeval tv = { 10, 0 };  // a stuck stage fails, not hangs

    (void) state;
    memset(&r, 0, sizeof(r));
    assert_int_equal(pool_create(&r.pool, 8, 32 << 10, &err), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, r.sv), 0);
    setsockopt(r.sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    assert_int_equal(pthread_create(&r.th, NULL, run_stage, &r), 0);
    assert_int_equal(next_frame(&r, buf, sizeof(buf), &id, &inner),
                     OMNI_F_STAGE_READY);
    assert_memory_equal(buf, "{\"id\":\"flite\"}", 14);

    send_frame(&r, OMNI_F_STAGE_SUBMIT, 1, 0, speak, sizeof(speak) - 1);
    assert_int_equal(drain(&r, 1, &blocks), OMNI_F_DONE);
    assert_true(blocks >= 2);                   // latency: a short first

    send_frame(&r, OMNI_F_STAGE_SUBMIT, 2, 0, talk, sizeof(talk) - 1);
    send_frame(&r, OMNI_F_STAGE_INPUT, 2, OMNI_F_TEXT, "Once upon a ", 12);
    send_frame(&r, OMNI_F_STAGE_INPUT, 2, OMNI_F_TEXT, "time.", 5);
    memset(done, 0, sizeof(done));
    send_frame(&r, OMNI_F_STAGE_INPUT, 2, OMNI_F_DONE, done, sizeof(done));
    assert_int_equal(drain(&r, 2, &blocks), OMNI_F_DONE);
    assert_true(blocks >= 1);

    /* a BLOCK is not the talker's input: its reference is dropped and the
       request fails */
    send_frame(&r, OMNI_F_STAGE_SUBMIT, 3, 0, talk, sizeof(talk) - 1);
    b = pool_alloc(&r.pool, 1, 3);
    assert_true(b >= 0);
    omni_wr32(bad, (uint32_t) b);
    omni_wr32(bad + 8, 4);
    send_frame(&r, OMNI_F_STAGE_INPUT, 3, OMNI_F_STAGE_BLOCK, bad,
               sizeof(bad));
    assert_int_equal(drain(&r, 3, &blocks), OMNI_F_ERROR);

    send_frame(&r, OMNI_F_STAGE_CANCEL, 9, 0, "", 0);  // unknown: acked
    do {
        inner = 0;
    } while (next_frame(&r, buf, sizeof(buf), &id, &inner)
             != OMNI_F_STAGE_CANCELLED);
    assert_int_equal(id, 9);

    shutdown(r.sv[0], SHUT_WR);
    pthread_join(r.th, NULL);
    assert_int_equal(r.rc, 0);
    pool_stats(&r.pool, &st);
    assert_int_equal(st.used, 0);
    close(r.sv[0]);
    close(r.sv[1]);
    pool_destroy(&r.pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_full_pool),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_stage_row),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("talker", tests, setup, NULL);
}

/* test_frame.c -- the frame reader and writer (frame.c) and the payload
 * codecs of omni_proto.h: every frame type round trips, split at every
 * byte; a header that breaks a rule is refused before any payload memory
 * is reserved; the reader keeps bytes read past a frame; the writer
 * survives partial writes through a small socket buffer. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "frame.h"

typedef struct {
    uint8_t        type;
    const uint8_t *p;
    size_t         len;
} Frame;

/* The stream a FrameWriter produces for frames (its queued bytes). */
static void encode(FrameWriter *w, const Frame *f, int n) {
    frame_writer_init(w);
    for (int i = 0; i < n; i++) {
        assert_int_equal(frame_put(w, f[i].type, f[i].p, f[i].len), 0);
    }
}

static void check_frame(const FrameReader *r, const Frame *want) {
    assert_int_equal(r->hdr.type, want->type);
    assert_int_equal(r->hdr.len, want->len);
    assert_int_equal(r->hdr.version, OMNI_PROTO_VERSION);
    if (want->len > 0) assert_memory_equal(r->payload, want->p, want->len);
}

/* Feeds buf (n bytes) as a first piece of split bytes, then pieces of step
 * bytes, checking each READY frame against want in order. Returns the
 * frames seen; stops early when the reader goes BAD. */
static int feed_check(FrameReader *r, const uint8_t *buf, size_t n,
                      size_t split, size_t step, const Frame *want,
                      int n_want)
{
    int got = 0;

    for (size_t off = 0, end; off < n; off = end) {
        end = off == 0 ? split : off + step;
        if (end > n) end = n;
        while (off < end) {
            size_t      used;
            FrameStatus st = frame_feed(r, buf + off, end - off, &used);

            off += used;
            if (st == FRAME_BAD) return got;
            if (st == FRAME_MORE) {
                assert_int_equal(off, end);
                break;
            }
            assert_int_equal(st, FRAME_READY);
            assert_true(got < n_want);
            check_frame(r, &want[got++]);
            frame_reader_next(r);
        }
    }
    return got;
}

/* Every valid frame of one direction, fed all at once, byte by byte, and
 * split in two at every byte boundary: always the same frames. */
static void round_trip(OmniDirection dir, const Frame *f, int n) {
    FrameWriter w;
    FrameReader r;
    size_t      len;

    encode(&w, f, n);
    len = frame_writer_pending(&w);
    for (size_t split = 1; split <= len; split++) {
        frame_reader_init(&r, dir);
        assert_int_equal(feed_check(&r, w.buf, len, split, len, f, n), n);
        assert_null(r.error);
        assert_int_equal(r.hdr_got, 0);
        frame_reader_free(&r);
    }
    frame_reader_init(&r, dir);
    assert_int_equal(feed_check(&r, w.buf, len, 1, 1, f, n), n);
    frame_reader_free(&r);
    frame_writer_free(&w);
}

static void test_round_trip_engine(void **state) {
    static const uint8_t req[] = "{\"model\":\"m\",\"prompt\":\"hi\"}";
    const Frame f[] = {
        { OMNI_F_REQUEST, req, sizeof(req) - 1 },
        { OMNI_F_HEALTH, NULL, 0 },
        { OMNI_F_MODELS, NULL, 0 },
        { OMNI_F_METRICS, NULL, 0 },
        { OMNI_F_REQUEST, (const uint8_t *) "x", 1 },
    };

    (void) state;
    round_trip(OMNI_DIR_TO_ENGINE, f, 5);
}

static void test_round_trip_client(void **state) {
    uint8_t   done[OMNI_DONE_LEN], err[64], health[16];
    OmniDone  d = { 12, 8, 30, OMNI_FINISH_LENGTH, 77, 0, 0, 0, 0 };
    OmniError e = { 400, "invalid_request_error", 21, "", 0, "", 0,
                    "bad", 3 };
    size_t    elen = omni_error_encode(err, &e);
    Frame     f[] = {
        { OMNI_F_TEXT, (const uint8_t *) "Once upon", 9 },
        { OMNI_F_TEXT, (const uint8_t *) "\xc3\xa9t\xc3\xa9", 5 },
        { OMNI_F_REASONING, (const uint8_t *) "Hm.", 3 },
        { OMNI_F_AUDIO, (const uint8_t *) "RIFF\xff", 5 },
        { OMNI_F_DONE, done, OMNI_DONE_LEN },
        { OMNI_F_ERROR, err, elen },
        { OMNI_F_HEALTH_R, health, 5 },
        { OMNI_F_MODELS_R, (const uint8_t *) "{\"data\":[]}", 11 },
        { OMNI_F_METRICS_R, (const uint8_t *) "a 1\n", 4 },
        { OMNI_F_METRICS_R, NULL, 0 },
    };

    (void) state;
    omni_done_encode(done, &d);
    omni_wr16(health, 200);
    memcpy(health + 2, "ok!", 3);
    round_trip(OMNI_DIR_TO_CLIENT, f, 8);
}

static void test_round_trip_stage(void **state) {
    const Frame f[] = {
        { OMNI_F_STAGE_MIN, (const uint8_t *) "abc", 3 },
        { OMNI_F_STAGE_MAX, NULL, 0 },
        { OMNI_F_STAGE_MIN + 1, (const uint8_t *) "\0\1\2\3\4\5\6\7", 8 },
    };

    (void) state;
    round_trip(OMNI_DIR_STAGE, f, 3);
}

/* A header followed by payload bytes it announces. */
static size_t bad_frame(uint8_t *p, uint8_t type, uint32_t len,
                        uint8_t version, uint16_t flags)
{
    omni_wr32(p, len);
    p[4] = type;
    p[5] = version;
    omni_wr16(p + 6, flags);
    memset(p + OMNI_FRAME_HDR, 'x', 16);
    return OMNI_FRAME_HDR + 16;
}

typedef struct {
    OmniDirection dir;
    uint8_t       type;
    uint32_t      len;
    uint8_t       version;
    uint16_t      flags;
    const char   *error;
} BadCase;

#define V OMNI_PROTO_VERSION

static const BadCase bad_cases[] = {
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, OMNI_MAX_REQUEST + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, UINT32_MAX, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_TEXT, OMNI_MAX_TEXT + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_ERROR, OMNI_MAX_ERROR + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_STAGE, OMNI_F_STAGE_MIN, OMNI_MAX_STAGE + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_DONE, OMNI_DONE_LEN - 1, V, 0,
      "DONE frame of the wrong size" },
    { OMNI_DIR_TO_ENGINE, 99, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_TO_ENGINE, 0, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_TEXT, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_REQUEST, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_AUDIO, OMNI_MAX_AUDIO + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_AUDIO, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_STAGE, OMNI_F_REQUEST, 4, V, 0, "unexpected frame type" },
    { OMNI_DIR_STAGE, OMNI_F_STAGE_MAX + 1, 4, V, 0,
      "unexpected frame type" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, 4, V - 1, 0,
      "unsupported protocol version" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, 4, V + 1, 0,
      "unsupported protocol version" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, 4, V, 1, "nonzero frame flags" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_TEXT, 4, V, 0x8000, "nonzero frame flags" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_HEALTH, 1, V, 0,
      "control frame with a payload" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_METRICS, 16, V, 0,
      "control frame with a payload" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REQUEST, 0, V, 0, "empty request" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_REASONING, 0, V, 0, "empty REASONING" },
    { OMNI_DIR_TO_CLIENT, OMNI_F_REASONING, OMNI_MAX_TEXT + 1, V, 0,
      "frame too large" },
    { OMNI_DIR_TO_ENGINE, OMNI_F_REASONING, 4, V, 0,
      "unexpected frame type" },
};

/* Each bad header is refused at its 8th byte, all at once or byte by
 * byte, with nothing allocated and no payload byte taken; the reader then
 * stays BAD. */
static void test_rejects(void **state) {
    (void) state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const BadCase *c = &bad_cases[i];
        FrameReader    r;
        uint8_t        buf[OMNI_FRAME_HDR + 16];
        size_t         n = bad_frame(buf, c->type, c->len, c->version,
                                     c->flags), used, total = 0;
        FrameStatus    st = FRAME_MORE;

        frame_reader_init(&r, c->dir);
        assert_int_equal(frame_feed(&r, buf, n, &used), FRAME_BAD);
        assert_int_equal(used, OMNI_FRAME_HDR);
        assert_string_equal(r.error, c->error);
        assert_null(r.payload);
        assert_int_equal(r.cap, 0);
        assert_int_equal(frame_feed(&r, buf + used, n - used, &used),
                         FRAME_BAD);
        assert_int_equal(used, 0);
        frame_reader_next(&r);
        assert_int_equal(frame_feed(&r, buf, n, &used), FRAME_BAD);
        frame_reader_free(&r);

        frame_reader_init(&r, c->dir);
        while (total < n && st == FRAME_MORE) {
            st = frame_feed(&r, buf + total, 1, &used);
            total += used;
        }
        assert_int_equal(st, FRAME_BAD);
        assert_int_equal(total, OMNI_FRAME_HDR);
        assert_string_equal(r.error, c->error);
        assert_null(r.payload);
        frame_reader_free(&r);
    }
}

/* A good frame, then a bad one: the first arrives, the second is refused
 * without the buffer growing. */
static void test_reject_after_good(void **state) {
    static const uint8_t body[] = "{\"prompt\":\"a\"}";
    Frame       good = { OMNI_F_REQUEST, body, sizeof(body) - 1 };
    FrameWriter w;
    FrameReader r;
    uint8_t     bad[OMNI_FRAME_HDR + 16];
    size_t      cap;

    (void) state;
    encode(&w, &good, 1);
    frame_reader_init(&r, OMNI_DIR_TO_ENGINE);
    assert_int_equal(feed_check(&r, w.buf, frame_writer_pending(&w), 3, 5,
                                &good, 1), 1);
    cap = r.cap;
    assert_int_equal(cap, good.len);
    bad_frame(bad, OMNI_F_REQUEST, OMNI_MAX_REQUEST + 1, V, 0);
    assert_int_equal(feed_check(&r, bad, sizeof(bad), sizeof(bad), 1, NULL,
                                0), 0);
    assert_string_equal(r.error, "frame too large");
    assert_int_equal(r.cap, cap);
    frame_reader_free(&r);
    frame_writer_free(&w);
}

/* The payload buffer follows the bytes that arrived, not the announced
 * length, and ends at exactly the frame's length. */
static void test_growth(void **state) {
    size_t       len = OMNI_MAX_REQUEST;
    uint8_t     *buf = malloc(OMNI_FRAME_HDR + len);
    FrameReader  r;
    size_t       off = 0, used;
    FrameStatus  st = FRAME_MORE;

    (void) state;
    assert_non_null(buf);
    omni_hdr_encode(buf, OMNI_F_REQUEST, (uint32_t) len);
    for (size_t i = 0; i < len; i++) buf[OMNI_FRAME_HDR + i] = (uint8_t) i;
    frame_reader_init(&r, OMNI_DIR_TO_ENGINE);
    assert_int_equal(frame_feed(&r, buf, OMNI_FRAME_HDR + 10, &used),
                     FRAME_MORE);
    assert_true(r.cap <= 4096);
    off = used;
    while (st == FRAME_MORE) {
        size_t piece = OMNI_FRAME_HDR + len - off < 65537
                       ? OMNI_FRAME_HDR + len - off : 65537;

        st = frame_feed(&r, buf + off, piece, &used);
        off += used;
        /* geometric, and never past what arrived by more than double */
        assert_true(r.cap <= 2 * r.got || r.cap <= 4096);
    }
    assert_int_equal(st, FRAME_READY);
    assert_int_equal(off, OMNI_FRAME_HDR + len);
    assert_int_equal(r.cap, len);
    assert_memory_equal(r.payload, buf + OMNI_FRAME_HDR, len);
    frame_reader_free(&r);
    free(buf);
}

static void nonblock(int fd) {
    assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

static void write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);

        assert_true(k > 0);
        p += k;
        n -= (size_t) k;
    }
}

/* Two and a half frames in one write: frame_read_fd returns the first,
 * keeps the rest in its buffer, returns the second without a read, and
 * the third once its tail arrives; then EOF. */
static void test_read_fd_leftover(void **state) {
    const Frame f[] = {
        { OMNI_F_TEXT, (const uint8_t *) "one", 3 },
        { OMNI_F_TEXT, (const uint8_t *) "two!", 4 },
        { OMNI_F_TEXT, (const uint8_t *) "three", 5 },
    };
    FrameWriter w;
    FrameReader r;
    int         sv[2];
    bool        eof;
    size_t      n;

    (void) state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    nonblock(sv[1]);
    encode(&w, f, 3);
    n = frame_writer_pending(&w);
    write_all(sv[0], w.buf, n - 3);
    frame_reader_init(&r, OMNI_DIR_TO_CLIENT);
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_READY);
    check_frame(&r, &f[0]);
    assert_true(frame_reader_buffered(&r) > 0);
    /* a READY frame not yet handled is reported again, nothing read */
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_READY);
    frame_reader_next(&r);
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_READY);
    check_frame(&r, &f[1]);
    frame_reader_next(&r);
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_MORE);
    assert_false(eof);
    write_all(sv[0], w.buf + n - 3, 3);
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_READY);
    check_frame(&r, &f[2]);
    frame_reader_next(&r);
    close(sv[0]);
    assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_MORE);
    assert_true(eof);
    close(sv[1]);
    frame_reader_free(&r);
    frame_writer_free(&w);
}

/* A peer that closes inside a frame (in the header, or in the payload) is
 * a protocol error, not a clean EOF. */
static void test_read_fd_truncated(void **state) {
    static const uint8_t body[] = "truncated";
    Frame       f = { OMNI_F_TEXT, body, sizeof(body) - 1 };
    FrameWriter w;
    size_t      cuts[2] = { 5, OMNI_FRAME_HDR + 4 };

    (void) state;
    encode(&w, &f, 1);
    for (int i = 0; i < 2; i++) {
        FrameReader r;
        int         sv[2];
        bool        eof;

        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        nonblock(sv[1]);
        write_all(sv[0], w.buf, cuts[i]);
        close(sv[0]);
        frame_reader_init(&r, OMNI_DIR_TO_CLIENT);
        assert_int_equal(frame_read_fd(&r, sv[1], &eof), FRAME_BAD);
        assert_false(eof);
        assert_string_equal(r.error, "connection closed inside a frame");
        frame_reader_free(&r);
        close(sv[1]);
    }
    frame_writer_free(&w);
}

/* Deterministic pseudo-random payloads for the socket test. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define SOCK_FRAMES 300

/* Frames of 0..200 KiB through a socket with small buffers on both ends:
 * the writer sees partial writes and EAGAIN, the reader partial frames
 * and the direct payload path; everything arrives in order, and the
 * writer's buffer stays within a small multiple of its backlog. */
static void test_socket_partial(void **state) {
    uint8_t     *data = malloc(200 << 10);
    Frame        f[SOCK_FRAMES];
    FrameWriter  w;
    FrameReader  r;
    int          sv[2], small = 4096, sent = 0, got = 0, partial = 0;
    uint64_t     rng = 7;
    size_t       max_backlog = 0;
    bool         eof;

    (void) state;
    assert_non_null(data);
    for (size_t i = 0; i < (200 << 10); i++) data[i] = (uint8_t) rng_next(&rng);
    for (int i = 0; i < SOCK_FRAMES; i++) {
        size_t len = rng_next(&rng) % 8 == 0 ? rng_next(&rng) % (200 << 10)
                                             : rng_next(&rng) % 300;

        f[i].type = (uint8_t) (OMNI_F_STAGE_MIN + i % 32);
        f[i].len = len;
        f[i].p = data + rng_next(&rng) % ((200 << 10) - len + 1);
    }
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    nonblock(sv[0]);
    nonblock(sv[1]);
    frame_writer_init(&w);
    frame_reader_init(&r, OMNI_DIR_STAGE);
    while (got < SOCK_FRAMES) {
        size_t before;
        FrameStatus st;

        /* queue a few frames, flush what the socket takes */
        for (int k = 0; k < 3 && sent < SOCK_FRAMES; k++, sent++) {
            assert_int_equal(frame_put(&w, f[sent].type, f[sent].p,
                                       f[sent].len), 0);
        }
        if (frame_writer_pending(&w) > max_backlog) {
            max_backlog = frame_writer_pending(&w);
        }
        assert_true(w.cap <= 4 * max_backlog || w.cap <= 4096);
        before = frame_writer_pending(&w);
        assert_int_equal(frame_flush(&w, sv[0]), 0);
        partial += frame_writer_pending(&w) > 0
                   && frame_writer_pending(&w) < before;
        while ((st = frame_read_fd(&r, sv[1], &eof)) == FRAME_READY) {
            check_frame(&r, &f[got++]);
            frame_reader_next(&r);
        }
        assert_int_equal(st, FRAME_MORE);
        assert_false(eof);
    }
    assert_int_equal(frame_writer_pending(&w), 0);
    assert_true(partial > 0);

    /* the peer goes away: EPIPE, and no SIGPIPE kills the test */
    close(sv[1]);
    assert_int_equal(frame_put(&w, OMNI_F_STAGE_MIN, "x", 1), 0);
    assert_int_equal(frame_flush(&w, sv[0]), -1);
    assert_int_equal(errno, EPIPE);
    close(sv[0]);
    frame_reader_free(&r);
    frame_writer_free(&w);
    free(data);
}

/* Through a one-page pipe (write(2), not send): after a partial flush the
 * sent bytes outnumber the pending ones, so the next frame that does not
 * fit compacts the buffer instead of growing it. */
static void test_writer_compaction(void **state) {
    static uint8_t big[4088], mid[1000], tail[3500];
    const Frame    f[] = {
        { OMNI_F_STAGE_MIN, big, sizeof(big) },
        { OMNI_F_STAGE_MIN, mid, sizeof(mid) },
        { OMNI_F_STAGE_MIN, tail, sizeof(tail) },
    };
    FrameWriter    w;
    FrameReader    r;
    int            p[2], got = 0;
    size_t         cap;
    bool           eof;
    FrameStatus    st;

    (void) state;
    memset(big, 'b', sizeof(big));
    memset(mid, 'm', sizeof(mid));
    memset(tail, 't', sizeof(tail));
    assert_int_equal(pipe(p), 0);
    assert_true(fcntl(p[1], F_SETPIPE_SZ, 4096) >= 4096);
    nonblock(p[0]);
    nonblock(p[1]);
    encode(&w, f, 2);
    assert_int_equal(frame_flush(&w, p[1]), 0);
    assert_true(w.head > 0 && w.head >= frame_writer_pending(&w));
    cap = w.cap;
    assert_true(w.cap - w.tail < OMNI_FRAME_HDR + sizeof(tail));
    assert_int_equal(frame_put(&w, f[2].type, f[2].p, f[2].len), 0);
    assert_int_equal(w.head, 0);
    assert_int_equal(w.cap, cap);
    frame_reader_init(&r, OMNI_DIR_STAGE);
    while (got < 3) {
        assert_int_equal(frame_flush(&w, p[1]), 0);
        while ((st = frame_read_fd(&r, p[0], &eof)) == FRAME_READY) {
            check_frame(&r, &f[got++]);
            frame_reader_next(&r);
        }
        assert_int_equal(st, FRAME_MORE);
    }
    assert_int_equal(frame_writer_pending(&w), 0);
    close(p[0]);
    close(p[1]);
    frame_reader_free(&r);
    frame_writer_free(&w);
}

static void test_read_fd_error(void **state) {
    FrameReader r;
    bool        eof;

    (void) state;
    frame_reader_init(&r, OMNI_DIR_TO_ENGINE);
    assert_int_equal(frame_read_fd(&r, -1, &eof), FRAME_BAD);
    assert_int_equal(errno, EBADF);
    assert_string_equal(r.error, "read failed");
    frame_reader_free(&r);
}

/* frame_put2 joins its pieces; a length past u32 is refused. */
static void test_put2(void **state) {
    FrameWriter w;
    FrameReader r;
    Frame       want = { OMNI_F_STAGE_MIN, (const uint8_t *) "idbody", 6 };
    uint8_t     one = 1;

    (void) state;
    frame_writer_init(&w);
    assert_int_equal(frame_put2(&w, OMNI_F_STAGE_MIN, "id", 2, "body", 4), 0);
    assert_int_equal(frame_put2(&w, OMNI_F_STAGE_MIN, &one, UINT32_MAX,
                                &one, 1), -1);
    assert_int_equal(errno, EMSGSIZE);
    assert_int_equal(frame_writer_pending(&w), OMNI_FRAME_HDR + 6);
    frame_reader_init(&r, OMNI_DIR_STAGE);
    assert_int_equal(feed_check(&r, w.buf, frame_writer_pending(&w), 100, 1,
                                &want, 1), 1);
    frame_reader_free(&r);
    frame_writer_free(&w);
}

static void test_done_codec(void **state) {
    uint8_t  p[OMNI_DONE_LEN];
    OmniDone d = { 100000, 4096, 7, OMNI_FINISH_STOP,
                   0x7fedcba987654321ull, 321, 0x01020304,
                   0xa0b0c0d0, 0 }, e;

    (void) state;
    omni_done_encode(p, &d);
    assert_int_equal(omni_done_decode(&e, p), 0);
    assert_int_equal(e.prompt_tokens, 100000);
    assert_int_equal(e.cached_tokens, 4096);
    assert_int_equal(e.completion_tokens, 7);
    assert_int_equal(e.finish, OMNI_FINISH_STOP);
    assert_true(e.seed == 0x7fedcba987654321ull);
    assert_int_equal(p[13] | p[14] | p[15], 0);
    assert_int_equal(p[16], 0x21);      /* little-endian */
    assert_int_equal(p[23], 0x7f);
    assert_int_equal(e.audio_tokens, 321);
    assert_int_equal(e.audio_ms, 0x01020304);
    assert_int_equal(p[28], 0x04);
    assert_true(e.input_audio_ms == 0xa0b0c0d0);
    assert_int_equal(p[32], 0xd0);
    assert_int_equal(p[36] | p[37] | p[38] | p[39], 0);
    assert_int_equal(e.reasoning_tokens, 0);
    d.reasoning_tokens = 0x05060708;
    omni_done_encode(p, &d);
    assert_int_equal(omni_done_decode(&e, p), 0);
    assert_int_equal(e.reasoning_tokens, 0x05060708);
    assert_int_equal(p[36], 0x08);
    d.finish = OMNI_FINISH_LENGTH;
    omni_done_encode(p, &d);
    assert_int_equal(omni_done_decode(&e, p), 0);
    assert_int_equal(e.finish, OMNI_FINISH_LENGTH);
    p[12] = 2;
    assert_int_equal(omni_done_decode(&e, p), -1);
}

static void check_error_equal(const OmniError *a, const OmniError *b) {
    assert_int_equal(a->status, b->status);
    assert_int_equal(a->type_len, b->type_len);
    assert_int_equal(a->param_len, b->param_len);
    assert_int_equal(a->code_len, b->code_len);
    assert_int_equal(a->message_len, b->message_len);
    assert_memory_equal(a->type, b->type, a->type_len);
    if (a->param_len) assert_memory_equal(a->param, b->param, a->param_len);
    if (a->code_len) assert_memory_equal(a->code, b->code, a->code_len);
    assert_memory_equal(a->message, b->message, a->message_len);
}

static void test_error_codec(void **state) {
    const OmniError cases[] = {
        { 400, "invalid_request_error", 21, "messages", 8,
          "context_length_exceeded", 23, "prompt is too long", 18 },
        { 503, "server_error", 12, NULL, 0, "overloaded", 10,
          "too many requests waiting", 25 },
        { 599, "t", 1, NULL, 0, NULL, 0, "", 0 },
    };
    uint8_t   p[256];
    OmniError e;

    (void) state;
    for (int i = 0; i < 3; i++) {
        const OmniError *c = &cases[i];
        size_t n = omni_error_size(c->type_len, c->param_len, c->code_len,
                                   c->message_len);

        assert_int_equal(omni_error_encode(p, c), n);
        assert_int_equal(omni_error_decode(&e, p, n), 0);
        check_error_equal(&e, c);
        /* every truncation, and a trailing byte, is malformed */
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(omni_error_decode(&e, p, k), -1);
        }
        p[n] = 0;
        assert_int_equal(omni_error_decode(&e, p, n + 1), -1);
    }
}

static void test_error_malformed(void **state) {
    const OmniError ok = { 400, "invalid_request_error", 21, NULL, 0, NULL, 0,
                           "bad", 3 };
    uint8_t   p[64];
    OmniError e;
    size_t    n = omni_error_encode(p, &ok);

    (void) state;
    omni_wr16(p, 399);                          /* not an error status */
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    omni_wr16(p, 600);
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    omni_wr16(p, 200);
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    omni_wr16(p, 400);
    assert_int_equal(omni_error_decode(&e, p, n), 0);
    omni_wr16(p + 2, 22);                       /* type runs one too far */
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    omni_wr16(p + 2, 0xFFFF);
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    omni_wr16(p + 2, 20);                       /* one short: misparses */
    assert_int_equal(omni_error_decode(&e, p, n), -1);
    memset(p, 0, sizeof(p));
    omni_wr16(p, 500);
    assert_int_equal(omni_error_decode(&e, p, 10), 0);  /* all empty */
    assert_int_equal(omni_error_decode(&e, p, 9), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_engine),
        cmocka_unit_test(test_round_trip_client),
        cmocka_unit_test(test_round_trip_stage),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_reject_after_good),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_read_fd_leftover),
        cmocka_unit_test(test_read_fd_truncated),
        cmocka_unit_test(test_socket_partial),
        cmocka_unit_test(test_writer_compaction),
        cmocka_unit_test(test_read_fd_error),
        cmocka_unit_test(test_put2),
        cmocka_unit_test(test_done_codec),
        cmocka_unit_test(test_error_codec),
        cmocka_unit_test(test_error_malformed),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("frame", tests, NULL, NULL);
}

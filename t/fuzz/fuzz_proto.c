/* fuzz_proto.c -- libFuzzer target: arbitrary bytes as what a client sends
 * down an engine socket.
 *
 * Input layout: byte 0 picks how the stream is cut (0: one write; n > 0:
 * pieces of 1..n bytes, sizes from a small LCG seeded by n, so the same
 * input is always cut the same way); the rest is the stream. It is fed to
 * a FrameReader in the client-to-engine direction as the frontend would
 * feed it, and every REQUEST frame's payload goes through request_parse.
 *
 * Besides the sanitizers, the target checks contracts: a reader that says
 * MORE took every byte offered; a READY frame passed omni_frame_check; a
 * request that parses is accepted by sampler_init (bar the
 * vocabulary-dependent logit_bias ids) and by stop_init, and its strings
 * are NUL-terminated where the lengths say. A broken contract aborts, which
 * libFuzzer reports as a crash. */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "request.h"
#include "json_scan.h"
#include "sampler.h"
#include "stop.h"

static volatile uint8_t sink;

/* Every string of an accepted request is well-formed UTF-8. */
static void check_text(const char *s) {
    size_t n = strlen(s);

    if (omni_utf8_valid(s, n) != n) abort();
    sink ^= (uint8_t) n;
}

/* Walks a parsed request: every string read to its end (ASan checks each
 * lies in its allocation), every parameter passed to its consumer. */
static void check_request(const OmniRequest *r) {
    Sampler        s;
    SamplerParams  p = r->sampling;
    StopMatcher    m;
    Err            err;

    if (r->chat != (r->n_msgs > 0) || r->n_msgs > REQ_MAX_MESSAGES) abort();
    for (int i = 0; i < r->n_msgs; i++) {
        check_text(r->msgs[i].role);
        check_text(r->msgs[i].content);
    }
    if (!r->chat && (r->prompt == NULL || r->prompt[r->prompt_len] != '\0')) {
        abort();
    }
    if (!r->chat) check_text(r->prompt);
    if (r->model != NULL) check_text(r->model);
    for (int i = 0; i < r->n_stop; i++) check_text(r->stop[i]);
    if (r->sampling.seed > (uint64_t) INT64_MAX) abort();
    if (r->cache_salt != NULL
        && (r->cache_salt_len == 0 || r->cache_salt_len > REQ_MAX_SALT
            || strlen(r->cache_salt) != r->cache_salt_len)) {
        abort();
    }
    if (r->max_tokens == 0 || r->max_tokens < -1) abort();
    for (int32_t i = 0; i < p.n_bias; i++) {
        if (p.bias[i].token < 0 || !(p.bias[i].bias >= -100.0f
                                     && p.bias[i].bias <= 100.0f)) {
            abort();
        }
    }
    p.n_bias = 0;
    if (sampler_init(&s, &p, 1, &err) != 0) abort();
    sampler_free(&s);
    if (stop_init(&m, r->stop, r->n_stop, &err) != 0) abort();
}

static void handle_frame(const FrameReader *fr) {
    OmniRequest r;
    ReqError    e;

    if (omni_frame_check(&fr->hdr, OMNI_DIR_TO_ENGINE) != NULL
        || fr->got != fr->hdr.len) {
        abort();
    }
    if (fr->hdr.type != OMNI_F_REQUEST) return;
    if (request_parse(&r, (const char *) fr->payload, fr->hdr.len, &e) != 0) {
        if (e.err.msg[0] == '\0') abort();     // an error always says what
        if (e.status != 400 && e.status != 503) abort();
        if (omni_utf8_valid(e.param, strlen(e.param)) != strlen(e.param)) {
            abort();                            // the param is quotable
        }
        return;
    }
    check_request(&r);
    request_free(&r);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void) argc;
    (void) argv;
    log_set_level(LOG_ERROR);
    return 0;
}

/* Feeds one piece as a socket read would deliver it: it may hold several
 * frames or end mid-frame. Returns -1 once the reader refuses the stream
 * (BAD or NOMEM: the engine would answer an error and close). */
static int feed_piece(FrameReader *fr, const uint8_t *buf, size_t len) {
    while (len > 0) {
        size_t      used;
        FrameStatus st = frame_feed(fr, buf, len, &used);

        if (used > len) abort();
        buf += used;
        len -= used;
        if (st == FRAME_READY) {
            handle_frame(fr);
            frame_reader_next(fr);
        } else if (st == FRAME_MORE) {
            if (len != 0) abort();
        } else {
            return -1;
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FrameReader fr;
    size_t      pos = 1;
    uint32_t    lcg;

    if (size == 0) return 0;
    lcg = data[0];
    frame_reader_init(&fr, OMNI_DIR_TO_ENGINE);
    while (pos < size) {
        size_t piece = size - pos;

        if (data[0] > 0) {
            lcg = lcg * 1103515245u + 12345u;
            if (piece > 1 + (lcg >> 16) % data[0]) {
                piece = 1 + (lcg >> 16) % data[0];
            }
        }
        if (feed_piece(&fr, data + pos, piece) != 0) break;
        pos += piece;
    }
    frame_reader_free(&fr);
    return 0;
}

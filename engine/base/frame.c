/* frame.c -- see frame.h: a resumable frame reader and a write queue.
 *
 * The reader is a three-state machine kept in its counters, so any byte
 * boundary can interrupt it:
 *
 *   header    hdr_got < OMNI_FRAME_HDR: collecting the 8 header bytes
 *   payload   hdr_got == OMNI_FRAME_HDR, got < hdr.len
 *   ready     hdr_got == OMNI_FRAME_HDR, got == hdr.len
 *
 * plus BAD, which is error != NULL and is final. Because frame_feed's
 * outcome depends only on these counters and the bytes, never on how the
 * bytes were cut into calls, feeding piecewise and feeding at once give
 * the same frames.
 *
 * The header is checked the moment its last byte arrives, before a single
 * payload byte is stored, so a refused frame never costs memory. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"

#define FRAME_MIN_CAP 4096      // first payload / write buffer size

static size_t min_size(size_t a, size_t b) {
    return a < b ? a : b;
}

// ---------------------------------------------------------------------------
// Reader

void frame_reader_init(FrameReader *r, OmniDirection dir) {
    memset(r, 0, sizeof(*r));
    r->dir = dir;
}

void frame_reader_free(FrameReader *r) {
    free(r->payload);
    r->payload = NULL;
    r->cap = 0;
}

/* Makes the payload buffer hold at least need bytes (need <= hdr.len),
 * doubling from FRAME_MIN_CAP but never past the frame's length: memory
 * follows the bytes that actually arrived, not the length announced.
 * Returns -1 when realloc fails, the old buffer kept. */
static int reserve(FrameReader *r, size_t need) {
    size_t   cap = r->cap > 0 ? r->cap : FRAME_MIN_CAP;
    uint8_t *p;

    if (need <= r->cap) return 0;
    while (cap < need) cap *= 2;
    cap = min_size(cap, r->hdr.len);
    p = realloc(r->payload, cap);
    if (p == NULL) return -1;
    r->payload = p;
    r->cap = cap;
    return 0;
}

/* Takes header bytes; on the last one decodes and checks the header.
 * Returns the bytes taken; r->error is set when the header is refused. */
static size_t feed_header(FrameReader *r, const uint8_t *buf, size_t len) {
    size_t n = min_size(OMNI_FRAME_HDR - r->hdr_got, len);

    memcpy(r->hdr_buf + r->hdr_got, buf, n);
    r->hdr_got += n;
    if (r->hdr_got == OMNI_FRAME_HDR) {
        omni_hdr_decode(&r->hdr, r->hdr_buf);
        r->error = omni_frame_check(&r->hdr, r->dir);
    }
    return n;
}

FrameStatus frame_feed(FrameReader *r, const uint8_t *buf, size_t len,
                       size_t *used)
{
    size_t off = 0, n;

    *used = 0;
    if (r->error != NULL) return FRAME_BAD;
    if (r->hdr_got == OMNI_FRAME_HDR && r->got == r->hdr.len) {
        return FRAME_READY;
    }
    if (r->hdr_got < OMNI_FRAME_HDR) {
        if (len == 0) return FRAME_MORE;
        off = *used = feed_header(r, buf, len);
        if (r->error != NULL) return FRAME_BAD;
        if (r->hdr_got < OMNI_FRAME_HDR) return FRAME_MORE;
    }
    n = min_size(r->hdr.len - r->got, len - off);
    if (n > 0) {
        if (reserve(r, r->got + n) != 0) return FRAME_NOMEM;
        memcpy(r->payload + r->got, buf + off, n);
        r->got += n;
        *used = off + n;
    }
    return r->got == r->hdr.len ? FRAME_READY : FRAME_MORE;
}

void frame_reader_next(FrameReader *r) {
    if (r->error != NULL) return;
    r->hdr_got = 0;
    r->got = 0;
}

size_t frame_reader_buffered(const FrameReader *r) {
    return r->in_tail - r->in_head;
}

/* Feeds what in[] holds (possibly nothing: that reports a frame made
 * ready by a direct payload read). */
static FrameStatus feed_buffered(FrameReader *r) {
    size_t      used;
    FrameStatus st = frame_feed(r, r->in + r->in_head,
                                r->in_tail - r->in_head, &used);

    r->in_head += used;
    if (r->in_head == r->in_tail) r->in_head = r->in_tail = 0;
    return st;
}

/* Where the next read(2) goes, with in[] empty: straight into the payload
 * buffer when at least FRAME_INBUF payload bytes are still to come (no
 * second copy, and the read stops at the frame's end), else into in[] so
 * one read can take several small frames. -1 when the payload buffer
 * cannot grow. */
static int read_target(FrameReader *r, uint8_t **dst, size_t *room) {
    size_t left = r->hdr_got == OMNI_FRAME_HDR ? r->hdr.len - r->got : 0;

    if (left < FRAME_INBUF) {
        *dst = r->in;
        *room = FRAME_INBUF;
        return 0;
    }
    if (reserve(r, r->got + 1) != 0) return -1;
    *dst = r->payload + r->got;
    *room = min_size(r->cap - r->got, left);
    return 0;
}

FrameStatus frame_read_fd(FrameReader *r, int fd, bool *eof) {
    *eof = false;
    for (;;) {
        FrameStatus st = feed_buffered(r);
        uint8_t    *dst;
        size_t      room;
        ssize_t     n;

        if (st != FRAME_MORE) return st;
        if (read_target(r, &dst, &room) != 0) return FRAME_NOMEM;
        n = read(fd, dst, room);
        if (n > 0) {
            if (dst == r->in) r->in_tail = (size_t) n;
            else r->got += (size_t) n;
            continue;
        }
        if (n == 0) {
            if (r->hdr_got == 0) {
                *eof = true;
                return FRAME_MORE;
            }
            r->error = "connection closed inside a frame";
            return FRAME_BAD;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return FRAME_MORE;
        r->error = "read failed";
        return FRAME_BAD;
    }
}

// ---------------------------------------------------------------------------
// Writer

void frame_writer_init(FrameWriter *w) {
    memset(w, 0, sizeof(*w));
}

void frame_writer_free(FrameWriter *w) {
    free(w->buf);
    memset(w, 0, sizeof(*w));
}

size_t frame_writer_pending(const FrameWriter *w) {
    return w->tail - w->head;
}

/* Makes room for need more bytes at the tail. Compacting copies the
 * pending bytes, so it is done only when the sent bytes it drops are at
 * least as many (each byte is then copied O(1) times on average);
 * otherwise the buffer doubles. */
static int writer_room(FrameWriter *w, size_t need) {
    size_t   pending = w->tail - w->head, cap;
    uint8_t *p;

    if (w->cap - w->tail >= need) return 0;
    if (w->head > 0 && w->head >= pending) {
        memmove(w->buf, w->buf + w->head, pending);
        w->head = 0;
        w->tail = pending;
        if (w->cap - w->tail >= need) return 0;
    }
    cap = w->cap > 0 ? w->cap * 2 : FRAME_MIN_CAP;
    if (cap < w->tail + need) cap = w->tail + need;
    p = realloc(w->buf, cap);
    if (p == NULL) {
        errno = ENOMEM;
        return -1;
    }
    w->buf = p;
    w->cap = cap;
    return 0;
}

int frame_put2(FrameWriter *w, uint8_t type, const void *a, size_t alen,
               const void *b, size_t blen)
{
    uint8_t *p;

    if (alen > UINT32_MAX || blen > UINT32_MAX - alen) {
        errno = EMSGSIZE;
        return -1;
    }
    if (writer_room(w, OMNI_FRAME_HDR + alen + blen) != 0) return -1;
    p = w->buf + w->tail;
    omni_hdr_encode(p, type, (uint32_t) (alen + blen));
    if (alen > 0) memcpy(p + OMNI_FRAME_HDR, a, alen);
    if (blen > 0) memcpy(p + OMNI_FRAME_HDR + alen, b, blen);
    w->tail += OMNI_FRAME_HDR + alen + blen;
    return 0;
}

int frame_put(FrameWriter *w, uint8_t type, const void *payload, size_t len)
{
    return frame_put2(w, type, payload, len, NULL, 0);
}

/* send(2) with MSG_NOSIGNAL, so a peer that hung up is EPIPE rather than
 * a SIGPIPE that kills the engine; write(2) for what is not a socket. */
static ssize_t write_some(int fd, const void *p, size_t n) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);

    return r < 0 && errno == ENOTSOCK ? write(fd, p, n) : r;
}

int frame_flush(FrameWriter *w, int fd) {
    while (w->head < w->tail) {
        ssize_t n = write_some(fd, w->buf + w->head, w->tail - w->head);

        if (n > 0) {
            w->head += (size_t) n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            if (n == 0) errno = EIO;
            return -1;
        }
    }
    w->head = w->tail = 0;
    return 0;
}

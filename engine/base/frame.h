/* frame.h -- reading omni_proto.h frames off a non-blocking stream, and
 * queueing frames to write to one.
 *
 * FrameReader accumulates bytes until a whole frame is there. The header is
 * checked (omni_frame_check, for the reader's direction) as soon as its 8
 * bytes have arrived, before the payload buffer grows: a frame that breaks
 * a rule is refused without its payload being read or any memory reserved
 * for it. The payload buffer grows geometrically as payload bytes arrive,
 * never past the frame's length, so a peer that announces 16 MiB and sends
 * 10 bytes costs 4 KiB, not 16 MiB; it ends as large as the largest frame
 * seen (up to the direction's limit) and is reused.
 *
 * frame_read_fd reads into a small input buffer inside the reader (in[])
 * and feeds from there, so bytes that arrive behind the current frame are
 * kept for the next call rather than lost. The caller's loop is therefore:
 *
 *     while ((st = frame_read_fd(r, fd, &eof)) == FRAME_READY) {
 *         handle(r->hdr, r->payload);
 *         frame_reader_next(r);
 *     }
 *
 * Returning to epoll after a READY without calling frame_read_fd again
 * would strand buffered frames: the socket has nothing left to report.
 * When the reader is inside a payload and in[] is empty, frame_read_fd
 * reads straight into the payload buffer, so a large request is not
 * copied twice.
 *
 * FrameWriter is an output queue: frames are appended whole (header and
 * payload), flushed with write(2) as the socket takes them. Its size is
 * bounded by the caller (frame_writer_pending), so a consumer that does not
 * read cannot make the engine's memory grow without limit; the buffer's
 * size follows that backlog (see frame_put). */

#ifndef OMNI_FRAME_H
#define OMNI_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "omni_proto.h"

#define FRAME_INBUF 4096        // frame_read_fd's input buffer, bytes

typedef struct {
    OmniDirection dir;
    uint8_t       hdr_buf[OMNI_FRAME_HDR];
    size_t        hdr_got;
    OmniFrameHdr  hdr;          // valid once hdr_got == OMNI_FRAME_HDR
    uint8_t      *payload;      // owned, cap bytes
    size_t        cap;
    size_t        got;          // payload bytes read so far
    const char   *error;        // static message after FRAME_BAD; the
                                //   reader then stays BAD
    uint8_t       in[FRAME_INBUF]; // bytes read from the fd, not yet fed
    size_t        in_head;      // first unfed byte of in
    size_t        in_tail;      // end of the bytes read into in
} FrameReader;

typedef enum {
    FRAME_MORE = 0,             // need more bytes
    FRAME_READY,                // a whole frame: r->hdr, r->payload
    FRAME_BAD,                  // protocol error: r->error says what
    FRAME_NOMEM,                // payload buffer could not grow
} FrameStatus;

void        frame_reader_init(FrameReader *r, OmniDirection dir);
void        frame_reader_free(FrameReader *r);

/* Consumes bytes from buf (len of them); *used tells how many. Stops after
 * one complete frame (FRAME_READY) so the caller handles it before the
 * next; after handling, call frame_reader_next and feed the rest. While a
 * frame is READY (or after BAD) it consumes nothing and returns the same
 * status again. Feeding a stream in any pieces, byte by byte or all at
 * once, gives the same frames and the same errors. FRAME_NOMEM leaves the
 * reader as it was: feeding the same bytes again retries. */
FrameStatus frame_feed(FrameReader *r, const uint8_t *buf, size_t len,
                       size_t *used);
/* Forgets the frame just returned, keeping the buffer. */
void        frame_reader_next(FrameReader *r);

/* Reads from fd (non-blocking) and feeds, until a frame is READY, the
 * reader is BAD, or read(2) reports EAGAIN (FRAME_MORE). *eof is set (with
 * FRAME_MORE) when the peer closed with no partial frame pending; a close
 * inside a frame is FRAME_BAD, r->error "connection closed inside a
 * frame". A read error other than EAGAIN/EINTR is FRAME_BAD with r->error
 * "read failed" and errno kept. Bytes past the READY frame stay in r->in
 * for the next call (see the loop at the top). */
FrameStatus frame_read_fd(FrameReader *r, int fd, bool *eof);
/* Bytes read from the fd and not fed yet. */
size_t      frame_reader_buffered(const FrameReader *r);

typedef struct {
    uint8_t *buf;               // owned
    size_t   cap;
    size_t   head;              // first unsent byte
    size_t   tail;              // end of queued bytes
} FrameWriter;

void   frame_writer_init(FrameWriter *w);
void   frame_writer_free(FrameWriter *w);
/* Queues one frame; the payload is copied. When the frame does not fit,
 * sent bytes are dropped (compaction) if that frees as much as it copies,
 * else the buffer doubles: appends cost O(1) amortized and the buffer
 * stays within a small multiple of the largest backlog. Returns 0,
 * or -1 when memory runs out (ENOMEM) or len does not fit the u32 length
 * field (EMSGSIZE); nothing is queued then. */
int    frame_put(FrameWriter *w, uint8_t type, const void *payload,
                 size_t len);
/* Queues two payload pieces as one frame (a prefix such as a request id,
 * then the body). */
int    frame_put2(FrameWriter *w, uint8_t type, const void *a, size_t alen,
                  const void *b, size_t blen);
size_t frame_writer_pending(const FrameWriter *w);
/* Writes what the socket takes. Returns 0 (maybe with bytes left: wait
 * for EPOLLOUT), or -1 on a write error other than EAGAIN (errno set;
 * EPIPE when the peer has gone). On a socket it sends with MSG_NOSIGNAL,
 * so a client that hung up (cancel) never raises SIGPIPE. */
int    frame_flush(FrameWriter *w, int fd);

#endif

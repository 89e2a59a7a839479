/* stage.c -- the stage process skeleton (stage.h): the channel's stage
 * side, the statistics page's generic part, and the loop.
 *
 * Each turn, each frame and each step writes the heartbeat in the stats
 * page (stage_channel.h): the frontend's only evidence that this loop
 * still runs. A step also publishes its start while it runs (health tells
 * a long step from a stalled loop) and keeps the longest one (what
 * --stage-kill-after must stay above).
 *
 * EOF on ipc_fd means the frontend is gone or wants this stage gone:
 * ops->stop ends every request and stage_main returns 0.
 *
 * The pool (base/pool.h) is attached when the frontend passed one
 * (cfg->pool_fd): a BLOCK in an INPUT is checked against it here, once,
 * so a stage's input callback only ever sees a descriptor it may use. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stage.h"


/* ---- Events out --------------------------------------------------------
 * EVENT frames carry u64 id, then the client frame (header and payload)
 * the frontend passes on unchanged. */

void stage_event(Stage *s, uint64_t id, uint8_t type, const void *p,
                 size_t n)
{
    uint8_t pre[8 + OMNI_FRAME_HDR];

    omni_wr64(pre, id);
    omni_hdr_encode(pre + 8, type, (uint32_t) n);
    if (frame_put2(&s->wr, OMNI_F_STAGE_EVENT, pre, sizeof(pre), p, n) != 0) {
        s->nomem = true;
    }
}

void stage_started(Stage *s, uint64_t id) {
    uint8_t b[8];

    omni_wr64(b, id);
    if (frame_put(&s->wr, OMNI_F_STAGE_STARTED, b, sizeof(b)) != 0) {
        s->nomem = true;
    }
}

void stage_done(Stage *s, uint64_t id, const OmniDone *d) {
    uint8_t b[OMNI_DONE_LEN];

    omni_done_encode(b, d);
    stage_event(s, id, OMNI_F_DONE, b, sizeof(b));
}

void stage_block(Stage *s, uint64_t id, PoolRef r) {
    uint8_t b[STAGE_BLOCK_LEN];

    pool_ref_write(b, r);
    omni_wr32(b + 12, 0);
    stage_event(s, id, OMNI_F_STAGE_BLOCK, b, sizeof(b));
}

void stage_cancelled(Stage *s, uint64_t id) {
    uint8_t b[8];

    omni_wr64(b, id);
    if (frame_put(&s->wr, OMNI_F_STAGE_CANCELLED, b, sizeof(b)) != 0) {
        s->nomem = true;
    }
}

void stage_error(Stage *s, uint64_t id, int status, const char *type,
                 const char *param, const char *code, const char *msg)
{
    uint8_t   b[OMNI_MAX_ERROR];
    OmniError e;

    omni_error_set(&e, status, type, param, code, msg);
    stage_event(s, id, OMNI_F_ERROR, b, omni_error_encode(b, &e));
}


/* ---- Liveness (stage_channel.h) ---------------------------------------- */

static void beat(Stage *s) {
    if (s->stats == NULL) return;
    atomic_store_explicit(&s->stats->heartbeat_us, stage_clock_us(),
                          memory_order_relaxed);
}

/* One ops->step between two beats, its start published while it runs. */
static void step(Stage *s) {
    OmniStats *st = s->stats;
    int64_t    t0 = stage_clock_us(), t1;

    if (st != NULL) {
        atomic_store_explicit(&st->heartbeat_us, t0, memory_order_relaxed);
        atomic_store_explicit(&st->step_start_us, t0, memory_order_relaxed);
    }
    s->ops->step(s);
    if (st == NULL) return;
    t1 = stage_clock_us();
    atomic_store_explicit(&st->step_start_us, 0, memory_order_relaxed);
    atomic_store_explicit(&st->heartbeat_us, t1, memory_order_relaxed);
    if (t1 - t0 > atomic_load_explicit(&st->step_max_us,
                                       memory_order_relaxed))
    {
        atomic_store_explicit(&st->step_max_us, t1 - t0,
                              memory_order_relaxed);
    }
}

/* Maps the frontend's stats page (stats_fd < 0: none). The frontend sized
 * it; a new stage resets the generic gauges and keeps the counters (its
 * own part's gauges are its start's to reset). */
static int map_stats(Stage *s, int stats_fd, Err *err) {
    struct stat st;
    OmniStats  *p;

    if (stats_fd < 0) return 0;
    if (fstat(stats_fd, &st) != 0) {
        return err_set(err, "stats fd %d: %s", stats_fd, strerror(errno));
    }
    if ((size_t) st.st_size < sizeof(OmniStats)) {
        return err_set(err, "stats fd %d: %lld bytes, an OmniStats needs "
                       "%zu", stats_fd, (long long) st.st_size,
                       sizeof(OmniStats));
    }
    p = mmap(NULL, sizeof(OmniStats), PROT_READ | PROT_WRITE, MAP_SHARED,
             stats_fd, 0);
    if (p == MAP_FAILED) {
        return err_set(err, "stats fd %d: mmap: %s", stats_fd,
                       strerror(errno));
    }
    s->stats = p;
    if (p->magic != STATS_MAGIC) {
        return err_set(err, "stats fd %d: bad magic %#llx", stats_fd,
                       (unsigned long long) p->magic);
    }
    atomic_store(&p->requests_running, 0);
    atomic_store(&p->requests_waiting, 0);
    atomic_store(&p->heartbeat_us, 0);
    atomic_store(&p->step_start_us, 0);
    atomic_store(&p->step_max_us, 0);
    atomic_store(&p->stage_pid, (int64_t) getpid());
    return 0;
}

/* buf fits the worst case: 255 bytes of id, 6 each when escaped, and 255
 * of more. */
int stage_ready(Stage *s, const char *id, const char *more, Err *err) {
    char   buf[2 * 256 * 3 + 256];
    size_t n = 0;

    n += (size_t) snprintf(buf, sizeof(buf), "{\"id\":\"");
    for (const char *p = id; *p != '\0' && p - id < 256; p++) {
        unsigned char ch = (unsigned char) *p;

        if (ch == '"' || ch == '\\') {
            buf[n++] = '\\';
            buf[n++] = (char) ch;
        } else if (ch < 0x20) {
            n += (size_t) snprintf(buf + n, sizeof(buf) - n, "\\u%04x", ch);
        } else {
            buf[n++] = (char) ch;
        }
    }
    n += (size_t) snprintf(buf + n, sizeof(buf) - n, "\"%.255s}", more);
    beat(s);
    if (frame_put(&s->wr, OMNI_F_STAGE_READY, buf, n) != 0) {
        return err_set(err, "out of memory");
    }
    return 0;
}


/* ---- Requests in ------------------------------------------------------- */

/* An INPUT's inner frame (p, n bytes after the request id): a header
 * whose length matches, of a type a stage takes (TEXT, DONE, BLOCK); a
 * BLOCK must name a held block of the pool this stage attached. The
 * frontend only passes on what a stage sent and it checked, so anything
 * else here is a bug there: a protocol error. */
static int input(Stage *s, uint64_t id, const uint8_t *p, size_t n,
                 Err *err)
{
    OmniFrameHdr h;
    PoolRef      r;
    Err          perr;

    if (s->ops->input == NULL) {
        return err_set(err, "frontend sent INPUT to the %s stage, which "
                       "takes none", s->ops->name);
    }
    if (n < OMNI_FRAME_HDR) {
        return err_set(err, "frontend sent an INPUT of %zu bytes, without "
                       "an inner frame", n);
    }
    omni_hdr_decode(&h, p);
    if (h.len != n - OMNI_FRAME_HDR) {
        return err_set(err, "frontend sent an INPUT whose inner frame says "
                       "%u bytes and holds %zu", h.len, n - OMNI_FRAME_HDR);
    }
    p += OMNI_FRAME_HDR;
    switch (h.type) {
    case OMNI_F_TEXT:
        if (h.len == 0 || h.len > OMNI_MAX_TEXT) {
            return err_set(err, "frontend sent an INPUT TEXT of %u bytes",
                           h.len);
        }
        break;
    case OMNI_F_DONE:
        if (h.len != OMNI_DONE_LEN) {
            return err_set(err, "frontend sent an INPUT DONE of %u bytes",
                           h.len);
        }
        break;
    case OMNI_F_STAGE_BLOCK:
        if (!s->has_pool) {
            return err_set(err, "frontend sent an INPUT BLOCK, but gave "
                           "this stage no pool");
        }
        r = pool_ref_read(p);
        if (h.len != STAGE_BLOCK_LEN || omni_rd32(p + 12) != 0) {
            return err_set(err, "frontend sent an INPUT BLOCK of %u bytes "
                           "(flags %#x)", h.len,
                           h.len == STAGE_BLOCK_LEN ? omni_rd32(p + 12) : 0);
        }
        if (pool_check(&s->pool, r, &perr) != 0) {
            return err_set(err, "frontend sent a bad INPUT BLOCK: %s",
                           perr.msg);
        }
        break;
    default:
        return err_set(err, "frontend sent an INPUT of inner type %u",
                       h.type);
    }
    s->ops->input(s, id, h.type, p, h.len);
    return 0;
}

/* Handles every whole frame that can be read now. Returns 1 at EOF, 0
 * when more may come, -1 with err set when the frontend broke the
 * protocol. */
static int read_frames(Stage *s, Err *err) {
    FrameStatus st;
    bool        eof;

    while ((st = frame_read_fd(&s->rd, s->fd, &eof)) == FRAME_READY) {
        const uint8_t *p = s->rd.payload;
        uint32_t       len = s->rd.hdr.len;

        if (len < 8) {
            return err_set(err, "frontend sent a stage frame of %u bytes, "
                           "without a request id", len);
        }
        switch (s->rd.hdr.type) {
        case OMNI_F_STAGE_SUBMIT:
            s->ops->submit(s, omni_rd64(p), (const char *) p + 8, len - 8);
            break;
        case OMNI_F_STAGE_CANCEL:
            s->ops->cancel(s, omni_rd64(p));
            break;
        case OMNI_F_STAGE_INPUT:
            if (input(s, omni_rd64(p), p + 8, len - 8, err) != 0) return -1;
            break;
        case OMNI_F_STAGE_PAUSE:
        case OMNI_F_STAGE_RESUME:
            if (s->ops->pause != NULL) {
                s->ops->pause(s, omni_rd64(p),
                              s->rd.hdr.type == OMNI_F_STAGE_PAUSE);
            }
            break;
        default:
            return err_set(err, "frontend sent stage frame type %u, which "
                           "a stage does not take", s->rd.hdr.type);
        }
        frame_reader_next(&s->rd);
        beat(s);
    }
    if (st == FRAME_BAD) {
        return err_set(err, "frontend channel: %s", s->rd.error);
    }
    if (st == FRAME_NOMEM) {
        return err_set(err, "out of memory reading a frame");
    }
    return eof ? 1 : 0;
}


/* ---- The loop ---------------------------------------------------------- */

/* Serves until EOF (returns 0) or a fatal channel error (-1, err set). */
static int serve(Stage *s, Err *err) {
    for (;;) {
        size_t        pending = frame_writer_pending(&s->wr);
        bool          backlog = pending > STAGE_WRITE_HIGH;
        bool          waking = s->wake_fd >= 0 && s->ops->wake != NULL;
        struct pollfd p[2] = { { s->fd, POLLIN, 0 },
                               { s->wake_fd, POLLIN, 0 } };
        int           rc;

        if (pending > 0) p[0].events |= POLLOUT;
        rc = poll(p, waking ? 2 : 1,
                  s->ops->idle(s) || backlog ? STAGE_BEAT_MS : 0);
        if (rc < 0 && errno != EINTR) {
            return err_set(err, "poll: %s", strerror(errno));
        }
        beat(s);
        if (rc > 0 && waking && (p[1].revents & POLLIN)) s->ops->wake(s);
        if (rc > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            rc = read_frames(s, err);
            if (rc != 0) return rc > 0 ? 0 : -1;
        }
        if (!backlog && !s->ops->idle(s)) step(s);
        if (s->ops->tick != NULL) s->ops->tick(s);
        if (s->nomem) return err_set(err, "out of memory queueing output");
        if (frame_flush(&s->wr, s->fd) != 0) {
            if (errno == EPIPE || errno == ECONNRESET) return 0;
            return err_set(err, "writing to the frontend: %s",
                           strerror(errno));
        }
    }
}

/* The frontend's pool, when it passed one (cfg->pool_fd > 0), and this
 * stage's owner tag for the blocks it allocates. pool_attach's errors
 * name the fd. */
static int attach_pool(Stage *s, const ServeConfig *cfg, Err *err) {
    s->owner = cfg->stage_owner;
    if (cfg->pool_fd <= 0) return 0;
    if (pool_attach(&s->pool, cfg->pool_fd, err) != 0) return -1;
    s->has_pool = true;
    return 0;
}

int stage_main(const StageOps *ops, const ServeConfig *cfg, int ipc_fd,
               int stats_fd, Err *err)
{
    Stage s;
    int   rc = -1, fl;

    memset(&s, 0, sizeof(s));
    s.ops = ops;
    s.fd = ipc_fd;
    s.wake_fd = -1;
    frame_reader_init(&s.rd, OMNI_DIR_STAGE);
    frame_writer_init(&s.wr);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    fl = fcntl(ipc_fd, F_GETFL);
    if (fl < 0 || fcntl(ipc_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        err_set(err, "ipc fd %d: %s", ipc_fd, strerror(errno));
    } else if (map_stats(&s, stats_fd, err) == 0
               && attach_pool(&s, cfg, err) == 0)
    {
        rc = ops->start(&s, cfg, err);
        if (rc == 0) rc = serve(&s, err);
    }
    ops->stop(&s);
    frame_flush(&s.wr, s.fd);
    if (s.has_pool) pool_detach(&s.pool);
    if (s.stats != NULL) munmap(s.stats, sizeof(OmniStats));
    frame_reader_free(&s.rd);
    frame_writer_free(&s.wr);
    return rc;
}

/* audio_in.c -- a request's audio input on its way through the frontend:
 * the client's AUDIO_IN frames copied into pool blocks for the listener,
 * the pool's backpressure on the client, the transcripts of a chat
 * request kept until the listener is done, and the request JSON the
 * thinker then gets (the client's, with "audio_in_text" added).
 *
 * Why blocks and not the bytes on the channel: the channel carries
 * descriptors only (DESIGN.md), and the pool bounds what an upload can
 * hold in flight. The listener copies a block's bytes out and lets go of
 * it at once, so an upload holds a few blocks at a time, not its size.
 * When the pool is full the connection stops reading (the client's writes
 * then block, nginx's upstream waits) and tries again every
 * AUDIO_RETRY_MS: a freed block raises no event here (pool_wait blocks,
 * which the loop must not), and a short poll while stalled is cheap. */

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "frontend_impl.h"

#define AUDIO_RETRY_MS  2


/* ---- Upload ------------------------------------------------------------- */

static void stall(Frontend *fe, Conn *c, bool on) {
    if (c->audio_stalled == on) return;
    c->audio_stalled = on;
    fe->n_audio_stalled += on ? 1 : -1;
}

/* An INPUT for the listener (hop 0): an inner frame of type, body. */
static int to_listener(Frontend *fe, Conn *c, uint8_t type,
                       const uint8_t *body, uint32_t len)
{
    Stage  *s = c->route.hop[0];
    uint8_t pre[8 + OMNI_FRAME_HDR];

    if (s->sp.fd < 0) return -1;
    omni_wr64(pre, c->id);
    omni_hdr_encode(pre + 8, type, len);
    if (frame_put2(&s->wr, OMNI_F_STAGE_INPUT, pre, sizeof(pre), body,
                   len) != 0)
        return -1;
    stages_flush(fe, s);
    return 0;
}

/* Copies what is left of the current AUDIO_IN frame into blocks, one
 * INPUT BLOCK each. Returns 1 when the frame is all sent, 0 when the pool
 * is full (c stalls; audio_off says where to go on), -1 when the listener
 * cannot take it (out of memory, or its process is gone: the route's
 * failure reaches the client on its own). */
static int frame_to_pool(Frontend *fe, Conn *c) {
    const uint8_t *p = c->rd.payload;
    uint32_t       n = c->rd.hdr.len;

    while (c->audio_off < n) {
        uint32_t k = n - c->audio_off;
        uint8_t  d[STAGE_BLOCK_LEN] = { 0 };
        int      b;

        if (k > fe->pool.block_size) k = fe->pool.block_size;
        if ((b = pool_alloc(&fe->pool, 0, c->id)) < 0) return 0;
        memcpy(pool_block(&fe->pool, (uint32_t) b), p + c->audio_off, k);
        pool_ref_write(d, (PoolRef) { (uint32_t) b, 0, k });
        if (to_listener(fe, c, OMNI_F_STAGE_BLOCK, d, sizeof(d)) != 0) {
            pool_unref(&fe->pool, (uint32_t) b);
            return -1;
        }
        c->audio_off += k;
    }
    return 1;
}

/* A protocol error or a failure while c uploads: its route is cancelled
 * and it gets the error. */
static void upload_error(Frontend *fe, Conn *c, int status,
                         const char *code, const char *msg)
{
    stall(fe, c, false);
    c->audio_left = 0;
    route_cancel(fe, c, 0);
    conn_error(fe, c, status, NULL, code, msg);
}

/* The current frame (READY in c->rd) is an AUDIO_IN: into the pool. */
static bool take_frame(Frontend *fe, Conn *c) {
    int rc;

    if (c->rd.hdr.type != OMNI_F_AUDIO_IN) {
        upload_error(fe, c, 400, NULL, "expected an AUDIO_IN frame: the "
                     "request's audio_in bytes are not all sent");
        return false;
    }
    if (c->rd.hdr.len > c->audio_left) {
        upload_error(fe, c, 400, NULL, "more AUDIO_IN bytes than audio_in "
                     "declares");
        return false;
    }
    rc = frame_to_pool(fe, c);
    if (rc == 0) {
        stall(fe, c, true);
        frontend_ep_set(fe, c->fd, &c->events,
                        frame_writer_pending(&c->wr) > 0 ? EPOLLOUT : 0, c);
        return false;
    }
    if (rc < 0) {
        upload_error(fe, c, 503, "out_of_memory", "the listener stage "
                     "could not take the audio");
        return false;
    }
    c->audio_left -= c->rd.hdr.len;
    c->audio_off = 0;
    frame_reader_next(&c->rd);
    if (c->audio_left == 0) {
        uint8_t done[OMNI_DONE_LEN] = { 0 };

        if (to_listener(fe, c, OMNI_F_DONE, done, sizeof(done)) != 0) {
            upload_error(fe, c, 503, "out_of_memory", "the listener stage "
                         "could not take the end of the audio");
            return false;
        }
    }
    return true;
}

void audio_in_read(Frontend *fe, Conn *c) {
    FrameStatus st;
    bool        eof = false;

    if (c->audio_stalled) return;
    while (c->fd >= 0 && c->audio_left > 0) {
        st = frame_read_fd(&c->rd, c->fd, &eof);
        if (st == FRAME_READY) {
            if (!take_frame(fe, c)) return;
            continue;
        }
        if (st == FRAME_MORE) {
            if (eof) conn_gone(fe, c);
            return;
        }
        log_msg(LOG_INFO, "request %" PRIu64 ": bad audio upload: %s",
                c->id, st == FRAME_BAD ? c->rd.error : "out of memory");
        upload_error(fe, c, st == FRAME_BAD ? 400 : 503,
                     st == FRAME_BAD ? NULL : "out_of_memory",
                     st == FRAME_BAD ? c->rd.error
                                     : "out of memory reading the audio");
        return;
    }
    /* all in: anything more the client sends is a protocol error, which
       conn_read finds */
    if (c->fd >= 0 && frame_reader_buffered(&c->rd) > 0) {
        upload_error(fe, c, 400, NULL, "more AUDIO_IN bytes than audio_in "
                     "declares");
    }
}

/* Stalled uploads go on where they stopped, once blocks are free. */
void audio_in_retry(Frontend *fe) {
    if (fe->n_audio_stalled == 0) return;
    for (Conn *c = fe->conns; c != NULL; c = c->next) {
        int rc;

        if (!c->audio_stalled || c->fd < 0) continue;
        rc = frame_to_pool(fe, c);
        if (rc == 0) continue;
        stall(fe, c, false);
        if (rc < 0) {
            upload_error(fe, c, 503, "out_of_memory", "the listener stage "
                         "could not take the audio");
            continue;
        }
        frontend_ep_set(fe, c->fd, &c->events, EPOLLIN
                        | (frame_writer_pending(&c->wr) > 0 ? EPOLLOUT : 0),
                        c);
        c->audio_off = c->rd.hdr.len;   // the frame is in; take_frame ends
        take_frame(fe, c);              //   it (frame_to_pool is a no-op)
        if (c->fd >= 0 && !c->audio_stalled) audio_in_read(fe, c);
    }
}

double audio_in_deadline(const Frontend *fe) {
    return fe->n_audio_stalled > 0 ? clock_now_s() + AUDIO_RETRY_MS / 1e3
                                   : INFINITY;
}


/* ---- Transcripts -------------------------------------------------------- */

int audio_in_start(Frontend *fe, Conn *c, const OmniRequest *r,
                   const char *json, size_t len)
{
    c->audio_left = r->audio_in_bytes;
    c->audio_off = 0;
    if (r->transcribe || r->n_audio_in == 0) return 0;
    c->heard = calloc((size_t) r->n_audio_in, sizeof(TextBuf));
    c->json = malloc(len);
    if (c->heard == NULL || c->json == NULL) return -1;
    c->n_heard = r->n_audio_in;
    for (int k = 0; k < c->n_heard; k++) tb_init(&c->heard[k]);
    memcpy(c->json, json, len);
    c->json_len = len;
    return 0;
}

/* A TRANSCRIPT of a chat request: its text joins its input's, a space
 * between segments. Returns 0, or -1 for a TRANSCRIPT that is not the
 * protocol's (a bug in the listener) or out of memory. */
int audio_in_heard(Conn *c, const uint8_t *body, uint32_t len) {
    char        err[64], *copy = malloc(len + 1);
    const char *ip[] = { "input", NULL }, *tp[] = { "text", NULL };
    yajl_val    v, in, text;
    int         rc = -1;

    if (copy == NULL) return -1;
    memcpy(copy, body, len);
    copy[len] = '\0';
    v = yajl_tree_parse(copy, err, sizeof(err));
    free(copy);
    if (v == NULL) return -1;
    in = yajl_tree_get(v, ip, yajl_t_number);
    text = yajl_tree_get(v, tp, yajl_t_string);
    if (in != NULL && text != NULL && YAJL_IS_INTEGER(in)
        && YAJL_GET_INTEGER(in) >= 0 && YAJL_GET_INTEGER(in) < c->n_heard)
    {
        TextBuf *b = &c->heard[YAJL_GET_INTEGER(in)];

        tb_printf(b, "%s%s", b->len > 0 ? " " : "", YAJL_GET_STRING(text));
        rc = b->oom ? -1 : 0;
    }
    yajl_tree_free(v);
    return rc;
}

/* The client's JSON with "audio_in_text" added before its closing brace,
 * malloc'd (the caller frees it), *len its length; NULL when out of
 * memory or the JSON has no closing brace (it parsed, so it has). */
char *audio_in_json(const Conn *c, size_t *len) {
    static const char member[] = ",\"audio_in_text\":[";
    size_t            end = c->json_len, at = 0, cap;
    char             *out = NULL;

    while (end > 0 && c->json[end - 1] != '}') end--;
    if (end == 0) return NULL;
    end--;
    for (int pass = 0; pass < 2; pass++) {
        cap = pass == 0 ? 0 : at;
        at = end;
        json_put(out, cap, &at, member, sizeof(member) - 1);
        for (int k = 0; k < c->n_heard; k++) {
            const TextBuf *b = &c->heard[k];

            json_put(out, cap, &at, k > 0 ? ",\"" : "\"", k > 0 ? 2 : 1);
            json_put_escaped(out, cap, &at, b->p != NULL ? b->p : "",
                             b->len);
            json_put(out, cap, &at, "\"", 1);
        }
        json_put(out, cap, &at, "]}", 2);
        if (pass == 0 && (out = malloc(at)) == NULL) return NULL;
    }
    memcpy(out, c->json, end);
    *len = at;
    return out;
}

void audio_in_free(Frontend *fe, Conn *c) {
    stall(fe, c, false);
    for (int k = 0; k < c->n_heard; k++) tb_free(&c->heard[k]);
    free(c->heard);
    free(c->json);
    c->heard = NULL;
    c->json = NULL;
    c->n_heard = 0;
    c->audio_left = 0;
}

/* client.c -- see client.h. One connection per call: connect, send one
 * frame, read frames until the engine's last one. The reader checks every
 * frame the engine sends (direction OMNI_DIR_TO_CLIENT), so this is also a
 * conformance check of the engine's side of the protocol. */

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <yajl/yajl_gen.h>

#include "client.h"
#include "frame.h"

static int connect_to(const char *path, Err *err) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    int                fd;

    if (strlen(path) >= sizeof(a.sun_path)) {
        return err_set(err, "%s: socket path too long", path);
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_set(err, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *) &a, sizeof(a)) != 0) {
        err_set(err, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Connects and sends one frame. Returns the socket, or -1 with err set. */
static int send_frame(const char *path, uint8_t type, const void *payload,
                      size_t len, Err *err)
{
    FrameWriter w;
    int         fd = connect_to(path, err), rc;

    if (fd < 0) return -1;
    frame_writer_init(&w);
    rc = frame_put(&w, type, payload, len);
    if (rc == 0) rc = frame_flush(&w, fd);
    frame_writer_free(&w);
    if (rc != 0) {
        err_set(err, "%s: sending: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Blocks until the next whole frame. Returns 0 with r->hdr and
 * r->payload set, or -1 with err set. */
static int next_frame(FrameReader *r, int fd, Err *err) {
    bool        eof;
    FrameStatus st;

    frame_reader_next(r);
    st = frame_read_fd(r, fd, &eof);
    if (st == FRAME_READY) return 0;
    if (st == FRAME_NOMEM) return err_set(err, "out of memory");
    if (st == FRAME_BAD) return err_set(err, "the engine sent an invalid "
                                        "frame: %s", r->error);
    return err_set(err, "the engine closed the connection before the end");
}

#define KEY(g, s) yajl_gen_string(g, (const unsigned char *) (s), strlen(s))

static void gen_sampling(yajl_gen g, const ClientRequest *rq) {
    if (rq->max_tokens >= 0) {
        KEY(g, "max_tokens");
        yajl_gen_integer(g, rq->max_tokens);
    }
    if (!isnan(rq->temperature)) {
        KEY(g, "temperature");
        yajl_gen_double(g, rq->temperature);
    }
    if (!isnan(rq->top_p)) {
        KEY(g, "top_p");
        yajl_gen_double(g, rq->top_p);
    }
    if (rq->top_k >= 0) {
        KEY(g, "top_k");
        yajl_gen_integer(g, rq->top_k);
    }
    if (rq->seed >= 0) {
        KEY(g, "seed");
        yajl_gen_integer(g, rq->seed);
    }
    if (rq->n_stop > 0) {
        KEY(g, "stop");
        yajl_gen_array_open(g);
        for (int i = 0; i < rq->n_stop; i++) KEY(g, rq->stop[i]);
        yajl_gen_array_close(g);
    }
}

/* The request JSON of request.h. Returns the generator holding it (the
 * caller frees it), or NULL when memory runs out. */
static yajl_gen gen_request(const ClientRequest *rq) {
    yajl_gen g = yajl_gen_alloc(NULL);

    if (g == NULL) return NULL;
    yajl_gen_map_open(g);
    if (rq->model != NULL) {
        KEY(g, "model");
        KEY(g, rq->model);
    }
    if (rq->chat) {
        KEY(g, "messages");
        yajl_gen_array_open(g);
        yajl_gen_map_open(g);
        KEY(g, "role");
        KEY(g, "user");
        KEY(g, "content");
        KEY(g, rq->prompt);
        yajl_gen_map_close(g);
        yajl_gen_array_close(g);
    } else {
        KEY(g, "prompt");
        KEY(g, rq->prompt);
    }
    gen_sampling(g, rq);
    yajl_gen_map_close(g);
    return g;
}

static int error_event(const FrameReader *r, Err *err) {
    OmniError e;

    if (omni_error_decode(&e, r->payload, r->hdr.len) != 0) {
        return err_set(err, "the engine sent a malformed ERROR event");
    }
    return err_set(err, "%u %.*s: %.*s", e.status, (int) e.type_len, e.type,
                   (int) e.message_len, e.message);
}

int client_generate(const ClientRequest *rq, FILE *out, OmniDone *done,
                    Err *err)
{
    yajl_gen             g = gen_request(rq);
    const unsigned char *json;
    size_t               len;
    FrameReader          r;
    int                  fd, rc = -1;

    if (g == NULL || yajl_gen_get_buf(g, &json, &len) != yajl_gen_status_ok)
    {
        if (g != NULL) yajl_gen_free(g);
        return err_set(err, "building the request JSON failed");
    }
    fd = send_frame(rq->socket_path, OMNI_F_REQUEST, json, len, err);
    yajl_gen_free(g);
    if (fd < 0) return -1;
    frame_reader_init(&r, OMNI_DIR_TO_CLIENT);
    while (next_frame(&r, fd, err) == 0) {
        if (r.hdr.type == OMNI_F_TEXT) {
            fwrite(r.payload, 1, r.hdr.len, out);
            fflush(out);
        } else if (r.hdr.type == OMNI_F_REASONING) {
            continue;                   // the answer only
        } else if (r.hdr.type == OMNI_F_DONE) {
            rc = omni_done_decode(done, r.payload) == 0 ? 0
                 : err_set(err, "the engine sent a malformed DONE event");
            break;
        } else if (r.hdr.type == OMNI_F_ERROR) {
            error_event(&r, err);
            break;
        } else {
            err_set(err, "the engine sent frame type %u to a request",
                    r.hdr.type);
            break;
        }
    }
    frame_reader_free(&r);
    close(fd);
    return rc;
}

int client_control(const char *socket_path, uint8_t type, FILE *out,
                   Err *err)
{
    uint8_t     want = type == OMNI_F_HEALTH ? OMNI_F_HEALTH_R
                       : type == OMNI_F_MODELS ? OMNI_F_MODELS_R
                       : OMNI_F_METRICS_R;
    FrameReader r;
    int         fd = send_frame(socket_path, type, NULL, 0, err), rc = -1;

    if (fd < 0) return -1;
    frame_reader_init(&r, OMNI_DIR_TO_CLIENT);
    if (next_frame(&r, fd, err) != 0) {
        /* err says why */
    } else if (r.hdr.type == OMNI_F_ERROR) {
        error_event(&r, err);
    } else if (r.hdr.type != want) {
        err_set(err, "the engine answered with frame type %u", r.hdr.type);
    } else if (want == OMNI_F_HEALTH_R && r.hdr.len < 2) {
        err_set(err, "the engine sent a short HEALTH_R");
    } else if (want == OMNI_F_HEALTH_R) {
        rc = omni_rd16(r.payload);
        fprintf(out, "%d %.*s\n", rc, (int) r.hdr.len - 2, r.payload + 2);
    } else {
        fwrite(r.payload, 1, r.hdr.len, out);
        if (want == OMNI_F_MODELS_R) fputc('\n', out);
        rc = 200;
    }
    fflush(out);
    frame_reader_free(&r);
    close(fd);
    return rc;
}

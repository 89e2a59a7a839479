/* loadgen.h -- what the load generator's two files share.
 *
 * loadgen.c is the program: options, the event loop that keeps C requests
 * in flight, the statistics and the JSON report. loadgen_proto.c is what
 * one connection speaks: the request bytes, omni-engine's frames, and
 * HTTP/1.1 with Server-Sent Events, each a parser that takes whatever a
 * read returned and keeps its place in Conn. The split follows that seam:
 * the parsers see a connection and the stats, never the loop or epoll.
 * Private to bench/; see loadgen.c for the tool itself. */

#ifndef LOADGEN_H
#define LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define LG_MAX_EVENT   (4u << 20)   // bytes of one SSE event, one HTTP
                                    //   header block or one frame
#define LG_MAX_ERRMSG  4            // distinct error messages kept

typedef struct {
    char   *p;          // (cap,) owned
    size_t  len;
    size_t  cap;
} Buf;

// --- configuration and results ---------------------------------------------

typedef struct {
    const char *omni;           // socket path, or NULL
    const char *http;           // "host:port", or NULL
    const char *path;           // HTTP request path
    const char *model;          // "model" in the body, or NULL
    const char *api_key;        // Authorization: Bearer, or NULL
    const char *prompts_file;
    const char *json_out;       // NULL: stdout
    int         concurrency;
    int         requests;
    int         max_tokens;
    int         warmup;
    double      timeout;        // seconds per request
    double      duration;       // seconds; 0: run N requests
    bool        ignore_eos;
    bool        expect_done;    // SSE must end with [DONE]
    const char *audio_voice;    // --audio VOICE: ask for speech, or NULL
    const char *audio_format;   // --audio-format (default pcm)
    const char *extra;          // --extra: raw JSON members added to the
                                //   body ("k":v,...), or NULL

    char      **prompts;        // (n_prompts,) owned
    int         n_prompts;
    struct sockaddr_storage addr;   // resolved target
    socklen_t   addr_len;
    char        host[256];
} Config;

typedef struct {
    bool    ok;
    double  ttft;               // seconds; first text event - start
    double  e2e;                // seconds; end - start
    int64_t tokens;             // generated tokens
    int64_t prompt_tokens;      // -1: not reported
    int64_t cached_tokens;      // -1: not reported
    double  ttfa;               // seconds; first audio byte - start, NAN
    int64_t audio_bytes;        // audio received (decoded from base64)
} Result;

typedef struct {
    Result *res;                // (requests,) owned
    double *itl;                // (itl_cap,) owned, seconds
    size_t  n_itl;
    size_t  itl_cap;
    int     n_errors;
    char    errmsg[LG_MAX_ERRMSG][256];
    int     errcount[LG_MAX_ERRMSG];
    int     n_errmsg;
    bool    recording;          // false during warm-up
} Stats;

// --- one connection --------------------------------------------------------

typedef enum {
    H_HEADERS,          // status line and headers
    H_BODY,             // Content-Length or close-delimited body
    H_CHUNK_SIZE,       // chunk-size line
    H_CHUNK_DATA,
    H_CHUNK_CRLF,       // the CRLF after a chunk's data
    H_TRAILER,          // after the last chunk, up to the empty line
    H_END,
} HttpState;

typedef struct {
    int       fd;               // -1: the slot is free
    int       req;              // request index; -1: warm-up
    bool      connecting;
    Buf       out;              // request bytes, owned
    size_t    out_off;          // bytes of out written
    Buf       in;               // bytes read and not yet consumed, owned

    HttpState hstate;
    int       status;           // HTTP status
    bool      chunked;
    int64_t   remaining;        // Content-Length or chunk bytes left;
                                //   -1: until EOF
    Buf       line;             // SSE line being assembled, owned
    Buf       data;             // SSE event data being assembled, owned
    bool      have_data;
    bool      event_error;      // the event came in an "error" field
    bool      saw_done;         // "data: [DONE]" seen
    bool      expect_done;      // --expect-done

    bool      finished;         // DONE frame, or a complete HTTP body
    bool      failed;
    char      err[256];         // why it failed
    double    t_start;
    double    t_first;          // 0: no text yet
    double    t_audio;          // 0: no audio yet
    int64_t   audio_bytes;
    bool      raw_body;         // 200 with an audio body (not SSE)
    double    t_last;
    int64_t   n_text;           // text events
    int64_t   tokens;           // reported completion tokens, -1: none
    int64_t   prompt_tokens;
    int64_t   cached_tokens;
} Conn;

// --- helpers (loadgen.c) -----------------------------------------------------

/* Prints "loadgen: " and the message to stderr and exits 1. For startup
 * faults and out of memory only; a request's fault goes to conn_fail. */
_Noreturn void die(const char *fmt, ...);

/* Seconds on the monotonic clock. Can't fail. */
double now_s(void);

/* Buf: a byte buffer that grows by doubling up to LG_MAX_EVENT. reserve
 * and append return 0, or -1 (and change nothing) past the cap; they exit
 * on out of memory. consume drops the first n bytes. json_str appends s as
 * a JSON string literal; printf appends formatted text and exits past the
 * cap. */
int buf_reserve(Buf *b, size_t n);
int buf_append(Buf *b, const void *s, size_t n);
void buf_consume(Buf *b, size_t n);
void buf_json_str(Buf *b, const char *s);
void buf_printf(Buf *b, const char *fmt, ...);

// --- one connection's protocol (loadgen_proto.c) ----------------------------

/* Marks the request in c as failed with the message; the first message
 * wins, later calls do nothing. Can't fail. */
void conn_fail(Conn *c, const char *fmt, ...);

/* Fills c->out with the request for prompt p: an omni REQUEST frame or an
 * HTTP POST, as cf says. Exits when the prompt exceeds LG_MAX_EVENT. */
void request_build(Conn *c, const Config *cf, const char *p);

/* Handle the bytes in c->in, recording text events in st at time t, and
 * consume what they parsed. Return 0 when more bytes are wanted, or -1
 * when the request is over: c->finished, or c->failed with c->err.
 * http_parse's eof says no more bytes will come. */
int omni_parse(Conn *c, Stats *st, double t);
int http_parse(Conn *c, Stats *st, double t, bool eof);

#endif

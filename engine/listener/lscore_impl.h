/* lscore_impl.h -- the listener core's structs, shared by its two halves:
 * lscore.c (requests, the queue, workers, outbox: who runs what, when)
 * and lswork.c (one request's audio path on a worker: decode, recognise,
 * segments). Nothing outside engine/listener includes it. */

#ifndef OMNI_LSCORE_IMPL_H
#define OMNI_LSCORE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "lscore.h"

typedef enum {
    LS_RECEIVING = 0,   // bytes still coming (ls_audio)
    LS_QUEUED,          // all in; in the run queue
    LS_RUNNING,         // a worker has it; only that worker touches the
                        //   recognition fields below
    LS_ENDED,           // its end is in the outbox, for ls_next
} LsState;

typedef struct {
    AudioInFormat   format;
    uint64_t        bytes;
    char            param[64];      // OpenAI's parameter, "" for none
} LsInput;

typedef struct LsReq LsReq;

struct LsReq {
    LsCore         *core;           // borrowed
    uint64_t        id;
    LsReq          *next;           // the held list (all requests)
    LsReq          *qnext;          // the run queue
    /* scheduling, under core->mu */
    LsState         state;
    LsOutKind       end;            // when ENDED: DONE, ERROR, CANCELLED
    int             status;         // LS_OUT_ERROR's
    char            param[64];
    const char     *code;           //   (static, or NULL)
    Err             fail;           // its message
    /* set by the loop, read by the worker */
    atomic_bool     stop;           // cancelled or stopping
    /* the audio: filled by the loop while RECEIVING, read by the worker */
    LsInput        *in;             // (n_in,) owned
    int             n_in;
    uint8_t        *buf;            // (total,) owned: the inputs, in order
    uint64_t        total, got;
    double          max_seconds;    // the request's max_audio_seconds
    bool            words;          // word timings wanted
    /* the worker's: what it decoded, and why it failed the request */
    uint64_t        samples;        // decoded so far, every input, 16 kHz
    int             cur;            // the input being recognised
    int             w_status;       // 400 (the client's audio), 500, 503
    char            w_param[64];
    const char     *w_code;         //   (static, or NULL)
    Err             w_err;
};

/* An outbox entry: a request's STARTED or segment, or its end (DONE,
 * ERROR, CANCELLED), which comes after its other entries and frees it. */
typedef struct {
    LsReq          *r;              // borrowed: a request is freed only
                                    //   when its end is taken
    LsOutKind       kind;
    char           *json;           // owned (SEGMENT)
    size_t          len;
} LsEntry;

typedef struct {
    LsCore         *core;
    pthread_t       th;
    Asr            *asr;            // owned
    int16_t         pcm[LS_PIECE];  // one decoded piece
    char           *seg;            // (OMNI_MAX_TEXT,) a segment's JSON,
                                    //   owned
} LsWorker;

struct LsCore {
    LsConfig        cfg;
    LsWorker       *workers;        // (cfg.slots,), owned
    int             n_started;      // workers running
    pthread_mutex_t mu;             // guards everything below
    pthread_cond_t  cv;             // the run queue grew, or quit
    pthread_cond_t  room;           // the outbox has room, or a stop
    bool            quit;
    LsReq          *held;           // every request not yet reported ended
    int             n_held;
    uint64_t        bytes_held;     // sum of their totals
    LsReq          *runq, *runq_tail;   // FIFO
    LsEntry        *box;            // (box_cap,) ring: the outbox, owned;
    int             box_cap;        //   LS_BOX for STARTEDs and segments
    int             box_head, box_n;//   (box_data of them) plus one end
    int             box_data;       //   per request held

    int             busy;           // workers on a request now
    int             efd;            // eventfd: something for the loop
    char           *last_json;      // the last SEGMENT ls_next returned,
                                    //   owned until the next call
    char            msg[ERR_MAX];   // the last LS_OUT_ERROR's strings
    char            param[64];
};

/* lswork.c: worker w runs r (RUNNING) to its end. Returns 0 (r->samples
 * then counts its audio, DONE's input_audio_ms), or -1 with r's w_*
 * fields set (or r->stop set: cancelled or stopping). */
int  ls_work(LsWorker *w, LsReq *r);

/* lscore.c: hands a segment (json, owned; NULL for STARTED) to the loop;
 * waits while the outbox is full. Returns 0, or -1 when r was stopped
 * meanwhile (json is then freed). */
int  ls_post(LsCore *c, LsReq *r, LsOutKind kind, char *json, size_t len);

#endif

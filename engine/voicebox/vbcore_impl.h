/* vbcore_impl.h -- the voicebox core's structs, shared by its two halves:
 * vbcore.c (requests, queues, workers, outbox: who runs what, when) and
 * vbpipe.c (one chunk's audio path: units -> PCM -> 24 kHz -> codec ->
 * pool blocks, on a worker). Nothing outside engine/voicebox includes it. */

#ifndef OMNI_VBCORE_IMPL_H
#define OMNI_VBCORE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "encode.h"
#include "resample.h"
#include "vbcore.h"

typedef enum {
    VB_IDLE = 0,        // no worker, not queued: waiting for units
    VB_QUEUED,          // in first_q or next_q
    VB_RUNNING,         // a worker has it; only that worker touches the
                        //   audio fields below
    VB_ENDED,           // on the ended list, for vb_next to report
} VbState;

typedef struct VbReq VbReq;

struct VbReq {
    VbCore         *core;           // borrowed
    uint64_t        id;
    VbReq          *next;           // the held list (all requests)
    VbReq          *qnext;          // first_q, next_q or the ended list
    /* scheduling, under core->mu */
    VbState         state;
    PoolRef         pend[VB_MAX_PENDING];   // ring of queued unit chunks
    int             pend_head, pend_n;
    bool            input_done;
    bool            paused;
    bool            started;        // STARTED is in the outbox
    VbOutKind       end;            // when ENDED: DONE, ERROR, CANCELLED
    OmniDone        done;           // the talker's counts, then ours
    /* set by the loop, read by the worker's sinks */
    atomic_bool     stop;           // cancelled or stopping: refuse output
    /* audio, the RUNNING worker's (the loop's before and after) */
    const TtsVoice *voice;          // static, shared
    float           speed;
    AudioFormat     format;
    int             chunks;         // chunks synthesized
    Resampler      *rs;             // owned; opened by the first worker
    AudioEncoder   *enc;            //   turn (a codec may write its
                                    //   header at open: never on the loop)
    int             blk;            // pool block being filled, or -1
    uint32_t        fill;           // its bytes so far
    uint64_t        samples;        // SPEECH_RATE samples encoded
    Err             err;            // why its worker failed it
    Err             fail;           // why the loop failed it (a bad
                                    //   input, stop), under mu; it wins
};

typedef struct {
    VbOutKind       kind;           // VB_OUT_STARTED or VB_OUT_BLOCK
    VbReq          *r;              // borrowed: a request leaves the held
                                    //   list only after its entries
    PoolRef         ref;
} VbEntry;

typedef struct {
    VbCore         *core;
    pthread_t       th;
    int16_t        *out;            // (core->out_cap,) resampled, owned
} VbWorker;

struct VbCore {
    VbConfig        cfg;
    Pool           *pool;           // borrowed
    VbSynth         synth;
    VbWorker       *workers;        // (cfg.slots,), owned
    size_t          out_cap;        // samples a worker's out holds: what
                                    //   VB_PIECE samples of any voice may
                                    //   resample to (resample_out_max)
    int             n_started;      // workers running
    pthread_mutex_t mu;             // guards everything below
    pthread_cond_t  cv;             // a queue grew, or quit
    bool            quit;
    VbReq          *held;           // every request not yet reported ended
    int             n_held;
    VbReq          *first_q, *next_q;   // FIFO: first chunks, the rest
    VbReq          *ended, *ended_tail; // FIFO, for vb_next
    VbEntry        *box;            // (box_cap,) ring: the outbox
    int             box_cap, box_head, box_n;
    int             busy;           // workers on a chunk now
    int             efd;            // eventfd: the outbox is not empty
    char            msg[ERR_MAX];   // the last VB_OUT_ERROR's message
};

/* vbpipe.c: on a worker, request r RUNNING. */
int  vbpipe_open(VbReq *r);                                // first turn
long vbpipe_chunk(VbWorker *w, VbReq *r, PoolRef ref, bool last);
int  vbpipe_finish(VbWorker *w, VbReq *r);
void vbpipe_close(VbReq *r);                               // loop, end

/* vbcore.c: hands a filled block (or STARTED) to the loop. */
void vb_post(VbCore *c, VbReq *r, VbOutKind kind, PoolRef ref);

#endif

/* lscore.h -- the listener's core: audio files in, transcript segments
 * out, on a fixed set of worker slots. No channel, no frames: the stage
 * row (listener.c) feeds it from the loop and sends what it gives back, and
 * the unit tests drive it the same way without processes.
 *
 * Per request: ls_submit names its audio inputs (format hint, length,
 * the OpenAI parameter they came from); their bytes arrive as pool blocks
 * (ls_audio), which the loop copies into the request's buffer and lets go
 * of at once, so an upload holds a block of the shared pool for
 * microseconds, not for its recognition; ls_input_done says the bytes are
 * all in. The request then queues (FIFO) for a worker, which decodes each
 * input in pieces (audio/decoder.h: any layout, any rate, to 16 kHz
 * mono) and feeds the recogniser (asr.h) piece by piece, so each
 * utterance's segment goes out (LS_OUT_SEGMENT, a TRANSCRIPT payload) as
 * soon as it is recognised, while the rest is still being decoded. The
 * request ends with LS_OUT_DONE (input_audio_ms: the audio decoded) or
 * LS_OUT_ERROR: a file that is not audio, corrupt, empty or over the
 * request's max_audio_seconds is a 400 naming the input's parameter.
 *
 * Threads: the loop calls every function here; a worker touches a request
 * only while it runs it. One mutex guards the queues, the outbox and each
 * request's scheduling fields; decoding and recognition run outside it.
 * The loop never waits for a worker: a cancel sets the request's stop
 * flag, the worker sees it after its current piece (a quarter second of
 * audio), and the request ends (LS_OUT_CANCELLED) when the worker lets go.
 *
 * Memory: per slot one recogniser (asr_new: ~100 MB for pocketsphinx's
 * en-US, most of it its models) and a piece buffer; per request an LsReq
 * and one buffer of its declared bytes (malloc'd at submit, filled as the
 * blocks come). The bytes held by all requests are bounded by
 * max_bytes: a request that would go over it is refused with 503
 * overloaded (Retry-After) unless nothing else is held, so one file up to
 * the protocol's limit always goes through. The outbox holds at most
 * LS_BOX entries (segments waiting for the loop); a worker that finds it
 * full waits, so a stalled loop costs no memory. */

#ifndef OMNI_LSCORE_H
#define OMNI_LSCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "asr.h"
#include "log.h"
#include "omni_proto.h"
#include "pool.h"
#include "request.h"
#include "stage_channel.h"

#define LS_PIECE        4000    // samples decoded and fed at once (250 ms)
#define LS_BOX          64      // outbox entries, at most

typedef struct LsCore LsCore;

typedef struct {
    int              slots;         // worker threads, >= 1
    int              max_requests;  // held at once; more are refused
    uint64_t         max_bytes;     // audio bytes held at once (above)
    Pool            *pool;          // borrowed: the audio's blocks
    AsrConfig        asr;           // each slot's recogniser
    OmniStats       *stats;         // borrowed, or NULL: the counters
} LsConfig;

typedef enum {
    LS_OUT_STARTED = 0,         // a worker took the request
    LS_OUT_SEGMENT,             // json: one TRANSCRIPT payload
    LS_OUT_DONE,                // done: the counts; the request is over
    LS_OUT_ERROR,               // status, param, code, msg; over
    LS_OUT_CANCELLED,           // nothing of it is held any more
} LsOutKind;

typedef struct {
    LsOutKind   kind;
    uint64_t    id;
    const char *json;           // LS_OUT_SEGMENT: (len,) valid until the
    size_t      len;            //   next ls_next
    OmniDone    done;           // LS_OUT_DONE
    int         status;         // LS_OUT_ERROR: 400, 500 or 503,
    const char *param;          //   the parameter ("" for none), code
    const char *code;           //   (NULL: none) and message, valid
    const char *msg;            //   until the next ls_next
} LsOut;

/* A refusal at submit: status (400 or 503), code (NULL: none), message. */
typedef struct {
    int         status;
    const char *code;
    Err         err;
} LsRefusal;

/* Loads cfg->slots recognisers (one at a time: asr_new is not
 * thread-safe) and starts a worker on each. Returns the core, or NULL
 * with err set (nothing left to free). Freed with ls_free. */
LsCore *ls_new(const LsConfig *cfg, Err *err);

/* Warm-up, before any request: every slot's recogniser hears pcm (n
 * samples at ASR_RATE) on the calling thread. The words the first one
 * heard go to heard (cap bytes, NUL-terminated). Returns 0, or -1 with
 * err set: a recogniser failed, or one heard no word at all (a broken
 * model would otherwise fail every request). */
int  ls_warm(LsCore *c, const int16_t *pcm, size_t n, char *heard,
             size_t cap, Err *err);

/* The recognisers' description (asr_describe). */
const char *ls_describe(const LsCore *c);

/* A new request id for r's audio inputs (r->audio_in, n_audio_in >= 1;
 * r is read during the call only). Returns 0, or -1 with why set: a
 * duplicate id, max_requests held, the byte budget, or out of memory. */
int  ls_submit(LsCore *c, uint64_t id, const OmniRequest *r,
               LsRefusal *why);

/* The next bytes of request id's audio, ref (checked by the caller)
 * copied and dropped whatever happens. More bytes than declared fail the
 * request. Unknown ids: the block is dropped. Can't fail. */
void ls_audio(LsCore *c, uint64_t id, PoolRef ref);

/* The audio of request id is all sent: it queues for a worker. Fewer
 * bytes than declared fail it. Unknown ids are ignored. */
void ls_input_done(LsCore *c, uint64_t id);

/* Drops request id: a worker on it stops after its current piece, and
 * LS_OUT_CANCELLED follows once nothing of it is held. Returns false when
 * the id is unknown (the caller acks at once). */
bool ls_cancel(LsCore *c, uint64_t id);

/* Fails request id from the loop (a bad input frame) with a 500 and msg:
 * as ls_cancel, but it ends with LS_OUT_ERROR. False when unknown. */
bool ls_error(LsCore *c, uint64_t id, const char *msg);

/* Readable while the outbox or the ended list has entries; the core's. */
int  ls_wake_fd(const LsCore *c);

/* Takes the next outbox entry into o; false when there is none. A
 * request's STARTED and segments come in order, before its end; segments
 * of a request cancelled meanwhile are dropped here. The loop calls it
 * until false whenever the wake fd is readable. */
bool ls_next(LsCore *c, LsOut *o);

/* Requests held now (submitted and not yet ended through ls_next). */
int  ls_held(const LsCore *c);

/* Stops the workers (a request in progress is abandoned after its
 * piece), then every request still held ends: ls_next returns
 * LS_OUT_ERROR (500, msg why) for each, after the outbox's entries. */
void ls_stop(LsCore *c, const char *why);

/* Stops the workers if still running, frees every request and c; NULL is
 * fine. */
void ls_free(LsCore *c);

#endif

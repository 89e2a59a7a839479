/* vbcore.h -- the voicebox's core: speech units in, encoded audio blocks
 * out, on a fixed set of worker threads. No channel, no frames: the stage
 * row (voicebox.c) feeds it from the loop and sends what it gives back, and
 * the unit tests drive it the same way without processes.
 *
 * Per request: the units chunks arrive as pool references (vb_units), in
 * order, and wait in a bounded queue; a worker takes the request, decodes
 * its next chunk (tts/units.h), synthesizes it (tts/synth.h, 16 kHz),
 * resamples to SPEECH_RATE (one Resampler per request), encodes it (one
 * AudioEncoder per request) and copies the bytes into pool blocks, which it
 * hands to the loop through the outbox (an eventfd, vb_wake_fd). When the
 * input is over (vb_input_done) and every chunk is done, a worker drains
 * the resampler and the encoder, and the request ends with DONE.
 *
 * Scheduling: slots workers, so at most slots chunks are synthesized at
 * once. A request holds a worker only for one chunk (or its finish): then
 * it goes back to the tail of the queue when it has more, or idles until
 * more units arrive. Two FIFO queues, first chunks before the others: a
 * request's first chunk decides its time to first audio, later chunks only
 * have to keep ahead of playback.
 *
 * Threads: the loop calls every function here; workers touch a request
 * only while it is RUNNING. One mutex guards the queues, the outbox and
 * each request's scheduling fields; synthesis and encoding run outside it.
 * The loop never waits for a worker: a cancel of a request in mid-chunk
 * sets its stop flag, the worker's next sink call refuses the samples, and
 * the request ends (VB_OUT_CANCELLED) when the worker lets go.
 *
 * Memory, fixed at vb_new and per request: per worker a resampling
 * buffer (what VB_PIECE samples resample to, at most); per request its
 * VbReq with a queue of VB_MAX_PENDING unit references (vb_submit), one
 * Resampler and one AudioEncoder (opened by the worker of its first
 * turn); the outbox holds at most pool->n_blocks + max_requests entries (each one a
 * block this stage holds, or one request's STARTED). Nothing is allocated
 * per chunk beyond what Flite and the codecs allocate inside their calls.
 * Audio waits in the shared pool, never here: a worker that finds the pool
 * full waits for a block (pool_wait), re-checking its stop flag. */

#ifndef OMNI_VBCORE_H
#define OMNI_VBCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "omni_proto.h"
#include "pool.h"
#include "speech.h"
#include "stage_channel.h"
#include "synth.h"

#define VB_MAX_PENDING  512     // unit chunks queued per request, at most
#define VB_PIECE        4096    // samples resampled at once (16 kHz in)
#define VB_WAIT_MS      100     // a pool_wait's slice between stop checks

typedef struct VbCore VbCore;

/* The synthesizer, tts_synth's type: the stage passes tts_synth, a test
 * one it controls (timing, failures). */
typedef long (*VbSynth)(const TtsVoice *v, const Units *u,
                        const TtsSynthOpts *o, TtsPcmSink sink, void *ud,
                        Err *err);

typedef struct {
    int         slots;          // worker threads, >= 1
    int         max_requests;   // held at once; more are refused
    Pool       *pool;           // borrowed; units in, audio out
    uint16_t    owner;          // the tag on blocks allocated here
    VbSynth     synth;          // NULL: tts_synth
    OmniStats  *stats;          // borrowed, or NULL: the counters' page
} VbConfig;

typedef enum {
    VB_OUT_STARTED = 0,         // the request's first chunk began
    VB_OUT_BLOCK,               // ref: encoded audio; its reference is
                                //   the receiver's
    VB_OUT_DONE,                // done: the counts; the request is over
    VB_OUT_ERROR,               // msg: what failed; the request is over
    VB_OUT_CANCELLED,           // nothing of it is held any more
} VbOutKind;

typedef struct {
    VbOutKind   kind;
    uint64_t    id;
    PoolRef     ref;            // VB_OUT_BLOCK
    OmniDone    done;           // VB_OUT_DONE
    const char *msg;            // VB_OUT_ERROR: valid until the next
                                //   vb_next
} VbOut;

/* Starts cfg->slots workers. Returns the core, or NULL with err set
 * (nothing left to free). The caller frees it with vb_free. */
VbCore *vb_new(const VbConfig *cfg, Err *err);

/* A new request id speaking with sp (voice, format, speed); its resampler
 * and encoder are opened by the worker of its first turn (a codec that
 * fails to open fails the request then). Returns 0, or -1 with err set: a
 * duplicate id, an unknown voice or format, or max_requests held. */
int  vb_submit(VbCore *c, uint64_t id, const SpeechParams *sp, Err *err);

/* The request's next units chunk, ref (checked by the caller) taken over
 * whatever happens: queued, or dropped when the id is unknown or the
 * request already failed. A full queue fails the request (VB_OUT_ERROR).
 * Can't fail otherwise. */
void vb_units(VbCore *c, uint64_t id, PoolRef ref);

/* The input of request id is over; d carries the talker's counts
 * (prompt_tokens, audio_tokens), which its DONE repeats. Unknown ids are
 * ignored. */
void vb_input_done(VbCore *c, uint64_t id, const OmniDone *d);

/* Flow control: a paused request finishes the chunk it is on, then gets no
 * worker until resumed. Unknown ids are ignored. */
void vb_pause(VbCore *c, uint64_t id, bool paused);

/* Drops request id: its queued units are unreferenced, a worker on it
 * stops at its next sink call, and VB_OUT_CANCELLED follows once nothing
 * of it is held. Returns false when the id is unknown (the caller acks at
 * once). */
bool vb_cancel(VbCore *c, uint64_t id);

/* Fails request id from the loop with msg (a bad input frame): as
 * vb_cancel, but it ends with VB_OUT_ERROR. False when the id is unknown. */
bool vb_error(VbCore *c, uint64_t id, const char *msg);

/* Readable while the outbox has entries; the core's. */
int  vb_wake_fd(const VbCore *c);

/* Takes the next outbox entry into o; false when there is none. Blocks of
 * a request come in order, before its DONE/ERROR/CANCELLED; blocks of a
 * request cancelled meanwhile are dropped here, not returned. The loop
 * calls it until false whenever the wake fd is readable. */
bool vb_next(VbCore *c, VbOut *o);

/* Requests held now (submitted and not yet ended through vb_next). */
int  vb_held(const VbCore *c);

/* Stops the workers (a chunk in progress is abandoned), then every request
 * still held ends: vb_next returns VB_OUT_ERROR (msg why) for each, after
 * the outbox's last entries. */
void vb_stop(VbCore *c, const char *why);

/* Stops the workers if still running, drops every reference still held
 * and frees c; NULL is fine. */
void vb_free(VbCore *c);

#endif

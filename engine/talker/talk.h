/* talk.h -- the talker's logic without its process: requests and their
 * text in, chunks of speech units out in pool blocks. talker.c is the
 * stage row around it (the skeleton's callbacks mapped onto these calls);
 * this part is separate so that it is tested without processes
 * (t/unit/test_talker.c drives it with a pool of its own).
 *
 * A request's text comes from one of two places:
 *
 *   "input"   (/v1/audio/speech) spoken as it is: all of it is queued at
 *             SUBMIT and the input ends there;
 *   "audio"   (chat or prompt) the thinker's text deltas, passed on by the
 *             frontend as INPUT TEXT frames, until INPUT DONE.
 *
 * Either way it goes through a Chunker (tts/chunker.h) cut by the
 * request's mode and the engine's word counts; each chunk is analysed
 * (tts/analyze.h), encoded (tts/units.h) into a pool block and sent on
 * (TalkEvents.block). At the end: one DONE with prompt_tokens = the words
 * read and audio_tokens = the phones produced. A text with nothing to say
 * ends with a DONE of zero counts and no block.
 *
 * Steps never block. A step takes at most TALK_STEP_CHUNKS chunks: first
 * the requests that have sent nothing yet (their first chunk is the
 * latency a client hears), then round-robin from where the last step
 * stopped. When the pool has no free block the step stops and the chunk
 * waits for a later step (talk_idle says so, so the loop waits a
 * heartbeat instead of spinning): backpressure from the voicebox, never
 * more memory, and no text lost.
 *
 * Memory per request is bounded: the Chunker's fixed buffer
 * (CHUNKER_MAX) plus an input queue for text the Chunker cannot take yet
 * (it is full while its chunks wait for the pool). The queue grows on
 * INPUT, never in a step, up to TALK_INPUT_MAX bytes; text past that
 * fails the request (500 "talker_overrun": the frontend let a request's
 * text run TALK_INPUT_MAX + CHUNKER_MAX bytes ahead of its speech, which
 * flow control exists to prevent). At most max_requests requests are held
 * (the thinker's max_seqs + max_queue); more are refused, 503
 * "overloaded". So the talker holds at most max_requests *
 * (sizeof(TalkReq) + TALK_INPUT_MAX) bytes.
 *
 * Ownership: Talk owns its requests and their buffers; the blocks it
 * sends go with the event (the receiver's reference). A block is
 * allocated, filled and sent within one step, so a request never holds a
 * block across steps and a cancel has none to free. */

#ifndef OMNI_TALK_H
#define OMNI_TALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "analyze.h"
#include "chunker.h"
#include "omni_proto.h"
#include "pool.h"
#include "request.h"

#define TALK_INPUT_MAX    (64u << 10)   // queued text per request, bytes
#define TALK_STEP_CHUNKS  8             // chunks one step analyses at most

/* Where a Talk's output goes. Each call's arguments are borrowed for the
 * call but block's r, whose one reference becomes the callee's. */
typedef struct {
    void *ud;
    void (*block)(void *ud, uint64_t id, PoolRef r);
    void (*done)(void *ud, uint64_t id, const OmniDone *d);
    void (*error)(void *ud, uint64_t id, int status, const char *type,
                  const char *param, const char *code, const char *msg);
} TalkEvents;

typedef struct {
    int         first_words;    // ChunkPolicy's; 0: the defaults
    int         chunk_words;    //   (4, 12, 40; talk_init sets them)
    int         quality_words;
    int         max_requests;   // held at once, >= 1
    Pool       *pool;           // borrowed: where chunks go
    uint16_t    owner;          // the tag on blocks allocated
} TalkConfig;

typedef struct TalkReq TalkReq;

typedef struct {
    TalkConfig   cfg;
    TalkEvents   ev;
    TtsAnalyzer *an;            // owned
    TalkReq     *reqs;          // held requests, a list, owned
    TalkReq     *cursor;        // where the next round-robin turn starts
    int          n_reqs;
    bool         pool_full;     // the last step stopped for want of a
                                //   block; cleared by the next step
    /* counters, since start */
    uint64_t     chunks;        // blocks sent
    uint64_t     words;
    uint64_t     phones;
} Talk;

/* Builds t: an analyzer (tts_init must have run). Returns 0, or -1 with
 * err set (nothing to free then). */
int  talk_init(Talk *t, const TalkConfig *cfg, const TalkEvents *ev,
               Err *err);

/* Ends every request still held with an ERROR (msg says why), then frees
 * t. */
void talk_free(Talk *t, const char *msg);

/* A parsed request r (borrowed for the call): queued, or refused with an
 * ERROR event (no "audio", the talker full, an id in use). Can't
 * otherwise fail. */
void talk_submit(Talk *t, uint64_t id, const OmniRequest *r);

/* n bytes of text for request id (INPUT TEXT). Unknown ids are ignored (a
 * CANCEL or the request's end crossed it). */
void talk_text(Talk *t, uint64_t id, const char *s, size_t n);

/* The input of request id is over (INPUT DONE). */
void talk_end(Talk *t, uint64_t id);

/* PAUSE (true) and RESUME: a paused request takes no turn in steps. */
void talk_pause(Talk *t, uint64_t id, bool paused);

/* Ends request id with an ERROR (type by status, code and msg as given)
 * and drops it; unknown ids are ignored. */
void talk_fail(Talk *t, uint64_t id, int status, const char *code,
               const char *msg);

/* Drops request id without a word; returns whether it was held. */
bool talk_cancel(Talk *t, uint64_t id);

/* One step (above). */
void talk_step(Talk *t);

/* Nothing a step could do now: no request has a chunk to cut, or every
 * one that has waits for a block (pool_full) or is paused. */
bool talk_idle(const Talk *t);

/* Requests held, and of those how many have something to say now. */
void talk_counts(const Talk *t, int *held, int *ready);

#endif

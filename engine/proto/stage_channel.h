/* stage_channel.h -- the channel between the engine's frontend and a stage
 * process, and the statistics page they share.
 *
 * The frontend starts a stage by fork+exec of its own binary,
 *
 *   omni-engine stage thinker --ipc-fd 3 --stats-fd 4 [serve options]
 *
 * with fd 3 one end of a SOCK_STREAM socketpair (frames of omni_proto.h,
 * types OMNI_F_STAGE_*, direction OMNI_DIR_STAGE) and fd 4 a memfd holding
 * one OmniStats. The stage exits when fd 3 reaches EOF (the frontend is
 * gone or wants it gone). Payloads:
 *
 *   frontend -> stage
 *     SUBMIT   u64 request id, then the request JSON (request.h)
 *     INPUT    u64 request id, then an inner frame (header included): the
 *              output of the stage before this one on the request's route,
 *              passed on as that stage sent it in its EVENT: TEXT (text to
 *              speak, for the talker), BLOCK (a pool descriptor: units for
 *              the voicebox), DONE (the input is over; its counts are the
 *              previous stage's). For the listener, the first stage of its
 *              routes, the frontend itself is the stage before: BLOCKs
 *              hold the client's AUDIO_IN bytes in order (the audio_in
 *              inputs concatenated), and DONE (all zero counts) follows
 *              the last of them.
 *     CANCEL   u64 request id: the client went away or another stage of
 *              the route failed; drop it, send nothing more for it but
 *              CANCELLED
 *     PAUSE    u64 request id: its client is behind; produce no more for
 *              it until RESUME (flow control, so a slow reader holds no
 *              more than a window of the pool)
 *     RESUME   u64 request id
 *   stage -> frontend
 *     READY    JSON {"id": model name, "max_model_len": n, "kernels": set,
 *              "max_piece_bytes": n, "ws_free": bool}: loaded, warmed
 *              up, accepting SUBMITs. The last two are the tokenizer's
 *              PromptBound (below), so the frontend can refuse a prompt
 *              that cannot fit without sending it here.
 *     STARTED  u64 request id: first scheduled (its queue time ends)
 *     EVENT    u64 request id, then a client frame (header included: TEXT,
 *              DONE or ERROR) to pass on as it is. DONE and ERROR end the
 *              request; events for an id the frontend no longer knows are
 *              dropped (a CANCEL crossed them). Inner frames: TEXT, AUDIO,
 *              TRANSCRIPT (the listener's), DONE, ERROR, and BLOCK
 *              (below).
 *     CANCELLED u64 request id: the answer to CANCEL, sent once the stage
 *              holds nothing of the request (no pool reference, no worker
 *              on it); only then may the frontend reclaim its blocks
 *              (pool_reclaim_request). Sent for unknown ids too.
 *
 * BLOCK (an inner frame only, never sent to a client): PoolRef, 12 bytes
 * (u32 block, u32 offset, u32 length), then u32 flags 0. The bytes live in
 * the shared-memory pool (base/pool.h) that the frontend creates and every
 * stage maps (fd STAGE_POOL_FD); exactly one pool reference travels with
 * the descriptor: whoever receives it passes it on or drops it
 * (pool_unref), including when it drops the event itself (unknown id).
 * What the bytes are is the sender's: the talker's units (tts/units.h),
 * the voicebox's audio in the request's format. A receiver checks the
 * descriptor (pool_check) before it touches the block.
 *
 * Request ids are the frontend's; a stage never reuses one.
 *
 * Liveness: the stage writes the monotonic time into the stats page's
 * heartbeat at every turn of its loop, which turns at least every
 * STAGE_BEAT_MS when idle, and step_start while a step runs. The stage
 * side of all this, channel, page and loop, is written once, in the stage
 * skeleton (engine/stage/stage.h), which every stage runs in.
 * The frontend reads them without asking: a stage silent for longer than
 * --stage-unready-after is not ready, one silent for --stage-kill-after is
 * killed and restarted. A channel ping would say the same but would queue
 * behind a long step's output; the page needs no round trip and no
 * cooperation from a stopped process. */

#ifndef OMNI_STAGE_CHANNEL_H
#define OMNI_STAGE_CHANNEL_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "omni_proto.h"

enum {
    OMNI_F_STAGE_SUBMIT  = OMNI_F_STAGE_MIN,
    OMNI_F_STAGE_CANCEL,
    OMNI_F_STAGE_INPUT,
    OMNI_F_STAGE_PAUSE,
    OMNI_F_STAGE_RESUME,
    OMNI_F_STAGE_READY   = OMNI_F_STAGE_MIN + 16,
    OMNI_F_STAGE_STARTED,
    OMNI_F_STAGE_EVENT,
    OMNI_F_STAGE_CANCELLED,
    OMNI_F_STAGE_BLOCK   = OMNI_F_STAGE_MIN + 31,  // inner frames only
};

#define STAGE_BLOCK_LEN 16      // a BLOCK payload: PoolRef + u32 flags

#define STAGE_BEAT_MS   100         // longest idle wait between beats

#define STAGE_IPC_FD    3
#define STAGE_STATS_FD  4
#define STAGE_POOL_FD   5       // the shared-memory pool's memfd

#define STATS_MAGIC     0x6f6d6e6973746174ull   // "omnistat"

/* The part of the statistics page only the thinker writes: its KV cache,
 * its prefix cache and its forward passes. */
typedef struct {
    /* gauges */
    _Atomic int64_t   kv_blocks_total;
    _Atomic int64_t   kv_blocks_used;       // referenced by a sequence
    _Atomic int64_t   kv_blocks_cached;     // unreferenced, in the prefix
                                            //   cache (evictable)
    _Atomic int64_t   kv_blocks_free;
    /* counters */
    _Atomic uint64_t  prefix_cache_queries; // prompt tokens looked up
    _Atomic uint64_t  prefix_cache_hits;    // of those, found cached
    _Atomic uint64_t  preemptions;
    _Atomic uint64_t  prompt_tokens;        // prompt tokens of admitted
                                            //   requests
    _Atomic uint64_t  generation_tokens;
    _Atomic uint64_t  steps;                // forward passes
    _Atomic uint64_t  step_tokens;          // tokens run in them
    /* prefix routing (--redis: thinker/prefix_pub.h); gauges */
    _Atomic int64_t   prefix_publishing;    // 1 with --redis: the rest
                                            //   of these are drawn
    _Atomic int64_t   prefix_keys_held;     // the index's held keys
    _Atomic int64_t   redis_up;             // 1 while connected
    /* counters */
    _Atomic uint64_t  prefix_keys_published;    // SETs decided
    _Atomic uint64_t  prefix_keys_removed;      // DELs decided
    _Atomic uint64_t  redis_errors;         // failed connects, commands
    _Atomic uint64_t  prefix_resyncs;       // full rewrites of the keys
} ThinkerStats;

/* The talker's part: text in, speech units out. */
typedef struct {
    /* counters */
    _Atomic uint64_t  chunks;               // unit chunks sent (pool
                                            //   blocks)
    _Atomic uint64_t  words;                // words analysed
    _Atomic uint64_t  phones;               // phones produced: the
                                            //   requests' audio_tokens
} TalkerStats;

/* The voicebox's part: its worker slots and what they made. */
typedef struct {
    /* gauges */
    _Atomic int64_t   slots;                // --voicebox-slots: workers
    _Atomic int64_t   slots_busy;           // synthesizing a chunk now
    /* counters */
    _Atomic uint64_t  chunks;               // units chunks synthesized
    _Atomic uint64_t  audio_ms;             // audio of finished requests
} VoiceboxStats;

/* The listener's part: audio in, transcripts out. */
typedef struct {
    /* gauges */
    _Atomic int64_t   slots;                // --listener-slots: workers
    _Atomic int64_t   slots_busy;           // recognising now
    /* counters */
    _Atomic uint64_t  audio_ms;             // input audio decoded
    _Atomic uint64_t  segments;             // TRANSCRIPT events sent
    _Atomic uint64_t  words;                // words recognised
    _Atomic uint64_t  decode_errors;        // inputs refused as not audio,
                                            //   corrupt, empty or too long
} ListenerStats;

/* Counters and gauges a stage publishes; the frontend renders them as
 * Prometheus metrics. The page lives in a memfd the frontend creates, so
 * counters survive a stage restart (a new stage keeps adding to them) and
 * the frontend reads them without asking. Gauges are rewritten by the
 * stage at every step; a new stage resets them when it starts. Only the
 * stage writes (bar the two the frontend keeps, marked); relaxed atomics
 * are enough for monitoring.
 *
 * The first part is every stage's: liveness, queue, restarts; the stage
 * skeleton maps the page and resets and writes its liveness fields, the
 * stage its queue gauges. The rest is the stage's own, one member of the union per kind of stage, so the page
 * has one size whatever the stage and a new stage adds its member. */
typedef struct {
    uint64_t          magic;                // STATS_MAGIC
    /* gauges */
    _Atomic int64_t   requests_running;     // admitted, incl. preempted
    _Atomic int64_t   requests_waiting;     // queued, not yet admitted
    _Atomic int64_t   stage_pid;
    _Atomic int64_t   heartbeat_us;         // monotonic clock, us, at the
                                            //   loop's last turn; 0: none
                                            //   yet (loading)
    _Atomic int64_t   step_start_us;        // the step running since; 0:
                                            //   between steps
    _Atomic int64_t   step_max_us;          // the longest step so far
    /* counters */
    _Atomic uint64_t  stage_restarts;       // written by the frontend
    _Atomic uint64_t  stage_hang_kills;     // written by the frontend:
                                            //   killed for silence
    union {
        ThinkerStats  thinker;
        TalkerStats   talker;
        VoiceboxStats voicebox;
        ListenerStats listener;
    };
} OmniStats;

/* The monotonic clock in microseconds, the heartbeat's unit (the clock is
 * system-wide, so both processes read the same one). */
static inline int64_t stage_clock_us(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}


/* ---- The prompt bound ---------------------------------------------------
 * A prompt is refused when it leaves no room in the context. Knowing that
 * exactly takes tokenizing it, which costs time in proportion to its bytes
 * however small the context: a megabyte prompt to a 512-token model was
 * tokenized in full (twice) before its refusal. But one token covers at
 * most max_piece bytes of text (tokenizer_text_bound), so counted bytes /
 * max_piece tokens, rounded up, is a lower bound that costs one pass over
 * the text at most, and none when whitespace counts. The thinker checks
 * it before tokenizing; the frontend, which has no tokenizer, checks it on
 * the message contents as parsed (each trimmed, as some templates trim),
 * before the request reaches the stage at all. */

typedef struct {
    uint32_t max_piece;     // bytes one token covers at most; 0: no bound
    bool     ws_free;       // whitespace may cost no token: not counted
} PromptBound;

/* OpenAI's words; the arguments: the context, the param ("messages" or
 * "prompt"), "" or "at least ", the prompt's tokens, the param again. */
#define PROMPT_TOO_LONG_FMT "This model's maximum context length is %" \
    PRId64 " tokens. However, your %s resulted in %s%" PRId64 " tokens. " \
    "Please reduce the length of the %s."

static inline bool prompt_bound_space(char c) {     // C isspace, "C" locale
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The bytes of s[0..n) the bound counts: all, or with ws_free those that
 * are not whitespace. O(1) or O(n); can't fail. */
static inline uint64_t prompt_bound_bytes(const PromptBound *b, const char *s,
                                          size_t n)
{
    uint64_t k = 0;

    if (!b->ws_free) return n;
    for (size_t i = 0; i < n; i++) k += !prompt_bound_space(s[i]);
    return k;
}

/* The fewest tokens text with `bytes` counted bytes can take; 0 when there
 * is no bound. */
static inline int64_t prompt_bound_tokens(const PromptBound *b,
                                          uint64_t bytes)
{
    if (b->max_piece == 0) return 0;
    return (int64_t) ((bytes + b->max_piece - 1) / b->max_piece);
}

#endif

/* stage.h -- the channel between the engine's frontend and a stage
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
 *     CANCEL   u64 request id: the client went away; free it, say nothing
 *   stage -> frontend
 *     READY    JSON {"id": model name, "max_model_len": n}: loaded, warmed
 *              up, accepting SUBMITs
 *     STARTED  u64 request id: first scheduled (its queue time ends)
 *     EVENT    u64 request id, then a client frame (header included: TEXT,
 *              DONE or ERROR) to pass on as it is. DONE and ERROR end the
 *              request; events for an id the frontend no longer knows are
 *              dropped (a CANCEL crossed them).
 *
 * Request ids are the frontend's; a stage never reuses one. */

#ifndef OMNI_STAGE_H
#define OMNI_STAGE_H

#include <stdatomic.h>
#include <stdint.h>

#include "omni_proto.h"

enum {
    OMNI_F_STAGE_SUBMIT  = OMNI_F_STAGE_MIN,
    OMNI_F_STAGE_CANCEL,
    OMNI_F_STAGE_READY   = OMNI_F_STAGE_MIN + 16,
    OMNI_F_STAGE_STARTED,
    OMNI_F_STAGE_EVENT,
};

#define STAGE_IPC_FD    3
#define STAGE_STATS_FD  4

#define STATS_MAGIC     0x6f6d6e6973746174ull   // "omnistat"

/* Counters and gauges a stage publishes; the frontend renders them as
 * Prometheus metrics. The page lives in a memfd the frontend creates, so
 * counters survive a stage restart (a new stage keeps adding to them) and
 * the frontend reads them without asking. Gauges are rewritten by the
 * stage at every step; a new stage resets them when it starts. Only the
 * stage writes; relaxed atomics are enough for monitoring. */
typedef struct {
    uint64_t          magic;                // STATS_MAGIC
    /* gauges */
    _Atomic int64_t   requests_running;     // admitted, incl. preempted
    _Atomic int64_t   requests_waiting;     // queued, not yet admitted
    _Atomic int64_t   kv_blocks_total;
    _Atomic int64_t   kv_blocks_used;       // referenced by a sequence
    _Atomic int64_t   kv_blocks_cached;     // unreferenced, in the prefix
                                            //   cache (evictable)
    _Atomic int64_t   kv_blocks_free;
    _Atomic int64_t   stage_pid;
    /* counters */
    _Atomic uint64_t  prefix_cache_queries; // prompt tokens looked up
    _Atomic uint64_t  prefix_cache_hits;    // of those, found cached
    _Atomic uint64_t  preemptions;
    _Atomic uint64_t  prompt_tokens;        // prompt tokens of admitted
                                            //   requests
    _Atomic uint64_t  generation_tokens;
    _Atomic uint64_t  steps;                // forward passes
    _Atomic uint64_t  step_tokens;          // tokens run in them
    _Atomic uint64_t  stage_restarts;       // written by the frontend
} OmniStats;

#endif

/* serve.h -- `omni-engine serve`: its settings and the frontend's entry
 * point (a stage's is stage.h's stage_main).
 *
 *   omni-engine serve --model PATH --socket PATH [options]
 *
 * runs the frontend (frontend/): it listens on the Unix socket, starts the
 * thinker stage (thinker.c, run by the skeleton of stage.h) by fork+exec
 * of its own binary as
 *
 *   omni-engine stage thinker --ipc-fd 3 --stats-fd 4 --pool-fd 5
 *       --stage-owner N <the serve options>
 *
 * and restarts it if it dies (stage_channel.h describes the channel). Both
 * processes parse the same options into a ServeConfig (main.c). */

#ifndef OMNI_SERVE_H
#define OMNI_SERVE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "log.h"

typedef struct {
    const char *model_path;
    const char *model_name;         // served id; default: the file's name
                                    //   without directory and ".gguf"
    const char *socket_path;
    int         threads;            // 0: one per core
    const char *isa;                // NULL: auto
    const char *backend;            // "auto", "cpu" or "cuda"; NULL: auto
    double      gpu_memory_fraction;// of the device's memory; 0: 0.9
    bool        mmap;               // map weights instead of copying
    int64_t     ctx;                // 0: the model's, at most 4096
    int64_t     max_batch_tokens;   // default 512
    int         max_seqs;           // default 64
    int         max_queue;          // default 1024
    int         block_size;         // default 16
    double      kv_cache_mb;        // 0: 1024; the pool never takes more
                                    //   than max_seqs full contexts use
    bool        prefix_cache;       // default on
    /* the voicebox stage (voicebox/) */
    int         voicebox_slots;     // --voicebox-slots N: requests
                                    //   synthesized at once; 0: one per
                                    //   CPU, at least 2
    /* the listener stage (listener/) */
    int         listener_slots;     // --listener-slots N: inputs
                                    //   recognised at once; 0: one per
                                    //   CPU, 1..4
    int         listener_buffer_mib;// audio bytes held at once; 0: 256
    const char *listener_model;     // pocketsphinx model dir; NULL: the
                                    //   default (asr.h)
    int         drain_s;            // on SIGTERM, wait this long for
                                    //   requests in flight (default 30)
    int         read_timeout_s;     // a connection's one frame must be
                                    //   in within this (default 10)
    double      stage_unready_s;    // a stage without a heartbeat this
                                    //   long is not ready (default 10)
    double      stage_kill_s;       // ... and is killed and restarted
                                    //   at this (default 60; 0: never)
    const char *lock_file;          // NULL: none; else the frontend holds
                                    //   an fcntl write lock on it while it
                                    //   lives (one engine per lock file)
    bool        replace;            // when another engine holds lock_file:
                                    //   start beside it, take its place
                                    //   once ready (frontend/listen.c)
    int         pool_blocks;        // the shared-memory pool the frontend
    int         pool_block_kib;     //   creates: blocks (default 512) of
                                    //   KiB each (default 32): 16 MiB
    /* `stage` only: what the frontend tells the process it starts */
    int         pool_fd;            // the pool's memfd (STAGE_POOL_FD);
                                    //   0: none (fd 0 is never a pool)
    uint16_t    stage_owner;        // tag on the blocks this stage
                                    //   allocates: its row + 1; 0: none
    /* prefix routing: what the thinker's KV cache holds, published to
     * Redis (thinker/prefix_pub.h); redis NULL: nothing is */
    const char *redis;              // --redis: "unix:/path", "host:port"
    const char *redis_password_file;// its first line is the password;
                                    //   NULL: no AUTH
    const char *redis_user;         // the ACL user, or NULL
    int         redis_db;           // SELECTed when > 0
    const char *redis_namespace;    // key prefix, default "omni:"
    const char *route_id;           // this engine's name in nginx's
                                    //   upstream; NULL: "unix:" followed
                                    //   by socket_path
    int         prefix_ttl_s;       // prefix keys' expiry (default 300)
    /* the talker's chunks (tts/chunker.h); 0: the chunker's default */
    int         speech_first_words; // latency mode: the first chunk, at
                                    //   most (default 4)
    int         speech_chunk_words; // latency mode: later chunks (12)
    int         speech_quality_words; // quality mode: a chunk (40)
} ServeConfig;

/* The one rule for the name a model is served under (main.c's default,
 * the thinker's READY id, the frontend's id until READY): cfg->model_name
 * when set and not empty, else the model file's name without its
 * directory and ".gguf". Writes it to out (cap > 0 bytes), cut to fit, and
 * returns its whole length as snprintf does: cap or more means it was cut.
 * Can't fail. */
static inline size_t serve_model_name(const ServeConfig *cfg, char *out,
                                      size_t cap)
{
    const char *s = cfg->model_name;
    size_t      n;

    if (s != NULL && s[0] != '\0') {
        n = strlen(s);
    } else {
        s = strrchr(cfg->model_path, '/');
        s = s != NULL ? s + 1 : cfg->model_path;
        n = strlen(s);
        if (n > 5 && strcmp(s + n - 5, ".gguf") == 0) n -= 5;
    }
    memcpy(out, s, n < cap ? n : cap - 1);
    out[n < cap ? n : cap - 1] = '\0';
    return n;
}

/* The frontend. argv (argc entries) are the serve options exactly as given,
 * passed on to the stage it starts. Returns 0 after a clean SIGTERM/SIGINT
 * shutdown, or -1 with err set when it cannot start (socket in use,
 * cfg->lock_file held by another engine: "another engine (pid N) holds
 * PATH" unless cfg->replace, ...). */
int frontend_run(const ServeConfig *cfg, int argc, char **argv, Err *err);

#endif

/* client.h -- a client of the wire protocol (omni_proto.h): the engine
 * side of `omni-engine client`, used by tests, benchmarks and people
 * poking at a running engine.
 *
 * Blocking I/O on one connection per call, as the protocol has it. The
 * request JSON is built with yajl_gen, so any prompt text is escaped
 * correctly. */

#ifndef OMNI_CLIENT_H
#define OMNI_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "omni_proto.h"
#include "stop.h"

typedef struct {
    const char *socket_path;
    const char *prompt;
    bool        chat;           // send messages [{user: prompt}], not prompt
    const char *model;          // NULL: not sent
    int64_t     max_tokens;     // < 0: not sent
    double      temperature;    // NaN: not sent (so the engine's default)
    double      top_p;          // NaN: not sent
    int64_t     top_k;          // < 0: not sent
    int64_t     seed;           // < 0: not sent
    const char *stop[STOP_MAX]; // borrowed
    int         n_stop;
} ClientRequest;

/* Sends rq and writes each TEXT event to out as it arrives (flushed).
 * Returns 0 after DONE, with *done filled; -1 with err set after an ERROR
 * event ("<status> <type>: <message>") or when the connection or the
 * engine's frames fail. */
int client_generate(const ClientRequest *rq, FILE *out, OmniDone *done,
                    Err *err);

/* Sends a control frame (OMNI_F_HEALTH, _MODELS or _METRICS) and writes
 * the reply's text to out (health: "<status> <reason>\n"). Returns the
 * HTTP status for health and 200 for the others, or -1 with err set. */
int client_control(const char *socket_path, uint8_t type, FILE *out,
                   Err *err);

#endif

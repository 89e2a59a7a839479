/* log.h -- one logging entry point and one error-carrying type for the engine.
 *
 * Every fallible engine function returns 0 on success and -1 on failure, and
 * on failure writes one human-readable line into an Err supplied by the
 * caller. The line names what failed and, where there is one, the file or
 * object it concerns ("model.gguf: tensor 'blk.0.attn_q.weight' has type q5_1,
 * which is not supported"). Callers add context by prefixing, never by
 * logging and returning: the message is printed once, at the top.
 *
 * log_msg() writes to stderr with a level tag. The level threshold is part of
 * the process configuration set once at startup (log_set_level), the only
 * mutable file-scope state here, written before any thread starts. */

#ifndef OMNI_LOG_H
#define OMNI_LOG_H

#include <inttypes.h>
#include <stddef.h>

#define ERR_MAX 512

typedef struct {
    char msg[ERR_MAX];      // NUL-terminated message of the last failure
} Err;

typedef enum {
    LOG_DEBUG = 0,
    LOG_INFO  = 1,
    LOG_WARN  = 2,
    LOG_ERROR = 3,
} LogLevel;

/* Formats a message into err (if not NULL) and returns -1, so that error
 * paths read "return err_set(err, ...)". */
int err_set(Err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the message already in err; returns -1. */
int err_prefix(Err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void log_set_level(LogLevel level);

/* Seconds on the monotonic clock: for durations (latencies, timeouts,
 * benchmark timings), never for wall-clock time. */
double clock_now_s(void);
void log_msg(LogLevel level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

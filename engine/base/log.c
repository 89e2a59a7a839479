/* log.c -- see log.h. */

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

static LogLevel log_level = LOG_WARN;

int err_set(Err *err, const char *fmt, ...) {
    va_list ap;

    if (err == NULL) return -1;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return -1;
}

int err_prefix(Err *err, const char *fmt, ...) {
    char    prefix[ERR_MAX / 2];
    size_t  plen;
    va_list ap;

    if (err == NULL) return -1;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);

    /* the prefix is at most half the buffer, so the old message keeps its
       head; its tail is what truncation drops */
    plen = strlen(prefix);
    memmove(err->msg + plen + 2, err->msg, ERR_MAX - plen - 2);
    memcpy(err->msg, prefix, plen);
    memcpy(err->msg + plen, ": ", 2);
    err->msg[ERR_MAX - 1] = '\0';
    return -1;
}

void log_set_level(LogLevel level) {
    log_level = level;
}

void log_msg(LogLevel level, const char *fmt, ...) {
    static const char *tags[] = { "debug", "info", "warn", "error" };
    va_list ap;

    if (level < log_level) return;
    flockfile(stderr);                  // one line, whichever thread
    fprintf(stderr, "omni-engine [%s] ", tags[level]);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}

double clock_now_s(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

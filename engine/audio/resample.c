/* resample.c -- resample.h over libsoxr: one soxr stream per Resampler,
 * s16 interleaved in and out (mono), SOXR_HQ, SOXR_NO_DITHER.
 *
 * soxr buffers input internally and emits output as its filter allows,
 * so a call may return fewer samples than n_in * ratio (the held-back
 * latency, measured in audio/README.md) and a later one more. The cap
 * resample_out_max gives covers the ratio's share of n_in plus RS_SLACK
 * output samples of catch-up; should soxr ever want more, the call fails
 * with a clear error rather than dropping input. Memory: soxr's state,
 * allocated by soxr_create; nothing per call. */

#include <soxr.h>
#include <stdlib.h>

#include "resample.h"

#define RS_SLACK 4096       // output samples of catch-up a call may bring

struct Resampler {
    soxr_t soxr;            // owned
    int    in_rate, out_rate;
};

Resampler *resample_new(int in_rate, int out_rate, Err *err) {
    soxr_io_spec_t      io = soxr_io_spec(SOXR_INT16_I, SOXR_INT16_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    soxr_error_t        e;
    Resampler          *r;

    if (in_rate < 1000 || in_rate > 384000 || out_rate < 1000
        || out_rate > 384000) {
        err_set(err, "resampler: rates %d -> %d Hz out of range", in_rate,
                out_rate);
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        err_set(err, "resampler: out of memory");
        return NULL;
    }
    io.flags |= SOXR_NO_DITHER;
    r->in_rate = in_rate;
    r->out_rate = out_rate;
    r->soxr = soxr_create(in_rate, out_rate, 1, &e, &io, &q, NULL);
    if (r->soxr == NULL) {
        err_set(err, "resampler: soxr_create(%d -> %d Hz) failed: %s",
                in_rate, out_rate, e != NULL ? e : "unknown error");
        free(r);
        return NULL;
    }
    return r;
}

size_t resample_out_max(const Resampler *r, size_t n_in) {
    return (size_t) (((uint64_t) n_in * (uint64_t) r->out_rate
                      + (uint64_t) r->in_rate - 1) / (uint64_t) r->in_rate)
           + RS_SLACK;
}

/* in == NULL ends the stream (soxr's flush). */
static int resample_call(Resampler *r, const int16_t *in, size_t n_in,
                         int16_t *out, size_t cap, size_t *n_out, Err *err) {
    size_t       done = 0;
    soxr_error_t e;

    *n_out = 0;
    e = soxr_process(r->soxr, in, n_in, &done, out, cap, n_out);
    if (e != NULL) {
        return err_set(err, "resampler: soxr_process failed: %s", e);
    }
    if (in != NULL && done < n_in) {
        return err_set(err, "resampler: output of %zu samples full after "
                       "%zu of %zu input samples", cap, done, n_in);
    }
    return 0;
}

int resample_process(Resampler *r, const int16_t *in, size_t n_in,
                     int16_t *out, size_t cap, size_t *n_out, Err *err) {
    if (n_in == 0) {
        *n_out = 0;
        return 0;               // soxr would read NULL-with-0 as flush
    }
    return resample_call(r, in, n_in, out, cap, n_out, err);
}

int resample_flush(Resampler *r, int16_t *out, size_t cap, size_t *n_out,
                   Err *err) {
    return resample_call(r, NULL, 0, out, cap, n_out, err);
}

void resample_free(Resampler *r) {
    if (r != NULL) {
        soxr_delete(r->soxr);
        free(r);
    }
}

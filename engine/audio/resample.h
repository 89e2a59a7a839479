/* resample.h -- sample-rate conversion of s16 mono, streamed: libsoxr,
 * SOXR_HQ without dither, so that the output of a stream fed in pieces
 * equals that of the whole (the recipe measured it) and nothing random
 * enters a greedy request's audio.
 *
 * soxr holds back a few tens of milliseconds of input (37 ms at 16 kHz
 * in, HQ) before its first output: resample_flush at the end of a stream
 * gives it back. One Resampler per stream, one thread at a time. */

#ifndef OMNI_RESAMPLE_H
#define OMNI_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"

typedef struct Resampler Resampler;

/* A resampler from in_rate to out_rate Hz. Returns it, or NULL with err
 * set. Freed with resample_free. */
Resampler *resample_new(int in_rate, int out_rate, Err *err);

/* Converts n_in samples of in; writes at most cap samples to out and sets
 * *n_out. Returns 0, or -1 with err set. resample_out_max(r, n_in) is a
 * cap that always suffices. */
int    resample_process(Resampler *r, const int16_t *in, size_t n_in,
                        int16_t *out, size_t cap, size_t *n_out, Err *err);
size_t resample_out_max(const Resampler *r, size_t n_in);

/* Ends the stream: writes what soxr held back (at most cap samples; call
 * again while it fills cap) and sets *n_out. Returns 0, or -1 with err. */
int    resample_flush(Resampler *r, int16_t *out, size_t cap, size_t *n_out,
                      Err *err);

void   resample_free(Resampler *r);

#endif

/* enc_flac.c -- FLAC through libFLAC's stream encoder: 16-bit mono,
 * streamable subset, no seek table, total samples 0 (unknown), MD5 zero,
 * because the file leaves before its end is known. The "fLaC" marker and
 * STREAMINFO go to the sink from FLAC__stream_encoder_init_stream (at
 * open); without a seek callback libFLAC never rewrites them.
 *
 * Blocks of FLAC_BLOCK samples (48 ms at 24 kHz) instead of the level's
 * 4096 (171 ms): speech leaves sooner for ~1% more bytes. libFLAC wants
 * int32 samples: each write widens through a fixed buffer in FLAC_STEP
 * pieces. Memory: libFLAC's state (allocated at init) and that buffer. */

#include <FLAC/stream_encoder.h>
#include <stdlib.h>

#include "enc_impl.h"

#define FLAC_LEVEL 5
#define FLAC_BLOCK 1152
#define FLAC_STEP  4096

typedef struct {
    FLAC__StreamEncoder *enc;               // owned
    FLAC__int32          wide[FLAC_STEP];   // one piece, widened
} Flac;

static FLAC__StreamEncoderWriteStatus flac_out(const FLAC__StreamEncoder *fe,
        const FLAC__byte *p, size_t n, uint32_t samples, uint32_t frame,
        void *ud) {
    return enc_emit(ud, p, n) == 0 ? FLAC__STREAM_ENCODER_WRITE_STATUS_OK
                                   : FLAC__STREAM_ENCODER_WRITE_STATUS_FATAL_ERROR;
}

static int flac_fail(AudioEncoder *e, Err *err, const char *what) {
    Flac *f = e->codec;

    return enc_fail(e, err, what, FLAC__StreamEncoderStateString[
                        FLAC__stream_encoder_get_state(f->enc)]);
}

static int flac_open(AudioEncoder *e, Err *err) {
    Flac                          *f = calloc(1, sizeof(*f));
    FLAC__StreamEncoderInitStatus  st;
    FLAC__bool                     ok;

    if (f == NULL) {
        return err_set(err, "flac encoder: out of memory");
    }
    e->codec = f;
    f->enc = FLAC__stream_encoder_new();
    if (f->enc == NULL) {
        return enc_fail(e, err, "FLAC__stream_encoder_new", "out of memory");
    }
    ok = FLAC__stream_encoder_set_channels(f->enc, 1)
         && FLAC__stream_encoder_set_bits_per_sample(f->enc, 16)
         && FLAC__stream_encoder_set_sample_rate(f->enc, (uint32_t) e->rate)
         && FLAC__stream_encoder_set_compression_level(f->enc, FLAC_LEVEL)
         && FLAC__stream_encoder_set_blocksize(f->enc, FLAC_BLOCK)
         && FLAC__stream_encoder_set_streamable_subset(f->enc, true)
         && FLAC__stream_encoder_set_total_samples_estimate(f->enc, 0);
    if (!ok) {
        return flac_fail(e, err, "FLAC__stream_encoder_set_*");
    }
    st = FLAC__stream_encoder_init_stream(f->enc, flac_out, NULL, NULL, NULL,
                                          e);
    if (st != FLAC__STREAM_ENCODER_INIT_STATUS_OK) {
        if (st == FLAC__STREAM_ENCODER_INIT_STATUS_ENCODER_ERROR) {
            return flac_fail(e, err, "FLAC__stream_encoder_init_stream");
        }
        return enc_fail(e, err, "FLAC__stream_encoder_init_stream",
                        FLAC__StreamEncoderInitStatusString[st]);
    }
    return 0;
}

static int flac_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                      Err *err) {
    Flac *f = e->codec;

    while (n > 0) {
        size_t k = n < FLAC_STEP ? n : FLAC_STEP;

        for (size_t i = 0; i < k; i++) {
            f->wide[i] = pcm[i];
        }
        if (!FLAC__stream_encoder_process_interleaved(f->enc, f->wide,
                                                      (uint32_t) k)) {
            return flac_fail(e, err, "FLAC__stream_encoder_process");
        }
        pcm += k;
        n -= k;
    }
    return 0;
}

static int flac_finish(AudioEncoder *e, Err *err) {
    Flac *f = e->codec;

    if (!FLAC__stream_encoder_finish(f->enc)) {
        return flac_fail(e, err, "FLAC__stream_encoder_finish");
    }
    return 0;
}

static void flac_free(AudioEncoder *e) {
    Flac *f = e->codec;

    /* delete finishes an unfinished stream: its output must not reach a
     * sink whose owner has moved on */
    e->refused = true;
    if (f != NULL) {
        if (f->enc != NULL) {
            FLAC__stream_encoder_delete(f->enc);
        }
        free(f);
    }
}

const EncoderOps enc_flac_ops = {
    "flac", flac_open, flac_write, flac_finish, flac_free,
};

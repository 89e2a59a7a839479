/* enc_opus.c -- Ogg Opus through libopusenc, fed at 24 kHz (a rate Opus
 * codes natively: the header says 24000, decoders play it at 48 kHz).
 *
 * libopusenc's defaults suit files, not streams: it holds 2 s of input
 * for its speech/music decision and up to 1 s of packets before it writes
 * a page. We set the decision delay to 0 and the muxing delay to 60 ms
 * (3 packets of 20 ms a page: the 27-byte page header costs ~10% of a
 * 32 kbps voice, where a page per packet would cost ~30%), so pages flow
 * while the speech is synthesized. The header pages (OpusHead, and
 * OpusTags with only the vendor string and no padding) are flushed at
 * open, so a client has its first bytes before the first sample.
 *
 * The serial number is fixed: a response is one logical stream, never
 * chained, and the same input then gives the same bytes (tests compare).
 * Memory: libopusenc's state and its page buffer; ope_encoder_write
 * copies into its own ring, so nothing per write on our side. */

#include <opusenc.h>
#include <stdlib.h>

#include "enc_impl.h"

#define OPUS_BPS       32000
#define OPUS_MUX_DELAY 2880     // 48 kHz samples (60 ms) before a page goes
#define OPUS_SERIAL    0x6f6d6e69   // "omni"

static int opus_page(void *ud, const unsigned char *p, opus_int32 n) {
    return enc_emit(ud, p, (size_t) n) != 0;
}

static int opus_close(void *ud) {
    return 0;
}

static const OpusEncCallbacks OPUS_CALLBACKS = { opus_page, opus_close };

static int opus_set(AudioEncoder *e, int rc, const char *what, Err *err) {
    return rc == OPE_OK ? 0 : enc_fail(e, err, what, ope_strerror(rc));
}

static int opus_open(AudioEncoder *e, Err *err) {
    OggOpusComments *tags = ope_comments_create();
    OggOpusEnc      *enc;
    int              rc;

    if (tags == NULL) {
        return enc_fail(e, err, "ope_comments_create", "out of memory");
    }
    enc = ope_encoder_create_callbacks(&OPUS_CALLBACKS, e, tags, e->rate, 1,
                                       0, &rc);
    ope_comments_destroy(tags);     // the encoder keeps a copy
    if (enc == NULL) {
        return enc_fail(e, err, "ope_encoder_create_callbacks",
                        ope_strerror(rc));
    }
    e->codec = enc;
    if (opus_set(e, ope_encoder_ctl(enc, OPE_SET_DECISION_DELAY(0)),
                 "OPE_SET_DECISION_DELAY", err) != 0
        || opus_set(e, ope_encoder_ctl(enc,
                    OPE_SET_MUXING_DELAY(OPUS_MUX_DELAY)),
                    "OPE_SET_MUXING_DELAY", err) != 0
        || opus_set(e, ope_encoder_ctl(enc, OPE_SET_COMMENT_PADDING(0)),
                    "OPE_SET_COMMENT_PADDING", err) != 0
        || opus_set(e, ope_encoder_ctl(enc, OPE_SET_SERIALNO(OPUS_SERIAL)),
                    "OPE_SET_SERIALNO", err) != 0
        || opus_set(e, ope_encoder_ctl(enc, OPUS_SET_BITRATE(OPUS_BPS)),
                    "OPUS_SET_BITRATE", err) != 0
        || opus_set(e, ope_encoder_ctl(enc,
                    OPUS_SET_SIGNAL(OPUS_SIGNAL_VOICE)),
                    "OPUS_SET_SIGNAL", err) != 0)
    {
        return -1;
    }
    return opus_set(e, ope_encoder_flush_header(enc),
                    "ope_encoder_flush_header", err);
}

static int opus_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                      Err *err) {
    while (n > 0) {
        int k = n < 48000 ? (int) n : 48000;

        if (opus_set(e, ope_encoder_write(e->codec, pcm, k),
                     "ope_encoder_write", err) != 0) {
            return -1;
        }
        pcm += k;
        n -= (size_t) k;
    }
    return 0;
}

/* libopusenc 0.2.1's drain of a stream that was given no sample reads
 * state it never set (it asserted in about half of our runs): an empty
 * stream gets one sample of silence, 42 microseconds, instead. */
static int opus_finish(AudioEncoder *e, Err *err) {
    static const int16_t silence[1];

    if (e->n_in == 0 && opus_write(e, silence, 1, err) != 0) {
        return -1;
    }
    return opus_set(e, ope_encoder_drain(e->codec), "ope_encoder_drain",
                    err);
}

static void opus_free(AudioEncoder *e) {
    if (e->codec != NULL) {
        ope_encoder_destroy(e->codec);
    }
}

const EncoderOps enc_opus_ops = {
    "opus", opus_open, opus_write, opus_finish, opus_free,
};

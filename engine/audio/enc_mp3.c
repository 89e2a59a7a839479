/* enc_mp3.c -- MP3 through libmp3lame: 24 kHz mono is MPEG-2 Layer III
 * (576 samples a frame), CBR 64 kbps, no ID3 or Xing/LAME tag, so the
 * stream starts with a frame sync (FF F3, as OpenAI's does) and may be
 * cut anywhere between frames.
 *
 * lame takes any number of samples and returns the frames it completed;
 * we feed it at most MP3_STEP samples a call so that the output buffer,
 * sized at open from lame's own bound (1.25 n + 7200 bytes), always
 * suffices. Memory: lame's state plus that buffer, nothing per write. */

#include <lame/lame.h>
#include <stdlib.h>

#include "enc_impl.h"

#define MP3_KBPS  64
#define MP3_STEP  4608                        // samples per lame call
#define MP3_BUF   (MP3_STEP * 5 / 4 + 7200)   // lame.h's worst case

typedef struct {
    lame_global_flags *lame;                // owned
    uint8_t            buf[MP3_BUF];        // one call's output
} Mp3;

static const char *lame_why(int rc) {
    switch (rc) {
    case -1: return "mp3buf was too small";
    case -2: return "malloc() problem";
    case -3: return "lame_init_params() not called";
    case -4: return "psycho acoustic problem";
    default: return "unknown error";
    }
}

static int mp3_open(AudioEncoder *e, Err *err) {
    Mp3 *m = calloc(1, sizeof(*m));

    if (m == NULL) {
        return err_set(err, "mp3 encoder: out of memory");
    }
    e->codec = m;
    m->lame = lame_init();
    if (m->lame == NULL) {
        return enc_fail(e, err, "lame_init", "out of memory");
    }
    lame_set_num_channels(m->lame, 1);
    lame_set_mode(m->lame, MONO);
    lame_set_in_samplerate(m->lame, e->rate);
    lame_set_out_samplerate(m->lame, e->rate);
    lame_set_brate(m->lame, MP3_KBPS);
    lame_set_VBR(m->lame, vbr_off);
    lame_set_bWriteVbrTag(m->lame, 0);
    lame_set_write_id3tag_automatic(m->lame, 0);
    if (lame_init_params(m->lame) < 0) {
        return enc_fail(e, err, "lame_init_params", "rate not supported");
    }
    return 0;
}

static int mp3_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                     Err *err) {
    Mp3 *m = e->codec;

    while (n > 0) {
        int k = n < MP3_STEP ? (int) n : MP3_STEP;
        /* mono: lame reads the left buffer only */
        int rc = lame_encode_buffer(m->lame, pcm, NULL, k, m->buf,
                                    sizeof(m->buf));

        if (rc < 0) {
            return enc_fail(e, err, "lame_encode_buffer", lame_why(rc));
        }
        if (enc_emit(e, m->buf, (size_t) rc) != 0) {
            return enc_fail(e, err, "write", "");
        }
        pcm += k;
        n -= (size_t) k;
    }
    return 0;
}

static int mp3_finish(AudioEncoder *e, Err *err) {
    Mp3 *m = e->codec;
    int  rc = lame_encode_flush(m->lame, m->buf, sizeof(m->buf));

    if (rc < 0) {
        return enc_fail(e, err, "lame_encode_flush", lame_why(rc));
    }
    if (enc_emit(e, m->buf, (size_t) rc) != 0) {
        return enc_fail(e, err, "write", "");
    }
    return 0;
}

static void mp3_free(AudioEncoder *e) {
    Mp3 *m = e->codec;

    if (m != NULL) {
        if (m->lame != NULL) {
            lame_close(m->lame);
        }
        free(m);
    }
}

const EncoderOps enc_mp3_ops = {
    "mp3", mp3_open, mp3_write, mp3_finish, mp3_free,
};

/* encode.c -- the encoder handle: open/write/finish/free dispatched to a
 * format's EncoderOps (enc_*.c), the sink path with its "output refused",
 * and the two formats that need no codec: WAV (OpenAI's streamed 44-byte
 * header, then samples) and raw PCM (s16le, a copy).
 *
 * The handle enforces the call order once for every format: a failed
 * call leaves the encoder broken (only free is allowed), and nothing may
 * be written after finish. */

#include <stdlib.h>
#include <string.h>

#include "enc_impl.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "WAV and PCM pass s16 samples through as they lie in memory (LE)"
#endif

#define WAV_HEADER 44

static const EncoderOps wav_ops, pcm_ops;

static const EncoderOps *const FORMAT_OPS[AUDIO_N_FORMATS] = {
    [AUDIO_MP3]  = &enc_mp3_ops,
    [AUDIO_OPUS] = &enc_opus_ops,
    [AUDIO_AAC]  = &enc_aac_ops,
    [AUDIO_FLAC] = &enc_flac_ops,
    [AUDIO_WAV]  = &wav_ops,
    [AUDIO_PCM]  = &pcm_ops,
};


/* ---- the handle ---- */

/* An op's return, checked once more for a refusal the library swallowed
 * (libopusenc ignores its write callback's error). */
static int op_result(AudioEncoder *e, int rc, Err *err) {
    if (rc == 0 && e->refused) {
        return enc_fail(e, err, "write", "");
    }
    return rc;
}

AudioEncoder *audio_encoder_open(AudioFormat f, int rate, AudioSink sink,
                                 void *ud, Err *err) {
    AudioEncoder *e;

    if ((unsigned) f >= AUDIO_N_FORMATS) {
        err_set(err, "audio encoder: unknown format %d", (int) f);
        return NULL;
    }
    if (rate < 8000 || rate > 192000 || sink == NULL) {
        err_set(err, "audio encoder %s: bad rate %d or no sink",
                FORMAT_OPS[f]->name, rate);
        return NULL;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        err_set(err, "audio encoder %s: out of memory", FORMAT_OPS[f]->name);
        return NULL;
    }
    e->ops = FORMAT_OPS[f];
    e->format = f;
    e->rate = rate;
    e->sink = sink;
    e->ud = ud;
    if (op_result(e, e->ops->open(e, err), err) != 0) {
        audio_encoder_free(e);
        return NULL;
    }
    return e;
}

static int encoder_usable(AudioEncoder *e, Err *err) {
    if (e->broken) {
        return err_set(err, "%s encoder: used after a failure", e->ops->name);
    }
    if (e->finished) {
        return err_set(err, "%s encoder: used after finish", e->ops->name);
    }
    return 0;
}

int audio_encoder_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                        Err *err) {
    if (encoder_usable(e, err) != 0) {
        return -1;
    }
    if (n == 0) {
        return 0;
    }
    if (op_result(e, e->ops->write(e, pcm, n, err), err) != 0) {
        e->broken = true;
        return -1;
    }
    e->n_in += n;
    return 0;
}

int audio_encoder_finish(AudioEncoder *e, Err *err) {
    if (encoder_usable(e, err) != 0) {
        return -1;
    }
    e->finished = true;
    if (e->ops->finish != NULL
        && op_result(e, e->ops->finish(e, err), err) != 0) {
        e->broken = true;
        return -1;
    }
    return 0;
}

void audio_encoder_free(AudioEncoder *e) {
    if (e == NULL) {
        return;
    }
    if (e->ops->free != NULL) {
        e->ops->free(e);
    }
    free(e);
}

int enc_emit(AudioEncoder *e, const uint8_t *p, size_t n) {
    if (n == 0) {
        return 0;
    }
    if (e->refused || e->sink(e->ud, p, n) != 0) {
        e->refused = true;
        return -1;
    }
    return 0;
}

int enc_fail(AudioEncoder *e, Err *err, const char *what, const char *why) {
    if (e->refused) {
        return err_set(err, "%s encoder: output refused", e->ops->name);
    }
    return err_set(err, "%s encoder: %s failed: %s", e->ops->name, what, why);
}


/* ---- WAV and PCM ---- */

static void put_le16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t) v;
    p[1] = (uint8_t) (v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v) {
    put_le16(p, (uint16_t) v);
    put_le16(p + 2, (uint16_t) (v >> 16));
}

/* openai-api.md 7.2: canonical PCM header, both sizes 0xFFFFFFFF. */
static int wav_open(AudioEncoder *e, Err *err) {
    uint8_t h[WAV_HEADER];

    memcpy(h, "RIFF\xff\xff\xff\xffWAVEfmt ", 16);
    put_le32(h + 16, 16);                       // fmt chunk size
    put_le16(h + 20, 1);                        // integer PCM
    put_le16(h + 22, 1);                        // mono
    put_le32(h + 24, (uint32_t) e->rate);
    put_le32(h + 28, (uint32_t) e->rate * 2);   // byte rate
    put_le16(h + 32, 2);                        // block align
    put_le16(h + 34, 16);                       // bits per sample
    memcpy(h + 36, "data\xff\xff\xff\xff", 8);
    if (enc_emit(e, h, sizeof(h)) != 0) {
        return enc_fail(e, err, "header", "");
    }
    return 0;
}

static int raw_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                     Err *err) {
    if (enc_emit(e, (const uint8_t *) pcm, n * sizeof(*pcm)) != 0) {
        return enc_fail(e, err, "write", "");
    }
    return 0;
}

static int pcm_open(AudioEncoder *e, Err *err) {
    return 0;
}

static const EncoderOps wav_ops = {
    "wav", wav_open, raw_write, NULL, NULL,
};

static const EncoderOps pcm_ops = {
    "pcm", pcm_open, raw_write, NULL, NULL,
};

int audio_wav_patch(uint8_t *p, size_t len) {
    uint8_t h[WAV_HEADER];
    size_t  data;

    if (len < WAV_HEADER || len - 8 > UINT32_MAX) {
        return -1;
    }
    memcpy(h, p, sizeof(h));
    put_le32(h + 4, 0xFFFFFFFFu);
    put_le32(h + 40, 0xFFFFFFFFu);
    if (memcmp(h, "RIFF\xff\xff\xff\xffWAVEfmt \x10\0\0\0\x01\0\x01\0", 24)
        != 0 || memcmp(h + 32, "\x02\0\x10\0data\xff\xff\xff\xff", 12) != 0)
    {
        return -1;
    }
    data = len - WAV_HEADER;
    if (data % 2 != 0) {
        return -1;
    }
    put_le32(p + 4, (uint32_t) (len - 8));
    put_le32(p + 40, (uint32_t) data);
    return 0;
}

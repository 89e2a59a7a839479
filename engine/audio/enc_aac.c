/* enc_aac.c -- AAC-LC in ADTS through FFmpeg's native encoder
 * (libavcodec "aac"): fltp input, 24 kHz mono, 64 kbps. The codec takes
 * frames of exactly frame_size (1024) samples, all but the last: we fill
 * one AVFrame, allocated at open, and send it when full. Each packet
 * leaves as one sink call: the 7-byte ADTS header (no CRC), written from
 * the AudioSpecificConfig the codec put in extradata, then the raw frame.
 *
 * FFmpeg logs to stderr by default; its messages go to our log instead
 * (av_log_set_callback, once per process): its errors as warnings (the
 * failing call's error, with context, is what reports a failure), its
 * warnings as debug (e.g. "frames left in the queue" when a cancelled
 * request's encoder is freed unfinished).
 * Memory: the codec context, one frame and one packet, allocated at open;
 * libavcodec allocates each packet's payload itself. */

#include <libavcodec/avcodec.h>
#include <libavutil/channel_layout.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "enc_impl.h"

#define AAC_BPS     64000
#define ADTS_HEADER 7
#define ADTS_MAX    8191            // 13-bit frame length, header included

typedef struct {
    AVCodecContext *ctx;            // owned
    AVFrame        *frame;          // (frame_size,) fltp, owned
    AVPacket       *pkt;            // owned
    int             fill;           // samples in frame
    int64_t         pts;            // samples sent so far
    uint8_t         adts[3];        // ADTS bytes 2..3 fixed by the ASC
    uint8_t         out[ADTS_MAX];  // header + one packet
} Aac;

static void av_to_log(void *avcl, int level, const char *fmt, va_list ap) {
    char line[256];

    if (level > AV_LOG_WARNING) {
        return;
    }
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    log_msg(level <= AV_LOG_ERROR ? LOG_WARN : LOG_DEBUG, "libavcodec: %s",
            line);
}

static void av_log_route(void) {
    av_log_set_callback(av_to_log);
}

static int aac_averr(AudioEncoder *e, Err *err, const char *what, int rc) {
    char why[AV_ERROR_MAX_STRING_SIZE];

    av_strerror(rc, why, sizeof(why));
    return enc_fail(e, err, what, why);
}

/* The AudioSpecificConfig's object type, frequency index and channel
 * configuration, as the ADTS header's profile/index/channel bits. */
static int aac_adts_fields(AudioEncoder *e, Err *err) {
    Aac           *a = e->codec;
    const uint8_t *x = a->ctx->extradata;
    int            object, freq, chan;

    if (x == NULL || a->ctx->extradata_size < 2) {
        return enc_fail(e, err, "avcodec_open2", "no AudioSpecificConfig");
    }
    object = x[0] >> 3;
    freq = ((x[0] & 7) << 1) | (x[1] >> 7);
    chan = (x[1] >> 3) & 0xF;
    if (object < 1 || object > 4 || freq > 12 || chan > 7) {
        return enc_fail(e, err, "avcodec_open2", "unexpected AudioSpecificConfig");
    }
    a->adts[0] = (uint8_t) (((object - 1) << 6) | (freq << 2) | (chan >> 2));
    a->adts[1] = (uint8_t) ((chan & 3) << 6);
    return 0;
}

static int aac_open(AudioEncoder *e, Err *err) {
    static pthread_once_t  routed = PTHREAD_ONCE_INIT;
    const AVCodec         *codec;
    Aac                   *a;
    int                    rc;

    pthread_once(&routed, av_log_route);
    codec = avcodec_find_encoder(AV_CODEC_ID_AAC);
    if (codec == NULL) {
        return enc_fail(e, err, "avcodec_find_encoder", "no AAC encoder");
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return err_set(err, "aac encoder: out of memory");
    }
    e->codec = a;
    a->ctx = avcodec_alloc_context3(codec);
    a->frame = av_frame_alloc();
    a->pkt = av_packet_alloc();
    if (a->ctx == NULL || a->frame == NULL || a->pkt == NULL) {
        return enc_fail(e, err, "avcodec_alloc_context3", "out of memory");
    }
    a->ctx->sample_fmt = AV_SAMPLE_FMT_FLTP;
    a->ctx->sample_rate = e->rate;
    a->ctx->bit_rate = AAC_BPS;
    a->ctx->time_base = (AVRational) { 1, e->rate };
    a->ctx->profile = FF_PROFILE_AAC_LOW;
    av_channel_layout_default(&a->ctx->ch_layout, 1);
    /* extradata (the ASC) is what we build ADTS headers from */
    a->ctx->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    rc = avcodec_open2(a->ctx, codec, NULL);
    if (rc < 0) {
        return aac_averr(e, err, "avcodec_open2", rc);
    }
    a->frame->format = AV_SAMPLE_FMT_FLTP;
    a->frame->nb_samples = a->ctx->frame_size;
    a->frame->sample_rate = e->rate;
    rc = av_channel_layout_copy(&a->frame->ch_layout, &a->ctx->ch_layout);
    if (rc < 0 || (rc = av_frame_get_buffer(a->frame, 0)) < 0) {
        return aac_averr(e, err, "av_frame_get_buffer", rc);
    }
    return aac_adts_fields(e, err);
}

/* Sends every packet the codec has ready. */
static int aac_drain(AudioEncoder *e, Err *err) {
    Aac *a = e->codec;
    int  rc;

    while ((rc = avcodec_receive_packet(a->ctx, a->pkt)) == 0) {
        size_t len = ADTS_HEADER + (size_t) a->pkt->size;

        if (len > ADTS_MAX) {
            av_packet_unref(a->pkt);
            return enc_fail(e, err, "ADTS framing", "packet too large");
        }
        memcpy(a->out, "\xff\xf1", 2);
        a->out[2] = a->adts[0];
        a->out[3] = (uint8_t) (a->adts[1] | (len >> 11));
        a->out[4] = (uint8_t) (len >> 3);
        a->out[5] = (uint8_t) (((len & 7) << 5) | 0x1F);
        a->out[6] = 0xFC;           // buffer fullness 0x7FF: VBR; 1 frame
        memcpy(a->out + ADTS_HEADER, a->pkt->data, (size_t) a->pkt->size);
        av_packet_unref(a->pkt);
        if (enc_emit(e, a->out, len) != 0) {
            return enc_fail(e, err, "write", "");
        }
    }
    if (rc != AVERROR(EAGAIN) && rc != AVERROR_EOF) {
        return aac_averr(e, err, "avcodec_receive_packet", rc);
    }
    return 0;
}

/* Sends the frame's fill samples (a short frame only at the end). */
static int aac_send(AudioEncoder *e, Err *err) {
    Aac *a = e->codec;
    int  rc;

    a->frame->nb_samples = a->fill;
    a->frame->pts = a->pts;
    a->pts += a->fill;
    a->fill = 0;
    rc = avcodec_send_frame(a->ctx, a->frame);
    if (rc < 0) {
        return aac_averr(e, err, "avcodec_send_frame", rc);
    }
    return aac_drain(e, err);
}

static int aac_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                     Err *err) {
    Aac *a = e->codec;
    int  rc;

    for (size_t i = 0; i < n; i++) {
        /* the codec dropped its reference to the last frame when it
         * encoded it, so this never copies */
        if (a->fill == 0 && (rc = av_frame_make_writable(a->frame)) < 0) {
            return aac_averr(e, err, "av_frame_make_writable", rc);
        }
        ((float *) a->frame->data[0])[a->fill++] = pcm[i] / 32768.0f;
        if (a->fill == a->ctx->frame_size && aac_send(e, err) != 0) {
            return -1;
        }
    }
    return 0;
}

static int aac_finish(AudioEncoder *e, Err *err) {
    Aac *a = e->codec;
    int  rc;

    if (a->fill > 0 && aac_send(e, err) != 0) {
        return -1;
    }
    rc = avcodec_send_frame(a->ctx, NULL);
    if (rc < 0) {
        return aac_averr(e, err, "avcodec_send_frame (flush)", rc);
    }
    return aac_drain(e, err);
}

static void aac_free(AudioEncoder *e) {
    Aac *a = e->codec;

    if (a != NULL) {
        avcodec_free_context(&a->ctx);
        av_frame_free(&a->frame);
        av_packet_free(&a->pkt);
        free(a);
    }
}

const EncoderOps enc_aac_ops = {
    "aac", aac_open, aac_write, aac_finish, aac_free,
};

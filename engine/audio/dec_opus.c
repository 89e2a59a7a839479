/* dec_opus.c -- Ogg Opus through libopusfile, decoded at 48 kHz (Opus's
 * own rate; decode.c resamples), pre-skip and end padding trimmed by
 * opusfile from the granule positions, so the length is exact.
 *
 * The source is opened as an unseekable stream over the caller's memory
 * (op_open_callbacks with a read callback only), not with op_open_memory:
 * a seekable open bisects the file for every chained link at open and
 * keeps one OggOpusLink (headers and tags) per link, which a crafted file
 * of many tiny links makes proportional to its size. Unseekable, opusfile
 * reads front to back and holds the current link only; chained links
 * play one after the other, each with its own channel count (every piece
 * says its own; more than 8 is refused).
 *
 * Each piece is what op_read_float gives into f->pcm: at most OPUS_PIECE
 * frames of up to 8 channels (61 KB); opusfile keeps the rest of a packet
 * (at most 120 ms) in its own buffer. A hole in the stream (missing or
 * corrupt pages, OP_HOLE) is an error with the byte position: a damaged
 * upload is refused rather than transcribed with a gap. A file cut inside
 * a page ends at the last whole page. Memory: opusfile's and libogg's
 * state (one page, and one packet, which libogg assembles whole: a
 * crafted packet spanning many pages makes that buffer as large as the
 * file, which the caller already bounds), plus f->pcm. */

#include <opusfile.h>
#include <stdlib.h>
#include <string.h>

#include "dec_impl.h"

#define OPUS_RATE  48000
#define OPUS_PIECE 1920                 // 40 ms at 48 kHz

typedef struct {
    OggOpusFile *of;                    // owned
    size_t       at;                    // bytes of the file given to opusfile
    float        pcm[OPUS_PIECE * DEC_MAX_CHANNELS];    // one piece
} Opus;

static int opus_read(void *ud, unsigned char *dst, int k) {
    AudioDecoder *d = ud;
    Opus         *o = d->codec;
    size_t        n = (size_t) (k > 0 ? k : 0);

    n = n < d->len - o->at ? n : d->len - o->at;
    memcpy(dst, d->data + o->at, n);
    o->at += n;
    return (int) n;
}

static const char *opus_why(int rc) {
    switch (rc) {
    case OP_HOLE:          return "missing or corrupt data";
    case OP_EREAD:         return "read failed";
    case OP_EFAULT:        return "out of memory or internal error";
    case OP_EIMPL:         return "a feature opusfile lacks";
    case OP_ENOTFORMAT:    return "not an Ogg Opus stream";
    case OP_EBADHEADER:    return "bad header packet";
    case OP_EVERSION:      return "unknown OpusHead version";
    case OP_EBADPACKET:    return "bad packet";
    case OP_EBADLINK:      return "bad link";
    case OP_EBADTIMESTAMP: return "bad timestamp";
    default:               return "decoder error";
    }
}

static int opus_open(AudioDecoder *d, Err *err) {
    OpusFileCallbacks cb = { opus_read, NULL, NULL, NULL };
    Opus             *o = calloc(1, sizeof(*o));
    int               rc;

    if (o == NULL) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    d->codec = o;
    o->of = op_open_callbacks(d, &cb, NULL, 0, &rc);
    if (o->of == NULL) {
        /* an Ogg file that ends before its headers do reads as "no Opus
         * stream in it" to opusfile */
        if (o->at >= d->len && d->len >= 4 && memcmp(d->data, "OggS", 4) == 0
            && (rc == OP_ENOTFORMAT || rc == OP_EBADHEADER)) {
            return err_set(err, "truncated header");
        }
        return err_set(err, "%s", opus_why(rc));
    }
    d->rate = OPUS_RATE;
    d->channels = op_channel_count(o->of, -1);
    return 0;
}

static int opus_next(AudioDecoder *d, Piece *pc, Err *err) {
    Opus       *o = d->codec;
    int         li, n, ch;
    opus_int64  at;

    n = op_read_float(o->of, o->pcm, OPUS_PIECE * DEC_MAX_CHANNELS, &li);
    if (n == 0) {
        return 0;
    }
    if (n < 0) {
        at = op_raw_tell(o->of);
        return err_set(err, "%s near byte %lld", opus_why(n),
                       (long long) (at >= 0 ? at : (opus_int64) o->at));
    }
    ch = op_channel_count(o->of, li);
    if (ch < 1 || ch > DEC_MAX_CHANNELS) {
        return err_set(err, "%d channels (1..%d supported)", ch,
                       DEC_MAX_CHANNELS);
    }
    pc->p = (const uint8_t *) o->pcm;
    pc->frames = (size_t) n;
    pc->channels = ch;
    pc->type = SAMPLE_F32;
    pc->bits = 0;
    return 1;
}

static void opus_free(AudioDecoder *d) {
    Opus *o = d->codec;

    if (o != NULL) {
        if (o->of != NULL) {
            op_free(o->of);
        }
        free(o);
    }
}

const DecoderOps dec_opus_ops = {
    "opus", opus_open, opus_next, opus_free,
};

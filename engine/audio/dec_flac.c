/* dec_flac.c -- native FLAC through libFLAC's stream decoder, reading the
 * caller's memory through its read callback (no seek callback: decoding
 * runs front to back, and libFLAC then never looks at the end). libFLAC
 * skips an ID3v2 tag before "fLaC" itself, and every metadata block but
 * STREAMINFO unread into memory (no metadata_respond).
 *
 * Each piece is one FLAC frame: the write callback gets it as one int32
 * array per channel, valid only during the call, so it is interleaved
 * into f->block (SAMPLE_I32 with the frame's bits per sample). That
 * buffer grows to the largest frame seen, at most 65535 samples x 8
 * channels (2 MiB), the format's own bound; at 4096-sample blocks of
 * stereo it is 32 KB.
 *
 * libFLAC reports a corrupt frame (lost sync, bad header, CRC mismatch)
 * to its error callback and carries on; we stop at the first, with its
 * byte position: a damaged upload is refused rather than transcribed with
 * holes. A file cut inside a frame ends at the last whole frame (libFLAC
 * reaches the end while reading it and reports no error). A frame whose
 * rate differs from STREAMINFO's is refused. MD5 is not checked (the
 * sum covers the whole file, which would be known bad only at the end). */

#include <FLAC/stream_decoder.h>
#include <stdlib.h>
#include <string.h>

#include "dec_impl.h"

#define FLAC_STUCK 64   // process_single calls in a row without progress

typedef struct {
    FLAC__StreamDecoder *dec;           // owned
    size_t               at;            // bytes of the file given to libFLAC
    int32_t             *block;         // (block_cap,) the last frame,
    size_t               block_cap;     //   interleaved, owned
    size_t               frames;        // in block
    int                  channels, bits;
    bool                 have_frame;    // the write callback ran
    bool                 have_info;     // STREAMINFO was read
    const char          *error;         // the first error, static text
    uint64_t             error_at;      // its byte position
} Flac;

static FLAC__StreamDecoderReadStatus flac_read(const FLAC__StreamDecoder *fd,
        FLAC__byte *buf, size_t *n, void *ud) {
    AudioDecoder *d = ud;
    Flac         *f = d->codec;
    size_t        k = *n < d->len - f->at ? *n : d->len - f->at;

    memcpy(buf, d->data + f->at, k);
    f->at += k;
    *n = k;
    return k == 0 ? FLAC__STREAM_DECODER_READ_STATUS_END_OF_STREAM
                  : FLAC__STREAM_DECODER_READ_STATUS_CONTINUE;
}

static FLAC__StreamDecoderTellStatus flac_tell(const FLAC__StreamDecoder *fd,
        FLAC__uint64 *at, void *ud) {
    AudioDecoder *d = ud;

    *at = ((Flac *) d->codec)->at;
    return FLAC__STREAM_DECODER_TELL_STATUS_OK;
}

static void flac_error_at(AudioDecoder *d, const char *what) {
    Flac         *f = d->codec;
    FLAC__uint64  pos;

    if (f->error == NULL) {
        f->error = what;
        f->error_at = FLAC__stream_decoder_get_decode_position(f->dec, &pos)
                      ? pos : f->at;
    }
}

/* Interleaves the frame into f->block, growing it to the frame's size. */
static FLAC__StreamDecoderWriteStatus flac_write(const FLAC__StreamDecoder *fd,
        const FLAC__Frame *fr, const FLAC__int32 *const ch[], void *ud) {
    AudioDecoder *d = ud;
    Flac         *f = d->codec;
    size_t        n = fr->header.blocksize, c = fr->header.channels;

    if ((int) fr->header.sample_rate != d->rate) {
        flac_error_at(d, "sample rate changes mid-stream");
        return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
    }
    if (n * c > f->block_cap) {
        int32_t *b = realloc(f->block, n * c * sizeof(*b));

        if (b == NULL) {
            d->oom = true;
            return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
        }
        f->block = b;
        f->block_cap = n * c;
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < c; k++) {
            f->block[i * c + k] = ch[k][i];
        }
    }
    f->frames = n;
    f->channels = (int) c;
    f->bits = (int) fr->header.bits_per_sample;
    f->have_frame = true;
    return FLAC__STREAM_DECODER_WRITE_STATUS_CONTINUE;
}

static void flac_metadata(const FLAC__StreamDecoder *fd,
                          const FLAC__StreamMetadata *md, void *ud) {
    AudioDecoder *d = ud;
    Flac         *f = d->codec;

    if (md->type == FLAC__METADATA_TYPE_STREAMINFO && !f->have_info) {
        d->rate = (int) md->data.stream_info.sample_rate;
        d->channels = (int) md->data.stream_info.channels;
        f->have_info = true;
    }
}

static void flac_error(const FLAC__StreamDecoder *fd,
                       FLAC__StreamDecoderErrorStatus st, void *ud) {
    switch (st) {
    case FLAC__STREAM_DECODER_ERROR_STATUS_LOST_SYNC:
        flac_error_at(ud, "lost sync");
        break;
    case FLAC__STREAM_DECODER_ERROR_STATUS_BAD_HEADER:
        flac_error_at(ud, "bad frame header");
        break;
    case FLAC__STREAM_DECODER_ERROR_STATUS_FRAME_CRC_MISMATCH:
        flac_error_at(ud, "frame CRC mismatch");
        break;
    default:
        flac_error_at(ud, "unparseable stream");
        break;
    }
}

/* err after a libFLAC call failed or reported an error; d->oom is set
 * only by our own allocations (flac_write's block). */
static int flac_fail(AudioDecoder *d, Err *err) {
    Flac                    *f = d->codec;
    FLAC__StreamDecoderState st = FLAC__stream_decoder_get_state(f->dec);

    if (d->oom) {
        return err_set(err, "out of memory");
    }
    /* libFLAC sets this state for short metadata blocks too (an
     * APPLICATION block under 4 bytes): that is the file's fault as
     * often as memory's, and answering 503 to a crafted file would be
     * worse than 400 to a real shortage */
    if (st == FLAC__STREAM_DECODER_MEMORY_ALLOCATION_ERROR) {
        return err_set(err, "corrupt metadata or out of memory at byte %zu",
                       f->at);
    }
    if (f->error != NULL) {
        return err_set(err, "%s at byte %llu", f->error,
                       (unsigned long long) f->error_at);
    }
    return err_set(err, "decoder failed: %s",
                   FLAC__StreamDecoderStateString[st]);
}

static int flac_open(AudioDecoder *d, Err *err) {
    FLAC__StreamDecoderInitStatus st;
    Flac                         *f = calloc(1, sizeof(*f));

    if (f == NULL) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    d->codec = f;
    if ((f->dec = FLAC__stream_decoder_new()) == NULL) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    st = FLAC__stream_decoder_init_stream(f->dec, flac_read, NULL, flac_tell,
                                          NULL, NULL, flac_write,
                                          flac_metadata, flac_error, d);
    if (st != FLAC__STREAM_DECODER_INIT_STATUS_OK) {
        d->oom = st == FLAC__STREAM_DECODER_INIT_STATUS_MEMORY_ALLOCATION_ERROR;
        return err_set(err, "FLAC__stream_decoder_init_stream failed: %s",
                       FLAC__StreamDecoderInitStatusString[st]);
    }
    if (!FLAC__stream_decoder_process_until_end_of_metadata(f->dec)
        || f->error != NULL) {
        if (f->error == NULL && !d->oom && FLAC__stream_decoder_get_state(
                f->dec) == FLAC__STREAM_DECODER_END_OF_STREAM) {
            return err_set(err, "truncated header");
        }
        return flac_fail(d, err);
    }
    if (!f->have_info) {
        return err_set(err, f->at >= d->len ? "truncated header"
                                            : "no STREAMINFO");
    }
    return 0;
}

static int flac_next(AudioDecoder *d, Piece *pc, Err *err) {
    Flac                    *f = d->codec;
    FLAC__StreamDecoderState st;
    size_t                   at = 0;

    /* a call decodes a frame, reads a metadata block or skips to the next
     * sync; FLAC_STUCK calls in a row that read nothing mean a bug, not a
     * file, and end it */
    f->have_frame = false;
    for (int idle = 0; !f->have_frame; idle = f->at == at ? idle + 1 : 0) {
        st = FLAC__stream_decoder_get_state(f->dec);
        if (st == FLAC__STREAM_DECODER_END_OF_STREAM) {
            return 0;
        }
        if (idle >= FLAC_STUCK) {
            return err_set(err, "decoder stuck at byte %zu", f->at);
        }
        at = f->at;
        if (!FLAC__stream_decoder_process_single(f->dec)
            || f->error != NULL) {
            return flac_fail(d, err);
        }
    }
    pc->p = (const uint8_t *) f->block;
    pc->frames = f->frames;
    pc->channels = f->channels;
    pc->type = SAMPLE_I32;
    pc->bits = f->bits;
    return 1;
}

static void flac_free(AudioDecoder *d) {
    Flac *f = d->codec;

    if (f != NULL) {
        if (f->dec != NULL) {
            FLAC__stream_decoder_delete(f->dec);
        }
        free(f->block);
        free(f);
    }
}

const DecoderOps dec_flac_ops = {
    "flac", flac_open, flac_next, flac_free,
};

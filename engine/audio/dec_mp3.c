/* dec_mp3.c -- MPEG audio (Layer III, and I/II, which libmpg123 decodes as
 * well) through libmpg123, reading the caller's memory with its replaced
 * reader (mpg123_replace_reader_handle): no copy of the file. Feed mode
 * (mpg123_feed) was rejected: it holds the last frame back, waiting for
 * a next header that never comes.
 *
 * Each piece is one MPEG frame, decoded by mpg123_decode_frame into
 * libmpg123's own buffer (s16, the stream's channels) and handed to
 * decode.c from there. ID3v2 tags are skipped unparsed (MPG123_SKIP_ID3V2:
 * a tag's text is not ours to allocate for). Gapless decoding is
 * libmpg123's default: with a LAME/Xing info frame the encoder delay and
 * padding are trimmed; without one (our own encoder writes none) the
 * decoder's 529 samples and the encoder's priming stay (README).
 *
 * libmpg123 resyncs over junk for up to MPG123_RESYNC_LIMIT bytes (1024)
 * and fails beyond; that failure is reported with the position of the
 * last frame it parsed: "corrupt frame at byte N". A file cut inside a
 * frame ends at the last whole frame (libmpg123 drops the rest). A rate
 * change mid-stream (two files glued together) is refused; a change of
 * channels is fine, since every piece says its own.
 *
 * mpg123_init is needed once per process by libmpg123 older than 1.27
 * (a no-op since): done under pthread_once, because decoders open on
 * several listener threads at once. Memory: libmpg123's handle (fixed
 * buffers, about 100 KB), nothing per frame. */

#include <mpg123.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dec_impl.h"

#define MP3_STUCK 64    // empty frames in a row without input read: a bug

typedef struct {
    mpg123_handle *mh;          // owned
    size_t         at;          // bytes of the file given to libmpg123
    int            channels;    // of the frames decoded now
} Mp3;

static pthread_once_t mp3_once = PTHREAD_ONCE_INIT;
static int            mp3_init_rc;      // written once, under mp3_once

static void mp3_init(void) {
    mp3_init_rc = mpg123_init();
}

static mpg123_ssize_t mp3_read(void *ud, void *dst, size_t k) {
    AudioDecoder *d = ud;
    Mp3          *m = d->codec;

    k = k < d->len - m->at ? k : d->len - m->at;
    memcpy(dst, d->data + m->at, k);
    m->at += k;
    return (mpg123_ssize_t) k;
}

static off_t mp3_seek(void *ud, off_t off, int whence) {
    AudioDecoder *d = ud;
    Mp3          *m = d->codec;
    off_t         base = whence == SEEK_SET ? 0
                       : whence == SEEK_CUR ? (off_t) m->at : (off_t) d->len;

    if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END) {
        return -1;
    }
    if (off < -base || off > (off_t) d->len - base) {
        return -1;
    }
    m->at = (size_t) (base + off);
    return (off_t) m->at;
}

/* err for the libmpg123 call that failed; marks d->oom when memory is
 * why. */
static int mp3_fail(AudioDecoder *d, Err *err) {
    Mp3 *m = d->codec;
    int  code = mpg123_errcode(m->mh);

    if (code == MPG123_OUT_OF_MEM) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    return err_set(err, "truncated or corrupt frame at byte %lld: %s",
                   (long long) mpg123_framepos(m->mh),
                   mpg123_plain_strerror(code));
}

/* The rate and channels of the stream's first or next format. */
static int mp3_format(AudioDecoder *d, Err *err) {
    Mp3  *m = d->codec;
    long  rate;
    int   ch, enc;

    if (mpg123_getformat(m->mh, &rate, &ch, &enc) != MPG123_OK) {
        return mp3_fail(d, err);
    }
    if (d->rate != 0 && rate != d->rate) {
        return err_set(err, "sample rate changes mid-stream (%d -> %ld Hz) "
                       "near byte %lld", d->rate, rate,
                       (long long) mpg123_framepos(m->mh));
    }
    d->rate = (int) rate;
    m->channels = ch;
    if (d->channels == 0) {
        d->channels = ch;
    }
    return 0;
}

/* Every rate libmpg123 knows, s16, the stream's own channels: the output
 * format is the stream's, never resampled or mixed by libmpg123. */
static int mp3_setup(AudioDecoder *d, Err *err) {
    Mp3        *m = d->codec;
    const long *rates;
    size_t      n_rates;

    if (mpg123_param(m->mh, MPG123_ADD_FLAGS,
                     MPG123_QUIET | MPG123_SKIP_ID3V2, 0) != MPG123_OK
        || mpg123_format_none(m->mh) != MPG123_OK) {
        return mp3_fail(d, err);
    }
    mpg123_rates(&rates, &n_rates);
    for (size_t i = 0; i < n_rates; i++) {
        if (mpg123_format(m->mh, rates[i], MPG123_MONO | MPG123_STEREO,
                          MPG123_ENC_SIGNED_16) != MPG123_OK) {
            return mp3_fail(d, err);
        }
    }
    if (mpg123_replace_reader_handle(m->mh, mp3_read, mp3_seek, NULL)
            != MPG123_OK
        || mpg123_open_handle(m->mh, d) != MPG123_OK) {
        return mp3_fail(d, err);
    }
    return 0;
}

/* Opening reads up to the first frame header: its format is the file's
 * rate and channels, and a file with no frame fails here. */
static int mp3_open(AudioDecoder *d, Err *err) {
    unsigned char *audio;
    size_t         bytes;
    off_t          num;
    Mp3           *m;
    int            rc;

    pthread_once(&mp3_once, mp3_init);
    if (mp3_init_rc != MPG123_OK) {
        return err_set(err, "mpg123_init failed: %s",
                       mpg123_plain_strerror(mp3_init_rc));
    }
    if ((m = calloc(1, sizeof(*m))) == NULL) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    d->codec = m;
    if ((m->mh = mpg123_new(NULL, &rc)) == NULL) {
        d->oom = rc == MPG123_OUT_OF_MEM;
        return err_set(err, "mpg123_new failed: %s",
                       mpg123_plain_strerror(rc));
    }
    if (mp3_setup(d, err) != 0) {
        return -1;
    }
    rc = mpg123_decode_frame(m->mh, &num, &audio, &bytes);
    if (rc == MPG123_NEW_FORMAT) {
        return mp3_format(d, err);
    }
    if (rc == MPG123_DONE) {
        return err_set(err, "no MPEG audio frame");
    }
    if (mpg123_errcode(m->mh) == MPG123_OUT_OF_MEM) {
        return mp3_fail(d, err);
    }
    return err_set(err, "no MPEG audio frame: %s",
                   mpg123_plain_strerror(mpg123_errcode(m->mh)));
}

static int mp3_next(AudioDecoder *d, Piece *pc, Err *err) {
    Mp3           *m = d->codec;
    unsigned char *audio;
    size_t         bytes, at;
    off_t          num;
    int            rc;

    /* every call parses a frame or skips junk, and libmpg123 ends with
     * MPG123_DONE at the end of the file; should it ever return empty
     * frames without reading on, MP3_STUCK of them end it */
    for (int empty = 0;; empty = m->at == at ? empty + 1 : 0) {
        at = m->at;
        if (empty >= MP3_STUCK) {
            return err_set(err, "decoder stuck at byte %zu", at);
        }
        rc = mpg123_decode_frame(m->mh, &num, &audio, &bytes);
        if (rc == MPG123_NEW_FORMAT) {
            if (mp3_format(d, err) != 0) {
                return -1;
            }
            continue;
        }
        if (rc == MPG123_DONE) {
            return 0;
        }
        if (rc != MPG123_OK) {
            return mp3_fail(d, err);
        }
        if (bytes >= sizeof(int16_t) * (size_t) m->channels) {
            break;
        }
    }
    pc->p = audio;
    pc->frames = bytes / (sizeof(int16_t) * (size_t) m->channels);
    pc->channels = m->channels;
    pc->type = SAMPLE_S16;
    pc->bits = 0;
    return 1;
}

static void mp3_free(AudioDecoder *d) {
    Mp3 *m = d->codec;

    if (m != NULL) {
        if (m->mh != NULL) {
            mpg123_delete(m->mh);
        }
        free(m);
    }
}

const DecoderOps dec_mp3_ops = {
    "mp3", mp3_open, mp3_next, mp3_free,
};

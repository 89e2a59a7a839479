/* audio_decode.c -- audio_decode.h: one function per decoder library, each
 * appending s16 frames to a growing buffer. Test code: it may allocate
 * freely, but must never crash on a bad file (every library's error is
 * checked and reported by name). */

#include <math.h>
#include <mpg123.h>
#include <neaacdec.h>
#include <opusfile.h>
#include <sndfile.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audio_decode.h"

typedef struct {
    char   *why;
    size_t  why_len;
} Why;

static int fail(Why *w, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(w->why, w->why_len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Appends frames (of d->channels samples) to d->pcm. */
static int append(AudioDecoded *d, const int16_t *s, size_t frames,
                  size_t *cap, Why *w) {
    size_t need = (d->pcm_frames + frames) * (size_t) d->channels;

    if (need > *cap) {
        size_t   c = *cap ? *cap : 65536;
        int16_t *p;

        while (c < need) {
            c *= 2;
        }
        p = realloc(d->pcm, c * sizeof(*p));
        if (p == NULL) {
            return fail(w, "out of memory");
        }
        d->pcm = p;
        *cap = c;
    }
    memcpy(d->pcm + d->pcm_frames * (size_t) d->channels, s,
           frames * (size_t) d->channels * sizeof(*s));
    d->pcm_frames += frames;
    return 0;
}

/* Appends frames of `have` channels, keeping the first d->channels. */
static int append_first(AudioDecoded *d, const int16_t *s, size_t frames,
                        int have, size_t *cap, Why *w) {
    int16_t one[2];

    if (have == d->channels) {
        return append(d, s, frames, cap, w);
    }
    for (size_t i = 0; i < frames; i++) {
        memcpy(one, s + i * (size_t) have, sizeof(*one) * (size_t) d->channels);
        if (append(d, one, 1, cap, w) != 0) {
            return -1;
        }
    }
    return 0;
}


/* ---- mp3: libmpg123 reading the memory file (feed mode would hold back
 * the last frames, waiting for a next header that never comes) ---- */

typedef struct {
    const uint8_t *p;
    size_t         n, at;
} Mem;

static ssize_t mp3_read(void *ud, void *dst, size_t k) {
    Mem *m = ud;

    k = k < m->n - m->at ? k : m->n - m->at;
    memcpy(dst, m->p + m->at, k);
    m->at += k;
    return (ssize_t) k;
}

static off_t mp3_seek(void *ud, off_t off, int whence) {
    Mem   *m = ud;
    off_t  at = whence == SEEK_SET ? off
              : whence == SEEK_CUR ? (off_t) m->at + off : (off_t) m->n + off;

    if (at < 0 || at > (off_t) m->n) {
        return -1;
    }
    m->at = (size_t) at;
    return at;
}

static int decode_mp3(const uint8_t *p, size_t n, AudioDecoded *d, Why *w) {
    mpg123_handle *mh;
    const long    *rates;
    Mem            m = { p, n, 0 };
    size_t         n_rates, cap = 0, done;
    int16_t        buf[8192];
    int            rc, enc, ch;
    long           rate;

    if (mpg123_init() != MPG123_OK
        || (mh = mpg123_new(NULL, &rc)) == NULL) {
        return fail(w, "mp3: mpg123_new failed");
    }
    mpg123_param(mh, MPG123_ADD_FLAGS, MPG123_QUIET, 0);
    mpg123_format_none(mh);
    mpg123_rates(&rates, &n_rates);
    for (size_t i = 0; i < n_rates; i++) {
        mpg123_format(mh, rates[i], MPG123_MONO | MPG123_STEREO,
                      MPG123_ENC_SIGNED_16);
    }
    if (mpg123_replace_reader_handle(mh, mp3_read, mp3_seek, NULL)
            != MPG123_OK
        || mpg123_open_handle(mh, &m) != MPG123_OK) {
        rc = fail(w, "mp3: %s", mpg123_strerror(mh));
        mpg123_delete(mh);
        return rc;
    }
    for (;;) {
        rc = mpg123_read(mh, buf, sizeof(buf), &done);
        if (rc == MPG123_NEW_FORMAT) {
            mpg123_getformat(mh, &rate, &ch, &enc);
            if (d->channels != 0 && (d->channels != ch || d->rate != rate)) {
                rc = fail(w, "mp3: format changes mid-stream");
                break;
            }
            d->rate = d->pcm_rate = (int) rate;
            d->channels = ch;
            continue;
        }
        if (rc != MPG123_OK && rc != MPG123_DONE) {
            rc = fail(w, "mp3: %s", mpg123_strerror(mh));
            break;
        }
        /* the last samples come with MPG123_DONE */
        if (done > 0 && append(d, buf, done / 2 / (size_t) d->channels,
                               &cap, w) != 0) {
            rc = -1;
            break;
        }
        if (rc == MPG123_DONE) {
            rc = d->channels == 0 ? fail(w, "mp3: no MPEG audio frame") : 0;
            break;
        }
    }
    mpg123_close(mh);
    mpg123_delete(mh);
    return rc;
}


/* ---- opus: libopusfile (decodes at 48 kHz, trims pre-skip) ---- */

static int decode_opus(const uint8_t *p, size_t n, AudioDecoded *d, Why *w) {
    const OpusHead *head;
    OggOpusFile    *of;
    int16_t         buf[5760 * 2];
    size_t          cap = 0;
    int             rc, got;

    of = op_open_memory(p, n, &rc);
    if (of == NULL) {
        return fail(w, "opus: op_open_memory failed (error %d)", rc);
    }
    head = op_head(of, -1);
    d->channels = op_channel_count(of, -1);
    d->rate = head->input_sample_rate ? (int) head->input_sample_rate : 48000;
    d->pcm_rate = 48000;
    while ((got = op_read(of, buf, (int) (sizeof(buf) / sizeof(buf[0])),
                          NULL)) > 0) {
        if (op_channel_count(of, -1) != d->channels) {
            op_free(of);
            return fail(w, "opus: channel count changes mid-stream");
        }
        if (append(d, buf, (size_t) got, &cap, w) != 0) {
            op_free(of);
            return -1;
        }
    }
    op_free(of);
    if (got < 0) {
        return fail(w, "opus: op_read failed (error %d)", got);
    }
    return 0;
}


/* ---- aac: faad2 over ADTS ---- */

static int decode_aac(const uint8_t *p, size_t n, AudioDecoded *d, Why *w) {
    NeAACDecHandle            h = NeAACDecOpen();
    NeAACDecConfigurationPtr  cfg;
    NeAACDecFrameInfo         info;
    unsigned long             rate;
    unsigned char             ch;
    size_t                    cap = 0, off;
    long                      skip;
    int                       rc = 0;

    if (h == NULL) {
        return fail(w, "aac: NeAACDecOpen failed");
    }
    cfg = NeAACDecGetCurrentConfiguration(h);
    cfg->outputFormat = FAAD_FMT_16BIT;
    cfg->downMatrix = 0;
    cfg->dontUpSampleImplicitSBR = 1;
    NeAACDecSetConfiguration(h, cfg);
    if (n < 7 || p[0] != 0xFF || (p[1] & 0xF6) != 0xF0) {
        rc = fail(w, "aac: no ADTS sync at the start");
        goto out;
    }
    skip = NeAACDecInit(h, (unsigned char *) p, (unsigned long) n, &rate,
                        &ch);
    if (skip < 0) {
        rc = fail(w, "aac: NeAACDecInit failed");
        goto out;
    }
    /* faad2 turns mono into two equal channels (in case Parametric
     * Stereo appears later): the stream's channels are the ADTS header's,
     * and only the first decoded channel is kept */
    d->rate = d->pcm_rate = (int) rate;
    d->channels = ((p[2] & 1) << 2) | (p[3] >> 6);
    if (d->channels < 1 || d->channels > 2) {
        rc = fail(w, "aac: ADTS channel configuration %d", d->channels);
        goto out;
    }
    for (off = (size_t) skip; off < n; off += info.bytesconsumed) {
        void *s = NeAACDecDecode(h, &info, (unsigned char *) p + off,
                                 (unsigned long) (n - off));

        if (info.error != 0) {
            rc = fail(w, "aac: at byte %zu: %s", off,
                      NeAACDecGetErrorMessage(info.error));
            goto out;
        }
        if (info.bytesconsumed == 0) {
            rc = fail(w, "aac: decoder stuck at byte %zu", off);
            goto out;
        }
        if (info.samples == 0) {
            continue;
        }
        if ((int) info.channels < d->channels
            || (int) info.samplerate != d->rate) {
            rc = fail(w, "aac: format changes at byte %zu", off);
            goto out;
        }
        if (append_first(d, s, info.samples / info.channels, info.channels,
                         &cap, w) != 0) {
            rc = -1;
            goto out;
        }
    }
out:
    NeAACDecClose(h);
    return rc;
}


/* ---- flac and wav: libsndfile on a memory file ---- */

static sf_count_t mem_len(void *ud) { return (sf_count_t) ((Mem *) ud)->n; }
static sf_count_t mem_tell(void *ud) { return (sf_count_t) ((Mem *) ud)->at; }

static sf_count_t mem_seek(sf_count_t off, int whence, void *ud) {
    return mp3_seek(ud, (off_t) off, whence);
}

static sf_count_t mem_read(void *dst, sf_count_t k, void *ud) {
    return mp3_read(ud, dst, (size_t) k);
}

static sf_count_t mem_write(const void *src, sf_count_t k, void *ud) {
    return 0;
}

static int decode_sndfile(const char *fmt, const uint8_t *p, size_t n,
                          AudioDecoded *d, Why *w) {
    SF_VIRTUAL_IO io = { mem_len, mem_seek, mem_read, mem_write, mem_tell };
    Mem           m = { p, n, 0 };
    SF_INFO       info;
    SNDFILE      *sf;
    int16_t       buf[8192];
    sf_count_t    got;
    size_t        cap = 0;
    int           want = strcmp(fmt, "flac") == 0 ? SF_FORMAT_FLAC
                                                  : SF_FORMAT_WAV;

    memset(&info, 0, sizeof(info));
    sf = sf_open_virtual(&io, SFM_READ, &info, &m);
    if (sf == NULL) {
        return fail(w, "%s: %s", fmt, sf_strerror(NULL));
    }
    if ((info.format & SF_FORMAT_TYPEMASK) != want) {
        sf_close(sf);
        return fail(w, "%s: the file is another format (0x%x)", fmt,
                    info.format);
    }
    d->rate = d->pcm_rate = info.samplerate;
    d->channels = info.channels;
    /* frames may be unknown (a streamed FLAC says 0): read to the end */
    while ((got = sf_readf_short(sf, buf, 8192 / info.channels)) > 0) {
        if (append(d, buf, (size_t) got, &cap, w) != 0) {
            sf_close(sf);
            return -1;
        }
    }
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        fail(w, "%s: %s", fmt, sf_strerror(sf));
        sf_close(sf);
        return -1;
    }
    sf_close(sf);
    return 0;
}


/* ---- raw pcm ---- */

static int decode_pcm(const uint8_t *p, size_t n, int rate, AudioDecoded *d,
                      Why *w) {
    size_t cap = 0;

    if (n % 2 != 0) {
        return fail(w, "pcm: odd byte count %zu (s16 samples)", n);
    }
    d->rate = d->pcm_rate = rate;
    d->channels = 1;
    return n == 0 ? 0 : append(d, (const int16_t *) p, n / 2, &cap, w);
}


int audio_decode(const char *format, const uint8_t *p, size_t n,
                 int pcm_rate, AudioDecoded *out, char *why,
                 size_t why_len) {
    Why w = { why, why_len };
    int rc;

    memset(out, 0, sizeof(*out));
    if (strcmp(format, "mp3") == 0) {
        rc = decode_mp3(p, n, out, &w);
    } else if (strcmp(format, "opus") == 0) {
        rc = decode_opus(p, n, out, &w);
    } else if (strcmp(format, "aac") == 0) {
        rc = decode_aac(p, n, out, &w);
    } else if (strcmp(format, "flac") == 0 || strcmp(format, "wav") == 0) {
        rc = decode_sndfile(format, p, n, out, &w);
    } else if (strcmp(format, "pcm") == 0) {
        rc = decode_pcm(p, n, pcm_rate, out, &w);
    } else {
        rc = fail(&w, "unknown format \"%s\"", format);
    }
    if (rc == 0 && out->channels <= 0) {
        rc = fail(&w, "%s: no channels", format);
    }
    if (rc == 0 && out->pcm_frames == 0 && (strcmp(format, "mp3") == 0
                                            || strcmp(format, "aac") == 0)) {
        rc = fail(&w, "%s: no samples decoded", format);
    }
    if (rc != 0) {
        audio_decoded_free(out);
        return -1;
    }
    out->samples = (size_t) ((double) out->pcm_frames * out->rate
                             / out->pcm_rate + 0.5);
    return 0;
}

void audio_decoded_free(AudioDecoded *d) {
    free(d->pcm);
    memset(d, 0, sizeof(*d));
}

void audio_decoded_level(const AudioDecoded *d, double *rms, double *peak) {
    double sum = 0, top = 0;

    for (size_t i = 0; i < d->pcm_frames; i++) {
        double x = d->pcm[i * (size_t) d->channels] / 32768.0;

        sum += x * x;
        top = fabs(x) > top ? fabs(x) : top;
    }
    *rms = d->pcm_frames ? sqrt(sum / (double) d->pcm_frames) : 0;
    *peak = top;
}

/* dec_wav.c -- RIFF/WAVE, parsed by hand: the chunks up to "data" are
 * walked (fmt read, ds64 read for RF64, anything else skipped with its
 * pad byte), then the data chunk is handed to decode.c as one Piece that
 * points into the file: no copy, no library.
 *
 * Accepted: WAVE_FORMAT_PCM 8 (unsigned), 16, 24, 32-bit; IEEE float 32
 * and 64-bit; G.711 A-law and mu-law; the same inside
 * WAVE_FORMAT_EXTENSIBLE (its subformat GUID; valid bits below the
 * container are taken as the container); 1..8 channels; RF64/BW64.
 *
 * Sizes, as real files have them. The data size 0xFFFFFFFF means "to the
 * end of the file" (streamed headers, OpenAI's among them; RF64 then has
 * the size in ds64). A data size of 0 means the same when the RIFF size
 * is 0 or 0xFFFFFFFF too (a streaming writer patched neither), and an
 * empty file otherwise. A data size larger than what follows is a file
 * cut short: the whole frames that are there are decoded, because a
 * truncated upload is still speech, and the caller reports the duration
 * it got. A partial last frame is dropped. Bytes after the data chunk are
 * ignored; the RIFF size bounds nothing (writers get it wrong). */

#include <stdlib.h>
#include <string.h>

#include "dec_impl.h"

/* KSDATAFORMAT_SUBTYPE_*: {000000tt-0000-0010-8000-00aa00389b71}, after
 * its first two bytes (the format tag). */
static const uint8_t GUID_TAIL[14] = {
    0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00,
    0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
};

#define WAVE_PCM        0x0001
#define WAVE_FLOAT      0x0003
#define WAVE_ALAW       0x0006
#define WAVE_ULAW       0x0007
#define WAVE_EXTENSIBLE 0xFFFE

typedef struct {
    const uint8_t *p;           // first frame, a view into the file
    size_t         frames;
    SampleType     type;
    int            channels;
    size_t         align;       // bytes per frame
    bool           given;       // next has returned the data
} Wav;

static uint32_t le16(const uint8_t *p) {
    return (uint32_t) p[0] | (uint32_t) p[1] << 8;
}

static uint32_t le32(const uint8_t *p) {
    return le16(p) | le16(p + 2) << 16;
}

static uint64_t le64(const uint8_t *p) {
    return (uint64_t) le32(p) | (uint64_t) le32(p + 4) << 32;
}

/* The codecs people send that we refuse, for a message that names them. */
static const char *tag_name(uint32_t tag) {
    switch (tag) {
    case 0x0002: return " (MS ADPCM)";
    case 0x0011: return " (IMA ADPCM)";
    case 0x0031: return " (GSM 6.10)";
    case 0x0050: return " (MPEG)";
    case 0x0055: return " (mp3)";
    default:     return "";
    }
}

static int sample_type(uint32_t tag, uint32_t bits, SampleType *t,
                       Err *err) {
    if (tag == WAVE_PCM && (bits == 8 || bits == 16 || bits == 24
                            || bits == 32)) {
        *t = bits == 8 ? SAMPLE_U8 : bits == 16 ? SAMPLE_S16
           : bits == 24 ? SAMPLE_S24 : SAMPLE_S32;
    } else if (tag == WAVE_FLOAT && (bits == 32 || bits == 64)) {
        *t = bits == 32 ? SAMPLE_F32 : SAMPLE_F64;
    } else if ((tag == WAVE_ALAW || tag == WAVE_ULAW) && bits == 8) {
        *t = tag == WAVE_ALAW ? SAMPLE_ALAW : SAMPLE_ULAW;
    } else {
        return err_set(err, "format 0x%04x%s with %u bits is not supported "
                       "(PCM 8/16/24/32, float 32/64, A-law, mu-law)",
                       (unsigned) tag, tag_name(tag), (unsigned) bits);
    }
    return 0;
}

/* The fmt chunk's n bytes at p. */
static int wav_fmt(AudioDecoder *d, Wav *w, const uint8_t *p, size_t n,
                   Err *err) {
    uint32_t tag, ch, rate, align, bits;

    if (n < 16) {
        return err_set(err, "fmt chunk of %zu bytes (16 at least)", n);
    }
    tag = le16(p);
    ch = le16(p + 2);
    rate = le32(p + 4);
    align = le16(p + 12);
    bits = le16(p + 14);
    if (tag == WAVE_EXTENSIBLE) {
        if (n < 40 || le16(p + 16) < 22) {
            return err_set(err, "WAVE_FORMAT_EXTENSIBLE fmt chunk of %zu "
                           "bytes (40 at least)", n);
        }
        if (memcmp(p + 26, GUID_TAIL, sizeof(GUID_TAIL)) != 0) {
            return err_set(err, "WAVE_FORMAT_EXTENSIBLE subformat is not "
                           "a WAVE format tag");
        }
        if (le16(p + 18) > bits) {
            return err_set(err, "%u valid bits in %u-bit samples",
                           (unsigned) le16(p + 18), (unsigned) bits);
        }
        tag = le16(p + 24);
    }
    if (sample_type(tag, bits, &w->type, err) != 0) {
        return -1;
    }
    if (ch < 1 || ch > DEC_MAX_CHANNELS) {
        return err_set(err, "%u channels (1..%d supported)", (unsigned) ch,
                       DEC_MAX_CHANNELS);
    }
    if (rate < DEC_MIN_RATE || rate > DEC_MAX_RATE) {
        return err_set(err, "sample rate %u Hz out of range (%d..%d)",
                       (unsigned) rate, DEC_MIN_RATE, DEC_MAX_RATE);
    }
    if (align != ch * (bits / 8)) {
        return err_set(err, "block align %u does not match %u channels of "
                       "%u bits", (unsigned) align, (unsigned) ch,
                       (unsigned) bits);
    }
    w->channels = (int) ch;
    w->align = align;
    d->channels = (int) ch;
    d->rate = (int) rate;
    return 0;
}

/* The data chunk whose header is at `at` (its size field says size):
 * how many bytes of audio to take, by the rules at the top. */
static size_t data_bytes(const uint8_t *p, size_t len, size_t at,
                         uint64_t ds64, bool rf64) {
    uint32_t riff = le32(p + 4), size = le32(p + at + 4);
    size_t   avail = len - at - 8;
    uint64_t want;

    if (size == 0xFFFFFFFFu) {
        want = rf64 && ds64 != UINT64_MAX ? ds64 : avail;
    } else if (size == 0 && (riff == 0 || riff == 0xFFFFFFFFu)) {
        want = avail;
    } else {
        want = size;
    }
    return want < avail ? (size_t) want : avail;
}

static int wav_open(AudioDecoder *d, Err *err) {
    const uint8_t *p = d->data;
    size_t         len = d->len, at = 12, size;
    uint64_t       ds64 = UINT64_MAX;
    bool           rf64, have_fmt = false;
    Wav           *w;

    if (len < 12 || memcmp(p + 8, "WAVE", 4) != 0
        || (memcmp(p, "RIFF", 4) != 0 && memcmp(p, "RF64", 4) != 0
            && memcmp(p, "BW64", 4) != 0)) {
        return err_set(err, len < 12 ? "truncated header"
                                     : "no RIFF/WAVE header");
    }
    rf64 = memcmp(p, "RIFF", 4) != 0;
    if ((w = calloc(1, sizeof(*w))) == NULL) {
        d->oom = true;
        return err_set(err, "out of memory");
    }
    d->codec = w;
    /* each chunk advances at by 8 bytes or more: linear in the file */
    for (;;) {
        if (len - at < 8) {
            return err_set(err, have_fmt ? "no data chunk"
                                         : "truncated header");
        }
        if (memcmp(p + at, "data", 4) == 0) {
            break;
        }
        size = le32(p + at + 4);
        if (size > len - at - 8) {
            return err_set(err, "truncated header");
        }
        if (memcmp(p + at, "fmt ", 4) == 0) {
            if (have_fmt) {
                return err_set(err, "two fmt chunks");
            }
            if (wav_fmt(d, w, p + at + 8, size, err) != 0) {
                return -1;
            }
            have_fmt = true;
        } else if (memcmp(p + at, "ds64", 4) == 0 && size >= 16) {
            ds64 = le64(p + at + 16);
        }
        at += 8 + size;
        at += (size & 1) != 0 && at < len ? 1 : 0;
    }
    if (!have_fmt) {
        return err_set(err, "data chunk before the fmt chunk");
    }
    w->p = p + at + 8;
    w->frames = data_bytes(p, len, at, ds64, rf64) / w->align;
    return 0;
}

/* The whole data chunk in one piece: decode.c takes it DEC_PIECE frames
 * at a time. */
static int wav_next(AudioDecoder *d, Piece *pc, Err *err) {
    Wav *w = d->codec;

    if (w->given || w->frames == 0) {
        return 0;
    }
    w->given = true;
    pc->p = w->p;
    pc->frames = w->frames;
    pc->channels = w->channels;
    pc->type = w->type;
    pc->bits = 0;
    return 1;
}

static void wav_free(AudioDecoder *d) {
    free(d->codec);
}

const DecoderOps dec_wav_ops = {
    "wav", wav_open, wav_next, wav_free,
};

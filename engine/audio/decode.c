/* decode.c -- the decoder handle: sniffing, the format table, and the path
 * every format shares from a container's Piece to what audio_decoder_read
 * gives: channels averaged to mono, s16 with rounding and clipping, then
 * libsoxr to out_rate (skipped when the file is already at out_rate, so a
 * 16 kHz mono s16 WAV comes out bit-exact).
 *
 * Memory is fixed at open: DEC_PIECE frames are mixed at a time into
 * d->mono and resampled into d->out, whose size soxr's bound for one piece
 * gives (resample_out_max), so a read of any cap decodes piece after piece
 * and keeps what does not fit for the next read. The containers add their
 * own bounded state (dec_*.c); nothing grows with the file, which stays
 * where the caller keeps it. Sniffing reads at most the first 64 bytes,
 * and the bytes behind an ID3v2 tag when the caller has them. */

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dec_impl.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "WAV samples are read as they lie in memory (LE)"
#endif

#define DEC_PIECE 4096          // frames mixed and resampled at a time
#define SNIFF_MAX 64

static const struct {
    const char       *name;
    const DecoderOps *ops;
} FORMATS[] = {
    [AUDIO_IN_AUTO] = { "auto", NULL },
    [AUDIO_IN_WAV]  = { "wav",  &dec_wav_ops },
    [AUDIO_IN_MP3]  = { "mp3",  &dec_mp3_ops },
    [AUDIO_IN_FLAC] = { "flac", &dec_flac_ops },
    [AUDIO_IN_OPUS] = { "opus", &dec_opus_ops },
};

#define N_FORMATS (sizeof(FORMATS) / sizeof(FORMATS[0]))

static const char SUPPORTED[] = "send wav, mp3, flac or ogg opus";


/* ---- sniffing ---- */

/* Containers we recognise but do not decode, by their magic at an offset.
 * Matroska and WebM share EBML's magic: the DocType within the first 64
 * bytes tells them apart (sniff_other). */
static const struct {
    size_t      at;
    const char *magic;
    const char *name;
} OTHERS[] = {
    { 4, "ftyp", "mp4" },
    { 0, ".snd", "au" },
    { 0, "#!AMR", "amr" },
    { 0, "caff", "caf" },
    { 0, "MAC ", "ape" },
    { 0, "wvpk", "wavpack" },
    { 0, "TTA1", "tta" },
    { 0, "MPCK", "musepack" },
    { 0, "MP+", "musepack" },
    { 0, "ADIF", "aac" },
    { 0, "DSD ", "dsf" },
    { 0, "FRM8", "dff" },
    { 0, "MThd", "midi" },
    { 0, ".RMF", "realmedia" },
    { 0, "\x30\x26\xb2\x75\x8e\x66\xcf\x11", "wma" },
};

/* Ogg codecs by their first packet's opening bytes. */
static const struct {
    const char *id;
    size_t      n;
    const char *name;
} OGG_CODECS[] = {
    { "\x01vorbis", 7, "ogg vorbis" },
    { "\x7f" "FLAC", 5, "ogg flac" },
    { "Speex   ", 8, "ogg speex" },
    { "\x80theora", 7, "ogg theora" },
};

static bool has(const uint8_t *p, size_t len, size_t at, const char *s,
                size_t n) {
    return at <= len && n <= len - at && memcmp(p + at, s, n) == 0;
}

static bool has_str(const uint8_t *p, size_t len, size_t at, const char *s) {
    return has(p, len, at, s, strlen(s));
}

/* An MPEG audio frame header at p (4 bytes): the 11-bit sync, then no
 * reserved value in version, layer, bitrate index, rate index or
 * emphasis. Layer bits 00 with a 12-bit sync are ADTS AAC, not MPEG. */
static bool mpeg_header(const uint8_t *p) {
    int version = (p[1] >> 3) & 3, layer = (p[1] >> 1) & 3;

    return p[0] == 0xFF && (p[1] & 0xE0) == 0xE0 && version != 1
           && layer != 0 && (p[2] >> 4) != 15 && ((p[2] >> 2) & 3) != 3
           && (p[3] & 3) != 2;
}

static bool adts_header(const uint8_t *p) {
    return p[0] == 0xFF && (p[1] & 0xF6) == 0xF0;
}

/* The offset just past the ID3v2 tags at p (0 when there is none): ten
 * bytes of header, a 28-bit syncsafe size, ten more when the footer flag
 * is set. Some files stack tags; four are followed. */
static size_t id3_end(const uint8_t *p, size_t len) {
    size_t at = 0;

    for (int k = 0; k < 4 && has_str(p, len, at, "ID3") && len - at >= 10;
         k++) {
        const uint8_t *h = p + at;

        if (h[3] == 0xFF || h[4] == 0xFF
            || ((h[6] | h[7] | h[8] | h[9]) & 0x80) != 0) {
            break;
        }
        at += 10 + ((size_t) h[6] << 21 | (size_t) h[7] << 14
                    | (size_t) h[8] << 7 | h[9]);
        at += (h[5] & 0x10) != 0 ? 10 : 0;
    }
    return at;
}

/* OggS: the codec is named by the first page's first packet, which
 * starts after the 27-byte page header and its segment table (one
 * segment in both Opus's and Vorbis's first page). What cannot be told
 * within the first 64 bytes is handed to opusfile, the one Ogg decoder,
 * to say why. */
static AudioInFormat sniff_ogg(const uint8_t *p, size_t len,
                               const char **other) {
    size_t body;

    if (len < 27) {
        return AUDIO_IN_OPUS;
    }
    body = 27 + (size_t) p[26];
    if (has_str(p, len, body, "OpusHead") || body + 8 > SNIFF_MAX) {
        return AUDIO_IN_OPUS;
    }
    for (size_t i = 0; i < sizeof(OGG_CODECS) / sizeof(OGG_CODECS[0]); i++) {
        if (has(p, len, body, OGG_CODECS[i].id, OGG_CODECS[i].n)) {
            *other = OGG_CODECS[i].name;
            return AUDIO_IN_AUTO;
        }
    }
    if (body + 8 > len || body + 8 > SNIFF_MAX) {
        return AUDIO_IN_OPUS;
    }
    *other = "ogg (not opus)";
    return AUDIO_IN_AUTO;
}

/* Behind ID3v2 tags: FLAC (libFLAC skips the tag), ADTS AAC, or MP3.
 * What lies beyond the bytes we have, or is no known header (padding
 * after the tag is common; libmpg123 skips it), is taken for MP3, whose
 * tag ID3 is. */
static AudioInFormat sniff_id3(const uint8_t *p, size_t len, size_t at,
                               const char **other) {
    if (has_str(p, len, at, "fLaC")) {
        return AUDIO_IN_FLAC;
    }
    if (at <= len && len - at >= 4 && !mpeg_header(p + at)
        && adts_header(p + at)) {
        *other = "aac";
        return AUDIO_IN_AUTO;
    }
    return AUDIO_IN_MP3;
}

static const char *sniff_other(const uint8_t *p, size_t len) {
    size_t n = len < SNIFF_MAX ? len : SNIFF_MAX;

    if (has_str(p, len, 0, "\x1a\x45\xdf\xa3")) {
        return memmem(p, n, "matroska", 8) != NULL ? "matroska" : "webm";
    }
    if (has_str(p, len, 0, "FORM") && (has_str(p, len, 8, "AIFF")
                                       || has_str(p, len, 8, "AIFC"))) {
        return "aiff";
    }
    if (has_str(p, len, 0, "RIFF")) {
        return has_str(p, len, 8, "AVI ") ? "avi"
             : has_str(p, len, 8, "WEBP") ? "webp" : "riff (not wave)";
    }
    if (len >= 4 && adts_header(p)) {
        return "aac";
    }
    for (size_t i = 0; i < sizeof(OTHERS) / sizeof(OTHERS[0]); i++) {
        if (has_str(p, len, OTHERS[i].at, OTHERS[i].magic)) {
            return OTHERS[i].name;
        }
    }
    return NULL;
}

AudioInFormat audio_sniff(const uint8_t *p, size_t len, const char **other) {
    const char    *o = NULL;
    AudioInFormat  f = AUDIO_IN_AUTO;
    size_t         at;

    if ((has_str(p, len, 0, "RIFF") || has_str(p, len, 0, "RF64")
         || has_str(p, len, 0, "BW64"))
        && (len < 12 || has_str(p, len, 8, "WAVE"))) {
        f = AUDIO_IN_WAV;           // too short to tell: wav says why
    } else if (has_str(p, len, 0, "fLaC")) {
        f = AUDIO_IN_FLAC;
    } else if (has_str(p, len, 0, "OggS")) {
        f = sniff_ogg(p, len, &o);
    } else if ((at = id3_end(p, len)) > 0) {
        f = sniff_id3(p, len, at, &o);
    } else if (len >= 4 && mpeg_header(p)) {
        f = AUDIO_IN_MP3;
    } else {
        o = sniff_other(p, len);
    }
    if (other != NULL) {
        *other = o;
    }
    return f;
}

const char *audio_in_format_name(AudioInFormat f) {
    return (unsigned) f < N_FORMATS ? FORMATS[f].name : "unknown";
}

/* ---- mixing: a Piece to mono s16 ---- */

static const size_t SAMPLE_BYTES[] = {
    [SAMPLE_U8] = 1, [SAMPLE_S16] = 2, [SAMPLE_S24] = 3, [SAMPLE_S32] = 4,
    [SAMPLE_F32] = 4, [SAMPLE_F64] = 8, [SAMPLE_I32] = 4, [SAMPLE_ALAW] = 1,
    [SAMPLE_ULAW] = 1,
};

/* G.711 (ITU-T, as in Sun's reference g711.c): 8-bit codes to 16-bit
 * linear, full scale 32124 (mu-law) and 32256 (A-law). */
static int ulaw_linear(uint8_t u) {
    int t;

    u = (uint8_t) ~u;
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4);
    return (u & 0x80) != 0 ? 0x84 - t : t - 0x84;
}

static int alaw_linear(uint8_t a) {
    int t, seg;

    a ^= 0x55;
    t = (a & 0x0F) << 4;
    seg = (a & 0x70) >> 4;
    t += seg == 0 ? 8 : 0x108;
    t <<= seg > 1 ? seg - 1 : 0;
    return (a & 0x80) != 0 ? t : -t;
}

/* One sample at p as a float, full scale 1.0 (scale: SAMPLE_I32's). A
 * double is clamped before it narrows: out of float's range the
 * conversion would be undefined. NaN stays NaN (to_s16 makes it 0). */
static float sample_at(const uint8_t *p, SampleType t, float scale) {
    int16_t s16;
    int32_t s32;
    float   f32;
    double  f64;

    switch (t) {
    case SAMPLE_U8:
        return (float) (p[0] - 128) * (1.0f / 128);
    case SAMPLE_S16:
        memcpy(&s16, p, sizeof(s16));
        return (float) s16 * (1.0f / 32768);
    case SAMPLE_S24:
        s32 = (int32_t) ((uint32_t) p[0] << 8 | (uint32_t) p[1] << 16
                         | (uint32_t) p[2] << 24);
        return (float) s32 * (1.0f / 2147483648.0f);
    case SAMPLE_S32:
        memcpy(&s32, p, sizeof(s32));
        return (float) s32 * (1.0f / 2147483648.0f);
    case SAMPLE_F32:
        memcpy(&f32, p, sizeof(f32));
        return f32;
    case SAMPLE_F64:
        memcpy(&f64, p, sizeof(f64));
        return f64 > 2.0 ? 2.0f : f64 < -2.0 ? -2.0f : (float) f64;
    case SAMPLE_I32:
        memcpy(&s32, p, sizeof(s32));
        return (float) s32 * scale;
    case SAMPLE_ALAW:
        return (float) alaw_linear(p[0]) * (1.0f / 32768);
    case SAMPLE_ULAW:
        return (float) ulaw_linear(p[0]) * (1.0f / 32768);
    }
    return 0.0f;
}

static int16_t to_s16(float v) {
    if (v != v) {
        return 0;
    }
    if (v >= 32767.0f) {
        return 32767;
    }
    if (v <= -32768.0f) {
        return -32768;
    }
    return (int16_t) lrintf(v);
}

/* Frames [at, at + n) of pc, each the mean of its channels, to out. The
 * switch inside the loop costs little next to soxr (README: decode
 * speed) and keeps one loop for nine sample types. */
static void mix(const Piece *pc, size_t at, size_t n, int16_t *out) {
    size_t         w = SAMPLE_BYTES[pc->type];
    const uint8_t *p = pc->p + at * (size_t) pc->channels * w;
    float          scale = pc->type == SAMPLE_I32 ? ldexpf(1.0f, 1 - pc->bits)
                                                  : 1.0f;

    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;

        for (int c = 0; c < pc->channels; c++, p += w) {
            sum += sample_at(p, pc->type, scale);
        }
        out[i] = to_s16(sum / (float) pc->channels * 32768.0f);
    }
}

/* What every op promises (dec_impl.h), checked rather than assumed: a
 * broken promise would read out of bounds or loop forever. */
static bool piece_ok(const Piece *pc) {
    return pc->p != NULL && pc->frames > 0 && pc->channels >= 1
           && pc->channels <= DEC_MAX_CHANNELS
           && (unsigned) pc->type <= SAMPLE_ULAW
           && (pc->type != SAMPLE_I32 || (pc->bits >= 4 && pc->bits <= 32));
}


/* ---- the handle ---- */

static void set_oom(bool *oom, bool v) {
    if (oom != NULL) {
        *oom = v;
    }
}

/* The format to decode: what the bytes say, else the hint; a container
 * we recognise and do not decode is refused by name whatever the hint. */
static int pick_format(const uint8_t *data, size_t len, AudioInFormat hint,
                       AudioInFormat *f, Err *err) {
    const char *other;

    if (len == 0) {
        return err_set(err, "not audio: 0 bytes");
    }
    *f = audio_sniff(data, len, &other);
    if (*f != AUDIO_IN_AUTO) {
        return 0;
    }
    if (other != NULL) {
        return err_set(err, "%s is not supported: %s", other, SUPPORTED);
    }
    if (hint == AUDIO_IN_AUTO || (unsigned) hint >= N_FORMATS) {
        return err_set(err, "not audio: not wav, mp3, flac or ogg opus");
    }
    *f = hint;
    return 0;
}

/* The buffers of the mixing path, sized from the rates open found. */
static int alloc_path(AudioDecoder *d, Err *err) {
    d->mono = malloc(DEC_PIECE * sizeof(*d->mono));
    if (d->mono == NULL) {
        d->oom = true;
        return err_set(err, "%s: out of memory", d->ops->name);
    }
    if (d->rate == d->out_rate) {
        d->out = d->mono;
        d->out_cap = DEC_PIECE;
        return 0;
    }
    /* the rates are in range, so soxr_create can fail only for memory */
    d->rs = resample_new(d->rate, d->out_rate, err);
    if (d->rs == NULL) {
        d->oom = true;
        return err_prefix(err, "%s", d->ops->name);
    }
    d->out_cap = resample_out_max(d->rs, DEC_PIECE);
    d->out = malloc(d->out_cap * sizeof(*d->out));
    if (d->out == NULL) {
        d->oom = true;
        return err_set(err, "%s: out of memory", d->ops->name);
    }
    return 0;
}

static int open_codec(AudioDecoder *d, Err *err) {
    if (d->ops->open(d, err) != 0) {
        return err_prefix(err, "%s", d->ops->name);
    }
    if (d->rate < DEC_MIN_RATE || d->rate > DEC_MAX_RATE) {
        return err_set(err, "%s: sample rate %d Hz out of range (%d..%d)",
                       d->ops->name, d->rate, DEC_MIN_RATE, DEC_MAX_RATE);
    }
    if (d->channels < 1 || d->channels > DEC_MAX_CHANNELS) {
        return err_set(err, "%s: %d channels (1..%d supported)",
                       d->ops->name, d->channels, DEC_MAX_CHANNELS);
    }
    return alloc_path(d, err);
}

AudioDecoder *audio_decoder_open(const uint8_t *data, size_t len,
                                 AudioInFormat hint, int out_rate,
                                 Err *err, bool *oom) {
    AudioDecoder  *d;
    AudioInFormat  f;

    set_oom(oom, false);
    if (out_rate < DEC_MIN_RATE || out_rate > DEC_MAX_RATE) {
        err_set(err, "audio decoder: output rate %d Hz out of range",
                out_rate);
        return NULL;
    }
    if (pick_format(data, len, hint, &f, err) != 0) {
        return NULL;
    }
    d = calloc(1, sizeof(*d));
    if (d == NULL) {
        err_set(err, "%s: out of memory", FORMATS[f].name);
        set_oom(oom, true);
        return NULL;
    }
    d->ops = FORMATS[f].ops;
    d->format = f;
    d->data = data;
    d->len = len;
    d->out_rate = out_rate;
    if (open_codec(d, err) != 0) {
        set_oom(oom, d->oom);
        audio_decoder_free(d);
        return NULL;
    }
    return d;
}

AudioInFormat audio_decoder_format(const AudioDecoder *d) {
    return d->format;
}

int audio_decoder_rate(const AudioDecoder *d) {
    return d->rate;
}

int audio_decoder_channels(const AudioDecoder *d) {
    return d->channels;
}

uint64_t audio_decoder_samples(const AudioDecoder *d) {
    return d->n_given;
}

/* The op's next piece, once the current one is used up. */
static int next_piece(AudioDecoder *d, Err *err) {
    int rc = d->ops->next(d, &d->piece, err);

    d->piece_at = 0;
    if (rc < 0) {
        d->piece.frames = 0;
        return err_prefix(err, "%s", d->ops->name);
    }
    if (rc == 0) {
        d->piece.frames = 0;
        d->eof = true;
        return 0;
    }
    if (!piece_ok(&d->piece)) {
        d->piece.frames = 0;
        return err_set(err, "%s: decoder gave a malformed piece",
                       d->ops->name);
    }
    return 0;
}

/* Makes d->out hold the next samples (possibly none: soxr holds back its
 * first few tens of milliseconds): mixes and resamples up to DEC_PIECE
 * frames, taking a new piece from the op when needed; at the end of the
 * audio, drains soxr until it gives less than out_cap. */
static int fill(AudioDecoder *d, Err *err) {
    size_t n;

    d->out_at = d->out_n = 0;
    if (d->piece_at == d->piece.frames && !d->eof
        && next_piece(d, err) != 0) {
        return -1;
    }
    if (d->piece_at < d->piece.frames) {
        n = d->piece.frames - d->piece_at;
        n = n < DEC_PIECE ? n : DEC_PIECE;
        mix(&d->piece, d->piece_at, n, d->mono);
        d->piece_at += n;
        if (d->rs == NULL) {
            d->out_n = n;
            return 0;
        }
        return resample_process(d->rs, d->mono, n, d->out, d->out_cap,
                                &d->out_n, err);
    }
    if (d->rs != NULL
        && resample_flush(d->rs, d->out, d->out_cap, &d->out_n, err) != 0) {
        return -1;
    }
    d->done = d->out_n < d->out_cap;
    return 0;
}

ssize_t audio_decoder_read(AudioDecoder *d, int16_t *out, size_t cap,
                           Err *err, bool *oom) {
    size_t given = 0, k;

    set_oom(oom, false);
    if (d->broken) {
        return err_set(err, "%s: read after a failure", d->ops->name);
    }
    if (cap == 0) {
        return err_set(err, "%s: read with cap 0", d->ops->name);
    }
    cap = cap < SSIZE_MAX ? cap : SSIZE_MAX;
    while (given < cap) {
        if (d->out_at < d->out_n) {
            k = d->out_n - d->out_at;
            k = k < cap - given ? k : cap - given;
            memcpy(out + given, d->out + d->out_at, k * sizeof(*out));
            d->out_at += k;
            given += k;
            continue;
        }
        if (d->done) {
            break;
        }
        if (fill(d, err) != 0) {
            d->broken = true;
            set_oom(oom, d->oom);
            return -1;
        }
    }
    d->n_given += given;
    return (ssize_t) given;
}

void audio_decoder_free(AudioDecoder *d) {
    if (d == NULL) {
        return;
    }
    d->ops->free(d);
    resample_free(d->rs);
    if (d->out != d->mono) {
        free(d->out);
    }
    free(d->mono);
    free(d);
}

/* test_audio_in.c -- the audio-input decoders (engine/audio/decode.c,
 * dec_*.c) on files from independent encoders: libsndfile (WAV in every
 * sample format and layout, RF64, FLAC, MP3 through lame, Ogg Opus, and
 * the containers we refuse: AIFF, Ogg Vorbis, AU, CAF) and the engine's
 * own encoders (engine/audio/encode.h: mp3, flac, opus at 24 kHz).
 *
 * What is checked, at 16 kHz out: the number of samples (exactly the
 * input's duration where the format keeps it, within the codec's priming
 * and padding where it does not: FMT_SLACK), that a tone keeps its
 * frequency and amplitude (a least-squares fit of sines at the expected
 * frequencies, so a wrong rate, a lost channel or a bad scale fails), the
 * mean of the channels, bit-exact samples where nothing is lossy or
 * resampled, streamed and odd WAV headers, truncated, corrupt, garbage
 * and empty input, the names of refused containers, reads with caps of 1
 * and 7 giving what big reads give, and several decoders on several
 * threads at once.
 *
 * OMNI_AUDIO_SEEDS=DIR build/t/test_audio_in writes small files of every
 * format into DIR instead of testing: t/fuzz/run's seed corpus for
 * fuzz_audio. */

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sndfile.h>
#include <cmocka.h>

#include "decoder.h"
#include "encode.h"

#define OUT_RATE 16000

typedef struct {
    uint8_t *p;
    size_t   n, cap, at;            // at: libsndfile's virtual file position
} Buf;

typedef struct {
    double freq, amp;               // one sine per channel; amp 0: silence
} Tone;

typedef struct {
    int16_t       *s;               // (n,) at OUT_RATE, owned
    size_t         n;
    int            rate, channels;
    AudioInFormat  format;
    bool           ok;              // open and every read succeeded
    char           err[ERR_MAX];
} Decoded;

static void buf_put(Buf *b, const void *p, size_t n) {
    if (b->at + n > b->cap) {
        b->cap = (b->at + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->at, p, n);
    b->at += n;
    b->n = b->at > b->n ? b->at : b->n;
}


/* ---- libsndfile over memory ---- */

static sf_count_t vio_len(void *ud) {
    return (sf_count_t) ((Buf *) ud)->n;
}

static sf_count_t vio_seek(sf_count_t off, int whence, void *ud) {
    Buf        *b = ud;
    sf_count_t  at = whence == SEEK_SET ? off
                   : whence == SEEK_CUR ? (sf_count_t) b->at + off
                                        : (sf_count_t) b->n + off;

    if (at < 0) return -1;
    b->at = (size_t) at;
    return at;
}

static sf_count_t vio_read(void *p, sf_count_t n, void *ud) {
    Buf    *b = ud;
    size_t  k = b->at < b->n ? b->n - b->at : 0;

    k = (size_t) n < k ? (size_t) n : k;
    memcpy(p, b->p + b->at, k);
    b->at += k;
    return (sf_count_t) k;
}

static sf_count_t vio_write(const void *p, sf_count_t n, void *ud) {
    buf_put(ud, p, (size_t) n);
    return n;
}

static sf_count_t vio_tell(void *ud) {
    return (sf_count_t) ((Buf *) ud)->at;
}

static SF_VIRTUAL_IO VIO = {
    vio_len, vio_seek, vio_read, vio_write, vio_tell,
};

/* seconds of tones[c] on channel c, as format (SF_FORMAT_*), at rate. */
static Buf sf_make(int format, int rate, int channels, double seconds,
                   const Tone *tones) {
    SF_INFO  info = { .samplerate = rate, .channels = channels,
                      .format = format };
    Buf      b = { 0 };
    size_t   frames = (size_t) lrint(seconds * rate);
    float   *x = malloc((frames ? frames : 1) * (size_t) channels
                        * sizeof(*x));
    SNDFILE *sf;

    assert_non_null(x);
    sf = sf_open_virtual(&VIO, SFM_WRITE, &info, &b);
    if (sf == NULL) {
        fail_msg("sf_open_virtual(0x%x, %d Hz, %d ch): %s", format, rate,
                 channels, sf_strerror(NULL));
    }
    for (size_t i = 0; i < frames; i++) {
        for (int c = 0; c < channels; c++) {
            x[i * (size_t) channels + (size_t) c] = (float) (tones[c].amp
                * sin(2 * M_PI * tones[c].freq * (double) i / rate));
        }
    }
    assert_int_equal(sf_writef_float(sf, x, (sf_count_t) frames), frames);
    assert_int_equal(sf_close(sf), 0);
    free(x);
    return b;
}

/* Shorts exactly as given, mono, as a 16-bit WAV at rate. */
static Buf sf_make_s16(int rate, const int16_t *s, size_t n) {
    SF_INFO  info = { .samplerate = rate, .channels = 1,
                      .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16 };
    Buf      b = { 0 };
    SNDFILE *sf = sf_open_virtual(&VIO, SFM_WRITE, &info, &b);

    assert_non_null(sf);
    assert_int_equal(sf_write_short(sf, s, (sf_count_t) n), n);
    assert_int_equal(sf_close(sf), 0);
    return b;
}


/* ---- the engine's encoders (mono, 24 kHz) ---- */

static int enc_sink(void *ud, const uint8_t *p, size_t n) {
    buf_put(ud, p, n);
    return 0;
}

static int16_t *tone_s16(int rate, size_t n, double freq, double amp) {
    int16_t *s = malloc((n ? n : 1) * sizeof(*s));

    assert_non_null(s);
    for (size_t i = 0; i < n; i++) {
        s[i] = (int16_t) lrint(32767.0 * amp
                               * sin(2 * M_PI * freq * (double) i / rate));
    }
    return s;
}

static Buf engine_make(AudioFormat f, const int16_t *s, size_t n) {
    Buf           b = { 0 };
    Err           err;
    AudioEncoder *e = audio_encoder_open(f, SPEECH_RATE, enc_sink, &b, &err);

    if (e == NULL) fail_msg("%s: %s", speech_format_name(f), err.msg);
    if (audio_encoder_write(e, s, n, &err) != 0
        || audio_encoder_finish(e, &err) != 0) {
        fail_msg("%s: %s", speech_format_name(f), err.msg);
    }
    audio_encoder_free(e);
    return b;
}

static Buf engine_tone(AudioFormat f, double seconds, double freq,
                       double amp) {
    size_t   n = (size_t) lrint(seconds * SPEECH_RATE);
    int16_t *s = tone_s16(SPEECH_RATE, n, freq, amp);
    Buf      b = engine_make(f, s, n);

    free(s);
    return b;
}


/* ---- decoding ---- */

/* The whole of p[0..n) through the decoder, cap samples a read. */
static Decoded decode_cap(const uint8_t *p, size_t n, AudioInFormat hint,
                          size_t cap, int out_rate) {
    Decoded       r = { 0 };
    Err           err = { "" };
    bool          oom = true;
    size_t        have = 0;
    AudioDecoder *d = audio_decoder_open(p, n, hint, out_rate, &err, &oom);
    ssize_t       k;

    assert_false(oom);
    if (d == NULL) {
        assert_true(err.msg[0] != '\0');
        snprintf(r.err, sizeof(r.err), "%s", err.msg);
        return r;
    }
    r.format = audio_decoder_format(d);
    r.rate = audio_decoder_rate(d);
    r.channels = audio_decoder_channels(d);
    for (;;) {
        if (r.n + cap > have) {
            have = (r.n + cap) * 2;
            r.s = realloc(r.s, have * sizeof(*r.s));
            assert_non_null(r.s);
        }
        k = audio_decoder_read(d, r.s + r.n, cap, &err, &oom);
        assert_false(oom);
        if (k <= 0) break;
        assert_true((size_t) k <= cap);
        r.n += (size_t) k;
        assert_int_equal(audio_decoder_samples(d), r.n);
    }
    r.ok = k == 0;
    if (k < 0) {
        assert_true(err.msg[0] != '\0');
        snprintf(r.err, sizeof(r.err), "%s", err.msg);
        /* a failed decoder refuses further reads */
        assert_int_equal(audio_decoder_read(d, r.s, 1, &err, &oom), -1);
    } else {
        assert_int_equal(audio_decoder_read(d, r.s, 1, &err, &oom), 0);
    }
    audio_decoder_free(d);
    return r;
}

static Decoded decode_buf(const Buf *b, AudioInFormat hint) {
    return decode_cap(b->p, b->n, hint, 4096, OUT_RATE);
}

static Decoded decode_ok(const Buf *b, AudioInFormat hint,
                         const char *what) {
    Decoded r = decode_buf(b, hint);

    if (!r.ok) fail_msg("%s: %s", what, r.err);
    return r;
}

/* A decode that must fail with a message starting with prefix. */
static void decode_fails(const uint8_t *p, size_t n, AudioInFormat hint,
                         const char *prefix) {
    Decoded r = decode_cap(p, n, hint, 4096, OUT_RATE);

    if (r.ok) fail_msg("expected '%s...', decoded %zu samples", prefix, r.n);
    if (strncmp(r.err, prefix, strlen(prefix)) != 0) {
        fail_msg("expected '%s...', got '%s'", prefix, r.err);
    }
    free(r.s);
}


/* ---- measuring a tone ---- */

/* Least-squares amplitudes of sines at freqs[0..k) over s (skipping
 * 0.1 s at each end: soxr's edges, codec priming), one projection per
 * frequency (they are far enough apart to be near orthogonal over the
 * window); returns the signal-to-residual ratio in dB. */
static double fit_tones(const int16_t *s, size_t n, int rate,
                        const double *freqs, int k, double *amps) {
    size_t lo = (size_t) rate / 10, hi = n > lo ? n - lo : 0;
    double sig = 0, res = 0, a[4], b[4];

    assert_true(k <= 4 && hi > lo + (size_t) rate / 10);
    for (int j = 0; j < k; j++) {
        a[j] = b[j] = 0;
        for (size_t i = lo; i < hi; i++) {
            double w = 2 * M_PI * freqs[j] * (double) i / rate;

            a[j] += s[i] / 32768.0 * sin(w);
            b[j] += s[i] / 32768.0 * cos(w);
        }
        a[j] *= 2.0 / (double) (hi - lo);
        b[j] *= 2.0 / (double) (hi - lo);
        amps[j] = sqrt(a[j] * a[j] + b[j] * b[j]);
    }
    for (size_t i = lo; i < hi; i++) {
        double fit = 0;

        for (int j = 0; j < k; j++) {
            double w = 2 * M_PI * freqs[j] * (double) i / rate;

            fit += a[j] * sin(w) + b[j] * cos(w);
        }
        sig += fit * fit;
        res += (s[i] / 32768.0 - fit) * (s[i] / 32768.0 - fit);
    }
    return 10 * log10(sig / (res > 1e-20 ? res : 1e-20));
}

/* d holds freq at amp, within rel of it and snr_db above the residual. */
static void check_tone(const Decoded *d, double freq, double amp,
                       double rel, double snr_db, const char *what) {
    double got, snr = fit_tones(d->s, d->n, OUT_RATE, &freq, 1, &got);

    printf("# %s: %zu samples, %.0f Hz at %.4f, SNR %.1f dB\n", what, d->n,
           freq, got, snr);

    if (fabs(got - amp) > rel * amp || snr < snr_db) {
        fail_msg("%s: %.0f Hz at %.4f (want %.4f +-%.0f%%), SNR %.1f dB "
                 "(want > %.0f)", what, freq, got, amp, rel * 100, snr,
                 snr_db);
    }
}

/* n samples at rate in, resampled to OUT_RATE: soxr's count, +-1. */
static void check_count(const Decoded *d, size_t n_in, int rate,
                        size_t slack, const char *what) {
    double want = (double) n_in * OUT_RATE / rate;

    if ((double) d->n < want - 1 || (double) d->n > want + 1 + (double) slack) {
        fail_msg("%s: %zu samples at %d Hz, want %.1f (+%zu)", what, d->n,
                 OUT_RATE, want, slack);
    }
}


/* ---- WAV ---- */

static const Tone T440 = { 440, 0.5 };

/* Every sample format, mono and stereo, at the usual rates: the count and
 * the tone. The SNR floor is each format's: 8-bit and G.711 are noisy. */
static void test_wav_formats(void **state) {
    static const struct {
        int         format, rate;
        double      snr;
        const char *name;
    } cases[] = {
        { SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 8000, 35, "u8 8k" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 70, "s16 44.1k" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_16, 8000, 70, "s16 8k" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_24, 48000, 70, "s24 48k" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_32, 44100, 70, "s32 44.1k" },
        { SF_FORMAT_WAV | SF_FORMAT_FLOAT, 48000, 70, "float 48k" },
        { SF_FORMAT_WAV | SF_FORMAT_DOUBLE, 22050, 70, "double 22.05k" },
        { SF_FORMAT_WAV | SF_FORMAT_ULAW, 8000, 30, "mu-law 8k" },
        { SF_FORMAT_WAV | SF_FORMAT_ALAW, 8000, 30, "A-law 8k" },
        { SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, 44100, 70, "extensible s16" },
        { SF_FORMAT_WAVEX | SF_FORMAT_PCM_24, 96000, 70, "extensible s24" },
        { SF_FORMAT_WAVEX | SF_FORMAT_FLOAT, 48000, 70, "extensible float" },
        { SF_FORMAT_RF64 | SF_FORMAT_PCM_16, 48000, 70, "rf64 s16" },
    };
    Tone two[2] = { T440, T440 };
    char what[64];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int ch = 1; ch <= 2; ch++) {
            Buf     b = sf_make(cases[i].format, cases[i].rate, ch, 1.0, two);
            Decoded d;

            snprintf(what, sizeof(what), "wav %s %s", cases[i].name,
                     ch == 1 ? "mono" : "stereo");
            d = decode_ok(&b, AUDIO_IN_AUTO, what);
            assert_int_equal(d.format, AUDIO_IN_WAV);
            assert_int_equal(d.rate, cases[i].rate);
            assert_int_equal(d.channels, ch);
            check_count(&d, (size_t) cases[i].rate, cases[i].rate, 0, what);
            check_tone(&d, 440, 0.5, 0.02, cases[i].snr, what);
            free(d.s);
            free(b.p);
        }
    }
}

/* 16-bit mono at 16 kHz is passed through: the same samples. */
static void test_wav_exact(void **state) {
    int16_t  s[5000];
    uint32_t x = 1;
    Buf      b;
    Decoded  d;

    for (size_t i = 0; i < 5000; i++) {
        x = x * 1103515245u + 12345u;
        s[i] = (int16_t) (x >> 16);
    }
    s[0] = -32768;
    s[1] = 32767;
    b = sf_make_s16(OUT_RATE, s, 5000);
    d = decode_ok(&b, AUDIO_IN_WAV, "s16 16k");
    assert_int_equal(d.n, 5000);
    assert_memory_equal(d.s, s, sizeof(s));
    free(d.s);
    free(b.p);
}

/* Channels are averaged: two tones at half their amplitudes; opposite
 * channels cancel; 3 and 8 channels divide by 3 and 8. */
static void test_wav_channels(void **state) {
    Tone    lr[2] = { { 440, 0.6 }, { 1000, 0.3 } };
    Tone    inv[2] = { { 440, 0.5 }, { 440, -0.5 } };
    Tone    eight[8];
    double  freqs[2] = { 440, 1000 }, amps[2], snr;
    Buf     b = sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, 1.0, lr);
    Decoded d = decode_ok(&b, AUDIO_IN_AUTO, "stereo");

    snr = fit_tones(d.s, d.n, OUT_RATE, freqs, 2, amps);
    assert_true(fabs(amps[0] - 0.3) < 0.006);
    assert_true(fabs(amps[1] - 0.15) < 0.003);
    assert_true(snr > 60);
    free(d.s);
    free(b.p);

    b = sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, 0.5, inv);
    d = decode_ok(&b, AUDIO_IN_AUTO, "opposite");
    assert_int_equal(d.n, 8000);
    for (size_t i = 0; i < d.n; i++) {
        assert_true(abs(d.s[i]) <= 1);
    }
    free(d.s);
    free(b.p);

    for (int c = 0; c < 8; c++) {
        eight[c] = (Tone) { 440, c < 3 ? 0.8 : 0 };
    }
    b = sf_make(SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, 48000, 8, 1.0, eight);
    d = decode_ok(&b, AUDIO_IN_AUTO, "8 channels");
    assert_int_equal(d.channels, 8);
    check_tone(&d, 440, 0.3, 0.02, 60, "8 channels, 3 with the tone");
    free(d.s);
    free(b.p);

    b = sf_make(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 48000, 3, 1.0, eight);
    d = decode_ok(&b, AUDIO_IN_AUTO, "3 channels");
    check_tone(&d, 440, 0.8, 0.02, 60, "3 channels, all with the tone");
    free(d.s);
    free(b.p);
}

/* A canonical 44-byte header (16 kHz mono s16) with given sizes, then n
 * samples of a ramp. */
static Buf wav_canon(uint32_t riff, uint32_t data, size_t n) {
    uint8_t h[44];
    Buf     b = { 0 };

    memcpy(h, "RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0"
              "\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0", 44);
    memcpy(h + 4, &riff, 4);
    memcpy(h + 40, &data, 4);
    buf_put(&b, h, 44);
    for (size_t i = 0; i < n; i++) {
        int16_t v = (int16_t) (i * 7);

        buf_put(&b, &v, 2);
    }
    return b;
}

static size_t decoded_n(const Buf *b) {
    Decoded d = decode_ok(b, AUDIO_IN_AUTO, "wav header");
    size_t  n = d.n;

    for (size_t i = 0; i < n; i++) {
        assert_int_equal(d.s[i], (int16_t) (i * 7));
    }
    free(d.s);
    return n;
}

/* Streamed sizes (0xFFFFFFFF, 0), a data size beyond the file, an
 * odd-sized unknown chunk and its pad byte, the engine's own WAV. */
static void test_wav_headers(void **state) {
    Buf      b;
    Decoded  d;
    int16_t *s;

    b = wav_canon(0xFFFFFFFFu, 0xFFFFFFFFu, 1000);
    assert_int_equal(decoded_n(&b), 1000);
    free(b.p);
    b = wav_canon(0, 0, 1000);
    assert_int_equal(decoded_n(&b), 1000);
    free(b.p);
    /* a real RIFF size makes data size 0 an empty file */
    b = wav_canon(36, 0, 1000);
    assert_int_equal(decoded_n(&b), 0);
    free(b.p);
    /* cut short: the frames that are there, a partial one dropped */
    b = wav_canon(36 + 4000, 4000, 1000);
    b.n -= 1;
    assert_int_equal(decoded_n(&b), 999);
    free(b.p);
    /* bytes after the data chunk are not audio */
    b = wav_canon(36 + 200, 200, 1000);
    assert_int_equal(decoded_n(&b), 100);
    free(b.p);

    /* "junk" of 5 bytes + pad, and a LIST chunk, before fmt and data */
    b = wav_canon(0xFFFFFFFFu, 0xFFFFFFFFu, 300);
    {
        Buf     c = { 0 };
        uint8_t junk[14] = "junk\x05\0\0\0abcde";

        buf_put(&c, b.p, 12);
        buf_put(&c, junk, 14);
        buf_put(&c, "LIST\x04\0\0\0INFO", 12);
        buf_put(&c, b.p + 12, b.n - 12);
        assert_int_equal(decoded_n(&c), 300);
        free(c.p);
    }
    free(b.p);

    /* what the engine itself sends: streamed, both sizes 0xFFFFFFFF */
    s = tone_s16(SPEECH_RATE, 24000, 440, 0.5);
    b = engine_make(AUDIO_WAV, s, 24000);
    assert_int_equal(b.p[40], 0xFF);
    d = decode_ok(&b, AUDIO_IN_AUTO, "engine wav");
    check_count(&d, 24000, SPEECH_RATE, 0, "engine wav");
    check_tone(&d, 440, 0.5, 0.02, 60, "engine wav");
    free(d.s);
    free(b.p);
    free(s);
}

/* Headers we refuse, each by what is wrong. */
static void test_wav_refused(void **state) {
    static const struct {
        size_t      at;             // where the bytes go in wav_canon's
        const char *bytes;
        size_t      n;
        const char *prefix;
    } cases[] = {
        { 24, "\x01\0\0\0", 4, "wav: sample rate 1 Hz" },
        { 24, "\xff\xff\xff\xff", 4, "wav: sample rate 4294967295 Hz" },
        { 22, "\x08\0\x01\0\0\0", 6, "wav: sample rate 1 Hz" },
        { 22, "\x09\0", 2, "wav: 9 channels" },
        { 22, "\0\0", 2, "wav: 0 channels" },
        { 20, "\x02\0", 2, "wav: format 0x0002 (MS ADPCM)" },
        { 20, "\x55\0", 2, "wav: format 0x0055 (mp3)" },
        { 34, "\x0c\0", 2, "wav: format 0x0001 with 12 bits" },
        { 32, "\x04\0", 2, "wav: block align 4" },
        { 16, "\x0e\0\0\0", 4, "wav: fmt chunk of 14 bytes" },
        { 16, "\x00\x10\0\0", 4, "wav: truncated header" },
        { 12, "data", 4, "wav: data chunk before the fmt chunk" },
        { 36, "fact", 4, "wav: no data chunk" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Buf b = wav_canon(0xFFFFFFFFu, 0xFFFFFFFFu, 10);

        memcpy(b.p + cases[i].at, cases[i].bytes, cases[i].n);
        if (i + 1 == sizeof(cases) / sizeof(cases[0])) {
            b.n = 44;               // "fact" of 0xFFFFFFFF bytes, cut
            memcpy(b.p + 40, "\0\0\0\0", 4);
        }
        decode_fails(b.p, b.n, AUDIO_IN_AUTO, cases[i].prefix);
        free(b.p);
    }
    decode_fails((const uint8_t *) "RIFF\0\0\0\0WAVE", 12, AUDIO_IN_AUTO,
                 "wav: truncated header");
    decode_fails((const uint8_t *) "RIFF", 4, AUDIO_IN_WAV,
                 "wav: truncated header");
}


/* ---- mp3, flac, opus ---- */

/* Samples a format may add at 16 kHz beyond the input's duration: mp3
 * without a LAME tag keeps lame's 576 priming and libmpg123's 529
 * decoder delay and pads to a frame (576 at 24 kHz, 1152 at 44.1 kHz):
 * at most 1105 + 1152 input samples; the rest keep the exact length
 * (FLAC by construction, Opus by granule position, mp3 with a LAME tag
 * by libmpg123's gapless trimming). */
/* lame's files play 0.45 dB below their input (sox's reader agrees with
 * libmpg123 on it): a 0.5 tone comes back at 0.475. */
#define MP3_REL 0.08

static size_t mp3_slack(int rate) {
    return (size_t) ((1105.0 + 1152.0) * OUT_RATE / rate) + 1;
}

/* The engine's encoders: 1.5 s of 440 Hz at 24 kHz. */
static void test_engine_formats(void **state) {
    Buf     mp3 = engine_tone(AUDIO_MP3, 1.5, 440, 0.5);
    Buf     flac = engine_tone(AUDIO_FLAC, 1.5, 440, 0.5);
    Buf     opus = engine_tone(AUDIO_OPUS, 1.5, 440, 0.5);
    Buf     wav = engine_tone(AUDIO_WAV, 1.5, 440, 0.5);
    Decoded d, w;

    d = decode_ok(&mp3, AUDIO_IN_AUTO, "engine mp3");
    assert_int_equal(d.format, AUDIO_IN_MP3);
    assert_int_equal(d.rate, 24000);
    assert_int_equal(d.channels, 1);
    check_count(&d, 36000, 24000, mp3_slack(24000), "engine mp3");
    check_tone(&d, 440, 0.5, MP3_REL, 25, "engine mp3");
    free(d.s);

    /* lossless and through the same resampler: the WAV's very samples */
    d = decode_ok(&flac, AUDIO_IN_AUTO, "engine flac");
    w = decode_ok(&wav, AUDIO_IN_AUTO, "engine wav");
    assert_int_equal(d.format, AUDIO_IN_FLAC);
    assert_int_equal(d.rate, 24000);
    assert_int_equal(d.n, w.n);
    check_count(&d, 36000, 24000, 0, "engine flac");
    assert_memory_equal(d.s, w.s, d.n * sizeof(*d.s));
    free(d.s);
    free(w.s);

    d = decode_ok(&opus, AUDIO_IN_AUTO, "engine opus");
    assert_int_equal(d.format, AUDIO_IN_OPUS);
    assert_int_equal(d.rate, 48000);
    check_count(&d, 36000, 24000, 0, "engine opus");
    check_tone(&d, 440, 0.5, 0.05, 25, "engine opus");
    free(d.s);

    free(mp3.p);
    free(flac.p);
    free(opus.p);
    free(wav.p);
}

/* libsndfile's encoders: stereo, other rates, other bit depths. */
static void test_sndfile_formats(void **state) {
    static const struct {
        int           format, rate;
        AudioInFormat want;
        size_t        slack;
        double        rel, snr;
        const char   *name;
    } cases[] = {
        { SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 44100, AUDIO_IN_FLAC, 0,
          0.02, 70, "flac s16 44.1k" },
        { SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 96000, AUDIO_IN_FLAC, 0,
          0.02, 70, "flac s24 96k" },
        { SF_FORMAT_FLAC | SF_FORMAT_PCM_S8, 8000, AUDIO_IN_FLAC, 0,
          0.02, 35, "flac s8 8k" },
        { SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 44100, AUDIO_IN_MP3,
          1, MP3_REL, 25, "mp3 44.1k" },
        { SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 22050, AUDIO_IN_MP3,
          1, MP3_REL, 25, "mp3 22.05k" },
        { SF_FORMAT_OGG | SF_FORMAT_OPUS, 48000, AUDIO_IN_OPUS, 0,
          0.05, 25, "opus 48k" },
    };
    Tone two[2] = { T440, T440 };
    char what[64];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int ch = 1; ch <= 2; ch++) {
            Buf     b = sf_make(cases[i].format, cases[i].rate, ch, 1.0, two);
            Decoded d;

            snprintf(what, sizeof(what), "%s %s", cases[i].name,
                     ch == 1 ? "mono" : "stereo");
            d = decode_ok(&b, AUDIO_IN_AUTO, what);
            assert_int_equal(d.format, cases[i].want);
            assert_int_equal(d.channels, ch);
            if (cases[i].want != AUDIO_IN_OPUS) {
                assert_int_equal(d.rate, cases[i].rate);
            }
            check_count(&d, (size_t) cases[i].rate, cases[i].rate,
                        cases[i].slack ? mp3_slack(cases[i].rate) : 0, what);
            check_tone(&d, 440, 0.5, cases[i].rel, cases[i].snr, what);
            free(d.s);
            free(b.p);
        }
    }
}

/* An ID3v2 tag (with a text frame and padding) before mp3 and FLAC:
 * sniffed through, skipped, the same samples as without. */
static Buf id3_before(const Buf *b) {
    uint8_t tag[10 + 20 + 300] = { 'I', 'D', '3', 4, 0, 0 };
    Buf     c = { 0 };
    size_t  body = sizeof(tag) - 10;

    tag[6] = (uint8_t) (body >> 21 & 0x7F);
    tag[7] = (uint8_t) (body >> 14 & 0x7F);
    tag[8] = (uint8_t) (body >> 7 & 0x7F);
    tag[9] = (uint8_t) (body & 0x7F);
    memcpy(tag + 10, "TIT2\0\0\0\x0a\0\0\x03hello tag", 20);
    buf_put(&c, tag, sizeof(tag));
    buf_put(&c, b->p, b->n);
    return c;
}

static void test_id3(void **state) {
    Buf b[2] = { engine_tone(AUDIO_MP3, 0.5, 440, 0.5),
                 engine_tone(AUDIO_FLAC, 0.5, 440, 0.5) };

    for (int i = 0; i < 2; i++) {
        Buf     t = id3_before(&b[i]);
        Decoded d = decode_ok(&b[i], AUDIO_IN_AUTO, "no tag");
        Decoded e = decode_ok(&t, AUDIO_IN_AUTO, "id3 tag");

        assert_int_equal(audio_sniff(t.p, t.n, NULL),
                         i == 0 ? AUDIO_IN_MP3 : AUDIO_IN_FLAC);
        assert_int_equal(d.n, e.n);
        assert_memory_equal(d.s, e.s, d.n * sizeof(*d.s));
        free(d.s);
        free(e.s);
        free(t.p);
        free(b[i].p);
    }
}


/* ---- bad input ---- */

static bool starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* A file cut at several points decodes what it holds (no more samples
 * than the whole) or fails with a message naming its format. */
static void check_truncations(const Buf *b, const char *fmt,
                              AudioInFormat hint) {
    Decoded whole = decode_ok(b, hint, fmt);
    size_t  cuts[] = { 1, 4, 11, 30, 44, 60, 100, b->n / 3, b->n / 2,
                       b->n - 200, b->n - 1 };
    char    prefix[32];

    snprintf(prefix, sizeof(prefix), "%s: ", fmt);
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        Decoded d;

        if (cuts[i] == 0 || cuts[i] >= b->n) continue;
        d = decode_cap(b->p, cuts[i], hint, 4096, OUT_RATE);
        if (d.ok) {
            assert_true(d.n <= whole.n);
        } else if (!starts(d.err, prefix) && !starts(d.err, "not audio")) {
            fail_msg("%s cut at %zu: '%s'", fmt, cuts[i], d.err);
        }
        free(d.s);
    }
    free(whole.s);
}

static void test_truncated(void **state) {
    Buf     wav = sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, 0.5,
                          (Tone[2]) { T440, T440 });
    Buf     mp3 = engine_tone(AUDIO_MP3, 0.5, 440, 0.5);
    Buf     flac = engine_tone(AUDIO_FLAC, 0.5, 440, 0.5);
    Buf     opus = engine_tone(AUDIO_OPUS, 0.5, 440, 0.5);
    Decoded d;

    check_truncations(&wav, "wav", AUDIO_IN_AUTO);
    check_truncations(&mp3, "mp3", AUDIO_IN_AUTO);
    check_truncations(&mp3, "mp3", AUDIO_IN_MP3);
    check_truncations(&flac, "flac", AUDIO_IN_AUTO);
    check_truncations(&opus, "opus", AUDIO_IN_AUTO);

    /* cut inside the headers */
    decode_fails(wav.p, 30, AUDIO_IN_AUTO, "wav: truncated header");
    decode_fails(flac.p, 30, AUDIO_IN_AUTO, "flac: truncated header");
    decode_fails(opus.p, 30, AUDIO_IN_AUTO, "opus: truncated header");
    decode_fails(opus.p, 100, AUDIO_IN_AUTO, "opus: truncated header");
    decode_fails(mp3.p, 30, AUDIO_IN_AUTO, "mp3: no MPEG audio frame");

    /* half a WAV is half its samples (soxr's +-1) */
    d = decode_cap(wav.p, wav.n / 2, AUDIO_IN_AUTO, 4096, OUT_RATE);
    assert_true(d.ok);
    assert_true(d.n > 3900 && d.n < 4100);
    free(d.s);
    free(wav.p);
    free(mp3.p);
    free(flac.p);
    free(opus.p);
}

/* Damage in the middle: FLAC and Opus refuse it with the position. */
static void test_corrupt(void **state) {
    Buf     flac = engine_tone(AUDIO_FLAC, 1.0, 440, 0.5);
    Buf     opus = engine_tone(AUDIO_OPUS, 1.0, 440, 0.5);
    Buf     mp3 = engine_tone(AUDIO_MP3, 1.0, 440, 0.5);
    Decoded d;

    memset(flac.p + flac.n / 2, 0x55, 64);
    d = decode_buf(&flac, AUDIO_IN_AUTO);
    assert_false(d.ok);
    assert_true(starts(d.err, "flac: "));
    assert_non_null(strstr(d.err, " at byte "));
    free(d.s);

    memset(opus.p + opus.n / 2, 0x55, 64);
    d = decode_buf(&opus, AUDIO_IN_AUTO);
    assert_false(d.ok);
    assert_true(starts(d.err, "opus: "));
    assert_non_null(strstr(d.err, " near byte "));
    free(d.s);

    /* mp3 has no CRC: libmpg123 resyncs over short damage and may decode
     * it as noise; long damage fails with the frame's position */
    memset(mp3.p + 2000, 0, mp3.n - 4000);
    d = decode_buf(&mp3, AUDIO_IN_AUTO);
    if (!d.ok) {
        assert_true(starts(d.err, "mp3: "));
        assert_non_null(strstr(d.err, " at byte "));
    }
    free(d.s);
    free(flac.p);
    free(opus.p);
    free(mp3.p);
}

static void test_garbage(void **state) {
    static const char text[] = "hello, this is text and not a sound file";
    uint8_t  junk[8192];
    uint32_t x = 7;

    for (size_t i = 0; i < sizeof(junk); i++) {
        x = x * 1664525u + 1013904223u;
        junk[i] = (uint8_t) (x >> 24);
    }
    junk[0] = 0x12;                 // no accidental magic
    decode_fails(junk, sizeof(junk), AUDIO_IN_AUTO, "not audio: ");
    decode_fails((const uint8_t *) text, strlen(text), AUDIO_IN_AUTO,
                 "not audio: ");
    decode_fails(junk, 0, AUDIO_IN_AUTO, "not audio: 0 bytes");
    decode_fails(junk, 0, AUDIO_IN_MP3, "not audio: 0 bytes");
    /* with a hint, the hinted decoder says why (mp3 may find "frames" in
     * noise: then it decodes them, bounded) */
    decode_fails(junk, sizeof(junk), AUDIO_IN_WAV, "wav: no RIFF/WAVE");
    decode_fails(junk, sizeof(junk), AUDIO_IN_FLAC, "flac: ");
    decode_fails(junk, sizeof(junk), AUDIO_IN_OPUS, "opus: ");
    {
        Decoded d = decode_buf(&(Buf) { junk, sizeof(junk), 0, 0 },
                               AUDIO_IN_MP3);

        assert_true(d.ok || starts(d.err, "mp3: "));
        free(d.s);
    }
    decode_fails((const uint8_t *) text, strlen(text), AUDIO_IN_MP3,
                 "mp3: no MPEG audio frame");
}

/* Valid headers, no samples: open succeeds, the first read returns 0. */
static void test_empty(void **state) {
    Buf     wav = sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 0,
                          &T440);
    Buf     flac = engine_make(AUDIO_FLAC, NULL, 0);
    Buf     ewav = engine_make(AUDIO_WAV, NULL, 0);
    Buf     opus = engine_make(AUDIO_OPUS, NULL, 0);
    Decoded d;

    d = decode_ok(&wav, AUDIO_IN_AUTO, "empty wav");
    assert_int_equal(d.format, AUDIO_IN_WAV);
    assert_int_equal(d.n, 0);
    free(d.s);
    d = decode_ok(&ewav, AUDIO_IN_AUTO, "empty engine wav");
    assert_int_equal(d.n, 0);
    free(d.s);
    d = decode_ok(&flac, AUDIO_IN_AUTO, "empty flac");
    assert_int_equal(d.format, AUDIO_IN_FLAC);
    assert_int_equal(d.n, 0);
    free(d.s);
    /* the engine's empty opus holds one sample of silence (libopusenc
     * cannot drain nothing: audio/README.md), two at 48 kHz */
    d = decode_ok(&opus, AUDIO_IN_AUTO, "empty opus");
    assert_int_equal(d.format, AUDIO_IN_OPUS);
    assert_true(d.n <= 1);
    free(d.s);
    free(wav.p);
    free(flac.p);
    free(ewav.p);
    free(opus.p);
}

/* Containers recognised and refused by name, whatever the hint. */
static void test_refused_containers(void **state) {
    static const struct {
        const char *bytes;
        size_t      n;
        const char *name;
    } magic[] = {
        { "\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm", 16,
          "webm" },
        { "\x1a\x45\xdf\xa3\x9f\x42\x82\x88matroska", 16, "matroska" },
        { "\0\0\0\x20" "ftypM4A \0\0\0\0", 16, "mp4" },
        { "\xff\xf1\x50\x80\x02\x1f\xfc", 7, "aac" },
        { "#!AMR\n", 6, "amr" },
        { "RIFF\0\0\0\0AVI LIST", 16, "avi" },
    };
    static const struct {
        int         format;
        const char *name;
    } sf[] = {
        { SF_FORMAT_AIFF | SF_FORMAT_PCM_16, "aiff" },
        { SF_FORMAT_OGG | SF_FORMAT_VORBIS, "ogg vorbis" },
        { SF_FORMAT_AU | SF_FORMAT_PCM_16, "au" },
        { SF_FORMAT_CAF | SF_FORMAT_PCM_16, "caf" },
    };
    char want[64];

    for (size_t i = 0; i < sizeof(magic) / sizeof(magic[0]); i++) {
        for (int h = AUDIO_IN_AUTO; h <= AUDIO_IN_OPUS; h++) {
            snprintf(want, sizeof(want), "%s is not supported: send wav, "
                     "mp3, flac or ogg opus", magic[i].name);
            decode_fails((const uint8_t *) magic[i].bytes, magic[i].n,
                         (AudioInFormat) h, want);
        }
    }
    for (size_t i = 0; i < sizeof(sf) / sizeof(sf[0]); i++) {
        Buf         b = sf_make(sf[i].format, 44100, 1, 0.1, &T440);
        const char *other = "x";

        assert_int_equal(audio_sniff(b.p, b.n, &other), AUDIO_IN_AUTO);
        assert_non_null(other);
        assert_string_equal(other, sf[i].name);
        snprintf(want, sizeof(want), "%s is not supported", sf[i].name);
        decode_fails(b.p, b.n, AUDIO_IN_WAV, want);
        free(b.p);
    }
}

/* Opening refuses what it cannot decode: a FLAC STREAMINFO rate beyond
 * 384 kHz, a caller's output rate out of range. */
static void test_rates_refused(void **state) {
    Buf      flac = engine_tone(AUDIO_FLAC, 0.2, 440, 0.5);
    uint32_t rate = 500000;
    Decoded  d;
    Err      err;
    bool     oom;

    /* STREAMINFO's rate: 20 bits at byte 18 of the file */
    flac.p[18] = (uint8_t) (rate >> 12);
    flac.p[19] = (uint8_t) (rate >> 4);
    flac.p[20] = (uint8_t) ((flac.p[20] & 0x0F) | (rate & 0x0F) << 4);
    decode_fails(flac.p, flac.n, AUDIO_IN_AUTO,
                 "flac: sample rate 500000 Hz out of range");
    free(flac.p);

    flac = engine_tone(AUDIO_FLAC, 0.2, 440, 0.5);
    assert_null(audio_decoder_open(flac.p, flac.n, AUDIO_IN_AUTO, 999, &err,
                                   &oom));
    assert_non_null(strstr(err.msg, "out of range"));
    /* another output rate */
    d = decode_cap(flac.p, flac.n, AUDIO_IN_AUTO, 4096, 48000);
    assert_true(d.ok);
    assert_true(abs((int) d.n - 9600) <= 1);
    free(d.s);
    free(flac.p);
}


/* ---- reading ---- */

/* Caps of 1 and 7 give what caps of 4096 and a million give, in every
 * format (with and without the resampler). */
static void test_caps(void **state) {
    Buf b[] = {
        sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_24, 44100, 2, 0.4,
                (Tone[2]) { T440, { 1000, 0.2 } }),
        sf_make(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 0.4, &T440),
        engine_tone(AUDIO_MP3, 0.4, 440, 0.5),
        engine_tone(AUDIO_FLAC, 0.4, 440, 0.5),
        engine_tone(AUDIO_OPUS, 0.4, 440, 0.5),
    };
    static const size_t caps[] = { 1, 7, 1000000 };

    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
        Decoded ref = decode_ok(&b[i], AUDIO_IN_AUTO, "cap 4096");

        assert_true(ref.n > 1000);
        for (size_t k = 0; k < sizeof(caps) / sizeof(caps[0]); k++) {
            Decoded d = decode_cap(b[i].p, b[i].n, AUDIO_IN_AUTO, caps[k],
                                   OUT_RATE);

            assert_true(d.ok);
            assert_int_equal(d.n, ref.n);
            assert_memory_equal(d.s, ref.s, d.n * sizeof(*d.s));
            free(d.s);
        }
        free(ref.s);
        free(b[i].p);
    }
}

/* Four decoders of four formats on four threads at once, twice each:
 * the same samples as one at a time (no shared state between them). */
typedef struct {
    Buf     in;
    Decoded ref, got[2];
} Job;

static void *job_run(void *ud) {
    Job *j = ud;

    for (int k = 0; k < 2; k++) {
        j->got[k] = decode_cap(j->in.p, j->in.n, AUDIO_IN_AUTO, 1000,
                               OUT_RATE);
    }
    return NULL;
}

static void test_threads(void **state) {
    Job       jobs[4] = {
        { .in = sf_make(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 48000, 2, 0.5,
                        (Tone[2]) { T440, T440 }) },
        { .in = engine_tone(AUDIO_MP3, 0.5, 440, 0.5) },
        { .in = engine_tone(AUDIO_FLAC, 0.5, 440, 0.5) },
        { .in = engine_tone(AUDIO_OPUS, 0.5, 440, 0.5) },
    };
    pthread_t t[4];

    for (int i = 0; i < 4; i++) {
        jobs[i].ref = decode_cap(jobs[i].in.p, jobs[i].in.n, AUDIO_IN_AUTO,
                                 1000, OUT_RATE);
        assert_true(jobs[i].ref.ok);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_create(&t[i], NULL, job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        for (int k = 0; k < 2; k++) {
            assert_true(jobs[i].got[k].ok);
            assert_int_equal(jobs[i].got[k].n, jobs[i].ref.n);
            assert_memory_equal(jobs[i].got[k].s, jobs[i].ref.s,
                                jobs[i].ref.n * sizeof(int16_t));
            free(jobs[i].got[k].s);
        }
        free(jobs[i].ref.s);
        free(jobs[i].in.p);
    }
}

/* audio_sniff on first bytes alone, the names, the parser. */
static void test_sniff(void **state) {
    static const struct {
        const char    *bytes;
        size_t         n;
        AudioInFormat  want;
    } cases[] = {
        { "RIFF\0\0\0\0WAVE", 12, AUDIO_IN_WAV },
        { "RF64\xff\xff\xff\xffWAVE", 12, AUDIO_IN_WAV },
        { "fLaC\0\0\0\x22", 8, AUDIO_IN_FLAC },
        { "OggS\0\x02\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01\x13"
          "OpusHead", 36, AUDIO_IN_OPUS },
        { "ID3\x04\0\0\0\0\x10\0", 10, AUDIO_IN_MP3 },
        { "\xff\xfb\x90\x64", 4, AUDIO_IN_MP3 },      // MPEG-1 L3 128k
        { "\xff\xf3\x84\xc4", 4, AUDIO_IN_MP3 },      // MPEG-2 L3 64k
        { "\xff\xfb\xf0\x64", 4, AUDIO_IN_AUTO },     // bitrate index 15
        { "\xff\xfb\x9c\x64", 4, AUDIO_IN_AUTO },     // rate index 3
        { "\xff\xeb\x90\x64", 4, AUDIO_IN_AUTO },     // version 01
        { "\xff\xf9\x90\x64", 4, AUDIO_IN_AUTO },     // layer 00 (ADTS)
        { "\xff\xfb\x90\x66", 4, AUDIO_IN_AUTO },     // emphasis 10
        { "\xff\xfb", 2, AUDIO_IN_AUTO },
        { "", 0, AUDIO_IN_AUTO },
    };
    AudioInFormat f;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *other = "x";

        assert_int_equal(audio_sniff((const uint8_t *) cases[i].bytes,
                                     cases[i].n, &other), cases[i].want);
        if (cases[i].want != AUDIO_IN_AUTO) assert_null(other);
    }
    assert_string_equal(audio_in_format_name(AUDIO_IN_WAV), "wav");
    assert_string_equal(audio_in_format_name(AUDIO_IN_OPUS), "opus");
    assert_string_equal(audio_in_format_name(AUDIO_IN_AUTO), "auto");
    assert_int_equal(request_audio_format("ogg", &f), 0);
    assert_int_equal(f, AUDIO_IN_OPUS);
    assert_int_equal(request_audio_format("flac", &f), 0);
    assert_int_equal(f, AUDIO_IN_FLAC);
    assert_int_equal(request_audio_format("auto", &f), 0);
    assert_int_equal(f, AUDIO_IN_AUTO);
    assert_int_equal(request_audio_format("webm", &f), -1);
}


/* ---- the fuzzer's seeds ---- */

static void seed_put(const char *dir, const char *name, Buf b) {
    char  path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/seed-%s", dir, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(b.p, 1, b.n, f) != b.n || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", path);
        exit(1);
    }
    free(b.p);
}

/* Small files of every format and layout, 50 to 100 ms each. */
static int write_seeds(const char *dir) {
    static const struct {
        int         format, rate, channels;
        const char *name;
    } sf[] = {
        { SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 8000, 1, "u8.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 2, "s16.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_24, 8000, 1, "s24.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_PCM_32, 8000, 1, "s32.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_FLOAT, 8000, 2, "f32.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_DOUBLE, 8000, 1, "f64.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_ULAW, 8000, 1, "ulaw.wav" },
        { SF_FORMAT_WAV | SF_FORMAT_ALAW, 8000, 1, "alaw.wav" },
        { SF_FORMAT_WAVEX | SF_FORMAT_PCM_16, 8000, 3, "wavex.wav" },
        { SF_FORMAT_RF64 | SF_FORMAT_PCM_16, 8000, 1, "rf64.wav" },
        { SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 8000, 2, "s24.flac" },
        { SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 8000, 2, "lame.mp3" },
        { SF_FORMAT_OGG | SF_FORMAT_OPUS, 8000, 2, "stereo.opus" },
    };
    Tone two[3] = { T440, { 1000, 0.3 }, T440 };

    for (size_t i = 0; i < sizeof(sf) / sizeof(sf[0]); i++) {
        seed_put(dir, sf[i].name, sf_make(sf[i].format, sf[i].rate,
                                          sf[i].channels, 0.05, two));
    }
    seed_put(dir, "engine.mp3", engine_tone(AUDIO_MP3, 0.1, 440, 0.5));
    seed_put(dir, "engine.flac", engine_tone(AUDIO_FLAC, 0.1, 440, 0.5));
    seed_put(dir, "engine.opus", engine_tone(AUDIO_OPUS, 0.1, 440, 0.5));
    seed_put(dir, "stream.wav", wav_canon(0xFFFFFFFFu, 0xFFFFFFFFu, 400));
    {
        Buf b = engine_tone(AUDIO_FLAC, 0.05, 440, 0.5);

        seed_put(dir, "id3.flac", id3_before(&b));
        free(b.p);
        b = engine_tone(AUDIO_MP3, 0.05, 440, 0.5);
        seed_put(dir, "id3.mp3", id3_before(&b));
        free(b.p);
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wav_formats),
        cmocka_unit_test(test_wav_exact),
        cmocka_unit_test(test_wav_channels),
        cmocka_unit_test(test_wav_headers),
        cmocka_unit_test(test_wav_refused),
        cmocka_unit_test(test_engine_formats),
        cmocka_unit_test(test_sndfile_formats),
        cmocka_unit_test(test_id3),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_refused_containers),
        cmocka_unit_test(test_rates_refused),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_sniff),
    };
    const char *seeds = getenv("OMNI_AUDIO_SEEDS");

    if (seeds != NULL && *seeds != '\0') {
        return write_seeds(seeds);
    }
    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("audio_in", tests, NULL, NULL);
}

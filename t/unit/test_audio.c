/* test_audio.c -- the audio encoders (engine/audio/encode.c, enc_*.c) and
 * the resampler (resample.c).
 *
 * Every format encodes 1.5 s of a known signal (a 440 Hz tone plus a
 * 200 Hz -> 4 kHz chirp) at 24 kHz, once whole and once in pieces of 1,
 * 7, 480 and 4099 samples: the bytes must be the same. The chunked file is
 * decoded by an independent decoder (t/tools/audio_decode.c: libmpg123,
 * libopusfile, faad2, libsndfile): 24 kHz, mono, as long as the input
 * plus at most the codec's priming and padding (FMT_PAD), and the signal
 * is there (RMS within 3 dB of the input's); wav, pcm and flac decode
 * bit-exact. Also: what each format gives for an empty stream, a sink
 * that refuses, calls after finish or a failure, audio_wav_patch.
 *
 * The resampler: pieces give the same output as one call, a 1 kHz sine at
 * 16 kHz comes out at 24 kHz with its frequency and level, and the
 * held-back input before the first output is reported. */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../tools/audio_decode.h"
#include "encode.h"
#include "resample.h"

#define RATE   SPEECH_RATE
#define N_SIG  (RATE * 3 / 2)       // 1.5 s

/* Samples a decoder may return beyond the input: mp3 (MPEG-2 Layer III,
 * 576-sample frames, no gapless tag): lame's 576 + 529 decoder delay,
 * then padding to a frame; aac: 1024 priming + padding to a 1024 frame
 * + faad's own frame; opus: opusfile trims pre-skip and end padding
 * exactly (granule position), so 0. */
static const size_t FMT_PAD[AUDIO_N_FORMATS] = {
    [AUDIO_MP3] = 576 * 4, [AUDIO_AAC] = 1024 * 3, [AUDIO_OPUS] = 0,
};

static const size_t PIECES[] = { 1, 7, 480, 4099 };

typedef struct {
    uint8_t *p;
    size_t   n, cap;
    int      calls;
    int      refuse_at;             // the call (1-based) that gets -1; 0 none
} Out;

static int out_sink(void *ud, const uint8_t *p, size_t n) {
    Out *o = ud;

    assert_true(n > 0);
    if (++o->calls == o->refuse_at) {
        return -1;
    }
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2;
        o->p = realloc(o->p, o->cap);
        assert_non_null(o->p);
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
    return 0;
}

static int16_t *signal_new(void) {
    int16_t *s = malloc(N_SIG * sizeof(*s));

    assert_non_null(s);
    for (int i = 0; i < N_SIG; i++) {
        double t = (double) i / RATE;
        double f = 200.0 * t + (3800.0 / 3.0) * t * t;   // 200 Hz -> 4 kHz

        s[i] = (int16_t) lrint(32767.0 * (0.3 * sin(2 * M_PI * 440 * t)
                                          + 0.2 * sin(2 * M_PI * f)));
    }
    return s;
}

static double rms_of(const int16_t *s, size_t n) {
    double sum = 0;

    for (size_t i = 0; i < n; i++) {
        sum += (s[i] / 32768.0) * (s[i] / 32768.0);
    }
    return n ? sqrt(sum / (double) n) : 0;
}

/* Encodes n samples of s as format f, in pieces cycling through PIECES
 * (chunked) or in one call. */
static Out encode(AudioFormat f, const int16_t *s, size_t n, bool chunked) {
    Out           o = { 0 };
    Err           err;
    AudioEncoder *e = audio_encoder_open(f, RATE, out_sink, &o, &err);
    size_t        at = 0;

    if (e == NULL) {
        fail_msg("%s: %s", speech_format_name(f), err.msg);
    }
    for (int k = 0; at < n; k++) {
        size_t m = chunked ? PIECES[k % 4] : n;

        m = m < n - at ? m : n - at;
        if (audio_encoder_write(e, s + at, m, &err) != 0) {
            fail_msg("%s: %s", speech_format_name(f), err.msg);
        }
        at += m;
    }
    if (audio_encoder_finish(e, &err) != 0) {
        fail_msg("%s: %s", speech_format_name(f), err.msg);
    }
    audio_encoder_free(e);
    return o;
}

static void decode_ok(AudioFormat f, const Out *o, AudioDecoded *d) {
    char why[256];

    if (audio_decode(speech_format_name(f), o->p, o->n, RATE, d, why,
                     sizeof(why)) != 0) {
        fail_msg("%s: %s", speech_format_name(f), why);
    }
}


/* ---- every format ---- */

static void check_format(AudioFormat f) {
    int16_t      *s = signal_new();
    Out           whole = encode(f, s, N_SIG, false);
    Out           parts = encode(f, s, N_SIG, true);
    AudioDecoded  d;
    double        rms_in = rms_of(s, N_SIG), rms, peak;

    assert_int_equal(whole.n, parts.n);
    assert_memory_equal(whole.p, parts.p, whole.n);
    decode_ok(f, &parts, &d);
    assert_int_equal(d.rate, RATE);
    assert_int_equal(d.channels, 1);
    assert_true(d.samples >= N_SIG);
    assert_true(d.samples <= N_SIG + FMT_PAD[f]);
    audio_decoded_level(&d, &rms, &peak);
    assert_true(fabs(20 * log10(rms / rms_in)) < 3.0);
    if (f == AUDIO_WAV || f == AUDIO_PCM || f == AUDIO_FLAC) {
        assert_int_equal(d.pcm_frames, N_SIG);
        assert_memory_equal(d.pcm, s, N_SIG * sizeof(*s));
    }
    print_message("# %-4s %6zu bytes for 1.5 s, %zu sink calls (pieces), "
                  "decoded %zu samples, %+.2f dB\n", speech_format_name(f),
                  parts.n, (size_t) parts.calls, d.samples,
                  20 * log10(rms / rms_in));
    audio_decoded_free(&d);
    free(whole.p);
    free(parts.p);
    free(s);
}

static void test_mp3(void **state) {
    int16_t *s = signal_new();
    Out      o = encode(AUDIO_MP3, s, N_SIG, true);

    /* MPEG-2 Layer III frame sync, no CRC, as OpenAI's files start */
    assert_true(o.n > 2 && o.p[0] == 0xFF && o.p[1] == 0xF3);
    free(o.p);
    free(s);
    check_format(AUDIO_MP3);
}

static void test_opus(void **state) {
    int16_t *s = signal_new();
    Out      o = encode(AUDIO_OPUS, s, N_SIG, true);

    assert_true(o.n > 4 && memcmp(o.p, "OggS", 4) == 0);
    /* pages flow while encoding: far more than the two header pages and
     * one end page (60 ms a page: ~25 for 1.5 s) */
    assert_true(o.calls > 20);
    free(o.p);
    free(s);
    check_format(AUDIO_OPUS);
}

static void test_aac(void **state) {
    int16_t *s = signal_new();
    Out      o = encode(AUDIO_AAC, s, N_SIG, true);

    /* ADTS: sync, MPEG-4, no CRC; AAC LC, 24 kHz (index 6), mono */
    assert_true(o.n > 7 && o.p[0] == 0xFF && o.p[1] == 0xF1);
    assert_int_equal(o.p[2], (1 << 6) | (6 << 2));
    assert_int_equal(o.p[3] >> 6, 1);
    free(o.p);
    free(s);
    check_format(AUDIO_AAC);
}

static void test_flac(void **state) {
    int16_t *s = signal_new();
    Out      o = encode(AUDIO_FLAC, s, N_SIG, true);

    assert_true(o.n > 4 && memcmp(o.p, "fLaC", 4) == 0);
    free(o.p);
    free(s);
    check_format(AUDIO_FLAC);
}

static const uint8_t WAV_HEAD[44] = {
    0x52, 0x49, 0x46, 0x46, 0xFF, 0xFF, 0xFF, 0xFF, 0x57, 0x41, 0x56, 0x45,
    0x66, 0x6D, 0x74, 0x20, 0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00,
    0xC0, 0x5D, 0x00, 0x00, 0x80, 0xBB, 0x00, 0x00, 0x02, 0x00, 0x10, 0x00,
    0x64, 0x61, 0x74, 0x61, 0xFF, 0xFF, 0xFF, 0xFF,
};

static void test_wav(void **state) {
    int16_t      *s = signal_new();
    Out           o = encode(AUDIO_WAV, s, N_SIG, true);
    AudioDecoded  d;

    /* openai-api.md 7.2, byte for byte */
    assert_int_equal(o.n, 44 + 2 * N_SIG);
    assert_memory_equal(o.p, WAV_HEAD, 44);
    /* the patched file says its sizes and still decodes the same */
    assert_int_equal(audio_wav_patch(o.p, o.n), 0);
    assert_memory_equal(o.p + 4, "\x64\x19\x01\x00", 4);  // 36 + 72000
    assert_memory_equal(o.p + 40, "\x40\x19\x01\x00", 4); // 72000
    decode_ok(AUDIO_WAV, &o, &d);
    assert_int_equal(d.pcm_frames, N_SIG);
    assert_memory_equal(d.pcm, s, sizeof(*s) * N_SIG);
    audio_decoded_free(&d);
    /* patching twice is fine; what is not our WAV is refused */
    assert_int_equal(audio_wav_patch(o.p, o.n), 0);
    assert_int_equal(audio_wav_patch(o.p, 43), -1);
    assert_int_equal(audio_wav_patch(o.p, o.n - 1), -1);
    o.p[22] = 2;                                        // stereo
    assert_int_equal(audio_wav_patch(o.p, o.n), -1);
    free(o.p);
    free(s);
    check_format(AUDIO_WAV);
}

static void test_pcm(void **state) {
    int16_t *s = signal_new();
    Out      o = encode(AUDIO_PCM, s, N_SIG, true);

    assert_int_equal(o.n, 2 * N_SIG);
    assert_memory_equal(o.p, s, o.n);
    free(o.p);
    free(s);
    check_format(AUDIO_PCM);
}

/* Finish with no samples: aac and pcm give 0 bytes (no sink call: ADTS
 * has no file header), wav its 44-byte header, flac a header-only stream;
 * all three decode to 0 samples. mp3 is lame's flush, two frames of
 * silence (1152 samples); opus one sample of silence (enc_opus.c says
 * why). Each stream that has bytes decodes as its format. */
static void test_empty(void **state) {
    static const size_t SAMPLES[AUDIO_N_FORMATS] = {
        [AUDIO_MP3] = 1152, [AUDIO_OPUS] = 1,
    };

    for (int f = 0; f < AUDIO_N_FORMATS; f++) {
        Out          o = encode(f, NULL, 0, false);
        AudioDecoded d;
        double       rms, peak;

        if (f == AUDIO_AAC || f == AUDIO_PCM) {
            assert_int_equal(o.n, 0);
            assert_int_equal(o.calls, 0);
            continue;
        }
        decode_ok(f, &o, &d);
        assert_int_equal(d.rate, RATE);
        assert_int_equal(d.channels, 1);
        assert_int_equal(d.samples, SAMPLES[f]);
        audio_decoded_level(&d, &rms, &peak);
        assert_true(peak < 0.001);
        audio_decoded_free(&d);
        free(o.p);
    }
}

/* A sink that refuses its first call fails the call that made it (open,
 * write or finish), with "output refused"; the encoder is then unusable. */
static void test_refused(void **state) {
    int16_t *s = signal_new();

    for (int f = 0; f < AUDIO_N_FORMATS; f++) {
        Out           o = { .refuse_at = 1 };
        Err           err = { "" };
        AudioEncoder *e = audio_encoder_open(f, RATE, out_sink, &o, &err);
        int           rc = e == NULL ? -1 : 0;

        if (rc == 0) {
            rc = audio_encoder_write(e, s, N_SIG, &err);
        }
        if (rc == 0) {
            rc = audio_encoder_finish(e, &err);
        }
        assert_int_equal(rc, -1);
        assert_int_equal(o.calls, 1);
        if (strstr(err.msg, "output refused") == NULL) {
            fail_msg("%s: \"%s\"", speech_format_name(f), err.msg);
        }
        if (e != NULL) {
            assert_int_equal(audio_encoder_write(e, s, 1, &err), -1);
            assert_non_null(strstr(err.msg, "after a failure"));
        }
        audio_encoder_free(e);
    }
    free(s);
}

static void test_misuse(void **state) {
    Out           o = { 0 };
    Err           err;
    AudioEncoder *e;
    int16_t       s[4] = { 0 };

    assert_null(audio_encoder_open(AUDIO_N_FORMATS, RATE, out_sink, &o,
                                   &err));
    assert_non_null(strstr(err.msg, "unknown format"));
    assert_null(audio_encoder_open(AUDIO_MP3, 0, out_sink, &o, &err));
    assert_null(audio_encoder_open(AUDIO_MP3, RATE, NULL, &o, &err));
    e = audio_encoder_open(AUDIO_OPUS, RATE, out_sink, &o, &err);
    assert_non_null(e);
    assert_int_equal(audio_encoder_write(e, s, 0, &err), 0);
    assert_int_equal(audio_encoder_finish(e, &err), 0);
    assert_int_equal(audio_encoder_write(e, s, 4, &err), -1);
    assert_non_null(strstr(err.msg, "after finish"));
    assert_int_equal(audio_encoder_finish(e, &err), -1);
    audio_encoder_free(e);
    audio_encoder_free(NULL);
    free(o.p);
}


/* ---- the resampler ---- */

#define RS_IN  16000
#define RS_N   (RS_IN * 2)          // 2 s at 16 kHz

static void sine_1k(int16_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        s[i] = (int16_t) lrint(16384 * sin(2 * M_PI * 1000.0 * i / RS_IN));
    }
}

/* Runs the whole of in through a fresh resampler in pieces of the given
 * sizes (cycled; one piece when NULL), then flushes. Returns the output
 * (malloc'd), its length in *n_out, and in *held the input samples that
 * went in before the first output sample came out. */
static int16_t *resample_all(const int16_t *in, size_t n,
                             const size_t *sizes, size_t n_sizes,
                             size_t *n_out, size_t *held) {
    Err        err;
    Resampler *r = resample_new(RS_IN, RATE, &err);
    size_t     cap = resample_out_max(r, n) + RATE, at = 0, got;
    int16_t   *out = malloc(cap * sizeof(*out));

    assert_non_null(r);
    *n_out = 0;
    *held = 0;
    for (size_t k = 0; at < n; k++) {
        size_t m = sizes != NULL ? sizes[k % n_sizes] : n;

        m = m < n - at ? m : n - at;
        assert_int_equal(resample_process(r, in + at, m, out + *n_out,
                                          resample_out_max(r, m), &got,
                                          &err), 0);
        at += m;
        if (*n_out == 0 && got > 0) {
            *held = at;
        }
        *n_out += got;
    }
    do {
        assert_int_equal(resample_flush(r, out + *n_out, cap - *n_out, &got,
                                        &err), 0);
        *n_out += got;
    } while (got > 0 && *n_out < cap);
    resample_free(r);
    return out;
}

static void test_resample(void **state) {
    static const size_t ODD[] = { 1, 7, 160, 4099, 13, 480 };
    static const size_t TEN_MS[] = { 160 };
    int16_t *in = malloc(RS_N * sizeof(*in)), *one, *many, *tick;
    size_t   n_one, n_many, n_tick, held, held_tick, crossings = 0;
    double   rms;

    sine_1k(in, RS_N);
    one = resample_all(in, RS_N, NULL, 0, &n_one, &held);
    many = resample_all(in, RS_N, ODD, 6, &n_many, &held);
    tick = resample_all(in, RS_N, TEN_MS, 1, &n_tick, &held_tick);
    /* whole = pieces, and nothing lost: 1.5 x the input */
    assert_int_equal(n_one, RS_N * 3 / 2);
    assert_int_equal(n_many, n_one);
    assert_memory_equal(one, many, n_one * sizeof(*one));
    assert_int_equal(n_tick, n_one);
    assert_memory_equal(one, tick, n_one * sizeof(*one));
    /* the middle second: 1000 periods (2000 zero crossings), the level of
     * a 0.5-amplitude sine (0.3536 RMS) within 0.1 dB */
    for (size_t i = RATE / 2; i < RATE / 2 + RATE; i++) {
        crossings += (one[i] < 0) != (one[i + 1] < 0);
    }
    assert_true(crossings >= 1999 && crossings <= 2001);
    rms = rms_of(one + RATE / 2, RATE);
    assert_true(fabs(20 * log10(rms / (0.5 / sqrt(2)))) < 0.1);
    print_message("# resample 16 -> 24 kHz: first output after %zu input "
                  "samples (%.1f ms) fed 10 ms at a time\n", held_tick,
                  1000.0 * held_tick / RS_IN);
    free(in);
    free(one);
    free(many);
    free(tick);
}

static void test_resample_refuses(void **state) {
    Err        err;
    Resampler *r;
    int16_t    in[4000] = { 0 }, out[8];
    size_t     got;

    assert_null(resample_new(0, RATE, &err));
    assert_non_null(strstr(err.msg, "out of range"));
    r = resample_new(RS_IN, RATE, &err);
    assert_non_null(r);
    /* a cap too small for the input is an error, never dropped input */
    assert_int_equal(resample_process(r, in, 4000, out, 8, &got, &err), -1);
    assert_non_null(strstr(err.msg, "full"));
    assert_int_equal(resample_process(r, in, 0, out, 8, &got, &err), 0);
    assert_int_equal(got, 0);
    resample_free(r);
    resample_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mp3),
        cmocka_unit_test(test_opus),
        cmocka_unit_test(test_aac),
        cmocka_unit_test(test_flac),
        cmocka_unit_test(test_wav),
        cmocka_unit_test(test_pcm),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_resample),
        cmocka_unit_test(test_resample_refuses),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

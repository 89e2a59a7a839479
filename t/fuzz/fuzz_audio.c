/* fuzz_audio.c -- libFuzzer target: arbitrary bytes as an uploaded audio
 * file, through what the listener runs on it: audio_sniff, then
 * audio_decoder_open and reads to the end, at 16 kHz.
 *
 * Every hint is tried on bytes that sniff as nothing (there the hint picks
 * the decoder: WAV's parser, libmpg123 resyncing over junk, libFLAC,
 * opusfile); bytes that sniff as a format, or as a refused container, are
 * decoded once with no hint and opened once more with another, which must
 * change nothing. The read cap cycles through 1, 7, 160 and 4096 samples
 * (by the input's length), and reading stops after MAX_OUT samples, as
 * the listener stops at max_audio_seconds: a few bytes of FLAC or Opus
 * may legally say minutes of silence.
 *
 * Besides the sanitizers, the target checks contracts, aborting (which
 * libFuzzer reports as a crash) when one breaks: sniffing the first 64
 * bytes says what sniffing everything says (ID3-tagged input aside: the
 * sniffer looks behind the tag); a sniffed format is the one opened,
 * whatever the hint; an open decoder has a rate in 1000..384000 and 1..8
 * channels; a read returns at most cap, and audio_decoder_samples counts
 * what reads returned; a failure always says why, in a NUL-terminated
 * message that names a format or says "not audio"; memory never runs out
 * (*oom stays false: libFuzzer's -malloc_limit_mb catches a runaway
 * allocation first). */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"
#include "log.h"

#define OUT_RATE 16000
#define MAX_OUT  (1 << 18)              // 16 s at 16 kHz

static const size_t CAPS[] = { 1, 7, 160, 4096 };

static int16_t out[4096];

static void check_err(const Err *err) {
    static const char *const prefixes[] = {
        "wav: ", "mp3: ", "flac: ", "opus: ", "not audio: ",
    };
    size_t n = strnlen(err->msg, sizeof(err->msg));

    if (n == 0 || n == sizeof(err->msg)) abort();
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        if (strncmp(err->msg, prefixes[i], strlen(prefixes[i])) == 0) return;
    }
    if (strstr(err->msg, " is not supported: send wav, mp3, flac or ogg "
                         "opus") == NULL) {
        abort();
    }
}

/* Opens data with hint and reads it to the end (or MAX_OUT). Returns the
 * format opened, or AUDIO_IN_AUTO when opening failed. */
static AudioInFormat decode(const uint8_t *data, size_t len,
                            AudioInFormat hint, size_t cap, bool read) {
    AudioDecoder  *d;
    AudioInFormat  f;
    uint64_t       total = 0;
    ssize_t        k;
    Err            err;
    bool           oom = true;

    memset(&err, 0, sizeof(err));
    d = audio_decoder_open(data, len, hint, OUT_RATE, &err, &oom);
    if (oom) abort();
    if (d == NULL) {
        check_err(&err);
        return AUDIO_IN_AUTO;
    }
    f = audio_decoder_format(d);
    if (f == AUDIO_IN_AUTO || audio_decoder_rate(d) < 1000
        || audio_decoder_rate(d) > 384000 || audio_decoder_channels(d) < 1
        || audio_decoder_channels(d) > 8) {
        abort();
    }
    while (read && total < MAX_OUT) {
        k = audio_decoder_read(d, out, cap, &err, &oom);
        if (oom) abort();
        if (k < 0) {
            check_err(&err);
            break;
        }
        if (k == 0) break;
        if ((size_t) k > cap) abort();
        total += (uint64_t) k;
        if (audio_decoder_samples(d) != total) abort();
    }
    audio_decoder_free(d);
    return f;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void) argc;
    (void) argv;
    log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
    const char    *other, *other64;
    AudioInFormat  sniffed, f, g;
    size_t         cap = CAPS[len % 4];

    sniffed = audio_sniff(data, len, &other);
    if ((unsigned) sniffed > AUDIO_IN_OPUS
        || (sniffed != AUDIO_IN_AUTO && other != NULL)) {
        abort();
    }
    if (len < 3 || memcmp(data, "ID3", 3) != 0) {
        if (audio_sniff(data, len < 64 ? len : 64, &other64) != sniffed
            || (other == NULL) != (other64 == NULL)
            || (other != NULL && strcmp(other, other64) != 0)) {
            abort();
        }
    }
    if (sniffed != AUDIO_IN_AUTO || other != NULL) {
        f = decode(data, len, AUDIO_IN_AUTO, cap, true);
        if (f != AUDIO_IN_AUTO && f != sniffed) abort();
        g = decode(data, len, (AudioInFormat) (1 + len % 4), cap, false);
        if (g != f) abort();
        return 0;
    }
    if (decode(data, len, AUDIO_IN_AUTO, cap, true) != AUDIO_IN_AUTO) {
        abort();                        // nothing sniffed, no hint: refused
    }
    for (int h = AUDIO_IN_WAV; h <= AUDIO_IN_OPUS; h++) {
        f = decode(data, len, (AudioInFormat) h, cap, true);
        if (f != AUDIO_IN_AUTO && f != (AudioInFormat) h) abort();
    }
    return 0;
}

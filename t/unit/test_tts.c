/* test_tts.c -- the text side of engine/tts: the units' byte form
 * (units.c), the analyzer (analyze.c) and the chunker (chunker.c).
 *
 *   - units round-trip; units_decode refuses every truncation of a valid
 *     chunk, trailing bytes, a bad magic or flags, too many words, unknown
 *     phones, silences, vowels without stress and consonants with one,
 *     stray spaces, unprintable text, each with an error that says which;
 *     and it survives every one-byte change and random bytes (anything it
 *     accepts passes its own checks again after re-encoding);
 *   - the analyzer on hostile text (non-ASCII letters, emoji, control
 *     characters, invalid UTF-8, 4096-character inputs, a 500-letter word,
 *     only punctuation, numbers, abbreviations): no crash, valid units that
 *     the synthesizer accepts, and what can be said is said;
 *   - the chunker: both modes give the same chunks whether the text comes
 *     a byte at a time or at once; latency mode's first chunk has at most
 *     first_words words; cuts fall at punctuation and never inside a word;
 *     a text without spaces longer than the buffer is cut at a character
 *     boundary. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "analyze.h"
#include "chunker.h"
#include "synth.h"
#include "units.h"
#include "test_tts.h"

static uint8_t bytes[UNITS_MAX_BYTES];

/* A chunk of the given words: "text|phones|prepunc|punc" each. */
static long make(const char *const *spec, int n, uint8_t *buf, size_t cap) {
    UnitWord w[8];
    char     copy[8][128];
    Units    u = { w, n, 0, false, NULL };

    for (int i = 0; i < n; i++) {
        char *f[4], *s = copy[i];

        snprintf(copy[i], sizeof(copy[i]), "%s", spec[i]);
        for (int k = 0; k < 4; k++) {
            f[k] = s;
            s = strchr(s, '|');
            if (s != NULL) *s++ = '\0';
            else s = f[k] + strlen(f[k]);
        }
        w[i] = (UnitWord) { f[0], f[1], f[2], f[3] };
    }
    return units_encode(&u, buf, cap);
}

static void expect_error(const char *spec, const char *needle) {
    Units u;
    Err   err;
    long  n = make(&spec, 1, bytes, sizeof(bytes));

    assert_true(n > 0);
    assert_int_equal(units_decode(&u, bytes, (size_t) n, &err), -1);
    if (strstr(err.msg, needle) == NULL)
        fail_msg("'%s': error '%s' does not say '%s'", spec, err.msg, needle);
    assert_null(u.arena);
}

// ---------------------------------------------------------------------------
// Units

static const char *HELLO[] = {
    "Hello|hh ax0 l ow1|\"|,", "world|w er1 l d||.\"", "--|||",
};

static void test_units_round_trip(void **state) {
    Units u, v;
    Err   err;
    long  n = make(HELLO, 3, bytes, sizeof(bytes)), m;
    uint8_t again[256];

    assert_true(n > 0);
    assert_int_equal(units_decode(&u, bytes, (size_t) n, &err), 0);
    assert_int_equal(u.n_words, 3);
    assert_int_equal(u.n_phones, 8);
    assert_false(u.last);
    assert_string_equal(u.words[0].text, "Hello");
    assert_string_equal(u.words[0].phones, "hh ax0 l ow1");
    assert_string_equal(u.words[0].prepunc, "\"");
    assert_string_equal(u.words[0].punc, ",");
    assert_string_equal(u.words[1].punc, ".\"");
    assert_string_equal(u.words[2].phones, "");
    u.last = true;
    assert_int_equal(units_encode(&u, again, 10), -1);   // does not fit
    m = units_encode(&u, again, sizeof(again));
    assert_int_equal(m, n);
    assert_int_equal(units_decode(&v, again, (size_t) m, &err), 0);
    assert_true(v.last);
    units_free(&u);
    units_free(&v);
    assert_int_equal(units_decode(&u, (const uint8_t *) "OTU1\0\0\0\0", 8,
                                  &err), 0);                // no words
    assert_int_equal(u.n_words, 0);
    units_free(&u);
}

static void test_units_refused(void **state) {
    Units u;
    Err   err;
    long  n = make(HELLO, 3, bytes, sizeof(bytes));

    for (long k = 0; k < n; k++)            // every truncation
        assert_int_equal(units_decode(&u, bytes, (size_t) k, &err), -1);
    assert_int_equal(units_decode(&u, bytes, (size_t) n + 1, &err), -1);
    assert_non_null(strstr(err.msg, "after the last word"));
    bytes[0] = 'X';
    assert_int_equal(units_decode(&u, bytes, (size_t) n, &err), -1);
    assert_non_null(strstr(err.msg, "not a chunk"));
    bytes[0] = 'O';
    bytes[4] = 2;
    assert_int_equal(units_decode(&u, bytes, (size_t) n, &err), -1);
    assert_non_null(strstr(err.msg, "flags"));
    bytes[4] = 0;
    bytes[6] = 0x01;
    bytes[7] = 0x01;                        // 257 words
    assert_int_equal(units_decode(&u, bytes, (size_t) n, &err), -1);
    assert_non_null(strstr(err.msg, "257 words"));
    assert_int_equal(units_decode(&u, bytes, UNITS_MAX_BYTES + 1, &err), -1);

    expect_error("cat|k ae1 zz t||", "unknown phone 'zz'");
    expect_error("cat|k ae1 pau t||", "unknown phone 'pau'");
    expect_error("cat|k ae t||", "a vowel needs its stress");
    expect_error("cat|k1 ae1 t||", "only vowels take a stress digit");
    expect_error("cat|k ae2 t||", "unknown phone 'ae2'");
    expect_error("cat|k  ae1 t||", "empty phone");
    expect_error("cat| k ae1 t||", "empty phone");
    expect_error("cat|k ae1 t ||", "end with a space");
    expect_error("cat|k ae1 t-||", "unknown phone 't-'");
    expect_error("c\tat|k ae1 t||", "not printable");
    expect_error("caf\xc3\xa9|k ae1 f||", "not printable");
    expect_error("cat|k ae1 t||\x01", "not printable");
}

/* Anything decode accepts is whole: it encodes back to a chunk that
 * decodes again. */
static void decode_any(const uint8_t *p, size_t n) {
    static uint8_t again[UNITS_MAX_BYTES];
    Units          u, v;
    Err            err;
    long           m;

    if (units_decode(&u, p, n, &err) < 0) {
        assert_null(u.arena);
        assert_true(strlen(err.msg) > 0);
        return;
    }
    assert_true((m = units_encode(&u, again, sizeof(again))) > 0);
    assert_int_equal(units_decode(&v, again, (size_t) m, &err), 0);
    assert_int_equal(v.n_phones, u.n_phones);
    units_free(&u);
    units_free(&v);
}

static void test_units_garbled(void **state) {
    uint8_t  buf[512];
    long     n = make(HELLO, 3, bytes, sizeof(bytes));
    unsigned seed = 12345;

    for (long k = 0; k < n; k++)            // every byte, a few values
        for (int d = 1; d < 256; d += 17) {
            memcpy(buf, bytes, (size_t) n);
            buf[k] = (uint8_t) (buf[k] + d);
            decode_any(buf, (size_t) n);
        }
    for (int r = 0; r < 20000; r++) {       // random bytes after a header
        size_t len = 8 + (size_t) (rand_r(&seed) % 200);

        memcpy(buf, "OTU1", 4);
        for (size_t i = 4; i < len; i++) buf[i] = (uint8_t) rand_r(&seed);
        buf[4] &= 1;
        buf[5] = 0;
        buf[7] = 0;
        buf[6] %= 4;
        decode_any(buf, len);
    }
}

// ---------------------------------------------------------------------------
// Analyzer

static int count_samples(void *ud, const int16_t *pcm, size_t n) {
    *(size_t *) ud += n;
    return 0;
}

/* Analyses text and synthesizes it with kal16 (the fastest voice); returns
 * the words said. */
static int analyse(TtsAnalyzer *a, const char *text, size_t len) {
    TtsSynthOpts o = { 1.0f, true, true, false };
    Units        u;
    Err          err;
    size_t       samples = 0;
    int          n;

    if (tts_analyze(a, text, len, &u, &err) < 0)
        fail_msg("analyse \"%.40s\": %s", text, err.msg);
    assert_true(u.n_words <= UNITS_MAX_WORDS);
    assert_true(units_encode(&u, bytes, sizeof(bytes)) > 0);
    if (tts_synth(tts_voice("kal16"), &u, &o, count_samples, &samples,
                  &err) < 0)
        fail_msg("synth \"%.40s\": %s", text, err.msg);
    assert_true((samples > 0) == (u.n_phones > 0));
    n = u.n_words;
    units_free(&u);
    return n;
}

/* Checks the words text gives (unless want is NULL); returns its phones. */
static int words_of(TtsAnalyzer *a, const char *text, const char *want) {
    Units u;
    Err   err;
    char  got[512] = "";
    int   n;

    assert_int_equal(tts_analyze(a, text, strlen(text), &u, &err), 0);
    for (int i = 0; i < u.n_words; i++) {
        strcat(got, i > 0 ? " " : "");
        strcat(got, u.words[i].text);
    }
    if (want != NULL && strcmp(got, want) != 0)
        fail_msg("\"%s\" gave \"%s\", not \"%s\"", text, got, want);
    n = u.n_phones;
    units_free(&u);
    return n;
}

static void test_analyze_words(void **state) {
    Err          err;
    TtsAnalyzer *a = tts_analyzer_new(&err);

    assert_non_null(a);
    words_of(a, "$3.50", "three dollars fifty cents");
    words_of(a, "1999", "nineteen ninety nine");
    words_of(a, "Dr. Smith", "doctor smith");
    // accents dropped, typographic quotes and dashes made ASCII
    words_of(a, "Caf\xc3\xa9 na\xc3\xafve", "cafe naive");
    // (a dash alone is a token without words, kept for its place)
    words_of(a, "\xe2\x80\x9cHi\xe2\x80\x9d \xe2\x80\x94 she said",
             "hi - she said");
    // emoji, other scripts, control characters: dropped
    words_of(a, "I \xf0\x9f\x98\x80 you\x01\x7f \xe6\x97\xa5\xe6\x9c\xac",
             "i you");
    assert_int_equal(words_of(a, "?!... ,;", "? ,"), 0);   // nothing said
    assert_int_equal(words_of(a, "", NULL), 0);
    tts_analyzer_free(a);
}

static void test_analyze_hostile(void **state) {
    static char  big[4096 * 4 + 1];
    Err          err;
    TtsAnalyzer *a = tts_analyzer_new(&err);
    unsigned     seed = 7;
    const char  *small[] = {
        "\xff\xfe\xc3\x28\xe2\x82\x28\xf0\x90\x28\xbc\xed\xa0\x80 ok",
        "\xc0\xaf\xe0\x80\xaf\xf4\x90\x80\x80", "\t\n\r\v\f", "'\"'\"",
        "12345678901234567890123456789012345678901234567890",
        "3.14159 -7 1e10 0x1F 1/2 50% #1 @home a&b <b>x</b> C++ U.S.A.",
        "e.g. i.e. etc. vs. St. Mt. Jr. a.m. p.m. Ph.D. Jan. Feb. No. 5",
    };

    assert_non_null(a);
    for (size_t i = 0; i < sizeof(small) / sizeof(*small); i++)
        analyse(a, small[i], strlen(small[i]));
    memset(big, 'a', 500);                  // a 500-letter word
    assert_true(analyse(a, big, 500) > 0);
    memset(big, 'x', 4096);                 // 4096 characters, no space
    analyse(a, big, 4096);
    for (int i = 0; i < 4096; i++)          // 4096 one-letter words
        big[i] = i % 2 ? ' ' : 'b';
    assert_int_equal(analyse(a, big, 4096), UNITS_MAX_WORDS);   // capped
    for (int i = 0; i < 4096; i++)          // 4096 emoji: 16 KiB
        memcpy(big + 4 * i, "\xf0\x9f\x98\x80", 4);
    assert_int_equal(analyse(a, big, 4096 * 4), 0);
    for (int r = 0; r < 5; r++) {           // random bytes
        for (int i = 0; i < 4096; i++) big[i] = (char) rand_r(&seed);
        analyse(a, big, 4096);
    }
    for (int r = 0; r < 5; r++) {           // random printable ASCII
        for (int i = 0; i < 4096; i++)
            big[i] = (char) (0x20 + rand_r(&seed) % 95);
        analyse(a, big, 4096);
    }
    assert_int_equal(tts_analyze(a, big, CHUNKER_MAX + 1, &(Units) { 0 },
                                 &err), -1);
    assert_non_null(strstr(err.msg, "at most"));
    tts_analyzer_free(a);
}

// ---------------------------------------------------------------------------
// Chunker

static const char STORY[] =
    "Once upon a time, there was a little girl named Lily. She had a red "
    "ball that cost $3.50 and she loved it very much! One day\xe2\x80\x94"
    "it was 10:30 a.m.\xe2\x80\x94she went to the park; the sun was bright "
    "and warm and the birds were singing in the tall green trees near the "
    "pond where the ducks swam \"Look, Mom!\" she said. \"Can I play?\" Her "
    "mom smiled: yes. They played all day long until the sun went down and "
    "the stars came out over the quiet little town by the sea";

typedef struct {
    char   text[64][512];
    int    n;
} Chunks;

static void drain(Chunker *c, Chunks *out) {
    const char *t;
    size_t      n;

    while ((n = chunker_next(c, &t)) > 0) {
        assert_true(out->n < 64 && n < 512);
        memcpy(out->text[out->n], t, n);
        out->text[out->n++][n] = '\0';
        chunker_take(c, n);
    }
}

static void chunk(SpeechMode mode, const char *text, size_t step,
                  Chunks *out) {
    ChunkPolicy p = { mode, 0, 0, 0 };      // 0: the defaults
    static Chunker c;
    size_t len = strlen(text);

    chunker_init(&c, &p);
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < len; i += step) {
        size_t n = len - i < step ? len - i : step;

        assert_int_equal(chunker_push(&c, text + i, n), n);
        drain(&c, out);
    }
    assert_false(chunker_done(&c));
    chunker_end(&c);
    drain(&c, out);
    assert_true(chunker_done(&c));
}

static int count_words(const char *t) {
    int n = 0;

    for (const char *s = t; *s; ) {
        bool word = false;

        while (*s == ' ') s++;
        if (*s == '\0') break;
        for (; *s && *s != ' '; s++)
            word |= (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')
                 || (*s >= '0' && *s <= '9') || (unsigned char) *s >= 0x80;
        n += word;
    }
    return n;
}

static void test_chunker_modes(void **state) {
    for (int m = 0; m < 2; m++) {
        SpeechMode mode = m == 0 ? SPEECH_LATENCY : SPEECH_QUALITY;
        Chunks     once, bytewise;
        size_t     at = 0;

        chunk(mode, STORY, sizeof(STORY), &once);
        chunk(mode, STORY, 1, &bytewise);
        assert_int_equal(once.n, bytewise.n);
        for (int i = 0; i < once.n; i++) {
            size_t n = strlen(once.text[i]);
            char   end = once.text[i][n - 1];
            int    words = count_words(once.text[i]);

            assert_string_equal(once.text[i], bytewise.text[i]);
            // each chunk is the next piece of the text, cut at a space
            while (STORY[at] == ' ') at++;
            assert_memory_equal(STORY + at, once.text[i], n);
            at += n;
            assert_true(STORY[at] == ' ' || STORY[at] == '\0');
            if (mode == SPEECH_LATENCY)
                assert_true(words <= (i == 0 ? 4 : 12));
            else
                assert_true(words <= 40);
            // not at punctuation: the word limit (or, in latency mode,
            // backed off from a leaning word, leaving at least 2), or the
            // end of the text
            if (!strchr(".!?,;:\"", end)
                && !strstr(once.text[i], "\xe2\x80\x94"))
                assert_true(words == (mode == SPEECH_QUALITY ? 40
                                      : i == 0 ? 4 : 12)
                            || (mode == SPEECH_LATENCY && words >= 2)
                            || i == once.n - 1);
            if (mode == SPEECH_QUALITY && i < once.n - 1)
                assert_true(strchr(".!?\"", end) != NULL || words == 40);
        }
        assert_int_equal(STORY[at], '\0');
    }
    {   // the first chunks of each mode, as the policy says
        Chunks c;

        chunk(SPEECH_LATENCY, STORY, 7, &c);
        assert_string_equal(c.text[0], "Once upon a time,");
        assert_string_equal(c.text[1], "there was a little girl named Lily.");
        chunk(SPEECH_QUALITY, STORY, 7, &c);
        assert_string_equal(c.text[0], "Once upon a time, there was a little "
                            "girl named Lily.");
    }
    {   // a cut at the word limit backs off from a word leaning on the next
        static const char t1[] = "The girl read the note out loud.";
        static const char t2[] = "They found a big box under the bench.";
        static const char t3[] = "In the dark of the night.";
        Chunks c;

        chunk(SPEECH_LATENCY, t1, 5, &c);
        assert_string_equal(c.text[0], "The girl read");
        assert_string_equal(c.text[1], "the note out loud.");
        chunk(SPEECH_LATENCY, t2, 5, &c);
        assert_string_equal(c.text[0], "They found a big");
        chunk(SPEECH_LATENCY, t3, 5, &c);
        assert_string_equal(c.text[0], "In the dark");
    }
}

static void test_chunker_bounded(void **state) {
    static Chunker c;
    ChunkPolicy    p = { SPEECH_QUALITY, 0, 0, 0 };
    const char    *t;
    size_t         total = 0, n;
    int            pieces = 0;

    chunker_init(&c, &p);
    // "é" 10000 times: 20000 bytes without a space or punctuation
    for (int i = 0; i < 10000; ) {
        if (chunker_push(&c, "\xc3\xa9", 2) == 2) {
            i++;
            continue;
        }
        // the buffer is full: a forced cut, on a character boundary
        assert_true((n = chunker_next(&c, &t)) > 0);
        assert_true(n % 2 == 0 && n <= CHUNKER_MAX);
        chunker_take(&c, n);
        total += n;
        pieces++;
    }
    assert_int_equal(chunker_next(&c, &t), 0);  // the word is not whole
    chunker_end(&c);
    assert_int_equal(chunker_push(&c, "x", 1), 0);  // ended: nothing taken
    n = chunker_next(&c, &t);
    chunker_take(&c, n);
    total += n;
    assert_int_equal(total, 20000);
    assert_int_equal(pieces, 1);
    assert_true(chunker_done(&c));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_round_trip),
        cmocka_unit_test(test_units_refused),
        cmocka_unit_test(test_units_garbled),
        cmocka_unit_test(test_analyze_words),
        cmocka_unit_test(test_analyze_hostile),
        cmocka_unit_test(test_chunker_modes),
        cmocka_unit_test(test_chunker_bounded),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests(tests, setup, NULL);
}

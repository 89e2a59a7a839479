/* test_stop.c -- stop strings over streamed text (engine/llm/stop.c).
 *
 * The central property: whatever way the text is cut into pieces, the
 * released text is exactly the text before the first stop string to
 * complete (or all of it), and at every moment the released text is the
 * longest prefix in which no stop string can still begin. Both are checked
 * against a brute-force reference, over every split point of hand-picked
 * cases and over random splits of random text. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "stop.h"

#define BIG (1 << 16)

typedef struct {
    char   out[BIG];    // everything released so far
    size_t n_out;
} Sink;


/* ---- reference ---- */

/* Length of the text to release from t[0..n): read byte by byte, the
 * first byte that completes a stop string ends it, and the longest stop
 * string ending there is cut off; n when no stop string occurs. */
static size_t ref_stop_at(const char *const *stops, int n_stops,
                          const char *t, size_t n) {
    for (size_t e = 1; e <= n; e++) {
        size_t best = n;

        for (int s = 0; s < n_stops; s++) {
            size_t l = strlen(stops[s]);

            if (l <= e && memcmp(t + e - l, stops[s], l) == 0
                && e - l < best)
            {
                best = e - l;
            }
        }
        if (best < n) return best;
    }
    return n;
}

/* Longest prefix of t[0..n) in which no stop string can begin (assuming no
 * full match): positions from which the rest is a proper prefix of a stop
 * string are held back. */
static size_t ref_safe(const char *const *stops, int n_stops, const char *t,
                       size_t n) {
    for (size_t i = 0; i < n; i++) {
        for (int s = 0; s < n_stops; s++) {
            size_t l = strlen(stops[s]);

            if (n - i < l && memcmp(t + i, stops[s], n - i) == 0) return i;
        }
    }
    return n;
}


/* ---- helpers ---- */

static void feed(StopMatcher *m, Sink *k, const char *t, size_t n) {
    char   out[BIG + STOP_MAX_LEN];
    size_t r = stop_feed(m, t, n, out, sizeof(out));

    assert_true(k->n_out + r <= sizeof(k->out));
    memcpy(k->out + k->n_out, out, r);
    k->n_out += r;
}

static void flush(StopMatcher *m, Sink *k) {
    char   out[STOP_MAX_LEN];
    size_t r = stop_flush(m, out, sizeof(out));

    memcpy(k->out + k->n_out, out, r);
    k->n_out += r;
}

/* Feeds text cut at the given points (sorted, within the text), checking
 * after each piece that exactly the safe prefix has been released; then
 * checks the total against the reference. */
static void run_cuts(const char *const *stops, int n_stops, const char *text,
                     const size_t *cuts, int n_cuts) {
    static Sink  k;
    StopMatcher  m;
    Err          err;
    size_t       len = strlen(text), from = 0;
    size_t       want = ref_stop_at(stops, n_stops, text, len);

    assert_int_equal(stop_init(&m, stops, n_stops, &err), 0);
    k.n_out = 0;
    for (int c = 0; c <= n_cuts; c++) {
        size_t to = c < n_cuts ? cuts[c] : len;

        feed(&m, &k, text + from, to - from);
        from = to;
        if (ref_stop_at(stops, n_stops, text, to) < to) {
            assert_true(m.stopped);
            assert_int_equal(k.n_out, want);
        } else {
            assert_false(m.stopped);
            assert_int_equal(k.n_out, ref_safe(stops, n_stops, text, to));
            assert_true(m.n_held < STOP_MAX_LEN);
        }
        assert_memory_equal(k.out, text, k.n_out);
    }
    flush(&m, &k);
    assert_int_equal(k.n_out, want);
    assert_memory_equal(k.out, text, want);
    assert_int_equal(m.stopped, want < len);
}

/* Every single cut point, every pair of cut points, and byte by byte. */
static void run_all_splits(const char *const *stops, int n_stops,
                           const char *text) {
    size_t len = strlen(text), cuts[BIG / 256];

    run_cuts(stops, n_stops, text, NULL, 0);
    for (size_t i = 0; i <= len; i++) {
        run_cuts(stops, n_stops, text, &i, 1);
        for (size_t j = i; j <= len; j++) {
            size_t two[2] = { i, j };

            run_cuts(stops, n_stops, text, two, 2);
        }
    }
    assert_true(len < sizeof(cuts) / sizeof(cuts[0]));
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    run_cuts(stops, n_stops, text, cuts, (int) len);
}


/* ---- tests ---- */

static void test_init_errors(void **state) {
    const char *five[] = { "a", "b", "c", "d", "e" };
    const char *empty[] = { "a", "" };
    const char *null[] = { "a", NULL };
    char        long_stop[STOP_MAX_LEN + 1];
    const char *too_long[] = { long_stop };
    StopMatcher m;
    Err         err;

    assert_int_equal(stop_init(&m, five, 5, &err), -1);
    assert_string_equal(err.msg, "stop: at most 4 sequences, got 5");
    assert_int_equal(stop_init(&m, empty, 2, &err), -1);
    assert_string_equal(err.msg, "stop: sequence 1 is empty");
    assert_int_equal(stop_init(&m, null, 2, &err), -1);
    assert_string_equal(err.msg, "stop: sequence 1 is empty");
    assert_int_equal(stop_init(&m, NULL, 1, &err), -1);

    memset(long_stop, 'x', STOP_MAX_LEN);
    long_stop[STOP_MAX_LEN] = '\0';
    assert_int_equal(stop_init(&m, too_long, 1, &err), -1);
    assert_string_equal(err.msg, "stop: sequence 0 is 256 bytes, at most 255");
    long_stop[STOP_MAX_LEN - 1] = '\0';
    assert_int_equal(stop_init(&m, too_long, 1, &err), 0);
    assert_int_equal(stop_init(&m, five, 4, &err), 0);
    assert_int_equal(stop_init(&m, NULL, 0, &err), 0);
}

static void test_no_stops_passes_through(void **state) {
    static Sink k;
    StopMatcher m;
    Err         err;

    assert_int_equal(stop_init(&m, NULL, 0, &err), 0);
    k.n_out = 0;
    feed(&m, &k, "hello ", 6);
    assert_int_equal(k.n_out, 6);
    feed(&m, &k, "", 0);
    feed(&m, &k, "world", 5);
    assert_int_equal(k.n_out, 11);
    assert_int_equal(m.n_held, 0);
    flush(&m, &k);
    assert_memory_equal(k.out, "hello world", 11);
}

static void test_whole_piece(void **state) {
    const char *stops[] = { "STOP" };
    const char *overlap[] = { "abcd", "bc" };
    static Sink k;
    StopMatcher m;
    Err         err;

    assert_int_equal(stop_init(&m, stops, 1, &err), 0);
    k.n_out = 0;
    feed(&m, &k, "Hello world STOP more", 21);
    assert_true(m.stopped);
    assert_int_equal(k.n_out, 12);
    assert_memory_equal(k.out, "Hello world ", 12);

    /* after a stop nothing more comes out */
    feed(&m, &k, "again", 5);
    flush(&m, &k);
    assert_int_equal(k.n_out, 12);

    /* in one piece, "bc" still completes before "abcd" */
    assert_int_equal(stop_init(&m, overlap, 2, &err), 0);
    k.n_out = 0;
    feed(&m, &k, "xabcd", 5);
    assert_true(m.stopped);
    assert_int_equal(k.n_out, 2);
    assert_memory_equal(k.out, "xa", 2);
}

static void test_release_as_soon_as_safe(void **state) {
    const char *stops[] = { "</end>" };
    char        out[64 + STOP_MAX_LEN];
    StopMatcher m;
    Err         err;

    assert_int_equal(stop_init(&m, stops, 1, &err), 0);
    assert_int_equal(stop_feed(&m, "abc<", 4, out, sizeof(out)), 3);
    assert_memory_equal(out, "abc", 3);
    assert_int_equal(stop_feed(&m, "/e", 2, out, sizeof(out)), 0);
    assert_int_equal(m.n_held, 3);
    /* "</ex" can no longer become "</end>": all of it goes */
    assert_int_equal(stop_feed(&m, "x", 1, out, sizeof(out)), 4);
    assert_memory_equal(out, "</ex", 4);
    /* "<" starts again right after */
    assert_int_equal(stop_feed(&m, "y<", 2, out, sizeof(out)), 1);
    assert_int_equal(stop_flush(&m, out, sizeof(out)), 1);
    assert_memory_equal(out, "<", 1);
    assert_false(m.stopped);
}

static void test_every_split(void **state) {
    const char *stops[] = { "</end>" };
    /* "。" and "été" */
    const char *utf8[] = { "\xe3\x80\x82", "\xc3\xa9t\xc3\xa9" };

    run_all_splits(stops, 1, "abc</end>def");
    run_all_splits(stops, 1, "</end>");
    run_all_splits(stops, 1, "x</en</end");         /* false start, no stop */
    run_all_splits(stops, 1, "<<</</e</en</end</end>");
    run_all_splits(utf8, 2, "caf\xc3\xa9 \xc3\xa9t\xc3\xa9\xe3\x80\x82!");
}

static void test_overlapping_prefixes(void **state) {
    const char *ab_abc[] = { "ab", "abc" };
    const char *abc_ab[] = { "abc", "ab" };
    const char *bcd_abce[] = { "bcd", "abce" };
    const char *aab[] = { "aab" };
    const char *abcd_bc[] = { "abcd", "bc" };

    run_all_splits(ab_abc, 2, "aab");
    run_all_splits(ab_abc, 2, "aabc tail");
    run_all_splits(abc_ab, 2, "xxaabcx");
    run_all_splits(ab_abc, 2, "aaaaaa");
    /* "abce" is still possible at 0 when "bcd" completes at 1 */
    run_all_splits(bcd_abce, 2, "abcd");
    /* "bc" completes before "abcd" does, however the text is cut */
    run_all_splits(abcd_bc, 2, "xabcd");
    /* self-overlapping stop: the match starts at the second 'a' */
    run_all_splits(aab, 1, "aaab");
    run_all_splits(aab, 1, "aaaaaaa");
}

/* Random text over a small alphabet, random stop strings and random cuts,
 * against the reference: many matches, false starts and overlaps. */
static void test_random(void **state) {
    char   text[200], stop_buf[STOP_MAX][8];
    size_t cuts[200];
    unsigned seed = 12345;

    for (int round = 0; round < 3000; round++) {
        const char *stops[STOP_MAX];
        int         n_stops = 1 + rand_r(&seed) % STOP_MAX;
        size_t      len = (size_t) (rand_r(&seed) % 60);
        int         n_cuts = 0;

        for (int s = 0; s < n_stops; s++) {
            int l = 1 + rand_r(&seed) % 5;

            for (int i = 0; i < l; i++) {
                stop_buf[s][i] = "abc"[rand_r(&seed) % 3];
            }
            stop_buf[s][l] = '\0';
            stops[s] = stop_buf[s];
        }
        for (size_t i = 0; i < len; i++) {
            text[i] = "abcd"[rand_r(&seed) % 4];
        }
        text[len] = '\0';
        for (size_t i = 1; i < len; i++) {
            if (rand_r(&seed) % 3 == 0) cuts[n_cuts++] = i;
        }
        run_cuts(stops, n_stops, text, cuts, n_cuts);
    }
}

static void test_long_pieces(void **state) {
    const char  *stops[] = { "<|im_end|>", "\n\nUser:" };
    static char  text[20000];
    static Sink  k;
    StopMatcher  m;
    Err          err;

    memset(text, 'z', sizeof(text));
    memcpy(text + 15000, "\n\nUser:", 7);
    assert_int_equal(stop_init(&m, stops, 2, &err), 0);
    k.n_out = 0;
    feed(&m, &k, text, 9999);
    assert_int_equal(k.n_out, 9999);
    feed(&m, &k, text + 9999, sizeof(text) - 9999);
    assert_true(m.stopped);
    assert_int_equal(k.n_out, 15000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_errors),
        cmocka_unit_test(test_no_stops_passes_through),
        cmocka_unit_test(test_whole_piece),
        cmocka_unit_test(test_release_as_soon_as_safe),
        cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_overlapping_prefixes),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_long_pieces),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("stop", tests, NULL, NULL);
}

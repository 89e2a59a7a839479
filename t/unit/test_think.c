/* test_think.c -- the reasoning splitter (engine/llm/think.c).
 *
 * Each case is an output text and the reasoning and content it must give.
 * Every case is fed whole, one byte at a time, and cut in two at every
 * position (and in three at every pair, for the short ones), so tags and
 * whitespace split across tokens take every path; the result must not
 * depend on the cuts. Token counting is checked on token lists with known
 * reasoning counts. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "think.h"

#define OUT_MAX 1024

typedef struct {
    char   text[2][OUT_MAX];    // [TEXT_CONTENT], [TEXT_REASONING]
    size_t len[2];
    int    runs;
    int    last_kind;           // to check runs alternate kinds
    int    cancel_at;           // the run that returns nonzero; 0: never
} Sink;

typedef struct {
    const char *out;            // the model's output
    const char *reasoning;
    const char *content;
} Case;

static const Case cases[] = {
    /* Qwen3's shape */
    { "<think>\nLet me see.\n</think>\n\nIt is 4.", "Let me see.",
      "It is 4." },
    /* thinking off: the prompt held the empty block, output is content */
    { "It is 4.", "", "It is 4." },
    { "", "", "" },
    /* an empty block, as the model writes it when it does not think */
    { "<think>\n\n</think>\n\nHi", "", "Hi" },
    { "<think></think>Hi", "", "Hi" },
    /* only a leading <think> opens reasoning; later tags are content */
    { " <think>a</think>b", "", " <think>a</think>b" },
    { "Hi <think>x</think>", "", "Hi <think>x</think>" },
    { "<thinking>x", "", "<thinking>x" },
    { "<th", "", "<th" },
    { "<", "", "<" },
    /* inner whitespace and near-tags stay in the reasoning */
    { "<think>a \n b</think>c", "a \n b", "c" },
    { "<think>a < b </thin k></think>c", "a < b </thin k>", "c" },
    { "<think>a<</think>c", "a<", "c" },
    { "<think>a </</think>c", "a </", "c" },
    { "<think>x</think>\n\n  y\n", "x", "  y\n" },
    /* everything after the first </think> is content */
    { "<think>x</think>y</think>z", "x", "y</think>z" },
    /* cut short while thinking: all of it is reasoning */
    { "<think>\nstill thinking\n", "still thinking", "" },
    { "<think>\nstill </th", "still </th", "" },
    { "<think>\n</th", "</th", "" },
    { "<think>", "", "" },
    { "<think>\n\n", "", "" },
    /* UTF-8 passes whole */
    { "<think>\xc3\xa9t\xc3\xa9 \xe2\x82\xac</think>\n\xf0\x9f\x98\x80",
      "\xc3\xa9t\xc3\xa9 \xe2\x82\xac", "\xf0\x9f\x98\x80" },
};

static int sink(void *ud, TextKind kind, const char *t, size_t n) {
    Sink *s = ud;

    assert_true(n > 0);
    assert_true(kind == TEXT_CONTENT || kind == TEXT_REASONING);
    assert_true(s->len[kind] + n < OUT_MAX);
    memcpy(s->text[kind] + s->len[kind], t, n);
    s->len[kind] += n;
    s->text[kind][s->len[kind]] = '\0';
    s->last_kind = (int) kind;
    return ++s->runs == s->cancel_at;
}

/* Feeds out cut at the positions in cuts[] (ascending, n_cuts of them),
 * then flushes; checks the result against c. */
static void run_case(const Case *c, const size_t *cuts, int n_cuts,
                     bool on)
{
    ThinkSplit t;
    Sink       s;
    char       scratch[OUT_MAX + THINK_HOLD];
    size_t     len = strlen(c->out), at = 0;

    memset(&s, 0, sizeof(s));
    think_start(&t, on);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;

        assert_int_equal(think_feed(&t, c->out + at, end - at, scratch,
                                    sink, &s), 0);
        think_token(&t);
        at = end;
    }
    assert_int_equal(think_flush(&t, scratch, sink, &s), 0);
    if (!on) {
        assert_string_equal(s.text[TEXT_CONTENT], c->out);
        assert_int_equal(s.len[TEXT_REASONING], 0);
        assert_int_equal(t.n_reasoning, 0);
        return;
    }
    if (strcmp(s.text[TEXT_REASONING], c->reasoning) != 0
        || strcmp(s.text[TEXT_CONTENT], c->content) != 0)
    {
        char where[128] = "";

        for (int i = 0; i < n_cuts && i < 4; i++) {
            snprintf(where + strlen(where), sizeof(where) - strlen(where),
                     " %zu", cuts[i]);
        }
        fail_msg("[%s] cut at%s: reasoning [%s] content [%s], wanted [%s] "
                 "[%s]", c->out, where, s.text[TEXT_REASONING],
                 s.text[TEXT_CONTENT], c->reasoning, c->content);
    }
}

static void test_cases_whole_and_bytes(void **state) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t len = strlen(cases[k].out), cuts[OUT_MAX];

        run_case(&cases[k], NULL, 0, true);
        run_case(&cases[k], NULL, 0, false);
        for (size_t i = 1; i < len; i++) cuts[i - 1] = i;
        run_case(&cases[k], cuts, len > 0 ? (int) len - 1 : 0, true);
        run_case(&cases[k], cuts, len > 0 ? (int) len - 1 : 0, false);
    }
}

static void test_cases_every_cut(void **state) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        size_t len = strlen(cases[k].out), cuts[2];

        for (size_t i = 1; i < len; i++) {
            cuts[0] = i;
            run_case(&cases[k], cuts, 1, true);
            for (size_t j = i + 1; len <= 48 && j < len; j++) {
                cuts[1] = j;
                run_case(&cases[k], cuts, 2, true);
            }
        }
    }
}

/* Runs alternate kinds within one feed: a token holding "</think>\n\nA"
 * after reasoning gives one reasoning run and one content run. */
static void test_runs(void **state) {
    ThinkSplit t;
    Sink       s;
    char       scratch[OUT_MAX + THINK_HOLD];
    const char *a = "<think>xy", *b = "z</think>\n\nAB";

    memset(&s, 0, sizeof(s));
    think_start(&t, true);
    assert_int_equal(think_feed(&t, a, strlen(a), scratch, sink, &s), 0);
    assert_int_equal(s.runs, 1);
    assert_int_equal(think_feed(&t, b, strlen(b), scratch, sink, &s), 0);
    assert_int_equal(s.runs, 3);
    assert_int_equal(s.last_kind, TEXT_CONTENT);
    assert_string_equal(s.text[TEXT_REASONING], "xyz");
    assert_string_equal(s.text[TEXT_CONTENT], "AB");
}

/* Whitespace inside the reasoning is held only up to the hold: a longer
 * run goes out (and so stays even before </think>); nothing overflows. */
static void test_long_whitespace(void **state) {
    char       out[1024], want[512];
    size_t     n = 0;
    ThinkSplit t;
    Sink       s;
    char       scratch[OUT_MAX + THINK_HOLD];

    n += (size_t) sprintf(out, "<think>a");
    memset(out + n, ' ', 300);
    n += 300;
    n += (size_t) sprintf(out + n, "b");
    memset(out + n, '\n', 300);
    n += 300;
    sprintf(out + n, "</think>c");
    memset(&s, 0, sizeof(s));
    think_start(&t, true);
    for (size_t i = 0; out[i] != '\0'; i++) {
        assert_int_equal(think_feed(&t, out + i, 1, scratch, sink, &s), 0);
    }
    think_flush(&t, scratch, sink, &s);
    snprintf(want, sizeof(want), "a%.300sb", out + 8);
    assert_int_equal(strncmp(s.text[TEXT_REASONING], want, strlen(want)),
                     0);
    assert_true(s.len[TEXT_REASONING] < strlen(want) + 300);
    assert_string_equal(s.text[TEXT_CONTENT], "c");
}

/* Tokens: those that spell <think> (counted once decided), those inside,
 * and the one that completes </think> are reasoning; the rest are not. */
static void test_token_count(void **state) {
    static const struct {
        const char *toks[12];
        int64_t     reasoning;
    } seqs[] = {
        { { "<", "th", "ink", ">", "\n", "hm", "\n", "</", "think", ">",
            "\n\n", "A" }, 10 },
        { { "<think>", "hm</think>A", "B" }, 2 },
        { { "<think>", "hm", "</think>", "\n\n", "A" }, 3 },
        { { "<", "th", "is", " is", " it" }, 0 },
        { { "Hi", "<think>", "x" }, 0 },
        { { "<think>", "a", "b", "c" }, 4 },            // cut short
        { { "<th", "", "ink>", "a" }, 4 },              // an empty token
    };

    for (size_t k = 0; k < sizeof(seqs) / sizeof(seqs[0]); k++) {
        ThinkSplit t;
        Sink       s;
        char       scratch[OUT_MAX + THINK_HOLD];

        memset(&s, 0, sizeof(s));
        think_start(&t, true);
        for (int i = 0; i < 12 && seqs[k].toks[i] != NULL; i++) {
            think_feed(&t, seqs[k].toks[i], strlen(seqs[k].toks[i]),
                       scratch, sink, &s);
            think_token(&t);
        }
        think_flush(&t, scratch, sink, &s);
        if (t.n_reasoning != seqs[k].reasoning) {
            fail_msg("sequence %zu: %lld reasoning tokens, wanted %lld", k,
                     (long long) t.n_reasoning,
                     (long long) seqs[k].reasoning);
        }
    }
}

/* A nonzero emit return comes back from the feed. */
static void test_cancel(void **state) {
    ThinkSplit  t;
    Sink        s;
    char        scratch[OUT_MAX + THINK_HOLD];
    const char *a = "<think>x</think>y";

    memset(&s, 0, sizeof(s));
    s.cancel_at = 1;
    think_start(&t, true);
    assert_int_equal(think_feed(&t, a, strlen(a), scratch, sink, &s), 1);
    assert_int_equal(s.runs, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_whole_and_bytes),
        cmocka_unit_test(test_cases_every_cut),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_long_whitespace),
        cmocka_unit_test(test_token_count),
        cmocka_unit_test(test_cancel),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("think", tests, NULL, NULL);
}

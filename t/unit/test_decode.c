/* test_decode.c -- the decode step on its own (engine/llm/decode.c).
 *
 * Tokens are fed through decode_take (the step after sampling) so each case
 * names exactly the tokens it wants; decode_token is checked once with
 * greedy logits. Uses the default model's tokenizer (stories260K, or
 * $OMNI_MODEL): its vocabulary has byte tokens, so a character can be
 * split across tokens. Covered: a stop string across tokens, EOS with and
 * without ignore_eos, max_tokens, a full context, UTF-8 held back by the
 * detokenizer, the tail flush, a cancelling consumer, the reasoning split
 * (its own cases are test_think's). SPM text starts
 * with the dummy-prefix space, which the detokenizer keeps. test_scheduler
 * checks the step's callers agree with each other. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "decode.h"
#include "gguf.h"
#include "tokenizer.h"

#define OUT_MAX 4096

typedef struct {
    char   text[OUT_MAX];
    size_t len;
    char   reasoning[OUT_MAX];  // TEXT_REASONING runs
    size_t r_len;
    int    calls;
    int    cancel_at;       // the call that returns nonzero; 0: never
} Sink;

typedef struct {
    GGUF       g;
    Tokenizer *tk;
    Decoder    d;
    Sink       out;
} Fix;

static Fix *fx;

static const char *model_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m != NULL && *m != '\0' ? m : "../shared/models/stories260K.gguf";
}

static int sink(void *ud, TextKind kind, const char *t, size_t n) {
    Sink   *s = ud;
    char   *buf = kind == TEXT_REASONING ? s->reasoning : s->text;
    size_t *len = kind == TEXT_REASONING ? &s->r_len : &s->len;

    assert_true(n > 0);
    assert_true(*len + n < OUT_MAX);
    memcpy(buf + *len, t, n);
    *len += n;
    buf[*len] = '\0';
    return ++s->calls == s->cancel_at;
}

static int setup(void **state) {
    Err e;

    fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    if (gguf_open(&fx->g, model_path(), &e) != 0) fail_msg("%s", e.msg);
    fx->tk = tokenizer_new(&fx->g, &e);
    if (fx->tk == NULL) fail_msg("%s", e.msg);
    if (decode_init(&fx->d, fx->tk, tokenizer_n_vocab(fx->tk), &e) != 0) {
        fail_msg("%s", e.msg);
    }
    return 0;
}

static int teardown(void **state) {
    decode_free(&fx->d);
    tokenizer_free(fx->tk);
    gguf_close(&fx->g);
    free(fx);
    return 0;
}

/* A fresh sequence of n_prompt prompt tokens in a context of n_ctx, greedy,
 * with the given stop strings. */
static void start_split(const char *const *stops, int n_stops,
                        int64_t max_tokens, int64_t n_prompt, int64_t n_ctx,
                        bool ignore_eos, bool think)
{
    SamplerParams sp;
    StopMatcher   sm;
    DecodeLimits  lim = { max_tokens, n_ctx, ignore_eos, think };
    Err           e;

    sampler_params_default(&sp);
    sp.temperature = 0;
    assert_int_equal(stop_init(&sm, stops, n_stops, &e), 0);
    assert_int_equal(decode_start(&fx->d, &sp, &sm, &lim, n_prompt, &e), 0);
    memset(&fx->out, 0, sizeof(fx->out));
}

static void start(const char *const *stops, int n_stops, int64_t max_tokens,
                  int64_t n_prompt, int64_t n_ctx, bool ignore_eos)
{
    start_split(stops, n_stops, max_tokens, n_prompt, n_ctx, ignore_eos,
                false);
}

/* The ids of text, without BOS. */
static int64_t ids_of(const char *text, int32_t *ids, int64_t cap) {
    Err     e;
    int64_t n = tokenizer_encode(fx->tk, text, strlen(text), false, false,
                                 ids, cap, &e);

    assert_true(n > 1 && n <= cap);
    return n;
}

static int32_t byte_token(unsigned b) {
    char    name[8];
    int32_t id;

    snprintf(name, sizeof(name), "<0x%02X>", b);
    id = tokenizer_find(fx->tk, name);
    assert_true(id >= 0);
    return id;
}

static DecodeEnd take(int32_t tok) {
    return decode_take(&fx->d, tok, sink, &fx->out);
}

/* Feeds ids until the step ends the sequence; returns its verdict and the
 * index of the token that ended it in *at (n when none did). */
static DecodeEnd feed(const int32_t *ids, int64_t n, int64_t *at) {
    DecodeEnd end = DECODE_MORE;

    for (*at = 0; *at < n; (*at)++) {
        end = take(ids[*at]);
        if (end != DECODE_MORE) break;
    }
    return end;
}


/* "Once upon a time" with the stop string "pon a t": it spans tokens, so
 * " Once u" is released and the rest never is; the step that completes it
 * says so, and that token counts. After a stop the tail adds nothing. */
static void test_stop_across_tokens(void **state) {
    const char *stops[] = { "pon a t" };
    int32_t     ids[32];
    int64_t     n = ids_of("Once upon a time", ids, 32), at;

    start(stops, 1, -1, 1, 1000, false);
    assert_int_equal(feed(ids, n, &at), DECODE_STOP);
    assert_true(at < n);
    assert_int_equal(fx->d.n_gen, at + 1);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.text, " Once u");
}

/* Without stop strings everything comes out; text a stop string could
 * still begin is held until the tail flush releases it. */
static void test_tail_flush(void **state) {
    const char *stops[] = { "time to go" };
    int32_t     ids[32];
    int64_t     n = ids_of("Once upon a time", ids, 32), at;

    start(stops, 1, -1, 1, 1000, false);
    assert_int_equal(feed(ids, n, &at), DECODE_MORE);
    assert_int_equal(fx->d.n_gen, n);
    assert_string_equal(fx->out.text, " Once upon a ");
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.text, " Once upon a time");
}

/* EOS ends the sequence uncounted and silent; with ignore_eos it is a
 * token like any other (no text: a control token renders as nothing). */
static void test_eos(void **state) {
    int32_t eos = tokenizer_eos(fx->tk), ids[32];
    int64_t n = ids_of("Once upon", ids, 32), at;

    assert_true(eos >= 0);
    start(NULL, 0, -1, 1, 1000, false);
    assert_int_equal(feed(ids, n, &at), DECODE_MORE);
    assert_int_equal(take(eos), DECODE_EOS);
    assert_int_equal(fx->d.n_gen, n);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.text, " Once upon");

    start(NULL, 0, -1, 1, 1000, true);
    assert_int_equal(take(eos), DECODE_MORE);
    assert_int_equal(take(ids[0]), DECODE_MORE);
    assert_int_equal(fx->d.n_gen, 2);
    assert_string_equal(fx->out.text, " Once");
}

/* max_tokens: the last allowed token is taken and emitted, then LENGTH. A
 * full context does the same for the token that would sit at n_ctx. */
static void test_limits(void **state) {
    int32_t ids[32];
    int64_t n = ids_of("Once upon a time there was", ids, 32), at;

    assert_true(n > 4);
    start(NULL, 0, 3, 5, 1000, false);
    assert_int_equal(feed(ids, n, &at), DECODE_LENGTH);
    assert_int_equal(at, 2);
    assert_int_equal(fx->d.n_gen, 3);

    /* prompt 5, context 8: tokens at positions 5, 6, 7 run; the 4th is
       taken at position 8 and ends the sequence */
    start(NULL, 0, -1, 5, 8, false);
    assert_int_equal(feed(ids, n, &at), DECODE_LENGTH);
    assert_int_equal(at, 3);
    assert_int_equal(fx->d.n_gen, 4);
}

/* "€" is E2 82 AC: nothing comes out until its last byte; cut short, the
 * tail flush ends it as one U+FFFD. */
static void test_utf8_held_back(void **state) {
    start(NULL, 0, -1, 1, 1000, false);
    assert_int_equal(take(byte_token(0xE2)), DECODE_MORE);
    assert_int_equal(take(byte_token(0x82)), DECODE_MORE);
    assert_int_equal(fx->out.calls, 0);
    assert_int_equal(take(byte_token(0xAC)), DECODE_MORE);
    assert_string_equal(fx->out.text, "\xE2\x82\xAC");

    start(NULL, 0, -1, 1, 1000, false);
    take(byte_token(0xE2));
    take(byte_token(0x82));
    assert_int_equal(fx->out.calls, 0);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.text, "\xEF\xBF\xBD");
}

/* A consumer that cancels ends the sequence on the token whose text it
 * refused; that token counts. */
static void test_cancel(void **state) {
    int32_t ids[32];
    int64_t n = ids_of("Once upon a time", ids, 32), at;

    start(NULL, 0, -1, 1, 1000, false);
    fx->out.cancel_at = 2;
    assert_int_equal(feed(ids, n, &at), DECODE_CANCEL);
    assert_int_equal(at, 1);
    assert_int_equal(fx->d.n_gen, 2);
}

/* Feeds s one byte token a byte (so every tag is cut across tokens);
 * returns the last verdict. */
static DecodeEnd feed_bytes(const char *s) {
    DecodeEnd end = DECODE_MORE;

    for (; *s != '\0' && end == DECODE_MORE; s++) {
        end = take(byte_token((unsigned char) *s));
    }
    return end;
}

/* The reasoning split inside the step: byte tokens spell a Qwen3 answer;
 * the reasoning (without the whitespace around it) and the answer
 * (without its leading newlines) come out apart, and the tokens up to the
 * one that ends </think> are reasoning tokens. */
static void test_think_split(void **state) {
    const char *text = "<think>\nHm, 2+2.\n</think>\n\nIt is 4.";

    start_split(NULL, 0, -1, 1, 1000, false, true);
    assert_int_equal(feed_bytes(text), DECODE_MORE);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.reasoning, "Hm, 2+2.");
    assert_string_equal(fx->out.text, "It is 4.");
    assert_int_equal(fx->d.think.n_reasoning,
                     (int64_t) (strstr(text, "</think>") - text) + 8);
    assert_int_equal(fx->d.n_gen, (int64_t) strlen(text));

    /* cut by max_tokens while thinking: all reasoning, nothing held back */
    start_split(NULL, 0, 12, 1, 1000, false, true);
    assert_int_equal(feed_bytes(text), DECODE_LENGTH);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.reasoning, "Hm,");    // trailing space
    assert_int_equal(fx->out.len, 0);                 //   dropped
    assert_int_equal(fx->d.think.n_reasoning, 12);

    /* a stop string inside the reasoning ends it there */
    {
        const char *stops[] = { "2+2" };

        start_split(stops, 1, -1, 1, 1000, false, true);
        assert_int_equal(feed_bytes(text), DECODE_STOP);
        decode_finish(&fx->d, sink, &fx->out);
        assert_string_equal(fx->out.reasoning, "Hm,");
        assert_int_equal(fx->out.len, 0);
    }

    /* off: the same tokens are all content */
    start_split(NULL, 0, -1, 1, 1000, false, false);
    feed_bytes(text);
    decode_finish(&fx->d, sink, &fx->out);
    assert_string_equal(fx->out.text, text);
    assert_int_equal(fx->out.r_len, 0);
    assert_int_equal(fx->d.think.n_reasoning, 0);
}

/* decode_token samples (greedy: the best logit) and then takes. */
static void test_decode_token(void **state) {
    int32_t n_vocab = tokenizer_n_vocab(fx->tk), ids[32], tok = -1;
    float  *logits = calloc((size_t) n_vocab, sizeof(float));

    assert_non_null(logits);
    ids_of("Once upon", ids, 32);
    start(NULL, 0, -1, 1, 1000, false);
    logits[ids[0]] = 10;
    assert_int_equal(decode_token(&fx->d, logits, &tok, sink, &fx->out),
                     DECODE_MORE);
    assert_int_equal(tok, ids[0]);
    assert_string_equal(fx->out.text, " Once");

    memset(logits, 0, (size_t) n_vocab * sizeof(float));
    logits[tokenizer_eos(fx->tk)] = 10;
    assert_int_equal(decode_token(&fx->d, logits, &tok, sink, &fx->out),
                     DECODE_EOS);
    assert_int_equal(tok, tokenizer_eos(fx->tk));
    assert_int_equal(fx->d.n_gen, 1);
    free(logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_across_tokens),
        cmocka_unit_test(test_tail_flush),
        cmocka_unit_test(test_eos),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_utf8_held_back),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_decode_token),
        cmocka_unit_test(test_think_split),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("decode", tests, setup, teardown);
}

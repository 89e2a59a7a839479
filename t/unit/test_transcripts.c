/* test_transcripts.c -- the store of spoken answers' transcripts and their
 * splicing into a request (engine/frontend/transcripts.c): expiry,
 * eviction by count and by bytes, replacement of an id, refusals, and the
 * spliced JSON parsed back by request.c. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "request.h"
#include "transcripts.h"

static void put_ok(Transcripts *t, const char *id, const char *text,
                   double now) {
    Err err;

    if (transcripts_put(t, id, text, strlen(text), now, &err) != 0) {
        fail_msg("put %s: %s", id, err.msg);
    }
}

static void test_put_get_expire(void **state) {
    Transcripts t;
    Err         err;
    size_t      len = 0;

    (void) state;
    assert_int_equal(transcripts_init(&t, 4, 1000, &err), 0);
    assert_null(transcripts_get(&t, "a", 0.0, NULL));
    put_ok(&t, "a", "alpha", 10.0);
    put_ok(&t, "b", "beta", 20.0);
    assert_string_equal(transcripts_get(&t, "a", 11.0, &len), "alpha");
    assert_int_equal(len, 5);
    assert_null(transcripts_get(&t, "c", 11.0, NULL));
    /* a expires at 10 + TTL, b ten seconds later */
    assert_non_null(transcripts_get(&t, "a", 10.0 + TRANSCRIPT_TTL_S - 0.5,
                                    NULL));
    assert_null(transcripts_get(&t, "a", 10.0 + TRANSCRIPT_TTL_S, NULL));
    assert_string_equal(transcripts_get(&t, "b", 10.0 + TRANSCRIPT_TTL_S,
                                        NULL), "beta");
    assert_int_equal(t.n, 1);
    assert_int_equal(t.bytes, 4);
    assert_null(transcripts_get(&t, "b", 20.0 + TRANSCRIPT_TTL_S, NULL));
    assert_int_equal(t.n, 0);
    assert_int_equal(t.bytes, 0);
    transcripts_free(&t);
}

/* Count and byte bounds evict the oldest; a replaced id moves to the
 * newest end and its old text no longer counts. */
static void test_bounds(void **state) {
    Transcripts t;
    Err         err;
    char        id[8];

    (void) state;
    assert_int_equal(transcripts_init(&t, 3, 10, &err), 0);
    put_ok(&t, "a", "11", 1.0);
    put_ok(&t, "b", "22", 2.0);
    put_ok(&t, "c", "33", 3.0);
    put_ok(&t, "d", "44", 4.0);                 // count: a goes
    assert_null(transcripts_get(&t, "a", 5.0, NULL));
    assert_int_equal(t.n, 3);
    put_ok(&t, "b", "2222", 5.0);               // replaced: c d b
    assert_string_equal(transcripts_get(&t, "b", 5.0, NULL), "2222");
    assert_int_equal(t.n, 3);
    assert_int_equal(t.bytes, 8);
    put_ok(&t, "e", "5555", 6.0);               // bytes: c goes (10 fit)
    assert_null(transcripts_get(&t, "c", 6.0, NULL));
    assert_string_equal(transcripts_get(&t, "d", 6.0, NULL), "44");
    assert_string_equal(transcripts_get(&t, "b", 6.0, NULL), "2222");
    assert_string_equal(transcripts_get(&t, "e", 6.0, NULL), "5555");
    assert_int_equal(t.bytes, 10);
    put_ok(&t, "g", "7", 6.5);                  // bytes: d goes
    assert_null(transcripts_get(&t, "d", 6.5, NULL));
    assert_int_equal(t.bytes, 9);
    put_ok(&t, "f", "0123456789", 7.0);         // exactly max_bytes: alone
    assert_int_equal(t.n, 1);
    assert_int_equal(t.bytes, 10);

    /* refusals leave the rest as it was */
    assert_int_equal(transcripts_put(&t, "g", "0123456789x", 11, 8.0, &err),
                     -1);
    assert_non_null(strstr(err.msg, "over the store's 10"));
    assert_int_equal(transcripts_put(&t, "g", "\xc3(", 2, 8.0, &err), -1);
    assert_non_null(strstr(err.msg, "not UTF-8"));
    assert_int_equal(transcripts_put(&t, "a b", "x", 1, 8.0, &err), -1);
    assert_int_equal(transcripts_put(&t, "", "x", 1, 8.0, &err), -1);
    assert_string_equal(transcripts_get(&t, "f", 8.0, NULL), "0123456789");

    /* many ids through a small store: the hash chains stay right */
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "k%d", i);
        put_ok(&t, id, "x", 10.0 + i);
        assert_string_equal(transcripts_get(&t, id, 10.0 + i, NULL), "x");
    }
    assert_int_equal(t.n, 3);
    assert_non_null(transcripts_get(&t, "k197", 300.0, NULL));
    assert_null(transcripts_get(&t, "k196", 300.0, NULL));
    transcripts_free(&t);

    assert_int_equal(transcripts_init(&t, 0, 10, &err), -1);
}

/* The spliced request parses back with each turn's transcript, escaping
 * included; a missing id is named; a short buffer gets the length. */
static void test_attach(void **state) {
    static const char json[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"audio\": {\"id\": \"a1\"}},"
        " {\"role\": \"user\", \"content\": \"And?\"},"
        " {\"role\": \"assistant\", \"audio\": {\"id\": \"a2\"}},"
        " {\"role\": \"assistant\", \"audio\": {\"id\": \"a1\"}}]} \n";
    static const char text1[] = "Say \"hi\"\\\n\t\x01 caf\xc3\xa9.";
    Transcripts       t;
    OmniRequest       r, back;
    ReqError          e;
    Err               err;
    char              out[512], small[16];
    long              n;
    int               missing;

    (void) state;
    assert_int_equal(transcripts_init(&t, 8, 4096, &err), 0);
    assert_int_equal(request_parse(&r, json, sizeof(json) - 1, &e), 0);
    put_ok(&t, "a1", text1, 1.0);
    assert_int_equal(transcripts_attach(&t, &r, json, sizeof(json) - 1, 2.0,
                                        out, sizeof(out), &missing), -1);
    assert_int_equal(missing, 3);

    put_ok(&t, "a2", "", 1.0);
    n = transcripts_attach(&t, &r, json, sizeof(json) - 1, 2.0, small,
                           sizeof(small), &missing);
    assert_true(n > (long) sizeof(small));
    assert_int_equal(transcripts_attach(&t, &r, json, sizeof(json) - 1, 2.0,
                                        out, (size_t) n, &missing), n);
    assert_non_null(strstr(out, "\"audio_transcripts\":{\"a1\":\"Say "
                           "\\\"hi\\\"\\\\\\u000a\\u0009\\u0001 caf\xc3\xa9"
                           ".\",\"a2\":\"\"}}"));
    assert_int_equal(request_parse(&back, out, (size_t) n, &e), 0);
    assert_string_equal(back.msgs[0].content, "Hi");
    assert_string_equal(back.msgs[1].content, text1);
    assert_string_equal(back.msgs[3].content, "");
    assert_string_equal(back.msgs[4].content, text1);
    request_free(&back);

    /* expired: missing again */
    assert_int_equal(transcripts_attach(&t, &r, json, sizeof(json) - 1,
                                        1.0 + TRANSCRIPT_TTL_S, out,
                                        sizeof(out), &missing), -1);
    assert_int_equal(missing, 1);
    request_free(&r);

    /* no audio ids: nothing to do */
    assert_int_equal(request_parse(&r, "{\"prompt\": \"x\"}", 15, &e), 0);
    assert_int_equal(transcripts_attach(&t, &r, "{\"prompt\": \"x\"}", 15,
                                        2.0, out, sizeof(out), &missing), 0);
    request_free(&r);
    transcripts_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_expire),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_attach),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("transcripts", tests, NULL, NULL);
}

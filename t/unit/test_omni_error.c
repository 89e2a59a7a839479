/* test_omni_error.c -- omni_error_set (engine/proto/omni_proto.h): the one place
 * an ERROR event's strings are cut to fit, and omni_utf8_cut
 * (engine/proto/json_scan.h) under it.
 *
 * The property: a string that fits is kept whole; one that does not is
 * cut to at most its room, at a character boundary, and no shorter than
 * the room less one character (three bytes at most). Checked for every
 * length of a message of one-, two-, three- and four-byte characters
 * around the room, and through an encode/decode round trip. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "json_scan.h"
#include "omni_proto.h"

/* A string of reps copies of ch, NUL-terminated, in a malloc'd buffer. */
static char *repeat(const char *ch, size_t reps) {
    size_t k = strlen(ch);
    char  *s = malloc(k * reps + 1);

    assert_non_null(s);
    for (size_t i = 0; i < reps; i++) memcpy(s + i * k, ch, k);
    s[k * reps] = '\0';
    return s;
}

/* The room omni_error_set leaves the message for these fields. */
static size_t message_room(const char *type, const char *param,
                           const char *code) {
    return OMNI_MAX_ERROR - omni_error_size(strlen(type),
                                            param ? strlen(param) : 0,
                                            code ? strlen(code) : 0, 0);
}

/* e's message is a prefix of msg, ends between characters, and is whole
 * when msg fits room, else within one character of room. */
static void check_cut(const OmniError *e, const char *msg, size_t room) {
    size_t n = strlen(msg);

    assert_ptr_equal(e->message, msg);
    if (n <= room) {
        assert_int_equal(e->message_len, n);
        return;
    }
    assert_true(e->message_len <= room);
    assert_true(e->message_len + 3 >= room);
    assert_int_equal(omni_utf8_valid(msg, e->message_len), e->message_len);
    // the next byte starts a character: the cut is not inside one
    assert_true(((unsigned char) msg[e->message_len] & 0xc0) != 0x80);
}

static void test_short_kept_whole(void **state) {
    const char *msg = "The model \xe2\x80\x9cx\xe2\x80\x9d does not exist.";
    OmniError   e;

    omni_error_set(&e, 404, "invalid_request_error", "model",
                   "model_not_found", msg);
    assert_int_equal(e.status, 404);
    assert_int_equal(e.type_len, strlen("invalid_request_error"));
    assert_int_equal(e.param_len, 5);
    assert_memory_equal(e.code, "model_not_found", e.code_len);
    assert_int_equal(e.message_len, strlen(msg));
}

static void test_null_fields(void **state) {
    OmniError e;

    omni_error_set(&e, 503, "server_error", NULL, NULL, "x");
    assert_null(e.param);
    assert_int_equal(e.param_len, 0);
    assert_null(e.code);
    assert_int_equal(e.code_len, 0);
    assert_int_equal(e.message_len, 1);
}

/* Every message length from a little under the room to a little over,
 * for characters of each width: never cut inside a character. */
static void test_long_cut_at_boundary(void **state) {
    static const char *chars[] = { "a", "\xc3\xa9", "\xe2\x82\xac",
                                   "\xf0\x9f\x98\x80" };
    const char *type = "server_error", *code = "stage_failed";
    size_t      room = message_room(type, NULL, code);

    for (size_t c = 0; c < 4; c++) {
        size_t k = strlen(chars[c]);

        for (size_t reps = room / k - 2; reps <= room / k + 2; reps++) {
            for (size_t pre = 0; pre < 4; pre++) {
                // 0..3 ASCII bytes in front move the character edges
                // across the cut point
                char     *tail = repeat(chars[c], reps);
                char     *msg = malloc(pre + strlen(tail) + 1);
                OmniError e;

                assert_non_null(msg);
                memset(msg, 'p', pre);
                strcpy(msg + pre, tail);
                omni_error_set(&e, 500, type, NULL, code, msg);
                check_cut(&e, msg, room);
                free(msg);
                free(tail);
            }
        }
    }
}

/* A message over the room by one byte, whose last character would
 * straddle the room: it is dropped whole, the encoding fits the event
 * and decodes to the same strings. */
static void test_cut_round_trip(void **state) {
    const char *type = "invalid_request_error", *param = "messages";
    size_t      room = message_room(type, param, NULL);
    char       *msg = malloc(room + 2);
    uint8_t     buf[OMNI_MAX_ERROR];
    OmniError   e, d;
    size_t      len;

    assert_non_null(msg);
    memset(msg, 'x', room - 1);
    memcpy(msg + room - 1, "\xc3\xa9", 3);      // é at room-1..room
    omni_error_set(&e, 400, type, param, NULL, msg);
    assert_int_equal(e.message_len, room - 1);
    len = omni_error_encode(buf, &e);
    assert_true(len <= OMNI_MAX_ERROR);
    assert_int_equal(omni_error_decode(&d, buf, len), 0);
    assert_int_equal(d.status, 400);
    assert_int_equal(d.message_len, room - 1);
    assert_memory_equal(d.message, msg, room - 1);
    assert_int_equal(d.param_len, strlen(param));
    assert_int_equal(d.code_len, 0);
    free(msg);
}

/* type, param and code are cut too, and by the same rule. */
static void test_fields_cut(void **state) {
    char     *code = repeat("\xe2\x82\xac", 100);     // 300 bytes
    OmniError e;

    omni_error_set(&e, 400, "invalid_request_error", NULL, code, "m");
    assert_int_equal(e.code_len, 255);          // 85 whole characters
    assert_int_equal(e.message_len, 1);
    free(code);
}

/* omni_utf8_cut on its own: the edges, and ill-formed bytes counted one
 * at a time. */
static void test_utf8_cut(void **state) {
    assert_int_equal(omni_utf8_cut("", 0), 0);
    assert_int_equal(omni_utf8_cut("abc", 3), 3);
    assert_int_equal(omni_utf8_cut("abc", 2), 2);
    assert_int_equal(omni_utf8_cut("a\xc3\xa9", 2), 1);
    assert_int_equal(omni_utf8_cut("a\xc3\xa9", 3), 3);
    assert_int_equal(omni_utf8_cut("\xf0\x9f\x98\x80z", 3), 0);
    assert_int_equal(omni_utf8_cut("\xf0\x9f\x98\x80z", 4), 4);
    assert_int_equal(omni_utf8_cut("\xff\xfe\xfd", 2), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_kept_whole),
        cmocka_unit_test(test_null_fields),
        cmocka_unit_test(test_long_cut_at_boundary),
        cmocka_unit_test(test_cut_round_trip),
        cmocka_unit_test(test_fields_cut),
        cmocka_unit_test(test_utf8_cut),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("omni_error", tests, NULL, NULL);
}

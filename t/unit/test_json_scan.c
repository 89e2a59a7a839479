/* test_json_scan.c -- engine/proto/json_scan.h: the UTF-8 validator and the
 * pre-scan that the engine's request parser and the nginx module share.
 *
 * The validator is checked three ways: a table of every class of valid and
 * ill-formed sequence at its boundaries (Unicode's Table 3-7), every
 * truncation of every valid multi-byte character, and every sequence of
 * up to three bytes (and every four-byte lead and second byte) against an
 * independent decoder that computes the code point and rejects it by
 * range. Then the pre-scan finds the same sequences inside JSON strings,
 * refuses unpaired surrogate escapes, and names the value (path) and the
 * bytes for the error message. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "json_scan.h"

#define DEPTH 64
#define NODES (1 << 18)


/* ---- the validator: a table of classes at their boundaries ------------- */

typedef struct {
    const char *name;
    const char *bytes;
    size_t      len;
    size_t      first;          // omni_utf8_char() of the first character
    size_t      bad_at;         // omni_utf8_valid(): len when valid
} Case;

#define VALID(name, s, k)    { name, s, sizeof(s) - 1, k, sizeof(s) - 1 }
#define INVALID(name, s, first, at) { name, s, sizeof(s) - 1, first, at }

static const Case CASES[] = {
    /* one byte */
    VALID("U+0000", "\x00", 1),
    VALID("U+0041", "A", 1),
    VALID("U+007F (last 1-byte)", "\x7f", 1),
    /* two bytes */
    VALID("U+0080 (first 2-byte)", "\xc2\x80", 2),
    VALID("U+00E9", "\xc3\xa9", 2),
    VALID("U+07FF (last 2-byte)", "\xdf\xbf", 2),
    /* three bytes, each row of Table 3-7 at both ends */
    VALID("U+0800 (first 3-byte)", "\xe0\xa0\x80", 3),
    VALID("U+0FFF", "\xe0\xbf\xbf", 3),
    VALID("U+1000", "\xe1\x80\x80", 3),
    VALID("U+CFFF", "\xec\xbf\xbf", 3),
    VALID("U+D000", "\xed\x80\x80", 3),
    VALID("U+D7FF (before the surrogates)", "\xed\x9f\xbf", 3),
    VALID("U+E000 (after the surrogates)", "\xee\x80\x80", 3),
    VALID("U+FEFF (BOM)", "\xef\xbb\xbf", 3),
    VALID("U+FFFE (noncharacter, well-formed)", "\xef\xbf\xbe", 3),
    VALID("U+FFFF (last 3-byte)", "\xef\xbf\xbf", 3),
    /* four bytes */
    VALID("U+10000 (first 4-byte)", "\xf0\x90\x80\x80", 4),
    VALID("U+1F600", "\xf0\x9f\x98\x80", 4),
    VALID("U+3FFFF", "\xf0\xbf\xbf\xbf", 4),
    VALID("U+40000", "\xf1\x80\x80\x80", 4),
    VALID("U+FFFFF", "\xf3\xbf\xbf\xbf", 4),
    VALID("U+100000", "\xf4\x80\x80\x80", 4),
    VALID("U+10FFFF (last code point)", "\xf4\x8f\xbf\xbf", 4),
    VALID("mixed", "a\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80z", 1),

    /* overlong: each length, at its edges */
    INVALID("overlong U+0000 in 2", "\xc0\x80", 0, 0),
    INVALID("overlong '/' in 2 (C0 AF)", "\xc0\xaf", 0, 0),
    INVALID("overlong U+007F in 2 (C1 BF)", "\xc1\xbf", 0, 0),
    INVALID("overlong U+0000 in 3", "\xe0\x80\x80", 0, 0),
    INVALID("overlong '/' in 3", "\xe0\x80\xaf", 0, 0),
    INVALID("overlong U+07FF in 3", "\xe0\x9f\xbf", 0, 0),
    INVALID("overlong U+0000 in 4", "\xf0\x80\x80\x80", 0, 0),
    INVALID("overlong U+FFFF in 4", "\xf0\x8f\xbf\xbf", 0, 0),
    INVALID("5-byte form", "\xf8\x88\x80\x80\x80", 0, 0),
    INVALID("6-byte form", "\xfc\x84\x80\x80\x80\x80", 0, 0),
    /* surrogates D800-DFFF encoded */
    INVALID("U+D800 (ED A0 80)", "\xed\xa0\x80", 0, 0),
    INVALID("U+DBFF", "\xed\xaf\xbf", 0, 0),
    INVALID("U+DC00", "\xed\xb0\x80", 0, 0),
    INVALID("U+DFFF", "\xed\xbf\xbf", 0, 0),
    INVALID("surrogate pair (CESU-8)", "\xed\xa0\xbd\xed\xb8\x80", 0, 0),
    /* above U+10FFFF */
    INVALID("U+110000 (F4 90 80 80)", "\xf4\x90\x80\x80", 0, 0),
    INVALID("U+13FFFF", "\xf4\xbf\xbf\xbf", 0, 0),
    INVALID("lead F5", "\xf5\x80\x80\x80", 0, 0),
    INVALID("lead F7", "\xf7\xbf\xbf\xbf", 0, 0),
    INVALID("byte FE", "\xfe", 0, 0),
    INVALID("byte FF", "\xff", 0, 0),
    /* stray continuation bytes */
    INVALID("stray 80", "\x80", 0, 0),
    INVALID("stray BF", "\xbf", 0, 0),
    INVALID("two strays", "\x80\x80", 0, 0),
    INVALID("stray after ASCII", "ab\x80", 1, 2),
    INVALID("extra continuation after U+0080", "\xc2\x80\x80", 2, 2),
    INVALID("extra continuation after U+FFFF", "\xef\xbf\xbf\xbf", 3, 3),
    /* a lead without its continuation bytes */
    INVALID("C2 then ASCII", "\xc2" "A", 0, 0),
    INVALID("E0 A0 then ASCII", "\xe0\xa0" "A", 0, 0),
    INVALID("F0 90 80 then ASCII", "\xf0\x90\x80" "A", 0, 0),
    INVALID("lead then lead", "\xc2\xc2\x80", 0, 0),
    INVALID("valid, then truncated", "\xc3\xa9\xe2\x82", 2, 2),
};

static void test_table(void **state) {
    (void) state;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        const Case          *c = &CASES[i];
        const unsigned char *u = (const unsigned char *) c->bytes;
        size_t               first = omni_utf8_char(u, c->len);
        size_t               at = omni_utf8_valid(c->bytes, c->len);

        if (c->bad_at == 0 && first != 0) {
            fail_msg("%s: the first character was accepted (%zu bytes)",
                     c->name, first);
        }
        if (c->bad_at != 0 && first != c->first) {
            fail_msg("%s: first character %zu bytes, want %zu", c->name,
                     first, c->first);
        }
        if (at != c->bad_at) {
            fail_msg("%s: ill-formed at %zu, want %zu (len %zu)", c->name,
                     at, c->bad_at, c->len);
        }
    }
}

/* Every proper prefix of a valid multi-byte character is refused, alone,
 * before ASCII, before another character, and at the end of a string. */
static void test_truncated(void **state) {
    (void) state;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        const Case *c = &CASES[i];

        if (c->bad_at != c->len || c->first < 2 || c->first != c->len) {
            continue;
        }
        for (size_t k = 1; k < c->len; k++) {
            char buf[16];

            memcpy(buf, c->bytes, k);
            if (omni_utf8_char((const unsigned char *) buf, k) != 0
                || omni_utf8_valid(buf, k) != 0) {
                fail_msg("%s cut to %zu bytes: accepted", c->name, k);
            }
            buf[k] = 'x';
            assert_int_equal(omni_utf8_valid(buf, k + 1), 0);
            memcpy(buf + k, "\xc3\xa9", 2);
            assert_int_equal(omni_utf8_valid(buf, k + 2), 0);
            memmove(buf + 1, buf, k);
            buf[0] = 'a';
            assert_int_equal(omni_utf8_valid(buf, k + 1), 1);
        }
    }
}

/* An independent definition: decode by the bit patterns, then refuse by
 * the code point (overlong for its length, a surrogate, above U+10FFFF).
 * Returns the length of the first character, 0 when ill-formed. */
static size_t ref_char(const unsigned char *s, size_t n) {
    static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    size_t   k;
    uint32_t cp;

    if (s[0] < 0x80) return 1;
    if ((s[0] & 0xe0) == 0xc0) k = 2, cp = s[0] & 0x1f;
    else if ((s[0] & 0xf0) == 0xe0) k = 3, cp = s[0] & 0x0f;
    else if ((s[0] & 0xf8) == 0xf0) k = 4, cp = s[0] & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min_cp[k] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
        return 0;
    }
    return k;
}

static void test_exhaustive(void **state) {
    static const unsigned char tails[] = { 0x00, 0x41, 0x7f, 0x80, 0x8f,
                                           0x90, 0x9f, 0xa0, 0xbf, 0xc0,
                                           0xc2, 0xf4, 0xff };
    unsigned char b[4];
    size_t        valid = 0;

    (void) state;
    for (unsigned x = 0; x < 1u << 24; x++) {       // every 1..3 bytes
        b[0] = (unsigned char) (x >> 16);
        b[1] = (unsigned char) (x >> 8);
        b[2] = (unsigned char) x;
        for (size_t n = 1; n <= 3; n++) {
            if (n < 3 && (x & ((1u << (8 * (3 - n))) - 1)) != 0) continue;
            if (omni_utf8_char(b, n) != ref_char(b, n)) {
                fail_msg("%02X %02X %02X (n %zu): %zu, reference %zu", b[0],
                         b[1], b[2], n, omni_utf8_char(b, n), ref_char(b, n));
            }
        }
        valid += ref_char(b, 3) == 3;
    }
    /* 3-byte characters: U+0800..U+FFFF less the 2048 surrogates */
    assert_int_equal(valid, 0x10000 - 0x800 - 0x800);
    for (unsigned x = 0; x < 1u << 16; x++) {       // 4 bytes: leads x 2nd
        for (size_t i = 0; i < sizeof(tails); i++) {
            for (size_t j = 0; j < sizeof(tails); j++) {
                b[0] = (unsigned char) (x >> 8);
                b[1] = (unsigned char) x;
                b[2] = tails[i];
                b[3] = tails[j];
                if (omni_utf8_char(b, 4) != ref_char(b, 4)) {
                    fail_msg("%02X %02X %02X %02X: %zu, reference %zu",
                             b[0], b[1], b[2], b[3], omni_utf8_char(b, 4),
                             ref_char(b, 4));
                }
            }
        }
    }
}


/* ---- the pre-scan -------------------------------------------------------- */

/* Every class of the table inside a JSON string, and outside one. */
static void test_scan_strings(void **state) {
    (void) state;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        const Case  *c = &CASES[i];
        char         json[64];
        size_t       pre = sizeof("{\"prompt\": \"x") - 1, n, at = 99;
        OmniJsonScan rc;

        if (c->bytes[0] == '\0') continue;          // NUL: its own refusal
        n = (size_t) snprintf(json, sizeof(json), "{\"prompt\": \"x");
        memcpy(json + n, c->bytes, c->len);
        n += c->len;
        n += (size_t) snprintf(json + n, sizeof(json) - n, "\"}");
        rc = omni_json_scan(json, n, DEPTH, NODES, &at);
        if (c->bad_at == c->len) {
            if (rc != OMNI_JSON_OK) fail_msg("%s: refused (%d)", c->name, rc);
        } else if (rc != OMNI_JSON_UTF8 || at != pre + c->bad_at) {
            fail_msg("%s: rc %d at %zu, want %d at %zu", c->name, rc, at,
                     OMNI_JSON_UTF8, pre + c->bad_at);
        }
    }
    /* outside strings too: the body must be UTF-8 throughout */
    {
        size_t at = 0;

        assert_int_equal(omni_json_scan("{\"a\": \xc0\xaf}", 9, DEPTH, NODES,
                                        &at), OMNI_JSON_UTF8);
        assert_int_equal(at, 6);
    }
}

/* \u escapes: a surrogate must be a high one directly followed by an
 * escaped low one. */
static void test_scan_escapes(void **state) {
    static const struct {
        const char  *str;       // the string's body, between the quotes
        OmniJsonScan want;
        size_t       at;        // offset in the string of the refusal
    } esc[] = {
        { "\\u0041", OMNI_JSON_OK, 0 },
        { "\\u00e9\\u4E16", OMNI_JSON_OK, 0 },
        { "\\ud7ff\\ue000\\uffff", OMNI_JSON_OK, 0 },
        { "\\ud800\\udc00", OMNI_JSON_OK, 0 },          // U+10000
        { "\\uD83D\\uDE00", OMNI_JSON_OK, 0 },          // U+1F600
        { "\\udbff\\udfff", OMNI_JSON_OK, 0 },          // U+10FFFF
        { "a\\ud83d\\ude00b\\ud83d\\ude00", OMNI_JSON_OK, 0 },
        { "\\\\ud800", OMNI_JSON_OK, 0 },               // an escaped '\'
        { "\\\\\\ud800\\udc00", OMNI_JSON_OK, 0 },
        { "\\u12", OMNI_JSON_OK, 0 },                   // yajl's to refuse
        { "\\u0000", OMNI_JSON_U0000, 0 },
        { "ab\\ud800", OMNI_JSON_SURROGATE, 2 },        // high, then end
        { "\\ud800x", OMNI_JSON_SURROGATE, 0 },         // high, then text
        { "\\udbff\\u0041", OMNI_JSON_SURROGATE, 0 },   // high, then BMP
        { "\\ud800\\ud800", OMNI_JSON_SURROGATE, 0 },   // high, then high
        { "\\ud800\\n", OMNI_JSON_SURROGATE, 0 },       // high, other escape
        { "\\ud800\\", OMNI_JSON_SURROGATE, 0 },        // high, cut
        { "\\ud800\\udc", OMNI_JSON_SURROGATE, 0 },     // high, cut low
        { "\\udc00", OMNI_JSON_SURROGATE, 0 },          // lone low
        { "\\uDFFF\\uD800", OMNI_JSON_SURROGATE, 0 },   // low before high
        { "\\ud83d\\ude00\\ude00", OMNI_JSON_SURROGATE, 12 },
    };

    (void) state;
    for (size_t i = 0; i < sizeof(esc) / sizeof(esc[0]); i++) {
        char         json[128];
        size_t       pre = sizeof("{\"prompt\": \"") - 1, at = 99;
        int          n = snprintf(json, sizeof(json), "{\"prompt\": \"%s\"}",
                                  esc[i].str);
        OmniJsonScan rc = omni_json_scan(json, (size_t) n, DEPTH, NODES, &at);

        if (rc != esc[i].want) {
            fail_msg("\"%s\": rc %d, want %d", esc[i].str, rc, esc[i].want);
        }
        if (rc == OMNI_JSON_SURROGATE && at != pre + esc[i].at) {
            fail_msg("\"%s\": at %zu, want %zu", esc[i].str, at,
                     pre + esc[i].at);
        }
    }
    /* in a key as in a value */
    {
        size_t at = 0;

        assert_int_equal(omni_json_scan("{\"\\udc00\": 1}", 13, DEPTH, NODES,
                                        &at), OMNI_JSON_SURROGATE);
        assert_int_equal(at, 2);
    }
}

/* The scan reads only len bytes, whatever follows. */
static void test_scan_len(void **state) {
    size_t at = 0;

    (void) state;
    /* a character cut by len is refused, even if the bytes go on */
    assert_int_equal(omni_json_scan("\"\xc3\xa9\"", 2, DEPTH, NODES, &at),
                     OMNI_JSON_UTF8);
    assert_int_equal(omni_json_scan("\"\\ud800\\udc00\"", 10, DEPTH, NODES,
                                    &at), OMNI_JSON_SURROGATE);
    assert_int_equal(omni_json_scan("\"\xc3\xa9\"", 4, DEPTH, NODES, &at),
                     OMNI_JSON_OK);
}


/* ---- naming what was refused ------------------------------------------- */

/* The path of the value holding the first 0xFF byte of json. */
static void expect_path(const char *json, const char *want) {
    size_t       len = strlen(json), at = 0;
    char         path[64];
    OmniJsonScan rc = omni_json_scan(json, len, DEPTH, NODES, &at);

    if (rc != OMNI_JSON_UTF8 || json[at] != '\xff') {
        fail_msg("%s: scan rc %d at %zu", json, rc, at);
    }
    memset(path, '#', sizeof(path));
    omni_json_path(json, len, at, path, sizeof(path));
    if (strcmp(path, want) != 0) {
        fail_msg("%s: path '%s', want '%s'", json, path, want);
    }
}

static void test_path(void **state) {
    (void) state;
    expect_path("{\"prompt\": \"a\xff\"}", "prompt");
    expect_path("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", "
                "\"content\": \"\xff\"}]}", "messages[0].content");
    expect_path("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                "{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                "\"text\": \"x\"}, {}, {\"type\": \"text\", \"text\": "
                "\"\xff\"}]}]}", "messages[1].content[2].text");
    expect_path("{\"messages\": [{\"role\": \"us\xff\"}]}",
                "messages[0].role");
    expect_path("{\"stop\": [\"a\", \"b\xff\"]}", "stop[1]");
    expect_path("{\"stop\": \"\xff\"}", "stop");
    expect_path("{\"prompt\": \"x\", \"user\": \"\xff\"}", "user");
    expect_path("{ \"a\" : [ 1 , \"\xff\" ] }", "a[1]");
    expect_path("{\"a\": [[1, 2], [3, \"\xff\"]]}", "a[1][1]");
    expect_path("{\"a\": {}, \"b\": [{}], \"c\": [], \"d\": \"\xff\"}", "d");
    expect_path("{\"a\": 1.5, \"b\": true, \"c\": null, \"d\": \"\xff\"}",
                "d");
    expect_path("{\"a\": {\"b\": \"x\"}, \"c\": \"\xff\"}", "c");
    expect_path("{\"a\\\"b\": \"\xff\"}", "a\\\"b");
    expect_path("{\"a\": \"\\\"}\", \"b\": \"\xff\"}", "b");
    expect_path("{\"a\": \xff}", "a");              // outside a string
    /* a bad key names its object; at the top level, nothing */
    expect_path("{\"k\xff\": 1}", "");
    expect_path("{\"a\": {\"b\xff\": 1}}", "a");
    expect_path("{\"a\": [{\"b\xff\": 1}]}", "a[0]");
    /* not in an object member */
    expect_path("\"\xff\"", "");
    expect_path("[\"x\", \"\xff\"]", "[1]");
    /* too long for the buffer: cut, marked, NUL-terminated */
    {
        char   json[256], path[16];
        size_t at = 0, len;

        len = (size_t) snprintf(json, sizeof(json), "{\"%s\": \"\xff\"}",
                                "a_very_long_parameter_name_indeed");
        assert_int_equal(omni_json_scan(json, len, DEPTH, NODES, &at),
                         OMNI_JSON_UTF8);
        omni_json_path(json, len, at, path, sizeof(path));
        assert_string_equal(path, "a_very_long_...");
        /* the cut never splits a character */
        len = (size_t) snprintf(json, sizeof(json), "{\"%s\": \"\xff\"}",
                                "abcdefghijk\xc3\xa9\xc3\xa9\xc3\xa9");
        assert_int_equal(omni_json_scan(json, len, DEPTH, NODES, &at),
                         OMNI_JSON_UTF8);
        omni_json_path(json, len, at, path, sizeof(path));
        assert_string_equal(path, "abcdefghijk...");
        assert_int_equal(omni_utf8_valid(path, strlen(path)), strlen(path));
    }
    /* deeper than the levels tracked: no overflow, a path that fits */
    {
        size_t n = 0, at;
        char   json[400], path[64];

        n += (size_t) snprintf(json, sizeof(json), "{\"a\": ");
        for (int i = 0; i < 100; i++) json[n++] = '[';
        memcpy(json + n, "\"\xff\"", 3);
        n += 3;
        at = n - 2;
        omni_json_path(json, n, at, path, sizeof(path));
        assert_true(strlen(path) < sizeof(path));
        assert_memory_equal(path, "a[0][0]", 7);
    }
}

static void expect_what(const char *json, const char *want) {
    size_t       len = strlen(json), at = 0;
    char         what[96];
    OmniJsonScan rc = omni_json_scan(json, len, DEPTH, NODES, &at);

    assert_true(rc == OMNI_JSON_UTF8 || rc == OMNI_JSON_SURROGATE);
    omni_json_utf8_what(json, len, rc, at, what, sizeof(what));
    if (strcmp(what, want) != 0) {
        fail_msg("%s: '%s', want '%s'", json, what, want);
    }
}

static void test_what(void **state) {
    (void) state;
    expect_what("{\"p\": \"\xc0\xaf\"}", "bytes C0 AF at offset 7");
    expect_what("{\"p\": \"\xed\xa0\x80\"}", "bytes ED A0 80 at offset 7");
    expect_what("{\"p\": \"\xf4\x90\x80\x80\"}",
                "bytes F4 90 80 80 at offset 7");
    expect_what("{\"p\": \"\xf5\x80\x80\x80\x80\"}",
                "bytes F5 80 80 80 at offset 7");
    expect_what("{\"p\": \"\xff\"}", "byte FF at offset 7");
    expect_what("{\"p\": \"ab\x80\"}", "byte 80 at offset 9");
    expect_what("{\"p\": \"\xe2\x82\"}", "bytes E2 82 at offset 7");
    expect_what("{\"p\": \"\xe2\"}", "byte E2 at offset 7");
    expect_what("{\"p\": \"\\uD800\"}", "unpaired surrogate \\uD800 at "
                "offset 7");
    expect_what("{\"p\": \"\\udc00\\ud800\"}", "unpaired surrogate \\udc00 "
                "at offset 7");
    {
        char what[12];

        omni_json_utf8_what("\"\xed\xa0\x80\"", 5, OMNI_JSON_UTF8, 1, what,
                            sizeof(what));
        assert_string_equal(what, "bytes ED A0");     // cut to fit
    }
}


int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_exhaustive),
        cmocka_unit_test(test_scan_strings),
        cmocka_unit_test(test_scan_escapes),
        cmocka_unit_test(test_scan_len),
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_what),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("json_scan", tests, NULL, NULL);
}

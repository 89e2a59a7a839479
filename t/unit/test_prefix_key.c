/* test_prefix_key.c -- the prefix key chain of proto/prefix_key.h, which
 * nginx and the engine must compute alike, and the engine's way to it
 * from a parsed request (llm/prefix_keys.c: model, salt, roles, joined
 * content parts, the chain's end at audio).
 *
 * The fixed vectors below are the contract: nginx's side checks the same
 * conversations against the same hex (they are in the README too). They
 * were produced by the header's functions; that those follow the header's
 * own description is checked separately, by hashing the byte stream the
 * description spells out in one XXH3_128bits call, and XXH3 itself by its
 * published empty-input vector. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "prefix_key.h"
#include "prefix_keys.h"
#include "request.h"

typedef struct {
    const char *role, *content;
} Msg;

static const Msg conv[] = {
    { "system",    "You are a helpful assistant." },
    { "user",      "Hello" },
    { "assistant", "Hi! How can I help?" },
    { "user",      "Tell me a story about a cat." },
};

static const Msg conv_d[] = {
    { "user",      "Gr\xc3\xbc\xc3\x9f" "e, \xe4\xb8\x96\xe7\x95\x8c" },
    { "assistant", "" },
    { "tool",      "{\"ok\":true}" },
};

/* model, salt, messages -> root then one key per message. */
typedef struct {
    const char *model, *salt;
    const Msg  *msgs;
    int         n;
    const char *hex[5];
} Vector;

static const Vector vectors[] = {
    { "", "", conv, 4, {
        "1acb7c158d6148372f43aca3d78a95d9",
        "203588df7384e3fb776e273c1e5975ad",
        "c121c676835310fc6a71506efc20dcc2",
        "37ea0f93d892eb50311d52a75e6c3c4c",
        "7800294062ba54b9a28dda20679a5c2c" } },
    { "stories260K", "", conv, 4, {
        "0a4396abedb65c159401f769ce31b0e5",
        "c477fe44e14ce73add2b2b818640d063",
        "063961f7e2eab856370c737f6f608eca",
        "d35ab063feabcde3a65b569e97fea85c",
        "0417590c0167b14b50bddc0a4c3e7677" } },
    { "stories260K", "tenant-7", conv, 4, {
        "4f76597af26c2c792fa72c6020f6241f",
        "abee3ac69268c01405c72c051998bee1",
        "fb6a3da8fa8ad611a88fbeb20569863e",
        "899c460e6a2f9d8dd99834a6efaf9264",
        "777f1fd3f4ffb6c7b3264c7c8c26b5fb" } },
    { "", "", conv_d, 3, {
        "1acb7c158d6148372f43aca3d78a95d9",
        "904c69818dbb4925cec744e7695c257e",
        "0abcb40ef108c113daefc0bd8039aa04",
        "f31c9e8625ba662f559d13d5a685d131" } },
};

#define N_VECTORS ((int) (sizeof(vectors) / sizeof(vectors[0])))

static void assert_hex(OmniPkey k, const char *want) {
    char hex[OMNI_PKEY_HEX + 1];

    *omni_pkey_hex(hex, k) = '\0';
    assert_string_equal(hex, want);
}


/* ---- XXH3 and the byte stream ------------------------------------------- */

static void test_xxh3(void **state) {
    XXH128_hash_t h = XXH3_128bits("", 0);

    (void) state;
    assert_true(h.high64 == 0x99aa06d3014798d8ULL);
    assert_true(h.low64 == 0x6001c324468d497fULL);
}

/* Appends n as 8 bytes, little-endian, then the n bytes of s. */
static size_t put_field(uint8_t *b, size_t at, const char *s, size_t n) {
    for (int i = 0; i < 8; i++) b[at++] = (uint8_t) (n >> (8 * i));
    memcpy(b + at, s, n);
    return at + n;
}

static OmniPkey one_shot(const uint8_t *b, size_t n) {
    XXH128_hash_t h = XXH3_128bits(b, n);
    OmniPkey      k = { h.high64, h.low64 };

    return k;
}

/* The header's description: root = H(len "omni-prefix-1", model, salt),
 * key = H(prev as 16 big-endian bytes, high half first, then role and
 * content with their lengths). */
static void test_stream_layout(void **state) {
    uint8_t  b[512];
    size_t   n = 0;
    OmniPkey root, k;

    (void) state;
    n = put_field(b, n, "omni-prefix-1", 13);
    n = put_field(b, n, "m", 1);
    n = put_field(b, n, "salt", 4);
    root = one_shot(b, n);
    k = omni_pkey_root("m", 1, "salt", 4);
    assert_true(k.hi == root.hi && k.lo == root.lo);

    n = 0;
    for (int i = 0; i < 8; i++) b[n++] = (uint8_t) (root.hi >> (56 - 8 * i));
    for (int i = 0; i < 8; i++) b[n++] = (uint8_t) (root.lo >> (56 - 8 * i));
    n = put_field(b, n, "user", 4);
    n = put_field(b, n, "Hello\nworld", 11);
    k = one_shot(b, n);
    assert_true(omni_pkey_next(root, "user", 4, "Hello\nworld", 11).hi
                == k.hi);

    /* content fed in pieces, as nginx feeds text parts and their "\n"s */
    {
        OmniPkeyHash h;
        OmniPkey     p;

        omni_pkey_begin(&h, root, "user", 4, 11);
        omni_pkey_put(&h, "Hello", 5);
        omni_pkey_put(&h, "\n", 1);
        omni_pkey_put(&h, "", 0);
        omni_pkey_put(&h, "world", 5);
        p = omni_pkey_digest(&h);
        assert_true(p.hi == k.hi && p.lo == k.lo);
    }
}

static void test_vectors(void **state) {
    (void) state;
    for (int v = 0; v < N_VECTORS; v++) {
        const Vector *t = &vectors[v];
        OmniPkey      k = omni_pkey_root(t->model, strlen(t->model), t->salt,
                                         strlen(t->salt));

        assert_hex(k, t->hex[0]);
        for (int i = 0; i < t->n; i++) {
            const Msg *m = &t->msgs[i];

            k = omni_pkey_next(k, m->role, strlen(m->role), m->content,
                               strlen(m->content));
            assert_hex(k, t->hex[i + 1]);
        }
    }
}

static void test_hex(void **state) {
    OmniPkey k = { 0x0123456789abcdefULL, 0xfedcba9876543210ULL };
    char     hex[OMNI_PKEY_HEX + 1];

    (void) state;
    assert_ptr_equal(omni_pkey_hex(hex, k), hex + OMNI_PKEY_HEX);
    hex[OMNI_PKEY_HEX] = '\0';
    assert_string_equal(hex, "0123456789abcdeffedcba9876543210");
}

/* The first 16 and the last 48 of a long chain. */
static void test_used(void **state) {
    int n = 0;

    (void) state;
    for (size_t i = 0; i < 64; i++) assert_true(omni_pkey_used(i, 64));
    for (size_t i = 0; i < 70; i++) n += omni_pkey_used(i, 70);
    assert_int_equal(n, OMNI_PKEY_MAX);
    assert_true(omni_pkey_used(15, 70));
    assert_false(omni_pkey_used(16, 70));
    assert_false(omni_pkey_used(21, 70));
    assert_true(omni_pkey_used(22, 70));
    assert_true(omni_pkey_used(69, 70));
}


/* ---- From a request ------------------------------------------------------ */

static void parse(OmniRequest *r, const char *json) {
    ReqError e;

    if (request_parse(r, json, strlen(json), &e) != 0) {
        fail_msg("%s: %s", json, e.err.msg);
    }
}

/* The keys pkeys_* give a parsed request. */
static void request_keys(const char *json, OmniPkey *keys, int *n) {
    OmniRequest r;
    OmniPkey    k;

    parse(&r, json);
    k = pkeys_root(&r);
    keys[0] = k;
    *n = pkeys_chain_len(&r);
    for (int i = 0; i < *n; i++) keys[i + 1] = k = pkeys_next(k, &r.msgs[i]);
    request_free(&r);
}

/* Vector C from JSON: model and salt as given, "developer" is "system",
 * a content array's text parts joined with "\n". */
static void test_request_vector(void **state) {
    OmniPkey keys[8], want;
    int      n;

    (void) state;
    request_keys("{\"model\":\"stories260K\",\"cache_salt\":\"tenant-7\","
                 "\"messages\":["
                 "{\"role\":\"developer\",\"content\":\"You are a helpful "
                 "assistant.\"},{\"role\":\"user\",\"content\":\"Hello\"},"
                 "{\"role\":\"assistant\",\"content\":\"Hi! How can I help?"
                 "\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                 "\"text\":\"Tell me a story about a cat.\"}]}],"
                 "\"max_tokens\":5}", keys, &n);
    assert_int_equal(n, 4);
    for (int i = 0; i <= 4; i++) assert_hex(keys[i], vectors[2].hex[i]);

    request_keys("{\"messages\":[{\"role\":\"system\",\"content\":["
                 "{\"type\":\"text\",\"text\":\"You are a\"},{\"type\":"
                 "\"text\",\"text\":\"helpful assistant.\"}]}]}", keys, &n);
    want = omni_pkey_next(omni_pkey_root("", 0, "", 0), "system", 6,
                          "You are a\nhelpful assistant.", 28);
    assert_int_equal(n, 1);
    assert_true(keys[1].hi == want.hi && keys[1].lo == want.lo);
}

/* A message with audio ends the chain: an assistant's audio id, a user's
 * input_audio part. */
static void test_request_audio(void **state) {
    OmniPkey keys[8];
    int      n;

    (void) state;
    request_keys("{\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
                 "helpful assistant.\"},{\"role\":\"user\",\"content\":"
                 "\"Hello\"},{\"role\":\"assistant\",\"audio\":{\"id\":"
                 "\"audio_1\"}},{\"role\":\"user\",\"content\":\"x\"}]}",
                 keys, &n);
    assert_int_equal(n, 2);
    assert_hex(keys[2], vectors[0].hex[2]);
    request_keys("{\"audio_in\":[{\"format\":\"wav\",\"bytes\":44}],"
                 "\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"},"
                 "{\"role\":\"assistant\",\"content\":\"Hi\"},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                 "\"text\":\"listen\"},{\"type\":\"input_audio\","
                 "\"index\":0}]}]}", keys, &n);
    assert_int_equal(n, 2);
    request_keys("{\"prompt\":\"Hello\"}", keys, &n);
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh3),
        cmocka_unit_test(test_stream_layout),
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_hex),
        cmocka_unit_test(test_used),
        cmocka_unit_test(test_request_vector),
        cmocka_unit_test(test_request_audio),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("prefix_key", tests, NULL, NULL);
}

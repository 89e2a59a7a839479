/* test_serve_name.c -- serve_model_name (engine/stage/serve.h), the one rule for
 * the name a model is served under, which main.c, the thinker and the
 * frontend all apply. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "serve.h"

/* The name for model_path and model_name, with cap bytes of room; its
 * whole length in *n. */
static const char *name_of(const char *path, const char *model_name,
                           size_t cap, size_t *n) {
    static char out[64];
    ServeConfig cfg = { .model_path = path, .model_name = model_name };

    assert_true(cap <= sizeof(out));
    memset(out, 'X', sizeof(out));
    *n = serve_model_name(&cfg, out, cap);
    return out;
}

static void test_file_name(void **state) {
    size_t n;

    assert_string_equal(name_of("../models/stories260K.gguf", NULL, 64, &n),
                        "stories260K");
    assert_int_equal(n, 11);
    assert_string_equal(name_of("tiny.gguf", NULL, 64, &n), "tiny");
    assert_string_equal(name_of("/m/a.gguf.gguf", NULL, 64, &n), "a.gguf");
    assert_string_equal(name_of("/m/weights.bin", NULL, 64, &n),
                        "weights.bin");
    // ".gguf" alone is a name, not an empty one
    assert_string_equal(name_of("/m/.gguf", NULL, 64, &n), ".gguf");
    assert_string_equal(name_of("/m/", NULL, 64, &n), "");
    assert_int_equal(n, 0);
}

static void test_model_name_wins(void **state) {
    size_t n;

    assert_string_equal(name_of("/m/x.gguf", "org/model:1", 64, &n),
                        "org/model:1");
    assert_int_equal(n, 11);
    // an empty one counts as not given
    assert_string_equal(name_of("/m/x.gguf", "", 64, &n), "x");
}

/* Too long for cap: cut to cap - 1 bytes, the whole length returned. */
static void test_cut(void **state) {
    size_t n;

    assert_string_equal(name_of("/m/abcdefgh.gguf", NULL, 5, &n), "abcd");
    assert_int_equal(n, 8);
    assert_string_equal(name_of("/m/x.gguf", "abcdefgh", 8, &n), "abcdefg");
    assert_int_equal(n, 8);
    assert_string_equal(name_of("/m/x.gguf", "abcdefg", 8, &n), "abcdefg");
    assert_int_equal(n, 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_name),
        cmocka_unit_test(test_model_name_wins),
        cmocka_unit_test(test_cut),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("serve_name", tests, NULL, NULL);
}

/* test_kv_cache.c -- the block pool: every block handed out once, freed
 * blocks come back most recent first, layers do not overlap. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kv_cache.h"

static void test_alloc_release(void **state) {
    KVCache kv;
    Err     err;
    int32_t got[64];
    uint8_t seen[64] = { 0 };

    (void) state;
    assert_int_equal(kv_init(&kv, 3, 2, 8, 16, 64, &err), 0);
    for (int i = 0; i < 64; i++) {
        got[i] = kv_alloc_block(&kv);
        assert_true(got[i] >= 0 && got[i] < 64);
        assert_int_equal(seen[got[i]]++, 0);
    }
    assert_int_equal(kv_alloc_block(&kv), -1);
    kv_release_block(&kv, got[10]);
    kv_release_block(&kv, got[20]);
    assert_int_equal(kv_alloc_block(&kv), got[20]);
    assert_int_equal(kv_alloc_block(&kv), got[10]);
    assert_int_equal(kv_alloc_block(&kv), -1);
    kv_free(&kv);
}

/* Writing every element of every layer's K and V through the views touches
 * each byte of the one allocation exactly once (ASan checks the bounds). */
static void test_layer_views(void **state) {
    KVCache kv;
    Err     err;
    size_t  per = (size_t) 5 * 2 * 16 * 8;      /* blocks*heads*bs*hd */

    (void) state;
    assert_int_equal(kv_init(&kv, 4, 2, 8, 16, 5, &err), 0);
    memset(kv.mem, 0, per * 2 * 4 * sizeof(uint16_t));
    for (int l = 0; l < 4; l++) {
        for (size_t i = 0; i < per; i++) {
            kv.layers[l].k[i] += 1;
            kv.layers[l].v[i] += 1;
        }
    }
    for (size_t i = 0; i < per * 2 * 4; i++) assert_int_equal(kv.mem[i], 1);
    kv_free(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release),
        cmocka_unit_test(test_layer_views),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("kv_cache", tests, NULL, NULL);
}

/* test_gguf.c -- the GGUF reader against valid, corrupt and truncated files.
 *
 * A small valid file is built in memory with the writer; each corruption
 * case patches one field and checks that opening fails with a message
 * naming the problem. Every truncation length of the valid file must fail
 * cleanly too (the ASan build turns any out-of-bounds read into a crash). */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "dtype.h"
#include "gguf.h"

typedef struct {
    uint8_t *buf;
    size_t   len;
} Blob;

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Builds: 4 key/values (u32, f32, string, string array) and two tensors
 * (f32 [8], q8_0 [32, 2]). */
static Blob build_valid(void) {
    GGUFWriter  w;
    Blob        b;
    FILE       *f;
    float       v8[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    BlockQ8_0   q[2];
    int64_t     ne1[1] = { 8 }, ne2[2] = { 32, 2 };
    GGUF        src;
    Err         err;
    static const char vocab[] =
        "GGUF\3\0\0\0" "\0\0\0\0\0\0\0\0" "\1\0\0\0\0\0\0\0"
        "\25\0\0\0\0\0\0\0" "tokenizer.ggml.tokens" "\11\0\0\0" "\10\0\0\0"
        "\2\0\0\0\0\0\0\0" "\1\0\0\0\0\0\0\0" "a" "\2\0\0\0\0\0\0\0" "bc";

    memset(q, 0, sizeof(q));
    q[0].d = f32_to_f16(0.5f);
    q[0].qs[3] = 7;
    assert_int_equal(gguf_open_buffer(&src, vocab, sizeof(vocab) - 1, "vocab",
                                      &err), 0);
    gguf_writer_init(&w);
    gguf_writer_u32(&w, "test.count", 42);
    gguf_writer_f32(&w, "test.eps", 1e-5f);
    gguf_writer_str(&w, "general.architecture", "llama");
    gguf_writer_copy_kv(&w, &src.kv[0]);
    gguf_writer_tensor(&w, "vec", DT_F32, 1, ne1);
    gguf_writer_tensor(&w, "mat", DT_Q8_0, 2, ne2);
    f = open_memstream((char **) &b.buf, &b.len);
    assert_non_null(f);
    assert_int_equal(gguf_writer_write_header(&w, f, &err), 0);
    assert_int_equal(gguf_writer_write_data(&w, f, v8, &err), 0);
    assert_int_equal(gguf_writer_write_data(&w, f, q, &err), 0);
    assert_int_not_equal(gguf_writer_write_data(&w, f, q, &err), 0);
    fclose(f);
    gguf_writer_free(&w);
    gguf_close(&src);
    return b;
}

static void test_valid_roundtrip(void **state) {
    Blob              b = build_valid();
    GGUF              g;
    Err               err;
    uint32_t          u;
    float             e;
    GGUFStr           s;
    const GGUFKV     *arr;
    const GGUFTensor *t;

    (void) state;
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "ok.gguf", &err), 0);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.n_kv, 4);
    assert_int_equal(g.n_tensors, 2);
    assert_int_equal(gguf_get_u32(&g, "test.count", &u, &err), 0);
    assert_int_equal(u, 42);
    assert_int_equal(gguf_get_f32(&g, "test.eps", &e, &err), 0);
    assert_true(e == 1e-5f);
    assert_int_equal(gguf_get_str(&g, "general.architecture", &s, &err), 0);
    assert_true(gguf_str_eq(s, "llama"));
    assert_int_equal(gguf_get_u32(&g, "absent", &u, &err), 1);
    assert_int_equal(gguf_get_u32(&g, "general.architecture", &u, &err), -1);
    assert_non_null(strstr(err.msg, "expected an integer"));
    assert_int_equal(gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_STRING,
                                  &arr, &err), 0);
    assert_int_equal(arr->count, 2);
    assert_true(gguf_str_eq(gguf_arr_str(arr, 1), "bc"));
    t = gguf_find_tensor(&g, "mat");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 32);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->nbytes, 68);
    assert_int_equal(((uintptr_t) t->data - (uintptr_t) b.buf) % 32, 0);
    assert_int_equal(((const BlockQ8_0 *) t->data)[0].qs[3], 7);
    t = gguf_find_tensor(&g, "vec");
    assert_non_null(t);
    assert_true(((const float *) t->data)[7] == 8.0f);
    gguf_close(&g);
    free(b.buf);
}

/* Version 2 has the same layout as 3 (64-bit counts): it opens. */
static void test_version2(void **state) {
    Blob b = build_valid();
    GGUF g;
    Err  err;

    (void) state;
    put_u32(b.buf + 4, 2);
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "v2.gguf", &err), 0);
    assert_int_equal(g.version, 2);
    assert_int_equal(g.n_tensors, 2);
    gguf_close(&g);
    free(b.buf);
}

/* Every prefix of a valid file that cuts into its header or tensor data is
 * invalid and must fail without a crash (only the final padding may go). */
static void test_every_truncation_fails(void **state) {
    Blob   b = build_valid();
    GGUF   g;
    Err    err;
    size_t end = 0;

    (void) state;
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "ok.gguf", &err), 0);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        size_t e = g.data_offset + g.tensors[i].offset + g.tensors[i].nbytes;
        end = e > end ? e : end;
    }
    gguf_close(&g);
    assert_true(end > 0 && end < b.len);
    for (size_t n = end; n <= b.len; n++) {
        assert_int_equal(gguf_open_buffer(&g, b.buf, n, "ok.gguf", &err), 0);
        gguf_close(&g);
    }
    for (size_t n = 0; n < end; n++) {
        uint8_t *copy = malloc(n ? n : 1);

        memcpy(copy, b.buf, n);
        assert_int_equal(gguf_open_buffer(&g, copy, n, "cut.gguf", &err), -1);
        assert_non_null(strstr(err.msg, "cut.gguf"));
        free(copy);
    }
    free(b.buf);
}

/* Offset of the first occurrence of needle in the blob. */
static size_t find(const Blob *b, const void *needle, size_t n) {
    for (size_t i = 0; i + n <= b->len; i++) {
        if (memcmp(b->buf + i, needle, n) == 0) return i;
    }
    fail_msg("pattern not found");
    return 0;
}

typedef void (*Patch)(Blob *b);

static void expect_error(Patch patch, const char *needle) {
    Blob b = build_valid();
    GGUF g;
    Err  err;

    patch(&b);
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "bad.gguf", &err), -1);
    if (strstr(err.msg, needle) == NULL) {
        fail_msg("error '%s' does not mention '%s'", err.msg, needle);
    }
    assert_non_null(strstr(err.msg, "bad.gguf"));
    free(b.buf);
}

static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void p_magic(Blob *b)      { b->buf[0] = 'X'; }
static void p_version1(Blob *b)   { put_u32(b->buf + 4, 1); }
static void p_version9(Blob *b)   { put_u32(b->buf + 4, 9); }
static void p_many_kv(Blob *b)    { put_u64(b->buf + 16, UINT64_MAX / 2); }
static void p_many_t(Blob *b)     { put_u64(b->buf + 8, 1ull << 40); }
static void p_keylen(Blob *b)     { put_u64(b->buf + 24, 1ull << 62); }
static void p_valtype(Blob *b)    { put_u32(b->buf + 24 + 8 + 10, 77); }

static void p_strlen(Blob *b) {
    size_t at = find(b, "llama", 5);
    put_u64(b->buf + at - 8, UINT64_MAX - 3);
}

static void p_arrcount(Blob *b) {
    size_t at = find(b, "tokenizer.ggml.tokens", 21) + 21 + 8;
    put_u64(b->buf + at, 1ull << 61);
}

static void p_arrnested(Blob *b) {
    size_t at = find(b, "tokenizer.ggml.tokens", 21) + 21 + 4;
    put_u32(b->buf + at, GGUF_ARRAY);
}

static void p_ndims(Blob *b) {
    size_t at = find(b, "vec", 3) + 3;
    put_u32(b->buf + at, 5);
}

static void p_dimzero(Blob *b) {
    size_t at = find(b, "vec", 3) + 3 + 4;
    put_u64(b->buf + at, 0);
}

static void p_dimhuge(Blob *b) {
    size_t at = find(b, "mat", 3) + 3 + 4;
    put_u64(b->buf + at, 1ull << 40);
    put_u64(b->buf + at + 8, 1ull << 40);
}

static void p_ttype(Blob *b) {
    size_t at = find(b, "vec", 3) + 3 + 4 + 8;
    put_u32(b->buf + at, 5);        /* removed ggml type id */
}

static void p_blockrow(Blob *b) {
    size_t at = find(b, "mat", 3) + 3 + 4;
    put_u64(b->buf + at, 33);       /* q8_0 row of 33 elements */
}

static void p_offset_past(Blob *b) {
    size_t at = find(b, "mat", 3) + 3 + 4 + 16 + 4;
    put_u64(b->buf + at, 1ull << 20);
}

static void p_offset_misaligned(Blob *b) {
    size_t at = find(b, "mat", 3) + 3 + 4 + 16 + 4;
    put_u64(b->buf + at, 33);
}

static void p_offset_wrap(Blob *b) {
    size_t at = find(b, "mat", 3) + 3 + 4 + 16 + 4;
    put_u64(b->buf + at, UINT64_MAX - 31);
}

static void p_dup_tensor(Blob *b) {
    size_t at = find(b, "mat", 3);
    memcpy(b->buf + at, "vec", 3);
}

static void test_corruptions(void **state) {
    (void) state;
    expect_error(p_magic, "not a GGUF file");
    expect_error(p_version1, "version 1 is not supported");
    expect_error(p_version9, "version 9 is not supported");
    expect_error(p_many_kv, "header claims");
    expect_error(p_many_t, "header claims");
    expect_error(p_keylen, "key");
    expect_error(p_valtype, "invalid value type 77");
    expect_error(p_strlen, "truncated or corrupt");
    expect_error(p_arrcount, "truncated or corrupt");
    expect_error(p_arrnested, "array of unsupported type");
    expect_error(p_ndims, "has 5 dimensions");
    expect_error(p_dimzero, "invalid dimension 0");
    expect_error(p_dimhuge, "invalid dimension 1");
    expect_error(p_ttype, "unknown type id 5");
    expect_error(p_blockrow, "not a multiple of the q8_0 block size");
    expect_error(p_offset_past, "runs past the end of the file");
    expect_error(p_offset_misaligned, "is not a multiple of the alignment");
    expect_error(p_offset_wrap, "runs past the end of the file");
    expect_error(p_dup_tensor, "duplicate tensor 'vec'");
}

/* Writes a file with the writer from the given key/values only. */
static Blob build_kv_only(void (*add)(GGUFWriter *w)) {
    GGUFWriter w;
    Blob       b;
    FILE      *f;
    Err        err;

    gguf_writer_init(&w);
    add(&w);
    f = open_memstream((char **) &b.buf, &b.len);
    assert_int_equal(gguf_writer_write_header(&w, f, &err), 0);
    fclose(f);
    gguf_writer_free(&w);
    return b;
}

static void add_dup(GGUFWriter *w) {
    gguf_writer_u32(w, "a.key", 1);
    gguf_writer_str(w, "a.key", "again");
}

static void test_duplicate_key(void **state) {
    Blob b = build_kv_only(add_dup);
    GGUF g;
    Err  err;

    (void) state;
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "dup.gguf", &err), -1);
    assert_string_equal(err.msg, "dup.gguf: duplicate key 'a.key'");
    free(b.buf);
}

static void test_alignment_key(void **state) {
    GGUFWriter w;
    Blob       b;
    FILE      *f;
    GGUF       g;
    Err        err;
    int64_t    ne[1] = { 4 };
    float      v[4] = { 0 };

    (void) state;
    gguf_writer_init(&w);
    gguf_writer_u32(&w, "general.alignment", 48);
    gguf_writer_tensor(&w, "v", DT_F32, 1, ne);
    f = open_memstream((char **) &b.buf, &b.len);
    assert_int_equal(gguf_writer_write_header(&w, f, &err), 0);
    assert_int_equal(gguf_writer_write_data(&w, f, v, &err), 0);
    fclose(f);
    gguf_writer_free(&w);
    assert_int_equal(gguf_open_buffer(&g, b.buf, b.len, "al.gguf", &err), -1);
    assert_non_null(strstr(err.msg, "alignment 48 is not a power of two"));
    free(b.buf);
}

static void test_open_errors(void **state) {
    GGUF  g;
    Err   err;
    char  path[] = "/tmp/omni-test-gguf-XXXXXX";
    int   fd;

    (void) state;
    assert_int_equal(gguf_open(&g, "/nonexistent/model.gguf", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/model.gguf: No such file"));
    assert_int_equal(gguf_open(&g, "/tmp", &err), -1);
    assert_non_null(strstr(err.msg, "not a regular file"));
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "GGUF", 4), 4);
    close(fd);
    assert_int_equal(gguf_open(&g, path, &err), -1);
    assert_non_null(strstr(err.msg, "too short"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_roundtrip),
        cmocka_unit_test(test_version2),
        cmocka_unit_test(test_every_truncation_fails),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_alignment_key),
        cmocka_unit_test(test_open_errors),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("gguf", tests, NULL, NULL);
}

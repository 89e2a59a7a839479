/* fuzz_gguf.c -- libFuzzer target: arbitrary bytes as a GGUF file.
 *
 * Opens the input with the reader, then touches everything a model load
 * would: every key through the typed getters, every array element, every
 * tensor's first and last byte, every weight type's first row dequantized
 * (what an embedding lookup reads), and the tokenizer built from the
 * metadata. Any out-of-bounds read is an ASan crash; any accepted file must
 * be safe to walk completely. */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "log.h"
#include "tokenizer.h"

static volatile uint8_t sink;

static void walk_kv(const GGUF *g, const GGUFKV *kv) {
    char     key[256];
    uint32_t u;
    float    f;
    bool     b;
    GGUFStr  s;
    size_t   n = kv->key.len < sizeof(key) - 1 ? kv->key.len : sizeof(key) - 1;

    memcpy(key, kv->key.ptr, n);
    key[n] = '\0';
    gguf_get_u32(g, key, &u, NULL);
    gguf_get_f32(g, key, &f, NULL);
    gguf_get_bool(g, key, &b, NULL);
    if (gguf_get_str(g, key, &s, NULL) == 0 && s.len > 0) {
        sink ^= (uint8_t) s.ptr[s.len - 1];
    }
    if (kv->type != GGUF_ARRAY) return;
    for (uint64_t i = 0; i < kv->count; i++) {
        if (kv->elem_type == GGUF_STRING) {
            s = gguf_arr_str(kv, i);
            if (s.len > 0) sink ^= (uint8_t) s.ptr[0];
        } else if (kv->elem_type == GGUF_FLOAT32
                   || kv->elem_type == GGUF_INT32
                   || kv->elem_type == GGUF_UINT32)
        {
            sink ^= (uint8_t) gguf_arr_i32(kv, i);
        }
    }
}

/* The first row of a tensor of a type the engine runs, as an embedding
 * lookup converts it; a row the tensor's bytes do not hold, or a length not
 * made of whole blocks, is what model loading refuses, so it is skipped
 * here too. */
static void walk_row(const GGUFTensor *t) {
    static float row[8192];
    int64_t      n = t->ne[0];

    if (!dtype_supported(t->type) || n <= 0 || n > 8192
        || n % dtype_block((DType) t->type) != 0
        || dtype_row_bytes((DType) t->type, n) > t->nbytes)
    {
        return;
    }
    dequantize_row((DType) t->type, t->data, row, n);
    sink ^= (uint8_t) (row[n - 1] != row[n - 1]);
}

/* Warnings about odd but harmless metadata would flood the fuzzer's
 * output at thousands of inputs a second. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void) argc;
    (void) argv;
    log_set_level(LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    GGUF       g;
    Err        err;
    Tokenizer *tk;

    if (gguf_open_buffer(&g, data, size, "fuzz.gguf", &err) != 0) return 0;
    for (uint64_t i = 0; i < g.n_kv; i++) walk_kv(&g, &g.kv[i]);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const uint8_t *p = g.tensors[i].data;
        sink ^= p[0] ^ p[g.tensors[i].nbytes - 1];
        walk_row(&g.tensors[i]);
    }
    tk = tokenizer_new(&g, &err);
    if (tk != NULL) {
        int32_t ids[64];
        char    buf[256];
        int64_t n = tokenizer_encode(tk, "Hello world 123 ", 16, true, true,
                                     ids, 64, &err);
        for (int64_t i = 0; i < n && i < 64; i++) {
            tokenizer_piece(tk, ids[i], true, buf, sizeof(buf));
        }
        tokenizer_free(tk);
    }
    gguf_close(&g);
    return 0;
}

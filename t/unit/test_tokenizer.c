/* test_tokenizer.c -- the tokenizer (engine/tokenizer*.c, detok.c) against llama.cpp.
 *
 * Two kinds of reference, both llama.cpp's:
 *
 *   - Literal id arrays below, printed by llama.cpp's llama-tokenize for the
 *     default model (../shared/models/stories260K.gguf, or $OMNI_MODEL when
 *     that is a stories260K.gguf) and for llama.cpp's vocabulary files.
 *   - llama.cpp's tokenizer vectors, models/ggml-vocab-*.gguf with .inp and
 *     .out, read from its checkout at run time (env OMNI_LLAMA_SRC, else the
 *     last line printed by t/fetch-llama-src). Every case of every listed
 *     vocabulary must match, encoded as tests/test-tokenizer-0.cpp does it:
 *     add_special and parse_special both false.
 *
 * Beyond llama.cpp: the text bound (tokenizer_text_bound) is a true lower
 * bound on every vocabulary, and tokenizer_encode_upto agrees with
 * tokenizer_encode wherever it stops.
 *
 * A missing checkout or model fails the group; it is never skipped. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "testutil.h"

#include "gguf.h"
#include "stage_channel.h"
#include "tokenizer.h"

#define MAX_IDS 65536

/* Every vocabulary llama.cpp has vectors for, except bert-bge (WPM model,
 * not supported: see test_unsupported). */
static const char *vector_vocabs[] = {
    "llama-spm", "llama-bpe", "qwen2", "qwen35", "gpt-2", "phi-3", "gemma-4",
    "deepseek-llm", "deepseek-coder", "falcon", "mpt", "starcoder", "refact",
    "command-r",
};

#define N_VOCABS ((int) (sizeof(vector_vocabs) / sizeof(vector_vocabs[0])))

typedef struct {
    GGUF       g;
    Tokenizer *tk;
} Vocab;

typedef struct {
    char    src[4096];          // llama.cpp checkout
    char    stories[4096];      // the default model
    Vocab   stories_v;
    Vocab   v[N_VOCABS];        // same order as vector_vocabs
} Ref;


/* ---- Setup --------------------------------------------------------------- */


static void find_stories(char *dst, size_t cap) {
    const char *env = getenv("OMNI_MODEL");
    const char *base = env != NULL ? strrchr(env, '/') : NULL;

    base = base != NULL ? base + 1 : env;
    if (base != NULL && strcmp(base, "stories260K.gguf") == 0) {
        snprintf(dst, cap, "%s", env);
    } else {
        snprintf(dst, cap, "../shared/models/stories260K.gguf");
    }
}

static int ref_setup(void **state) {
    Ref *r = calloc(1, sizeof(*r));
    char path[8192];

    *state = r;
    if (find_llama_src(r->src, sizeof(r->src)) != 0) {
        print_error("llama.cpp source not found: set OMNI_LLAMA_SRC or run "
                    "t/fetch-llama-src from the repository root\n");
        return -1;
    }
    find_stories(r->stories, sizeof(r->stories));
    if (open_tokenizer(r->stories, &r->stories_v.g, &r->stories_v.tk) != 0) {
        return -1;
    }
    for (int i = 0; i < N_VOCABS; i++) {
        snprintf(path, sizeof(path), "%s/models/ggml-vocab-%s.gguf", r->src,
                 vector_vocabs[i]);
        if (open_tokenizer(path, &r->v[i].g, &r->v[i].tk) != 0) return -1;
    }
    return 0;
}

static int ref_teardown(void **state) {
    Ref *r = *state;

    if (r == NULL) return 0;
    tokenizer_free(r->stories_v.tk);
    gguf_close(&r->stories_v.g);
    for (int i = 0; i < N_VOCABS; i++) {
        tokenizer_free(r->v[i].tk);
        gguf_close(&r->v[i].g);
    }
    free(r);
    return 0;
}

static const Tokenizer *vocab(void **state, const char *name) {
    Ref *r = *state;

    for (int i = 0; i < N_VOCABS; i++) {
        if (strcmp(vector_vocabs[i], name) == 0) return r->v[i].tk;
    }
    fail_msg("no vocabulary %s", name);
    return NULL;
}

static const Tokenizer *stories(void **state) {
    return ((Ref *) *state)->stories_v.tk;
}


/* ---- Helpers ------------------------------------------------------------- */


#define expect_ids(tk, text, add, parse, ...) \
    expect_ids_(tk, text, add, parse, (const int32_t[]) { __VA_ARGS__ }, \
                sizeof((const int32_t[]) { __VA_ARGS__ }) / sizeof(int32_t))

static void expect_ids_(const Tokenizer *tk, const char *text, bool add,
                        bool parse, const int32_t *want, size_t n_want)
{
    int32_t ids[256];
    Err     err;
    int64_t n = tokenizer_encode(tk, text, strlen(text), add, parse, ids, 256,
                                 &err);

    if (n != (int64_t) n_want || memcmp(ids, want, n_want * 4) != 0) {
        print_error("'%s' add=%d parse=%d:\n  got ", text, add, parse);
        for (int64_t i = 0; i < n && i < 256; i++) print_error(" %d", ids[i]);
        print_error("\n  want");
        for (size_t i = 0; i < n_want; i++) print_error(" %d", want[i]);
        print_error("\n");
        fail();
    }
}

static void expect_piece(const Tokenizer *tk, int32_t id, bool special,
                         const char *want)
{
    char   buf[256];
    size_t n = tokenizer_piece(tk, id, special, buf, sizeof(buf));

    assert_int_equal(n, strlen(want));
    assert_memory_equal(buf, want, n);
}

/* Pushes ids one at a time; each push must emit valid UTF-8 on its own. */
static size_t detok_all(const Tokenizer *tk, const int32_t *ids, size_t n,
                        char *out, size_t cap)
{
    Detok  d;
    size_t len = 0;

    detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        char   piece[512];
        size_t k = detok_push(&d, tk, ids[i], piece, sizeof(piece));

        assert_true(len + k <= cap);
        memcpy(out + len, piece, k);
        len += k;
    }
    len += detok_flush(&d, out + len, cap - len);
    return len;
}

static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *) s;

    for (size_t i = 0; i < n; ) {
        unsigned c = p[i];
        int      k = c < 0x80 ? 1 : c >= 0xc2 && c < 0xe0 ? 2
                     : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4
                     : 0;

        if (k == 0 || i + (size_t) k > n) return false;
        for (int j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return false;
        }
        i += (size_t) k;
    }
    return true;
}


/* ---- llama.cpp's vectors ------------------------------------------------- */

/* Runs one vocabulary's .inp/.out pairs (the format test-tokenizer-0.cpp
 * reads: inputs separated by "\n__ggml_vocab_test__\n", one line of ids per
 * input). Returns the number of failing cases; *n_cases gets the total. */
static int run_vectors(const Tokenizer *tk, const char *base, int *n_cases) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char     path[8300];
    size_t   ni, no, pos = 0;
    char    *inp, *out, *line;
    int32_t *ids = malloc(MAX_IDS * sizeof(int32_t));
    int      bad = 0;

    snprintf(path, sizeof(path), "%s.inp", base);
    inp = read_file(path, &ni);
    snprintf(path, sizeof(path), "%s.out", base);
    out = read_file(path, &no);
    if (inp == NULL || out == NULL || ids == NULL) {
        print_error("cannot read %s\n", path);
        free(inp), free(out), free(ids);
        *n_cases = 0;
        return 1;
    }
    line = out;
    for (*n_cases = 0; pos < ni; ) {
        char   *next = strstr(inp + pos, sep), *eol = strchr(line, '\n');
        size_t  len = next != NULL ? (size_t) (next - inp) - pos : ni - pos;
        int64_t n = tokenizer_encode(tk, inp + pos, len, false, false, ids,
                                     MAX_IDS, NULL);
        int64_t k = 0;
        char   *p = line;

        if (eol != NULL) *eol = '\0';
        for (;;) {
            char *end;
            long  v = strtol(p, &end, 10);

            if (end == p) break;
            if (k >= n || ids[k] != v) k = -1;
            if (k < 0) break;
            k++;
            p = end;
        }
        if (k != n) {
            if (bad++ < 3) {
                print_error("%s: case %d '%.*s' differs\n", base, *n_cases,
                            (int) (len > 60 ? 60 : len), inp + pos);
            }
        }
        line = eol != NULL ? eol + 1 : line + strlen(line);
        (*n_cases)++;
        if (next == NULL) break;
        pos = (size_t) (next - inp) + sizeof(sep) - 1;
    }
    if (*line != '\0') {
        print_error("%s: more outputs than inputs\n", base);
        bad++;
    }
    free(inp), free(out), free(ids);
    return bad;
}

static void test_llama_cpp_vectors(void **state) {
    Ref *r = *state;
    int  total_bad = 0;

    for (int i = 0; i < N_VOCABS; i++) {
        char path[8192];
        int  n, bad;

        snprintf(path, sizeof(path), "%s/models/ggml-vocab-%s.gguf", r->src,
                 vector_vocabs[i]);
        bad = run_vectors(r->v[i].tk, path, &n);
        print_message("# ggml-vocab-%s: %d/%d cases match\n",
                      vector_vocabs[i], n - bad, n);
        assert_true(n >= 40);
        total_bad += bad;
    }
    assert_int_equal(total_bad, 0);
}


/* ---- Literal cases from llama-tokenize ---------------------------------- */

static void test_stories(void **state) {
    const Tokenizer *tk = stories(state);

    assert_int_equal(tokenizer_n_vocab(tk), 512);
    assert_int_equal(tokenizer_bos(tk), 1);
    assert_int_equal(tokenizer_eos(tk), 2);
    assert_true(tokenizer_adds_bos(tk));
    expect_ids(tk, "Once upon a time", true, true, 1, 403, 407, 261, 378);
    expect_ids(tk, "Once upon a time", false, true, 403, 407, 261, 378);
    expect_ids(tk, "  two  spaces", true, true,
               1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419);
    /* no token for the llama: byte fallback <0xF0><0x9F><0xA6><0x99> */
    expect_ids(tk, "Lily saw a \xf0\x9f\xa6\x99!", true, true,
               1, 317, 394, 261, 410, 243, 162, 169, 156, 443);
    /* "<s>", "</s>" are control tokens: whole strings only when parsing
       special tokens, and the text after one gets a space prefix */
    expect_ids(tk, "<s>Hi</s> there", true, true, 1, 1, 320, 417, 2, 410, 383);
    expect_ids(tk, "<s>Hi</s> there", true, false,
               1, 410, 504, 419, 505, 440, 417, 504, 492, 419, 505, 383);
    expect_ids(tk, "", true, true, 1);
    assert_int_equal(tokenizer_encode(tk, "", 0, false, true, NULL, 0, NULL),
                     0);
}

static void test_bpe_literals(void **state) {
    const Tokenizer *l3 = vocab(state, "llama-bpe");
    const Tokenizer *qw = vocab(state, "qwen2");
    const Tokenizer *g2 = vocab(state, "gpt-2");
    const Tokenizer *sp = vocab(state, "llama-spm");

    expect_ids(sp, "Hello world", true, true, 1, 15043, 3186);
    expect_ids(sp, "\xf0\x9f\xa6\x99 llama", true, true,
               1, 29871, 243, 162, 169, 156, 11148, 3304);
    expect_ids(l3, "Hello world! \xe4\xbd\xa0\xe5\xa5\xbd", true, true,
               128000, 9906, 1917, 0, 118195, 53901);
    expect_ids(g2, "Hello world, it's 2024!", true, true,
               15496, 995, 11, 340, 338, 48609, 0);
    expect_ids(qw, "Hello", true, true, 9707);  // qwen2 adds no BOS
    assert_true(tokenizer_adds_bos(l3));
    assert_false(tokenizer_adds_bos(qw));
    assert_false(tokenizer_adds_bos(g2));
}

static void test_special_parsing(void **state) {
    const Tokenizer *l3 = vocab(state, "llama-bpe");
    const Tokenizer *qw = vocab(state, "qwen2");
    const Tokenizer *g2 = vocab(state, "gpt-2");
    const char      *l3_chat = "<|start_header_id|>user<|end_header_id|>\n\n"
                               "Hi<|eot_id|>";
    const char      *qw_chat = "<|im_start|>user\nHello "
                               "\xe4\xb8\x96\xe7\x95\x8c<|im_end|>";

    expect_ids(l3, l3_chat, true, true,
               128000, 128006, 882, 128007, 271, 13347, 128009);
    expect_ids(l3, l3_chat, true, false,
               128000, 27, 91, 2527, 8932, 851, 91, 29, 882, 27, 91, 408, 8932,
               851, 91, 1363, 13347, 27, 91, 68, 354, 851, 91, 29);
    expect_ids(qw, qw_chat, true, true,
               151644, 872, 198, 9707, 220, 99489, 151645);
    expect_ids(qw, qw_chat, true, false,
               27, 91, 318, 4906, 91, 29, 872, 198, 9707, 220, 99489, 27, 91,
               318, 6213, 91, 29);
    expect_ids(g2, "<|endoftext|>", true, true, 50256);
    expect_ids(g2, "<|endoftext|>", true, false,
               27, 91, 437, 1659, 5239, 91, 29);
    assert_int_equal(tokenizer_find(qw, "<|im_start|>"), 151644);
    assert_int_equal(tokenizer_find(qw, "<|no such token|>"), -1);
}

/* The count is the full length even when cap is smaller; only cap ids are
 * written. */
static void test_short_output(void **state) {
    const Tokenizer *tk = stories(state);
    int32_t          ids[3] = { -7, -7, -7 };

    assert_int_equal(tokenizer_encode(tk, "Once upon a time", 16, true, true,
                                      ids, 2, NULL), 5);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 403);
    assert_int_equal(ids[2], -7);
    assert_int_equal(tokenizer_encode(tk, "Once upon a time", 16, true, true,
                                      NULL, 0, NULL), 5);
}


/* ---- Pieces, detokenizing, end of generation ---------------------------- */

static void test_pieces(void **state) {
    const Tokenizer *sp = vocab(state, "llama-spm");
    const Tokenizer *g2 = vocab(state, "gpt-2");
    const Tokenizer *qw = vocab(state, "qwen2");
    char             small[2];

    expect_piece(sp, 15043, false, " Hello");      // "▁Hello"
    expect_piece(sp, 13, false, "\n");             // "<0x0A>"
    expect_piece(sp, 2, false, "");                // "</s>", control
    expect_piece(sp, 2, true, "</s>");
    expect_piece(g2, 995, false, " world");        // "Ġworld"
    expect_piece(g2, 198, false, "\n");            // "Ċ"
    expect_piece(g2, 50256, false, "");
    expect_piece(g2, 50256, true, "<|endoftext|>");
    expect_piece(qw, 151644, true, "<|im_start|>");
    expect_piece(stories(state), 243, false, "\xf0");
    assert_int_equal(tokenizer_piece(sp, 15043, false, small, 2), 6);
    assert_int_equal(tokenizer_piece(sp, -1, true, small, 2), 0);
    assert_int_equal(tokenizer_piece(sp, 32000, true, small, 2), 0);
}

/* Multi-byte characters split across tokens come out whole, once. */
static void test_detok_streaming(void **state) {
    static const char *texts[] = {
        " this is \xf0\x9f\xa6\x99.cpp",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c "
        "\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f "
        "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b",
        "caf\xc3\xa9 \xd0\xbc\xd0\xb8\xd1\x80 \xf0\x9f\x9a\x80\xf0\x9f\x9a\x80",
    };
    const char *names[] = { "llama-bpe", "qwen2", "gpt-2", "llama-spm" };

    for (int v = 0; v < 4; v++) {
        const Tokenizer *tk = vocab(state, names[v]);

        for (int t = 0; t < 3; t++) {
            int32_t ids[256];
            char    out[1024];
            size_t  len = strlen(texts[t]), n_out;
            int64_t n = tokenizer_encode(tk, texts[t], len, false, false, ids,
                                         256, NULL);
            Detok   d;

            assert_true(n > 0);
            detok_init(&d);
            n_out = 0;
            for (int64_t i = 0; i < n; i++) {
                size_t k = detok_push(&d, tk, ids[i], out + n_out,
                                      sizeof(out) - n_out);

                assert_true(valid_utf8(out + n_out, k));
                n_out += k;
            }
            assert_int_equal(detok_flush(&d, out + n_out, 8), 0);
            /* SPM prefixes a space when encoding and keeps it here */
            if (strcmp(names[v], "llama-spm") == 0) {
                assert_int_equal(out[0], ' ');
                assert_int_equal(n_out, len + 1);
                assert_memory_equal(out + 1, texts[t], len);
            } else {
                assert_int_equal(n_out, len);
                assert_memory_equal(out, texts[t], len);
            }
        }
    }
}

/* The llama's four byte tokens: nothing until the last one arrives. */
static void test_detok_bytes(void **state) {
    const Tokenizer *tk = stories(state);
    const int32_t    llama[] = { 243, 162, 169, 156 };
    Detok            d;
    char             out[64];

    detok_init(&d);
    assert_int_equal(detok_push(&d, tk, llama[0], out, sizeof(out)), 0);
    assert_int_equal(detok_push(&d, tk, llama[1], out, sizeof(out)), 0);
    assert_int_equal(detok_push(&d, tk, llama[2], out, sizeof(out)), 0);
    assert_int_equal(detok_push(&d, tk, llama[3], out, sizeof(out)), 4);
    assert_memory_equal(out, "\xf0\x9f\xa6\x99", 4);
    assert_int_equal(detok_push(&d, tk, 2, out, sizeof(out)), 0);  // </s>
    assert_int_equal(detok_flush(&d, out, sizeof(out)), 0);
}

/* Invalid sequences become U+FFFD (byte token <0xXX> is id 3 + XX). */
static void test_detok_invalid(void **state) {
    const Tokenizer *tk = stories(state);
    const int32_t    e4_a[] = { 3 + 0xe4, 3 + 'a' };
    const int32_t    ff[] = { 3 + 0xff };
    const int32_t    lone[] = { 3 + 0x80, 3 + 'b' };
    const int32_t    cut[] = { 3 + 0xf0, 3 + 0x9f };
    const int32_t    overlong[] = { 3 + 0xc0, 3 + 0xaf };
    const int32_t    surrogate[] = { 3 + 0xed, 3 + 0xa0, 3 + 0x80 };
    char             out[64];
    size_t           n;

    n = detok_all(tk, e4_a, 2, out, sizeof(out));
    assert_int_equal(n, 4);
    assert_memory_equal(out, "\xef\xbf\xbd" "a", 4);
    n = detok_all(tk, ff, 1, out, sizeof(out));
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    n = detok_all(tk, lone, 2, out, sizeof(out));
    assert_int_equal(n, 4);
    assert_memory_equal(out, "\xef\xbf\xbd" "b", 4);
    n = detok_all(tk, cut, 2, out, sizeof(out));   // flushed at the end
    assert_int_equal(n, 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    n = detok_all(tk, overlong, 2, out, sizeof(out));
    assert_int_equal(n, 6);
    assert_true(valid_utf8(out, n));
    n = detok_all(tk, surrogate, 3, out, sizeof(out));
    assert_int_equal(n, 9);
    assert_true(valid_utf8(out, n));
}

static void test_eog(void **state) {
    const Tokenizer *l3 = vocab(state, "llama-bpe");
    const Tokenizer *qw = vocab(state, "qwen2");
    const Tokenizer *ph = vocab(state, "phi-3");
    const Tokenizer *gm = vocab(state, "gemma-4");

    assert_true(tokenizer_is_eog(stories(state), 2));
    assert_false(tokenizer_is_eog(stories(state), 1));
    assert_true(tokenizer_is_eog(l3, 128001));      // <|end_of_text|>
    assert_true(tokenizer_is_eog(l3, 128009));      // <|eot_id|>
    assert_false(tokenizer_is_eog(l3, 128000));     // <|begin_of_text|>
    assert_false(tokenizer_is_eog(l3, 128006));     // <|start_header_id|>
    assert_true(tokenizer_is_eog(qw, 151643));      // <|endoftext|>
    assert_true(tokenizer_is_eog(qw, 151645));      // <|im_end|>
    assert_false(tokenizer_is_eog(qw, 151644));     // <|im_start|>
    assert_true(tokenizer_is_eog(ph, 32007));       // <|end|>
    assert_true(tokenizer_is_eog(gm, 106));         // <turn|>
    assert_true(tokenizer_is_eog(gm, 1));           // <eos>
    assert_false(tokenizer_is_eog(l3, -1));
    assert_false(tokenizer_is_eog(l3, 1 << 30));
}

/* Long inputs: linear-ish time (this runs under ASan too) and a lossless
 * round trip through the streaming detokenizer. */
static void test_long_round_trip(void **state) {
    Ref        *r = *state;
    char        path[8192];
    size_t      n_inp;
    char       *inp, *text, *back;
    int32_t    *ids;
    size_t      len;
    const char *names[] = { "llama-bpe", "qwen2" };

    snprintf(path, sizeof(path), "%s/models/ggml-vocab-qwen2.gguf.inp",
             r->src);
    inp = read_file(path, &n_inp);
    assert_non_null(inp);
    len = 8 * n_inp + 40000;
    text = malloc(len);
    for (int i = 0; i < 8; i++) memcpy(text + i * n_inp, inp, n_inp);
    memset(text + 8 * n_inp, ' ', 20000);                 // long runs
    memset(text + 8 * n_inp + 20000, '7', 20000);
    ids = malloc(len * sizeof(int32_t));
    back = malloc(len + 64);
    for (int v = 0; v < 2; v++) {
        const Tokenizer *tk = vocab(state, names[v]);
        int64_t          n = tokenizer_encode(tk, text, len, false, false, ids,
                                              (int64_t) len, NULL);

        assert_true(n > 0 && n < (int64_t) len);
        assert_int_equal(detok_all(tk, ids, (size_t) n, back, len + 64), len);
        assert_memory_equal(back, text, len);
    }
    free(inp), free(text), free(ids), free(back);
}


/* ---- The text bound and early stop ---------------------------------------
 * tokenizer_text_bound must be a true lower bound: a prompt refused by it
 * must be one the tokenizer would have refused. Checked on every vector
 * input of every vocabulary, plus texts built to be cheap in tokens (long
 * runs, the longest tokens' text, special tokens with whitespace that
 * strip attributes eat), with and without special handling. */

/* Calls fn on every input of a vocabulary's .inp file and on the extra
 * texts below; fn returns false to report a failure. */
typedef bool (*TextFn)(const Tokenizer *tk, const void *ctx, const char *name,
                       const char *text, size_t len);

static int each_text(const Tokenizer *tk, const void *ctx, const char *name,
                     const char *src, TextFn fn)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    static const char *extra[] = {
        "", " ", "a", "<|user|>", "<|user|>\nhi<|end|>\n<|assistant|>\n",
        "<s>   </s>\t\t\n<|endoftext|>", "\xff\xfe\x80 bad bytes \xc3",
    };
    char   path[8300], *inp, *big;
    size_t ni, pos = 0, blen = 12000;
    int    bad = 0;

    snprintf(path, sizeof(path), "%s/models/ggml-vocab-%s.gguf.inp", src,
             name);
    inp = read_file(path, &ni);
    while (inp != NULL && pos < ni) {
        char  *next = strstr(inp + pos, sep);
        size_t len = next != NULL ? (size_t) (next - inp) - pos : ni - pos;

        bad += !fn(tk, ctx, name, inp + pos, len);
        if (next == NULL) break;
        pos = (size_t) (next - inp) + sizeof(sep) - 1;
    }
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
        bad += !fn(tk, ctx, name, extra[i], strlen(extra[i]));
    }
    big = malloc(blen);
    assert_non_null(big);
    memset(big, ' ', blen);                             // one long run
    bad += !fn(tk, ctx, name, big, blen);
    memcpy(big, "<|user|>", 8);                         // eaten by RSTRIP
    bad += !fn(tk, ctx, name, big, blen);
    for (size_t i = 0; i < blen; i++) big[i] = "-=_ \n"[(i / 997) % 5];
    bad += !fn(tk, ctx, name, big, blen);
    for (int32_t id = 0, k = 0; id < tokenizer_n_vocab(tk) && k < 6; id++) {
        size_t n = tokenizer_piece(tk, id, true, big, 4096);   // the texts
                                                               //   of long
        if (n >= 24 && n <= 4096) {                            //   tokens
            size_t at = n;

            while (at + n <= blen / 3) memcpy(big + at, big, n), at += n;
            bad += !fn(tk, ctx, name, big, at);
            k++;
        }
    }
    free(big);
    free(inp);
    return bad;
}

/* ctx: the vocabulary's PromptBound */
static bool bound_holds(const Tokenizer *tk, const void *ctx,
                        const char *name, const char *text, size_t len)
{
    const PromptBound *bp = ctx;
    PromptBound        b = *bp;
    int32_t            one;

    for (int mode = 0; mode < 2; mode++) {
        int64_t n = tokenizer_encode(tk, text, len, mode, mode, &one, 1,
                                     NULL);
        int64_t least = prompt_bound_tokens(&b,
                                            prompt_bound_bytes(&b, text, len));

        if (n < least) {
            print_error("%s: '%.40s' (%zu bytes, special %d): %" PRId64
                        " tokens, bound %" PRId64 "\n", name, text, len, mode,
                        n, least);
            return false;
        }
    }
    return true;
}

static void test_text_bound(void **state) {
    Ref        *r = *state;
    PromptBound b;
    int         bad = 0;

    /* vocabularies that can drop bytes have no bound */
    static const char *none[] = { "falcon", "mpt", "starcoder", "refact" };

    for (int i = 0; i < N_VOCABS; i++) {
        bool lossy = false;

        for (size_t k = 0; k < sizeof(none) / sizeof(none[0]); k++) {
            lossy |= strcmp(vector_vocabs[i], none[k]) == 0;
        }
        tokenizer_text_bound(r->v[i].tk, &b.max_piece, &b.ws_free);
        print_message("# %s: max_piece %u%s\n", vector_vocabs[i],
                      b.max_piece, b.ws_free ? ", whitespace free" : "");
        assert_true(lossy ? b.max_piece == 0 : b.max_piece > 0);
        assert_int_equal(b.ws_free, strcmp(vector_vocabs[i], "phi-3") == 0);
        bad += each_text(r->v[i].tk, &b, vector_vocabs[i], r->src,
                         bound_holds);
    }
    tokenizer_text_bound(stories(state), &b.max_piece, &b.ws_free);
    assert_int_equal(b.max_piece, 9);
    assert_false(b.ws_free);
    bad += each_text(stories(state), &b, "llama-spm", r->src, bound_holds);
    assert_int_equal(bad, 0);
}

/* Phi-3's strip attributes are why ws_free exists: counting whitespace
 * there would refuse a prompt that fits. */
static void test_text_bound_strip(void **state) {
    const Tokenizer *tk = vocab(state, "phi-3");
    PromptBound      b;
    size_t           len = 100000;
    char            *text = malloc(len);
    int32_t          one;
    int64_t          n;

    assert_non_null(text);
    memcpy(text, "<|user|>", 8);
    memset(text + 8, ' ', len - 10);
    memcpy(text + len - 2, "hi", 2);
    tokenizer_text_bound(tk, &b.max_piece, &b.ws_free);
    n = tokenizer_encode(tk, text, len, true, true, &one, 1, NULL);
    assert_true(n < 8);
    b.ws_free = false;
    assert_true(prompt_bound_tokens(&b, prompt_bound_bytes(&b, text, len))
                > n);
    free(text);
}

static bool upto_agrees(const Tokenizer *tk, const void *ctx,
                        const char *name, const char *text, size_t len)
{
    int32_t *all = malloc((len + 4) * sizeof(int32_t));
    int32_t *some = malloc((len + 4) * sizeof(int32_t));
    int64_t  n = tokenizer_encode(tk, text, len, true, true, all,
                                  (int64_t) len + 4, NULL);
    int64_t  caps[] = { 0, 1, n / 2, n - 1, n };
    bool     ok = n >= 0;

    for (size_t i = 0; ok && i < sizeof(caps) / sizeof(caps[0]); i++) {
        int64_t cap = caps[i] < 0 ? 0 : caps[i];
        int64_t k = tokenizer_encode_upto(tk, text, len, true, true, some,
                                          cap, NULL);

        ok = k == (n <= cap ? n : cap + 1)
             && memcmp(some, all, (size_t) (k <= cap ? k : cap) * 4) == 0;
        if (!ok) {
            print_error("%s: '%.40s' cap %" PRId64 ": %" PRId64 " of %"
                        PRId64 "\n", name, text, cap, k, n);
        }
    }
    free(all);
    free(some);
    return ok;
}

static void test_encode_upto(void **state) {
    Ref *r = *state;
    int  bad = 0;

    for (int i = 0; i < N_VOCABS; i++) {
        bad += each_text(r->v[i].tk, NULL, vector_vocabs[i], r->src,
                         upto_agrees);
    }
    bad += each_text(stories(state), NULL, "llama-spm", r->src, upto_agrees);
    assert_int_equal(bad, 0);
}


/* ---- Errors ------------------------------------------------------------ */

/* A GGUF holding only tokenizer.ggml.model and, when pre is set,
 * tokenizer.ggml.pre. */
static Tokenizer *new_from_meta(const char *model, const char *pre, Err *err,
                                char **mem)
{
    GGUFWriter w;
    GGUF       g;
    size_t     len;
    FILE      *f = open_memstream(mem, &len);
    Tokenizer *tk;

    gguf_writer_init(&w);
    gguf_writer_str(&w, "tokenizer.ggml.model", model);
    if (pre != NULL) gguf_writer_str(&w, "tokenizer.ggml.pre", pre);
    assert_int_equal(gguf_writer_write_header(&w, f, err), 0);
    gguf_writer_free(&w);
    fclose(f);
    assert_int_equal(gguf_open_buffer(&g, *mem, len, "meta.gguf", err), 0);
    tk = tokenizer_new(&g, err);
    gguf_close(&g);
    return tk;
}

static void expect_new_error(const char *model, const char *pre,
                             const char *want)
{
    Err   err;
    char *mem = NULL;

    assert_null(new_from_meta(model, pre, &err, &mem));
    if (strstr(err.msg, want) == NULL) {
        fail_msg("error '%s' does not say '%s'", err.msg, want);
    }
    free(mem);
}

static void test_unsupported(void **state) {
    Ref  *r = *state;
    char  path[8192];
    GGUF  g;
    Err   err;

    snprintf(path, sizeof(path), "%s/models/ggml-vocab-bert-bge.gguf",
             r->src);
    assert_int_equal(gguf_open(&g, path, &err), 0);
    assert_null(tokenizer_new(&g, &err));
    assert_non_null(strstr(err.msg, "tokenizer model 'bert' is not "
                                    "supported"));
    gguf_close(&g);
    expect_new_error("t5", NULL, "tokenizer model 't5' is not supported");
    expect_new_error("gpt2", "nonsense", "unknown pre-tokenizer 'nonsense'");
    expect_new_error("gpt2", "kimi-k2",
                     "pre-tokenizer 'kimi-k2' is not supported");
    expect_new_error("llama", NULL, "no tokenizer.ggml.tokens");
    expect_new_error("gpt2", "qwen2", "no tokenizer.ggml.tokens");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_cpp_vectors),
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_bpe_literals),
        cmocka_unit_test(test_special_parsing),
        cmocka_unit_test(test_short_output),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_detok_streaming),
        cmocka_unit_test(test_detok_bytes),
        cmocka_unit_test(test_detok_invalid),
        cmocka_unit_test(test_eog),
        cmocka_unit_test(test_long_round_trip),
        cmocka_unit_test(test_text_bound),
        cmocka_unit_test(test_text_bound_strip),
        cmocka_unit_test(test_encode_upto),
        cmocka_unit_test(test_unsupported),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("tokenizer", tests, ref_setup,
                                       ref_teardown);
}

/* test_prefix_keys.c -- where each message of a rendered chat ends
 * (chat_render's ends), how many of the prompt's tokens lie inside each
 * (pkeys_bytes_to_tokens) and what a request is published under
 * (pkeys_request), for every chat template and several tokenizers: the
 * default model's (stories260K, SPM without special tokens of its own)
 * and llama.cpp's vocabulary files (t/fetch-llama-src): Llama 2's SPM
 * (<s> and </s> special), Llama 3's and Qwen2's BPE (their chat markers
 * special), Phi-3's SPM (special tokens eat the whitespace after them)
 * and Gemma 4's BPE.
 *
 * The checks are properties against independent renderings and
 * tokenizations, not copies of the walk:
 *
 *   ends      messages 0..i rendered alone (no generation prompt) are
 *             exactly the first ends[i] bytes of the whole conversation's
 *             rendering
 *   tokens    the first T_i tokens of the whole prompt are the first T_i
 *             tokens of the prompt of messages 0..i alone (what a later
 *             request sharing them tokenizes: the KV blocks are shared),
 *             and T_i is at most two short of the tokens of those bytes
 *             encoded alone (the walk does not give up early)
 *   anchors   the chain hash of the key's last block, as kv_cache.h
 *             computes it over the prompt */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "testutil.h"

#include "chat.h"
#include "gguf.h"
#include "kv_cache.h"
#include "prefix_keys.h"
#include "request.h"
#include "tokenizer.h"

#define MAX_TOK  4096
#define MAX_TEXT 16384
#define MAX_MSGS 80

typedef struct {
    const char *name;           // "stories260K", or llama.cpp's vocab name
    GGUF        g;
    Tokenizer  *tk;
} Vocab;

typedef struct {
    char  src[4096];
    Vocab v[6];
    int   n;
} Fix;

static const char *vocab_names[] = {
    "stories260K", "llama-spm", "llama-bpe", "qwen2", "phi-3", "gemma-4",
};

/* Every template; with a vocabulary, the ones a model of it would use. */
static const ChatTemplate all_templates[] = {
    CHAT_PLAIN, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_LLAMA2_SYS,
    CHAT_LLAMA2_SYS_BOS, CHAT_LLAMA2_SYS_STRIP, CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3, CHAT_MISTRAL_V3_TEKKEN, CHAT_MISTRAL_V7,
    CHAT_MISTRAL_V7_TEKKEN, CHAT_GEMMA, CHAT_PHI3, CHAT_ZEPHYR,
};

#define N_TEMPLATES ((int) (sizeof(all_templates) / sizeof(all_templates[0])))

static const ChatMsg conv[] = {
    { "system",    "You are a helpful assistant who tells short stories." },
    { "user",      "Hello" },
    { "assistant", "Hi there! Once upon a time, a cat sat on a mat." },
    { "user",      "  Tell me one about a dog, please.  " },
    { "assistant", "   The dog ran home.\n\nThe end.   " },
    { "user",      "Another one\nwith two lines" },
};

/* A system message in the middle: Gemma holds it back until the next user
 * turn. Unicode, an empty assistant turn. */
static const ChatMsg conv_mid[] = {
    { "user",      "Gr\xc3\xbc\xc3\x9f" "e! \xe4\xb8\x96\xe7\x95\x8c" },
    { "assistant", "" },
    { "system",    "Answer in English." },
    { "system",    "Be brief." },
    { "user",      "What is a cat?" },
};

#define N_OF(a) ((int) (sizeof(a) / sizeof((a)[0])))


/* ---- Setup --------------------------------------------------------------- */

static const char *stories_path(void) {
    const char *m = getenv("OMNI_MODEL");

    return m != NULL && strstr(m, "stories260K") != NULL
           ? m : "../shared/models/stories260K.gguf";
}

static int setup(void **state) {
    Fix  *f = calloc(1, sizeof(*f));
    char  path[8192];

    *state = f;
    if (f == NULL) return -1;
    if (find_llama_src(f->src, sizeof(f->src)) != 0) {
        print_error("llama.cpp source not found: set OMNI_LLAMA_SRC or run "
                    "t/fetch-llama-src from the repository root\n");
        return -1;
    }
    for (int i = 0; i < N_OF(vocab_names); i++) {
        Vocab *v = &f->v[f->n++];

        v->name = vocab_names[i];
        if (i == 0) {
            snprintf(path, sizeof(path), "%s", stories_path());
        } else {
            snprintf(path, sizeof(path), "%s/models/ggml-vocab-%s.gguf",
                     f->src, vocab_names[i]);
        }
        if (open_tokenizer(path, &v->g, &v->tk) != 0) return -1;
    }
    return 0;
}

static int teardown(void **state) {
    Fix *f = *state;

    for (int i = 0; f != NULL && i < f->n; i++) {
        tokenizer_free(f->v[i].tk);
        gguf_close(&f->v[i].g);
    }
    free(f);
    return 0;
}


/* ---- Helpers ------------------------------------------------------------- */

static size_t render(ChatTemplate t, const ChatMsg *m, int n, bool gen,
                     char *buf, size_t *ends)
{
    Err  err;
    long len = chat_render(t, m, n, gen, buf, MAX_TEXT, ends, &err);

    if (len < 0) fail_msg("%s: %s", chat_name(t), err.msg);
    assert_true(len < MAX_TEXT);
    return (size_t) len;
}

/* The prompt's tokens as the thinker encodes a chat: BOS, specials. */
static int64_t encode(const Tokenizer *tk, const char *text, size_t len,
                      int32_t *toks)
{
    Err     err;
    int64_t n = tokenizer_encode(tk, text, len, true, true, toks, MAX_TOK,
                                 &err);

    if (n < 0 || n > MAX_TOK) fail_msg("encode: %s", err.msg);
    return n;
}

/* The three properties of the top of the file for one template,
 * vocabulary and conversation. */
static void check_conversation(const Vocab *v, ChatTemplate t,
                               const ChatMsg *m, int n)
{
    static char    full[MAX_TEXT], part[MAX_TEXT];
    static int32_t toks[MAX_TOK], ptoks[MAX_TOK];
    size_t         ends[MAX_MSGS], at[MAX_MSGS];
    size_t         len = render(t, m, n, true, full, ends);
    int64_t        nt = encode(v->tk, full, len, toks);
    Err            err;

    memcpy(at, ends, sizeof(size_t) * (size_t) n);
    if (pkeys_bytes_to_tokens(v->tk, full, len, toks, nt, at, n, &err)
        != 0)
    {
        fail_msg("%s, %s: %s", v->name, chat_name(t), err.msg);
    }
    for (int i = 0; i < n; i++) {
        size_t  plen = render(t, m, i + 1, false, part, NULL);
        int64_t np, alone;

        if (plen != ends[i] || memcmp(part, full, plen) != 0) {
            fail_msg("%s, message %d: ends %zu, alone %zu bytes",
                     chat_name(t), i, ends[i], plen);
        }
        assert_true(at[i] <= (size_t) nt);
        if (i > 0) assert_true(at[i] >= at[i - 1]);
        alone = encode(v->tk, full, ends[i], ptoks);
        if ((int64_t) at[i] + 2 < alone) {
            fail_msg("%s, %s, message %d: %zu tokens inside, %" PRId64
                     " alone", v->name, chat_name(t), i, at[i], alone);
        }
        plen = render(t, m, i + 1, true, part, NULL);
        np = encode(v->tk, part, plen, ptoks);
        if ((int64_t) at[i] > np
            || memcmp(toks, ptoks, at[i] * sizeof(int32_t)) != 0)
        {
            fail_msg("%s, %s, message %d: the first %zu tokens differ "
                     "from the prefix request's", v->name, chat_name(t), i,
                     at[i]);
        }
    }
}


/* ---- Tests --------------------------------------------------------------- */

static void test_every_template(void **state) {
    Fix *f = *state;

    for (int k = 0; k < N_TEMPLATES; k++) {
        check_conversation(&f->v[0], all_templates[k], conv, N_OF(conv));
        check_conversation(&f->v[0], all_templates[k], conv_mid,
                           N_OF(conv_mid));
    }
}

/* Each vocabulary with the templates its models use. */
static void test_vocabularies(void **state) {
    static const struct {
        int          v;
        ChatTemplate t;
    } pairs[] = {
        { 1, CHAT_LLAMA2_SYS }, { 1, CHAT_LLAMA2_SYS_BOS },
        { 1, CHAT_MISTRAL_V1 }, { 1, CHAT_MISTRAL_V3 }, { 1, CHAT_PLAIN },
        { 2, CHAT_LLAMA3 }, { 2, CHAT_CHATML }, { 2, CHAT_PLAIN },
        { 3, CHAT_CHATML }, { 3, CHAT_LLAMA3 },
        { 4, CHAT_PHI3 }, { 4, CHAT_ZEPHYR },
        { 5, CHAT_GEMMA }, { 5, CHAT_CHATML },
    };
    Fix *f = *state;

    for (int i = 0; i < N_OF(pairs); i++) {
        check_conversation(&f->v[pairs[i].v], pairs[i].t, conv, N_OF(conv));
        check_conversation(&f->v[pairs[i].v], pairs[i].t, conv_mid,
                           N_OF(conv_mid));
    }
}

/* Literal byte ends for one case (stories260K, ChatML), and the tokens
 * counted inside the first message: their pieces spell it (the dummy
 * space first), bar at most the one token straddling its end. */
static void test_literal(void **state) {
    static const ChatMsg m[] = {
        { "system", "Be kind." }, { "user", "Hi" },
    };
    Fix       *f = *state;
    char       text[MAX_TEXT], got[256];
    int32_t    toks[MAX_TOK];
    size_t     ends[2], count[2], g = 0;
    size_t     len = render(CHAT_CHATML, m, 2, true, text, ends);
    int64_t    n = encode(f->v[0].tk, text, len, toks);
    Err        err;

    /* "<|im_start|>system\nBe kind.<|im_end|>\n", then
       "<|im_start|>user\nHi<|im_end|>\n" */
    assert_int_equal(ends[0], 38);
    assert_int_equal(ends[1], 38 + 30);
    memcpy(count, ends, sizeof(ends));
    assert_int_equal(pkeys_bytes_to_tokens(f->v[0].tk, text, len, toks, n,
                                           count, 2, &err), 0);
    assert_int_equal(toks[0], tokenizer_bos(f->v[0].tk));
    for (size_t k = 1; k < count[0]; k++) {
        g += tokenizer_piece(f->v[0].tk, toks[k], true, got + g,
                             sizeof(got) - g);
    }
    assert_true(g <= 1 + ends[0] && got[0] == ' ');
    assert_memory_equal(got + 1, text, g - 1);
    g += tokenizer_piece(f->v[0].tk, toks[count[0]], true, got + g,
                         sizeof(got) - g);
    assert_true(g > 1 + ends[0]);
}

/* Tokens that are not the text's fail the walk, naming where. */
static void test_mismatch(void **state) {
    Fix    *f = *state;
    char    text[] = "User: hello there\n\n";
    int32_t toks[64];
    size_t  at[1] = { 6 };
    int64_t n = encode(f->v[0].tk, text, strlen(text), toks);
    Err     err;

    toks[n - 1] = toks[1];
    assert_int_equal(pkeys_bytes_to_tokens(f->v[0].tk, text, strlen(text),
                                           toks, n, at, 1, &err), -1);
    assert_non_null(strstr(err.msg, "does not match the text at byte"));
    at[0] = 6;
    assert_int_equal(pkeys_bytes_to_tokens(f->v[0].tk, text, strlen(text),
                                           toks, n - 1, at, 1, &err), -1);
    assert_non_null(strstr(err.msg, "cover"));
}

/* pkeys_request: whole blocks, anchors as the scheduler hashes them, the
 * salt in the anchors, keys under a block left out, and of a long chain
 * the first 16 and the last 48. */
static void check_request(const Vocab *v, const char *json, int bs,
                          int want_keys)
{
    static char    text[MAX_TEXT];
    static int32_t toks[MAX_TOK];
    size_t         ends[MAX_MSGS];
    PrefixKey      keys[OMNI_PKEY_MAX];
    OmniRequest    r;
    ReqError       e;
    Err            err;
    int64_t        n;
    size_t         len;
    int            n_keys;
    uint64_t       root;

    if (request_parse(&r, json, strlen(json), &e) != 0) {
        fail_msg("%s", e.err.msg);
    }
    len = render(CHAT_PLAIN, r.msgs, r.n_msgs, true, text, ends);
    n = encode(v->tk, text, len, toks);
    assert_int_equal(pkeys_bytes_to_tokens(v->tk, text, len, toks, n, ends,
                                           pkeys_chain_len(&r), &err), 0);
    n_keys = pkeys_request(&r, ends, toks, n, bs, keys);
    assert_int_equal(n_keys, want_keys);
    root = kv_root_hash(r.cache_salt, r.cache_salt_len);
    for (int k = 0; k < n_keys; k++) {
        uint64_t h = root;
        OmniPkey key = pkeys_root(&r);

        for (int i = 0; i <= keys[k].msg; i++) {
            key = pkeys_next(key, &r.msgs[i]);
        }
        assert_true(key.hi == keys[k].key.hi && key.lo == keys[k].key.lo);
        assert_int_equal(keys[k].tokens, ends[keys[k].msg] / bs * bs);
        assert_true(keys[k].tokens >= bs);
        for (int b = 0; b < keys[k].tokens / bs; b++) {
            h = kv_block_hash(h, toks + b * bs, bs);
        }
        assert_true(h == keys[k].anchor);
        if (k > 0) assert_true(keys[k].msg > keys[k - 1].msg);
    }
    if (n_keys == OMNI_PKEY_MAX) {
        assert_int_equal(keys[15].msg, 15);
        assert_int_equal(keys[16].msg, r.n_msgs - 48);
    }
    request_free(&r);
}

static void test_request(void **state) {
    Fix  *f = *state;
    char  json[8192];
    int   at;

    /* the system turn is 12 tokens or so: under a block of 16, over 4 */
    check_request(&f->v[0], "{\"messages\":[{\"role\":\"system\",\"content\":"
                  "\"Be kind.\"},{\"role\":\"user\",\"content\":\"Tell me "
                  "a long story about a cat and a dog and a bird.\"}]}", 16,
                  1);
    check_request(&f->v[0], "{\"cache_salt\":\"s1\",\"messages\":[{\"role\":"
                  "\"system\",\"content\":\"Be kind.\"},{\"role\":\"user\","
                  "\"content\":\"Tell me a story.\"}]}", 4, 2);
    at = snprintf(json, sizeof(json), "{\"messages\":[");
    for (int i = 0; i < 70; i++) {
        at += snprintf(json + at, sizeof(json) - (size_t) at, "%s{\"role\":"
                       "\"%s\",\"content\":\"m%d\"}", i ? "," : "",
                       i % 2 ? "assistant" : "user", i);
    }
    snprintf(json + at, sizeof(json) - (size_t) at, "]}");
    check_request(&f->v[0], json, 1, OMNI_PKEY_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_template),
        cmocka_unit_test(test_vocabularies),
        cmocka_unit_test(test_literal),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_request),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("prefix_keys", tests, setup, teardown);
}

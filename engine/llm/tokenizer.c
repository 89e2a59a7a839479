/* tokenizer.c -- text <-> token ids, as llama.cpp does it; see tokenizer.h.
 * This file builds the Tokenizer from GGUF metadata; tokenizer_impl.h says
 * which file does the rest.
 *
 * The goal is to produce exactly the ids llama.cpp produces for the same
 * GGUF, so that prompts, prefix-cache hashes and benchmarks agree with it.
 * Every rule (defaults per model, which tokens count as special, the
 * order special tokens are split out, the pre-tokenizer patterns, the merge
 * order and its tie-breaks) follows llama.cpp's llama-vocab.cpp; the tests
 * run llama.cpp's own tokenizer vectors against the tokenizer.
 *
 * tokenizer_new reads the metadata once: token texts, scores and types,
 * merges, special ids and flags. It then decides, from texts as well as
 * types, which tokens are cut out of the text as special and which end
 * generation, and compiles the pre-tokenizer patterns (tokenizer_pre.c).
 * Encoding (tokenizer_encode.c) and decoding (detok.c) only read the result.
 *
 * Lookups go through two open-addressing hash tables built once here:
 * token text -> id and (left, right) -> merge rank, both keyed by views into
 * the GGUF, so nothing is copied and a 150k-token vocabulary loads in tens
 * of milliseconds (llama.cpp's string maps take ten times that).
 *
 * Where we knowingly differ from llama.cpp: when a vocabulary has several
 * FIM tokens for one role, llama.cpp picks one in hash-map order; we pick
 * the first in its list. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* tokenizer.ggml.token_type values */
#define TT_NORMAL          1
#define TT_UNKNOWN         2
#define TT_CONTROL         3
#define TT_USER_DEFINED    4
#define TT_UNUSED          5
#define TT_BYTE            6


/* ---- Hash tables -----------------------------------------------------------
 * Open addressing with linear probing over a power-of-two array of uint32
 * (index + 1, 0 = free), at most half full. Keys are never copied: a slot
 * leads back to the token text or merge string in the GGUF. */

static uint64_t hash_bytes(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {    // FNV-1a
        h ^= (uint8_t) s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t hash_text(const char *s, size_t n) {
    uint64_t h = hash_bytes(0xcbf29ce484222325ULL, s, n);

    return h ^ (h >> 29);
}

static uint64_t hash_pair(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = hash_bytes(0xcbf29ce484222325ULL, l, ln);

    h = hash_bytes(h * 0x9e3779b97f4a7c15ULL, r, rn);
    return h ^ (h >> 29);
}

static uint32_t *slots_new(uint64_t n, uint32_t *mask) {
    uint64_t cap = 16;

    while (cap < 2 * n) cap *= 2;
    *mask = (uint32_t) (cap - 1);
    return calloc(cap, sizeof(uint32_t));
}

int32_t tok_vocab_find(const Tokenizer *tk, const char *s, size_t n) {
    uint32_t i = (uint32_t) hash_text(s, n) & tk->vocab_mask;

    for (; tk->vocab_slot[i] != 0; i = (i + 1) & tk->vocab_mask) {
        int32_t id = (int32_t) tk->vocab_slot[i] - 1;

        if (tk->len[id] == n && memcmp(tk->text[id], s, n) == 0) return id;
    }
    return NO_TOKEN;
}

/* A later token with the same text takes the slot, as in llama.cpp. h is
 * hash_text() of the token's text. */
static void vocab_insert(Tokenizer *tk, int32_t id, uint64_t h) {
    const char *s = tk->text[id];
    uint32_t    n = tk->len[id];
    uint32_t    i = (uint32_t) h & tk->vocab_mask;

    for (; tk->vocab_slot[i] != 0; i = (i + 1) & tk->vocab_mask) {
        int32_t old = (int32_t) tk->vocab_slot[i] - 1;

        if (tk->len[old] == n && memcmp(tk->text[old], s, n) == 0) break;
    }
    tk->vocab_slot[i] = (uint32_t) id + 1;
}

int32_t tok_merge_rank(const Tokenizer *tk, const char *l, size_t ln,
                       const char *r, size_t rn)
{
    uint32_t i = (uint32_t) hash_pair(l, ln, r, rn) & tk->merge_mask;

    for (; tk->merge_slot[i] != 0; i = (i + 1) & tk->merge_mask) {
        uint32_t rank = tk->merge_slot[i] - 1;
        GGUFStr  m = tk->merge_str[rank];

        if (tk->merge_split[rank] == ln && m.len == ln + 1 + rn
            && memcmp(m.ptr, l, ln) == 0 && memcmp(m.ptr + ln + 1, r, rn) == 0)
        {
            return (int32_t) rank;
        }
    }
    return -1;
}

static uint64_t merge_hash(const Tokenizer *tk, uint32_t rank) {
    GGUFStr  m = tk->merge_str[rank];
    uint32_t ln = tk->merge_split[rank];

    return hash_pair(m.ptr, ln, m.ptr + ln + 1, m.len - ln - 1);
}

/* The first rank of a pair wins, as in llama.cpp. h is merge_hash(). */
static void merge_insert(Tokenizer *tk, uint32_t rank, uint64_t h) {
    GGUFStr  m = tk->merge_str[rank];
    uint32_t ln = tk->merge_split[rank];
    uint32_t i = (uint32_t) h & tk->merge_mask;

    for (; tk->merge_slot[i] != 0; i = (i + 1) & tk->merge_mask) {
        uint32_t o = tk->merge_slot[i] - 1;
        GGUFStr  om = tk->merge_str[o];

        if (tk->merge_split[o] == ln && om.len == m.len
            && memcmp(om.ptr, m.ptr, m.len) == 0)
        {
            return;
        }
    }
    tk->merge_slot[i] = rank + 1;
}


/* Filling a table in key order costs a cache miss per key. Hashing every
 * key first lets each insert prefetch the slot of the key 16 places ahead,
 * which makes loading a 500k-merge table several times faster. */
#define PREFETCH_AHEAD 16

static int fill_vocab_slots(Tokenizer *tk) {
    uint64_t *h = malloc((size_t) tk->n_vocab * sizeof(uint64_t));

    if (h == NULL) return -1;
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        h[i] = hash_text(tk->text[i], tk->len[i]);
    }
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        if (i + PREFETCH_AHEAD < tk->n_vocab) {
            __builtin_prefetch(&tk->vocab_slot[h[i + PREFETCH_AHEAD]
                                               & tk->vocab_mask]);
        }
        vocab_insert(tk, i, h[i]);
    }
    free(h);
    return 0;
}

static int fill_merge_slots(Tokenizer *tk) {
    uint64_t *h = malloc(((size_t) tk->n_merges + 1) * sizeof(uint64_t));

    if (h == NULL) return -1;
    for (uint32_t r = 0; r < tk->n_merges; r++) {
        h[r] = tk->merge_split[r] != 0 ? merge_hash(tk, r) : 0;
    }
    for (uint32_t r = 0; r < tk->n_merges; r++) {
        if (r + PREFETCH_AHEAD < tk->n_merges) {
            __builtin_prefetch(&tk->merge_slot[h[r + PREFETCH_AHEAD]
                                               & tk->merge_mask]);
        }
        if (tk->merge_split[r] != 0) merge_insert(tk, r, h[r]);
    }
    free(h);
    return 0;
}


/* ---- Loading ------------------------------------------------------------- */

static int load_tokens(Tokenizer *tk, const GGUF *g, Err *err) {
    const GGUFKV *tokens;
    size_t        names_len = 0, off = 0;
    int           rc = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING,
                                    &tokens, err);

    if (rc < 0) return -1;
    if (rc > 0) return err_set(err, "no tokenizer.ggml.tokens in the file");
    if (tokens->count == 0 || tokens->count > INT32_MAX / 2) {
        return err_set(err, "tokenizer.ggml.tokens has %llu entries",
                       (unsigned long long) tokens->count);
    }
    tk->n_vocab = (int32_t) tokens->count;
    tk->text = calloc((size_t) tk->n_vocab, sizeof(*tk->text));
    tk->len = calloc((size_t) tk->n_vocab, sizeof(*tk->len));
    tk->attr = calloc((size_t) tk->n_vocab, sizeof(*tk->attr));
    tk->vocab_slot = slots_new((uint64_t) tk->n_vocab, &tk->vocab_mask);
    if (!tk->text || !tk->len || !tk->attr || !tk->vocab_slot) goto oom;

    /* llama.cpp renames empty tokens "[EMPTY_<id>]" */
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        if (gguf_arr_str(tokens, (uint64_t) i).len == 0) names_len += 24;
    }
    if (names_len > 0 && (tk->names = malloc(names_len)) == NULL) goto oom;
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        GGUFStr s = gguf_arr_str(tokens, (uint64_t) i);

        if (s.len > UINT32_MAX) return err_set(err, "token %d is too long", i);
        tk->text[i] = s.ptr;
        tk->len[i] = (uint32_t) s.len;
        if (s.len == 0) {
            tk->text[i] = tk->names + off;
            tk->len[i] = (uint32_t) snprintf(tk->names + off, 24,
                                             "[EMPTY_%d]", (int) i);
            off += 24;
        }
    }
    return fill_vocab_slots(tk) == 0 ? 0 : err_set(err, "out of memory");

oom:
    return err_set(err, "out of memory for a %d-token vocabulary",
                   (int) tokens->count);
}

static uint16_t attr_of_type(int32_t type) {
    switch (type) {
    case TT_NORMAL:       return ATTR_NORMAL;
    case TT_UNKNOWN:      return ATTR_UNKNOWN;
    case TT_CONTROL:      return ATTR_CONTROL;
    case TT_USER_DEFINED: return ATTR_USER_DEFINED;
    case TT_UNUSED:       return ATTR_UNUSED;
    case TT_BYTE:         return ATTR_BYTE;
    default:              return 0;
    }
}

/* Scores (f32 or i32) and token types are optional; without types every
 * token is normal. */
static int load_scores_types(Tokenizer *tk, const GGUF *g, Err *err) {
    const GGUFKV *sc = gguf_find_kv(g, "tokenizer.ggml.scores");
    const GGUFKV *tt = gguf_find_kv(g, "tokenizer.ggml.token_type");
    uint64_t      n = (uint64_t) tk->n_vocab;

    if (sc != NULL) {
        if (sc->type != GGUF_ARRAY || (sc->elem_type != GGUF_FLOAT32
                                       && sc->elem_type != GGUF_INT32))
        {
            return err_set(err, "tokenizer.ggml.scores is not an array of "
                           "float32 or int32");
        }
        if (sc->count < n) return err_set(err, "tokenizer.ggml.scores has "
                                          "fewer entries than tokens");
        if ((tk->score = malloc(n * sizeof(float))) == NULL) {
            return err_set(err, "out of memory for token scores");
        }
        for (uint64_t i = 0; i < n; i++) {
            tk->score[i] = sc->elem_type == GGUF_FLOAT32
                           ? gguf_arr_f32(sc, i) : (float) gguf_arr_i32(sc, i);
        }
    }
    if (tt != NULL) {
        if (tt->type != GGUF_ARRAY || tt->elem_type != GGUF_INT32) {
            return err_set(err, "tokenizer.ggml.token_type is not an array "
                           "of int32");
        }
        if (tt->count < n) return err_set(err, "tokenizer.ggml.token_type "
                                          "has fewer entries than tokens");
    }
    for (uint64_t i = 0; i < n; i++) {
        tk->attr[i] = tt != NULL ? attr_of_type(gguf_arr_i32(tt, i))
                                 : ATTR_NORMAL;
    }
    return 0;
}

/* Merges are "left right", split at the first space after the first byte. */
static int load_merges(Tokenizer *tk, const GGUF *g, Err *err) {
    const GGUFKV *m;
    int           rc = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_STRING,
                                    &m, err);

    if (rc < 0) return -1;
    if (rc > 0) return err_set(err, "no tokenizer.ggml.merges in the file");
    if (m->count >= UINT32_MAX / 4) {
        return err_set(err, "tokenizer.ggml.merges has too many entries");
    }
    tk->merge_str = m->strs;
    tk->n_merges = (uint32_t) m->count;
    tk->merge_split = calloc(m->count + 1, sizeof(uint32_t));
    tk->merge_slot = slots_new(m->count, &tk->merge_mask);
    if (tk->merge_split == NULL || tk->merge_slot == NULL) {
        return err_set(err, "out of memory for %llu merges",
                       (unsigned long long) m->count);
    }
    for (uint32_t r = 0; r < tk->n_merges; r++) {
        GGUFStr     s = tk->merge_str[r];
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;

        if (sp != NULL && s.len <= UINT32_MAX) {
            tk->merge_split[r] = (uint32_t) (sp - s.ptr);
        }
    }
    if (fill_merge_slots(tk) != 0) return err_set(err, "out of memory");
    return 0;
}

/* The file's special ids over the defaults. An id outside the vocabulary is
 * ignored with a warning, as llama.cpp does; 0xffffffff quietly means none. */
static int load_special_ids(Tokenizer *tk, const GGUF *g, Err *err) {
    static const char *keys[SID_COUNT] = {
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
    };
    static const struct { int sid; const char *key; } old_keys[] = {
        { SID_FIM_PRE, "prefix" }, { SID_FIM_SUF, "suffix" },
        { SID_FIM_MID, "middle" },
    };

    for (int i = 0; i < SID_COUNT + 3; i++) {
        int         old = i - SID_COUNT;
        int         sid = old < 0 ? i : old_keys[old].sid;
        const char *name = old < 0 ? keys[i] : old_keys[old].key;
        char        key[64];
        uint32_t    v;
        int         rc;

        snprintf(key, sizeof(key), "tokenizer.ggml.%s_token_id", name);
        rc = gguf_get_u32(g, key, &v, err);
        if (rc < 0) return -1;
        if (rc > 0 || v == UINT32_MAX) continue;    // absent, or -1: none
        if (v >= (uint32_t) tk->n_vocab) {
            log_msg(LOG_WARN, "tokenizer: %s = %u is outside the vocabulary, "
                    "ignored", key, v);
            continue;
        }
        tk->sid[sid] = (int32_t) v;
    }
    return 0;
}

static void set_default_ids(Tokenizer *tk, const char *model) {
    for (int i = 0; i < SID_COUNT; i++) tk->sid[i] = NO_TOKEN;
    if (strcmp(model, "llama") == 0) {
        tk->sid[SID_BOS] = 1;
        tk->sid[SID_EOS] = 2;
        tk->sid[SID_UNK] = 0;
    } else if (strcmp(model, "gpt2") == 0 && !(tk->pre_flags & PRE_NO_BOS)) {
        tk->sid[SID_BOS] = 11;
        tk->sid[SID_EOS] = 11;
    }
    for (int i = 0; i < SID_COUNT; i++) {
        if (tk->sid[i] >= tk->n_vocab) tk->sid[i] = NO_TOKEN;
    }
}

static int load_flags(Tokenizer *tk, const GGUF *g, Err *err) {
    bool v;
    int  rc;

    tk->add_bos = tk->model == MODEL_SPM || (tk->pre_flags & PRE_ADD_BOS);
    tk->add_eos = false;
    tk->add_space_prefix = tk->model == MODEL_SPM;
    if (tk->model == MODEL_SPM) {
        rc = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v, err);
        if (rc < 0) return -1;
        if (rc == 0) tk->add_space_prefix = v;
    }
    if ((rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v, err)) < 0) {
        return -1;
    }
    if (rc == 0) tk->add_bos = v;
    if ((rc = gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &v, err)) < 0) {
        return -1;
    }
    if (rc == 0) tk->add_eos = v;
    if (tk->pre_flags & PRE_FORCE_BOS) tk->add_bos = true;
    return 0;
}

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes take code points 256, 257, ... in byte order. */
static void build_byte_tables(Tokenizer *tk) {
    int n = 0;

    memset(tk->bl_byte, 0xff, sizeof(tk->bl_byte));
    for (int b = 0; b < 256; b++) {
        bool     self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac)
                        || b >= 0xae;
        uint32_t cp = self ? (uint32_t) b : 256 + (uint32_t) n++;

        if (cp < 0x80) {
            tk->bl_utf8[b][0] = (uint8_t) cp;
            tk->bl_len[b] = 1;
        } else {
            tk->bl_utf8[b][0] = (uint8_t) (0xc0 | (cp >> 6));
            tk->bl_utf8[b][1] = (uint8_t) (0x80 | (cp & 0x3f));
            tk->bl_len[b] = 2;
        }
        tk->bl_byte[cp] = (int16_t) b;
    }
    for (int b = 0; b < 256; b++) {
        char hex[8];
        char one = (char) b;

        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        if (tk->model == MODEL_BPE) {
            tk->byte_tok[b] = (tk->pre_flags & PRE_RAW_UTF8)
                              ? tok_vocab_find(tk, hex, 6)
                              : tok_vocab_find(tk, &one, 1);
        } else {
            tk->byte_tok[b] = tok_vocab_find(tk, hex, 6);
            if (tk->byte_tok[b] == NO_TOKEN) {
                tk->byte_tok[b] = tok_vocab_find(tk, &one, 1);
            }
        }
    }
}


/* ---- Special tokens and end of generation ----------------------------------
 * llama.cpp decides these from token texts as well as types; the rules and
 * their order are its own (llama_vocab::impl::load). */

#define FB   "\xef\xbd\x9c"     // U+FF5C, DeepSeek's fullwidth bar

static const char *fim_texts[6][9] = {
    { "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" FB "fim" U2581
      "begin" FB ">", "<PRE>", U2581 "<PRE>", "<|code_prefix|>", "<|prefix|>" },
    { "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" FB "fim" U2581
      "hole" FB ">", "<SUF>", U2581 "<SUF>", "<|code_suffix|>", "<|suffix|>" },
    { "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" FB "fim" U2581
      "end" FB ">", "<MID>", U2581 "<MID>", "<|code_middle|>", "<|middle|>" },
    { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]" },
    { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>" },
    { "<|file_sep|>" },
};

static const char *eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
    "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FB "end" U2581 "of" U2581 "sentence" FB ">", "[e~[",
};

static int32_t find_c(const Tokenizer *tk, const char *s) {
    return tok_vocab_find(tk, s, strlen(s));
}

static bool eog_has(const Tokenizer *tk, int32_t id) {
    return id >= 0 && id < tk->n_vocab && (tk->eog[id >> 3] >> (id & 7)) & 1;
}

static void eog_set(Tokenizer *tk, int32_t id, bool on) {
    if (id < 0 || id >= tk->n_vocab) return;
    if (on) tk->eog[id >> 3] |= (uint8_t) (1u << (id & 7));
    else    tk->eog[id >> 3] &= (uint8_t) ~(1u << (id & 7));
}

/* FIM tokens found by text become control tokens; pad/rep/sep end
 * generation. Then every text in eog_texts does, again as control. */
static void mark_fim_eog(Tokenizer *tk) {
    for (int role = 0; role < 6; role++) {
        int32_t *sid = &tk->sid[SID_FIM_PRE + role];

        for (int j = 0; *sid == NO_TOKEN && j < 9 && fim_texts[role][j]; j++) {
            int32_t id = find_c(tk, fim_texts[role][j]);

            if (id == NO_TOKEN) continue;
            *sid = id;
            tk->attr[id] |= ATTR_CONTROL;
        }
        if (role >= 3) eog_set(tk, *sid, true);
    }
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
        int32_t id = find_c(tk, eog_texts[i]);

        if (id == NO_TOKEN) continue;
        eog_set(tk, id, true);
        tk->attr[id] |= ATTR_CONTROL;
    }
}

static void mark_eog(Tokenizer *tk) {
    static const char *harmony[] = {
        "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"
    };
    int32_t end = find_c(tk, "<|end|>"), s = find_c(tk, "</s>");
    bool    ret, call, flush;

    mark_fim_eog(tk);
    for (int i = 0; i < 4; i++) {               // gpt-oss: always rendered
        int32_t id = find_c(tk, harmony[i]);

        if (id != NO_TOKEN) tk->attr[id] = ATTR_USER_DEFINED;
    }
    eog_set(tk, tk->sid[SID_EOS], true);
    eog_set(tk, tk->sid[SID_EOT], true);
    eog_set(tk, tk->sid[SID_EOM], true);

    /* gpt-oss and solar-open end a message with <|end|>, not the turn */
    ret = eog_has(tk, find_c(tk, "<|return|>"));
    call = eog_has(tk, find_c(tk, "<|call|>"))
           || eog_has(tk, find_c(tk, "<|calls|>"));
    flush = eog_has(tk, find_c(tk, "<|flush|>"));
    if (eog_has(tk, end) && call && (ret || flush)) {
        eog_set(tk, end, false);
        tk->attr[end] = ATTR_USER_DEFINED;
    }
    /* gemma4 uses </s> as text when it has <|tool_response> */
    if (eog_has(tk, s) && eog_has(tk, find_c(tk, "<|tool_response>"))) {
        eog_set(tk, s, false);
        tk->attr[s] = ATTR_NORMAL;
    }
}

static int by_length_desc(const void *a, const void *b, void *ctx) {
    const Tokenizer *tk = ctx;
    int32_t          x = *(const int32_t *) a, y = *(const int32_t *) b;

    if (tk->len[x] != tk->len[y]) return tk->len[x] > tk->len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_special(Tokenizer *tk, Err *err) {
    int32_t n = 0;

    for (int32_t i = 0; i < tk->n_vocab; i++) {
        n += (tk->attr[i] & ATTR_SPECIAL) != 0;
    }
    tk->special = malloc(((size_t) n + 1) * sizeof(int32_t));
    if (tk->special == NULL) return err_set(err, "out of memory");
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        if (tk->attr[i] & ATTR_SPECIAL) tk->special[tk->n_special++] = i;
    }
    qsort_r(tk->special, (size_t) n, sizeof(int32_t), by_length_desc, tk);
    return 0;
}

/* Whitespace next to some special tokens is dropped when they are cut out:
 * after every special token of Phi-3, before <mask>/[MASK] of some
 * embedding models (llama.cpp keys this on model names). */
static void mark_strip(Tokenizer *tk, const GGUF *g) {
    GGUFStr name = { "", 0 }, pre = { "", 0 }, arch = { "", 0 };
    char    low[256];
    size_t  n;
    int32_t id;

    (void) gguf_get_str(g, "general.name", &name, NULL);
    (void) gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
    (void) gguf_get_str(g, "general.architecture", &arch, NULL);
    n = name.len < sizeof(low) - 1 ? name.len : sizeof(low) - 1;
    for (size_t i = 0; i < n; i++) {
        char c = name.ptr[i];

        low[i] = (char) (c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    low[n] = '\0';
    if (memmem(pre.ptr, pre.len, "jina-v2-", 8) != NULL
        || memmem(arch.ptr, arch.len, "nomic-bert-moe", 14) != NULL
        || memmem(arch.ptr, arch.len, "jina-bert-v3", 12) != NULL)
    {
        if ((id = find_c(tk, "<mask>")) != NO_TOKEN) {
            tk->attr[id] |= ATTR_LSTRIP;
        }
    } else if (strstr(low, "phi-3") != NULL || strstr(low, "phi3") != NULL) {
        static const char *keep[] = { "<unk>", "<s>", "<|endoftext|>" };

        for (int32_t i = 0; i < tk->n_special; i++) {
            tk->attr[tk->special[i]] |= ATTR_RSTRIP;
        }
        if ((id = find_c(tk, "</s>")) != NO_TOKEN) tk->attr[id] |= ATTR_RSTRIP;
        for (int i = 0; i < 3; i++) {
            if ((id = find_c(tk, keep[i])) != NO_TOKEN) {
                tk->attr[id] &= (uint16_t) ~ATTR_RSTRIP;
            }
        }
    } else if (strstr(low, "modern-bert") != NULL) {
        if ((id = find_c(tk, "[MASK]")) != NO_TOKEN) {
            tk->attr[id] |= ATTR_LSTRIP;
        }
    }
}


/* ---- Construction -------------------------------------------------------- */

/* Picks the model and, for BPE, the pre-tokenizer; fails naming what it
 * does not know. model is filled with a NUL-terminated copy. */
static int pick_model(Tokenizer *tk, const GGUF *g, char *model, size_t cap,
                      const PreTok **pre, Err *err)
{
    GGUFStr m, p = { "", 0 };
    int     rc = gguf_get_str(g, "tokenizer.ggml.model", &m, err);

    if (rc < 0) return -1;
    if (rc > 0) return err_set(err, "no tokenizer.ggml.model in the file");
    snprintf(model, cap, "%.*s", (int) (m.len < cap ? m.len : cap - 1), m.ptr);
    if (strcmp(model, "llama") == 0) {
        tk->model = MODEL_SPM;
        return 0;
    }
    if (strcmp(model, "gpt2") != 0 && strcmp(model, "gemma4") != 0) {
        return err_set(err, "tokenizer model '%s' is not supported (only "
                       "'llama', 'gpt2' and 'gemma4' are)", model);
    }
    tk->model = MODEL_BPE;
    if ((rc = gguf_get_str(g, "tokenizer.ggml.pre", &p, err)) < 0) return -1;
    if (strcmp(model, "gemma4") == 0) p = (GGUFStr) { "gemma4", 6 };
    if (p.len == 0) {
        log_msg(LOG_WARN, "tokenizer: no tokenizer.ggml.pre, using 'default'");
        p = (GGUFStr) { "default", 7 };
    }
    *pre = tok_pre_find(p.ptr, (size_t) p.len, &tk->pre_flags, err);
    return *pre != NULL ? 0 : -1;
}

Tokenizer *tokenizer_new(const GGUF *g, Err *err) {
    Tokenizer    *tk = calloc(1, sizeof(*tk));
    const PreTok *pre = NULL;
    char          model[32];

    if (tk == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    if (pick_model(tk, g, model, sizeof(model), &pre, err) != 0) goto fail;
    if (load_tokens(tk, g, err) != 0) goto fail;
    if (load_scores_types(tk, g, err) != 0) goto fail;
    if (tk->model == MODEL_SPM && tk->score == NULL) {
        tk->score = calloc((size_t) tk->n_vocab, sizeof(float));
        if (tk->score == NULL) goto oom;
    }
    if (tk->model == MODEL_BPE && load_merges(tk, g, err) != 0) goto fail;
    set_default_ids(tk, model);
    if (load_special_ids(tk, g, err) != 0) goto fail;
    if (load_flags(tk, g, err) != 0) goto fail;
    build_byte_tables(tk);
    tk->eog = calloc(((size_t) tk->n_vocab + 7) / 8, 1);
    if (tk->eog == NULL) goto oom;
    mark_eog(tk);
    if (build_special(tk, err) != 0) goto fail;
    mark_strip(tk, g);
    if (pre != NULL && tok_pre_compile(tk, pre, err) != 0) goto fail;
    return tk;

oom:
    err_set(err, "out of memory");
fail:
    err_prefix(err, "%s: tokenizer", g->path);
    tokenizer_free(tk);
    return NULL;
}

void tokenizer_free(Tokenizer *tk) {
    if (tk == NULL) return;
    for (int i = 0; i < tk->n_re; i++) pcre2_code_free(tk->re[i]);
    free(tk->text);
    free(tk->len);
    free(tk->score);
    free(tk->attr);
    free(tk->names);
    free(tk->vocab_slot);
    free(tk->merge_split);
    free(tk->merge_slot);
    free(tk->special);
    free(tk->eog);
    free(tk);
}

/* ---- How much text one token covers ----------------------------------------
 * Every token the encoder emits stands for a run of its working text (the
 * input with SPM's spaces as U+2581, bytes mapped to GPT-2's byte-level
 * characters, bad bytes as U+FFFD: never shorter than the input it came
 * from) that is either the token's own text or, for a symbol that is not a
 * token, one byte of it. So a token covers at most max(len) input bytes,
 * with two exceptions: a special token with a strip attribute also takes
 * the whitespace next to it, and a byte with no token to fall back to is
 * dropped (llama.cpp's behaviour, kept). */

/* The token whose text is l followed by r, without building the string. */
static int32_t vocab_find_concat(const Tokenizer *tk, const char *l,
                                 size_t ln, const char *r, size_t rn)
{
    uint64_t h = hash_bytes(0xcbf29ce484222325ULL, l, ln);
    uint32_t i;

    h = hash_bytes(h, r, rn);
    i = (uint32_t) (h ^ (h >> 29)) & tk->vocab_mask;
    for (; tk->vocab_slot[i] != 0; i = (i + 1) & tk->vocab_mask) {
        int32_t id = (int32_t) tk->vocab_slot[i] - 1;

        if (tk->len[id] == ln + rn && memcmp(tk->text[id], l, ln) == 0
            && memcmp(tk->text[id] + ln, r, rn) == 0)
        {
            return id;
        }
    }
    return NO_TOKEN;
}

/* Whether no input byte can be dropped. Either every byte has a token to
 * fall back to (SPM: or there is an unknown token), or, for byte-level
 * BPE, no symbol ever needs the fallback: every byte-level character is a
 * token and so is the result of every merge (merges are the only way a
 * symbol grows). The second test reads every merge once. */
static bool drops_nothing(const Tokenizer *tk) {
    bool unk = tk->model == MODEL_SPM && tk->sid[SID_UNK] != NO_TOKEN;
    int  b;

    for (b = 0; b < 256; b++) {
        if (tk->byte_tok[b] == NO_TOKEN && !unk) break;
    }
    if (b == 256) return true;
    if (tk->model != MODEL_BPE || (tk->pre_flags & PRE_RAW_UTF8)) return false;
    for (b = 0; b < 256; b++) {
        if (tok_vocab_find(tk, (const char *) tk->bl_utf8[b], tk->bl_len[b])
            == NO_TOKEN)
        {
            return false;
        }
    }
    for (uint32_t r = 0; r < tk->n_merges; r++) {
        GGUFStr  m = tk->merge_str[r];
        uint32_t ln = tk->merge_split[r];

        if (ln != 0 && vocab_find_concat(tk, m.ptr, ln, m.ptr + ln + 1,
                                         m.len - ln - 1) == NO_TOKEN)
        {
            return false;
        }
    }
    return true;
}

void tokenizer_text_bound(const Tokenizer *tk, uint32_t *max_piece,
                          bool *ws_free)
{
    uint32_t longest = 1;
    bool     strip = false;

    for (int32_t i = 0; i < tk->n_vocab; i++) {
        if (tk->len[i] > longest) longest = tk->len[i];
        if (tk->attr[i] & (ATTR_LSTRIP | ATTR_RSTRIP)) strip = true;
    }
    *max_piece = drops_nothing(tk) ? longest : 0;
    *ws_free = strip;
}


int32_t tokenizer_n_vocab(const Tokenizer *tk) { return tk->n_vocab; }
int32_t tokenizer_bos(const Tokenizer *tk)     { return tk->sid[SID_BOS]; }
int32_t tokenizer_eos(const Tokenizer *tk)     { return tk->sid[SID_EOS]; }

bool tokenizer_adds_bos(const Tokenizer *tk) {
    return tk->add_bos && tk->sid[SID_BOS] != NO_TOKEN;
}

bool tokenizer_is_eog(const Tokenizer *tk, int32_t id) {
    return eog_has(tk, id);
}

bool tokenizer_is_special(const Tokenizer *tk, int32_t id) {
    return id >= 0 && id < tk->n_vocab && (tk->attr[id] & ATTR_SPECIAL);
}

bool tokenizer_space_prefix(const Tokenizer *tk) {
    return tk->model == MODEL_SPM && tk->add_space_prefix;
}

int32_t tokenizer_find(const Tokenizer *tk, const char *s) {
    return find_c(tk, s);
}

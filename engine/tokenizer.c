/* tokenizer.c -- text <-> token ids, as llama.cpp does it; see tokenizer.h.
 *
 * The goal is to produce exactly the ids llama.cpp produces for the same
 * GGUF, so that prompts, prefix-cache hashes and benchmarks agree with it.
 * Every rule below (defaults per model, which tokens count as special, the
 * order special tokens are split out, the pre-tokenizer patterns, the merge
 * order and its tie-breaks) follows llama.cpp's llama-vocab.cpp; the tests
 * run llama.cpp's own tokenizer vectors against this file.
 *
 * Encoding has three stages:
 *
 *   1. Special tokens. Tokens of type control, user-defined or unknown are
 *      cut out of the text as whole strings, longest token first, before any
 *      model runs. Without parse_special only user-defined ones are (that is
 *      what Hugging Face does with "added tokens"). The text is thus a list
 *      of fragments: raw text, or one token.
 *   2. SPM ("llama"): a raw fragment gets a leading space when it starts the
 *      text or follows a special token, spaces become U+2581, and adjacent
 *      symbols (initially UTF-8 characters) are merged best score first while
 *      the merged text is a token. Leftovers fall back to <0xXX> tokens.
 *   3. BPE ("gpt2"): a raw fragment is split into words by the model's
 *      pre-tokenizer patterns (PCRE2, Unicode properties, each pattern
 *      refining the pieces of the previous one, unmatched gaps kept as
 *      pieces), each word is mapped to GPT-2's byte-level characters and its
 *      symbols are merged lowest merge rank first.
 *
 * Both merge loops keep symbols in an array linked as a list and candidate
 * pairs in a binary heap, so a word of n characters costs O(n log n); a
 * stale heap entry is recognised by its size and skipped. Lookups go through
 * two open-addressing hash tables built once in tokenizer_new: token text ->
 * id and (left, right) -> merge rank, both keyed by views into the GGUF, so
 * nothing is copied and a 150k-token vocabulary loads in tens of
 * milliseconds (llama.cpp's string maps take ten times that).
 *
 * Where we knowingly differ from llama.cpp:
 *   - Character classes come from PCRE2's Unicode tables (Unicode 14 in
 *     PCRE2 10.42) rather than llama.cpp's (Unicode 15): the characters added
 *     in Unicode 15, and U+180E, which PCRE2 counts as \s, may split
 *     differently.
 *   - BPE text is made valid UTF-8 first, each byte that does not start a
 *     well-formed sequence becoming U+FFFD. llama.cpp does the same for most
 *     bad input but lets overlong forms and surrogates through.
 *   - When a vocabulary has several FIM tokens for one role, llama.cpp picks
 *     one in hash-map order; we pick the first in its list.
 * Pre-tokenizers whose llama.cpp behaviour no pattern reproduces are
 * refused by name: kimi-k2, afmoe, superbpe and tiny_aya (hand-written code
 * there), youtu (its \p{Lu}/\p{Ll} classes act as \p{L} there) and
 * whitespace (a different model). */

#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

/* tokenizer.ggml.token_type values */
#define TT_NORMAL          1
#define TT_UNKNOWN         2
#define TT_CONTROL         3
#define TT_USER_DEFINED    4
#define TT_UNUSED          5
#define TT_BYTE            6

/* per-token attributes (llama.cpp's llama_token_attr bits) */
#define ATTR_UNKNOWN       (1u << 0)
#define ATTR_UNUSED        (1u << 1)
#define ATTR_NORMAL        (1u << 2)
#define ATTR_CONTROL       (1u << 3)
#define ATTR_USER_DEFINED  (1u << 4)
#define ATTR_BYTE          (1u << 5)
#define ATTR_LSTRIP        (1u << 7)
#define ATTR_RSTRIP        (1u << 8)
#define ATTR_SPECIAL       (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)

/* pre-tokenizer flags */
#define PRE_ADD_BOS        (1u << 0)    // add_bos defaults to true
#define PRE_IGNORE_MERGES  (1u << 1)    // a word that is a token stays whole
#define PRE_RAW_UTF8       (1u << 2)    // no byte-level mapping: spaces are
                                        //   U+2581, bytes fall back to <0xXX>
#define PRE_NO_BOS         (1u << 3)    // no default BOS id (chatglm)
#define PRE_NEWLINE_WORDS  (1u << 4)    // a word of newlines that is a token
                                        //   stays whole (gemma4)
#define PRE_FORCE_BOS      (1u << 5)    // add_bos even if the file says no

#define MAX_RE             6
#define MAX_TEXT           (UINT32_MAX / 8)    // symbol offsets are 32-bit
                                                //   over up to 6x the text
#define NO_TOKEN           (-1)
#define U2581              "\xe2\x96\x81"  // SPM's visible space

typedef enum { MODEL_SPM, MODEL_BPE } TokModel;

enum {                          // special ids read from the GGUF
    SID_BOS, SID_EOS, SID_EOT, SID_EOM, SID_UNK, SID_SEP, SID_PAD, SID_MASK,
    SID_FIM_PRE, SID_FIM_SUF, SID_FIM_MID, SID_FIM_PAD, SID_FIM_REP,
    SID_FIM_SEP, SID_COUNT
};

struct Tokenizer {
    TokModel      model;
    int32_t       n_vocab;
    const char  **text;         // (n_vocab,) token text, views into the GGUF
                                //   or into names; owned array
    uint32_t     *len;          // (n_vocab,) text length in bytes, owned
    float        *score;        // (n_vocab,) SPM merge scores, owned
    uint16_t     *attr;         // (n_vocab,) ATTR_* bits, owned
    char         *names;        // "[EMPTY_<id>]" texts of empty tokens, owned
    uint32_t     *vocab_slot;   // (vocab_mask + 1,) text -> id + 1; 0 = free
    uint32_t      vocab_mask;
    const GGUFStr *merge_str;   // (n_merges,) "left right", borrowed from
                                //   tokenizer.ggml.merges (BPE only)
    uint32_t      n_merges;
    uint32_t     *merge_split;  // (n_merges,) offset of the separating space,
                                //   0 when the merge is unusable; owned
    uint32_t     *merge_slot;   // (merge_mask + 1,) (left, right) -> rank + 1
    uint32_t      merge_mask;
    int32_t      *special;      // (n_special,) ids cut out as whole strings,
                                //   longest text first; owned
    int32_t       n_special;
    uint8_t      *eog;          // (n_vocab + 7) / 8 end-of-generation bits
    int32_t       sid[SID_COUNT];
    bool          add_bos, add_eos;
    bool          add_space_prefix;     // SPM
    unsigned      pre_flags;            // PRE_* (BPE)
    int32_t       byte_tok[256];        // fallback token of each byte, or -1
    uint8_t       bl_utf8[256][2];      // GPT-2 byte-level character of each
    uint8_t       bl_len[256];          //   byte, UTF-8
    int16_t       bl_byte[324];         // byte of each byte-level code point
    pcre2_code   *re[MAX_RE];           // split patterns, owned
    int           n_re;
};


/* ---- Pre-tokenizers --------------------------------------------------------
 * The split patterns llama.cpp uses for each `tokenizer.ggml.pre`. Where the
 * Hugging Face original uses (?i:'s|...) llama.cpp spells the case out, and
 * so do we: PCRE2's caseless mode would also fold U+017F into 's'.
 * llama.cpp shows patterns without \p{..} a copy of the text in which every
 * non-ASCII space is U+000B, so their literal ranges never match one; the
 * two ranges here that span spaces (U+0800-U+4E00 holds U+2000, U+3000...)
 * exclude them with (?!\s) to agree. */

#define CONTRACTIONS \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+" \
    "|\\s+(?!\\S)"
#define RE_LLAMA3 \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CJK_KANA \
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_CJK_HANGUL \
    "(?:(?!\\s)[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+"
#define RE_DEEPSEEK3 \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+" \
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
#define RE_FINNISH \
    " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}" \
    "\\x{60C})]+"
#define RE_UPPER_LOWER(L) \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))*((?=[" L "])([^A-Z]))+" \
    CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[" L "])([^a-z]))+" \
    "((?=[" L "])([^A-Z]))*" CONTRACTIONS "?|\\p{N}{1,3}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* deepseek-llm's letters: Latin, Greek, Cyrillic, Armenian, Georgian and
   other cased scripts, from its tokenizer.json */
#define RE_DEEPSEEK_LETTERS \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}" \
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}" \
    "\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}" \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}" \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}" \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}" \
    "\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}" \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}" \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}" \
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}" \
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}" \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}" \
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}" \
    "\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}" \
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}" \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}" \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}" \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}" \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}" \
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}" \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}" \
    "\\x{1E900}-\\x{1E943}]+"

typedef struct {
    const char *names;          // '|'-separated values of tokenizer.ggml.pre
    unsigned    flags;          // PRE_*
    const char *re[MAX_RE];     // split patterns, applied in order
} PreTok;

static const PreTok pre_toks[] = {
    { "default", 0, {
        "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" } },
    { "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2"
      "|jina-v5-nano", PRE_ADD_BOS | PRE_IGNORE_MERGES, { RE_LLAMA3 } },
    { "dbrx|smaug-bpe|glm4|chatglm-bpe", 0, { RE_LLAMA3 } },
    { "jais-2", 0, {
        CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)"
        "|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)"
        "|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)"
        "|\\s{1}" } },
    { "deepseek-llm", 0, {
        "[\\r\\n]", RE_DEEPSEEK_LETTERS,
        "\\s?(?:(?!\\s)[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}"
        "\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}])+",
        "\\s+$", RE_CJK_HANGUL, "\\p{N}+" } },
    { "deepseek-v3|hunyuan-dense|hy_v4|joyai-llm", 0, {
        "\\p{N}{1,3}", RE_CJK_KANA,
        RE_DEEPSEEK3 "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)"
        "|\\s+" } },
    { "spark2_5", 0, {
        "\\p{N}{1,3}", RE_CJK_KANA,
        RE_DEEPSEEK3 "| ?[\\p{P}\\p{S}]+|[\\r\\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}" } },
    { "deepseek-coder", 0, {
        "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}" } },
    { "falcon", 0, {
        "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]" } },
    { "starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2",
      0, { "\\p{N}", RE_GPT2 } },
    { "gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0"
      "|mellum|modern-bert|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|mpt"
      "|olmo|jais|trillion|granite-docling", 0, { RE_GPT2 } },
    { "qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan"
      "|solar-open|grok-2", 0, { RE_QWEN2 } },
    { "qwen35", 0, {
        CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)"
        "|\\s+" } },
    { "poro-chat|bloom|gpt3-finnish", 0, { RE_FINNISH } },
    { "viking", 0, { RE_FINNISH, "\\p{N}" } },
    { "tekken", PRE_ADD_BOS | PRE_IGNORE_MERGES, {
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
        "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
        "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)"
        "|\\s+" } },
    { "chameleon", PRE_ADD_BOS, {
        "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2 } },
    { "gpt-4o|llama4|kanana2|talkie|minimax-m2", 0, {
        RE_UPPER_LOWER("\\p{L}") } },
    { "granite-embed-multi-97m", PRE_IGNORE_MERGES, {
        RE_UPPER_LOWER("\\p{L}\\p{M}") } },
    { "bailingmoe|bailingmoe2|llada-moe", 0, {
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?"
        "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]"
        "|\\s+(?!\\S)|\\s+" } },
    { "seed-coder", 0, {
        CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}"
        "| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "ufakzeka", 0, {
        "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
        "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "laguna", 0, { "[^\\n]+|[\\n]+", RE_QWEN2 } },
    { "exaone-moe", 0, {
        CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*"
        "(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?"
        "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
    { "gemma4|granite-embed-multi-311m",
      PRE_FORCE_BOS | PRE_RAW_UTF8 | PRE_NEWLINE_WORDS, { "[^\\n]+|[\\n]+" } },
    { "sarvam-moe", PRE_RAW_UTF8, { "[^\\n]+|[\\n]+" } },
    { "minicpm5", PRE_IGNORE_MERGES, {
        "\\p{N}{1,3}",
        CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
};

/* llama.cpp knows these, but splits them with hand-written code */
static const char *pre_unsupported =
    "kimi-k2|superbpe|afmoe|tiny_aya|cohere2moe|youtu|whitespace";

static bool name_in(const char *list, const char *s, size_t n) {
    const char *p = list, *bar;

    for (;;) {
        bar = strchr(p, '|');
        size_t m = bar != NULL ? (size_t) (bar - p) : strlen(p);
        if (m == n && memcmp(p, s, n) == 0) return true;
        if (bar == NULL) return false;
        p = bar + 1;
    }
}

static const PreTok *pre_find(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof(pre_toks) / sizeof(pre_toks[0]); i++) {
        if (name_in(pre_toks[i].names, s, n)) return &pre_toks[i];
    }
    return NULL;
}

/* Compiles the patterns once; JIT when PCRE2 has it, else the interpreter. */
static int pre_compile(Tokenizer *tk, const PreTok *pre, Err *err) {
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY;

    for (int i = 0; i < MAX_RE && pre->re[i] != NULL; i++) {
        PCRE2_SIZE where;
        int        code;
        char       msg[128];

        tk->re[i] = pcre2_compile((PCRE2_SPTR) pre->re[i],
                                  PCRE2_ZERO_TERMINATED, opts, &code, &where,
                                  NULL);
        if (tk->re[i] == NULL) {
            pcre2_get_error_message(code, (PCRE2_UCHAR *) msg, sizeof(msg));
            return err_set(err, "pre-tokenizer pattern %d does not compile "
                           "at offset %zu: %s", i, (size_t) where, msg);
        }
        tk->n_re = i + 1;
        (void) pcre2_jit_compile(tk->re[i], PCRE2_JIT_COMPLETE);
    }
    return 0;
}


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

static int32_t vocab_find(const Tokenizer *tk, const char *s, size_t n) {
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

static int32_t merge_rank(const Tokenizer *tk, const char *l, size_t ln,
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
                              ? vocab_find(tk, hex, 6)
                              : vocab_find(tk, &one, 1);
        } else {
            tk->byte_tok[b] = vocab_find(tk, hex, 6);
            if (tk->byte_tok[b] == NO_TOKEN) {
                tk->byte_tok[b] = vocab_find(tk, &one, 1);
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
    return vocab_find(tk, s, strlen(s));
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
    *pre = pre_find(p.ptr, (size_t) p.len);
    if (*pre != NULL) {
        tk->pre_flags = (*pre)->flags;
        if (name_in("glm4|chatglm-bpe", p.ptr, (size_t) p.len)) {
            tk->pre_flags |= PRE_NO_BOS;
        }
        return 0;
    }
    if (name_in(pre_unsupported, p.ptr, (size_t) p.len)) {
        return err_set(err, "pre-tokenizer '%.*s' is not supported",
                       (int) p.len, p.ptr);
    }
    return err_set(err, "unknown pre-tokenizer '%.*s'", (int) p.len, p.ptr);
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
    if (pre != NULL && pre_compile(tk, pre, err) != 0) goto fail;
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

int32_t tokenizer_n_vocab(const Tokenizer *tk) { return tk->n_vocab; }
int32_t tokenizer_bos(const Tokenizer *tk)     { return tk->sid[SID_BOS]; }
int32_t tokenizer_eos(const Tokenizer *tk)     { return tk->sid[SID_EOS]; }

bool tokenizer_adds_bos(const Tokenizer *tk) {
    return tk->add_bos && tk->sid[SID_BOS] != NO_TOKEN;
}

bool tokenizer_is_eog(const Tokenizer *tk, int32_t id) {
    return eog_has(tk, id);
}

int32_t tokenizer_find(const Tokenizer *tk, const char *s) {
    return find_c(tk, s);
}


/* ---- UTF-8 ------------------------------------------------------------- */

/* Bytes in the character a lead byte announces, as llama.cpp counts them
 * (a stray continuation byte counts as one). */
static size_t utf8_lead_len(uint8_t c) {
    static const uint8_t len[16] = { 1,1,1,1,1,1,1,1,1,1,1,1,2,2,3,4 };

    return len[c >> 4];
}

/* Length of a well-formed sequence starting with lead byte c: 1-4, or 0 when
 * c can never start one. */
static int utf8_need(uint8_t c) {
    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) return 2;
    if (c < 0xf0) return 3;
    return c < 0xf5 ? 4 : 0;
}

/* Whether b may be byte i (>= 1) of a sequence led by c; the second byte's
 * range excludes overlong forms, surrogates and code points past U+10FFFF. */
static bool utf8_next_ok(uint8_t c, int i, uint8_t b) {
    uint8_t lo = 0x80, hi = 0xbf;

    if (i == 1) {
        if (c == 0xe0) lo = 0xa0;
        else if (c == 0xed) hi = 0x9f;
        else if (c == 0xf0) lo = 0x90;
        else if (c == 0xf4) hi = 0x8f;
    }
    return b >= lo && b <= hi;
}

static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    int need = utf8_need(s[0]);

    if (need == 0 || (size_t) need > n) return 0;
    for (int i = 1; i < need; i++) {
        if (!utf8_next_ok(s[0], i, s[i])) return 0;
    }
    return (size_t) need;
}

/* Copies s to dst as valid UTF-8, each byte that does not start a
 * well-formed sequence becoming U+FFFD, and, with escape, each space U+2581.
 * dst holds 3 * n bytes. Returns the bytes written. */
static size_t utf8_clean(const char *s, size_t n, char *dst, bool escape) {
    size_t i = 0, m = 0;

    while (i < n) {
        size_t k = utf8_valid_len((const uint8_t *) s + i, n - i);

        if (k == 0) {
            memcpy(dst + m, "\xef\xbf\xbd", 3);
            m += 3;
            i++;
        } else if (escape && s[i] == ' ') {
            memcpy(dst + m, U2581, 3);
            m += 3;
            i++;
        } else {
            memcpy(dst + m, s + i, k);
            m += k;
            i += k;
        }
    }
    return m;
}

/* Decodes one code point as llama.cpp does (continuation bits checked, not
 * ranges); an invalid byte yields U+FFFD and a length of 1. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    size_t k = s[0] < 0x80 ? 1 : s[0] < 0xc0 ? 0 : s[0] < 0xe0 ? 2
               : s[0] < 0xf0 ? 3 : s[0] < 0xf8 ? 4 : 0;

    if (k == 0 || k > n) goto bad;
    *cp = k == 1 ? s[0] : (uint32_t) (s[0] & (0x7f >> k));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        *cp = (*cp << 6) | (s[i] & 0x3f);
    }
    return k;
bad:
    *cp = 0xfffd;
    return 1;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char) cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char) (0xc0 | (cp >> 6));
        out[1] = (char) (0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char) (0xe0 | (cp >> 12));
        out[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char) (0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char) (0xf0 | ((cp >> 18) & 0x07));
    out[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char) (0x80 | (cp & 0x3f));
    return 4;
}


/* ---- Encoding: working memory ----------------------------------------------
 * One Scratch per tokenizer_encode call, sized from the text, so encoding
 * is reentrant; the Tokenizer itself is only read. */

typedef struct {
    size_t  off, len;           // raw text bytes, when tok is NO_TOKEN
    int32_t tok;
} Frag;

typedef struct {
    int32_t  prev, next;        // neighbours in the list, -1 at the ends
    uint32_t off, n;            // bytes of the symbol; n == 0 once merged
} Sym;

typedef struct {
    float    score;             // higher first: SPM score, or -rank for BPE
    int32_t  left, right;       // symbol indices
    uint32_t size;              // left.n + right.n when pushed
} Pair;

typedef struct {
    size_t off, len;
} Span;

typedef struct {
    char             *buf;      // (3 * len + 3,) escaped or cleaned text
    char             *word;     // (6 * len + 2,) one byte-level word
    Sym              *sym;      // (sym_cap,) symbols of one word
    Pair             *heap;     // (3 * sym_cap,) heap of candidate pairs
    size_t            sym_cap;
    Span             *span[2];  // (len + 1,) pieces before/after a pattern
    Frag             *frag;     // (frag_cap,) fragments of the text
    size_t            frag_cap;
    pcre2_match_data *md;
} Scratch;

typedef struct {
    int32_t *ids;               // caller's buffer
    int64_t  cap, n;            // n counts every token, written or not
} Out;

static void out_push(Out *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

static int scratch_init(Scratch *w, const Tokenizer *tk, size_t len,
                        Err *err)
{
    memset(w, 0, sizeof(*w));
    w->buf = malloc(3 * len + 3);
    w->frag_cap = 16;
    w->frag = malloc(w->frag_cap * sizeof(Frag));
    if (!w->buf || !w->frag) goto oom;
    if (tk->model == MODEL_BPE) {
        /* a cleaned byte may become a 2-byte byte-level character */
        w->word = malloc(6 * len + 2);
        w->span[0] = malloc((len + 1) * sizeof(Span));  // a span holds at
        w->span[1] = malloc((len + 1) * sizeof(Span));  //   least one char
        w->md = pcre2_match_data_create(1, NULL);
        if (!w->word || !w->span[0] || !w->span[1] || !w->md) goto oom;
    }
    return 0;
oom:
    return err_set(err, "out of memory encoding %zu bytes", len);
}

/* Room for the symbols of a word of n characters (each merge pushes at most
 * two pairs). */
static int scratch_reserve(Scratch *w, size_t n) {
    Sym  *sym;
    Pair *heap;

    if (n <= w->sym_cap) return 0;
    if ((sym = realloc(w->sym, n * sizeof(Sym))) == NULL) return -1;
    w->sym = sym;
    if ((heap = realloc(w->heap, 3 * n * sizeof(Pair))) == NULL) return -1;
    w->heap = heap;
    w->sym_cap = n;
    return 0;
}

static void scratch_free(Scratch *w) {
    free(w->buf);
    free(w->word);
    free(w->sym);
    free(w->heap);
    free(w->span[0]);
    free(w->span[1]);
    free(w->frag);
    pcre2_match_data_free(w->md);
}


/* ---- Encoding: special tokens ----------------------------------------------
 * Each special token, longest first, splits every raw fragment at each of
 * its occurrences, left to right. A bitmap of the byte pairs in the text
 * skips most tokens without searching. */

typedef struct {
    uint64_t bits[1024];        // byte pair (a << 8 | b) present in the text
    uint64_t bytes[4];          // single byte present
} PairSet;

static void pairs_build(PairSet *p, const uint8_t *s, size_t n) {
    memset(p, 0, sizeof(*p));
    for (size_t i = 0; i < n; i++) {
        p->bytes[s[i] >> 6] |= 1ULL << (s[i] & 63);
        if (i + 1 < n) {
            unsigned k = (unsigned) s[i] << 8 | s[i + 1];

            p->bits[k >> 6] |= 1ULL << (k & 63);
        }
    }
}

static bool pairs_may_hold(const PairSet *p, const uint8_t *t, size_t n) {
    unsigned k;

    if (n == 1) return (p->bytes[t[0] >> 6] >> (t[0] & 63)) & 1;
    k = (unsigned) t[0] << 8 | t[1];
    return (p->bits[k >> 6] >> (k & 63)) & 1;
}

static bool is_space(char c) {     // C isspace() in the "C" locale
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static int frag_push(Scratch *w, size_t *n, Frag f) {
    if (*n == w->frag_cap) {
        Frag *nf = realloc(w->frag, 2 * w->frag_cap * sizeof(Frag));

        if (nf == NULL) return -1;
        w->frag = nf;
        w->frag_cap *= 2;
    }
    w->frag[(*n)++] = f;
    return 0;
}

/* Splits the raw fragment f at every occurrence of token id, appending the
 * pieces; strip attributes eat whitespace next to the token. */
static int frag_split(const Tokenizer *tk, const char *text, Frag f,
                      int32_t id, Scratch *w, size_t *n)
{
    const char *t = tk->text[id];
    size_t      tl = tk->len[id], pos = f.off, end = f.off + f.len;
    const char *m;

    while ((m = memmem(text + pos, end - pos, t, tl)) != NULL) {
        size_t at = (size_t) (m - text), l = at - pos;

        if (tk->attr[id] & ATTR_LSTRIP) {
            while (l > 0 && is_space(text[pos + l - 1])) l--;
        }
        if (l > 0 && frag_push(w, n, (Frag) { pos, l, NO_TOKEN }) != 0) {
            return -1;
        }
        if (frag_push(w, n, (Frag) { 0, 0, id }) != 0) return -1;
        pos = at + tl;
        if ((tk->attr[id] & ATTR_RSTRIP) && pos < end) {
            while (pos < end && is_space(text[pos])) pos++;
        }
    }
    if (pos < end) return frag_push(w, n, (Frag) { pos, end - pos, NO_TOKEN });
    return 0;
}

/* Cuts one special token out of all fragments; the new list is built after
 * the old one in w->frag, then moved down. */
static int partition_one(const Tokenizer *tk, const char *text, int32_t id,
                         Scratch *w, size_t *n_frag)
{
    size_t n_old = *n_frag, n = n_old;

    for (size_t i = 0; i < n_old; i++) {
        Frag f = w->frag[i];
        int  rc = f.tok != NO_TOKEN ? frag_push(w, &n, f)
                                    : frag_split(tk, text, f, id, w, &n);

        if (rc != 0) return -1;
    }
    memmove(w->frag, w->frag + n_old, (n - n_old) * sizeof(Frag));
    *n_frag = n - n_old;
    return 0;
}

static int partition(const Tokenizer *tk, const char *text, size_t len,
                     bool parse_special, Scratch *w, size_t *n_frag,
                     Err *err)
{
    PairSet *ps;

    *n_frag = 0;
    if (len == 0) return 0;
    w->frag[(*n_frag)++] = (Frag) { 0, len, NO_TOKEN };
    if ((ps = malloc(sizeof(*ps))) == NULL) goto oom;
    pairs_build(ps, (const uint8_t *) text, len);
    for (int32_t k = 0; k < tk->n_special; k++) {
        int32_t     id = tk->special[k];
        const char *t = tk->text[id];
        size_t      tl = tk->len[id];

        if (!parse_special && (tk->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) {
            continue;
        }
        if (tl == 0 || tl > len || !pairs_may_hold(ps, (const uint8_t *) t, tl)
            || memmem(text, len, t, tl) == NULL)
        {
            continue;
        }
        if (partition_one(tk, text, id, w, n_frag) != 0) {
            free(ps);
            goto oom;
        }
    }
    free(ps);
    return 0;
oom:
    return err_set(err, "out of memory splitting special tokens");
}


/* ---- Encoding: merging -----------------------------------------------------
 * Shared by both models: symbols start as UTF-8 characters; the best pair
 * (SPM: highest score of the merged token; BPE: lowest merge rank; ties go
 * to the leftmost) is merged until no pair qualifies. A popped pair whose
 * symbols changed since it was pushed has a different size and is
 * skipped: a symbol only grows, by absorbing its right neighbour. */

static bool pair_before(const Pair *a, const Pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(Pair *h, size_t *n, Pair p) {
    size_t i = (*n)++;

    while (i > 0 && pair_before(&p, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = p;
}

static Pair heap_pop(Pair *h, size_t *n) {
    Pair   top = h[0], last = h[--(*n)];
    size_t i = 0;

    for (;;) {
        size_t c = 2 * i + 1;

        if (c >= *n) break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void pair_push(const Tokenizer *tk, const char *s, Scratch *w,
                      size_t *nh, int32_t left, int32_t right)
{
    const Sym *l, *r;
    float      score;

    if (left < 0 || right < 0) return;
    l = &w->sym[left];
    r = &w->sym[right];
    if (tk->model == MODEL_SPM) {
        int32_t id = vocab_find(tk, s + l->off, l->n + r->n);

        if (id == NO_TOKEN) return;
        score = tk->score[id];
    } else {
        int32_t rank = merge_rank(tk, s + l->off, l->n, s + r->off, r->n);

        if (rank < 0) return;
        score = -(float) rank;      // exact: ranks are below 2^24
    }
    heap_push(w->heap, nh, (Pair) { score, left, right, l->n + r->n });
}

/* Merges s[0..n) (n > 0); the result is the list through w->sym from 0.
 * Fails only for lack of memory. */
static int merge_symbols(const Tokenizer *tk, const char *s, size_t n,
                         Scratch *w)
{
    size_t ns = 0, nh = 0;

    for (size_t off = 0; off < n; off += utf8_lead_len((uint8_t) s[off])) ns++;
    if (scratch_reserve(w, ns) != 0) return -1;
    ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t k = utf8_lead_len((uint8_t) s[off]);

        if (k > n - off) k = n - off;
        w->sym[ns] = (Sym) { (int32_t) ns - 1,
                             off + k < n ? (int32_t) ns + 1 : -1,
                             (uint32_t) off, (uint32_t) k };
        off += k;
    }
    for (size_t i = 1; i < ns; i++) {
        pair_push(tk, s, w, &nh, (int32_t) i - 1, (int32_t) i);
    }
    while (nh > 0) {
        Pair p = heap_pop(w->heap, &nh);
        Sym *l = &w->sym[p.left], *r = &w->sym[p.right];

        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = p.left;
        pair_push(tk, s, w, &nh, l->prev, p.left);
        pair_push(tk, s, w, &nh, p.left, l->next);
    }
    return 0;
}

/* Emits the merged symbols; one that is not a token goes out byte by byte
 * (SPM: <0xXX>, else the unknown token; BPE: the byte's own token if any,
 * else nothing, as llama.cpp does). */
static void emit_symbols(const Tokenizer *tk, const char *s, Scratch *w,
                         Out *o)
{
    for (int32_t i = 0; i != -1; i = w->sym[i].next) {
        const Sym *y = &w->sym[i];
        int32_t    id = vocab_find(tk, s + y->off, y->n);

        if (id != NO_TOKEN) {
            out_push(o, id);
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            int32_t b = tk->byte_tok[(uint8_t) s[y->off + j]];

            if (b == NO_TOKEN && tk->model == MODEL_SPM) b = tk->sid[SID_UNK];
            if (b != NO_TOKEN) out_push(o, b);
        }
    }
}


/* ---- Encoding: SPM and BPE fragments ------------------------------------- */

static int spm_fragment(const Tokenizer *tk, const char *s, size_t n,
                        bool space_prefix, Scratch *w, Out *o)
{
    size_t m = 0;

    if (space_prefix) {
        memcpy(w->buf, U2581, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + m, U2581, 3);
            m += 3;
        } else {
            w->buf[m++] = s[i];
        }
    }
    if (m == 0) return 0;
    if (merge_symbols(tk, w->buf, m, w) != 0) return -1;
    emit_symbols(tk, w->buf, w, o);
    return 0;
}

/* Refines spans in[0..n_in) of s by one pattern: matches and the gaps
 * between them both become pieces; each span is matched as a whole subject,
 * so lookarounds and $ stop at its ends. Returns the piece count, or -1. */
static int64_t split_by(const pcre2_code *re, const char *s, const Span *in,
                        size_t n_in, Span *out, pcre2_match_data *md,
                        Err *err)
{
    size_t n = 0;

    for (size_t i = 0; i < n_in; i++) {
        PCRE2_SPTR subj = (PCRE2_SPTR) (s + in[i].off);
        size_t     len = in[i].len, start = 0, prev = 0;

        while (start <= len) {
            int         rc = pcre2_match(re, subj, len, start,
                                         PCRE2_NO_UTF_CHECK, md, NULL);
            PCRE2_SIZE *ov;

            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
                rc = pcre2_match(re, subj, len, start,
                                 PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
            }
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                char msg[128];

                pcre2_get_error_message(rc, (PCRE2_UCHAR *) msg, sizeof(msg));
                return err_set(err, "pre-tokenizer pattern failed: %s", msg);
            }
            ov = pcre2_get_ovector_pointer(md);
            if (ov[0] > prev) {                             // the gap
                out[n++] = (Span) { in[i].off + prev, ov[0] - prev };
            }
            if (ov[1] > ov[0]) {                            // the match
                out[n++] = (Span) { in[i].off + ov[0], ov[1] - ov[0] };
            }
            prev = ov[1];
            start = ov[1] > ov[0] ? ov[1]
                    : ov[1] + (ov[1] < len ? utf8_lead_len(subj[ov[1]]) : 1);
        }
        if (prev < len) out[n++] = (Span) { in[i].off + prev, len - prev };
    }
    return (int64_t) n;
}

static bool all_newlines(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\n') return false;
    }
    return true;
}

/* One pre-tokenized word: byte-level mapped (unless raw UTF-8), then merged;
 * with ignore_merges a word that is a token is taken whole. */
static int bpe_word(const Tokenizer *tk, const char *s, size_t n, Scratch *w,
                    Out *o)
{
    bool   raw = tk->pre_flags & PRE_RAW_UTF8;
    size_t m = 0;

    if (raw) {
        memcpy(w->word, s, n);
        m = n;
    } else {
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t) s[i];

            memcpy(w->word + m, tk->bl_utf8[b], tk->bl_len[b]);
            m += tk->bl_len[b];
        }
    }
    if ((tk->pre_flags & PRE_IGNORE_MERGES)
        || ((tk->pre_flags & PRE_NEWLINE_WORDS) && all_newlines(s, n)))
    {
        int32_t id = vocab_find(tk, w->word, m);

        if (id != NO_TOKEN) {
            out_push(o, id);
            return 0;
        }
    }
    if (merge_symbols(tk, w->word, m, w) != 0) return -1;
    emit_symbols(tk, w->word, w, o);
    return 0;
}

static int bpe_fragment(const Tokenizer *tk, const char *s, size_t n,
                        Scratch *w, Out *o, Err *err)
{
    size_t m = utf8_clean(s, n, w->buf, tk->pre_flags & PRE_RAW_UTF8);
    size_t ns = 1;
    int    cur = 0;

    if (m == 0) return 0;
    w->span[0][0] = (Span) { 0, m };
    for (int i = 0; i < tk->n_re; i++) {
        int64_t k = split_by(tk->re[i], w->buf, w->span[cur], ns,
                             w->span[1 - cur], w->md, err);

        if (k < 0) return -1;
        ns = (size_t) k;
        cur = 1 - cur;
    }
    for (size_t i = 0; i < ns; i++) {
        const Span *sp = &w->span[cur][i];

        if (bpe_word(tk, w->buf + sp->off, sp->len, w, o) != 0) {
            return err_set(err, "out of memory encoding a %zu-byte word",
                           sp->len);
        }
    }
    return 0;
}

int64_t tokenizer_encode(const Tokenizer *tk, const char *text, size_t len,
                         bool add_special, bool parse_special,
                         int32_t *out, int64_t cap, Err *err)
{
    Scratch w;
    Out     o = { out, cap, 0 };
    size_t  nf;
    bool    prev_special = true;    // SPM: the text start counts as special
    int     rc = 0;

    if (len > MAX_TEXT) {
        return err_set(err, "text of %zu bytes is too long to tokenize", len);
    }
    if (scratch_init(&w, tk, len, err) != 0
        || partition(tk, text, len, parse_special, &w, &nf, err) != 0)
    {
        scratch_free(&w);
        return -1;
    }
    if (add_special && tokenizer_adds_bos(tk)) out_push(&o, tk->sid[SID_BOS]);
    for (size_t i = 0; i < nf && rc == 0; i++) {
        const Frag *f = &w.frag[i];

        if (f->tok != NO_TOKEN) {
            out_push(&o, f->tok);
            prev_special = true;
        } else if (tk->model == MODEL_SPM) {
            rc = spm_fragment(tk, text + f->off, f->len,
                              tk->add_space_prefix && prev_special, &w, &o);
            if (rc != 0) err_set(err, "out of memory encoding %zu bytes", len);
            prev_special = false;
        } else {
            rc = bpe_fragment(tk, text + f->off, f->len, &w, &o, err);
        }
    }
    if (add_special && tk->add_eos && tk->sid[SID_EOS] != NO_TOKEN) {
        out_push(&o, tk->sid[SID_EOS]);
    }
    scratch_free(&w);
    return rc == 0 ? o.n : -1;
}


/* ---- Pieces ----------------------------------------------------------------
 * A piece is rendered through a callback, chunk by chunk, so the streaming
 * detokenizer needs no buffer of its own. */

typedef void (*PieceFn)(void *ud, const char *p, size_t n);

static void render_unescaped(const char *s, size_t n, PieceFn fn, void *ud) {
    const char *end = s + n, *m;

    while ((m = memmem(s, (size_t) (end - s), U2581, 3)) != NULL) {
        if (m > s) fn(ud, s, (size_t) (m - s));
        fn(ud, " ", 1);
        s = m + 3;
    }
    if (s < end) fn(ud, s, (size_t) (end - s));
}

/* Byte-level characters back to bytes; a character outside the alphabet is
 * rendered the way llama.cpp renders it, "[UNK_BYTE_0x<hex><token>]". */
static void render_byte_level(const Tokenizer *tk, const char *s, size_t n,
                              PieceFn fn, void *ud)
{
    char   buf[64], u[4], hex[16];
    size_t k = 0, un;

    for (size_t i = 0; i < n; ) {
        uint32_t cp;

        i += utf8_decode((const uint8_t *) s + i, n - i, &cp);
        if (cp < 324 && tk->bl_byte[cp] >= 0) {
            buf[k++] = (char) tk->bl_byte[cp];
            if (k == sizeof(buf)) {
                fn(ud, buf, k);
                k = 0;
            }
            continue;
        }
        if (k > 0) {
            fn(ud, buf, k);
            k = 0;
        }
        un = utf8_encode(cp, u);
        for (size_t j = 0; j < un; j++) {
            snprintf(hex + 2 * j, sizeof(hex) - 2 * j, "%02x", (uint8_t) u[j]);
        }
        fn(ud, "[UNK_BYTE_0x", 12);
        fn(ud, hex, 2 * un);
        fn(ud, s, n);
        fn(ud, "]", 1);
    }
    if (k > 0) fn(ud, buf, k);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void piece_render(const Tokenizer *tk, int32_t id, bool special,
                         PieceFn fn, void *ud)
{
    uint16_t    a = tk->attr[id];
    const char *s = tk->text[id];
    size_t      n = tk->len[id];

    if (!special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return;
    if (a & ATTR_SPECIAL) {
        fn(ud, s, n);
    } else if (a & ATTR_NORMAL) {
        if (tk->model == MODEL_SPM || (tk->pre_flags & PRE_RAW_UTF8)) {
            render_unescaped(s, n, fn, ud);
        } else {
            render_byte_level(tk, s, n, fn, ud);
        }
    } else if (a & ATTR_BYTE) {     // "<0xXX>"
        int  v = 0;
        char b;

        for (size_t i = 3; i < 5 && i < n && hex_digit(s[i]) >= 0; i++) {
            v = v * 16 + hex_digit(s[i]);
        }
        b = (char) v;
        fn(ud, &b, 1);
    }
}

typedef struct {
    char   *buf;
    size_t  cap, n;
} Copy;

static void copy_fn(void *ud, const char *p, size_t n) {
    Copy *c = ud;

    if (c->n + n <= c->cap) memcpy(c->buf + c->n, p, n);
    c->n += n;
}

size_t tokenizer_piece(const Tokenizer *tk, int32_t id, bool render_special,
                       char *buf, size_t cap)
{
    Copy c = { buf, cap, 0 };

    if (id < 0 || id >= tk->n_vocab) return 0;
    piece_render(tk, id, render_special, copy_fn, &c);
    return c.n;
}


/* ---- Streaming detokenizer -------------------------------------------------
 * Bytes go through a UTF-8 state machine: a character is written once its
 * last byte arrives; a byte that cannot continue the pending sequence turns
 * that sequence into one U+FFFD and is then looked at afresh (the "maximal
 * subpart" rule of Unicode, as browsers and Python decode). */

typedef struct {
    Detok *d;
    char  *out;
    size_t cap, n;
    bool   full;                // output was dropped for lack of room
} DetokOut;

static void detok_put(DetokOut *o, const void *p, size_t n) {
    if (o->full || o->n + n > o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->out + o->n, p, n);
    o->n += n;
}

static void detok_byte(DetokOut *o, uint8_t b) {
    Detok *d = o->d;

    for (;;) {
        if (d->n_pending == 0) {
            int need = utf8_need(b);

            if (need == 1) detok_put(o, &b, 1);
            else if (need == 0) detok_put(o, "\xef\xbf\xbd", 3);
            else d->pending[d->n_pending++] = b;
            return;
        }
        if (utf8_next_ok(d->pending[0], d->n_pending, b)) {
            d->pending[d->n_pending++] = b;
            if (d->n_pending == utf8_need(d->pending[0])) {
                detok_put(o, d->pending, (size_t) d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        detok_put(o, "\xef\xbf\xbd", 3);
        d->n_pending = 0;
    }
}

static void detok_fn(void *ud, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) detok_byte(ud, (uint8_t) p[i]);
}

void detok_init(Detok *d) {
    memset(d, 0, sizeof(*d));
}

size_t detok_push(Detok *d, const Tokenizer *tk, int32_t id, char *out,
                  size_t cap)
{
    DetokOut o = { d, out, cap, 0, false };

    if (id < 0 || id >= tk->n_vocab) return 0;
    piece_render(tk, id, false, detok_fn, &o);
    return o.n;
}

size_t detok_flush(Detok *d, char *out, size_t cap) {
    DetokOut o = { d, out, cap, 0, false };

    if (d->n_pending > 0) detok_put(&o, "\xef\xbf\xbd", 3);
    d->n_pending = 0;
    return o.n;
}

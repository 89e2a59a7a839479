/* tokenizer_pre.c -- BPE pre-tokenizers: the split patterns per
 * `tokenizer.ggml.pre`; see tokenizer_impl.h.
 *
 * Byte-level BPE does not merge across the whole text: the text is first
 * split into words by a list of PCRE2 patterns, each refining the pieces of
 * the previous one (tokenizer_encode.c runs them). Which patterns a model
 * uses is not in the GGUF; llama.cpp keys them on the `tokenizer.ggml.pre`
 * name, and this file is that table, copied from its llama-vocab.cpp so
 * that we split, and therefore tokenize, exactly as it does.
 *
 * Where we knowingly differ from llama.cpp: character classes come from
 * PCRE2's Unicode tables (Unicode 14 in PCRE2 10.42) rather than
 * llama.cpp's (Unicode 15): the characters added in Unicode 15, and U+180E,
 * which PCRE2 counts as \s, may split differently.
 * Pre-tokenizers whose llama.cpp behaviour no pattern reproduces are
 * refused by name: kimi-k2, afmoe, superbpe and tiny_aya (hand-written code
 * there), youtu (its \p{Lu}/\p{Ll} classes act as \p{L} there) and
 * whitespace (a different model). */

#include <string.h>

#include "tokenizer_impl.h"


/* ---- Patterns --------------------------------------------------------------
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

struct PreTok {
    const char *names;          // '|'-separated values of tokenizer.ggml.pre
    unsigned    flags;          // PRE_*
    const char *re[MAX_RE];     // split patterns, applied in order
};

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


/* ---- Lookup and compilation ---------------------------------------------- */

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

const PreTok *tok_pre_find(const char *name, size_t n, unsigned *flags,
                           Err *err)
{
    const PreTok *pre = pre_find(name, n);

    if (pre != NULL) {
        *flags = pre->flags;
        if (name_in("glm4|chatglm-bpe", name, n)) *flags |= PRE_NO_BOS;
        return pre;
    }
    if (name_in(pre_unsupported, name, n)) {
        err_set(err, "pre-tokenizer '%.*s' is not supported", (int) n, name);
    } else {
        err_set(err, "unknown pre-tokenizer '%.*s'", (int) n, name);
    }
    return NULL;
}

/* Compiles the patterns once; JIT when PCRE2 has it, else the interpreter. */
int tok_pre_compile(Tokenizer *tk, const PreTok *pre, Err *err) {
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

/* tokenizer_impl.h -- what the tokenizer's source files share; not an API.
 *
 * The tokenizer of tokenizer.h is four files, one job each:
 *   tokenizer.c         construction from GGUF metadata: the token and
 *                       merge hash tables, special ids, flags, end of
 *                       generation; tokenizer_new/free and the getters
 *   tokenizer_pre.c     the pre-tokenizer patterns per `tokenizer.ggml.pre`
 *   tokenizer_encode.c  text -> ids (tokenizer_encode)
 *   detok.c             ids -> text (tokenizer_piece, the streaming detok_*)
 * They share struct Tokenizer, defined here so that encoding and decoding
 * read its tables directly, and the few tok_* functions below. Only those
 * four files include this header; the rest of the engine sees the opaque
 * Tokenizer of tokenizer.h.
 *
 * Invariant: a Tokenizer is written only while tokenizer_new builds it
 * (tok_pre_compile included). Every function after that only reads it,
 * which is what lets one Tokenizer serve any number of threads. */

#ifndef OMNI_TOKENIZER_IMPL_H
#define OMNI_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

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


/* ---- Lookups (tokenizer.c) ----------------------------------------------- */

/* Id of the token whose text is exactly s[0..n), or NO_TOKEN. One hash and
 * a short probe of a table at most half full; allocates nothing, can't
 * fail. */
int32_t tok_vocab_find(const Tokenizer *tk, const char *s, size_t n);

/* Rank of the BPE merge of l[0..ln) with r[0..rn), or -1 when there is
 * none; a lower rank merges first. Only for MODEL_BPE (an SPM tokenizer has
 * no merge table). Allocates nothing, can't fail. */
int32_t tok_merge_rank(const Tokenizer *tk, const char *l, size_t ln,
                       const char *r, size_t rn);


/* ---- Pre-tokenizers (tokenizer_pre.c) ------------------------------------ */

typedef struct PreTok PreTok;

/* The pre-tokenizer for the `tokenizer.ggml.pre` value name[0..n), and in
 * *flags its PRE_* bits. Returns a pointer into a static table, or NULL
 * with err set, naming it, when llama.cpp knows the name but we refuse it
 * or nobody knows it. */
const PreTok *tok_pre_find(const char *name, size_t n, unsigned *flags,
                           Err *err);

/* Compiles pre's split patterns into tk->re, counting them in tk->n_re so
 * that tokenizer_free releases exactly what was compiled, even after a
 * failure. Returns 0, or -1 with err set when a pattern does not compile
 * (our table is wrong, or PCRE2 lacks Unicode support). */
int tok_pre_compile(Tokenizer *tk, const PreTok *pre, Err *err);


/* ---- UTF-8 well-formedness (tokenizer_encode.c and detok.c) ---------------
 * One definition for both directions, so that the encoder's U+FFFD
 * replacement and the detokenizer's agree on what is a valid sequence.
 * Inline: they run once per byte of text. */

/* Length of a well-formed sequence starting with lead byte c: 1-4, or 0 when
 * c can never start one. */
static inline int tok_utf8_need(uint8_t c) {
    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) return 2;
    if (c < 0xf0) return 3;
    return c < 0xf5 ? 4 : 0;
}

/* Whether b may be byte i (>= 1) of a sequence led by c; the second byte's
 * range excludes overlong forms, surrogates and code points past U+10FFFF. */
static inline bool tok_utf8_next_ok(uint8_t c, int i, uint8_t b) {
    uint8_t lo = 0x80, hi = 0xbf;

    if (i == 1) {
        if (c == 0xe0) lo = 0xa0;
        else if (c == 0xed) hi = 0x9f;
        else if (c == 0xf0) lo = 0x90;
        else if (c == 0xf4) hi = 0x8f;
    }
    return b >= lo && b <= hi;
}

#endif

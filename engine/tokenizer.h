/* tokenizer.h -- text <-> token ids, from a GGUF's tokenizer metadata.
 *
 * Two models, as llama.cpp reads them from `tokenizer.ggml.model`:
 *   "llama"  SentencePiece (SPM): score-driven bigram merges over UTF-8
 *            characters, spaces shown as U+2581, byte fallback <0xXX>.
 *   "gpt2"   byte-level BPE: a pre-tokenizer regex (chosen by
 *            `tokenizer.ggml.pre`, run with PCRE2 and Unicode properties)
 *            splits the text, each piece is mapped to byte-level unicode and
 *            merged by `tokenizer.ggml.merges` rank.
 * Special tokens (control/user-defined types) are matched as whole strings
 * before either model runs, when parse_special is set.
 *
 * The Tokenizer borrows the GGUF's strings (the GGUF must outlive it) and
 * owns its lookup tables. Encoding and decoding are read-only on it, so one
 * Tokenizer serves any number of threads. */

#ifndef OMNI_TOKENIZER_H
#define OMNI_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "log.h"

typedef struct Tokenizer Tokenizer;

/* Builds a tokenizer from g's metadata. Returns NULL with err set when the
 * metadata is missing, inconsistent, or names an unsupported model or
 * pre-tokenizer. */
Tokenizer *tokenizer_new(const GGUF *g, Err *err);
void       tokenizer_free(Tokenizer *tk);

int32_t    tokenizer_n_vocab(const Tokenizer *tk);
int32_t    tokenizer_bos(const Tokenizer *tk);          // -1 when none
int32_t    tokenizer_eos(const Tokenizer *tk);          // -1 when none
/* Whether encoding with add_special prepends BOS (`add_bos_token`, default
 * true for SPM, false for BPE unless set) and appends EOS. */
bool       tokenizer_adds_bos(const Tokenizer *tk);
/* True for every end-of-generation token: EOS, EOT, and the usual
 * end-of-turn markers (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, ...)
 * present in the vocabulary. */
bool       tokenizer_is_eog(const Tokenizer *tk, int32_t id);
/* Id of a token whose text is exactly s, or -1. */
int32_t    tokenizer_find(const Tokenizer *tk, const char *s);

/* Encodes len bytes of text into out (cap entries). add_special adds BOS /
 * EOS as the model's metadata asks; parse_special makes special-token text
 * ("<|im_start|>") encode as that token instead of as characters.
 * Returns the number of tokens, which may exceed cap (then only cap were
 * written and the caller retries with a larger buffer), or -1 with err set
 * (invalid UTF-8 is not an error: it is encoded through byte tokens). */
int64_t    tokenizer_encode(const Tokenizer *tk, const char *text, size_t len,
                            bool add_special, bool parse_special,
                            int32_t *out, int64_t cap, Err *err);

/* The bytes token id stands for: SPM's U+2581 becomes a space, <0xXX> the
 * byte, byte-level BPE characters their bytes; control tokens render as
 * nothing unless render_special. Returns the byte length, which may exceed
 * cap (then nothing useful was written); never fails for a valid id. */
size_t     tokenizer_piece(const Tokenizer *tk, int32_t id, bool render_special,
                           char *buf, size_t cap);


/* ---- Streaming detokenizer -------------------------------------------------
 * Turns a stream of generated ids into UTF-8 text without ever emitting part
 * of a character: bytes of an incomplete sequence are held until it
 * completes. Invalid sequences are emitted as U+FFFD, so output is always
 * valid UTF-8. The first piece after the prompt keeps its leading space
 * (llama.cpp prints it too). */

typedef struct {
    unsigned char pending[8];   // bytes of an unfinished character
    int           n_pending;
} Detok;

void   detok_init(Detok *d);
/* Appends the text of id to out (cap bytes, at least 64 + the longest
 * piece); returns bytes written. */
size_t detok_push(Detok *d, const Tokenizer *tk, int32_t id, char *out,
                  size_t cap);
/* Emits what is still pending (as U+FFFD) at the end of a stream. */
size_t detok_flush(Detok *d, char *out, size_t cap);

#endif

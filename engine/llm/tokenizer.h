/* tokenizer.h -- text <-> token ids, from a GGUF's tokenizer metadata.
 *
 * The ids are llama.cpp's for the same file (its tokenizer test vectors are
 * the unit test). Models, as llama.cpp reads `tokenizer.ggml.model`:
 *   "llama"  SentencePiece (SPM): score-driven bigram merges over UTF-8
 *            characters, spaces shown as U+2581, byte fallback <0xXX>.
 *   "gpt2"   byte-level BPE: pre-tokenizer patterns (chosen by
 *            `tokenizer.ggml.pre`, run with PCRE2 and Unicode properties)
 *            split the text, each piece is mapped to byte-level unicode and
 *            merged by `tokenizer.ggml.merges` rank.
 *   "gemma4" BPE over raw UTF-8 with spaces as U+2581.
 * Special tokens are cut out of the text as whole strings before either
 * model runs: user-defined ones always, control ones when parse_special is
 * set (llama.cpp and Hugging Face both do this).
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

/* Builds a tokenizer from g's metadata: hash tables for token text -> id
 * and merge -> rank, compiled pre-tokenizer patterns; about 50 ms for a
 * 150k-token vocabulary. Returns NULL with err set ("PATH: tokenizer: ...")
 * when the metadata is missing, inconsistent, or names a model or
 * pre-tokenizer we do not support (the message names it). */
Tokenizer *tokenizer_new(const GGUF *g, Err *err);
void       tokenizer_free(Tokenizer *tk);

int32_t    tokenizer_n_vocab(const Tokenizer *tk);
int32_t    tokenizer_bos(const Tokenizer *tk);          // -1 when none
int32_t    tokenizer_eos(const Tokenizer *tk);          // -1 when none
/* Whether encoding with add_special prepends BOS: `add_bos_token`, by
 * default true for SPM and for the llama3, tekken, chameleon and gemma4
 * pre-tokenizers, false for other BPE. (EOS is appended when
 * `add_eos_token` says so, false by default.) */
bool       tokenizer_adds_bos(const Tokenizer *tk);
/* True for every end-of-generation token, the set llama.cpp computes: EOS,
 * EOT, EOM, the usual end-of-turn markers (<|eot_id|>, <|im_end|>, <|end|>,
 * <end_of_turn>, ...) present in the vocabulary, and the FIM pad/repo/
 * file-separator tokens. False for ids outside the vocabulary. */
bool       tokenizer_is_eog(const Tokenizer *tk, int32_t id);
/* Id of a token whose text is exactly s, or -1. */
int32_t    tokenizer_find(const Tokenizer *tk, const char *s);
/* Whether id is one of the special tokens encoding cuts out of the text
 * as whole strings (control, user-defined, unknown; control ones only
 * with parse_special). False for ids outside the vocabulary. */
bool       tokenizer_is_special(const Tokenizer *tk, int32_t id);
/* Whether SPM's dummy prefix is on: each stretch of plain text that
 * starts the text or follows a special token is encoded with a space
 * before it, one the text does not have (its first token's piece starts
 * with it). */
bool       tokenizer_space_prefix(const Tokenizer *tk);

/* Encodes len bytes of text into out (cap entries). add_special adds BOS /
 * EOS as the model's metadata asks; parse_special makes control-token text
 * ("<|im_start|>") encode as that token instead of as characters.
 * Returns the number of tokens, which may exceed cap (then only cap were
 * written and the caller retries with a larger buffer), or -1 with err set
 * (out of memory, or text over 512 MiB). Invalid UTF-8 is not an error:
 * SPM encodes its bytes through byte tokens, BPE first turns each bad byte
 * into U+FFFD, as llama.cpp does. Allocates working memory proportional to
 * len (up to about 70 bytes per byte of text) and frees it before
 * returning, so tokenize prompts outside the step loop. */
int64_t    tokenizer_encode(const Tokenizer *tk, const char *text, size_t len,
                            bool add_special, bool parse_special,
                            int32_t *out, int64_t cap, Err *err);

/* As tokenizer_encode, but encoding may stop once more than cap tokens
 * are found: returns the count when it is at most cap, else cap + 1,
 * meaning "more than cap". BPE text is consumed left to right and stops
 * within the word that passes cap, so refusing a prompt too long for a
 * context costs about a context's worth of text, not the whole text; SPM
 * merges a fragment (text between special tokens) as a whole, so there
 * only the prompt bound below limits the work. */
int64_t    tokenizer_encode_upto(const Tokenizer *tk, const char *text,
                                 size_t len, bool add_special,
                                 bool parse_special, int32_t *out,
                                 int64_t cap, Err *err);

/* What lets a caller refuse text that cannot fit n tokens without encoding
 * it: every token tokenizer_encode emits (BOS and EOS aside) covers at most
 * *max_piece bytes of the text, so text of more than n * *max_piece bytes
 * needs more than n tokens. With *ws_free, whitespace (C isspace) next to
 * a special token may be absorbed by it (strip attributes, as Phi-3 sets
 * them): count only the other bytes then. *max_piece is 0 when there is
 * no bound: a vocabulary lacking the byte tokens some text falls back to
 * drops those bytes. Walks the vocabulary, and the merges of a byte-level
 * BPE without raw byte tokens (tens of ms for 500k merges): call it once.
 * Can't fail. */
void       tokenizer_text_bound(const Tokenizer *tk, uint32_t *max_piece,
                                bool *ws_free);

/* The bytes token id stands for: SPM's U+2581 becomes a space, <0xXX> the
 * byte, byte-level BPE characters their bytes; control tokens render as
 * nothing unless render_special, user-defined ones always as their text.
 * Returns the byte length, which may exceed cap (then nothing useful was
 * written); 0 for an id outside the vocabulary. Can't fail. */
size_t     tokenizer_piece(const Tokenizer *tk, int32_t id, bool render_special,
                           char *buf, size_t cap);


/* ---- Streaming detokenizer -------------------------------------------------
 * Turns a stream of generated ids into UTF-8 text without ever emitting part
 * of a character: bytes of an incomplete sequence are held until it
 * completes. Invalid sequences are emitted as U+FFFD (one per maximal
 * invalid subpart, as Unicode recommends), so output is always valid UTF-8.
 * Pieces are rendered as tokenizer_piece(render_special = false) does: no
 * text for control tokens. The first piece after the prompt keeps its
 * leading space (llama.cpp prints it too). */

typedef struct {
    unsigned char pending[8];   // bytes of an unfinished character
    int           n_pending;
} Detok;

void   detok_init(Detok *d);
/* Writes the text that id completes to out (cap bytes, at least 64 + the
 * longest piece; a piece full of invalid bytes may need 3 bytes per byte)
 * and returns the bytes written, 0 while a character is incomplete or for
 * an id outside the vocabulary. Characters that do not fit in cap are
 * dropped whole. Allocates nothing. */
size_t detok_push(Detok *d, const Tokenizer *tk, int32_t id, char *out,
                  size_t cap);
/* Emits what is still pending (as one U+FFFD, 3 bytes) at the end of a
 * stream and resets d; returns the bytes written. */
size_t detok_flush(Detok *d, char *out, size_t cap);

#endif

/* prefix_keys.h -- the prefix keys of a chat request (proto/prefix_key.h)
 * and the part of its prompt each one names in the KV cache: what the
 * engine publishes for nginx's prefix-aware routing.
 *
 * Key i names messages 0..i. What the engine holds of them is the prompt's
 * tokens that lie wholly inside their rendering (chat_render's ends[i]),
 * T_i, rounded down to whole KV blocks: tokens_i = floor(T_i / bs) * bs.
 * Those blocks are held when the last of them is, block tokens_i / bs - 1,
 * whose chain hash (kv_root_hash of the salt, then kv_block_hash per
 * block, exactly as the scheduler computes them) is the key's anchor: the
 * prefix index (thinker/prefix_index.h) asks the KV cache whether the
 * anchor is published (the LRU list evicts a sequence's tail before its
 * head, so the last block going is what the prefix losing looks like). A
 * key with T_i < bs names no whole block and is not published.
 *
 * Token counts come from the byte offsets without tokenizing any prefix
 * again (that would be quadratic in the conversation): one walk over the
 * prompt's tokens, each token's piece matched against the rendered text.
 * The text and the pieces differ in known ways only, each accounted for:
 * a BOS token (no text), SentencePiece's dummy-prefix space (a space the
 * text lacks, at the start of each stretch of plain text), whitespace a
 * special token with a strip attribute ate, an EOS appended. Anything else
 * (a vocabulary that renders a token as other bytes than it encoded) and
 * the walk fails: the request publishes nothing, which is always safe.
 *
 * Everything here only reads its inputs and allocates nothing, so the
 * thinker runs it while it prepares a request, on either thread. */

#ifndef OMNI_PREFIX_KEYS_H
#define OMNI_PREFIX_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "prefix_key.h"
#include "request.h"
#include "tokenizer.h"

/* One key a request is published under. */
typedef struct {
    OmniPkey key;
    uint64_t anchor;            // chain hash of the last whole block
    int32_t  tokens;            // tokens of whole blocks (a multiple of
                                //   the block size, >= it): the TOKENS
                                //   published
    int32_t  msg;               // its last message: it names 0..msg
} PrefixKey;

/* How many of r's messages take part in its key chain: those before the
 * first one with audio (its text is a transcript nginx does not have).
 * 0 for a request without messages. Can't fail. */
int      pkeys_chain_len(const OmniRequest *r);

/* The root of r's chain (its model, "" when absent, and cache_salt, ""
 * when absent), and one step of the chain: key i from key i - 1 (or the
 * root) and message i. Can't fail. */
OmniPkey pkeys_root(const OmniRequest *r);
OmniPkey pkeys_next(OmniPkey prev, const ChatMsg *m);

/* Replaces each of the n_at ascending byte offsets at[] into text (len
 * bytes, what toks[0..n) encodes, BOS and special tokens parsed as the
 * thinker encodes a chat prompt) with the number of tokens that end at or
 * before it. Returns 0, or -1 with err set (naming the token and the byte)
 * when the tokens' pieces cannot be reconciled with the text; at[] is
 * then partly rewritten. O(len + n). */
int      pkeys_bytes_to_tokens(const Tokenizer *tk, const char *text,
                               size_t len, const int32_t *toks, int64_t n,
                               size_t *at, int n_at, Err *err);

/* The keys r's prompt is published under, into out (OMNI_PKEY_MAX
 * entries): of the chain's keys, those omni_pkey_used() selects and that
 * name at least one whole block. counts[i] is T_i, the tokens of toks
 * inside messages 0..i (pkeys_bytes_to_tokens over chat_render's ends),
 * for each i < pkeys_chain_len(r); bs is the KV block size. Returns how
 * many. Can't fail. */
int      pkeys_request(const OmniRequest *r, const size_t *counts,
                       const int32_t *toks, int64_t n, int bs,
                       PrefixKey *out);

#endif

/* prefix_key.h -- the names of conversation prefixes, computed alike by the
 * nginx module (which routes a request to the engine holding its longest
 * prefix) and by the engine (which publishes the prefixes its KV cache
 * holds), without tokenizing on nginx's side.
 *
 * A chat request's keys are a hash chain over its normalized messages:
 *
 *   root   = H("omni-prefix-1", model, cache_salt)
 *   key[i] = H(key[i-1] or root, role of message i, content of message i)
 *
 * so key[i] names messages 0..i of this model and salt, and nothing else:
 * two requests share key[i] exactly when their first i+1 messages are the
 * same. The salt (the request's "cache_salt", from prompt_cache_key) is in
 * every key, so requests of different salts never share one, as they never
 * share KV blocks. Fields go in with their lengths, so no two different
 * inputs are the same stream of bytes.
 *
 * What goes in is what the engine's chat template sees (engine/request/
 * request.h): "model" as the request names it ("" when absent); the role
 * as chat.h spells it ("developer" is "system"); the content, an array's
 * text parts joined with "\n". A message with audio (an input_audio part,
 * or an assistant's "audio" id) ends the chain: its text is a transcript
 * nginx does not have, so neither side names it or anything after it.
 *
 * H is XXH3's 128-bit hash (libxxhash, Debian's libxxhash-dev): fast (the
 * module hashes every message of every routed request) and wide enough
 * that a collision between two conversations is not a concern. A key is
 * written as 32 lowercase hex digits, high half first.
 *
 * In Redis (the engine writes, nginx reads; NS is the namespace, "omni:"
 * by default):
 *
 *   NS px:ROUTE:HEX   "TOKENS"   the engine named ROUTE holds the KV of
 *                                the prefix HEX names, TOKENS tokens of
 *                                it; expires unless refreshed
 *   NS load:ROUTE     "RUNNING WAITING MAX_SEQS"
 *                                its thinker's load, refreshed each second
 *
 * ROUTE is the engine's name in nginx's upstream block: "unix:/path" for
 * a Unix socket (its --socket, unless --route-id says otherwise),
 * "host:port" for TCP. */

#ifndef OMNI_PREFIX_KEY_H
#define OMNI_PREFIX_KEY_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY     /* XXH3_state_t on the stack */
#include <xxhash.h>

#define OMNI_PKEY_HEX       32      /* a key's hex digits */
#define OMNI_PKEY_MAX       64      /* keys a request is looked up by and
                                       published under, at most: the
                                       first 16 and the last 48 of a
                                       longer conversation */
#define OMNI_PKEY_HEAD      16

typedef struct {
    uint64_t hi;
    uint64_t lo;
} OmniPkey;

/* A key being computed: the previous key, then the fields of a message. */
typedef struct {
    XXH3_state_t st;
} OmniPkeyHash;

static inline void omni_pkey_put_len(OmniPkeyHash *h, uint64_t n) {
    uint8_t b[8];

    for (int i = 0; i < 8; i++) b[i] = (uint8_t) (n >> (8 * i));
    XXH3_128bits_update(&h->st, b, sizeof(b));
}

static inline void omni_pkey_put(OmniPkeyHash *h, const void *p, size_t n) {
    if (n > 0) XXH3_128bits_update(&h->st, p, n);
}

static inline OmniPkey omni_pkey_digest(OmniPkeyHash *h) {
    XXH128_hash_t d = XXH3_128bits_digest(&h->st);
    OmniPkey      k = { d.high64, d.low64 };

    return k;
}

/* The root of a chat request's chain: its model and salt. */
static inline OmniPkey omni_pkey_root(const char *model, size_t model_len,
                                      const char *salt, size_t salt_len)
{
    static const char tag[] = "omni-prefix-1";
    OmniPkeyHash      h;

    XXH3_128bits_reset(&h.st);
    omni_pkey_put_len(&h, sizeof(tag) - 1);
    omni_pkey_put(&h, tag, sizeof(tag) - 1);
    omni_pkey_put_len(&h, model_len);
    omni_pkey_put(&h, model, model_len);
    omni_pkey_put_len(&h, salt_len);
    omni_pkey_put(&h, salt, salt_len);
    return omni_pkey_digest(&h);
}

/* The next key begins: the previous one and the message's role, then
 * content_len bytes of content in as many omni_pkey_put() calls as suit
 * the caller (the module feeds text parts and their "\n"s), then
 * omni_pkey_digest(). */
static inline void omni_pkey_begin(OmniPkeyHash *h, OmniPkey prev,
                                   const char *role, size_t role_len,
                                   size_t content_len)
{
    uint8_t b[16];

    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t) (prev.hi >> (56 - 8 * i));
        b[8 + i] = (uint8_t) (prev.lo >> (56 - 8 * i));
    }
    XXH3_128bits_reset(&h->st);
    omni_pkey_put(h, b, sizeof(b));
    omni_pkey_put_len(h, role_len);
    omni_pkey_put(h, role, role_len);
    omni_pkey_put_len(h, content_len);
}

/* The whole step for content in one piece. */
static inline OmniPkey omni_pkey_next(OmniPkey prev, const char *role,
                                      size_t role_len, const char *content,
                                      size_t content_len)
{
    OmniPkeyHash h;

    omni_pkey_begin(&h, prev, role, role_len, content_len);
    omni_pkey_put(&h, content, content_len);
    return omni_pkey_digest(&h);
}

/* 32 lowercase hex digits at out (no NUL); returns out + 32. */
static inline char *omni_pkey_hex(char *out, OmniPkey k) {
    static const char hex[] = "0123456789abcdef";

    for (int i = 0; i < 16; i++) {
        out[i] = hex[(k.hi >> (60 - 4 * i)) & 0xf];
        out[16 + i] = hex[(k.lo >> (60 - 4 * i)) & 0xf];
    }
    return out + OMNI_PKEY_HEX;
}

/* Which of n keys (n > OMNI_PKEY_MAX) take part: the first OMNI_PKEY_HEAD
 * and the last OMNI_PKEY_MAX - OMNI_PKEY_HEAD. A long conversation's
 * shared beginning (a system prompt) and its latest turns are what an
 * engine may hold; the middle of it without its end is rarely the longest
 * prefix held. Returns whether key i (0-based) is one of them. */
static inline int omni_pkey_used(size_t i, size_t n) {
    return n <= OMNI_PKEY_MAX || i < OMNI_PKEY_HEAD
           || i >= n - (OMNI_PKEY_MAX - OMNI_PKEY_HEAD);
}

#endif

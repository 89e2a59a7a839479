/* prefix_keys.c -- a chat request's prefix keys, the tokens each names and
 * their anchors; see prefix_keys.h.
 *
 * The walk of pkeys_bytes_to_tokens keeps one position in the text and
 * matches each token's piece there. A piece is rendered with special
 * tokens as their text (tokenizer_piece with render_special), which is how
 * they stood in the rendered prompt before encoding cut them out. The
 * allowances, in the order the encoder makes the differences:
 *
 *   BOS        token 0 when the tokenizer adds one: no text
 *   dummy      SPM with add_space_prefix: the first piece of each stretch
 *              of plain text (at the start, or after a special token)
 *              starts with a space that is not in the text
 *   strip      a special token with lstrip/rstrip ate the whitespace next
 *              to it (Phi-3): a piece that does not match where the
 *              text has whitespace next to a special token matches past
 *              it; the whitespace counts as the special token's
 *   EOS        a special token after the whole text: appended, no text
 *
 * A token "ends" where its bytes end; the tokens inside a prefix of the
 * text are those that end at or before its end (a token straddling a
 * message's end is not inside it), but for a token of no width (a dummy
 * space the merges left alone) right at the end: it is the start of the
 * text after it, which a request ending there does not have. */

#include <string.h>

#include "kv_cache.h"
#include "prefix_keys.h"

#define PIECE_MAX 2048          // longer pieces fail the walk


/* ---- The key chain ------------------------------------------------------ */

int pkeys_chain_len(const OmniRequest *r) {
    int n = 0;

    if (!r->chat) return 0;
    while (n < r->n_msgs && !(r->has_audio != NULL && r->has_audio[n])) n++;
    return n;
}

OmniPkey pkeys_root(const OmniRequest *r) {
    const char *model = r->model != NULL ? r->model : "";
    const char *salt = r->cache_salt != NULL ? r->cache_salt : "";

    return omni_pkey_root(model, strlen(model), salt,
                          r->cache_salt != NULL ? r->cache_salt_len : 0);
}

OmniPkey pkeys_next(OmniPkey prev, const ChatMsg *m) {
    return omni_pkey_next(prev, m->role, strlen(m->role), m->content,
                          strlen(m->content));
}


/* ---- Byte offsets to token counts --------------------------------------- */

static bool ws(char c) {            // C isspace, as the tokenizer strips
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The walk's state: where it is in the text and whether a stretch of plain
 * text starts there. */
typedef struct {
    const char *text;
    size_t      len;
    size_t      pos;
    bool        frag_start;         // at the text's start or after a
                                    //   special token
    bool        after_special;
} Walk;

/* Whether p (n bytes) stands at w->pos, or past whitespace there when
 * strip allows it; moves w->pos past it. */
static bool match_at(Walk *w, const char *p, size_t n, bool strip) {
    size_t at = w->pos;

    for (;;) {
        if (at + n <= w->len && memcmp(w->text + at, p, n) == 0) {
            w->pos = at + n;
            return true;
        }
        if (!strip || at >= w->len || !ws(w->text[at])) return false;
        at++;
    }
}

/* Moves w past token id. Returns false when its piece is not there. */
static bool walk_token(Walk *w, const Tokenizer *tk, int32_t id,
                       bool last)
{
    char        buf[PIECE_MAX];
    size_t      n = tokenizer_piece(tk, id, true, buf, sizeof(buf));
    const char *p = buf;
    bool        special = tokenizer_is_special(tk, id);

    if (n > sizeof(buf)) return false;
    if (special) {
        if (last && w->pos == w->len) return true;     // an EOS appended
        if (!match_at(w, p, n, true)) return false;
    } else {
        if (w->frag_start && tokenizer_space_prefix(tk) && n > 0
            && p[0] == ' ')
        {
            p++;
            n--;
        }
        if (!match_at(w, p, n, w->after_special)) return false;
    }
    w->frag_start = special;
    w->after_special = special;
    return true;
}

int pkeys_bytes_to_tokens(const Tokenizer *tk, const char *text, size_t len,
                          const int32_t *toks, int64_t n, size_t *at,
                          int n_at, Err *err)
{
    Walk    w = { text, len, 0, true, false };
    int64_t k = 0;
    int     j = 0;

    if (n > 0 && tokenizer_adds_bos(tk) && toks[0] == tokenizer_bos(tk)) {
        k = 1;
    }
    for (; k < n; k++) {
        size_t from = w.pos;

        if (!walk_token(&w, tk, toks[k], k == n - 1)) {
            return err_set(err, "token %" PRId64 " (id %d) does not match "
                           "the text at byte %zu of %zu", k, toks[k], from,
                           len);
        }
        /* a token of no width (a dummy space alone) goes with the text
           after it, so one right at an end is not inside */
        while (j < n_at && (at[j] < w.pos
                            || (at[j] == w.pos && w.pos == from)))
        {
            at[j++] = (size_t) k;
        }
    }
    while (w.pos < len && w.after_special && ws(text[w.pos])) w.pos++;
    if (w.pos != len) {
        return err_set(err, "the tokens cover %zu of the text's %zu bytes",
                       w.pos, len);
    }
    while (j < n_at) at[j++] = (size_t) n;
    return 0;
}


/* ---- The keys a request is published under ------------------------------ */

int pkeys_request(const OmniRequest *r, const size_t *counts,
                  const int32_t *toks, int64_t n, int bs, PrefixKey *out)
{
    int      n_chain = pkeys_chain_len(r), n_out = 0;
    OmniPkey key = pkeys_root(r);
    uint64_t hash = kv_root_hash(r->cache_salt, r->cache_salt != NULL
                                                 ? r->cache_salt_len : 0);
    int64_t  hashed = 0;                // blocks the chain hash covers

    for (int i = 0; i < n_chain; i++) {
        int64_t blocks = (int64_t) counts[i] / bs;

        key = pkeys_next(key, &r->msgs[i]);
        if (!omni_pkey_used((size_t) i, (size_t) n_chain) || blocks < 1
            || n_out == OMNI_PKEY_MAX)
        {
            continue;
        }
        if (blocks * bs > n) blocks = n / bs;       // believed unreachable
        for (; hashed < blocks; hashed++) {
            hash = kv_block_hash(hash, toks + hashed * bs, bs);
        }
        out[n_out].key = key;
        out[n_out].anchor = hash;
        out[n_out].tokens = (int32_t) (blocks * bs);
        out[n_out].msg = i;
        n_out++;
    }
    return n_out;
}

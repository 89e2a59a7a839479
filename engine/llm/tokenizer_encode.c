/* tokenizer_encode.c -- text -> token ids (tokenizer_encode), as llama.cpp
 * encodes it; see tokenizer.h and tokenizer_impl.h.
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
 *      pre-tokenizer patterns (tokenizer_pre.c; PCRE2, Unicode properties,
 *      each pattern refining the pieces of the previous one, unmatched gaps
 *      kept as pieces), each word is mapped to GPT-2's byte-level characters
 *      and its symbols are merged lowest merge rank first. The refinement
 *      runs depth first, each word merged as soon as the last pattern has
 *      cut it, so the text is consumed from left to right and encoding can
 *      stop at a token limit without matching the rest (the words and
 *      their order are those of refining the whole text pattern by
 *      pattern).
 *
 * Both merge loops keep symbols in an array linked as a list and candidate
 * pairs in a binary heap, so a word of n characters costs O(n log n); a
 * stale heap entry is recognised by its size and skipped. Token and merge
 * lookups are the hash tables of tokenizer.c (tok_vocab_find,
 * tok_merge_rank).
 *
 * Where we knowingly differ from llama.cpp: BPE text is made valid UTF-8
 * first, each byte that does not start a well-formed sequence becoming
 * U+FFFD. llama.cpp does the same for most bad input but lets overlong forms
 * and surrogates through. */

#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

#define MAX_TEXT           (UINT32_MAX / 8)    // symbol offsets are 32-bit
                                                //   over up to 6x the text


/* ---- UTF-8 ------------------------------------------------------------- */

/* Bytes in the character a lead byte announces, as llama.cpp counts them
 * (a stray continuation byte counts as one). */
static size_t utf8_lead_len(uint8_t c) {
    static const uint8_t len[16] = { 1,1,1,1,1,1,1,1,1,1,1,1,2,2,3,4 };

    return len[c >> 4];
}

static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    int need = tok_utf8_need(s[0]);

    if (need == 0 || (size_t) need > n) return 0;
    for (int i = 1; i < need; i++) {
        if (!tok_utf8_next_ok(s[0], i, s[i])) return 0;
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
    char             *buf;      // (3 * len + 3,) escaped or cleaned text
    char             *word;     // (6 * len + 2,) one byte-level word
    Sym              *sym;      // (sym_cap,) symbols of one word
    Pair             *heap;     // (3 * sym_cap,) heap of candidate pairs
    size_t            sym_cap;
    Frag             *frag;     // (frag_cap,) fragments of the text
    size_t            frag_cap;
    pcre2_match_data *md;
} Scratch;

typedef struct {
    int32_t *ids;               // caller's buffer
    int64_t  cap, n;            // n counts every token, written or not
    int64_t  limit;             // encoding may stop once n > limit
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
        w->md = pcre2_match_data_create(1, NULL);
        if (!w->word || !w->md) goto oom;
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
        int32_t id = tok_vocab_find(tk, s + l->off, l->n + r->n);

        if (id == NO_TOKEN) return;
        score = tk->score[id];
    } else {
        int32_t rank = tok_merge_rank(tk, s + l->off, l->n, s + r->off, r->n);

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
        int32_t    id = tok_vocab_find(tk, s + y->off, y->n);

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
        int32_t id = tok_vocab_find(tk, w->word, m);

        if (id != NO_TOKEN) {
            out_push(o, id);
            return 0;
        }
    }
    if (merge_symbols(tk, w->word, m, w) != 0) return -1;
    emit_symbols(tk, w->word, w, o);
    return 0;
}

/* Cuts s[off, off + len) by patterns re[i..], depth first: the matches of
 * re[i] and the gaps between them are pieces, each cut by re[i + 1] as a
 * whole subject (so lookarounds and $ stop at its ends); a piece past the
 * last pattern is a word and is merged at once. Stops early once o->n
 * passes o->limit. Returns 0, or -1 with err set. */
static int bpe_split(const Tokenizer *tk, const char *s, size_t off,
                     size_t len, int i, Scratch *w, Out *o, Err *err)
{
    PCRE2_SPTR subj = (PCRE2_SPTR) (s + off);
    size_t     start = 0, prev = 0;

    if (i == tk->n_re) {
        if (bpe_word(tk, s + off, len, w, o) != 0) {
            return err_set(err, "out of memory encoding a %zu-byte word",
                           len);
        }
        return 0;
    }
    while (start <= len && o->n <= o->limit) {
        int         rc = pcre2_match(tk->re[i], subj, len, start,
                                     PCRE2_NO_UTF_CHECK, w->md, NULL);
        PCRE2_SIZE *ov, m0, m1;

        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            rc = pcre2_match(tk->re[i], subj, len, start,
                             PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, w->md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[128];

            pcre2_get_error_message(rc, (PCRE2_UCHAR *) msg, sizeof(msg));
            return err_set(err, "pre-tokenizer pattern failed: %s", msg);
        }
        ov = pcre2_get_ovector_pointer(w->md);
        m0 = ov[0];                     // the deeper levels reuse w->md
        m1 = ov[1];
        if (m0 > prev
            && bpe_split(tk, s, off + prev, m0 - prev, i + 1, w, o, err) != 0)
        {
            return -1;
        }
        if (m1 > m0
            && bpe_split(tk, s, off + m0, m1 - m0, i + 1, w, o, err) != 0)
        {
            return -1;
        }
        prev = m1;
        start = m1 > m0 ? m1
                : m1 + (m1 < len ? utf8_lead_len(subj[m1]) : 1);
    }
    if (prev < len && o->n <= o->limit) {
        return bpe_split(tk, s, off + prev, len - prev, i + 1, w, o, err);
    }
    return 0;
}

static int bpe_fragment(const Tokenizer *tk, const char *s, size_t n,
                        Scratch *w, Out *o, Err *err)
{
    size_t m = utf8_clean(s, n, w->buf, tk->pre_flags & PRE_RAW_UTF8);

    if (m == 0) return 0;
    return bpe_split(tk, w->buf, 0, m, 0, w, o, err);
}

/* tokenizer_encode and tokenizer_encode_upto: o->limit is where encoding
 * may stop (INT64_MAX: never). */
static int64_t encode(const Tokenizer *tk, const char *text, size_t len,
                      bool add_special, bool parse_special, Out *out,
                      Err *err)
{
    Scratch w;
    Out     o = *out;
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
    for (size_t i = 0; i < nf && rc == 0 && o.n <= o.limit; i++) {
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

int64_t tokenizer_encode(const Tokenizer *tk, const char *text, size_t len,
                         bool add_special, bool parse_special,
                         int32_t *out, int64_t cap, Err *err)
{
    Out o = { out, cap, 0, INT64_MAX };

    return encode(tk, text, len, add_special, parse_special, &o, err);
}

int64_t tokenizer_encode_upto(const Tokenizer *tk, const char *text,
                              size_t len, bool add_special,
                              bool parse_special, int32_t *out, int64_t cap,
                              Err *err)
{
    Out     o = { out, cap, 0, cap };
    int64_t n = encode(tk, text, len, add_special, parse_special, &o, err);

    return n > cap ? cap + 1 : n;
}

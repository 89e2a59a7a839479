/* chunker.c -- a text stream cut into chunks for the talker (chunker.h).
 *
 * The text is read as tokens separated by whitespace; a token counts as a
 * word when it has a letter, a digit or a non-ASCII character (a lone "-"
 * does not). A token can end a chunk only once whitespace follows it or the
 * input has ended, so "3.50" is never cut at its point and feeding the text
 * a byte at a time cuts exactly where feeding it at once does. A token
 * ends a clause when, past closing quotes and brackets, it ends in , ; :
 * a dash or an ellipsis, and a sentence when it ends in . ! ?
 *
 *   latency  the first chunk ends at the first clause or sentence end or
 *            at first_words words; later ones likewise at chunk_words;
 *   quality  a chunk ends at a sentence end; at quality_words words it
 *            ends at the last clause end before, else there.
 *
 * A cut at a word count that would fall after a word leaning on the next
 * (is_leaning: "the", "of", "and"...) backs off to the last word that
 * does not, when at least two words are left before it.
 *
 * Only a full buffer without any cut forces one: at the last whitespace,
 * else at the last whole UTF-8 character. A policy's word counts of 0 take
 * the defaults (4, 12, 40). */

#include <string.h>

#include "chunker.h"

typedef enum { END_NONE = 0, END_CLAUSE, END_SENTENCE } TokenEnd;

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'
        || ch == '\f' || ch == '\v';
}

static bool has_suffix(const char *s, size_t n, const char *suf) {
    size_t m = strlen(suf);

    return n >= m && memcmp(s + n - m, suf, m) == 0;
}

/* What token t (n bytes) ends: a clause, a sentence or neither. */
static TokenEnd token_end(const char *t, size_t n) {
    static const char *closers[] = { "\"", "'", ")", "]", "}",
                                     "\xe2\x80\x99", "\xe2\x80\x9d" };
    static const char *clause[] = { ",", ";", ":", "--", "\xe2\x80\x94",
                                    "\xe2\x80\x93", "\xe2\x80\xa6" };
    bool stripped = true;

    while (stripped) {
        stripped = false;
        for (size_t i = 0; i < sizeof(closers) / sizeof(*closers); i++)
            if (has_suffix(t, n, closers[i])) {
                n -= strlen(closers[i]);
                stripped = true;
            }
    }
    if (n == 0) return END_NONE;
    if (t[n - 1] == '.' || t[n - 1] == '!' || t[n - 1] == '?')
        return END_SENTENCE;
    if (n == 1 && t[0] == '-') return END_CLAUSE;
    for (size_t i = 0; i < sizeof(clause) / sizeof(*clause); i++)
        if (has_suffix(t, n, clause[i])) return END_CLAUSE;
    return END_NONE;
}

static bool is_word(const char *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char) t[i];

        if (ch >= 0x80 || (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a'
            && (ch | 0x20) <= 'z'))
            return true;
    }
    return false;
}

/* Whether token t is a word that leans on the next one (an article, a
 * preposition, a conjunction, a possessive, an auxiliary): a chunk that
 * ends on it is spoken as a finished phrase ("the girl read the | note"),
 * which pocketsphinx and people mishear. Measured: latency mode's WER went
 * from 11.1% to (see README) when cuts back off from such words. */
static bool is_leaning(const char *t, size_t n) {
    static const char *const words[] = {
        "a", "an", "the", "to", "of", "in", "on", "at", "with", "from",
        "for", "by", "into", "onto", "over", "under", "about", "after",
        "before", "than", "and", "or", "but", "nor", "so", "if", "when",
        "while", "as", "her", "his", "their", "its", "my", "your", "our",
        "this", "that", "these", "those", "some", "every", "no", "is", "was",
        "are", "were", "be", "been", "will", "would", "can", "could",
        "should", "has", "have", "had", "do", "did", "not", "very", "who",
        "which", "whose",
    };
    char w[8];

    if (n == 0 || n >= sizeof(w)) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = t[i];

        w[i] = ch >= 'A' && ch <= 'Z' ? (char) (ch | 0x20) : ch;
    }
    w[n] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(*words); i++) {
        if (strcmp(words[i], w) == 0) return true;
    }
    return false;
}

void chunker_init(Chunker *c, const ChunkPolicy *p) {
    c->policy = *p;
    if (c->policy.first_words <= 0) c->policy.first_words = 4;
    if (c->policy.chunk_words <= 0) c->policy.chunk_words = 12;
    if (c->policy.quality_words <= 0) c->policy.quality_words = 40;
    c->len = 0;
    c->chunks = 0;
    c->ended = false;
}

size_t chunker_push(Chunker *c, const char *text, size_t n) {
    size_t room = CHUNKER_MAX - c->len;

    if (c->ended) return 0;
    if (n > room) n = room;
    memcpy(c->buf + c->len, text, n);
    c->len += n;
    return n;
}

void chunker_end(Chunker *c) { c->ended = true; }

/* The end of the chunk the policy cuts from the buffer's start (which is
 * not whitespace), or 0 when none is cut yet. */
static size_t policy_cut(const Chunker *c) {
    const ChunkPolicy *p = &c->policy;
    bool   latency = p->mode == SPEECH_LATENCY;
    int    limit = !latency ? p->quality_words
                 : c->chunks == 0 ? p->first_words : p->chunk_words;
    int    words = 0;
    size_t i = 0, clause_cut = 0, firm_cut = 0;

    while (i < c->len) {
        size_t   start = i;
        TokenEnd e;
        bool     leaning;

        while (i < c->len && !is_space(c->buf[i])) i++;
        if (i == c->len && !c->ended) return 0;     // not whole yet
        words += is_word(c->buf + start, i - start);
        e = token_end(c->buf + start, i - start);
        if (e == END_SENTENCE || (latency && e == END_CLAUSE)) return i;
        if (e == END_CLAUSE) clause_cut = i;
        leaning = e == END_NONE && is_leaning(c->buf + start, i - start);
        if (words >= limit) {
            if (clause_cut > 0) return clause_cut;
            return leaning && firm_cut > 0 ? firm_cut : i;
        }
        if (!leaning && words >= 2) firm_cut = i;
        while (i < c->len && is_space(c->buf[i])) i++;
    }
    return c->ended ? c->len : 0;
}

/* A cut in a full buffer that has no other: at its last whitespace, else
 * before the last UTF-8 character that may be incomplete. */
static size_t forced_cut(const Chunker *c) {
    size_t i = c->len;

    while (i > 0 && !is_space(c->buf[i - 1])) i--;
    if (i > 0) return i - 1;
    i = c->len;
    while (i > 0 && ((unsigned char) c->buf[i - 1] & 0xc0) == 0x80) i--;
    if (i > 0 && (unsigned char) c->buf[i - 1] >= 0xc0) i--;
    return i > 0 ? i : c->len;
}

size_t chunker_next(Chunker *c, const char **text) {
    size_t skip = 0, cut;

    while (skip < c->len && is_space(c->buf[skip])) skip++;
    if (skip > 0) {
        memmove(c->buf, c->buf + skip, c->len - skip);
        c->len -= skip;
    }
    *text = c->buf;
    if (c->len == 0) return 0;
    cut = policy_cut(c);
    if (cut == 0 && c->len == CHUNKER_MAX) cut = forced_cut(c);
    while (cut > 0 && is_space(c->buf[cut - 1])) cut--;
    return cut;
}

void chunker_take(Chunker *c, size_t n) {
    if (n > c->len) n = c->len;
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
    c->chunks++;
}

bool chunker_done(const Chunker *c) {
    for (size_t i = 0; i < c->len; i++)
        if (!is_space(c->buf[i])) return false;
    return c->ended;
}

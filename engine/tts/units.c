/* units.c -- a chunk of speech units in bytes and back (units.h).
 *
 * The byte form (little-endian, no padding; UNITS_MAX_BYTES at most):
 *
 *   offset  size  field
 *   0       4     magic "OTU1"
 *   4       1     flags: bit 0 = the request's last chunk; others 0
 *   5       1     0
 *   6       2     n_words, 0..UNITS_MAX_WORDS
 *   8       ...   n_words records, each:
 *                   u8  text_len     1..UNITS_MAX_TEXT
 *                   u8  prepunc_len  0..UNITS_MAX_PUNC
 *                   u8  punc_len     0..UNITS_MAX_PUNC
 *                   u16 phones_len   0..UNITS_MAX_PHONES
 *                   text, prepunc, punc, phones (no NULs)
 *
 * Nothing may follow the last record. text and punctuation are printable
 * ASCII (the analyzer reduces its input to that before Flite sees it);
 * phones are usenglish phones separated by single spaces, each vowel with
 * its stress digit (0 or 1) and no consonant with one; silences are not
 * phones of a word. Decoding checks all of it, so no byte string can make
 * Flite meet a phone it does not know (it would exit()). */

#include <stdlib.h>
#include <string.h>

#include "tts_impl.h"

static const uint8_t MAGIC[4] = { 'O', 'T', 'U', '1' };

// ---------------------------------------------------------------------------
// Phones

bool units_phone_known(const char *name, size_t n, bool *vowel) {
    const cst_phoneset *ps = &us_phoneset;
    char                buf[8];

    if (n == 0 || n >= sizeof(buf)) return false;
    memcpy(buf, name, n);
    buf[n] = '\0';
    if (strcmp(buf, ps->silence) == 0) return false;
    for (int i = 0; i < ps->num_phones; i++) {
        if (strcmp(ps->phonenames[i], buf) == 0) {
            // only now: phone_feature_string on an unknown name indexes -1
            *vowel = strcmp(phone_feature_string(ps, buf, "vc"), "+") == 0;
            return true;
        }
    }
    return false;
}

/* Checks a word's phones; returns how many there are, or -1 with err set. */
static int check_phones(const char *p, size_t n, Err *err) {
    size_t i = 0;
    int    count = 0;

    while (i < n) {
        size_t start = i, len;
        bool   vowel, digit;

        while (i < n && p[i] != ' ') i++;
        len = i - start;
        if (len == 0)
            return err_set(err, "empty phone at byte %zu", start);
        digit = p[i - 1] == '0' || p[i - 1] == '1';
        if (!units_phone_known(p + start, len - digit, &vowel))
            return err_set(err, "unknown phone '%.*s'", (int) len,
                           p + start);
        if (vowel != digit)
            return err_set(err, "phone '%.*s': %s", (int) len, p + start,
                           vowel ? "a vowel needs its stress (0 or 1)"
                                 : "only vowels take a stress digit");
        count++;
        if (i < n && ++i == n)
            return err_set(err, "phones end with a space");
    }
    return count;
}

static bool printable(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e) return false;
    return true;
}

// ---------------------------------------------------------------------------
// Writing

void units_begin(UnitsWriter *w, uint8_t *buf, size_t cap) {
    *w = (UnitsWriter) { buf, cap, UNITS_HEADER, 0, cap < UNITS_HEADER };
}

int units_put(UnitsWriter *w, const char *text, const char *phones,
              const char *prepunc, const char *punc) {
    size_t nt = strlen(text), nq = strlen(prepunc), np = strlen(punc);
    size_t nh = strlen(phones), need = 5 + nt + nq + np + nh;
    uint8_t *p;

    if (!w->full && (need > w->cap - w->len || w->n_words >= UNITS_MAX_WORDS))
        w->full = true;
    if (w->full || nt == 0 || nt > UNITS_MAX_TEXT
        || nq > UNITS_MAX_PUNC || np > UNITS_MAX_PUNC
        || nh > UNITS_MAX_PHONES)
        return -1;
    p = w->buf + w->len;
    *p++ = (uint8_t) nt;
    *p++ = (uint8_t) nq;
    *p++ = (uint8_t) np;
    *p++ = (uint8_t) (nh & 0xff);
    *p++ = (uint8_t) (nh >> 8);
    memcpy(p, text, nt);    p += nt;
    memcpy(p, prepunc, nq); p += nq;
    memcpy(p, punc, np);    p += np;
    memcpy(p, phones, nh);
    w->len += need;
    w->n_words++;
    return 0;
}

long units_finish(UnitsWriter *w, bool last) {
    if (w->cap < UNITS_HEADER) return -1;
    memcpy(w->buf, MAGIC, 4);
    w->buf[4] = last ? 1 : 0;
    w->buf[5] = 0;
    w->buf[6] = (uint8_t) (w->n_words & 0xff);
    w->buf[7] = (uint8_t) (w->n_words >> 8);
    return (long) w->len;
}

long units_encode(const Units *u, uint8_t *buf, size_t cap) {
    UnitsWriter w;

    units_begin(&w, buf, cap < UNITS_MAX_BYTES ? cap : UNITS_MAX_BYTES);
    for (int i = 0; i < u->n_words; i++) {
        const UnitWord *uw = &u->words[i];

        if (units_put(&w, uw->text, uw->phones, uw->prepunc, uw->punc) < 0)
            return -1;
    }
    return units_finish(&w, u->last);
}

// ---------------------------------------------------------------------------
// Reading

/* Copies n bytes to the arena's string area as a C string. */
static const char *take(char **s, const uint8_t *p, size_t n) {
    char *r = *s;

    memcpy(r, p, n);
    r[n] = '\0';
    *s += n + 1;
    return r;
}

/* Parses one record at p[*at..n) into *w. Returns its phone count, or -1
 * with err set. */
static int decode_word(const uint8_t *p, size_t n, size_t *at, UnitWord *w,
                       char **s, Err *err) {
    size_t i = *at, nt, nq, np, nh;
    int    phones;

    if (n - i < 5) return err_set(err, "record truncated");
    nt = p[i];
    nq = p[i + 1];
    np = p[i + 2];
    nh = (size_t) p[i + 3] | (size_t) p[i + 4] << 8;
    i += 5;
    if (nt == 0) return err_set(err, "empty word");
    if (nh > UNITS_MAX_PHONES)
        return err_set(err, "%zu bytes of phones (at most %d)", nh,
                       UNITS_MAX_PHONES);
    if (n - i < nt + nq + np + nh) return err_set(err, "record truncated");
    if (!printable(p + i, nt + nq + np))
        return err_set(err, "text or punctuation is not printable ASCII");
    w->text = take(s, p + i, nt);       i += nt;
    w->prepunc = take(s, p + i, nq);    i += nq;
    w->punc = take(s, p + i, np);       i += np;
    if ((phones = check_phones((const char *) p + i, nh, err)) < 0)
        return err_prefix(err, "word '%s'", w->text);
    w->phones = take(s, p + i, nh);     i += nh;
    *at = i;
    return phones;
}

int units_decode(Units *u, const uint8_t *p, size_t n, Err *err) {
    size_t at = UNITS_HEADER;
    int    nw;
    char  *s;

    *u = (Units) { 0 };
    if (n > UNITS_MAX_BYTES)
        return err_set(err, "units: %zu bytes (at most %u)", n,
                       UNITS_MAX_BYTES);
    if (n < UNITS_HEADER || memcmp(p, MAGIC, 4) != 0)
        return err_set(err, "units: not a chunk of speech units");
    if ((p[4] & ~1u) != 0 || p[5] != 0)
        return err_set(err, "units: unknown flags 0x%02x%02x", p[5], p[4]);
    nw = p[6] | p[7] << 8;
    if (nw > UNITS_MAX_WORDS)
        return err_set(err, "units: %d words (at most %d)", nw,
                       UNITS_MAX_WORDS);
    // the strings fit in n bytes plus a NUL for each of the 4 per word
    u->arena = malloc(sizeof(UnitWord) * (size_t) nw + n + 4 * (size_t) nw);
    if (u->arena == NULL) return err_set(err, "units: out of memory");
    u->words = u->arena;
    u->last = p[4] & 1;
    s = (char *) (u->words + nw);
    for (int i = 0; i < nw; i++) {
        int ph = decode_word(p, n, &at, &u->words[i], &s, err);

        if (ph < 0) {
            units_free(u);
            return err_prefix(err, "units: word %d", i);
        }
        u->n_phones += ph;
        u->n_words++;
    }
    if (at != n) {
        units_free(u);
        return err_set(err, "units: %zu bytes after the last word", n - at);
    }
    return 0;
}

void units_free(Units *u) {
    free(u->arena);
    *u = (Units) { 0 };
}

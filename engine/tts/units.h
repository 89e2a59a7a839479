/* units.h -- speech units: what the talker hands the voicebox. One chunk
 * of text as Flite's front end analysed it: per word, its phones with
 * stress, and the punctuation around it (the recipe's exact talker /
 * voicebox split: the voicebox rebuilds Flite's token list from these and
 * synthesizes bit-identically to Flite on the whole text).
 *
 * A chunk travels between processes through the shared-memory pool, so
 * it has a byte form (units_encode / units_decode). Decoding checks
 * everything: it comes from another process, and Flite exit()s on a phone
 * it does not know, so every phone is checked against the phone set
 * before synthesis may see it.
 *
 * Ownership: a Units owns one arena holding its words and strings;
 * units_free releases it. */

#ifndef OMNI_UNITS_H
#define OMNI_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"

#define UNITS_MAX_WORDS  256        // per chunk
#define UNITS_MAX_BYTES  (16u << 10)    // a chunk's byte form, at most

typedef struct {
    const char *text;           // the word as written, NUL-terminated
    const char *phones;         // phones with stress, space-separated:
                                //   "hh ax0 l ow1"; "" for a word that
                                //   is only punctuation
    const char *prepunc;        // punctuation before it: "", "\"", "("
    const char *punc;           // after it: "", ",", ".", "?", ...
} UnitWord;

typedef struct {
    UnitWord *words;            // (n_words,)
    int       n_words;
    int       n_phones;         // phones in all words: the audio tokens
    bool      last;             // the request's last chunk
    void     *arena;            // owned
} Units;

/* The byte form of u into buf (cap bytes). Returns the length, or -1 when
 * it does not fit. */
long units_encode(const Units *u, uint8_t *buf, size_t cap);

/* Parses n bytes into u (the caller frees it), checking every field and
 * every phone. Returns 0, or -1 with err set and u owning nothing. */
int  units_decode(Units *u, const uint8_t *p, size_t n, Err *err);

void units_free(Units *u);

#endif

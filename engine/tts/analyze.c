/* analyze.c -- the talker's text to speech units (analyze.h): the text is
 * reduced to printable ASCII (Flite's English front end and its lexicon
 * know nothing else: accented Latin letters lose their accents, typographic
 * quotes and dashes become ASCII ones, anything else -- emoji, other
 * scripts, control characters, invalid UTF-8 -- becomes a space), then
 * Flite's front end (utt_synth_text2segs: tokens, words with numbers and
 * abbreviations expanded, part of speech, lexicon and letter-to-sound,
 * stress) runs on it, and each word is written out with its phones and the
 * punctuation around it.
 *
 * Bounds: the input is at most ANALYZE_MAX_TEXT bytes; a chunk's units at
 * most UNITS_MAX_WORDS words and UNITS_MAX_BYTES bytes -- the words past
 * them are dropped with a warning (the chunker's cuts keep real text far
 * below: 40 words of text make ~60 words spoken). Buffers are the
 * analyzer's, allocated once. */

#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "chunker.h"
#include "synth.h"
#include "tts_impl.h"

#define ANALYZE_MAX_TEXT  CHUNKER_MAX   // bytes of text per call
#define ASCII_MAX         3             // ASCII bytes per code point, at most

struct TtsAnalyzer {
    cst_voice *voice;                   // any voice: all share the front end
    char       text[ANALYZE_MAX_TEXT * ASCII_MAX + 1];
    char       phones[UNITS_MAX_PHONES + 1];
    uint8_t    bytes[UNITS_MAX_BYTES];  // the chunk's byte form
};

// ---------------------------------------------------------------------------
// UTF-8 to what Flite can say

/* Latin-1's letters U+00C0..U+00FF without their accents ('\0': none). */
static const char LATIN1[64] =
    "AAAAAAACEEEEIIII" "DNOOOOO\0OUUUUYTs"
    "aaaaaaaceeeeiiii" "dnooooo\0ouuuuyty";

/* The code point at p (n bytes left), or -1 for invalid UTF-8 (overlong,
 * surrogate, past U+10FFFF, truncated); *len gets the bytes it took (1 for
 * an invalid one). */
static long utf8_next(const unsigned char *p, size_t n, size_t *len) {
    long   cp;
    size_t k;

    *len = 1;
    if (p[0] < 0x80) return p[0];
    if (p[0] >= 0xc2 && p[0] <= 0xdf) { k = 2; cp = p[0] & 0x1f; }
    else if (p[0] >= 0xe0 && p[0] <= 0xef) { k = 3; cp = p[0] & 0x0f; }
    else if (p[0] >= 0xf0 && p[0] <= 0xf4) { k = 4; cp = p[0] & 0x07; }
    else return -1;
    if (n < k) return -1;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80) return -1;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) || cp > 0x10ffff
        || (cp >= 0xd800 && cp <= 0xdfff))
        return -1;
    *len = k;
    return cp;
}

/* The ASCII that stands for code point cp (at most ASCII_MAX bytes). */
static const char *ascii_for(long cp, char one[2]) {
    one[1] = '\0';
    if (cp >= 0x20 && cp < 0x7f) { one[0] = (char) cp; return one; }
    if (cp >= 0xc0 && cp <= 0xff && LATIN1[cp - 0xc0] != '\0') {
        if (cp == 0xdf) return "ss";
        if (cp == 0xc6) return "AE";
        if (cp == 0xe6) return "ae";
        one[0] = LATIN1[cp - 0xc0];
        return one;
    }
    switch (cp) {
    case 0x152: return "OE";
    case 0x153: return "oe";
    case 0x2018: case 0x2019: case 0x2032: return "'";
    case 0x201c: case 0x201d: case 0x2033: case 0xab: case 0xbb: return "\"";
    case 0x2010: case 0x2011: return "-";
    case 0x2013: case 0x2014: case 0x2212: return " - ";
    case 0x2026: return "...";
    default: return " ";     // control characters, symbols, other scripts
    }
}

/* Writes the ASCII form of n bytes of UTF-8 into out (room for
 * n * ASCII_MAX + 1); returns its length. */
static size_t to_ascii(const char *text, size_t n, char *out) {
    const unsigned char *p = (const unsigned char *) text;
    size_t               o = 0;

    for (size_t i = 0, k; i < n; i += k) {
        char        one[2];
        const char *a = ascii_for(utf8_next(p + i, n - i, &k), one);
        size_t      m = strlen(a);

        memcpy(out + o, a, m);
        o += m;
    }
    out[o] = '\0';
    return o;
}

// ---------------------------------------------------------------------------
// Flite's words to units

TtsAnalyzer *tts_analyzer_new(Err *err) {
    const TtsVoice *v = tts_voice("rms");
    TtsAnalyzer    *a;

    if (v == NULL) {
        err_set(err, "tts analyzer: no voices (tts_init first)");
        return NULL;
    }
    if ((a = malloc(sizeof(*a))) == NULL) {
        err_set(err, "tts analyzer: out of memory");
        return NULL;
    }
    a->voice = tts_flite_voice(v);
    return a;
}

void tts_analyzer_free(TtsAnalyzer *a) { free(a); }

/* The phones of word w ("hh ax0 l ow1": vowels carry their syllable's
 * stress, as the lexicon gave them) into a->phones; -1 when too long. */
static int word_phones(TtsAnalyzer *a, const cst_item *w) {
    const cst_item *syl = item_daughter(item_as(w, "SylStructure"));
    size_t          o = 0;

    a->phones[0] = '\0';
    for (; syl != NULL; syl = item_next(syl)) {
        const char *stress = item_feat_string(syl, "stress");

        for (const cst_item *s = item_daughter(syl); s; s = item_next(s)) {
            const char *name = item_name(s);
            bool        vowel;
            size_t      m = strlen(name);

            if (!units_phone_known(name, m, &vowel)) return -1;
            if (o + m + 3 > UNITS_MAX_PHONES) return -1;
            if (o > 0) a->phones[o++] = ' ';
            memcpy(a->phones + o, name, m);
            o += m;
            if (vowel) a->phones[o++] = stress[0] == '1' ? '1' : '0';
            a->phones[o] = '\0';
        }
    }
    return 0;
}

/* s cut to at most max bytes, in buf (max + 1 bytes). */
static const char *clip(const char *s, char *buf, size_t max) {
    size_t n = strlen(s);

    if (n <= max) return s;
    memcpy(buf, s, max);
    buf[max] = '\0';
    return buf;
}

/* Writes token t's words (or the token alone, without phones, if it has
 * none). Returns the words that did not fit (0: all did). */
static int put_token(TtsAnalyzer *a, UnitsWriter *uw, const cst_item *t) {
    char        bt[UNITS_MAX_TEXT + 1], bq[UNITS_MAX_PUNC + 1];
    char        bp[UNITS_MAX_PUNC + 1];
    const char *pre = clip(item_feat_string(t, "prepunctuation"), bq,
                           UNITS_MAX_PUNC);
    const char *punc = clip(item_feat_string(t, "punc"), bp, UNITS_MAX_PUNC);
    int         lost = 0;

    if (item_daughter(t) == NULL)
        return units_put(uw, clip(item_name(t), bt, UNITS_MAX_TEXT), "",
                         pre, punc) < 0;
    for (const cst_item *w = item_daughter(t); w; w = item_next(w)) {
        const char *text = clip(item_name(w), bt, UNITS_MAX_TEXT);

        if (word_phones(a, w) < 0
            || units_put(uw, text, a->phones, w == item_daughter(t) ? pre : "",
                         item_next(w) == NULL ? punc : "") < 0)
            lost++;
    }
    return lost;
}

int tts_analyze(TtsAnalyzer *a, const char *text, size_t len, Units *u,
                Err *err) {
    cst_utterance *utt;
    UnitsWriter    uw;
    long           n;
    int            lost = 0;

    *u = (Units) { 0 };
    if (len > ANALYZE_MAX_TEXT)
        return err_set(err, "tts: %zu bytes of text to analyse (at most %u)",
                       len, ANALYZE_MAX_TEXT);
    to_ascii(text, len, a->text);
    utt = new_utterance();
    utt_set_input_text(utt, a->text);
    if ((utt = flite_do_synth(utt, a->voice, utt_synth_text2segs)) == NULL)
        return err_set(err, "tts: flite's front end failed");
    units_begin(&uw, a->bytes, sizeof(a->bytes));
    for (const cst_item *t = relation_head(utt_relation(utt, "Token")); t;
         t = item_next(t))
        lost += put_token(a, &uw, t);
    delete_utterance(utt);
    if (lost > 0)
        log_msg(LOG_WARN, "tts: %d words of a chunk not said (a chunk says "
                "at most %d words, %u bytes of units)", lost,
                UNITS_MAX_WORDS, UNITS_MAX_BYTES);
    if ((n = units_finish(&uw, false)) < 0 ||
        units_decode(u, a->bytes, (size_t) n, err) < 0)
        return err_prefix(err, "tts: analysis");
    return 0;
}

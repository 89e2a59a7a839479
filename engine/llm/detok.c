/* detok.c -- token ids -> text: tokenizer_piece and the streaming
 * detokenizer (detok_*); see tokenizer.h and tokenizer_impl.h.
 *
 * A token's text is not its bytes: SPM shows spaces as U+2581 and bytes as
 * <0xXX> tokens, byte-level BPE maps every byte to a printable character,
 * and control tokens render as nothing unless asked for. Both entry points
 * undo that through one renderer, piece_render, which hands the bytes to a
 * callback chunk by chunk: tokenizer_piece copies them to the caller's
 * buffer, the streaming detokenizer feeds them to a UTF-8 state machine,
 * so neither needs a buffer of its own and neither allocates.
 *
 * What counts as valid UTF-8 is tokenizer_impl.h's definition, the one the
 * encoder uses to replace bad bytes with U+FFFD. */

#include <stdio.h>
#include <string.h>

#include "tokenizer_impl.h"


/* ---- UTF-8 ------------------------------------------------------------- */

/* Decodes one code point as llama.cpp does (continuation bits checked, not
 * ranges); an invalid byte yields U+FFFD and a length of 1. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    size_t k = s[0] < 0x80 ? 1 : s[0] < 0xc0 ? 0 : s[0] < 0xe0 ? 2
               : s[0] < 0xf0 ? 3 : s[0] < 0xf8 ? 4 : 0;

    if (k == 0 || k > n) goto bad;
    *cp = k == 1 ? s[0] : (uint32_t) (s[0] & (0x7f >> k));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        *cp = (*cp << 6) | (s[i] & 0x3f);
    }
    return k;
bad:
    *cp = 0xfffd;
    return 1;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char) cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char) (0xc0 | (cp >> 6));
        out[1] = (char) (0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char) (0xe0 | (cp >> 12));
        out[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char) (0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char) (0xf0 | ((cp >> 18) & 0x07));
    out[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char) (0x80 | (cp & 0x3f));
    return 4;
}


/* ---- Pieces ----------------------------------------------------------------
 * A piece is rendered through a callback, chunk by chunk, so the streaming
 * detokenizer needs no buffer of its own. */

typedef void (*PieceFn)(void *ud, const char *p, size_t n);

static void render_unescaped(const char *s, size_t n, PieceFn fn, void *ud) {
    const char *end = s + n, *m;

    while ((m = memmem(s, (size_t) (end - s), U2581, 3)) != NULL) {
        if (m > s) fn(ud, s, (size_t) (m - s));
        fn(ud, " ", 1);
        s = m + 3;
    }
    if (s < end) fn(ud, s, (size_t) (end - s));
}

/* Byte-level characters back to bytes; a character outside the alphabet is
 * rendered the way llama.cpp renders it, "[UNK_BYTE_0x<hex><token>]". */
static void render_byte_level(const Tokenizer *tk, const char *s, size_t n,
                              PieceFn fn, void *ud)
{
    char   buf[64], u[4], hex[16];
    size_t k = 0, un;

    for (size_t i = 0; i < n; ) {
        uint32_t cp;

        i += utf8_decode((const uint8_t *) s + i, n - i, &cp);
        if (cp < 324 && tk->bl_byte[cp] >= 0) {
            buf[k++] = (char) tk->bl_byte[cp];
            if (k == sizeof(buf)) {
                fn(ud, buf, k);
                k = 0;
            }
            continue;
        }
        if (k > 0) {
            fn(ud, buf, k);
            k = 0;
        }
        un = utf8_encode(cp, u);
        for (size_t j = 0; j < un; j++) {
            snprintf(hex + 2 * j, sizeof(hex) - 2 * j, "%02x", (uint8_t) u[j]);
        }
        fn(ud, "[UNK_BYTE_0x", 12);
        fn(ud, hex, 2 * un);
        fn(ud, s, n);
        fn(ud, "]", 1);
    }
    if (k > 0) fn(ud, buf, k);
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void piece_render(const Tokenizer *tk, int32_t id, bool special,
                         PieceFn fn, void *ud)
{
    uint16_t    a = tk->attr[id];
    const char *s = tk->text[id];
    size_t      n = tk->len[id];

    if (!special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return;
    if (a & ATTR_SPECIAL) {
        fn(ud, s, n);
    } else if (a & ATTR_NORMAL) {
        if (tk->model == MODEL_SPM || (tk->pre_flags & PRE_RAW_UTF8)) {
            render_unescaped(s, n, fn, ud);
        } else {
            render_byte_level(tk, s, n, fn, ud);
        }
    } else if (a & ATTR_BYTE) {     // "<0xXX>"
        int  v = 0;
        char b;

        for (size_t i = 3; i < 5 && i < n && hex_digit(s[i]) >= 0; i++) {
            v = v * 16 + hex_digit(s[i]);
        }
        b = (char) v;
        fn(ud, &b, 1);
    }
}

typedef struct {
    char   *buf;
    size_t  cap, n;
} Copy;

static void copy_fn(void *ud, const char *p, size_t n) {
    Copy *c = ud;

    if (c->n + n <= c->cap) memcpy(c->buf + c->n, p, n);
    c->n += n;
}

size_t tokenizer_piece(const Tokenizer *tk, int32_t id, bool render_special,
                       char *buf, size_t cap)
{
    Copy c = { buf, cap, 0 };

    if (id < 0 || id >= tk->n_vocab) return 0;
    piece_render(tk, id, render_special, copy_fn, &c);
    return c.n;
}


/* ---- Streaming detokenizer -------------------------------------------------
 * Bytes go through a UTF-8 state machine: a character is written once its
 * last byte arrives; a byte that cannot continue the pending sequence turns
 * that sequence into one U+FFFD and is then looked at afresh (the "maximal
 * subpart" rule of Unicode, as browsers and Python decode). */

typedef struct {
    Detok *d;
    char  *out;
    size_t cap, n;
    bool   full;                // output was dropped for lack of room
} DetokOut;

static void detok_put(DetokOut *o, const void *p, size_t n) {
    if (o->full || o->n + n > o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->out + o->n, p, n);
    o->n += n;
}

static void detok_byte(DetokOut *o, uint8_t b) {
    Detok *d = o->d;

    for (;;) {
        if (d->n_pending == 0) {
            int need = tok_utf8_need(b);

            if (need == 1) detok_put(o, &b, 1);
            else if (need == 0) detok_put(o, "\xef\xbf\xbd", 3);
            else d->pending[d->n_pending++] = b;
            return;
        }
        if (tok_utf8_next_ok(d->pending[0], d->n_pending, b)) {
            d->pending[d->n_pending++] = b;
            if (d->n_pending == tok_utf8_need(d->pending[0])) {
                detok_put(o, d->pending, (size_t) d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        detok_put(o, "\xef\xbf\xbd", 3);
        d->n_pending = 0;
    }
}

static void detok_fn(void *ud, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) detok_byte(ud, (uint8_t) p[i]);
}

void detok_init(Detok *d) {
    memset(d, 0, sizeof(*d));
}

size_t detok_push(Detok *d, const Tokenizer *tk, int32_t id, char *out,
                  size_t cap)
{
    DetokOut o = { d, out, cap, 0, false };

    if (id < 0 || id >= tk->n_vocab) return 0;
    piece_render(tk, id, false, detok_fn, &o);
    return o.n;
}

size_t detok_flush(Detok *d, char *out, size_t cap) {
    DetokOut o = { d, out, cap, 0, false };

    if (d->n_pending > 0) detok_put(&o, "\xef\xbf\xbd", 3);
    d->n_pending = 0;
    return o.n;
}

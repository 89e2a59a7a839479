/* json_scan.h -- what a request body must be before yajl sees it: bounded,
 * and text (well-formed UTF-8, no unpaired surrogate escapes).
 *
 * Shared, as it is, by the engine (engine/request/request.c) and the nginx module
 * (ngx_omni_module/ngx_http_omni_request.c): both parse bodies with
 * yajl_tree_parse, and yajl 2.1 sets none of these bounds itself.
 *
 *   depth   yajl has no nesting limit and yajl_tree_free recurses: a
 *           million levels of "[" (2 MB) parse, then overflow the stack
 *           when freed.
 *   nodes   a tree node costs one or two mallocs (~50-90 bytes) for as
 *           little as two input bytes ("1,"): counting the structural
 *           characters and strings bounds the tree whatever the input.
 *   NUL     yajl_tree_parse takes a C string and would accept the valid
 *           prefix before a raw NUL byte.
 *   \u0000  the tree's strings are NUL-terminated without a length, so the
 *           text would be cut silently.
 *   comment yajl_tree_parse turns yajl_allow_comments on; JSON has none.
 *   UTF-8   yajl's lexer checks only the shape of a sequence (a lead byte
 *           and its count of 80..BF bytes): it lets overlong forms
 *           (C0 AF for '/'), encoded surrogates (ED A0 80) and code points
 *           above U+10FFFF (F4 90 80 80, F5..F7 leads) through, while it
 *           refuses other bad bytes. Here every byte sequence must be
 *           well-formed as Unicode's Table 3-7 (RFC 3629) says, below.
 *   \uD800  an escaped surrogate must be a high one (D800-DBFF) followed
 *           at once by an escaped low one (DC00-DFFF): the pair is one
 *           character above U+FFFF. Anything else is refused as invalid
 *           text, the same error as a bad byte: yajl would turn a lone high
 *           surrogate into '?', pair a high one with whatever escape comes
 *           next, and write a lone low one out as an encoded surrogate (an
 *           ill-formed ED B0 80 in the text the model gets). RFC 8259
 *           (8.2) leaves such strings' meaning unpredictable.
 *
 * One pass over the raw bytes, tracking strings the way the JSON lexer
 * does; O(len), no allocation. Brackets that do not match, bad escapes
 * and stray non-ASCII characters outside strings are left to yajl to
 * report. When the text is refused, omni_json_path() names the value it
 * was found in ("messages[0].content") and omni_json_utf8_what() says what
 * was found, in the same words for the module and the engine;
 * omni_utf8_cut() cuts text to fit a field without splitting a character
 * (omni_proto.h's ERROR events).
 * Header-only so that the module needs nothing from the engine but
 * headers. */

#ifndef OMNI_JSON_SCAN_H
#define OMNI_JSON_SCAN_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef enum {
    OMNI_JSON_OK = 0,
    OMNI_JSON_NUL,              // a raw NUL byte
    OMNI_JSON_U0000,            // "\u0000" inside a string
    OMNI_JSON_COMMENT,          // '/' outside a string
    OMNI_JSON_DEEP,             // nesting deeper than max_depth
    OMNI_JSON_NODES,            // more than max_nodes values
    OMNI_JSON_UTF8,             // bytes that are not well-formed UTF-8
    OMNI_JSON_SURROGATE,        // an escaped surrogate without its pair
} OmniJsonScan;


/* ---- UTF-8 ----------------------------------------------------------------
 * The well-formed byte sequences (Unicode 15, Table 3-7):
 *
 *   code points          byte 1   byte 2   byte 3   byte 4
 *   U+0000..U+007F       00..7F
 *   U+0080..U+07FF       C2..DF   80..BF
 *   U+0800..U+0FFF       E0       A0..BF   80..BF
 *   U+1000..U+CFFF       E1..EC   80..BF   80..BF
 *   U+D000..U+D7FF       ED       80..9F   80..BF
 *   U+E000..U+FFFF       EE..EF   80..BF   80..BF
 *   U+10000..U+3FFFF     F0       90..BF   80..BF   80..BF
 *   U+40000..U+FFFFF     F1..F3   80..BF   80..BF   80..BF
 *   U+100000..U+10FFFF   F4       80..8F   80..BF   80..BF
 *
 * Everything else is ill-formed: C0 and C1 (always overlong), E0 80..9F
 * and F0 80..8F (overlong), ED A0..BF (surrogates D800-DFFF), F4 90..BF
 * and F5..FF (above U+10FFFF), a continuation byte 80..BF where a
 * character should start, and a lead byte without all its continuation
 * bytes. The narrower second-byte ranges are the whole trick: they rule
 * out the overlongs, surrogates and out-of-range forms in one compare. */

/* The length (1..4) of the well-formed character that starts s, which has
 * n > 0 bytes; 0 when s does not start with one. Can't fail. */
static inline size_t omni_utf8_char(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    size_t        k;

    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) {
        k = 2;
    } else if (c < 0xf0) {
        k = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c < 0xf5) {
        k = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < k || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++) {
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    }
    return k;
}

/* The offset of the first ill-formed sequence in len bytes at s, or len
 * when they are all well-formed UTF-8. Can't fail. */
static inline size_t omni_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *) s;
    size_t               i = 0, k;

    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        k = omni_utf8_char(u + i, len - i);
        if (k == 0) return i;
        i += k;
    }
    return len;
}

/* The length of the longest prefix of the NUL-terminated s that has at
 * most max bytes and does not end inside a character: all of s when it
 * fits. A byte that starts no well-formed character counts as one, so an
 * ill-formed s is cut too, but never through a well-formed character.
 * Reads at most max + 4 bytes of s. Can't fail. Not inlined: inlined
 * into a caller that passes a short literal, gcc's -Warray-bounds sees
 * omni_utf8_char read past it on the path the length check rules out. */
__attribute__((noinline, unused))
static size_t omni_utf8_cut(const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *) s;
    size_t               n = strnlen(s, max + 4), i = 0, k;

    if (n <= max) return n;
    while (i < max) {
        k = omni_utf8_char(u + i, n - i);
        if (k == 0) k = 1;
        if (i + k > max) break;
        i += k;
    }
    return i;
}

/* How many bytes of the ill-formed sequence at s (n > 0 bytes) to show: the
 * lead byte and the continuation bytes (80..BF) that follow it, up to the
 * count its top bits announce (1 for a stray continuation or F8..FF). */
static inline size_t omni_utf8_span(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t        want = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0
                         ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1, k = 1;

    while (k < want && k < n && s[k] >= 0x80 && s[k] <= 0xbf) k++;
    return k;
}


/* ---- the scan ------------------------------------------------------------ */

/* The value of four hex digits at s (n bytes available), or -1. */
static inline long omni_json_hex4(const char *s, size_t n)
{
    long v = 0;

    if (n < 4) return -1;
    for (int i = 0; i < 4; i++) {
        char c = s[i];

        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    return v;
}

/* A "\u" escape whose 'u' is at s[i]. Returns OMNI_JSON_OK with *skip the
 * bytes to step over past the 'u' (4, or 10 for a surrogate pair), or the
 * refusal. Bad hex digits are yajl's to report. */
static inline OmniJsonScan omni_json_unicode(const char *s, size_t len,
                                             size_t i, size_t *skip)
{
    long cp = omni_json_hex4(s + i + 1, len - i - 1), lo;

    *skip = 0;
    if (cp < 0) return OMNI_JSON_OK;
    *skip = 4;
    if (cp == 0) return OMNI_JSON_U0000;
    if (cp < 0xd800 || cp > 0xdfff) return OMNI_JSON_OK;
    if (cp >= 0xdc00) return OMNI_JSON_SURROGATE;
    if (len - i < 11 || s[i + 5] != '\\' || s[i + 6] != 'u') {
        return OMNI_JSON_SURROGATE;
    }
    lo = omni_json_hex4(s + i + 7, len - i - 7);
    if (lo < 0xdc00 || lo > 0xdfff) return OMNI_JSON_SURROGATE;
    *skip = 10;
    return OMNI_JSON_OK;
}

/* Scans len bytes of s; on a refusal *at is the offset where it was seen
 * (for OMNI_JSON_UTF8 the first byte of the bad sequence, for
 * OMNI_JSON_SURROGATE the backslash of the escape). */
static inline OmniJsonScan omni_json_scan(const char *s, size_t len,
                                          int max_depth, size_t max_nodes,
                                          size_t *at)
{
    OmniJsonScan rc;
    size_t       nodes = 0, k;
    int          depth = 0, in_str = 0, esc = 0;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];

        *at = i;
        if (c == '\0') return OMNI_JSON_NUL;
        if ((unsigned char) c >= 0x80) {
            k = omni_utf8_char((const unsigned char *) s + i, len - i);
            if (k == 0) return OMNI_JSON_UTF8;
            i += k - 1;
            esc = 0;
            continue;
        }
        if (in_str) {
            if (esc) {
                esc = 0;
                if (c != 'u') continue;
                *at = i - 1;
                rc = omni_json_unicode(s, len, i, &k);
                if (rc != OMNI_JSON_OK) return rc;
                i += k;
            } else if (c == '\\') {
                esc = 1;
            } else if (c == '"') {
                in_str = 0;
            }
            continue;
        }
        switch (c) {
        case '/':
            return OMNI_JSON_COMMENT;
        case '[':
        case '{':
            if (++depth > max_depth) return OMNI_JSON_DEEP;
            break;
        case ']':
        case '}':
            depth--;
            continue;
        case '"':
            in_str = 1;
            break;
        case ',':
        case ':':
            break;
        default:
            continue;
        }
        if (++nodes > max_nodes) return OMNI_JSON_NODES;
    }
    return OMNI_JSON_OK;
}


/* ---- naming what was refused ------------------------------------------- */

#define OMNI_JSON_PATH_DEPTH 64     // levels tracked; deeper ones are cut

/* Writes n bytes of p at logical position pos of out (size bytes, the last
 * kept for the NUL); what does not fit is dropped. Returns pos + n. */
static inline size_t omni_json_path_put(char *out, size_t size, size_t pos,
                                        const char *p, size_t n)
{
    for (size_t i = 0; i < n && pos + i + 1 < size; i++) out[pos + i] = p[i];
    return pos + n;
}

/* Writes to out (size >= 4 bytes, NUL-terminated) the path of the JSON
 * value that offset at of s lies in, in the API's way of naming
 * parameters: "prompt", "stop[1]", "messages[0].content[2].text"; "" when
 * at is in no member's value (the top level, or a key at the top level:
 * a bad key of an object names that object). Keys are copied as written,
 * escapes included. A path that does not fit ends in "...". Meant for
 * error messages after omni_json_scan() refused s: it walks the bytes
 * before at once more, which the scan has checked. Can't fail. */
static inline void omni_json_path(const char *s, size_t len, size_t at,
                                  char *out, size_t size)
{
    size_t mark[OMNI_JSON_PATH_DEPTH];  // path length where each level's
                                        //   component starts
    long   item[OMNI_JSON_PATH_DEPTH];  // array element, -1 for objects
    size_t pos = 0, key = 0;            // path length; where a key began
    int    depth = 0, in_str = 0, esc = 0, is_key = 0, want_key = 0;
    char   num[24];

    for (size_t i = 0; i < at && i < len; i++) {
        char c = s[i];
        int  top = depth - 1 < OMNI_JSON_PATH_DEPTH ? depth - 1 : -1;

        if (in_str) {
            if (esc) {
                esc = 0;
            } else if (c == '\\') {
                esc = 1;
            } else if (c == '"') {
                in_str = 0;
                if (is_key && top >= 0) {
                    pos = mark[top];
                    if (pos > 0) pos = omni_json_path_put(out, size, pos,
                                                          ".", 1);
                    pos = omni_json_path_put(out, size, pos, s + key,
                                             i - key);
                }
            }
            continue;
        }
        switch (c) {
        case '"':
            in_str = 1;
            is_key = want_key && top >= 0 && item[top] < 0;
            want_key = 0;
            key = i + 1;
            break;
        case '{':
        case '[':
            if (depth++ >= OMNI_JSON_PATH_DEPTH) break;
            mark[depth - 1] = pos;
            item[depth - 1] = c == '[' ? 0 : -1;
            want_key = c == '{';
            if (c == '[') pos = omni_json_path_put(out, size, pos, "[0]", 3);
            break;
        case '}':
        case ']':
            if (depth > 0 && --depth < OMNI_JSON_PATH_DEPTH) pos = mark[depth];
            break;
        case ',':
            if (top < 0) break;
            pos = mark[top];
            if (item[top] < 0) {
                want_key = 1;
                break;
            }
            snprintf(num, sizeof(num), "[%ld]", ++item[top]);
            pos = omni_json_path_put(out, size, pos, num, strlen(num));
            break;
        }
    }
    if (in_str && is_key) pos = mark[depth - 1];     // in a key: its object
    if (pos + 1 > size) {
        size_t n = size - 4;

        while (n > 0 && ((unsigned char) out[n] & 0xc0) == 0x80) n--;
        memcpy(out + n, "...", 3);
        pos = n + 3;
    }
    out[pos] = '\0';
}

/* Says what omni_json_scan() found at offset at of s when it returned why
 * (OMNI_JSON_UTF8 or OMNI_JSON_SURROGATE), into out (size bytes):
 * "bytes ED A0 80 at offset 41", "byte FF at offset 41", "unpaired
 * surrogate \ud800 at offset 41". Can't fail (the text is cut to fit). */
static inline void omni_json_utf8_what(const char *s, size_t len,
                                       OmniJsonScan why, size_t at,
                                       char *out, size_t size)
{
    const unsigned char *u = (const unsigned char *) s + at;
    char                 buf[80];   // the longest: 4 bytes, a 20-digit at
    size_t               n, w;

    if (size == 0) return;
    out[0] = '\0';
    if (at >= len) return;
    if (why == OMNI_JSON_SURROGATE) {
        snprintf(buf, sizeof(buf), "unpaired surrogate %.6s at offset %zu",
                 s + at, at);
    } else {
        n = omni_utf8_span(u, len - at);
        w = (size_t) snprintf(buf, sizeof(buf), "%s", n > 1 ? "bytes" : "byte");
        for (size_t i = 0; i < n; i++) {
            w += (size_t) snprintf(buf + w, sizeof(buf) - w, " %02X",
                                   (unsigned) u[i]);
        }
        snprintf(buf + w, sizeof(buf) - w, " at offset %zu", at);
    }
    n = strlen(buf);
    if (n > size - 1) n = size - 1;
    memcpy(out, buf, n);
    out[n] = '\0';
}

#endif

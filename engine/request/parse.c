/* parse.c -- the pieces every part of the request parser uses: the
 * arena the request's strings live in, the 400s it answers with, the
 * pre-scan of the raw JSON, and reading scalars out of yajl's tree.
 * request_impl.h says what each does for its callers (request.c and
 * request_audio.c). */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "json_scan.h"
#include "request_impl.h"

/* ---- arena ---- */

void req_arena_free(ReqBlock *b) {
    while (b != NULL) {
        ReqBlock *next = b->next;

        free(b);
        b = next;
    }
}

void *req_arena_alloc(ReqBlock **head, size_t n, size_t hint) {
    ReqBlock *b = *head;
    void     *p;

    n = (n + 15) & ~(size_t) 15;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = n > hint ? n : hint;

        if (b != NULL && cap < b->cap) cap = b->cap;
        b = malloc(sizeof(*b) + cap);
        if (b == NULL) return NULL;
        b->next = *head;
        b->cap = cap;
        b->used = 0;
        *head = b;
    }
    p = b->data + b->used;
    b->used += n;
    return p;
}


/* ---- errors ---- */


/* Sets the error (400) for param: the message is "param: what", or just
 * "what" when param is empty. Returns -1. */
int req_fail(Parser *p, const char *param, const char *fmt, ...) {
    char    what[ERR_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(p->e->param, sizeof(p->e->param), "%s", param);
    p->e->status = 400;
    if (param[0] == '\0') return err_set(&p->e->err, "%s", what);
    return err_set(&p->e->err, "%s: %s", param, what);
}

/* At most REQ_CLIP bytes of a client's string, cut at a character
 * boundary (the text is valid UTF-8), "..." marking a cut. */
const char *req_clip(const char *s, char out[REQ_CLIP + 4]) {
    size_t n = strnlen(s, REQ_CLIP + 1);

    if (n <= REQ_CLIP) return s;
    n = REQ_CLIP;
    while (n > 0 && ((unsigned char) s[n] & 0xC0) == 0x80) n--;
    memcpy(out, s, n);
    memcpy(out + n, "...", 4);
    return out;
}

/* The engine's own failure, not the client's: 503. Returns -1. */
int req_fail_oom(Parser *p) {
    req_fail(p, "", "out of memory for the request");
    p->e->status = 503;
    return -1;
}

const char *req_type_name(yajl_val v) {
    switch (v->type) {
    case yajl_t_string: return "a string";
    case yajl_t_number: return "a number";
    case yajl_t_object: return "an object";
    case yajl_t_array:  return "an array";
    case yajl_t_true:
    case yajl_t_false:  return "a boolean";
    default:            return "null";
    }
}

int req_fail_type(Parser *p, const char *param, const char *want,
                     yajl_val v) {
    return req_fail(p, param, "expected %s, got %s", want, req_type_name(v));
}


/* ---- pre-scan ---- */

/* Text that is not valid UTF-8 (json_scan.h), naming the value it is in:
 * "messages[0].content: not valid UTF-8 (bytes ED A0 80 at offset 41)". */
static int req_fail_utf8(Parser *p, const char *s, size_t len,
                         OmniJsonScan why, size_t at) {
    char path[sizeof(p->e->param)], what[96];

    omni_json_path(s, len, at, path, sizeof(path));
    omni_json_utf8_what(s, len, why, at, what, sizeof(what));
    return req_fail(p, path, "%snot valid UTF-8 (%s)",
                path[0] == '\0' ? "request JSON is " : "", what);
}

/* The bounds of json_scan.h, as 400 errors. */
int req_prescan(Parser *p, const char *s, size_t len) {
    size_t       at = 0;
    OmniJsonScan why;

    why = omni_json_scan(s, len, REQ_MAX_DEPTH, REQ_MAX_NODES, &at);
    switch (why) {
    case OMNI_JSON_OK:
        return 0;
    case OMNI_JSON_UTF8:
    case OMNI_JSON_SURROGATE:
        return req_fail_utf8(p, s, len, why, at);
    case OMNI_JSON_NUL:
        return req_fail(p, "", BAD_JSON ": NUL byte at offset %zu", at);
    case OMNI_JSON_U0000:
        return req_fail(p, "", "strings may not contain U+0000");
    case OMNI_JSON_COMMENT:
        return req_fail(p, "", BAD_JSON ": comments are not JSON");
    case OMNI_JSON_DEEP:
        return req_fail(p, "", "request JSON nests deeper than %d levels",
                    REQ_MAX_DEPTH);
    case OMNI_JSON_NODES:
        return req_fail(p, "", "request JSON has more than %d values",
                    REQ_MAX_NODES);
    }
    return req_fail(p, "", BAD_JSON);
}


/* ---- scalars ---- */

/* Reads an integer in [lo, hi]. JSON has one number type, so 3.0 and 3e2
 * are integers too; 2.5 is not. The raw text is read rather than yajl's
 * flags: upstream yajl 2.1.0 never sets YAJL_NUMBER_INT_VALID. */
int req_get_int(Parser *p, const char *param, yajl_val v, int64_t lo,
                   int64_t hi, int64_t *out) {
    const char *raw;
    char        c[REQ_CLIP + 4];
    long long   i = 0;
    int         beyond = 0;     // -1, +1: below, above every int64_t

    if (!YAJL_IS_NUMBER(v)) return req_fail_type(p, param, "an integer", v);
    raw = v->u.number.r;
    if (strpbrk(raw, ".eE") == NULL) {
        errno = 0;
        i = strtoll(raw, NULL, 10);
        if (errno == ERANGE) beyond = raw[0] == '-' ? -1 : 1;
    } else {
        double d = strtod(raw, NULL);

        if (isfinite(d) && d != trunc(d)) {
            return req_fail(p, param, "expected an integer, got %s",
                        req_clip(raw, c));
        }
        if (d < -0x1p63) beyond = -1;
        else if (d >= 0x1p63) beyond = 1;
        else i = (long long) d;
    }
    if (beyond < 0 || (beyond == 0 && i < lo)) {
        return req_fail(p, param, "must be >= %lld, got %s", (long long) lo,
                    req_clip(raw, c));
    }
    if (beyond > 0 || i > hi) {
        return req_fail(p, param, "must be at most %lld, got %s",
                        (long long) hi,
                    req_clip(raw, c));
    }
    *out = i;
    return 0;
}

/* Reads a number in [lo, hi], or (lo, hi] when lo_open, as a float; the
 * range holds for the float too (a tiny top_p must not round to 0), so the
 * sampler's own check passes. */
int req_get_float(Parser *p, const char *param, yajl_val v, double lo,
                     double hi, bool lo_open, float *out) {
    char   c[REQ_CLIP + 4];
    double d;
    float  f;

    if (!YAJL_IS_NUMBER(v)) return req_fail_type(p, param, "a number", v);
    d = strtod(v->u.number.r, NULL);
    f = (float) d;
    if (lo_open ? d > lo && f > lo && d <= hi : d >= lo && d <= hi) {
        *out = f;
        return 0;
    }
    if (lo_open) {
        return req_fail(p, param, "must be in (%g, %g], got %s", lo, hi,
                    req_clip(v->u.number.r, c));
    }
    return req_fail(p, param, "must be between %g and %g, got %s", lo, hi,
                req_clip(v->u.number.r, c));
}

/* A copy of the string v in the arena; *len gets its length. */
int req_get_string(Parser *p, const char *param, yajl_val v,
                      const char **out, size_t *len) {
    char  *s;
    size_t n;

    if (!YAJL_IS_STRING(v)) return req_fail_type(p, param, "a string", v);
    n = strlen(v->u.string);
    s = req_arena_alloc(&p->arena, n + 1, p->hint);
    if (s == NULL) return req_fail_oom(p);
    memcpy(s, v->u.string, n + 1);
    *out = s;
    if (len != NULL) *len = n;
    return 0;
}


yajl_val req_member(yajl_val o, const char *key) {
    yajl_val v = NULL;

    for (size_t i = 0; i < o->u.object.len; i++) {
        if (strcmp(o->u.object.keys[i], key) == 0) v = o->u.object.values[i];
    }
    return YAJL_IS_NULL(v) ? NULL : v;
}

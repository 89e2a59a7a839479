/* request.c -- the normalized request JSON -> OmniRequest; the format is
 * in request.h.
 *
 * Three steps:
 *
 *   1. a pre-scan of the raw bytes, for bounds yajl does not set;
 *   2. yajl_tree_parse over a NUL-terminated copy;
 *   3. a walk over the tree that checks every field we know and copies what
 *      it keeps (strings, the message array) into the request's arena.
 *
 * Why the pre-scan: yajl 2.1 sets no bound on nesting or tree size and
 * lets NUL bytes, "\u0000", comments, overlong and surrogate UTF-8 and
 * unpaired surrogate escapes through (json_scan.h has the details, shared
 * with the nginx module, so both refuse the same bodies). Rejected
 * alternative: yajl's event API with our own stack -- more code than the
 * tree walk, for a parse that is small next to one forward pass.
 *
 * Checks go field by field in a fixed order, not in the order of the keys,
 * so the same body always reports the same first error. A key given twice
 * counts once, its last value wins (as in JavaScript's JSON.parse). JSON
 * null for an optional field means absent, as in the OpenAI API.
 *
 * Every string in the result is NUL-terminated, well-formed UTF-8 (the
 * pre-scan has checked it) in one arena: blocks chained newest first, the first sized for the
 * whole request (the decoded strings are never longer than the JSON), so
 * a request is almost always one allocation. */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "json_scan.h"
#include "omni_proto.h"
#include "request.h"

#define REQ_MAX_DEPTH   64          // nesting levels; ours use 5
#define REQ_MAX_NODES   (1 << 18)   // strings + structural characters
#define REQ_CLIP        40          // bytes of a client value quoted back

#define BAD_JSON "We could not parse the JSON body of your request"


/* ---- arena ---- */

typedef struct Block {
    struct Block *next;         // the block before this one, owned
    size_t        cap;          // bytes in data
    size_t        used;
    _Alignas(16) unsigned char data[];
} Block;

static void arena_free(Block *b) {
    while (b != NULL) {
        Block *next = b->next;

        free(b);
        b = next;
    }
}

/* n bytes, 16-aligned, from the newest block or a new one of at least
 * hint bytes. NULL when memory runs out. */
static void *arena_alloc(Block **head, size_t n, size_t hint) {
    Block *b = *head;
    void  *p;

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

/* The parser's state: the arena being filled and where errors go. */
typedef struct {
    Block    *arena;            // owned until handed to the request
    size_t    hint;             // size of the first block
    ReqError *e;
} Parser;

/* Sets the error (400) for param: the message is "param: what", or just
 * "what" when param is empty. Returns -1. */
__attribute__((format(printf, 3, 4)))
static int fail(Parser *p, const char *param, const char *fmt, ...) {
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
static const char *clip(const char *s, char out[REQ_CLIP + 4]) {
    size_t n = strnlen(s, REQ_CLIP + 1);

    if (n <= REQ_CLIP) return s;
    n = REQ_CLIP;
    while (n > 0 && ((unsigned char) s[n] & 0xC0) == 0x80) n--;
    memcpy(out, s, n);
    memcpy(out + n, "...", 4);
    return out;
}

/* The engine's own failure, not the client's: 503. Returns -1. */
static int fail_oom(Parser *p) {
    fail(p, "", "out of memory for the request");
    p->e->status = 503;
    return -1;
}

static const char *type_name(yajl_val v) {
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

static int fail_type(Parser *p, const char *param, const char *want,
                     yajl_val v) {
    return fail(p, param, "expected %s, got %s", want, type_name(v));
}


/* ---- pre-scan ---- */

/* Text that is not valid UTF-8 (json_scan.h), naming the value it is in:
 * "messages[0].content: not valid UTF-8 (bytes ED A0 80 at offset 41)". */
static int fail_utf8(Parser *p, const char *s, size_t len, OmniJsonScan why,
                     size_t at) {
    char path[sizeof(p->e->param)], what[96];

    omni_json_path(s, len, at, path, sizeof(path));
    omni_json_utf8_what(s, len, why, at, what, sizeof(what));
    return fail(p, path, "%snot valid UTF-8 (%s)",
                path[0] == '\0' ? "request JSON is " : "", what);
}

/* The bounds of json_scan.h, as 400 errors. */
static int prescan(Parser *p, const char *s, size_t len) {
    size_t       at = 0;
    OmniJsonScan why;

    why = omni_json_scan(s, len, REQ_MAX_DEPTH, REQ_MAX_NODES, &at);
    switch (why) {
    case OMNI_JSON_OK:
        return 0;
    case OMNI_JSON_UTF8:
    case OMNI_JSON_SURROGATE:
        return fail_utf8(p, s, len, why, at);
    case OMNI_JSON_NUL:
        return fail(p, "", BAD_JSON ": NUL byte at offset %zu", at);
    case OMNI_JSON_U0000:
        return fail(p, "", "strings may not contain U+0000");
    case OMNI_JSON_COMMENT:
        return fail(p, "", BAD_JSON ": comments are not JSON");
    case OMNI_JSON_DEEP:
        return fail(p, "", "request JSON nests deeper than %d levels",
                    REQ_MAX_DEPTH);
    case OMNI_JSON_NODES:
        return fail(p, "", "request JSON has more than %d values",
                    REQ_MAX_NODES);
    }
    return fail(p, "", BAD_JSON);
}


/* ---- scalars ---- */

/* Reads an integer in [lo, hi]. JSON has one number type, so 3.0 and 3e2
 * are integers too; 2.5 is not. The raw text is read rather than yajl's
 * flags: upstream yajl 2.1.0 never sets YAJL_NUMBER_INT_VALID. */
static int get_int(Parser *p, const char *param, yajl_val v, int64_t lo,
                   int64_t hi, int64_t *out) {
    const char *raw;
    char        c[REQ_CLIP + 4];
    long long   i = 0;
    int         beyond = 0;     // -1, +1: below, above every int64_t

    if (!YAJL_IS_NUMBER(v)) return fail_type(p, param, "an integer", v);
    raw = v->u.number.r;
    if (strpbrk(raw, ".eE") == NULL) {
        errno = 0;
        i = strtoll(raw, NULL, 10);
        if (errno == ERANGE) beyond = raw[0] == '-' ? -1 : 1;
    } else {
        double d = strtod(raw, NULL);

        if (isfinite(d) && d != trunc(d)) {
            return fail(p, param, "expected an integer, got %s",
                        clip(raw, c));
        }
        if (d < -0x1p63) beyond = -1;
        else if (d >= 0x1p63) beyond = 1;
        else i = (long long) d;
    }
    if (beyond < 0 || (beyond == 0 && i < lo)) {
        return fail(p, param, "must be >= %lld, got %s", (long long) lo,
                    clip(raw, c));
    }
    if (beyond > 0 || i > hi) {
        return fail(p, param, "must be at most %lld, got %s", (long long) hi,
                    clip(raw, c));
    }
    *out = i;
    return 0;
}

/* Reads a number in [lo, hi], or (lo, hi] when lo_open, as a float; the
 * range holds for the float too (a tiny top_p must not round to 0), so the
 * sampler's own check passes. */
static int get_float(Parser *p, const char *param, yajl_val v, double lo,
                     double hi, bool lo_open, float *out) {
    char   c[REQ_CLIP + 4];
    double d;
    float  f;

    if (!YAJL_IS_NUMBER(v)) return fail_type(p, param, "a number", v);
    d = strtod(v->u.number.r, NULL);
    f = (float) d;
    if (lo_open ? d > lo && f > lo && d <= hi : d >= lo && d <= hi) {
        *out = f;
        return 0;
    }
    if (lo_open) {
        return fail(p, param, "must be in (%g, %g], got %s", lo, hi,
                    clip(v->u.number.r, c));
    }
    return fail(p, param, "must be between %g and %g, got %s", lo, hi,
                clip(v->u.number.r, c));
}

/* A copy of the string v in the arena; *len gets its length. */
static int get_string(Parser *p, const char *param, yajl_val v,
                      const char **out, size_t *len) {
    char  *s;
    size_t n;

    if (!YAJL_IS_STRING(v)) return fail_type(p, param, "a string", v);
    n = strlen(v->u.string);
    s = arena_alloc(&p->arena, n + 1, p->hint);
    if (s == NULL) return fail_oom(p);
    memcpy(s, v->u.string, n + 1);
    *out = s;
    if (len != NULL) *len = n;
    return 0;
}


/* ---- messages ---- */

/* The value of key in object o, the last one when repeated; NULL when
 * absent or null. */
static yajl_val member(yajl_val o, const char *key) {
    yajl_val v = NULL;

    for (size_t i = 0; i < o->u.object.len; i++) {
        if (strcmp(o->u.object.keys[i], key) == 0) v = o->u.object.values[i];
    }
    return YAJL_IS_NULL(v) ? NULL : v;
}

/* The role as chat.h spells it: a static string, or NULL. */
static const char *role_of(const char *s) {
    static const char *const roles[][2] = {
        { "system", "system" }, { "user", "user" },
        { "assistant", "assistant" }, { "developer", "system" },
        { "tool", "tool" },
    };

    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(s, roles[i][0]) == 0) return roles[i][1];
    }
    return NULL;
}

/* The text of part j of message i, checked: {"type": "text", "text": s}. */
static int part_text(Parser *p, int i, size_t j, yajl_val part,
                     const char **text) {
    char     param[64], c[REQ_CLIP + 4];
    yajl_val type, t;

    snprintf(param, sizeof(param), "messages[%d].content[%zu]", i, j);
    if (!YAJL_IS_OBJECT(part)) return fail_type(p, param, "an object", part);
    type = member(part, "type");
    snprintf(param, sizeof(param), "messages[%d].content[%zu].type", i, j);
    if (type == NULL) return fail(p, param, "is required");
    if (!YAJL_IS_STRING(type)) return fail_type(p, param, "a string", type);
    if (strcmp(type->u.string, "text") != 0) {
        return fail(p, param, "unsupported content part type '%s'",
                    clip(type->u.string, c));
    }
    t = member(part, "text");
    snprintf(param, sizeof(param), "messages[%d].content[%zu].text", i, j);
    if (t == NULL) return fail(p, param, "is required");
    if (!YAJL_IS_STRING(t)) return fail_type(p, param, "a string", t);
    *text = t->u.string;
    return 0;
}

/* An array of text parts, joined with "\n" as vLLM and llama.cpp join
 * them, into one arena string. */
static int content_parts(Parser *p, int i, yajl_val a, const char **out) {
    size_t      n = a->u.array.len, total = 0, at = 0;
    const char *text = NULL;
    char       *s;

    for (size_t j = 0; j < n; j++) {
        if (part_text(p, i, j, a->u.array.values[j], &text) != 0) return -1;
        total += strlen(text) + 1;
    }
    s = arena_alloc(&p->arena, total + 1, p->hint);
    if (s == NULL) return fail_oom(p);
    for (size_t j = 0; j < n; j++) {
        size_t len;

        text = member(a->u.array.values[j], "text")->u.string;
        len = strlen(text);
        if (j > 0) s[at++] = '\n';
        memcpy(s + at, text, len);
        at += len;
    }
    s[at] = '\0';
    *out = s;
    return 0;
}

/* An audio id: 1..SPEECH_MAX_ID bytes of [A-Za-z0-9_-], so that it can go
 * into logs and keys as it is. */
static int get_audio_id(Parser *p, const char *param, yajl_val v,
                        const char **out) {
    size_t n;

    if (get_string(p, param, v, out, &n) != 0) return -1;
    if (n == 0 || n > SPEECH_MAX_ID
        || strspn(*out, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789_-") != n)
    {
        return fail(p, param, "must be 1 to %d characters of A-Z, a-z, 0-9, "
                    "'_' and '-'", SPEECH_MAX_ID);
    }
    return 0;
}

/* An assistant turn's {"audio": {"id": ...}}: an earlier spoken answer. */
static int message_audio(Parser *p, int i, yajl_val a, const ChatMsg *msg,
                         const char **audio_id) {
    char param[64];

    snprintf(param, sizeof(param), "messages[%d].audio", i);
    if (strcmp(msg->role, "assistant") != 0) {
        return fail(p, param, "only an assistant message may refer to "
                    "audio");
    }
    if (!YAJL_IS_OBJECT(a)) return fail_type(p, param, "an object", a);
    snprintf(param, sizeof(param), "messages[%d].audio.id", i);
    if (member(a, "id") == NULL) return fail(p, param, "is required");
    return get_audio_id(p, param, member(a, "id"), audio_id);
}

/* Message i: role and content. Content may be absent or null only for an
 * assistant turn (one that carried tool calls or audio): it is then "". */
static int parse_message(Parser *p, int i, yajl_val m, ChatMsg *msg,
                         const char **audio_id) {
    char     param[64], c[REQ_CLIP + 4];
    yajl_val role, content;

    snprintf(param, sizeof(param), "messages[%d]", i);
    if (!YAJL_IS_OBJECT(m)) return fail_type(p, param, "an object", m);
    role = member(m, "role");
    snprintf(param, sizeof(param), "messages[%d].role", i);
    if (role == NULL) return fail(p, param, "is required");
    if (!YAJL_IS_STRING(role)) return fail_type(p, param, "a string", role);
    msg->role = role_of(role->u.string);
    if (msg->role == NULL) {
        return fail(p, param, "must be one of 'system', 'user', "
                    "'assistant', 'developer', 'tool', got '%s'",
                    clip(role->u.string, c));
    }
    if (member(m, "audio") != NULL
        && message_audio(p, i, member(m, "audio"), msg, audio_id) != 0)
        return -1;
    content = member(m, "content");
    snprintf(param, sizeof(param), "messages[%d].content", i);
    if (content == NULL) {
        if (strcmp(msg->role, "assistant") != 0) {
            return fail(p, param, "is required");
        }
        msg->content = "";
        return 0;
    }
    if (YAJL_IS_ARRAY(content)) {
        return content_parts(p, i, content, &msg->content);
    }
    if (!YAJL_IS_STRING(content)) {
        return fail_type(p, param, "a string or an array of content parts",
                         content);
    }
    return get_string(p, param, content, &msg->content, NULL);
}

static int parse_messages(Parser *p, yajl_val v, OmniRequest *r) {
    size_t n;

    if (!YAJL_IS_ARRAY(v)) return fail_type(p, "messages", "an array", v);
    n = v->u.array.len;
    if (n == 0) return fail(p, "messages", "must not be empty");
    if (n > REQ_MAX_MESSAGES) {
        return fail(p, "messages", "at most %d messages, got %zu",
                    REQ_MAX_MESSAGES, n);
    }
    r->msgs = arena_alloc(&p->arena, n * sizeof(ChatMsg), p->hint);
    r->audio_ids = arena_alloc(&p->arena, n * sizeof(char *), p->hint);
    if (r->msgs == NULL || r->audio_ids == NULL) return fail_oom(p);
    for (size_t i = 0; i < n; i++) {
        r->audio_ids[i] = NULL;
        if (parse_message(p, (int) i, v->u.array.values[i], &r->msgs[i],
                          &r->audio_ids[i]) != 0)
            return -1;
    }
    r->n_msgs = (int) n;
    r->chat = true;
    return 0;
}


/* ---- sampling, stop, the rest ---- */

/* One logit_bias entry: the key a decimal token id, the value a number in
 * [-100, 100]. Whether the id exists in the vocabulary is the model's
 * stage to say. */
static int bias_entry(Parser *p, const char *key, yajl_val v, LogitBias *b) {
    char   c[REQ_CLIP + 4], c2[REQ_CLIP + 4];
    size_t len = strlen(key);
    double d;

    if (len == 0 || len > 10 || strspn(key, "0123456789") != len
        || strtoll(key, NULL, 10) > INT32_MAX)
    {
        return fail(p, "logit_bias", "key '%s' is not a token id",
                    clip(key, c));
    }
    if (!YAJL_IS_NUMBER(v)) return fail_type(p, "logit_bias", "a number", v);
    d = strtod(v->u.number.r, NULL);
    if (!(d >= -100 && d <= 100)) {
        return fail(p, "logit_bias", "bias for token %s must be between "
                    "-100 and 100, got %s", clip(key, c),
                    clip(v->u.number.r, c2));
    }
    b->token = (int32_t) strtol(key, NULL, 10);
    b->bias = (float) d;
    return 0;
}

/* A token given twice keeps its last bias. O(n^2) over at most
 * SAMPLER_MAX_BIAS entries. */
static int parse_logit_bias(Parser *p, yajl_val v, SamplerParams *sp) {
    size_t n;

    if (!YAJL_IS_OBJECT(v)) return fail_type(p, "logit_bias", "an object", v);
    n = v->u.object.len;
    if (n > SAMPLER_MAX_BIAS) {
        return fail(p, "logit_bias", "at most %d entries, got %zu",
                    SAMPLER_MAX_BIAS, n);
    }
    for (size_t i = 0; i < n; i++) {
        LogitBias b;
        int32_t   k = 0;

        if (bias_entry(p, v->u.object.keys[i], v->u.object.values[i], &b)) {
            return -1;
        }
        while (k < sp->n_bias && sp->bias[k].token != b.token) k++;
        sp->bias[k] = b;
        if (k == sp->n_bias) sp->n_bias++;
    }
    return 0;
}

/* One stop string s as stop_init() will take it. */
static int add_stop(Parser *p, yajl_val s, OmniRequest *r) {
    size_t len;

    if (!YAJL_IS_STRING(s)) {
        return fail_type(p, "stop", "a string or an array of strings", s);
    }
    len = strlen(s->u.string);
    if (len == 0) return fail(p, "stop", "sequence %d is empty", r->n_stop);
    if (len > STOP_MAX_LEN - 1) {
        return fail(p, "stop", "sequence %d is %zu bytes, at most %d",
                    r->n_stop, len, STOP_MAX_LEN - 1);
    }
    if (get_string(p, "stop", s, &r->stop[r->n_stop], NULL) != 0) return -1;
    r->n_stop++;
    return 0;
}

static int parse_stop(Parser *p, yajl_val v, OmniRequest *r) {
    if (!YAJL_IS_ARRAY(v)) return add_stop(p, v, r);
    if (v->u.array.len > STOP_MAX) {
        return fail(p, "stop", "at most %d sequences, got %zu", STOP_MAX,
                    v->u.array.len);
    }
    for (size_t i = 0; i < v->u.array.len; i++) {
        if (add_stop(p, v->u.array.values[i], r) != 0) return -1;
    }
    return 0;
}

/* The float parameters and their ranges, as sampler.c checks them. */
static const struct {
    const char *name;
    double      lo, hi;
    bool        lo_open;        // (lo, hi] rather than [lo, hi]
    size_t      off;            // of the float in SamplerParams
} FLOAT_PARAMS[] = {
    { "temperature",       0, 2, false, offsetof(SamplerParams, temperature) },
    { "top_p",             0, 1, true,  offsetof(SamplerParams, top_p) },
    { "min_p",             0, 1, false, offsetof(SamplerParams, min_p) },
    { "presence_penalty", -2, 2, false,
      offsetof(SamplerParams, presence_penalty) },
    { "frequency_penalty", -2, 2, false,
      offsetof(SamplerParams, frequency_penalty) },
};

/* omni_seed_draw (omni_proto.h), with the error in err. */
int request_draw_seed(uint64_t *seed, Err *err) {
    if (omni_seed_draw(seed) != 0) {
        return err_set(err, "no random seed: getrandom: %s",
                       strerror(errno));
    }
    return 0;
}

/* A fresh seed for a request that sent none; failing is the engine's
 * fault (503). */
static int draw_seed(Parser *p, uint64_t *seed) {
    Err err;

    if (request_draw_seed(seed, &err) != 0) {
        fail(p, "", "%s", err.msg);
        p->e->status = 503;
        return -1;
    }
    return 0;
}

static int parse_sampling(Parser *p, yajl_val o, SamplerParams *sp,
                          bool *drawn) {
    yajl_val v;
    int64_t  i;

    sampler_params_default(sp);
    for (size_t k = 0; k < sizeof(FLOAT_PARAMS) / sizeof(FLOAT_PARAMS[0]);
         k++) {
        float *f = (float *) ((char *) sp + FLOAT_PARAMS[k].off);

        v = member(o, FLOAT_PARAMS[k].name);
        if (v != NULL && get_float(p, FLOAT_PARAMS[k].name, v,
                                   FLOAT_PARAMS[k].lo, FLOAT_PARAMS[k].hi,
                                   FLOAT_PARAMS[k].lo_open, f) != 0) {
            return -1;
        }
    }
    if ((v = member(o, "top_k")) != NULL) {
        if (get_int(p, "top_k", v, 0, INT32_MAX, &i) != 0) return -1;
        sp->top_k = (int32_t) i;
    }
    if ((v = member(o, "seed")) != NULL) {
        if (get_int(p, "seed", v, 0, INT64_MAX, &i) != 0) return -1;
        sp->seed = (uint64_t) i;
    } else if (draw_seed(p, &sp->seed) != 0) {
        return -1;
    } else {
        *drawn = true;
    }
    if ((v = member(o, "logit_bias")) != NULL) {
        return parse_logit_bias(p, v, sp);
    }
    return 0;
}

/* Characters (not bytes) in well-formed UTF-8: the bytes that do not
 * continue one. */
static size_t utf8_chars(const char *s, size_t n) {
    size_t k = 0;

    for (size_t i = 0; i < n; i++) k += ((unsigned char) s[i] & 0xC0) != 0x80;
    return k;
}

/* Text to speak as it is: 1..SPEECH_MAX_INPUT characters. */
static int parse_speech_input(Parser *p, yajl_val v, OmniRequest *r) {
    size_t chars;

    if (get_string(p, "input", v, &r->input, &r->input_len) != 0) return -1;
    chars = utf8_chars(r->input, r->input_len);
    if (chars == 0 || chars > SPEECH_MAX_INPUT) {
        return fail(p, "input", "must be 1 to %d characters, got %zu",
                    SPEECH_MAX_INPUT, chars);
    }
    return 0;
}

/* The request's input: exactly one of messages, prompt and input. */
static int parse_input(Parser *p, yajl_val o, OmniRequest *r) {
    yajl_val msgs = member(o, "messages"), prompt = member(o, "prompt");
    yajl_val input = member(o, "input");

    if ((msgs != NULL) + (prompt != NULL) + (input != NULL) > 1) {
        return fail(p, input != NULL ? "input" : "prompt", "give one of "
                    "messages, prompt and input, not several");
    }
    if (msgs != NULL) return parse_messages(p, msgs, r);
    if (input != NULL) return parse_speech_input(p, input, r);
    if (prompt == NULL) {
        return fail(p, "messages", "one of messages or prompt is required");
    }
    return get_string(p, "prompt", prompt, &r->prompt, &r->prompt_len);
}

/* A string member of "audio" naming one of a fixed set; its index in
 * *out, or def when absent. */
static int audio_enum(Parser *p, yajl_val a, const char *key,
                      int (*lookup)(const char *), const char *allowed,
                      int def, int *out) {
    char     param[32], c[REQ_CLIP + 4];
    yajl_val v = member(a, key);

    snprintf(param, sizeof(param), "audio.%s", key);
    *out = def;
    if (v == NULL) return 0;
    if (!YAJL_IS_STRING(v)) return fail_type(p, param, "a string", v);
    *out = lookup(v->u.string);
    if (*out < 0) {
        return fail(p, param, "must be one of %s, got '%s'", allowed,
                    clip(v->u.string, c));
    }
    return 0;
}

static int speech_mode(const char *s) {
    return strcmp(s, "latency") == 0 ? SPEECH_LATENCY
           : strcmp(s, "quality") == 0 ? SPEECH_QUALITY : -1;
}

/* "audio": speech out. */
static int parse_audio(Parser *p, yajl_val a, SpeechParams *sp) {
    char     c[REQ_CLIP + 4];
    yajl_val v;
    int      fmt, mode;

    if (!YAJL_IS_OBJECT(a)) return fail_type(p, "audio", "an object", a);
    if ((v = member(a, "voice")) == NULL) {
        return fail(p, "audio.voice", "is required");
    }
    if (!YAJL_IS_STRING(v)) return fail_type(p, "audio.voice", "a string", v);
    sp->voice = speech_voice(v->u.string);
    if (sp->voice == NULL) {
        return fail(p, "audio.voice", "unknown voice '%s'; the voices are "
                    "alloy, ash, ballad, coral, echo, fable, nova, onyx, "
                    "sage, shimmer, verse, marin, cedar, rms, slt, awb and "
                    "kal16", clip(v->u.string, c));
    }
    if (audio_enum(p, a, "format", speech_format, "mp3, opus, aac, flac, "
                   "wav and pcm", AUDIO_MP3, &fmt) != 0
        || audio_enum(p, a, "mode", speech_mode, "latency and quality",
                      SPEECH_LATENCY, &mode) != 0)
        return -1;
    sp->format = (AudioFormat) fmt;
    sp->mode = (SpeechMode) mode;
    sp->speed = 1.0f;
    if ((v = member(a, "speed")) != NULL
        && get_float(p, "audio.speed", v, SPEECH_MIN_SPEED, SPEECH_MAX_SPEED,
                     false, &sp->speed) != 0)
        return -1;
    if ((v = member(a, "id")) != NULL
        && get_audio_id(p, "audio.id", v, &sp->id) != 0)
        return -1;
    sp->on = true;
    return 0;
}

/* "audio_transcripts": {id: text}, which only the frontend writes
 * (frontend/transcripts.h; a client's own is overridden, the last key
 * winning): each assistant turn that refers to an id gets its text as
 * content. An id without one stays "" (the frontend refused the request
 * before that). */
static int parse_transcripts(Parser *p, yajl_val v, OmniRequest *r) {
    yajl_val t;

    if (!YAJL_IS_OBJECT(v)) {
        return fail_type(p, "audio_transcripts", "an object", v);
    }
    for (int i = 0; r->chat && i < r->n_msgs; i++) {
        if (r->audio_ids[i] == NULL
            || (t = member(v, r->audio_ids[i])) == NULL)
            continue;
        if (get_string(p, "audio_transcripts", t, &r->msgs[i].content,
                       NULL) != 0)
            return -1;
    }
    return 0;
}

static int parse_root(Parser *p, yajl_val o, OmniRequest *r) {
    yajl_val v;

    if (!YAJL_IS_OBJECT(o)) {
        return fail(p, "", "the request must be a JSON object, got %s",
                    type_name(o));
    }
    if ((v = member(o, "model")) != NULL
        && get_string(p, "model", v, &r->model, NULL) != 0)
        return -1;
    if (parse_input(p, o, r) != 0) return -1;
    if ((v = member(o, "audio")) != NULL
        && parse_audio(p, v, &r->speech) != 0)
        return -1;
    if ((v = member(o, "audio_transcripts")) != NULL
        && parse_transcripts(p, v, r) != 0)
        return -1;
    if (r->input != NULL && !r->speech.on) {
        return fail(p, "audio", "is required with input (the voice to "
                    "speak it in)");
    }
    r->max_tokens = -1;
    if ((v = member(o, "max_tokens")) != NULL
        && get_int(p, "max_tokens", v, 1, INT64_MAX, &r->max_tokens) != 0)
        return -1;
    if (parse_sampling(p, o, &r->sampling, &r->seed_drawn) != 0) return -1;
    if ((v = member(o, "stop")) != NULL && parse_stop(p, v, r) != 0) {
        return -1;
    }
    if ((v = member(o, "ignore_eos")) != NULL) {
        if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v)) {
            return fail_type(p, "ignore_eos", "a boolean", v);
        }
        r->ignore_eos = YAJL_IS_TRUE(v);
    }
    if ((v = member(o, "cache_salt")) == NULL) return 0;
    if (get_string(p, "cache_salt", v, &r->cache_salt, &r->cache_salt_len)) {
        return -1;
    }
    if (r->cache_salt_len == 0 || r->cache_salt_len > REQ_MAX_SALT) {
        return fail(p, "cache_salt", "must be 1 to %d bytes, got %zu",
                    REQ_MAX_SALT, r->cache_salt_len);
    }
    return 0;
}


/* ---- entry points ---- */

/* yajl's message is several lines, the later ones quoting the input; the
 * first ("parse error: premature EOF") is the one worth passing on. */
static int fail_json(Parser *p, const char *yajl_msg) {
    size_t n = strcspn(yajl_msg, "\n");

    while (n > 0 && yajl_msg[n - 1] == ' ') n--;
    if (n == 0) return fail(p, "", BAD_JSON);
    return fail(p, "", BAD_JSON ": %.*s", (int) n, yajl_msg);
}

int request_parse(OmniRequest *r, const char *json, size_t len,
                  ReqError *e) {
    Parser   p = { .arena = NULL, .hint = len + 256, .e = e };
    char     ebuf[256];
    char    *copy;
    yajl_val root;
    int      rc;

    memset(r, 0, sizeof(*r));
    memset(e, 0, sizeof(*e));
    if (prescan(&p, json, len) != 0) return -1;
    copy = malloc(len + 1);
    if (copy == NULL) return fail_oom(&p);
    memcpy(copy, json, len);
    copy[len] = '\0';
    root = yajl_tree_parse(copy, ebuf, sizeof(ebuf));
    free(copy);
    if (root == NULL) return fail_json(&p, ebuf);

    rc = parse_root(&p, root, r);
    yajl_tree_free(root);
    if (rc != 0) {
        arena_free(p.arena);
        memset(r, 0, sizeof(*r));
        return -1;
    }
    r->arena = p.arena;
    return 0;
}

void request_free(OmniRequest *r) {
    arena_free(r->arena);
    memset(r, 0, sizeof(*r));
}

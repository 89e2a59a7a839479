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
 * pre-scan has checked it) in one arena: blocks chained newest first,
 * the first sized for the
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
#include "request_impl.h"



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

/* The text of part j of message i, checked: {"type": "text", "text": s},
 * or an input_audio part (request_audio.c). */
static int part_text(Parser *p, int i, size_t j, yajl_val part,
                     const char *role, const char **text) {
    char     param[64], c[REQ_CLIP + 4];
    yajl_val type, t;

    snprintf(param, sizeof(param), "messages[%d].content[%zu]", i, j);
    if (!YAJL_IS_OBJECT(part)) {
        return req_fail_type(p, param, "an object", part);
    }
    type = req_member(part, "type");
    snprintf(param, sizeof(param), "messages[%d].content[%zu].type", i, j);
    if (type == NULL) return req_fail(p, param, "is required");
    if (!YAJL_IS_STRING(type)) {
        return req_fail_type(p, param, "a string", type);
    }
    if (strcmp(type->u.string, "input_audio") == 0) {
        return req_input_audio_part(p, i, j, part, role, text);
    }
    if (strcmp(type->u.string, "text") != 0) {
        return req_fail(p, param, "unsupported content part type '%s'",
                        req_clip(type->u.string, c));
    }
    t = req_member(part, "text");
    snprintf(param, sizeof(param), "messages[%d].content[%zu].text", i, j);
    if (t == NULL) return req_fail(p, param, "is required");
    if (!YAJL_IS_STRING(t)) return req_fail_type(p, param, "a string", t);
    *text = t->u.string;
    return 0;
}

/* An array of parts, joined with "\n" as vLLM and llama.cpp join them,
 * into one arena string. */
static int content_parts(Parser *p, int i, yajl_val a, const char *role,
                         const char **out) {
    size_t       n = a->u.array.len, total = 0, at = 0;
    const char **texts;
    char        *s;

    texts = req_arena_alloc(&p->arena, (n + 1) * sizeof(char *), p->hint);
    if (texts == NULL) return req_fail_oom(p);
    for (size_t j = 0; j < n; j++) {
        if (part_text(p, i, j, a->u.array.values[j], role, &texts[j]) != 0) {
            return -1;
        }
        total += strlen(texts[j]) + 1;
    }
    s = req_arena_alloc(&p->arena, total + 1, p->hint);
    if (s == NULL) return req_fail_oom(p);
    for (size_t j = 0; j < n; j++) {
        size_t len = strlen(texts[j]);

        if (j > 0) s[at++] = '\n';
        memcpy(s + at, texts[j], len);
        at += len;
    }
    s[at] = '\0';
    *out = s;
    return 0;
}

/* Message i: role and content. Content may be absent or null only for an
 * assistant turn (one that carried tool calls or audio): it is then "". */
static int parse_message(Parser *p, int i, yajl_val m, ChatMsg *msg,
                         const char **audio_id) {
    char     param[64], c[REQ_CLIP + 4];
    yajl_val role, content;

    snprintf(param, sizeof(param), "messages[%d]", i);
    if (!YAJL_IS_OBJECT(m)) return req_fail_type(p, param, "an object", m);
    role = req_member(m, "role");
    snprintf(param, sizeof(param), "messages[%d].role", i);
    if (role == NULL) return req_fail(p, param, "is required");
    if (!YAJL_IS_STRING(role)) {
        return req_fail_type(p, param, "a string", role);
    }
    msg->role = role_of(role->u.string);
    if (msg->role == NULL) {
        return req_fail(p, param, "must be one of 'system', 'user', "
                    "'assistant', 'developer', 'tool', got '%s'",
                    req_clip(role->u.string, c));
    }
    if (req_member(m, "audio") != NULL
        && req_message_audio(p, i, req_member(m, "audio"), msg, audio_id) != 0)
        return -1;
    content = req_member(m, "content");
    snprintf(param, sizeof(param), "messages[%d].content", i);
    if (content == NULL) {
        if (strcmp(msg->role, "assistant") != 0) {
            return req_fail(p, param, "is required");
        }
        msg->content = "";
        return 0;
    }
    if (YAJL_IS_ARRAY(content)) {
        return content_parts(p, i, content, msg->role, &msg->content);
    }
    if (!YAJL_IS_STRING(content)) {
        return req_fail_type(p, param, "a string or an array of content parts",
                         content);
    }
    return req_get_string(p, param, content, &msg->content, NULL);
}

static int parse_messages(Parser *p, yajl_val v, OmniRequest *r) {
    size_t n;

    if (!YAJL_IS_ARRAY(v)) return req_fail_type(p, "messages", "an array", v);
    n = v->u.array.len;
    if (n == 0) return req_fail(p, "messages", "must not be empty");
    if (n > REQ_MAX_MESSAGES) {
        return req_fail(p, "messages", "at most %d messages, got %zu",
                    REQ_MAX_MESSAGES, n);
    }
    r->msgs = req_arena_alloc(&p->arena, n * sizeof(ChatMsg), p->hint);
    r->audio_ids = req_arena_alloc(&p->arena, n * sizeof(char *), p->hint);
    r->has_audio = req_arena_alloc(&p->arena, n * sizeof(bool), p->hint);
    if (r->msgs == NULL || r->audio_ids == NULL || r->has_audio == NULL) {
        return req_fail_oom(p);
    }
    for (size_t i = 0; i < n; i++) {
        r->audio_ids[i] = NULL;
        r->has_audio[i] = false;
        if (parse_message(p, (int) i, v->u.array.values[i], &r->msgs[i],
                          &r->audio_ids[i]) != 0)
            return -1;
        r->has_audio[i] = r->has_audio[i] || r->audio_ids[i] != NULL;
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
        return req_fail(p, "logit_bias", "key '%s' is not a token id",
                    req_clip(key, c));
    }
    if (!YAJL_IS_NUMBER(v)) {
        return req_fail_type(p, "logit_bias", "a number", v);
    }
    d = strtod(v->u.number.r, NULL);
    if (!(d >= -100 && d <= 100)) {
        return req_fail(p, "logit_bias", "bias for token %s must be between "
                    "-100 and 100, got %s", req_clip(key, c),
                    req_clip(v->u.number.r, c2));
    }
    b->token = (int32_t) strtol(key, NULL, 10);
    b->bias = (float) d;
    return 0;
}

/* A token given twice keeps its last bias. O(n^2) over at most
 * SAMPLER_MAX_BIAS entries. */
static int parse_logit_bias(Parser *p, yajl_val v, SamplerParams *sp) {
    size_t n;

    if (!YAJL_IS_OBJECT(v)) {
        return req_fail_type(p, "logit_bias", "an object", v);
    }
    n = v->u.object.len;
    if (n > SAMPLER_MAX_BIAS) {
        return req_fail(p, "logit_bias", "at most %d entries, got %zu",
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
        return req_fail_type(p, "stop", "a string or an array of strings", s);
    }
    len = strlen(s->u.string);
    if (len == 0) {
        return req_fail(p, "stop", "sequence %d is empty", r->n_stop);
    }
    if (len > STOP_MAX_LEN - 1) {
        return req_fail(p, "stop", "sequence %d is %zu bytes, at most %d",
                    r->n_stop, len, STOP_MAX_LEN - 1);
    }
    if (req_get_string(p, "stop", s, &r->stop[r->n_stop], NULL) != 0) {
        return -1;
    }
    r->n_stop++;
    return 0;
}

static int parse_stop(Parser *p, yajl_val v, OmniRequest *r) {
    if (!YAJL_IS_ARRAY(v)) return add_stop(p, v, r);
    if (v->u.array.len > STOP_MAX) {
        return req_fail(p, "stop", "at most %d sequences, got %zu", STOP_MAX,
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
        req_fail(p, "", "%s", err.msg);
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

        v = req_member(o, FLOAT_PARAMS[k].name);
        if (v != NULL && req_get_float(p, FLOAT_PARAMS[k].name, v,
                                   FLOAT_PARAMS[k].lo, FLOAT_PARAMS[k].hi,
                                   FLOAT_PARAMS[k].lo_open, f) != 0) {
            return -1;
        }
    }
    if ((v = req_member(o, "top_k")) != NULL) {
        if (req_get_int(p, "top_k", v, 0, INT32_MAX, &i) != 0) return -1;
        sp->top_k = (int32_t) i;
    }
    if ((v = req_member(o, "seed")) != NULL) {
        if (req_get_int(p, "seed", v, 0, INT64_MAX, &i) != 0) return -1;
        sp->seed = (uint64_t) i;
    } else if (draw_seed(p, &sp->seed) != 0) {
        return -1;
    } else {
        *drawn = true;
    }
    if ((v = req_member(o, "logit_bias")) != NULL) {
        return parse_logit_bias(p, v, sp);
    }
    return 0;
}

/* The request's input: exactly one of messages, prompt and input. */
static int parse_input(Parser *p, yajl_val o, OmniRequest *r) {
    yajl_val msgs = req_member(o, "messages");
    yajl_val prompt = req_member(o, "prompt");
    yajl_val input = req_member(o, "input");

    if ((msgs != NULL) + (prompt != NULL) + (input != NULL) > 1) {
        return req_fail(p, input != NULL ? "input" : "prompt", "give one of "
                    "messages, prompt and input, not several");
    }
    if (msgs != NULL) return parse_messages(p, msgs, r);
    if (input != NULL) return req_speech_input(p, input, r);
    if (prompt == NULL) {
        if (r->transcribe) return 0;
        return req_fail(p, "messages", "one of messages or prompt is "
                        "required");
    }
    return req_get_string(p, "prompt", prompt, &r->prompt, &r->prompt_len);
}

static int parse_root(Parser *p, yajl_val o, OmniRequest *r) {
    yajl_val v;

    if (!YAJL_IS_OBJECT(o)) {
        return req_fail(p, "", "the request must be a JSON object, got %s",
                    req_type_name(o));
    }
    if ((v = req_member(o, "model")) != NULL
        && req_get_string(p, "model", v, &r->model, NULL) != 0)
        return -1;
    if (req_parse_audio_in(p, o, r) != 0) return -1;
    if (parse_input(p, o, r) != 0) return -1;
    if (req_audio_in_check(p, r) != 0) return -1;
    if ((v = req_member(o, "audio")) != NULL
        && req_parse_audio(p, v, &r->speech) != 0)
        return -1;
    if ((v = req_member(o, "audio_transcripts")) != NULL
        && req_parse_transcripts(p, v, r) != 0)
        return -1;
    if (r->input != NULL && !r->speech.on) {
        return req_fail(p, "audio", "is required with input (the voice to "
                    "speak it in)");
    }
    r->max_tokens = -1;
    if ((v = req_member(o, "max_tokens")) != NULL
        && req_get_int(p, "max_tokens", v, 1, INT64_MAX, &r->max_tokens) != 0)
        return -1;
    if (parse_sampling(p, o, &r->sampling, &r->seed_drawn) != 0) return -1;
    if ((v = req_member(o, "stop")) != NULL && parse_stop(p, v, r) != 0) {
        return -1;
    }
    if ((v = req_member(o, "ignore_eos")) != NULL) {
        if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v)) {
            return req_fail_type(p, "ignore_eos", "a boolean", v);
        }
        r->ignore_eos = YAJL_IS_TRUE(v);
    }
    r->thinking = true;
    if ((v = req_member(o, "thinking")) != NULL) {
        if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v)) {
            return req_fail_type(p, "thinking", "a boolean", v);
        }
        r->thinking = YAJL_IS_TRUE(v);
    }
    if ((v = req_member(o, "cache_salt")) == NULL) return 0;
    if (req_get_string(p, "cache_salt", v, &r->cache_salt,
                       &r->cache_salt_len)) {
        return -1;
    }
    if (r->cache_salt_len == 0 || r->cache_salt_len > REQ_MAX_SALT) {
        return req_fail(p, "cache_salt", "must be 1 to %d bytes, got %zu",
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
    if (n == 0) return req_fail(p, "", BAD_JSON);
    return req_fail(p, "", BAD_JSON ": %.*s", (int) n, yajl_msg);
}

int request_parse(OmniRequest *r, const char *json, size_t len,
                  ReqError *e) {
    Parser   p = { .arena = NULL, .hint = len + 256, .e = e, .req = r };
    char     ebuf[256];
    char    *copy;
    yajl_val root;
    int      rc;

    memset(r, 0, sizeof(*r));
    memset(e, 0, sizeof(*e));
    if (req_prescan(&p, json, len) != 0) return -1;
    copy = malloc(len + 1);
    if (copy == NULL) return req_fail_oom(&p);
    memcpy(copy, json, len);
    copy[len] = '\0';
    root = yajl_tree_parse(copy, ebuf, sizeof(ebuf));
    free(copy);
    if (root == NULL) return fail_json(&p, ebuf);

    rc = parse_root(&p, root, r);
    yajl_tree_free(root);
    if (rc != 0) {
        req_arena_free(p.arena);
        memset(r, 0, sizeof(*r));
        return -1;
    }
    r->arena = p.arena;
    return 0;
}

void request_free(OmniRequest *r) {
    req_arena_free(r->arena);
    memset(r, 0, sizeof(*r));
}

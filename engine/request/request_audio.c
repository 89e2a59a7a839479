/* request_audio.c -- the audio parts of a request: speech out ("audio",
 * "input", audio ids and their transcripts) and audio in ("audio_in",
 * "max_audio_seconds", "transcribe", input_audio content parts and the
 * texts the frontend adds for them). request.h has the format. */

#include <stdio.h>
#include <string.h>

#include "omni_proto.h"
#include "request_impl.h"


/* ---- speech out ---- */

/* An audio id: 1..SPEECH_MAX_ID bytes of [A-Za-z0-9_-], so that it can go
 * into logs and keys as it is. */
static int get_audio_id(Parser *p, const char *param, yajl_val v,
                        const char **out) {
    size_t n;

    if (req_get_string(p, param, v, out, &n) != 0) return -1;
    if (n == 0 || n > SPEECH_MAX_ID
        || strspn(*out, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789_-") != n)
    {
        return req_fail(p, param, "must be 1 to %d characters of A-Z, a-z, "
                        "0-9, "
                    "'_' and '-'", SPEECH_MAX_ID);
    }
    return 0;
}

/* An assistant turn's {"audio": {"id": ...}}: an earlier spoken answer. */
int req_message_audio(Parser *p, int i, yajl_val a, const ChatMsg *msg,
                         const char **audio_id) {
    char param[64];

    snprintf(param, sizeof(param), "messages[%d].audio", i);
    if (strcmp(msg->role, "assistant") != 0) {
        return req_fail(p, param, "only an assistant message may refer to "
                    "audio");
    }
    if (!YAJL_IS_OBJECT(a)) return req_fail_type(p, param, "an object", a);
    snprintf(param, sizeof(param), "messages[%d].audio.id", i);
    if (req_member(a, "id") == NULL) return req_fail(p, param, "is required");
    return get_audio_id(p, param, req_member(a, "id"), audio_id);
}


/* Characters (not bytes) in well-formed UTF-8: the bytes that do not
 * continue one. */
static size_t utf8_chars(const char *s, size_t n) {
    size_t k = 0;

    for (size_t i = 0; i < n; i++) k += ((unsigned char) s[i] & 0xC0) != 0x80;
    return k;
}

/* Text to speak as it is: 1..SPEECH_MAX_INPUT characters. */
int req_speech_input(Parser *p, yajl_val v, OmniRequest *r) {
    size_t chars;

    if (req_get_string(p, "input", v, &r->input, &r->input_len) != 0) {
        return -1;
    }
    chars = utf8_chars(r->input, r->input_len);
    if (chars == 0 || chars > SPEECH_MAX_INPUT) {
        return req_fail(p, "input", "must be 1 to %d characters, got %zu",
                    SPEECH_MAX_INPUT, chars);
    }
    return 0;
}


/* A string member of "audio" naming one of a fixed set; its index in
 * *out, or def when absent. */
static int audio_enum(Parser *p, yajl_val a, const char *key,
                      int (*lookup)(const char *), const char *allowed,
                      int def, int *out) {
    char     param[32], c[REQ_CLIP + 4];
    yajl_val v = req_member(a, key);

    snprintf(param, sizeof(param), "audio.%s", key);
    *out = def;
    if (v == NULL) return 0;
    if (!YAJL_IS_STRING(v)) return req_fail_type(p, param, "a string", v);
    *out = lookup(v->u.string);
    if (*out < 0) {
        return req_fail(p, param, "must be one of %s, got '%s'", allowed,
                    req_clip(v->u.string, c));
    }
    return 0;
}

static int speech_mode(const char *s) {
    return strcmp(s, "latency") == 0 ? SPEECH_LATENCY
           : strcmp(s, "quality") == 0 ? SPEECH_QUALITY : -1;
}

/* "audio": speech out. */
int req_parse_audio(Parser *p, yajl_val a, SpeechParams *sp) {
    char     c[REQ_CLIP + 4];
    yajl_val v;
    int      fmt, mode;

    if (!YAJL_IS_OBJECT(a)) return req_fail_type(p, "audio", "an object", a);
    if ((v = req_member(a, "voice")) == NULL) {
        return req_fail(p, "audio.voice", "is required");
    }
    if (!YAJL_IS_STRING(v)) {
        return req_fail_type(p, "audio.voice", "a string", v);
    }
    sp->voice = speech_voice(v->u.string);
    if (sp->voice == NULL) {
        return req_fail(p, "audio.voice", "unknown voice '%s'; the voices are "
                    "alloy, ash, ballad, coral, echo, fable, nova, onyx, "
                    "sage, shimmer, verse, marin, cedar, rms, slt, awb and "
                    "kal16", req_clip(v->u.string, c));
    }
    if (audio_enum(p, a, "format", speech_format, "mp3, opus, aac, flac, "
                   "wav and pcm", AUDIO_MP3, &fmt) != 0
        || audio_enum(p, a, "mode", speech_mode, "latency and quality",
                      SPEECH_LATENCY, &mode) != 0)
        return -1;
    sp->format = (AudioFormat) fmt;
    sp->mode = (SpeechMode) mode;
    sp->speed = 1.0f;
    if ((v = req_member(a, "speed")) != NULL
        && req_get_float(p, "audio.speed", v, SPEECH_MIN_SPEED,
                         SPEECH_MAX_SPEED,
                     false, &sp->speed) != 0)
        return -1;
    if ((v = req_member(a, "id")) != NULL
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
int req_parse_transcripts(Parser *p, yajl_val v, OmniRequest *r) {
    yajl_val t;

    if (!YAJL_IS_OBJECT(v)) {
        return req_fail_type(p, "audio_transcripts", "an object", v);
    }
    for (int i = 0; r->chat && i < r->n_msgs; i++) {
        if (r->audio_ids[i] == NULL
            || (t = req_member(v, r->audio_ids[i])) == NULL)
            continue;
        if (req_get_string(p, "audio_transcripts", t, &r->msgs[i].content,
                       NULL) != 0)
            return -1;
    }
    return 0;
}


/* ---- audio in ---- */

static const struct {
    const char    *name;
    AudioInFormat  format;
} audio_in_formats[] = {
    { "auto", AUDIO_IN_AUTO }, { "wav", AUDIO_IN_WAV },
    { "mp3", AUDIO_IN_MP3 }, { "flac", AUDIO_IN_FLAC },
    { "opus", AUDIO_IN_OPUS }, { "ogg", AUDIO_IN_OPUS },
};

int request_audio_format(const char *s, AudioInFormat *f) {
    for (size_t i = 0; i < sizeof(audio_in_formats)
                           / sizeof(audio_in_formats[0]); i++) {
        if (strcmp(s, audio_in_formats[i].name) == 0) {
            *f = audio_in_formats[i].format;
            return 0;
        }
    }
    return -1;
}

/* audio_in[k]: {"format", "bytes", "param"}. */
static int audio_in_entry(Parser *p, int k, yajl_val v, AudioIn *in) {
    char        param[64], c[REQ_CLIP + 4];
    yajl_val    f, b, pa;
    int64_t     bytes;
    const char *s;
    size_t      n;

    snprintf(param, sizeof(param), "audio_in[%d]", k);
    if (!YAJL_IS_OBJECT(v)) return req_fail_type(p, param, "an object", v);
    in->format = AUDIO_IN_AUTO;
    snprintf(param, sizeof(param), "audio_in[%d].format", k);
    if ((f = req_member(v, "format")) != NULL) {
        if (!YAJL_IS_STRING(f)) return req_fail_type(p, param, "a string", f);
        if (request_audio_format(f->u.string, &in->format) != 0) {
            return req_fail(p, param, "must be one of wav, mp3, flac, opus, "
                            "ogg and auto, got '%s'",
                            req_clip(f->u.string, c));
        }
    }
    snprintf(param, sizeof(param), "audio_in[%d].bytes", k);
    if ((b = req_member(v, "bytes")) == NULL) {
        return req_fail(p, param, "is required");
    }
    if (req_get_int(p, param, b, 1, OMNI_MAX_AUDIO_IN_TOTAL, &bytes) != 0) {
        return -1;
    }
    in->bytes = (uint64_t) bytes;
    in->param = "";
    snprintf(param, sizeof(param), "audio_in[%d].param", k);
    if ((pa = req_member(v, "param")) != NULL) {
        if (req_get_string(p, param, pa, &s, &n) != 0) return -1;
        if (n >= sizeof(p->e->param)) {
            return req_fail(p, param, "at most %zu bytes",
                            sizeof(p->e->param) - 1);
        }
        in->param = s;
    }
    return 0;
}

static int parse_audio_in_list(Parser *p, yajl_val v, OmniRequest *r) {
    size_t n;

    if (!YAJL_IS_ARRAY(v)) return req_fail_type(p, "audio_in", "an array", v);
    n = v->u.array.len;
    if (n == 0 || n > REQ_MAX_AUDIO_IN) {
        return req_fail(p, "audio_in", "must hold 1 to %d inputs, got %zu",
                        REQ_MAX_AUDIO_IN, n);
    }
    r->audio_in = req_arena_alloc(&p->arena, n * sizeof(AudioIn), p->hint);
    if (r->audio_in == NULL) return req_fail_oom(p);
    for (size_t k = 0; k < n; k++) {
        if (audio_in_entry(p, (int) k, v->u.array.values[k], &r->audio_in[k]))
            return -1;
        r->audio_in_bytes += r->audio_in[k].bytes;
    }
    r->n_audio_in = (int) n;
    if (r->audio_in_bytes > OMNI_MAX_AUDIO_IN_TOTAL) {
        return req_fail(p, "audio_in", "at most %u bytes of audio in all, "
                        "got %llu", OMNI_MAX_AUDIO_IN_TOTAL,
                        (unsigned long long) r->audio_in_bytes);
    }
    return 0;
}

/* "transcribe": {"language", "prompt", "words"}. prompt is accepted and
 * unused (the recogniser takes no context yet). */
static int parse_transcribe(Parser *p, yajl_val v, OmniRequest *r) {
    char     c[REQ_CLIP + 4];
    yajl_val l, w;

    if (!YAJL_IS_OBJECT(v)) {
        return req_fail_type(p, "transcribe", "an object", v);
    }
    if ((l = req_member(v, "language")) != NULL) {
        if (req_get_string(p, "language", l, &r->language, NULL) != 0) {
            return -1;
        }
        if (strcmp(r->language, "en") != 0) {
            return req_fail(p, "language", "unsupported language '%s': the "
                            "recogniser knows only 'en'",
                            req_clip(r->language, c));
        }
    }
    if ((w = req_member(v, "prompt")) != NULL && !YAJL_IS_STRING(w)) {
        return req_fail_type(p, "prompt", "a string", w);
    }
    if ((w = req_member(v, "words")) != NULL) {
        if (!YAJL_IS_TRUE(w) && !YAJL_IS_FALSE(w)) {
            return req_fail_type(p, "transcribe.words", "a boolean", w);
        }
        r->words = YAJL_IS_TRUE(w);
    }
    r->transcribe = true;
    return 0;
}

/* "audio_in_text": one string per input, which only the frontend writes. */
static int parse_audio_in_text(Parser *p, yajl_val v, OmniRequest *r) {
    size_t n;

    if (!YAJL_IS_ARRAY(v)) {
        return req_fail_type(p, "audio_in_text", "an array", v);
    }
    n = v->u.array.len;
    if ((int) n != r->n_audio_in) {
        return req_fail(p, "audio_in_text", "must hold one text per "
                        "audio_in (%d), got %zu", r->n_audio_in, n);
    }
    r->audio_in_text = req_arena_alloc(&p->arena, n * sizeof(char *),
                                       p->hint);
    if (r->audio_in_text == NULL) return req_fail_oom(p);
    for (size_t k = 0; k < n; k++) {
        if (req_get_string(p, "audio_in_text", v->u.array.values[k],
                           &r->audio_in_text[k], NULL) != 0)
            return -1;
    }
    return 0;
}

int req_parse_audio_in(Parser *p, yajl_val o, OmniRequest *r) {
    yajl_val v;
    float    max;

    r->max_audio_seconds = REQ_MAX_AUDIO_SECONDS_DEFAULT;
    if ((v = req_member(o, "audio_in")) != NULL
        && parse_audio_in_list(p, v, r) != 0)
        return -1;
    if ((v = req_member(o, "max_audio_seconds")) != NULL) {
        if (req_get_float(p, "max_audio_seconds", v, 0, 86400, true, &max)) {
            return -1;
        }
        r->max_audio_seconds = max;
    }
    if ((v = req_member(o, "transcribe")) != NULL
        && parse_transcribe(p, v, r) != 0)
        return -1;
    if ((v = req_member(o, "audio_in_text")) != NULL) {
        if (r->n_audio_in == 0) {
            return req_fail(p, "audio_in_text", "needs audio_in");
        }
        return parse_audio_in_text(p, v, r);
    }
    return 0;
}

/* Part j of message i is {"type": "input_audio", "index": k}: the text of
 * audio_in[k], "" until the frontend adds it. Only in a user turn; each
 * input in exactly one place (req_audio_in_check counts them). */
int req_input_audio_part(Parser *p, int i, size_t j, yajl_val part,
                         const char *role, const char **text) {
    char     param[64];
    yajl_val v;
    int64_t  k;

    snprintf(param, sizeof(param), "messages[%d].content[%zu]", i, j);
    if (strcmp(role, "user") != 0) {
        return req_fail(p, param, "audio input is allowed in user messages "
                        "only");
    }
    snprintf(param, sizeof(param), "messages[%d].content[%zu].index", i, j);
    if ((v = req_member(part, "index")) == NULL) {
        return req_fail(p, param, "is required");
    }
    if (p->req->n_audio_in == 0) {
        return req_fail(p, param, "refers to audio_in, which is absent");
    }
    if (req_get_int(p, param, v, 0, p->req->n_audio_in - 1, &k) != 0) {
        return -1;
    }
    if (p->audio_seen & (1u << k)) {
        return req_fail(p, param, "audio_in[%d] is used twice", (int) k);
    }
    p->audio_seen |= 1u << k;
    p->req->has_audio[i] = true;
    *text = p->req->audio_in_text != NULL ? p->req->audio_in_text[k] : "";
    return 0;
}

/* After the input: audio_in goes with a transcription (one input, no
 * messages, prompt or input) or with messages that place every input. */
int req_audio_in_check(Parser *p, const OmniRequest *r) {
    if (r->transcribe) {
        if (r->n_audio_in != 1) {
            return req_fail(p, "audio_in", "a transcription takes exactly "
                            "one audio input, got %d", r->n_audio_in);
        }
        if (r->chat || r->prompt != NULL || r->input != NULL) {
            return req_fail(p, "transcribe", "a transcription takes no "
                            "messages, prompt or input");
        }
        return 0;
    }
    if (r->n_audio_in == 0) return 0;
    if (!r->chat) {
        return req_fail(p, "audio_in", "audio input needs messages (or "
                        "transcribe)");
    }
    for (int k = 0; k < r->n_audio_in; k++) {
        if (!(p->audio_seen & (1u << k))) {
            return req_fail(p, "audio_in", "audio_in[%d] is in no message",
                            k);
        }
    }
    return 0;
}

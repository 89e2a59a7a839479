
/*
 * Copyright (C) ngx_omni authors
 *
 * ngx_http_omni_speech.c -- speech requests in: the body of
 * POST /v1/audio/speech, and chat's "modalities": ["text", "audio"] with
 * its "audio" object. Both become the engine's "audio" object
 * (engine/request/request.h: voice, format, speed, mode, id). Apart from
 * ngx_http_omni_request.c because the speech endpoint has its own body
 * (input, voice, response_format, ...) and its own error names, which
 * the engine's ("audio.voice") are mapped back to here.
 *
 * The module checks what decides the response (the format: its
 * Content-Type; stream_format; pcm16 when chat streams) and what OpenAI
 * refuses by shape (lengths, ranges, custom voices); the voice names are
 * the engine's table (engine/request/speech.c), which answers 400
 * "audio.voice" for a name it does not know. No I/O.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_request.h"


#define NGX_HTTP_OMNI_SPEECH_CHARS  4096    /* input, instructions */
#define NGX_HTTP_OMNI_SHOWN         64      /* bytes of a bad value quoted */


static ngx_int_t ngx_http_omni_speech_text(ngx_http_request_t *r,
    yajl_val root, char *key, ngx_uint_t required, yajl_val *out,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_speech_voice(ngx_http_request_t *r,
    yajl_val o, char *param, ngx_http_omni_speech_t *sp,
    ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_speech_enum(ngx_http_request_t *r,
    yajl_val o, char *key, char *param, const char *const *names,
    char *list, ngx_uint_t *index, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_speech_speed(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_speech_t *sp, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_speech_mode(ngx_http_request_t *r,
    yajl_val root, ngx_http_omni_speech_t *sp, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_audio_id(ngx_http_request_t *r,
    ngx_http_omni_req_t *req);


/* response_format (speech) and the engine's format names: the same */
static const char *const  ngx_http_omni_speech_formats[] = {
    "mp3", "opus", "aac", "flac", "wav", "pcm", NULL
};

/* chat's audio.format; pcm16 is the engine's "pcm" */
static const char *const  ngx_http_omni_chat_formats[] = {
    "wav", "mp3", "flac", "opus", "pcm16", "aac", NULL
};

static const char *const  ngx_http_omni_engine_formats[] = {
    "wav", "mp3", "flac", "opus", "pcm", "aac", NULL
};

static const char *const  ngx_http_omni_stream_formats[] = {
    "audio", "sse", NULL
};

/* the order of ngx_http_omni_speech_mode_e */
static const char *const  ngx_http_omni_modes[] = {
    "latency", "quality", NULL
};


/* the engine's names of the speech endpoint's fields, and OpenAI's */
static const char *const  ngx_http_omni_speech_params[][2] = {
    { "audio.voice", "voice" },
    { "audio.format", "response_format" },
    { "audio.speed", "speed" },
    { "audio.mode", "speech_mode" },
    { NULL, NULL }
};


/* POST /v1/audio/speech: {"model", "input", "voice", "response_format",
 * "speed", "instructions", "stream_format", "speech_mode"}, for
 * {"model", "input", "audio": {...}} (ngx_http_omni_parse() writes it). */

ngx_int_t
ngx_http_omni_speech_check(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    yajl_val    v;
    ngx_int_t   rc;
    ngx_uint_t  i, flag;

    rc = ngx_http_omni_check_model(r, root, f, req, err);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_text(r, root, "input", 1, &f->input, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_voice(r, root, "voice", &f->speech, err);
    }

    i = 0;

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_enum(r, root, "response_format",
                                       "response_format",
                                       ngx_http_omni_speech_formats,
                                       "'mp3', 'opus', 'aac', 'flac', 'wav' "
                                       "and 'pcm'", &i, err);
    }

    f->speech.format = (char *) ngx_http_omni_speech_formats[i];
    req->format.data = (u_char *) f->speech.format;
    req->format.len = ngx_strlen(f->speech.format);

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_speed(r, root, &f->speech, err);
    }

    /* instructions: checked as OpenAI does, then ignored (Flite has no
     * style prompt) */

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_text(r, root, "instructions", 0, &v, err);
    }

    i = 0;

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_enum(r, root, "stream_format",
                                       "stream_format",
                                       ngx_http_omni_stream_formats,
                                       "'audio' and 'sse'", &i, err);
    }

    /* "stream": not OpenAI's, sent by some clients: a boolean, ignored;
     * the audio always streams */

    flag = 0;

    if (rc == NGX_OK) {
        rc = ngx_http_omni_bool(r, root, "stream", "stream", &flag, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_speech_mode(r, root, &f->speech, err);
    }

    req->stream = 1;
    req->sse = (i == 1);
    f->speech.on = 1;

    return rc;
}


/*
 * Chat's audio out. With "audio" in modalities: "audio" {"voice",
 * "format"} is required, and a stream takes pcm16 only (OpenAI's words);
 * the module mints the id under which the engine keeps the transcript.
 * Without it, "audio" is refused: it would be silently ignored.
 */

ngx_int_t
ngx_http_omni_check_chat_audio(ngx_http_request_t *r, yajl_val root,
    ngx_uint_t audio, ngx_http_omni_fields_t *f, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    yajl_val                 a;
    ngx_int_t                rc;
    ngx_uint_t               i;
    ngx_http_omni_speech_t  *sp;

    a = ngx_http_omni_member(root, "audio");

    if (!audio) {
        if (a == NULL) {
            return NGX_OK;
        }

        return ngx_http_omni_invalid(r, err, "audio", "invalid_value",
                                     "Invalid 'audio': it is only allowed "
                                     "when 'modalities' includes "
                                     "'audio'.");
    }

    if (a == NULL) {
        return ngx_http_omni_invalid(r, err, "audio",
                                     "missing_required_parameter",
                                     "Missing required parameter: 'audio'. "
                                     "It is required when 'modalities' "
                                     "includes 'audio'.");
    }

    if (!YAJL_IS_OBJECT(a)) {
        return ngx_http_omni_invalid_type(r, err, "audio", "an object", a);
    }

    sp = &f->speech;

    rc = ngx_http_omni_speech_voice(r, a, "audio.voice", sp, err);
    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_omni_member(a, "format") == NULL) {
        return ngx_http_omni_invalid(r, err, "audio.format",
                                     "missing_required_parameter",
                                     "Missing required parameter: "
                                     "'audio.format'.");
    }

    rc = ngx_http_omni_speech_enum(r, a, "format", "audio.format",
                                   ngx_http_omni_chat_formats,
                                   "'wav', 'mp3', 'flac', 'opus', 'pcm16' "
                                   "and 'aac'", &i, err);
    if (rc != NGX_OK) {
        return rc;
    }

    if (req->stream && i != 4) {
        return ngx_http_omni_invalid(r, err, "audio.format",
                                     "unsupported_value",
                                     "Unsupported value: 'audio.format' "
                                     "does not support '%s' when "
                                     "stream=true. Supported values are: "
                                     "'pcm16'.",
                                     ngx_http_omni_chat_formats[i]);
    }

    sp->format = (char *) ngx_http_omni_engine_formats[i];
    req->format.data = (u_char *) ngx_http_omni_chat_formats[i];
    req->format.len = ngx_strlen(ngx_http_omni_chat_formats[i]);

    rc = ngx_http_omni_speech_mode(r, root, sp, err);
    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_omni_audio_id(r, req) != NGX_OK) {
        return NGX_ERROR;
    }

    sp->id = (char *) req->audio_id.data;
    sp->on = 1;
    req->audio = 1;

    return NGX_OK;
}


/* {"voice", "format", "speed" (when given), "mode", "id" (chat)} */

ngx_uint_t
ngx_http_omni_gen_audio(yajl_gen g, ngx_http_omni_speech_t *sp)
{
    ngx_uint_t  s;

    s = ngx_http_omni_gen_str(g, "audio");
    s |= yajl_gen_map_open(g);

    s |= ngx_http_omni_gen_str(g, "voice");
    s |= ngx_http_omni_gen_str(g, sp->voice);
    s |= ngx_http_omni_gen_str(g, "format");
    s |= ngx_http_omni_gen_str(g, sp->format);

    if (sp->speed != NULL) {
        s |= ngx_http_omni_gen_str(g, "speed");
        s |= ngx_http_omni_gen_value(g, sp->speed);
    }

    s |= ngx_http_omni_gen_str(g, "mode");
    s |= ngx_http_omni_gen_str(g, sp->mode);

    if (sp->id != NULL) {
        s |= ngx_http_omni_gen_str(g, "id");
        s |= ngx_http_omni_gen_str(g, sp->id);
    }

    s |= yajl_gen_map_close(g);

    return s;
}


/* An engine ERROR of the speech endpoint names its fields as the engine
 * does ("audio.voice"): put OpenAI's names back. err->param must be a
 * view that outlives the response: static strings do. */

void
ngx_http_omni_speech_error(ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err)
{
    ngx_uint_t  i;

    if (ctx->endpoint->kind != NGX_HTTP_OMNI_KIND_SPEECH) {
        return;
    }

    for (i = 0; ngx_http_omni_speech_params[i][0] != NULL; i++) {

        if (err->param.len == ngx_strlen(ngx_http_omni_speech_params[i][0])
            && ngx_strncmp(err->param.data, ngx_http_omni_speech_params[i][0],
                           err->param.len) == 0)
        {
            err->param.data = (u_char *) ngx_http_omni_speech_params[i][1];
            err->param.len = ngx_strlen(ngx_http_omni_speech_params[i][1]);
            return;
        }
    }
}


/* A string of 1 to 4096 characters (input, instructions); *out NULL when
 * absent and not required. The body is valid UTF-8 (the pre-scan):
 * characters are the bytes that do not continue one. */

static ngx_int_t
ngx_http_omni_speech_text(ngx_http_request_t *r, yajl_val root, char *key,
    ngx_uint_t required, yajl_val *out, ngx_http_omni_error_t *err)
{
    u_char    *p;
    size_t     n;
    yajl_val   v;

    v = ngx_http_omni_member(root, key);
    *out = v;

    if (v == NULL) {
        if (!required) {
            return NGX_OK;
        }

        return ngx_http_omni_invalid(r, err, key,
                                     "missing_required_parameter",
                                     "Missing required parameter: '%s'.",
                                     key);
    }

    if (!YAJL_IS_STRING(v)) {
        return ngx_http_omni_invalid_type(r, err, key, "a string", v);
    }

    n = 0;

    for (p = (u_char *) v->u.string; *p; p++) {
        n += ((*p & 0xc0) != 0x80);
    }

    if (n == 0 && required) {
        return ngx_http_omni_invalid(r, err, key, "empty_string",
                                     "Invalid '%s': empty string. Expected "
                                     "a string with minimum length 1, but "
                                     "got an empty string instead.", key);
    }

    if (n > NGX_HTTP_OMNI_SPEECH_CHARS) {
        return ngx_http_omni_invalid(r, err, key, "string_above_max_length",
                                     "Invalid '%s': string too long. "
                                     "Expected a string with maximum "
                                     "length %d, but got a string with "
                                     "length %uz instead.", key,
                                     NGX_HTTP_OMNI_SPEECH_CHARS, n);
    }

    return NGX_OK;
}


/* voice: a name (the engine's table decides), or {"id": ...}, a custom
 * voice, which there is none of. */

static ngx_int_t
ngx_http_omni_speech_voice(ngx_http_request_t *r, yajl_val o, char *param,
    ngx_http_omni_speech_t *sp, ngx_http_omni_error_t *err)
{
    yajl_val  v, id;

    v = ngx_http_omni_member(o, "voice");

    if (v == NULL) {
        return ngx_http_omni_invalid(r, err, param,
                                     "missing_required_parameter",
                                     "Missing required parameter: '%s'.",
                                     param);
    }

    if (YAJL_IS_STRING(v)) {

        if (v->u.string[0] == '\0') {
            return ngx_http_omni_invalid(r, err, param, "empty_string",
                                         "Invalid '%s': empty string. "
                                         "Expected a voice name.", param);
        }

        sp->voice = v->u.string;
        return NGX_OK;
    }

    if (!YAJL_IS_OBJECT(v)) {
        return ngx_http_omni_invalid_type(r, err, param,
                                          "a voice name or an object", v);
    }

    id = ngx_http_omni_member(v, "id");

    if (id == NULL || !YAJL_IS_STRING(id)) {
        return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                     "Invalid '%s': a custom voice is "
                                     "{\"id\": \"voice_...\"}.", param);
    }

    return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                 "Invalid '%s': unknown custom voice "
                                 "'%*s'; only the built-in voices are "
                                 "served.", param,
                                 ngx_min(ngx_strlen(id->u.string),
                                         NGX_HTTP_OMNI_SHOWN),
                                 id->u.string);
}


/* o.key, one of names (list: them in words); *index its place, left
 * alone when absent or null. */

static ngx_int_t
ngx_http_omni_speech_enum(ngx_http_request_t *r, yajl_val o, char *key,
    char *param, const char *const *names, char *list, ngx_uint_t *index,
    ngx_http_omni_error_t *err)
{
    yajl_val    v;
    ngx_uint_t  i;

    v = ngx_http_omni_member(o, key);

    if (v == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_STRING(v)) {
        return ngx_http_omni_invalid_type(r, err, param, "a string", v);
    }

    for (i = 0; names[i] != NULL; i++) {
        if (ngx_strcmp(v->u.string, names[i]) == 0) {
            *index = i;
            return NGX_OK;
        }
    }

    return ngx_http_omni_invalid(r, err, param, "invalid_value",
                                 "Invalid value for '%s': '%*s'. Supported "
                                 "values are: %s.", param,
                                 ngx_min(ngx_strlen(v->u.string),
                                         NGX_HTTP_OMNI_SHOWN),
                                 v->u.string, list);
}


/* speed: a number in [0.25, 4], passed on as given */

static ngx_int_t
ngx_http_omni_speech_speed(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_speech_t *sp, ngx_http_omni_error_t *err)
{
    double    d;
    yajl_val  v;

    v = ngx_http_omni_member(root, "speed");

    if (v == NULL) {
        return NGX_OK;
    }

    if (!YAJL_IS_NUMBER(v)) {
        return ngx_http_omni_invalid_type(r, err, "speed", "a number", v);
    }

    d = YAJL_IS_DOUBLE(v) ? YAJL_GET_DOUBLE(v) : (double) YAJL_GET_INTEGER(v);

    if (!(d >= 0.25 && d <= 4.0)) {
        return ngx_http_omni_invalid(r, err, "speed", "invalid_value",
                                     "Invalid 'speed': %*s is out of range. "
                                     "Expected a number between 0.25 and "
                                     "4.0.",
                                     ngx_min(ngx_strlen(v->u.number.r),
                                             NGX_HTTP_OMNI_SHOWN),
                                     v->u.number.r);
    }

    sp->speed = v;

    return NGX_OK;
}


/* "speech_mode" (our extension, both endpoints), else omni_speech_mode */

static ngx_int_t
ngx_http_omni_speech_mode(ngx_http_request_t *r, yajl_val root,
    ngx_http_omni_speech_t *sp, ngx_http_omni_error_t *err)
{
    ngx_int_t                  rc;
    ngx_uint_t                 i;
    ngx_http_omni_loc_conf_t  *olcf;

    olcf = ngx_http_get_module_loc_conf(r, ngx_http_omni_module);

    i = olcf->speech_mode;

    rc = ngx_http_omni_speech_enum(r, root, "speech_mode", "speech_mode",
                                   ngx_http_omni_modes,
                                   "'latency' and 'quality'", &i, err);

    sp->mode = (char *) ngx_http_omni_modes[i];

    return rc;
}


/* "audio_" and 32 hex digits from getrandom(2): an id names a stored
 * transcript, so it must not be guessable from another one. */

static ngx_int_t
ngx_http_omni_audio_id(ngx_http_request_t *r, ngx_http_omni_req_t *req)
{
    u_char  *p, rnd[16];

    if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t) sizeof(rnd)) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, ngx_errno,
                      "omni getrandom() failed for an audio id");
        return NGX_ERROR;
    }

    p = ngx_pnalloc(r->pool, sizeof("audio_") + 2 * sizeof(rnd));
    if (p == NULL) {
        return NGX_ERROR;
    }

    req->audio_id.data = p;

    p = ngx_cpymem(p, "audio_", sizeof("audio_") - 1);
    p = ngx_hex_dump(p, rnd, sizeof(rnd));
    *p = '\0';

    req->audio_id.len = p - req->audio_id.data;

    return NGX_OK;
}

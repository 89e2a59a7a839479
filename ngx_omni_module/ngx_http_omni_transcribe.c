
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_transcribe.c -- POST /v1/audio/transcriptions in
 * (openai-api.md 10.1, 10.2): a multipart/form-data upload becomes the
 * engine's transcription request (engine/request/request.h: "transcribe",
 * one "audio_in", "max_audio_seconds") and the file part's bytes, which
 * follow it in AUDIO_IN frames (ngx_http_omni_audio_in.c).
 *
 * The body is read by nginx (ngx_http_read_client_request_body(): into
 * memory, or into a temporary file past client_body_buffer_size) and
 * parsed on its way there: a request body filter gives the transcription's
 * parser (ngx_http_omni_multipart.c) each piece nginx reads, before it is
 * saved. The parser keeps the few text fields the endpoint reads and only
 * the offsets of the file part; so the file is neither copied nor read
 * back to be parsed, and its bytes go to the engine from where nginx put
 * them. A body over the endpoint's size limit (a chunked one has no
 * Content-Length to refuse it by) is a 413 as soon as it passes it; a
 * malformed one is read to its end, as a JSON body is, and refused then.
 *
 * Fields: file (required), model (required: the served model or one of
 * OpenAI's transcription models, which name it here), language (en: the
 * recogniser's only one), prompt, response_format, temperature (0..1,
 * unused: decoding is greedy), timestamp_granularities[] (word, segment;
 * verbose_json only), stream. include[], chunking_strategy and any part
 * not named here are accepted and ignored, as OpenAI's own extra fields
 * are. Each mistake is a 400 naming its field; nothing a client sends
 * reaches the engine unchecked but the audio, which only the engine can
 * judge (its 400s name "file").
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_omni_module.h"
#include "ngx_http_omni_request.h"


#define NGX_HTTP_OMNI_STT_SHOWN  40         /* bytes of a bad value quoted */


static ngx_int_t ngx_http_omni_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_omni_stt_fields(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_http_omni_req_t *req,
    ngx_str_t *language, ngx_str_t *prompt, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_stt_format(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_str_t *v, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_stt_language(ngx_http_request_t *r,
    ngx_str_t *v, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_stt_temperature(ngx_http_request_t *r,
    ngx_str_t *v, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_stt_granularities(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_http_omni_error_t *err);
static ngx_int_t ngx_http_omni_stt_text(ngx_http_request_t *r, char *param,
    ngx_str_t *v, ngx_http_omni_error_t *err);
static ngx_str_t *ngx_http_omni_stt_field(ngx_http_omni_stt_t *stt,
    char *name);
static ngx_int_t ngx_http_omni_stt_audio(ngx_http_request_t *r,
    ngx_http_omni_mp_t *mp, ngx_http_omni_req_t *req);
static char *ngx_http_omni_stt_hint(ngx_str_t *filename);
static ngx_int_t ngx_http_omni_stt_engine(ngx_http_request_t *r,
    ngx_str_t *model, ngx_str_t *language, ngx_str_t *prompt,
    ngx_http_omni_stt_t *stt, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);


static ngx_http_request_body_filter_pt  ngx_http_omni_next_request_body_filter;


/* the parts whose values are kept; the file part */
static ngx_str_t  ngx_http_omni_stt_keep[] = {
    ngx_string("model"),
    ngx_string("language"),
    ngx_string("prompt"),
    ngx_string("response_format"),
    ngx_string("temperature"),
    ngx_string("timestamp_granularities[]"),
    ngx_string("timestamp_granularities"),
    ngx_string("stream"),
    ngx_null_string
};

static ngx_str_t  ngx_http_omni_stt_file = ngx_string("file");


/* the order of ngx_http_omni_stt_format_e */
static ngx_str_t  ngx_http_omni_stt_formats[] = {
    ngx_string("json"),
    ngx_string("text"),
    ngx_string("srt"),
    ngx_string("verbose_json"),
    ngx_string("vtt"),
    ngx_null_string
};


/* OpenAI's transcription models: the served model answers for them, as
 * tts-1 names it for /v1/audio/speech */
static ngx_str_t  ngx_http_omni_stt_models[] = {
    ngx_string("whisper-1"),
    ngx_string("gpt-4o-transcribe"),
    ngx_string("gpt-4o-mini-transcribe"),
    ngx_string("gpt-4o-mini-transcribe-2025-12-15"),
    ngx_null_string
};


/* ISO 639-1: a code the recogniser does not know is an unsupported value,
 * anything else OpenAI's invalid_language_format */
static u_char  ngx_http_omni_iso639_1[] =
    "aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce "
    "ch co cr cs cu cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr "
    "fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id ie ig ii ik io is "
    "it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln "
    "lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv "
    "ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk "
    "sl sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw "
    "ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu ";


/*
 * Before the body is read: it must be multipart/form-data with a
 * boundary, and gets a parser, which the request body filter feeds.
 */

ngx_int_t
ngx_http_omni_transcribe_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err)
{
    ngx_str_t             boundary, type;
    ngx_int_t             rc;
    ngx_http_omni_stt_t  *stt;

    if (r->headers_in.content_type == NULL) {
        return ngx_http_omni_invalid(r, err, NULL, NULL,
                                     "Invalid Content-Type header (none): "
                                     "the request must be "
                                     "multipart/form-data.");
    }

    type = r->headers_in.content_type->value;

    rc = ngx_http_omni_mp_boundary(&type, &boundary);

    if (rc == NGX_DECLINED) {
        return ngx_http_omni_invalid(r, err, NULL, NULL,
                                     "Invalid Content-Type header (%*s): the "
                                     "request must be multipart/form-data.",
                                     ngx_min(type.len,
                                             NGX_HTTP_OMNI_STT_SHOWN),
                                     type.data);
    }

    if (rc == NGX_ABORT) {
        return ngx_http_omni_invalid(r, err, NULL, NULL,
                                     "Invalid Content-Type header: "
                                     "multipart/form-data needs a boundary "
                                     "of 1 to %d characters.",
                                     NGX_HTTP_OMNI_MP_BOUNDARY);
    }

    stt = ngx_pcalloc(r->pool, sizeof(ngx_http_omni_stt_t));
    if (stt == NULL) {
        return NGX_ERROR;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     stt->format = NGX_HTTP_OMNI_STT_JSON;
     *     stt->held = 0;
     *     stt->deltas = 0;
     */

    if (ngx_array_init(&stt->segments, r->pool, 8,
                       sizeof(ngx_http_omni_segment_t))
        != NGX_OK
        || ngx_array_init(&stt->words, r->pool, 32,
                          sizeof(ngx_http_omni_word_t))
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    stt->mp = ngx_http_omni_mp_create(r->pool, &boundary,
                                      ngx_http_omni_stt_keep,
                                      &ngx_http_omni_stt_file);
    if (stt->mp == NULL) {
        return NGX_ERROR;
    }

    ctx->stt = stt;

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni transcription, boundary \"%V\"", &boundary);

    return NGX_OK;
}


ngx_int_t
ngx_http_omni_transcribe_init(ngx_conf_t *cf)
{
    ngx_http_omni_next_request_body_filter = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_omni_request_body_filter;

    return NGX_OK;
}


/*
 * Each piece of a transcription's body, as nginx reads it and before it
 * is saved: into the parser. Other requests pass untouched. The parser
 * stops at its first mistake, and the body is read on (the 400 comes at
 * its end); a body over the endpoint's limit is refused at once.
 */

static ngx_int_t
ngx_http_omni_request_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    off_t                 size;
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_http_omni_mp_t   *mp;
    ngx_http_omni_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);

    if (ctx == NULL || ctx->stt == NULL || ctx->stt->mp == NULL) {
        return ngx_http_omni_next_request_body_filter(r, in);
    }

    mp = ctx->stt->mp;

    for (cl = in; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        if (!ngx_buf_in_memory(b)) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "omni request body filter got a buffer that is "
                          "not in memory");
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (mp->offset + size > ctx->endpoint->max_body) {
            (void) ngx_http_omni_too_large(r, mp->offset + size, &ctx->err);
            return NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
        }

        if (mp->error) {
            mp->offset += size;
            continue;
        }

        rc = ngx_http_omni_mp_parse(mp, b->pos, b->last);

        if (rc == NGX_ERROR) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (rc == NGX_DECLINED) {
            ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "omni multipart body refused at %O: %s",
                           mp->offset, mp->error);
            mp->offset += size;
        }
    }

    return ngx_http_omni_next_request_body_filter(r, in);
}


/*
 * The whole body is read (and parsed): its fields checked, the engine's
 * JSON in req->engine, the file part as req's audio. NGX_OK; NGX_DECLINED
 * with err filled; NGX_ERROR.
 */

ngx_int_t
ngx_http_omni_transcribe_parse(ngx_http_request_t *r,
    ngx_http_omni_endpoint_t *ep, ngx_str_t *body, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err)
{
    ngx_str_t             language, prompt, *model;
    ngx_int_t             rc;
    ngx_http_omni_mp_t   *mp;
    ngx_http_omni_ctx_t  *ctx;
    ngx_http_omni_stt_t  *stt;

    ngx_memzero(req, sizeof(ngx_http_omni_req_t));

    ctx = ngx_http_get_module_ctx(r, ngx_http_omni_module);
    stt = ctx->stt;
    mp = stt->mp;

    if (mp->error == NULL) {
        (void) ngx_http_omni_mp_end(mp);
    }

    if (mp->error) {
        return ngx_http_omni_invalid(r, err,
                                     mp->param.len ? (char *) mp->param.data
                                                   : NULL,
                                     NULL,
                                     "Invalid multipart/form-data body: %s.",
                                     mp->error);
    }

    model = ngx_http_omni_stt_field(stt, "model");

    if (model == NULL || model->len == 0) {
        return ngx_http_omni_invalid(r, err, "model",
                                     "missing_required_parameter",
                                     "you must provide a model parameter");
    }

    rc = ngx_http_omni_stt_text(r, "model", model, err);

    if (rc == NGX_OK && !mp->file) {
        rc = ngx_http_omni_invalid(r, err, "file",
                                   "missing_required_parameter",
                                   "Missing required parameter: 'file'.");
    }

    if (rc == NGX_OK && mp->file_end == mp->file_start) {
        rc = ngx_http_omni_invalid(r, err, "file", "invalid_value",
                                   "Invalid 'file': the audio file is "
                                   "empty.");
    }

    if (rc == NGX_OK
        && mp->file_end - mp->file_start > (off_t) OMNI_MAX_AUDIO_IN_TOTAL)
    {
        rc = ngx_http_omni_invalid(r, err, "file", "invalid_value",
                                   "Invalid 'file': %O bytes, at most %uD.",
                                   mp->file_end - mp->file_start,
                                   (uint32_t) OMNI_MAX_AUDIO_IN_TOTAL);
        err->status = NGX_HTTP_REQUEST_ENTITY_TOO_LARGE;
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_stt_fields(r, stt, req, &language, &prompt, err);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_stt_audio(r, mp, req);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_omni_stt_engine(r, model, &language, &prompt, stt, req,
                                      err);
    }

    return rc;
}


/* language, prompt, response_format, temperature,
 * timestamp_granularities[], stream */

static ngx_int_t
ngx_http_omni_stt_fields(ngx_http_request_t *r, ngx_http_omni_stt_t *stt,
    ngx_http_omni_req_t *req, ngx_str_t *language, ngx_str_t *prompt,
    ngx_http_omni_error_t *err)
{
    ngx_str_t  *v;
    ngx_int_t   rc;

    ngx_str_null(language);
    ngx_str_null(prompt);

    v = ngx_http_omni_stt_field(stt, "language");

    if (v) {
        rc = ngx_http_omni_stt_language(r, v, err);
        if (rc != NGX_OK) {
            return rc;
        }

        ngx_str_set(language, "en");
        stt->language = 1;
    }

    v = ngx_http_omni_stt_field(stt, "prompt");

    if (v) {
        rc = ngx_http_omni_stt_text(r, "prompt", v, err);
        if (rc != NGX_OK) {
            return rc;
        }

        *prompt = *v;
    }

    v = ngx_http_omni_stt_field(stt, "response_format");

    if (v) {
        rc = ngx_http_omni_stt_format(r, stt, v, err);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    v = ngx_http_omni_stt_field(stt, "temperature");

    if (v) {
        rc = ngx_http_omni_stt_temperature(r, v, err);
        if (rc != NGX_OK) {
            return rc;
        }
    }

    rc = ngx_http_omni_stt_granularities(r, stt, err);
    if (rc != NGX_OK) {
        return rc;
    }

    v = ngx_http_omni_stt_field(stt, "stream");

    if (v == NULL) {
        return NGX_OK;
    }

    if ((v->len == 4 && ngx_strncasecmp(v->data, (u_char *) "true", 4) == 0)
        || (v->len == 1 && v->data[0] == '1'))
    {
        req->stream = 1;
        return NGX_OK;
    }

    if ((v->len == 5 && ngx_strncasecmp(v->data, (u_char *) "false", 5) == 0)
        || (v->len == 1 && v->data[0] == '0'))
    {
        return NGX_OK;
    }

    return ngx_http_omni_invalid(r, err, "stream", "invalid_type",
                                 "Invalid type for 'stream': expected a "
                                 "boolean (true or false), but got '%*s' "
                                 "instead.",
                                 ngx_min(v->len, NGX_HTTP_OMNI_STT_SHOWN),
                                 v->data);
}


static ngx_int_t
ngx_http_omni_stt_format(ngx_http_request_t *r, ngx_http_omni_stt_t *stt,
    ngx_str_t *v, ngx_http_omni_error_t *err)
{
    ngx_uint_t  i;

    for (i = 0; ngx_http_omni_stt_formats[i].len; i++) {
        if (v->len == ngx_http_omni_stt_formats[i].len
            && ngx_strncmp(v->data, ngx_http_omni_stt_formats[i].data,
                           v->len) == 0)
        {
            stt->format = (ngx_http_omni_stt_format_e) i;
            return NGX_OK;
        }
    }

    return ngx_http_omni_invalid(r, err, "response_format", "invalid_value",
                                 "Invalid value for 'response_format': "
                                 "'%*s'. Supported values are: 'json', "
                                 "'text', 'srt', 'verbose_json' and 'vtt'.",
                                 ngx_min(v->len, NGX_HTTP_OMNI_STT_SHOWN),
                                 v->data);
}


/* en (any case) is taken; another ISO 639-1 code is not supported; the
 * rest is not a language code at all (OpenAI's words) */

static ngx_int_t
ngx_http_omni_stt_language(ngx_http_request_t *r, ngx_str_t *v,
    ngx_http_omni_error_t *err)
{
    u_char  *p, c0, c1;

    if (v->len == 2) {
        c0 = ngx_tolower(v->data[0]);
        c1 = ngx_tolower(v->data[1]);

        if (c0 == 'e' && c1 == 'n') {
            return NGX_OK;
        }

        for (p = ngx_http_omni_iso639_1; *p; p += 3) {
            if (p[0] == c0 && p[1] == c1) {
                return ngx_http_omni_invalid(r, err, "language",
                                             "unsupported_value",
                                             "Unsupported value: language "
                                             "'%*s' is not supported; the "
                                             "recogniser knows only 'en'.",
                                             v->len, v->data);
            }
        }
    }

    return ngx_http_omni_invalid(r, err, "language",
                                 "invalid_language_format",
                                 "Invalid language '%*s'. Language parameter "
                                 "must be specified in ISO-639-1 format.",
                                 ngx_min(v->len, NGX_HTTP_OMNI_STT_SHOWN),
                                 v->data);
}


/* a number from 0 to 1 (checked, unused: decoding is greedy) */

static ngx_int_t
ngx_http_omni_stt_temperature(ngx_http_request_t *r, ngx_str_t *v,
    ngx_http_omni_error_t *err)
{
    char    buf[32], *end;
    double  d;

    if (v->len > 0 && v->len < sizeof(buf)) {
        ngx_memcpy(buf, v->data, v->len);
        buf[v->len] = '\0';

        d = strtod(buf, &end);

        if (end == buf + v->len && d >= 0.0 && d <= 1.0) {
            return NGX_OK;
        }
    }

    return ngx_http_omni_invalid(r, err, "temperature", "invalid_value",
                                 "Invalid 'temperature': '%*s'. Expected a "
                                 "number between 0 and 1.",
                                 ngx_min(v->len, NGX_HTTP_OMNI_STT_SHOWN),
                                 v->data);
}


/* every timestamp_granularities[] part (with or without the [], as curl
 * users write it): word or segment, and only with verbose_json */

static ngx_int_t
ngx_http_omni_stt_granularities(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_http_omni_error_t *err)
{
    ngx_str_t                 *v;
    ngx_uint_t                 i, n, word, segment;
    ngx_http_omni_mp_field_t  *f;

    f = stt->mp->fields.elts;
    n = 0;
    word = 0;
    segment = 0;

    for (i = 0; i < stt->mp->fields.nelts; i++) {

        if (ngx_strncmp(f[i].name.data, "timestamp_granularities",
                        sizeof("timestamp_granularities") - 1)
            != 0)
        {
            continue;
        }

        v = &f[i].value;
        n++;

        if (v->len == 4 && ngx_strncmp(v->data, "word", 4) == 0) {
            word = 1;

        } else if (v->len == 7 && ngx_strncmp(v->data, "segment", 7) == 0) {
            segment = 1;

        } else {
            return ngx_http_omni_invalid(r, err, "timestamp_granularities[]",
                                         "invalid_value",
                                         "Invalid value for "
                                         "'timestamp_granularities[]': "
                                         "'%*s'. Supported values are: "
                                         "'word' and 'segment'.",
                                         ngx_min(v->len,
                                                 NGX_HTTP_OMNI_STT_SHOWN),
                                         v->data);
        }
    }

    if (n && stt->format != NGX_HTTP_OMNI_STT_VERBOSE_JSON) {
        return ngx_http_omni_invalid(r, err, "timestamp_granularities[]",
                                     "invalid_value",
                                     "`response_format` must be "
                                     "`verbose_json` if "
                                     "`timestamp_granularities[]` is "
                                     "provided");
    }

    if (stt->format == NGX_HTTP_OMNI_STT_VERBOSE_JSON) {
        stt->segment_times = (segment || !word);
        stt->word_times = word;
    }

    return NGX_OK;
}


/* model and prompt go into the engine's JSON: UTF-8 text without NUL */

static ngx_int_t
ngx_http_omni_stt_text(ngx_http_request_t *r, char *param, ngx_str_t *v,
    ngx_http_omni_error_t *err)
{
    u_char  *nul;
    size_t   at;

    at = omni_utf8_valid((const char *) v->data, v->len);

    if (at < v->len) {
        return ngx_http_omni_invalid(r, err, param, NULL,
                                     "Invalid '%s': the text is not valid "
                                     "UTF-8 (at offset %uz).", param, at);
    }

    nul = ngx_strlchr(v->data, v->data + v->len, '\0');

    if (nul) {
        return ngx_http_omni_invalid(r, err, param, NULL,
                                     "Invalid '%s': the text holds a NUL "
                                     "byte (at offset %uz).", param,
                                     (size_t) (nul - v->data));
    }

    return NGX_OK;
}


/* The value of the last part named name, NULL when none. */

static ngx_str_t *
ngx_http_omni_stt_field(ngx_http_omni_stt_t *stt, char *name)
{
    size_t                     n;
    ngx_str_t                 *v;
    ngx_uint_t                 i;
    ngx_http_omni_mp_field_t  *f;

    f = stt->mp->fields.elts;
    v = NULL;
    n = ngx_strlen(name);

    for (i = 0; i < stt->mp->fields.nelts; i++) {
        if (f[i].name.len == n && ngx_strncmp(f[i].name.data, name, n) == 0)
        {
            v = &f[i].value;
        }
    }

    return v;
}


/*
 * The file part's bytes as the request's audio: views of the body's
 * buffers. In memory, views of each buffer it spans; in nginx's
 * temporary file (the whole body is there then), one buffer of the file
 * from its start, the bytes before the file part skipped by the output
 * filter (see ngx_http_omni_audio_in.c for why).
 */

static ngx_int_t
ngx_http_omni_stt_audio(ngx_http_request_t *r, ngx_http_omni_mp_t *mp,
    ngx_http_omni_req_t *req)
{
    off_t         off, size, from, to, skip, got;
    ngx_buf_t    *b, *v;
    ngx_chain_t  *cl, *out, **ll;

    out = NULL;
    ll = &out;
    off = 0;
    skip = 0;
    got = 0;

    for (cl = r->request_body ? r->request_body->bufs : NULL;
         cl;
         cl = cl->next)
    {
        b = cl->buf;

        if (ngx_buf_in_memory(b)) {
            size = b->last - b->pos;

        } else if (b->in_file) {
            size = b->file_last - b->file_pos;

        } else {
            continue;
        }

        from = ngx_max(off, mp->file_start);
        to = ngx_min(off + size, mp->file_end);
        off += size;

        if (from >= to) {
            continue;
        }

        v = ngx_calloc_buf(r->pool);
        if (v == NULL) {
            return NGX_ERROR;
        }

        if (ngx_buf_in_memory(b)) {

            /* start is where a retry on the next engine sends from */

            v->start = b->pos + (from - (off - size));
            v->pos = v->start;
            v->last = b->pos + (to - (off - size));
            v->end = v->last;
            v->memory = 1;

        } else {

            if (out != NULL) {
                ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                              "omni file part spans memory and the "
                              "temporary file");
                return NGX_ERROR;
            }

            v->in_file = 1;
            v->file = b->file;
            v->file_pos = 0;
            v->file_last = b->file_pos + (to - (off - size));
            skip = b->file_pos + (from - (off - size));
        }

        *ll = ngx_alloc_chain_link(r->pool);
        if (*ll == NULL) {
            return NGX_ERROR;
        }

        (*ll)->buf = v;
        (*ll)->next = NULL;
        ll = &(*ll)->next;

        got += to - from;
    }

    if (got != mp->file_end - mp->file_start) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "omni file part at %O-%O, but the body's buffers "
                      "hold %O of its bytes", mp->file_start, mp->file_end,
                      got);
        return NGX_ERROR;
    }

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni file part \"%V\": %O bytes at %O%s",
                   &mp->file_filename, got, mp->file_start,
                   skip ? ", in the temporary file" : "");

    return ngx_http_omni_audio_in_add(r, req,
                                      ngx_http_omni_stt_hint(
                                          &mp->file_filename),
                                      "file", out, skip, got);
}


/* The format the filename's extension suggests: a hint only, the engine
 * sniffs the bytes, and nothing is refused by its name (a .webm's bytes
 * get the engine's 400 naming webm). */

static char *
ngx_http_omni_stt_hint(ngx_str_t *filename)
{
    u_char      *dot, ext[8];
    size_t       n;
    ngx_uint_t   i;

    static char  *hints[][2] = {
        { "wav", "wav" }, { "wave", "wav" },
        { "mp3", "mp3" }, { "mpga", "mp3" }, { "mpeg", "mp3" },
        { "flac", "flac" },
        { "ogg", "opus" }, { "opus", "opus" }, { "oga", "opus" },
        { NULL, NULL }
    };

    for (dot = filename->data + filename->len; dot > filename->data; dot--) {
        if (dot[-1] == '.') {
            break;
        }
    }

    if (dot == filename->data) {
        return "auto";
    }

    n = filename->data + filename->len - dot;

    if (n == 0 || n >= sizeof(ext)) {
        return "auto";
    }

    ngx_strlow(ext, dot, n);
    ext[n] = '\0';

    for (i = 0; hints[i][0]; i++) {
        if (ngx_strcmp(ext, hints[i][0]) == 0) {
            return hints[i][1];
        }
    }

    return "auto";
}


/* {"model" (unless OpenAI's name of it), "transcribe": {"language",
 *  "prompt", "words"}, "audio_in": [...], "max_audio_seconds"} */

static ngx_int_t
ngx_http_omni_stt_engine(ngx_http_request_t *r, ngx_str_t *model,
    ngx_str_t *language, ngx_str_t *prompt, ngx_http_omni_stt_t *stt,
    ngx_http_omni_req_t *req, ngx_http_omni_error_t *err)
{
    yajl_gen    g;
    ngx_int_t   rc;
    ngx_uint_t  s, i, served;

    req->model.data = ngx_pstrdup(r->pool, model);
    if (req->model.data == NULL) {
        return NGX_ERROR;
    }

    req->model.len = model->len;

    served = 1;

    for (i = 0; ngx_http_omni_stt_models[i].len; i++) {
        if (model->len == ngx_http_omni_stt_models[i].len
            && ngx_strncmp(model->data, ngx_http_omni_stt_models[i].data,
                           model->len) == 0)
        {
            served = 0;
            break;
        }
    }

    g = yajl_gen_alloc(NULL);
    if (g == NULL) {
        return NGX_ERROR;
    }

    s = yajl_gen_map_open(g);

    /* without "model" the engine takes its own */

    if (served) {
        s |= ngx_http_omni_gen_str(g, "model");
        s |= yajl_gen_string(g, model->data, model->len);
    }

    s |= ngx_http_omni_gen_str(g, "transcribe");
    s |= yajl_gen_map_open(g);

    if (language->len) {
        s |= ngx_http_omni_gen_str(g, "language");
        s |= yajl_gen_string(g, language->data, language->len);
    }

    if (prompt->data) {
        s |= ngx_http_omni_gen_str(g, "prompt");
        s |= yajl_gen_string(g, prompt->data, prompt->len);
    }

    s |= ngx_http_omni_gen_str(g, "words");
    s |= yajl_gen_bool(g, stt->word_times);
    s |= yajl_gen_map_close(g);

    s |= ngx_http_omni_gen_audio_in(r, g, req);
    s |= yajl_gen_map_close(g);

    rc = ngx_http_omni_engine_json(r, g, s, req, err);

    yajl_gen_free(g);

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni transcription: format %ui, stream:%ui, words:%ui, "
                   "engine json:%uz", (ngx_uint_t) stt->format,
                   (ngx_uint_t) req->stream, (ngx_uint_t) stt->word_times,
                   req->engine.len);

    return rc;
}

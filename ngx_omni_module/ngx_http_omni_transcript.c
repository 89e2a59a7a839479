
/*
 * Copyright (C) ngx_omni authors
 */


/*
 * ngx_http_omni_transcript.c -- a transcription's answer: the engine's
 * TRANSCRIPT frames (omni_proto.h: one JSON object per recognised
 * utterance, {"input","text","start","end","avg_logprob","words"}) and
 * its DONE (input_audio_ms) as OpenAI's bodies and events
 * (openai-api.md 10.3, 10.4). No I/O.
 *
 *   json          {"text":T,"usage":{"type":"duration","seconds":S}}
 *   text          T "\n"
 *   srt           cues "N\nHH:MM:SS,mmm --> HH:MM:SS,mmm\nTEXT\n\n", "\n"
 *   vtt           "WEBVTT\n\n", cues "HH:MM:SS.mmm --> ...\nTEXT\n\n"
 *   verbose_json  {"task","language","duration","text","segments",
 *                 "words","usage"}
 *   stream        data: {"type":"transcript.text.delta","delta":D} per
 *                 TRANSCRIPT, data: {"type":"transcript.text.done",
 *                 "text":T}, data: [DONE]
 *
 * T is the segments' texts joined by single spaces; a delta is a
 * segment's text, after the first with a space before it, so that the
 * deltas concatenated are T. S is the decoded audio's length rounded up
 * to whole seconds, as OpenAI's duration usage is.
 *
 * A verbose_json segment has Whisper's ten keys. What a recogniser that
 * is not Whisper cannot have is said so, not made up: "tokens" is [] (no
 * Whisper token ids exist), "temperature" 0.0 (decoding is greedy),
 * "no_speech_prob" 0.0 (the engine sends an utterance only when its
 * voice activity detection found speech in it), "seek" the segment's
 * start in 10 ms frames (Whisper's is that of its 30 s window), and
 * "compression_ratio" computed as Whisper computes it: the text's bytes
 * over those of the text compressed by zlib at its default level (Python's
 * zlib.compress()), of the segment's text as sent, with its leading
 * space.
 *
 * Not streaming, the segments are held in r->pool until DONE, at most
 * NGX_HTTP_OMNI_MAX_AUDIO bytes of TRANSCRIPT payloads; a stream holds
 * its text so far (for the done event) and nothing else.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <zlib.h>

#include "ngx_http_omni_module.h"


#define NGX_HTTP_OMNI_SEGMENT_LEN   (512 + 6 * NGX_HTTP_OMNI_DOUBLE_LEN)
                                    /* a segment's JSON but its text */
#define NGX_HTTP_OMNI_WORD_LEN      (64 + 2 * NGX_HTTP_OMNI_DOUBLE_LEN)
#define NGX_HTTP_OMNI_CUE_LEN       96  /* a cue but its text */
#define NGX_HTTP_OMNI_STT_HEAD_LEN  (256 + 2 * NGX_HTTP_OMNI_DOUBLE_LEN)


static ngx_int_t ngx_http_omni_transcript_parse(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload,
    ngx_http_omni_segment_t *seg, ngx_uint_t keep);
static ngx_int_t ngx_http_omni_transcript_words(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, yajl_val words, ngx_http_omni_segment_t *seg);
static ngx_int_t ngx_http_omni_transcript_number(yajl_val o,
    const char *key, double *v);
static ngx_int_t ngx_http_omni_transcript_copy(ngx_http_request_t *r,
    const char *s, ngx_str_t *out);
static ngx_buf_t *ngx_http_omni_transcript_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
static ngx_buf_t *ngx_http_omni_transcript_verbose(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
static ngx_int_t ngx_http_omni_transcript_segments(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_buf_t *b);
static u_char *ngx_http_omni_transcript_segment(u_char *p, ngx_uint_t id,
    ngx_http_omni_segment_t *seg, double ratio);
static ngx_buf_t *ngx_http_omni_transcript_cues(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
static size_t ngx_http_omni_joined_len(ngx_http_omni_stt_t *stt,
    ngx_uint_t escape);
static u_char *ngx_http_omni_joined(u_char *p, ngx_http_omni_stt_t *stt,
    ngx_uint_t escape);
static u_char *ngx_http_omni_cue_time(u_char *p, double s, u_char sep);
static u_char *ngx_http_omni_duration_usage(u_char *p,
    ngx_http_omni_ctx_t *ctx);
static ngx_int_t ngx_http_omni_compression(ngx_http_request_t *r,
    z_stream *zs, ngx_str_t *text, double *ratio);
static void *ngx_http_omni_zalloc(void *opaque, u_int items, u_int size);
static void ngx_http_omni_zfree(void *opaque, void *address);
static ngx_int_t ngx_http_omni_transcript_delta(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
static ngx_int_t ngx_http_omni_transcript_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);


static ngx_str_t  ngx_http_omni_stt_json_type =
    ngx_string("application/json");
static ngx_str_t  ngx_http_omni_stt_text_type =
    ngx_string("text/plain; charset=utf-8");


/* ---- the engine's TRANSCRIPT ---- */

ngx_int_t
ngx_http_omni_transcript_gather(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload, ngx_http_omni_error_t *err)
{
    ngx_int_t                 rc;
    ngx_http_omni_stt_t      *stt;
    ngx_http_omni_segment_t   seg, *s;

    stt = ctx->stt;

    stt->held += payload->len;

    if (stt->held > NGX_HTTP_OMNI_MAX_AUDIO) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni transcript over %uz bytes, not held",
                      (size_t) NGX_HTTP_OMNI_MAX_AUDIO);

        err->status = NGX_HTTP_INTERNAL_SERVER_ERROR;
        ngx_str_set(&err->type, "server_error");
        ngx_str_null(&err->param);
        ngx_str_set(&err->code, "transcript_too_long");
        ngx_str_set(&err->message, "The transcript is longer than a "
                    "response without streaming may hold (16 MiB); send "
                    "stream=true to have it as it is made.");
        return NGX_DECLINED;
    }

    rc = ngx_http_omni_transcript_parse(r, ctx, payload, &seg,
                                        stt->word_times);
    if (rc != NGX_OK) {
        return rc;
    }

    s = ngx_array_push(&stt->segments);
    if (s == NULL) {
        return NGX_ERROR;
    }

    *s = seg;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni transcript segment %ui: %uz bytes of text, "
                   "%ui words, %uz held", stt->segments.nelts - 1,
                   seg.text.len, seg.nwords, stt->held);

    return NGX_OK;
}


/*
 * A TRANSCRIPT payload in *seg: its text (and, when keep, its words in
 * stt->words) copied into r->pool. The engine's JSON is checked as any
 * reply of it is (the pre-scan, then its shape); what is not a
 * TRANSCRIPT's is logged, NGX_HTTP_UPSTREAM_INVALID_HEADER.
 */

static ngx_int_t
ngx_http_omni_transcript_parse(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload,
    ngx_http_omni_segment_t *seg, ngx_uint_t keep)
{
    char        *reason;
    u_char       ebuf[128];
    double       input;
    yajl_val     root, text, words;
    ngx_int_t    rc;
    ngx_uint_t   syntax;

    ngx_memzero(seg, sizeof(ngx_http_omni_segment_t));

    reason = ngx_http_omni_prescan(payload->data, payload->len, &syntax);
    if (reason != NULL) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent invalid TRANSCRIPT: %s", reason);
        return ngx_http_omni_invalid_frame(r, ctx, NULL);
    }

    ebuf[0] = '\0';

    root = ngx_http_omni_tree(r, payload->data, payload->len, ebuf,
                              sizeof(ebuf));
    if (root == NULL) {
        if (ebuf[0] == '\0') {
            return NGX_ERROR;
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni engine sent invalid TRANSCRIPT: %s", ebuf);
        return ngx_http_omni_invalid_frame(r, ctx, NULL);
    }

    rc = NGX_HTTP_UPSTREAM_INVALID_HEADER;
    reason = "not an object";

    if (!YAJL_IS_OBJECT(root)) {
        goto invalid;
    }

    text = ngx_http_omni_member(root, "text");
    reason = "no \"text\" string";

    if (text == NULL || !YAJL_IS_STRING(text)) {
        goto invalid;
    }

    reason = "no \"start\" and \"end\" seconds";

    if (ngx_http_omni_transcript_number(root, "start", &seg->start)
        != NGX_OK
        || ngx_http_omni_transcript_number(root, "end", &seg->end) != NGX_OK
        || seg->start < 0 || seg->end < seg->start)
    {
        goto invalid;
    }

    reason = "an \"input\" other than 0 (one audio input)";
    input = 0;

    if (ngx_http_omni_member(root, "input") != NULL
        && (ngx_http_omni_transcript_number(root, "input", &input) != NGX_OK
            || input != 0))
    {
        goto invalid;
    }

    reason = "an \"avg_logprob\" that is not a number";

    if (ngx_http_omni_member(root, "avg_logprob") != NULL
        && ngx_http_omni_transcript_number(root, "avg_logprob",
                                           &seg->avg_logprob)
           != NGX_OK)
    {
        goto invalid;
    }

    if (ngx_http_omni_transcript_copy(r, text->u.string, &seg->text)
        != NGX_OK)
    {
        rc = NGX_ERROR;
        goto done;
    }

    words = ngx_http_omni_member(root, "words");

    if (keep && words != NULL) {
        rc = ngx_http_omni_transcript_words(r, ctx->stt, words, seg);

        if (rc == NGX_DECLINED) {
            reason = "\"words\" that are not [{\"word\",\"start\",\"end\"}]";
            rc = NGX_HTTP_UPSTREAM_INVALID_HEADER;
            goto invalid;
        }

        goto done;
    }

    rc = NGX_OK;
    goto done;

invalid:

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "omni engine sent invalid TRANSCRIPT: %s", reason);

    rc = ngx_http_omni_invalid_frame(r, ctx, NULL);

done:

    yajl_tree_free(root);

    return rc;
}


/* A segment's words, appended to stt->words. NGX_DECLINED: not an array
 * of {"word": string, "start", "end"}. */

static ngx_int_t
ngx_http_omni_transcript_words(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, yajl_val words, ngx_http_omni_segment_t *seg)
{
    size_t                 i;
    yajl_val               w, word;
    ngx_http_omni_word_t  *out;

    if (!YAJL_IS_ARRAY(words)) {
        return NGX_DECLINED;
    }

    seg->word = stt->words.nelts;

    for (i = 0; i < words->u.array.len; i++) {
        w = words->u.array.values[i];

        if (!YAJL_IS_OBJECT(w)) {
            return NGX_DECLINED;
        }

        word = ngx_http_omni_member(w, "word");

        if (word == NULL || !YAJL_IS_STRING(word)) {
            return NGX_DECLINED;
        }

        out = ngx_array_push(&stt->words);
        if (out == NULL) {
            return NGX_ERROR;
        }

        if (ngx_http_omni_transcript_number(w, "start", &out->start)
            != NGX_OK
            || ngx_http_omni_transcript_number(w, "end", &out->end)
               != NGX_OK)
        {
            return NGX_DECLINED;
        }

        if (ngx_http_omni_transcript_copy(r, word->u.string, &out->word)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        seg->nwords++;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_omni_transcript_number(yajl_val o, const char *key, double *v)
{
    yajl_val  n;

    n = ngx_http_omni_member(o, key);

    if (n == NULL || !YAJL_IS_NUMBER(n)) {
        return NGX_DECLINED;
    }

    *v = YAJL_IS_DOUBLE(n) ? YAJL_GET_DOUBLE(n)
                           : (double) YAJL_GET_INTEGER(n);

    /* NaN fails both */

    return (*v > -1e12 && *v < 1e12) ? NGX_OK : NGX_DECLINED;
}


static ngx_int_t
ngx_http_omni_transcript_copy(ngx_http_request_t *r, const char *s,
    ngx_str_t *out)
{
    out->len = ngx_strlen(s);

    if (out->len == 0) {
        out->data = NULL;
        return NGX_OK;
    }

    out->data = ngx_pnalloc(r->pool, out->len);
    if (out->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(out->data, s, out->len);

    return NGX_OK;
}


/* ---- the whole answer, at DONE ---- */

ngx_int_t
ngx_http_omni_transcript_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload)
{
    ngx_buf_t  *b;
    ngx_str_t  *type;

    if (omni_done_decode(&ctx->usage, payload->data) != 0) {
        return ngx_http_omni_invalid_frame(r, ctx, "DONE");
    }

    ctx->done = 1;
    type = &ngx_http_omni_stt_json_type;

    switch (ctx->stt->format) {

    case NGX_HTTP_OMNI_STT_VERBOSE_JSON:
        b = ngx_http_omni_transcript_verbose(r, ctx);
        break;

    case NGX_HTTP_OMNI_STT_TEXT:
        b = ngx_create_temp_buf(r->pool,
                                ngx_http_omni_joined_len(ctx->stt, 0) + 1);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->last = ngx_http_omni_joined(b->last, ctx->stt, 0);
        *b->last++ = '\n';
        type = &ngx_http_omni_stt_text_type;
        break;

    case NGX_HTTP_OMNI_STT_SRT:
    case NGX_HTTP_OMNI_STT_VTT:
        b = ngx_http_omni_transcript_cues(r, ctx);
        type = &ngx_http_omni_stt_text_type;
        break;

    default: /* NGX_HTTP_OMNI_STT_JSON */
        b = ngx_http_omni_transcript_json(r, ctx);
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni transcript done: %ui segments, %ui words, "
                   "audio %uD ms", ctx->stt->segments.nelts,
                   ctx->stt->words.nelts, ctx->usage.input_audio_ms);

    return ngx_http_omni_reply_buf(r, ctx, NGX_HTTP_OK, type, b);
}


/* {"text":T,"usage":{"type":"duration","seconds":S}}\n */

static ngx_buf_t *
ngx_http_omni_transcript_json(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    ngx_buf_t  *b;

    b = ngx_create_temp_buf(r->pool, ngx_http_omni_joined_len(ctx->stt, 1)
                                     + NGX_HTTP_OMNI_STT_HEAD_LEN);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, "{\"text\":\"", sizeof("{\"text\":\"") - 1);
    b->last = ngx_http_omni_joined(b->last, ctx->stt, 1);
    b->last = ngx_cpymem(b->last, "\",", sizeof("\",") - 1);
    b->last = ngx_http_omni_duration_usage(b->last, ctx);
    *b->last++ = '}';
    *b->last++ = '\n';

    return b;
}


/*
 * {"task":"transcribe","language":"english","duration":D,"text":T,
 *  "segments":[...],"words":[...],"usage":{...}}\n, with "segments"
 * when timestamp_granularities[] named segment (or nothing), "words" when
 * it named word, in OpenAI's key order.
 */

static ngx_buf_t *
ngx_http_omni_transcript_verbose(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx)
{
    size_t                    size;
    ngx_buf_t                *b;
    ngx_uint_t                i;
    ngx_http_omni_stt_t      *stt;
    ngx_http_omni_word_t     *word;
    ngx_http_omni_segment_t  *seg;

    stt = ctx->stt;
    seg = stt->segments.elts;
    word = stt->words.elts;

    size = NGX_HTTP_OMNI_STT_HEAD_LEN + ngx_http_omni_joined_len(stt, 1);

    for (i = 0; stt->segment_times && i < stt->segments.nelts; i++) {
        size += NGX_HTTP_OMNI_SEGMENT_LEN
                + ngx_http_omni_escape_len(seg[i].text.data, seg[i].text.len);
    }

    for (i = 0; stt->word_times && i < stt->words.nelts; i++) {
        size += NGX_HTTP_OMNI_WORD_LEN
                + ngx_http_omni_escape_len(word[i].word.data, word[i].word.len);
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    b->last = ngx_cpymem(b->last, "{\"task\":\"transcribe\","
                         "\"language\":\"english\",\"duration\":",
                         sizeof("{\"task\":\"transcribe\","
                                "\"language\":\"english\",\"duration\":")
                         - 1);
    b->last = ngx_http_omni_double(b->last,
                                   ctx->usage.input_audio_ms / 1000.0, 3);
    b->last = ngx_cpymem(b->last, ",\"text\":\"", sizeof(",\"text\":\"") - 1);
    b->last = ngx_http_omni_joined(b->last, stt, 1);
    *b->last++ = '"';

    if (stt->segment_times
        && ngx_http_omni_transcript_segments(r, stt, b) != NGX_OK)
    {
        return NULL;
    }

    if (stt->word_times) {
        b->last = ngx_cpymem(b->last, ",\"words\":[",
                             sizeof(",\"words\":[") - 1);

        for (i = 0; i < stt->words.nelts; i++) {
            if (i) {
                *b->last++ = ',';
            }

            b->last = ngx_cpymem(b->last, "{\"word\":\"",
                                 sizeof("{\"word\":\"") - 1);
            b->last = ngx_http_omni_escape(b->last, word[i].word.data,
                                           word[i].word.len);
            b->last = ngx_cpymem(b->last, "\",\"start\":",
                                 sizeof("\",\"start\":") - 1);
            b->last = ngx_http_omni_double(b->last, word[i].start, 3);
            b->last = ngx_cpymem(b->last, ",\"end\":",
                                 sizeof(",\"end\":") - 1);
            b->last = ngx_http_omni_double(b->last, word[i].end, 3);
            *b->last++ = '}';
        }

        *b->last++ = ']';
    }

    *b->last++ = ',';
    b->last = ngx_http_omni_duration_usage(b->last, ctx);
    *b->last++ = '}';
    *b->last++ = '\n';

    return b;
}


/* ,"segments":[...] into b, each segment's compression ratio from one
 * deflate stream (reset between them), whose memory is r->pool's. */

static ngx_int_t
ngx_http_omni_transcript_segments(ngx_http_request_t *r,
    ngx_http_omni_stt_t *stt, ngx_buf_t *b)
{
    double                    ratio;
    z_stream                  zs;
    ngx_str_t                 text;
    ngx_int_t                 rc;
    ngx_uint_t                i, zinit;
    ngx_http_omni_segment_t  *seg;

    seg = stt->segments.elts;
    zinit = 0;
    rc = NGX_OK;

    ngx_memzero(&zs, sizeof(z_stream));

    zs.zalloc = ngx_http_omni_zalloc;
    zs.zfree = ngx_http_omni_zfree;
    zs.opaque = r->pool;

    b->last = ngx_cpymem(b->last, ",\"segments\":[",
                         sizeof(",\"segments\":[") - 1);

    for (i = 0; i < stt->segments.nelts; i++) {
        ratio = 0.0;

        if (seg[i].text.len) {

            /* of the text as sent, with Whisper's leading space */

            text.len = seg[i].text.len + 1;
            text.data = ngx_pnalloc(r->pool, text.len);
            if (text.data == NULL) {
                rc = NGX_ERROR;
                break;
            }

            text.data[0] = ' ';
            ngx_memcpy(text.data + 1, seg[i].text.data, seg[i].text.len);

            if (!zinit) {
                if (deflateInit(&zs, Z_DEFAULT_COMPRESSION) != Z_OK) {
                    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                                  "omni deflateInit() failed");
                    return NGX_ERROR;
                }

                zinit = 1;
            }

            rc = ngx_http_omni_compression(r, &zs, &text, &ratio);
            if (rc != NGX_OK) {
                break;
            }
        }

        if (i) {
            *b->last++ = ',';
        }

        b->last = ngx_http_omni_transcript_segment(b->last, i, &seg[i],
                                                   ratio);
    }

    if (zinit) {
        (void) deflateEnd(&zs);
    }

    *b->last++ = ']';

    return rc;
}


/* {"id","seek","start","end","text","tokens","temperature",
 *  "avg_logprob","compression_ratio","no_speech_prob"}: see the top of
 * the file for what each is here */

static u_char *
ngx_http_omni_transcript_segment(u_char *p, ngx_uint_t id,
    ngx_http_omni_segment_t *seg, double ratio)
{
    /* seek: the start in 10 ms frames, rounded down (from whole ms,
     * which 2.71 * 100 = 270.99999999999997 would not be) */

    p = ngx_sprintf(p, "{\"id\":%ui,\"seek\":%uL,\"start\":", id,
                    (uint64_t) (seg->start * 1000 + 0.5) / 10);
    p = ngx_http_omni_double(p, seg->start, 3);
    p = ngx_cpymem(p, ",\"end\":", sizeof(",\"end\":") - 1);
    p = ngx_http_omni_double(p, seg->end, 3);
    p = ngx_cpymem(p, ",\"text\":\" ", sizeof(",\"text\":\" ") - 1);
    p = ngx_http_omni_escape(p, seg->text.data, seg->text.len);
    p = ngx_cpymem(p, "\",\"tokens\":[],\"temperature\":0.0,"
                   "\"avg_logprob\":",
                   sizeof("\",\"tokens\":[],\"temperature\":0.0,"
                          "\"avg_logprob\":") - 1);
    p = ngx_http_omni_double(p, seg->avg_logprob, 6);
    p = ngx_cpymem(p, ",\"compression_ratio\":",
                   sizeof(",\"compression_ratio\":") - 1);
    p = ngx_http_omni_double(p, ratio, 6);
    p = ngx_cpymem(p, ",\"no_speech_prob\":0.0}",
                   sizeof(",\"no_speech_prob\":0.0}") - 1);

    return p;
}


/* srt: "N\n00:00:00,000 --> 00:00:02,000\nTEXT\n\n" per segment, then
 * "\n"; vtt: "WEBVTT\n\n", then "00:00:00.000 --> 00:00:02.000\nTEXT\n\n"
 * per segment. LF only, the texts without their leading space. */

static ngx_buf_t *
ngx_http_omni_transcript_cues(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx)
{
    u_char                    sep;
    size_t                    size;
    ngx_buf_t                *b;
    ngx_uint_t                i, vtt;
    ngx_http_omni_stt_t      *stt;
    ngx_http_omni_segment_t  *seg;

    stt = ctx->stt;
    seg = stt->segments.elts;
    vtt = (stt->format == NGX_HTTP_OMNI_STT_VTT);
    sep = vtt ? '.' : ',';

    size = sizeof("WEBVTT\n\n");

    for (i = 0; i < stt->segments.nelts; i++) {
        size += NGX_HTTP_OMNI_CUE_LEN + seg[i].text.len;
    }

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NULL;
    }

    if (vtt) {
        b->last = ngx_cpymem(b->last, "WEBVTT\n\n", sizeof("WEBVTT\n\n") - 1);
    }

    for (i = 0; i < stt->segments.nelts; i++) {
        if (!vtt) {
            b->last = ngx_sprintf(b->last, "%ui\n", i + 1);
        }

        b->last = ngx_http_omni_cue_time(b->last, seg[i].start, sep);
        b->last = ngx_cpymem(b->last, " --> ", sizeof(" --> ") - 1);
        b->last = ngx_http_omni_cue_time(b->last, seg[i].end, sep);
        *b->last++ = '\n';
        b->last = ngx_cpymem(b->last, seg[i].text.data, seg[i].text.len);
        *b->last++ = '\n';
        *b->last++ = '\n';
    }

    if (!vtt) {
        *b->last++ = '\n';
    }

    return b;
}


/* The segments' texts joined by single spaces, JSON-escaped or not. */

static size_t
ngx_http_omni_joined_len(ngx_http_omni_stt_t *stt, ngx_uint_t escape)
{
    size_t                    n;
    ngx_uint_t                i;
    ngx_http_omni_segment_t  *seg;

    seg = stt->segments.elts;
    n = 0;

    for (i = 0; i < stt->segments.nelts; i++) {
        n += 1 + (escape ? ngx_http_omni_escape_len(seg[i].text.data,
                                                    seg[i].text.len)
                         : seg[i].text.len);
    }

    return n;
}


static u_char *
ngx_http_omni_joined(u_char *p, ngx_http_omni_stt_t *stt, ngx_uint_t escape)
{
    ngx_uint_t                i, first;
    ngx_http_omni_segment_t  *seg;

    seg = stt->segments.elts;
    first = 1;

    for (i = 0; i < stt->segments.nelts; i++) {
        if (seg[i].text.len == 0) {
            continue;
        }

        if (!first) {
            *p++ = ' ';
        }

        first = 0;

        p = escape ? ngx_http_omni_escape(p, seg[i].text.data,
                                          seg[i].text.len)
                   : ngx_cpymem(p, seg[i].text.data, seg[i].text.len);
    }

    return p;
}


/* HH:MM:SS,mmm (srt) or HH:MM:SS.mmm (vtt); hours grow past 99 */

static u_char *
ngx_http_omni_cue_time(u_char *p, double s, u_char sep)
{
    uint64_t  ms;

    ms = (uint64_t) (s * 1000 + 0.5);

    return ngx_sprintf(p, "%02uL:%02uL:%02uL%c%03uL", ms / 3600000,
                       ms / 60000 % 60, ms / 1000 % 60, sep, ms % 1000);
}


/* "usage":{"type":"duration","seconds":S}, S the audio's whole seconds,
 * rounded up */

static u_char *
ngx_http_omni_duration_usage(u_char *p, ngx_http_omni_ctx_t *ctx)
{
    return ngx_sprintf(p, "\"usage\":{\"type\":\"duration\",\"seconds\":%uD}",
                       (uint32_t) ((ctx->usage.input_audio_ms + 999ULL)
                                   / 1000));
}


/* Whisper's compression ratio of text: its bytes over those of
 * zlib.compress(text), deflate at the default level with the zlib
 * wrapper (what deflateInit() gives). */

static ngx_int_t
ngx_http_omni_compression(ngx_http_request_t *r, z_stream *zs,
    ngx_str_t *text, double *ratio)
{
    int     rc;
    u_char  out[1024];

    if (deflateReset(zs) != Z_OK) {
        return NGX_ERROR;
    }

    zs->next_in = text->data;
    zs->avail_in = text->len;

    do {
        zs->next_out = out;
        zs->avail_out = sizeof(out);

        rc = deflate(zs, Z_FINISH);

    } while (rc == Z_OK);

    if (rc != Z_STREAM_END || zs->total_out == 0) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "omni deflate() failed: %d", rc);
        return NGX_ERROR;
    }

    *ratio = (double) text->len / zs->total_out;

    return NGX_OK;
}


/* zlib's memory from r->pool, freed with it */

static void *
ngx_http_omni_zalloc(void *opaque, u_int items, u_int size)
{
    ngx_pool_t  *pool = opaque;

    return ngx_palloc(pool, (size_t) items * size);
}


static void
ngx_http_omni_zfree(void *opaque, void *address)
{
    return;
}


/* ---- a stream ---- */

ngx_int_t
ngx_http_omni_transcript_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload)
{
    switch (ctx->frame.type) {

    case OMNI_F_TRANSCRIPT:
        return ngx_http_omni_transcript_delta(r, ctx, payload);

    case OMNI_F_DONE:
        return ngx_http_omni_transcript_done(r, ctx, payload);
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "omni engine sent unexpected frame type %ui in a "
                  "transcription", (ngx_uint_t) ctx->frame.type);

    return ngx_http_omni_invalid_frame(r, ctx, NULL);
}


/* data: {"type":"transcript.text.delta","delta":D}\n\n, D the segment's
 * text with a space before it after the first; the text so far kept in
 * ctx->text for the done event. */

static ngx_int_t
ngx_http_omni_transcript_delta(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload)
{
    u_char                   *p;
    size_t                    n;
    ngx_int_t                 rc;
    ngx_chain_t              *cl;
    ngx_http_omni_stt_t      *stt;
    ngx_http_omni_segment_t   seg;

    static u_char  pre[] = "data: {\"type\":\"transcript.text.delta\","
                           "\"delta\":\"";
    static u_char  post[] = "\"}\n\n";

    stt = ctx->stt;

    rc = ngx_http_omni_transcript_parse(r, ctx, payload, &seg, 0);
    if (rc != NGX_OK) {
        return rc;
    }

    if (seg.text.len == 0) {
        return NGX_OK;
    }

    n = seg.text.len + (stt->deltas ? 1 : 0);

    stt->held += n;

    if (stt->held > NGX_HTTP_OMNI_MAX_AUDIO) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "omni transcript over %uz bytes, not held",
                      (size_t) NGX_HTTP_OMNI_MAX_AUDIO);
        return ngx_http_omni_invalid_frame(r, ctx, NULL);
    }

    /* the text so far, for transcript.text.done */

    cl = ngx_http_omni_chain_add(r, &ctx->text, &ctx->text_last, n);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    p = cl->buf->last;

    if (stt->deltas) {
        *cl->buf->last++ = ' ';
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, seg.text.data, seg.text.len);

    stt->deltas++;

    cl = ngx_http_omni_event_buf(r, ctx, sizeof(pre) - 1 + sizeof(post) - 1
                                         + ngx_http_omni_escape_len(p, n));
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, pre, sizeof(pre) - 1);
    cl->buf->last = ngx_http_omni_escape(cl->buf->last, p, n);
    cl->buf->last = ngx_cpymem(cl->buf->last, post, sizeof(post) - 1);

    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}


/* data: {"type":"transcript.text.done","text":T}\n\n, then data: [DONE].
 * No "usage": the SDKs type it as the token-billed kind only, and this
 * one is billed by duration (openai-api.md 10.4). */

static ngx_int_t
ngx_http_omni_transcript_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload)
{
    u_char       *text;
    size_t        len;
    ngx_chain_t  *cl;

    static u_char  pre[] = "data: {\"type\":\"transcript.text.done\","
                           "\"text\":\"";
    static u_char  post[] = "\"}\n\n";

    if (omni_done_decode(&ctx->usage, payload->data) != 0) {
        return ngx_http_omni_invalid_frame(r, ctx, "DONE");
    }

    ctx->done = 1;
    ngx_http_omni_keepalive_stop(ctx);

    text = ngx_http_omni_text(r, ctx->text, &len);
    if (text == NULL && len > 0) {
        return NGX_ERROR;
    }

    cl = ngx_http_omni_event_buf(r, ctx, sizeof(pre) - 1 + sizeof(post) - 1
                                         + ngx_http_omni_escape_len(text,
                                                                    len));
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, pre, sizeof(pre) - 1);
    cl->buf->last = ngx_http_omni_escape(cl->buf->last, text, len);
    cl->buf->last = ngx_cpymem(cl->buf->last, post, sizeof(post) - 1);

    if (ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR) {
        return NGX_ERROR;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "omni transcript stream done: %ui deltas, audio %uD ms",
                   ctx->stt->deltas, ctx->usage.input_audio_ms);

    cl = ngx_http_omni_chunk_done(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_omni_send_event(r, ctx, cl) == NGX_ERROR
           ? NGX_ERROR : NGX_OK;
}


/*
 * ngx_http_omni_module.h -- what the files of ngx_omni_module share.
 *
 *   ngx_http_omni_module.c    directives, configuration, the endpoint
 *                             table, the content handler: endpoint,
 *                             method, API key, then body or upstream
 *   ngx_http_omni_auth.c      API keys: the key file, the Bearer check
 *   ngx_http_omni_body.c      the request body: read, parsed by the
 *                             endpoint's parser, then the upstream
 *   ngx_http_omni_request.c   OpenAI request bodies in: pre-scanned,
 *                             checked, normalized into the engine's JSON
 *   ngx_http_omni_params.c    the checks of single fields, the 400s'
 *                             words (ngx_http_omni_request.h: theirs)
 *   ngx_http_omni_speech.c    speech requests in: /v1/audio/speech's
 *                             body, chat's "audio" and "modalities"
 *   ngx_http_omni_transcribe.c
 *                             /v1/audio/transcriptions in: the
 *                             multipart body parsed as it arrives (a
 *                             request body filter), its fields, the
 *                             engine's JSON and the file part's bytes
 *   ngx_http_omni_multipart.c multipart/form-data, parsed in pieces
 *                             (ngx_http_omni_multipart.h)
 *   ngx_http_omni_audio_in.c  audio in: the inputs that follow a REQUEST
 *                             in AUDIO_IN frames (a transcription's file,
 *                             chat's input_audio parts, base64 decoded),
 *                             framed on their way out by the upstream's
 *                             output filter
 *   ngx_http_omni_json.c      yajl as the module uses it: the pre-scan
 *                             (json_scan.h), trees, yajl_gen helpers
 *   ngx_http_omni_upstream.c  upstream callbacks: the REQUEST or control
 *                             frame out, the frame parser, the response
 *                             decided from the first frames
 *   ngx_http_omni_sse.c       a stream: its start (the header), then
 *                             each engine frame one SSE event
 *   ngx_http_omni_audio.c     AUDIO frames out: raw audio bytes, speech
 *                             SSE events, chat audio chunks and the
 *                             non-streaming chat answer's "audio"
 *   ngx_http_omni_transcript.c
 *                             TRANSCRIPT frames out: a transcription's
 *                             json, text, srt, vtt and verbose_json
 *                             bodies, or its transcript.text.* events
 *   ngx_http_omni_openai.c    OpenAI JSON out: response bodies, SSE
 *                             chunks, errors
 *   ngx_http_omni_models.c    the model list and the one model
 *                             (MODELS_R)
 *   ngx_http_omni_output.c    unbuffered output: one event, one flush,
 *                             event buffers recycled; the idle keep-alive
 *                             comment; the header and body filters that
 *                             replace nginx's error pages
 *   ngx_http_omni_error.c     the OpenAI errors of the engine's failures,
 *                             its ERROR frames and nginx's error pages;
 *                             Retry-After
 *   ngx_http_omni_metrics.c   counters in shared memory (all workers),
 *                             omni_metrics and omni_health responses
 *   ngx_http_omni_redis.c     omni_redis: one Redis connection per
 *                             worker on nginx's event loop (hiredis's
 *                             async API), calls with timeouts, scripts
 *                             (ngx_http_omni_redis.h)
 *   ngx_http_omni_limit.c     omni_limit_zone, omni_limit: rate limits
 *                             in Redis, OpenAI's headers and 429s
 *   ngx_http_omni_route.c     omni_prefix_route: chats sent to the engine
 *                             holding their conversation's prefix
 *   ngx_omni_engine_*.c       CORE module: omni_engine, the sidecar that
 *                             nginx's master starts and keeps alive
 *                             (ngx_omni_engine_module.h)
 *
 * The wire protocol is ../engine/proto/omni_proto.h, included as it is.
 */


#ifndef _NGX_HTTP_OMNI_MODULE_H_INCLUDED_
#define _NGX_HTTP_OMNI_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <yajl/yajl_gen.h>
#include <yajl/yajl_tree.h>

#include "json_scan.h"
#include "omni_proto.h"

#include "ngx_http_omni_multipart.h"


typedef struct ngx_http_omni_endpoint_s  ngx_http_omni_endpoint_t;
typedef struct ngx_http_omni_ctx_s       ngx_http_omni_ctx_t;
typedef struct ngx_http_omni_stt_s       ngx_http_omni_stt_t;
typedef struct ngx_http_omni_main_conf_s ngx_http_omni_main_conf_t;
typedef struct ngx_http_omni_limit_s     ngx_http_omni_limit_t;
typedef struct ngx_http_omni_redis_call_s  ngx_http_omni_redis_call_t;
typedef struct ngx_http_omni_redis_slot_s  ngx_http_omni_redis_slot_t;

struct redisReply;


/* Why a Redis call got no reply (ngx_http_omni_redis.h). */
typedef enum {
    NGX_HTTP_OMNI_REDIS_OK = 0,
    NGX_HTTP_OMNI_REDIS_DOWN,       /* not connected, or the connection
                                       was lost before the reply */
    NGX_HTTP_OMNI_REDIS_TIMEOUT,    /* no reply within the timeout */
    NGX_HTTP_OMNI_REDIS_BUSY,       /* too many calls in flight, or Redis
                                       is behind: failed at once */
    NGX_HTTP_OMNI_REDIS_FAULTS
} ngx_http_omni_redis_fault_e;


/* reply: the reply (valid for the call only), an error reply included;
 * NULL when call->fault says why there is none. */
typedef void (*ngx_http_omni_redis_handler_pt)(
    ngx_http_omni_redis_call_t *call, struct redisReply *reply);


/* One command to Redis, answered at most once through its handler
 * (ngx_http_omni_redis.h). */
struct ngx_http_omni_redis_call_s {
    ngx_http_request_t             *r;          /* NULL: sent and
                                                   forgotten */
    ngx_http_omni_redis_handler_pt  handler;
    void                           *data;
    ngx_http_omni_redis_fault_e     fault;

    /* internal */
    ngx_http_omni_redis_slot_t     *slot;       /* NULL: answered, or
                                                   never sent */
};


/* How omni_prefix_route sent a request (ngx_http_omni_route.c). */
typedef enum {
    NGX_HTTP_OMNI_ROUTE_NONE = 0,   /* not prefix-routed */
    NGX_HTTP_OMNI_ROUTE_HIT,        /* to the engine holding its prefix */
    NGX_HTTP_OMNI_ROUTE_MISS,       /* none holds any: round robin */
    NGX_HTTP_OMNI_ROUTE_FALLBACK    /* a holder could not take it, or
                                       Redis did not answer: round robin */
} ngx_http_omni_route_e;


/* A chat request's prefix key (engine/proto/prefix_key.h): its hex, and
 * how many messages it names. */
#define NGX_HTTP_OMNI_PKEY_HEX  32

typedef struct {
    u_char                      hex[NGX_HTTP_OMNI_PKEY_HEX];
    ngx_uint_t                  messages;
} ngx_http_omni_prefix_key_t;


/* What a request asks the engine for, which decides the request and
 * response shapes (messages or prompt; chat.completion or
 * text_completion objects). */
typedef enum {
    NGX_HTTP_OMNI_KIND_NONE = 0,    /* no body: the engine's models,
                                       health, metrics */
    NGX_HTTP_OMNI_KIND_CHAT,        /* messages in, chat.completion out */
    NGX_HTTP_OMNI_KIND_COMPLETION,  /* a prompt in, text_completion out */
    NGX_HTTP_OMNI_KIND_SPEECH,      /* input in, audio (or speech.audio.*
                                       SSE events) out */
    NGX_HTTP_OMNI_KIND_TRANSCRIPTION
                                    /* a multipart upload in, its
                                       transcript out */
} ngx_http_omni_kind_e;


/* /v1/audio/speech with stream_format "audio": the bytes themselves */
#define ngx_http_omni_raw_audio(ctx)                                          \
    ((ctx)->endpoint->kind == NGX_HTTP_OMNI_KIND_SPEECH && !(ctx)->req.sse)

/* the response carries audio: speech, or chat with audio in modalities */
#define ngx_http_omni_spoken(ctx)                                             \
    ((ctx)->endpoint->kind == NGX_HTTP_OMNI_KIND_SPEECH || (ctx)->req.audio)


/* omni_speech_mode and "speech_mode": the engine's "audio.mode" */
typedef enum {
    NGX_HTTP_OMNI_SPEECH_LATENCY = 0,
    NGX_HTTP_OMNI_SPEECH_QUALITY
} ngx_http_omni_speech_mode_e;


/* A non-streaming chat answer's audio is held in r->pool until DONE, to
 * be sent base64 in one JSON body: at most this many bytes (about 5
 * minutes of 24 kHz pcm16); more fails the request with a 500 that says
 * to stream instead. Streams hold nothing beyond the current event. */
#define NGX_HTTP_OMNI_MAX_AUDIO  (16u << 20)


/* An OpenAI error, ready to be sent as JSON (before the response header)
 * or as an SSE error event (after it). Empty param/code are JSON null. */
typedef struct {
    ngx_uint_t                  status;
    ngx_str_t                   type;       /* "invalid_request_error" ... */
    ngx_str_t                   param;
    ngx_str_t                   code;
    ngx_str_t                   message;
} ngx_http_omni_error_t;


/* How the engine itself failed a request, as opposed to an ERROR frame
 * it sent: each has one OpenAI error (ngx_http_omni_error.c). */
typedef enum {
    NGX_HTTP_OMNI_ENGINE_DOWN = 0,  /* 503: not reached */
    NGX_HTTP_OMNI_ENGINE_GONE,      /* 503: took the request, then closed */
    NGX_HTTP_OMNI_ENGINE_TIMEOUT,   /* 504: did not answer in time */
    NGX_HTTP_OMNI_ENGINE_INVALID,   /* 502: sent a frame it should not */
    NGX_HTTP_OMNI_ENGINE_CUT,       /* 502: closed a stream before DONE */
    NGX_HTTP_OMNI_ENGINE_FAILED,    /* 502: failed during a stream */
    NGX_HTTP_OMNI_ENGINE_FAULTS
} ngx_http_omni_fault_e;


/* An audio input: what follows the REQUEST in AUDIO_IN frames, one of
 * the engine's "audio_in" (engine/request/request.h). Strings are static
 * or from r->pool, NUL-terminated. */
typedef struct {
    char                       *format;     /* "wav", "mp3", "flac", "opus",
                                               "auto": a hint, the engine
                                               sniffs */
    char                       *param;      /* OpenAI's name for it, in the
                                               engine's errors: "file",
                                               "messages[0].content[1]
                                               .input_audio" */
    off_t                       bytes;
} ngx_http_omni_audio_in_t;


/* What the OpenAI request body said, once parsed. */
typedef struct {
    ngx_str_t                   model;      /* as the client named it */
    ngx_str_t                   engine;     /* the request JSON for the
                                               engine (engine/request/
                                               request.h) */
    ngx_str_t                   seed;       /* decimal: the client's, or
                                               the one drawn for it */
    ngx_str_t                   audio_id;   /* chat audio out: "audio_" and
                                               32 hex digits, minted here */
    ngx_str_t                   format;     /* audio out: the client's name
                                               of it ("pcm16", "mp3", ...) */
    ngx_array_t                *audio_in;   /* ngx_http_omni_audio_in_t, in
                                               the order their bytes go;
                                               NULL: no audio in */
    ngx_chain_t                *audio_bufs; /* their bytes: memory buffers,
                                               or one buffer of the body's
                                               temporary file */
    ngx_chain_t               **audio_last;
    off_t                       audio_skip; /* bytes at the start of
                                               audio_bufs that are not
                                               audio (the file case) */
    off_t                       audio_bytes;
                                            /* every input's bytes */
    ngx_array_t                *prefix_keys;
                                            /* chat: of
                                               ngx_http_omni_prefix_key_t,
                                               in order; NULL: none */
    unsigned                    stream:1;   /* speech: always */
    unsigned                    include_usage:1;
    unsigned                    audio:1;    /* chat: "audio" in modalities */
    unsigned                    sse:1;      /* speech: stream_format "sse" */
} ngx_http_omni_req_t;


/* A transcription's response_format */
typedef enum {
    NGX_HTTP_OMNI_STT_JSON = 0,
    NGX_HTTP_OMNI_STT_TEXT,
    NGX_HTTP_OMNI_STT_SRT,
    NGX_HTTP_OMNI_STT_VERBOSE_JSON,
    NGX_HTTP_OMNI_STT_VTT
} ngx_http_omni_stt_format_e;


/* One TRANSCRIPT: a recognised utterance, and its words. */
typedef struct {
    ngx_str_t                   text;       /* no leading space */
    double                      start;      /* seconds */
    double                      end;
    double                      avg_logprob;
    ngx_uint_t                  word;       /* its first in stt->words */
    ngx_uint_t                  nwords;
} ngx_http_omni_segment_t;

typedef struct {
    ngx_str_t                   word;
    double                      start;
    double                      end;
} ngx_http_omni_word_t;


/* A transcription: its body's parser while the body arrives, what the
 * fields asked for, and (not streaming) the segments until DONE. */
struct ngx_http_omni_stt_s {
    ngx_http_omni_mp_t         *mp;
    ngx_http_omni_stt_format_e  format;
    ngx_array_t                 segments;   /* ngx_http_omni_segment_t */
    ngx_array_t                 words;      /* ngx_http_omni_word_t */
    size_t                      held;       /* TRANSCRIPT bytes gathered */
    ngx_uint_t                  deltas;     /* streaming: deltas sent */
    unsigned                    segment_times:1;
                                            /* verbose_json: "segments" */
    unsigned                    word_times:1;
                                            /* verbose_json: "words" */
    unsigned                    language:1; /* "language" was given */
};



/* An endpoint's functions. parse: the body read into req (see
 * ngx_http_omni_parse()); start: before the body is read, for a body the
 * endpoint reads as it arrives (NGX_OK; NGX_DECLINED, err filled: the
 * request is answered at once; NGX_ERROR), parse then gets no body;
 * reply: the engine's one answer frame made the
 * response (ngx_http_omni_reply() and its kin); page: the body of nginx's
 * error page of the status for it, err->status and *type changed when the
 * page answers otherwise (NULL: out of memory). */
typedef ngx_int_t (*ngx_http_omni_parse_pt)(ngx_http_request_t *r,
    ngx_http_omni_endpoint_t *ep, ngx_str_t *body, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
typedef ngx_int_t (*ngx_http_omni_start_pt)(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
typedef ngx_int_t (*ngx_http_omni_reply_pt)(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
typedef ngx_buf_t *(*ngx_http_omni_page_pt)(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, ngx_uint_t status, ngx_str_t *type);


/*
 * One row of ngx_http_omni_endpoints[] (ngx_http_omni_module.c): all the
 * module knows of an endpoint, so that a new one is a row and its
 * functions. A location holds a pointer to its row (omni_health,
 * omni_metrics) or finds it by URI; the request's ctx keeps it.
 */
struct ngx_http_omni_endpoint_s {
    ngx_str_t                   path;       /* after "/v1/"; ending in "/":
                                               a prefix, the rest of the URI
                                               is ctx->model_id */
    ngx_str_t                   directive;  /* else the directive that
                                               makes a location it */
    ngx_str_t                   label;      /* omni_nginx_requests_total's
                                               endpoint label */
    ngx_uint_t                  methods;    /* NGX_HTTP_POST ... */
    ngx_str_t                   allow;      /* the same, for a 405's Allow */
    ngx_http_omni_kind_e        kind;
    ngx_http_omni_parse_pt      parse;      /* NULL: no body, discarded */
    ngx_http_omni_start_pt      start;      /* NULL: the body is read whole
                                               into memory for parse */
    off_t                       max_body;   /* a larger body is a 413 */
    ngx_uint_t                  frame;      /* the engine frame it sends,
                                               OMNI_F_*; 0: not implemented
                                               yet, answered 501 */
    ngx_uint_t                  reply_frame;
                                            /* the engine's answer, OMNI_F_*_R;
                                               0: a completion, TEXT ... DONE,
                                               as JSON or as SSE events */
    ngx_http_omni_reply_pt      reply;      /* reply_frame as a response */
    ngx_http_omni_page_pt       page;       /* NULL: OpenAI's error object */
    ngx_str_t                   id_prefix;  /* ctx->id: "chatcmpl-" ... */
    unsigned                    probe:1;    /* omni_health_timeout, no API
                                               key, no body size check */
};


#define NGX_HTTP_OMNI_ENDPOINTS  8          /* ngx_http_omni_endpoints[]'s
                                               rows */

extern ngx_http_omni_endpoint_t  ngx_http_omni_endpoints[];


/* Per-request state. */
struct ngx_http_omni_ctx_s {
    ngx_http_omni_endpoint_t   *endpoint;   /* NULL: the URI names none */
    ngx_http_omni_req_t         req;
    ngx_str_t                   model_id;   /* GET /v1/models/{id},
                                               URL-decoded */
    ngx_str_t                   id;         /* "chatcmpl-<request id>" or
                                               "cmpl-..." */
    time_t                      created;
    ngx_str_t                   request_id; /* $request_id, x-request-id */

    /* frame parsing state, upstream side */
    u_char                      hdr[OMNI_FRAME_HDR];
    size_t                      hdr_got;
    OmniFrameHdr                frame;
    ngx_buf_t                  *payload;    /* the frame being read, when
                                               it spans reads; reused */
    size_t                      payload_got;

    /* response state */
    unsigned                    header_sent:1;  /* HTTP header out */
    unsigned                    role_sent:1;    /* first chat chunk out */
    unsigned                    done:1;         /* DONE or ERROR seen */
    ngx_chain_t                *text;           /* non-streaming: text
                                                   gathered so far */
    ngx_chain_t                *text_last;      /* its last link */
    ngx_chain_t                *reasoning;      /* non-streaming chat: the
                                                   REASONING gathered */
    ngx_chain_t                *reasoning_last;
    OmniDone                    usage;
    ngx_chain_t                *audio;          /* non-streaming chat: audio
                                                   gathered so far, in
                                                   buffers of a multiple of
                                                   3 bytes (base64) */
    ngx_chain_t                *audio_last;
    size_t                      audio_len;      /* its bytes */
    u_char                      carry[6];       /* chat stream: pcm16 bytes
                                                   short of a 6-byte piece */
    size_t                      carry_len;
    unsigned                    audio_started:1; /* first delta.audio out:
                                                    the id went with it */
    ngx_chain_t                *out;            /* a whole body, made
                                                   before the header */
    ngx_chain_t                *free;           /* event buffers, sent */
    ngx_chain_t                *busy;           /* event buffers, being
                                                   sent */
    ngx_event_t                 keepalive;      /* idle SSE comment timer */

    ngx_http_omni_stt_t        *stt;            /* a transcription's */

    /* the AUDIO_IN upload (ngx_http_omni_audio_in.c): the request stream
     * is the REQUEST frame, up_skip bytes that are not sent, the audio */
    off_t                       up_request;     /* the REQUEST frame's
                                                   bytes */
    off_t                       up_off;         /* bytes of the stream seen
                                                   by the output filter */
    ngx_chain_t                *up_free;        /* frame headers and views
                                                   of the audio, sent */
    ngx_chain_t                *up_busy;        /* the same, being sent */
    unsigned                    up_stopped:1;   /* the engine answered, or
                                                   stopped reading: the rest
                                                   is not sent */

    /* Redis, before the upstream: the limits (ngx_http_omni_limit.c),
     * the prefix route (ngx_http_omni_route.c) */
    ngx_http_omni_limit_t      *limit;
    ngx_uint_t                  waiting;        /* answers still due before
                                                   the upstream starts */
    ngx_http_omni_route_e       route;
    ngx_str_t                   route_engine;   /* the holder chosen, a
                                                   peer's name; empty:
                                                   round robin's */
    ngx_uint_t                  route_messages; /* what it holds */
    ngx_uint_t                  route_tokens;
    ngx_str_t                  *route_peers;    /* the names asked about */
    ngx_uint_t                  route_npeers;
    ngx_http_omni_redis_call_t  route_call;
    unsigned                    route_busy:1;   /* a holder was skipped */
    unsigned                    admitted:1;     /* the upstream started, or
                                                   the request was refused */
    unsigned                    usage_seen:1;   /* DONE decoded into usage */

    /* an error page of nginx's, replaced by JSON (output.c filters) */
    ngx_http_omni_error_t       err;            /* what the module knows
                                                   about it; status 0:
                                                   nothing */
    ngx_chain_t                *page;           /* the replacement body */
};


typedef struct {
    ngx_http_upstream_conf_t    upstream;
    ngx_flag_t                  enabled;        /* the content handler here
                                                   is the module's */
    ngx_http_omni_endpoint_t   *endpoint;       /* omni_health/omni_metrics
                                                   locations: their row;
                                                   NULL: found by URI */
    ngx_msec_t                  keepalive_interval;
                                                /* omni_keepalive_interval */
    ngx_msec_t                  health_timeout; /* omni_health_timeout */
    ngx_array_t                *api_keys;       /* of ngx_str_t, or NULL */
    ngx_str_t                   api_keys_file;
    ngx_uint_t                  speech_mode;    /* omni_speech_mode */
    ngx_int_t                   max_audio_seconds;
                                                /* omni_max_audio_seconds */
    ngx_array_t                *limits;         /* omni_limit: of
                                                   ngx_shm_zone_t *; NULL:
                                                   none */
    ngx_uint_t                  limit_fail;     /* omni_limit_fail: 1 open,
                                                   0 closed */
    ngx_flag_t                  route_header;   /* omni_route_header */
} ngx_http_omni_loc_conf_t;


/* An upstream block's: omni_prefix_route. */
typedef struct {
    ngx_flag_t                  prefix_route;
    ngx_uint_t                  max_waiting;
} ngx_http_omni_srv_conf_t;


typedef struct ngx_http_omni_redis_s       ngx_http_omni_redis_t;
typedef struct ngx_http_omni_redis_conf_s  ngx_http_omni_redis_conf_t;


struct ngx_http_omni_main_conf_s {
    ngx_shm_zone_t             *shm_zone;       /* the module's counters,
                                                   NULL until a location
                                                   uses the module */
    ngx_int_t                   request_id;     /* $request_id's index */
    ngx_http_omni_redis_conf_t *redis;          /* omni_redis, or NULL */
    ngx_http_omni_redis_t      *redis_worker;   /* the worker's connection
                                                   (init_process) */
    ngx_array_t                 limit_zones;    /* omni_limit_zone's, of
                                                   ngx_shm_zone_t * */
};


extern ngx_module_t  ngx_http_omni_module;


/* ngx_http_omni_request.c
 *
 * ngx_http_omni_parse() reads a chat or completions body (yajl), checks
 * that it is valid UTF-8 text (json_scan.h) and the fields the module acts
 * on (model, stream, stream_options, n, logprobs, max_completion_tokens /
 * max_tokens, modalities, tools, response_format, seed, ...) and writes
 * req->engine: the normalized request of engine/request/request.h with
 * messages or prompt, the seed (drawn when absent; req->seed) and the
 * sampling fields copied as given (the engine checks their types and
 * ranges and answers with an ERROR naming the param). ep->kind says
 * which. Returns NGX_OK, NGX_DECLINED with err filled (a 400), or
 * NGX_ERROR (no memory). The row's parser of chat and completions, and
 * of /v1/audio/speech (its fields: ngx_http_omni_speech.c). */
ngx_int_t ngx_http_omni_parse(ngx_http_request_t *r,
    ngx_http_omni_endpoint_t *ep, ngx_str_t *body, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);


/* ngx_http_omni_speech.c
 *
 * The speech endpoint's names for the engine's params of an ERROR
 * ("audio.voice" is "voice" there); other endpoints' errors are left
 * alone. */
void ngx_http_omni_speech_error(ngx_http_omni_ctx_t *ctx,
    ngx_http_omni_error_t *err);


/* ngx_http_omni_json.c
 *
 * JSON in, for the request body and the engine's MODELS_R: the pre-scan
 * with the module's limits (*at: where it stopped); why it refused (NULL:
 * it did not; *syntax: not JSON at all); both at once; yajl's tree of
 * the bytes, freed by yajl_tree_free() (NULL: refused, why in ebuf, or
 * out of memory, ebuf empty); an object's member (NULL when absent or
 * null); a tree value or a C string added to a yajl_gen (a
 * yajl_gen_status). */
OmniJsonScan ngx_http_omni_json_scan(u_char *p, size_t len, size_t *at);
char *ngx_http_omni_scan_reason(OmniJsonScan rc, ngx_uint_t *syntax);
char *ngx_http_omni_prescan(u_char *p, size_t len, ngx_uint_t *syntax);
yajl_val ngx_http_omni_tree(ngx_http_request_t *r, u_char *json,
    size_t len, u_char *ebuf, size_t size);
yajl_val ngx_http_omni_member(yajl_val o, const char *key);
ngx_uint_t ngx_http_omni_gen_value(yajl_gen g, yajl_val v);
ngx_uint_t ngx_http_omni_gen_str(yajl_gen g, const char *s);


/* ngx_http_omni_openai.c
 *
 * Whole bodies, allocated from r->pool. */
ngx_buf_t *ngx_http_omni_error_json(ngx_http_request_t *r,
    ngx_http_omni_error_t *err);
ngx_buf_t *ngx_http_omni_completion_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);              /* non-streaming body from
                                               ctx->text and ctx->usage */
/* SSE events, in a buffer of ctx's free list (ngx_http_omni_event_buf()),
 * for ngx_http_omni_send_event(); NULL: no memory. */
ngx_chain_t *ngx_http_omni_error_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
                                            /* data: {"error":...}\n\n */
ngx_chain_t *ngx_http_omni_chunk_role(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_text(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *text, size_t len);
ngx_chain_t *ngx_http_omni_chunk_reasoning(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char *text, size_t len);
ngx_chain_t *ngx_http_omni_chunk_finish(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_usage(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_chain_t *ngx_http_omni_chunk_done(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);              /* data: [DONE]\n\n */
/* usage {...} of ctx->usage at p, at most NGX_HTTP_OMNI_USAGE_LEN
 * bytes; the finish reason of a choice; a whole answer's end,
 * REASON"}],"usage":{...}}\n, at most NGX_HTTP_OMNI_END_LEN bytes. */
#define NGX_HTTP_OMNI_USAGE_LEN  512        /* ample: 6 numbers in 250 */
#define NGX_HTTP_OMNI_END_LEN                                                 \
    (sizeof("length\"}],\"usage\":}\n") - 1 + NGX_HTTP_OMNI_USAGE_LEN)

u_char *ngx_http_omni_usage(u_char *p, ngx_http_omni_ctx_t *ctx);
/* A double with at most frac (<= 9) decimals, the trailing zeros but one
 * dropped: "-0.41", "2.0", at most NGX_HTTP_OMNI_DOUBLE_LEN bytes;
 * outside +-1e15 (NaN, infinities) it is 0.0. */
#define NGX_HTTP_OMNI_DOUBLE_LEN  (NGX_INT64_LEN + 12)

u_char *ngx_http_omni_double(u_char *p, double v, ngx_uint_t frac);
ngx_str_t ngx_http_omni_finish(ngx_http_omni_ctx_t *ctx);
u_char *ngx_http_omni_completion_end(u_char *p, ngx_http_omni_ctx_t *ctx);
/* The pieces of chat.completion.chunk events, for ngx_http_omni_audio.c:
 * one event of escaped text: "data: " head pre text post
 * [,"usage":null] "}\n\n" (the head: id, object, created, model; usage
 * null when usage_null and include_usage); the same in two steps, for a
 * body of size bytes the caller writes; the head {"id","object",
 * "created","model", (open) and its length; JSON string escaping. */
ngx_chain_t *ngx_http_omni_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *pre, u_char *text, size_t len,
    ngx_str_t *post, ngx_uint_t usage_null);
ngx_chain_t *ngx_http_omni_event_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *pre, size_t size, ngx_str_t *post);
void ngx_http_omni_event_end(ngx_http_omni_ctx_t *ctx, ngx_buf_t *b,
    ngx_str_t *post, ngx_uint_t usage_null);
size_t ngx_http_omni_head_len(ngx_http_omni_ctx_t *ctx, ngx_str_t *object);
u_char *ngx_http_omni_head(u_char *p, ngx_http_omni_ctx_t *ctx,
    ngx_str_t *object);
u_char *ngx_http_omni_text(ngx_http_request_t *r, ngx_chain_t *chain,
    size_t *len);
size_t ngx_http_omni_escape_len(u_char *s, size_t len);
u_char *ngx_http_omni_escape(u_char *dst, u_char *s, size_t len);
/* x-omni-seed on a chat or completions response about to start. */
ngx_int_t ngx_http_omni_seed_header(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);


/* ngx_http_omni_upstream.c */
/* Creates r->upstream with the module's callbacks (omni_pass). */
ngx_int_t ngx_http_omni_upstream_create(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf);
/* The response of an endpoint's reply function, made before the header:
 * status, Content-Type and Content-Length of body, which goes out in
 * input_filter_init; of one buffer b (NULL, out of memory: NGX_ERROR);
 * of an OpenAI error. */
ngx_int_t ngx_http_omni_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_uint_t status, ngx_str_t *type,
    ngx_chain_t *body);
ngx_int_t ngx_http_omni_reply_buf(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_uint_t status, ngx_str_t *type,
    ngx_buf_t *b);
ngx_int_t ngx_http_omni_reply_error(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
/* A frame the engine should not have sent (what: its name, logged; NULL:
 * logged already): NGX_HTTP_UPSTREAM_INVALID_HEADER, a 502. */
ngx_int_t ngx_http_omni_invalid_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, const char *what);
/* Reads one engine frame from *pos up to last, advancing *pos. NGX_OK: a
 * whole frame, header in ctx->frame, payload in *payload (valid until the
 * next call); NGX_AGAIN: every byte consumed, the frame not whole yet;
 * NGX_HTTP_UPSTREAM_INVALID_HEADER; NGX_ERROR. */
ngx_int_t ngx_http_omni_parse_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, u_char **pos, u_char *last,
    ngx_str_t *payload);
/* An ERROR frame's payload as an OpenAI error, logged; NGX_ERROR: it is
 * not an ERROR's. */
ngx_int_t ngx_http_omni_error_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload, ngx_http_omni_error_t *err);


/* ngx_http_omni_models.c: the reply function of the models rows
 * (MODELS_R): OpenAI's list, or the model the URI names (ctx->model_id;
 * a 404 when the engine does not serve it). */
ngx_int_t ngx_http_omni_models_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);


/* ngx_http_omni_sse.c */
/* A stream's first frame, left in the buffer (process_header): NGX_OK,
 * the header is set; NGX_AGAIN, no whole frame header yet; NGX_DECLINED,
 * the frame is not part of a stream (process_header reads it); NGX_ERROR.
 */
ngx_int_t ngx_http_omni_stream_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
/* The upstream input filter of a stream (u->input_filter_ctx is r). */
ngx_int_t ngx_http_omni_input_filter(void *data, ssize_t bytes);
/* A chat stream's role chunk, once. NGX_ERROR: the client is gone. */
ngx_int_t ngx_http_omni_stream_role(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
/* An error after the stream began: one error event, and the stream is
 * done. Raw audio (speech, stream_format "audio") has no events: the
 * stream is cut, NGX_ERROR, and the connection closes without the last
 * chunk, so that the client sees a truncated body. NGX_ERROR: the
 * client is gone, or the stream is cut. */
ngx_int_t ngx_http_omni_stream_error(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);


/* ngx_http_omni_audio.c */
/* A stream's first frame (process_header): its Content-Type, once the
 * engine answered with audio or text; NGX_ERROR: no memory. */
ngx_int_t ngx_http_omni_audio_header(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
/* A stream's AUDIO, TEXT and DONE when the response is spoken (speech,
 * chat audio): NGX_OK, NGX_ERROR (the client is gone),
 * NGX_HTTP_UPSTREAM_INVALID_HEADER. */
ngx_int_t ngx_http_omni_audio_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
/* Non-streaming chat audio: AUDIO gathered (NGX_DECLINED with err filled,
 * a 500, past NGX_HTTP_OMNI_MAX_AUDIO); the chat.completion body at
 * DONE. */
ngx_int_t ngx_http_omni_audio_gather(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload, ngx_http_omni_error_t *err);
ngx_buf_t *ngx_http_omni_audio_json(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);


/* ngx_http_omni_error.c */
/* The type an error of status has when it names none. */
ngx_str_t *ngx_http_omni_error_type(ngx_uint_t status);
/* The OpenAI error of an engine failure: err's fields point at static
 * strings. */
void ngx_http_omni_engine_fault(ngx_http_omni_fault_e fault,
    ngx_http_omni_error_t *err);
/* An engine ERROR payload as an OpenAI error (views into p); NGX_ERROR:
 * not an ERROR payload. */
ngx_int_t ngx_http_omni_engine_error(u_char *p, size_t len,
    ngx_http_omni_error_t *err);
/* An error page nginx made for status, as an OpenAI error. */
void ngx_http_omni_status_error(ngx_uint_t status,
    ngx_http_omni_error_t *err);
/* Retry-After: 1 when status is 503, the answer of an engine that may be
 * back soon; nothing otherwise. */
ngx_int_t ngx_http_omni_retry_after(ngx_http_request_t *r, ngx_uint_t status);


/* ngx_http_omni_output.c */
/* A new buffer of size bytes from r->pool linked at the end of the chain
 * *first..*last; NULL: no memory. */
ngx_chain_t *ngx_http_omni_chain_add(ngx_http_request_t *r,
    ngx_chain_t **first, ngx_chain_t **last, size_t size);
ngx_int_t ngx_http_omni_send_header(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *content_type, off_t content_length);
/* An empty event buffer of at least size bytes, from ctx->free. */
ngx_chain_t *ngx_http_omni_event_buf(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, size_t size);
/* Sends the event cl (from ngx_http_omni_event_buf()) now and flushes;
 * its buffer goes back to ctx->free once written out. Arms the keep-alive
 * timer again. */
ngx_int_t ngx_http_omni_send_event(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_chain_t *cl);
/* A whole response: header, body b, last buffer. */
ngx_int_t ngx_http_omni_send_response(ngx_http_request_t *r,
    ngx_uint_t status, ngx_str_t *content_type, ngx_buf_t *b);
ngx_int_t ngx_http_omni_send_error(ngx_http_request_t *r,
    ngx_http_omni_error_t *err);
/* Content-Type, with content_type_len the part before ";". */
void ngx_http_omni_set_content_type(ngx_http_request_t *r, ngx_str_t *type);
/* Adds a response header line; value must outlive the request. */
ngx_int_t ngx_http_omni_add_header(ngx_http_request_t *r, ngx_str_t *key,
    ngx_str_t *value);
/* Arms the SSE keep-alive comment (omni_keepalive_interval). */
void ngx_http_omni_keepalive_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
void ngx_http_omni_keepalive_stop(ngx_http_omni_ctx_t *ctx);
/* Header and body filters: x-request-id on every response of an omni
 * location, nginx's own error pages there replaced by OpenAI JSON. */
ngx_int_t ngx_http_omni_filter_init(ngx_conf_t *cf);


/* ngx_http_omni_metrics.c */
typedef enum {
    NGX_HTTP_OMNI_M_CLIENT_ABORT = 0,
    NGX_HTTP_OMNI_M_UPSTREAM_ERROR,
    NGX_HTTP_OMNI_M_AUTH_FAILED,
    NGX_HTTP_OMNI_M_REDIS_UP,           /* gauge: workers connected */
    NGX_HTTP_OMNI_M_REDIS_PENDING,      /* gauge: calls in flight */
    NGX_HTTP_OMNI_M_REDIS_CONNECTS,
    NGX_HTTP_OMNI_M_REDIS_DOWN,         /* calls failed, by why */
    NGX_HTTP_OMNI_M_REDIS_TIMEOUT,
    NGX_HTTP_OMNI_M_REDIS_BUSY,
    NGX_HTTP_OMNI_M_REDIS_REPLY_ERROR,
    NGX_HTTP_OMNI_M_LIMIT_FAIL_OPEN,    /* omni_limit_fail's decisions */
    NGX_HTTP_OMNI_M_LIMIT_FAIL_CLOSED,
    NGX_HTTP_OMNI_M_ROUTE_HIT,          /* omni_prefix_route's choices */
    NGX_HTTP_OMNI_M_ROUTE_MISS,
    NGX_HTTP_OMNI_M_ROUTE_FALLBACK,
    NGX_HTTP_OMNI_M_COUNTERS
} ngx_http_omni_counter_e;

void ngx_http_omni_count(ngx_http_request_t *r, ngx_http_omni_counter_e c);
/* The same without a request: delta may be negative (gauges). */
void ngx_http_omni_metric_add(ngx_http_omni_main_conf_t *omcf,
    ngx_http_omni_counter_e c, ngx_atomic_int_t delta);
/* One Redis round trip of us microseconds, into the histogram. */
void ngx_http_omni_redis_observe(ngx_http_omni_main_conf_t *omcf,
    uint64_t us);
/* The module's counters as Prometheus text, appended after the engine's;
 * engine_up says whether the engine answered. */
ngx_buf_t *ngx_http_omni_metrics_text(ngx_http_request_t *r,
    ngx_uint_t engine_up);
/* {"status":"ready"} or {"status":"not ready","reason":...} */
ngx_buf_t *ngx_http_omni_health_json(ngx_http_request_t *r,
    ngx_uint_t ready, u_char *reason, size_t len);
/* omni_health's and omni_metrics' reply (HEALTH_R, METRICS_R) and error
 * page functions. */
ngx_int_t ngx_http_omni_health_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
ngx_int_t ngx_http_omni_metrics_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
ngx_buf_t *ngx_http_omni_health_page(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, ngx_uint_t status, ngx_str_t *type);
ngx_buf_t *ngx_http_omni_metrics_page(ngx_http_request_t *r,
    ngx_http_omni_error_t *err, ngx_uint_t status, ngx_str_t *type);
/* Adds the counters' shared zone (once per configuration). */
ngx_int_t ngx_http_omni_metrics_add_zone(ngx_conf_t *cf);
/* Counts each request of an omni location by endpoint and status. */
ngx_int_t ngx_http_omni_metrics_init(ngx_conf_t *cf);

/* ngx_http_omni_auth.c
 *
 * The request's "Authorization: Bearer KEY" against omni_api_keys: NGX_OK;
 * NGX_DECLINED with err filled (a 401); NGX_ERROR: out of memory, a
 * server fault, not a refused key. The key file read into olcf->api_keys
 * (configuration time). */
ngx_int_t ngx_http_omni_auth(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf, ngx_http_omni_error_t *err);
/* The request's Bearer token when omni_api_keys is off or knows it
 * (NGX_OK), else NGX_DECLINED: the default key of omni_limit_zone. */
ngx_int_t ngx_http_omni_api_key(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf, ngx_str_t *key);
/* With omni_api_keys on, the request's tenant: "key-" and 16 hex digits
 * of its key's SHA-1 at name (NGX_OK); NGX_DECLINED: no tenants. */
#define NGX_HTTP_OMNI_TENANT_LEN  (sizeof("key-") - 1 + 16)

ngx_int_t ngx_http_omni_tenant(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf, u_char *name);
char *ngx_http_omni_read_keys(ngx_conf_t *cf,
    ngx_http_omni_loc_conf_t *olcf);


/* ngx_http_omni_body.c
 *
 * The largest request body read into memory: the engine's largest request
 * (a body that big cannot become a smaller one but by fields the module
 * ignores). A body over it: a 413, err filled, NGX_DECLINED. The body
 * handler of ngx_http_read_client_request_body(). */
#define NGX_HTTP_OMNI_MAX_BODY  OMNI_MAX_REQUEST

ngx_int_t ngx_http_omni_too_large(ngx_http_request_t *r, off_t len,
    ngx_http_omni_error_t *err);
void ngx_http_omni_body_handler(ngx_http_request_t *r);


/* ngx_http_omni_transcribe.c
 *
 * POST /v1/audio/transcriptions in. The largest body it takes: the
 * engine's largest audio upload and room for the other fields. start (the
 * row's): the Content-Type's boundary and the body's parser, before the
 * body is read; the request body filter (installed by _init) feeds it
 * what nginx reads, so the body is parsed as it arrives, and a malformed
 * or too large one is refused before the rest is read; parse (the row's):
 * the fields, the engine's JSON, the file part's bytes as the audio. */
#define NGX_HTTP_OMNI_MAX_UPLOAD                                              \
    ((off_t) OMNI_MAX_AUDIO_IN_TOTAL + NGX_HTTP_OMNI_MP_KEPT + 65536)

ngx_int_t ngx_http_omni_transcribe_start(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_transcribe_parse(ngx_http_request_t *r,
    ngx_http_omni_endpoint_t *ep, ngx_str_t *body, ngx_http_omni_req_t *req,
    ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_transcribe_init(ngx_conf_t *cf);


/* ngx_http_omni_transcript.c
 *
 * A transcription's TRANSCRIPT frames out. Not streaming: each gathered
 * (NGX_DECLINED with err filled, a 500, past NGX_HTTP_OMNI_MAX_AUDIO
 * bytes of them), then at DONE the body in the response_format asked
 * for. Streaming: a transcript.text.delta event each, at DONE
 * transcript.text.done and [DONE]. NGX_HTTP_UPSTREAM_INVALID_HEADER: the
 * engine's JSON is not a TRANSCRIPT's. */
ngx_int_t ngx_http_omni_transcript_gather(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload, ngx_http_omni_error_t *err);
ngx_int_t ngx_http_omni_transcript_reply(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);
ngx_int_t ngx_http_omni_transcript_frame(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_str_t *payload);


/* ngx_http_omni_audio_in.c
 *
 * An input added to req: its format and param (static or pool strings),
 * its bytes (a chain of memory buffers, or one buffer of a temporary file
 * whose first skip bytes are not its own; skip only for the first).
 * The request chain's audio (create_request): its links after *ll, the
 * upload's counters reset; the output filter that frames it (the
 * upstream's u->output.output_filter, its ctx r); the engine answered or
 * closed: what is left of the upload is dropped. */
ngx_int_t ngx_http_omni_audio_in_add(ngx_http_request_t *r,
    ngx_http_omni_req_t *req, char *format, char *param, ngx_chain_t *bufs,
    off_t skip, off_t bytes);
ngx_int_t ngx_http_omni_audio_in_request(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_chain_t **ll);
ngx_int_t ngx_http_omni_audio_in_filter(void *data, ngx_chain_t *in);
void ngx_http_omni_audio_in_stop(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);


/* ngx_http_omni_limit.c
 *
 * omni_limit_zone, omni_limit; the phase handlers (postconfiguration);
 * admission: the prompt's tokens once the body is parsed (NGX_OK: taken
 * or none to take; NGX_AGAIN: asked, ngx_http_omni_admitted() follows;
 * NGX_DECLINED: refused, err filled; NGX_ERROR); the zones' metrics. */
char *ngx_http_omni_limit_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_omni_limit(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_omni_limit_init(ngx_conf_t *cf);
ngx_int_t ngx_http_omni_limit_admit(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_error_t *err);
size_t ngx_http_omni_limit_metrics_len(ngx_http_omni_main_conf_t *omcf);
u_char *ngx_http_omni_limit_metrics(u_char *p,
    ngx_http_omni_main_conf_t *omcf);


/* ngx_http_omni_route.c
 *
 * omni_prefix_route (an upstream block's); a chat request's prefix keys
 * (its parser calls it); the lookup before the upstream (NGX_OK: nothing
 * to wait for; NGX_AGAIN: asked, ngx_http_omni_admitted() follows;
 * NGX_ERROR); x-omni-route; the variables. */
char *ngx_http_omni_prefix_route(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_omni_prefix_keys(ngx_http_request_t *r,
    ngx_http_omni_req_t *req, yajl_val model, ngx_str_t *salt,
    yajl_val msgs);
ngx_int_t ngx_http_omni_route_lookup(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx, ngx_http_omni_loc_conf_t *olcf);
ngx_int_t ngx_http_omni_route_header(ngx_http_request_t *r,
    ngx_http_omni_ctx_t *ctx);
ngx_int_t ngx_http_omni_route_add_variables(ngx_conf_t *cf);


/* ngx_http_omni_body.c: one of the Redis answers a request waited on
 * before its upstream is in. rc NGX_OK: it let the request go on (the
 * upstream starts once none is due); NGX_DECLINED: the request is
 * answered with err; NGX_ERROR: a 500. */
void ngx_http_omni_admitted(ngx_http_request_t *r, ngx_http_omni_ctx_t *ctx,
    ngx_int_t rc, ngx_http_omni_error_t *err);


/* ngx_http_omni_module.c: the request's ctx, made on first use (the
 * limits' preaccess handler, or the content handler). */
ngx_http_omni_ctx_t *ngx_http_omni_get_ctx(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf);

/* ngx_http_omni_module.c: the endpoint of a request, its location's or
 * the one its URI names, NULL when none (also for requests answered
 * before the content handler, such as a 413). */
ngx_http_omni_endpoint_t *ngx_http_omni_endpoint(ngx_http_request_t *r,
    ngx_http_omni_loc_conf_t *olcf, ngx_str_t *model_id);


#endif /* _NGX_HTTP_OMNI_MODULE_H_INCLUDED_ */

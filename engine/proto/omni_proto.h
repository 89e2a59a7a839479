/* omni_proto.h -- the wire protocol between nginx (ngx_omni_module) and
 * omni-engine, and between the engine's frontend and its stages.
 *
 * Binary frames on a stream socket. Every frame is an 8-byte header and a
 * payload:
 *
 *   offset 0  u32  payload length in bytes, little-endian
 *          4  u8   frame type (OmniFrameType)
 *          5  u8   protocol version (OMNI_PROTO_VERSION)
 *          6  u16  flags, little-endian; 0 (reserved)
 *
 * One connection carries one exchange; closing it cancels:
 *
 *   request:  client sends REQUEST (JSON, see request.h) and, when the JSON
 *             has "audio_in", the bytes of those audio inputs in AUDIO_IN
 *             frames; the engine answers with REASONING*, TEXT*, AUDIO*
 *             and TRANSCRIPT* (interleaved) then exactly one DONE or ERROR,
 *             then closes. The engine may answer (an ERROR) before the
 *             audio is all sent; the client then stops sending.
 *             A client that closes its end first cancels the request: the
 *             engine frees the sequence at once.
 *   control:  client sends HEALTH, MODELS or METRICS (empty payload); the
 *             engine answers with one HEALTH_R, MODELS_R or METRICS_R frame
 *             and closes.
 *
 * The receiver checks a header (omni_frame_check) before it allocates or
 * reads the payload: unknown type, wrong version, nonzero flags, a frame
 * type that does not travel in that direction, or a length over the
 * type's limit is a protocol error: the engine answers with an ERROR
 * event (400, "invalid_request_error") and closes; it keeps serving.
 *
 * AUDIO_IN (client -> engine): 1..OMNI_MAX_AUDIO_IN bytes of the request's
 * audio inputs, in order: the concatenation of every AUDIO_IN payload is
 * audio_in[0]'s file, then audio_in[1]'s, ... The JSON gives each input's
 * length ("bytes"), so there is no end marker: the engine reads exactly
 * that many more bytes (at most OMNI_MAX_AUDIO_IN_TOTAL in all), and a
 * byte more, or an AUDIO_IN after a REQUEST without "audio_in", is a
 * protocol error.
 *
 * Payloads of the engine's answers:
 *
 *   TEXT       raw UTF-8, whole characters (never split), 1..OMNI_MAX_TEXT.
 *              With speech out, the text being spoken (the transcript).
 *   REASONING  raw UTF-8 as TEXT, 1..OMNI_MAX_TEXT: the model's reasoning
 *              (a thinking template's text between <think> and </think>,
 *              llm/think.h), which the client shows apart from the answer
 *              (OpenAI's reasoning_content); never spoken. Sent only for a
 *              chat request to a model with a thinking template and
 *              thinking on; it precedes every TEXT of the request.
 *   AUDIO      1..OMNI_MAX_AUDIO bytes of the audio stream in the format
 *              the request asked for ("audio.format", request.h), in order:
 *              the concatenation of every AUDIO payload is the file (or,
 *              for "pcm", the raw s16le 24 kHz mono samples). A payload is
 *              a slice of that stream, not aligned to codec frames; for
 *              "pcm" it holds whole samples (an even length).
 *   TRANSCRIPT 1..OMNI_MAX_TEXT bytes of JSON: one recognised segment
 *              (an utterance) of an audio input, sent as soon as the
 *              utterance ends:
 *                {"input":0,"text":"and so my fellow americans",
 *                 "start":0.32,"end":2.71,"avg_logprob":-0.8123,
 *                 "words":[{"word":"and","start":0.32,"end":0.45},...]}
 *              "input" indexes "audio_in"; "text" is the words joined by
 *              single spaces (no leading space: the client puts one
 *              between segments), lower case as the recogniser's
 *              dictionary has them; times are seconds from the start of
 *              that input's audio; "avg_logprob" is the mean natural log
 *              of the words' posterior probabilities; "words" is there
 *              only when "transcribe" asked for them ("words": true). A
 *              segment without words is not sent; one lasts at most 30 s
 *              of speech. For a chat request the engine keeps the texts
 *              (they become the user's words) and sends none.
 *   DONE       OMNI_DONE_LEN bytes: u32 prompt_tokens, u32 cached_tokens
 *              (prompt tokens whose KV came from the prefix cache), u32
 *              completion_tokens, u8 finish (OmniFinish), 3 bytes zero,
 *              u64 seed (the request's, or the one the engine drew for a
 *              request without one: sending it reproduces the text), u32
 *              audio_tokens (speech units the talker produced: phones;
 *              0 without speech out), u32 audio_ms (milliseconds of audio
 *              sent), u32 input_audio_ms (milliseconds of audio input
 *              decoded, every input; 0 without "audio_in"), u32
 *              reasoning_tokens (of completion_tokens, those taken while
 *              the model was reasoning: up to and including the one that
 *              ends </think>; 0 without REASONING).
 *              For /v1/audio/speech's "input", prompt_tokens counts
 *              the words the talker read and completion_tokens is 0; for
 *              a transcription both are 0.
 *   ERROR      u16 HTTP status, then four strings, each u16 length + bytes
 *              (not NUL-terminated): type ("invalid_request_error",
 *              "server_error"), param (may be empty: null), code (may be
 *              empty: null), message
 *   HEALTH_R   u16 HTTP status (200 ready, 503 not), then the reason text
 *   MODELS_R   JSON: {"data":[{"id":..., "created":<unix time>,
 *              "owned_by":"ngx_omni", "max_model_len":<tokens>}]}
 *   METRICS_R  Prometheus text exposition format 0.0.4
 *
 * Every number is little-endian; the helpers below read and write them
 * byte by byte, so the code is the same on any host. This header is
 * included by both the engine (C11) and the nginx module, so it depends on
 * nothing but the C library. */

#ifndef OMNI_PROTO_H
#define OMNI_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#include "json_scan.h"

/* 2: DONE carries the seed (24 bytes, was 16). 3: AUDIO events, and DONE
 * carries audio_tokens and audio_ms (32 bytes). 4: AUDIO_IN and
 * TRANSCRIPT frames, and DONE carries input_audio_ms (40 bytes). 5:
 * REASONING frames, and DONE carries reasoning_tokens (in what was its
 * zero tail; still 40 bytes). A module
 * and an engine of different versions refuse each other's frames by name instead of
 * misreading them (a binary upgrade keeps the old engine running). */
#define OMNI_PROTO_VERSION  5
#define OMNI_FRAME_HDR      8

/* Limits on payload lengths, checked before anything is allocated. */
#define OMNI_MAX_REQUEST    (16u << 20)     // request JSON
#define OMNI_MAX_AUDIO_IN   (64u << 10)     // one AUDIO_IN frame
#define OMNI_MAX_AUDIO_IN_TOTAL (128u << 20) // every AUDIO_IN of a request
#define OMNI_MAX_TEXT       (64u << 10)     // one TEXT event
#define OMNI_MAX_AUDIO      (64u << 10)     // one AUDIO event
#define OMNI_MAX_ERROR      (8u << 10)      // one ERROR event
#define OMNI_MAX_REPLY      (4u << 20)      // MODELS_R, METRICS_R, HEALTH_R
#define OMNI_MAX_STAGE      (OMNI_MAX_REQUEST + 64) // frontend <-> stage

#define OMNI_DONE_LEN       40

typedef enum {
    /* client -> engine, the first and only frame the client sends */
    OMNI_F_REQUEST   = 1,
    OMNI_F_HEALTH    = 2,
    OMNI_F_MODELS    = 3,
    OMNI_F_METRICS   = 4,
    OMNI_F_AUDIO_IN  = 5,       // after a REQUEST with "audio_in"

    /* engine -> client */
    OMNI_F_TEXT      = 16,
    OMNI_F_AUDIO     = 17,
    OMNI_F_DONE      = 18,
    OMNI_F_ERROR     = 19,
    OMNI_F_HEALTH_R  = 20,
    OMNI_F_MODELS_R  = 21,
    OMNI_F_METRICS_R = 22,
    OMNI_F_TRANSCRIPT = 23,
    OMNI_F_REASONING = 24,

    /* frontend <-> stage (internal; see stage_channel.h) */
    OMNI_F_STAGE_MIN = 64,
    OMNI_F_STAGE_MAX = 95,
} OmniFrameType;

typedef enum {
    OMNI_FINISH_STOP   = 0,     // EOS or a stop string
    OMNI_FINISH_LENGTH = 1,     // max_tokens or the context is full
} OmniFinish;

typedef enum {
    OMNI_DIR_TO_ENGINE = 0,     // what a client may send
    OMNI_DIR_TO_CLIENT = 1,     // what the engine may send
    OMNI_DIR_STAGE     = 2,     // frontend <-> stage channel
} OmniDirection;

typedef struct {
    uint32_t len;
    uint8_t  type;
    uint8_t  version;
    uint16_t flags;
} OmniFrameHdr;

static inline uint16_t omni_rd16(const uint8_t *p) {
    return (uint16_t) (p[0] | (p[1] << 8));
}

static inline uint32_t omni_rd32(const uint8_t *p) {
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16)
           | ((uint32_t) p[3] << 24);
}

static inline uint64_t omni_rd64(const uint8_t *p) {
    return (uint64_t) omni_rd32(p) | ((uint64_t) omni_rd32(p + 4) << 32);
}

static inline void omni_wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t) v;
    p[1] = (uint8_t) (v >> 8);
}

static inline void omni_wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t) v;
    p[1] = (uint8_t) (v >> 8);
    p[2] = (uint8_t) (v >> 16);
    p[3] = (uint8_t) (v >> 24);
}

static inline void omni_wr64(uint8_t *p, uint64_t v) {
    omni_wr32(p, (uint32_t) v);
    omni_wr32(p + 4, (uint32_t) (v >> 32));
}

static inline void omni_hdr_decode(OmniFrameHdr *h, const uint8_t *p) {
    h->len = omni_rd32(p);
    h->type = p[4];
    h->version = p[5];
    h->flags = omni_rd16(p + 6);
}

static inline void omni_hdr_encode(uint8_t *p, uint8_t type, uint32_t len) {
    omni_wr32(p, len);
    p[4] = type;
    p[5] = OMNI_PROTO_VERSION;
    omni_wr16(p + 6, 0);
}

/* The most payload bytes a frame of this type may carry in direction dir;
 * 0 when the type may not travel that way at all (an empty control frame
 * gets 0 as well, see omni_frame_check). */
static inline uint32_t omni_frame_limit(uint8_t type, OmniDirection dir) {
    if (dir == OMNI_DIR_STAGE) {
        return type >= OMNI_F_STAGE_MIN && type <= OMNI_F_STAGE_MAX
               ? OMNI_MAX_STAGE : 0;
    }
    if (dir == OMNI_DIR_TO_ENGINE) {
        return type == OMNI_F_REQUEST ? OMNI_MAX_REQUEST
               : type == OMNI_F_AUDIO_IN ? OMNI_MAX_AUDIO_IN : 0;
    }
    switch (type) {
    case OMNI_F_TEXT:      return OMNI_MAX_TEXT;
    case OMNI_F_REASONING: return OMNI_MAX_TEXT;
    case OMNI_F_AUDIO:     return OMNI_MAX_AUDIO;
    case OMNI_F_TRANSCRIPT: return OMNI_MAX_TEXT;
    case OMNI_F_DONE:      return OMNI_DONE_LEN;
    case OMNI_F_ERROR:     return OMNI_MAX_ERROR;
    case OMNI_F_HEALTH_R:
    case OMNI_F_MODELS_R:
    case OMNI_F_METRICS_R: return OMNI_MAX_REPLY;
    default:               return 0;
    }
}

/* Checks a decoded header for direction dir. Returns NULL when the frame
 * is acceptable, else a static message naming the problem. */
static inline const char *omni_frame_check(const OmniFrameHdr *h,
                                           OmniDirection dir)
{
    int control = dir == OMNI_DIR_TO_ENGINE
                  && (h->type == OMNI_F_HEALTH || h->type == OMNI_F_MODELS
                      || h->type == OMNI_F_METRICS);

    if (h->version != OMNI_PROTO_VERSION) {
        return "unsupported protocol version";
    }
    if (h->flags != 0) return "nonzero frame flags";
    if (control) return h->len == 0 ? NULL : "control frame with a payload";
    if (omni_frame_limit(h->type, dir) == 0) return "unexpected frame type";
    if (h->len > omni_frame_limit(h->type, dir)) return "frame too large";
    if (h->type == OMNI_F_DONE && h->len != OMNI_DONE_LEN) {
        return "DONE frame of the wrong size";
    }
    if (h->type == OMNI_F_REQUEST && h->len == 0) return "empty request";
    if (h->type == OMNI_F_AUDIO_IN && h->len == 0) return "empty AUDIO_IN";
    if (h->type == OMNI_F_TRANSCRIPT && h->len == 0) {
        return "empty TRANSCRIPT";
    }
    if (h->type == OMNI_F_REASONING && h->len == 0) {
        return "empty REASONING";
    }
    return NULL;
}

typedef struct {
    uint32_t prompt_tokens;
    uint32_t cached_tokens;
    uint32_t completion_tokens;
    uint8_t  finish;            // OmniFinish
    uint64_t seed;              // the sampler's seed, 0..INT64_MAX
    uint32_t audio_tokens;      // speech units (phones) spoken; 0: no
                                //   speech out
    uint32_t audio_ms;          // audio sent, milliseconds
    uint32_t input_audio_ms;    // audio input decoded, milliseconds
    uint32_t reasoning_tokens;  // of completion_tokens, reasoning
} OmniDone;

static inline void omni_done_encode(uint8_t *p, const OmniDone *d) {
    omni_wr32(p, d->prompt_tokens);
    omni_wr32(p + 4, d->cached_tokens);
    omni_wr32(p + 8, d->completion_tokens);
    p[12] = d->finish;
    p[13] = p[14] = p[15] = 0;
    omni_wr64(p + 16, d->seed);
    omni_wr32(p + 24, d->audio_tokens);
    omni_wr32(p + 28, d->audio_ms);
    omni_wr32(p + 32, d->input_audio_ms);
    omni_wr32(p + 36, d->reasoning_tokens);
}

/* A fresh seed for a request that sent none: 63 random bits, so it is a
 * valid seed to send back (0..INT64_MAX, what both sides accept). Drawn by
 * the module (which reports it in a header before the engine's first
 * word) and by the engine for direct clients. getrandom(2) never blocks
 * once the kernel's pool is initialized; GRND_NONBLOCK turns the
 * early-boot case into an error (-1, errno set) rather than a stalled
 * event loop. Rejected: a clock or a counter, which repeat across
 * processes and restarts. */
static inline int omni_seed_draw(uint64_t *seed) {
    uint64_t v;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t) sizeof(v)) {
        return -1;
    }
    *seed = v & (uint64_t) INT64_MAX;
    return 0;
}

/* Returns 0, or -1 for an unknown finish reason. */
static inline int omni_done_decode(OmniDone *d, const uint8_t *p) {
    d->prompt_tokens = omni_rd32(p);
    d->cached_tokens = omni_rd32(p + 4);
    d->completion_tokens = omni_rd32(p + 8);
    d->finish = p[12];
    d->seed = omni_rd64(p + 16);
    d->audio_tokens = omni_rd32(p + 24);
    d->audio_ms = omni_rd32(p + 28);
    d->input_audio_ms = omni_rd32(p + 32);
    d->reasoning_tokens = omni_rd32(p + 36);
    return d->finish <= OMNI_FINISH_LENGTH ? 0 : -1;
}

/* An ERROR payload, decoded as views into the frame's bytes. */
typedef struct {
    uint16_t    status;
    const char *type;
    size_t      type_len;
    const char *param;          // param_len 0: null
    size_t      param_len;
    const char *code;           // code_len 0: null
    size_t      code_len;
    const char *message;
    size_t      message_len;
} OmniError;

/* Bytes an ERROR payload for these strings takes. */
static inline size_t omni_error_size(size_t type_len, size_t param_len,
                                     size_t code_len, size_t message_len)
{
    return 2 + 8 + type_len + param_len + code_len + message_len;
}

/* Writes an ERROR payload (omni_error_size bytes) to p. Each string must
 * be < 65536 bytes and the total <= OMNI_MAX_ERROR, as omni_error_set
 * (below) makes them. Returns the bytes written. */
static inline size_t omni_error_encode(uint8_t *p, const OmniError *e) {
    const char *s[4] = { e->type, e->param, e->code, e->message };
    size_t      n[4] = { e->type_len, e->param_len, e->code_len,
                         e->message_len };
    size_t      off = 2;

    omni_wr16(p, e->status);
    for (int i = 0; i < 4; i++) {
        omni_wr16(p + off, (uint16_t) n[i]);
        if (n[i] > 0) memcpy(p + off + 2, s[i], n[i]);
        off += 2 + n[i];
    }
    return off;
}

/* The most bytes omni_error_set keeps of type, param and code. */
#define OMNI_ERROR_FIELD_MAX 256

/* Points e at these strings, cut to fit one ERROR event: type, param and
 * code to OMNI_ERROR_FIELD_MAX bytes, the message to what is left of
 * OMNI_MAX_ERROR. Every cut falls between characters (omni_utf8_cut), so
 * the client never sees half of one. param and code may be NULL (the
 * field is then null on the wire); the strings must outlive e. */
static inline void omni_error_set(OmniError *e, int status, const char *type,
                                  const char *param, const char *code,
                                  const char *message)
{
    size_t room;

    e->status = (uint16_t) status;
    e->type = type;
    e->type_len = omni_utf8_cut(type, OMNI_ERROR_FIELD_MAX);
    e->param = param;
    e->param_len = param != NULL ? omni_utf8_cut(param, OMNI_ERROR_FIELD_MAX)
                                 : 0;
    e->code = code;
    e->code_len = code != NULL ? omni_utf8_cut(code, OMNI_ERROR_FIELD_MAX)
                               : 0;
    room = OMNI_MAX_ERROR - omni_error_size(e->type_len, e->param_len,
                                            e->code_len, 0);
    e->message = message;
    e->message_len = omni_utf8_cut(message, room);
}

/* Decodes an ERROR payload of len bytes. Returns 0, or -1 when the lengths
 * do not add up to len or the status is not 400..599. */
static inline int omni_error_decode(OmniError *e, const uint8_t *p,
                                    size_t len)
{
    const char **s[4] = { &e->type, &e->param, &e->code, &e->message };
    size_t      *n[4] = { &e->type_len, &e->param_len, &e->code_len,
                          &e->message_len };
    size_t       off = 2;

    if (len < 10) return -1;
    e->status = omni_rd16(p);
    if (e->status < 400 || e->status > 599) return -1;
    for (int i = 0; i < 4; i++) {
        if (len - off < 2) return -1;
        *n[i] = omni_rd16(p + off);
        off += 2;
        if (len - off < *n[i]) return -1;
        *s[i] = (const char *) p + off;
        off += *n[i];
    }
    return off == len ? 0 : -1;
}

#endif

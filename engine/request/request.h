/* request.h -- the normalized request: the JSON a client (the nginx module)
 * sends in a REQUEST frame, parsed and checked.
 *
 *   {
 *     "model":             "stories260K",          optional; must name the
 *                                                  served model when given
 *     "messages":          [{"role": "user", "content": "Hi"}, ...],
 *     "prompt":            "Once upon a time",     exactly one of the three
 *     "input":             "Hello there.",         text to speak as it is
 *                                                  (/v1/audio/speech): 1 to
 *                                                  4096 characters; needs
 *                                                  "audio"
 *     "max_tokens":        16,                     >= 1; absent: until EOS
 *                                                  or the context is full
 *     "temperature":       1.0,   [0, 2]
 *     "top_p":             1.0,   (0, 1]
 *     "top_k":             0,     >= 0, 0 = off
 *     "min_p":             0.0,   [0, 1]
 *     "seed":              42,    integer >= 0; absent: a random one
 *     "presence_penalty":  0.0,   [-2, 2]
 *     "frequency_penalty": 0.0,   [-2, 2]
 *     "logit_bias":        {"1234": -100},         [-100, 100], <= 300 keys
 *     "stop":              "\n" or ["a", "b"],     <= 4, 1..255 bytes each
 *     "ignore_eos":        false,                  keep going past EOS
 *     "thinking":          true,                   false: a thinking
 *                                                  template (chat.h)
 *                                                  renders thinking off;
 *                                                  others ignore it
 *     "cache_salt":        "tenant-7",             prefix-cache isolation
 *     "audio": {                                   speech out (speech.h)
 *       "voice":  "alloy",                         required; a name of the
 *                                                  voice table
 *       "format": "mp3",                           mp3 (default), opus, aac,
 *                                                  flac, wav, pcm
 *       "speed":  1.0,                             [0.25, 4]
 *       "mode":   "latency",                       latency (default) or
 *                                                  quality
 *       "id":     "audio_abc"                      chat: keep the answer's
 *                                                  transcript under this id
 *                                                  (1..64 bytes of
 *                                                  [A-Za-z0-9_-])
 *     },
 *     "audio_transcripts": {"audio_abc": "..."}    added by the frontend
 *                                                  (transcripts.h): the
 *                                                  text of the audio ids
 *                                                  the messages refer to
 *     "audio_in": [{                               audio input (listener):
 *       "format": "wav",                           wav, mp3, flac, opus
 *                                                  (Ogg) or auto; a hint:
 *                                                  the decoder sniffs
 *       "bytes":  48044,                           1..OMNI_MAX_AUDIO_IN_
 *                                                  TOTAL; the file follows
 *                                                  in AUDIO_IN frames
 *       "param":  "file"                           the OpenAI parameter it
 *                                                  came from, for errors
 *     }, ...],                                     1..REQ_MAX_AUDIO_IN
 *     "max_audio_seconds": 600,                    longer input is refused
 *     "transcribe": {                              a transcription: needs
 *       "language": "en",                          one audio_in, excludes
 *       "prompt":   "...",                         messages/prompt/input;
 *       "words":    true                           prompt accepted, unused
 *     },
 *     "audio_in_text": ["...", ...]                added by the frontend:
 *                                                  each audio_in's
 *                                                  transcript
 *   }
 *
 * "content" is a string or an array of {"type": "text", "text": "..."}
 * and {"type": "input_audio", "index": k} parts, joined; an input_audio
 * part is audio_in[k]'s transcript (from "audio_in_text"; "" until the
 * frontend adds it, each index at most once). Roles: "system", "user",
 * "assistant", "developer" (taken
 * as "system"), "tool". An assistant message may be {"role": "assistant",
 * "audio": {"id": "audio_abc"}} instead of content: an earlier spoken
 * answer, whose transcript the frontend puts back (audio_ids).
 * Unknown keys are ignored, as OpenAI does.
 * A messages request is rendered with the model's chat template and gets
 * the generation prompt; a prompt request is tokenized as it is.
 *
 * Without a seed, each request samples afresh, as OpenAI's do: the seed is
 * drawn from getrandom(2) (63 bits, so that sending it back as "seed"
 * reproduces the text) and reported in the DONE event (omni_proto.h).
 * Greedy requests (temperature 0) do not depend on it.
 *
 * Strings must be valid text: well-formed UTF-8 with no unpaired
 * surrogate escapes (json_scan.h, the one check the nginx module runs
 * too); anything else is refused naming the value it was found in.
 *
 * Errors name the parameter as the OpenAI API does ("top_p", "messages[1]
 * .role", "stop") so the module can put it in `error.param`. They are
 * client mistakes (400) except running out of memory or of randomness
 * (503). Whether token ids in logit_bias exist and whether the prompt fits
 * the context is for the stage that has the model to say.
 *
 * Parsing uses yajl's tree API. An OmniRequest owns one arena that holds
 * every string and array; request_free releases everything. */

#ifndef OMNI_REQUEST_H
#define OMNI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "params.h"
#include "speech.h"

#define REQ_MAX_MESSAGES 4096
#define REQ_MAX_SALT     320         // nginx: 256 of prompt_cache_key, behind a tenant name
#define REQ_MAX_AUDIO_IN 16
#define REQ_MAX_AUDIO_SECONDS_DEFAULT 600

/* An audio input's container, as the client named it. The decoder
 * (audio/decoder.h) sniffs the bytes; this is a hint for what it cannot
 * tell by their first bytes. */
typedef enum {
    AUDIO_IN_AUTO = 0,
    AUDIO_IN_WAV,
    AUDIO_IN_MP3,
    AUDIO_IN_FLAC,
    AUDIO_IN_OPUS,              // Ogg Opus
} AudioInFormat;

typedef struct {
    AudioInFormat  format;
    uint64_t       bytes;           // its length in the AUDIO_IN stream
    const char    *param;           // OpenAI's parameter ("file"), or ""
} AudioIn;

typedef struct {
    const char    *model;           // NULL when absent
    bool           chat;            // messages (true) or prompt (false)
    ChatMsg       *msgs;            // (n_msgs,) when chat
    int            n_msgs;
    const char   **audio_ids;       // (n_msgs,) when chat: the audio id an
                                    //   assistant turn refers to instead of
                                    //   content (whose content is "" until
                                    //   the frontend puts the transcript
                                    //   back), else NULL
    bool          *has_audio;       // (n_msgs,) when chat: message i
                                    //   carries audio (an input_audio
                                    //   part or an audio id), so its text
                                    //   is a transcript
    const char    *prompt;          // when !chat and no input;
    size_t         prompt_len;      //   NUL-terminated
    const char    *input;           // text to speak (/v1/audio/speech),
    size_t         input_len;       //   or NULL; then speech.on
    SpeechParams   speech;          // speech out; .on false: text only
    int64_t        max_tokens;      // -1: no limit but the context
    SamplerParams  sampling;        // .seed drawn when the JSON has none
    bool           seed_drawn;      // so it was
    const char    *stop[STOP_MAX];
    int            n_stop;
    bool           ignore_eos;
    bool           thinking;        // true unless "thinking": false
    const char    *cache_salt;      // NULL when absent
    size_t         cache_salt_len;
    AudioIn       *audio_in;        // (n_audio_in,), NULL when none
    int            n_audio_in;
    uint64_t       audio_in_bytes;  // the sum of their bytes
    double         max_audio_seconds;
    bool           transcribe;      // a transcription: audio_in[0] -> text
    const char    *language;        // "en"; NULL when absent
    bool           words;           // word timings wanted
    const char   **audio_in_text;   // (n_audio_in,) from "audio_in_text",
                                    //   or NULL when absent
    void          *arena;           // everything above points into it,
                                    //   owned
} OmniRequest;

typedef struct {
    int  status;                    // 400, or 503: the engine's own failure
    Err  err;                       // what is wrong
    char param[64];                 // the parameter, "" when none applies
} ReqError;

/* Parses len bytes of JSON. Returns 0 with r filled (the caller frees it
 * with request_free), or -1 with e set and r owning nothing. Never reads
 * past len; input need not be NUL-terminated. */
int  request_parse(OmniRequest *r, const char *json, size_t len,
                   ReqError *e);
void request_free(OmniRequest *r);

/* Parses an audio_in format name: wav, mp3, flac, opus, ogg (= opus),
 * auto. Returns 0, or -1 for any other. */
int  request_audio_format(const char *s, AudioInFormat *f);

/* A fresh seed: 63 random bits from getrandom(2), so that it is a valid
 * "seed" to send back. Returns 0, or -1 with err set when the kernel has
 * no random bytes to give without blocking (early in boot). */
int  request_draw_seed(uint64_t *seed, Err *err);

#endif

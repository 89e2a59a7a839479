/* transcripts.h -- the transcripts of spoken chat answers, kept by audio id
 * so that a later turn can refer to one ({"role": "assistant", "audio":
 * {"id": ...}}) as OpenAI's clients do.
 *
 * A chat request with "audio": {"id": X} has its answer's text (the
 * thinker's TEXT events, joined) stored under X at its DONE. A later
 * request that refers to X gets the text back as that turn's content: the
 * frontend appends
 *
 *   ,"audio_transcripts":{"X":"<the text, JSON-escaped>",...}
 *
 * before the request JSON's closing brace (transcripts_attach), and the
 * thinker, which parses the JSON again, puts each text in its message
 * (request.c). Only the ids the request refers to are attached; request.c
 * takes the last of repeated keys, so a client's own "audio_transcripts"
 * is overridden by ours.
 *
 * Bounds: at most max_entries transcripts and max_bytes of text in all;
 * a put that would pass either evicts the oldest first. Each entry
 * expires TRANSCRIPT_TTL_S after it was put (OpenAI's expires_at), and
 * every entry has the same lifetime, so the oldest is always the first
 * to expire: the store is one FIFO list, expired entries leave from its
 * head. Lookups go through a hash of the ids (chained by index, buckets
 * a power of two >= 2 * max_entries), O(1) expected.
 *
 * Single-threaded: the frontend's loop only. The store owns copies of
 * every id and text; nothing it returns survives the next put or free. */

#ifndef OMNI_TRANSCRIPTS_H
#define OMNI_TRANSCRIPTS_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "request.h"

#define TRANSCRIPT_TTL_S        3600.0
#define TRANSCRIPTS_MAX_ENTRIES 1024        // the frontend's defaults
#define TRANSCRIPTS_MAX_BYTES   (16u << 20)

typedef struct {
    char     id[SPEECH_MAX_ID + 1];
    char    *text;                  // (len + 1,) owned, NUL-terminated
    size_t   len;
    double   expires;               // clock_now_s() seconds
    int32_t  older, newer;          // FIFO neighbours, -1: none
    int32_t  hnext;                 // next in its hash chain, -1: none
} Transcript;

typedef struct {
    Transcript *e;                  // (max_entries,) owned
    int32_t    *buckets;            // (n_buckets,) heads, -1: empty; owned
    uint32_t    n_buckets;          // a power of two
    size_t      max_entries;
    size_t      max_bytes;
    int32_t     oldest, newest;     // the FIFO, -1 when empty
    int32_t     free;               // unused entries, chained by hnext
    size_t      n;                  // entries held
    size_t      bytes;              // text held
} Transcripts;

/* An empty store for at most max_entries (>= 1, <= INT32_MAX / 2)
 * transcripts and max_bytes of text. Returns 0, or -1 with err set (out of
 * memory, bad bounds); nothing to free then. */
int  transcripts_init(Transcripts *t, size_t max_entries, size_t max_bytes,
                      Err *err);
void transcripts_free(Transcripts *t);

/* Stores a copy of len bytes of text under id (1..SPEECH_MAX_ID bytes of
 * [A-Za-z0-9_-], as request.c checks), replacing any transcript id had,
 * evicting the oldest while a bound would be passed; it expires at now +
 * TRANSCRIPT_TTL_S. Returns 0, or -1 with err set and the store unchanged
 * but for the expired and the replaced entry: a bad id, text that is not
 * well-formed UTF-8 (it must go back into JSON), text over max_bytes
 * alone, or out of memory. */
int  transcripts_put(Transcripts *t, const char *id, const char *text,
                     size_t len, double now, Err *err);

/* The transcript kept under id (NUL-terminated, *len its length when len
 * is not NULL), or NULL when there is none or it expired. Valid until the
 * next put or free. */
const char *transcripts_get(Transcripts *t, const char *id, double now,
                            size_t *len);

/* Writes to out (cap bytes) the request json (len bytes, a parsed
 * request r's, so it ends with its object's '}', maybe followed by
 * whitespace) with the member ,"audio_transcripts":{...} put before that
 * brace, holding the transcript of every id r's messages refer to.
 * Returns:
 *   0     r refers to no audio: send json as it is (nothing written);
 *   n > 0 the new JSON's length; out holds it only when n <= cap (else
 *         out's bytes are undefined: call again with cap >= n, as with
 *         snprintf);
 *   -1    message *missing refers to an id with no transcript (or an
 *         expired one): refuse the request, 400, param
 *         "messages[i].audio.id", "Audio with id 'X' not found.";
 *         *missing is -1 when json has no closing brace (not a parsed
 *         request's: a bug).
 * The transcripts are looked up once per call. Can't otherwise fail. */
long transcripts_attach(Transcripts *t, const OmniRequest *r,
                        const char *json, size_t len, double now, char *out,
                        size_t cap, int *missing);

/* Sizing writers for JSON the frontend splices into a request: each
 * appends at *at of out when it fits cap, and moves *at in any case, so a
 * first pass with cap 0 measures. json_put_escaped writes text as the
 * inside of a JSON string ('"', '\\' and control characters escaped; the
 * rest must be well-formed UTF-8). */
void json_put(char *out, size_t cap, size_t *at, const char *s, size_t n);
void json_put_escaped(char *out, size_t cap, size_t *at, const char *text,
                      size_t len);

#endif

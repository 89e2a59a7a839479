/* request_impl.h -- the request parser's shared insides, seen only by its
 * own files: parse.c (arena, errors, pre-scan, scalars), request.c (the
 * root, messages, sampling, stop) and request_audio.c (speech out and
 * audio in). Not an interface for anyone else: request.h is. */

#ifndef OMNI_REQUEST_IMPL_H
#define OMNI_REQUEST_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yajl/yajl_tree.h>

#include "request.h"

#define REQ_MAX_DEPTH   64          // nesting levels; ours use 5
#define REQ_MAX_NODES   (1 << 18)   // strings + structural characters
#define REQ_CLIP        40          // bytes of a client value quoted back

#define BAD_JSON "We could not parse the JSON body of your request"

/* One block of the arena: blocks chained newest first. */
typedef struct ReqBlock {
    struct ReqBlock *next;      // the block before this one, owned
    size_t           cap;       // bytes in data
    size_t           used;
    _Alignas(16) unsigned char data[];
} ReqBlock;

/* The parser's state: the arena being filled and where errors go. */
typedef struct {
    ReqBlock *arena;            // owned until handed to the request
    size_t    hint;             // size of the first block
    ReqError *e;
    OmniRequest *req;           // the request being filled
    uint32_t  audio_seen;       // audio_in indices placed in messages
} Parser;

void  req_arena_free(ReqBlock *b);
/* n bytes, 16-aligned, from the newest block or a new one of at least
 * hint bytes. NULL when memory runs out. */
void *req_arena_alloc(ReqBlock **head, size_t n, size_t hint);

/* Sets the error (400) for param: "param: what", or "what" when param is
 * empty. Returns -1, as do the other fail functions. */
__attribute__((format(printf, 3, 4)))
int   req_fail(Parser *p, const char *param, const char *fmt, ...);
int   req_fail_oom(Parser *p);          // the engine's failure: 503
int   req_fail_type(Parser *p, const char *param, const char *want,
                    yajl_val v);
const char *req_type_name(yajl_val v);  // "a string", "null", ...
/* At most REQ_CLIP bytes of a client's string, cut at a character
 * boundary, "..." marking a cut. */
const char *req_clip(const char *s, char out[REQ_CLIP + 4]);

/* The bounds of json_scan.h over the raw bytes, as 400 errors. */
int   req_prescan(Parser *p, const char *s, size_t len);

/* Scalars, checked and (strings) copied into the arena; each returns 0,
 * or -1 with the error set naming param. */
int   req_get_int(Parser *p, const char *param, yajl_val v, int64_t lo,
                  int64_t hi, int64_t *out);
int   req_get_float(Parser *p, const char *param, yajl_val v, double lo,
                    double hi, bool lo_open, float *out);
int   req_get_string(Parser *p, const char *param, yajl_val v,
                     const char **out, size_t *len);
/* The value of key in object o, the last one when repeated; NULL when
 * absent or null. */
yajl_val req_member(yajl_val o, const char *key);

/* request_audio.c: the audio members, each 0 or -1 with the error set. */
int   req_message_audio(Parser *p, int i, yajl_val a, const ChatMsg *msg,
                        const char **audio_id);
int   req_speech_input(Parser *p, yajl_val v, OmniRequest *r);
int   req_parse_audio(Parser *p, yajl_val a, SpeechParams *sp);
int   req_parse_transcripts(Parser *p, yajl_val v, OmniRequest *r);
int   req_parse_audio_in(Parser *p, yajl_val o, OmniRequest *r);
int   req_input_audio_part(Parser *p, int i, size_t j, yajl_val part,
                           const char *role, const char **text);
int   req_audio_in_check(Parser *p, const OmniRequest *r);

#endif

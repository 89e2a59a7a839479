/* enc_impl.h -- what encode.c shares with the per-format encoders
 * (enc_mp3.c, enc_opus.c, enc_aac.c, enc_flac.c): the AudioEncoder struct,
 * the op table each format fills, and the one path to the sink.
 *
 * Separate from encode.h because callers see only the opaque handle; the
 * formats are one file each (like Redis's ae_epoll.c/ae_kqueue.c) so that
 * each library's quirks stay next to its calls. Private to engine/audio. */

#ifndef OMNI_ENC_IMPL_H
#define OMNI_ENC_IMPL_H

#include <stdbool.h>

#include "encode.h"

/* One format's codec. open sets e->codec (owned by e, freed by free);
 * write takes any n > 0; finish drains; free may see a half-opened codec
 * (e->codec NULL or partly built) and must cope. */
typedef struct {
    const char *name;
    int  (*open)(AudioEncoder *e, Err *err);
    int  (*write)(AudioEncoder *e, const int16_t *pcm, size_t n, Err *err);
    int  (*finish)(AudioEncoder *e, Err *err);
    void (*free)(AudioEncoder *e);
} EncoderOps;

struct AudioEncoder {
    const EncoderOps *ops;
    AudioFormat       format;
    int               rate;         // Hz of the s16 mono input
    AudioSink         sink;         // borrowed, with its ud
    void             *ud;
    void             *codec;        // the format's state, owned
    uint64_t          n_in;         // samples written so far
    bool              refused;      // the sink returned -1
    bool              broken;       // a call failed: only free is allowed
    bool              finished;
};

/* Hands n bytes to the sink. Returns 0, or -1 after marking e->refused;
 * n == 0 is not passed on (the sink's contract is n > 0). */
int enc_emit(AudioEncoder *e, const uint8_t *p, size_t n);

/* For a library call that failed: err gets "output refused" when the sink
 * is why, else "<fmt>: <what> failed: <why>". Returns -1. */
int enc_fail(AudioEncoder *e, Err *err, const char *what, const char *why);

extern const EncoderOps enc_mp3_ops, enc_opus_ops, enc_aac_ops,
                        enc_flac_ops;

#endif

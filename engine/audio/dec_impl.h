/* dec_impl.h -- what decode.c shares with the per-container decoders
 * (dec_wav.c, dec_mp3.c, dec_flac.c, dec_opus.c): the AudioDecoder struct,
 * the op table each format fills, and the Piece a decoder hands back.
 *
 * A container decoder does not convert, mix or resample: it returns views
 * of its samples as they are (the WAV file's own bytes, libmpg123's frame
 * buffer, a FLAC block, opusfile's floats), and decode.c turns each view
 * into mono s16 at the caller's rate with one switch on the sample type.
 * So the per-format files hold only their library's quirks (like the
 * encoders behind enc_impl.h), and every format is mixed, clipped and
 * resampled by the same code. Private to engine/audio. */

#ifndef OMNI_DEC_IMPL_H
#define OMNI_DEC_IMPL_H

#include <stdbool.h>

#include "decoder.h"
#include "resample.h"

#define DEC_MIN_RATE     1000
#define DEC_MAX_RATE     384000
#define DEC_MAX_CHANNELS 8

/* How one sample lies in a Piece. Multi-byte types are in the host's
 * order, which is little-endian (decode.c refuses to build otherwise), so
 * WAV's bytes are read where they lie. */
typedef enum {
    SAMPLE_U8,          // WAV 8-bit: unsigned, 128 is silence
    SAMPLE_S16,
    SAMPLE_S24,         // 3 bytes, packed
    SAMPLE_S32,
    SAMPLE_F32,         // IEEE, full scale is 1.0
    SAMPLE_F64,
    SAMPLE_I32,         // int32 holding a Piece.bits-bit value (FLAC)
    SAMPLE_ALAW,        // G.711
    SAMPLE_ULAW,
} SampleType;

/* A run of interleaved frames, borrowed from the decoder: valid until its
 * next call to next or free. p needs no alignment (decode.c reads each
 * sample with memcpy: a WAV data chunk may start at any even offset). */
typedef struct {
    const uint8_t *p;           // (frames, channels) samples of type
    size_t         frames;      // > 0
    int            channels;    // 1..DEC_MAX_CHANNELS
    SampleType     type;
    int            bits;        // SAMPLE_I32 only: 4..32
} Piece;

/* One container's decoder. open reads the headers, sets d->codec (owned
 * by d, freed by free), d->rate and d->channels, or fails. next gives the
 * next piece: returns 1 with *pc set, 0 at the end of the audio, -1 with
 * err set; it must consume input on every return of 1 or loop until it
 * does, so that decoding always ends. free may see a half-opened codec
 * (d->codec NULL or partly built) and must cope. An op that fails for
 * lack of memory sets d->oom. Messages do not name the format: decode.c
 * prefixes it. */
typedef struct {
    const char *name;
    int  (*open)(AudioDecoder *d, Err *err);
    int  (*next)(AudioDecoder *d, Piece *pc, Err *err);
    void (*free)(AudioDecoder *d);
} DecoderOps;

struct AudioDecoder {
    const DecoderOps *ops;
    AudioInFormat     format;
    const uint8_t    *data;         // (len,) the file, borrowed
    size_t            len;
    int               rate;         // Hz of the decoded samples
    int               channels;     // as the headers say (pieces may vary)
    int               out_rate;     // Hz of what read gives
    void             *codec;        // the format's state, owned
    bool              oom;          // an op failed for lack of memory

    Piece             piece;        // the op's current piece, borrowed
    size_t            piece_at;     // its frames mixed so far
    bool              eof;          // next returned 0
    Resampler        *rs;           // rate -> out_rate; NULL if equal, owned
    int16_t          *mono;         // (DEC_PIECE,) a piece mixed, owned
    int16_t          *out;          // (out_cap,) ready samples: mono
                                    //   itself without rs, else owned
    size_t            out_cap, out_at, out_n;
    uint64_t          n_given;      // samples read has returned
    bool              done;         // everything, soxr's tail too, is out
    bool              broken;       // a read failed: only free is allowed
};

extern const DecoderOps dec_wav_ops, dec_mp3_ops, dec_flac_ops,
                        dec_opus_ops;

#endif

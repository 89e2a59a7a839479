/* decoder.h -- audio files in, mono s16 samples at one rate out: what the
 * listener hears. WAV (PCM 8/16/24/32-bit, IEEE float 32/64, G.711 A-law
 * and mu-law, WAVE_FORMAT_EXTENSIBLE, RF64, 1..8 channels, and the
 * streaming headers whose sizes are 0 or 0xFFFFFFFF: the data runs to the
 * end), MP3 (libmpg123), FLAC (libFLAC), Ogg Opus (libopusfile); channels
 * are averaged to mono and the rate converted with libsoxr (resample.h).
 *
 * The file is whole in memory (the listener has it all before it
 * decodes: clients send files, not streams) and is decoded in pieces, so
 * the recogniser starts on the first second while the rest is still
 * compressed, and memory is a piece, not the whole decoded file.
 *
 * Every failure here is about the bytes the client sent: the caller
 * answers 400 with err's message (it names the format and what is wrong,
 * e.g. "mp3: truncated or corrupt frame at byte 70311"), except when
 * *oom says the engine ran out of memory (503). The bytes are untrusted:
 * no input may crash, hang or allocate without bound (fuzzed:
 * t/fuzz/fuzz_audio.c). */

#ifndef OMNI_AUDIO_DECODER_H
#define OMNI_AUDIO_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "request.h"

/* What the first bytes of data say it is: one of the formats above, or
 * AUDIO_IN_AUTO when they say nothing we decode. *other is then the name
 * of a container that was recognised but is not supported ("webm",
 * "mp4", "ogg vorbis", "aiff", ...) or NULL when nothing was (other may
 * be NULL). Needs no more than the first 64 bytes, except that behind an
 * ID3v2 tag it looks at the first bytes after the tag when len holds
 * them (FLAC and ADTS AAC can be tagged too; past len it says mp3).
 * Can't fail. */
AudioInFormat audio_sniff(const uint8_t *data, size_t len,
                          const char **other);

/* "wav", "mp3", "flac", "opus", "auto". */
const char   *audio_in_format_name(AudioInFormat f);

/* (Format names are parsed with request.h's request_audio_format.) */

typedef struct AudioDecoder AudioDecoder;

/* A decoder over data[0..len), which the caller keeps alive and unchanged
 * until audio_decoder_free. The format is what audio_sniff finds, else
 * hint (AUDIO_IN_AUTO: refused, naming what sniffing saw). out_rate is
 * the rate of the samples it gives (16000 for the listener). Opening
 * reads the headers: a file that is not audio of a supported format, or
 * whose headers are corrupt, fails here. Returns the decoder, or NULL
 * with err set (and *oom true when memory ran out). */
AudioDecoder *audio_decoder_open(const uint8_t *data, size_t len,
                                 AudioInFormat hint, int out_rate,
                                 Err *err, bool *oom);

/* The format decoded, and the file's own rate and channels (Opus: 48000,
 * the rate it is decoded at; channels: the first link's or frame's). */
AudioInFormat audio_decoder_format(const AudioDecoder *d);
int           audio_decoder_rate(const AudioDecoder *d);
int           audio_decoder_channels(const AudioDecoder *d);

/* Writes up to cap (> 0) mono samples at out_rate to out. Returns how
 * many (> 0), 0 at the end of the audio (at once for a file with valid
 * headers and no samples: the caller's "no audio"), or -1 with err set
 * (*oom as above): a corrupt stream (a file cut short gives what it holds
 * instead; audio/README.md has each format's rule). After -1 only free is
 * allowed. Each call decodes about cap samples' worth plus at most one
 * piece of 4096 frames, so it returns in bounded time; memory is fixed at
 * open, whatever cap is. */
ssize_t       audio_decoder_read(AudioDecoder *d, int16_t *out, size_t cap,
                                 Err *err, bool *oom);

/* Samples given so far by audio_decoder_read, at out_rate. */
uint64_t      audio_decoder_samples(const AudioDecoder *d);

void          audio_decoder_free(AudioDecoder *d);

#endif

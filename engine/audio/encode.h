/* encode.h -- PCM in, an audio file's bytes out, as a stream: the six
 * formats of speech.h (mp3, Ogg Opus, ADTS AAC, FLAC, WAV, raw PCM), each
 * from a well-kept library (libmp3lame, libopusenc, FFmpeg's libavcodec,
 * libFLAC; WAV and PCM are a header and a copy).
 *
 * One AudioEncoder per request, used by one thread at a time (the
 * voicebox's worker that synthesizes it). Input is s16 mono at the rate
 * given at open (SPEECH_RATE for every format today), in pieces of any
 * size; output goes to the sink as the codec produces it, so the first
 * bytes leave as soon as the codec has a frame (bounded look-ahead: the
 * report of each format's delay is in audio/README.md), and
 * audio_encoder_finish drains the rest. The concatenation of every sink
 * call is the file, the same bytes whatever the input's piece sizes.
 *
 * WAV is the streamed form: both size fields 0xFFFFFFFF, as OpenAI sends
 * (openai-api.md 7.2); whoever holds the whole file may write the real
 * sizes (audio_wav_patch). Memory: what the codec allocates at open, then
 * nothing per write. */

#ifndef OMNI_ENCODE_H
#define OMNI_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "speech.h"

typedef struct AudioEncoder AudioEncoder;

/* Receives n > 0 bytes of output (borrowed for the call). Returns 0, or
 * -1 to stop: the encoder call that made it fails with "output refused". */
typedef int (*AudioSink)(void *ud, const uint8_t *p, size_t n);

/* Opens an encoder for format f, mono s16 at rate Hz. speed is not the
 * encoder's business (the voicebox applies it). Returns the encoder, or
 * NULL with err set. The caller frees it with audio_encoder_free. */
AudioEncoder *audio_encoder_open(AudioFormat f, int rate, AudioSink sink,
                                 void *ud, Err *err);

/* Encodes n samples (n may be 0). Returns 0, or -1 with err set (the
 * encoder is then unusable: free it). */
int  audio_encoder_write(AudioEncoder *e, const int16_t *pcm, size_t n,
                         Err *err);

/* Flushes whatever the codec holds and ends the stream (the Ogg end page,
 * FLAC's last frame, ...). Returns 0, or -1 with err set. */
int  audio_encoder_finish(AudioEncoder *e, Err *err);

/* Frees e and everything it holds; NULL is fine. */
void audio_encoder_free(AudioEncoder *e);

/* A whole WAV file of len bytes as audio_encoder wrote it: writes the
 * real RIFF and data sizes in place of 0xFFFFFFFF. Returns 0, or -1 when
 * p is not such a file. */
int  audio_wav_patch(uint8_t *p, size_t len);

#endif

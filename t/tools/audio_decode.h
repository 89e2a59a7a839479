/* audio_decode.h -- decodes a whole audio file in memory with a decoder
 * that shares no code with the engine's encoders (engine/audio): mp3 with
 * libmpg123, Ogg Opus with libopusfile, ADTS AAC with libfaad (faad2),
 * FLAC and WAV with libsndfile, raw s16le PCM by hand at a given rate.
 * Used by audio_probe (the command-line tool the Test::Nginx suites run)
 * and by t/unit/test_audio.c (which compares samples). */

#ifndef OMNI_AUDIO_DECODE_H
#define OMNI_AUDIO_DECODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int      rate;          // Hz the stream says it holds (Opus: the
                            //   OpusHead input rate, 48000 if unset)
    int      channels;
    size_t   samples;       // per channel, counted at rate
    int      pcm_rate;      // Hz of pcm: rate, except Opus (always 48000)
    size_t   pcm_frames;    // frames in pcm
    int16_t *pcm;           // (pcm_frames, channels) interleaved, owned:
                            //   free with audio_decoded_free
} AudioDecoded;

/* Decodes the n bytes at p as format ("mp3", "opus", "aac", "flac", "wav",
 * "pcm"; pcm_rate is the rate of "pcm", ignored otherwise). Returns 0 and
 * fills out, or -1 with a message in why (why_len bytes) and out empty.
 * A stream that decodes to no samples at all is an error, except for
 * "pcm" and formats with a header (wav, flac, opus), where 0 samples is a
 * valid empty file. */
int  audio_decode(const char *format, const uint8_t *p, size_t n,
                  int pcm_rate, AudioDecoded *out, char *why,
                  size_t why_len);

void audio_decoded_free(AudioDecoded *d);

/* RMS and peak of the first channel, in [0, 1] of full scale. */
void audio_decoded_level(const AudioDecoded *d, double *rms, double *peak);

#endif

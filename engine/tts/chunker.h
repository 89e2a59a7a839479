/* chunker.h -- cuts a stream of text (the thinker's deltas, or a speech
 * request's input at once) into the chunks the talker analyses, by mode:
 *
 *   latency  a small first chunk (first_words words, or up to the first
 *            punctuation that ends a clause, whichever comes first), then
 *            chunks of at most chunk_words, cut at punctuation when there
 *            is some;
 *   quality  clauses or sentences, at most quality_words words.
 *
 * Only whole words are cut: a word is whole once something follows it
 * (space, punctuation) or the input has ended. The buffer is fixed
 * (CHUNKER_MAX bytes); input past it forces a cut, so memory is bounded
 * whatever the text. */

#ifndef OMNI_CHUNKER_H
#define OMNI_CHUNKER_H

#include <stdbool.h>
#include <stddef.h>

#include "speech.h"

#define CHUNKER_MAX  (16u << 10)

typedef struct {
    SpeechMode mode;
    int        first_words;     // latency: the first chunk (default 4)
    int        chunk_words;     // latency: later chunks (default 12)
    int        quality_words;   // quality: a chunk at most (default 40)
} ChunkPolicy;

typedef struct {
    ChunkPolicy policy;
    char        buf[CHUNKER_MAX];
    size_t      len;
    int         chunks;         // cut so far
    bool        ended;          // chunker_end was called
} Chunker;

void   chunker_init(Chunker *c, const ChunkPolicy *p);

/* Appends n bytes. Returns the bytes taken (fewer than n when the buffer
 * is full: take a chunk, then push the rest). */
size_t chunker_push(Chunker *c, const char *text, size_t n);

/* The input is over: what is left becomes the last chunk. */
void   chunker_end(Chunker *c);

/* The next chunk if one is ready: *text points into the buffer, valid
 * until the next call; returns its length (0: none ready yet, or none
 * left after chunker_end). chunker_take removes it. */
size_t chunker_next(Chunker *c, const char **text);
void   chunker_take(Chunker *c, size_t n);

/* No text is left and the input has ended. */
bool   chunker_done(const Chunker *c);

#endif

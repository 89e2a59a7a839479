/* listener.h -- the listener stage: audio in (pool blocks of the client's
 * files, which the frontend fills), transcripts out (TRANSCRIPT events):
 * decoding (audio/decoder.h) and recognition (asr.h) on a bounded set of
 * worker threads, --listener-slots. */

#ifndef OMNI_LISTENER_H
#define OMNI_LISTENER_H

#include "stage.h"

extern const StageOps listener_stage;

#endif

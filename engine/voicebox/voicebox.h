/* voicebox.h -- the voicebox stage: speech units in (pool blocks from the
 * talker), audio out (pool blocks of the request's format): synthesis
 * (tts/synth.h), resampling to 24 kHz (audio/resample.h) and encoding
 * (audio/encode.h) on a bounded set of worker threads, --voicebox-slots. */

#ifndef OMNI_VOICEBOX_H
#define OMNI_VOICEBOX_H

#include "stage.h"

extern const StageOps voicebox_stage;

#endif

/* talker.h -- the talker stage: text in (a speech request's input, or the
 * thinker's text deltas passed on by the frontend), speech units out
 * (tts/units.h) in pool blocks, cut into chunks by the request's mode
 * (tts/chunker.h) and analysed by Flite's front end (tts/analyze.h). */

#ifndef OMNI_TALKER_H
#define OMNI_TALKER_H

#include "stage.h"

extern const StageOps talker_stage;

#endif

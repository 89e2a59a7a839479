/* thinker.h -- the thinker stage's row for the stage skeleton (stage.h):
 * text in, text out, through the model and the scheduler (thinker.c).
 * main.c's table of stages is its only user. */

#ifndef OMNI_THINKER_H
#define OMNI_THINKER_H

#include "stage.h"

extern const StageOps thinker_stage;

#endif

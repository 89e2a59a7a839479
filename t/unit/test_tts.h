/* test_tts.h -- what the two tts test programs share: the group setup that
 * registers Flite's voices once. Header-only, like testutil.h. */

#ifndef OMNI_TEST_TTS_H
#define OMNI_TEST_TTS_H

#include <stdio.h>

#include "synth.h"

/* cmocka group setup: tts_init, or the reason it failed on stderr. */
static int setup(void **state) {
    Err err;

    (void) state;
    if (tts_init(&err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

#endif

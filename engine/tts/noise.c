/* noise.c -- rand() and srand() for the whole process, with one state per
 * thread, so that synthesis is reproducible and threads do not disturb
 * each other.
 *
 * Why: Flite's clustergen vocoder (cst_mlsa.c, plus_or_minus_one) draws the
 * noise excitation of unvoiced frames from rand(), glibc's one sequence
 * for the process. With it, two syntheses of the same units differ in
 * their noise, and threads synthesizing at once interleave their draws, so
 * no chunk's samples could be predicted or tested. Defined here, these
 * two symbols take the place of libc's for every library in the process
 * (the executable's definition comes first in dynamic symbol resolution),
 * and each thread draws from its own state, which tts_synth resets to the
 * same seed at every chunk: the same units give the same samples on any
 * thread, at any time.
 *
 * The generator is glibc's own (random_r, the algorithm behind rand), so a
 * thread's sequence after srand(s) is what glibc's rand() gives after
 * srand(s). Nothing else in the engine calls rand() (request seeds come
 * from getrandom(2), the sampler has its own generator).
 *
 * This file must be linked whenever synth.c is: tts_noise_reset, which
 * synth.c calls, is here, so an archive link pulls both in. */

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tts_impl.h"

static _Thread_local struct random_data state;
static _Thread_local char               state_buf[128];
static _Thread_local bool               seeded;

void srand(unsigned seed) {
    // initstate_r reads state.state: it must start zeroed (glibc notes it)
    memset(&state, 0, sizeof(state));
    initstate_r(seed, state_buf, sizeof(state_buf), &state);
    seeded = true;
}

int rand(void) {
    int32_t r;

    if (!seeded) srand(1);          // glibc's rand() starts as srand(1)
    random_r(&state, &r);
    return r;
}

void tts_noise_reset(void) { srand(1); }

/* params.h -- the parameter types of a request: its chat messages, how to
 * sample and where to stop. They are the request's (request.h) and the
 * model's (chat.h, sampler.h, stop.h) alike; here, so that the frontend,
 * which checks requests, sees them without seeing the model. */

#ifndef OMNI_PARAMS_H
#define OMNI_PARAMS_H

#include <stdint.h>
#include <string.h>

typedef struct {
    const char *role;           // "system", "user", "assistant"
    const char *content;        // UTF-8, NUL-terminated
} ChatMsg;

#define SAMPLER_MAX_BIAS 300    // OpenAI allows up to 300 logit_bias entries

typedef struct {
    int32_t token;
    float   bias;               // added to the logit; -100 bans, +100 forces
} LogitBias;

typedef struct {
    float      temperature;     // 0..2; 0 = greedy (argmax, lowest id on ties)
    int32_t    top_k;           // >= 0; 0 = off
    float      top_p;           // (0, 1]; 1 = off
    float      min_p;           // [0, 1]; 0 = off
    uint64_t   seed;
    float      presence_penalty;    // -2..2, subtracted once per seen token
    float      frequency_penalty;   // -2..2, times the token's count
    int32_t    n_bias;
    LogitBias  bias[SAMPLER_MAX_BIAS];
} SamplerParams;

#define STOP_MAX       4        // OpenAI allows up to 4 stop sequences
#define STOP_MAX_LEN   256      // bytes per stop sequence

/* Fills p with the defaults: temperature 1, top_p 1, others off, seed 0.
 * Can't fail. */
static inline void sampler_params_default(SamplerParams *p) {
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_p = 1.0f;
}

#endif

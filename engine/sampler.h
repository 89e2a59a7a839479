/* sampler.h -- choosing the next token from logits, per sequence.
 *
 * Order of operations, as llama.cpp's default chain applies them:
 *   logit bias -> repetition penalties (presence, frequency) -> greedy if
 *   temperature == 0 -> top-k -> top-p -> min-p -> temperature -> softmax ->
 *   draw with the sequence's own RNG.
 * Same parameters and seed, same logits: same token, on any machine.
 *
 * A Sampler is one sequence's state: its RNG, the counts of tokens it has
 * generated (for penalties) and scratch sized to the vocabulary at init, so
 * sampling never allocates. */

#ifndef OMNI_SAMPLER_H
#define OMNI_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "log.h"

#define SAMPLER_MAX_BIAS 300    // OpenAI allows up to 300 logit_bias entries

typedef struct {
    int32_t token;
    float   bias;               // added to the logit; -100 bans, +100 forces
} LogitBias;

typedef struct {
    float      temperature;     // 0 = greedy (argmax, lowest id on ties)
    int32_t    top_k;           // 0 = off
    float      top_p;           // 1 = off
    float      min_p;           // 0 = off
    uint64_t   seed;
    float      presence_penalty;    // -2..2, subtracted once per seen token
    float      frequency_penalty;   // -2..2, times the token's count
    int32_t    n_bias;
    LogitBias  bias[SAMPLER_MAX_BIAS];
} SamplerParams;

/* Fills p with the defaults: temperature 1, top_p 1, others off, seed 0. */
void sampler_params_default(SamplerParams *p);

typedef struct {
    SamplerParams  p;
    int32_t        n_vocab;
    uint64_t       rng[4];      // xoshiro256** state, seeded from p.seed
    int32_t       *counts;      // (n_vocab,) times each token was sampled,
                                //   owned
    int32_t       *seen;        // (n_vocab,) tokens with counts > 0, owned
    int32_t        n_seen;
    int32_t       *idx;         // (n_vocab,) candidate scratch, owned
    float         *prob;        // (n_vocab,) candidate scratch, owned
} Sampler;

/* Checks p (ranges, bias token ids) against n_vocab and allocates the
 * scratch. Returns -1 with err naming the bad parameter. */
int     sampler_init(Sampler *s, const SamplerParams *p, int32_t n_vocab,
                     Err *err);
void    sampler_free(Sampler *s);
/* Restarts the sequence: same parameters, RNG reseeded, counts cleared. */
void    sampler_reset(Sampler *s);
/* Picks a token; logits (n_vocab,) are modified in place. Can't fail. */
int32_t sampler_sample(Sampler *s, float *logits);
/* Records a generated token for the penalties. */
void    sampler_accept(Sampler *s, int32_t token);

#endif

/* sampler.h -- choosing the next token from logits, per sequence.
 *
 * Order of operations, as llama.cpp's default chain applies them:
 *   logit bias -> repetition penalties (presence, frequency) -> greedy if
 *   temperature == 0 -> top-k -> top-p -> min-p -> temperature -> softmax ->
 *   draw with the sequence's own RNG.
 * top-p and min-p look at the probabilities *before* temperature, as in
 * llama.cpp; temperature only reshapes what survives them.
 * Same parameters and seed, same logits: same token, on any machine with
 * the same libm (expf and logf are the only calls whose last bit could
 * differ between C libraries).
 *
 * A Sampler is one sequence's state: its RNG, the counts of tokens it has
 * generated (for penalties) and scratch sized to the vocabulary at init, so
 * sampling never allocates. Each non-greedy sample draws exactly one number
 * from the RNG, so the stream position depends only on how many tokens were
 * sampled, not on how many candidates survived. */

#ifndef OMNI_SAMPLER_H
#define OMNI_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "log.h"
#include "params.h"


typedef struct {
    SamplerParams  p;
    int32_t        n_vocab;
    uint64_t       rng[4];      // xoshiro256** state, seeded from p.seed
    int32_t       *counts;      // (n_vocab,) times each token was sampled,
                                //   owned
    int32_t       *seen;        // (n_vocab,) tokens with counts > 0, owned
    int32_t        n_seen;
    int32_t       *idx;         // (n_vocab,) candidate token ids, owned
    float         *prob;        // (n_vocab,) candidate weights, owned
} Sampler;


/* Checks p against n_vocab, allocates the scratch (16 bytes per vocabulary
 * entry) and seeds the RNG. Returns 0, or -1 with err set: a bad parameter
 * is named as the OpenAI API names it ("top_p: must be in (0, 1], got 0"),
 * and an allocation failure says so. On failure s owns nothing. The caller
 * owns s and releases it with sampler_free(). p is copied. */
int     sampler_init(Sampler *s, const SamplerParams *p, int32_t n_vocab,
                     Err *err);

/* Gives an initialised Sampler new parameters for a new sequence without
 * allocating: checks p as sampler_init() does, then resets (RNG reseeded
 * from p->seed, counts cleared). On error (-1, err set) s is unchanged. This
 * lets the scheduler allocate one Sampler per slot at startup. */
int     sampler_set_params(Sampler *s, const SamplerParams *p, Err *err);

/* Frees the scratch; s may then be initialised again. Safe on a zeroed or
 * already freed Sampler. */
void    sampler_free(Sampler *s);

/* Restarts the sequence: same parameters, RNG reseeded, counts cleared.
 * O(tokens seen). Can't fail. */
void    sampler_reset(Sampler *s);

/* Picks a token; logits (n_vocab,) are modified in place (bias and
 * penalties are added to them). Never allocates. Greedy is one pass; top-k
 * a bounded heap, O(n_vocab log k) at worst; top-p without top-k a bucket
 * pass plus a sort of the one bucket at the nucleus edge; a plain draw one
 * expf per token (~0.15 ms greedy, ~0.2 ms top-k 40, ~0.8 ms full softmax
 * at 150k tokens on one core). Can't fail: the result is always a valid
 * token id, the lowest-id best logit when the logits are degenerate (all
 * -inf). */
int32_t sampler_sample(Sampler *s, float *logits);

/* Whether sampler_sample is a plain argmax for s: temperature 0, no logit
 * bias, no penalties. Then a backend's device argmax picks the same token
 * and the logits need not leave the device. */
bool    sampler_is_greedy(const Sampler *s);

/* Records a generated token for the penalties. Ids outside the vocabulary
 * are ignored. Can't fail. */
void    sampler_accept(Sampler *s, int32_t token);

#endif

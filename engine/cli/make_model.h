/* make_model.h -- writing a GGUF model with random weights.
 *
 * For tests (every weight type and architecture through the whole engine),
 * benchmarks (a ~1B llama-shaped file both we and llama.cpp load) and
 * comparisons with llama.cpp: the file carries every metadata key and
 * tensor llama.cpp's loader requires for its architecture, under its
 * names and shapes (llama, qwen2, qwen3, gemma, gemma2, gemma3, phi3). The
 * tokenizer metadata is copied verbatim from another GGUF, so the file
 * tokenizes and detokenizes like that model; the vocabulary size follows
 * it. Weights are drawn from a normal distribution (std 0.02 by default, as
 * in GPT-2 style initialisation; larger gives peaked logits, so greedy
 * text depends on every weight) by a seeded generator, so the same
 * arguments write the same bytes. Norm weights are drawn around 1 (std
 * 0.1), so a norm applied wrongly shows. */

#ifndef OMNI_MAKE_MODEL_H
#define OMNI_MAKE_MODEL_H

#include <stdint.h>

#include "dtype.h"
#include "log.h"

typedef struct {
    const char *out;            // path to write
    const char *arch;           // "llama", "qwen2", "qwen3", "gemma",
                                //   "gemma2", "gemma3" or "phi3"
    int         dim, layers, heads, kv_heads, ffn;
    int         head_dim;       // 0: dim / heads
    int         rope_dims;      // rotated dims per head, 0: head_dim
    int         swa;            // sliding window (gemma2/3), 0: the
                                //   family's default (gemma2 4096,
                                //   gemma3 none)
    float       std;            // weights' std, 0: 0.02
    const char *rope_scaling;   // NULL, "linear" or "yarn"
    float       rope_factor;    //   and its factor (original context:
                                //   ctx / factor)
    int         rope_factors;   // phi3: write rope_factors_short/long
    int         ctx;            // context length written to the metadata
    DType       type;           // type of every 2-D weight
    const char *vocab_from;     // GGUF whose tokenizer.* keys are copied
    const char *chat_template;  // NUL-terminated text written as
                                //   tokenizer.chat_template instead of
                                //   vocab_from's, or NULL
    uint64_t    seed;
    int         tied;           // omit output.weight (tied embeddings)
} MakeModelParams;

/* Writes the file. Returns -1 with err set on bad parameters (shapes that do
 * not fit the type's block size, heads not dividing dim, ...) or I/O
 * failure; a partial file is removed. */
int make_model(const MakeModelParams *p, Err *err);

#endif

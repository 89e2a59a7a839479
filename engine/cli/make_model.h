/* make_model.h -- writing a GGUF model with random weights.
 *
 * For tests (every weight type through the whole engine) and benchmarks (a
 * ~1B llama-shaped file both we and llama.cpp load). The tokenizer metadata
 * is copied verbatim from another GGUF, so the file tokenizes and detokenizes
 * like that model; the vocabulary size follows it. Weights are drawn from a
 * normal distribution (std 0.02, as in GPT-2 style initialisation) by a
 * seeded generator, so the same arguments write the same bytes. */

#ifndef OMNI_MAKE_MODEL_H
#define OMNI_MAKE_MODEL_H

#include <stdint.h>

#include "dtype.h"
#include "log.h"

typedef struct {
    const char *out;            // path to write
    const char *arch;           // "llama" or "qwen2"
    int         dim, layers, heads, kv_heads, ffn;
    int         ctx;            // context length written to the metadata
    DType       type;           // type of every 2-D weight
    const char *vocab_from;     // GGUF whose tokenizer.* keys are copied
    uint64_t    seed;
    int         tied;           // omit output.weight (tied embeddings)
} MakeModelParams;

/* Writes the file. Returns -1 with err set on bad parameters (shapes that do
 * not fit the type's block size, heads not dividing dim, ...) or I/O
 * failure; a partial file is removed. */
int make_model(const MakeModelParams *p, Err *err);

#endif

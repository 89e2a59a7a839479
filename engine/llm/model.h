/* model.h -- a llama-family transformer loaded from GGUF, and its forward
 * pass.
 *
 * Architectures follow llama.cpp's GGUF conventions (tensor names,
 * metadata keys and their defaults, the graph its src/models/<arch>.cpp
 * builds):
 *   llama   Llama 2/3, Mistral, TinyStories, SmolLM: RMSNorm, GQA attention
 *           with RoPE on adjacent pairs (the converter permutes Q/K rows for
 *           this), SwiGLU FFN, optional rope_freqs (llama 3.1 scaling).
 *   qwen2   the same with Q/K/V biases and RoPE on halves (NEOX layout).
 *   qwen3   qwen2 without biases, with a per-head RMSNorm of Q and K before
 *           RoPE.
 *   gemma   embeddings scaled by sqrt(dim), queries pre-scaled, GeGLU FFN,
 *           output tied to the embedding, NEOX RoPE; head_dim may differ
 *           from dim / heads (attention.key_length).
 *   gemma2  gemma plus attention and final logit soft-capping, RMSNorm of
 *           the attention and FFN outputs, sliding-window attention on
 *           every other layer (from layer 0).
 *   gemma3  gemma2 without soft-capping (final capping only if the file
 *           says), per-head Q/K norms, five sliding-window layers to one
 *           global, local layers on their own RoPE base (10000 unless
 *           rope.freq_base_swa) and unscaled.
 *   phi3    fused QKV and gate/up matrices (bound as row views, no copy),
 *           NEOX RoPE over n_rot dims, rope_factors_short/long per context
 *           length; its sliding window is ignored, as llama.cpp does.
 * RoPE scaling: linear, yarn (ggml's rope_yarn), longrope (the factors),
 * llama3 (rope_freqs). The converters already add gemma's 1 to its norm
 * weights, so every norm multiplies by the stored weight.
 * When `output.weight` is absent the output projection is the token
 * embedding (tied). Weights stay as the file has them, mapped or copied
 * whole into huge-page memory (GGUFLoad), in their own type (F32, F16,
 * BF16, Q8_0, Q4_0); nothing is dequantized ahead of time. A copy's
 * quantized matrices may be rearranged in place for the backend
 * (model_repack), in the same bytes.
 *
 * model_forward() runs a batch of tokens, possibly from several sequences,
 * through every layer, writing each token's K/V into the paged cache and
 * producing logits for the tokens asked for. It allocates nothing: the
 * RunState holds every activation buffer, sized for max_tokens. */

#ifndef OMNI_MODEL_H
#define OMNI_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "kernels.h"
#include "kv_cache.h"
#include "log.h"

typedef enum {
    ARCH_LLAMA,
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_GEMMA,
    ARCH_GEMMA2,
    ARCH_GEMMA3,
    ARCH_PHI3,
} Arch;

typedef struct {
    Arch     arch;
    int      dim;           // embedding width
    int      n_layers;
    int      n_heads;
    int      n_kv_heads;
    int      head_dim;
    int      ffn_dim;
    int      n_vocab;
    int      n_ctx;         // trained context length
    float    norm_eps;
    RopeParams rope;        // global layers; freq_factors borrowed
    RopeParams rope_swa;    // sliding-window layers
    /* what a family changes in the llama block (model.h's top) */
    bool     qkv_bias;      // Q/K/V biases (qwen2)
    bool     qk_norm;       // per-head RMSNorm of Q and K before RoPE
    bool     post_norms;    // RMSNorm of attention and FFN outputs
    bool     geglu;         // GELU-gated FFN instead of SwiGLU
    float    embed_scale;   // embeddings multiplied by this, 1 = none
    float    q_scale;       // > 0: queries multiplied by this and scores
                            //   not scaled; 0: scores by 1/sqrt(head_dim)
    float    attn_softcap;  // > 0: scores soft-capped at this
    float    final_softcap; // > 0: logits soft-capped at this
    int      n_swa;         // sliding window in positions, 0 = none
    int      swa_pattern;   // layer l slides iff l % p < p - 1 (p = 0: all)
} ModelConfig;

typedef struct {
    const float *attn_norm;     // (dim,)
    Matrix       wq;            // (n_heads*head_dim, dim)
    Matrix       wk;            // (n_kv_heads*head_dim, dim)
    Matrix       wv;            // (n_kv_heads*head_dim, dim)
    const float *bq, *bk, *bv;  // qwen2 biases or NULL
    const float *q_norm;        // (head_dim,) or NULL (qk_norm)
    const float *k_norm;        // (head_dim,) or NULL
    const float *attn_post_norm;// (dim,) or NULL (post_norms)
    const float *ffn_post_norm; // (dim,) or NULL
    Matrix       wo;            // (dim, n_heads*head_dim)
    const float *ffn_norm;      // (dim,)
    Matrix       w_gate;        // (ffn_dim, dim)
    Matrix       w_up;          // (ffn_dim, dim)
    Matrix       w_down;        // (dim, ffn_dim)
} LayerWeights;

typedef struct {
    ModelConfig   c;
    GGUF          gguf;         // the mapped file, owned
    Matrix        tok_embd;     // (n_vocab, dim)
    Matrix        output;       // (n_vocab, dim); tok_embd when tied
    const float  *output_norm;  // (dim,)
    LayerWeights *layers;       // (n_layers,), owned
    const float  *rope_long;    // (n_rot/2,) phi3 factors past n_ctx_orig,
    const float  *rope_short;   //   and within it; NULL if none
    float       **f32_copies;   // (n_copies,) f32 copies of 1-D tensors
    int           n_copies;     //   stored as f16/bf16, owned (usually 0)
    uint64_t      weight_bytes; // bytes of weights one token reads
} Model;

/* Loads (maps or copies, see GGUFLoad) and validates a model file. Returns -1 with err naming the file and
 * the problem (unsupported architecture or weight type, missing tensor,
 * shape mismatch). On failure nothing needs freeing. */
int  model_load(Model *m, const char *path, GGUFLoad how, Err *err);
/* Puts m's weights where be's ops read them: a device backend
 * (be->upload) gets a copy of every matrix and vector, m's pointers are
 * then its device copies, and the host's tensor data is given back
 * (gguf_drop_data); a host backend may repack them
 * (model_repack). Call once, after model_use_context, before the first
 * forward; from then on only be runs m. Returns -1 with err set when a
 * weight type is one be does not run or its memory runs out. */
int  model_place(Model *m, Backend *be, Err *err);
/* Lets be rearrange, in place, the weights its matmul reads (be->repack)
 * when they are a private copy (GGUF_COPY), then seals them read-only.
 * Call once, with the backend that will run m, before the first forward:
 * from then on only backends of be's kind may run m. A mapped model
 * (GGUF_MAP) is left as stored. Can't fail. */
void model_repack(Model *m, Backend *be);
void model_free(Model *m);
/* Picks what depends on the context the model will run with: phi3's long
 * RoPE factors when n_ctx exceeds the original context, as llama.cpp
 * does, else the short ones. Call before the first forward. Can't fail. */
void model_use_context(Model *m, int64_t n_ctx);
/* Whether layer l attends through a sliding window. */
bool model_layer_swa(const ModelConfig *c, int l);

/* Activations for up to max_tokens tokens per forward call, of which at most
 * max_out get logits. */
typedef struct {
    int64_t max_tokens;
    int64_t max_out;
    float  *x;          // (max_tokens, dim) residual stream
    float  *xb;         // (max_tokens, wide) normed input, attention output
    float  *q;          // (max_tokens, n_heads*head_dim)
    float  *k, *v;      // (max_tokens, n_kv_heads*head_dim)
    float  *hb, *hb2;   // (max_tokens, wide) FFN hidden, projections out
    float  *xo;         // (max_out, dim) rows gathered for the output
    float  *logits;     // (max_out, n_vocab)
    float  *mem;        // the one allocation all of the above live in, owned
    Backend *be;        // whose memory mem is (a device backend's), or
                        //   NULL for host memory; borrowed
    float  *logits_host;// (max_out, n_vocab) on the host: logits itself
                        //   for host memory, else an owned buffer that
                        //   runstate_logits_row fills
} RunState;             // wide = max(dim, n_heads*head_dim, ffn_dim)

/* Sizes for max_tokens per call, max_out logits rows, in be's memory
 * (be->alloc; host memory when be is NULL or has none). */
int  runstate_init(RunState *s, const ModelConfig *c, int64_t max_tokens,
                   int64_t max_out, Backend *be, Err *err);
void runstate_free(RunState *s);
/* Bytes runstate_init takes in the backend's memory (for a memory plan). */
uint64_t runstate_bytes(const ModelConfig *c, int64_t max_tokens,
                        int64_t max_out);
/* Logits row `row` of the last forward, on the host: copied off the
 * device for a device backend (a sampler needs it whole), else where
 * forward wrote it. */
float *runstate_logits_row(RunState *s, int64_t row, int64_t n_vocab);

/* Runs tokens (b->n of them, b->n <= s->max_tokens) at the positions and
 * through the block tables in b. The K/V slots of every token must exist
 * (the caller allocated the blocks). For the n_out token indices in out_idx
 * (ascending), logits are written to s->logits rows 0..n_out-1. Can't fail:
 * everything was validated and allocated before. */
void model_forward(const Model *m, Backend *be, const KVCache *kv,
                   RunState *s, const int32_t *tokens, const TokenBatch *b,
                   const int32_t *out_idx, int64_t n_out);

#endif

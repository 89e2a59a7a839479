/* kernels.h -- the compute backend seam: every operation the model's forward
 * pass needs, as one table of function pointers.
 *
 * model.c sees only this header. A backend (kernels/cpu/, kernels/cuda/)
 * fills a Backend at creation; the model calls through it. Pointers given
 * to ops are in the backend's memory (host memory for the CPU, device
 * memory for CUDA: see alloc and upload), except the host arrays of a
 * TokenBatch, which a device backend copies over in begin.
 * Shapes are given as (rows, cols) with cols contiguous, rows of a batch of
 * n tokens one after another.
 *
 * Contract shared by every op: results for one token never depend on which
 * other tokens are in the same call, nor on the thread count. Every output
 * element is computed by one fixed sequence of floating-point operations
 * (batch-invariant accumulation order), so a sequence decodes to the same
 * tokens alone or batched with 63 others. The kernel tests check this
 * bit for bit.
 *
 * The KV cache is paged: keys and values of a layer live in fixed-size
 * blocks of block_size tokens; a sequence owns a block table mapping its
 * logical block i (positions i*block_size ...) to a physical block. The
 * attention op reads through that table, so sequences of any length share
 * one pool without copying. */

#ifndef OMNI_KERNELS_H
#define OMNI_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix, viewed in place (no dequantized copy is ever made). */
typedef struct {
    DType       type;
    int64_t     rows;       // output features (ggml ne[1])
    int64_t     cols;       // input features, the row length (ggml ne[0])
    size_t      row_bytes;  // stride between rows
    const void *data;       // (rows, row_bytes), borrowed: a view into the
                            // mmapped GGUF
    WLayout     layout;     // how the blocks of a row are arranged (dtype.h):
                            // WL_ROWS as stored, unless the backend repacked
} Matrix;

/* One layer's share of the paged KV cache. */
typedef struct {
    int       n_kv_heads;
    int       head_dim;
    int       block_size;   // tokens per block
    int64_t   n_blocks;
    uint16_t *k;            // (n_blocks, n_kv_heads, block_size, head_dim)
    uint16_t *v;            //   f16, both owned by the KV cache
} KVLayer;

/* Where each token of a batch sits: its position and its sequence's block
 * table. Tokens of one sequence appear in position order. */
typedef struct {
    int64_t          n;             // tokens in the batch
    const int32_t   *pos;           // (n,) position in its sequence
    const int32_t  **block_table;   // (n,) borrowed; logical -> physical
} TokenBatch;

typedef enum {
    ROPE_NORM = 0,          // rotate adjacent pairs (x[2i], x[2i+1]): llama
    ROPE_NEOX = 2,          // rotate halves (x[i], x[i+n_rot/2]): qwen2
} RopeMode;

/* The angle of pair i at position p follows ggml's rope: theta =
 * freq_scale * p * base^(-2i/n_rot) / freq_factors[i]. With ext_factor != 0
 * (YaRN) it is mixed with the unscaled angle by a ramp over the pairs
 * between the correction dims of beta_fast and beta_slow (computed from
 * n_ctx_orig), and cos/sin are multiplied by attn_factor * (1 + 0.1 *
 * ln(1 / freq_scale)); without it by attn_factor alone. */
typedef struct {
    RopeMode     mode;
    int          n_rot;         // dimensions rotated per head (<= head_dim)
    float        freq_base;     // theta base, 10000 unless the model says
    float        freq_scale;    // linear position scaling, 1 = none
    const float *freq_factors;  // (n_rot/2,) or NULL: per-frequency divisors
                                // (llama 3.1 rope_freqs), borrowed
    float        ext_factor;    // YaRN extrapolation mix, 0 = off
    float        attn_factor;   // magnitude scale of cos/sin, 1 = none
    float        beta_fast;     // YaRN correction range (32 and 1 in
    float        beta_slow;     //   llama.cpp)
    int          n_ctx_orig;    // YaRN: the context trained before scaling
} RopeParams;

/* Attention options beyond plain causal softmax. */
typedef struct {
    float scale;        // score = scale * q . k
    float softcap;      // > 0: score = softcap * tanh(score) (gemma2)
    int   window;       // > 0: only the last window positions, the token's
                        //   own included (sliding-window layers)
} AttnParams;

#define MM_MAX_FUSED 3           // matrices one matmul_n call takes

typedef struct Backend Backend;

struct Backend {
    const char *name;           // "cpu-avx512", "cpu-avx2", "cpu-ref", ...
    void       *ctx;            // backend state, owned

    /* (optional) Rewrites w's rows in place into the layout this
     * backend's matmul reads fastest and sets w->layout; leaves w as it is
     * when it has none for w's type and shape. w->data must be writable,
     * and w is from then on read only by backends of this kind (matmul,
     * embed). Runs at load time; can't fail. NULL means weights are read
     * as stored. */
    void (*repack)(Backend *be, Matrix *w);

    /* out (n, dim) = rows tokens[i] of table, converted to f32. */
    void (*embed)(Backend *be, float *out, const Matrix *table,
                  const int32_t *tokens, int64_t n);

    /* out (n, dim) = x / sqrt(mean(x^2) + eps) * weight, per row; out may
     * equal x. */
    void (*rmsnorm)(Backend *be, float *out, const float *x,
                    const float *weight, int64_t n, int64_t dim, float eps);

    /* out (n, w->rows) = x (n, w->cols) . w^T. out and x do not overlap. */
    void (*matmul)(Backend *be, float *out, const float *x, int64_t n,
                   const Matrix *w);

    /* outs[i] (n, ws[i]->rows) = x . ws[i]^T for i < count (at most
     * MM_MAX_FUSED), bit for bit what count matmul calls give, as one job:
     * Q/K/V and gate/up read the same input. */
    void (*matmul_n)(Backend *be, float *const *outs, const float *x,
                     int64_t n, const Matrix *const *ws, int count);

    /* x (n, dim) += bias (dim,) on every row. */
    void (*add_bias)(Backend *be, float *x, const float *bias, int64_t n,
                     int64_t dim);

    /* x (n, dim) += y (n, dim): the residual connection. */
    void (*add)(Backend *be, float *x, const float *y, int64_t n,
                int64_t dim);

    /* Rotates x (n, n_heads, head_dim) in place by each token's position. */
    void (*rope)(Backend *be, float *x, int64_t n, int n_heads, int head_dim,
                 const int32_t *pos, const RopeParams *p);

    /* Stores k, v (n, n_kv_heads * head_dim) into kv at each token's slot. */
    void (*kv_store)(Backend *be, const KVLayer *kv, const float *k,
                     const float *v, const TokenBatch *b);

    /* Causal attention. For each token t and head h: out[t][h] =
     * softmax(score(q[t][h], K[s..pos[t]])) . V[s..pos[t]], reading K and
     * V of kv head h / (n_heads / n_kv_heads) through t's block table;
     * s = 0, or pos[t] - window + 1 with a window; score as AttnParams
     * says. q, out: (n, n_heads * head_dim). kv_store for the batch comes
     * first. */
    void (*attention)(Backend *be, float *out, const float *q, int n_heads,
                      const KVLayer *kv, const TokenBatch *b,
                      const AttnParams *p);

    /* out (n,) = silu(gate) * up, elementwise; out may equal gate. */
    void (*swiglu)(Backend *be, float *out, const float *gate,
                   const float *up, int64_t n);

    /* out (n,) = gelu(gate) * up, elementwise (GeGLU); out may equal
     * gate. gelu is the tanh approximation as ggml's CPU backend computes
     * it: through f16 (gate rounded to f16, gelu rounded to f16), 0 below
     * -10 and the identity above 10. */
    void (*geglu)(Backend *be, float *out, const float *gate,
                  const float *up, int64_t n);

    /* x (n,) = cap * tanh(x * (1/cap)): gemma2's final logit soft-capping,
     * in ggml's order of operations. */
    void (*softcap)(Backend *be, float *x, int64_t n, float cap);

    /* x (n,) *= s. */
    void (*scale)(Backend *be, float *x, int64_t n, float s);

    /* ---- Where the data lives --------------------------------------
     * A host backend (the CPU's) leaves every hook below NULL except
     * gather: activations, the KV pool and weights are host memory, and
     * logits are read where forward wrote them. A device backend (CUDA)
     * fills them all: buffers its ops touch come from alloc, weights are
     * copied over by upload, and only token ids (or the logits rows a
     * sampler needs) come back. */

    /* (optional) Memory for activations or the KV pool, in the backend's
     * memory and charged to its budget; NULL when it is spent. release
     * frees it. NULL hooks: host memory (the caller's aligned_alloc). */
    void *(*alloc)(Backend *be, size_t bytes);
    void  (*release)(Backend *be, void *p);

    /* (optional) Bytes of the backend's memory budget still free (for
     * sizing the KV pool from it); -1 when it has no budget of its own. */
    int64_t (*budget_left)(Backend *be);

    /* (optional) Copies w's rows into the backend's memory and points
     * w->data there; a matrix with the same data and size as one already
     * uploaded shares that copy (a tied output). Returns -1 with err set
     * when the type is one this backend does not run or memory runs out.
     * Runs at load time. */
    int  (*upload)(Backend *be, Matrix *w, char *err, size_t errlen);
    /* (optional) The same for a vector of n f32 (norm weights, biases,
     * RoPE factors): *v is replaced by the backend's copy. */
    int  (*upload_f32)(Backend *be, const float **v, int64_t n, char *err,
                       size_t errlen);

    /* (optional) Called by model_forward before its first op and after
     * its last, with the host arrays the ops will also be given: a device
     * backend copies the batch's tokens, positions, block tables and output
     * rows over in one transfer, and may record the ops in between as a
     * graph (a decode step) or replay one recorded for the same shape and
     * the same bufs: an identity of the buffers the ops will be given (the
     * activations and KV cache), since a graph holds their addresses. The
     * arrays stay valid and unchanged until end. */
    void (*begin)(Backend *be, const int32_t *tokens, const TokenBatch *b,
                  const int32_t *out_idx, int64_t n_out, uint64_t bufs);
    void (*end)(Backend *be);

    /* out (n_out, dim) = rows idx[i] of x (n, dim): the tokens that get
     * logits. idx as given to begin. */
    void (*gather)(Backend *be, float *out, const float *x,
                   const int32_t *idx, int64_t n_out, int64_t dim);

    /* (optional) ids (n,) on the host = the argmax of each logits row (n,
     * n_vocab) in the backend's memory: the lowest id among the highest
     * values, NaN never winning, as the sampler's greedy pick. Only the ids
     * cross. NULL: read the logits on the host (sampler_sample). */
    void (*argmax)(Backend *be, int32_t *ids, const float *logits,
                   int64_t n, int64_t n_vocab);

    /* (optional) Copies n floats of the backend's memory at src to the
     * host at dst (a logits row a sampler needs whole). NULL: src is host
     * memory already. */
    void (*to_host)(Backend *be, float *dst, const float *src, int64_t n);

    /* Releases the backend and its ctx. */
    void (*free)(Backend *be);
};

/* Sizes a backend preallocates for, so that no op allocates. */
typedef struct {
    const char *backend;    // "auto" (CUDA when a device is present, else
                            // the CPU), "cpu" or "cuda"; NULL = "auto"
    int         n_threads;  // workers incl. the caller; 0: one per core
    const char *isa;        // "auto" (best this CPU has), "avx512", "avx2",
                            // "neon" or "ref" (scalar); NULL = "auto"
    int64_t     max_tokens; // most tokens in one call
    int64_t     max_out;    // most logits rows in one call
    int64_t     max_cols;   // longest matrix row (input features)
    int64_t     max_ctx;    // longest sequence attention reads
    int         block_size; // tokens per KV block, the smallest of the
                            //   caches it will serve: a device copies up
                            //   to ceil(max_ctx / block_size) entries of
                            //   a block table, which must hold as many
    int         n_heads;    // query heads and head width attention runs
    int         head_dim;   //   with (a device sizes its workspace)
    int64_t     n_vocab;    // logits row length
    double      gpu_memory_fraction;  // share of the device's memory the
                            // backend may hold (weights, activations, KV
                            // pool, workspace); 0 = 0.9
    char        note[256];  // out: why "auto" chose as it did (a CUDA
                            // backend missing or failing), "" otherwise
} BackendConfig;

/* The CPU features the kernel sets need, as bits: x86-64's, then
 * aarch64's (Advanced SIMD, and its Armv8.2 dot product SDOT). */
enum {
    CPU_AVX512F    = 1 << 0,
    CPU_AVX512BW   = 1 << 1,
    CPU_AVX512VL   = 1 << 2,
    CPU_AVX512DQ   = 1 << 3,
    CPU_AVX512VNNI = 1 << 4,
    CPU_AVX2       = 1 << 5,
    CPU_FMA        = 1 << 6,
    CPU_F16C       = 1 << 7,
    CPU_NEON       = 1 << 8,
    CPU_DOTPROD    = 1 << 9,
};

/* The features of the CPU this runs on (0 off x86-64 and aarch64). */
unsigned cpu_features(void);

/* The kernel set ("avx512", "avx2", "neon", "ref") that isa picks on a CPU
 * with these features: "auto" (or NULL) the widest in this build the CPU
 * runs, down to "ref"; a named set itself, or NULL with err set when the CPU
 * lacks what it needs or the build does not have it. */
const char *cpu_kernel_set(const char *isa, unsigned features, char *err,
                           size_t errlen);

/* Creates the CPU backend. Returns NULL with err set (errlen bytes) when the
 * CPU lacks the requested ISA or memory runs out. */
Backend *backend_cpu_new(const BackendConfig *cfg, char *err, size_t errlen);

/* Creates the backend cfg->backend names (backend.c): "cpu"; "cuda" from
 * the CUDA plugin (omni-cuda.so, found as OMNI_CUDA_LIB says or beside the
 * running executable), which needs a device, its driver and the memory;
 * "auto" the CUDA one when it can be had, else the CPU with cfg->note
 * saying why not. Returns NULL with err naming what is missing. Call it
 * in a process that will not fork afterwards (the thinker stage is
 * exec'ed): CUDA's context does not survive a fork. */
Backend *backend_new(BackendConfig *cfg, char *err, size_t errlen);

/* The CUDA plugin's one entry point (kernels/cuda/cuda_backend.cu),
 * looked up by name by backend_new. */
#define BACKEND_CUDA_ENTRY "omni_cuda_backend_new"
typedef Backend *(*BackendNewFn)(const BackendConfig *cfg, char *err,
                                 size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

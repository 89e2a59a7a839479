/* cuda_ops.h -- what the CUDA backend's files share: the device copy of a
 * batch, the attention and matmul workspaces, and one launcher per
 * kernel.
 *
 * cuda_backend.cu owns the device, the stream and every buffer, and maps
 * the Backend table onto these launchers; ops.cu (elementwise, norms,
 * RoPE, embedding, KV store, gather, argmax), attention.cu (paged
 * attention) and matmul.cu (our kernels for F32, Q8_0 and Q4_0, cuBLASLt
 * for F16 and BF16) hold the kernels.
 *
 * Every launcher only enqueues work on the stream it is given: no
 * allocation, no synchronisation, no host reads of device memory, so that
 * a decode step can be captured into a CUDA graph and replayed. Pointers
 * are device pointers unless a comment says host.
 *
 * Batch invariance, as kernels.h asks: every output element is computed by
 * one fixed sequence of operations that depends on the token's own data and
 * on sizes fixed at creation (never on n, the batch's token count): a
 * reduction splits its k the same way for any n, warps combine in a fixed
 * order, attention splits a context at fixed positions (chunk) and merges
 * the splits in order, and a cuBLASLt GEMM runs one algorithm chosen per
 * weight shape at upload, without split-K, for every n. */

#ifndef OMNI_CUDA_OPS_H
#define OMNI_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A batch's TokenBatch and output rows, copied to the device by begin.
 * Block tables are stored once per sequence: a token's table is row seq[t]
 * of tables (table_stride entries, of which the sequence's blocks are
 * valid). */
typedef struct {
    int64_t        n;               // tokens
    int64_t        n_out;           // rows that get logits
    const int32_t *tokens;          // (n,)
    const int32_t *pos;             // (n,)
    const int32_t *seq;             // (n,) row of tables
    const int32_t *tables;          // (n_seqs, table_stride)
    int            table_stride;    // max_ctx / block_size, rounded up
    const int32_t *out_idx;         // (n_out,)
} CuBatch;

/* Paged attention's split-context workspace: a token's context is cut at
 * multiples of chunk positions, each piece reduced on its own into part,
 * then merged in order. chunk and max_splits are fixed at creation from
 * max_ctx (cuda_attn_shape, plan.h), so that no token needs more than
 * max_splits pieces. */
typedef struct {
    float *part;        // (max_tokens, n_heads, max_splits, head_dim + 2):
                        //   per piece the unnormalised output, its max
                        //   score and its sum of exp
    int    chunk;       // positions per piece, a multiple of 32
    int    max_splits;  // ceil(max_ctx / chunk)
} CuAttnWork;

/* ---- ops.cu ---- */

/* out (n, dim) = rows tokens[i] of table, converted to f32. table->data is
 * device memory; types F32, F16, BF16, Q8_0, Q4_0. */
void cu_embed(cudaStream_t st, float *out, const Matrix *table,
              const int32_t *tokens, int64_t n);
/* As kernels.h's rmsnorm (out may equal x); one block per row, a fixed
 * reduction tree. */
void cu_rmsnorm(cudaStream_t st, float *out, const float *x,
                const float *weight, int64_t n, int64_t dim, float eps);
void cu_add_bias(cudaStream_t st, float *x, const float *bias, int64_t n,
                 int64_t dim);
void cu_add(cudaStream_t st, float *x, const float *y, int64_t count);
void cu_swiglu(cudaStream_t st, float *out, const float *gate,
               const float *up, int64_t count);
/* GeGLU through f16 as kernels.h says (ggml's table semantics). */
void cu_geglu(cudaStream_t st, float *out, const float *gate,
              const float *up, int64_t count);
void cu_softcap(cudaStream_t st, float *x, int64_t count, float cap);
void cu_scale(cudaStream_t st, float *x, int64_t count, float s);
/* As kernels.h's rope, positions from pos (device); p is a host struct
 * whose freq_factors, when set, is device memory. */
void cu_rope(cudaStream_t st, float *x, int64_t n, int n_heads,
             int head_dim, const int32_t *pos, const RopeParams *p);
/* k, v (n, n_kv_heads * head_dim) to f16 at each token's slot (kv's
 * arrays are device memory). */
void cu_kv_store(cudaStream_t st, const KVLayer *kv, const float *k,
                 const float *v, const CuBatch *b);
/* out (n_out, dim) = rows b->out_idx of x. */
void cu_gather(cudaStream_t st, float *out, const float *x,
               const CuBatch *b, int64_t dim);
/* ids (n,) = argmax per row of logits (n, n_vocab): lowest id among the
 * highest, NaN never wins (a row of NaN gives 0). */
void cu_argmax(cudaStream_t st, int32_t *ids, const float *logits,
               int64_t n, int64_t n_vocab);

/* ---- attention.cu ---- */

/* As kernels.h's attention: q, out (n, n_heads * head_dim); K/V f16
 * through each token's block table; head_dim <= 256. */
void cu_attention(cudaStream_t st, float *out, const float *q, int n_heads,
                  const KVLayer *kv, const CuBatch *b, const AttnParams *p,
                  const CuAttnWork *w);

/* ---- matmul.cu ---- */

typedef struct CuMatmul CuMatmul;

/* The matmul state: the cuBLASLt handle and workspace, an f16/bf16 copy of
 * the activations (max_tokens x max_cols), and the algorithm chosen for
 * each weight shape. Returns NULL with err set. */
CuMatmul *cu_matmul_new(int64_t max_tokens, int64_t max_cols, char *err,
                        size_t errlen);
void      cu_matmul_free(CuMatmul *mm);
/* Device bytes cu_matmul_new takes for these sizes (for the memory
 * plan). */
size_t    cu_matmul_bytes(int64_t max_tokens, int64_t max_cols);
/* Whether the CUDA matmul runs weights of this type. */
int       cu_matmul_supports(DType t);
/* Called once per uploaded matrix: picks and checks the GEMM algorithm for
 * its shape (F16/BF16), for every n up to max_tokens. -1 with err set when
 * none is found. */
int       cu_matmul_prepare(CuMatmul *mm, const Matrix *w, char *err,
                            size_t errlen);
/* out (n, w->rows) = x (n, w->cols) . w^T, on st. */
void      cu_matmul(CuMatmul *mm, cudaStream_t st, float *out,
                    const float *x, int64_t n, const Matrix *w);

#ifdef __cplusplus
}
#endif

#endif

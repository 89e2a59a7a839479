/* model.c -- loading a llama-family GGUF and running its forward pass.
 *
 * Loading reads the hyperparameters from `<arch>.*` metadata with
 * llama.cpp's defaults, then binds every tensor by its llama.cpp name,
 * checking type and shape, so a forward pass can never index outside a
 * weight. Only 1-D tensors stored in f16/bf16 are copied (to f32); matrices
 * are used in place.
 *
 * The forward pass reads like llama2.c's: embed, then per layer RMSNorm ->
 * QKV -> RoPE -> paged attention -> output projection + residual -> RMSNorm
 * -> SwiGLU FFN + residual; final norm and logits only for the tokens that
 * need them (the last prompt token, each decoding token). */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define MAX_HEAD_DIM 512            /* rope's per-token angle buffer */

static const char *arch_names[] = { "llama", "qwen2" };


/* ---- Hyperparameters --------------------------------------------------- */

/* Reads "<arch>.<key>" as u32 into *out; required keys must exist. */
static int hp_u32(const Model *m, const char *key, bool required,
                  uint32_t *out, Err *err)
{
    char name[128];
    int  rc;

    snprintf(name, sizeof(name), "%s.%s", arch_names[m->c.arch], key);
    rc = gguf_get_u32(&m->gguf, name, out, err);
    if (rc < 0) return -1;
    if (rc > 0 && required) {
        return err_set(err, "missing metadata key '%s'", name);
    }
    return 0;
}

static int hp_f32(const Model *m, const char *key, float *out, Err *err) {
    char name[128];

    snprintf(name, sizeof(name), "%s.%s", arch_names[m->c.arch], key);
    return gguf_get_f32(&m->gguf, name, out, err) < 0 ? -1 : 0;
}

static int read_arch(Model *m, Err *err) {
    GGUFStr a;

    if (gguf_get_str(&m->gguf, "general.architecture", &a, err) != 0) {
        return err_set(err, "missing or invalid general.architecture");
    }
    for (size_t i = 0; i < sizeof(arch_names) / sizeof(arch_names[0]); i++) {
        if (gguf_str_eq(a, arch_names[i])) {
            m->c.arch = (Arch) i;
            return 0;
        }
    }
    return err_set(err, "architecture '%.*s' is not supported (llama, qwen2)",
                   (int) (a.len > 64 ? 64 : a.len), a.ptr);
}

static int read_rope_scaling(Model *m, Err *err) {
    char    name[128];
    GGUFStr type = { "none", 4 };
    float   factor = 1.0f;

    snprintf(name, sizeof(name), "%s.rope.scaling.type",
             arch_names[m->c.arch]);
    if (gguf_get_str(&m->gguf, name, &type, err) < 0) return -1;
    if (hp_f32(m, "rope.scaling.factor", &factor, err) != 0) return -1;
    m->c.rope.freq_scale = 1.0f;
    if (gguf_str_eq(type, "none") || factor == 0.0f || factor == 1.0f) {
        return 0;
    }
    if (gguf_str_eq(type, "linear")) {
        m->c.rope.freq_scale = 1.0f / factor;
        return 0;
    }
    return err_set(err, "rope scaling '%.*s' is not supported (none, "
                   "linear, llama3 rope_freqs)", (int) type.len, type.ptr);
}

static int read_config(Model *m, Err *err) {
    ModelConfig *c = &m->c;
    uint32_t     ctx, dim, layers, ffn, heads, kv_heads = 0, key_len = 0;
    uint32_t     n_rot = 0;

    if (read_arch(m, err) != 0
        || hp_u32(m, "context_length", true, &ctx, err) != 0
        || hp_u32(m, "embedding_length", true, &dim, err) != 0
        || hp_u32(m, "block_count", true, &layers, err) != 0
        || hp_u32(m, "feed_forward_length", true, &ffn, err) != 0
        || hp_u32(m, "attention.head_count", true, &heads, err) != 0
        || hp_u32(m, "attention.head_count_kv", false, &kv_heads, err) != 0
        || hp_u32(m, "attention.key_length", false, &key_len, err) != 0
        || hp_u32(m, "rope.dimension_count", false, &n_rot, err) != 0)
    {
        return -1;
    }
    if (dim == 0 || dim > 65536 || layers == 0 || layers > 1024
        || ffn == 0 || ffn > 262144 || heads == 0 || heads > dim
        || ctx == 0)
    {
        return err_set(err, "implausible hyperparameters (dim %u, layers %u, "
                       "ffn %u, heads %u, context %u)", dim, layers, ffn,
                       heads, ctx);
    }
    kv_heads = kv_heads ? kv_heads : heads;
    key_len = key_len ? key_len : dim / heads;
    n_rot = n_rot ? n_rot : key_len;
    if (kv_heads > heads || heads % kv_heads != 0 || key_len % 2 != 0
        || key_len > MAX_HEAD_DIM || n_rot > key_len || n_rot % 2 != 0)
    {
        return err_set(err, "unsupported attention shape (heads %u, kv heads "
                       "%u, head dim %u, rope dims %u)", heads, kv_heads,
                       key_len, n_rot);
    }
    c->n_ctx = (int) (ctx > (1u << 20) ? 1u << 20 : ctx);
    c->dim = (int) dim;
    c->n_layers = (int) layers;
    c->ffn_dim = (int) ffn;
    c->n_heads = (int) heads;
    c->n_kv_heads = (int) kv_heads;
    c->head_dim = (int) key_len;
    c->norm_eps = 1e-5f;
    c->rope.mode = c->arch == ARCH_QWEN2 ? ROPE_NEOX : ROPE_NORM;
    c->rope.n_rot = (int) n_rot;
    c->rope.freq_base = 10000.0f;
    if (hp_f32(m, "attention.layer_norm_rms_epsilon", &c->norm_eps, err) != 0
        || hp_f32(m, "rope.freq_base", &c->rope.freq_base, err) != 0)
    {
        return -1;
    }
    return read_rope_scaling(m, err);
}


/* ---- Tensors ----------------------------------------------------------- */

static int tensor_shape_error(const GGUFTensor *t, int64_t ne0, int64_t ne1,
                              Err *err)
{
    return err_set(err, "tensor '%.*s' has shape [%" PRId64 ", %" PRId64
                   ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                   (int) t->name.len, t->name.ptr, t->ne[0], t->ne[1],
                   t->ne[2], ne0, ne1);
}

/* Binds a 2-D weight of rows x cols (ggml shape [cols, rows]). */
static int bind_matrix(const Model *m, const char *name, int64_t rows,
                       int64_t cols, Matrix *out, Err *err)
{
    const GGUFTensor *t = gguf_find_tensor(&m->gguf, name);

    if (t == NULL) return err_set(err, "missing tensor '%s'", name);
    if (t->n_dims != 2 || t->ne[0] != cols || (rows > 0 && t->ne[1] != rows)) {
        return tensor_shape_error(t, cols, rows, err);
    }
    if (!dtype_supported(t->type)) {
        return err_set(err, "tensor '%s' has type %s, which is not supported "
                       "(f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, "
                       "q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs)", name,
                       ggml_type_name(t->type));
    }
    /* gguf.c checks this for every tensor; the kernels read whole blocks,
       so it is checked again where a matrix is handed to them */
    if (t->ne[0] % dtype_block((DType) t->type) != 0) {
        return err_set(err, "tensor '%s' has rows of %" PRId64 " elements, "
                       "not a multiple of the %s block of %" PRId64, name,
                       t->ne[0], dtype_name((DType) t->type),
                       dtype_block((DType) t->type));
    }
    out->type = (DType) t->type;
    out->rows = t->ne[1];
    out->cols = t->ne[0];
    out->row_bytes = dtype_row_bytes(out->type, out->cols);
    out->data = t->data;
    return 0;
}

/* Binds a 1-D f32 vector of n; f16/bf16 ones are converted into an owned
 * copy. A missing optional vector leaves *out NULL. */
static int bind_vector(Model *m, const char *name, int64_t n, bool optional,
                       const float **out, Err *err)
{
    const GGUFTensor *t = gguf_find_tensor(&m->gguf, name);
    float            *copy, **list;

    *out = NULL;
    if (t == NULL) {
        return optional ? 0 : err_set(err, "missing tensor '%s'", name);
    }
    if (t->n_dims != 1 || t->ne[0] != n) return tensor_shape_error(t, n, 1, err);
    if (t->type == DT_F32) {
        *out = t->data;
        return 0;
    }
    if (t->type != DT_F16 && t->type != DT_BF16) {
        return err_set(err, "tensor '%s' has type %s; 1-D tensors must be "
                       "f32, f16 or bf16", name, ggml_type_name(t->type));
    }
    list = realloc(m->f32_copies, (size_t) (m->n_copies + 1) * sizeof(float *));
    copy = malloc((size_t) n * sizeof(float));
    if (list == NULL || copy == NULL) {
        free(copy);
        if (list != NULL) m->f32_copies = list;
        return err_set(err, "out of memory");
    }
    m->f32_copies = list;
    m->f32_copies[m->n_copies++] = copy;
    dequantize_row((DType) t->type, t->data, copy, n);
    *out = copy;
    return 0;
}

static int bind_layer(Model *m, int l, Err *err) {
    const ModelConfig *c = &m->c;
    LayerWeights      *L = &m->layers[l];
    int64_t            qd = (int64_t) c->n_heads * c->head_dim;
    int64_t            kvd = (int64_t) c->n_kv_heads * c->head_dim;
    bool               bias = c->arch == ARCH_QWEN2;
    char               n[12][64];
    static const char *fmt[] = {
        "blk.%d.attn_norm.weight", "blk.%d.attn_q.weight",
        "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
        "blk.%d.attn_output.weight", "blk.%d.ffn_norm.weight",
        "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
        "blk.%d.ffn_down.weight", "blk.%d.attn_q.bias",
        "blk.%d.attn_k.bias", "blk.%d.attn_v.bias",
    };

    for (int i = 0; i < 12; i++) snprintf(n[i], sizeof(n[i]), fmt[i], l);
    return bind_vector(m, n[0], c->dim, false, &L->attn_norm, err) != 0
        || bind_matrix(m, n[1], qd, c->dim, &L->wq, err) != 0
        || bind_matrix(m, n[2], kvd, c->dim, &L->wk, err) != 0
        || bind_matrix(m, n[3], kvd, c->dim, &L->wv, err) != 0
        || bind_matrix(m, n[4], c->dim, qd, &L->wo, err) != 0
        || bind_vector(m, n[5], c->dim, false, &L->ffn_norm, err) != 0
        || bind_matrix(m, n[6], c->ffn_dim, c->dim, &L->w_gate, err) != 0
        || bind_matrix(m, n[7], c->ffn_dim, c->dim, &L->w_up, err) != 0
        || bind_matrix(m, n[8], c->dim, c->ffn_dim, &L->w_down, err) != 0
        || bind_vector(m, n[9], qd, !bias, &L->bq, err) != 0
        || bind_vector(m, n[10], kvd, !bias, &L->bk, err) != 0
        || bind_vector(m, n[11], kvd, !bias, &L->bv, err) != 0 ? -1 : 0;
}

static uint64_t matrix_bytes(const Matrix *w) {
    return (uint64_t) w->rows * w->row_bytes;
}

static int bind_tensors(Model *m, Err *err) {
    ModelConfig *c = &m->c;

    if (bind_matrix(m, "token_embd.weight", -1, c->dim, &m->tok_embd, err)
        != 0)
    {
        return -1;
    }
    if (m->tok_embd.rows > INT32_MAX) {
        return err_set(err, "vocabulary of %" PRId64 " tokens is too large",
                       m->tok_embd.rows);
    }
    c->n_vocab = (int) m->tok_embd.rows;
    if (gguf_find_tensor(&m->gguf, "output.weight") != NULL) {
        if (bind_matrix(m, "output.weight", c->n_vocab, c->dim, &m->output,
                        err) != 0)
        {
            return -1;
        }
    } else {
        m->output = m->tok_embd;
    }
    if (bind_vector(m, "output_norm.weight", c->dim, false, &m->output_norm,
                    err) != 0
        || bind_vector(m, "rope_freqs.weight", c->rope.n_rot / 2, true,
                       &c->rope.freq_factors, err) != 0)
    {
        return -1;
    }
    m->layers = calloc((size_t) c->n_layers, sizeof(LayerWeights));
    if (m->layers == NULL) return err_set(err, "out of memory");
    m->weight_bytes = matrix_bytes(&m->output);
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *L = &m->layers[l];

        if (bind_layer(m, l, err) != 0) return -1;
        m->weight_bytes += matrix_bytes(&L->wq) + matrix_bytes(&L->wk)
                           + matrix_bytes(&L->wv) + matrix_bytes(&L->wo)
                           + matrix_bytes(&L->w_gate) + matrix_bytes(&L->w_up)
                           + matrix_bytes(&L->w_down);
    }
    return 0;
}

int model_load(Model *m, const char *path, GGUFLoad how, Err *err) {
    memset(m, 0, sizeof(*m));
    if (gguf_load(&m->gguf, path, how, err) != 0) return -1;
    if (read_config(m, err) != 0 || bind_tensors(m, err) != 0) {
        err_prefix(err, "%s", path);
        model_free(m);
        return -1;
    }
    return 0;
}

/* Every matrix matmul reads; the token embedding only as the tied output
 * (embed follows its layout; an untied one stays as stored). */
void model_repack(Model *m, Backend *be) {
    bool tied = m->output.data == m->tok_embd.data;

    if (be->repack != NULL && m->gguf.writable) {
        for (int l = 0; l < m->c.n_layers; l++) {
            LayerWeights *L = &m->layers[l];
            Matrix       *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo,
                                   &L->w_gate, &L->w_up, &L->w_down };

            for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
                be->repack(be, ws[i]);
            }
        }
        be->repack(be, &m->output);
        if (tied) m->tok_embd = m->output;
    }
    gguf_seal(&m->gguf);
}

void model_free(Model *m) {
    for (int i = 0; i < m->n_copies; i++) free(m->f32_copies[i]);
    free(m->f32_copies);
    free(m->layers);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof(*m));
}


/* ---- Activations ------------------------------------------------------- */

int runstate_init(RunState *s, const ModelConfig *c, int64_t max_tokens,
                  int64_t max_out, Err *err)
{
    int64_t qd = (int64_t) c->n_heads * c->head_dim;
    int64_t kvd = (int64_t) c->n_kv_heads * c->head_dim;
    int64_t wide = c->ffn_dim, total;
    float  *p;

    wide = wide > c->dim ? wide : c->dim;
    wide = wide > qd ? wide : qd;
    total = max_tokens * (c->dim + wide + qd + 2 * kvd + 2 * wide)
            + max_out * ((int64_t) c->dim + c->n_vocab);
    memset(s, 0, sizeof(*s));
    s->mem = aligned_alloc(64, ((size_t) total * sizeof(float) + 63) / 64 * 64);
    if (s->mem == NULL) {
        return err_set(err, "out of memory allocating activations for %"
                       PRId64 " tokens", max_tokens);
    }
    s->max_tokens = max_tokens;
    s->max_out = max_out;
    p = s->mem;
    s->x = p;      p += max_tokens * c->dim;
    s->xb = p;     p += max_tokens * wide;
    s->q = p;      p += max_tokens * qd;
    s->k = p;      p += max_tokens * kvd;
    s->v = p;      p += max_tokens * kvd;
    s->hb = p;     p += max_tokens * wide;
    s->hb2 = p;    p += max_tokens * wide;
    s->xo = p;     p += max_out * c->dim;
    s->logits = p;
    return 0;
}

void runstate_free(RunState *s) {
    free(s->mem);
    memset(s, 0, sizeof(*s));
}


/* ---- Forward ----------------------------------------------------------- */

void model_forward(const Model *m, Backend *be, const KVCache *kv,
                   RunState *s, const int32_t *tokens, const TokenBatch *b,
                   const int32_t *out_idx, int64_t n_out)
{
    const ModelConfig *c = &m->c;
    int64_t            n = b->n, dim = c->dim;
    int64_t            kvd = (int64_t) c->n_kv_heads * c->head_dim;
    float              scale = 1.0f / sqrtf((float) c->head_dim);

    be->embed(be, s->x, &m->tok_embd, tokens, n);

    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &m->layers[l];
        const KVLayer      *kvl = &kv->layers[l];

        /* attention: norm, q/k/v projections (+ qwen2 biases), rope */
        be->rmsnorm(be, s->xb, s->x, L->attn_norm, n, dim, c->norm_eps);
        {
            float *const        outs[] = { s->q, s->k, s->v };
            const Matrix *const ws[] = { &L->wq, &L->wk, &L->wv };

            be->matmul_n(be, outs, s->xb, n, ws, 3);
        }
        if (L->bq != NULL) {
            be->add_bias(be, s->q, L->bq, n, L->wq.rows);
            be->add_bias(be, s->k, L->bk, n, kvd);
            be->add_bias(be, s->v, L->bv, n, kvd);
        }
        be->rope(be, s->q, n, c->n_heads, c->head_dim, b->pos, &c->rope);
        be->rope(be, s->k, n, c->n_kv_heads, c->head_dim, b->pos, &c->rope);

        /* paged attention over every earlier position, then residual */
        be->kv_store(be, kvl, s->k, s->v, b);
        be->attention(be, s->xb, s->q, c->n_heads, kvl, b, scale);
        be->matmul(be, s->hb2, s->xb, n, &L->wo);
        be->add(be, s->x, s->hb2, n, dim);

        /* feed-forward: norm, SwiGLU, down projection, residual */
        be->rmsnorm(be, s->xb, s->x, L->ffn_norm, n, dim, c->norm_eps);
        {
            float *const        outs[] = { s->hb, s->hb2 };
            const Matrix *const ws[] = { &L->w_gate, &L->w_up };

            be->matmul_n(be, outs, s->xb, n, ws, 2);
        }
        be->swiglu(be, s->hb, s->hb, s->hb2, n * c->ffn_dim);
        be->matmul(be, s->xb, s->hb, n, &L->w_down);
        be->add(be, s->x, s->xb, n, dim);
    }

    /* final norm and logits, only for the rows asked for */
    for (int64_t i = 0; i < n_out; i++) {
        memcpy(s->xo + i * dim, s->x + (int64_t) out_idx[i] * dim,
               (size_t) dim * sizeof(float));
    }
    be->rmsnorm(be, s->xo, s->xo, m->output_norm, n_out, dim, c->norm_eps);
    be->matmul(be, s->logits, s->xo, n_out, &m->output);
}

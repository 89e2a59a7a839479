/* model.c -- loading a llama-family GGUF and running its forward pass.
 *
 * Loading reads the hyperparameters from `<arch>.*` metadata with
 * llama.cpp's defaults, then binds every tensor by its llama.cpp name,
 * checking type and shape, so a forward pass can never index outside a
 * weight. Only 1-D tensors stored in f16/bf16 are copied (to f32); matrices
 * are used in place, fused ones (phi3's attn_qkv, ffn_up) as row views.
 *
 * The families differ from llama in a few switches (ModelConfig), set in
 * one place per family (read_family), so the forward pass stays one
 * function that reads like llama2.c's: embed, then per layer RMSNorm ->
 * QKV -> (Q/K norm) -> RoPE -> paged attention -> output projection (+ post
 * norm) + residual -> RMSNorm -> SwiGLU or GeGLU FFN (+ post norm) +
 * residual; final norm and logits only for the tokens that need them (the
 * last prompt token, each decoding token). */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define MAX_HEAD_DIM 512            /* rope's per-token angle buffer */

static const char *arch_names[] = {
    "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3",
};

#define N_ARCHS ((int) (sizeof(arch_names) / sizeof(arch_names[0])))


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

/* Reads "<arch>.<key>" as f32 into *out when present. */
static int hp_f32(const Model *m, const char *key, float *out, Err *err) {
    char name[128];

    snprintf(name, sizeof(name), "%s.%s", arch_names[m->c.arch], key);
    return gguf_get_f32(&m->gguf, name, out, err) < 0 ? -1 : 0;
}

static int read_arch(Model *m, Err *err) {
    GGUFStr a;
    char    list[128] = "";

    if (gguf_get_str(&m->gguf, "general.architecture", &a, err) != 0) {
        return err_set(err, "missing or invalid general.architecture");
    }
    for (int i = 0; i < N_ARCHS; i++) {
        if (gguf_str_eq(a, arch_names[i])) {
            m->c.arch = (Arch) i;
            return 0;
        }
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                 i ? ", " : "", arch_names[i]);
    }
    return err_set(err, "architecture '%.*s' is not supported (%s)",
                   (int) (a.len > 64 ? 64 : a.len), a.ptr, list);
}

/* YaRN's attention factor as llama_context computes it: mscale(factor)
 * cancelled by the 1 + 0.1 ln(factor) ggml's rope applies again, times
 * rope.scaling.attn_factor; float operations in its order. */
static float yarn_attn_factor(float freq_scale, float rope_attn_factor) {
    float factor = 1.0f / freq_scale;
    float a = factor <= 1.0f ? 1.0f : 0.1f * 1.0f * logf(factor) + 1.0f;

    a *= 1.0f / (1.0f + 0.1f * logf(factor));
    return a * rope_attn_factor;
}

/* llama.cpp's rope scaling: the type defaults to linear, so a factor alone
 * scales; none never does; yarn adds the ramp (ext_factor 1, betas 32 and
 * 1 over the original context). */
static int read_rope_scaling(Model *m, Err *err) {
    RopeParams *r = &m->c.rope;
    char        name[128];
    GGUFStr     type = { "linear", 6 };
    float       factor = 0.0f, attn = 1.0f;
    uint32_t    orig = (uint32_t) m->c.n_ctx;

    snprintf(name, sizeof(name), "%s.rope.scaling.type",
             arch_names[m->c.arch]);
    if (gguf_get_str(&m->gguf, name, &type, err) < 0
        || hp_f32(m, "rope.scaling.factor", &factor, err) != 0
        || hp_f32(m, "rope.scaling.attn_factor", &attn, err) != 0
        || hp_u32(m, "rope.scaling.original_context_length", false, &orig,
                  err) != 0)
    {
        return -1;
    }
    r->freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    r->attn_factor = attn;
    r->beta_fast = 32.0f;
    r->beta_slow = 1.0f;
    r->n_ctx_orig = (int) orig;
    if (gguf_str_eq(type, "none")) {
        r->freq_scale = 1.0f;
    } else if (gguf_str_eq(type, "yarn")) {
        r->ext_factor = 1.0f;
        r->attn_factor = yarn_attn_factor(r->freq_scale, attn);
    } else if (!gguf_str_eq(type, "linear")
               && !gguf_str_eq(type, "longrope"))
    {
        return err_set(err, "rope scaling '%.*s' is not supported (none, "
                       "linear, yarn, longrope, llama3 rope_freqs)",
                       (int) type.len, type.ptr);
    }
    return 0;
}

/* Sliding-window settings (llama.cpp's load_swa_pattern): the window,
 * the pattern (file or family default), and the local layers' RoPE base,
 * from rope.freq_base_swa or the default given. */
static int read_swa(Model *m, uint32_t n_swa, uint32_t pattern,
                    float base_swa, float scale_swa, Err *err)
{
    ModelConfig *c = &m->c;
    uint32_t     window = n_swa;

    if (hp_u32(m, "attention.sliding_window", false, &window, err) != 0
        || hp_u32(m, "attention.sliding_window_pattern", false, &pattern,
                  err) != 0)
    {
        return -1;
    }
    c->rope_swa.freq_base = base_swa;
    c->rope_swa.freq_scale = scale_swa;
    if (hp_f32(m, "rope.freq_base_swa", &c->rope_swa.freq_base, err) != 0) {
        return -1;
    }
    c->n_swa = window > (1u << 30) ? 1 << 30 : (int) window;
    c->swa_pattern = (int) pattern;
    return 0;
}

/* Gemma 2/3's query scale: 1/sqrt(dim/heads) for the 27B models
 * (recognised, as llama.cpp does, by their layer count), else
 * 1/sqrt(head_dim). */
static float gemma_q_scale(const ModelConfig *c, int layers_27b) {
    return c->n_layers == layers_27b
           ? 1.0f / sqrtf((float) (c->dim / c->n_heads))
           : 1.0f / sqrtf((float) c->head_dim);
}

/* The switches of each family, with llama.cpp's defaults for its keys. */
static int read_family(Model *m, Err *err) {
    ModelConfig *c = &m->c;
    uint32_t     n_swa = 0;

    c->rope_swa = c->rope;
    c->embed_scale = 1.0f;
    switch (c->arch) {
    case ARCH_QWEN2:
        c->qkv_bias = true;
        return 0;
    case ARCH_QWEN3:
        c->qk_norm = true;
        return 0;
    case ARCH_GEMMA:
        c->geglu = true;
        c->embed_scale = sqrtf((float) c->dim);
        c->q_scale = 1.0f / sqrtf((float) c->head_dim);
        return 0;
    case ARCH_GEMMA2:
        c->geglu = c->post_norms = true;
        c->embed_scale = sqrtf((float) c->dim);
        c->q_scale = gemma_q_scale(c, 46);
        c->attn_softcap = 50.0f;
        c->final_softcap = 30.0f;
        return hp_f32(m, "attn_logit_softcapping", &c->attn_softcap, err)
               || hp_f32(m, "final_logit_softcapping", &c->final_softcap,
                         err)
               || read_swa(m, 4096, 2, c->rope.freq_base,
                           c->rope.freq_scale, err) ? -1 : 0;
    case ARCH_GEMMA3:
        c->geglu = c->post_norms = c->qk_norm = true;
        c->embed_scale = sqrtf((float) c->dim);
        c->q_scale = gemma_q_scale(c, 62);
        if (hp_f32(m, "final_logit_softcapping", &c->final_softcap, err)
            || hp_u32(m, "attention.sliding_window", false, &n_swa, err))
        {
            return -1;
        }
        return n_swa > 0 ? read_swa(m, n_swa, 6, 10000.0f, 1.0f, err) : 0;
    case ARCH_PHI3:
        c->q_scale = 1.0f / sqrtf((float) c->head_dim);
        return 0;
    case ARCH_LLAMA:
        return 0;
    }
    return 0;
}

static int read_config(Model *m, Err *err) {
    ModelConfig *c = &m->c;
    uint32_t     ctx, dim, layers, ffn, heads, kv_heads = 0, key_len = 0;
    uint32_t     n_rot = 0, val_len = 0;

    if (read_arch(m, err) != 0
        || hp_u32(m, "context_length", true, &ctx, err) != 0
        || hp_u32(m, "embedding_length", true, &dim, err) != 0
        || hp_u32(m, "block_count", true, &layers, err) != 0
        || hp_u32(m, "feed_forward_length", true, &ffn, err) != 0
        || hp_u32(m, "attention.head_count", true, &heads, err) != 0
        || hp_u32(m, "attention.head_count_kv", false, &kv_heads, err) != 0
        || hp_u32(m, "attention.key_length", false, &key_len, err) != 0
        || hp_u32(m, "attention.value_length", false, &val_len, err) != 0
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
    val_len = val_len ? val_len : dim / heads;
    n_rot = n_rot ? n_rot : key_len;
    if (kv_heads > heads || heads % kv_heads != 0 || key_len % 2 != 0
        || key_len > MAX_HEAD_DIM || n_rot > key_len || n_rot % 2 != 0
        || val_len != key_len)
    {
        return err_set(err, "unsupported attention shape (heads %u, kv heads "
                       "%u, head dim %u, value dim %u, rope dims %u)", heads,
                       kv_heads, key_len, val_len, n_rot);
    }
    c->n_ctx = (int) (ctx > (1u << 20) ? 1u << 20 : ctx);
    c->dim = (int) dim;
    c->n_layers = (int) layers;
    c->ffn_dim = (int) ffn;
    c->n_heads = (int) heads;
    c->n_kv_heads = (int) kv_heads;
    c->head_dim = (int) key_len;
    c->norm_eps = 1e-5f;
    c->rope.mode = c->arch == ARCH_LLAMA ? ROPE_NORM : ROPE_NEOX;
    c->rope.n_rot = (int) n_rot;
    c->rope.freq_base = 10000.0f;
    if (hp_f32(m, "attention.layer_norm_rms_epsilon", &c->norm_eps, err) != 0
        || hp_f32(m, "rope.freq_base", &c->rope.freq_base, err) != 0
        || read_rope_scaling(m, err) != 0)
    {
        return -1;
    }
    return read_family(m, err);
}

bool model_layer_swa(const ModelConfig *c, int l) {
    if (c->n_swa <= 0) return false;
    return c->swa_pattern == 0 || l % c->swa_pattern < c->swa_pattern - 1;
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
    out->layout = WL_ROWS;
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

/* Rows [r0, r0 + rows) of w, as a matrix of its own (fused weights). */
static Matrix matrix_rows(const Matrix *w, int64_t r0, int64_t rows) {
    Matrix v = *w;

    v.rows = rows;
    v.data = (const char *) w->data + (size_t) r0 * w->row_bytes;
    return v;
}

/* blk.<l>.<name>, a 2-D weight of rows x cols. */
static int layer_matrix(const Model *m, int l, const char *name,
                        int64_t rows, int64_t cols, Matrix *out, Err *err)
{
    char n[96];

    snprintf(n, sizeof(n), "blk.%d.%s.weight", l, name);
    return bind_matrix(m, n, rows, cols, out, err);
}

/* blk.<l>.<name>, a 1-D vector of n, required unless optional. */
static int layer_vector(Model *m, int l, const char *name, int64_t n,
                        bool optional, const float **out, Err *err)
{
    char t[96];

    snprintf(t, sizeof(t), "blk.%d.%s", l, name);
    return bind_vector(m, t, n, optional, out, err);
}

/* Q, K, V: separate, or phi3's attn_qkv fused in that row order. */
static int bind_qkv(Model *m, int l, Err *err) {
    const ModelConfig *c = &m->c;
    LayerWeights      *L = &m->layers[l];
    int64_t            qd = (int64_t) c->n_heads * c->head_dim;
    int64_t            kvd = (int64_t) c->n_kv_heads * c->head_dim;
    char               n[64];
    Matrix             w;

    snprintf(n, sizeof(n), "blk.%d.attn_qkv.weight", l);
    if (gguf_find_tensor(&m->gguf, n) == NULL) {
        return layer_matrix(m, l, "attn_q", qd, c->dim, &L->wq, err) != 0
            || layer_matrix(m, l, "attn_k", kvd, c->dim, &L->wk, err) != 0
            || layer_matrix(m, l, "attn_v", kvd, c->dim, &L->wv, err) != 0
            ? -1 : 0;
    }
    if (bind_matrix(m, n, qd + 2 * kvd, c->dim, &w, err) != 0) return -1;
    L->wq = matrix_rows(&w, 0, qd);
    L->wk = matrix_rows(&w, qd, kvd);
    L->wv = matrix_rows(&w, qd + kvd, kvd);
    return 0;
}

/* Gate and up: separate, or phi3's ffn_up holding gate then up. */
static int bind_ffn(Model *m, int l, Err *err) {
    const ModelConfig *c = &m->c;
    LayerWeights      *L = &m->layers[l];
    Matrix             w;

    if (layer_matrix(m, l, "ffn_down", c->dim, c->ffn_dim, &L->w_down, err)
        != 0)
    {
        return -1;
    }
    if (c->arch != ARCH_PHI3) {
        return layer_matrix(m, l, "ffn_gate", c->ffn_dim, c->dim, &L->w_gate,
                            err) != 0
            || layer_matrix(m, l, "ffn_up", c->ffn_dim, c->dim, &L->w_up,
                            err) != 0 ? -1 : 0;
    }
    if (layer_matrix(m, l, "ffn_up", 2 * (int64_t) c->ffn_dim, c->dim, &w,
                     err) != 0)
    {
        return -1;
    }
    L->w_gate = matrix_rows(&w, 0, c->ffn_dim);
    L->w_up = matrix_rows(&w, c->ffn_dim, c->ffn_dim);
    return 0;
}

static int bind_layer(Model *m, int l, Err *err) {
    const ModelConfig *c = &m->c;
    LayerWeights      *L = &m->layers[l];
    int64_t            qd = (int64_t) c->n_heads * c->head_dim;
    int64_t            kvd = (int64_t) c->n_kv_heads * c->head_dim;
    bool               nb = !c->qkv_bias, nn = !c->qk_norm;
    bool               np = !c->post_norms;

    return layer_vector(m, l, "attn_norm.weight", c->dim, false,
                        &L->attn_norm, err) != 0
        || bind_qkv(m, l, err) != 0
        || layer_matrix(m, l, "attn_output", c->dim, qd, &L->wo, err) != 0
        || layer_vector(m, l, "ffn_norm.weight", c->dim, false, &L->ffn_norm,
                        err) != 0
        || bind_ffn(m, l, err) != 0
        || layer_vector(m, l, "attn_q.bias", qd, nb, &L->bq, err) != 0
        || layer_vector(m, l, "attn_k.bias", kvd, nb, &L->bk, err) != 0
        || layer_vector(m, l, "attn_v.bias", kvd, nb, &L->bv, err) != 0
        || layer_vector(m, l, "attn_q_norm.weight", c->head_dim, nn,
                        &L->q_norm, err) != 0
        || layer_vector(m, l, "attn_k_norm.weight", c->head_dim, nn,
                        &L->k_norm, err) != 0
        || layer_vector(m, l, "post_attention_norm.weight", c->dim, np,
                        &L->attn_post_norm, err) != 0
        || layer_vector(m, l, "post_ffw_norm.weight", c->dim, np,
                        &L->ffn_post_norm, err) != 0 ? -1 : 0;
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
    /* gemma and gemma2 always tie, whatever else the file holds */
    if (gguf_find_tensor(&m->gguf, "output.weight") != NULL
        && c->arch != ARCH_GEMMA && c->arch != ARCH_GEMMA2)
    {
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
                       &c->rope.freq_factors, err) != 0
        || bind_vector(m, "rope_factors_long.weight", c->rope.n_rot / 2,
                       true, &m->rope_long, err) != 0
        || bind_vector(m, "rope_factors_short.weight", c->rope.n_rot / 2,
                       true, &m->rope_short, err) != 0)
    {
        return -1;
    }
    if (c->rope.freq_factors == NULL) c->rope.freq_factors = m->rope_short;
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

typedef struct {
    const float **v;
    int64_t       n;
} VecRef;

/* Every 1-D tensor the ops read, to the device: a norm, bias or factor
 * set the file lacks stays NULL. The RoPE factors in use are one of the
 * others (or rope_freqs), so they find that copy. */
static int upload_vectors(Model *m, Backend *be, char *msg, size_t cap) {
    ModelConfig *c = &m->c;
    int64_t      qd = (int64_t) c->n_heads * c->head_dim;
    int64_t      kvd = (int64_t) c->n_kv_heads * c->head_dim;
    int64_t      nf = c->rope.n_rot / 2, nfs = c->rope_swa.n_rot / 2;
    VecRef       vs[9];
    int          k = 0;

    vs[k++] = (VecRef) { &m->output_norm, c->dim };
    vs[k++] = (VecRef) { &m->rope_long, nf };
    vs[k++] = (VecRef) { &m->rope_short, nf };
    vs[k++] = (VecRef) { &c->rope.freq_factors, nf };
    for (int i = 0; i < k; i++) {
        if (*vs[i].v != NULL && be->upload_f32(be, vs[i].v, vs[i].n, msg, cap)
                                != 0)
        {
            return -1;
        }
    }
    if (c->rope_swa.freq_factors != NULL
        && be->upload_f32(be, &c->rope_swa.freq_factors, nfs, msg, cap) != 0)
    {
        return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *L = &m->layers[l];

        k = 0;
        vs[k++] = (VecRef) { &L->attn_norm, c->dim };
        vs[k++] = (VecRef) { &L->ffn_norm, c->dim };
        vs[k++] = (VecRef) { &L->bq, qd };
        vs[k++] = (VecRef) { &L->bk, kvd };
        vs[k++] = (VecRef) { &L->bv, kvd };
        vs[k++] = (VecRef) { &L->q_norm, c->head_dim };
        vs[k++] = (VecRef) { &L->k_norm, c->head_dim };
        vs[k++] = (VecRef) { &L->attn_post_norm, c->dim };
        vs[k++] = (VecRef) { &L->ffn_post_norm, c->dim };
        for (int i = 0; i < k; i++) {
            if (*vs[i].v != NULL
                && be->upload_f32(be, vs[i].v, vs[i].n, msg, cap) != 0)
            {
                return -1;
            }
        }
    }
    return 0;
}

/* Every matrix, the embedding included (a tied output shares its copy). */
static int upload_matrices(Model *m, Backend *be, char *msg, size_t cap) {
    if (be->upload(be, &m->tok_embd, msg, cap) != 0
        || be->upload(be, &m->output, msg, cap) != 0)
    {
        return -1;
    }
    for (int l = 0; l < m->c.n_layers; l++) {
        LayerWeights *L = &m->layers[l];
        Matrix       *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo,
                               &L->w_gate, &L->w_up, &L->w_down };

        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
            if (be->upload(be, ws[i], msg, cap) != 0) return -1;
        }
    }
    return 0;
}

int model_place(Model *m, Backend *be, Err *err) {
    char msg[ERR_MAX];

    if (be->upload == NULL) {
        model_repack(m, be);
        return 0;
    }
    if (upload_matrices(m, be, msg, sizeof(msg)) != 0
        || upload_vectors(m, be, msg, sizeof(msg)) != 0)
    {
        return err_set(err, "%s", msg);
    }
    gguf_seal(&m->gguf);
    gguf_drop_data(&m->gguf);       /* the device holds every weight now */
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

void model_use_context(Model *m, int64_t n_ctx) {
    RopeParams *r = &m->c.rope;

    if (m->rope_long == NULL || (r->freq_factors != m->rope_long
                                 && r->freq_factors != m->rope_short))
    {
        return;                     /* rope_freqs win, as in llama.cpp */
    }
    r->freq_factors = n_ctx > r->n_ctx_orig ? m->rope_long : m->rope_short;
}

void model_free(Model *m) {
    for (int i = 0; i < m->n_copies; i++) free(m->f32_copies[i]);
    free(m->f32_copies);
    free(m->layers);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof(*m));
}


/* ---- Activations ------------------------------------------------------- */

/* The widest activation row: max(dim, n_heads*head_dim, ffn_dim). */
static int64_t runstate_wide(const ModelConfig *c) {
    int64_t qd = (int64_t) c->n_heads * c->head_dim;
    int64_t wide = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;

    return wide > qd ? wide : qd;
}

/* Floats of the buffers, all in one allocation. */
static int64_t runstate_floats(const ModelConfig *c, int64_t max_tokens,
                               int64_t max_out)
{
    int64_t qd = (int64_t) c->n_heads * c->head_dim;
    int64_t kvd = (int64_t) c->n_kv_heads * c->head_dim;
    int64_t wide = runstate_wide(c);

    return max_tokens * (c->dim + wide + qd + 2 * kvd + 2 * wide)
           + max_out * ((int64_t) c->dim + c->n_vocab);
}

uint64_t runstate_bytes(const ModelConfig *c, int64_t max_tokens,
                        int64_t max_out)
{
    return ((uint64_t) runstate_floats(c, max_tokens, max_out)
            * sizeof(float) + 63) / 64 * 64;
}

int runstate_init(RunState *s, const ModelConfig *c, int64_t max_tokens,
                  int64_t max_out, Backend *be, Err *err)
{
    int64_t qd = (int64_t) c->n_heads * c->head_dim;
    int64_t kvd = (int64_t) c->n_kv_heads * c->head_dim;
    int64_t wide = runstate_wide(c);
    size_t  bytes = runstate_bytes(c, max_tokens, max_out);
    float  *p;

    memset(s, 0, sizeof(*s));
    s->be = be != NULL && be->alloc != NULL ? be : NULL;
    s->mem = s->be != NULL ? s->be->alloc(s->be, bytes)
                           : aligned_alloc(64, bytes);
    if (s->be != NULL && s->mem != NULL) {
        s->logits_host = malloc((size_t) max_out * (size_t) c->n_vocab
                                * sizeof(float));
    }
    if (s->mem == NULL || (s->be != NULL && s->logits_host == NULL)) {
        runstate_free(s);
        return err_set(err, "out of %s memory allocating activations for %"
                       PRId64 " tokens (%.1f MiB)", be != NULL
                       && be->alloc != NULL ? "device" : "host", max_tokens,
                       (double) bytes / 1048576.0);
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
    if (s->be == NULL) s->logits_host = s->logits;
    return 0;
}

void runstate_free(RunState *s) {
    if (s->be != NULL) {
        s->be->release(s->be, s->mem);
        free(s->logits_host);
    } else {
        free(s->mem);
    }
    memset(s, 0, sizeof(*s));
}

float *runstate_logits_row(RunState *s, int64_t row, int64_t n_vocab) {
    float *dst = s->logits_host + row * n_vocab;

    if (s->be != NULL) {
        s->be->to_host(s->be, dst, s->logits + row * n_vocab, n_vocab);
    }
    return dst;
}


/* ---- Forward ----------------------------------------------------------- */

/* Layer l's attention scores: scaled here, or by q_scale on the queries
 * (gemma, phi3: ggml scales Q first, so do we, for the same rounding);
 * soft-capping divides by the cap first, as ggml's graph does. */
static AttnParams layer_attn(const ModelConfig *c, int l) {
    AttnParams p = { 1.0f / sqrtf((float) c->head_dim), 0.0f, 0 };

    if (c->q_scale > 0.0f) p.scale = 1.0f;
    if (c->attn_softcap > 0.0f) {
        p.scale = 1.0f / c->attn_softcap;
        p.softcap = c->attn_softcap;
    }
    if (model_layer_swa(c, l)) p.window = c->n_swa;
    return p;
}

/* Q/K/V projections (+ biases, per-head norms, query scale) and RoPE. */
static void forward_qkv(const Model *m, Backend *be, RunState *s,
                        const TokenBatch *b, int l)
{
    const ModelConfig  *c = &m->c;
    const LayerWeights *L = &m->layers[l];
    const RopeParams   *rope = model_layer_swa(c, l) ? &c->rope_swa
                                                     : &c->rope;
    int64_t             n = b->n;
    int64_t             kvd = (int64_t) c->n_kv_heads * c->head_dim;
    float *const        outs[] = { s->q, s->k, s->v };
    const Matrix *const ws[] = { &L->wq, &L->wk, &L->wv };

    be->matmul_n(be, outs, s->xb, n, ws, 3);
    if (L->bq != NULL) {
        be->add_bias(be, s->q, L->bq, n, L->wq.rows);
        be->add_bias(be, s->k, L->bk, n, kvd);
        be->add_bias(be, s->v, L->bv, n, kvd);
    }
    if (L->q_norm != NULL) {
        be->rmsnorm(be, s->q, s->q, L->q_norm, n * c->n_heads, c->head_dim,
                    c->norm_eps);
        be->rmsnorm(be, s->k, s->k, L->k_norm, n * c->n_kv_heads,
                    c->head_dim, c->norm_eps);
    }
    be->rope(be, s->q, n, c->n_heads, c->head_dim, b->pos, rope);
    be->rope(be, s->k, n, c->n_kv_heads, c->head_dim, b->pos, rope);
    if (c->q_scale > 0.0f) {
        be->scale(be, s->q, n * c->n_heads * c->head_dim, c->q_scale);
    }
}

void model_forward(const Model *m, Backend *be, const KVCache *kv,
                   RunState *s, const int32_t *tokens, const TokenBatch *b,
                   const int32_t *out_idx, int64_t n_out)
{
    const ModelConfig *c = &m->c;
    int64_t            n = b->n, dim = c->dim;

    if (be->begin != NULL) {
        /* the buffers a recorded graph would hold: these allocations */
        be->begin(be, tokens, b, out_idx, n_out,
                  (uint64_t) (uintptr_t) s->mem * 31
                  + (uint64_t) (uintptr_t) kv->mem);
    }
    be->embed(be, s->x, &m->tok_embd, tokens, n);
    if (c->embed_scale != 1.0f) be->scale(be, s->x, n * dim, c->embed_scale);

    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &m->layers[l];
        const KVLayer      *kvl = &kv->layers[l];
        AttnParams          ap = layer_attn(c, l);

        /* attention: norm, q/k/v (+ biases, q/k norms), rope */
        be->rmsnorm(be, s->xb, s->x, L->attn_norm, n, dim, c->norm_eps);
        forward_qkv(m, be, s, b, l);

        /* paged attention over earlier positions (or the window's), output
           projection (+ post norm), residual */
        be->kv_store(be, kvl, s->k, s->v, b);
        be->attention(be, s->xb, s->q, c->n_heads, kvl, b, &ap);
        be->matmul(be, s->hb2, s->xb, n, &L->wo);
        if (L->attn_post_norm != NULL) {
            be->rmsnorm(be, s->hb2, s->hb2, L->attn_post_norm, n, dim,
                        c->norm_eps);
        }
        be->add(be, s->x, s->hb2, n, dim);

        /* feed-forward: norm, SwiGLU or GeGLU, down (+ post norm),
           residual */
        be->rmsnorm(be, s->xb, s->x, L->ffn_norm, n, dim, c->norm_eps);
        {
            float *const        outs[] = { s->hb, s->hb2 };
            const Matrix *const ws[] = { &L->w_gate, &L->w_up };

            be->matmul_n(be, outs, s->xb, n, ws, 2);
        }
        if (c->geglu) {
            be->geglu(be, s->hb, s->hb, s->hb2, n * c->ffn_dim);
        } else {
            be->swiglu(be, s->hb, s->hb, s->hb2, n * c->ffn_dim);
        }
        be->matmul(be, s->xb, s->hb, n, &L->w_down);
        if (L->ffn_post_norm != NULL) {
            be->rmsnorm(be, s->xb, s->xb, L->ffn_post_norm, n, dim,
                        c->norm_eps);
        }
        be->add(be, s->x, s->xb, n, dim);
    }

    /* final norm and logits, only for the rows asked for */
    be->gather(be, s->xo, s->x, out_idx, n_out, dim);
    be->rmsnorm(be, s->xo, s->xo, m->output_norm, n_out, dim, c->norm_eps);
    be->matmul(be, s->logits, s->xo, n_out, &m->output);
    if (c->final_softcap > 0.0f) {
        be->softcap(be, s->logits, n_out * c->n_vocab, c->final_softcap);
    }
    if (be->end != NULL) be->end(be);
}

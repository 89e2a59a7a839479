/* make_model.c -- see make_model.h.
 *
 * The writer declares every tensor first (the header carries all tensor
 * infos), then generates and writes them one at a time, so memory use is
 * one tensor in its stored type plus one f32 row, even for a multi-GB file.
 * The file is written under a temporary name and renamed at the end, so a
 * failed run never leaves a truncated model behind. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "make_model.h"

#define N_LAYER_TENSORS 16

typedef enum {
    FILL_RANDOM,            // normal, std p->std
    FILL_NORM,              // normal around 1, std 0.1
} Fill;

typedef struct {
    char    name[64];
    DType   type;
    int     n_dims;
    int64_t ne[2];
    Fill    fill;
} TensorSpec;

typedef struct {
    uint64_t s;
} Rng;

/* The shape of the file being written, derived once from the params. */
typedef struct {
    const MakeModelParams *p;
    int64_t hd, qd, kvd;        // head dim, Q rows, K/V rows
    int     n_rot;
    int     swa;                // window written, 0 = none
    bool    bias, qk_norm, post_norms, fused, tied, gemma;
} Shape;

/* splitmix64: tiny, seeds well, plenty for weights */
static uint64_t rng_next(Rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Approximately normal with the given std: the sum of four uniforms
 * (Irwin-Hall) is close enough for weights and an order of magnitude
 * cheaper than Box-Muller over a billion draws. */
static float rng_normal(Rng *r, float std) {
    uint64_t v = rng_next(r);
    float    s = 0.0f;

    for (int i = 0; i < 4; i++) s += (float) ((v >> (16 * i)) & 0xffff);
    s = s / 65536.0f - 2.0f;            /* mean 0, std sqrt(1/3) */
    return s * (std / 0.57735027f);
}

static const char *archs[] = {
    "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3",
};

static bool is_arch(const MakeModelParams *p, const char *a) {
    return strcmp(p->arch, a) == 0;
}

static void shape_init(Shape *sh, const MakeModelParams *p) {
    bool g2 = is_arch(p, "gemma2"), g3 = is_arch(p, "gemma3");

    sh->p = p;
    sh->hd = p->head_dim > 0 ? p->head_dim
             : p->heads > 0 ? p->dim / p->heads : 0;
    sh->qd = sh->hd * p->heads;
    sh->kvd = sh->hd * p->kv_heads;
    sh->n_rot = p->rope_dims > 0 ? p->rope_dims : (int) sh->hd;
    sh->swa = p->swa > 0 ? p->swa : g2 ? 4096 : 0;
    sh->gemma = is_arch(p, "gemma") || g2 || g3;
    sh->bias = is_arch(p, "qwen2");
    sh->qk_norm = is_arch(p, "qwen3") || g3;
    sh->post_norms = g2 || g3;
    sh->fused = is_arch(p, "phi3");
    /* gemma and gemma2 always tie in llama.cpp */
    sh->tied = p->tied || is_arch(p, "gemma") || g2;
}

static int check_params(const MakeModelParams *p, const Shape *sh,
                        Err *err)
{
    int64_t blk = dtype_block(p->type);
    bool    known = false;

    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        known |= is_arch(p, archs[i]);
    }
    if (!known) {
        return err_set(err, "--arch must be llama, qwen2, qwen3, gemma, "
                       "gemma2, gemma3 or phi3, not '%s'", p->arch);
    }
    if (p->dim <= 0 || p->layers <= 0 || p->heads <= 0 || p->kv_heads <= 0
        || p->ffn <= 0 || p->ctx <= 0)
    {
        return err_set(err, "--dim, --layers, --heads, --kv-heads, --ffn and "
                       "--ctx must be positive");
    }
    if ((p->head_dim <= 0 && p->dim % p->heads != 0) || sh->hd % 2 != 0) {
        return err_set(err, "--dim %d must be a multiple of --heads %d with "
                       "an even head size", p->dim, p->heads);
    }
    if (sh->n_rot % 2 != 0 || sh->n_rot > sh->hd) {
        return err_set(err, "--rope-dims must be even and at most the head "
                       "size");
    }
    if (p->heads % p->kv_heads != 0) {
        return err_set(err, "--kv-heads %d must divide --heads %d",
                       p->kv_heads, p->heads);
    }
    if (p->dim % blk != 0 || p->ffn % blk != 0 || sh->qd % blk != 0) {
        return err_set(err, "--dim and --ffn must be multiples of %" PRId64
                       " for %s", blk, dtype_name(p->type));
    }
    if (p->rope_scaling != NULL && strcmp(p->rope_scaling, "linear") != 0
        && strcmp(p->rope_scaling, "yarn") != 0)
    {
        return err_set(err, "--rope-scaling must be linear or yarn");
    }
    return 0;
}

static void spec(TensorSpec *t, const char *name, DType type, int64_t ne0,
                 int64_t ne1, Fill fill)
{
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->type = type;
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->fill = fill;
}

/* One layer's tensors, in llama.cpp's names; returns the count. */
static int list_layer(const Shape *sh, int l, TensorSpec *ts) {
    const MakeModelParams *p = sh->p;
    DType                  t = p->type;
    char                   n[64];
    int                    k = 0;

#define LT(suffix, type, ne0, ne1, fill)                                      \
    snprintf(n, sizeof(n), "blk.%d." suffix, l);                              \
    spec(&ts[k++], n, type, ne0, ne1, fill)
    LT("attn_norm.weight", DT_F32, p->dim, 0, FILL_NORM);
    if (sh->fused) {
        LT("attn_qkv.weight", t, p->dim, sh->qd + 2 * sh->kvd, FILL_RANDOM);
    } else {
        LT("attn_q.weight", t, p->dim, sh->qd, FILL_RANDOM);
        LT("attn_k.weight", t, p->dim, sh->kvd, FILL_RANDOM);
        LT("attn_v.weight", t, p->dim, sh->kvd, FILL_RANDOM);
    }
    if (sh->bias) {
        LT("attn_q.bias", DT_F32, sh->qd, 0, FILL_RANDOM);
        LT("attn_k.bias", DT_F32, sh->kvd, 0, FILL_RANDOM);
        LT("attn_v.bias", DT_F32, sh->kvd, 0, FILL_RANDOM);
    }
    if (sh->qk_norm) {
        LT("attn_q_norm.weight", DT_F32, sh->hd, 0, FILL_NORM);
        LT("attn_k_norm.weight", DT_F32, sh->hd, 0, FILL_NORM);
    }
    LT("attn_output.weight", t, sh->qd, p->dim, FILL_RANDOM);
    if (sh->post_norms) {
        LT("post_attention_norm.weight", DT_F32, p->dim, 0, FILL_NORM);
    }
    LT("ffn_norm.weight", DT_F32, p->dim, 0, FILL_NORM);
    if (sh->fused) {
        LT("ffn_up.weight", t, p->dim, 2 * (int64_t) p->ffn, FILL_RANDOM);
    } else {
        LT("ffn_gate.weight", t, p->dim, p->ffn, FILL_RANDOM);
        LT("ffn_up.weight", t, p->dim, p->ffn, FILL_RANDOM);
    }
    LT("ffn_down.weight", t, p->ffn, p->dim, FILL_RANDOM);
    if (sh->post_norms) {
        LT("post_ffw_norm.weight", DT_F32, p->dim, 0, FILL_NORM);
    }
#undef LT
    return k;
}

/* Lists every tensor of the model in file order; returns the count. */
static int list_tensors(const Shape *sh, int64_t n_vocab, TensorSpec *ts) {
    const MakeModelParams *p = sh->p;
    int                    k = 0;

    spec(&ts[k++], "token_embd.weight", p->type, p->dim, n_vocab,
         FILL_RANDOM);
    spec(&ts[k++], "output_norm.weight", DT_F32, p->dim, 0, FILL_NORM);
    if (!sh->tied) {
        spec(&ts[k++], "output.weight", p->type, p->dim, n_vocab,
             FILL_RANDOM);
    }
    if (sh->fused && p->rope_factors) {
        spec(&ts[k++], "rope_factors_long.weight", DT_F32, sh->n_rot / 2, 0,
             FILL_NORM);
        spec(&ts[k++], "rope_factors_short.weight", DT_F32, sh->n_rot / 2,
             0, FILL_NORM);
    }
    for (int l = 0; l < p->layers; l++) k += list_layer(sh, l, ts + k);
    return k;
}

/* Fills one tensor's data in its stored type. row is f32 scratch of ne[0].
 * Norm-like vectors are drawn around 1, kept positive. */
static void fill_tensor(const TensorSpec *t, Rng *rng, float std, void *data,
                        float *row)
{
    size_t rb = dtype_row_bytes(t->type, t->ne[0]);

    for (int64_t r = 0; r < t->ne[1]; r++) {
        char *dst = (char *) data + (size_t) r * rb;

        for (int64_t i = 0; i < t->ne[0]; i++) {
            row[i] = t->fill == FILL_NORM
                     ? fmaxf(0.05f, 1.0f + rng_normal(rng, 0.1f))
                     : rng_normal(rng, std);
        }
        quantize_row(t->type, row, dst, t->ne[0]);
    }
}

static uint32_t file_type(DType t) {
    switch (t) {
    case DT_F32:  return 0;
    case DT_F16:  return 1;
    case DT_Q4_0: return 2;
    case DT_Q8_0: return 7;
    case DT_BF16: return 32;
    default:      break;
    }
    return 0;
}

/* The family's own keys, with the values its converter writes. */
static void write_family_keys(GGUFWriter *w, const Shape *sh) {
    const MakeModelParams *p = sh->p;
    char                   key[96];

#define HP(suffix, fn, v)                                                     \
    snprintf(key, sizeof(key), "%s." suffix, p->arch);                        \
    fn(w, key, v)
    if (sh->gemma || p->head_dim > 0) {
        HP("attention.key_length", gguf_writer_u32, (uint32_t) sh->hd);
        HP("attention.value_length", gguf_writer_u32, (uint32_t) sh->hd);
    }
    if (sh->fused || p->rope_dims > 0) {
        HP("rope.dimension_count", gguf_writer_u32, (uint32_t) sh->n_rot);
    }
    if (is_arch(p, "gemma2")) {
        HP("attn_logit_softcapping", gguf_writer_f32, 50.0f);
        HP("final_logit_softcapping", gguf_writer_f32, 30.0f);
    }
    if (sh->swa > 0 && (is_arch(p, "gemma2") || is_arch(p, "gemma3"))) {
        HP("attention.sliding_window", gguf_writer_u32, (uint32_t) sh->swa);
    }
    if (p->rope_scaling != NULL) {
        HP("rope.scaling.type", gguf_writer_str, p->rope_scaling);
        HP("rope.scaling.factor", gguf_writer_f32, p->rope_factor);
        HP("rope.scaling.original_context_length", gguf_writer_u32,
           (uint32_t) (p->ctx / (p->rope_factor > 1.0f ? p->rope_factor
                                                       : 1.0f)));
    } else if (sh->fused && p->rope_factors) {
        HP("rope.scaling.attn_factor", gguf_writer_f32, 1.19f);
        HP("rope.scaling.original_context_length", gguf_writer_u32,
           (uint32_t) p->ctx);
    }
#undef HP
}

static void write_metadata(GGUFWriter *w, const Shape *sh, const GGUF *vocab)
{
    const MakeModelParams *p = sh->p;
    char                   key[96];
    bool                   big_base = is_arch(p, "qwen2")
                                      || is_arch(p, "qwen3")
                                      || is_arch(p, "gemma3");

    gguf_writer_str(w, "general.architecture", p->arch);
    gguf_writer_str(w, "general.name", "omni random weights");
    gguf_writer_u32(w, "general.file_type", file_type(p->type));
#define HP(suffix, fn, v)                                                     \
    snprintf(key, sizeof(key), "%s." suffix, p->arch);                        \
    fn(w, key, v)
    HP("context_length", gguf_writer_u32, (uint32_t) p->ctx);
    HP("embedding_length", gguf_writer_u32, (uint32_t) p->dim);
    HP("block_count", gguf_writer_u32, (uint32_t) p->layers);
    HP("feed_forward_length", gguf_writer_u32, (uint32_t) p->ffn);
    HP("attention.head_count", gguf_writer_u32, (uint32_t) p->heads);
    HP("attention.head_count_kv", gguf_writer_u32, (uint32_t) p->kv_heads);
    HP("attention.layer_norm_rms_epsilon", gguf_writer_f32,
       sh->gemma ? 1e-6f : 1e-5f);
    HP("rope.freq_base", gguf_writer_f32, big_base ? 1000000.0f : 10000.0f);
#undef HP
    write_family_keys(w, sh);
    for (uint64_t i = 0; i < vocab->n_kv; i++) {
        const GGUFKV *kv = &vocab->kv[i];

        bool tmpl = kv->key.len == 23
                    && memcmp(kv->key.ptr, "tokenizer.chat_template", 23) == 0;

        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0
            && !(tmpl && p->chat_template != NULL))
        {
            gguf_writer_copy_kv(w, kv);
        }
    }
    if (p->chat_template != NULL) {
        gguf_writer_str(w, "tokenizer.chat_template", p->chat_template);
    }
}

static int write_model(const Shape *sh, const GGUF *vocab, int64_t n_vocab,
                       FILE *f, Err *err)
{
    const MakeModelParams *p = sh->p;
    int         n_max = 5 + N_LAYER_TENSORS * p->layers, n;
    float       std = p->std > 0.0f ? p->std : 0.02f;
    TensorSpec *ts = calloc((size_t) n_max, sizeof(TensorSpec));
    GGUFWriter  w;
    uint64_t    max_bytes = 0;
    int64_t     max_row = 0;
    void       *data = NULL;
    float      *row = NULL;
    Rng         rng = { p->seed };
    int         rc = -1;

    gguf_writer_init(&w);
    if (ts == NULL) goto oom;
    write_metadata(&w, sh, vocab);
    n = list_tensors(sh, n_vocab, ts);
    for (int i = 0; i < n; i++) {
        uint64_t b = gguf_writer_tensor(&w, ts[i].name, ts[i].type,
                                        ts[i].n_dims, ts[i].ne);
        max_bytes = b > max_bytes ? b : max_bytes;
        max_row = ts[i].ne[0] > max_row ? ts[i].ne[0] : max_row;
    }
    data = malloc(max_bytes);
    row = malloc((size_t) max_row * sizeof(float));
    if (data == NULL || row == NULL) goto oom;
    if (gguf_writer_write_header(&w, f, err) != 0) goto done;
    for (int i = 0; i < n; i++) {
        fill_tensor(&ts[i], &rng, std, data, row);
        if (gguf_writer_write_data(&w, f, data, err) != 0) goto done;
    }
    rc = 0;
    goto done;

oom:
    err_set(err, "out of memory");
done:
    free(ts);
    free(data);
    free(row);
    gguf_writer_free(&w);
    return rc;
}

int make_model(const MakeModelParams *p, Err *err) {
    GGUF          vocab;
    const GGUFKV *tokens;
    char          tmp[4096];
    FILE         *f;
    int           rc;
    Shape         sh;

    shape_init(&sh, p);
    if (check_params(p, &sh, err) != 0) return -1;
    if (gguf_open(&vocab, p->vocab_from, err) != 0) return -1;
    if (gguf_get_arr(&vocab, "tokenizer.ggml.tokens", GGUF_STRING, &tokens,
                     err) != 0 || tokens->count == 0)
    {
        gguf_close(&vocab);
        return err_set(err, "%s: no tokenizer.ggml.tokens to copy the "
                       "vocabulary from", p->vocab_from);
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", p->out, (int) getpid());
    f = fopen(tmp, "wb");
    if (f == NULL) {
        gguf_close(&vocab);
        return err_set(err, "%s: cannot create: %m", tmp);
    }
    rc = write_model(&sh, &vocab, (int64_t) tokens->count, f, err);
    if (fclose(f) != 0 && rc == 0) rc = err_set(err, "%s: write failed: %m",
                                                tmp);
    if (rc == 0 && rename(tmp, p->out) != 0) {
        rc = err_set(err, "%s: cannot rename to %s: %m", tmp, p->out);
    }
    if (rc != 0) unlink(tmp);
    gguf_close(&vocab);
    return rc;
}

/* make_model.c -- see make_model.h.
 *
 * The writer declares every tensor first (the header carries all tensor
 * infos), then generates and writes them one at a time, so memory use is
 * one tensor in its stored type plus one f32 row, even for a multi-GB file.
 * The file is written under a temporary name and renamed at the end, so a
 * failed run never leaves a truncated model behind. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "make_model.h"

#define N_LAYER_TENSORS 12

typedef struct {
    char    name[64];
    DType   type;
    int     n_dims;
    int64_t ne[2];
    float   fill;           // 1-D norms: constant; otherwise random
} TensorSpec;

typedef struct {
    uint64_t s;
} Rng;

/* splitmix64: tiny, seeds well, plenty for weights */
static uint64_t rng_next(Rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Approximately normal with std 0.02: the sum of four uniforms (Irwin-Hall)
 * is close enough for weights and an order of magnitude cheaper than
 * Box-Muller over a billion draws. */
static float rng_weight(Rng *r) {
    uint64_t v = rng_next(r);
    float    s = 0.0f;

    for (int i = 0; i < 4; i++) s += (float) ((v >> (16 * i)) & 0xffff);
    s = s / 65536.0f - 2.0f;            /* mean 0, std sqrt(1/3) */
    return s * (0.02f / 0.57735027f);
}

static int check_params(const MakeModelParams *p, Err *err) {
    int64_t blk = dtype_block(p->type);

    if (strcmp(p->arch, "llama") != 0 && strcmp(p->arch, "qwen2") != 0) {
        return err_set(err, "--arch must be llama or qwen2, not '%s'", p->arch);
    }
    if (p->dim <= 0 || p->layers <= 0 || p->heads <= 0 || p->kv_heads <= 0
        || p->ffn <= 0 || p->ctx <= 0)
    {
        return err_set(err, "--dim, --layers, --heads, --kv-heads, --ffn and "
                       "--ctx must be positive");
    }
    if (p->dim % p->heads != 0 || (p->dim / p->heads) % 2 != 0) {
        return err_set(err, "--dim %d must be a multiple of --heads %d with "
                       "an even head size", p->dim, p->heads);
    }
    if (p->heads % p->kv_heads != 0) {
        return err_set(err, "--kv-heads %d must divide --heads %d",
                       p->kv_heads, p->heads);
    }
    if (p->dim % blk != 0 || p->ffn % blk != 0) {
        return err_set(err, "--dim and --ffn must be multiples of %" PRId64
                       " for %s", blk, dtype_name(p->type));
    }
    return 0;
}

static void spec(TensorSpec *t, const char *name, DType type, int64_t ne0,
                 int64_t ne1, float fill)
{
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->type = type;
    t->n_dims = ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->fill = fill;
}

/* Lists every tensor of the model in file order; returns the count. */
static int list_tensors(const MakeModelParams *p, int64_t n_vocab,
                        TensorSpec *ts)
{
    int64_t kvd = (int64_t) p->dim / p->heads * p->kv_heads;
    bool    bias = strcmp(p->arch, "qwen2") == 0;
    char    n[64];
    int     k = 0;

    spec(&ts[k++], "token_embd.weight", p->type, p->dim, n_vocab, 0);
    spec(&ts[k++], "output_norm.weight", DT_F32, p->dim, 0, 1.0f);
    if (!p->tied) spec(&ts[k++], "output.weight", p->type, p->dim, n_vocab, 0);
    for (int l = 0; l < p->layers; l++) {
#define LT(suffix, type, ne0, ne1, fill)                                      \
        snprintf(n, sizeof(n), "blk.%d." suffix, l);                          \
        spec(&ts[k++], n, type, ne0, ne1, fill)
        LT("attn_norm.weight", DT_F32, p->dim, 0, 1.0f);
        LT("attn_q.weight", p->type, p->dim, p->dim, 0);
        LT("attn_k.weight", p->type, p->dim, kvd, 0);
        LT("attn_v.weight", p->type, p->dim, kvd, 0);
        if (bias) {
            LT("attn_q.bias", DT_F32, p->dim, 0, 0);
            LT("attn_k.bias", DT_F32, kvd, 0, 0);
            LT("attn_v.bias", DT_F32, kvd, 0, 0);
        }
        LT("attn_output.weight", p->type, p->dim, p->dim, 0);
        LT("ffn_norm.weight", DT_F32, p->dim, 0, 1.0f);
        LT("ffn_gate.weight", p->type, p->dim, p->ffn, 0);
        LT("ffn_up.weight", p->type, p->dim, p->ffn, 0);
        LT("ffn_down.weight", p->type, p->ffn, p->dim, 0);
#undef LT
    }
    return k;
}

/* Fills one tensor's data in its stored type. row is f32 scratch of ne[0]. */
static void fill_tensor(const TensorSpec *t, Rng *rng, void *data, float *row)
{
    size_t rb = dtype_row_bytes(t->type, t->ne[0]);

    for (int64_t r = 0; r < t->ne[1]; r++) {
        char *dst = (char *) data + (size_t) r * rb;

        for (int64_t i = 0; i < t->ne[0]; i++) {
            row[i] = t->fill != 0.0f ? t->fill : rng_weight(rng);
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

static void write_metadata(GGUFWriter *w, const MakeModelParams *p,
                           const GGUF *vocab)
{
    char key[96];
    bool qwen = strcmp(p->arch, "qwen2") == 0;

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
    HP("attention.layer_norm_rms_epsilon", gguf_writer_f32, 1e-5f);
    HP("rope.freq_base", gguf_writer_f32, qwen ? 1000000.0f : 10000.0f);
#undef HP
    for (uint64_t i = 0; i < vocab->n_kv; i++) {
        const GGUFKV *kv = &vocab->kv[i];

        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0) {
            gguf_writer_copy_kv(w, kv);
        }
    }
}

static int write_model(const MakeModelParams *p, const GGUF *vocab,
                       int64_t n_vocab, FILE *f, Err *err)
{
    int         n_max = 3 + N_LAYER_TENSORS * p->layers, n;
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
    write_metadata(&w, p, vocab);
    n = list_tensors(p, n_vocab, ts);
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
        fill_tensor(&ts[i], &rng, data, row);
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

    if (check_params(p, err) != 0) return -1;
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
    rc = write_model(p, &vocab, (int64_t) tokens->count, f, err);
    if (fclose(f) != 0 && rc == 0) rc = err_set(err, "%s: write failed: %m",
                                                tmp);
    if (rc == 0 && rename(tmp, p->out) != 0) {
        rc = err_set(err, "%s: cannot rename to %s: %m", tmp, p->out);
    }
    if (rc != 0) unlink(tmp);
    gguf_close(&vocab);
    return rc;
}

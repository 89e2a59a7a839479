/* llama-top-logits.c -- llama.cpp's side of `omni-engine generate
 * --top-logits K`, for t/data/make-reference (not part of the engine):
 * greedy generation exactly as llama.cpp's llama-simple runs it (BOS +
 * prompt with special tokens parsed, n_ctx = prompt + n_predict - 1, one
 * batch for the prompt, the greedy sampler: first best logit, default
 * context parameters), printing one JSON line per step on stdout in the
 * engine's format: step, pos, token, piece, logit, top (K best), margin;
 * plus "eog": true on an end-of-generation token, where it stops. Its text
 * with the defaults equals llama-simple's (make-reference checks). The
 * prompt's token ids go to stderr.
 *
 *   llama-top-logits MODEL N_PREDICT K PROMPT
 *   LLAMA_FA=auto|on|off   flash attention (default: llama-simple's auto)
 *   LLAMA_KV=f16|f32       KV cache type (default: llama-simple's f16)
 *   LLAMA_REPACK=off       weights as stored (default: llama-simple's
 *                          repacking for the CPU's kernels, on)
 *
 * Build against a llama.cpp build tree (not part of the engine's build):
 *   cc -O2 -o llama-top-logits t/data/llama-top-logits.c \
 *      -I$SRC/include -I$SRC/ggml/include -L$BUILD/bin -lllama -lggml \
 *      -lggml-base -Wl,-rpath,$BUILD/bin */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

typedef struct {
    int   id;
    float logit;
} Cand;

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void) ud;
    if (level >= GGML_LOG_LEVEL_WARN || getenv("LLAMA_VERBOSE") != NULL) {
        fputs(text, stderr);
    }
}

static void put_str(const char *s, int n) {
    putchar('"');
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s[i];

        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void put_piece(const struct llama_vocab *v, int id) {
    char buf[256];
    int  n = llama_token_to_piece(v, id, buf, sizeof(buf), 0, true);

    put_str(buf, n < 0 ? 0 : n);
}

static void put_float(double x) {
    if (isfinite(x)) printf("%.9g", x);
    else fputs("null", stdout);
}

/* The k best, higher logit first, lower id on ties (greedy's order). */
static void top_k(const float *l, int n, Cand *top, int k) {
    int m = 0;

    for (int i = 0; i < n; i++) {
        int j;

        if (m == k && !(l[i] > top[k - 1].logit)) continue;
        j = m < k ? m++ : k - 1;
        for (; j > 0 && l[i] > top[j - 1].logit; j--) top[j] = top[j - 1];
        top[j] = (Cand) { i, l[i] };
    }
}

int main(int argc, char **argv) {
    const char *fa = getenv("LLAMA_FA"), *kv = getenv("LLAMA_KV");
    const char *repack = getenv("LLAMA_REPACK");
    struct llama_model_params mp = llama_model_default_params();

    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL N_PREDICT K PROMPT\n", argv[0]);
        return 1;
    }
    int n_predict = atoi(argv[2]), k = atoi(argv[3]);
    const char *prompt = argv[4];

    llama_log_set(quiet, NULL);
    ggml_backend_load_all();
    if (repack != NULL && strcmp(repack, "off") == 0) {
        mp.use_extra_bufts = false;
    }
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (model == NULL) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    int n_prompt = -llama_tokenize(vocab, prompt, strlen(prompt), NULL, 0,
                                   true, true);
    llama_token *toks = malloc(sizeof(llama_token) * n_prompt);
    llama_tokenize(vocab, prompt, strlen(prompt), toks, n_prompt, true, true);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_prompt + n_predict - 1;
    cp.n_batch = n_prompt;
    if (fa != NULL && strcmp(fa, "on") == 0) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    } else if (fa != NULL && strcmp(fa, "off") == 0) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    if (kv != NULL && strcmp(kv, "f32") == 0) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) return 1;

    fprintf(stderr, "prompt tokens:");
    for (int i = 0; i < n_prompt; i++) fprintf(stderr, " %d", toks[i]);
    fprintf(stderr, "\n");

    Cand *top = malloc(sizeof(Cand) * (k < 2 ? 2 : k));
    struct llama_batch batch = llama_batch_get_one(toks, n_prompt);
    llama_token tok;
    int pos = n_prompt;

    for (int step = 0; step < n_predict; step++) {
        if (llama_decode(ctx, batch) != 0) return 1;
        const float *l = llama_get_logits_ith(ctx, -1);

        top_k(l, n_vocab, top, k < 2 ? 2 : k);
        tok = top[0].id;                /* llama_sampler_init_greedy */
        printf("{\"step\":%d,\"pos\":%d,\"token\":%d,\"piece\":", step, pos,
               tok);
        put_piece(vocab, tok);
        fputs(",\"logit\":", stdout);
        put_float(l[tok]);
        fputs(",\"top\":[", stdout);
        for (int i = 0; i < k; i++) {
            printf("%s{\"id\":%d,\"piece\":", i ? "," : "", top[i].id);
            put_piece(vocab, top[i].id);
            fputs(",\"logit\":", stdout);
            put_float(top[i].logit);
            putchar('}');
        }
        fputs("],\"margin\":", stdout);
        put_float((double) top[0].logit - (double) top[1].logit);
        if (llama_vocab_is_eog(vocab, tok)) {
            fputs(",\"eog\":true}\n", stdout);
            break;
        }
        fputs("}\n", stdout);
        batch = llama_batch_get_one(&tok, 1);
        pos++;
    }
    llama_free(ctx);
    llama_model_free(model);
    free(top);
    free(toks);
    return 0;
}

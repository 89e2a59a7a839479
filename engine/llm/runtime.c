/* runtime.c -- the model's start-up, once for the CLI and the thinker
 * (runtime.h). */

#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "runtime.h"

int runtime_load_weights(Runtime *rt, const char *path, GGUFLoad how,
                         Err *err)
{
    memset(rt, 0, sizeof(*rt));
    if (model_load(&rt->m, path, how, err) != 0) return -1;
    rt->m_loaded = true;
    return 0;
}

int runtime_load(Runtime *rt, const char *path, GGUFLoad how, Err *err) {
    GGUFStr tmpl = { NULL, 0 };
    bool    known;

    if (runtime_load_weights(rt, path, how, err) != 0) return -1;
    rt->tk = tokenizer_new(&rt->m.gguf, err);
    if (rt->tk == NULL) return err_prefix(err, "%s", path);
    if (tokenizer_n_vocab(rt->tk) != rt->m.c.n_vocab) {
        return err_set(err, "%s: the tokenizer has %d tokens but the "
                       "embedding has %d rows", path,
                       tokenizer_n_vocab(rt->tk), rt->m.c.n_vocab);
    }
    gguf_get_str(&rt->m.gguf, "tokenizer.chat_template", &tmpl, NULL);
    rt->tmpl = chat_detect(tmpl.ptr, tmpl.len, &known);
    rt->tmpl_unknown = tmpl.len > 0 && !known;
    return 0;
}

/* The widest row a matmul reads: the FFN's, the model's, or the heads'. */
int runtime_backend(Runtime *rt, BackendConfig *bc, Err *err) {
    const ModelConfig *c = &rt->m.c;
    char               msg[ERR_MAX];
    int64_t            wide = c->ffn_dim > c->dim ? c->ffn_dim : c->dim;

    if (wide < (int64_t) c->n_heads * c->head_dim) {
        wide = (int64_t) c->n_heads * c->head_dim;
    }
    bc->max_cols = wide;
    bc->n_heads = c->n_heads;
    bc->head_dim = c->head_dim;
    bc->n_vocab = c->n_vocab;
    if (bc->max_out < 1) bc->max_out = 1;
    if (bc->block_size < 1) bc->block_size = 16;
    rt->be = backend_new(bc, msg, sizeof(msg));
    if (rt->be == NULL) return err_set(err, "%s", msg);
    model_use_context(&rt->m, bc->max_ctx);
    return model_place(&rt->m, rt->be, err);
}

/* chat_render says how long the text is when it does not fit, so one
 * retry with that room always does. */
long runtime_render_chat(const Runtime *rt, const ChatMsg *msgs, int n,
                         unsigned flags, char **buf, size_t *cap,
                         size_t *ends, Err *err)
{
    long len = chat_render(rt->tmpl, msgs, n, flags, *buf, *cap, ends, err);

    if (len >= 0 && (size_t) len >= *cap) {
        char *grown = realloc(*buf, (size_t) len + 1);

        if (grown == NULL) return err_set(err, "out of memory");
        *buf = grown;
        *cap = (size_t) len + 1;
        len = chat_render(rt->tmpl, msgs, n, flags, *buf, *cap, ends, err);
    }
    return len;
}

void runtime_free(Runtime *rt) {
    if (rt->be != NULL) rt->be->free(rt->be);
    tokenizer_free(rt->tk);
    if (rt->m_loaded) model_free(&rt->m);
    memset(rt, 0, sizeof(*rt));
}

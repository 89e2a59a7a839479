/* prefix_cli.c -- `omni-engine prefix-keys`; see prefix_cli.h.
 *
 * The prompt is rendered and tokenized as the thinker does it (the GGUF's
 * chat template, the generation prompt, BOS and special tokens parsed),
 * then the same prefix_keys.h calls the thinker makes give the tokens. The
 * model's weights are never read: a vocabulary-only GGUF is enough. */

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "gguf.h"
#include "prefix_cli.h"
#include "prefix_keys.h"
#include "request.h"
#include "tokenizer.h"

/* What a GGUF gives: its tokenizer and its chat template. */
typedef struct {
    GGUF          g;
    bool          open;
    Tokenizer    *tk;           // owned
    ChatTemplate  tmpl;
} Vocab;

static int vocab_open(Vocab *v, const char *path, Err *err) {
    GGUFStr tmpl = { NULL, 0 };

    memset(v, 0, sizeof(*v));
    if (gguf_open(&v->g, path, err) != 0) return -1;
    v->open = true;
    v->tk = tokenizer_new(&v->g, err);
    if (v->tk == NULL) return err_prefix(err, "%s", path);
    gguf_get_str(&v->g, "tokenizer.chat_template", &tmpl, NULL);
    v->tmpl = chat_detect(tmpl.ptr, tmpl.len, NULL);
    return 0;
}

static void vocab_close(Vocab *v) {
    tokenizer_free(v->tk);
    if (v->open) gguf_close(&v->g);
}

/* The tokens each key of r's chain publishes, into tokens (n_chain
 * entries, 0 for none), as the thinker computes them. */
static int published(const OmniRequest *r, const Vocab *v, int bs,
                     int32_t *tokens, Err *err)
{
    int        n_chain = pkeys_chain_len(r), n_keys, rc = -1;
    size_t    *ends = malloc((size_t) r->n_msgs * sizeof(size_t));
    PrefixKey  keys[OMNI_PKEY_MAX];
    long       len = chat_render(v->tmpl, r->msgs, r->n_msgs, CHAT_ADD_GEN, NULL, 0,
                                 ends, err);
    char      *text = len >= 0 ? malloc((size_t) len + 1) : NULL;
    int32_t   *toks = len >= 0 ? malloc((2 * (size_t) len + 2)
                                        * sizeof(int32_t)) : NULL;
    int64_t    n;

    if (ends == NULL || text == NULL || toks == NULL) {
        if (len >= 0) err_set(err, "out of memory");
        goto out;
    }
    chat_render(v->tmpl, r->msgs, r->n_msgs, CHAT_ADD_GEN, text, (size_t) len + 1,
                ends, err);
    /* at most a token a byte, and one more for each dummy prefix and
       each of BOS and EOS */
    n = tokenizer_encode(v->tk, text, (size_t) len, true, true, toks,
                         2 * len + 2, err);
    if (n < 0) goto out;
    rc = 0;
    if (pkeys_bytes_to_tokens(v->tk, text, (size_t) len, toks, n, ends,
                              n_chain, err) != 0)
    {
        log_msg(LOG_WARN, "no key is published: %s", err->msg);
        goto out;
    }
    n_keys = pkeys_request(r, ends, toks, n, bs, keys);
    for (int k = 0; k < n_keys; k++) tokens[keys[k].msg] = keys[k].tokens;
out:
    free(ends);
    free(text);
    free(toks);
    return rc;
}

int prefix_cli_run(const PrefixCliParams *p, FILE *out, Err *err) {
    OmniRequest r;
    ReqError    e;
    Vocab       v;
    int32_t    *tokens = NULL;
    OmniPkey    key;
    int         n_chain, rc = -1;
    char        hex[OMNI_PKEY_HEX + 1];

    memset(&v, 0, sizeof(v));
    if (request_parse(&r, p->request, p->request_len, &e) != 0) {
        return err_set(err, "the request: %s", e.err.msg);
    }
    if (!r.chat) {
        err_set(err, "the request has no messages: only chat requests "
                "have prefix keys");
        goto out;
    }
    n_chain = pkeys_chain_len(&r);
    tokens = calloc((size_t) n_chain + 1, sizeof(int32_t));
    if (tokens == NULL) {
        err_set(err, "out of memory");
        goto out;
    }
    if (p->model_path != NULL
        && (vocab_open(&v, p->model_path, err) != 0
            || published(&r, &v, p->block_size, tokens, err) != 0))
    {
        goto out;
    }
    key = pkeys_root(&r);
    hex[OMNI_PKEY_HEX] = '\0';
    for (int i = 0; i < n_chain; i++) {
        key = pkeys_next(key, &r.msgs[i]);
        omni_pkey_hex(hex, key);
        fprintf(out, "%d %s %d\n", i, hex, tokens[i]);
    }
    rc = 0;
out:
    free(tokens);
    vocab_close(&v);
    request_free(&r);
    return rc;
}

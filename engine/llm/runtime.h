/* runtime.h -- one start-up for everything that runs the model: the
 * weights, the tokenizer, the chat template and the backend, and chat
 * rendering with that template.
 *
 * The CLI (generate, bench) and the thinker stage used to build these
 * each their own way, kept in step by hand; they now build a Runtime.
 * Errors come back with their context in an Err: the CLI dies with the
 * message, the thinker returns it. Nothing here logs, so each caller keeps
 * its own log lines (the thinker's say "thinker:").
 *
 *     Runtime rt;
 *     runtime_load(&rt, path, GGUF_COPY, &err);        // or _weights
 *     runtime_backend(&rt, threads, isa, max_tokens, n_ctx, &err);
 *     ... rt.m, rt.tk, rt.tmpl, rt.be ...
 *     runtime_free(&rt);
 *
 * After a failure the Runtime holds what was built and runtime_free
 * releases it. */

#ifndef OMNI_RUNTIME_H
#define OMNI_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "kernels.h"
#include "log.h"
#include "model.h"
#include "tokenizer.h"

/* The context the CLI and the thinker use when none is asked for: the
 * model's, but no more than this many tokens. */
#define RUNTIME_CTX_DEFAULT_MAX 4096

typedef struct {
    Model         m;
    bool          m_loaded;         // m is loaded (model_free due)
    Tokenizer    *tk;               // owned; NULL for weights only
    ChatTemplate  tmpl;             // detected from the GGUF
    bool          tmpl_unknown;     // the GGUF has a template that was
                                    //   not recognised: tmpl is plain
    Backend      *be;               // owned; NULL until runtime_backend
} Runtime;

/* Loads the weights of the GGUF at path (how: copied or mapped) into
 * rt->m, nothing else (a benchmark needs no tokenizer). rt is zeroed
 * first. Returns 0, or -1 with err set by model_load (naming the file). */
int  runtime_load_weights(Runtime *rt, const char *path, GGUFLoad how,
                          Err *err);

/* runtime_load_weights, then the tokenizer (its vocabulary must match the
 * embedding) and the chat template. Returns 0, or -1 with err set, the
 * tokenizer's errors prefixed with path. */
int  runtime_load(Runtime *rt, const char *path, GGUFLoad how, Err *err);

/* The CPU backend for rt->m (n_threads 0: one per core; isa NULL or
 * "auto": the best this CPU has), sized for max_tokens per call and
 * sequences of max_ctx tokens; then rt->m's weights are repacked for it.
 * Returns 0, or -1 with err set (an isa this CPU or build lacks, out of
 * memory). */
int  runtime_backend(Runtime *rt, int n_threads, const char *isa,
                     int64_t max_tokens, int64_t max_ctx, Err *err);

/* Renders n messages with rt->tmpl and chat_render's flags into *buf
 * (*cap bytes; both may be NULL/0), growing it with realloc when it is short: *buf stays the
 * caller's, to reuse or free. ends (n entries, or NULL) as chat_render's.
 * Returns the length, or -1 with err set (a role the template cannot
 * express, out of memory). Only reads rt, so it may run on a helper
 * thread. */
long runtime_render_chat(const Runtime *rt, const ChatMsg *msgs, int n,
                         unsigned flags, char **buf, size_t *cap,
                         size_t *ends, Err *err);

/* Frees what rt holds, in reverse order of building. Can't fail. */
void runtime_free(Runtime *rt);

#endif

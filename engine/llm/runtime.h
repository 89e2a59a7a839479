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
 *     runtime_backend(&rt, &backend_config, &err);
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

/* The backend bc asks for (backend_new: "auto", "cpu" or "cuda"; its
 * threads, isa, GPU memory fraction; max_tokens and max_ctx; max_out and
 * block_size, 1 and 16 when unset), the model's sizes filled in here; then
 * rt->m's weights are placed for it (model_place). bc->note says why
 * "auto" did not choose CUDA, for the caller to log. Returns 0, or -1
 * with err set (an isa this CPU or build lacks, no CUDA device for
 * "cuda", a weight type the backend does not run, out of memory). */
int  runtime_backend(Runtime *rt, BackendConfig *bc, Err *err);

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

/* prefix_cli.h -- `omni-engine prefix-keys`: the prefix keys of a chat
 * request (proto/prefix_key.h) and what the engine would publish for each,
 * computed by the engine's own code (llm/prefix_keys.h), so that tests,
 * and nginx's side, can check their keys against it without a Redis or a
 * server:
 *
 *   omni-engine prefix-keys --request JSON [--model PATH] [--block-size 16]
 *
 * prints one line per key of the request's chain (its messages up to the
 * first one with audio):
 *
 *   I HEX TOKENS
 *
 * I the message the key ends with (0-based), HEX its 32 hex digits, TOKENS
 * what an engine serving the model with that block size publishes it
 * with: whole blocks of the prompt inside messages 0..I, or 0 when it
 * publishes nothing for it (less than a block, not one of the keys
 * omni_pkey_used() selects, or no --model given). */

#ifndef OMNI_PREFIX_CLI_H
#define OMNI_PREFIX_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "log.h"

typedef struct {
    const char *request;            // the request JSON (request.h)
    size_t      request_len;
    const char *model_path;         // a GGUF with a tokenizer (weights
                                    //   are not read), or NULL: keys only
    int         block_size;         // the engine's --block-size
} PrefixCliParams;

/* Prints the lines to out. Returns 0, or -1 with err set (a request that
 * does not parse, or has no messages; a model that cannot be read; a
 * template that cannot render it). */
int prefix_cli_run(const PrefixCliParams *p, FILE *out, Err *err);

#endif

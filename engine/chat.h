/* chat.h -- chat templates: messages -> prompt text.
 *
 * A GGUF carries its template as Jinja text in `tokenizer.chat_template`.
 * We do not run Jinja; we recognise the common families by distinctive
 * markers in that text (as llama.cpp's llm_chat_detect_template does) and
 * render them with code:
 *
 *   chatml   <|im_start|>role\ncontent<|im_end|>\n     (Qwen, SmolLM, ...)
 *   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *   llama2   [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
 *   mistral  [INST] ... [/INST] (v1/v3/v7 variants by marker)
 *   gemma    <start_of_turn>user\n...<end_of_turn>\n
 *   phi3     <|user|>\n...<|end|>\n<|assistant|>\n
 *   zephyr   <|user|>\n...</s>\n<|assistant|>\n
 *
 * A model without a template gets the plain format, documented in the
 * README: each message as "Role: content\n\n" (System, User, Assistant),
 * then "Assistant:" when a generation prompt is asked for.
 * BOS is not part of the rendered text; the tokenizer adds it. */

#ifndef OMNI_CHAT_H
#define OMNI_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "log.h"

typedef enum {
    CHAT_PLAIN = 0,
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_LLAMA2,
    CHAT_MISTRAL_V1,            // " [INST] ... [/INST]", spaces around
    CHAT_MISTRAL_V3,            // "[INST] ...[/INST]" (v3 tekken: no space)
    CHAT_MISTRAL_V7,            // [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT]
    CHAT_GEMMA,
    CHAT_PHI3,
    CHAT_ZEPHYR,
} ChatTemplate;

typedef struct {
    const char *role;           // "system", "user", "assistant"
    const char *content;        // UTF-8, NUL-terminated
} ChatMsg;

/* Detects the family from the template text (NULL or empty: CHAT_PLAIN).
 * An unrecognised template also gives CHAT_PLAIN and sets *known = false. */
ChatTemplate chat_detect(const char *tmpl, size_t len, bool *known);
const char  *chat_name(ChatTemplate t);
/* Parses a name ("chatml", "llama3", ...); -1 when unknown. */
int          chat_from_name(const char *name);

/* Renders n messages into buf (cap bytes, NUL-terminated). Returns the
 * length, which may be >= cap (then the caller retries with more room), or
 * -1 with err set for a role the template cannot express. */
long chat_render(ChatTemplate t, const ChatMsg *msgs, int n,
                 bool add_generation_prompt, char *buf, size_t cap, Err *err);

#endif

/* chat.h -- chat templates: messages -> prompt text.
 *
 * A GGUF carries its template as Jinja text in `tokenizer.chat_template`.
 * We do not run Jinja; we recognise the common families by distinctive
 * markers in that text, in the order llama.cpp's llm_chat_detect_template
 * tests them, and render them with code, byte for byte as llama.cpp's
 * llm_chat_apply_template does:
 *
 *   chatml   <|im_start|>role\ncontent<|im_end|>\n     (Qwen, SmolLM, ...)
 *   qwen3    chatml, as Qwen3's own template renders it: an assistant
 *            message loses its reasoning (the text up to the last
 *            </think>, and the newlines after it), and with thinking off
 *            the generation prompt ends with an empty <think>\n\n</think>
 *            \n\n. A thinking template (chat_thinks): the model's output
 *            opens with <think>...</think> (think.h splits it off).
 *   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *   llama2   [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]  (4 variants:
 *            no system block, <<SYS>>, "<s>" inside history, stripped)
 *   mistral  [INST] ... [/INST]  (v1, v3, v3-tekken by marker; v7 by
 *            [SYSTEM_PROMPT]; v7-tekken by name only, as in llama.cpp)
 *   gemma    <start_of_turn>user\n...<end_of_turn>\n  (no system role: the
 *            system text opens the next user turn)
 *   phi3     <|user|>\n...<|end|>\n<|assistant|>\n
 *   zephyr   <|user|>\n...<|endoftext|>\n<|assistant|>\n  (also detected
 *            when the template spells out <|assistant|>, which llama.cpp
 *            sends to GLM-Edge instead: our one deviation from it)
 *
 * qwen3 is ours, not llama.cpp's legacy list (which says chatml): it is
 * told from chatml by enable_thinking and the literal empty think block
 * of its generation prompt, in a template whose generation prompt does not
 * open <think> itself (Qwen3.5 and MiniCPM5 do: they stay chatml). Its one
 * deviation from Qwen3's template: Qwen3 keeps the reasoning of assistant
 * turns after the last user turn (a tool-call loop, which we do not
 * serve); we drop every one's, so that a message's rendering depends on
 * it and the ones before it alone (chat_render's ends). Tool messages
 * render as chatml's ("<|im_start|>tool"), as llama.cpp's legacy
 * renderer does.
 *
 * Templates of other families llama.cpp knows (phi4, command-r, deepseek,
 * ...) are reported unknown rather than mistaken for one of ours: a Phi-4
 * template contains <|im_start|> but is not ChatML.
 *
 * A model without a template gets the plain format, documented in the
 * README: each message as "Role: content\n\n" (System, User, Assistant),
 * then "Assistant:" when a generation prompt is asked for.
 * BOS is not part of the rendered text; the tokenizer adds it. llama.cpp
 * renders none of these with a leading BOS either; only llama2-sys-bos puts
 * "<s>" between turns, which we reproduce. Turn-ending EOS text ("</s>",
 * "<|endoftext|>") is part of the rendering, so the prompt must be
 * tokenized with special tokens parsed. */

#ifndef OMNI_CHAT_H
#define OMNI_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "log.h"
#include "params.h"

typedef enum {
    CHAT_PLAIN = 0,
    CHAT_CHATML,
    CHAT_LLAMA3,
    CHAT_LLAMA2,                // system text as a plain line, no <<SYS>>
    CHAT_LLAMA2_SYS,            // <<SYS>> block
    CHAT_LLAMA2_SYS_BOS,        // later turns open with "<s>[INST] "
    CHAT_LLAMA2_SYS_STRIP,      // contents trimmed
    CHAT_MISTRAL_V1,            // " [INST] ... [/INST]", spaces around
    CHAT_MISTRAL_V3,            // "[INST] ...[/INST]", assistant trimmed
    CHAT_MISTRAL_V3_TEKKEN,     // "[INST]...[/INST]", no spaces
    CHAT_MISTRAL_V7,            // [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT]
    CHAT_MISTRAL_V7_TEKKEN,     // v7 without the spaces
    CHAT_GEMMA,
    CHAT_PHI3,
    CHAT_ZEPHYR,
    CHAT_QWEN3,                 // chatml with <think> reasoning
} ChatTemplate;

/* chat_render's flags. */
#define CHAT_ADD_GEN    1u      // add the generation prompt
#define CHAT_NO_THINK   2u      // thinking off (thinking templates only;
                                //   the others ignore it)


/* Detects the family from the template text (tmpl need not be
 * NUL-terminated). NULL or empty: CHAT_PLAIN with *known = true. Text equal
 * to a name chat_from_name() accepts selects that template, as in llama.cpp.
 * An unrecognised template, or one of a family we do not render, also gives
 * CHAT_PLAIN and sets *known = false. known may be NULL. Can't fail. */
ChatTemplate chat_detect(const char *tmpl, size_t len, bool *known);

/* llama.cpp's name for t ("chatml", "mistral-v3-tekken", ...; "plain" for
 * CHAT_PLAIN); a static string. */
const char  *chat_name(ChatTemplate t);

/* Parses a name chat_name() returns; -1 when unknown. */
int          chat_from_name(const char *name);

/* Whether t is a thinking template: its model opens its answer with
 * <think>...</think> unless CHAT_NO_THINK rendered the prompt. */
bool         chat_thinks(ChatTemplate t);

/* Renders n messages into buf (cap bytes, NUL-terminated when cap > 0);
 * flags are CHAT_ADD_GEN and CHAT_NO_THINK, or-ed.
 * Returns the full length, which may be >= cap (then the caller retries
 * with more room), or -1 with err set for a role the template cannot
 * express. Roles are "system", "user", "assistant"; chatml, qwen3, llama3,
 * phi3 and zephyr print the role itself and so also take any other name of
 * letters, digits, '_' and '-' ("tool"). The messages are only read.
 *
 * ends (n entries, or NULL) gets where each message's rendering ends:
 * bytes [0, ends[i]) depend on messages 0..i alone, so every request
 * whose first i + 1 messages are these renders them alike (what prefix
 * routing needs, prefix_keys.h). Where a template holds a message's text
 * back until a later one (Gemma's system text opens the next user turn),
 * that message's end is where the text before it ends: earlier, never
 * later. Set even when the text does not fit cap. */
long chat_render(ChatTemplate t, const ChatMsg *msgs, int n,
                 unsigned flags, char *buf, size_t cap,
                 size_t *ends, Err *err);

#endif

/* chat.c -- chat template detection and rendering; see chat.h.
 *
 * Detection walks llama.cpp's marker chain in its order up to the Llama 3
 * test, because order is what disambiguates: Phi-4 and SmolVLM templates
 * contain <|im_start|> yet are not ChatML, Falcon 3 and GLM-Edge contain
 * <|user|> and <|assistant|> yet are not Zephyr. Families we do not render
 * stay in the chain so they are reported unknown instead of falling through
 * to a wrong match; every family llama.cpp tests after Llama 3 is unknown
 * to us, so the chain stops there. One deliberate deviation, for Zephyr,
 * is explained where it happens.
 *
 * Rendering reproduces llama.cpp's llm_chat_apply_template byte for byte,
 * quirks included (Llama 3 and Gemma trim contents, Mistral v3 trims only
 * assistant turns, Llama 2 without <<SYS>> puts the system text on its own
 * line), so that a model served here and by llama.cpp sees the same
 * prompt. The four families that print the role name share one table
 * driven renderer; the [INST] families and Gemma each have a small one.
 *
 * The [INST] families have no generation prompt to add: a prompt ending in
 * a user turn already ends with [/INST], as in llama.cpp.
 *
 * Output goes through Out, which counts every byte but stores only what
 * fits, so a short buffer still yields the exact length to retry with.
 * Nothing is allocated. */

#include <string.h>

#include "chat.h"

typedef struct {
    char   *buf;
    size_t  cap;
    size_t  len;        // bytes produced so far, stored or not
    size_t *ends;       // (n,) where each message's rendering ends, or NULL
} Out;

/* Families that print the role name: open role mid content close. */
typedef struct {
    const char *open;
    const char *mid;
    const char *close;
    const char *gen;    // generation prompt
    bool        trim;   // trim contents
} TaggedFormat;

static const char *chat_names[] = {
    [CHAT_PLAIN]             = "plain",
    [CHAT_CHATML]            = "chatml",
    [CHAT_LLAMA3]            = "llama3",
    [CHAT_LLAMA2]            = "llama2",
    [CHAT_LLAMA2_SYS]        = "llama2-sys",
    [CHAT_LLAMA2_SYS_BOS]    = "llama2-sys-bos",
    [CHAT_LLAMA2_SYS_STRIP]  = "llama2-sys-strip",
    [CHAT_MISTRAL_V1]        = "mistral-v1",
    [CHAT_MISTRAL_V3]        = "mistral-v3",
    [CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [CHAT_MISTRAL_V7]        = "mistral-v7",
    [CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [CHAT_GEMMA]             = "gemma",
    [CHAT_PHI3]              = "phi3",
    [CHAT_ZEPHYR]            = "zephyr",
    [CHAT_QWEN3]             = "qwen3",
};

#define CHAT_N_TEMPLATES ((int) (sizeof(chat_names) / sizeof(chat_names[0])))

static const TaggedFormat tagged[] = {
    [CHAT_CHATML] = { "<|im_start|>", "\n", "<|im_end|>\n",
                      "<|im_start|>assistant\n", false },
    [CHAT_LLAMA3] = { "<|start_header_id|>", "<|end_header_id|>\n\n",
                      "<|eot_id|>",
                      "<|start_header_id|>assistant<|end_header_id|>\n\n",
                      true },
    [CHAT_PHI3]   = { "<|", "|>\n", "<|end|>\n", "<|assistant|>\n",
                      false },
    [CHAT_ZEPHYR] = { "<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n",
                      false },
    [CHAT_QWEN3]  = { "<|im_start|>", "\n", "<|im_end|>\n",
                      "<|im_start|>assistant\n", false },
};


/* ---- detection ---- */

static bool has(const char *t, size_t len, const char *marker) {
    return memmem(t, len, marker, strlen(marker)) != NULL;
}

/* The Llama 2 and Mistral branch of the chain: the template mentions
 * [INST] or starts with "mistral". */
static int detect_inst(const char *t, size_t len) {
    if (has(t, len, "[SYSTEM_PROMPT]")) return CHAT_MISTRAL_V7;
    if (has(t, len, "' [INST] ' + system_message")
        || has(t, len, "[AVAILABLE_TOOLS]"))
    {
        if (has(t, len, " [INST]")) return CHAT_MISTRAL_V1;
        if (has(t, len, "\"[INST]\"")) return CHAT_MISTRAL_V3_TEKKEN;
        return CHAT_MISTRAL_V3;
    }
    if (has(t, len, "content.strip()")) return CHAT_LLAMA2_SYS_STRIP;
    if (has(t, len, "bos_token + '[INST]")) return CHAT_LLAMA2_SYS_BOS;
    if (has(t, len, "<<SYS>>")) return CHAT_LLAMA2_SYS;
    return CHAT_LLAMA2;
}

/* Qwen3's template (a chatml one): enable_thinking turns thinking off
 * with an empty think block ('<think>\n\n</think>\n\n', escapes as
 * the Jinja source spells them), and the generation prompt does not open
 * one itself (Qwen3.5's and MiniCPM5's {{- '<think>\n' }} do). */
static bool is_qwen3(const char *t, size_t len) {
    return has(t, len, "enable_thinking")
           && has(t, len, "'<think>\\n\\n</think>\\n\\n'")
           && !has(t, len, "'<think>\\n' }}");
}

/* llama.cpp's chain up to Llama 3; -1 for a family we do not render (the
 * comment names it) or no match. */
static int detect_markers(const char *t, size_t len) {
    if (has(t, len, "<|im_start|>")) {
        if (has(t, len, "<|im_sep|>")) return -1;              /* phi4 */
        if (has(t, len, "<end_of_utterance>")) return -1;      /* smolvlm */
        return is_qwen3(t, len) ? CHAT_QWEN3 : CHAT_CHATML;
    }
    if ((len >= 7 && memcmp(t, "mistral", 7) == 0) || has(t, len, "[INST]")) {
        return detect_inst(t, len);
    }
    if (has(t, len, "<|assistant|>") && has(t, len, "<|end|>")) {
        return CHAT_PHI3;
    }
    if (has(t, len, "[gMASK]<sop>")) return -1;                /* chatglm4 */
    if (has(t, len, "<|assistant|>") && has(t, len, "<|user|>")) {
        if (has(t, len, "<|tool_declare|>")) return -1;        /* exaone-moe */
        if (has(t, len, "</s>")) return -1;                    /* falcon3 */

        /* llama.cpp says glmedge here, which shadows its own Zephyr test
           below for every template spelling out <|assistant|>, StableLM 2
           Zephyr's included. Our one deviation: with <|endoftext|> it is
           Zephyr; GLM-Edge templates do not contain it. */
        return has(t, len, "<|endoftext|>") ? CHAT_ZEPHYR : -1;
    }
    if (has(t, len, "<|{{ item['role'] }}|>")
        && has(t, len, "<|begin_of_image|>"))
    {
        return -1;                                              /* glmedge */
    }
    if (has(t, len, "<|user|>") && has(t, len, "<|endoftext|>")) {
        return CHAT_ZEPHYR;
    }
    if (has(t, len, "bos_token + message['role']")) return -1; /* monarch */
    if (has(t, len, "<start_of_turn>")) return CHAT_GEMMA;
    if (has(t, len, "'\\n\\nAssistant: ' + eos_token")     /* orion */
        || has(t, len, "GPT4 Correct ")                       /* openchat */
        || (has(t, len, "USER: ") && has(t, len, "ASSISTANT: "))  /* vicuna */
        || (has(t, len, "### Instruction:") && has(t, len, "<|EOT|>"))
        || (has(t, len, "<|START_OF_TURN_TOKEN|>")          /* command-r */
            && has(t, len, "<|USER_TOKEN|>")))
    {
        return -1;
    }
    if (has(t, len, "<|start_header_id|>")
        && has(t, len, "<|end_header_id|>"))
    {
        return CHAT_LLAMA3;
    }
    return -1;
}

ChatTemplate chat_detect(const char *tmpl, size_t len, bool *known) {
    int t = -1;

    if (known != NULL) *known = true;
    if (tmpl == NULL || len == 0) return CHAT_PLAIN;

    /* a bare name selects that template, as llama.cpp allows */
    for (int i = 0; i < CHAT_N_TEMPLATES && t < 0; i++) {
        if (strlen(chat_names[i]) == len
            && memcmp(tmpl, chat_names[i], len) == 0)
        {
            t = i;
        }
    }
    if (t < 0) t = detect_markers(tmpl, len);
    if (t >= 0) return (ChatTemplate) t;
    if (known != NULL) *known = false;
    return CHAT_PLAIN;
}

const char *chat_name(ChatTemplate t) {
    if ((int) t < 0 || (int) t >= CHAT_N_TEMPLATES) return "unknown";
    return chat_names[t];
}

bool chat_thinks(ChatTemplate t) {
    return t == CHAT_QWEN3;
}

int chat_from_name(const char *name) {
    for (int i = 0; i < CHAT_N_TEMPLATES; i++) {
        if (strcmp(name, chat_names[i]) == 0) return i;
    }
    return -1;
}


/* ---- output ---- */

static void put(Out *o, const char *s, size_t n) {
    if (o->len < o->cap) {
        size_t room = o->cap - o->len;

        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len += n;
}

static void put_str(Out *o, const char *s) {
    put(o, s, strlen(s));
}

static bool is_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* s without leading and trailing ASCII whitespace (C isspace, as llama.cpp
 * trims). */
static void put_trimmed(Out *o, const char *s) {
    size_t n = strlen(s);

    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    put(o, s, n);
}

static void put_content(Out *o, const char *s, bool trim) {
    if (trim) put_trimmed(o, s); else put_str(o, s);
}

/* Message i and everything before it are out. */
static void end_msg(Out *o, int i) {
    if (o->ends != NULL) o->ends[i] = o->len;
}


/* ---- roles ---- */

static bool is_role(const char *role, const char *name) {
    return strcmp(role, name) == 0;
}

static bool role_is_basic(const char *role) {
    return is_role(role, "system") || is_role(role, "user")
           || is_role(role, "assistant");
}

/* A role the tagged families may print: a non-empty name of letters,
 * digits, '_' and '-', so a role can never inject template markup. */
static bool role_is_name(const char *role) {
    if (*role == '\0') return false;
    for (const char *p = role; *p != '\0'; p++) {
        char c = *p;

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '_' || c == '-'))
        {
            return false;
        }
    }
    return true;
}

static int check_roles(ChatTemplate t, const ChatMsg *msgs, int n, Err *err) {
    bool named = t == CHAT_CHATML || t == CHAT_QWEN3 || t == CHAT_LLAMA3
                 || t == CHAT_PHI3 || t == CHAT_ZEPHYR;

    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role != NULL ? msgs[i].role : "";

        if (msgs[i].content == NULL) {
            return err_set(err, "messages[%d]: no content", i);
        }
        if (named ? !role_is_name(r) : !role_is_basic(r)) {
            return err_set(err, "messages[%d]: chat template '%s' has no "
                           "role '%.32s'", i, chat_name(t), r);
        }
    }
    return 0;
}


/* ---- renderers ---- */

static void render_tagged(Out *o, const TaggedFormat *f, const ChatMsg *msgs,
                          int n, bool gen) {
    for (int i = 0; i < n; i++) {
        put_str(o, f->open);
        put_str(o, msgs[i].role);
        put_str(o, f->mid);
        put_content(o, msgs[i].content, f->trim);
        put_str(o, f->close);
        end_msg(o, i);
    }
    if (gen) put_str(o, f->gen);
}

/* Qwen3: chatml, but an assistant message without its reasoning (what
 * follows its last </think>, newlines stripped from its start, as Qwen3's
 * template splits it), and thinking off answered in advance with an empty
 * think block. */
static void render_qwen3(Out *o, const ChatMsg *msgs, int n, unsigned flags)
{
    const TaggedFormat *f = &tagged[CHAT_QWEN3];

    for (int i = 0; i < n; i++) {
        const char *c = msgs[i].content, *p;

        if (is_role(msgs[i].role, "assistant")) {
            while ((p = strstr(c, "</think>")) != NULL) c = p + 8;
            if (c != msgs[i].content) c += strspn(c, "\n");
        }
        put_str(o, f->open);
        put_str(o, msgs[i].role);
        put_str(o, f->mid);
        put_str(o, c);
        put_str(o, f->close);
        end_msg(o, i);
    }
    if (flags & CHAT_ADD_GEN) {
        put_str(o, f->gen);
        if (flags & CHAT_NO_THINK) put_str(o, "<think>\n\n</think>\n\n");
    }
}

/* "[INST] " opens the first turn (its BOS is the tokenizer's); a system
 * message becomes a <<SYS>> block, or a plain line in the variant without
 * one; an assistant message closes the turn. */
static void render_llama2(Out *o, ChatTemplate t, const ChatMsg *msgs,
                          int n) {
    bool sys = t != CHAT_LLAMA2, strip = t == CHAT_LLAMA2_SYS_STRIP;
    bool inside = true;

    put_str(o, "[INST] ");
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content;

        if (!inside) {
            put_str(o, t == CHAT_LLAMA2_SYS_BOS ? "<s>[INST] " : "[INST] ");
            inside = true;
        }
        if (is_role(r, "system")) {
            put_str(o, sys ? "<<SYS>>\n" : "");
            put_content(o, c, strip);
            put_str(o, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (is_role(r, "user")) {
            put_content(o, c, strip);
            put_str(o, " [/INST]");
        } else {
            put_content(o, c, strip);
            put_str(o, "</s>");
            inside = false;
        }
        end_msg(o, i);
    }
}

/* Mistral v1, v3, v3-tekken differ only in spaces around [INST] and in
 * trimming assistant turns (v3); system text opens the turn it is in. */
static void render_mistral(Out *o, ChatTemplate t, const ChatMsg *msgs,
                           int n) {
    const char *lead = t == CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = t == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool        inside = false;

    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content;

        if (!inside) {
            put_str(o, lead);
            put_str(o, "[INST]");
            put_str(o, trail);
            inside = true;
        }
        if (is_role(r, "system")) {
            put_str(o, c);
            put_str(o, "\n\n");
        } else if (is_role(r, "user")) {
            put_str(o, c);
            put_str(o, lead);
            put_str(o, "[/INST]");
        } else {
            put_str(o, trail);
            put_content(o, c, t == CHAT_MISTRAL_V3);
            put_str(o, "</s>");
            inside = false;
        }
        end_msg(o, i);
    }
}

static void render_mistral_v7(Out *o, ChatTemplate t, const ChatMsg *msgs,
                              int n) {
    const char *sp = t == CHAT_MISTRAL_V7 ? " " : "";

    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;

        if (is_role(r, "system")) {
            put_str(o, "[SYSTEM_PROMPT]");
        } else if (is_role(r, "user")) {
            put_str(o, "[INST]");
        }
        put_str(o, sp);
        put_str(o, msgs[i].content);
        put_str(o, is_role(r, "system") ? "[/SYSTEM_PROMPT]"
                   : is_role(r, "user") ? "[/INST]" : "</s>");
        end_msg(o, i);
    }
}

/* Gemma has no system role: trimmed system texts pending since the last
 * user turn (pend..i) are glued together and open the next user turn,
 * followed by a blank line. "assistant" is called "model". A system
 * message's end is where the text before it ends: its own is not out
 * until the next user turn. */
static void render_gemma(Out *o, const ChatMsg *msgs, int n, bool gen) {
    int pend = 0;

    for (int i = 0; i < n; i++) {
        bool   user = is_role(msgs[i].role, "user");
        size_t before;

        if (is_role(msgs[i].role, "system")) {
            end_msg(o, i);
            continue;
        }
        put_str(o, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (user) {
            before = o->len;
            for (int j = pend; j < i; j++) {
                if (is_role(msgs[j].role, "system")) {
                    put_trimmed(o, msgs[j].content);
                }
            }
            if (o->len > before) put_str(o, "\n\n");
            pend = i + 1;
        }
        put_trimmed(o, msgs[i].content);
        put_str(o, "<end_of_turn>\n");
        end_msg(o, i);
    }
    if (gen) put_str(o, "<start_of_turn>model\n");
}

/* The documented fallback for models without a template. */
static void render_plain(Out *o, const ChatMsg *msgs, int n, bool gen) {
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;

        put_str(o, is_role(r, "system") ? "System: "
                   : is_role(r, "user") ? "User: " : "Assistant: ");
        put_str(o, msgs[i].content);
        put_str(o, "\n\n");
        end_msg(o, i);
    }
    if (gen) put_str(o, "Assistant:");
}

long chat_render(ChatTemplate t, const ChatMsg *msgs, int n,
                 unsigned flags, char *buf, size_t cap,
                 size_t *ends, Err *err) {
    Out  o = { buf, cap, 0, ends };
    bool add_generation_prompt = (flags & CHAT_ADD_GEN) != 0;

    if ((int) t < 0 || (int) t >= CHAT_N_TEMPLATES) {
        return err_set(err, "chat template %d is unknown", (int) t);
    }
    if (check_roles(t, msgs, n, err) != 0) return -1;

    switch (t) {
    case CHAT_CHATML: case CHAT_LLAMA3: case CHAT_PHI3: case CHAT_ZEPHYR:
        render_tagged(&o, &tagged[t], msgs, n, add_generation_prompt);
        break;
    case CHAT_QWEN3:
        render_qwen3(&o, msgs, n, flags);
        break;
    case CHAT_LLAMA2: case CHAT_LLAMA2_SYS: case CHAT_LLAMA2_SYS_BOS:
    case CHAT_LLAMA2_SYS_STRIP:
        render_llama2(&o, t, msgs, n);
        break;
    case CHAT_MISTRAL_V1: case CHAT_MISTRAL_V3: case CHAT_MISTRAL_V3_TEKKEN:
        render_mistral(&o, t, msgs, n);
        break;
    case CHAT_MISTRAL_V7: case CHAT_MISTRAL_V7_TEKKEN:
        render_mistral_v7(&o, t, msgs, n);
        break;
    case CHAT_GEMMA:
        render_gemma(&o, msgs, n, add_generation_prompt);
        break;
    case CHAT_PLAIN:
        render_plain(&o, msgs, n, add_generation_prompt);
        break;
    }
    if (cap > 0) buf[o.len < cap ? o.len : cap - 1] = '\0';
    return (long) o.len;
}

/* test_chat.c -- chat template detection and rendering (engine/llm/chat.c).
 *
 * The reference is llama.cpp itself, read from its checkout at run time
 * (env OMNI_LLAMA_SRC, else the last line printed by t/fetch-llama-src):
 *
 *   - tests/test-chat-template.cpp: every test case's template must be
 *     detected as the family llama.cpp renders it with (or reported unknown
 *     when we do not render that family), and for our families the rendered
 *     conversation must equal llama.cpp's expected_output byte for byte.
 *     The C++ string literals are decoded here, so the expected strings are
 *     llama.cpp's own, not a copy that could drift.
 *   - the .jinja files in models/templates: every real template must be
 *     detected as the family llama.cpp's detection gives it; the table
 *     below lists each file, and a file missing from it fails the test.
 *
 * A missing checkout fails the group; it is never skipped. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "testutil.h"

#include "chat.h"

#define MAX_CASES 64

typedef struct {
    char *name;
    char *tmpl;
    char *expected;
} Case;

typedef struct {
    char  src[4096];            // llama.cpp checkout
    Case  cases[MAX_CASES];
    int   n_cases;
} Ref;

/* The conversation of llama.cpp's main_automated_tests(). */
static const ChatMsg conversation[] = {
    { "system",    "You are a helpful assistant" },
    { "user",      "Hello" },
    { "assistant", "Hi there" },
    { "user",      "Who are you" },
    { "assistant", "   I am an assistant   " },
    { "user",      "Another question" },
};

#define N_CONV ((int) (sizeof(conversation) / sizeof(conversation[0])))

/* Test case name in test-chat-template.cpp -> the family llama.cpp detects,
 * NULL for families we do not render. */
static const struct { const char *name, *family; } case_family[] = {
    { "teknium/OpenHermes-2.5-Mistral-7B", "chatml" },
    { "mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system "
      "prompt)", "llama2" },
    { "TheBloke/FusionNet_34Bx2_MoE-AWQ", "llama2-sys-bos" },
    { "bofenghuang/vigogne-2-70b-chat", "llama2-sys-strip" },
    { "mlabonne/AlphaMonarch-7B", NULL },
    { "google/gemma-7b-it", "gemma" },
    { "OrionStarAI/Orion-14B-Chat", NULL },
    { "openchat/openchat-3.5-0106", NULL },
    { "deepseek-ai/deepseek-coder-33b-instruct", NULL },
    { "eachadea/vicuna-13b-1.1", NULL },
    { "Orca-Vicuna", NULL },
    { "CohereForAI/c4ai-command-r-plus", NULL },
    { "Llama-3", "llama3" },
    { "Phi-3-mini", "phi3" },
    { "Phi-3-small", "phi3" },
    { "Phi-3-medium", "phi3" },
    { "Phi-3-vision", "phi3" },
    { "ChatGLM3", NULL },
    { "ChatGLM4", NULL },
    { "GLMEdge", NULL },
    { "MiniCPM-3B-OpenHermes-2.5-v2-GGUF", NULL },
    { "DeepSeek-V2", NULL },
    { "ibm-granite/granite-3.0-8b-instruct", NULL },
    { "mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a "
      "system prompt)", "mistral-v1" },
    { "Mistral-Large-Instruct-2407 (mistralai 'v3' template; modified to "
      "have system prompt at start)", "mistral-v3" },
    { "Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template; modified "
      "to have system prompt at start)", "mistral-v3-tekken" },
    { "mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)",
      "mistral-v7" },
    { "ai-sage/GigaChat-20B-A3B-instruct", NULL },
    { "Infinigence/Megrez-3B-Instruct", NULL },
    { "phi-4", NULL },
    { "yandex/YandexGPT-5-Lite-8B-instruct", NULL },
    { "inclusionAI/Ling-lite", NULL },
    { "ByteDance-Seed/Seed-OSS-36B-Instruct", NULL },
    { "ibm-granite/granite-3.x (tool call)", NULL },
    { "ibm-granite/granite-4.0 (tool call)", NULL },
    { "ibm-granite/granite-4.1 (tool call)", NULL },
};

/* models/templates/<file> -> the family llama.cpp's detection gives it,
 * NULL for families we do not render (deepseek3, granite, kimi-k2, ...). */
static const struct { const char *file, *family; } jinja_family[] = {
    { "Apertus-8B-Instruct.jinja", NULL },
    { "Apriel-1.6-15b-Thinker-fixed.jinja", NULL },
    { "Bielik-11B-v3.0-Instruct.jinja", "chatml" },
    { "ByteDance-Seed-OSS.jinja", NULL },
    { "Cohere2MoE.jinja", NULL },
    { "CohereForAI-c4ai-command-r-plus-tool_use.jinja", NULL },
    { "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", NULL },
    { "GLM-4.6.jinja", NULL },
    { "GLM-4.7-Flash.jinja", NULL },
    { "GigaChat3-10B-A1.8B.jinja", NULL },
    { "GigaChat3.1-10B-A1.8B.jinja", NULL },
    { "HuggingFaceTB-SmolLM3-3B.jinja", "chatml" },
    { "Kimi-K2-Instruct.jinja", NULL },
    { "Kimi-K2-Thinking.jinja", NULL },
    { "Kimi-K3.jinja", NULL },
    { "LFM2-8B-A1B.jinja", "chatml" },
    { "LFM2.5-8B-A1B.jinja", "chatml" },
    { "LFM2.5-Instruct.jinja", "chatml" },
    { "MiMo-VL.jinja", "chatml" },
    { "MiniMax-M1.jinja", NULL },
    { "MiniMax-M2.jinja", NULL },
    { "MiniMax-M3.jinja", NULL },
    { "Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral-v7" },
    { "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "chatml" },
    { "NVIDIA-Nemotron-Nano-v2.jinja", NULL },
    { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "chatml" },
    { "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "chatml" },
    { "Qwen-QwQ-32B.jinja", "chatml" },
    { "Qwen-Qwen2.5-7B-Instruct.jinja", "chatml" },
    { "Qwen-Qwen3-0.6B.jinja", "qwen3" },
    { "Qwen3-Coder.jinja", "chatml" },
    { "Qwen3.5-4B.jinja", "chatml" },
    { "Reka-Edge.jinja", NULL },
    { "Spark2.5.jinja", NULL },
    { "StepFun3.5-Flash.jinja", "chatml" },
    { "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", NULL },
    { "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", NULL },
    { "deepseek-ai-DeepSeek-V3.1.jinja", NULL },
    { "deepseek-ai-DeepSeek-V3.2.jinja", NULL },
    { "deepseek-ai-DeepSeek-V4-Flash-0731.jinja", NULL },
    { "deepseek-ai-DeepSeek-V4.jinja", NULL },
    { "fireworks-ai-llama-3-firefunction-v2.jinja", "llama3" },
    { "google-gemma-2-2b-it.jinja", "gemma" },
    { "google-gemma-4-31B-it-interleaved.jinja", NULL },
    { "google-gemma-4-31B-it.jinja", NULL },
    { "ibm-granite-granite-3.3-2B-Instruct.jinja", NULL },
    { "ibm-granite-granite-4.0.jinja", NULL },
    { "ibm-granite-granite-4.1.jinja", NULL },
    { "inclusionai-ling-3.0-flash.jinja", NULL },
    { "llama-cpp-deepseek-r1.jinja", NULL },
    { "llama-cpp-rwkv-world.jinja", NULL },
    { "meetkai-functionary-medium-v3.1.jinja", "llama3" },
    { "meetkai-functionary-medium-v3.2.jinja", "llama3" },
    { "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3" },
    { "meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3" },
    { "meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3" },
    { "microsoft-Phi-3.5-mini-instruct.jinja", "phi3" },
    { "mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral-v7" },
    { "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral-v3-tekken" },
    { "moonshotai-Kimi-K2.jinja", NULL },
    { "muse-glimmer.jinja", NULL },
    { "openai-gpt-oss-120b.jinja", NULL },
    { "openbmb-MiniCPM5-1B.jinja", "chatml" },
    { "poolside-Laguna-S-2.1.jinja", NULL },
    { "poolside-Laguna-XS-2.1.jinja", NULL },
    { "poolside-Laguna-XS.2.jinja", NULL },
    { "tencent-Hy3.jinja", NULL },
    { "unsloth-Apriel-1.5.jinja", "phi3" },
    { "unsloth-mistral-Devstral-Small-2507.jinja", "mistral-v7" },
    { "upstage-Solar-Open-100B.jinja", NULL },
};

#define COUNT(a) ((int) (sizeof(a) / sizeof((a)[0])))


/* ---- reading llama.cpp ---- */



/* Decodes the C++ string literal starting after the opening quote at *pp;
 * leaves *pp after the closing quote. */
static char *cxx_string(const char **pp) {
    const char *p = *pp;
    char       *out = malloc(strlen(p) + 1), *o = out;

    for (; *p != '\0' && *p != '"'; p++) {
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'n':  *o++ = '\n'; break;
        case 't':  *o++ = '\t'; break;
        case 'r':  *o++ = '\r'; break;
        default:   *o++ = *p; break;            /* \\ \" \' */
        }
    }
    *o = '\0';
    *pp = *p == '"' ? p + 1 : p;
    return out;
}

/* Pulls (name, template, expected_output) out of each brace-enclosed entry
 * of `test_cases`: the first three string literals directly inside it. */
static void parse_cases(Ref *r, const char *src) {
    const char *p = strstr(src, "std::vector<TestCase> test_cases {");
    int         depth = 1, n_fields = 0;

    assert_non_null(p);
    p = strchr(p, '{') + 1;
    while (*p != '\0' && depth > 0) {
        if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else if (p[0] == '/' && p[1] == '*') {
            p = strstr(p, "*/") + 2;
        } else if (*p == '"') {
            char *s;

            p++;
            s = cxx_string(&p);
            if (depth == 2 && n_fields < 3) {
                Case *c = &r->cases[r->n_cases - 1];
                char **f[3] = { &c->name, &c->tmpl, &c->expected };

                *f[n_fields++] = s;
            } else {
                free(s);
            }
        } else {
            if (*p == '{' && ++depth == 2) {
                assert_true(r->n_cases < MAX_CASES);
                r->n_cases++;
                n_fields = 0;
            }
            if (*p == '}') depth--;
            p++;
        }
    }
}

static int ref_setup(void **state) {
    Ref  *r = calloc(1, sizeof(*r));
    char  path[8192];
    char *src;

    *state = r;
    if (find_llama_src(r->src, sizeof(r->src)) != 0) {
        print_error("llama.cpp source not found: set OMNI_LLAMA_SRC or run "
                    "t/fetch-llama-src from the repository root\n");
        return -1;
    }
    snprintf(path, sizeof(path), "%s/tests/test-chat-template.cpp", r->src);
    src = read_file(path, NULL);
    if (src == NULL) {
        print_error("cannot read %s\n", path);
        return -1;
    }
    parse_cases(r, src);
    free(src);
    return 0;
}

static int ref_teardown(void **state) {
    Ref *r = *state;

    for (int i = 0; i < r->n_cases; i++) {
        free(r->cases[i].name);
        free(r->cases[i].tmpl);
        free(r->cases[i].expected);
    }
    free(r);
    return 0;
}


/* ---- helpers ---- */

static ChatTemplate detect_str(const char *s, bool *known) {
    return chat_detect(s, s != NULL ? strlen(s) : 0, known);
}

/* Renders into a fresh buffer and compares, showing both on a mismatch. */
static void expect_render(ChatTemplate t, const ChatMsg *msgs, int n,
                          unsigned flags, const char *want) {
    static char buf[1 << 16];
    Err         err;
    long        len = chat_render(t, msgs, n, flags, buf, sizeof(buf), NULL,
                                  &err);

    if (len < 0) fail_msg("%s: %s", chat_name(t), err.msg);
    if ((size_t) len != strlen(want) || memcmp(buf, want, (size_t) len) != 0)
    {
        fail_msg("%s renders\n[%s]\nwanted\n[%s]", chat_name(t), buf, want);
    }
}

static const char *family_of_case(const char *name) {
    for (int i = 0; i < COUNT(case_family); i++) {
        if (strcmp(case_family[i].name, name) == 0) {
            return case_family[i].family != NULL ? case_family[i].family
                                                 : "";
        }
    }
    fail_msg("llama.cpp test case \"%s\" is not in case_family", name);
    return NULL;
}


/* ---- against llama.cpp ---- */

static void test_llama_cpp_cases(void **state) {
    Ref *r = *state;
    int  rendered = 0;

    assert_int_equal(r->n_cases, COUNT(case_family));
    for (int i = 0; i < r->n_cases; i++) {
        const Case  *c = &r->cases[i];
        const char  *family = family_of_case(c->name);
        bool         known;
        ChatTemplate t = detect_str(c->tmpl, &known);

        if (*family == '\0') {
            if (known) {
                fail_msg("\"%s\" detected as %s, llama.cpp renders it with "
                         "a family we do not", c->name, chat_name(t));
            }
            continue;
        }
        if (!known || strcmp(chat_name(t), family) != 0) {
            fail_msg("\"%s\" detected as %s, wanted %s", c->name,
                     known ? chat_name(t) : "unknown", family);
        }
        expect_render(t, conversation, N_CONV, true, c->expected);
        rendered++;
    }
    assert_int_equal(rendered, 14);
}

static void test_llama_cpp_jinja_files(void **state) {
    Ref           *r = *state;
    char           dir[8192], path[16384];
    DIR           *d;
    struct dirent *e;
    int            seen = 0;

    snprintf(dir, sizeof(dir), "%s/models/templates", r->src);
    d = opendir(dir);
    if (d == NULL) fail_msg("cannot open %s", dir);
    while ((e = readdir(d)) != NULL) {
        size_t      n = strlen(e->d_name);
        const char *want = NULL;
        char       *text;
        size_t      len = 0;
        bool        known, listed = false;
        ChatTemplate t;

        if (n < 6 || strcmp(e->d_name + n - 6, ".jinja") != 0) continue;
        for (int i = 0; i < COUNT(jinja_family); i++) {
            if (strcmp(jinja_family[i].file, e->d_name) == 0) {
                want = jinja_family[i].family;
                listed = true;
            }
        }
        if (!listed) fail_msg("%s is not in jinja_family", e->d_name);

        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        text = read_file(path, &len);
        assert_non_null(text);
        t = chat_detect(text, len, &known);
        free(text);
        if (want == NULL ? known
                         : !known || strcmp(chat_name(t), want) != 0)
        {
            fail_msg("%s detected as %s, wanted %s", e->d_name,
                     known ? chat_name(t) : "unknown",
                     want != NULL ? want : "unknown");
        }
        seen++;
    }
    closedir(d);
    assert_int_equal(seen, COUNT(jinja_family));
}


/* ---- our own cases ---- */

/* Zephyr has no case in llama.cpp's test; the expected text is what its
 * renderer (LLM_CHAT_TEMPLATE_ZEPHYR) produces. llama.cpp detects Zephyr
 * only without a literal <|assistant|> (else it says GLM-Edge); we also
 * take StableLM 2 Zephyr's template, which has one. */
static void test_zephyr(void **state) {
    const char *stablelm = "{% for message in messages %}{% if message['role'] "
        "== 'user' %}{{'<|user|>\\n' + message['content'] + '<|endoftext|>'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + "
        "message['content'] + '<|endoftext|>'}}{% endif %}{% endfor %}";
    const char *by_role = "{% for message in messages %}{{'<|' + "
        "message['role'] + '|>\\n' + message['content'] + '<|endoftext|>'}}"
        "{% endfor %}{# <|user|> #}";
    const char *glm_edge = "<|user|>\\n{{ c }}<|assistant|>";
    bool        known;

    assert_int_equal(detect_str(stablelm, &known), CHAT_ZEPHYR);
    assert_true(known);
    assert_int_equal(detect_str(by_role, &known), CHAT_ZEPHYR);
    assert_true(known);
    detect_str(glm_edge, &known);
    assert_false(known);
    expect_render(CHAT_ZEPHYR, conversation, N_CONV, true,
        "<|system|>\nYou are a helpful assistant<|endoftext|>\n"
        "<|user|>\nHello<|endoftext|>\n"
        "<|assistant|>\nHi there<|endoftext|>\n"
        "<|user|>\nWho are you<|endoftext|>\n"
        "<|assistant|>\n   I am an assistant   <|endoftext|>\n"
        "<|user|>\nAnother question<|endoftext|>\n"
        "<|assistant|>\n");
}

static void test_generation_prompt(void **state) {
    const ChatMsg one[] = { { "user", " hi " } };

    expect_render(CHAT_CHATML, one, 1, false,
                  "<|im_start|>user\n hi <|im_end|>\n");
    expect_render(CHAT_LLAMA3, one, 1, false,
                  "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
    expect_render(CHAT_LLAMA3, one, 1, true,
                  "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(CHAT_PHI3, one, 1, false, "<|user|>\n hi <|end|>\n");
    expect_render(CHAT_GEMMA, one, 1, false,
                  "<start_of_turn>user\nhi<end_of_turn>\n");
    /* [INST] prompts end with [/INST] either way */
    expect_render(CHAT_LLAMA2_SYS, one, 1, false, "[INST]  hi  [/INST]");
    expect_render(CHAT_LLAMA2_SYS, one, 1, true, "[INST]  hi  [/INST]");
    expect_render(CHAT_MISTRAL_V7_TEKKEN, one, 1, true, "[INST] hi [/INST]");
    expect_render(CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");
}

/* Gemma folds system text into the next user turn: trimmed, several
 * system messages glued together, kept across model turns, and nothing
 * at all for an empty one. */
static void test_gemma_system(void **state) {
    const ChatMsg two_sys[] = {
        { "system", " A " }, { "system", "B\n" }, { "user", "Q" },
    };
    const ChatMsg late_sys[] = {
        { "user", "Q1" }, { "system", "S" }, { "assistant", "A1" },
        { "user", "Q2" },
    };
    const ChatMsg empty_sys[] = { { "system", "  " }, { "user", "Q" } };

    expect_render(CHAT_GEMMA, two_sys, 3, true,
                  "<start_of_turn>user\nAB\n\nQ<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_render(CHAT_GEMMA, late_sys, 4, false,
                  "<start_of_turn>user\nQ1<end_of_turn>\n"
                  "<start_of_turn>model\nA1<end_of_turn>\n"
                  "<start_of_turn>user\nS\n\nQ2<end_of_turn>\n");
    expect_render(CHAT_GEMMA, empty_sys, 2, false,
                  "<start_of_turn>user\nQ<end_of_turn>\n");
}

static void test_mistral_v7_tekken(void **state) {
    bool known;

    assert_int_equal(detect_str("mistral-v7-tekken", &known),
                     CHAT_MISTRAL_V7_TEKKEN);
    assert_true(known);
    expect_render(CHAT_MISTRAL_V7_TEKKEN, conversation, N_CONV, true,
                  "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT]"
                  "[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]"
                  "   I am an assistant   </s>[INST]Another question[/INST]");
}

static void test_plain(void **state) {
    bool known = false;

    assert_int_equal(detect_str(NULL, &known), CHAT_PLAIN);
    assert_true(known);
    assert_int_equal(detect_str("", &known), CHAT_PLAIN);
    assert_true(known);
    expect_render(CHAT_PLAIN, conversation, 3, true,
                  "System: You are a helpful assistant\n\n"
                  "User: Hello\n\n"
                  "Assistant: Hi there\n\n"
                  "Assistant:");
    expect_render(CHAT_PLAIN, conversation + 1, 1, false, "User: Hello\n\n");
}

static void test_detect_edges(void **state) {
    bool known = true;

    assert_int_equal(detect_str("{{ messages }}", &known), CHAT_PLAIN);
    assert_false(known);
    /* Phi-4 contains <|im_start|> but is not ChatML */
    assert_int_equal(detect_str("<|im_start|>user<|im_sep|>", &known),
                     CHAT_PLAIN);
    assert_false(known);
    /* Falcon 3 has <|user|> and <|assistant|>, but no <|end|> */
    detect_str("<|user|> <|assistant|> </s> <|endoftext|>", &known);
    assert_false(known);
    /* a template starting with "mistral" takes the [INST] branch */
    assert_int_equal(detect_str("mistral-ish", &known), CHAT_LLAMA2);
    assert_true(known);
    /* detection only reads len bytes */
    assert_int_equal(chat_detect("<|im_start|>", 11, &known), CHAT_PLAIN);
    assert_false(known);
    assert_int_equal(chat_detect("chatml!", 6, NULL), CHAT_CHATML);
}

/* Gemma 3's template (google/gemma-3-*-it; llama.cpp's models/templates
 * has Gemma 2's only): its markers are Gemma's, and nothing earlier in
 * the chain matches, so llama.cpp renders it as "gemma". Its image items
 * (<start_of_image>) do not change that. */
static void test_gemma3_template(void **state) {
    static const char gemma3[] =
        "{{ bos_token }}\n"
        "{%- if messages[0]['role'] == 'system' -%}\n"
        "    {%- set first_user_prefix = messages[0]['content'][0]['text']"
        " + '\n\n' -%}\n"
        "    {%- set loop_messages = messages[1:] -%}\n"
        "{%- endif -%}\n"
        "{%- for message in loop_messages -%}\n"
        "    {%- if (message['role'] == 'assistant') -%}\n"
        "        {%- set role = \"model\" -%}\n"
        "    {%- else -%}\n"
        "        {%- set role = message['role'] -%}\n"
        "    {%- endif -%}\n"
        "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if "
        "loop.first else \"\") }}\n"
        "    {%- for item in message['content'] -%}\n"
        "        {%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}\n"
        "        {%- elif item['type'] == 'text' -%}"
        "{{ item['text'] | trim }}{%- endif -%}\n"
        "    {%- endfor -%}\n"
        "    {{ '<end_of_turn>\n' }}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}"
        "{%- endif -%}\n";
    bool known = false;

    (void) state;
    assert_int_equal(detect_str(gemma3, &known), CHAT_GEMMA);
    assert_true(known);
}

static void test_names(void **state) {
    for (int t = CHAT_PLAIN; t <= CHAT_QWEN3; t++) {
        bool known;

        assert_int_equal(chat_from_name(chat_name((ChatTemplate) t)), t);
        assert_int_equal(detect_str(chat_name((ChatTemplate) t), &known), t);
        assert_true(known);
    }
    assert_int_equal(chat_from_name("phi4"), -1);
    assert_int_equal(chat_from_name(""), -1);
    assert_string_equal(chat_name(CHAT_MISTRAL_V3_TEKKEN),
                        "mistral-v3-tekken");
}

/* Qwen3: detected from its real template (llama.cpp's copy of
 * Qwen/Qwen3-0.6B's), not from look-alikes; rendered as that template
 * does (the expected texts are its Jinja output, rendered with jinja2):
 * assistant turns without their reasoning (up to the last </think>, then
 * newlines only stripped), and thinking off as an empty think block after
 * the generation prompt. Only qwen3 thinks; others ignore CHAT_NO_THINK. */
static void test_qwen3(void **state) {
    Ref          *r = *state;
    char          path[8192], *text, *p;
    size_t        len = 0;
    bool          known;
    const ChatMsg conv[] = {
        { "system",    "You are a helpful assistant" },
        { "user",      "Hello" },
        { "assistant", "<think>\nsome thought\n</think>\n\nHi there" },
        { "user",      "Who are you" },
        { "assistant", "   I am an assistant   " },
        { "user",      "Another question" },
    };
    const ChatMsg twice[] = {
        { "user", "Q" }, { "assistant", "a</think>b</think>\n\n c" },
        { "user", "R" },
    };
    const char   *want =
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n"
        "<|im_start|>user\nWho are you<|im_end|>\n"
        "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
        "<|im_start|>user\nAnother question<|im_end|>\n"
        "<|im_start|>assistant\n";
    char          no_think[1024];

    snprintf(path, sizeof(path), "%s/models/templates/Qwen-Qwen3-0.6B.jinja",
             r->src);
    text = read_file(path, &len);
    if (text == NULL) fail_msg("cannot read %s", path);
    assert_int_equal(chat_detect(text, len, &known), CHAT_QWEN3);
    assert_true(known);
    assert_true(chat_thinks(CHAT_QWEN3));

    /* without enable_thinking's empty block it is plain chatml */
    assert_non_null(strstr(text, "enable_thinking"));
    while ((p = strstr(text, "enable_thinking")) != NULL) {
        memcpy(p, "disable_thinkin", 15);
    }
    assert_int_equal(chat_detect(text, len, &known), CHAT_CHATML);
    free(text);
    for (int t = CHAT_PLAIN; t < CHAT_QWEN3; t++) {
        assert_false(chat_thinks((ChatTemplate) t));
    }

    expect_render(CHAT_QWEN3, conv, 6, CHAT_ADD_GEN, want);
    snprintf(no_think, sizeof(no_think), "%s<think>\n\n</think>\n\n", want);
    expect_render(CHAT_QWEN3, conv, 6, CHAT_ADD_GEN | CHAT_NO_THINK,
                  no_think);
    expect_render(CHAT_QWEN3, twice, 3, 0,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\n c<|im_end|>\n"
                  "<|im_start|>user\nR<|im_end|>\n");
    /* no generation prompt: no think block either */
    expect_render(CHAT_QWEN3, twice, 1, CHAT_NO_THINK,
                  "<|im_start|>user\nQ<|im_end|>\n");
    /* chatml keeps the reasoning and ignores thinking off */
    expect_render(CHAT_CHATML, twice, 2, CHAT_ADD_GEN | CHAT_NO_THINK,
                  "<|im_start|>user\nQ<|im_end|>\n"
                  "<|im_start|>assistant\na</think>b</think>\n\n c"
                  "<|im_end|>\n<|im_start|>assistant\n");
}

/* ends[] for qwen3: each message's end depends on it and those before. */
static void test_qwen3_ends(void **state) {
    const ChatMsg m[] = {
        { "user", "Q" }, { "assistant", "<think>x</think>\nA" },
        { "user", "R" },
    };
    char   buf[512];
    size_t ends[3];
    long   n = chat_render(CHAT_QWEN3, m, 3, CHAT_ADD_GEN, buf, sizeof(buf),
                           ends, NULL);

    assert_true(n > 0);
    assert_int_equal(ends[0], strlen("<|im_start|>user\nQ<|im_end|>\n"));
    assert_int_equal(ends[1], ends[0]
                     + strlen("<|im_start|>assistant\nA<|im_end|>\n"));
    assert_int_equal(ends[2], (size_t) n - strlen("<|im_start|>assistant\n"));
}

static void test_roles(void **state) {
    const ChatMsg tool[] = { { "tool", "42" } };
    const ChatMsg bad[] = { { "user", "x" }, { "us|>er", "y" } };
    const ChatMsg no_content[] = { { "user", NULL } };
    char          buf[256];
    Err           err;

    expect_render(CHAT_CHATML, tool, 1, false,
                  "<|im_start|>tool\n42<|im_end|>\n");
    assert_int_equal(chat_render(CHAT_GEMMA, tool, 1, true, buf, sizeof(buf),
                                 NULL, &err), -1);
    assert_string_equal(err.msg,
                        "messages[0]: chat template 'gemma' has no role "
                        "'tool'");
    assert_int_equal(chat_render(CHAT_PLAIN, tool, 1, true, buf, sizeof(buf),
                                 NULL, &err), -1);
    assert_int_equal(chat_render(CHAT_MISTRAL_V3, tool, 1, true, buf,
                                 sizeof(buf), NULL, &err), -1);
    assert_int_equal(chat_render(CHAT_CHATML, bad, 2, true, buf, sizeof(buf),
                                 NULL, &err), -1);
    assert_non_null(strstr(err.msg, "messages[1]"));
    assert_int_equal(chat_render(CHAT_LLAMA3, no_content, 1, true, buf,
                                 sizeof(buf), NULL, &err), -1);
    assert_int_equal(chat_render((ChatTemplate) 99, tool, 1, true, buf,
                                 sizeof(buf), NULL, &err), -1);
}

/* A short buffer still gives the full length, truncated and terminated;
 * the retry with that length + 1 gets it all. */
static void test_short_buffer(void **state) {
    char full[1024], small[10];
    long n = chat_render(CHAT_CHATML, conversation, N_CONV, true, full,
                         sizeof(full), NULL, NULL);

    assert_true(n > 100);
    assert_int_equal(chat_render(CHAT_CHATML, conversation, N_CONV, true,
                                 small, sizeof(small), NULL, NULL), n);
    assert_memory_equal(small, full, sizeof(small) - 1);
    assert_int_equal(small[sizeof(small) - 1], '\0');
    assert_int_equal(chat_render(CHAT_CHATML, conversation, N_CONV, true,
                                 NULL, 0, NULL, NULL), n);
    assert_int_equal(chat_render(CHAT_CHATML, conversation, N_CONV, true,
                                 full, (size_t) n + 1, NULL, NULL), n);
    assert_int_equal(full[n], '\0');
    assert_int_equal((long) strlen(full), n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_cpp_cases),
        cmocka_unit_test(test_llama_cpp_jinja_files),
        cmocka_unit_test(test_zephyr),
        cmocka_unit_test(test_generation_prompt),
        cmocka_unit_test(test_gemma_system),
        cmocka_unit_test(test_mistral_v7_tekken),
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_detect_edges),
        cmocka_unit_test(test_gemma3_template),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_qwen3_ends),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_short_buffer),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("chat", tests, ref_setup,
                                       ref_teardown);
}

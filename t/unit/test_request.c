/* test_request.c -- the normalized request JSON (engine/request/request.c).
 *
 * Every accepted request must also pass the checks downstream of the
 * parser (sampler_init, stop_init), so the valid cases feed the result to
 * both. Every rejected one must name the parameter exactly as the OpenAI
 * API does, be a 400, leave the request owning nothing, and (under ASan)
 * leak nothing: truncated bodies are tried at every length. Text that is
 * not UTF-8 is refused in every field (json_scan.h has the validator's own
 * test, test_json_scan.c); a request without a seed gets a fresh one. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "request.h"
#include "sampler.h"
#include "stop.h"

#define BAD_JSON "We could not parse the JSON body of your request"

static const char FULL[] =
    "{\"model\": \"stories260K\","
    " \"messages\": ["
    "   {\"role\": \"developer\", \"content\": \"Be brief.\"},"
    "   {\"role\": \"user\", \"name\": \"ann\", \"content\": ["
    "       {\"type\": \"text\", \"text\": \"Hi\"},"
    "       {\"type\": \"text\", \"text\": \"there\"}]},"
    "   {\"role\": \"assistant\", \"content\": null,"
    "    \"tool_calls\": [{\"id\": \"c1\"}]},"
    "   {\"role\": \"tool\", \"content\": \"42\"},"
    "   {\"role\": \"system\", \"content\": \"\"}],"
    " \"max_tokens\": 16, \"temperature\": 0.5, \"top_p\": 0.9,"
    " \"top_k\": 40, \"min_p\": 0.05, \"seed\": 9223372036854775807,"
    " \"presence_penalty\": -1.5, \"frequency_penalty\": 2,"
    " \"logit_bias\": {\"1234\": -100, \"7\": 2.5},"
    " \"stop\": [\"\\n\", \"User:\"], \"ignore_eos\": true,"
    " \"thinking\": false,"
    " \"cache_salt\": \"tenant-7\", \"stream\": true,"
    " \"response_format\": {\"type\": \"text\"}}";


/* ---- helpers ---- */

static void parse_len(const char *json, size_t len, OmniRequest *r) {
    ReqError e;

    if (request_parse(r, json, len, &e) != 0) {
        fail_msg("rejected (param '%s'): %s", e.param, e.err.msg);
    }
}

static void parse_ok(const char *json, OmniRequest *r) {
    parse_len(json, strlen(json), r);
}

/* The sampler and the stop matcher take what the parser accepted. */
static void downstream_ok(const OmniRequest *r) {
    Sampler     s;
    StopMatcher m;
    Err         err;

    if (sampler_init(&s, &r->sampling, 3000, &err) != 0) {
        fail_msg("sampler: %s", err.msg);
    }
    sampler_free(&s);
    if (stop_init(&m, r->stop, r->n_stop, &err) != 0) {
        fail_msg("stop: %s", err.msg);
    }
}

/* Rejected with this param and a message containing want. */
static void rejects_len(const char *json, size_t len, const char *param,
                        const char *want) {
    OmniRequest r;
    ReqError    e;

    if (request_parse(&r, json, len, &e) == 0) {
        request_free(&r);
        fail_msg("accepted: %.200s", json);
    }
    if (strcmp(e.param, param) != 0 || strstr(e.err.msg, want) == NULL) {
        fail_msg("%.200s\n  got param '%s': %s\n  want param '%s': ...%s...",
                 json, e.param, e.err.msg, param, want);
    }
    assert_int_equal(e.status, 400);
    assert_null(r.arena);
    assert_null(r.msgs);
    assert_null(r.prompt);
}

static void rejects(const char *json, const char *param, const char *want) {
    rejects_len(json, strlen(json), param, want);
}

/* "{"prompt": "x", <fields>}" */
static void rejects_field(const char *fields, const char *param,
                          const char *want) {
    char json[8192];

    snprintf(json, sizeof(json), "{\"prompt\": \"x\", %s}", fields);
    rejects(json, param, want);
}

static void accepts_field(const char *fields, OmniRequest *r) {
    char json[8192];

    snprintf(json, sizeof(json), "{\"prompt\": \"x\", %s}", fields);
    parse_ok(json, r);
    downstream_ok(r);
}

/* A malloc'd string: prefix, n copies of unit, suffix. */
static char *repeat(const char *prefix, const char *unit, size_t n,
                    const char *suffix) {
    size_t lp = strlen(prefix), lu = strlen(unit), ls = strlen(suffix);
    char  *s = malloc(lp + lu * n + ls + 1), *at = s;

    assert_non_null(s);
    memcpy(at, prefix, lp);
    at += lp;
    for (size_t i = 0; i < n; i++, at += lu) memcpy(at, unit, lu);
    memcpy(at, suffix, ls + 1);
    return s;
}


/* Audio in: a transcription, and chat parts that place each input. */
static void test_audio_in(void **state) {
    OmniRequest r;

    (void) state;
    parse_ok("{\"audio_in\": [{\"format\": \"mp3\", \"bytes\": 1000, "
             "\"param\": \"file\"}], \"transcribe\": {\"language\": \"en\", "
             "\"prompt\": \"x\", \"words\": true}, "
             "\"max_audio_seconds\": 30}", &r);
    assert_true(r.transcribe);
    assert_true(r.words);
    assert_string_equal(r.language, "en");
    assert_int_equal(r.n_audio_in, 1);
    assert_int_equal(r.audio_in[0].format, AUDIO_IN_MP3);
    assert_int_equal(r.audio_in[0].bytes, 1000);
    assert_string_equal(r.audio_in[0].param, "file");
    assert_int_equal(r.audio_in_bytes, 1000);
    assert_true(r.max_audio_seconds == 30);
    assert_false(r.chat);
    assert_null(r.prompt);
    request_free(&r);

    /* without the texts, the parts are "" */
    parse_ok("{\"audio_in\": [{\"bytes\": 5}, {\"format\": \"ogg\", "
             "\"bytes\": 7}], \"messages\": [{\"role\": \"user\", "
             "\"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
             "{\"type\": \"input_audio\", \"index\": 1}, "
             "{\"type\": \"input_audio\", \"index\": 0}]}]}", &r);
    assert_int_equal(r.audio_in[0].format, AUDIO_IN_AUTO);
    assert_int_equal(r.audio_in[1].format, AUDIO_IN_OPUS);
    assert_string_equal(r.audio_in[0].param, "");
    assert_int_equal(r.audio_in_bytes, 12);
    assert_true(r.max_audio_seconds == REQ_MAX_AUDIO_SECONDS_DEFAULT);
    assert_string_equal(r.msgs[0].content, "a\n\n");
    request_free(&r);

    /* the frontend's texts take their places */
    parse_ok("{\"audio_in\": [{\"bytes\": 5}, {\"bytes\": 7}], "
             "\"audio_in_text\": [\"zero\", \"one\"], "
             "\"messages\": [{\"role\": \"user\", \"content\": "
             "[{\"type\": \"text\", \"text\": \"a\"}, "
             "{\"type\": \"input_audio\", \"index\": 1}, "
             "{\"type\": \"input_audio\", \"index\": 0}]}]}", &r);
    assert_string_equal(r.msgs[0].content, "a\none\nzero");
    assert_string_equal(r.audio_in_text[1], "one");
    request_free(&r);

    rejects("{\"audio_in\": [], \"transcribe\": {}}", "audio_in",
            "1 to 16 inputs");
    rejects("{\"audio_in\": [{\"bytes\": 0}], \"transcribe\": {}}",
            "audio_in[0].bytes", ">= 1");
    rejects("{\"audio_in\": [{\"bytes\": 1, \"format\": \"webm\"}], "
            "\"transcribe\": {}}", "audio_in[0].format", "got 'webm'");
    rejects("{\"audio_in\": [{\"format\": \"wav\"}], \"transcribe\": {}}",
            "audio_in[0].bytes", "is required");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"transcribe\": "
            "{\"language\": \"fr\"}}", "language", "unsupported language "
            "'fr'");
    rejects("{\"audio_in\": [{\"bytes\": 1}, {\"bytes\": 1}], "
            "\"transcribe\": {}}", "audio_in", "exactly one audio input");
    rejects("{\"transcribe\": {}}", "audio_in", "exactly one audio input");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"transcribe\": {}, "
            "\"prompt\": \"x\"}", "transcribe", "no messages, prompt");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"prompt\": \"x\"}",
            "audio_in", "needs messages");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"messages\": [{\"role\": "
            "\"user\", \"content\": \"x\"}]}", "audio_in",
            "audio_in[0] is in no message");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"messages\": [{\"role\": "
            "\"user\", \"content\": [{\"type\": \"input_audio\", "
            "\"index\": 0}, {\"type\": \"input_audio\", \"index\": 0}]}]}",
            "messages[0].content[1].index", "used twice");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"messages\": [{\"role\": "
            "\"user\", \"content\": [{\"type\": \"input_audio\", "
            "\"index\": 1}]}]}", "messages[0].content[0].index",
            "at most 0");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"messages\": [{\"role\": "
            "\"system\", \"content\": [{\"type\": \"input_audio\", "
            "\"index\": 0}]}]}", "messages[0].content[0]",
            "user messages only");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": "
            "[{\"type\": \"input_audio\", \"index\": 0}]}]}",
            "messages[0].content[0].index", "audio_in, which is absent");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"audio_in_text\": [], "
            "\"transcribe\": {}}", "audio_in_text", "one text per");
    rejects("{\"audio_in\": [{\"bytes\": 1}], \"transcribe\": {}, "
            "\"max_audio_seconds\": 0}", "max_audio_seconds", "(0, 86400]");
    rejects("{\"audio_in\": [{\"bytes\": 99999999999}], \"transcribe\": {}}",
            "audio_in[0].bytes", "at most");
}

/* ---- valid requests ---- */

static void test_full_request(void **state) {
    OmniRequest r;

    parse_ok(FULL, &r);
    downstream_ok(&r);
    assert_string_equal(r.model, "stories260K");
    assert_true(r.chat);
    assert_null(r.prompt);
    assert_int_equal(r.n_msgs, 5);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "Be brief.");
    assert_string_equal(r.msgs[1].role, "user");
    assert_string_equal(r.msgs[1].content, "Hi\nthere");
    assert_string_equal(r.msgs[2].role, "assistant");
    assert_string_equal(r.msgs[2].content, "");
    assert_string_equal(r.msgs[3].role, "tool");
    assert_string_equal(r.msgs[3].content, "42");
    assert_string_equal(r.msgs[4].role, "system");
    assert_string_equal(r.msgs[4].content, "");
    assert_int_equal(r.max_tokens, 16);
    assert_true(r.sampling.temperature == 0.5f);
    assert_true(r.sampling.top_p == 0.9f);
    assert_int_equal(r.sampling.top_k, 40);
    assert_true(r.sampling.min_p == 0.05f);
    assert_true(r.sampling.seed == (uint64_t) INT64_MAX);
    assert_true(r.sampling.presence_penalty == -1.5f);
    assert_true(r.sampling.frequency_penalty == 2.0f);
    assert_int_equal(r.sampling.n_bias, 2);
    assert_int_equal(r.sampling.bias[0].token, 1234);
    assert_true(r.sampling.bias[0].bias == -100.0f);
    assert_int_equal(r.sampling.bias[1].token, 7);
    assert_true(r.sampling.bias[1].bias == 2.5f);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "User:");
    assert_true(r.ignore_eos);
    assert_false(r.thinking);
    assert_string_equal(r.cache_salt, "tenant-7");
    assert_int_equal(r.cache_salt_len, 8);
    assert_non_null(r.arena);
    request_free(&r);
    assert_null(r.arena);
    request_free(&r);           // a freed request frees again safely
}

static void test_defaults(void **state) {
    OmniRequest   r;
    SamplerParams def;

    sampler_params_default(&def);
    parse_ok("{\"prompt\": \"Once upon\"}", &r);
    assert_true(r.seed_drawn);              // test_seed checks the value
    def.seed = r.sampling.seed;
    assert_null(r.model);
    assert_false(r.chat);
    assert_null(r.msgs);
    assert_int_equal(r.n_msgs, 0);
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.prompt_len, 9);
    assert_int_equal(r.max_tokens, -1);
    assert_memory_equal(&r.sampling, &def, sizeof(def));
    assert_int_equal(r.n_stop, 0);
    assert_false(r.ignore_eos);
    assert_true(r.thinking);
    assert_null(r.cache_salt);
    assert_int_equal(r.cache_salt_len, 0);
    request_free(&r);

    parse_ok("{\"prompt\": \"\"}", &r);     // empty: the stage decides
    assert_string_equal(r.prompt, "");
    assert_int_equal(r.prompt_len, 0);
    request_free(&r);
}

/* JSON null is absence, for every optional field. */
static void test_nulls(void **state) {
    static const char json[] =
        "{\"model\": null, \"messages\": null, \"prompt\": \"p\","
        " \"max_tokens\": null, \"temperature\": null, \"top_p\": null,"
        " \"top_k\": null, \"min_p\": null, \"seed\": null,"
        " \"presence_penalty\": null, \"frequency_penalty\": null,"
        " \"logit_bias\": null, \"stop\": null, \"ignore_eos\": null,"
        " \"cache_salt\": null}";
    OmniRequest   r;
    SamplerParams def;

    sampler_params_default(&def);
    parse_ok(json, &r);
    assert_true(r.seed_drawn);
    def.seed = r.sampling.seed;
    assert_false(r.chat);
    assert_null(r.model);
    assert_int_equal(r.max_tokens, -1);
    assert_memory_equal(&r.sampling, &def, sizeof(def));
    assert_int_equal(r.n_stop, 0);
    assert_null(r.cache_salt);
    request_free(&r);

    parse_ok("{\"prompt\": null, \"messages\": [{\"role\": \"user\","
             " \"content\": \"hi\"}]}", &r);
    assert_true(r.chat);
    request_free(&r);

    rejects("{\"prompt\": null}", "messages", "required");
    rejects("{\"messages\": [{\"role\": null, \"content\": \"x\"}]}",
            "messages[0].role", "is required");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": null}]}",
            "messages[0].content", "is required");
}

/* A key given twice: the last value counts; unknown keys are ignored. */
static void test_duplicates_and_unknown(void **state) {
    OmniRequest r;

    parse_ok("{\"prompt\": \"a\", \"x\": {\"y\": [1, {\"z\": null}]},"
             " \"prompt\": \"b\", \"top_k\": 1, \"top_k\": 2}", &r);
    assert_string_equal(r.prompt, "b");
    assert_int_equal(r.sampling.top_k, 2);
    request_free(&r);

    accepts_field("\"logit_bias\": {\"5\": 1, \"6\": 3, \"05\": -2}", &r);
    assert_int_equal(r.sampling.n_bias, 2);
    assert_int_equal(r.sampling.bias[0].token, 5);
    assert_true(r.sampling.bias[0].bias == -2.0f);
    request_free(&r);
}


/* ---- input and messages ---- */

static void test_input_errors(void **state) {
    char *many;

    rejects("{}", "messages", "one of messages or prompt is required");
    rejects("{\"model\": \"m\"}", "messages", "required");
    rejects("{\"prompt\": \"x\", \"messages\": [{\"role\": \"user\","
            " \"content\": \"y\"}]}", "prompt", "not several");
    rejects("{\"messages\": []}", "messages", "must not be empty");
    rejects("{\"messages\": \"hi\"}", "messages",
            "expected an array, got a string");
    rejects("{\"messages\": {}}", "messages", "got an object");
    rejects("{\"prompt\": 5}", "prompt", "expected a string, got a number");
    rejects("{\"prompt\": [\"a\"]}", "prompt", "got an array");
    rejects("{\"prompt\": \"x\", \"model\": 1}", "model",
            "expected a string");

    many = repeat("{\"messages\": [", "{\"role\":\"user\",\"content\":\"a\"},",
                  REQ_MAX_MESSAGES, "{\"role\":\"user\",\"content\":\"b\"}]}");
    rejects(many, "messages", "at most 4096 messages, got 4097");
    free(many);
}

/* Speech out: "input" with "audio", chat with "audio", assistant turns
 * that refer to earlier audio. */
static void test_speech(void **state) {
    OmniRequest r;
    char       *big;

    (void) state;
    parse_ok("{\"input\": \"Hello there.\", \"audio\": {\"voice\": "
             "\"alloy\"}}", &r);
    assert_string_equal(r.input, "Hello there.");
    assert_int_equal(r.input_len, 12);
    assert_false(r.chat);
    assert_true(r.speech.on);
    assert_string_equal(r.speech.voice->name, "alloy");
    assert_string_equal(r.speech.voice->flite, "rms");
    assert_int_equal(r.speech.format, AUDIO_MP3);
    assert_int_equal(r.speech.mode, SPEECH_LATENCY);
    assert_true(r.speech.speed == 1.0f);
    assert_null(r.speech.id);
    request_free(&r);

    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"},"
             " {\"role\": \"assistant\", \"audio\": {\"id\": \"audio_1\"}},"
             " {\"role\": \"user\", \"content\": \"More\"}],"
             " \"audio\": {\"voice\": \"slt\", \"format\": \"pcm\","
             " \"speed\": 0.25, \"mode\": \"quality\", \"id\": \"audio_2\"}}",
             &r);
    assert_true(r.chat);
    assert_null(r.audio_ids[0]);
    assert_string_equal(r.audio_ids[1], "audio_1");
    assert_string_equal(r.msgs[1].content, "");
    assert_int_equal(r.speech.format, AUDIO_PCM);
    assert_int_equal(r.speech.mode, SPEECH_QUALITY);
    assert_true(r.speech.speed == 0.25f);
    assert_string_equal(r.speech.id, "audio_2");
    request_free(&r);

    /* 4096 characters of two bytes each pass; one more does not */
    big = repeat("{\"audio\": {\"voice\": \"ash\"}, \"input\": \"",
                 "\xc3\xa9", 4096, "\"}");
    parse_ok(big, &r);
    assert_int_equal(r.input_len, 8192);
    request_free(&r);
    free(big);
    big = repeat("{\"audio\": {\"voice\": \"ash\"}, \"input\": \"",
                 "a", 4097, "\"}");
    rejects(big, "input", "must be 1 to 4096 characters, got 4097");
    free(big);

    rejects("{\"input\": \"\", \"audio\": {\"voice\": \"ash\"}}", "input",
            "got 0");
    rejects("{\"input\": \"x\"}", "audio", "is required with input");
    rejects("{\"input\": \"x\", \"prompt\": \"y\", \"audio\": {\"voice\":"
            " \"ash\"}}", "input", "not several");
    rejects_field("\"audio\": {}", "audio.voice", "is required");
    rejects_field("\"audio\": []", "audio", "expected an object");
    rejects_field("\"audio\": {\"voice\": \"bob\"}", "audio.voice",
                  "unknown voice 'bob'");
    rejects_field("\"audio\": {\"voice\": {\"id\": \"v1\"}}", "audio.voice",
                  "expected a string");
    rejects_field("\"audio\": {\"voice\": \"ash\", \"format\": \"ogg\"}",
                  "audio.format", "must be one of mp3, opus, aac, flac, wav "
                  "and pcm, got 'ogg'");
    rejects_field("\"audio\": {\"voice\": \"ash\", \"mode\": \"fast\"}",
                  "audio.mode", "latency and quality");
    rejects_field("\"audio\": {\"voice\": \"ash\", \"speed\": 4.01}",
                  "audio.speed", "between 0.25 and 4");
    rejects_field("\"audio\": {\"voice\": \"ash\", \"speed\": 0.2}",
                  "audio.speed", "between 0.25 and 4");
    rejects_field("\"audio\": {\"voice\": \"ash\", \"id\": \"a b\"}",
                  "audio.id", "A-Z, a-z, 0-9");
    rejects("{\"messages\": [{\"role\": \"user\", \"audio\": {\"id\":"
            " \"a\"}, \"content\": \"x\"}]}", "messages[0].audio",
            "only an assistant message");
    rejects("{\"messages\": [{\"role\": \"assistant\", \"audio\": {}}]}",
            "messages[0].audio.id", "is required");
    rejects("{\"messages\": [{\"role\": \"assistant\", \"audio\": 3}]}",
            "messages[0].audio", "expected an object");
}

static void test_many_messages(void **state) {
    OmniRequest r;
    char       *json = repeat("{\"messages\": [",
                              "{\"role\":\"user\",\"content\":\"abc\"},",
                              REQ_MAX_MESSAGES - 1,
                              "{\"role\":\"assistant\",\"content\":\"z\"}]}");

    parse_ok(json, &r);
    assert_int_equal(r.n_msgs, REQ_MAX_MESSAGES);
    for (int i = 0; i < REQ_MAX_MESSAGES - 1; i++) {
        assert_string_equal(r.msgs[i].role, "user");
        assert_string_equal(r.msgs[i].content, "abc");
    }
    assert_string_equal(r.msgs[REQ_MAX_MESSAGES - 1].content, "z");
    request_free(&r);
    free(json);
}

static void test_roles(void **state) {
    static const char *const roles[][2] = {
        { "system", "system" }, { "user", "user" },
        { "assistant", "assistant" }, { "developer", "system" },
        { "tool", "tool" },
    };
    OmniRequest r;
    char        json[256];

    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        snprintf(json, sizeof(json), "{\"messages\": [{\"role\": \"%s\","
                 " \"content\": \"c\"}]}", roles[i][0]);
        parse_ok(json, &r);
        assert_string_equal(r.msgs[0].role, roles[i][1]);
        request_free(&r);
    }
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"},"
            " {\"role\": \"bot\", \"content\": \"b\"}]}",
            "messages[1].role", "got 'bot'");
    rejects("{\"messages\": [{\"role\": \"User\", \"content\": \"a\"}]}",
            "messages[0].role", "must be one of");
    rejects("{\"messages\": [{\"role\": 1, \"content\": \"a\"}]}",
            "messages[0].role", "expected a string, got a number");
    rejects("{\"messages\": [{\"content\": \"a\"}]}",
            "messages[0].role", "is required");
    rejects("{\"messages\": [\"hi\"]}", "messages[0]",
            "expected an object, got a string");
    /* a long role is quoted back clipped, at a character boundary */
    rejects("{\"messages\": [{\"role\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
            "xxx\xc3\xa9\xc3\xa9\xc3\xa9\", \"content\": \"a\"}]}",
            "messages[0].role",
            "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\xc3\xa9...'");
}

static void test_content(void **state) {
    OmniRequest r;

    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": []}]}", &r);
    assert_string_equal(r.msgs[0].content, "");
    request_free(&r);
    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": [{\"text\":"
             " \"only\", \"type\": \"text\"}]}]}", &r);
    assert_string_equal(r.msgs[0].content, "only");
    request_free(&r);
    parse_ok("{\"messages\": [{\"role\": \"assistant\"}]}", &r);
    assert_string_equal(r.msgs[0].content, "");
    request_free(&r);

    rejects("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\":"
            " \"text\", \"text\": \"a\"}, {\"type\": \"image_url\","
            " \"image_url\": {\"url\": \"http://x\"}}]}]}",
            "messages[0].content[1].type",
            "unsupported content part type 'image_url'");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"},"
            " {\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}]}]}",
            "messages[1].content[0].index",
            "is required");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\":"
            " [{\"text\": \"a\"}]}]}",
            "messages[0].content[0].type", "is required");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\":"
            " [{\"type\": 3}]}]}",
            "messages[0].content[0].type", "expected a string");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\":"
            " [{\"type\": \"text\"}]}]}",
            "messages[0].content[0].text", "is required");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\":"
            " [{\"type\": \"text\", \"text\": [\"a\"]}]}]}",
            "messages[0].content[0].text", "expected a string, got an array");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": [\"a\"]}]}",
            "messages[0].content[0]", "expected an object, got a string");
    rejects("{\"messages\": [{\"role\": \"user\", \"content\": 7}]}",
            "messages[0].content",
            "expected a string or an array of content parts, got a number");
    rejects("{\"messages\": [{\"role\": \"user\"}]}",
            "messages[0].content", "is required");
}


/* ---- parameters ---- */

typedef struct {
    const char *fields;
    const char *param;
    const char *want;
} Bad;

static const Bad BAD_TYPES[] = {
    { "\"temperature\": \"1\"", "temperature", "expected a number, got a string" },
    { "\"temperature\": true", "temperature", "got a boolean" },
    { "\"top_p\": [1]", "top_p", "expected a number, got an array" },
    { "\"top_k\": \"40\"", "top_k", "expected an integer, got a string" },
    { "\"top_k\": 1.5", "top_k", "expected an integer, got 1.5" },
    { "\"min_p\": {}", "min_p", "expected a number, got an object" },
    { "\"seed\": \"42\"", "seed", "expected an integer, got a string" },
    { "\"seed\": 0.5", "seed", "expected an integer, got 0.5" },
    { "\"presence_penalty\": false", "presence_penalty", "got a boolean" },
    { "\"frequency_penalty\": \"0\"", "frequency_penalty", "got a string" },
    { "\"max_tokens\": \"16\"", "max_tokens", "expected an integer, got a string" },
    { "\"max_tokens\": 16.5", "max_tokens", "expected an integer, got 16.5" },
    { "\"max_tokens\": 1e-5", "max_tokens", "expected an integer" },
    { "\"logit_bias\": [1]", "logit_bias", "expected an object, got an array" },
    { "\"logit_bias\": {\"1\": \"5\"}", "logit_bias", "expected a number, got a string" },
    { "\"logit_bias\": {\"a\": 1}", "logit_bias", "key 'a' is not a token id" },
    { "\"logit_bias\": {\"-1\": 1}", "logit_bias", "key '-1' is not a token id" },
    { "\"logit_bias\": {\"\": 1}", "logit_bias", "not a token id" },
    { "\"logit_bias\": {\"1.0\": 1}", "logit_bias", "not a token id" },
    { "\"logit_bias\": {\" 1\": 1}", "logit_bias", "not a token id" },
    { "\"logit_bias\": {\"2147483648\": 1}", "logit_bias", "not a token id" },
    { "\"logit_bias\": {\"99999999999\": 1}", "logit_bias", "not a token id" },
    { "\"stop\": 5", "stop", "expected a string or an array of strings, got a number" },
    { "\"stop\": {}", "stop", "got an object" },
    { "\"stop\": [\"a\", 1]", "stop", "got a number" },
    { "\"stop\": [\"a\", null]", "stop", "got null" },
    { "\"stop\": \"\"", "stop", "sequence 0 is empty" },
    { "\"stop\": [\"x\", \"\"]", "stop", "sequence 1 is empty" },
    { "\"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]", "stop", "at most 4 sequences, got 5" },
    { "\"ignore_eos\": 1", "ignore_eos", "expected a boolean, got a number" },
    { "\"ignore_eos\": \"true\"", "ignore_eos", "got a string" },
    { "\"thinking\": 0", "thinking", "expected a boolean, got a number" },
    { "\"cache_salt\": 7", "cache_salt", "expected a string, got a number" },
    { "\"cache_salt\": \"\"", "cache_salt", "must be 1 to 320 bytes, got 0" },
};

static void test_type_errors(void **state) {
    for (size_t i = 0; i < sizeof(BAD_TYPES) / sizeof(BAD_TYPES[0]); i++) {
        rejects_field(BAD_TYPES[i].fields, BAD_TYPES[i].param,
                      BAD_TYPES[i].want);
    }
}

static const Bad BAD_RANGES[] = {
    { "\"temperature\": -0.1", "temperature", "must be between 0 and 2, got -0.1" },
    { "\"temperature\": 2.0001", "temperature", "got 2.0001" },
    { "\"temperature\": 1e400", "temperature", "got 1e400" },
    { "\"top_p\": 0", "top_p", "must be in (0, 1], got 0" },
    { "\"top_p\": 1e-50", "top_p", "got 1e-50" },   // a float 0
    { "\"top_p\": 1.5", "top_p", "got 1.5" },
    { "\"top_p\": -1", "top_p", "got -1" },
    { "\"min_p\": 1.01", "min_p", "must be between 0 and 1" },
    { "\"min_p\": -0.01", "min_p", "got -0.01" },
    { "\"presence_penalty\": -2.5", "presence_penalty", "must be between -2 and 2" },
    { "\"frequency_penalty\": 3", "frequency_penalty", "got 3" },
    { "\"top_k\": -1", "top_k", "must be >= 0, got -1" },
    { "\"top_k\": 2147483648", "top_k", "must be at most 2147483647" },
    { "\"top_k\": -1e400", "top_k", "must be >= 0, got -1e400" },
    { "\"max_tokens\": 0", "max_tokens", "must be >= 1, got 0" },
    { "\"max_tokens\": -5", "max_tokens", "must be >= 1" },
    { "\"max_tokens\": 1e400", "max_tokens", "must be at most 9223372036854775807" },
    { "\"max_tokens\": 99999999999999999999", "max_tokens", "must be at most" },
    { "\"seed\": -1", "seed", "must be >= 0, got -1" },
    { "\"seed\": -9223372036854775809", "seed", "must be >= 0" },
    { "\"seed\": 9223372036854775808", "seed", "must be at most 9223372036854775807" },
    { "\"seed\": 1e19", "seed", "must be at most" },
    { "\"seed\": 9.3e18", "seed", "must be at most" },
    { "\"logit_bias\": {\"3\": 100.5}", "logit_bias",
      "bias for token 3 must be between -100 and 100, got 100.5" },
    { "\"logit_bias\": {\"3\": -1e400}", "logit_bias", "got -1e400" },
};

static void test_range_errors(void **state) {
    char  fields[512], *huge;

    for (size_t i = 0; i < sizeof(BAD_RANGES) / sizeof(BAD_RANGES[0]); i++) {
        rejects_field(BAD_RANGES[i].fields, BAD_RANGES[i].param,
                      BAD_RANGES[i].want);
    }
    /* a 400-digit number is quoted back clipped */
    huge = repeat("\"top_k\": 1", "0", 400, "");
    rejects_field(huge, "top_k", "got 1000000000000000000000000000000000000000...");
    free(huge);
    huge = repeat("\"cache_salt\": \"", "x", REQ_MAX_SALT + 1, "\"");
    rejects_field(huge, "cache_salt", "must be 1 to 320 bytes, got 321");
    free(huge);
    /* stop strings: 255 bytes is the longest */
    memset(fields, 0, sizeof(fields));
    strcpy(fields, "\"stop\": \"");
    memset(fields + 9, 's', 256);
    strcat(fields, "\"");
    rejects_field(fields, "stop", "sequence 0 is 256 bytes, at most 255");
}

/* The edges of every range are accepted, and reach the sampler as given. */
static void test_range_edges(void **state) {
    OmniRequest r;
    char        fields[512], *huge;

    accepts_field("\"temperature\": 0, \"top_p\": 1, \"min_p\": 1,"
                  " \"presence_penalty\": -2, \"frequency_penalty\": 2,"
                  " \"top_k\": 2147483647, \"seed\": 0, \"max_tokens\": 1",
                  &r);
    assert_true(r.sampling.temperature == 0.0f);
    assert_int_equal(r.sampling.top_k, INT32_MAX);
    assert_int_equal(r.max_tokens, 1);
    request_free(&r);
    accepts_field("\"temperature\": 2, \"top_p\": 1e-30, \"min_p\": 0,"
                  " \"presence_penalty\": 2, \"frequency_penalty\": -2,"
                  " \"max_tokens\": 9223372036854775807, \"seed\": -0", &r);
    assert_true(r.sampling.temperature == 2.0f);
    assert_true(r.sampling.top_p > 0.0f);
    assert_int_equal(r.max_tokens, INT64_MAX);
    assert_true(r.sampling.seed == 0);
    request_free(&r);
    /* integral numbers in any spelling are integers */
    accepts_field("\"seed\": 1e3, \"max_tokens\": 2.0, \"top_k\": 4E1", &r);
    assert_true(r.sampling.seed == 1000);
    assert_int_equal(r.max_tokens, 2);
    assert_int_equal(r.sampling.top_k, 40);
    request_free(&r);
    accepts_field("\"seed\": 4.5e18", &r);
    assert_true(r.sampling.seed == 4500000000000000000ull);
    request_free(&r);
    parse_ok("{\"prompt\": \"x\", \"logit_bias\": {\"0\": 100,"
             " \"2147483647\": -100, \"00012\": 0.25}}", &r);
    assert_int_equal(r.sampling.n_bias, 3);
    assert_int_equal(r.sampling.bias[1].token, INT32_MAX);
    assert_int_equal(r.sampling.bias[2].token, 12);
    request_free(&r);
    accepts_field("\"stop\": [], \"cache_salt\": \"s\"", &r);
    assert_int_equal(r.n_stop, 0);
    request_free(&r);
    huge = repeat("\"cache_salt\": \"", "\xc3\xa9", REQ_MAX_SALT / 2, "\"");
    accepts_field(huge, &r);
    assert_int_equal(r.cache_salt_len, REQ_MAX_SALT);
    request_free(&r);
    free(huge);
    memset(fields, 0, sizeof(fields));
    strcpy(fields, "\"stop\": [\"a\", \"b\", \"c\", \"");
    memset(fields + strlen(fields), 's', 255);
    strcat(fields, "\"]");
    accepts_field(fields, &r);
    assert_int_equal(r.n_stop, 4);
    assert_int_equal(strlen(r.stop[3]), 255);
    request_free(&r);
}

static void test_logit_bias_count(void **state) {
    char        json[16384];
    size_t      at;
    OmniRequest r;

    for (int n = SAMPLER_MAX_BIAS; n <= SAMPLER_MAX_BIAS + 1; n++) {
        at = (size_t) snprintf(json, sizeof(json),
                               "{\"prompt\": \"x\", \"logit_bias\": {");
        for (int i = 0; i < n; i++) {
            at += (size_t) snprintf(json + at, sizeof(json) - at,
                                    "%s\"%d\": %d", i ? ", " : "", i * 7,
                                    i % 201 - 100);
        }
        snprintf(json + at, sizeof(json) - at, "}}");
        if (n == SAMPLER_MAX_BIAS) {
            parse_ok(json, &r);
            downstream_ok(&r);
            assert_int_equal(r.sampling.n_bias, SAMPLER_MAX_BIAS);
            assert_int_equal(r.sampling.bias[299].token, 299 * 7);
            request_free(&r);
        } else {
            rejects(json, "logit_bias", "at most 300 entries, got 301");
        }
    }
}


/* ---- malformed input ---- */

static void test_bad_json(void **state) {
    static const char *const bad[] = {
        "", " ", "{", "}", "{\"prompt\": \"x\"", "{\"prompt\": \"x\",}",
        "{\"prompt\": \"x\"} {}", "{\"prompt\": \"x\"} x", "{'prompt': 'x'}",
        "{prompt: \"x\"}", "{\"prompt\": x}", "{\"prompt\": \"x\" \"y\"}",
        "{\"prompt\": \"\x01\"}", "{\"prompt\": \"\\q\"}",
        "{\"prompt\": \"\\u12\"}", "{\"prompt\": 01}", "{\"prompt\": -}",
        "{\"prompt\": .5}", "{\"prompt\": NaN}", "{\"prompt\": Infinity}",
        "{/* c */ \"prompt\": \"x\"}", "{\"prompt\": \"x\"} // c",
        "[1, 2", "\"unterminated",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rejects(bad[i], "", BAD_JSON);
    }
    /* a NUL byte inside would make yajl stop at a valid prefix */
    rejects_len("{\"prompt\": \"x\"}\0garbage", 23, "", BAD_JSON);
    rejects_len("{\"prompt\": \"x\0y\"}", 17, "", BAD_JSON);
    /* valid JSON, but not a request */
    rejects("[]", "", "must be a JSON object, got an array");
    rejects("\"prompt\"", "", "got a string");
    rejects("42", "", "got a number");
    rejects("null", "", "got null");
}

/* Every proper prefix of a valid request is invalid JSON: rejected, with
 * nothing leaked (ASan checks the partial trees are freed). */
static void test_truncated(void **state) {
    size_t n = strlen(FULL);
    char  *buf = malloc(n);

    assert_non_null(buf);
    memcpy(buf, FULL, n);       // no NUL: ASan catches a read past len
    for (size_t len = 0; len < n; len++) {
        OmniRequest r;
        ReqError    e;

        if (request_parse(&r, buf, len, &e) == 0) {
            fail_msg("prefix of %zu bytes accepted", len);
        }
        assert_string_equal(e.param, "");
        assert_non_null(strstr(e.err.msg, BAD_JSON));
        assert_null(r.arena);
    }
    free(buf);
}

/* len bounds the input: the bytes after it are not read. */
static void test_not_nul_terminated(void **state) {
    static const char json[] = "{\"prompt\": \"abc\"}";
    size_t      n = sizeof(json) - 1;
    char       *exact = malloc(n), *more = malloc(n + 8);
    OmniRequest r;

    assert_non_null(exact);
    assert_non_null(more);
    memcpy(exact, json, n);
    parse_len(exact, n, &r);
    assert_string_equal(r.prompt, "abc");
    request_free(&r);

    memcpy(more, json, n);
    memcpy(more + n, "garbage!", 8);
    parse_len(more, n, &r);
    assert_string_equal(r.prompt, "abc");
    request_free(&r);
    rejects_len(more, n + 8, "", BAD_JSON);
    free(exact);
    free(more);
}

/* yajl has no depth limit and frees its tree recursively: deep nesting is
 * refused before yajl sees it. */
static void test_deep_nesting(void **state) {
    char       *deep, *ok;
    OmniRequest r;

    deep = repeat("", "[", 100000, "");
    rejects(deep, "", "nests deeper than 64 levels");
    free(deep);
    deep = repeat("{\"prompt\": \"x\", \"extra\": ", "{\"a\":", 100000, "1");
    rejects(deep, "", "nests deeper than 64 levels");
    free(deep);
    deep = repeat("{\"prompt\": \"x\", \"extra\": ", "[", 64, "");
    rejects(deep, "", "nests deeper");                  // 65 levels
    free(deep);

    deep = repeat("{\"prompt\": \"x\", \"extra\": ", "[", 63, "");
    ok = repeat(deep, "]", 63, "}");                    // 64 levels
    parse_ok(ok, &r);
    request_free(&r);
    free(deep);
    free(ok);
    /* brackets inside a string are text */
    ok = repeat("{\"prompt\": \"", "[{", 50000, "\"}");
    parse_ok(ok, &r);
    assert_int_equal(r.prompt_len, 100000);
    request_free(&r);
    free(ok);
}

/* The tree is bounded whatever the input: a body of tiny values is
 * refused before yajl builds it. */
static void test_many_values(void **state) {
    char       *many = repeat("{\"prompt\": \"x\", \"extra\": [", "1,", 300000,
                              "1]}");
    char       *big;
    OmniRequest r;

    rejects(many, "", "more than 262144 values");
    free(many);
    /* a long string is one value: 4 MiB of prompt */
    big = repeat("{\"prompt\": \"", "abcdefgh", 1 << 19, "\"}");
    parse_ok(big, &r);
    assert_int_equal(r.prompt_len, 4u << 20);
    assert_int_equal(r.prompt[(4u << 20) - 1], 'h');
    request_free(&r);
    free(big);
}

/* UTF-8 passes through byte for byte; escapes are decoded. */
static void test_strings(void **state) {
    static const char utf8[] =
        "{\"prompt\": \"h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c "
        "\xf0\x9f\x98\x80\"}";
    static const char want_utf8[] =
        "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80";
    static const char esc[] =
        "{\"prompt\": \"\\u00e9\\u4E16\\ud83d\\ude00\\n\\t\\r\\b\\f"
        "\\\"\\\\\\/\\u0041\"}";
    static const char want_esc[] =
        "\xc3\xa9\xe4\xb8\x96\xf0\x9f\x98\x80\n\t\r\b\f\"\\/A";
    OmniRequest r;

    parse_ok(utf8, &r);
    assert_int_equal(r.prompt_len, strlen(want_utf8));
    assert_memory_equal(r.prompt, want_utf8, sizeof(want_utf8));
    request_free(&r);
    parse_ok(esc, &r);
    assert_int_equal(r.prompt_len, strlen(want_esc));
    assert_memory_equal(r.prompt, want_esc, sizeof(want_esc));
    request_free(&r);

    /* an escaped backslash before "u0000" is not a NUL */
    parse_ok("{\"prompt\": \"\\\\u0000\"}", &r);
    assert_string_equal(r.prompt, "\\u0000");
    request_free(&r);
    /* "\u0000" cannot live in a C string: refused, never cut */
    rejects("{\"prompt\": \"a\\u0000b\"}", "", "U+0000");
    rejects("{\"prompt\": \"x\", \"k\\u0000\": 1}", "", "U+0000");
    /* escapes in keys and in a stop string */
    parse_ok("{\"\\u0070rompt\": \"x\", \"stop\": \"\\u00e9\"}", &r);
    assert_string_equal(r.prompt, "x");
    assert_string_equal(r.stop[0], "\xc3\xa9");
    request_free(&r);
}

/* A request without a seed gets a fresh one (63 bits: a valid "seed" to
 * send back); one with a seed keeps it. Eight draws that all differ: a
 * repeat by chance has odds of about 2^-58. */
static void test_seed(void **state) {
    uint64_t    seen[8];
    OmniRequest r;

    for (int i = 0; i < 8; i++) {
        parse_ok("{\"prompt\": \"x\", \"temperature\": 1}", &r);
        assert_true(r.seed_drawn);
        assert_true(r.sampling.seed <= (uint64_t) INT64_MAX);
        seen[i] = r.sampling.seed;
        for (int j = 0; j < i; j++) assert_true(seen[j] != seen[i]);
        request_free(&r);
    }
    parse_ok("{\"prompt\": \"x\", \"seed\": null}", &r);
    assert_true(r.seed_drawn);
    request_free(&r);
    parse_ok("{\"prompt\": \"x\", \"seed\": 0}", &r);
    assert_false(r.seed_drawn);
    assert_true(r.sampling.seed == 0);
    request_free(&r);
    parse_ok("{\"prompt\": \"x\", \"seed\": 42}", &r);
    assert_false(r.seed_drawn);
    assert_true(r.sampling.seed == 42);
    request_free(&r);
}

/* Every class of ill-formed text, in every string a request carries, is
 * refused the same way: 400, the value named, "not valid UTF-8 (...)". */
static void test_utf8(void **state) {
    static const struct {
        const char *bytes;
        const char *what;           // how the message shows them
    } bad[] = {
        { "\xc0\xaf", "bytes C0 AF" },            // overlong '/'
        { "\xc1\xbf", "bytes C1 BF" },            // overlong U+007F
        { "\xe0\x80\xaf", "bytes E0 80 AF" },     // overlong in 3
        { "\xe0\x9f\xbf", "bytes E0 9F BF" },     // overlong U+07FF
        { "\xf0\x8f\xbf\xbf", "bytes F0 8F BF BF" }, // overlong U+FFFF
        { "\xed\xa0\x80", "bytes ED A0 80" },     // U+D800
        { "\xed\xbf\xbf", "bytes ED BF BF" },     // U+DFFF
        { "\xf4\x90\x80\x80", "bytes F4 90 80 80" }, // U+110000
        { "\xf5\x80\x80\x80", "bytes F5 80 80 80" },
        { "\xff", "byte FF" },
        { "\x80", "byte 80" },                    // stray
        { "\xc3", "byte C3" },                    // truncated
        { "\xe2\x82", "bytes E2 82" },            // truncated
        { "\xf0\x9f\x98", "bytes F0 9F 98" },     // truncated
        { "\\ud800", "unpaired surrogate \\ud800" },
        { "\\udfff", "unpaired surrogate \\udfff" },
        { "\\ud83d\\u0041", "unpaired surrogate \\ud83d" },
    };
    static const struct {
        const char *fmt;            // %s: the bad bytes, after "a"
        const char *param;
    } where[] = {
        { "{\"prompt\": \"a%s\"}", "prompt" },
        { "{\"model\": \"a%s\", \"prompt\": \"x\"}", "model" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"a%s\"}]}",
          "messages[0].content" },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
          " {\"role\": \"user\", \"content\": [{\"type\": \"text\","
          " \"text\": \"a%s\"}]}]}", "messages[1].content[0].text" },
        { "{\"messages\": [{\"role\": \"a%s\", \"content\": \"x\"}]}",
          "messages[0].role" },
        { "{\"prompt\": \"x\", \"stop\": \"a%s\"}", "stop" },
        { "{\"prompt\": \"x\", \"stop\": [\"\\n\", \"a%s\"]}", "stop[1]" },
        { "{\"prompt\": \"x\", \"cache_salt\": \"a%s\"}", "cache_salt" },
        { "{\"prompt\": \"x\", \"user\": \"a%s\"}", "user" },
        { "{\"prompt\": \"x\", \"a%s\": 1}", "" },
    };

    (void) state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (size_t j = 0; j < sizeof(where) / sizeof(where[0]); j++) {
            char json[256], want[128];

            snprintf(json, sizeof(json), where[j].fmt, bad[i].bytes);
            snprintf(want, sizeof(want), "%snot valid UTF-8 (%s at offset",
                     where[j].param[0] ? "" : "request JSON is ",
                     bad[i].what);
            rejects(json, where[j].param, want);
        }
    }
    /* the valid edges of each length pass, byte for byte */
    {
        static const char edges[] =
            "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"
            "\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
        char        json[128];
        OmniRequest r;

        snprintf(json, sizeof(json), "{\"prompt\": \"%s\", \"stop\": "
                 "\"%s\", \"model\": \"%s\"}", edges, edges, edges);
        parse_ok(json, &r);
        assert_string_equal(r.prompt, edges);
        assert_string_equal(r.stop[0], edges);
        assert_string_equal(r.model, edges);
        request_free(&r);
        parse_ok("{\"prompt\": \"\\ud800\\udc00\\udbff\\udfff\"}", &r);
        assert_string_equal(r.prompt, "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf");
        request_free(&r);
    }
}

/* "audio_transcripts", which the frontend appends (transcripts.h): each
 * assistant turn that refers to an id gets its text; the last of repeated
 * keys wins (so the frontend's, appended last, overrides a client's); an
 * id without one stays "". */
static void test_audio_transcripts(void **state) {
    OmniRequest r;

    (void) state;
    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"},"
             " {\"role\": \"assistant\", \"audio\": {\"id\": \"a1\"}},"
             " {\"role\": \"user\", \"content\": \"And?\"},"
             " {\"role\": \"assistant\", \"audio\": {\"id\": \"a2\"}},"
             " {\"role\": \"assistant\", \"audio\": {\"id\": \"a1\"}}],"
             " \"audio_transcripts\": {\"a1\": \"client's\"},"
             " \"audio_transcripts\": {\"a1\": \"Hello \\\"you\\\".\","
             " \"zz\": \"unused\"}}", &r);
    assert_string_equal(r.msgs[0].content, "Hi");
    assert_string_equal(r.msgs[1].content, "Hello \"you\".");
    assert_string_equal(r.msgs[3].content, "");
    assert_string_equal(r.msgs[4].content, "Hello \"you\".");
    request_free(&r);

    rejects("{\"prompt\": \"x\", \"audio_transcripts\": []}",
            "audio_transcripts", "expected an object");
    rejects("{\"messages\": [{\"role\": \"assistant\", \"audio\":"
            " {\"id\": \"a1\"}}], \"audio_transcripts\": {\"a1\": 3}}",
            "audio_transcripts", "expected a string");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_request),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_nulls),
        cmocka_unit_test(test_duplicates_and_unknown),
        cmocka_unit_test(test_input_errors),
        cmocka_unit_test(test_speech),
        cmocka_unit_test(test_audio_in),
        cmocka_unit_test(test_audio_transcripts),
        cmocka_unit_test(test_many_messages),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_content),
        cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_range_errors),
        cmocka_unit_test(test_range_edges),
        cmocka_unit_test(test_logit_bias_count),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_not_nul_terminated),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_many_values),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_utf8),
    };

    cmocka_set_message_output(CM_OUTPUT_TAP);
    return cmocka_run_group_tests_name("request", tests, NULL, NULL);
}

// t/e2e/openai.js -- drives nginx + ngx_omni_module with the official
// `openai` npm package, as an application would. Run by t/e2e/openai.t,
// which starts the server and passes, in the environment:
//
//   OMNI_BASE_URL    http://127.0.0.1:PORT/v1
//   OMNI_MODEL_ID    the served model's id
//   OMNI_EXPECT      JSON: the engine's own greedy outputs for the prompts
//                    used here ({"chat": ..., "completion": ...})
//   OMNI_API_KEY     a key the server accepts (when it checks keys)
//
// Prints TAP (tap.js); exits 0 when all passed.
'use strict';

const mod = require('openai');
const { ok, is, run } = require('./tap.js');
const OpenAI = mod.OpenAI || mod.default || mod;
const APIError = mod.APIError || OpenAI.APIError;

const base = process.env.OMNI_BASE_URL;
const model = process.env.OMNI_MODEL_ID;
const expect = JSON.parse(process.env.OMNI_EXPECT || '{}');
const client = new OpenAI({ baseURL: base, apiKey: process.env.OMNI_API_KEY
                            || 'sk-unused', maxRetries: 0, timeout: 60000 });

// The request failed with APIError of this status; returns the error.
async function apiError(name, status, fn) {
    try {
        await fn();
        ok(false, `${name}: throws`);
    } catch (e) {
        ok(e instanceof APIError, `${name}: APIError`,
           { error: String(e), ctor: e && e.constructor && e.constructor.name });
        is(e.status, status, `${name}: status ${status}`);
        return e;
    }
    return null;
}

const PROMPT = 'Tell me a story';
const PREFIX = 'Once upon a time';

async function main() {
    // --- models ------------------------------------------------------------
    const list = await client.models.list();
    const ids = list.data.map((m) => m.id);
    ok(ids.includes(model), 'models.list: has the served model', ids);
    is(list.data[0].object, 'model', 'models.list: object is model');
    const one = await client.models.retrieve(model);
    is(one.id, model, 'models.retrieve: id');
    is(one.object, 'model', 'models.retrieve: object');

    // --- chat, non-streaming -------------------------------------------------
    const c = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: PROMPT }],
        max_completion_tokens: 24, temperature: 0,
    });
    is(c.object, 'chat.completion', 'chat: object');
    ok(/^chatcmpl-/.test(c.id), 'chat: id', c.id);
    is(c.choices.length, 1, 'chat: one choice');
    is(c.choices[0].message.role, 'assistant', 'chat: role');
    is(c.choices[0].message.content, expect.chat, 'chat: text as the engine');
    ok(['stop', 'length'].includes(c.choices[0].finish_reason),
       'chat: finish_reason', c.choices[0].finish_reason);
    ok(c.usage && c.usage.total_tokens
       === c.usage.prompt_tokens + c.usage.completion_tokens,
       'chat: usage adds up', c.usage);
    const raw = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: PROMPT }],
        max_tokens: 4, temperature: 0,
    }).withResponse();
    ok(!!raw.response.headers.get('x-request-id'), 'chat: x-request-id');

    // --- chat, streaming ---------------------------------------------------
    const stream = await client.chat.completions.create({
        model, messages: [{ role: 'user', content: PROMPT }],
        max_completion_tokens: 24, temperature: 0, stream: true,
        stream_options: { include_usage: true },
    });
    let text = '', role = null, finish = null, usage = null, chunks = 0;
    for await (const ch of stream) {
        chunks++;
        is(ch.object, 'chat.completion.chunk', `stream: chunk ${chunks} object`);
        if (ch.usage) usage = ch.usage;
        for (const choice of ch.choices) {
            if (choice.delta.role) role = choice.delta.role;
            if (choice.delta.content) text += choice.delta.content;
            if (choice.finish_reason) finish = choice.finish_reason;
        }
    }
    is(role, 'assistant', 'stream: role');
    is(text, expect.chat, 'stream: text as the engine');
    is(finish, c.choices[0].finish_reason, 'stream: finish_reason');
    ok(usage && usage.completion_tokens === c.usage.completion_tokens,
       'stream: include_usage chunk', usage);

    // the SDK's stream helper checks the stream's integrity itself
    const helper = client.chat.completions.stream({
        model, messages: [{ role: 'user', content: PROMPT }],
        max_completion_tokens: 24, temperature: 0,
    });
    const final = await helper.finalChatCompletion();
    is(final.choices[0].message.content, expect.chat,
       'stream helper: final message');

    // --- completions -------------------------------------------------------
    const t = await client.completions.create({
        model, prompt: PREFIX, max_tokens: 24, temperature: 0,
    });
    is(t.object, 'text_completion', 'completions: object');
    is(t.choices[0].text, expect.completion, 'completions: text as the engine');
    ok(t.usage && t.usage.completion_tokens > 0, 'completions: usage');
    const ts = await client.completions.create({
        model, prompt: PREFIX, max_tokens: 24, temperature: 0, stream: true,
    });
    let ttext = '';
    for await (const ch of ts) ttext += ch.choices.length ? ch.choices[0].text : '';
    is(ttext, expect.completion, 'completions stream: text as the engine');

    // --- errors surface as APIError --------------------------------------------
    let e = await apiError('unknown model', 404, () =>
        client.chat.completions.create({
            model: 'no-such-model', messages: [{ role: 'user', content: 'x' }],
        }));
    ok(e && e instanceof (mod.NotFoundError || OpenAI.NotFoundError),
       'unknown model: NotFoundError');
    e = await apiError('n=2', 400, () =>
        client.chat.completions.create({
            model, messages: [{ role: 'user', content: 'x' }], n: 2,
        }));
    is(e && e.param, 'n', 'n=2: param n');
    ok(e && e instanceof (mod.BadRequestError || OpenAI.BadRequestError),
       'n=2: BadRequestError');
    e = await apiError('temperature 5', 400, () =>
        client.chat.completions.create({
            model, messages: [{ role: 'user', content: 'x' }], temperature: 5,
        }));
    is(e && e.param, 'temperature', 'temperature 5: param temperature');
    e = await apiError('streaming, empty messages', 400, () =>
        client.chat.completions.create({ model, messages: [], stream: true }));
    is(e && e.param, 'messages', 'empty messages: param messages');
    e = await apiError('unknown model id', 404, () =>
        client.models.retrieve('no/such-model'));
    is(e && e.code, 'model_not_found', 'models.retrieve: model_not_found');

    if (process.env.OMNI_BAD_KEY_URL) {
        const bad = new OpenAI({ baseURL: process.env.OMNI_BAD_KEY_URL,
                                 apiKey: 'sk-wrong', maxRetries: 0 });
        e = await apiError('wrong API key', 401, () => bad.models.list());
        ok(e && e instanceof (mod.AuthenticationError
                              || OpenAI.AuthenticationError),
           'wrong API key: AuthenticationError');
    }
}

run(main);

// t/e2e/speech.js -- speech out through nginx + ngx_omni_module with the
// official `openai` npm package: audio.speech.create (raw audio, and
// stream_format "sse" read as the SDK hands it over: a fetch Response),
// chat completions with modalities ["text", "audio"], streaming and not.
// Run by t/e2e/speech.t, which passes, in the environment:
//
//   OMNI_BASE_URL     http://127.0.0.1:PORT/v1
//   OMNI_MODEL_ID     the model name to send
//   OMNI_AUDIO_EXPECT JSON {"mp3": base64, "pcm": base64}: the exact audio
//                     the upstream answers with (the stand-in engine); ""
//                     for the real engine, where only the shape is checked
//
// Prints TAP (tap.js); exits 0 when all passed.
'use strict';

const mod = require('openai');
const { ok, is, run } = require('./tap.js');
const OpenAI = mod.OpenAI || mod.default || mod;

const model = process.env.OMNI_MODEL_ID;
const expect = process.env.OMNI_AUDIO_EXPECT
               ? JSON.parse(process.env.OMNI_AUDIO_EXPECT) : null;
const client = new OpenAI({ baseURL: process.env.OMNI_BASE_URL,
                            apiKey: 'sk-unused', maxRetries: 0,
                            timeout: 60000 });

// The audio as the upstream sent it, exactly (stand-in) or by its shape.
function audioIs(buf, format, name) {
    if (expect) {
        ok(buf.equals(Buffer.from(expect[format], 'base64')),
           `${name}: the upstream's ${format} bytes`, { len: buf.length });
    } else {
        ok(buf.length > 1000, `${name}: ${format} audio`, { len: buf.length });
    }
}

async function main() {
    const input = 'Hello there. This is a test.';

    // --- audio.speech.create ------------------------------------------------
    const raw = await client.audio.speech.create({ model, input,
                                                   voice: 'alloy' });
    is(raw.headers.get('content-type'), 'audio/mpeg',
       'speech: Content-Type audio/mpeg');
    audioIs(Buffer.from(await raw.arrayBuffer()), 'mp3', 'speech');

    const sse = await client.audio.speech.create({ model, input,
        voice: 'alloy', response_format: 'pcm', stream_format: 'sse' });
    is(sse.headers.get('content-type'), 'text/event-stream; charset=utf-8',
       'speech sse: Content-Type');
    const events = (await sse.text()).split('\n\n').filter((e) => e)
        .map((e) => e.replace(/^data: /, ''));
    is(events[events.length - 1], '[DONE]', 'speech sse: [DONE] last');
    const done = JSON.parse(events[events.length - 2]);
    is(done.type, 'speech.audio.done', 'speech sse: speech.audio.done');
    ok(done.usage.output_tokens > 0 && done.usage.total_tokens
       === done.usage.input_tokens + done.usage.output_tokens,
       'speech sse: usage', done.usage);
    const deltas = events.slice(0, -2).map((e) => JSON.parse(e));
    ok(deltas.every((d) => d.type === 'speech.audio.delta'),
       'speech sse: deltas');
    audioIs(Buffer.concat(deltas.map((d) => Buffer.from(d.audio, 'base64'))),
            'pcm', 'speech sse, each delta decoded alone');

    // --- chat with audio ------------------------------------------------------
    const messages = [{ role: 'user', content: 'Tell me a story' }];
    const audio = { voice: 'alloy', format: 'pcm16' };
    const c = await client.chat.completions.create({ model, messages,
        modalities: ['text', 'audio'], audio, max_tokens: 16 });
    const m = c.choices[0].message;
    is(m.content, null, 'chat audio: content null');
    ok(/^audio_[0-9a-f]{32}$/.test(m.audio.id), 'chat audio: id', m.audio.id);
    is(m.audio.expires_at, c.created + 3600, 'chat audio: expires_at');
    ok(m.audio.transcript.length > 0, 'chat audio: transcript');
    audioIs(Buffer.from(m.audio.data, 'base64'), 'pcm', 'chat audio');
    ok(c.usage.completion_tokens_details.audio_tokens > 0,
       'chat audio: audio tokens', c.usage);

    const stream = await client.chat.completions.create({ model, messages,
        modalities: ['text', 'audio'], audio, max_tokens: 16, stream: true,
        stream_options: { include_usage: true } });
    let data = '', transcript = '', ids = [], expires = 0, finish = null;
    let usage = null, sizes = [];
    for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        const ch = chunk.choices[0];
        if (!ch) continue;
        if (ch.finish_reason) finish = ch.finish_reason;
        const a = ch.delta.audio;
        if (!a) continue;
        if (a.id) ids.push(a.id);
        if (a.transcript) transcript += a.transcript;
        if (a.data) { data += a.data; sizes.push(Buffer.from(a.data,
                                                              'base64').length); }
        if (a.expires_at) expires = a.expires_at;
    }
    is(ids.length, 1, 'chat audio stream: the id once');
    ok(transcript.length > 0, 'chat audio stream: transcript');
    ok(sizes.slice(0, -1).every((s) => s % 6 === 0),
       'chat audio stream: pieces of 6 bytes but the last', sizes);
    audioIs(Buffer.from(data, 'base64'), 'pcm',
            'chat audio stream, base64 joined');
    ok(expires > 0, 'chat audio stream: expires_at');
    // the fake engine ends with stop; the model may reach max_tokens
    ok(finish === 'stop' || finish === 'length',
       'chat audio stream: finish_reason', finish);
    ok(usage && usage.completion_tokens_details.audio_tokens > 0,
       'chat audio stream: usage', usage);
}

run(main);

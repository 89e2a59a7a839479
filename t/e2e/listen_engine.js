// t/e2e/listen_engine.js -- audio in against the real omni-engine (its
// listener: pocketsphinx) through nginx + ngx_omni_module, with the
// official `openai` npm package: audio.transcriptions.create on real
// human speech in every input format, plain and streaming (the SDK's own
// stream iterator), verbose_json with word and segment timings, a chat
// completion whose user turn is audio (text out, and speech out), and a
// bad file as the SDK raises it. Run by t/e2e/listen_engine.t, which
// computes the word error rates from what this script writes. In the
// environment:
//
//   OMNI_BASE_URL     http://127.0.0.1:PORT/v1
//   OMNI_FILES        JSON: [{"name": ..., "path": ..., "filename": ...,
//                     "stream": bool}, ...] the uploads
//   OMNI_CHAT_WAV     the WAV file a chat turn sends as input_audio
//   OMNI_OUT          where to write {"<name>": "<text heard>", ...}
//
// Prints TAP (tap.js); exits 0 when all passed.
'use strict';

const fs = require('fs');
const mod = require('openai');
const { ok, is, run } = require('./tap.js');
const OpenAI = mod.OpenAI || mod.default || mod;
const toFile = mod.toFile;

const client = new OpenAI({ baseURL: process.env.OMNI_BASE_URL,
                            apiKey: 'sk-unused', maxRetries: 0,
                            timeout: 120000 });
const files = JSON.parse(process.env.OMNI_FILES);
const heard = {};

async function upload(f) {
    return toFile(fs.readFileSync(f.path), f.filename);
}

async function plain(f) {
    const r = await client.audio.transcriptions.create({
        file: await upload(f), model: 'whisper-1', language: 'en' });
    ok(typeof r.text === 'string' && r.text.length > 0,
       `${f.name}: json text`, r);
    ok(r.usage && r.usage.type === 'duration' && r.usage.seconds > 0,
       `${f.name}: usage in seconds`, r.usage);
    heard[f.name] = r.text;
}

async function streamed(f) {
    const s = await client.audio.transcriptions.create({
        file: await upload(f), model: 'gpt-4o-mini-transcribe',
        stream: true });
    let deltas = '', n = 0, done = null;
    for await (const ev of s) {
        if (ev.type === 'transcript.text.delta') {
            if (done === null) deltas += ev.delta;
            n++;
        } else if (ev.type === 'transcript.text.done') {
            done = ev.text;
        }
    }
    ok(n >= 1, `${f.name}: ${n} delta events`);
    is(done, deltas, `${f.name}: done's text is the deltas joined`);
    heard[f.name] = done || '';
}

async function verbose(f) {
    const v = await client.audio.transcriptions.create({
        file: await upload(f), model: 'whisper-1',
        response_format: 'verbose_json',
        timestamp_granularities: ['word', 'segment'] });
    is(v.language, 'english', 'verbose_json: language');
    ok(Math.abs(v.duration - 11) < 0.1, 'verbose_json: duration', v.duration);
    ok(v.segments.length >= 1, 'verbose_json: segments', v.segments.length);
    let last = -1, inside = true, increasing = true;
    for (const w of v.words) {
        increasing = increasing && w.start >= last && w.end >= w.start;
        inside = inside && w.end <= v.duration + 0.05;
        last = w.start;
    }
    ok(v.words.length >= 10, 'verbose_json: words', v.words.length);
    ok(increasing, 'verbose_json: word times increase');
    ok(inside, 'verbose_json: words inside the audio');
    is(v.text, v.segments.map((s) => s.text.trim()).join(' '),
       'verbose_json: text is the segments joined');
    heard[f.name] = v.text;
}

async function chat() {
    const wav = fs.readFileSync(process.env.OMNI_CHAT_WAV);
    const part = { type: 'input_audio',
                   input_audio: { data: wav.toString('base64'),
                                  format: 'wav' } };
    const c = await client.chat.completions.create({
        model: 'stories260K', max_tokens: 16, temperature: 0,
        messages: [{ role: 'user',
                     content: [{ type: 'text', text: 'Listen:' }, part] }] });
    ok(c.choices[0].message.content.length > 0, 'chat input_audio: an answer');
    ok(c.usage.prompt_tokens > 20, 'chat input_audio: the words heard are '
       + 'in the prompt', c.usage);
    ok(Math.abs(c.usage.input_audio_seconds - 11) < 0.1,
       'chat input_audio: usage.input_audio_seconds', c.usage);

    const a = await client.chat.completions.create({
        model: 'stories260K', max_tokens: 16, temperature: 0,
        modalities: ['text', 'audio'],
        audio: { voice: 'alloy', format: 'wav' },
        messages: [{ role: 'user', content: [part] }] });
    const m = a.choices[0].message;
    ok(m.audio && m.audio.data && m.audio.transcript.length > 0,
       'speech in, speech out: message.audio with its transcript');
    ok(Buffer.from(m.audio.data, 'base64').slice(0, 4).toString() === 'RIFF',
       'speech in, speech out: a WAV');
}

async function bad() {
    let err = null;
    try {
        await client.audio.transcriptions.create({
            file: await toFile(Buffer.from('this is not a sound at all, '
                                           .repeat(20)), 'notes.wav'),
            model: 'whisper-1' });
    } catch (e) {
        err = e;
    }
    is(err && err.status, 400, 'not audio: 400');
    is(err && err.param, 'file', 'not audio: param file');
}

async function main() {
    for (const f of files) {
        if (f.verbose) await verbose(f);
        else if (f.stream) await streamed(f);
        else await plain(f);
    }
    await chat();
    await bad();
    fs.writeFileSync(process.env.OMNI_OUT, JSON.stringify(heard));
}

run(main);

// t/e2e/transcriptions.js -- audio in through nginx + ngx_omni_module
// with the official `openai` npm package, against the stand-in engine
// (t/lib/FakeEngine.pm): audio.transcriptions.create in every
// response_format, verbose_json with both granularities, stream: true
// read with the SDK's own stream iterator, and a chat completion with an
// input_audio part. The SDK builds the multipart body itself (its own
// boundary, quoting and part order), so this is the framing openai-node
// really sends. Run by t/e2e/transcriptions.t, which passes, in the
// environment:
//
//   OMNI_BASE_URL     http://127.0.0.1:PORT/v1
//   OMNI_AUDIO        the audio file to upload (its path)
//   OMNI_TEXT         the transcript the stand-in answers with
//
// Prints TAP (tap.js); exits 0 when all passed.
'use strict';

const mod = require('openai');
const { ok, is, run } = require('./tap.js');
const OpenAI = mod.OpenAI || mod.default || mod;
const toFile = mod.toFile;

const client = new OpenAI({ baseURL: process.env.OMNI_BASE_URL,
                            apiKey: 'sk-unused', maxRetries: 0,
                            timeout: 60000 });
const audio = require('fs').readFileSync(process.env.OMNI_AUDIO);
const text = process.env.OMNI_TEXT;

async function file() {
    return toFile(audio, 'speech.wav', { type: 'audio/wav' });
}

async function main() {
    const json = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1' });
    is(json.text, text, 'json: text');
    is(json.usage && json.usage.seconds, 11, 'json: usage.seconds');

    const plain = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1', response_format: 'text' });
    is(plain, text + '\n', 'text: the string');

    const srt = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1', response_format: 'srt' });
    ok(/^1\n00:00:00,320 --> 00:00:02,710\n/.test(srt), 'srt: the first cue',
       srt);

    const vtt = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1', response_format: 'vtt' });
    ok(vtt.startsWith('WEBVTT\n\n00:00:00.320 --> '), 'vtt: header, cue', vtt);

    const v = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1',
        response_format: 'verbose_json',
        timestamp_granularities: ['word', 'segment'], language: 'en',
        prompt: 'A speech.', temperature: 0 });
    is(v.text, text, 'verbose_json: text');
    is(v.language, 'english', 'verbose_json: language');
    is(v.duration, 11, 'verbose_json: duration');
    is(v.segments.length, 2, 'verbose_json: segments');
    is(v.segments[1].text, ' ask not what your country can do for you',
       'verbose_json: a segment, its leading space');
    is(v.words.length, 14, 'verbose_json: words');
    is(v.words[0].word, 'and', 'verbose_json: the first word');

    const stream = await client.audio.transcriptions.create({
        file: await file(), model: 'gpt-4o-mini-transcribe', stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    is(events.map((e) => e.type).join(','),
       'transcript.text.delta,transcript.text.delta,transcript.text.done',
       'stream: two deltas, then done');
    is(events.slice(0, -1).map((e) => e.delta).join(''),
       events[events.length - 1].text, 'stream: done is the deltas joined');
    is(events[events.length - 1].text, text, 'stream: the text');

    let err = null;
    try {
        await client.audio.transcriptions.create({
            file: await file(), model: 'whisper-1', language: 'xx' });
    } catch (e) {
        err = e;
    }
    ok(err && err.status === 400 && err.code === 'invalid_language_format'
       && err.param === 'language', 'a 400 as the SDK raises it',
       err && { status: err.status, code: err.code, param: err.param });

    const chat = await client.chat.completions.create({
        model: 'gpt-4o-audio-preview',
        messages: [{ role: 'user', content: [
            { type: 'text', text: 'What is said?' },
            { type: 'input_audio',
              input_audio: { data: audio.toString('base64'),
                             format: 'wav' } }] }] });
    is(chat.choices[0].message.content, `heard ${audio.length} bytes`,
       'chat input_audio: the engine got every byte');
    is(chat.usage.input_audio_seconds, 11, 'chat: usage.input_audio_seconds');

    // the last: the .t checks that the engine got this file's bytes
    const last = await client.audio.transcriptions.create({
        file: await file(), model: 'whisper-1', response_format: 'text' });
    is(last, text + '\n', 'the last transcription');
}

run(main);

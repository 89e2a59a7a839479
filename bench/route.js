// bench/route.js -- a multi-turn chat workload through nginx, for
// bench/route (prefix-aware routing against round robin).
//
//   node bench/route.js --url URL --conversations 32 --turns 8 --tenants 4
//        --system-words 200 --first-words 600 --user-words 15
//        --max-tokens 32 --stagger-ms 0 --salt S --json OUT
//
// Every conversation belongs to a tenant (conversation % tenants) whose
// long system prompt all its conversations share, and opens with a long
// message of its own (a document to talk about: first-words), then short
// ones (user-words); each sends its turns
// one after another (streamed, greedy, ignore_eos), appending the
// assistant's answer and a new user message each time, while all the
// conversations run at once, conversation c starting c * stagger-ms
// after the first (conversations arrive over time, as users do). Per turn it records the time to the first
// content token (TTFT), the x-omni-route header (hit, miss or fallback,
// and the engine), the engine that answered (x-engine, $upstream_addr),
// and the usage's prompt and cached tokens. The text is made from a
// seeded generator: both modes of a run send the same words; "salt" (the
// prompt_cache_key) keeps their cached prefixes apart.

'use strict';

const fs = require('fs');

function args() {
    const a = { conversations: 32, turns: 8, tenants: 4, 'system-words': 200,
                'first-words': 600, 'user-words': 15, 'max-tokens': 32,
                'stagger-ms': 0,
                salt: 'bench', model: null, json: null, url: null };
    const v = process.argv.slice(2);
    for (let i = 0; i < v.length; i += 2) {
        const k = v[i].replace(/^--/, '');
        if (!(k in a)) throw new Error(`unknown option ${v[i]}`);
        a[k] = /^\d+$/.test(v[i + 1]) ? Number(v[i + 1]) : v[i + 1];
    }
    if (!a.url) throw new Error('--url is required');
    return a;
}

// xorshift32: the same words for the same seed, in both modes
function rng(seed) {
    let x = seed >>> 0 || 1;
    return () => {
        x ^= x << 13; x >>>= 0;
        x ^= x >>> 17;
        x ^= x << 5; x >>>= 0;
        return x;
    };
}

const WORDS = ('once upon a time there was a little girl named lily she ' +
    'loved to play outside in the park with her friends one day she saw ' +
    'a big red ball near the tree and wanted to play with it her mom said ' +
    'be careful the sun was warm and the birds sang happy songs tom the ' +
    'dog ran fast after the cat who jumped over the fence into the garden')
    .split(' ');

function words(r, n) {
    const out = [];
    for (let i = 0; i < n; i++) out.push(WORDS[r() % WORDS.length]);
    return out.join(' ');
}

async function turn(o, messages, salt) {
    const body = {
        messages, stream: true, stream_options: { include_usage: true },
        max_tokens: o['max-tokens'], temperature: 0, ignore_eos: true,
        prompt_cache_key: salt,
    };
    if (o.model) body.model = o.model;
    const t0 = performance.now();
    const res = await fetch(o.url, {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
    });
    const rec = { status: res.status, route: res.headers.get('x-omni-route'),
                  engine: res.headers.get('x-engine'), ttft_ms: null,
                  prompt_tokens: null, cached_tokens: null, text: '' };
    if (res.status !== 200) {
        rec.error = await res.text();
        return rec;
    }
    const dec = new TextDecoder();
    let buf = '';
    for await (const chunk of res.body) {
        buf += dec.decode(chunk, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
            const ev = buf.slice(0, i);
            buf = buf.slice(i + 2);
            if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
            const j = JSON.parse(ev.slice(6));
            if (j.error) { rec.error = j.error.message; continue; }
            const d = j.choices && j.choices[0] && j.choices[0].delta;
            if (d && d.content) {
                if (rec.ttft_ms === null) rec.ttft_ms = performance.now() - t0;
                rec.text += d.content;
            }
            if (j.usage) {
                rec.prompt_tokens = j.usage.prompt_tokens;
                rec.cached_tokens = j.usage.prompt_tokens_details
                                    ? j.usage.prompt_tokens_details.cached_tokens
                                    : 0;
            }
        }
    }
    rec.total_ms = performance.now() - t0;
    return rec;
}

async function conversation(o, c, out) {
    const tenant = c % o.tenants;
    await new Promise(ok => setTimeout(ok, c * o['stagger-ms']));
    const sys = words(rng(1000 + tenant), o['system-words']);
    const r = rng(5000 + c);
    const messages = [{ role: 'system', content: sys }];
    for (let t = 0; t < o.turns; t++) {
        messages.push({ role: 'user',
                        content: words(r, t === 0 ? o['first-words']
                                                  : o['user-words']) });
        const rec = await turn(o, messages, `${o.salt}-tenant-${tenant}`);
        rec.conversation = c;
        rec.tenant = tenant;
        rec.turn = t;
        out.push(rec);
        if (rec.status !== 200 || rec.error) return;
        messages.push({ role: 'assistant', content: rec.text });
    }
}

function pct(v, p) {
    if (v.length === 0) return null;
    const s = [...v].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
}

(async () => {
    const o = args();
    const out = [];
    const t0 = performance.now();
    await Promise.all([...Array(o.conversations).keys()]
                      .map(c => conversation(o, c, out)));
    const wall = (performance.now() - t0) / 1000;
    const ok = out.filter(r => r.status === 200 && !r.error
                               && r.ttft_ms !== null);
    const later = ok.filter(r => r.turn > 0);
    const ttft = ok.map(r => r.ttft_ms), ttft2 = later.map(r => r.ttft_ms);
    const hits = ok.filter(r => r.route && r.route.startsWith('hit')).length;
    // the engine that served the conversation's previous turn
    const prev = {};
    let same = 0;
    for (const r of [...ok].sort((a, b) => a.turn - b.turn)) {
        if (r.turn > 0 && prev[r.conversation] === r.engine) same++;
        prev[r.conversation] = r.engine;
    }
    const sum = (v, k) => v.reduce((s, r) => s + (r[k] || 0), 0);
    const summary = {
        requests: out.length, ok: ok.length,
        failed: out.length - ok.length,
        wall_s: wall,
        ttft_p50_ms: pct(ttft, 50), ttft_p95_ms: pct(ttft, 95),
        ttft_later_p50_ms: pct(ttft2, 50), ttft_later_p95_ms: pct(ttft2, 95),
        prefix_hit_rate: ok.length ? hits / ok.length : 0,
        same_engine_rate: later.length ? same / later.length : 0,
        prompt_tokens: sum(ok, 'prompt_tokens'),
        cached_tokens: sum(ok, 'cached_tokens'),
        cached_rate: sum(ok, 'prompt_tokens')
                     ? sum(ok, 'cached_tokens') / sum(ok, 'prompt_tokens') : 0,
        errors: out.filter(r => r.error).slice(0, 3).map(r => r.error),
    };
    const report = { options: o, summary,
                     turns: out.map(({ text, ...r }) => r) };
    if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 1));
    process.stdout.write(JSON.stringify(summary) + '\n');
})().catch(e => { console.error(e); process.exit(1); });

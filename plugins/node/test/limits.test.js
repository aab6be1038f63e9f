// Requests near the daemon's limits: the frame cap (1 MiB per request line), lone surrogates,
// and calls that time out. Each through the real daemon.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import fs from 'node:fs';

import {
  CallTimeout, Client, ConnectionClosed, FrameTooLarge, InvalidParams, MAX_FRAME_BYTES,
  StreamProducer, toWellFormed,
} from '../src/index.js';
import { until, withDaemon } from './harness.js';

test('a producer batch is split to fit the frame cap: one run\'s big deltas never drop the connection other runs share', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client({ client: 'web-server', timeoutMs: 60_000 });
  t.after(() => c.close());
  assert.equal(c.maxFrameBytes, MAX_FRAME_BYTES);
  const others = [];
  for (let i = 0; i < 3; i++) {
    const p = await StreamProducer.begin(c, `chat-${i}`);
    await p.text('streaming fine ');
    others.push(p);
  }
  const big = await StreamProducer.begin(c, 'chat-big', { retryTimeoutMs: 5_000 });
  // Six deltas of 250 KB (each under the 256 KiB event cap) handed over at once: 1.5 MB in all.
  const delta = 'x'.repeat(250_000);
  const r = await Promise.allSettled(Array.from({ length: 6 }, () => big.append({
    type: 'tool_call_delta', id: 'call-1', name: 'write_file', arguments_delta: delta,
  })));
  assert.deepEqual(r.map((x) => x.status), Array(6).fill('fulfilled'), String(r.find((x) => x.reason)?.reason));
  assert.ok(big.appends >= 2, `the batch went in ${big.appends} appends`);
  assert.equal(c.reconnects, 0, 'the daemon never closed the connection');
  await big.append({ type: 'tool_call_end', id: 'call-1' });
  await big.commit({ role: 'assistant' });
  for (const p of others) {
    await p.text('and more');
    await p.commit({ role: 'assistant' });
  }
  assert.equal((await c.streamGet('chat-big')).status, 'committed');
  assert.equal(c.reconnects, 0);
});

test('a request over the frame cap is refused unsent; an event that alone cannot fit fails its stream only', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client({ timeoutMs: 60_000 });
  t.after(() => c.close());
  const other = await StreamProducer.begin(c, 'other-run');
  const sub = await c.subscribeStream('other-run', 0);

  const call = await c.setValue('huge', 'y'.repeat(MAX_FRAME_BYTES)).then(() => null, (e) => e);
  assert.ok(call instanceof FrameTooLarge && call instanceof InvalidParams, String(call));
  assert.ok(call.bytes > MAX_FRAME_BYTES);
  assert.equal(await c.exists('huge'), false, 'it was never carried out');

  const p = await StreamProducer.begin(c, 'run-big', { retryTimeoutMs: 5_000 });
  await p.text('before ');
  // 300,000 control characters: 1.8 MB serialized (each is a \u00XX escape).
  const e = await p.text('\u0001'.repeat(300_000)).then(() => null, (x) => x);
  assert.ok(e instanceof FrameTooLarge, String(e));
  assert.equal(p.failed, e);
  assert.ok(await p.text('after').then(() => false, (x) => x === e), 'later appends fail with it');

  // Nothing else on the client noticed: no reconnection, the subscription and the other run go on.
  assert.equal(c.reconnects, 0);
  await other.text('still here');
  await other.commit({ role: 'assistant' });
  const seen = [];
  for await (const ev of sub) seen.push(ev.event.type);
  assert.deepEqual(seen, ['text', 'finish']);
});

const LONE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

test('strings with lone surrogates are sent well-formed (U+FFFD), never a line the daemon cannot parse', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client({ timeoutMs: 120_000 });
  t.after(() => c.close());
  const cut = `${'x'.repeat(59)}😀 rest`.slice(0, 60); // an emoji cut in half
  assert.ok(LONE.test(cut));
  const p = await StreamProducer.begin(c, 'run-sur', { retryTimeoutMs: 5_000 });
  await p.text(`Answer to "${cut}": `);
  await p.text('\\ud800 is how JSON writes one; 😀 stays');
  await p.commit({ role: 'assistant', note: 'k\udc00' });
  const m = (await c.streamGet('run-sur', { reveal: true })).final_message;
  assert.equal(m.content, `Answer to "${'x'.repeat(59)}\uFFFD": \\ud800 is how JSON writes one; 😀 stays`);
  assert.equal(m.note, 'k\uFFFD');
  await c.setValue('k\ud800', 'sk-\udbff');
  assert.equal((await c.get('k\uFFFD')).value(), 'sk-\uFFFD');
  assert.equal(toWellFormed('a\ud83d'), 'a\uFFFD');
  assert.equal(toWellFormed('😀'), '😀');
  assert.equal(c.reconnects, 0);
});

test('a line the daemon cannot parse (answered with id null) fails its call at once, not at its timeout', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client({ timeoutMs: 120_000 });
  t.after(() => c.close());
  let deep = {};
  for (let i = 0; i < 200; i++) deep = { a: deep };
  const started = Date.now();
  const alone = await c.call('cred.set', { credential: deep }).then(() => null, (e) => e);
  assert.ok(alone instanceof InvalidParams && !(alone instanceof CallTimeout), String(alone));
  assert.match(alone.message, /parse error/);
  // With other calls in flight: the one nested too deep is the one that fails.
  const [bad, ok] = await Promise.allSettled([c.call('cred.set', { credential: deep }), c.status(), c.status()]);
  assert.equal(bad.status, 'rejected');
  assert.ok(bad.reason instanceof InvalidParams, String(bad.reason));
  assert.equal(ok.status, 'fulfilled');
  assert.ok(Date.now() - started < 100_000, 'long before the call timeout');
});

test('a parse error with id null and several calls in flight fails them all at once (ConnectionClosed), never leaves them waiting', async (t) => {
  // The daemon answers a line it cannot parse with the line's id whenever its syntax reads
  // (the test above); an older daemon answered id null. That peer, on a socket of this test's
  // own: hello, then two calls held, then one id-null parse error for a line neither could be.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hf-null-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const socketPath = path.join(dir, 'old.sock');
  let connections = 0;
  const server = net.createServer((sock) => {
    connections += 1;
    let buf = '';
    let held = 0;
    sock.on('data', (chunk) => {
      buf += chunk;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const req = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        const answer = (body) => sock.write(`${JSON.stringify({ jsonrpc: '2.0', id: req.id, ...body })}\n`);
        if (req.method === 'hello') answer({ result: { server: 'holdfast', protocol: 1, methods: [] } });
        else if (connections > 1) answer({ result: { ok: true } });
        else if (++held === 2) sock.write('{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error: expected value"}}\n');
      }
    });
  });
  await new Promise((resolve) => server.listen(socketPath, resolve));
  t.after(() => server.close());
  const c = await Client.connect({ socketPath, timeoutMs: 120_000 });
  t.after(() => c.close());
  const started = Date.now();
  const got = await Promise.allSettled([c.call('admin.status', {}), c.call('admin.status', {})]);
  for (const r of got) {
    assert.equal(r.status, 'rejected');
    assert.ok(r.reason instanceof ConnectionClosed, String(r.reason));
    assert.match(r.reason.message, /parse error: expected value/);
  }
  assert.ok(Date.now() - started < 60_000, 'long before the call timeout');
  // The next call opens a new connection and is answered.
  assert.deepEqual(await c.call('admin.status', {}), { ok: true });
  assert.equal(connections, 2);
});

test('the example provider cuts the prompt by characters, never inside an emoji', async () => {
  const { fakeReply } = await import('../examples/chat/fake-provider.js');
  const [first] = fakeReply(`${'x'.repeat(59)}😀 rest`, 3);
  assert.ok(!LONE.test(first), JSON.stringify(first));
  assert.ok(first.includes('😀'));
});

test('a call that timed out leaves nothing behind: a late subscribe answer is unsubscribed, a late begin aborted', async (t) => {
  const d = await withDaemon(t);
  const owner = await d.client();
  const c = await d.client({ timeoutMs: 300 });
  t.after(() => { owner.close(); c.close(); });
  const p = await StreamProducer.begin(owner, 'run-live');
  await p.text('hi');
  d.proc.kill('SIGSTOP'); // the daemon is slow: the calls time out, the daemon does them later
  let outcomes;
  try {
    const subs = Array.from({ length: 16 }, () => c.subscribeStream('run-live', 0).then(() => 'ok', (e) => e.name));
    const begin = c.streamBegin('run-begun').then(() => 'ok', (e) => e.name);
    outcomes = await Promise.all([...subs, begin]);
  } finally {
    d.proc.kill('SIGCONT');
  }
  assert.deepEqual(outcomes, Array(17).fill('CallTimeout'));
  c.timeoutMs = 60_000;
  // (NotFound until the daemon, resumed, gets to the begin.)
  await until(async () => (await owner.streamGet('run-begun').catch(() => ({}))).status === 'aborted', 30_000, 'the late begin aborted its run');
  // Every slot of the connection is free again.
  await until(async () => {
    const opened = [];
    try {
      for (let i = 0; i < 16; i++) opened.push(await c.subscribeStream('run-live', 0));
      return true;
    } catch {
      return false;
    } finally {
      for (const s of opened) await s.close();
    }
  }, 30_000, 'the connection can open 16 subscriptions again');
  assert.equal(c.reconnects, 0);
});

test('a refused append aborts the run (persistUIMessageStream, RecoveringStream): viewers end instead of waiting days', async (t) => {
  const { persistUIMessageStream } = await import('../src/ai.js');
  const { RecoveringStream, followRun } = await import('../src/index.js');
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const big = 'x'.repeat(300 * 1024); // over the daemon's 256 KiB per-event cap
  const chunks = [
    { type: 'start', messageId: 'm1' }, { type: 'start-step' }, { type: 'text-start', id: 't' },
    { type: 'text-delta', id: 't', delta: 'hello ' }, { type: 'text-delta', id: 't', delta: big },
    { type: 'text-end', id: 't' }, { type: 'finish-step' }, { type: 'finish' },
  ];
  const e = await persistUIMessageStream(client, 'run-big', chunks).then(() => null, (x) => x);
  assert.ok(e instanceof InvalidParams, String(e));
  assert.equal((await client.streamGet('run-big')).status, 'aborted');
  const seen = [];
  for await (const ev of followRun(client, 'run-big', 0)) seen.push(ev.event.type);
  assert.equal(seen.at(-1), 'finish', 'a viewer ends');

  const rs = new RecoveringStream(client, 'run-rs', ['hello ', big, 'never'], { reopen: () => [] });
  const e2 = await (async () => { for await (const _ of rs); })().then(() => null, (x) => x);
  assert.ok(e2 instanceof InvalidParams, String(e2));
  assert.equal((await client.streamGet('run-rs')).status, 'aborted');
});

test('persistUIMessageStream keeps a UTF-8 character split across two byte chunks whole', async (t) => {
  const { persistUIMessageStream } = await import('../src/ai.js');
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const sse = ['{"type":"start"}', '{"type":"text-start","id":"t"}', '{"type":"text-delta","id":"t","delta":"é😀 ok"}',
    '{"type":"text-end","id":"t"}', '{"type":"finish"}'].map((x) => `data: ${x}\n\n`).join('');
  const bytes = new TextEncoder().encode(sse);
  const at = bytes.indexOf(0xf0) + 2; // inside the emoji's four bytes
  const r = await persistUIMessageStream(client, 'run-utf8', [bytes.slice(0, at), bytes.slice(at)]);
  assert.equal(r.status, 'committed');
  assert.equal((await client.streamGet('run-utf8', { reveal: true })).final_message.content, 'é😀 ok');
});

test('createNewResumableStream whose makeStream throws ends the run it began, never leaves it streaming', async (t) => {
  const { createResumableStreamContext } = await import('../src/resumable-stream.js');
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const reported = [];
  const ctx = createResumableStreamContext({ client, onError: (e) => reported.push(e) });
  const e = await ctx.createNewResumableStream('run-nostream', () => { throw new Error('boom'); }).then(() => null, (x) => x);
  assert.equal(e?.message, 'boom');
  assert.equal((await client.streamGet('run-nostream')).status, 'aborted');
  assert.equal(reported.length, 1);
});

// Requests near the daemon's limits: the frame cap (1 MiB per request line), lone surrogates,
// and calls that time out. Each through the real daemon.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FrameTooLarge, InvalidParams, MAX_FRAME_BYTES, StreamProducer } from '../src/index.js';
import { withDaemon } from './harness.js';

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

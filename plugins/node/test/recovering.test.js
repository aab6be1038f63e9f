// Issue 35 for Node through the real daemon: RecoveringStream renders each event as soon as it
// is durable, catches a provider gone silent (`stallTimeoutMs`, cause `stalled`) mid-text and
// mid tool-call, declares its continuation (exact: the model's text at every break point), and
// a producer process killed with SIGKILL leaves no viewer waiting (interrupted, then finish).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';

import { InvalidParams, RecoveringStream, SplitToolCall, StreamProducer, StreamStalled } from '../src/index.js';
import { REPO, withDaemon } from './harness.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const noWait = async () => {};

async function* items(list, then = 'end') {
  for (const x of list) yield x;
  if (then === 'forever') await new Promise(() => {}); // silent, never resolves
}

function chunks(s, n = 3) {
  const out = [];
  for (let i = 0; i < s.length; i += n) out.push(s.slice(i, i + n));
  return out;
}

async function render(rs) {
  const seqs = [];
  let text = '';
  for await (const ev of rs) {
    seqs.push(ev.seq);
    if (ev.type === 'stream_reset') text = '';
    else if (ev.type === 'text') text += ev.text;
  }
  assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), 'each event once, in order');
  return text;
}

test('each chunk is rendered while the provider is silent', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  // The provider sends its next chunk only once the first is rendered (at most 30 s): a
  // wrapper rendering a chunk when the next one comes would leave it to that timeout.
  // Ordering, not a clock (the machine may be slow); the latency is printed.
  let shown;
  const firstShown = new Promise((res) => { shown = res; });
  let released = null;
  async function* provider() {
    yield 'first ';
    released = await Promise.race([firstShown.then(() => true), sleep(30_000).then(() => false)]);
    yield 'second';
  }
  const t0 = Date.now();
  const at = {};
  for await (const ev of new RecoveringStream(c, 'latency', provider(), { reopen: () => items([]) })) {
    if (ev.type === 'text') { at[ev.text] = Date.now() - t0; shown(); }
  }
  assert.equal(released, true, 'the first chunk was not rendered while the provider waited');
  assert.ok(at['first '] <= at.second, JSON.stringify(at));
  console.log(`node render latency: first chunk rendered at ${at['first ']} ms while the provider waited`);
});

test('a silent provider mid-text is a stalled interruption, continued exactly', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const rs = new RecoveringStream(c, 'stall-text', items(['Hello, ', 'wor'], 'forever'), {
    reopen: (prefix) => { assert.equal(prefix, 'Hello, wor'); return items(['ld!']); },
    stallTimeoutMs: 400, sleep: noWait,
  });
  assert.equal(await render(rs), 'Hello, world!');
  assert.equal(rs.finalMessage.content, 'Hello, world!');
  assert.deepEqual(rs.plans.map((p) => [p.cause, p.plan, p.continuation]), [['stalled', 'R1', 'exact']]);
});

test('a tool call that stalls again and again raises SplitToolCall, never a text reply', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const call = (id) => ({ type: 'tool_call_delta', id, name: 'write_file', arguments_delta: '{"content": "lorem' });
  let n = 0;
  const shown = [];
  const rs = new RecoveringStream(c, 'stall-tool', items([{ type: 'text', text: 'On it. ' }, call('w0')], 'forever'), {
    reopen: (prefix) => { assert.equal(prefix, 'On it. '); n += 1; return items([call(`w${n}`)], 'forever'); },
    stallTimeoutMs: 300, sleep: noWait,
  });
  await assert.rejects(async () => { for await (const ev of rs) shown.push(ev); }, (e) => {
    assert.ok(e instanceof SplitToolCall, String(e));
    assert.ok(e.cause instanceof StreamStalled);
    assert.equal(e.tool, 'write_file');
    return true;
  });
  assert.deepEqual(rs.plans.map((p) => [p.cause, p.plan]), [['stalled', 'R3'], ['stalled', 'R3']]);
  assert.equal(shown.filter((e) => e.type === 'text').map((e) => e.text).join(''), 'On it. ');
  assert.deepEqual(shown.filter((e) => e.type === 'tool_call_cancel').map((e) => e.data.id), ['w0', 'w1']);
  assert.equal((await c.streamGet('stall-tool')).status, 'aborted');
});

test('an exact continuation is the model\'s text at every break point; restated removes the restatement', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const text = 'def f(x):\n    if x:\n        return 3\n    return 0\n'.repeat(2);
  let points = 0;
  for (let k = 1; k < text.length; k += 1) {
    async function* breaking() {
      for (const ch of chunks(text.slice(0, k))) yield ch;
      const e = new Error('reset');
      e.code = 'ECONNRESET';
      throw e;
    }
    const rs = new RecoveringStream(c, `exact-${k}`, breaking(), {
      reopen: (prefix) => items(chunks(text.slice(prefix.length))), sleep: noWait,
    });
    assert.equal(await render(rs), text, `break at ${k}`);
    assert.equal(rs.finalMessage.content, text);
    points += 1;
  }
  const prose = 'The quick brown fox jumps over the lazy dog.';
  const k = prose.indexOf('over') + 2;
  async function* breakingProse() {
    yield prose.slice(0, k);
    throw Object.assign(new Error('reset'), { code: 'ECONNRESET' });
  }
  const rs = new RecoveringStream(c, 'restated', breakingProse(), {
    reopen: (prefix) => items([prefix.slice(prefix.indexOf('jumps')) + prose.slice(prefix.length)]),
    continuation: 'restated', sleep: noWait,
  });
  assert.equal(await render(rs), prose);
  assert.equal(rs.plans[0].continuation, 'restated');
  assert.throws(() => new RecoveringStream(c, 'x', items([]), { reopen: () => items([]), continuation: 'maybe' }), TypeError);
  const b = await c.streamBegin('bad');
  await c.streamAppend('bad', b.stream_id, 1, [{ type: 'text', text: 'x' }]);
  await assert.rejects(c.streamInterrupt('bad', b.stream_id, 'connection_reset', { continuation: 'maybe' }), InvalidParams);
  console.log(`node exact continuation: ${points} break points, shown == stored == the model's text`);
});

test('a producer killed with SIGKILL: viewers see interrupted (producer_lost), then finish', async (t) => {
  const d = await withDaemon(t, { config: '[streams]\norphan_timeout_s = 2\n' });
  const code = `
    import { Client, StreamProducer } from ${JSON.stringify(`${REPO}/plugins/node/src/index.js`)};
    const c = await Client.connect({ socketPath: process.argv[1] });
    const p = await StreamProducer.begin(c, 'doomed');
    await p.text('partial answer');
    console.log('ready');
    setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', code, d.socket], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGKILL'));
  await new Promise((res) => child.stdout.on('data', (b) => { if (String(b).includes('ready')) res(); }));
  const c = await d.client();
  t.after(() => c.close());
  const sub = await c.subscribeStream('doomed', 1);
  const t0 = Date.now();
  child.kill('SIGKILL');
  const got = [];
  let since = null;
  for await (const ev of sub) {
    got.push([Date.now() - t0, ev.event]);
    if (since === null && ev.event.cause === 'producer_lost') {
      // Announced at once: while the run is still there, unheld since the loss (the daemon's
      // clock, not the client's: the machine may be slow).
      const live = await c.streamGet('doomed');
      assert.equal(live.status, 'interrupted');
      since = live.no_producer_since_ms;
    }
  }
  assert.deepEqual(got.map(([, e]) => [e.type, e.cause ?? e.status]), [['interrupted', 'producer_lost'], ['finish', 'abandoned']]);
  const state = await c.streamGet('doomed', { reveal: true });
  assert.equal(state.partial_message.content, 'partial answer');
  assert.ok(state.at_ms - since >= 2000, `ended ${state.at_ms - since} ms after the loss`);
  console.log(`node SIGKILLed producer: interrupted after ${got[0][0]} ms, finish (abandoned) after ${got[1][0]} ms`);
});

test('a restated continuation that only restates is committed, not waited for', async (t) => {
  // Regression (attack round, issue 35): the daemon holds that text until the commit decides.
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  async function* first() {
    yield 'The answer is 42.';
    throw Object.assign(new Error('reset'), { code: 'ECONNRESET' });
  }
  const t0 = Date.now();
  const rs = new RecoveringStream(c, 'only-restates', first(), {
    reopen: () => items(['is 42.']), continuation: 'restated', sleep: noWait,
  });
  assert.equal(await render(rs), 'The answer is 42.');
  assert.equal(rs.finalMessage.content, 'The answer is 42.');
  assert.ok(Date.now() - t0 < 10_000);
});

test('persistUIMessageStream with stallTimeoutMs: a silent UI stream ends its run for every viewer, and is cancelled', async (t) => {
  const { persistUIMessageStream } = await import('../src/ai.js');
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  async function* ui() {
    yield { type: 'start', messageId: 'm' };
    yield { type: 'text-delta', id: 't', delta: 'Half ' };
    await new Promise(() => {}); // the model's stream went silent
  }
  const producer = await StreamProducer.begin(c, 'ui-stall');
  const sub = await c.subscribeStream('ui-stall', 0);
  const work = persistUIMessageStream(c, 'ui-stall', ui(), { producer, stallTimeoutMs: 300 });
  const seen = [];
  for await (const ev of sub) seen.push(ev.event);
  const r = await work;
  assert.equal(r.status, 'aborted');
  assert.deepEqual(seen.map((e) => [e.type, e.cause ?? e.status ?? e.text]),
    [['text', 'Half '], ['finish', 'aborted']]);
  const state = await c.streamGet('ui-stall');
  assert.match(state.reason, /stalled/);
  // A web ReadableStream that goes silent is cancelled (a fetch body's connection freed).
  let cancelled = false;
  const web = new ReadableStream({
    start(ctl) { ctl.enqueue({ type: 'text-delta', id: 't', delta: 'x' }); },
    cancel() { cancelled = true; },
  });
  const r2 = await persistUIMessageStream(c, 'ui-stall-web', web, { stallTimeoutMs: 200 });
  assert.equal(r2.status, 'aborted');
  assert.ok(cancelled, 'the silent web stream was not cancelled');
  await assert.rejects(persistUIMessageStream(c, 'x', [], { stallTimeoutMs: Infinity }), TypeError);
});

test('second attack round: ReadableStream providers, early breaks, sync throws, the stall clock, late opens, the wait shown, the subscription cap', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const rsOf = (parts, then = 'end') => new ReadableStream({
    async start(ctl) {
      for (const x of parts) ctl.enqueue(x);
      if (then === 'end') ctl.close();
    },
  });
  // A web ReadableStream that stalls: abandoned without crashing the process, recovered.
  const r1 = new RecoveringStream(c, 'web-stall', rsOf(['Hello '], 'stall'), {
    reopen: () => rsOf(['world']), stallTimeoutMs: 200, sleep: noWait,
  });
  assert.equal(await render(r1), 'Hello world');
  // A consumer breaking out early: the loop ends, the run stays resumable.
  const r2 = new RecoveringStream(c, 'web-break', rsOf(['a', 'b', 'c'], 'stall'), { reopen: () => rsOf([]) });
  for await (const ev of r2) if (ev.type === 'text') break;
  assert.equal((await c.streamGet('web-break')).status, 'streaming');
  // A sync iterator whose next() throws a provider error: classified, recovered.
  let n = 0;
  const throwing = { [Symbol.iterator]() { return { next() { n += 1; if (n === 1) return { value: 'Hi ', done: false }; throw Object.assign(new Error('overloaded'), { status: 503 }); } }; } };
  const r3 = new RecoveringStream(c, 'sync-throw', throwing, { reopen: () => items(['there']), sleep: noWait });
  assert.equal(await render(r3), 'Hi there');
  assert.equal(r3.plans[0].cause, 'overloaded');
  // The stall clock runs from the request on: slow to open + slow first chunk is a stall.
  const slow = async () => { await sleep(250); return (async function* g() { await sleep(250); yield 'late'; }()); };
  let opened = 0;
  const closed = [];
  const reopen = async () => {
    opened += 1;
    const k = opened;
    if (k === 1) await sleep(600); // still opening when the stall is declared
    let sent = false;
    return {
      [Symbol.asyncIterator]() {
        return {
          next: async () => (sent ? { done: true } : (sent = true, { value: `r${k}`, done: false })),
          return: async () => { closed.push(k); return { done: true }; },
        };
      },
    };
  };
  const r4 = new RecoveringStream(c, 'clock', slow, { reopen, stallTimeoutMs: 300, sleep: noWait });
  const text4 = await render(r4);
  assert.deepEqual(r4.plans.map((x) => x.cause), ['stalled', 'stalled'], text4);
  assert.equal(text4, 'r2');
  for (let i = 0; i < 100 && !closed.includes(1); i += 1) await sleep(100); // it opens late
  assert.ok(closed.includes(1), `the stream opened after its stall was never let go: ${closed}`);
  // The plan's interrupted (its wait) is shown before the wait.
  const shownBeforeWait = [];
  const seen = [];
  async function* limited() { yield 'x '; throw Object.assign(new Error('429'), { status: 429, retryAfter: '2' }); }
  const r5 = new RecoveringStream(c, 'wait-shown', limited(), {
    reopen: () => items(['y']), sleep: async (ms) => { shownBeforeWait.push([ms, seen.map((e) => e.type)]); },
  });
  for await (const ev of r5) seen.push(ev);
  assert.ok(shownBeforeWait[0][0] >= 2000 && shownBeforeWait[0][1].includes('interrupted'), JSON.stringify(shownBeforeWait));
  // Past the connection's 16 subscriptions: the run just begun is aborted, not left held.
  await c.streamBegin('live');
  const subs = [];
  for (let i = 0; i < 16; i += 1) subs.push(await c.subscribeStream('live', 0));
  await assert.rejects(render(new RecoveringStream(c, 'one-too-many', items(['x']), { reopen: () => items([]) })));
  const st = await c.streamGet('one-too-many');
  assert.equal(st.status, 'aborted');
  assert.match(st.reason, /subscribe/);
  for (const s of subs) await s.close();
});

test('many empty chunks do not pile up waiters on the subscription', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  function* empties() { for (let i = 0; i < 200_000; i += 1) yield ''; yield 'x'; }
  const before = process.memoryUsage().heapUsed;
  const rs = new RecoveringStream(c, 'empties', empties(), { reopen: () => items([]) });
  assert.equal(await render(rs), 'x');
  const grew = process.memoryUsage().heapUsed - before;
  console.log(`node: 200,000 empty chunks, heap grew ${(grew / 1048576).toFixed(1)} MiB`);
  assert.ok(grew < 64 * 1048576, `heap grew ${grew} bytes`);
});

test('third attack round: a silent or abandoned web stream is cancelled; an unreadable Retry-After does not stop the recovery', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const cancelled = [];
  const web = (name, parts, end = false) => new ReadableStream({
    start(ctl) { for (const x of parts) ctl.enqueue(x); if (end) ctl.close(); },
    cancel() { cancelled.push(name); },
  });
  const r1 = new RecoveringStream(c, 'web-cancel-stall', web('stalled', ['Hello ']), {
    reopen: () => web('second', ['world'], true), stallTimeoutMs: 200, sleep: noWait,
  });
  assert.equal(await render(r1), 'Hello world');
  for await (const ev of new RecoveringStream(c, 'web-cancel-break', web('broken-out', ['a']), { reopen: () => items([]) })) {
    if (ev.type === 'text') break;
  }
  await sleep(100);
  assert.ok(cancelled.includes('stalled') && cancelled.includes('broken-out'), JSON.stringify(cancelled));
  for (const ra of ['soon', '', '1.5', -1]) {
    async function* limited() { yield 'x '; throw Object.assign(new Error('429'), { status: 429, retryAfter: ra }); }
    const rs = new RecoveringStream(c, `ra-${String(ra).replace(/[^a-z0-9]/g, '_') || 'empty'}`, limited(), { reopen: () => items(['y']), sleep: noWait });
    assert.equal(await render(rs), 'x y', `Retry-After ${JSON.stringify(ra)}`);
    assert.equal(rs.plans[0].cause, 'rate_limited');
  }
});

test('fourth attack round: once its appends are refused, the stream stops reading the provider', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  const other = await d.client();
  t.after(() => { c.close(); other.close(); });
  let pulled = 0;
  let tookOver = false;
  async function* many() {
    for (let i = 0; i < 60; i += 1) {
      pulled += 1;
      if (i === 5 && !tookOver) { tookOver = true; await other.streamResume('refused-appends'); }
      await sleep(20);
      yield `w${i} `;
    }
  }
  const rs = new RecoveringStream(c, 'refused-appends', many(), { reopen: () => items([]) });
  await assert.rejects(render(rs), (e) => e.name === 'Conflict');
  assert.ok(pulled < 20, `the provider was read on after the takeover: ${pulled} chunks`);
});

// sseHandler against the real daemon: framing, Last-Event-ID resume at every position of a
// 500-event run, the committed run's stored message instead of a replay, 404/400/204,
// heartbeats, and the recovery events a UI acts on.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { StreamProducer, followStats, sseHandler } from '../src/index.js';
import { withDaemon } from './harness.js';
import { readSse } from './sse-client.js';

async function serve(t, client, options) {
  const handler = sseHandler(client, (req) => decodeURIComponent(new URL(req.url, 'http://x').pathname.split('/')[2]), options);
  const server = http.createServer((req, res) => { handler(req, res); });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => { server.closeAllConnections(); server.close(); });
  return `http://127.0.0.1:${server.address().port}`;
}

const N = 500;
const pieces = Array.from({ length: N }, (_, i) => `t${i}${i % 7 === 0 ? '\n' : ' '}`);

test(`Last-Event-ID resume at every position of a ${N}-event run: what came before + the resume = the run, once`, async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c);
  const p = await StreamProducer.begin(c, 'run-500', { model: 'm' });
  for (let i = 0; i < N; i += 50) await p.append(pieces.slice(i, i + 50).map((text) => ({ type: 'text', text })));

  const full = pieces.join('');
  let checked = 0;
  for (let k = 0; k <= N; k++) {
    const headers = k === 0 ? {} : { 'last-event-id': String(k) };
    const r = k === N
      ? await readSse(`${base}/runs/run-500/events`, { headers, until: (ps) => ps.retry !== null, timeoutMs: 5000 })
      : await readSse(`${base}/runs/run-500/events`, { headers, until: (ps) => ps.lastId === String(N) });
    assert.equal(r.status, 200);
    if (k === 0) {
      assert.equal(r.headers['content-type'], 'text/event-stream; charset=utf-8');
      assert.equal(r.retry, 1000);
    }
    const seqs = r.events.map((e) => Number(e.id));
    assert.deepEqual(seqs, Array.from({ length: N - k }, (_, i) => k + 1 + i), `resume after ${k}`);
    for (const e of r.events) {
      assert.equal(e.event, 'text');
      assert.equal(JSON.parse(e.data).seq, Number(e.id));
    }
    const text = pieces.slice(0, k).join('') + r.events.map((e) => JSON.parse(e.data).text).join('');
    assert.equal(text, full, `resume after ${k}`);
    checked += 1;
  }
  console.log(`Last-Event-ID resume: ${checked} positions (0..${N}) of a ${N}-event run, each = the run exactly once`);

  // Live: a page following from the start while the rest arrives and the run commits.
  const live = readSse(`${base}/runs/run-500/events`, { headers: { 'last-event-id': String(N - 5) } });
  // Attached before the run goes on (a handler that first ran after the commit would rightly
  // serve the stored message instead).
  await until(() => followStats(c).viewers >= 1, 30_000, 'the live viewer attached');
  for (const x of ['and ', 'the ', 'end.']) await p.text(x);
  await p.commit({ role: 'assistant' });
  const r = await live;
  assert.equal(r.ended, true, 'the response ends after finish');
  assert.deepEqual(r.events.map((e) => e.event), ['text', 'text', 'text', 'text', 'text', 'text', 'text', 'text', 'finish']);
  const fin = JSON.parse(r.events.at(-1).data);
  assert.equal(fin.status, 'committed');
  assert.equal(fin.final_message.content, `${full}and the end.`);
  assert.equal(fin.seq, N + 4);
  console.log(`live follow: ${r.events.length} events then finish with the stored message (${fin.final_message.content.length} chars)`);

  // Refresh after the commit: the stored message once, never the deltas again.
  const fresh = await readSse(`${base}/runs/run-500/events`);
  assert.deepEqual(fresh.events.map((e) => e.event), ['final']);
  assert.equal(JSON.parse(fresh.events[0].data).final_message.content, `${full}and the end.`);
  assert.equal(fresh.events[0].id, String(N + 4));
  // A browser that saw part of it and comes back after the commit: the stored message, to
  // replace what it holds.
  const partial = await readSse(`${base}/runs/run-500/events`, { headers: { 'last-event-id': '17' } });
  assert.deepEqual(partial.events.map((e) => e.event), ['final']);
  // EventSource reconnecting after the finish it saw: 204, which stops it.
  const after = await readSse(`${base}/runs/run-500/events`, { headers: { 'last-event-id': String(N + 4) } });
  assert.equal(after.status, 204);
  assert.deepEqual(after.events, []);
});

test('404 for a run that never existed, 400 for a bad id or Last-Event-ID; heartbeats; unsubscribed on close', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c, { heartbeatMs: 40, retryMs: 250 });
  assert.equal((await readSse(`${base}/runs/never-was/events`)).status, 404);
  assert.equal((await readSse(`${base}/runs/.hidden/events`)).status, 400);
  const p = await StreamProducer.begin(c, 'run-hb');
  await p.text('x');
  assert.equal((await readSse(`${base}/runs/run-hb/events`, { headers: { 'last-event-id': 'abc' } })).status, 400);
  assert.equal((await readSse(`${base}/runs/run-hb/events?lastEventId=-1`)).status, 400);
  const q = await readSse(`${base}/runs/run-hb/events?lastEventId=1`, { until: (ps) => ps.comments.filter((x) => x === 'ping').length >= 3 });
  assert.equal(q.retry, 250);
  assert.deepEqual(q.events, [], 'lastEventId in the query resumes after it');
  assert.ok(q.comments.filter((x) => x === 'ping').length >= 3);
  // The dropped browsers' subscriptions were given back: this connection can open 16 more.
  await new Promise((r) => setTimeout(r, 100));
  const subs = [];
  for (let i = 0; i < 16; i++) subs.push(await c.subscribeStream('run-hb', 1));
  for (const s of subs) await s.close();
});

test('recovery events reach the page as SSE events it can act on: tool_call_cancel, interrupted, stream_reset', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c);
  // A cut-off tool call: cancelled, then R3 continues the text.
  const p = await StreamProducer.begin(c, 'run-cut');
  await p.append([{ type: 'text', text: 'Writing it. ' }, { type: 'tool_call_delta', id: 'c1', name: 'write_file', arguments_delta: '{"path": "a' }]);
  const plan = await p.interrupt('connection_reset');
  assert.equal(plan.plan, 'R3');
  // No text at all: R4 resets.
  const q = await StreamProducer.begin(c, 'run-reset');
  assert.equal((await q.interrupt('provider_5xx')).plan, 'R4');
  for (const [run, expect] of [['run-cut', ['text', 'tool_call_delta', 'tool_call_cancel', 'interrupted']], ['run-reset', ['stream_reset', 'interrupted']]]) {
    const r = await readSse(`${base}/runs/${run}/events`, { until: (ps) => ps.events.some((e) => e.event === 'interrupted') });
    assert.deepEqual(r.events.map((e) => e.event), expect, run);
    const last = JSON.parse(r.events.at(-1).data);
    assert.equal(last.type, 'interrupted');
    console.log(`${run}: ${r.events.map((e) => e.event).join(', ')} (plan ${last.plan})`);
  }
});

/** Until `cond()` holds (checked every 20 ms), for at most `ms`: a condition, not a timing. */
async function until(cond, ms, what) {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('40 SSE viewers of one run on one client: each gets every event after its Last-Event-ID exactly once, in order, then finish', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c, { heartbeatMs: 60_000 });
  const p = await StreamProducer.begin(c, 'run-many', { model: 'm' });
  const texts = Array.from({ length: 90 }, (_, i) => `e${i + 1} `);
  await p.append(texts.slice(0, 30).map((text) => ({ type: 'text', text })));
  // 20 viewers from the start, then (after 30 more events) 10 late ones from the start and
  // 10 coming back with a Last-Event-ID: the late ones are served from the run's history.
  const viewers = [];
  const open = (after) => {
    const headers = after ? { 'last-event-id': String(after) } : {};
    viewers.push({ after, r: readSse(`${base}/runs/run-many/events`, { headers, timeoutMs: 60_000 }) });
  };
  // A request only starts when `open` returns: each group is waited for until the server has
  // attached it (on a loaded machine a handler could otherwise first run after the commit, and
  // rightly serve the stored message instead of the live run).
  for (let i = 0; i < 20; i++) open(0);
  await until(() => followStats(c).viewers >= 20, 30_000, '20 viewers attached');
  await p.append(texts.slice(30, 60).map((text) => ({ type: 'text', text })));
  for (let i = 0; i < 10; i++) open(0);
  for (let i = 0; i < 10; i++) open(5 + i * 5);
  await until(() => followStats(c).viewers >= 40, 30_000, '40 viewers attached');
  for (const text of texts.slice(60)) await p.text(text);
  await p.commit({ role: 'assistant' });
  const results = await Promise.all(viewers.map((v) => v.r));
  assert.equal(results.length, 40);
  results.forEach((r, i) => {
    const { after } = viewers[i];
    assert.equal(r.status, 200, `viewer ${i}`);
    assert.equal(r.ended, true, `viewer ${i}: the response ended after finish`);
    const errors = r.events.filter((e) => e.event === 'error');
    assert.deepEqual(errors, [], `viewer ${i}: no error`);
    const body = r.events.slice(0, -1);
    assert.deepEqual(body.map((e) => Number(e.id)), Array.from({ length: 90 - after }, (_, k) => after + k + 1), `viewer ${i} (after ${after}): every event once, in order`);
    assert.equal(body.map((e) => JSON.parse(e.data).text).join(''), texts.slice(after).join(''));
    assert.equal(r.events.at(-1).event, 'finish', `viewer ${i}: saw the run end live`);
    assert.equal(JSON.parse(r.events.at(-1).data).final_message.content, texts.join(''));
  });
  console.log(`40 viewers (20 from the start, 10 late, 10 with Last-Event-ID 5..50) of one run: each got its events once, in order, and finish`);
});

test('SSE viewers of more runs than one connection has subscription slots: none is refused', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c, { heartbeatMs: 60_000 });
  const runs = Array.from({ length: 20 }, (_, i) => `run-wide-${i}`);
  const producers = [];
  for (const run of runs) {
    const p = await StreamProducer.begin(c, run);
    await p.text(`${run} first `);
    producers.push(p);
  }
  const firstSeen = new Array(runs.length * 2).fill(false);
  const reads = runs.flatMap((run, i) => [0, 1].map((k) => readSse(`${base}/runs/${run}/events`, {
    timeoutMs: 60_000, until: (ps) => { firstSeen[i * 2 + k] = ps.events.length > 0; return false; },
  })));
  // Every viewer has the run's first event before the rest comes.
  await until(() => firstSeen.every(Boolean), 30_000, `every viewer got its run's first event (${firstSeen.filter(Boolean).length} of ${firstSeen.length} did)`);
  for (const p of producers) await p.text('second.');
  for (const p of producers) await p.commit({ role: 'assistant' });
  const results = await Promise.all(reads);
  results.forEach((r, i) => {
    const run = runs[Math.floor(i / 2)];
    assert.deepEqual(r.events.map((e) => e.event), ['text', 'text', 'finish'], `${run}: ${JSON.stringify(r.events)}`);
    assert.equal(JSON.parse(r.events.at(-1).data).final_message.content, `${run} first second.`);
  });
  const { followStats } = await import('../src/index.js');
  await until(() => followStats(c).runs === 0 && followStats(c).connections === 1, 30_000, 'the shared subscriptions and extra connections given back');
  // This connection's own 16 slots are free again.
  const subs = [];
  for (let i = 0; i < 16; i++) subs.push(await c.subscribeStream('run-wide-0', 0));
  for (const s of subs) await s.close();
});

test('a Last-Event-ID past the end of a live run: held until the run ends, then the stored message and the end of the response', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const base = await serve(t, c, { heartbeatMs: 60_000 });
  const p = await StreamProducer.begin(c, 'run-past');
  await p.append([{ type: 'text', text: 'one ' }, { type: 'text', text: 'two ' }]);
  let connected = false;
  const r = readSse(`${base}/runs/run-past/events`, { headers: { 'last-event-id': '50' }, timeoutMs: 30_000, until: (ps) => { connected = ps.retry !== null; return false; } });
  await until(() => connected, 20_000, 'the viewer is connected');
  await p.text('three.');
  const end = await p.commit({ role: 'assistant' });
  const got = await r;
  assert.equal(got.ended, true, 'the response ended when the run did');
  assert.deepEqual(got.events.map((e) => e.event), ['final'], 'no event of the run (all before its position), then the stored message');
  assert.equal(got.events[0].id, String(end.finish_seq));
  assert.equal(JSON.parse(got.events[0].data).final_message.content, 'one two three.');
  // Its subscription was given back: this connection has its 16 slots for a live run.
  const live = await StreamProducer.begin(c, 'run-slots');
  await live.text('x');
  await until(async () => {
    const subs = [];
    try {
      for (let i = 0; i < 16; i++) subs.push(await c.subscribeStream('run-slots', 0));
      return true;
    } catch {
      return false;
    } finally {
      for (const s of subs) await s.close();
    }
  }, 20_000, 'its subscription given back');
  // After the end: past it, the stored message (the page's position is not the run's); at it, 204.
  const later = await readSse(`${base}/runs/run-past/events`, { headers: { 'last-event-id': '50' } });
  assert.deepEqual(later.events.map((e) => e.event), ['final']);
  assert.equal((await readSse(`${base}/runs/run-past/events`, { headers: { 'last-event-id': String(end.finish_seq) } })).status, 204);
});

test('a viewer the server cannot serve gets an error event before its response ends (never a silent empty 200)', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client({ reconnectTimeoutMs: 1500 });
  t.after(() => c.close());
  const base = await serve(t, c, { heartbeatMs: 60_000 });
  const p = await StreamProducer.begin(c, 'run-gone');
  await p.text('first ');
  let got = 0;
  const r = readSse(`${base}/runs/run-gone/events`, { timeoutMs: 60_000, until: (ps) => { got = ps.events.length; return false; } });
  await until(() => got === 1, 20_000, 'the viewer has the first event');
  await d.stop(); // the daemon goes away for longer than the client's reconnect timeout
  const res = await r;
  assert.equal(res.ended, true, 'the response ended');
  assert.deepEqual(res.events.map((e) => e.event), ['text', 'error']);
  const err = JSON.parse(res.events[1].data);
  assert.equal(typeof err.message, 'string');
  assert.ok(err.message.length > 0);
  console.log(`daemon gone: the viewer got an error event (${err.kind}: ${err.message})`);
});

test('a viewer arriving during a daemon restart is served once the client reconnects; a daemon that stays away gets an SSE error with retry, never a 503', async (t) => {
  const { until } = await import('./harness.js');
  const d = await withDaemon(t);
  const prod = await d.client({ client: 'prod' });
  const web = await d.client({ client: 'web', reconnectTimeoutMs: 60_000 });
  t.after(() => { prod.close(); web.close(); });
  const base = await serve(t, web);
  const p = await StreamProducer.begin(prod, 'run-r');
  await p.text('hello');

  // The viewer's stream.get is in flight when the daemon goes (stopped, then killed).
  const proc = d.proc;
  proc.kill('SIGSTOP');
  const viewer = readSse(`${base}/runs/run-r/events`, { until: (ps) => ps.events.length > 0, timeoutMs: 90_000 });
  await until(() => web._conn?.pending.size > 0, 20_000, 'the viewer\'s call is in flight');
  await d.restart('SIGKILL');
  const r = await viewer;
  assert.equal(r.status, 200);
  assert.equal(r.events[0].event, 'text', JSON.stringify(r.events));
  assert.equal(JSON.parse(r.events[0].data).text, 'hello');

  // The daemon away for longer than the client keeps trying.
  const impatient = await d.client({ client: 'web2', reconnectTimeoutMs: 500 });
  t.after(() => impatient.close());
  const base2 = await serve(t, impatient);
  await d.stop();
  try {
    const down = await readSse(`${base2}/runs/run-r/events`, { timeoutMs: 60_000 });
    assert.equal(down.status, 200, 'not a status that stops EventSource for good');
    assert.ok(down.retry > 0, 'the browser is told when to come back');
    assert.equal(down.events.at(-1)?.event, 'error');
    assert.ok(down.ended);
  } finally {
    await d.launch();
  }
});

test('viewers never take the slots of the application\'s connection, and a burst of viewers of many runs shares further connections 16 runs each', async (t) => {
  const { RecoveringStream, followRun, followStats } = await import('../src/index.js');
  const { until } = await import('./harness.js');
  const d = await withDaemon(t);
  const web = await d.client({ client: 'web' });
  const prod = await d.client({ client: 'prod' });
  t.after(() => { web.close(); prod.close(); });
  const R = 40;
  for (let i = 0; i < R; i++) {
    const p = await StreamProducer.begin(prod, `b-${i}`);
    await p.text('x');
  }
  // Viewers of R runs arriving at once.
  const viewers = Array.from({ length: R }, (_, i) => followRun(web, `b-${i}`, 0));
  const firsts = await Promise.all(viewers.map((v) => v.next()));
  assert.ok(firsts.every((r) => r.value?.event?.type === 'text'));
  const stats = followStats(web);
  assert.equal(stats.runs, R);
  assert.ok(stats.connections <= 1 + Math.ceil(R / 16), `${stats.connections} connections for ${R} runs`);

  // The application's own connection still has all 16 slots.
  const subs = [];
  for (let i = 0; i < 15; i++) subs.push(await web.subscribeStream(`b-${i}`, 0));
  async function* provider() { yield 'Hello '; yield 'world'; }
  let text = '';
  for await (const ev of new RecoveringStream(web, 'answer-1', provider(), { reopen: () => provider() })) {
    if (ev.type === 'text') text += ev.text;
  }
  assert.equal(text, 'Hello world');
  assert.equal((await prod.streamGet('answer-1')).status, 'committed');
  for (const s of subs) await s.close();
  for (const v of viewers) await v.close();
  await until(() => followStats(web).connections === 1, 30_000, 'the further connections closed with their last viewer');
});

// The example chat server's care of its producers, without a browser (browser.test.js drives
// the page): a shutdown hands the answers in progress over to the next server, a producer whose
// run has ended is not restarted, and a message whose run never began is given up on.
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { fakeReply } from '../examples/chat/fake-provider.js';
import { startChatServer, until, withDaemon } from './harness.js';

async function post(server, thread, body) {
  const r = await fetch(`${server.url}api/threads/${thread}/messages`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

const getJson = async (url) => {
  const r = await fetch(url);
  return { status: r.status, body: await r.json() };
};

const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test('SIGTERM hands the answers in progress over: the server exits, and the next one resumes and finishes them', async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const server = await startChatServer(t, d);
  const prompts = ['First answer in flight', 'Second answer in flight'];
  const runs = [];
  for (const [i, text] of prompts.entries()) runs.push(await post(server, `handover-${i}`, { text, deltas: 400, delayMs: 15 }));
  for (const { run_id: run } of runs) await until(async () => (await client.streamGet(run)).next_seq > 40, 30_000, `${run} streaming`);
  const exit = await server.kill('SIGTERM');
  assert.deepEqual(exit, { code: 0, signal: null }, `the server stopped cleanly:\n${server.log()}`);
  for (const { run_id: run, producer_pid: pid } of runs) {
    assert.equal(alive(pid), false, `its producer ${pid} stopped with it`);
    const state = await client.streamGet(run);
    assert.ok(!['committed', 'aborted', 'expired', 'abandoned'].includes(state.status), `${run} was left resumable, not ended: ${state.status}`);
    assert.notEqual(state.no_producer_since_ms, null, `${run} is held by no producer`);
  }
  assert.match(server.log(), /handed over/);

  const next = await startChatServer(t, d);
  for (const [i, { run_id: run }] of runs.entries()) {
    const state = await until(async () => {
      const s = await client.streamGet(run, { reveal: true });
      return s.status === 'committed' ? s : null;
    }, 60_000, `${run} committed by the next server's producer`);
    assert.equal(state.final_message.content, fakeReply(prompts[i], 400).join(''), `${run}: the whole answer, once`);
    assert.equal(state.last_plan.plan, 'R1', 'resumed after the text already streamed');
  }
  assert.match(next.log(), /resuming chat-handover-0/);
  console.log(`SIGTERM mid-answer: ${runs.length} runs handed over and finished by the next server`);
});

test('a producer whose run ended under it is not restarted', async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const server = await startChatServer(t, d);
  const { run_id: run, producer_pid: pid } = await post(server, 'ended-under', { text: 'Ended under me', deltas: 200, delayMs: 10 });
  await until(async () => (await client.streamGet(run)).next_seq > 5, 30_000, 'streaming');
  // Someone else takes the run over and commits it: the producer's writes are refused, and it
  // dies with its run committed — as one killed just after its own commit does.
  const { stream_id: sid } = await client.streamBegin(run, { takeover: true });
  await client.streamCommit(run, sid, { role: 'assistant', content: 'taken over' });
  await until(() => !alive(pid), 60_000, `producer ${pid} exits`);
  await until(() => /nothing to resume|starting a new one/.test(server.log()), 30_000, 'the server decided about the dead producer');
  const info = await getJson(`${server.url}api/runs/${run}`);
  assert.equal(info.body.producer_restarts, 0, `not restarted:\n${server.log()}`);
  assert.doesNotMatch(server.log(), /starting a new one to resume/);
  assert.equal(info.body.status, 'committed');
});

test('a message whose run never began: reported failed after the start timeout, never polled forever', async (t) => {
  const d = await withDaemon(t);
  const dataDir = join(d.root, 'chat-never');
  mkdirSync(dataDir, { recursive: true });
  const run = 'chat-never-1';
  writeFileSync(join(dataDir, 'threads.json'), JSON.stringify({
    never: [{ text: 'hello?', run_id: run, created_at_ms: Date.now(), job: { run_id: run, thread_id: 'never', prompt: 'hello?', deltas: 5, delayMs: 0, failAt: null } }],
  }));
  const server = await startChatServer(t, d, { dataDir, args: ['--start-timeout-ms', '1500'] });
  const first = await getJson(`${server.url}api/runs/${run}`);
  assert.equal(first.status, 404);
  const gaveUp = await until(async () => {
    const r = await getJson(`${server.url}api/runs/${run}`);
    return r.body.gave_up ? r : null;
  }, 30_000, 'the server gives up on the run');
  assert.equal(gaveUp.status, 404);
  const view = await getJson(`${server.url}api/threads/never`);
  assert.deepEqual(view.body.messages.map((m) => m.status ?? m.role), ['user', 'failed']);
  assert.match(view.body.messages[1].error, /never started/);
});

test('a rolling restart (the new server up before the old one stops) loses no answer; a message posted during a shutdown is answered 503 + Retry-After', async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const old = await startChatServer(t, d);
  const { run_id: run } = await post(old, 'rolling', { text: 'An answer during a rolling restart', deltas: 400, delayMs: 15 });
  await until(async () => (await client.streamGet(run)).next_seq > 20, 30_000, 'streaming');
  const next = await startChatServer(t, d); // same --data
  // A second message to the old server, whose producer is held up (stopped) so that the
  // shutdown is still waiting for it when a third message comes.
  const { run_id: run2, producer_pid: slow } = await post(old, 'rolling', { text: 'Second', deltas: 400, delayMs: 15 });
  process.kill(slow, 'SIGSTOP');
  const stopped = old.kill('SIGTERM');
  let late;
  try {
    await until(() => /stopping; handing/.test(old.log()), 20_000, 'the shutdown began');
    const r = await fetch(`${old.url}api/threads/rolling/messages`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ text: 'During the shutdown' }),
    });
    late = { status: r.status, retryAfter: r.headers.get('retry-after'), body: await r.json() };
  } finally {
    process.kill(slow, 'SIGCONT');
  }
  assert.equal(late.status, 503);
  assert.equal(late.retryAfter, '1');
  assert.match(late.body.error, /restarting/);
  assert.deepEqual(await stopped, { code: 0, signal: null }, old.log());
  for (const r of [run, run2]) {
    await until(async () => (await client.streamGet(r)).status === 'committed', 90_000, `${r} resumed by the new server and committed`);
  }
  assert.match(next.log(), /resuming chat-rolling-/);
  const view = await getJson(`${next.url}api/threads/rolling`);
  assert.deepEqual(view.body.messages.map((m) => m.status ?? m.role), ['user', 'committed', 'user', 'committed'], 'the turns the old server recorded after the new one started are there');
});

test('a malformed URL is a 400, never the end of the server', async (t) => {
  const d = await withDaemon(t);
  const server = await startChatServer(t, d);
  // One unauthenticated request with a path parameter that does not decode ended the process
  // (decodeURIComponent threw outside the handler's try: found by the independent attack).
  for (const [method, path] of [['GET', 'api/threads/%E0%A4%A'], ['GET', 'api/runs/%ZZ/events'], ['GET', 'api/runs/%ZZ'], ['POST', 'api/threads/%C0%80/messages']]) {
    const r = await fetch(`${server.url}${path}`, { method, headers: { 'content-type': 'application/json' }, body: method === 'POST' ? '{"text":"x"}' : undefined });
    assert.equal(r.status, 400, `${path}: ${r.status} ${await r.clone().text()}`);
    assert.match((await r.json()).error, /malformed URL/);
  }
  // Still serving.
  const ok = await fetch(`${server.url}`);
  assert.equal(ok.status, 200);
});

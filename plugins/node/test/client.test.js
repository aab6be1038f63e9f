// The Node client against the real daemon binary: every method family, typed errors, secrets
// kept out of messages, pipelining, subscriptions, reconnection across a daemon restart.
import assert from 'node:assert/strict';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { inspect } from 'node:util';

import {
  Client, Conflict, ConnectionClosed, Forbidden, HoldfastError, InvalidParams, NotFound,
  StreamProducer, Unsupported, defaultSocketPath,
} from '../src/index.js';
import { SECRET, withDaemon } from './harness.js';

function assertNoSecret(err) {
  for (const shown of [err.message, String(err), inspect(err), JSON.stringify(err.data), err.stack]) {
    assert.ok(!String(shown).includes(SECRET), `secret leaked: ${shown}`);
  }
}

test('hello, credentials, and a typed error for each failure', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  assert.equal(c.hello.server, 'holdfast');
  assert.equal(c.hello.protocol, 1);
  assert.ok(c.hello.methods.includes('stream.append'));

  assert.deepEqual(await c.setValue('openai', SECRET), { id: 'openai', generation: 1 });
  const rec = await c.get('openai');
  assert.equal(rec.generation, 1);
  assert.equal(rec.value(), SECRET);
  assert.ok(!inspect(rec).includes(SECRET), 'console.log of a credential hides its values');
  assert.ok(inspect(rec).includes('api_key'));
  // What loggers write (pino/winston call JSON.stringify; others spread or clone the object):
  // never the value. The value is there on explicit access only.
  const shown = {
    json: JSON.stringify(rec), nested: JSON.stringify({ msg: 'got it', rec, list: [rec] }),
    inspect: inspect(rec, { showHidden: true, depth: null, getters: true }),
    nestedInspect: inspect({ rec }, { showHidden: true, depth: null }), string: String(rec),
    template: `${rec}`, spread: JSON.stringify({ ...rec }), clone: JSON.stringify(structuredClone(rec)),
    keys: JSON.stringify(Object.entries(rec)),
  };
  for (const [how, text] of Object.entries(shown)) assert.ok(!text.includes(SECRET), `the secret serialized through ${how}: ${text}`);
  assert.deepEqual(JSON.parse(shown.json), { id: 'openai', generation: 1, keys: ['api_key'], values: 'hidden', credential_type: 'api_key' });
  assert.equal(rec.credential.keys.api_key.value, SECRET, 'explicit access gives the value');
  assert.deepEqual(rec.keyNames, ['api_key']);
  assert.equal(await c.exists('openai'), true);
  assert.deepEqual((await c.list()).map((x) => x.id), ['openai']);
  assert.ok(!JSON.stringify(await c.list()).includes(SECRET), 'cred.list has no values');

  await c.set({ id: 'gh', credential_type: 'oauth2', keys: { access_token: { value: 'x1' } } }, { ifGeneration: 0 });
  const conflict = await c.set({ id: 'gh', keys: { access_token: { value: SECRET } } }, { ifGeneration: 0 })
    .then(() => null, (e) => e);
  assert.ok(conflict instanceof Conflict && conflict instanceof HoldfastError);
  assert.equal(conflict.kind, 'conflict');
  assert.equal(conflict.code, -32002);
  assert.equal(conflict.data.generation, 1);
  assertNoSecret(conflict);

  const missing = await c.get('nope').then(() => null, (e) => e);
  assert.ok(missing instanceof NotFound, String(missing));
  const bad = await c.get('../etc/passwd').then(() => null, (e) => e);
  assert.ok(bad instanceof InvalidParams);
  assert.match(bad.message, /invalid id/);
  const unknown = await c.call('no.such.method').then(() => null, (e) => e);
  assert.ok(unknown instanceof Unsupported);
  // A wrong-typed field holding a secret: the daemon does not echo it, nor does the client.
  const typed = await c.call('cred.set', { id: 'z', value: SECRET, bogus_field_with_secret: SECRET })
    .then(() => null, (e) => e);
  assert.ok(typed instanceof InvalidParams);
  assertNoSecret(typed);
  await assert.rejects(c.call('cred.watch'), InvalidParams, 'subscriptions go through watch()');

  const lease = await c.refreshLease('gh', 5000);
  assert.equal(lease.granted, true);
  assert.equal(await c.releaseLease('gh'), true);
  assert.equal(await c.delete('openai'), true);
  assert.equal(await c.delete('openai'), false);
  const st = await c.status();
  assert.equal(st.stores[0].name, 'default');
  console.log('credentials: set/get/list/exists/CAS/lease/delete and 5 error kinds checked');
});

test('a plugin grant is enforced and an unknown plugin is refused', async (t) => {
  const d = await withDaemon(t, { config: '[plugins.reader]\nstores = ["default"]\nmethods = ["cred.get", "cred.list"]\n' });
  const r = await d.client({ plugin: 'reader' });
  t.after(() => r.close());
  assert.deepEqual(r.hello.methods.sort(), ['cred.get', 'cred.list', 'hello', 'unsubscribe']);
  await assert.rejects(r.setValue('x', 'y'), Forbidden);
  await assert.rejects(d.client({ plugin: 'nobody' }), Forbidden);
});

test('pipelined calls: 200 at once on one connection, each answered to its caller', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const ids = Array.from({ length: 200 }, (_, i) => `k${i}`);
  await Promise.all(ids.map((id, i) => c.setValue(id, `v${i}`)));
  const got = await Promise.all(ids.map((id) => c.get(id)));
  got.forEach((rec, i) => assert.equal(rec.value(), `v${i}`));
  console.log(`200 pipelined writes and 200 pipelined reads matched their callers`);
});

test('stream subscription: every event once, in order, ending with finish; unsubscribe is exact', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  const w = await d.client({ client: 'watcher' });
  t.after(() => { c.close(); w.close(); });
  const p = await StreamProducer.begin(c, 'run-sub', { model: 'm' });
  const early = await w.subscribeStream('run-sub');
  const words = Array.from({ length: 50 }, (_, i) => `w${i} `);
  await Promise.all(words.map((x) => p.text(x)));
  assert.ok(p.appends < words.length, `appends given while one is in flight are batched (${p.appends} appends for ${words.length})`);
  const late = await w.subscribeStream('run-sub', 10);
  await p.commit({ role: 'assistant' });
  const seen = [];
  for await (const ev of early) seen.push(ev);
  assert.deepEqual(seen.map((e) => e.seq), Array.from({ length: 51 }, (_, i) => i + 1));
  assert.equal(seen.slice(0, -1).map((e) => e.event.text).join(''), words.join(''));
  assert.deepEqual(seen.at(-1).event, { type: 'finish', status: 'committed' });
  const rest = [];
  for await (const ev of late) rest.push(ev.seq);
  assert.deepEqual(rest, Array.from({ length: 41 }, (_, i) => i + 11));
  console.log(`${words.length} text events in ${p.appends} appends; early and late subscribers each saw them once`);

  // Credential watch: events, then an exact unsubscribe by breaking out of the loop.
  const watch = await w.watch('default');
  await c.setValue('a', 'b');
  const first = await watch.next();
  assert.equal(first.value.type, 'cred.changed');
  assert.equal(first.value.id, 'a');
  assert.equal(await watch.close(), true);
  assert.equal((await watch.next()).done, true);
});

test('the client reconnects after a daemon restart; a stream subscription resumes after its last seq', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  const w = await d.client({ client: 'watcher' });
  t.after(() => { c.close(); w.close(); });
  const p = await StreamProducer.begin(c, 'run-restart', { model: 'm' });
  const sub = await w.subscribeStream('run-restart');
  for (let i = 0; i < 20; i++) await p.text(`a${i} `);
  const before = [];
  for (let i = 0; i < 20; i++) before.push((await sub.next()).value);
  const r = await d.restart();
  assert.equal(r.code, 0);
  // The watcher makes its subscription again by itself (not waiting for a call of its own).
  const deadline = Date.now() + 10_000;
  while (sub.id === null || w.reconnects === 0) {
    assert.ok(Date.now() < deadline, 'the watcher reconnected within 10 s');
    await new Promise((res) => setTimeout(res, 20));
  }
  // Appends go on with the same producer: the client connects again by itself.
  for (let i = 0; i < 20; i++) await p.text(`b${i} `);
  await p.commit({ role: 'assistant' });
  const after = [];
  for await (const ev of sub) after.push(ev);
  const all = before.concat(after);
  assert.deepEqual(all.map((e) => e.seq), Array.from({ length: 41 }, (_, i) => i + 1), 'no gap, no duplicate');
  assert.ok(c.reconnects >= 1 && w.reconnects >= 1);
  const state = await c.streamGet('run-restart', { reveal: true });
  assert.equal(state.final_message.content, all.slice(0, -1).map((e) => e.event.text).join(''));
  console.log(`restart mid-stream: ${all.length} events seen once each; producer reconnects ${c.reconnects}, watcher ${w.reconnects}`);
});

test('a subscriber that is away while the run commits gets its finish with the gap showing, and the stored message', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  const w = await d.client({ client: 'watcher', reconnectTimeoutMs: 10_000 });
  t.after(() => { c.close(); w.close(); });
  const p = await StreamProducer.begin(c, 'run-away');
  const sub = await w.subscribeStream('run-away');
  await p.text('seen ');
  assert.equal((await sub.next()).value.seq, 1);
  await d.stop();
  const relaunch = d.launch();
  // The producer reconnects first and finishes while the watcher is still away.
  await relaunch;
  await p.text('unseen');
  await p.commit({ role: 'assistant' });
  const rest = [];
  for await (const ev of sub) rest.push(ev);
  const last = rest.at(-1);
  assert.deepEqual(last.event, { type: 'finish', status: 'committed' });
  if (rest.length === 1) {
    assert.equal(last.seq, 3, 'finish at seq 3: seq 2 was not seen, and the seq says so');
    assert.equal((await w.streamGet('run-away', { reveal: true })).final_message.content, 'seen unseen');
    console.log('away during the commit: finish alone at seq 3 (gap after 1); the stored message read instead');
  } else {
    assert.deepEqual(rest.map((e) => e.seq), [2, 3]); // the watcher was back in time after all
    console.log('away during the commit: the watcher was back before it (events 2, 3)');
  }
});

test('a lost append answer is retried with the same seq and the daemon drops the duplicate', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const p = await StreamProducer.begin(c, 'run-dup');
  await p.text('one ');
  // The same batch again, as a producer whose answer was lost would send it.
  const again = await c.streamAppend('run-dup', p.streamId, 1, [{ type: 'text', text: 'one ' }]);
  assert.deepEqual(again, { acked_seq: 1, duplicate: true });
  await p.text('two');
  await p.commit({ role: 'assistant' });
  assert.equal((await c.streamGet('run-dup', { reveal: true })).final_message.content, 'one two');
  // A commit repeated after success is confirmed, not done twice, and a fenced producer fails.
  const old = await StreamProducer.begin(c, 'run-fence');
  const taker = await StreamProducer.begin(c, 'run-fence', { takeover: true });
  await assert.rejects(old.text('zombie'), Conflict);
  await taker.text('mine');
  await taker.abort('user closed the tab');
  assert.equal((await c.streamGet('run-fence')).status, 'aborted');
});

test('run logs and checkpoints', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  assert.equal((await c.runLogNode('run-7', { node_id: 'plan', success: true })).written, true);
  assert.equal((await c.runLogNode('run-7', { node_id: 'plan', success: true })).written, false);
  assert.equal((await c.runEnsureNode('run-7', 'plan')).written, false);
  await c.runLogStep('run-7', { node_id: 'plan', step_index: 0, llm_text: 'hi' });
  await c.runToolBegin('run-7', 'toolu_1', 'search', { q: 'x' });
  await c.runToolEnd('run-7', 'toolu_1', { result: '3 results', isError: false });
  const end = await c.runEnd('run-7', 'success', { agent_id: 'a', node_path: ['plan'] });
  assert.equal(end.summary.total_nodes_executed, 1);
  assert.deepEqual(end.summary.node_path, ['plan']);
  const got = await c.runGet('run-7');
  assert.equal(got.tool_calls, 1);
  assert.equal((await c.runList({ status: 'success' })).length, 1);
  await assert.rejects(c.runLogNode('run-7', { node_id: 'late' }), Conflict);
  assert.deepEqual((await c.runPrune(30, { dryRun: true })).pruned, []);

  await c.checkpointPut('run-9', { thread_id: 't', upstream_model: 'm', partial_text: 'half', completed_tool_calls: [], in_flight_tool: null });
  assert.equal((await c.checkpointGet('run-9')).partial_text, 'half');
  assert.equal(await c.checkpointDelete('run-9'), true);
});

test('the socket is found as the CLI finds it, and a socket owned by another uid is refused', async (t) => {
  const saved = { ...process.env };
  t.after(() => { process.env = saved; });
  const root = mkdtempSync(join(tmpdir(), 'hf-js-paths-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  for (const k of ['HOLDFAST_SOCKET', 'HOLDFAST_CONFIG', 'XDG_CONFIG_HOME', 'XDG_RUNTIME_DIR']) delete process.env[k];
  process.env.HOME = root;
  assert.equal(defaultSocketPath(), `/tmp/holdfast-${process.geteuid()}/holdfast.sock`);
  process.env.XDG_RUNTIME_DIR = join(root, 'run');
  assert.equal(defaultSocketPath(), join(root, 'run', 'holdfast', 'holdfast.sock'));
  mkdirSync(join(root, '.config', 'holdfast'), { recursive: true });
  writeFileSync(join(root, '.config', 'holdfast', 'config.toml'), 'socket = "~/s\\u0061.sock" # mine\n[stores.x]\nsocket = "no"\n');
  assert.equal(defaultSocketPath(), join(root, 'sa.sock'));
  process.env.HOLDFAST_SOCKET = '/x/y.sock';
  assert.equal(defaultSocketPath(), '/x/y.sock');

  await assert.rejects(Client.connect({ socketPath: join(root, 'none.sock') }), (e) => e instanceof ConnectionClosed && /none\.sock/.test(e.message));
  // A socket someone else bound at the path (a socket file owned by another uid).
  const path = join(root, 'other.sock');
  const server = net.createServer((s) => s.end());
  await new Promise((r) => server.listen(path, r));
  t.after(() => server.close());
  if (process.geteuid() === 0) {
    chownSync(path, 65534, 65534);
    chmodSync(path, 0o777);
    await assert.rejects(Client.connect({ socketPath: path }), (e) => e instanceof Forbidden && /uid 65534/.test(e.message));
  } else {
    t.diagnostic('SKIPPED: the foreign-owner case needs root to chown a socket file');
  }
});

test('scrubbing keeps parameter names and the caller\'s own run id (issue 36, one part)', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  await assert.rejects(c.streamBegin('x'.repeat(200)), (e) => {
    assert.ok(e.message.includes('run_id') && !e.message.includes('<redacted>'), e.message);
    return true;
  });
  await assert.rejects(c.call('cred.refresh_lease', { id: 's', ttl_ms: SECRET }), (e) => {
    assertNoSecret(e);
    return true;
  });
});

test('a stream subscription after the end of its run ends with the finish (ended run at once, live run when it ends)', async (t) => {
  const d = await withDaemon(t);
  const c = await d.client();
  t.after(() => c.close());
  const p = await StreamProducer.begin(c, 'run-end');
  await p.text('a');
  const end = await p.commit({ role: 'assistant' });
  const collect = async (sub) => {
    const out = [];
    for await (const ev of sub) out.push(ev);
    return out;
  };
  const bound = (promise, what) => Promise.race([promise, new Promise((_, rej) => setTimeout(() => rej(new Error(`${what}: no end within 20 s`)), 20_000).unref())]);
  for (const after of [end.finish_seq, end.finish_seq + 10]) {
    const evs = await bound(collect(await c.subscribeStream('run-end', after)), `ended run after ${after}`);
    assert.deepEqual(evs.map((e) => [e.seq, e.event.type, e.event.status]), [[end.finish_seq, 'finish', 'committed']], `after ${after}`);
  }
  // Live: after a seq past its end, the subscription ends with the run (the daemon's side).
  const q = await StreamProducer.begin(c, 'run-live-end');
  await q.text('b');
  const live = collect(await c.subscribeStream('run-live-end', 30));
  await q.text('c');
  const qend = await q.commit({ role: 'assistant' });
  const evs = await bound(live, 'live run after 30');
  assert.deepEqual(evs.map((e) => [e.seq, e.event.type]), [[qend.finish_seq, 'finish']]);
});

// The Vercel AI SDK adapter, checked with the `ai` package's own code on both ends: a real
// `streamText` (its mock model from `ai/test` stands in for a provider) pipes its UI message
// stream to the response and, through `consumeSseStream`, into holdfast via the
// resumable-stream-shaped context; the AI SDK's own `DefaultChatTransport` (what `useChat`
// uses) sends the message and reconnects, parsing with the SDK's parser; `readUIMessageStream`
// builds the message. The resumed message must equal the live one, and a finished chat must
// not be replayed.
import assert from 'node:assert/strict';
import http from 'node:http';
import { Readable } from 'node:stream';
import { test } from 'node:test';

import { createResumableStreamContext } from '../src/resumable-stream.js';
import { UIChunkEncoder, finalUIMessage } from '../src/ai.js';
import { StreamProducer } from '../src/index.js';
import { until, withDaemon } from './harness.js';

let ai = null;
let aiTest = null;
let skip = false;
try {
  ai = await import('ai');
  aiTest = await import('ai/test');
} catch (e) {
  skip = `the ai package is not installed (${e.code ?? e.message}): run plugins/run-tests.sh, which runs npm ci`;
  console.log(`SKIPPED: the AI SDK tests (${skip})`);
}

const WORDS = Array.from({ length: 120 }, (_, i) => `w${i}${i % 10 === 9 ? '.' : ''} `);

function mockModel(delayMs) {
  const chunks = [
    { type: 'stream-start', warnings: [] },
    { type: 'text-start', id: 't1' },
    ...WORDS.map((delta) => ({ type: 'text-delta', id: 't1', delta })),
    { type: 'text-end', id: 't1' },
    { type: 'tool-input-start', id: 'call-1', toolName: 'get_weather' },
    { type: 'tool-input-delta', id: 'call-1', delta: '{"city":' },
    { type: 'tool-input-delta', id: 'call-1', delta: '"Oslo"}' },
    { type: 'tool-input-end', id: 'call-1' },
    { type: 'tool-call', toolCallId: 'call-1', toolName: 'get_weather', input: '{"city":"Oslo"}' },
    {
      type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool_use' },
      usage: { inputTokens: { total: 3, noCache: 3, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 121, text: 121, reasoning: 0 } },
    },
  ];
  return new aiTest.MockLanguageModelV4({
    doStream: async () => ({ stream: aiTest.simulateReadableStream({ chunks, chunkDelayInMs: delayMs }) }),
  });
}

/** The app: POST /api/chat streams a reply (and keeps it in holdfast); GET
 * /api/chat/:id/stream resumes the chat's active stream, 204 when there is none. */
async function app(t, client, delayMs, { model = () => mockModel(delayMs), tools } = {}) {
  const ctx = createResumableStreamContext({ client, waitUntil: null });
  const activeRun = new Map(); // chat id -> run id (the app's "active stream id")
  const work = [];
  const server = http.createServer(async (req, res) => {
    try {
      const url = new URL(req.url, 'http://x');
      if (req.method === 'POST' && url.pathname === '/api/chat') {
        let body = '';
        for await (const c of req) body += c;
        const { id: chatId } = JSON.parse(body);
        const runId = `chat-${chatId}-${Date.now()}`;
        activeRun.set(chatId, runId);
        const result = ai.streamText({
          model: model(),
          prompt: 'weather?',
          tools: tools ?? { get_weather: ai.tool({ inputSchema: ai.jsonSchema({ type: 'object', properties: { city: { type: 'string' } } }) }) },
        });
        result.pipeUIMessageStreamToResponse(res, {
          generateMessageId: () => runId,
          consumeSseStream: ({ stream }) => {
            work.push(ctx.createNewResumableStream(runId, () => stream));
          },
        });
        return;
      }
      const m = /^\/api\/chat\/([^/]+)\/stream$/.exec(url.pathname);
      if (req.method === 'GET' && m) {
        const runId = activeRun.get(decodeURIComponent(m[1]));
        const stream = runId ? await ctx.resumeExistingStream(runId) : null;
        if (!stream) {
          res.writeHead(204);
          res.end();
          return;
        }
        res.writeHead(200, ai.UI_MESSAGE_STREAM_HEADERS);
        Readable.fromWeb(stream).pipe(res);
        return;
      }
      res.writeHead(404);
      res.end();
    } catch (e) {
      res.writeHead(500);
      res.end(e.message);
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => { server.closeAllConnections(); server.close(); });
  return { base: `http://127.0.0.1:${server.address().port}`, activeRun, work };
}

async function lastMessage(stream) {
  let last;
  for await (const m of ai.readUIMessageStream({ stream, terminateOnError: true })) last = m;
  return last;
}

const textOf = (m) => m.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
const toolsOf = (m) => m.parts.filter((p) => p.type.startsWith('tool-') || p.type === 'dynamic-tool')
  .map((p) => ({ id: p.toolCallId, input: p.input, state: p.state }));

test('useChat resume through holdfast: replayed from the first chunk by the AI SDK transport, equal to the live message; a finished chat is not replayed', { skip }, async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const { base, activeRun, work } = await app(t, client, 8);
  const transport = new ai.DefaultChatTransport({ api: `${base}/api/chat` });
  const chatId = 'c1';
  const user = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'weather?' }] };

  const live = await transport.sendMessages({ trigger: 'submit-message', chatId, messageId: undefined, messages: [user], abortSignal: undefined });
  const liveDone = lastMessage(live);
  // Mid-stream, a second tab (or the same one after a refresh) reconnects.
  const runId = activeRun.get(chatId);
  const midState = await until(async () => {
    const st = await client.streamGet(runId);
    return st.next_seq > 5 ? st : null;
  }, 30_000, 'the run has a few events');
  assert.ok(midState.next_seq > 5 && midState.status === 'streaming', `mid-stream (${midState.next_seq - 1} events so far)`);
  const resumed = await transport.reconnectToStream({ chatId });
  assert.ok(resumed, 'an active chat resumes');
  const [liveMsg, resumedMsg] = await Promise.all([liveDone, lastMessage(resumed)]);
  const returned = await Promise.all(work);

  assert.equal(textOf(liveMsg), WORDS.join(''));
  assert.equal(textOf(resumedMsg), textOf(liveMsg), 'the resumed message has the live text, once');
  assert.deepEqual(toolsOf(resumedMsg), toolsOf(liveMsg).map((x) => ({ ...x })), 'and the same tool call');
  assert.deepEqual(toolsOf(resumedMsg), [{ id: 'call-1', input: { city: 'Oslo' }, state: 'input-available' }]);
  assert.equal(resumedMsg.id, runId);
  console.log(`resumed after ${midState.next_seq - 1} events: ${textOf(resumedMsg).length} chars + ${toolsOf(resumedMsg).length} tool call, equal to the live message`);
  for (const s of returned) await s?.cancel(); // the stream createNewResumableStream returns, unread

  // Committed: the stored message, the end of resumability, in one step.
  const state = await client.streamGet(runId, { reveal: true });
  assert.equal(state.status, 'committed');
  assert.equal(state.final_message.content, WORDS.join(''));
  assert.deepEqual(state.final_message.tool_calls, [{ id: 'call-1', name: 'get_weather', arguments: { city: 'Oslo' } }]);
  const fin = await finalUIMessage(client, runId);
  assert.equal(textOf(fin), WORDS.join(''));
  assert.deepEqual(toolsOf(fin), [{ id: 'call-1', input: { city: 'Oslo' }, state: 'input-available' }]);
  // A refresh now: nothing to resume (204 → null), the page shows its history.
  assert.equal(await transport.reconnectToStream({ chatId }), null);
  assert.equal(await transport.reconnectToStream({ chatId: 'never' }), null);
});

test('the encoder: every holdfast event type becomes chunks the AI SDK accepts, and a reset drops the step', { skip }, async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  // A run with a cut-off call and no text (R4: stream_reset), then a fresh answer.
  const q = await StreamProducer.begin(client, 'run-enc');
  const sub = await client.subscribeStream('run-enc');
  await q.append({ type: 'tool_call_delta', id: 'x1', name: 'write_file', arguments_delta: '{"pa' });
  await q.interrupt('connection_reset');
  await q.append([{ type: 'text', text: 'Fresh ' }, { type: 'text', text: 'start.' }]);
  await q.commit({ role: 'assistant' });
  const enc = new UIChunkEncoder('m1');
  const chunks = [];
  const types = [];
  for await (const ev of sub) {
    types.push(ev.event.type);
    chunks.push(...enc.encode(ev.event));
  }
  assert.deepEqual(types, ['tool_call_delta', 'stream_reset', 'tool_call_cancel', 'interrupted', 'text', 'text', 'finish']);
  // Through the SDK's own schema and reducer.
  const sse = chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('');
  const parsed = ai.parseJsonEventStream({ stream: new Response(sse).body, schema: ai.uiMessageChunkSchema });
  const valid = [];
  for await (const r of parsed) {
    assert.ok(r.success, `a chunk the SDK refuses: ${JSON.stringify(r.rawValue)} ${r.error}`);
    valid.push(r.value);
  }
  assert.equal(valid.length, chunks.length);
  const msg = await lastMessage(new ReadableStream({ start(c) { valid.forEach((v) => c.enqueue(v)); c.close(); } }));
  assert.equal(textOf(msg), 'Fresh start.', 'the reset step is gone; the new text is there once');
  console.log(`encoder: ${types.length} holdfast events → ${chunks.length} chunks (${[...new Set(chunks.map((c) => c.type))].join(', ')}), all valid for the SDK; message "${textOf(msg)}"`);
});

test('persistUIMessageStream: split SSE text is reassembled; an error chunk aborts the run (never committed half)', { skip }, async (t) => {
  const { persistUIMessageStream } = await import('../src/ai.js');
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const sse = ['start', 'text-start', 'text-delta', 'text-delta', 'error'].map((type, i) => `data: ${JSON.stringify(
    type === 'text-delta' ? { type, id: 't', delta: `part${i} ` } : type === 'error' ? { type, errorText: 'provider exploded' } : { type, id: 't' })}\n\n`).join('');
  // Cut at awkward places, as a network would.
  const pieces = [sse.slice(0, 7), sse.slice(7, 50), sse.slice(50, 51), sse.slice(51)];
  const r = await persistUIMessageStream(client, 'run-err', pieces);
  assert.equal(r.status, 'aborted');
  assert.equal(r.events, 2);
  const state = await client.streamGet('run-err');
  assert.equal(state.status, 'aborted');
  const ok = await persistUIMessageStream(client, 'run-ok', [sse.replace(/data: \{"type":"error".*\n\n/, 'data: {"type":"reasoning-delta","id":"r","delta":"hm"}\n\ndata: {"type":"finish"}\n\n')]);
  assert.equal(ok.status, 'committed');
  assert.deepEqual(ok.skipped, { 'reasoning-delta': 1 });
  assert.equal((await client.streamGet('run-ok', { reveal: true })).final_message.content, 'part2 part3 ');
});

test('finalUIMessage equals the message readUIMessageStream built from the live stream (part order, text parts, tool-<name>, dynamic-tool, outputs)', { skip }, async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const chunks = [
    { type: 'stream-start', warnings: [] },
    { type: 'text-start', id: 't1' },
    { type: 'text-delta', id: 't1', delta: 'Let me look ' },
    { type: 'text-delta', id: 't1', delta: 'that up. ' },
    { type: 'text-end', id: 't1' },
    { type: 'tool-input-start', id: 'call-1', toolName: 'get_weather' },
    { type: 'tool-input-delta', id: 'call-1', delta: '{"city":' },
    { type: 'tool-input-delta', id: 'call-1', delta: '"Oslo"}' },
    { type: 'tool-input-end', id: 'call-1' },
    { type: 'tool-call', toolCallId: 'call-1', toolName: 'get_weather', input: '{"city":"Oslo"}' },
    { type: 'text-start', id: 't2' },
    { type: 'text-delta', id: 't2', delta: 'And the ' },
    { type: 'text-delta', id: 't2', delta: 'news.' },
    { type: 'text-end', id: 't2' },
    { type: 'tool-call', toolCallId: 'call-2', toolName: 'lookup', input: '{"q":"news"}' },
    { type: 'tool-call', toolCallId: 'call-3', toolName: 'forecast', input: '{"days":3}' },
    {
      type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool_use' },
      usage: { inputTokens: { total: 3, noCache: 3, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 9, text: 9, reasoning: 0 } },
    },
  ];
  const model = () => new aiTest.MockLanguageModelV4({
    doStream: async () => ({ stream: aiTest.simulateReadableStream({ chunks, chunkDelayInMs: 2 }) }),
  });
  const schema = ai.jsonSchema({ type: 'object' });
  const tools = {
    get_weather: ai.tool({ inputSchema: schema }), // no execute: the page runs it
    forecast: ai.tool({ inputSchema: schema, execute: async ({ days }) => ({ days, sky: 'clear' }) }),
    lookup: ai.dynamicTool({ inputSchema: schema, execute: async () => 'three headlines' }),
  };
  const { base, activeRun, work } = await app(t, client, 2, { model, tools });
  const transport = new ai.DefaultChatTransport({ api: `${base}/api/chat` });
  const user = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'weather?' }] };
  const live = await lastMessage(await transport.sendMessages({ trigger: 'submit-message', chatId: 'c-final', messageId: undefined, messages: [user], abortSignal: undefined }));
  for (const s of await Promise.all(work)) await s?.cancel();
  const runId = activeRun.get('c-final');
  await until(async () => (await client.streamGet(runId)).status === 'committed', 30_000, 'the run committed');
  // What the live page holds, as JSON stores it (the SDK leaves some fields undefined).
  const liveJson = JSON.parse(JSON.stringify(live));
  assert.deepEqual(liveJson.parts.map((p) => p.type), ['step-start', 'text', 'tool-get_weather', 'text', 'dynamic-tool', 'tool-forecast'], 'the live message has the shape this test is about');
  const fin = await finalUIMessage(client, runId);
  assert.deepEqual(JSON.parse(JSON.stringify(fin)), liveJson, 'the history message equals the live one');
  assert.equal((await client.streamGet(runId, { reveal: true })).final_message.content, 'Let me look that up. And the news.');
  console.log(`finalUIMessage = the live UIMessage: ${liveJson.parts.map((p) => `${p.type}${p.state ? `(${p.state})` : ''}`).join(', ')}`);
});

test('a stream that cannot be kept never crashes the server: consumeSseStream\'s rejection is handled, and beginNewResumableStream lets the POST fail with an error the page shows', { skip }, async (t) => {
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const unhandled = [];
  const onUnhandled = (e) => unhandled.push(e);
  process.on('unhandledRejection', onUnhandled);
  t.after(() => process.off('unhandledRejection', onUnhandled));
  const reported = [];
  const ctx = createResumableStreamContext({ client, waitUntil: null, onError: (e, id) => reported.push([id, e]) });
  const begun = [];

  // The README's line, as the AI SDK calls it (not awaited, not caught), with a run id the
  // daemon refuses (a chat id "a/b").
  const server = http.createServer(async (req, res) => {
    let body = '';
    for await (const c of req) body += c;
    const { id: chatId, begin } = JSON.parse(body);
    const runId = `chat-${chatId}-${Date.now()}`;
    begun.push(runId);
    const result = () => ai.streamText({ model: mockModel(0), prompt: 'hi' });
    if (!begin) {
      result().pipeUIMessageStreamToResponse(res, {
        generateMessageId: () => runId,
        consumeSseStream: ({ stream }) => ctx.createNewResumableStream(runId, () => stream),
      });
      return;
    }
    let consume;
    try {
      consume = await ctx.beginNewResumableStream(runId);
    } catch (e) {
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.end(`this chat cannot be kept: ${e.message}`);
      return;
    }
    result().pipeUIMessageStreamToResponse(res, { generateMessageId: () => runId, consumeSseStream: consume });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => { server.closeAllConnections(); server.close(); });
  const url = `http://127.0.0.1:${server.address().port}/api/chat`;
  const post = async (body) => {
    const r = await fetch(url, { method: 'POST', body: JSON.stringify(body) });
    return { status: r.status, text: await r.text() };
  };

  const bad = await post({ id: 'a/b' });
  assert.equal(bad.status, 200, 'the SDK had already answered');
  await until(() => reported.length === 1, 10_000, 'the failure reaches onError');
  assert.match(reported[0][0], /^chat-a\/b-/);
  assert.equal(reported[0][1].name, 'InvalidParams');
  await new Promise((r) => setTimeout(r, 200)); // past the turn where Node reports unhandled rejections
  assert.deepEqual(unhandled, [], 'no unhandled rejection (Node would end the server)');

  // Begun first: the refusal is the POST's answer (useChat's transport throws on it: the page
  // shows the error), and a good chat is kept.
  const refused = await post({ id: 'a/b', begin: true });
  assert.equal(refused.status, 503);
  assert.match(refused.text, /cannot be kept/);
  const ok = await post({ id: 'c1', begin: true });
  assert.equal(ok.status, 200);
  const good = begun.at(-1);
  assert.match(good, /^chat-c1-/);
  await until(async () => (await client.streamGet(good)).status === 'committed', 20_000, 'the good chat committed');
  assert.equal(reported.length, 1, 'the refusal the caller got itself is not reported again');
  assert.deepEqual(unhandled, []);
});

test('finalUIMessage equals readUIMessageStream for approvals, denied outputs, a reset step, an input still streaming, custom parts', { skip }, async (t) => {
  const { persistUIMessageStream } = await import('../src/ai.js');
  const d = await withDaemon(t);
  const client = await d.client();
  t.after(() => client.close());
  const S = [{ type: 'start', messageId: 'm1' }, { type: 'start-step' }];
  const T = (id, ...deltas) => [{ type: 'text-start', id }, ...deltas.map((delta) => ({ type: 'text-delta', id, delta })), { type: 'text-end', id }];
  const END = [{ type: 'finish-step' }, { type: 'finish', finishReason: 'stop' }];
  const cases = {
    approval: [...S, { type: 'tool-input-start', toolCallId: 'c1', toolName: 'rm' }, { type: 'tool-input-delta', toolCallId: 'c1', inputTextDelta: '{"path":"/"}' }, { type: 'tool-input-available', toolCallId: 'c1', toolName: 'rm', input: { path: '/' } }, { type: 'tool-approval-request', approvalId: 'ap1', toolCallId: 'c1' }, ...END],
    denied: [...S, { type: 'tool-input-available', toolCallId: 'c1', toolName: 'rm', input: {} }, { type: 'tool-approval-request', approvalId: 'ap1', toolCallId: 'c1' }, { type: 'tool-output-denied', toolCallId: 'c1' }, ...END],
    reset: [...S, ...T('a', 'first try that gets dropped'), { type: 'reset-step' }, { type: 'start-step' }, ...T('b', 'second try'), ...END],
    streaming: [...S, { type: 'tool-input-start', toolCallId: 'c1', toolName: 'w' }, { type: 'tool-input-delta', toolCallId: 'c1', inputTextDelta: '{"q":"ab' }, ...END],
    custom: [...S, { type: 'custom', kind: 'openai.compaction' }, ...T('a', 'x'), ...END],
    // An emoji cut between two deltas (slicing by UTF-16 code units): the live page joins the
    // halves; sent one per event, each half was kept as U+FFFD (found by the independent attack).
    splitPair: [...S, ...T('a', 'smile \ud83d', '\ude00 done', '\ud83d', '\ude00'), ...END],
  };
  for (const [name, chunks] of Object.entries(cases)) {
    let live;
    const stream = new ReadableStream({ start(c) { for (const x of chunks) c.enqueue(x); c.close(); } });
    for await (const m of ai.readUIMessageStream({ stream, terminateOnError: true })) live = m;
    const r = await persistUIMessageStream(client, `ui-${name}`, chunks);
    assert.equal(r.status, 'committed', name);
    const fin = await finalUIMessage(client, `ui-${name}`);
    assert.deepStrictEqual(JSON.parse(JSON.stringify(fin)), JSON.parse(JSON.stringify(live)), name);
  }
  const split = (await client.streamGet('ui-splitPair', { reveal: true })).final_message;
  assert.equal(split.content, 'smile 😀 done😀');
  const reset = (await client.streamGet('ui-reset', { reveal: true })).final_message;
  assert.equal(reset.content, 'second try', 'the dropped step\'s text is not in the stored content');
});

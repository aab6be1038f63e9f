#!/usr/bin/env node
// A small chat web app whose answers survive refreshes, crashes and daemon restarts.
//
//   node plugins/node/examples/chat/server.js [--port 3000] [--host 127.0.0.1] [--data DIR]
//
// The page posts a message; the server starts a producer process (producer.js) that streams a
// fake provider's answer into holdfast and commits it. The page follows the run over SSE
// (sseHandler). History is read from holdfast, not kept beside it: a run is either committed
// (its stored final message is shown) or streaming (the page follows it), never both — so no
// refresh shows an answer twice. If a producer dies mid-stream, the server starts a new one
// that resumes the run from holdfast (plan R1: continue after the text already streamed).
//
// The server keeps only each thread's turns (user text and run id) in a JSON file under
// --data (default: $XDG_STATE_HOME/holdfast-chat-example or ~/.local/state/...).
//
// Shutdown (SIGTERM, SIGINT) hands the answers in progress over: each producer stops with what
// it streamed durable and its run left resumable, and a server on the same --data resumes them
// (as it does any run of its threads that no producer holds) — at its start, and every
// --orphan-poll-ms (2 s) after, so a rolling restart (the new server up before the old one is
// stopped) loses nothing. A message posted during the shutdown is answered 503 with
// Retry-After (the page shows it failed). A message whose producer never began its run is
// reported as failed after --start-timeout-ms (30 s).
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { Client, ENDED, NotFound, sseHandler } from '../../src/index.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    port: { type: 'string', default: process.env.PORT ?? '3000' },
    host: { type: 'string', default: '127.0.0.1' },
    data: { type: 'string' },
    'start-timeout-ms': { type: 'string', default: '30000' },
    'orphan-poll-ms': { type: 'string', default: '2000' },
    help: { type: 'boolean', short: 'h' },
  },
});
if (opts.help) {
  process.stdout.write(readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\n').slice(1, 24)
    .map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
  process.exit(0);
}
const dataDir = opts.data ?? join(process.env.XDG_STATE_HOME ?? join(homedir(), '.local', 'state'), 'holdfast-chat-example');
mkdirSync(dataDir, { recursive: true, mode: 0o700 });
const log = (msg) => process.stderr.write(`chat: ${msg}\n`);
/** How long a message's run may take to begin before the page is told it failed. */
const startTimeoutMs = Number(opts['start-timeout-ms']);

// -- threads: the turns of each conversation ------------------------------------------------
const threadsFile = join(dataDir, 'threads.json');
let threads = {};
try {
  threads = JSON.parse(readFileSync(threadsFile, 'utf8'));
} catch (e) {
  if (e.code !== 'ENOENT') throw e;
}
/** Turns another server on the same --data recorded since we read the file (a rolling
 * restart runs two at once for a moment): merged in by run id, none of ours lost. */
function mergeThreads() {
  let disk;
  try {
    disk = JSON.parse(readFileSync(threadsFile, 'utf8'));
  } catch {
    return;
  }
  for (const [thread, turns] of Object.entries(disk)) {
    const mine = (threads[thread] ??= []);
    const known = new Set(mine.map((t) => t.run_id));
    const added = turns.filter((t) => !known.has(t.run_id));
    if (!added.length) continue;
    mine.push(...added);
    mine.sort((a, b) => (a.created_at_ms ?? 0) - (b.created_at_ms ?? 0));
  }
}
function saveThreads() {
  mergeThreads();
  const tmp = `${threadsFile}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(threads), { mode: 0o600 });
  renameSync(tmp, threadsFile);
}
const ID = /^[A-Za-z0-9_-]{1,64}$/;

// -- producers ------------------------------------------------------------------------------
const HANDED_OVER = 75; // producer.js: stopped on SIGTERM, its run left resumable
const producers = new Map(); // run_id -> {pid, restarts, job, state}
let stopping = false;

function startProducer(job) {
  return new Promise((resolve, reject) => {
    // Its log goes to our stderr (inherited: it outlives this server if this server is killed).
    const child = spawn(process.execPath, [join(HERE, 'producer.js')], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    let why = ''; // what it said on stdout if it failed before beginning the run
    const entry = producers.get(job.run_id) ?? { restarts: 0, job, state: 'running' };
    entry.pid = child.pid;
    entry.state = 'running';
    entry.exited = new Promise((r) => child.once('close', r));
    producers.set(job.run_id, entry);
    let out = '';
    let begun = false;
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (t) => {
      out += t;
      if (!begun && !why && out.includes('\n')) {
        let first = {};
        try {
          first = JSON.parse(out.slice(0, out.indexOf('\n')));
        } catch {
          // not its protocol: taken as begun below only if it says so
        }
        if (first.begun || first.ended) {
          begun = true; // (a resume that found the run ended resolves too: nothing to do)
          resolve(child.pid);
        } else why = String(first.error ?? 'it said nothing');
      }
    });
    child.on('close', (code, signal) => {
      if (!begun) reject(new Error(`the producer exited (${signal ?? code}) before it began the run${why ? `: ${why}` : ''}`));
      if (entry.pid === child.pid) entry.pid = null;
      if (code === 0) {
        entry.state = 'done';
        return;
      }
      if (stopping) {
        entry.state = code === HANDED_OVER ? 'handed over' : 'stopped';
        return;
      }
      afterDeath(job, entry, `${signal ?? `exit ${code}`}`).catch((e) => {
        entry.state = 'failed';
        log(`${job.run_id}: ${e.message}`);
      });
    });
    child.stdin.end(`${JSON.stringify(job)}\n`);
  });
}

/** A producer died (killed, crashed): a new process resumes its run — unless the run has ended
 * (committed just before the death, or by someone else), which nothing must resume. */
async function afterDeath(job, entry, how) {
  entry.state = 'checking';
  let state = null;
  try {
    state = await client.streamGet(job.run_id);
  } catch (e) {
    if (!(e instanceof NotFound)) throw e;
  }
  if (state === null || ENDED.has(state.status)) {
    entry.state = 'done';
    log(`producer of ${job.run_id} died (${how}) with its run ${state ? state.status : 'gone'}: nothing to resume`);
    return;
  }
  if (stopping) return;
  entry.restarts += 1;
  if (entry.restarts > 5) {
    entry.state = 'failed';
    log(`giving up on ${job.run_id} after 5 restarts`);
    return;
  }
  log(`producer of ${job.run_id} died (${how}): starting a new one to resume it`);
  await startProducer({ ...job, resume: true });
}

/** Runs of our threads that are live but held by no producer (the previous server handed them
 * over on shutdown, or their producer died while no server watched): resume them. */
async function resumeOrphans() {
  for (const turns of Object.values(threads)) {
    for (const turn of turns) {
      if (!turn.job || producers.get(turn.run_id)?.pid) continue;
      let state;
      try {
        state = await client.streamGet(turn.run_id);
      } catch (e) {
        if (e instanceof NotFound) continue;
        throw e;
      }
      if (ENDED.has(state.status) || state.no_producer_since_ms === null || state.no_producer_since_ms === undefined) continue;
      log(`resuming ${turn.run_id} (no producer since ${new Date(state.no_producer_since_ms).toISOString()})`);
      startProducer({ ...turn.job, resume: true }).catch((e) => log(`resuming ${turn.run_id}: ${e.message}`));
    }
  }
}

// -- HTTP -----------------------------------------------------------------------------------
const client = await Client.connect({ client: 'chat-example-server' });
const events = sseHandler(client, (req) => req.params.run);

/** A message posted while this server stops: not taken (the page shows it failed; sent again,
 * it goes to the next server). */
function restarting(res) {
  res.writeHead(503, { 'content-type': 'application/json', 'cache-control': 'no-store', 'retry-after': '1' });
  res.end(JSON.stringify({ error: 'the server is restarting: send the message again in a moment' }));
}

function json(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

async function readBody(req) {
  let text = '';
  for await (const chunk of req) {
    text += chunk;
    if (text.length > 64 * 1024) throw new Error('body too large');
  }
  return JSON.parse(text || '{}');
}

/** The thread as the page shows it: each turn's user text and its run's state in holdfast. */
async function threadView(threadId) {
  const turns = threads[threadId] ?? [];
  const messages = [];
  for (const turn of turns) {
    messages.push({ role: 'user', text: turn.text });
    let state;
    try {
      state = await client.streamGet(turn.run_id, { reveal: true });
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
      state = { status: 'missing' };
    }
    const m = { role: 'assistant', run_id: turn.run_id, status: state.status };
    if (state.status === 'missing' && neverBegan(turn)) {
      m.status = 'failed';
      m.error = turn.error ?? 'the answer never started';
    }
    if (state.status === 'committed') m.text = state.final_message?.content ?? '';
    messages.push(m);
  }
  return { thread: threadId, messages };
}

/** A turn whose run does not exist and never will: its producer failed before beginning it,
 * or did not begin it within --start-timeout-ms. */
function neverBegan(turn) {
  return Boolean(turn.error) || !(Date.now() - (turn.created_at_ms ?? 0) < startTimeoutMs);
}

function turnOf(runId) {
  for (const turns of Object.values(threads)) for (const t of turns) if (t.run_id === runId) return t;
  return null;
}

function clampInt(v, lo, hi, dflt) {
  const n = Number(v);
  return Number.isInteger(n) && n >= lo && n <= hi ? n : dflt;
}

const routes = [
  ['GET', /^\/$/, (req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(readFileSync(join(HERE, 'public', 'index.html')));
  }],
  ['GET', /^\/app\.js$/, (req, res) => {
    res.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' });
    res.end(readFileSync(join(HERE, 'public', 'app.js')));
  }],
  ['GET', /^\/api\/threads\/(?<thread>[^/]+)$/, async (req, res) => {
    if (!ID.test(req.params.thread)) return json(res, 400, { error: 'bad thread id' });
    return json(res, 200, await threadView(req.params.thread));
  }],
  ['POST', /^\/api\/threads\/(?<thread>[^/]+)\/messages$/, async (req, res) => {
    const thread = req.params.thread;
    if (!ID.test(thread)) return json(res, 400, { error: 'bad thread id' });
    if (stopping) return restarting(res);
    const body = await readBody(req);
    if (typeof body.text !== 'string' || !body.text.trim() || body.text.length > 2000) {
      return json(res, 400, { error: 'text: 1 to 2000 characters' });
    }
    const runId = `chat-${thread}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    const job = {
      run_id: runId, thread_id: thread, prompt: body.text,
      deltas: clampInt(body.deltas, 1, 5000, 300), delayMs: clampInt(body.delayMs, 0, 1000, 15),
      failAt: body.failAt === undefined || body.failAt === null ? null : clampInt(body.failAt, 0, 5000, null),
    };
    // Recorded before the run exists: a page loading meanwhile sees it as "missing" and
    // asks again; recorded after, a crash here would orphan a streaming run.
    const turn = { text: body.text, run_id: runId, created_at_ms: Date.now(), job };
    (threads[thread] ??= []).push(turn);
    saveThreads();
    let pid;
    try {
      pid = await startProducer(job);
    } catch (e) {
      turn.error = `the answer could not start: ${e.message}`;
      saveThreads();
      if (stopping) return restarting(res);
      throw e;
    }
    return json(res, 200, { run_id: runId, producer_pid: pid });
  }],
  ['GET', /^\/api\/runs\/(?<run>[^/]+)\/events$/, (req, res) => events(req, res)],
  ['GET', /^\/api\/runs\/(?<run>[^/]+)$/, async (req, res) => {
    const p = producers.get(req.params.run);
    let state;
    try {
      state = await client.streamGet(req.params.run);
    } catch (e) {
      if (!(e instanceof NotFound)) return json(res, 400, { error: e.message });
      // `gave_up`: the page stops waiting for a run that will never begin.
      const turn = turnOf(req.params.run);
      const gaveUp = !turn || neverBegan(turn);
      const error = turn?.error ?? (turn && gaveUp ? `the answer never started (no producer began it within ${startTimeoutMs} ms)` : e.message);
      return json(res, 404, { error, gave_up: gaveUp });
    }
    return json(res, 200, {
      ...state, producer_pid: p?.pid ?? null, producer_restarts: p?.restarts ?? 0, producer_state: p?.state ?? null,
    });
  }],
];

const handling = new Set(); // requests being answered (a shutdown lets them finish)
const server = http.createServer(async (req, res) => {
  const done = new Promise((r) => res.once('close', r));
  handling.add(done);
  done.then(() => handling.delete(done));
  // Nothing a request says may end the server: a URL or a path parameter that does not decode
  // (`%E0%A4%A`) is the client's 400, never an exception out of this handler.
  let path;
  try {
    path = new URL(req.url, 'http://x').pathname;
  } catch {
    return json(res, 400, { error: 'malformed URL' });
  }
  for (const [method, re, handle] of routes) {
    const m = re.exec(path);
    if (!m || req.method !== method) continue;
    try {
      req.params = Object.fromEntries(Object.entries(m.groups ?? {}).map(([k, v]) => [k, decodeURIComponent(v)]));
    } catch {
      return json(res, 400, { error: 'malformed URL: a path parameter is not valid percent-encoded UTF-8' });
    }
    try {
      await handle(req, res);
    } catch (e) {
      log(`${req.method} ${path}: ${e.message}`);
      if (!res.headersSent) json(res, 500, { error: e.message });
      else res.end();
    }
    return;
  }
  json(res, 404, { error: 'no such page' });
});

server.listen(Number(opts.port), opts.host, () => {
  const { port } = server.address();
  // The first line on stdout: how the tests (and you) find it.
  process.stdout.write(`listening on http://${opts.host}:${port}/\n`);
});
// Answers left by a previous server (handed over at its shutdown, or orphaned by a crash): at
// the start, then every --orphan-poll-ms (a server stopped after this one started hands its
// answers over later), with turns it recorded merged in from the shared file.
let polling = null;
const poll = () => {
  if (stopping || polling) return;
  polling = Promise.resolve().then(() => { mergeThreads(); return resumeOrphans(); })
    .catch((e) => log(`resuming the runs left over: ${e.message}`))
    .finally(() => { polling = null; });
};
poll();
const orphanPollMs = Number(opts['orphan-poll-ms']);
const poller = orphanPollMs > 0 ? setInterval(poll, orphanPollMs) : null;

async function shutdown(sig) {
  if (stopping) return;
  stopping = true;
  if (poller) clearInterval(poller);
  // Hand the answers in progress over: each producer (our own children, by the pids we
  // started) stops with what it streamed durable and leaves its run resumable; the next
  // server resumes it. Bounded: a producer that does not stop in 10 s is killed (and its run
  // is then resumed the same way, from what was durable).
  const running = [...producers.values()].filter((p) => p.pid);
  log(`${sig}: stopping; handing ${running.length} answer(s) in progress over`);
  for (const p of running) process.kill(p.pid, 'SIGTERM');
  const killer = setTimeout(() => {
    for (const p of running) if (p.pid) process.kill(p.pid, 'SIGKILL');
  }, 10_000);
  await Promise.all(running.map((p) => p.exited));
  clearTimeout(killer);
  log(`${sig}: ${running.length} answer(s) in progress handed over to the next server`);
  // The answers being written (a message posted meanwhile gets its 503) go out before the
  // connections close; SSE streams stay open until closed below (their pages reconnect).
  const answering = [...handling];
  await Promise.race([Promise.all(answering.filter((p) => p !== undefined)), new Promise((r) => setTimeout(r, 1000))]);
  server.close();
  server.closeAllConnections();
  client.close();
  process.exit(0);
}
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => { shutdown(sig); });

// A promise-based client of the holdfast daemon: one Unix-socket connection, pipelined
// requests, typed errors, subscriptions as async iterators, and reconnection.
import { lstatSync } from 'node:fs';
import net from 'node:net';
import { inspect } from 'node:util';

import {
  CallTimeout, ConnectionClosed, Forbidden, FrameTooLarge, InvalidParams, StorageError,
  errorFromResponse, scrub,
} from './errors.js';
import { defaultSocketPath } from './paths.js';

export const PROTOCOL_VERSION = 1;
/** The largest line the client accepts from the daemon (a cred.list of a huge store is a few
 * MiB): a longer one closes the connection instead of growing memory without end. */
export const MAX_LINE_BYTES = 64 * 1024 * 1024;
/** The daemon's default cap on one request line (`[limits] max_frame_bytes`, docs/protocol.md):
 * a longer line makes it close the connection, so the client refuses such a request unsent. */
export const MAX_FRAME_BYTES = 1024 * 1024;
const EARLY_EVENTS_CAP = 4096;

/** The serialized line with every lone UTF-16 surrogate made U+FFFD. `JSON.stringify` writes a
 * lone surrogate (an emoji cut in half by `slice`) as a `\udXXX` escape — and only a lone one:
 * a pair is written as the character — which the daemon refuses as a parse error of the whole
 * line. An escaped backslash (`\\`) is consumed as a pair so `\\ud800` (text) is left alone. */
function wellFormedLine(line) {
  if (!line.includes('\\ud')) return line;
  return line.replace(/\\(?:\\|(u[dD][89a-fA-F][0-9a-fA-F]{2}))/g, (m, lone) => (lone ? '\\ufffd' : m));
}

/** `text` with its lone surrogates replaced by U+FFFD (what the client sends for any string). */
export function toWellFormed(text) {
  if (typeof text.toWellFormed === 'function') return text.toWellFormed();
  return text.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, '\uFFFD');
}

/** How deep a JSON line nests (the daemon refuses more than 128 levels as a parse error). */
function nestingDepth(line) {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < line.length; i++) {
    const ch = line.charCodeAt(i);
    if (inString) {
      if (ch === 92) i += 1; // backslash: skip the escaped character
      else if (ch === 34) inString = false;
    } else if (ch === 34) inString = true;
    else if (ch === 123 || ch === 91) max = Math.max(max, ++depth);
    else if (ch === 125 || ch === 93) depth -= 1;
  }
  return max;
}
const MAX_NESTING = 128;
/** How long the answer to a timed-out subscribe or stream.begin is waited for, to undo it. */
const LATE_ANSWER_MS = 10 * 60_000;

const OWN_RESYNC = Symbol('holdfast.ownResync');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Run `op`, again (backing off 50 ms → 1 s) while it fails with `ConnectionClosed` — the
 * daemon restarting — and `keepTrying()` holds, for at most `timeoutMs`. The one retry loop of
 * the package: reconnection and the producer's idempotent writes both use it. */
export async function whileReconnecting(op, timeoutMs, keepTrying = () => true) {
  const deadline = Date.now() + timeoutMs;
  let wait = 50;
  for (;;) {
    try {
      return await op();
    } catch (e) {
      if (!(e instanceof ConnectionClosed) || !keepTrying() || Date.now() + wait > deadline) throw e;
    }
    await sleep(wait);
    wait = Math.min(wait * 2, 1000);
  }
}

/** The peer must run as our uid. Node cannot read SO_PEERCRED, so the client checks what decides
 * it: the socket file was created by the process that bound it, so its owner is the daemon's
 * uid, and it must be ours (a socket someone else put at the path is refused before a byte of
 * a request is sent). */
function checkSocketOwner(path) {
  let st;
  try {
    st = lstatSync(path);
  } catch (e) {
    throw new ConnectionClosed(`cannot connect to the holdfast daemon at ${path}: ${e.code ?? e.message} (is it running? \`holdfast daemon\`)`);
  }
  if (!st.isSocket()) {
    throw new ConnectionClosed(`${path} is not a socket (is the daemon's socket path right?)`);
  }
  const me = process.geteuid();
  if (st.uid !== me) {
    throw new Forbidden(`the socket ${path} belongs to uid ${st.uid}, not ${me}: refusing to talk to it`);
  }
}

/** A credential as the daemon returned it. Its secret values never serialize: `JSON.stringify`
 * (what structured loggers call), `util.inspect` / `console.log`, `String()`, object spread and
 * `structuredClone` show the id, generation, type and key names only. The values are given on
 * explicit access: `value(name)`, or the whole document as `credential` (which is the daemon's
 * plain JSON: do not log that). */
export class CredentialRecord {
  #credential;

  constructor(credential, generation) {
    this.#credential = credential;
    this.generation = generation;
  }

  /** The credential document with its values (explicit access; a plain object). */
  get credential() {
    return this.#credential;
  }

  get id() {
    return this.#credential?.id;
  }

  /** The names of its keys (never their values). */
  get keyNames() {
    return Object.keys(this.#credential?.keys ?? {});
  }

  /** The value of key `name` (default `api_key`, else the only key), or undefined. */
  value(name) {
    const keys = this.#credential?.keys ?? {};
    const k = name ?? (Object.hasOwn(keys, 'api_key') ? 'api_key' : Object.keys(keys)[0]);
    return keys[k]?.value;
  }

  /** What a logger writes: no value. */
  toJSON() {
    const out = { id: this.id, generation: this.generation, keys: this.keyNames, values: 'hidden' };
    const type = this.#credential?.credential_type;
    if (type !== undefined) out.credential_type = type;
    return out;
  }

  toString() {
    return `CredentialRecord(${this.id}, generation ${this.generation}, values hidden)`;
  }

  [inspect.custom]() {
    return `CredentialRecord { id: ${inspect(this.id)}, generation: ${this.generation}, keys: ${inspect(this.keyNames)} (values hidden) }`;
  }
}

/**
 * One subscription: an async iterator of its events (`for await (const ev of sub)`).
 * A stream subscription (`kind: 'stream'`) ends after its run's `finish` event and never drops
 * an event; across a reconnection it is made again after the last seq it delivered, so nothing
 * is repeated — and nothing missed while the run is live. If the run ended while the connection
 * was down, its events have left the daemon: the new subscription yields its `finish` alone, with
 * a seq past `lastSeq + 1`; read the stored message with `streamGet(runId, {reveal: true})`
 * (sseHandler does so). A credential watch (`kind: 'cred'`) keeps at most `maxQueued` events
 * (past that the oldest go and a `{type: 'resync', missed}` event says how many), and after a
 * reconnection yields `{type: 'resync', reason: 'reconnected'}`: list again.
 * `return()` (a `break` out of the loop) or `close()` unsubscribes.
 */
export class Subscription {
  constructor(client, kind, params, maxQueued) {
    this.client = client;
    this.kind = kind;
    this.params = params;
    this.id = null; // the daemon's number on the current connection
    this.runId = params.run_id ?? null;
    this.lastSeq = kind === 'stream' ? (params.after_seq ?? 0) : null;
    this.maxQueued = maxQueued;
    this.queue = [];
    this.waiters = [];
    this.done = false; // no more events will be queued
    this.error = null;
    this.dropped = 0;
    this.needsResubscribe = false;
  }

  _push(ev) {
    if (this.done) return;
    if (this.kind === 'stream') {
      const finish = ev.event?.type === 'finish';
      if (typeof ev.seq === 'number') {
        // Seen before a reconnection: never twice. A finish always ends it, even one at or
        // before the position asked for (a subscription after the run's end gets its finish).
        if (ev.seq <= this.lastSeq && !finish) return;
        this.lastSeq = Math.max(this.lastSeq, ev.seq);
      }
      this._deliver(ev);
      if (finish) this._end(null);
      return;
    }
    if (this.queue.length >= this.maxQueued) {
      // Drop the oldest; one resync event at the head counts every event dropped.
      this.dropped += 1;
      if (this.queue[0]?.[OWN_RESYNC]) {
        this.queue.splice(1, 1);
        this.queue[0].missed += 1;
      } else {
        this.queue[0] = { type: 'resync', missed: 1, subscription: this.id, [OWN_RESYNC]: true };
      }
      this.queue.push(ev);
      return;
    }
    this._deliver(ev);
  }

  _deliver(ev) {
    const w = this.waiters.shift();
    if (w) w.resolve({ value: ev, done: false });
    else this.queue.push(ev);
  }

  _end(error) {
    if (this.done) return;
    this.done = true;
    this.error = error;
    this.client._forget(this);
    if (this.queue.length === 0) this._flushWaiters();
  }

  _flushWaiters() {
    for (const w of this.waiters.splice(0)) {
      if (this.error) w.reject(this.error);
      else w.resolve({ value: undefined, done: true });
    }
  }

  next() {
    if (this.queue.length) {
      const value = this.queue.shift();
      if (this.done && this.queue.length === 0) queueMicrotask(() => this._flushWaiters());
      return Promise.resolve({ value, done: false });
    }
    if (this.done) {
      if (this.error) {
        const e = this.error;
        this.error = null;
        return Promise.reject(e);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Unsubscribe (exact: no event of it follows the daemon's answer). Idempotent. */
  async close() {
    if (this.done) return false;
    const id = this.id;
    this.queue.length = 0;
    this._end(null);
    if (id === null || this.client.closed || !this.client._connected()) return false;
    try {
      const r = await this.client.call('unsubscribe', { subscription: id });
      return r.unsubscribed === true;
    } catch (e) {
      if (e instanceof ConnectionClosed) return false;
      throw e;
    }
  }

  async return() {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

/**
 * One connection to the daemon, said hello to. Create it with `await Client.connect(options)`.
 *
 * Options: `socketPath` (default: found as the CLI finds it), `client` (a name for the
 * daemon's logs), `plugin` (bind to a plugin grant), `timeoutMs` (per call; default 60 s;
 * `null`: wait forever), `reconnect` (default true: after the connection drops, the next call
 * connects again, and open subscriptions are made again at once), `reconnectTimeoutMs` (how long
 * to keep trying, default 30 s).
 *
 * Calls may be made concurrently: they are pipelined on the one connection. A call in flight
 * when the connection drops fails with `ConnectionClosed` (it may or may not have been done:
 * stream appends are safe to retry with the same seq; `StreamProducer` does so).
 */
export class Client {
  static async connect(options = {}) {
    const c = new Client(options);
    await c._ensure();
    return c;
  }

  constructor({
    socketPath, client = 'node', plugin, timeoutMs = 60_000, reconnect = true,
    reconnectTimeoutMs = 30_000, maxFrameBytes,
  } = {}) {
    this.socketPath = socketPath ?? defaultSocketPath();
    this.clientName = client;
    this.plugin = plugin;
    this.timeoutMs = timeoutMs;
    this.reconnect = reconnect;
    this.reconnectTimeoutMs = reconnectTimeoutMs;
    this._maxFrameBytes = maxFrameBytes ?? null;
    /** The daemon's answer to `hello` on the current connection. */
    this.hello = null;
    /** How many times a dropped connection was made again. */
    this.reconnects = 0;
    this.closed = false;
    this._conn = null;
    this._connecting = null;
    this._nextId = 1;
    this._subs = new Set(); // every open Subscription
    this._siblings = new Set(); // further connections for shared run subscriptions (fanout.js)
  }

  /** The longest request line (bytes, its newline included) the client sends: the option
   * `maxFrameBytes`, else what the daemon announced or showed (a `request line longer than N
   * bytes` refusal), else 1 MiB, the daemon's default. */
  get maxFrameBytes() {
    return this._maxFrameBytes ?? this.hello?.max_frame_bytes ?? MAX_FRAME_BYTES;
  }

  _connected() {
    return this._conn !== null && !this._conn.dead;
  }

  /** The live connection, connecting (again) first if needed. */
  async _ensure() {
    if (this.closed) throw new ConnectionClosed('the client is closed');
    if (this._connected()) return this._conn;
    if (!this._connecting) {
      const first = this.hello === null;
      this._connecting = (first || !this.reconnect ? this._open()
        : whileReconnecting(() => this._open(), this.reconnectTimeoutMs, () => !this.closed))
        .finally(() => { this._connecting = null; });
      if (!first) {
        this._connecting.then(() => { this.reconnects += 1; }, () => {});
      }
    }
    return this._connecting;
  }

  async _open() {
    checkSocketOwner(this.socketPath);
    const sock = net.createConnection(this.socketPath);
    const conn = {
      sock, dead: false, pending: new Map(), late: new Map(), routes: new Map(), early: new Map(), subscribing: 0,
      chunks: [], size: 0, reason: null,
    };
    await new Promise((resolve, reject) => {
      const fail = (e) => reject(new ConnectionClosed(`cannot connect to the holdfast daemon at ${this.socketPath}: ${e.code ?? e.message}`));
      sock.once('error', fail);
      sock.once('connect', () => { sock.off('error', fail); resolve(); });
    });
    sock.on('data', (chunk) => this._onData(conn, chunk));
    sock.on('error', (e) => { conn.reason ??= `the connection to the daemon failed (${e.code ?? e.message})`; });
    sock.on('close', () => this._onClose(conn));
    const params = { client: this.clientName, protocol: PROTOCOL_VERSION };
    if (this.plugin !== undefined && this.plugin !== null) params.plugin = this.plugin;
    try {
      this.hello = await this._send(conn, 'hello', params);
    } catch (e) {
      sock.destroy();
      throw e;
    }
    this._conn = conn;
    // Subscriptions open on a connection that dropped are made again on this one.
    for (const sub of this._subs) {
      if (sub.needsResubscribe) {
        sub.needsResubscribe = false;
        this._resubscribe(sub);
      }
    }
    return conn;
  }

  _onData(conn, chunk) {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      let line = chunk.subarray(start, nl);
      if (conn.chunks.length) {
        conn.chunks.push(line);
        line = Buffer.concat(conn.chunks);
        conn.chunks = [];
        conn.size = 0;
      }
      start = nl + 1;
      this._onLine(conn, line);
      if (conn.dead) return;
    }
    if (start < chunk.length) {
      conn.chunks.push(chunk.subarray(start));
      conn.size += chunk.length - start;
      if (conn.size > MAX_LINE_BYTES) {
        conn.reason = `the daemon sent a line over ${MAX_LINE_BYTES} bytes`;
        conn.sock.destroy();
      }
    }
  }

  _onLine(conn, line) {
    if (line.length === 0 || (line.length === 1 && line[0] === 13)) return;
    let msg;
    try {
      msg = JSON.parse(line.toString('utf8'));
    } catch {
      conn.reason = 'the daemon sent a line that is not JSON';
      conn.sock.destroy();
      return;
    }
    if (msg === null || typeof msg !== 'object') return;
    if (msg.method === 'event' && !('id' in msg)) {
      this._onEvent(conn, msg.params);
      return;
    }
    const waiter = Number.isInteger(msg.id) ? conn.pending.get(msg.id) : undefined;
    if (!waiter) {
      if (msg.id === null && msg.error) this._onUnattributed(conn, msg.error);
      const late = Number.isInteger(msg.id) ? conn.late.get(msg.id) : undefined;
      if (late) {
        // The answer to a call that timed out: what it did must not be left behind.
        conn.late.delete(msg.id);
        clearTimeout(late.timer);
        if ('result' in msg) {
          try {
            late.onLateAnswer(msg.result, conn);
          } catch {
            // best effort
          }
        }
      }
      return;
    }
    conn.pending.delete(msg.id);
    clearTimeout(waiter.timer);
    if ('error' in msg) waiter.reject(scrub(errorFromResponse(msg.error), waiter.params));
    else if ('result' in msg) {
      // Claimed here, before the next line is read, so no event of a new subscription is
      // misfiled.
      if (waiter.onAnswer) waiter.onAnswer(msg.result, conn);
      waiter.resolve(msg.result);
    } else waiter.reject(new StorageError('a response with neither result nor error'));
  }

  /** An error answered with `id: null`: the daemon's refusal of the connection or of a line it
   * could not read. A line over its frame cap closes the connection: the requests that long fail
   * with `FrameTooLarge` (never sent again), the others with `ConnectionClosed`. A line it could
   * not parse fails the request that sent it when that one is known (the only one in flight, or
   * the only one nested too deep), never leaving it to hang until its timeout. When it is not
   * (a daemon older than the one that answers such errors with the line's id), no call may wait
   * for an answer that will never come: the connection is closed, so every call in flight fails
   * at once with `ConnectionClosed` (outcome unknown, as for any dropped connection) carrying the
   * daemon's message, and the next call opens a new one. */
  _onUnattributed(conn, error) {
    const message = typeof error?.message === 'string' ? error.message : 'an error';
    conn.reason = `the daemon said: ${message}`;
    const tooLong = /request line longer than (\d+) bytes/.exec(message);
    if (tooLong) {
      const max = Number(tooLong[1]);
      if (this._maxFrameBytes === null || max < this._maxFrameBytes) this._maxFrameBytes = max;
      for (const [id, w] of conn.pending) {
        if (w.bytes - 1 > max) {
          conn.pending.delete(id);
          clearTimeout(w.timer);
          w.reject(new FrameTooLarge(`${w.method}: a request of ${w.bytes} bytes is over the daemon's frame cap (${max} bytes)`, { bytes: w.bytes, maxFrameBytes: max }));
        }
      }
      return;
    }
    // Only a parse error is the answer to one line (a refusal of the connection, busy at its
    // cap, is not: the connection closes and the calls fail with ConnectionClosed, retried).
    if (conn.pending.size === 0 || error?.code !== -32700) return;
    // The line it could not parse: the only one in flight, else the one nested too deep (lone
    // surrogates, the other cause, are never sent: see wellFormedLine).
    let culprits = [...conn.pending];
    if (culprits.length > 1) culprits = culprits.filter(([, w]) => nestingDepth(w.line) > MAX_NESTING);
    if (culprits.length !== 1) {
      conn.sock.destroy();
      return;
    }
    const [[id, w]] = culprits;
    conn.pending.delete(id);
    clearTimeout(w.timer);
    w.reject(scrub(errorFromResponse(error), w.params));
  }

  _onEvent(conn, params) {
    if (params === null || typeof params !== 'object') return;
    const sub = conn.routes.get(params.subscription);
    if (sub) {
      sub._push(params);
      return;
    }
    // An event may come before its subscribe answer: hold it for the claim (only while a
    // subscribe is in flight; anything else is a subscription already given up).
    if (conn.subscribing === 0) return;
    const held = conn.early.get(params.subscription) ?? [];
    if (held.length < EARLY_EVENTS_CAP) held.push(params);
    conn.early.set(params.subscription, held);
  }

  _onClose(conn) {
    if (conn.dead) return;
    conn.dead = true;
    const reason = conn.reason ?? (this.closed ? 'the client closed the connection' : 'the daemon closed the connection');
    for (const w of conn.pending.values()) {
      clearTimeout(w.timer);
      w.reject(new ConnectionClosed(reason));
    }
    conn.pending.clear();
    for (const l of conn.late.values()) clearTimeout(l.timer);
    conn.late.clear();
    if (this._conn !== conn) return; // never became the connection (hello failed)
    this._conn = null;
    const subs = [...this._subs];
    if (!subs.length) return;
    if (this.closed || !this.reconnect) {
      for (const sub of subs) sub._end(new ConnectionClosed(reason));
      return;
    }
    for (const sub of subs) {
      sub.id = null;
      sub.needsResubscribe = true;
    }
    // Open subscriptions are worth a connection at once (a call would make one anyway).
    this._ensure().catch((e) => {
      for (const sub of [...this._subs]) if (sub.needsResubscribe) sub._end(e);
    });
  }

  /** Send one request on `conn`. `onAnswer(result, conn)` runs as its answer is read;
   * `onLateAnswer(result, conn)` when the answer comes after the call timed out (to undo what
   * the call did: nobody will use it). */
  _send(conn, method, params, onAnswer, onLateAnswer) {
    const id = this._nextId++;
    const line = `${wellFormedLine(JSON.stringify({ jsonrpc: '2.0', id, method, params }))}\n`;
    const bytes = Buffer.byteLength(line);
    const max = this.maxFrameBytes;
    if (bytes > max) {
      // Written, it would make the daemon close the connection (every call and subscription on
      // it would fail): refused here, never sent, never retried.
      return Promise.reject(new FrameTooLarge(`${method}: a request of ${bytes} bytes is over the daemon's frame cap (${max} bytes); nothing was sent`, { bytes, maxFrameBytes: max }));
    }
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject, params, onAnswer, timer: null, method, bytes, line };
      if (this.timeoutMs !== null && this.timeoutMs !== undefined) {
        waiter.timer = setTimeout(() => {
          conn.pending.delete(id);
          if (onLateAnswer && !conn.dead) {
            // Kept a while for the answer (a slow daemon still does the call), then forgotten.
            const timer = setTimeout(() => conn.late.delete(id), LATE_ANSWER_MS);
            timer.unref?.();
            conn.late.set(id, { onLateAnswer, timer });
          }
          reject(new CallTimeout(`no answer to ${method} within ${this.timeoutMs} ms`));
        }, this.timeoutMs);
      }
      if (conn.dead) {
        clearTimeout(waiter.timer);
        reject(new ConnectionClosed(conn.reason ?? 'the connection to the daemon closed'));
        return;
      }
      conn.pending.set(id, waiter);
      conn.sock.write(line);
    });
  }

  /**
   * Call `method` with `params` and resolve to its `result`; rejects with a `HoldfastError`
   * subclass per `data.kind`. Parameters whose value is `undefined` are left out. (For
   * subscriptions use `subscribeStream()` and `watch()`.)
   */
  async call(method, params = {}) {
    if (method === 'stream.subscribe' || method === 'cred.watch') {
      throw new InvalidParams(`use ${method === 'cred.watch' ? 'watch()' : 'subscribeStream()'} for ${method}: its events need a Subscription`);
    }
    const conn = await this._ensure();
    return this._send(conn, method, params);
  }

  async _subscribe(sub) {
    const conn = await this._ensure();
    const params = sub.kind === 'stream'
      ? { run_id: sub.runId, after_seq: sub.lastSeq } : { ...sub.params };
    conn.subscribing += 1;
    try {
      return await this._send(conn, sub.kind === 'stream' ? 'stream.subscribe' : 'cred.watch',
        params, (result, c) => this._claim(c, sub, result),
        // Timed out: the daemon's subscription would hold one of the connection's 16 slots.
        (result, c) => this._send(c, 'unsubscribe', { subscription: result.subscription }).catch(() => {}));
    } finally {
      conn.subscribing -= 1;
      if (conn.subscribing === 0) conn.early.clear();
    }
  }

  _claim(conn, sub, result) {
    const held = conn.early.get(result.subscription);
    conn.early.delete(result.subscription);
    if (sub.done) {
      // Closed while subscribing: give the daemon's slot back.
      this._send(conn, 'unsubscribe', { subscription: result.subscription }).catch(() => {});
      return;
    }
    sub.id = result.subscription;
    conn.routes.set(sub.id, sub);
    for (const ev of held ?? []) sub._push(ev);
  }

  _resubscribe(sub) {
    sub.id = null;
    if (sub.kind === 'cred') sub._push({ type: 'resync', missed: null, reason: 'reconnected' });
    this._subscribe(sub).catch((e) => {
      // A connection that dropped again makes it again (its close handler flagged it).
      if (!(e instanceof ConnectionClosed) || this.closed || !this.reconnect) sub._end(e);
    });
  }

  _forget(sub) {
    this._subs.delete(sub);
    if (this._conn && sub.id !== null && this._conn.routes.get(sub.id) === sub) {
      this._conn.routes.delete(sub.id);
    }
  }

  /** A further connection with this client's options (more subscription slots: the daemon
   * allows 16 per connection); closed with this one. */
  async _sibling() {
    const c = new Client({
      socketPath: this.socketPath, client: this.clientName, plugin: this.plugin,
      timeoutMs: this.timeoutMs, reconnect: this.reconnect, reconnectTimeoutMs: this.reconnectTimeoutMs,
    });
    this._siblings.add(c);
    const close = c.close.bind(c);
    c.close = () => { this._siblings.delete(c); close(); };
    try {
      await c._ensure();
    } catch (e) {
      c.close();
      throw e;
    }
    return c;
  }

  /** Close the connection; calls in flight fail with `ConnectionClosed`, subscriptions end. */
  close() {
    if (this.closed) return;
    this.closed = true;
    for (const c of [...this._siblings]) c.close();
    for (const sub of [...this._subs]) sub._end(null);
    if (this._conn) this._conn.sock.destroy();
    this._conn = null;
  }

  // -- subscriptions --------------------------------------------------------------------------

  /** Events of run `runId` with seq > `afterSeq`, then live ones, ending with `finish`. */
  async subscribeStream(runId, afterSeq = 0) {
    return this._startSubscription(new Subscription(this, 'stream', { run_id: runId, after_seq: afterSeq }, Infinity));
  }

  /** `cred.changed` / `lease.released` events of `store` (or of every store of the grant). */
  async watch(store, { maxQueued = 10_000 } = {}) {
    return this._startSubscription(new Subscription(this, 'cred', store === undefined ? {} : { store }, maxQueued));
  }

  async _startSubscription(sub) {
    this._subs.add(sub);
    try {
      await this._subscribe(sub);
    } catch (e) {
      this._subs.delete(sub);
      throw e;
    }
    return sub;
  }

  // -- credentials ----------------------------------------------------------------------------

  async get(id, store) {
    const r = await this.call('cred.get', { id, store });
    return new CredentialRecord(r.credential, r.generation);
  }

  /** Write a whole credential document; `ifGeneration` (0: only if absent) makes it a CAS. */
  async set(credential, { store, ifGeneration } = {}) {
    return this.call('cred.set', { credential, store, if_generation: ifGeneration });
  }

  /** The shorthand: an `api_key` credential with one key `api_key`. */
  async setValue(id, value, { store, ifGeneration } = {}) {
    return this.call('cred.set', { id, value, store, if_generation: ifGeneration });
  }

  async delete(id, store) {
    return (await this.call('cred.delete', { id, store })).deleted;
  }

  async list(store) {
    return (await this.call('cred.list', { store })).credentials;
  }

  async exists(id, store) {
    return (await this.call('cred.exists', { id, store })).exists;
  }

  async refreshLease(id, ttlMs, store) {
    return this.call('cred.refresh_lease', { id, ttl_ms: ttlMs, store });
  }

  async releaseLease(id, store) {
    return (await this.call('cred.release_lease', { id, store })).released;
  }

  async status() {
    return this.call('admin.status', {});
  }

  // -- streams --------------------------------------------------------------------------------

  /** Begin run `runId`. Should the call time out and its answer come later, the run it began
   * is aborted at once (nobody holds its stream id: it would stay `streaming`, held by this
   * connection, never declared producer-lost). */
  async streamBegin(runId, { threadId, model, takeover } = {}) {
    const conn = await this._ensure();
    return this._send(conn, 'stream.begin', { run_id: runId, thread_id: threadId, model, takeover },
      undefined, (result, c) => {
        this._send(c, 'stream.abort', {
          run_id: runId, stream_id: result.stream_id, reason: 'the caller gave up waiting for stream.begin',
        }).catch(() => {});
      });
  }

  async streamAppend(runId, streamId, seq, events) {
    return this.call('stream.append', { run_id: runId, stream_id: streamId, seq, events });
  }

  /** `continuation`: how the text goes on after an R1/R3 plan, `'exact'` (the daemon's
   * default: nothing trimmed) or `'restated'` (the model may restate the prefix's end). */
  async streamInterrupt(runId, streamId, cause, { continuation } = {}) {
    return this.call('stream.interrupt', { run_id: runId, stream_id: streamId, cause, continuation });
  }

  async streamResume(runId, { model, threadId, failOnStale, continuation } = {}) {
    return this.call('stream.resume', {
      run_id: runId, model, thread_id: threadId, fail_on_stale: failOnStale, continuation,
    });
  }

  async streamCommit(runId, streamId, finalMessage, { contentFromStream } = {}) {
    return this.call('stream.commit', {
      run_id: runId, stream_id: streamId, final_message: finalMessage,
      content_from_stream: contentFromStream,
    });
  }

  async streamAbort(runId, streamId, reason) {
    return this.call('stream.abort', { run_id: runId, stream_id: streamId, reason });
  }

  async streamGet(runId, { reveal } = {}) {
    return this.call('stream.get', { run_id: runId, reveal });
  }

  async streamList() {
    return (await this.call('stream.list', {})).runs;
  }

  async checkpointPut(runId, snapshot) {
    return this.call('checkpoint.put', { run_id: runId, snapshot });
  }

  async checkpointGet(runId) {
    return this.call('checkpoint.get', { run_id: runId });
  }

  async checkpointDelete(runId) {
    return (await this.call('checkpoint.delete', { run_id: runId })).deleted;
  }

  // -- run logs -------------------------------------------------------------------------------

  async runLogNode(runId, detail) {
    return this.call('run.log_node', { run_id: runId, detail });
  }

  async runEnsureNode(runId, nodeId, detail) {
    return this.call('run.ensure_node', { run_id: runId, node_id: nodeId, detail });
  }

  async runLogStep(runId, step) {
    return this.call('run.log_step', { run_id: runId, step });
  }

  async runToolBegin(runId, toolCallId, name, input) {
    return this.call('run.tool_begin', { run_id: runId, tool_call_id: toolCallId, name, input });
  }

  async runToolEnd(runId, toolCallId, { result, isError } = {}) {
    return this.call('run.tool_end', {
      run_id: runId, tool_call_id: toolCallId, result, is_error: isError,
    });
  }

  /** End the run: `fields` are `agent_id`, `goal_id`, `execution_quality`, `trace_id`,
   * `execution_id`, `started_at`, `duration_ms`, `node_path`, as the protocol names them. */
  async runEnd(runId, status, fields = {}) {
    return this.call('run.end', { ...fields, run_id: runId, status });
  }

  async runGet(runId) {
    return this.call('run.get', { run_id: runId });
  }

  async runList({ status, sinceMs, untilMs } = {}) {
    return (await this.call('run.list', { status, since_ms: sinceMs, until_ms: untilMs })).runs;
  }

  async runPrune(olderThanDays, { dryRun } = {}) {
    return this.call('run.prune', { older_than_days: olderThanDays, dry_run: dryRun });
  }
}

// `await using client = await Client.connect()` where the runtime has explicit resource
// management (runtimes that define Symbol.asyncDispose; Node 18 does not).
if (typeof Symbol.asyncDispose === 'symbol') {
  Client.prototype[Symbol.asyncDispose] = async function dispose() {
    this.close();
  };
}

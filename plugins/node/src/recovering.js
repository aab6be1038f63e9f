// A model's stream made recoverable through holdfast, for Node: the counterpart of Python's
// `RecoveringStream`. It appends the provider's chunks (durable before they are shown), renders
// the run's own published events as soon as each is durable, treats a provider that goes silent
// for `stallTimeoutMs` as broken (cause `stalled`), follows the daemon's recovery plans, and
// ends the run with one commit.
import { Conflict, ConnectionClosed, HoldfastError } from './errors.js';
import { iterate } from './iterate.js';
import { CONTINUATIONS, StreamProducer, abortRefused } from './producer.js';

/** Event types a provider stream may hand over already in holdfast's form. */
const PRODUCER_EVENTS = new Set(['text', 'tool_call_delta', 'tool_call_end']);
const MAX_CAUSE_MESSAGE = 1000;
const CATCH_UP_TIMEOUT_MS = 30_000;
const OPENED = Symbol('opened');
/** The longest `stallTimeoutMs`: 24 days (a longer timer fires at once in Node). */
export const MAX_STALL_TIMEOUT_MS = 24 * 86_400_000;

/** No chunk came for `stallTimeoutMs`: the interruption's cause was `stalled`. */
export class StreamStalled extends Error {
  constructor(ms) {
    super(`no chunk from the provider for ${ms} ms`);
    this.name = 'StreamStalled';
    this.stallTimeoutMs = ms;
  }
}

/** The planner gave up (a permanent cause, a spent budget): the run was aborted. */
export class StreamFailed extends Error {
  constructor(plan, options) {
    super(`stream failed: ${plan?.cause} (${plan?.reason})`, options);
    this.name = 'StreamFailed';
    this.plan = plan;
  }
}

/** The same tool call stalled again and again while its arguments were being written: the run
 * was aborted; tell the model `message` (split the output into smaller calls of `tool`). */
export class SplitToolCall extends Error {
  constructor(hint, plan, options) {
    super(hint?.message ?? 'split the tool call into smaller calls', options);
    this.name = 'SplitToolCall';
    this.hint = hint;
    this.plan = plan;
    this.tool = hint?.tool ?? null;
  }
}

function headerOf(headers, name) {
  if (!headers) return undefined;
  if (typeof headers.get === 'function') return headers.get(name) ?? undefined;
  return headers[name] ?? headers[name.toLowerCase()];
}

/**
 * The interruption cause of a provider error, or null when it is not a stream failure to
 * recover from (a bug in the caller's code): an HTTP status (`status`, `statusCode`,
 * `response.status`) becomes `{status, message, retry_after}` for the planner; a dropped
 * connection (`ECONNRESET`, `EPIPE`, `UND_ERR_SOCKET`, a premature close) is
 * `connection_reset`; a timeout is `idle_stall` once chunks were flowing, else `timeout`.
 */
export function classifyError(err, midStream) {
  const status = [err?.status, err?.statusCode, err?.response?.status]
    .find((s) => Number.isInteger(s) && s >= 100 && s <= 599);
  if (status !== undefined) {
    const cause = { status, message: String(err?.message ?? '').slice(0, MAX_CAUSE_MESSAGE) };
    const ra = err?.retryAfter ?? headerOf(err?.headers, 'retry-after')
      ?? headerOf(err?.responseHeaders, 'retry-after') ?? headerOf(err?.response?.headers, 'retry-after');
    if (typeof ra === 'string' || typeof ra === 'number') cause.retry_after = ra;
    return cause;
  }
  const code = err?.code ?? err?.cause?.code;
  if (['ETIMEDOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'].includes(code)
    || err?.name === 'TimeoutError') {
    return midStream ? 'idle_stall' : 'timeout';
  }
  if (['ECONNRESET', 'EPIPE', 'ECONNREFUSED', 'UND_ERR_SOCKET', 'ERR_STREAM_PREMATURE_CLOSE'].includes(code)) {
    return 'connection_reset';
  }
  return null;
}

/**
 * A provider stream made recoverable (`for await (const ev of rs)`; each `ev` is `{seq, type,
 * data, text}` as the run's subscribers see it).
 *
 * `stream`: the first response — an async or sync iterable of chunks (a string is text; an
 * object `{type: 'text' | 'tool_call_delta' | 'tool_call_end', …}` is a holdfast event), or a
 * function returning one; not needed with `resume`. `reopen(prefix)`: a new response that
 * continues after `prefix` (R1/R3: the text so far) or starts over (R4: null).
 * `continuation`: how `reopen` continues the text, `'exact'` (default: the provider continues
 * the prefix, nothing is removed) or `'restated'` (the model may restate the prefix's end; the
 * daemon removes the restatement). `stallTimeoutMs`: no chunk for that long (from the request
 * on) is an interruption with cause `stalled`, planned like any other (a stalled tool call is
 * cancelled: R3, or R2 with the completed ones; stalling again and again: `SplitToolCall`).
 * `resume`: take over a run whose producer died. `classify(err, midStream)`: your own cause.
 * `sleep(ms)`: how to wait a plan's `wait_ms` (tests pass a fake).
 *
 * After iterating: `text` (what was rendered), `finalMessage` (as stored), `plans`,
 * `toolCalls`, `stopReason`, `streamId`.
 */
export class RecoveringStream {
  constructor(client, runId, stream, {
    reopen, model, threadId, resume = false, takeover = false, afterSeq = 0,
    continuation = 'exact', stallTimeoutMs = null, classify, sleep,
  } = {}) {
    if (stream == null && !resume) throw new TypeError('RecoveringStream needs the provider stream (or resume: true)');
    if (typeof reopen !== 'function') throw new TypeError('reopen must be a function of the assistant prefix');
    if (!CONTINUATIONS.includes(continuation)) {
      throw new TypeError(`continuation must be 'exact' or 'restated', not ${JSON.stringify(continuation)}`);
    }
    if (stallTimeoutMs !== null && !(Number.isFinite(stallTimeoutMs) && stallTimeoutMs > 0
      && stallTimeoutMs <= MAX_STALL_TIMEOUT_MS)) {
      throw new TypeError(`stallTimeoutMs must be a number of milliseconds in (0, ${MAX_STALL_TIMEOUT_MS}] (or null: wait forever)`);
    }
    Object.assign(this, { client, runId });
    this._o = { stream, reopen, model, threadId, resume, takeover, afterSeq, continuation, stallTimeoutMs, classify };
    this._sleep = sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
    this.text = '';
    this.calls = new Map();
    this.plans = [];
    this.attempt = 0;
    this.lastSeq = afterSeq;
    this.finalMessage = null;
    this.toolCalls = [];
    this.stopReason = null;
    this.streamId = null;
    this._lastCallSeq = 0;
  }

  _seen(params) {
    const data = params.event ?? {};
    const ev = { seq: params.seq, type: data.type, data, text: data.type === 'text' ? data.text : '' };
    this.lastSeq = Math.max(this.lastSeq, params.seq ?? 0);
    if (data.type === 'text') this.text += data.text;
    else if (data.type === 'stream_reset') { this.text = ''; this.calls.clear(); }
    else if (data.type === 'tool_call_delta') {
      const c = this.calls.get(data.id) ?? { id: data.id, name: '', arguments: '' };
      if (data.name && !c.name) c.name = data.name;
      c.arguments += data.arguments_delta ?? '';
      this.calls.set(data.id, c);
    } else if (data.type === 'tool_call_cancel') this.calls.delete(data.id);
    return ev;
  }

  _completed() {
    const out = [];
    for (const c of this.calls.values()) {
      let args;
      try { args = JSON.parse(c.arguments); } catch { continue; }
      if (c.name && args !== null) out.push({ id: c.id, name: c.name, arguments: args });
    }
    return out;
  }

  _decide(plan) {
    this.plans.push(plan);
    if (plan.plan === 'fail') return ['fail', null];
    if (plan.plan === 'R2') return ['tools', (plan.completed ?? []).map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }))];
    const split = (plan.hints ?? []).find((h) => h.kind === 'split_tool_call');
    if (split) return ['split', split];
    this.attempt += 1;
    return ['reopen', ['R1', 'R3'].includes(plan.plan) ? plan.assistant_prefix : null];
  }

  _cause(err, mid) {
    if (err instanceof StreamStalled) return 'stalled';
    if (err instanceof HoldfastError) return null; // the daemon's answer, not the provider's
    return this._o.classify?.(err, mid) ?? classifyError(err, mid);
  }

  async* [Symbol.asyncIterator]() {
    const o = this._o;
    const { client, runId } = this;
    let plan = null;
    let p;
    let sub;
    if (o.resume) {
      // Subscribed first: a subscription refused (the connection's cap) takes nothing over.
      sub = await client.subscribeStream(runId, o.afterSeq);
      try {
        p = await StreamProducer.resume(client, runId, { model: o.model, threadId: o.threadId, continuation: o.continuation });
      } catch (e) {
        await sub.close().catch(() => {});
        throw e;
      }
      plan = p.plan;
    } else {
      p = await StreamProducer.begin(client, runId, {
        threadId: o.threadId, model: o.model, takeover: o.takeover, continuation: o.continuation,
      });
      try {
        sub = await client.subscribeStream(runId, o.afterSeq);
      } catch (e) {
        // Nothing was streamed: the run just begun is ended, not left held.
        await p.abort(`could not subscribe to the run (${e.name}): nothing was streamed`).catch(() => {});
        throw e;
      }
    }
    this.streamId = p.streamId;
    // What the loop waits for, each settled value parked in its slot and the loop woken: one
    // reaction per pending promise, however many times the loop waits (a race per wait would
    // add one to a long-pending promise every time).
    let wake = null;
    const signal = () => { const w = wake; wake = null; w?.(); };
    let subNext = null; // the subscription's pending next(): kept across waits, never dropped
    let subGot = null;
    let subWatched = false;
    const nextEvent = () => { subNext ??= sub.next(); return subNext; };
    const watchSub = () => {
      if (subWatched) return;
      subWatched = true;
      nextEvent().then((r) => { subGot = { kind: 'sub', r }; signal(); }, (e) => { subGot = { kind: 'suberror', e }; signal(); });
    };
    const taken = () => { subNext = null; subGot = null; subWatched = false; };
    const catchUp = async function* catchUp(self, seq) {
      while (self.lastSeq < seq) {
        let timer;
        const r = await Promise.race([nextEvent(), new Promise((res) => { timer = setTimeout(() => res(null), CATCH_UP_TIMEOUT_MS); })]);
        clearTimeout(timer);
        if (r === null || r.done) throw new Error(`the run's subscription did not deliver seq ${seq}`);
        taken();
        yield self._seen(r.value);
      }
    };
    let abandon = null;
    try {
      let pending = { first: true, prefix: null };
      let causeErr = null;
      for (;;) {
        if (plan) {
          // The plan's events (its `interrupted` says how long the wait is) are shown before
          // the wait, not after it.
          yield* catchUp(this, Math.max(0, ...(plan.events_published ?? []).filter(Number.isInteger)));
          const [what, arg] = this._decide(plan);
          plan = null;
          if (what !== 'reopen') {
            yield* this._finish(p, what, arg, nextEvent, taken, causeErr);
            return;
          }
          await this._sleep(Math.max(0, Number(this.plans.at(-1).wait_ms) || 0));
          pending = { first: false, prefix: arg };
        }
        const open = [];
        let mid = false;
        let broke = null;
        let it = null;
        let source = null;
        let abandoned = false;
        const letGo = (src, iter) => {
          // return() ends an iterator (a web ReadableStream's cancels the stream); cancel()
          // only an unlocked stream — both may reject, and nobody waits for either.
          Promise.resolve().then(() => iter?.return?.()).catch(() => {});
          if (src && typeof src.cancel === 'function' && src.locked === false) {
            Promise.resolve().then(() => src.cancel()).catch(() => {});
          }
        };
        const attempt = pending;
        let chunkNext = (async () => {
          const s = attempt.first ? (typeof o.stream === 'function' ? o.stream() : o.stream) : o.reopen(attempt.prefix);
          const opened = await s;
          const iter = iterate(opened);
          if (!iter) throw new TypeError('a provider stream must be an (async) iterable');
          if (abandoned) {
            letGo(opened, iter); // opened after the stall was declared: nobody reads it
            return OPENED;
          }
          source = opened;
          it = iter;
          return OPENED;
        })();
        let chunkGot = null;
        const watchChunk = (pr) => {
          pr.then((v) => { if (pr === chunkNext) { chunkGot = { kind: 'chunk', v }; signal(); } },
            (e) => { if (pr === chunkNext) { chunkGot = { kind: 'error', e }; signal(); } });
        };
        watchChunk(chunkNext);
        // A sync iterator's next() may throw: as a rejection, classified like an async one's.
        const pull = () => {
          chunkGot = null;
          chunkNext = Promise.resolve().then(() => it.next());
          watchChunk(chunkNext);
        };
        abandon = () => { abandoned = true; letGo(source, it); };
        // The stall clock runs from the request on (opening the stream included).
        let last = Date.now();
        for (;;) {
          watchSub();
          let got = subGot ?? chunkGot;
          if (!got) {
            let timer = null;
            let stalled = false;
            await new Promise((res) => {
              wake = res;
              if (o.stallTimeoutMs !== null) {
                timer = setTimeout(() => { stalled = true; signal(); }, Math.max(0, o.stallTimeoutMs - (Date.now() - last)));
              }
            });
            if (timer) clearTimeout(timer);
            got = subGot ?? chunkGot ?? (stalled ? { kind: 'stall' } : null);
            if (!got) continue;
          }
          if (got.kind === 'suberror') throw got.e;
          if (got.kind === 'sub') {
            taken();
            if (got.r.done) throw new Conflict('the run ended while it was being produced');
            yield this._seen(got.r.value); // rendered as soon as it is durable
            continue;
          }
          if (got.kind === 'stall') { broke = new StreamStalled(o.stallTimeoutMs); abandon(); break; }
          if (got.kind === 'error') { chunkGot = null; broke = got.e; break; }
          if (got.v === OPENED) { pull(); continue; }
          if (got.v.done) {
            const ends = open.splice(0).map((id) => ({ type: 'tool_call_end', id }));
            if (ends.length) this._append(p, ends);
            break;
          }
          mid = true;
          last = Date.now();
          if (p.failed) { broke = p.failed; abandon(); break; } // appends refused: stop reading
          const evs = this._events(got.v.value, open);
          if (evs.length) this._append(p, evs);
          pull();
        }
        abandon = null;
        if (broke) {
          const cause = this._cause(broke, mid);
          if (cause === null) throw broke;
          await p.flush(); // what the model sent before the break is kept
          plan = await p.interrupt(cause);
          causeErr = broke;
          continue;
        }
        await p.flush();
        // The turn's calls are read from the subscription up to the last tool-call event (text
        // after it may be held by the daemon until the commit decides on it).
        yield* catchUp(this, this._lastCallSeq);
        yield* this._finish(p, 'done', this._completed(), nextEvent, taken, null);
        return;
      }
    } catch (e) {
      // An error that leaves the run ours and unended (a refused append or commit, a chunk of
      // the wrong type): the run is aborted, saying why, not left `streaming` until it expires.
      if (!this._ended && !(e instanceof StreamFailed) && !(e instanceof SplitToolCall)) {
        await abortRefused(p, p.failed ? 'append refused' : 'failed', p.failed ?? e);
      }
      throw e;
    } finally {
      abandon?.();
      await sub.close().catch(() => {});
    }
  }

  /** Hand events to the producer (a failure is raised by its flush()), remembering the seq of
   * the last tool-call event: tool-call events are never held, a restated text may be. */
  _append(p, evs) {
    const base = p.handedSeq;
    evs.forEach((ev, i) => { if (ev.type !== 'text') this._lastCallSeq = base + i; });
    p.append(evs).catch(() => {});
  }

  _events(chunk, open) {
    if (typeof chunk === 'string') return chunk ? [{ type: 'text', text: chunk }] : [];
    if (chunk && typeof chunk === 'object' && PRODUCER_EVENTS.has(chunk.type)) {
      if (chunk.type === 'tool_call_delta' && !open.includes(chunk.id)) open.push(chunk.id);
      if (chunk.type === 'tool_call_end') open.splice(open.indexOf(chunk.id) >>> 0, open.includes(chunk.id) ? 1 : 0);
      return [{ ...chunk }];
    }
    throw new TypeError(`a provider chunk must be a string or a holdfast event; got ${typeof chunk}`);
  }

  async* _finish(p, what, arg, nextEvent, taken, causeErr) {
    if (what === 'done' || what === 'tools') {
      try {
        await p.commit({ role: 'assistant', ...(arg?.length ? { tool_calls: arg } : {}) }, { contentFromStream: true });
      } catch (e) {
        if (!(e instanceof ConnectionClosed)) this._ended = true;
        await abortRefused(p, 'commit refused', e);
        throw e;
      }
    } else {
      const last = this.plans.at(-1) ?? {};
      await p.abort(what === 'split' ? `split_tool_call: ${arg?.tool ?? '?'}` : `recovery failed: ${last.cause} (${last.reason})`);
    }
    this._ended = true;
    for (;;) {
      const r = await nextEvent();
      taken();
      if (r.done) break;
      yield this._seen(r.value);
    }
    if (what === 'done' || what === 'tools') {
      this.toolCalls = what === 'tools' ? (this.plans.at(-1).completed ?? []) : arg;
      this.stopReason = this.toolCalls.length ? 'tool_use' : 'end_turn';
      this.finalMessage = (await this.client.streamGet(this.runId, { reveal: true })).final_message ?? null;
      return;
    }
    this.stopReason = what;
    const planNow = this.plans.at(-1);
    throw what === 'split'
      ? new SplitToolCall(arg, planNow, { cause: causeErr ?? undefined })
      : new StreamFailed(planNow, { cause: causeErr ?? undefined });
  }
}

// The producer's side of a durable stream: begin or resume a run, append its deltas (batched
// while an append is in flight, retried across daemon restarts without ever doubling a token),
// interrupt it when the model's stream breaks, commit or abort it.
import { whileReconnecting } from './client.js';
import { Conflict, ConnectionClosed, FrameTooLarge, InvalidParams, NotFound } from './errors.js';


/** How a producer continues the text after an R1/R3 plan (docs/recovery.md, "Continuation"):
 * `exact` (the default; the provider continues the prefix, nothing is trimmed) or `restated`
 * (the model may begin by restating the prefix's end; the restatement is removed). */
export const CONTINUATIONS = Object.freeze(['exact', 'restated']);

/** The most events one `stream.append` carries (the daemon's cap is 1,024). */
export const MAX_BATCH_EVENTS = 1024;
const BIG_NUMBER = Number.MAX_SAFE_INTEGER;

/**
 * Produce one run. `await StreamProducer.begin(client, runId, {threadId, model, continuation})`
 * for a new run,
 * `await StreamProducer.resume(client, runId, {model})` to take over one whose producer died
 * (`producer.plan` then says how to go on: R1/R3 continue after `plan.assistant_prefix`, R2
 * ends the turn with `plan.completed`, R4 restarts, `fail` ends it).
 *
 * `append(events)` resolves once those events are durable. Events given while an append is in
 * flight go together in the next one (one round trip and one fsync for many tokens). When the
 * connection drops (a daemon restart), the batch is sent again with the same seq: the daemon
 * acknowledges what it already had and drops it, so no text is doubled. `retryTimeoutMs` (30 s)
 * bounds how long it keeps trying.
 */
export class StreamProducer {
  constructor(client, runId, streamId, nextSeq, { retryTimeoutMs = 30_000, continuation = 'exact' } = {}) {
    if (!CONTINUATIONS.includes(continuation)) {
      throw new TypeError(`continuation must be 'exact' or 'restated', not ${JSON.stringify(continuation)}`);
    }
    this.continuation = continuation;
    this.client = client;
    this.runId = runId;
    this.streamId = streamId;
    this.nextSeq = nextSeq; // the seq of the next event to send
    this.handedSeq = nextSeq; // the seq the next event handed to append() gets
    this.ackedSeq = nextSeq - 1;
    this.retryTimeoutMs = retryTimeoutMs;
    this.plan = null;
    this.checkpoint = null;
    /** Appends sent (round trips) and events in them. */
    this.appends = 0;
    this.events = 0;
    this._queue = []; // [{event, resolve, reject}]
    this._flushing = null;
    this._failed = null;
  }

  static async begin(client, runId, { threadId, model, takeover, ...options } = {}) {
    const r = await client.streamBegin(runId, { threadId, model, takeover });
    return new StreamProducer(client, runId, r.stream_id, r.next_seq, options);
  }

  static async resume(client, runId, { model, threadId, failOnStale, ...options } = {}) {
    const continuation = options.continuation ?? 'exact';
    if (!CONTINUATIONS.includes(continuation)) {
      throw new TypeError(`continuation must be 'exact' or 'restated', not ${JSON.stringify(continuation)}`);
    }
    const r = await client.streamResume(runId, { model, threadId, failOnStale, continuation });
    const p = new StreamProducer(client, runId, r.stream_id, r.next_seq, options);
    p.plan = r.plan;
    p.checkpoint = r.checkpoint;
    return p;
  }

  /** Append events (`{type: 'text', text}`, `{type: 'tool_call_delta', id, name?,
   * arguments_delta}`, `{type: 'tool_call_end', id}`); resolves to the acked seq once they are
   * durable. */
  append(events) {
    const list = Array.isArray(events) ? events : [events];
    if (this._failed) return Promise.reject(this._failed);
    this.handedSeq += list.length;
    const done = Promise.all(list.map((event) => new Promise((resolve, reject) => {
      this._queue.push({ event, bytes: Buffer.byteLength(JSON.stringify(event) ?? 'null') + 1, resolve, reject });
    })));
    this._kick();
    return done.then(() => this.ackedSeq);
  }

  /** The error that failed an append (every later one fails with it), or null. */
  get failed() {
    return this._failed;
  }

  /** Append one text delta. */
  text(text) {
    return this.append({ type: 'text', text });
  }

  /** Resolves when everything appended so far is durable. */
  async flush() {
    while (this._flushing) await this._flushing;
    if (this._failed) throw this._failed;
  }

  _kick() {
    if (this._flushing || this._queue.length === 0) return;
    this._flushing = this._drain().finally(() => {
      this._flushing = null;
      this._kick();
    });
  }

  /** The next batch: at most MAX_BATCH_EVENTS events whose request line fits the daemon's frame
   * cap (a longer line would make the daemon close the connection every run on it shares).
   * Throws FrameTooLarge when the first event cannot fit even alone. */
  _nextBatch() {
    const envelope = Buffer.byteLength(JSON.stringify({
      jsonrpc: '2.0', id: BIG_NUMBER, method: 'stream.append',
      params: { run_id: this.runId, stream_id: this.streamId, seq: BIG_NUMBER, events: [] },
    })) + 1;
    const max = this.client.maxFrameBytes;
    let size = envelope;
    let n = 0;
    while (n < this._queue.length && n < MAX_BATCH_EVENTS && size + this._queue[n].bytes <= max) {
      size += this._queue[n].bytes;
      n += 1;
    }
    if (n === 0) {
      const bytes = envelope + this._queue[0].bytes;
      throw new FrameTooLarge(`stream.append: an event of ${this._queue[0].bytes - 1} bytes (serialized) cannot fit in one request line (the daemon's frame cap is ${max} bytes); the stream stops here`, { bytes, maxFrameBytes: max });
    }
    return this._queue.splice(0, n);
  }

  async _drain() {
    while (this._queue.length) {
      let batch = [];
      const seq = this.nextSeq;
      try {
        batch = this._nextBatch();
        const r = await whileReconnecting(() => this.client.streamAppend(
          this.runId, this.streamId, seq, batch.map((b) => b.event)), this.retryTimeoutMs);
        this.appends += 1;
        this.events += batch.length;
        this.nextSeq = seq + batch.length;
        this.ackedSeq = r.acked_seq;
        for (const b of batch) b.resolve();
      } catch (e) {
        // Nothing after a refused batch may go out (its seqs would be a gap): fail the rest.
        this._failed = e;
        for (const b of batch.concat(this._queue.splice(0))) b.reject(e);
        return;
      }
    }
  }

  /** The model's stream broke: returns the plan (docs/recovery.md); appends go on from its
   * `next_seq`. `cause`: a cause name or `{status, message, retry_after}`. */
  async interrupt(cause) {
    await this.flush();
    let plan;
    try {
      plan = await this.client.streamInterrupt(this.runId, this.streamId, cause,
        { continuation: this.continuation });
    } catch (e) {
      // A provider's Retry-After the daemon cannot read ("soon", "") must not stop the
      // recovery: sent again without it, the plan's own backoff applies.
      if (!(e instanceof InvalidParams) || cause === null || typeof cause !== 'object' || !('retry_after' in cause)) throw e;
      const { retry_after: _dropped, ...plain } = cause;
      plan = await this.client.streamInterrupt(this.runId, this.streamId, plain,
        { continuation: this.continuation });
    }
    this.plan = plan;
    this.nextSeq = plan.next_seq;
    this.handedSeq = plan.next_seq;
    this.ackedSeq = plan.next_seq - 1;
    return plan;
  }

  /** Make `finalMessage` the run's durable final message and end it, in one step. With
   * `contentFromStream` (default true for an object message) its `content` is the text the run
   * published, exactly what subscribers were shown. A commit whose answer was lost to a daemon
   * restart is confirmed with `stream.get`, never done twice. */
  async commit(finalMessage, { contentFromStream } = {}) {
    await this.flush();
    const fromStream = contentFromStream ?? (finalMessage !== null && typeof finalMessage === 'object'
      && !Array.isArray(finalMessage));
    return this._ending(() => this.client.streamCommit(this.runId, this.streamId, finalMessage,
      { contentFromStream: fromStream || undefined }), 'committed');
  }

  /** End the run without a final message (the user stopped it). */
  async abort(reason) {
    await this.flush().catch(() => {});
    return this._ending(() => this.client.streamAbort(this.runId, this.streamId, reason), 'aborted');
  }

  async _ending(op, status) {
    let retried = false;
    try {
      return await whileReconnecting(async () => {
        try {
          return await op();
        } catch (e) {
          if (e instanceof ConnectionClosed) retried = true;
          throw e;
        }
      }, this.retryTimeoutMs);
    } catch (e) {
      // After a lost answer the first try may have been done: the run's state says.
      if (retried && (e instanceof Conflict || e instanceof NotFound)) {
        const state = await this.client.streamGet(this.runId);
        if (state.status === status) {
          return { run_id: this.runId, status, finish_seq: state.finish_seq, confirmed: true };
        }
      }
      throw e;
    }
  }
}

/** Abort `p`'s run after `err` ended its production (`what`: 'append refused', 'commit
 * refused', ...), the reason naming it; best effort. Not after a connection that stayed down
 * (the abort could not be sent either; a run whose connection is gone is producer-lost). */
export async function abortRefused(p, what, err) {
  if (err instanceof ConnectionClosed) return;
  const reason = `${what}: ${err?.name ?? 'Error'}: ${err?.message ?? err}`.slice(0, 200);
  await p.abort(reason).catch(() => {});
}

// Many viewers of a run on one daemon subscription. The daemon allows 16 subscriptions per
// connection; a web server has one Client and any number of browsers. So the viewers of a run
// share one subscription (from the run's first event), whose events are kept here while the
// run is followed: each viewer reads them from its own position (a late viewer, or one coming
// back with its Last-Event-ID, is served from this history, then live). These subscriptions
// live on further connections of the same client (made and closed as needed, 16 runs each),
// never on its own connection, whose slots stay for the application's subscribeStream, watch
// and RecoveringStream; so no viewer is refused for want of a slot, and a burst of viewers of
// many runs opens one connection per 16 runs (opened one at a time), not one per run.
import { Busy, CallTimeout } from './errors.js';

/** The daemon's 'no free subscription slot' (a call timeout is a Busy too, but not that). */
const full = (e) => e instanceof Busy && !(e instanceof CallTimeout);

const HUBS = new WeakMap(); // Client -> Hub
/** The daemon's subscriptions per connection. */
const SLOTS = 16;

/**
 * Follow run `runId` after seq `afterSeq` through `client`'s shared subscription of the run.
 * Returns a `RunViewer`: an async iterator of the events (`{run_id, seq, event}`, as a
 * `Subscription` yields them), each once and in order, ending with the run's `finish`, which
 * carries `complete`: true when this viewer was given every event before it, false when it was
 * not (the run ended while nobody followed it, so its events had left the daemon, or the
 * viewer's position was past the run's end): show the stored final message then.
 * `return()` / `close()` stops following; the shared subscription ends with its last viewer.
 */
export function followRun(client, runId, afterSeq = 0) {
  let hub = HUBS.get(client);
  if (!hub) {
    hub = new Hub(client);
    HUBS.set(client, hub);
  }
  return hub.follow(runId, afterSeq);
}

/** How many runs `client` follows for viewers, and how many viewers (for tests, metrics). */
export function followStats(client) {
  const hub = HUBS.get(client);
  if (!hub) return { runs: 0, viewers: 0, connections: 1 };
  let viewers = 0;
  for (const f of hub.feeds.values()) viewers += f.viewers.size;
  return { runs: hub.feeds.size, viewers, connections: 1 + hub.extra.length };
}

class Hub {
  constructor(client) {
    this.client = client;
    this.feeds = new Map(); // run id -> Feed
    this.extra = []; // [{client, subs, full}] the connections the shared subscriptions live on
    this.opening = null; // the further connection being opened (one at a time)
  }

  follow(runId, afterSeq) {
    let feed = this.feeds.get(runId);
    if (!feed) {
      feed = new Feed(this, runId);
      this.feeds.set(runId, feed);
      feed.start();
    }
    return feed.join(afterSeq);
  }

  /** A subscription of `runId` from its start, on the first further connection with a free
   * slot (a slot is taken before the call, so viewers arriving together fill a connection
   * before the next is opened); a new connection when all are full, one being opened at a time. */
  async subscribe(runId) {
    for (;;) {
      if (this.client.closed) throw new Busy('the client is closed');
      const conn = this.extra.find((c) => !c.client.closed && !c.full && c.subs < SLOTS);
      if (!conn) {
        this.opening ??= this.client._sibling()
          .then((client) => { this.extra.push({ client, subs: 0, full: false }); })
          .finally(() => { this.opening = null; });
        await this.opening;
        continue;
      }
      conn.subs += 1;
      try {
        return { sub: await conn.client.subscribeStream(runId, 0), conn };
      } catch (e) {
        // The daemon counts more subscriptions there than we do: none until one ends.
        if (full(e)) conn.full = true;
        this.release(conn);
        if (!full(e)) throw e;
      }
    }
  }

  /** A subscription on `conn` ended: a connection left with none is closed. */
  release(conn) {
    if (!conn) return;
    conn.subs -= 1;
    conn.full = false;
    if (conn.subs <= 0 && this.extra.includes(conn)) {
      this.extra = this.extra.filter((c) => c !== conn);
      conn.client.close();
    }
  }
}

class Feed {
  constructor(hub, runId) {
    this.hub = hub;
    this.runId = runId;
    this.events = []; // every event of the run so far, in seq order (no finish)
    this.finish = null;
    this.error = null;
    this.viewers = new Set();
    this.sub = null;
    this.conn = null;
    this.closed = false;
  }

  async start() {
    let got;
    try {
      got = await this.hub.subscribe(this.runId);
    } catch (e) {
      this._fail(e);
      return;
    }
    this.sub = got.sub;
    this.conn = got.conn;
    if (this.closed) {
      this._release();
      return;
    }
    try {
      for await (const ev of this.sub) {
        if (ev.event?.type === 'finish') {
          this.finish = ev;
          break;
        }
        this.events.push(ev);
        this._wake();
      }
      if (!this.finish && !this.closed) this._fail(new Busy(`the subscription of run ${this.runId} ended without its finish`));
    } catch (e) {
      this._fail(e);
      return;
    }
    this._release();
    this._wake();
  }

  _fail(e) {
    this.error = e;
    if (this.hub.feeds.get(this.runId) === this) this.hub.feeds.delete(this.runId); // a new viewer starts afresh
    this._release();
    this._wake();
  }

  _release() {
    const { sub, conn } = this;
    this.sub = null;
    this.conn = null;
    if (sub) sub.close().catch(() => {}).finally(() => this.hub.release(conn));
  }

  _wake() {
    for (const v of this.viewers) v._wake();
  }

  join(afterSeq) {
    const v = new RunViewer(this, afterSeq);
    this.viewers.add(v);
    return v;
  }

  leave(v) {
    this.viewers.delete(v);
    if (this.viewers.size === 0) {
      this.closed = true;
      if (this.hub.feeds.get(this.runId) === this) this.hub.feeds.delete(this.runId);
      this._release();
    }
  }

  /** True when the events before `finish` are all here (none left the daemon unseen). */
  whole() {
    const last = this.events.length ? this.events[this.events.length - 1].seq : 0;
    return this.finish.seq === last + 1;
  }
}

/** One viewer of a shared run subscription (see `followRun`). */
export class RunViewer {
  constructor(feed, afterSeq) {
    this.feed = feed;
    this.runId = feed.runId;
    this.afterSeq = afterSeq;
    /** The last seq given to this viewer (its own position). */
    this.lastSeq = afterSeq;
    this.cursor = 0;
    this.done = false;
    this.waiter = null;
  }

  _wake() {
    const w = this.waiter;
    this.waiter = null;
    if (w) w();
  }

  async next() {
    const f = this.feed;
    for (;;) {
      if (this.done) return { value: undefined, done: true };
      while (this.cursor < f.events.length && f.events[this.cursor].seq <= this.lastSeq) this.cursor += 1;
      if (this.cursor < f.events.length) {
        const ev = f.events[this.cursor];
        this.cursor += 1;
        this.lastSeq = ev.seq;
        return { value: ev, done: false };
      }
      if (f.finish) {
        const complete = f.whole() && f.finish.seq > this.afterSeq;
        this.lastSeq = Math.max(this.lastSeq, f.finish.seq);
        this.close();
        return { value: { ...f.finish, complete }, done: false };
      }
      if (f.error) {
        this.close();
        throw f.error;
      }
      await new Promise((resolve) => { this.waiter = resolve; });
    }
  }

  /** Stop following. Idempotent. */
  async close() {
    if (this.done) return false;
    this.done = true;
    this._wake();
    this.feed.leave(this);
    return true;
  }

  async return() {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

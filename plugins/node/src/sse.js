// Server-Sent Events for a browser: a run's events, resumable by Last-Event-ID.
import { whileReconnecting } from './client.js';
import { Busy, ConnectionClosed, InvalidParams, NotFound } from './errors.js';
import { followRun } from './fanout.js';

/** Statuses of a run that has ended (stream.get). */
export const ENDED = new Set(['committed', 'aborted', 'expired', 'abandoned']);

export const SSE_HEADERS = Object.freeze({
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache, no-transform',
  connection: 'keep-alive',
  'x-accel-buffering': 'no',
});

/** One SSE message. `data` is JSON on one line (JSON.stringify never writes a newline). */
export function sseMessage(event, data, id) {
  return `${id === undefined ? '' : `id: ${id}\n`}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

/** The seq a browser saw last: the `Last-Event-ID` header (EventSource sends it when it
 * reconnects by itself), else a `lastEventId` query parameter (a page that reopens its own
 * EventSource can pass it so), else 0. Throws `InvalidParams` for anything but a whole number. */
export function lastEventId(req) {
  let raw = req.headers?.['last-event-id'];
  if (raw === undefined || raw === '') {
    const q = new URL(req.url ?? '/', 'http://x').searchParams.get('lastEventId');
    raw = q ?? '';
  }
  if (Array.isArray(raw)) raw = raw[0];
  raw = String(raw).trim();
  if (raw === '') return 0;
  if (!/^\d{1,15}$/.test(raw)) throw new InvalidParams('Last-Event-ID must be the seq of an event (a whole number)');
  return Number(raw);
}

function plain(res, status, text) {
  if (res.headersSent) {
    res.end();
    return;
  }
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
  res.end(text === undefined ? undefined : `${text}\n`);
}

/**
 * A request handler, `(req, res) => Promise`, for Node's `http` and Express-style servers, that
 * streams run `runId` (a string, or a function of the request) to a browser's `EventSource`:
 *
 * - Each event as `id: <seq>`, `event: <type>` (`text`, `tool_call_delta`, `tool_call_end`,
 *   `tool_call_cancel`, `stream_reset`, `interrupted`), `data: <the event + its seq>`, after
 *   the browser's `Last-Event-ID`: a reconnecting EventSource gets exactly the events it has
 *   not seen. `stream_reset` means "drop this run's text so far"; `tool_call_cancel` "this call
 *   was cut off and will not run".
 * - `finish` (`{status, seq, final_message}`) ends it; the response closes and the browser's
 *   automatic reconnect then gets 204 (which stops EventSource for good).
 * - A run that ended before this connection saw its events (a page opened or refreshed after
 *   the commit) gets one `final` event (`{status, seq, final_message}`): the stored final
 *   message, never a replay. The page shows it in place of anything it holds for the run.
 * - 404 for a run that never existed, 400 for a bad run id or Last-Event-ID.
 * - A `: ping` comment every `heartbeatMs` (15 s) keeps proxies from closing a quiet stream;
 *   `retryMs` (1 s) is the reconnect delay the browser is told. If the daemon restarts, the
 *   client reconnects and the subscription goes on after the last seq written; if it cannot
 *   (past the client's `reconnectTimeoutMs`), the response ends and the browser reconnects
 *   with its Last-Event-ID.
 */
export function sseHandler(client, runId, { heartbeatMs = 15_000, retryMs = 1000, headers = {} } = {}) {
  return async function holdfastSse(req, res) {
    let after;
    let rid;
    try {
      rid = typeof runId === 'function' ? await runId(req) : runId;
      after = lastEventId(req);
    } catch (e) {
      plain(res, 400, e.message);
      return;
    }
    let gone = false;
    res.on?.('close', () => { gone = true; });
    // A call in flight when the daemon restarts fails with ConnectionClosed: asked again while
    // the client reconnects (for its reconnectTimeoutMs), so a viewer arriving during a
    // restart sees nothing of it.
    const retrying = (op) => whileReconnecting(op, client.reconnectTimeoutMs ?? 30_000, () => !gone);
    let state;
    try {
      state = await retrying(() => client.streamGet(rid));
    } catch (e) {
      if (e instanceof NotFound) plain(res, 404, `no run ${JSON.stringify(String(rid))}`);
      else if (e instanceof InvalidParams) plain(res, 400, e.message);
      else if ((e instanceof ConnectionClosed || e instanceof Busy) && !res.headersSent) {
        // The daemon stays unreachable (or busy): a non-200 would make EventSource give up for
        // good, so the browser is told to come back (`retry`) with an `error` event to show.
        res.writeHead(200, { ...SSE_HEADERS, ...headers });
        res.end(`retry: ${retryMs}\n\n${sseMessage('error', { kind: e.kind ?? 'storage', message: `holdfast: ${e.message}` })}`);
      } else plain(res, 503, `holdfast: ${e.message}`);
      return;
    }
    if (ENDED.has(state.status) && after === state.finish_seq) {
      plain(res, 204); // the browser saw the end: stop reconnecting
      return;
    }

    let open = true;
    let sub = null;
    const stop = () => {
      open = false;
      if (sub) sub.close().catch(() => {});
    };
    req.on?.('close', stop);
    res.on?.('close', stop);
    const write = (chunk) => {
      if (!open) return Promise.resolve();
      const ok = res.write(chunk);
      if (typeof res.flush === 'function') res.flush(); // compression middleware
      if (ok) return Promise.resolve();
      return new Promise((resolve) => {
        const done = () => {
          res.off?.('drain', done);
          res.off?.('close', done);
          resolve();
        };
        res.on('drain', done);
        res.on('close', done);
      });
    };
    const final = async (status, seq) => {
      let message = null;
      if (status === 'committed') {
        try {
          message = (await retrying(() => client.streamGet(rid, { reveal: true }))).final_message ?? null;
        } catch {
          message = null;
        }
      }
      return { status, seq, final_message: message };
    };

    res.writeHead(200, { ...SSE_HEADERS, ...headers });
    res.flushHeaders?.();
    const heartbeat = setInterval(() => { write(': ping\n\n'); }, heartbeatMs);
    try {
      await write(`retry: ${retryMs}\n\n`);
      if (ENDED.has(state.status)) {
        await write(sseMessage('final', await final(state.status, state.finish_seq), state.finish_seq));
        return;
      }
      // One daemon subscription per run for every viewer of this client (fanout.js): this
      // viewer reads it from its own Last-Event-ID.
      sub = followRun(client, rid, after);
      if (!open) {
        await sub.close();
        return;
      }
      for await (const ev of sub) {
        if (!open) break;
        const event = ev.event ?? {};
        if (event.type === 'finish') {
          // `complete` false: this viewer was not given every event before the end (the run
          // ended while nobody followed it, or its Last-Event-ID was past the run's end). The
          // page gets the stored message instead, to replace what it holds.
          const kind = ev.complete ? 'finish' : 'final';
          await write(sseMessage(kind, await final(event.status, ev.seq), ev.seq));
          break;
        }
        await write(sseMessage(event.type, { ...event, seq: ev.seq }, ev.seq));
      }
    } catch (e) {
      // The daemon went away for longer than the client retries, or refused the subscription:
      // say so (an `error` event with `data`: {kind, message}), then end the response; the
      // browser reconnects with its Last-Event-ID after `retry`.
      await write(`retry: ${retryMs}\n\n${sseMessage('error', { kind: e?.kind ?? 'error', message: String(e?.message ?? e) })}`);
    } finally {
      clearInterval(heartbeat);
      if (open) res.end();
      stop();
    }
  };
}

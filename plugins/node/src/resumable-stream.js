// The API of the `resumable-stream` package, kept by holdfast instead of Redis and one
// process's memory: switch the import, pass a holdfast client, and a stream survives the
// producing process, resumes from the first chunk on any host that reaches the daemon, and a
// finished stream is never replayed (its final message is committed in the same step).
//
//   import { createResumableStreamContext } from 'holdfast-client/resumable-stream';
//   const streamContext = createResumableStreamContext({ client, waitUntil: null });
import { Conflict, NotFound } from './errors.js';
import { persistUIMessageStream, uiMessageChunks } from './ai.js';
import { StreamProducer, abortRefused } from './producer.js';
import { ENDED } from './sse.js';

/**
 * `options.client`: a holdfast `Client` (required). `options.waitUntil`: as in
 * resumable-stream (`after` from Next.js, or null on a server that runs on); the background
 * work of each new stream is passed to it. `onError(error, streamId)`: a stream that could not
 * be kept (default: one line on stderr, never a secret). `stallTimeoutMs`: a UI stream silent
 * that long ends its run (`persistUIMessageStream`). The stream ids are the run ids
 * (1-128 of `A-Za-z0-9-_.:`). The streams carry the AI SDK's UI message stream (SSE text), as resumable-stream's
 * do when used with `consumeSseStream`.
 */
export function createResumableStreamContext({
  client, waitUntil = null, threadId, model, stallTimeoutMs = null,
  onError = (e, streamId) => console.error(`holdfast: stream ${streamId} could not be kept: ${e.message}`),
} = {}) {
  if (!client) throw new TypeError('createResumableStreamContext needs { client }: a holdfast Client');

  async function hasExistingStream(streamId) {
    try {
      const state = await client.streamGet(streamId);
      return ENDED.has(state.status) ? 'DONE' : true;
    } catch (e) {
      if (e instanceof NotFound) return null;
      throw e;
    }
  }

  async function resumeExistingStream(streamId, skipCharacters) {
    return uiMessageChunks(client, streamId, { sse: true, skipCharacters });
  }

  /** Let go of a stream that will not be kept: a `tee()` branch nobody reads buffers the whole
   * answer in memory. */
  function discard(makeStream) {
    try {
      const s = typeof makeStream === 'function' ? makeStream() : makeStream;
      Promise.resolve(s?.cancel?.()).catch(() => {});
    } catch {
      // nothing to let go
    }
  }

  /** Persist `stream` with `producer` (a begun run); never rejects: failures go to onError. */
  function keep(streamId, producer, stream) {
    const done = persistUIMessageStream(client, streamId, stream, { producer, stallTimeoutMs })
      .then(() => {}, (e) => onError(e, streamId));
    if (waitUntil) waitUntil(done);
    return done;
  }

  async function createNew(streamId, makeStream, skipCharacters) {
    let producer;
    try {
      // Begin first: a second producer of the same id is refused, never interleaved.
      producer = await StreamProducer.begin(client, streamId, { threadId, model });
    } catch (e) {
      discard(makeStream);
      if (e instanceof Conflict) return (await hasExistingStream(streamId)) === 'DONE' ? null : resumeExistingStream(streamId, skipCharacters);
      throw e;
    }
    let stream;
    try {
      stream = makeStream();
    } catch (e) {
      // No stream will come: the run just begun is ended, not left streaming.
      await abortRefused(producer, 'no stream to keep', e);
      throw e;
    }
    keep(streamId, producer, stream);
    const out = await uiMessageChunks(client, streamId, { sse: true, skipCharacters });
    return out ?? null;
  }

  /** The AI SDK calls `consumeSseStream` without awaiting or catching what it returns, so a
   * rejection here (a run id the daemon refuses, `Sealed`, the daemon unreachable) would be an
   * unhandled rejection, which ends a Node server. The promise returned is therefore handled
   * already (its failure goes to `onError`); a caller that awaits it still sees the rejection. */
  function createNewResumableStream(streamId, makeStream, skipCharacters) {
    const p = createNew(streamId, makeStream, skipCharacters);
    p.catch((e) => onError(e, streamId));
    return p;
  }

  /** Begin run `streamId` now, before the answer is streamed, so a refusal can be the HTTP
   * request's answer (useChat shows a failed POST as its error). Resolves to `consume`, the
   * `consumeSseStream` to pass: `({stream}) => ...` keeps the stream and never rejects;
   * `consume.abort(reason)` ends the run when no stream will come (streamText threw). */
  async function beginNewResumableStream(streamId) {
    const producer = await StreamProducer.begin(client, streamId, { threadId, model });
    let used = false;
    const consume = ({ stream }) => {
      if (used) {
        discard(stream);
        return Promise.resolve();
      }
      used = true;
      return keep(streamId, producer, stream);
    };
    consume.abort = async (reason = 'the answer was never streamed') => {
      if (used) return;
      used = true;
      await producer.abort(reason).catch((e) => onError(e, streamId));
    };
    return consume;
  }

  async function resumableStream(streamId, makeStream, skipCharacters) {
    const existing = await hasExistingStream(streamId);
    if (existing === 'DONE') return null;
    if (existing === true) return resumeExistingStream(streamId, skipCharacters);
    return createNewResumableStream(streamId, makeStream, skipCharacters);
  }

  return {
    resumableStream, resumeExistingStream, createNewResumableStream, hasExistingStream,
    beginNewResumableStream,
  };
}

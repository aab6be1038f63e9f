// The API of the `resumable-stream` package, kept by holdfast instead of Redis and one
// process's memory: switch the import, pass a holdfast client, and a stream survives the
// producing process, resumes from the first chunk on any host that reaches the daemon, and a
// finished stream is never replayed (its final message is committed in the same step).
//
//   import { createResumableStreamContext } from 'holdfast-client/resumable-stream';
//   const streamContext = createResumableStreamContext({ client, waitUntil: null });
import { Conflict, NotFound } from './errors.js';
import { persistUIMessageStream, uiMessageChunks } from './ai.js';
import { StreamProducer } from './producer.js';
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

  async function createNewResumableStream(streamId, makeStream, skipCharacters) {
    let work;
    try {
      // Begin first: a second producer of the same id is refused, never interleaved.
      const producer = await StreamProducer.begin(client, streamId, { threadId, model });
      work = persistUIMessageStream(client, streamId, makeStream(), { producer, stallTimeoutMs });
    } catch (e) {
      if (e instanceof Conflict) return (await hasExistingStream(streamId)) === 'DONE' ? null : resumeExistingStream(streamId, skipCharacters);
      throw e;
    }
    const done = work.catch((e) => onError(e, streamId));
    if (waitUntil) waitUntil(done);
    const out = await uiMessageChunks(client, streamId, { sse: true, skipCharacters });
    return out ?? null;
  }

  async function resumableStream(streamId, makeStream, skipCharacters) {
    const existing = await hasExistingStream(streamId);
    if (existing === 'DONE') return null;
    if (existing === true) return resumeExistingStream(streamId, skipCharacters);
    return createNewResumableStream(streamId, makeStream, skipCharacters);
  }

  return { resumableStream, resumeExistingStream, createNewResumableStream, hasExistingStream };
}

// holdfast-client for Node: the daemon's client, the stream producer, and SSE for browsers.
export {
  Client, CredentialRecord, Subscription, PROTOCOL_VERSION, MAX_LINE_BYTES, MAX_FRAME_BYTES, toWellFormed,
} from './client.js';
export {
  KINDS, HoldfastError, InvalidParams, NotFound, Conflict, Forbidden, Sealed, IntegrityError,
  StorageError, Busy, Unsupported, ConnectionClosed, CallTimeout, FrameTooLarge, errorFromResponse,
} from './errors.js';
export { defaultSocketPath } from './paths.js';
export { StreamProducer, MAX_BATCH_EVENTS, CONTINUATIONS } from './producer.js';
export { RecoveringStream, StreamStalled, StreamFailed, SplitToolCall, classifyError } from './recovering.js';
export { followRun, followStats, RunViewer } from './fanout.js';
export { sseHandler, sseMessage, lastEventId, SSE_HEADERS, ENDED } from './sse.js';

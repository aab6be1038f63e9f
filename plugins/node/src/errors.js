// Errors: one class per stable kind of the protocol (error.data.kind), and the scrubbing that
// keeps a request's strings out of them.

/** The stable error kinds (`error.data.kind`). */
export const KINDS = Object.freeze([
  'invalid_params', 'not_found', 'conflict', 'forbidden', 'sealed', 'integrity', 'storage',
  'busy', 'unsupported',
]);

// The JSON-RPC code of each kind, for an answer that lacks data.kind (src/ipc/protocol.rs).
const KIND_OF_CODE = new Map([
  [-32700, 'invalid_params'], [-32600, 'invalid_params'], [-32602, 'invalid_params'],
  [-32601, 'unsupported'], [-32008, 'unsupported'], [-32001, 'not_found'],
  [-32002, 'conflict'], [-32003, 'forbidden'], [-32004, 'sealed'], [-32005, 'integrity'],
  [-32006, 'storage'], [-32603, 'storage'], [-32007, 'busy'],
]);

/**
 * An error from the daemon (or the connection to it). `kind` is one of KINDS, `code` the
 * JSON-RPC code (0 for client-side errors), `message` never holds a secret, `data` the error's
 * data object (`kind` plus detail such as `generation` on a conflict).
 */
export class HoldfastError extends Error {
  constructor(message, { kind, code = 0, data } = {}) {
    super(message);
    this.name = new.target.name;
    this.kind = kind ?? new.target.kind ?? 'storage';
    this.code = code;
    this.data = data ? { ...data } : { kind: this.kind };
  }
}
HoldfastError.kind = 'storage';

export class InvalidParams extends HoldfastError {}
InvalidParams.kind = 'invalid_params';
export class NotFound extends HoldfastError {}
NotFound.kind = 'not_found';
export class Conflict extends HoldfastError {}
Conflict.kind = 'conflict';
export class Forbidden extends HoldfastError {}
Forbidden.kind = 'forbidden';
export class Sealed extends HoldfastError {}
Sealed.kind = 'sealed';
export class IntegrityError extends HoldfastError {}
IntegrityError.kind = 'integrity';
export class StorageError extends HoldfastError {}
StorageError.kind = 'storage';
export class Busy extends HoldfastError {}
Busy.kind = 'busy';
export class Unsupported extends HoldfastError {}
Unsupported.kind = 'unsupported';

/** The connection to the daemon failed or closed (kind `storage`, code 0). A call that was in
 * flight may or may not have been carried out. */
export class ConnectionClosed extends StorageError {}
/** No answer within the client's timeout (kind `busy`, code 0); the daemon may still do it. */
export class CallTimeout extends Busy {}
/** A request whose line would exceed the daemon's frame cap (`maxFrameBytes`, 1 MiB): refused
 * by the client before a byte of it is sent (the daemon would close the connection), never
 * retried (kind `invalid_params`, code 0). `bytes` and `maxFrameBytes` say by how much. */
export class FrameTooLarge extends InvalidParams {
  constructor(message, { bytes, maxFrameBytes } = {}) {
    super(message, { data: { kind: 'invalid_params', bytes, max_frame_bytes: maxFrameBytes } });
    this.bytes = bytes;
    this.maxFrameBytes = maxFrameBytes;
  }
}

const CLASSES = {
  invalid_params: InvalidParams, not_found: NotFound, conflict: Conflict, forbidden: Forbidden,
  sealed: Sealed, integrity: IntegrityError, storage: StorageError, busy: Busy,
  unsupported: Unsupported,
};

/** The error for a JSON-RPC `error` object. */
export function errorFromResponse(err) {
  if (err === null || typeof err !== 'object') {
    return new StorageError('malformed error response from the daemon');
  }
  const code = Number.isInteger(err.code) ? err.code : 0;
  const data = err.data !== null && typeof err.data === 'object' && !Array.isArray(err.data)
    ? { ...err.data } : {};
  let kind = data.kind;
  if (!Object.hasOwn(CLASSES, kind)) kind = KIND_OF_CODE.get(code) ?? 'storage';
  data.kind = kind;
  const message = typeof err.message === 'string' ? err.message : 'error';
  return new CLASSES[kind](message, { kind, code, data });
}

// Names that may appear in params and are never secret: they stay in messages ("run_id must
// be 1-128 characters" is useless as "<redacted> must be …"). Every parameter and event field
// of the protocol (docs/protocol.md), and hive's credential fields.
const FIELD_NAMES = new Set(`store id value credential if_generation ttl_ms repair client plugin
  protocol credential_type keys name expires_at metadata provider_id last_refreshed auto_refresh
  last_used use_count description tags created_at updated_at holdfast_generation
  run_id stream_id thread_id model takeover seq events type text arguments_delta
  tool_call_delta tool_call_end cause status message retry_after continuation
  fail_on_stale final_message content_from_stream reason after_seq reveal snapshot
  partial_text completed_tool_calls in_flight_tool upstream_model subscription
  node_id detail step tool_call_id input result is_error since_ms until_ms
  older_than_days dry_run attempt success`.split(/\s+/).filter(Boolean));
const MIN_SCRUBBED = 6;

function sensitiveStrings(params) {
  const found = new Set();
  const plain = new Set([params.id, params.store, params.client, params.plugin,
    params.credential?.id, params.run_id, params.stream_id, params.thread_id, params.model]);
  const stack = [params];
  while (stack.length) {
    const v = stack.pop();
    if (typeof v === 'string') found.add(v);
    else if (Array.isArray(v)) stack.push(...v);
    else if (v !== null && typeof v === 'object') {
      for (const [k, item] of Object.entries(v)) {
        if (!FIELD_NAMES.has(k)) found.add(k);
        stack.push(item);
      }
    }
  }
  return [...found].filter((s) => s.length >= MIN_SCRUBBED && !plain.has(s))
    .sort((a, b) => b.length - a.length);
}

/** Defence in depth: the daemon's messages never hold a secret, but should one ever echo a
 * string this request carried (a value or a field name), it is cut out here. */
export function scrub(err, params) {
  const secrets = sensitiveStrings(params ?? {});
  if (!secrets.length) return err;
  const clean = (text) => secrets.reduce((t, s) => t.split(s).join('<redacted>'), text);
  const walk = (v) => {
    if (typeof v === 'string') return clean(v);
    if (Array.isArray(v)) return v.map(walk);
    if (v !== null && typeof v === 'object') {
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [clean(k), walk(x)]));
    }
    return v;
  };
  err.message = clean(err.message);
  err.data = walk(err.data);
  if (typeof err.stack === 'string') err.stack = clean(err.stack);
  return err;
}

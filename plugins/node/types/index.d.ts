// Types of holdfast-client (Node). The protocol: docs/protocol.md in the holdfast repository.
import type { IncomingMessage, ServerResponse } from 'node:http';

export const PROTOCOL_VERSION: 1;
export const MAX_LINE_BYTES: number;
/** The daemon's default cap on one request line (1 MiB). */
export const MAX_FRAME_BYTES: number;
/** `text` with its lone UTF-16 surrogates replaced by U+FFFD (what the client sends). */
export function toWellFormed(text: string): string;
export const MAX_BATCH_EVENTS: number;

export type ErrorKind =
  | 'invalid_params' | 'not_found' | 'conflict' | 'forbidden' | 'sealed' | 'integrity'
  | 'storage' | 'busy' | 'unsupported';
export const KINDS: readonly ErrorKind[];

export class HoldfastError extends Error {
  constructor(message: string, options?: { kind?: ErrorKind; code?: number; data?: Record<string, unknown> });
  kind: ErrorKind;
  /** The JSON-RPC code (0 for client-side errors). */
  code: number;
  data: { kind: ErrorKind; [k: string]: unknown };
}
export class InvalidParams extends HoldfastError {}
export class NotFound extends HoldfastError {}
export class Conflict extends HoldfastError {}
export class Forbidden extends HoldfastError {}
export class Sealed extends HoldfastError {}
export class IntegrityError extends HoldfastError {}
export class StorageError extends HoldfastError {}
export class Busy extends HoldfastError {}
export class Unsupported extends HoldfastError {}
export class ConnectionClosed extends StorageError {}
export class CallTimeout extends Busy {}
/** A request over the daemon's frame cap: refused before it is sent, never retried. */
export class FrameTooLarge extends InvalidParams {
  bytes: number;
  maxFrameBytes: number;
}
export function errorFromResponse(err: unknown): HoldfastError;

export function defaultSocketPath(): string;

export interface ClientOptions {
  socketPath?: string;
  /** A name for the daemon's logs. */
  client?: string;
  /** Bind this connection to a plugin grant from the daemon's config. */
  plugin?: string;
  /** Per call; null waits forever. Default 60000. */
  timeoutMs?: number | null;
  /** Connect again after the connection drops (default true). */
  reconnect?: boolean;
  /** How long to keep trying (default 30000). */
  reconnectTimeoutMs?: number;
  /** The longest request line sent (default: 1 MiB, the daemon's default cap). */
  maxFrameBytes?: number;
}

export interface Hello {
  server: string;
  version: string;
  protocol: number;
  connection: number;
  methods: string[];
  /** What this connection may touch: `runs` are the run-id patterns its stream.*, checkpoint.*
   * and run.* calls are limited to (`["*"]`: every run). */
  grant: { plugin: string | null; stores: string[]; runs: string[] };
  data_dir: string;
}

export interface CredentialKey {
  name?: string;
  value: string;
  expires_at?: string | null;
  metadata?: Record<string, unknown>;
}
export interface Credential {
  id: string;
  credential_type?: string;
  keys: Record<string, CredentialKey>;
  [field: string]: unknown;
}
/** A credential as the daemon returned it. Its values never serialize (`JSON.stringify`,
 * `util.inspect`, `String()`, spread, `structuredClone` show id, generation, type and key names
 * only); `value()` and `credential` give them on explicit access. */
export class CredentialRecord {
  /** The document with its values (explicit access: a plain object, do not log it). */
  readonly credential: Credential;
  generation: number;
  readonly id: string;
  /** The names of its keys (never their values). */
  readonly keyNames: string[];
  /** The value of key `name` (default `api_key`, else the only key). */
  value(name?: string): string | undefined;
  /** What `JSON.stringify` writes: no value. */
  toJSON(): { id: string; generation: number; keys: string[]; values: 'hidden'; credential_type?: string };
}
export interface CredentialSummary {
  id: string;
  generation: number;
  credential_type: string;
  key_names: string[];
  [field: string]: unknown;
}

export type ProducerEvent =
  | { type: 'text'; text: string }
  | { type: 'tool_call_delta'; id: string; name?: string; arguments_delta?: string }
  | { type: 'tool_call_end'; id: string };
export type RunEvent =
  | ProducerEvent
  | { type: 'tool_call_cancel'; id: string; name?: string; reason?: string }
  | { type: 'stream_reset'; reason?: string }
  /** `plan` and `wait_ms` are null for cause `producer_lost` (the producer's connection
   * closed without a commit or abort: no plan until one resumes). */
  | { type: 'interrupted'; cause: string; plan: Plan['plan'] | null; wait_ms: number | null; hint: unknown }
  | { type: 'finish'; status: 'committed' | 'aborted' | 'expired' | 'abandoned' };
export interface StreamEvent {
  subscription: number;
  run_id: string;
  seq: number;
  event: RunEvent;
}
export interface CredEvent {
  subscription?: number | null;
  type: 'cred.changed' | 'lease.released' | 'resync';
  store?: string;
  id?: string;
  generation?: number | null;
  deleted?: boolean;
  source?: 'daemon' | 'external';
  missed?: number | null;
  reason?: string;
}

export interface Plan {
  plan: 'R1' | 'R2' | 'R3' | 'R4' | 'fail';
  cause: string;
  reason: string;
  assistant_prefix: string;
  completed: Array<{ id: string; name: string; arguments: unknown; execution?: string }>;
  cancelled: Array<{ id: string; name: string; partial_arguments: string }>;
  wait_ms: number;
  next_seq: number;
  /** R1/R3: how the next attempt continues the text (null for the other plans). */
  continuation?: Continuation | null;
  [field: string]: unknown;
}

export interface Begun { stream_id: string; epoch: number; next_seq: number }
export interface Resumed extends Begun { checkpoint: Record<string, unknown>; plan: Plan }
export interface Ended { run_id: string; status: 'committed' | 'aborted'; finish_seq: number; events?: number; confirmed?: boolean }
export interface StreamState {
  run_id: string;
  status: 'streaming' | 'interrupted' | 'failed' | 'committed' | 'aborted' | 'expired';
  next_seq?: number;
  finish_seq?: number;
  final_message?: Record<string, unknown>;
  [field: string]: unknown;
}

export class Subscription<E = StreamEvent | CredEvent> implements AsyncIterableIterator<E> {
  readonly kind: 'stream' | 'cred';
  /** The daemon's number for it on the current connection (null while reconnecting). */
  readonly id: number | null;
  readonly runId: string | null;
  /** The last seq delivered (stream subscriptions). */
  readonly lastSeq: number | null;
  /** Events dropped from a full watch queue. */
  readonly dropped: number;
  next(): Promise<IteratorResult<E>>;
  return(): Promise<IteratorResult<E>>;
  /** Unsubscribe; true if it was open at the daemon. */
  close(): Promise<boolean>;
  [Symbol.asyncIterator](): AsyncIterableIterator<E>;
}

type Json = Record<string, unknown>;

export class Client {
  static connect(options?: ClientOptions): Promise<Client>;
  constructor(options?: ClientOptions);
  readonly socketPath: string;
  readonly hello: Hello | null;
  readonly reconnects: number;
  /** The longest request line the client sends (see ClientOptions.maxFrameBytes). */
  readonly maxFrameBytes: number;
  readonly closed: boolean;
  call<T = any>(method: string, params?: Json): Promise<T>;
  close(): void;
  [Symbol.asyncDispose](): Promise<void>;

  subscribeStream(runId: string, afterSeq?: number): Promise<Subscription<StreamEvent>>;
  watch(store?: string, options?: { maxQueued?: number }): Promise<Subscription<CredEvent>>;

  get(id: string, store?: string): Promise<CredentialRecord>;
  set(credential: Credential, options?: { store?: string; ifGeneration?: number }): Promise<{ id: string; generation: number }>;
  setValue(id: string, value: string, options?: { store?: string; ifGeneration?: number }): Promise<{ id: string; generation: number }>;
  delete(id: string, store?: string): Promise<boolean>;
  list(store?: string): Promise<CredentialSummary[]>;
  exists(id: string, store?: string): Promise<boolean>;
  refreshLease(id: string, ttlMs: number, store?: string): Promise<{ granted: boolean; lease_id?: number; expires_in_ms: number; hint?: string }>;
  releaseLease(id: string, store?: string): Promise<boolean>;
  status(): Promise<Json>;

  streamBegin(runId: string, options?: { threadId?: string; model?: string; takeover?: boolean }): Promise<Begun>;
  streamAppend(runId: string, streamId: string, seq: number, events: ProducerEvent[]): Promise<{ acked_seq: number; duplicate?: true }>;
  streamInterrupt(runId: string, streamId: string, cause: string | { status?: number; message?: string; retry_after?: string | number }, options?: { continuation?: Continuation }): Promise<Plan>;
  streamResume(runId: string, options?: { model?: string; threadId?: string; failOnStale?: boolean; continuation?: Continuation }): Promise<Resumed>;
  streamCommit(runId: string, streamId: string, finalMessage: unknown, options?: { contentFromStream?: boolean }): Promise<Ended>;
  streamAbort(runId: string, streamId: string, reason?: string): Promise<Ended>;
  streamGet(runId: string, options?: { reveal?: boolean }): Promise<StreamState>;
  streamList(): Promise<StreamState[]>;
  checkpointPut(runId: string, snapshot: Json): Promise<{ run_id: string; updated_at_ms: number }>;
  checkpointGet(runId: string): Promise<Json>;
  checkpointDelete(runId: string): Promise<boolean>;

  runLogNode(runId: string, detail: Json): Promise<{ seq: number; written: boolean; replaced: boolean }>;
  runEnsureNode(runId: string, nodeId: string, detail?: Json): Promise<{ seq: number; written: boolean }>;
  runLogStep(runId: string, step: Json): Promise<{ seq: number; written: boolean; replaced: boolean }>;
  runToolBegin(runId: string, toolCallId: string, name: string, input?: unknown): Promise<{ seq: number; written: boolean }>;
  runToolEnd(runId: string, toolCallId: string, options?: { result?: unknown; isError?: boolean }): Promise<{ seq: number; written: boolean }>;
  runEnd(runId: string, status: 'success' | 'failure' | 'degraded' | 'cancelled' | 'timeout', fields?: Json): Promise<{ summary: Json; written: boolean }>;
  runGet(runId: string): Promise<Json>;
  runList(options?: { status?: string; sinceMs?: number; untilMs?: number }): Promise<Json[]>;
  runPrune(olderThanDays: number, options?: { dryRun?: boolean }): Promise<{ pruned: Array<{ run_id: string; last_activity_ms: number }>; dry_run: boolean }>;
}

/** How a producer continues the text after an R1/R3 plan: `exact` (nothing trimmed) or
 * `restated` (the model may restate the prefix's end; the restatement is removed). */
export type Continuation = 'exact' | 'restated';
export const CONTINUATIONS: readonly Continuation[];

export class StreamProducer {
  static begin(client: Client, runId: string, options?: { threadId?: string; model?: string; takeover?: boolean; retryTimeoutMs?: number; continuation?: Continuation }): Promise<StreamProducer>;
  static resume(client: Client, runId: string, options?: { model?: string; threadId?: string; failOnStale?: boolean; retryTimeoutMs?: number; continuation?: Continuation }): Promise<StreamProducer>;
  readonly continuation: Continuation;
  readonly runId: string;
  readonly streamId: string;
  readonly nextSeq: number;
  /** The seq the next event handed to `append` gets (events in flight and queued counted). */
  readonly handedSeq: number;
  readonly ackedSeq: number;
  /** The error that failed an append (every later one fails with it), or null. */
  readonly failed: Error | null;
  /** The plan of the last interrupt or of the resume. */
  readonly plan: Plan | null;
  readonly checkpoint: Json | null;
  readonly appends: number;
  readonly events: number;
  append(events: ProducerEvent | ProducerEvent[]): Promise<number>;
  text(text: string): Promise<number>;
  flush(): Promise<void>;
  interrupt(cause: string | { status?: number; message?: string; retry_after?: string | number }): Promise<Plan>;
  commit(finalMessage: unknown, options?: { contentFromStream?: boolean }): Promise<Ended>;
  abort(reason?: string): Promise<Ended>;
}

/** One event of a run as its subscribers see it. */
export interface RenderedEvent {
  seq: number;
  type: string;
  data: Json;
  /** The text of a `text` event ('' otherwise). */
  text: string;
}

export interface RecoveringStreamOptions {
  reopen: (prefix: string | null) => unknown;
  model?: string;
  threadId?: string;
  resume?: boolean;
  takeover?: boolean;
  afterSeq?: number;
  continuation?: Continuation;
  stallTimeoutMs?: number | null;
  classify?: (err: unknown, midStream: boolean) => string | Json | null | undefined;
  sleep?: (ms: number) => Promise<unknown>;
}

export class RecoveringStream implements AsyncIterable<RenderedEvent> {
  constructor(client: Client, runId: string, stream: unknown, options: RecoveringStreamOptions);
  [Symbol.asyncIterator](): AsyncIterator<RenderedEvent>;
  readonly text: string;
  readonly finalMessage: Json | null;
  readonly plans: Plan[];
  readonly toolCalls: Json[];
  readonly stopReason: string | null;
  readonly streamId: string | null;
}
export class StreamStalled extends Error {
  readonly stallTimeoutMs: number;
}
export class StreamFailed extends Error {
  readonly plan: Plan;
}
export class SplitToolCall extends Error {
  readonly hint: Json;
  readonly plan: Plan;
  readonly tool: string | null;
}
export function classifyError(err: unknown, midStream: boolean): string | Json | null;

export interface SseOptions {
  heartbeatMs?: number;
  retryMs?: number;
  headers?: Record<string, string>;
}
type Req = IncomingMessage | { headers: Record<string, string | string[] | undefined>; url?: string; on?: (...a: any[]) => unknown };
export function sseHandler(
  client: Client,
  runId: string | ((req: any) => string | Promise<string>),
  options?: SseOptions,
): (req: Req, res: ServerResponse | any) => Promise<void>;
export function sseMessage(event: string, data: unknown, id?: number | string): string;
export function lastEventId(req: Req): number;
export const SSE_HEADERS: Readonly<Record<string, string>>;
export const ENDED: ReadonlySet<string>;

/** An event of a run as a viewer of the shared subscription gets it; the `finish` carries
 * `complete`: false when this viewer was not given every event before it (show the stored
 * final message then). */
export interface ViewedEvent extends StreamEvent {
  complete?: boolean;
}
/** One viewer of a run on the client's shared subscription of it (`followRun`). */
export class RunViewer implements AsyncIterableIterator<ViewedEvent> {
  readonly runId: string;
  /** The last seq given to this viewer. */
  readonly lastSeq: number;
  next(): Promise<IteratorResult<ViewedEvent>>;
  return(): Promise<IteratorResult<ViewedEvent>>;
  /** Stop following; the shared subscription ends with its last viewer. */
  close(): Promise<boolean>;
  [Symbol.asyncIterator](): AsyncIterableIterator<ViewedEvent>;
}
/** Follow run `runId` after `afterSeq`: every viewer of a run on one client shares one daemon
 * subscription (runs past the connection's 16 use further connections of the client). */
export function followRun(client: Client, runId: string, afterSeq?: number): RunViewer;
export function followStats(client: Client): { runs: number; viewers: number; connections: number };

import type { Client } from './index.js';

export interface CreateResumableStreamContextOptions {
  client: Client;
  waitUntil?: ((promise: Promise<unknown>) => void) | null;
  threadId?: string;
  model?: string;
  /** A UI stream silent this long ends its run (interrupted `stalled`, then aborted). */
  stallTimeoutMs?: number | null;
  onError?: (error: Error, streamId: string) => void;
}

/** resumable-stream's ResumableStreamContext, kept by holdfast. */
export interface ResumableStreamContext {
  resumableStream(streamId: string, makeStream: () => ReadableStream<string>, skipCharacters?: number): Promise<ReadableStream<string> | null>;
  resumeExistingStream(streamId: string, skipCharacters?: number): Promise<ReadableStream<string> | null | undefined>;
  createNewResumableStream(streamId: string, makeStream: () => ReadableStream<string>, skipCharacters?: number): Promise<ReadableStream<string> | null>;
  hasExistingStream(streamId: string): Promise<null | true | 'DONE'>;
  /** Begin the run now (a refusal rejects here, before any answer is sent); resolves to the
   * `consumeSseStream` to pass to the AI SDK, which never rejects. */
  beginNewResumableStream(streamId: string): Promise<ConsumeSseStream>;
}

/** A `consumeSseStream` for the AI SDK: keeps the stream, never rejects (failures go to
 * `onError`). `abort(reason)` ends the begun run when no stream will come. */
export interface ConsumeSseStream {
  (options: { stream: ReadableStream<string> }): Promise<void>;
  abort(reason?: string): Promise<void>;
}

export function createResumableStreamContext(options: CreateResumableStreamContextOptions): ResumableStreamContext;

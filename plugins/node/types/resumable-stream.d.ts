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
}

export function createResumableStreamContext(options: CreateResumableStreamContextOptions): ResumableStreamContext;

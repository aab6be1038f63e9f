import type { Client, StreamProducer } from './index.js';

/** A UI message chunk of the AI SDK (`ai`'s UIMessageChunk); kept loose so any major works. */
export type UIChunk = { type: string; [field: string]: unknown };

export const UI_MESSAGE_STREAM_HEADERS: Readonly<Record<string, string>>;
export function sseData(chunk: UIChunk): string;

export class UIChunkEncoder {
  constructor(messageId: string);
  encode(event: { type: string; [field: string]: unknown }): UIChunk[];
}

export function uiMessageChunks(client: Client, runId: string, options: { sse: true; messageId?: string; skipCharacters?: number }): Promise<ReadableStream<string> | null | undefined>;
export function uiMessageChunks(client: Client, runId: string, options?: { sse?: false; messageId?: string }): Promise<ReadableStream<UIChunk> | null | undefined>;

export function persistUIMessageStream(
  client: Client,
  runId: string,
  stream: AsyncIterable<UIChunk | string | Uint8Array> | Iterable<UIChunk | string | Uint8Array>,
  options?: { threadId?: string; model?: string; producer?: StreamProducer; stallTimeoutMs?: number | null },
): Promise<{ status: 'committed' | 'aborted'; runId: string; events: number; appends: number; skipped: Record<string, number> }>;

export type ToolPartState = 'input-streaming' | 'input-available' | 'output-available' | 'output-error';
/** The fields of a tool part of the AI SDK's UIMessage that a stored message keeps. */
interface ToolPartFields {
  toolCallId: string;
  state: ToolPartState;
  input?: unknown;
  output?: unknown;
  errorText?: string;
  providerExecuted?: boolean;
  preliminary?: boolean;
  title?: string;
  callProviderMetadata?: Record<string, unknown>;
  resultProviderMetadata?: Record<string, unknown>;
}
/** An AI SDK `UIMessage` (assignable to `ai`'s, with the part types it kept). */
export interface HoldfastUIMessage {
  id: string;
  role: 'assistant';
  parts: Array<
    | { type: 'step-start' }
    | { type: 'text'; text: string; state?: 'streaming' | 'done'; providerMetadata?: Record<string, unknown> }
    | ({ type: `tool-${string}` } & ToolPartFields)
    | ({ type: 'dynamic-tool'; toolName: string } & ToolPartFields)
  >;
}
/** The committed message of run `runId` as the UIMessage `readUIMessageStream` built live
 * (for a run kept by `persistUIMessageStream`), or null while it is not committed. */
export function finalUIMessage(client: Client, runId: string): Promise<HoldfastUIMessage | null>;

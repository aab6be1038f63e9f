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

export interface HoldfastUIMessage {
  id: string;
  role: 'assistant';
  parts: Array<
    | { type: 'step-start' }
    | { type: 'text'; text: string; state: 'done' }
    | { type: 'dynamic-tool'; toolName: string; toolCallId: string; state: 'input-available'; input: unknown }
  >;
}
export function finalUIMessage(client: Client, runId: string): Promise<HoldfastUIMessage | null>;

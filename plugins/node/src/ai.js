// The Vercel AI SDK's UI message stream (the `ai` package, v5 to v7: "data: <chunk JSON>" SSE
// with the header `x-vercel-ai-ui-message-stream: v1`), kept durable by holdfast.
//
// Writing: `persistUIMessageStream` reads the UI message chunks a `streamText` result sends to
// the browser (objects, or the SSE text `consumeSseStream` hands over) and appends what a
// resumed page needs — text deltas and tool-call inputs — as holdfast events; `finish` commits
// the final message, `abort`/`error` abort the run. Reading: `uiMessageChunks` turns a run's
// events back into UI message chunks, from the start (the AI SDK's `resumeStreamIsReplay`:
// a reconnecting `useChat` rebuilds the message from the first chunk).
import { NotFound } from './errors.js';
import { followRun } from './fanout.js';
import { iterate } from './iterate.js';
import { StreamProducer, abortRefused } from './producer.js';
import { ENDED } from './sse.js';

export const UI_MESSAGE_STREAM_HEADERS = Object.freeze({
  'content-type': 'text/event-stream',
  'cache-control': 'no-cache',
  connection: 'keep-alive',
  'x-vercel-ai-ui-message-stream': 'v1',
  'x-accel-buffering': 'no',
});

/** Chunk types that carry nothing a resumed page needs beyond what holdfast rebuilds. */
const STRUCTURAL = new Set(['start', 'start-step', 'finish-step', 'text-start', 'text-end']);

/** One SSE message of the UI message stream. */
export const sseData = (chunk) => `data: ${JSON.stringify(chunk)}\n\n`;

/** Turns holdfast stream events into UI message chunks, one event at a time. */
export class UIChunkEncoder {
  constructor(messageId) {
    this.messageId = messageId;
    this.started = false;
    this.textId = null;
    this.texts = 0;
    this.tools = new Map(); // id -> {name, args}
  }

  _start(out) {
    if (!this.started) {
      this.started = true;
      out.push({ type: 'start', messageId: this.messageId }, { type: 'start-step' });
    }
  }

  _closeText(out) {
    if (this.textId !== null) {
      out.push({ type: 'text-end', id: this.textId });
      this.textId = null;
    }
  }

  /** The chunks for one holdfast event (`{type, ...}`), possibly none. */
  encode(event) {
    const out = [];
    this._start(out);
    switch (event.type) {
      case 'text':
        if (this.textId === null) {
          this.texts += 1;
          this.textId = `${this.messageId}-text-${this.texts}`;
          out.push({ type: 'text-start', id: this.textId });
        }
        out.push({ type: 'text-delta', id: this.textId, delta: event.text });
        break;
      case 'tool_call_delta': {
        this._closeText(out);
        let call = this.tools.get(event.id);
        if (!call) {
          call = { name: event.name ?? '', args: '' };
          this.tools.set(event.id, call);
          out.push({ type: 'tool-input-start', toolCallId: event.id, toolName: call.name });
        }
        if (event.arguments_delta) {
          call.args += event.arguments_delta;
          out.push({ type: 'tool-input-delta', toolCallId: event.id, inputTextDelta: event.arguments_delta });
        }
        break;
      }
      case 'tool_call_end': {
        const call = this.tools.get(event.id) ?? { name: '', args: '' };
        let input;
        try {
          input = call.args === '' ? {} : JSON.parse(call.args);
        } catch {
          input = call.args;
        }
        out.push({ type: 'tool-input-available', toolCallId: event.id, toolName: call.name, input });
        break;
      }
      case 'tool_call_cancel':
        this._closeText(out);
        out.push({
          type: 'tool-input-error', toolCallId: event.id, toolName: event.name ?? this.tools.get(event.id)?.name ?? '',
          input: this.tools.get(event.id)?.args ?? '',
          errorText: 'the stream broke before this call was complete: it was not run',
        });
        break;
      case 'stream_reset':
        // R4: the text so far is dropped and the request sent again.
        this._closeText(out);
        this.tools.clear();
        out.push({ type: 'reset-step' }, { type: 'start-step' });
        break;
      case 'interrupted':
        out.push({
          type: 'data-holdfast-interrupted', transient: true,
          data: { cause: event.cause, plan: event.plan, wait_ms: event.wait_ms },
        });
        break;
      case 'finish':
        this._closeText(out);
        if (event.status === 'committed') out.push({ type: 'finish-step' }, { type: 'finish' });
        else out.push({ type: 'abort', reason: event.status });
        break;
      default:
        break;
    }
    return out;
  }
}

/**
 * A run's UI message chunks from its first event, live until its end: a `ReadableStream` of
 * chunk objects, or (with `sse: true`) of the SSE text the AI SDK's client parses, ending
 * with `data: [DONE]`. Resolves to null for a run that has ended (the page has its final
 * message from history) and undefined for one that never existed — the shape of
 * `resumable-stream`'s `resumeExistingStream`.
 */
export async function uiMessageChunks(client, runId, { sse = false, messageId = runId, skipCharacters = 0 } = {}) {
  let state;
  try {
    state = await client.streamGet(runId);
  } catch (e) {
    if (e instanceof NotFound) return undefined;
    throw e;
  }
  if (ENDED.has(state.status)) return null;
  const enc = new UIChunkEncoder(messageId);
  let skip = sse ? skipCharacters : 0;
  // Subscribed on the first read, not before: a stream nobody reads (the one
  // createNewResumableStream returns beside consumeSseStream) holds nothing.
  let sub = null;
  let iter = null;
  return new ReadableStream({
    async pull(controller) {
      try {
        if (!sub) {
          // Shared with every other reader of the run on this client (fanout.js).
          sub = followRun(client, runId, 0);
          iter = sub[Symbol.asyncIterator]();
        }
        for (;;) {
          const r = await iter.next();
          if (r.done) {
            if (sse) controller.enqueue('data: [DONE]\n\n');
            controller.close();
            return;
          }
          const chunks = enc.encode(r.value.event ?? {});
          if (!chunks.length) continue;
          if (!sse) {
            for (const c of chunks) controller.enqueue(c);
            return;
          }
          let text = chunks.map(sseData).join('');
          if (skip > 0) {
            const n = Math.min(skip, text.length);
            text = text.slice(n);
            skip -= n;
            if (!text) continue;
          }
          controller.enqueue(text);
          return;
        }
      } catch (e) {
        controller.error(e);
      }
    },
    cancel() {
      return sub?.close();
    },
  }, { highWaterMark: 0 });
}

/**
 * The shape of the message the AI SDK's `readUIMessageStream` builds from a UI message stream —
 * its parts in order (step starts, each text part, each tool part as `tool-<name>` or
 * `dynamic-tool` with its state, input and output) — kept beside the final message so that
 * `finalUIMessage` gives the page the message it showed live. The text itself is not repeated:
 * `text` lists the runs of deltas as `[part index, characters]`, in the order the deltas came,
 * and their concatenation is the stored `content`.
 */
/** A tool input still streaming, read as the AI SDK's parsePartialJson would: the longest
 * reading of it as JSON once open strings and brackets are closed (undefined if none). */
function partialJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    // complete it below
  }
  const stack = [];
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (inString) {
      if (ch === '\\') i += 1;
      else if (ch === '"') inString = false;
    } else if (ch === '"') inString = true;
    else if (ch === '{' || ch === '[') stack.push(ch === '{' ? '}' : ']');
    else if (ch === '}' || ch === ']') stack.pop();
  }
  let head = inString ? `${text.replace(/\\$/, '')}"` : text;
  for (let k = 0; k < 4; k++) {
    try {
      return JSON.parse(head + [...stack].reverse().join(''));
    } catch {
      // drop a dangling ',' / ':' / key and try again
      head = head.replace(/\s*,\s*$/, '').replace(/,?\s*"(?:[^"\\]|\\.)*"\s*:?\s*$/, '').replace(/\s*:\s*$/, '');
    }
  }
  return undefined;
}

class UIMessageLayout {
  constructor() {
    this.parts = [];
    this.runs = []; // [[part index, text], ...]: the text deltas, in the order they came
    this.activeText = new Map(); // text id -> part index
    this.tools = new Map(); // toolCallId -> part index
    this.rawInputs = new Map(); // toolCallId -> the input text so far, while it streams
    this.reset = false; // a step was dropped (reset-step): its text is not in the content
  }

  /** The text of the message (the dropped steps' text left out). */
  get content() {
    return this.runs.map(([, t]) => t).join('');
  }

  /** The tool calls of the parts kept. */
  hasTool(toolCallId) {
    return this.tools.has(toolCallId);
  }

  handle(chunk) {
    switch (chunk.type) {
      case 'start-step':
        this.parts.push({ type: 'step-start' });
        return true;
      case 'text-start': {
        this.activeText.set(chunk.id, this.parts.length);
        this.parts.push({ type: 'text', state: 'streaming', providerMetadata: chunk.providerMetadata });
        return true;
      }
      case 'text-delta': {
        const i = this.activeText.get(chunk.id);
        if (i === undefined) return true;
        const part = this.parts[i];
        if (chunk.providerMetadata !== undefined) part.providerMetadata = chunk.providerMetadata;
        if (typeof chunk.delta !== 'string' || chunk.delta === '') return true;
        const last = this.runs[this.runs.length - 1];
        if (last && last[0] === i) last[1] += chunk.delta;
        else this.runs.push([i, chunk.delta]);
        return true;
      }
      case 'text-end': {
        const i = this.activeText.get(chunk.id);
        if (i === undefined) return true;
        const part = this.parts[i];
        part.state = 'done';
        if (chunk.citations != null) part.citations = chunk.citations;
        if (chunk.providerMetadata !== undefined) part.providerMetadata = chunk.providerMetadata;
        this.activeText.delete(chunk.id);
        return true;
      }
      case 'tool-input-start':
        this.rawInputs.set(chunk.toolCallId, { text: '', encoding: chunk.inputEncoding });
        this._tool(chunk, 'input-streaming', { input: undefined, inputEncoding: chunk.inputEncoding }, true);
        return true;
      case 'tool-input-delta': {
        // Read at the end only if it is still streaming then (see toJSON).
        const raw = this.rawInputs.get(chunk.toolCallId);
        if (raw && typeof chunk.inputTextDelta === 'string') raw.text += chunk.inputTextDelta;
        return true;
      }
      case 'tool-input-available':
        this.rawInputs.delete(chunk.toolCallId);
        this._tool(chunk, 'input-available', { input: chunk.input }, true);
        return true;
      case 'tool-approval-request': {
        const part = this.parts[this.tools.get(chunk.toolCallId)];
        if (!part) return true;
        part.state = 'approval-requested';
        part.approval = {
          id: chunk.approvalId,
          ...(chunk.approvalDescriptor != null ? { descriptor: chunk.approvalDescriptor } : {}),
          ...(Object.hasOwn(chunk, 'inputSchemaInput') ? { inputSchemaInput: chunk.inputSchemaInput } : {}),
          ...(chunk.reason != null ? { requestReason: chunk.reason } : {}),
          ...(chunk.isAutomatic === true ? { isAutomatic: true } : {}),
          ...(chunk.signature != null ? { signature: chunk.signature } : {}),
        };
        return true;
      }
      case 'tool-approval-response': {
        const part = this.parts.find((p) => p?.approval?.id === chunk.approvalId);
        if (!part) return true;
        part.state = 'approval-responded';
        part.approval = {
          ...part.approval, id: chunk.approvalId, approved: chunk.approved,
          ...(chunk.reason != null ? { reason: chunk.reason } : {}),
        };
        if (chunk.providerExecuted != null) part.providerExecuted = chunk.providerExecuted;
        if (chunk.providerMetadata != null) part.callProviderMetadata = chunk.providerMetadata;
        return true;
      }
      case 'tool-output-denied': {
        const part = this.parts[this.tools.get(chunk.toolCallId)];
        if (part) part.state = 'output-denied';
        return true;
      }
      case 'custom':
        this.parts.push({ type: 'custom', kind: chunk.kind, providerMetadata: chunk.providerMetadata });
        return true;
      case 'reset-step': {
        // The step is retried: its parts (after the last step start) and their text go, as
        // the AI SDK drops them.
        let cut = this.parts.length;
        while (cut > 0 && this.parts[cut - 1]?.type !== 'step-start') cut -= 1;
        if (cut < this.parts.length) {
          this.parts.splice(cut);
          const before = this.runs.length;
          this.runs = this.runs.filter(([i]) => i < cut);
          if (this.runs.length !== before) this.reset = true;
          for (const [id, i] of this.tools) if (i >= cut) this.tools.delete(id);
        }
        this.activeText.clear();
        this.rawInputs.clear();
        return true;
      }
      case 'tool-input-error':
        this._tool(chunk, 'output-error', { input: chunk.input, errorText: chunk.errorText }, true);
        return true;
      case 'tool-output-available': {
        const part = this.parts[this.tools.get(chunk.toolCallId)];
        if (!part) return true;
        this._tool(chunk, 'output-available', { input: part.input, output: chunk.output, preliminary: chunk.preliminary }, false);
        return true;
      }
      case 'tool-output-error': {
        const part = this.parts[this.tools.get(chunk.toolCallId)];
        if (!part) return true;
        this._tool(chunk, 'output-error', { input: part.input, errorText: chunk.errorText }, false);
        return true;
      }
      default:
        return false;
    }
  }

  /** The SDK's updateToolPart / updateDynamicToolPart, for the fields a stored message keeps. */
  _tool(chunk, state, fields, call) {
    const i = this.tools.get(chunk.toolCallId);
    let part = i === undefined ? null : this.parts[i];
    const meta = chunk.providerMetadata;
    const output = state === 'output-available' || state === 'output-error';
    if (!part) {
      const dynamic = Boolean(chunk.dynamic);
      part = dynamic
        ? { type: 'dynamic-tool', toolName: chunk.toolName, toolCallId: chunk.toolCallId }
        : { type: `tool-${chunk.toolName}`, toolCallId: chunk.toolCallId };
      part.title = chunk.title;
      this.tools.set(chunk.toolCallId, this.parts.length);
      this.parts.push(part);
    } else if (call && chunk.toolName !== undefined) {
      if (part.type === 'dynamic-tool') part.toolName = chunk.toolName;
      else part.type = `tool-${chunk.toolName}`;
    }
    part.state = state;
    part.input = fields.input;
    part.output = fields.output;
    part.errorText = fields.errorText;
    if (fields.inputEncoding != null) part.inputEncoding = fields.inputEncoding;
    else delete part.inputEncoding;
    part.preliminary = fields.preliminary;
    part.rawInput = fields.rawInput;
    if (chunk.title !== undefined) part.title = chunk.title;
    if (chunk.toolMetadata !== undefined) part.toolMetadata = chunk.toolMetadata;
    part.providerExecuted = chunk.providerExecuted ?? part.providerExecuted;
    if (meta != null) {
      if (output) part.resultProviderMetadata = meta;
      else part.callProviderMetadata = meta;
    }
  }

  /** What is stored in the final message (JSON: fields left undefined are dropped). */
  toJSON() {
    // A tool call whose input was still streaming at the end: its input as read so far.
    for (const [id, raw] of this.rawInputs) {
      const part = this.parts[this.tools.get(id)];
      if (!part || part.state !== 'input-streaming' || raw.text === '') continue;
      part.input = raw.encoding === 'text' ? raw.text : partialJson(raw.text);
      part.rawInput = raw.text;
    }
    return { parts: this.parts, text: this.runs.map(([i, t]) => [i, t.length]) };
  }
}

/** The UI message parts from a stored layout and the message's content. */
function partsFromLayout(layout, content) {
  const parts = layout.parts.map((p) => (p && p.type === 'text' ? { ...p, text: '' } : { ...p }));
  let pos = 0;
  for (const [i, n] of layout.text) {
    if (parts[i]?.type === 'text') parts[i].text += content.slice(pos, pos + n);
    pos += n;
  }
  return parts;
}

const STALLED = Symbol('stalled');

/** Splits SSE text into the JSON chunks of its `data:` lines (`[DONE]` ends it). */
class SseChunkReader {
  constructor() {
    this.buf = '';
  }

  *feed(text) {
    this.buf += text;
    for (;;) {
      const end = this.buf.search(/\r?\n\r?\n/);
      if (end < 0) return;
      const block = this.buf.slice(0, end);
      this.buf = this.buf.slice(end).replace(/^\r?\n\r?\n/, '');
      const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (!data || data === '[DONE]') continue;
      try {
        yield JSON.parse(data);
      } catch {
        // not a chunk of this protocol: nothing to keep
      }
    }
  }
}

/**
 * Make a UI message stream durable as run `runId`. `stream` is what the AI SDK sends the
 * browser: a `ReadableStream` (or async iterable) of UI message chunks, or of the SSE text
 * (`toUIMessageStreamResponse({consumeSseStream: ({stream}) => ...})` hands over the latter).
 * Text and tool-call inputs become holdfast events (durable before they count); `finish`
 * commits `{role: 'assistant', id, content, tool_calls}` — the content being exactly the
 * streamed text — in one step with the end of resumability; `abort` and `error` abort the run.
 * Reasoning, sources, files, data parts and tool outputs are not kept (a resumed page shows
 * text and tool calls); `skipped` counts them by type.
 *
 * Resolves to `{status, runId, events, appends, skipped}`. A stream that ends without
 * `finish` (the model's request failed mid-way) aborts the run with reason `incomplete`.
 * `stallTimeoutMs`: a stream that sends nothing for that long is let go (cancelled) and the
 * run aborted with reason `stalled: no chunk for N ms`, so every viewer and `useChat` ends
 * instead of waiting on it (the UI stream cannot be reopened from here).
 */
export async function persistUIMessageStream(client, runId, stream, { threadId, model, producer, stallTimeoutMs = null } = {}) {
  if (stallTimeoutMs !== null && !(Number.isFinite(stallTimeoutMs) && stallTimeoutMs > 0 && stallTimeoutMs <= 24 * 86_400_000)) {
    throw new TypeError('stallTimeoutMs must be a number of milliseconds in (0, 24 days] (or null: wait forever)');
  }
  const p = producer ?? await StreamProducer.begin(client, runId, { threadId, model });
  const reader = new SseChunkReader();
  const decoder = new TextDecoder();
  const skipped = {};
  const tools = new Map(); // toolCallId -> {name, deltas}
  let messageId = runId;
  let status = null;
  let reason = 'incomplete';
  const pending = [];
  const put = (ev) => { pending.push(p.append(ev)); };

  const layout = new UIMessageLayout();
  // A text delta ending in the first half of a surrogate pair (a provider or the app slicing
  // by UTF-16 code units) waits for the next delta of its text part: sent alone, each half
  // would be kept as U+FFFD where the live page joined them. Anything else that comes first
  // sends it alone (it is a lone surrogate then, kept as U+FFFD).
  let carry = null; // {id, half}
  const release = () => {
    if (carry) put({ type: 'text', text: carry.half });
    carry = null;
  };
  const handle = (chunk) => {
    if (chunk === null || typeof chunk !== 'object' || status) return;
    const shaped = layout.handle(chunk);
    if (carry && !(chunk.type === 'text-delta' && chunk.id === carry.id)) release();
    switch (chunk.type) {
      case 'start':
        if (typeof chunk.messageId === 'string') messageId = chunk.messageId;
        break;
      case 'text-delta': {
        if (typeof chunk.delta !== 'string') break;
        let text = carry ? carry.half + chunk.delta : chunk.delta;
        carry = null;
        const last = text.charCodeAt(text.length - 1);
        if (last >= 0xd800 && last <= 0xdbff) {
          carry = { id: chunk.id, half: text.slice(-1) };
          text = text.slice(0, -1);
        }
        if (text) put({ type: 'text', text });
        break;
      }
      case 'tool-input-start':
        tools.set(chunk.toolCallId, { name: chunk.toolName, deltas: 0 });
        put({ type: 'tool_call_delta', id: chunk.toolCallId, name: chunk.toolName });
        break;
      case 'tool-input-delta': {
        const t = tools.get(chunk.toolCallId);
        if (t) t.deltas += 1;
        put({ type: 'tool_call_delta', id: chunk.toolCallId, arguments_delta: chunk.inputTextDelta });
        break;
      }
      case 'tool-input-available': {
        const t = tools.get(chunk.toolCallId);
        if (!t) put({ type: 'tool_call_delta', id: chunk.toolCallId, name: chunk.toolName });
        if (!t || t.deltas === 0) {
          put({ type: 'tool_call_delta', id: chunk.toolCallId, arguments_delta: JSON.stringify(chunk.input ?? {}) });
        }
        tools.set(chunk.toolCallId, { name: chunk.toolName, deltas: 1, input: chunk.input ?? {} });
        put({ type: 'tool_call_end', id: chunk.toolCallId });
        break;
      }
      case 'finish':
        status = 'committed';
        break;
      case 'abort':
        status = 'aborted';
        reason = typeof chunk.reason === 'string' && chunk.reason ? chunk.reason.slice(0, 200) : 'aborted';
        break;
      case 'error':
        status = 'aborted';
        reason = 'error';
        break;
      default:
        if (!STRUCTURAL.has(chunk.type) && !shaped) skipped[chunk.type] = (skipped[chunk.type] ?? 0) + 1;
    }
  };

  let stalled = false;
  const it = iterate(stream);
  if (!it) throw new TypeError('persistUIMessageStream needs a ReadableStream or an (async) iterable');
  try {
    for (;;) {
      let timer = null;
      const next = Promise.resolve(it.next());
      const r = stallTimeoutMs === null ? await next : await Promise.race([next, new Promise((res) => {
        timer = setTimeout(() => res(STALLED), stallTimeoutMs);
      })]);
      if (timer) clearTimeout(timer);
      if (r === STALLED) {
        // The UI stream cannot be reopened from here: the run says it stalled and ends, so
        // every viewer (and useChat) stops waiting; the source is let go.
        stalled = true;
        next.catch(() => {});
        Promise.resolve().then(() => it.return?.()).catch(() => {});
        break;
      }
      if (r.done) break;
      const item = r.value;
      if (typeof item === 'string') for (const chunk of reader.feed(item)) handle(chunk);
      // One decoder for the whole stream: a character split across two chunks is kept whole.
      else if (item instanceof Uint8Array) for (const chunk of reader.feed(decoder.decode(item, { stream: true }))) handle(chunk);
      else handle(item);
      if (status || p.failed) {
        // Ended, or an append was refused (nothing after it can be kept): stop reading.
        Promise.resolve().then(() => it.return?.()).catch(() => {});
        break;
      }
    }
  } catch {
    status = null; // the source failed: abort below
  }
  release();
  await Promise.allSettled(pending);
  if (p.failed) {
    // A refused append (an event over the daemon's per-event cap, a frame too large): the run
    // cannot be kept whole. It is aborted, saying why, so viewers and useChat end instead of
    // waiting for a run that stays `streaming` until it expires.
    await abortRefused(p, 'append refused', p.failed);
    throw p.failed;
  }
  if (stalled && !status) {
    // Not an interruption (nothing here will reopen the model's stream): the run ends, and
    // its reason says why.
    reason = `stalled: no chunk for ${stallTimeoutMs} ms`;
  }
  let end;
  if (status === 'committed') {
    const toolCalls = [...tools.entries()].filter(([id, t]) => 'input' in t && layout.hasTool(id))
      .map(([id, t]) => ({ id, name: t.name, arguments: t.input }));
    const message = { role: 'assistant', id: messageId };
    if (toolCalls.length) message.tool_calls = toolCalls;
    // The UI message's shape (parts in order, tool outputs), for finalUIMessage.
    message.ui = JSON.parse(JSON.stringify(layout));
    // A step dropped by reset-step: the content is the text kept, not all that was streamed.
    if (layout.reset) message.content = layout.content;
    try {
      end = await p.commit(message, { contentFromStream: !layout.reset });
    } catch (e) {
      await abortRefused(p, 'commit refused', e);
      throw e;
    }
  } else {
    end = await p.abort(reason);
  }
  return { status: end.status, runId, events: p.events, appends: p.appends, skipped };
}

/** The stored final message of a committed run as an AI SDK `UIMessage`, or null while the
 * run is not committed. A run kept by `persistUIMessageStream` gives the message the AI SDK's
 * `readUIMessageStream` built from the live stream (its parts in order: step starts, text parts,
 * `tool-<name>` / `dynamic-tool` parts with their state, input and output), so a `useChat`
 * page shows history as it showed the live answer; reasoning, sources, files and data parts are
 * not kept. Any other committed run: one text part (its content) and its tool calls as
 * `tool-<name>` parts with state `input-available`. */
export async function finalUIMessage(client, runId) {
  let state;
  try {
    state = await client.streamGet(runId, { reveal: true });
  } catch (e) {
    if (e instanceof NotFound) return null;
    throw e;
  }
  if (state.status !== 'committed') return null;
  const m = state.final_message ?? {};
  const content = typeof m.content === 'string' ? m.content : '';
  const id = typeof m.id === 'string' ? m.id : runId;
  if (m.ui && Array.isArray(m.ui.parts) && Array.isArray(m.ui.text)) {
    return { id, role: 'assistant', parts: partsFromLayout(m.ui, content) };
  }
  const parts = [{ type: 'step-start' }];
  if (content) parts.push({ type: 'text', text: content, state: 'done' });
  for (const call of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
    parts.push({ type: `tool-${call.name}`, toolCallId: call.id, state: 'input-available', input: call.arguments });
  }
  return { id, role: 'assistant', parts };
}

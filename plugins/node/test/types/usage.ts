// Compiled (not run) by `tsc --noEmit --strict` in plugins/run-tests.sh: the .d.ts files
// describe the package as users import it.
import http from 'node:http';
import {
  Client, Conflict, FrameTooLarge, HoldfastError, MAX_FRAME_BYTES, StreamProducer, sseHandler, toWellFormed, type StreamEvent,
} from 'holdfast-client';
import { finalUIMessage, persistUIMessageStream, UI_MESSAGE_STREAM_HEADERS } from 'holdfast-client/ai';
import { createResumableStreamContext } from 'holdfast-client/resumable-stream';

async function main(): Promise<void> {
  const client = await Client.connect({ client: 'types' });
  const rec = await client.get('openai');
  const key: string | undefined = rec.value();
  const logged: { keys: string[]; values: 'hidden' } = rec.toJSON();
  const names: string[] = rec.keyNames;
  console.log(logged, names);
  const p = await StreamProducer.begin(client, 'run-1', { model: 'm' });
  const acked: number = await p.text('hi');
  const plan = await p.interrupt({ status: 529, message: 'overloaded' });
  if (plan.plan === 'R1') await p.text(plan.assistant_prefix.slice(-3));
  const end = await p.commit({ role: 'assistant' });
  const seq: number = end.finish_seq;
  for await (const ev of await client.subscribeStream('run-1')) {
    const e: StreamEvent = ev;
    if (e.event.type === 'text') console.log(e.event.text);
  }
  try {
    await client.setValue('x', 'y', { ifGeneration: 0 });
  } catch (e) {
    if (e instanceof Conflict) console.log(e.data.generation);
    if (e instanceof HoldfastError) console.log(e.kind);
  }
  http.createServer(sseHandler(client, (req: http.IncomingMessage) => req.url ?? '')).listen(0);
  const ctx = createResumableStreamContext({ client, waitUntil: null });
  const s: ReadableStream<string> | null | undefined = await ctx.resumeExistingStream('run-1');
  const r = await persistUIMessageStream(client, 'run-2', [{ type: 'text-delta', id: 't', delta: 'x' }]);
  const m = await finalUIMessage(client, 'run-2');
  const first: string | undefined = m?.parts[0]?.type;
  console.log(first);
  console.log(key, acked, seq, s, r.status, m?.parts.length, UI_MESSAGE_STREAM_HEADERS['content-type']);
}
void main();

// Frame cap and well-formed strings (fix of attack a19/a7).
async function frames(c: Client): Promise<number> {
  try {
    await c.setValue('k', toWellFormed('x'));
  } catch (e) {
    if (e instanceof FrameTooLarge) return e.bytes - e.maxFrameBytes;
  }
  return c.maxFrameBytes + MAX_FRAME_BYTES;
}
void frames;

// beginNewResumableStream: the consumeSseStream the AI SDK takes (fix of attack a26).
async function begin(client: Client): Promise<void> {
  const ctx = createResumableStreamContext({ client });
  const consume = await ctx.beginNewResumableStream('run-1');
  await consume({ stream: new ReadableStream<string>() });
  await consume.abort('never streamed');
}
void begin;

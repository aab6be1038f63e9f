#!/usr/bin/env node
// The producing process of one run: reads its job (one JSON line) on stdin, streams the fake
// provider's answer into holdfast, and commits it. With `resume: true` it takes over a run
// whose producer died and goes on as the daemon's plan says. Prints `{"begun": run_id}` on
// stdout once the run is held, so the server can answer the page; logs go to stderr.
//
// Exit codes: 0 the run ended (committed, aborted, or already ended when a resume came);
// HANDED_OVER (75) it stopped on SIGTERM with everything it streamed durable and the run left
// resumable, for the next server to resume; anything else a failure.
import { Client, NotFound, StreamProducer } from '../../src/index.js';
import { fakeStream } from './fake-provider.js';

export const HANDED_OVER = 75;
// SIGTERM (the server shutting down): stop reading the provider, make what was streamed
// durable, and leave the run to whoever resumes it.
let stopRequested = false;
let wakeStop = () => {};
// SIGINT too: Ctrl-C in the server's terminal reaches its whole process group.
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    stopRequested = true;
    wakeStop();
  });
}
const stopped = new Promise((resolve) => { wakeStop = resolve; });
let begun = false;

const log = (msg) => process.stderr.write(`producer[${process.pid}]: ${msg}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function readJob() {
  let text = '';
  for await (const chunk of process.stdin) {
    text += chunk;
    if (text.includes('\n')) break;
  }
  return JSON.parse(text);
}

async function main() {
  const job = await readJob();
  const client = await Client.connect({ client: `chat-producer-${process.pid}` });
  const model = 'fake-model-1';
  let producer;
  let from = 0;
  if (job.resume) {
    try {
      producer = await StreamProducer.resume(client, job.run_id, { model });
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
      // Ended meanwhile (committed by a producer killed just after, or aborted): nothing to do.
      log(`${job.run_id} has ended: nothing to resume`);
      process.stdout.write(`${JSON.stringify({ ended: job.run_id })}\n`);
      begun = true;
      client.close();
      return 0;
    }
    const { plan } = producer;
    log(`resumed ${job.run_id}: plan ${plan.plan} (${plan.reason})`);
    if (plan.plan === 'fail') {
      await producer.abort('the recovery plan was fail');
      return 0;
    }
    if (plan.plan === 'R1' || plan.plan === 'R3') from = plan.assistant_prefix.length;
    if (plan.plan === 'R2') {
      await producer.commit({ role: 'assistant', tool_calls: plan.completed });
      return 0;
    }
  } else {
    producer = await StreamProducer.begin(client, job.run_id, { model, threadId: job.thread_id });
  }
  process.stdout.write(`${JSON.stringify({ begun: job.run_id })}\n`);
  begun = true;

  let failAt = job.resume ? null : (job.failAt ?? null);
  for (;;) {
    try {
      const stream = fakeStream(job.prompt, { deltas: job.deltas, delayMs: job.delayMs, failAt, from });
      for (;;) {
        const r = await Promise.race([stream.next(), stopped.then(() => null)]);
        if (r === null || stopRequested) {
          stream.return?.().catch?.(() => {});
          await producer.flush(); // what was streamed is durable before the run is handed over
          log(`stopping on a signal: ${job.run_id} left resumable after seq ${producer.nextSeq - 1}`);
          client.close();
          return HANDED_OVER;
        }
        if (r.done) break;
        // Not awaited one by one: deltas that arrive while an append is in flight are batched.
        producer.text(r.value).catch(() => {});
      }
      break;
    } catch (e) {
      if (e.status === undefined) throw e;
      const plan = await producer.interrupt({ status: e.status, message: e.message });
      log(`provider failed (${e.status}): plan ${plan.plan}, wait ${plan.wait_ms} ms`);
      if (plan.plan === 'fail') {
        await producer.abort('the provider kept failing');
        return 0;
      }
      await sleep(plan.wait_ms);
      from = plan.plan === 'R4' ? 0 : plan.assistant_prefix.length;
      failAt = null;
    }
  }
  const end = await producer.commit({ role: 'assistant' });
  log(`committed ${job.run_id} at seq ${end.finish_seq} (${producer.appends} appends for ${producer.events} deltas)`);
  client.close();
  return 0;
}

main().then((code) => process.exit(code ?? 0), (e) => {
  log(`failed: ${e.message}`);
  // Before the run began, the server is waiting for our first line: say why there.
  if (!begun) process.stdout.write(`${JSON.stringify({ error: e.message })}\n`);
  process.exit(1);
});

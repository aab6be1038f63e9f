#!/usr/bin/env node
// The producing process of one run: reads its job (one JSON line) on stdin, streams the fake
// provider's answer into holdfast, and commits it. With `resume: true` it takes over a run
// whose producer died and goes on as the daemon's plan says. Prints `{"begun": run_id}` on
// stdout once the run is held, so the server can answer the page; logs go to stderr.
import { Client, StreamProducer } from '../../src/index.js';
import { fakeStream } from './fake-provider.js';

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
    producer = await StreamProducer.resume(client, job.run_id, { model });
    const { plan } = producer;
    log(`resumed ${job.run_id}: plan ${plan.plan} (${plan.reason})`);
    if (plan.plan === 'fail') {
      await producer.abort('the recovery plan was fail');
      return;
    }
    if (plan.plan === 'R1' || plan.plan === 'R3') from = plan.assistant_prefix.length;
    if (plan.plan === 'R2') {
      await producer.commit({ role: 'assistant', tool_calls: plan.completed });
      return;
    }
  } else {
    producer = await StreamProducer.begin(client, job.run_id, { model, threadId: job.thread_id });
  }
  process.stdout.write(`${JSON.stringify({ begun: job.run_id })}\n`);

  let failAt = job.resume ? null : (job.failAt ?? null);
  for (;;) {
    try {
      for await (const delta of fakeStream(job.prompt, { deltas: job.deltas, delayMs: job.delayMs, failAt, from })) {
        // Not awaited one by one: deltas that arrive while an append is in flight are batched.
        producer.text(delta).catch(() => {});
      }
      break;
    } catch (e) {
      if (e.status === undefined) throw e;
      const plan = await producer.interrupt({ status: e.status, message: e.message });
      log(`provider failed (${e.status}): plan ${plan.plan}, wait ${plan.wait_ms} ms`);
      if (plan.plan === 'fail') {
        await producer.abort('the provider kept failing');
        return;
      }
      await sleep(plan.wait_ms);
      from = plan.plan === 'R4' ? 0 : plan.assistant_prefix.length;
      failAt = null;
    }
  }
  const end = await producer.commit({ role: 'assistant' });
  log(`committed ${job.run_id} at seq ${end.finish_seq} (${producer.appends} appends for ${producer.events} deltas)`);
  client.close();
}

main().then(() => process.exit(0), (e) => {
  log(`failed: ${e.message}`);
  process.exit(1);
});

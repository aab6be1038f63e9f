// The example chat app in a real browser (Debian's chromium, headless, driven by
// playwright-core over the DevTools protocol) against the real daemon and real producer
// processes: refresh mid-stream, refresh after the commit, the producer SIGKILLed and resumed
// by a new process, the provider failing mid-stream, the daemon restarted mid-stream. Each
// ends with the answer on the page exactly once, equal to what holdfast committed.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { fakeReply } from '../examples/chat/fake-provider.js';
import { Daemon, REPO, startChatServer } from './harness.js';

const CHROMIUM = process.env.HOLDFAST_CHROMIUM || '/usr/bin/chromium';
let chromium = null;
let skip = false;
if (!existsSync(CHROMIUM)) skip = `no Chromium at ${CHROMIUM} (Debian: apt-get install chromium, as root; plugins/run-tests.sh does it)`;
else {
  try {
    ({ chromium } = await import('playwright-core'));
  } catch (e) {
    skip = `playwright-core is not installed (${e.code ?? e.message}): run plugins/run-tests.sh, which runs npm ci`;
  }
}
if (skip) console.log(`SKIPPED: the browser tests (${skip})`);

const DELTAS = 300;
const SHOT = join(REPO, 'target', 'node-chat-example.png');

async function startServer(t, d, port = 0, args = []) {
  return startChatServer(t, d, { port, args });
}

async function launch(t) {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  t.after(() => browser.close());
  const page = await browser.newPage({ viewport: { width: 900, height: 720 } });
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  return { browser, page, problems };
}

/** Send `prompt` from the page; resolves to the run id once its element exists. */
async function send(page, prompt) {
  await page.fill('#text', prompt);
  await page.click('button[type=submit]');
  const box = page.locator('.assistant').last();
  await box.waitFor();
  await page.waitForFunction(() => document.querySelector('.assistant:last-child')?.dataset.run);
  return box.getAttribute('data-run');
}

const textOf = (page, run) => page.locator(`[data-run="${run}"] .text`).textContent();

async function waitChars(page, run, n) {
  await page.waitForFunction(([r, k]) => (document.querySelector(`[data-run="${r}"] .text`)?.textContent.length ?? 0) >= k, [run, n], { timeout: 30_000 });
}

async function waitDone(page, run) {
  await page.waitForSelector(`[data-run="${run}"][data-status="done"]`, { timeout: 60_000 });
}

/** The page shows the answer exactly once, equal to the committed message and the fake's. */
async function checkOnce(page, client, run, prompt, what) {
  const expected = fakeReply(prompt, DELTAS).join('');
  const shown = await textOf(page, run);
  const body = await page.evaluate(() => document.body.innerText);
  const committed = (await client.streamGet(run, { reveal: true })).final_message.content;
  const count = body.split(expected).length - 1;
  assert.equal(shown, expected, `${what}: the run's element holds the answer`);
  assert.equal(committed, expected, `${what}: holdfast committed the answer`);
  assert.equal(count, 1, `${what}: the answer appears once on the page`);
  const stats = await page.evaluate(() => window.holdfastStats);
  console.log(`${what}: shown ${shown.length} chars = committed ${committed.length} chars = the provider's answer; on the page ${count} time(s); this page load got ${stats.textEvents} text events, ${stats.finishes} finish, ${stats.finals} final, ${stats.reconnects} reconnects`);
  return stats;
}

test('the chat example in headless Chromium: exactly once through refreshes, crashes and restarts', { skip }, async (t) => {
  const d = await Daemon.start();
  t.after(async () => {
    await d.stop();
    d.cleanup();
  });
  let server = await startServer(t, d);
  const client = await d.client();
  t.after(() => client.close());
  const { page, problems } = await launch(t);
  const open = (thread, q = '') => page.goto(`${server.url}?thread=${thread}&deltas=${DELTAS}&delayMs=12${q}`);

  await t.test('refresh in the middle of the answer', async () => {
    await open('refresh-mid');
    const prompt = 'What happens on a refresh?';
    const run = await send(page, prompt);
    await waitChars(page, run, 400);
    const before = (await textOf(page, run)).length;
    await page.reload();
    await waitDone(page, run);
    const stats = await checkOnce(page, client, run, prompt, `refresh at ${before} chars`);
    assert.ok(stats.textEvents > 0, 'the reloaded page followed the live run');
  });

  await t.test('refresh after the final message was committed: no replay', async () => {
    await open('refresh-after');
    const prompt = 'And after the commit?';
    const run = await send(page, prompt);
    await waitDone(page, run);
    await page.reload();
    await page.waitForSelector('body[data-loaded=true]');
    await waitDone(page, run);
    const stats = await checkOnce(page, client, run, prompt, 'refresh after commit');
    assert.equal(stats.textEvents + stats.finals + stats.opened, 0, 'from history: no stream opened, nothing replayed');
  });

  await t.test('the producing process SIGKILLed mid-stream, resumed by a new process (R1)', async () => {
    await open('kill-producer');
    const prompt = 'Survive a crash';
    const run = await send(page, prompt);
    await waitChars(page, run, 500);
    const info = await (await fetch(`${server.url}api/runs/${run}`)).json();
    assert.ok(info.producer_pid > 0);
    process.kill(info.producer_pid, 'SIGKILL'); // the producer this test's server started
    const at = (await textOf(page, run)).length;
    await waitDone(page, run);
    const after = await (await fetch(`${server.url}api/runs/${run}`)).json();
    assert.equal(after.producer_restarts, 1, 'one new producer process resumed it');
    assert.equal(after.last_plan.plan, 'R1');
    assert.equal(after.last_plan.cause, 'resumed_from_checkpoint');
    await checkOnce(page, client, run, prompt, `producer ${info.producer_pid} killed at ${at} chars, resumed by a new process with plan ${after.last_plan.plan}`);
  });

  await t.test('the provider fails mid-stream (529): interrupted, then resumed in the same process', async () => {
    await open('provider-fails', '&failAt=120');
    const prompt = 'Overload me';
    const run = await send(page, prompt);
    await waitDone(page, run);
    const stats = await checkOnce(page, client, run, prompt, 'provider 529 after 120 deltas');
    assert.equal(stats.interrupts, 1, 'the page was told of the interruption');
    const state = await client.streamGet(run);
    assert.equal(state.last_plan.plan, 'R1');
    assert.equal(state.attempts.overloaded, 1);
  });

  await t.test('the daemon restarted mid-stream: the page reconnects and finishes', async () => {
    await open('daemon-restart');
    const prompt = 'Restart the daemon';
    const run = await send(page, prompt);
    await waitChars(page, run, 400);
    const at = (await textOf(page, run)).length;
    const r = await d.restart();
    assert.equal(r.code, 0, 'the daemon stopped cleanly');
    await waitDone(page, run);
    await checkOnce(page, client, run, prompt, `daemon restarted at ${at} chars (the server's client reconnected and resubscribed after its last seq; the page's stream went on)`);
    // A refresh now: history only, once.
    await page.reload();
    await page.waitForSelector('body[data-loaded=true]');
    await waitDone(page, run);
    await checkOnce(page, client, run, prompt, 'refresh after the restart');
  });

  await t.test('the web server SIGKILLed mid-stream: EventSource reconnects to the new one with Last-Event-ID', async () => {
    await open('server-crash');
    const prompt = 'Crash the web server';
    const run = await send(page, prompt);
    await waitChars(page, run, 400);
    const at = (await textOf(page, run)).length;
    await server.kill('SIGKILL'); // the server this test started; its producer runs on
    server = await startServer(t, d, server.port);
    await waitDone(page, run);
    const stats = await checkOnce(page, client, run, prompt, `web server killed at ${at} chars, a new one on the same port`);
    assert.ok(stats.reconnects >= 1, 'the page lost its stream and reconnected');
    assert.equal(stats.textEvents, DELTAS, 'after the reconnect only the events it had not seen came');
  });

  await t.test('the page follows a long answer down as it streams', async () => {
    await page.goto(`${server.url}?thread=scroll&deltas=1200&delayMs=4`);
    await page.waitForSelector('body[data-loaded=true]');
    const run = await send(page, 'A long one, please');
    await waitChars(page, run, 4000);
    // The answer is taller than the window, and the window is at its end while it grows.
    await page.waitForFunction(() => {
      const h = document.documentElement.scrollHeight;
      return h > window.innerHeight + 300 && window.innerHeight + window.scrollY >= h - 60;
    }, null, { timeout: 30_000 });
    await waitDone(page, run);
    await page.waitForFunction(() => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 60, null, { timeout: 30_000 });
  });

  await t.test('a message whose run never began: the page stops asking and says so', async () => {
    // A turn recorded whose producer never began its run (it crashed first), found by a
    // server started after it.
    await server.kill('SIGTERM');
    const file = join(d.root, 'chat', 'threads.json');
    const threads = JSON.parse(readFileSync(file, 'utf8'));
    threads.never = [{ text: 'hello?', run_id: 'chat-never-x', created_at_ms: Date.now() }];
    writeFileSync(file, JSON.stringify(threads));
    server = await startServer(t, d, server.port, ['--start-timeout-ms', '3000']);
    await page.goto(`${server.url}?thread=never`);
    await page.waitForSelector('[data-run="chat-never-x"][data-status="failed"]', { timeout: 30_000 });
    const stats = await page.evaluate(() => window.holdfastStats);
    assert.equal(stats.gaveUp, 1, 'it gave up once, on the server saying the run will never begin');
    assert.match(await page.locator('[data-run="chat-never-x"] .note').textContent(), /never started/);
    console.log(`never-begun run: the page gave up after ${stats.opened} attempt(s)`);
  });

  // The picture for the README: a short conversation, one answer done.
  await page.goto(`${server.url}?thread=screenshot&deltas=45&delayMs=5`);
  await page.waitForSelector('body[data-loaded=true]');
  for (const q of ['What does holdfast keep?', 'And if I refresh now?']) {
    const run = await send(page, q);
    await waitDone(page, run);
  }
  mkdirSync(join(REPO, 'target'), { recursive: true });
  await page.screenshot({ path: SHOT, fullPage: false });
  console.log(`screenshot: ${SHOT}`);
  assert.deepEqual(problems, []);
});

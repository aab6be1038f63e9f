// The daemon under test, shared by every test file: each test that needs a daemon starts its
// own — a private HOME / XDG_* tree in a temp dir, `holdfast init` (store "default"),
// `holdfast daemon` on `$XDG_RUNTIME_DIR/holdfast/holdfast.sock` — and stops it by its pid
// (SIGTERM, which must exit 0). The binary is `$HOLDFAST_BIN`, else target/debug/holdfast
// (plugins/run-tests.sh builds it).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '../src/index.js';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const BIN = process.env.HOLDFAST_BIN || join(REPO, 'target', 'debug', 'holdfast');
/** A fake secret that is easy to search for. */
export const SECRET = `sk-test-DO-NOT-LEAK-${'7f3a9c'.repeat(4)}`;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function cleanEnv(home) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('HOLDFAST_') || k.startsWith('HIVE_')) continue;
    if (['CREDENTIALS_DIRECTORY', 'STATE_DIRECTORY', 'RUST_LOG', 'XDG_RUNTIME_DIR'].includes(k)) continue;
    env[k] = v;
  }
  return {
    ...env,
    HOME: home,
    XDG_CONFIG_HOME: join(home, 'config'),
    XDG_STATE_HOME: join(home, 'state'),
    XDG_RUNTIME_DIR: join(home, 'run'),
  };
}

export class Daemon {
  /** `await Daemon.start({config})`. */
  static async start(options = {}) {
    const d = new Daemon(options);
    await d.launch();
    return d;
  }

  constructor({ config, args = [] } = {}) {
    // mkdtemp (0700, short path): a socket path must fit in 108 bytes.
    this.root = mkdtempSync(join(tmpdir(), 'hf-js-'));
    this.home = join(this.root, 'home');
    mkdirSync(join(this.home, 'run'), { recursive: true, mode: 0o700 });
    this.env = cleanEnv(this.home);
    this.socket = join(this.home, 'run', 'holdfast', 'holdfast.sock');
    this.args = args;
    const out = this.cli('init');
    if (out.status !== 0) throw new Error(`holdfast init failed:\n${out.stderr}`);
    if (config !== undefined) {
      const dir = join(this.home, 'config', 'holdfast');
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      writeFileSync(join(dir, 'config.toml'), config);
    }
    this.logPath = join(this.root, 'daemon.log');
    this.proc = null;
    this.starts = 0;
  }

  cli(...args) {
    return spawnSync(BIN, args, { env: this.env, encoding: 'utf8', timeout: 60_000 });
  }

  async launch() {
    const log = openSync(this.logPath, 'a');
    this.proc = spawn(BIN, [...this.args, 'daemon'], { env: this.env, stdio: ['ignore', 'ignore', log] });
    closeSync(log);
    this.starts += 1;
    const proc = this.proc;
    this.exited = new Promise((res) => proc.once('exit', (code, signal) => res({ code, signal })));
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new Error(`daemon exited with ${proc.exitCode}:\n${this.log()}`);
      if (existsSync(this.socket) && await canConnect(this.socket)) return;
      await sleep(30);
    }
    throw new Error(`daemon did not listen within 20 s:\n${this.log()}`);
  }

  log() {
    try {
      return readFileSync(this.logPath, 'utf8');
    } catch {
      return '';
    }
  }

  client(options = {}) {
    return Client.connect({ socketPath: this.socket, client: 'node-test', ...options });
  }

  /** SIGTERM (or `signal`) to the pid we started; resolves to the exit {code, signal}. */
  async stop(signal = 'SIGTERM') {
    if (!this.proc) return null;
    const proc = this.proc;
    this.proc = null;
    if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
    const timer = setTimeout(() => proc.kill('SIGKILL'), 30_000);
    const r = await this.exited;
    clearTimeout(timer);
    return r;
  }

  /** Stop and start again on the same home (a restart under the clients' feet). */
  async restart(signal = 'SIGTERM') {
    const r = await this.stop(signal);
    await this.launch();
    return r;
  }

  cleanup() {
    rmSync(this.root, { recursive: true, force: true });
  }
}

function canConnect(path) {
  return new Promise((resolve) => {
    const s = net.createConnection(path);
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  });
}

/** Start a daemon for one test and stop it after (asserting a clean exit). */
export async function withDaemon(t, options) {
  const d = await Daemon.start(options);
  t.after(async () => {
    const r = await d.stop();
    d.cleanup();
    if (r && r.code !== 0) throw new Error(`daemon exited ${JSON.stringify(r)}:\n${d.log()}`);
  });
  return d;
}

/** Start the example chat server (examples/chat/server.js) on `d`'s daemon with `--data`
 * `dataDir`; stopped (SIGTERM, our own pid) after the test unless the test stopped it. */
export async function startChatServer(t, d, { port = 0, dataDir = join(d.root, 'chat'), args = [] } = {}) {
  const proc = spawn(process.execPath, [join(REPO, 'plugins/node/examples/chat/server.js'), '--port', String(port), '--data', dataDir, ...args], {
    env: { ...d.env, HOLDFAST_SOCKET: d.socket }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let errText = '';
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (s) => { errText += s; });
  const exited = new Promise((r) => proc.once('exit', (code, signal) => r({ code, signal })));
  const url = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.setEncoding('utf8');
    proc.stdout.on('data', (s) => {
      out += s;
      const m = /listening on (\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    proc.once('exit', (code) => reject(new Error(`the example server exited ${code}:\n${errText}`)));
  });
  t.after(async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
    await exited;
  });
  return {
    url, proc, port: Number(new URL(url).port), exited, log: () => errText,
    kill: async (sig) => { proc.kill(sig); return exited; },
  };
}

/** Until `cond()` is truthy (checked every 50 ms), for at most `ms`: a condition with a
 * generous bound, never a timing. Resolves to its value. */
export async function until(cond, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(50);
  }
}

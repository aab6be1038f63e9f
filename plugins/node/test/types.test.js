// The type check of run-tests.sh (`tsc --strict` on test/types) must be able to fail: a
// program that only strict TypeScript refuses — a possibly-undefined credential value used as a
// string, an implicitly-any parameter — fails it, with the .d.ts files and the tsconfig the check
// uses. (The check itself, on test/types/usage.ts, runs in run-tests.sh before node --test.)
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const TSC = join(HERE, '..', 'node_modules', '.bin', 'tsc');
const skip = existsSync(TSC) ? false : 'typescript is not installed: run plugins/node/run-tests.sh, which runs npm ci';
if (skip) console.log(`SKIPPED: the type check test (${skip})`);

test('the strict type check fails on code only strict TypeScript refuses', { skip }, (t) => {
  const dir = mkdtempSync(join(HERE, 'types', 'tmp-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'bad.ts'), [
    "import { Client } from 'holdfast-client';",
    'export async function f(): Promise<string> {',
    '  const rec = await (await Client.connect()).get("openai");',
    '  const key: string = rec.value(); // string | undefined: TS2322 under strictNullChecks',
    '  return key;',
    '}',
    'export function g(x) { return x; } // TS7006 under noImplicitAny',
    '',
  ].join('\n'));
  // The check's own tsconfig, on this file instead of usage.ts.
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ extends: '../tsconfig.json', files: ['bad.ts'], compilerOptions: { skipLibCheck: true } }));
  const r = spawnSync(TSC, ['--noEmit', '-p', join(dir, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
  assert.notEqual(r.status, 0, `tsc accepted code strict mode refuses:\n${r.stdout}${r.stderr}`);
  assert.match(r.stdout, /bad\.ts\(4,\d+\): error TS2322/, r.stdout);
  assert.match(r.stdout, /bad\.ts\(7,\d+\): error TS7006/, r.stdout);
  // And the same file made strict-clean passes: the failure was strictness, not the setup.
  writeFileSync(join(dir, 'bad.ts'), [
    "import { Client } from 'holdfast-client';",
    'export async function f(): Promise<string> {',
    '  const rec = await (await Client.connect()).get("openai");',
    "  return rec.value() ?? '';",
    '}',
    'export function g(x: unknown) { return x; }',
    '',
  ].join('\n'));
  const ok = spawnSync(TSC, ['--noEmit', '-p', join(dir, 'tsconfig.json')], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(ok.status, 0, ok.stdout + ok.stderr);
});

// What npm would publish (`npm pack --dry-run`, offline): a license, the example the README
// points to (with its own README), nothing the README points to that is left out, no image
// weighing down the tarball; and the README's steps create the store before the daemon serves
// a stream (`holdfast init`: without it a newcomer's first message fails).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join, normalize } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

function packed() {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr);
  const [info] = JSON.parse(r.stdout);
  return info;
}

test('the npm tarball: LICENSE, the example and its README, everything the READMEs point to, no image', () => {
  const info = packed();
  const files = new Map(info.files.map((f) => [f.path, f.size]));
  for (const need of ['LICENSE', 'README.md', 'package.json', 'src/index.js', 'types/index.d.ts',
    'examples/chat/README.md', 'examples/chat/server.js', 'examples/chat/producer.js',
    'examples/chat/fake-provider.js', 'examples/chat/public/app.js', 'examples/chat/public/index.html']) {
    assert.ok(files.has(need), `${need} is in the package (${[...files.keys()].join(', ')})`);
  }
  assert.match(readFileSync(join(ROOT, 'LICENSE'), 'utf8'), /MIT License[\s\S]*Apache License\s+Version 2\.0/);
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
  assert.equal(pkg.license, 'MIT OR Apache-2.0');
  for (const [path, size] of files) {
    assert.doesNotMatch(path, /\.(png|jpe?g|gif|webp)$/i, `no image in the package: ${path} (${size} B)`);
    assert.ok(size < 0.3 * info.unpackedSize, `${path} (${size} B) is not most of the package (${info.unpackedSize} B)`);
  }
  // Every relative link and every package path a shipped README names is shipped.
  for (const readme of ['README.md', 'examples/chat/README.md']) {
    const text = readFileSync(join(ROOT, readme), 'utf8');
    const base = dirname(readme);
    const links = [...text.matchAll(/\]\(([^)#\s]+)\)/g)].map((m) => m[1]).filter((l) => !/^[a-z]+:/i.test(l));
    for (const link of links) {
      const target = normalize(join(base, link)).replace(/\/$/, '');
      assert.ok([...files.keys()].some((f) => f === target || f.startsWith(`${target}/`)), `${readme} links ${link}, which is not in the package`);
    }
    // A document of the holdfast repository (docs/*.md) is not in the package: a shipped README
    // may name one only as the repository's, with what the reader needs said in the README.
    for (const m of text.matchAll(/[^\n]*\bdocs\/[\w.-]+\.md[^\n]*/g)) {
      const doc = /\bdocs\/[\w.-]+\.md/.exec(m[0])[0];
      if (files.has(doc)) continue;
      assert.match(m[0], /repository/, `${readme} cites ${doc}, which is not in the package: "${m[0].trim()}"`);
    }
    const named = [...text.matchAll(/holdfast-client\/((?:examples|src|types)\/[\w./-]+)/g)].map((m) => m[1].replace(/[.,]$/, '').replace(/\/$/, ''));
    for (const path of named) assert.ok(files.has(path) || [...files.keys()].some((f) => f.startsWith(`${path}/`)), `${readme} names ${path}, which is not in the package`);
  }
  console.log(`npm pack: ${info.files.length} files, ${info.size} B packed, largest ${Math.max(...files.values())} B`);
});

test('the README walks a newcomer through holdfast init before the daemon and the example', () => {
  for (const readme of ['README.md', 'examples/chat/README.md']) {
    const text = readFileSync(join(ROOT, readme), 'utf8');
    // The commands as typed (lines that begin with them), in the order given.
    const at = (re) => text.search(re);
    const init = at(/^holdfast init\b/m);
    const daemon = at(/^holdfast daemon\b/m);
    const server = at(/^node \S*examples\/chat\/server\.js/m);
    assert.ok(init >= 0, `${readme} says to run holdfast init`);
    assert.ok(init < daemon && daemon < server, `${readme}: holdfast init, then holdfast daemon, then the example server`);
  }
});

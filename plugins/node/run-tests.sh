#!/usr/bin/env bash
# The Node client's tests against the real daemon binary ($HOLDFAST_BIN, else a fresh
# `cargo build`), with what they need installed locally and idempotently:
#   - node >= 18 (Debian's nodejs via apt-get when absent, as root);
#   - Debian's chromium for the browser tests (as root, with apt-get; elsewhere those tests
#     say SKIPPED with the reason);
#   - `npm ci` into plugins/node/node_modules when package-lock.json is newer than the last
#     install: the `ai` package (its parser and transport check the AI SDK adapter),
#     playwright-core (drives the system chromium; never downloads a browser), typescript and
#     @types/node (checks the .d.ts files). Offline, the tests needing them say SKIPPED.
# Then `tsc` on test/types and `node --test` on test/. Extra arguments go to node --test.
set -euo pipefail
cd "$(dirname "$0")"
say() { echo "plugins/node/run-tests.sh: $*" >&2; }

apt_install() {
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing $* with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >/dev/null && return 0
  fi
  return 1
}

if ! command -v node >/dev/null 2>&1; then
  apt_install nodejs npm || { say "node is required and could not be installed (needs apt-get as root)"; exit 1; }
fi
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  say "node $(node --version) is older than the 18 the package needs"
  exit 1
fi
if [ ! -x "${HOLDFAST_CHROMIUM:-/usr/bin/chromium}" ]; then
  apt_install chromium || say "chromium missing and not installable here: the browser tests will say SKIPPED"
fi

# npm ci when the lock changed since the last install (npm writes node_modules/.package-lock.json).
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "npm ci (devDependencies into plugins/node/node_modules)"
  if ! npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>npm-ci.log; then
    say "npm ci failed ($(tail -1 npm-ci.log)): the AI SDK, type and browser tests will say SKIPPED"
  fi
  rm -f npm-ci.log
fi

if [ -z "${HOLDFAST_BIN:-}" ]; then
  (cd ../.. && cargo build --quiet --bin holdfast)
  HOLDFAST_BIN="$(cd ../.. && pwd)/${CARGO_TARGET_DIR:-target}/debug/holdfast"
fi
export HOLDFAST_BIN

if [ -x node_modules/.bin/tsc ]; then
  echo "== tsc --strict: the .d.ts files as a user's strict TypeScript sees them" >&2
  # --strict on the command line too: the check cannot lose it to an edited tsconfig. Any error
  # fails the run (test/types.test.js checks that a strict-only error is one).
  if ! node_modules/.bin/tsc --strict --noEmit -p test/types/tsconfig.json; then
    say "FAILED: tsc --strict on test/types (the .d.ts files)"
    exit 1
  fi
else
  say "SKIPPED: the type check (typescript is not installed)"
fi

echo "== node --test plugins/node/test (daemon: $HOLDFAST_BIN; $(node --version))" >&2
exec node --test --test-concurrency=1 "$@" test/*.test.js

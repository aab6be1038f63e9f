#!/usr/bin/env bash
# Run every test holdfast has: the same command locally and in CI (.ci/run calls this).
#   fmt check · clippy -D warnings · all Rust tests (unit, integration, crash, interop, daemon)
#   · the plugin tests in plugins/
# Crash and fault tests print what they explored; --show-output keeps those lines visible.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== module graph (scripts/module-graph.py: no import cycle between top-level modules)"
python3 scripts/module-graph.py

echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --features holdfast/fuzz --quiet -- -D warnings

echo "== cargo build --workspace --bins (holdfast-bench too: tests/bench_smoke.rs runs it via holdfast bench)"
cargo build --workspace --bins --quiet

echo "== cargo test --workspace (lib, bin, integration tests; benches are built by clippy above, run by cargo bench)"
cargo test --workspace --features holdfast/fuzz --lib --bins --tests --quiet -- --show-output

# The PostgreSQL backend: a throwaway server for this run (scripts/pg-cluster.sh: initdb in
# target/, a Unix socket there only, stopped on exit), then the streams, run-log and run-grant suites again on it, with
# two daemons on one database where the tests have two hosts.
echo "== streams, orphaned-run, run-log and run-grant suites on PostgreSQL (HOLDFAST_TEST_BACKEND=postgres)"
pgdir="$PWD/target/pg-test"
# A new cluster each run (the suites create a database per daemon environment).
scripts/pg-cluster.sh stop "$pgdir" >/dev/null 2>&1 || true
rm -rf "$pgdir"
if pg_err=$(scripts/pg-cluster.sh start "$pgdir" 2>&1 >/dev/null); then
  trap 'scripts/pg-cluster.sh stop "$pgdir" >/dev/null 2>&1 || true' EXIT
  pg_user=$( [ "$(id -u)" = 0 ] && echo postgres || id -un )
  HOLDFAST_TEST_BACKEND=postgres HOLDFAST_TEST_PG="host=$pgdir user=$pg_user" \
    cargo test --quiet --test streams --test orphans --test runlog --test run_grants -- --show-output
else
  echo "SKIPPED: the streams and run-log suites on PostgreSQL: no server could be started here: $pg_err"
fi

echo "== plugin tests (plugins/run-tests.sh: the Python and Node clients against the real daemon, the browser tests in headless Chromium)"
plugins/run-tests.sh

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

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

echo "== cargo build --workspace --bins (holdfast-bench too: tests/bench_smoke.rs runs it via holdfast bench)"
cargo build --workspace --bins --quiet

echo "== cargo test (lib, bin, integration tests; benches are built by clippy above, run by cargo bench)"
cargo test --lib --bins --tests --quiet -- --show-output

echo "== plugin tests (plugins/run-tests.sh: the Python and Node clients against the real daemon, the browser tests in headless Chromium)"
plugins/run-tests.sh

#!/usr/bin/env bash
# Install what the test suite needs beyond the Rust toolchain, idempotently:
# - Python's `cryptography` (hive's Fernet), for the interop tests in both directions.
# - rustfmt and clippy components, for the lint steps.
# Safe to run again and again: each step checks first and does nothing when satisfied.
set -euo pipefail

if ! python3 -c 'import cryptography.fernet' 2>/dev/null; then
  echo "test-deps: installing Python package cryptography" >&2
  python3 -m pip install --quiet --disable-pip-version-check cryptography \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages cryptography
fi

for comp in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${comp}"; then
    echo "test-deps: adding rustup component ${comp}" >&2
    rustup component add "${comp}"
  fi
done

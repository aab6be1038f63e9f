#!/usr/bin/env bash
# Install what the test suite needs beyond the Rust toolchain, idempotently:
# - Python's `cryptography` (hive's Fernet), for the interop tests in both directions.
# - strace, for the tests that prove the syscall order of a write and that a rejected id makes
#   no file-system call (SECURITY-CHECKLIST items 9 and 16).
# - systemd's tools (systemd-analyze, systemd-socket-activate), for the unit checks and the
#   socket-activation tests (tests/systemd.rs).
# - libfaketime, to jump one process's wall clock (lease expiry follows the monotonic clock:
#   SECURITY-CHECKLIST 36, tests/limits_env.rs).
# - rustfmt and clippy components, for the lint steps.
# Safe to run again and again: each step checks first and does nothing when satisfied.
set -euo pipefail

if ! python3 -c 'import cryptography.fernet' 2>/dev/null; then
  echo "test-deps: installing Python package cryptography" >&2
  python3 -m pip install --quiet --disable-pip-version-check cryptography \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages cryptography
fi

if ! command -v strace >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test-deps: installing strace" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace; } >/dev/null \
      || echo "test-deps: could not install strace; the strace tests will say SKIPPED" >&2
  else
    echo "test-deps: strace missing and cannot be installed here; the strace tests will say SKIPPED" >&2
  fi
fi

if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-socket-activate >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test-deps: installing systemd (for systemd-analyze and systemd-socket-activate)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd; } >/dev/null
  else
    echo "test-deps: systemd-analyze missing and cannot be installed here (needs apt-get as root)" >&2
    exit 1
  fi
fi

if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] && ! command -v faketime >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test-deps: installing faketime" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; } >/dev/null \
      || echo "test-deps: could not install faketime; the wall-clock test will say SKIPPED" >&2
  else
    echo "test-deps: faketime missing and cannot be installed here; the wall-clock test will say SKIPPED" >&2
  fi
fi

for comp in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${comp}"; then
    echo "test-deps: adding rustup component ${comp}" >&2
    rustup component add "${comp}"
  fi
done

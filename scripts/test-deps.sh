#!/usr/bin/env bash
# Install what the test suite needs beyond the Rust toolchain, idempotently:
# - Python's `cryptography` (hive's Fernet), for the interop tests in both directions.
# - strace, for the tests that prove the syscall order of a write and that a rejected id makes
#   no file-system call (SECURITY-CHECKLIST items 9 and 16).
# - systemd's tools (systemd-analyze, systemd-socket-activate), for the unit checks and the
#   socket-activation tests (tests/systemd.rs).
# - libfaketime, to jump one process's wall clock (lease expiry follows the monotonic clock:
#   SECURITY-CHECKLIST 36, tests/limits_env.rs).
# - PostgreSQL's server binaries, for a throwaway server per test run (scripts/pg-cluster.sh).
# - rustfmt and clippy components, for the lint steps.
# Safe to run again and again: each step checks first and does nothing when satisfied.
set -euo pipefail

if ! python3 -c 'import cryptography.fernet' 2>/dev/null; then
  echo "test-deps: installing Python package cryptography" >&2
  python3 -m pip install --quiet --disable-pip-version-check cryptography \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages cryptography
fi

# apt_install PACKAGE REQUIRED WHAT: install a Debian package (needs apt-get as root). When it
# cannot: REQUIRED=yes stops here; otherwise the tests that need WHAT say SKIPPED.
apt_install() {
  local pkg=$1 required=$2 what=$3
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test-deps: installing ${pkg} (${what})" >&2
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg}"; } >/dev/null; then
      return 0
    fi
  fi
  if [ "${required}" = yes ]; then
    echo "test-deps: ${pkg} is required (${what}) and could not be installed (needs apt-get as root)" >&2
    exit 1
  fi
  echo "test-deps: ${pkg} missing and not installable here; the tests needing ${what} will say SKIPPED" >&2
}

command -v strace >/dev/null 2>&1 \
  || apt_install strace no "syscall-order tests"
{ command -v systemd-analyze && command -v systemd-socket-activate; } >/dev/null 2>&1 \
  || apt_install systemd yes "systemd-analyze and systemd-socket-activate"
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 \
  || apt_install faketime no "the wall-clock jump test"
# A throwaway PostgreSQL server per test run (scripts/pg-cluster.sh: initdb in a temp dir, a Unix
# socket only) for the PostgreSQL backend's tests.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
  || apt_install postgresql no "the PostgreSQL backend tests"

for comp in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${comp}"; then
    echo "test-deps: adding rustup component ${comp}" >&2
    rustup component add "${comp}"
  fi
done

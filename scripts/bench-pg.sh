#!/usr/bin/env bash
# `holdfast bench --streams --backend postgres` against a throwaway PostgreSQL server of its own
# (scripts/pg-cluster.sh: initdb in a temp dir, a Unix socket there only, fsync on), stopped at
# the end. Extra arguments go to the bench (e.g. --quick, --json, --seconds 3).
#   scripts/bench-pg.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/hfbench-pg.XXXXXX)
cleanup() {
  scripts/pg-cluster.sh stop "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
scripts/pg-cluster.sh start "$dir" >/dev/null
user=$( [ "$(id -u)" = 0 ] && echo postgres || id -un )
bin=${HOLDFAST_BIN:-target/release/holdfast}
if [ ! -x "$bin" ]; then
  cargo build --release --workspace --bins --quiet
fi
"$bin" bench --streams --backend postgres --pg "host=$dir user=$user" "$@"

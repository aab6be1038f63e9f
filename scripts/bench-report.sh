#!/usr/bin/env bash
# The whole benchmark report: `holdfast bench --report docs/benchmarks.md --readme README.md`
# with every peer it can have — Redis (scripts/bench-deps.sh installs it) and a throwaway
# PostgreSQL server of its own for the PostgreSQL rows (scripts/pg-cluster.sh: initdb in a temp
# dir, a Unix socket there only, fsync on), stopped at the end. Without PostgreSQL on this
# machine the report runs without those rows and says so. Extra arguments go to the bench
# (e.g. --quick, --seconds 3).
#   scripts/bench-report.sh [BENCH ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${HOLDFAST_BIN:-target/release/holdfast}
if [ ! -x "$bin" ] || [ ! -x "$(dirname "$bin")/holdfast-bench" ]; then
  cargo build --release --workspace --bins --quiet
fi
pg=()
dir=$(mktemp -d /tmp/hfbench-pg.XXXXXX)
cleanup() {
  scripts/pg-cluster.sh stop "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
if scripts/pg-cluster.sh start "$dir" >/dev/null 2>&1; then
  user=$( [ "$(id -u)" = 0 ] && echo postgres || id -un )
  pg=(--pg "host=$dir user=$user")
else
  echo "bench-report: no PostgreSQL server could be started here (scripts/pg-cluster.sh); the report goes without the PostgreSQL rows" >&2
fi
"$bin" bench --report docs/benchmarks.md --readme README.md "${pg[@]}" "$@"

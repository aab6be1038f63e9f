#!/usr/bin/env bash
# Interleaved A/B of two holdfast builds on the stream bench, for a VM whose speed drifts:
# ROUNDS rounds, each running both builds one after the other, the order alternating
# (B A, A B, ...), then the median per row (docs/benchmarks.md, issue 15's A/B).
#   scripts/bench-ab.sh BEFORE_BIN AFTER_BIN
# Environment: ROUNDS (4), COUNTS (1,16,256), SECS (2). The harness is this checkout's
# target/release/holdfast-bench (cargo build --release --workspace).
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 BEFORE_HOLDFAST AFTER_HOLDFAST" >&2; exit 2; }
B=$1 A=$2
H=${HOLDFAST_BENCH:-$(dirname "$0")/../target/release/holdfast-bench}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "${ROUNDS:-4}"); do
  if [ $((r % 2)) = 1 ]; then order="B A"; else order="A B"; fi
  for x in $order; do
    if [ "$x" = B ]; then bin=$B; else bin=$A; fi
    echo "bench-ab: round $r, $x ($bin)" >&2
    "$H" --holdfast "$bin" --streams --no-peers --clients "${COUNTS:-1,16,256}" \
      --seconds "${SECS:-2}" 2>/dev/null | grep -E '^  holdfast ' | sed "s/^/$x /" >>"$out"
  done
done
python3 - "$out" <<'PY'
import collections, re, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    # kind, streams, ops/s, p50, p99, then the server's CPU per op (the client's follows).
    m = re.match(r"(\w)   (holdfast .*?) +(\d+) +([\d,]+) +[\d.]+ [µm]s +[\d.]+ [µm]s +([\d.]+) µs", line)
    if m:
        rows[(m.group(2), int(m.group(3)), m.group(1))].append(
            (int(m.group(4).replace(",", "")), float(m.group(5))))
for kind, n in sorted({(k, n) for k, n, _ in rows}):
    for x, name in (("B", "before"), ("A", "after")):
        v = rows.get((kind, n, x), [])
        if v:
            print("%-34s %4d %-6s median %8.0f/s  server CPU %6.1f µs  all %s" % (
                kind, n, name, statistics.median(o for o, _ in v),
                statistics.median(c for _, c in v), [o for o, _ in v]))
PY

#!/usr/bin/env bash
# Interleaved A/B (or A/B/C...) of holdfast builds on the stream bench, for a VM whose speed
# drifts: ROUNDS rounds, each running every build once, the order rotating each round, then the
# median per row and build (docs/benchmarks.md, issue 15's A/Bs).
#   scripts/bench-ab.sh BEFORE_BIN AFTER_BIN [MORE_BINS...]
# Builds are labelled by position: B (the first), A (the second), then C, D, ...
# Environment: ROUNDS (4), COUNTS (1,16,256), SECS (2). The harness is this checkout's
# target/release/holdfast-bench (cargo build --release --workspace).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_HOLDFAST AFTER_HOLDFAST [MORE...]" >&2; exit 2; }
bins=("$@")
labels=(B A C D E F G H)
H=${HOLDFAST_BENCH:-$(dirname "$0")/../target/release/holdfast-bench}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
n=${#bins[@]}
for r in $(seq 1 "${ROUNDS:-4}"); do
  for i in $(seq 0 $((n - 1))); do
    j=$(( (i + r) % n ))
    echo "bench-ab: round $r, ${labels[$j]} (${bins[$j]})" >&2
    "$H" --holdfast "${bins[$j]}" --streams --no-peers --clients "${COUNTS:-1,16,256}" \
      --seconds "${SECS:-2}" 2>/dev/null | grep -E '^  holdfast ' | sed "s/^/${labels[$j]} /" >>"$out"
  done
done
python3 - "$out" "$n" <<'PY'
import collections, re, statistics, sys
labels = "BACDEFGH"[: int(sys.argv[2])]
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    # kind, streams, ops/s, p50, p99, then the server's CPU per op (the client's follows).
    m = re.match(r"(\w)   (holdfast .*?) +(\d+) +([\d,]+) +[\d.]+ [µm]s +([\d.]+) ([µm]s) +([\d.]+) µs", line)
    if m:
        p99 = float(m.group(5)) * (1000 if m.group(6) == "ms" else 1)
        rows[(m.group(2), int(m.group(3)), m.group(1))].append(
            (int(m.group(4).replace(",", "")), float(m.group(7)), p99))
for kind, n in sorted({(k, n) for k, n, _ in rows}):
    for x in labels:
        v = rows.get((kind, n, x), [])
        if v:
            print("%-34s %4d %s  median %8.0f/s  server CPU %6.1f µs  p99 %9.0f µs  all %s" % (
                kind, n, x, statistics.median(o for o, _, _ in v),
                statistics.median(c for _, c, _ in v),
                statistics.median(p for _, _, p in v), [o for o, _, _ in v]))
PY

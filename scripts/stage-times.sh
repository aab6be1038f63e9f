#!/usr/bin/env bash
# Where a daemon `cred.set` spends its time, stage by stage: the method behind docs/benchmarks.md
# (issue 15, eleventh session). Builds the daemon of HEAD with bench/stage-times.patch applied (in
# a git worktree and a target directory of their own under target/stage-times/, so the tree you
# work in is untouched), then runs `holdfast-bench --sizes SIZE --clients 1` against it ROUNDS
# times. The patched daemon stamps each stage of every set (time since the previous stamp) and
# writes the medians of each block of 500 sets to a log; this prints, per round, the bench's own
# line for the set and the median of those block medians.
#
#   scripts/stage-times.sh [ROUNDS] [SIZE]      (2 and 100 by default; ~4 min to build, 20 s a round)
#
# Stages, in order: read (the request line read) → task (routed, the request's task running) →
# disp (store found, writer permit) → blk0 (a blocking-pool thread running it) → lock (store lock,
# key check) → rdfor (the current version read and decrypted) → enc (the new one encrypted) →
# w_open (a spare opened) → w_data (bytes written) → w_fsync → w_link (the old file kept as a
# spare by a link: a fresh temp file only; 0 when a spare is recycled) → w_rename (a recycled
# spare's exchange with the target, else the rename) → w_dirsync (the directory's fsync) → opend
# (index entry, lock released) →
# queued (the answer built) → sent (written to the socket).
set -euo pipefail
rounds=${1:-2}
size=${2:-100}
root=$(git rev-parse --show-toplevel)
cd "$root"
work=$root/target/stage-times
tree=$work/tree
log=$work/stages.log
mkdir -p "$work"
git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
git worktree prune
git worktree add --detach --quiet "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree" 2>/dev/null || true' EXIT
git -C "$tree" apply "$root/bench/stage-times.patch"
echo "building the instrumented daemon (target/stage-times/target)..." >&2
HOLDFAST_STAGE_LOG=$log CARGO_TARGET_DIR=$work/target \
    cargo build --release --quiet --manifest-path "$tree/Cargo.toml" --bin holdfast
cargo build --release --quiet -p holdfast-bench
for r in $(seq 1 "$rounds"); do
    rm -f "$log"
    echo "== round $r of $rounds"
    target/release/holdfast-bench --holdfast "$work/target/release/holdfast" \
        --sizes "$size" --clients 1 --seconds 3 2>/dev/null |
        grep -E "^ +$size +1 +cred\.set |served replace floor" | cut -c1-160 || true
    python3 - "$log" <<'PY'
import sys
blocks = [dict(kv.split("=") for kv in line.split()) for line in open(sys.argv[1])]
if not blocks:
    sys.exit("no stage log: did the set phase run?")
keys = list(blocks[0])
med = {k: sorted(float(b[k]) for b in blocks)[len(blocks) // 2] for k in keys}
print("   stage medians (µs, %d blocks of 500 sets): " % len(blocks)
      + " ".join(f"{k}={med[k]:.1f}" for k in keys))
PY
done

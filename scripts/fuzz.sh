#!/usr/bin/env bash
# Coverage-guided fuzzing of one of holdfast's fuzz targets with AFL++ (cargo-afl, stable
# toolchain), starting from its corpus in tests/corpus/TARGET/:
#   scripts/fuzz.sh TARGET [SECONDS]      (default 600 s; TARGET: see src/fuzz/mod.rs, TARGETS)
# cargo-afl is installed into target/tools/ the first time (idempotent), the harness (fuzz/)
# built with AFL++'s instrumentation, and afl-fuzz run for SECONDS with its state in
# target/afl/TARGET/. At the end: the executions and paths it reports, and every crash copied
# into tests/corpus/TARGET/ as crash-afl-<n> (then `cargo test --test fuzz_targets` replays it
# and fails until it is fixed). Nothing outside the repository is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS]}
secs=${2:-600}
[ -d "tests/corpus/$target" ] || { echo "fuzz: no corpus tests/corpus/$target" >&2; exit 2; }
tools="$PWD/target/tools"
export PATH="$tools/bin:$PATH"
if ! command -v cargo-afl >/dev/null 2>&1; then
  echo "fuzz: installing cargo-afl into $tools" >&2
  cargo install cargo-afl --locked --root "$tools" --quiet
fi
# AFL++'s runtime for this rustc (kept by cargo-afl under ~/.local/share/afl.rs).
cargo afl config --build >/dev/null 2>&1 || true
cargo afl build --release --quiet --manifest-path fuzz/Cargo.toml
out="target/afl/$target"
mkdir -p "$out"
# No core pattern or CPU governor changes (they need root and touch the machine): AFL++ is told
# to accept the machine as it is.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_QUIET=1
input="tests/corpus/$target"
[ -e "$out/default/fuzzer_stats" ] && input=-   # resume where the last run stopped
cargo afl fuzz -i "$input" -o "$out" -V "$secs" -- fuzz/target/release/holdfast-fuzz "$target" \
  >"$out/afl.log" 2>&1 || { tail -20 "$out/afl.log" >&2; exit 1; }
stats="$out/default/fuzzer_stats"
grep -E '^(execs_done|execs_per_sec|corpus_count|saved_crashes|saved_hangs|run_time) ' "$stats" \
  | sed "s/^/fuzz $target: /"
n=0
for c in "$out"/default/crashes/id:*; do
  [ -e "$c" ] || continue
  n=$((n + 1))
  cp "$c" "tests/corpus/$target/crash-afl-$(sha256sum "$c" | cut -c1-16)"
done
echo "fuzz $target: $n crash(es) copied into tests/corpus/$target/"

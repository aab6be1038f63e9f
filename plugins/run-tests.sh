#!/usr/bin/env bash
# Run the plugin clients' tests against the real daemon binary.
#   - installs pytest with pip if it is missing (idempotent: does nothing when it is there);
#   - builds target/debug/holdfast with `cargo build` (a no-op when it is up to date), unless
#     HOLDFAST_BIN names a binary to test instead;
#   - runs plugins/python/tests with pytest. Exits non-zero on any failure, and also when pytest
#     collected no test at all (its exit code 5).
# Extra arguments go to pytest, e.g. `bash plugins/run-tests.sh -k refresh`.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
  echo "plugins/run-tests.sh: installing Python package pytest" >&2
  "$PYTHON" -m pip install --quiet --disable-pip-version-check pytest \
    || "$PYTHON" -m pip install --quiet --disable-pip-version-check --break-system-packages pytest
fi

if [ -z "${HOLDFAST_BIN:-}" ]; then
  echo "== cargo build --bin holdfast" >&2
  cargo build --quiet --bin holdfast
  HOLDFAST_BIN="${CARGO_TARGET_DIR:-target}/debug/holdfast"
fi
if [ ! -x "$HOLDFAST_BIN" ]; then
  echo "plugins/run-tests.sh: no holdfast binary at $HOLDFAST_BIN" >&2
  exit 1
fi
HOLDFAST_BIN=$(cd "$(dirname "$HOLDFAST_BIN")" && pwd)/$(basename "$HOLDFAST_BIN")
export HOLDFAST_BIN

echo "== pytest plugins/python/tests (daemon: $HOLDFAST_BIN)" >&2
set +e
PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m pytest -p no:cacheprovider -q -s plugins/python/tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "plugins/run-tests.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

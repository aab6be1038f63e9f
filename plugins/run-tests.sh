#!/usr/bin/env bash
# Run the plugin clients' tests against the real daemon binary.
#   - makes a Python venv under target/ (once; reused after) with pytest and pyflakes, and
#     hive's published package (aden-hive==1.0.12 --no-deps, plus pydantic and cryptography)
#     for the hive drop-in tests. Each step checks first and does nothing when satisfied. If
#     PyPI cannot be reached, the hive tests say SKIPPED with the reason and the rest runs
#     (the venv sees the system's packages, so a system pytest is enough).
#   - installs plugins/python into that venv with pip, so the tests import the package as a
#     user installs it (pyproject.toml, py.typed and all); lints it with pyflakes; installs mypy
#     into the venv and type-checks the package with `mypy --strict` (failing the run on an
#     error; SKIPPED with the reason if mypy cannot be installed);
#   - builds target/debug/holdfast with `cargo build` (a no-op when it is up to date), unless
#     HOLDFAST_BIN names a binary to test instead;
#   - runs plugins/python/tests with pytest (failing also when it collected no test: exit 5);
#   - for plugins/node: installs Debian's chromium when absent (as root, with apt-get; else
#     the browser tests say SKIPPED with the reason), `npm ci` into plugins/node/node_modules
#     when package-lock.json changed (the `ai` package, playwright-core — no browser download —,
#     typescript; offline, the tests needing them say SKIPPED), type-checks the .d.ts files with
#     tsc, and runs `node --test` on plugins/node/test against the same daemon binary.
# Exits non-zero if either language's tests failed.
# Extra arguments go to pytest, e.g. `bash plugins/run-tests.sh -k refresh`; HOLDFAST_SKIP_PY=1
# or HOLDFAST_SKIP_NODE=1 leaves one side out.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${HOLDFAST_PY_VENV:-${CARGO_TARGET_DIR:-target}/py-venv}
HIVE_SPEC="aden-hive==1.0.12"
# Fail fast when PyPI is unreachable instead of waiting minutes per package.
PIP=(--quiet --disable-pip-version-check --retries 1 --timeout 20)

say() { echo "plugins/run-tests.sh: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  say "making the Python venv $VENV"
  if ! "$PYTHON" -m venv --system-site-packages "$VENV"; then
    # Debian's python3 has venv in a package of its own.
    rm -rf "$VENV"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      say "installing python3-venv"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; } >/dev/null
      "$PYTHON" -m venv --system-site-packages "$VENV"
    else
      say "$PYTHON cannot make a venv (Debian: apt-get install python3-venv, as root)"
      exit 1
    fi
  fi
fi
PY="$VENV/bin/python"

pip_install() { "$PY" -m pip install "${PIP[@]}" "$@"; }

if ! "$PY" -c 'import pytest' 2>/dev/null; then
  say "installing pytest into $VENV"
  pip_install pytest || { say "pytest is required and could not be installed"; exit 1; }
fi
if ! "$PY" -c 'import pyflakes' 2>/dev/null; then
  say "installing pyflakes into $VENV"
  pip_install pyflakes || say "pyflakes could not be installed: the Python lint step is SKIPPED"
fi

# hive, exactly as its users install it.
HOLDFAST_HIVE_MISSING=""
hive_ok() { "$PY" -c 'import framework.credentials.storage, framework.tracker.runtime_logger' 2>/dev/null; }
if ! hive_ok; then
  say "installing $HIVE_SPEC (--no-deps) with pydantic and cryptography into $VENV"
  if ! out=$(pip_install --no-deps "$HIVE_SPEC" 2>&1 && pip_install pydantic cryptography 2>&1); then
    HOLDFAST_HIVE_MISSING="pip could not install $HIVE_SPEC: $(echo "$out" | tail -1)"
  elif ! hive_ok; then
    HOLDFAST_HIVE_MISSING="$HIVE_SPEC installed but framework.credentials.storage does not import"
  fi
fi
if [ -n "$HOLDFAST_HIVE_MISSING" ]; then
  say "SKIPPED: the hive tests ($HOLDFAST_HIVE_MISSING)"
fi
export HOLDFAST_HIVE_MISSING

# The package itself, installed the way users install it (no network needed: no dependencies,
# and the venv's own setuptools builds it).
# (setuptools 70.1 and later build wheels by themselves; the one venv bundles needs `wheel`.)
if ! "$PY" -c 'import setuptools.command.bdist_wheel' 2>/dev/null; then
  say "installing setuptools>=70.1 into $VENV (to build plugins/python)"
  pip_install "setuptools>=70.1" || true
fi
if pip_install --no-deps --no-build-isolation --force-reinstall ./plugins/python; then
  export HOLDFAST_TEST_INSTALLED=1
  "$PY" - <<'EOF'
import importlib.resources, holdfast_client, os
assert "site-packages" in holdfast_client.__file__, holdfast_client.__file__
assert importlib.resources.files("holdfast_client").joinpath("py.typed").is_file(), "py.typed"
print("plugins/run-tests.sh: testing holdfast-client %s as installed by pip (%s)"
      % (holdfast_client.__version__, os.path.dirname(holdfast_client.__file__)))
EOF
else
  say "pip could not install plugins/python: testing it from the source tree instead"
  unset HOLDFAST_TEST_INSTALLED
fi
rm -rf plugins/python/build plugins/python/*.egg-info

if "$PY" -c 'import pyflakes' 2>/dev/null; then
  echo "== pyflakes plugins/python" >&2
  "$PY" -m pyflakes plugins/python
fi

# mypy --strict on the package: it ships py.typed, so its users' type checkers read these hints.
# Absolute paths, and no cd: the venv's path may be relative to the repository root.
MYPY_MISSING=""
if ! "$PY" -c 'import mypy' 2>/dev/null; then
  say "installing mypy into $VENV"
  if ! out=$(pip_install mypy 2>&1); then
    MYPY_MISSING="pip could not install mypy: $(echo "$out" | tail -1)"
  fi
fi
if "$PY" -c 'import mypy' 2>/dev/null; then
  PY_ABS="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
  MYPY_CACHE="${CARGO_TARGET_DIR:-target}/mypy-cache"
  mkdir -p "$MYPY_CACHE"
  MYPY_ARGS=(--strict --cache-dir "$(cd "$MYPY_CACHE" && pwd)")
  if [ -n "$HOLDFAST_HIVE_MISSING" ]; then
    # hive.py is checked against hive's own types, which are not here.
    say "mypy leaves out holdfast_client/hive.py ($HOLDFAST_HIVE_MISSING)"
    MYPY_ARGS+=(--exclude '/hive\.py$')
  fi
  echo "== mypy --strict plugins/python/holdfast_client" >&2
  "$PY_ABS" -m mypy "${MYPY_ARGS[@]}" "$(pwd)/plugins/python/holdfast_client"
else
  say "SKIPPED: mypy --strict (${MYPY_MISSING:-mypy does not import in $VENV})"
fi

# The oldest Python the package claims (3.8): it must at least compile and import there.
OLD_PY=""
for cand in "$(pyenv root 2>/dev/null)/versions/3.8"*/bin/python3.8 python3.8; do
  # A pyenv shim exists whether or not it can run: ask the interpreter itself.
  if "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 8)' >/dev/null 2>&1; then
    OLD_PY=$cand
    break
  fi
done
if [ -n "$OLD_PY" ]; then
  echo "== $("$OLD_PY" --version 2>&1): compile and import holdfast_client" >&2
  PYTHONPATH=plugins/python PYTHONDONTWRITEBYTECODE=1 "$OLD_PY" -c '
import glob, sys
for f in sorted(glob.glob("plugins/python/holdfast_client/*.py")):
    compile(open(f, encoding="utf-8").read(), f, "exec")
import holdfast_client, holdfast_client.aio, holdfast_client.streaming, holdfast_client.hive
print("holdfast_client compiles and imports on Python", sys.version.split()[0])'
else
  say "SKIPPED: no Python 3.8 interpreter here to check the package's oldest supported version"
fi

if [ -z "${HOLDFAST_BIN:-}" ]; then
  echo "== cargo build --bin holdfast" >&2
  cargo build --quiet --bin holdfast
  HOLDFAST_BIN="${CARGO_TARGET_DIR:-target}/debug/holdfast"
fi
if [ ! -x "$HOLDFAST_BIN" ]; then
  say "no holdfast binary at $HOLDFAST_BIN"
  exit 1
fi
HOLDFAST_BIN=$(cd "$(dirname "$HOLDFAST_BIN")" && pwd)/$(basename "$HOLDFAST_BIN")
export HOLDFAST_BIN

py_rc=0
if [ -z "${HOLDFAST_SKIP_PY:-}" ]; then
  echo "== pytest plugins/python/tests (daemon: $HOLDFAST_BIN)" >&2
  set +e
  PYTHONDONTWRITEBYTECODE=1 "$PY" -m pytest -c plugins/python/pytest.ini -p no:cacheprovider \
    -q -s -rs plugins/python/tests "$@"
  py_rc=$?
  set -e
  if [ "$py_rc" -eq 5 ]; then
    say "pytest collected no tests: failing"
    py_rc=1
  fi
fi

node_rc=0
if [ -z "${HOLDFAST_SKIP_NODE:-}" ]; then
  plugins/node/run-tests.sh || node_rc=$?
fi
if [ "$py_rc" -ne 0 ] || [ "$node_rc" -ne 0 ]; then
  say "failed: python tests exit $py_rc, node tests exit $node_rc"
  exit 1
fi

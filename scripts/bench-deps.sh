#!/usr/bin/env bash
# Install what `holdfast bench --streams` compares against, idempotently:
# - redis-server (Debian's), for the `appendfsync always` baseline. The bench starts its own
#   instance on a loopback port in a temporary directory; the package's own service is stopped
#   and disabled if the package manager started one.
# SQLite is measured through Python's standard sqlite3 module, which needs nothing installed.
set -euo pipefail

if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "bench-deps: installing redis-server" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; } >/dev/null
    # The bench runs its own redis-server; do not leave the packaged one running.
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now redis-server >/dev/null 2>&1 || true
    fi
    pkill -x redis-server >/dev/null 2>&1 || true
  else
    echo "bench-deps: redis-server missing and cannot be installed here (not root, or no apt-get);" \
         "the bench reports Redis as not measured" >&2
  fi
fi
echo "bench-deps: ok (redis-server: $(command -v redis-server || echo /usr/bin/redis-server))" >&2

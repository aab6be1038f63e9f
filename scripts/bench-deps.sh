#!/usr/bin/env bash
# Install what `holdfast bench --streams` compares against, idempotently:
# - redis-server (Debian's), for the `appendfsync always` baseline. The bench starts its own
#   instance on a loopback port in a temporary directory; the package's own service is kept
#   from starting at all (a policy-rc.d that answers 101 during the install, Debian's way to
#   say "do not start services now") and disabled, so nothing has to be stopped afterwards and
#   no process this script did not start is ever touched.
# SQLite is measured through Python's standard sqlite3 module, which needs nothing installed.
set -euo pipefail

if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "bench-deps: installing redis-server (its service not started)" >&2
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod 0755 /usr/sbin/policy-rc.d
      made_policy=yes
    fi
    rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; } >/dev/null || rc=$?
    if [ -n "$made_policy" ]; then
      rm -f /usr/sbin/policy-rc.d
    fi
    [ "$rc" = 0 ] || exit "$rc"
    # Nor at the next boot: the bench runs its own redis-server.
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable redis-server >/dev/null 2>&1 || true
    fi
  else
    echo "bench-deps: redis-server missing and cannot be installed here (not root, or no apt-get);" \
         "the bench reports Redis as not measured" >&2
  fi
fi
echo "bench-deps: ok (redis-server: $(command -v redis-server || echo /usr/bin/redis-server))" >&2

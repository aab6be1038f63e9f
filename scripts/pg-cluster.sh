#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests: Debian's server binaries (`pg_config --bindir`),
# `initdb` in a directory of ours, listening on a Unix socket in that directory only (no TCP
# port, so it never meets a user's own server), stopped by its own data directory.
#
#   scripts/pg-cluster.sh start DIR   # initdb (once) and start; prints the connection URL
#   scripts/pg-cluster.sh url DIR     # the URL again
#   scripts/pg-cluster.sh stop DIR    # fast shutdown of the server started in DIR (only that one)
#
# PG_CLUSTER_OPTS adds server options at start (e.g. a loopback port with TLS for a test:
# "-c listen_addresses=127.0.0.1 -c port=5433 -c ssl=on -c ssl_cert_file=...").
#
# Run as root, the server runs as the `postgres` user (initdb refuses root), DIR is handed to it,
# and the URL names the superuser `postgres`; otherwise as the caller. Exit 3 with the reason on
# stderr when no server can be started here (no binaries, no `postgres` user as root): tests then
# say SKIPPED with that reason.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|url|stop DIR" >&2
  exit 2
fi

bindir=$(pg_config --bindir 2>/dev/null || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ] || [ ! -x "$bindir/pg_ctl" ]; then
  # pg_config may come from libpq-dev alone; the server's binaries live per major version.
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "pg-cluster: no PostgreSQL server binaries (install Debian's postgresql package)" >&2
  exit 3
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}
user() {
  if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

url() {
  echo "postgresql:///postgres?host=${dir}&user=$(user)"
}

case "$cmd" in
  start)
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
      echo "pg-cluster: running as root but there is no postgres user to run the server as" >&2
      exit 3
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # The socket path must fit sun_path (107 bytes): DIR/.s.PGSQL.5432.
    if [ $(( ${#dir} + 17 )) -gt 107 ]; then
      echo "pg-cluster: $dir is too long for a Unix socket path; use a shorter directory" >&2
      exit 2
    fi
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_owner "$bindir/initdb" -D "$dir/data" -U "$(user)" --auth=trust --no-sync \
        -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
        || { echo "pg-cluster: initdb failed; see $dir/initdb.log" >&2; tail -n 5 "$dir/initdb.log" >&2; exit 3; }
    fi
    # No TCP at all; the socket only in DIR; fsync stays on (the backend's durability is tested).
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
      -o "-c listen_addresses='' -c unix_socket_directories='$dir' -c max_connections=300 ${PG_CLUSTER_OPTS:-}" \
      start >/dev/null \
      || { echo "pg-cluster: the server did not start; see $dir/server.log" >&2; tail -n 5 "$dir/server.log" >&2; exit 3; }
    url
    ;;
  url)
    dir=$(cd "$dir" && pwd)
    url
    ;;
  stop)
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    ;;
  *)
    echo "usage: $0 start|url|stop DIR" >&2
    exit 2
    ;;
esac

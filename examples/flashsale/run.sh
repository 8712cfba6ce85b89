#!/usr/bin/env bash
# Runs the flash sale against a throwaway PostgreSQL: starts one from Debian's postgresql
# package on a unix socket in a temp dir (installing it if missing), runs `go run . "$@"` here
# with PG_URL set, then stops and removes the server. Needs root (apt-get, su). With PG_URL
# already set, uses that database instead. `run.sh test [go test flags]` runs the tests.
# Redis: REDIS_URL if set, else the program starts its own throwaway redis-server.
set -euo pipefail
cd "$(dirname "$0")"
if [[ "${1:-}" == test ]]; then
  shift
  set -- go test -count=1 "$@" .
else
  set -- go run . "$@"
fi
if [[ -n "${PG_URL:-}" ]]; then
  exec "$@"
fi
if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
D=$(mktemp -d) && chown postgres "$D"
su postgres -c "$PGBIN/initdb -D $D/data -A trust -U postgres" >/dev/null
su postgres -c "$PGBIN/pg_ctl -D $D/data -l $D/log -w start -o '-c listen_addresses= -k $D -c max_connections=300'" >/dev/null
trap 'su postgres -c "$PGBIN/pg_ctl -D $D/data -m fast stop" >/dev/null; rm -rf "$D"' EXIT
PG_URL="postgres://postgres@/postgres?host=$D" "$@"

#!/usr/bin/env bash
# Runs the benchmark suite with PostgreSQL advisory locks included: starts a throwaway
# PostgreSQL from Debian's postgresql package on a unix socket (installing it if missing),
# runs `go run . "$@"` in bench/, then stops and removes the server. Needs root (apt-get, su).
# `with-postgres.sh --exec CMD [ARGS...]` runs CMD instead, in the caller's directory (the
# flash sale's run.sh does).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")"
if [[ "${1:-}" == --exec ]]; then
  shift
  cd "$caller"
else
  set -- go run . "$@"
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

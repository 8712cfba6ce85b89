#!/usr/bin/env bash
# Runs the flash sale against a throwaway PostgreSQL, which bench/with-postgres.sh starts
# from Debian's postgresql package (installing it if missing) and removes afterwards: `go run
# . "$@"` here with PG_URL set. Needs root (apt-get, su). With PG_URL already set, uses that
# database instead. `run.sh test [go test flags]` runs the tests.
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
exec bash ../../bench/with-postgres.sh --exec "$@"

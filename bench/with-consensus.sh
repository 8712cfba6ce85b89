#!/usr/bin/env bash
# Runs the benchmark suite with the etcd and zookeeper peers included: starts a throwaway
# single-member etcd (Debian's etcd-server) and a standalone ZooKeeper (Debian's zookeeper) on
# free loopback ports in a temporary directory (installing the packages if missing), runs
# `go run . "$@"` in bench/ with ETCD_URL and ZK_ADDR set, then stops both servers and removes
# the directory. Both keep their default durability (every write fsynced to their log).
#
# PostgreSQL comes along: unless PG_URL is already set, the run goes through with-postgres.sh,
# which starts a throwaway PostgreSQL too; WITH_PG=0 leaves pg out. Needs root (apt-get, su).
#
#   bash bench/with-consensus.sh -out ../docs   # -out is relative to bench/
#   WITH_PG=0 bash bench/with-consensus.sh -only '^contended-4x8/(dlock|etcd|zookeeper)$' -duration 1s
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v etcd >/dev/null || need+=(etcd-server)
[ -e /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

D=$(mktemp -d)
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$D"
}
trap stop EXIT
trap 'exit 130' INT TERM

# freeport prints a loopback port nothing listens on (a connection to it is refused).
freeport() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

# ask PORT REQUEST prints the server's reply to REQUEST (an HTTP request or a ZooKeeper
# four-letter word); nothing if it does not answer.
ask() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf '%b' "$2" >&3 && timeout 2 cat <&3) 2>/dev/null || true
}

# await NAME LOG TEST... waits up to 60 s until TEST succeeds; shows the server's log if not.
await() {
  local name=$1 log=$2
  shift 2
  for _ in $(seq 600); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  echo "with-consensus.sh: $name did not come up; its log:" >&2
  tail -30 "$log" >&2
  exit 1
}

EP=$(freeport)
EPEER=$(freeport)
while [ "$EPEER" = "$EP" ]; do EPEER=$(freeport); done
etcd --name bench --data-dir "$D/etcd" --logger zap --log-level warn \
  --listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
  --listen-peer-urls "http://127.0.0.1:$EPEER" --initial-advertise-peer-urls "http://127.0.0.1:$EPEER" \
  --initial-cluster "bench=http://127.0.0.1:$EPEER" >"$D/etcd.log" 2>&1 &
pids+=($!)

ZP=$(freeport)
while [ "$ZP" = "$EP" ] || [ "$ZP" = "$EPEER" ]; do ZP=$(freeport); done
mkdir "$D/zk"
cat >"$D/zoo.cfg" <<EOF
tickTime=2000
dataDir=$D/zk
clientPort=$ZP
clientPortAddress=127.0.0.1
admin.enableServer=false
maxClientCnxns=0
4lw.commands.whitelist=srvr
EOF
# Debian's zookeeper.jar lists its dependencies in its manifest; slf4j-simple (a dependency of
# the package) sends the server's warnings to the log file.
java -Xmx512m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
  -cp "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar" \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$D/zoo.cfg" >"$D/zookeeper.log" 2>&1 &
pids+=($!)

etcd_up() { ask "$EP" 'GET /health HTTP/1.0\r\n\r\n' | grep -q '"health":"true"'; }
zk_up() { ask "$ZP" 'srvr' | grep -q '^Mode: standalone'; }
await etcd "$D/etcd.log" etcd_up
await ZooKeeper "$D/zookeeper.log" zk_up

export ETCD_URL="http://127.0.0.1:$EP" ZK_ADDR="127.0.0.1:$ZP"
if [ -z "${PG_URL:-}" ] && [ "${WITH_PG:-1}" != 0 ]; then
  bash ./with-postgres.sh "$@"
else
  go run . "$@"
fi

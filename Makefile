# dlock: `make demo` and `make test` do all set-up on a fresh Debian machine with Go.
GO ?= go

.PHONY: demo test test-ha test-rueidis bench bench-pg bench-all flashsale safety build redis-server prometheus clean

# redis-server is needed by the tests and by the demo's throwaway server; the failover tests
# also build a small clock-offset shim with the C compiler.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server missing: installing it with apt-get"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; }
	@command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || { \
	  echo "C compiler missing: installing gcc with apt-get"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc libc6-dev >/dev/null; }

# The Prometheus adapter's test (dlockprom/) scrapes its metrics with a real prometheus server.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "prometheus missing: installing it with apt-get"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus >/dev/null; }

build:
	cd cmd/dlock && $(GO) build -o ../../bin/dlock .

# The seeds' scenarios, without and with a lock, against a throwaway redis-server
# (or $$REDIS_URL when set).
demo: build
	@[ -n "$$REDIS_URL" ] || $(MAKE) --no-print-directory redis-server
	./bin/dlock demo

test: redis-server prometheus
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	cd cmd/dlock && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd dlockprom && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd dlockotel && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd dlockrueidis && $(GO) vet ./... # its tests and the suite on rueidis: make test-rueidis
	cd examples/usertest && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd examples/flashsale && $(GO) vet ./... # its run needs PostgreSQL: make flashsale

# The rueidis adapter (dlockrueidis/, its own module): its own tests, then the library's whole
# test suite again with every Client's scripts on rueidis (go test -overlay lays the hook in
# dlockrueidis/testdata over the root package's tests). About 4 minutes.
test-rueidis: redis-server
	cd dlockrueidis && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	ov=$$(mktemp) && trap 'rm -f '$$ov EXIT && \
	  printf '{"Replace":{"%s/rueidis_suite_test.go":"%s/dlockrueidis/testdata/suite_hook_test.go"}}\n' "$(CURDIR)" "$(CURDIR)" > $$ov && \
	  cd dlockrueidis && $(GO) test -race -count=1 -overlay $$ov github.com/dlock-go/dlock

# High availability (ha_test.go): Cluster graceful and forced failovers, a Sentinel failover
# and a paused-and-resumed Sentinel master, each repeated $$DLOCK_HA_REPS times (default 20)
# with 100 leases and 10 waiters on the failing shard; then the bytes a lock name leaves in
# Redis after a million names were locked once. About 15 minutes; ha.log keeps the details.
test-ha: redis-server
	@$(GO) test -tags ha -race -count=1 -timeout 60m -run '$(or $(HA_RUN),TestHA)' -v . > ha.log 2>&1; rc=$$?; \
	  grep -E '^(test-ha:|--- FAIL|FAIL|ok)|ha_test.go' ha.log; exit $$rc

# Side-by-side benchmarks against peer libraries (bench/ is its own module); writes
# docs/BENCHMARKS.md, docs/bench.jsonl and docs/chart.png. Set PG_URL to include PostgreSQL
# advisory locks. About 4 minutes.
bench: redis-server
	cd bench && $(GO) run . -out ../docs

# The same with PostgreSQL advisory locks (a throwaway server from Debian's postgresql).
bench-pg: redis-server
	bench/with-postgres.sh -out ../docs

# The same with PostgreSQL advisory locks, etcd's concurrency.Mutex and ZooKeeper's lock
# recipe too (throwaway servers from Debian's postgresql, etcd-server and zookeeper packages),
# for the seeds' ranking "database < ZooKeeper < Redis". Needs root (apt-get, su).
bench-all: redis-server
	bench/with-consensus.sh -out ../docs

# The seeds' flash sale as an HTTP service under a vegeta load (examples/flashsale, its own
# module): 1,000 users x 5 clicks for 500 items, without a lock, with dlock, redsync,
# bsm/redislock and PostgreSQL SELECT ... FOR UPDATE; a throwaway PostgreSQL and redis-server.
# Needs root (apt-get, su). About 15 seconds.
flashsale: redis-server
	bash examples/flashsale/run.sh

# Fault injection (client pauses, slow, cut and reset connections, Redis paused, killed and
# restarted, clock steps, notification connections killed, Cluster failovers, lock holders
# SIGKILLed) over Mutex, RWMutex, MultiLock, Semaphore and Latch, with checked
# histories and positive controls, then the replication trials (Sentinel failovers that lose
# a write, Redlock servers restarted empty). The full run (about 60 minutes) writes
# docs/SAFETY.md; SAFETY_QUICK=1 runs in about two minutes and writes nothing unless
# SAFETY_ARGS says -out. SAFETY_ARGS passes flags (-seed N, -only NAME; go run . -h).
safety: redis-server
	cd safety && $(GO) test -count=1 . && $(GO) run . $(if $(SAFETY_QUICK),,-out ../docs) $(SAFETY_ARGS)

clean:
	rm -rf bin

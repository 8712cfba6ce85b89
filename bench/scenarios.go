package main

import (
	"fmt"
	"regexp"
	"time"
)

// Keying says which lock (and counter) a goroutine uses.
const (
	keyShared = "shared"        // one lock and one counter for every goroutine of every process
	keyPerG   = "per-goroutine" // one lock and one counter per goroutine
	keyFresh  = "fresh"         // a new lock name for every operation, no counter
)

// Critical sections.
const (
	csNone    = "none"        // empty
	csGetSet  = "get-set"     // GET counter, SET counter+1 (not atomic: a lost increment is a broken lock)
	csGetWait = "get-2ms-set" // GET, sleep 2ms, SET
)

// A scenario is a throughput run: Procs worker processes × Goroutines goroutines, each looping
// lock, critical section, unlock until the run's end.
type scenario struct {
	ID         string
	Title      string
	Procs      int
	Goroutines int
	Keying     string
	CS         string
	Libs       []string // libraries this scenario runs, in report order
	Workload   string   // "" (every goroutine loops lock, CS, unlock on Keying), workRW or workMulti
	Note       string
}

var contendedLibs = []string{"dlock", "dlock-nocohort", "dlock-rueidis", "redsync", "redsync-1ms", "redsync-10ms", "redsync-100ms",
	"redislock-100ms", "redislock-10ms", "redislock-1ms", "rueidislock", "pg", "etcd", "zookeeper"}

var allLibs = append(append([]string(nil), contendedLibs...), "raw")

var scenarios = []scenario{
	{ID: "uncontended", Title: "1. Uncontended: 1 process × 1 goroutine, a fresh key per operation, empty critical section",
		Procs: 1, Goroutines: 1, Keying: keyFresh, CS: csNone, Libs: allLibs},
	{ID: "uncontended-1x8", Title: "1b. Uncontended 1×8: 1 process × 8 goroutines, a fresh key per operation, empty critical section",
		Procs: 1, Goroutines: 8, Keying: keyFresh, CS: csNone, Libs: allLibs},
	{ID: "contended-4x8", Title: "2. Contended 4×8: 4 processes × 8 goroutines, one key, critical section GET+SET",
		Procs: 4, Goroutines: 8, Keying: keyShared, CS: csGetSet, Libs: contendedLibs},
	{ID: "contended-8x1", Title: "3. Contended 8×1: 8 processes × 1 goroutine, one key, critical section GET+SET",
		Procs: 8, Goroutines: 1, Keying: keyShared, CS: csGetSet, Libs: contendedLibs},
	{ID: "cs-2ms", Title: "4. Long critical section: 4 processes × 8 goroutines, one key, GET + sleep 2ms + SET",
		Procs: 4, Goroutines: 8, Keying: keyShared, CS: csGetWait, Libs: contendedLibs},
	{ID: "independent", Title: "5. Independent keys: 1 process × 64 goroutines, one key and counter per goroutine, GET+SET",
		Procs: 1, Goroutines: 64, Keying: keyPerG, CS: csGetSet, Libs: contendedLibs},
	{ID: "waiters-256", Title: "6. Waiter scaling: 4 processes × 64 goroutines (256 waiters) on one key, GET+SET",
		Procs: 4, Goroutines: 64, Keying: keyShared, CS: csGetSet, Libs: contendedLibs,
		Note: "The 32-waiter side of the comparison is the contended 4×8 run (same shape with 8 goroutines per process)."},
	// Reported after the special scenarios (sections 10 and 11).
	{ID: "rw-4x8", Title: "10. Read-heavy 4×8: 4 processes × 8 goroutines, one name, 90 % reads (GET + 1 ms), 10 % writes (GET+SET)",
		Procs: 4, Goroutines: 8, Keying: keyShared, CS: csGetSet, Workload: workRW, Libs: rwLibs},
	{ID: "rw-1x32", Title: "10b. The read-heavy workload's ceiling: 1 process × 32 goroutines, the same operations",
		Procs: 1, Goroutines: 32, Keying: keyShared, CS: csGetSet, Workload: workRW, Libs: rwCeilingLibs,
		Note: "**local-rw** is Go's `sync.RWMutex` shared by the 32 goroutines of the one process: not a distributed lock, but the same rule (a waiting writer keeps new readers out) with a hand-off that costs almost nothing, so its ops/s are what this workload allows any lock on this machine. dlock-rw and pg-rw run the same shape beside it."},
	{ID: "multi-4x8", Title: "11. Multi-lock 4×8: 4 processes × 8 goroutines, each operation takes 2–3 random names of 16, GET+SET of each name's counter",
		Procs: 4, Goroutines: 8, Keying: "2–3 of 16", CS: csGetSet, Workload: workMulti, Libs: multiLibs},
	{ID: replUncontendedID, Title: "14. Replication safety, uncontended: 1 process × 1 goroutine, a fresh key per operation, empty critical section",
		Procs: 1, Goroutines: 1, Keying: keyFresh, CS: csNone, Libs: replLibs,
		Note: "**dlock-ack1**: `WithReplicaAck(1, 1s)` on a master with one replica (loopback). **dlock-redlock3/5**: `NewRedlock` over 3 / 5 independent servers (loopback; the main server is the first). **redsync-3/5**: redsync with 3 / 5 pools on the same servers. The Redis columns count the main server only (a Redlock's first master; dlock-ack1's master is another server, hence 0)."},
	{ID: redlockID, Title: "15. Redlock contended 4×8: 4 processes × 8 goroutines, one key on 5 independent masters, critical section GET+SET",
		Procs: 4, Goroutines: 8, Keying: keyShared, CS: csGetSet, Libs: redlockLibs,
		Note: "The critical section's counter is on the main server. **redsync-5-1ms**: `WithRetryDelay(1ms)`, `WithTries(1<<20)`."},
	{ID: semID, Title: "12. Semaphore 4×8: 4 processes × 8 goroutines, one semaphore of 4 permits, GET + sleep 2ms + SET of the holder's own counter",
		Procs: 4, Goroutines: 8, Keying: keySemOwn, CS: csGetWait, Libs: semLibs},
}

// rwLibs: dlock's RWMutex, dlock's Mutex on the same workload, PostgreSQL shared advisory locks.
var rwLibs = []string{"dlock-rw", "dlock", "pg-rw"}

// rwCeilingLibs: the read-heavy workload in one process, with an in-memory RWMutex as its ceiling.
var rwCeilingLibs = []string{"local-rw", "dlock-rw", "pg-rw"}

// multiLibs: dlock's MultiLock and ordered chains of single locks at three retry delays each.
var multiLibs = []string{"dlock", "redsync-chain-1ms", "redsync-chain-10ms", "redsync-chain-100ms",
	"redislock-chain-1ms", "redislock-chain-10ms", "redislock-chain-100ms"}

// Special scenarios (not throughput loops).
const (
	killedID = "killed-waiter"
	memoryID = "memory"
)

var killedLibs = []string{"dlock", "dlock-nocohort"}
var memoryLibs = []string{"dlock"}

// plannedRun is one (scenario, library) pair selected by -only.
type plannedRun struct {
	sc  *scenario // nil for the special scenarios
	id  string    // scenario id
	lib string
}

func (p plannedRun) name() string { return p.id + "/" + p.lib }

// plan lists the runs to do, in order: throughput scenarios, then killed waiter, then memory.
// enabled leaves out the optional peers whose server was not given.
func plan(only *regexp.Regexp, enabled func(lib string) bool) []plannedRun {
	var out []plannedRun
	add := func(sc *scenario, id, lib string) {
		if !enabled(lib) {
			return
		}
		r := plannedRun{sc: sc, id: id, lib: lib}
		if only != nil && !only.MatchString(r.name()) {
			return
		}
		out = append(out, r)
	}
	for i := range scenarios {
		for _, l := range scenarios[i].Libs {
			add(&scenarios[i], scenarios[i].ID, l)
		}
	}
	for _, l := range killedLibs {
		add(nil, killedID, l)
	}
	for _, l := range memoryLibs {
		add(nil, memoryID, l)
	}
	for _, l := range latchLibs {
		add(nil, latchID, l)
	}
	return out
}

// Sizes of the special scenarios.
const (
	killedReps    = 5
	memoryKeys    = 1000
	memoryPerKey  = 10
	memoryTimeout = 90 * time.Second
)

func (s *scenario) shape() string { return fmt.Sprintf("%d×%d", s.Procs, s.Goroutines) }

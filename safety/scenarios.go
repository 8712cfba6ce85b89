package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
)

// drift is the clients' WithDrift: a lease's validity window is TTL × (1 − drift).
const drift = 0.01

// safeLease is a lease's validity window in nanoseconds, TTL × (1 − drift): every counter and
// the model measure "could have expired" with it.
func safeLease(ttl time.Duration) int64 { return int64(float64(ttl) * (1 - drift)) }

// grantGrace is the TTL a release gives a lock it grants to a waiter, which holds it with
// that TTL until the lease's first renewal (dlock's safety model).
const grantGrace = 500 * time.Millisecond

// certainLease is how long after its acquire call a lease certainly holds its lock in Redis
// whatever its holder does: the validity window of the TTL, or of the grant's TTL if shorter
// (a granted lease, whose first renewal its holder may not live to send). Beyond that only
// the end of the window its holder last read counts.
func certainLease(ttl time.Duration) int64 { return safeLease(min(ttl, grantGrace)) }

// A scenario is one workload under one fault.
type scenario struct {
	Name     string `json:"name"`
	Workload string `json:"workload"` // "fenced", "lockset", "rw" (RWMutex), "multi" (MultiLock beside Mutexes), "sem" (Semaphore) or "latch"
	Fault    string `json:"fault"`    // "", "F1", "F2", "F3", "F4", "F5", "F6-restart", "F6-aof", "F6-delayed", "F9", "notify", "cluster-failover", "cluster-kill", "kill" (client SIGKILL)
	Weak     string `json:"control,omitempty"`
	// Catch lists what a control must show (kinds dlock guarantees in the scenario it mirrors)
	// for the run to count it as caught.
	Catch  []string `json:"catch,omitempty"`
	Renew  bool     `json:"renew,omitempty"`  // leases renewed by the watchdog, work longer than the TTL
	Try    bool     `json:"try,omitempty"`    // TryLock attempts
	Extend bool     `json:"extend,omitempty"` // Lease.Extend in the critical section
	Long   bool     `json:"long,omitempty"`   // runs longer in the full run (F1's size target)
	// WorkTTL, when set, is the work per round as a fraction of the TTL (default: the short
	// fixed work, or 1.5 with Renew, so the watchdog must keep the lease).
	WorkTTL float64 `json:"work_ttl,omitempty"`
	// Default runs dlock as shipped (cohorting on) with Goroutines goroutines per client
	// process (default 4) taking the same locks, re-entering through Lease.Context in 30% of
	// critical sections.
	Default    bool `json:"default,omitempty"`
	Goroutines int  `json:"goroutines,omitempty"`
	// TTL, when set, is the scenario's lease TTL in both runs (loss detection is measured
	// against the notifier's and renewer's periods, which a 150-250ms TTL would hide).
	TTL time.Duration `json:"ttl,omitempty"`
	// Cluster puts the locks on a Redis Cluster of 3 masters and 3 replicas.
	Cluster bool `json:"cluster,omitempty"`
	// OpTimeout bounds each round (default 2s): longer where Lock must wait out a failover.
	OpTimeout time.Duration `json:"op_timeout,omitempty"`
	// FullOnly leaves the scenario out of the quick run (CI's time budget).
	FullOnly bool `json:"full_only,omitempty"`
	// FullDur and QuickDur, when set, replace the run's scenario duration.
	FullDur  time.Duration `json:"full_dur,omitempty"`
	QuickDur time.Duration `json:"quick_dur,omitempty"`
	// Guarantee lists what dlock promises here (a count above 0 is a violation); Expected
	// lists the documented limits, measured and reported beside them.
	Guarantee []string `json:"guarantee"`
	Expected  []string `json:"expected"`
	About     string   `json:"about"`
}

// all is every kind of violation the checker counts (but "unexplained", which only means
// something where a fault may lose acknowledged writes).
var all = []string{"overlaps", "double", "tokens", "stale", "lost", "foreign", "expired", "illegal", "false", "reentry"}

// primitives is what the rw and multi workloads check (they touch no resource and do not
// read the hold back after a loss).
var primitives = []string{"overlaps", "double", "tokens", "foreign", "expired", "illegal"}

// semaphore is what the sem workload checks: the permits held at once by the validity windows
// (overlaps) and by the holds Redis certainly kept (double), tokens, permits that never came
// back, and killed holders' permits kept past their TTL.
var semaphore = []string{"overlaps", "double", "tokens", "permits-lost", "permits-late"}

func except(drop ...string) []string {
	var out []string
next:
	for _, k := range all {
		for _, d := range drop {
			if k == d {
				continue next
			}
		}
		out = append(out, k)
	}
	return out
}

var scenarios = []scenario{
	{Name: "baseline-lockset", Workload: "lockset", Guarantee: all,
		About: "no fault: the lock alone keeps read-modify-write exact"},
	{Name: "baseline-fenced", Workload: "fenced", Guarantee: all, About: "no fault, fenced register"},
	{Name: "F1-fenced", Workload: "fenced", Fault: "F1", Long: true, Guarantee: all,
		About: "holders paused (SIGSTOP) for 0.5-3 x TTL, often between their last check and their write; the register refuses the stale tokens"},
	{Name: "F1-lockset", Workload: "lockset", Fault: "F1", Long: true, Guarantee: except("lost"), Expected: []string{"lost"},
		About: "the same pauses on an unfenced read-modify-write: the lost updates are the reason fencing exists"},
	{Name: "F2-fenced", Workload: "fenced", Fault: "F2", Try: true, Guarantee: all,
		About: "every reply from the lock's Redis delayed 1.2 x TTL (toxiproxy latency) for 2 x TTL at a time, TryLock attempts: no lease may be handed out already expired"},
	{Name: "F3-fenced", Workload: "fenced", Fault: "F3", Guarantee: all,
		About: "a holder's writes to the resource delayed 0.5-3 x TTL (toxiproxy latency on its link): they arrive after its lease ended"},
	{Name: "F4-fenced", Workload: "fenced", Fault: "F4", Renew: true, Extend: true, WorkTTL: 0.5, Guarantee: all,
		About: "client-Redis partitions for 1.5 x TTL (toxiproxy timeout) and connection resets (reset_peer), while holders work TTL/2 with the watchdog renewing and an explicit Extend half-way: no release or extend of another owner's lock"},
	{Name: "F5-lockset", Workload: "lockset", Fault: "F5", Guarantee: all, About: "Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "F6-restart", Workload: "lockset", Fault: "F6-restart", Guarantee: []string{"tokens", "stale", "foreign", "expired", "false"},
		Expected: []string{"overlaps", "double", "lost", "illegal"},
		About:    "Redis killed and restarted at once without persistence: it forgets its locks, so a lock can be granted twice (documented)"},
	{Name: "F6-aof", Workload: "lockset", Fault: "F6-aof", Guarantee: all, About: "Redis killed and restarted with appendfsync always"},
	{Name: "F6-delayed", Workload: "lockset", Fault: "F6-delayed", Guarantee: all,
		About: "Redis killed and restarted after 2 x TTL, without persistence"},
	{Name: "F9-lockset", Workload: "lockset", Fault: "F9", Renew: true, Guarantee: all,
		About: "every client's wall clock steps an hour forward or back every TTL/2 (injected with WithClock), renewed leases held for 1.5 x TTL: no effect"},
	{Name: "default-baseline-lockset", Workload: "lockset", Default: true, Renew: true, WorkTTL: 0.02, Guarantee: all,
		About: "dlock as shipped: cohorting on (no WithoutCohort), the watchdog renewing, 4 goroutines per process on the same locks, 30% of critical sections re-entering through Lease.Context; no fault: the lock alone keeps read-modify-write exact across goroutines and processes"},
	{Name: "default-F1-fenced", Workload: "fenced", Fault: "F1", Default: true, Renew: true, WorkTTL: 0.1, Guarantee: all,
		About: "the default mode under F1's pauses (every goroutine of the paused process stops; renewals stop with them)"},
	{Name: "default-F4-fenced", Workload: "fenced", Fault: "F4", Default: true, Renew: true, Extend: true, WorkTTL: 0.5, Guarantee: all,
		About: "the default mode under F4's partitions and resets, holders working TTL/2 with an Extend half-way"},
	{Name: "notify-fenced", Workload: "fenced", Fault: "notify", Default: true, Goroutines: 2, Renew: true, TTL: 2 * time.Second, WorkTTL: 0.3,
		OpTimeout: 10 * time.Second, FullDur: 90 * time.Second, QuickDur: 2500 * time.Millisecond, Guarantee: all,
		About: "every 0.2-0.6s the nemesis kills the lock Redis's dlock-notify connections of one kind (tracking and pub/sub alternately), force-releases a held lock (ForceRelease or a plain DEL, alternately), or both, the force right after the kill: a holder must see the loss across the reconnect, and the kills alone must end no lease; TTL 2s, so the watchdog (every TTL/4) does not find a loss first as a rule"},
	{Name: "cluster-failover-fenced", Workload: "fenced", Fault: "cluster-failover", Cluster: true, Default: true, Renew: true, TTL: 2 * time.Second,
		WorkTTL: 0.25, OpTimeout: 10 * time.Second, QuickDur: 2 * time.Second, Guarantee: all,
		About: "locks on a Redis Cluster (3 masters, 3 replicas, node timeout 1s), go-redis ClusterClient: graceful CLUSTER FAILOVER on the replica of a master that owns one of the locks, about every second; the replica catches up first, so every guarantee holds and no lease may end while its hold survives"},
	{Name: "cluster-kill-fenced", Workload: "fenced", Fault: "cluster-kill", Cluster: true, Default: true, Renew: true, TTL: 2 * time.Second,
		WorkTTL: 0.1, OpTimeout: 10 * time.Second, FullDur: 90 * time.Second, QuickDur: 2500 * time.Millisecond,
		Guarantee: []string{"tokens", "stale", "foreign", "expired", "false", "reentry", "unexplained"},
		Expected:  []string{"overlaps", "double", "illegal"},
		About:     "the same Cluster, a master that owns one of the locks killed (SIGKILL), its replica promoted by the cluster (about 2s), the killed node restarted to rejoin as a replica; replication is asynchronous, so a lock the replica missed can be granted twice (documented, counted as expected), but not a lock whose hold no kill spanned (unexplained), and no lease may end while its hold survives"},
	// Issue 10: RWMutex and MultiLock under the faults whose guarantees they share with Mutex.
	{Name: "rw-F1", Workload: "rw", Fault: "F1", FullDur: 30 * time.Second, Guarantee: primitives,
		About: "RWMutex, half the rounds RLock and half Lock, holders paused (SIGSTOP) for 0.5-3 x TTL: no writer's window overlaps another lease's (reader or writer), readers may overlap readers, a write token is above every earlier lease's and a reader's above every earlier writer's"},
	{Name: "rw-default-F1", Workload: "rw", Fault: "F1", Default: true, FullDur: 30 * time.Second, Guarantee: primitives,
		About: "rw-F1 as shipped: cohorting on, 4 goroutines per process, so the readers of a process share Redis read holds (reader cohorting) and wait behind one of them; holders paused (SIGSTOP) for 0.5-3 x TTL: a paused reader's shared hold ends for every reader of it, and no writer's window overlaps any of theirs"},
	{Name: "rw-F5", Workload: "rw", Fault: "F5", FullOnly: true, FullDur: 30 * time.Second, Guarantee: primitives,
		About: "RWMutex readers and writers, Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "rw-F6-aof", Workload: "rw", Fault: "F6-aof", FullOnly: true, FullDur: 30 * time.Second, Guarantee: primitives,
		About: "RWMutex readers and writers, Redis killed and restarted with appendfsync always (without persistence a restart forgets read and write holds alike, as F6-restart shows for Mutex)"},
	{Name: "rw-cluster-failover", Workload: "rw", Fault: "cluster-failover", Cluster: true, Renew: true, TTL: 2 * time.Second, WorkTTL: 0.25,
		OpTimeout: 10 * time.Second, FullOnly: true, FullDur: 45 * time.Second, Guarantee: primitives,
		About: "RWMutex readers and writers on the Redis Cluster of cluster-failover-fenced (one goroutine per process, no cohorting, the watchdog renewing), graceful failovers about every second"},
	{Name: "multi-F1", Workload: "multi", Fault: "F1", FullOnly: true, FullDur: 30 * time.Second, Guarantee: primitives,
		About: "half the rounds a MultiLock over 2-3 of the locks, half a plain Mutex on one of the same names, holders paused (SIGSTOP) for 0.5-3 x TTL: each member of a multi-lock lease counts as an exclusive lease on that lock (with its member token), so no multi-lock window may overlap a Mutex's or another multi-lock's on any member"},
	{Name: "multi-F5", Workload: "multi", Fault: "F5", FullDur: 30 * time.Second, Guarantee: primitives,
		About: "MultiLock and Mutex holders on the same names, Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "multi-F6-aof", Workload: "multi", Fault: "F6-aof", FullOnly: true, FullDur: 30 * time.Second, Guarantee: primitives,
		About: "MultiLock and Mutex holders, Redis killed and restarted with appendfsync always"},
	{Name: "multi-cluster-failover", Workload: "multi", Fault: "cluster-failover", Cluster: true, Renew: true, TTL: 2 * time.Second, WorkTTL: 0.25,
		OpTimeout: 10 * time.Second, FullOnly: true, FullDur: 45 * time.Second, Guarantee: primitives,
		About: "MultiLock (members on different masters as a rule) and Mutex holders on the Redis Cluster, graceful failovers about every second"},
	// Issue 11: Semaphore and Latch.
	{Name: "sem-F1", Workload: "sem", Fault: "F1", FullDur: 30 * time.Second, Guarantee: semaphore,
		About: "semaphores of 3 permits (a quarter as many as locks, so 4 clients to each), each round Acquire of 1 (3 in 5), 2 or 3 permits, holders paused (SIGSTOP) for 0.5-3 x TTL: the validity windows open at any moment hold at most 3 permits, so do the holds Redis certainly keeps, tokens never go back, and a TTL after the run every permit can be taken again"},
	{Name: "sem-F5", Workload: "sem", Fault: "F5", FullOnly: true, FullDur: 30 * time.Second, Guarantee: semaphore,
		About: "the semaphores of sem-F1, Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "sem-F6-aof", Workload: "sem", Fault: "F6-aof", FullOnly: true, FullDur: 30 * time.Second, Guarantee: semaphore,
		About: "the semaphores of sem-F1, Redis killed and restarted with appendfsync always"},
	{Name: "sem-kill", Workload: "sem", Fault: "kill", FullDur: 45 * time.Second, Guarantee: semaphore,
		About: "the semaphores of sem-F1, every 2-2.5 x TTL the process holding permits of one of them SIGKILLed (a fresh client started in its place): the killed holder's lease (read back from what it left before working) counts in the checks, its permits are free again at most a TTL after the kill (the deadline Redis keeps for its hold), and none is lost"},
	{Name: "latch-F1", Workload: "latch", Fault: "F1", FullDur: 30 * time.Second, Guarantee: []string{"early"},
		About: "count-down latches (a quarter as many as locks), each round at random TrySetCount(1-3), CountDown or Wait (at most 500ms), clients paused (SIGSTOP) for 0.5-3 x TTL: no Wait returns while the count was certainly above zero (a count set before the Wait began, fewer CountDowns that could have applied before it returned, no new count in between)"},
	{Name: "latch-F5", Workload: "latch", Fault: "F5", FullOnly: true, FullDur: 30 * time.Second, Guarantee: []string{"early"},
		About: "the latches of latch-F1, Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "latch-F6-aof", Workload: "latch", Fault: "F6-aof", FullOnly: true, FullDur: 30 * time.Second, Guarantee: []string{"early"},
		About: "the latches of latch-F1, Redis killed and restarted with appendfsync always"},
	{Name: "control-sem-kill", Workload: "sem", Fault: "kill", Weak: "incr", FullDur: 30 * time.Second, Catch: []string{"permits-lost"},
		About: "control: sem-kill with a semaphore without leases (INCRBY the permits out, DECRBY back when over 3, DECRBY to release): a killed holder's permits never come back"},
	{Name: "control-latch-F1", Workload: "latch", Fault: "F1", Weak: "early", FullDur: 30 * time.Second, Catch: []string{"early"},
		About: "control: latch-F1 with a Wait that returns at a count of 1, one CountDown too soon"},
	{Name: "control-rw-F1", Workload: "rw", Fault: "F1", Weak: "readwriter", FullDur: 30 * time.Second, Catch: []string{"overlaps", "double", "illegal"},
		About: "control: rw-F1 with writers that take only a read lease (RLock) and write as if alone"},
	{Name: "control-multi-F1", Workload: "multi", Fault: "F1", Weak: "early", FullDur: 30 * time.Second, Catch: []string{"overlaps", "double", "illegal"},
		About: "control: multi-F1 with multi-locks taken one member at a time with Mutexes (not all or nothing), the last member released at once while the holder goes on as if it held them all"},
	{Name: "control-default-lockset", Workload: "lockset", Default: true, Renew: true, WorkTTL: 0.02, Weak: "shared", Catch: []string{"overlaps", "double", "tokens", "lost", "illegal"},
		About: "control: the default mode with goroutines that do not exclude each other (a goroutine re-enters the lease another goroutine of its process holds, as if holders were processes, not goroutines)"},
	{Name: "control-F1-lockset", Workload: "lockset", Fault: "F1", Weak: "nodel", Catch: []string{"overlaps", "double", "foreign", "illegal"},
		About: "control: SET NX PX + plain DEL, no owner check"},
	{Name: "control-F1-fenced", Workload: "fenced", Fault: "F1", Weak: "nofence", Catch: []string{"stale", "illegal"},
		About: "control: dlock's lock, register writes without the token check"},
	{Name: "control-F3-fenced", Workload: "fenced", Fault: "F3", Weak: "nofence", Catch: []string{"stale", "illegal"},
		About: "control: slow writes without the token check"},
	{Name: "control-F9-lockset", Workload: "lockset", Fault: "F9", Weak: "wallclock", Renew: true, Catch: []string{"overlaps", "double", "lost", "illegal"},
		About: "control: dlock given a clock without monotonic readings, so it follows the wall clock's steps"},
}

// result is one scenario's outcome.
type result struct {
	Scenario scenario `json:"scenario"`
	Verdict  verdict  `json:"verdict"`
	Faults   int      `json:"faults"`
	Control  bool     `json:"control"`
	Seconds  float64  `json:"seconds"`
	TTLms    int64    `json:"ttl_ms"`
	Clients  int      `json:"clients"`
	Locks    int      `json:"locks"`
	Seed     int64    `json:"seed"`
	// Goroutines per client process (default-mode workload), 1 otherwise.
	Goroutines int `json:"goroutines"`
}

func (r result) count(what string) int {
	v := r.Verdict
	switch what {
	case "overlaps":
		return v.Overlaps
	case "stale":
		return v.StaleAccepted
	case "lost":
		return v.LostUpdates
	case "foreign":
		return v.ForeignReleases
	case "expired":
		return v.ExpiredHandedOut
	case "double":
		return v.DoubleGrants
	case "tokens":
		return v.TokenRegressions
	case "illegal":
		if v.Porcupine == "illegal" {
			return 1
		}
	case "false":
		return v.FalseLosses
	case "reentry":
		return v.ReentryErrors
	case "unexplained":
		return v.Unexplained
	case "permits-lost":
		return v.PermitsLost
	case "permits-late":
		return v.PermitsLate
	case "early":
		return v.LatchEarly
	}
	return 0
}

// Violations counts breaches of what dlock guarantees in this scenario.
func (r result) Violations() int {
	n := 0
	for _, g := range r.Scenario.Guarantee {
		n += r.count(g)
	}
	return n
}

// Caught reports whether a control run showed the harness can see a broken lock: a count
// above 0 of what the mirrored dlock scenario guarantees.
func (r result) Caught() bool {
	for _, k := range r.Scenario.Catch {
		if r.count(k) > 0 {
			return true
		}
	}
	return false
}

type params struct {
	quick        bool
	fixedDur     bool // -dur given: it overrides every scenario's duration
	dur, longDur time.Duration
	ttl, work    time.Duration
	clients      int
	locks        int
	checkTimeout time.Duration
	htmlDir      string
}

// paramsFor returns the full run's parameters, or the quick run's; dur > 0 overrides every
// scenario's duration.
func paramsFor(quick bool, dur time.Duration, htmlDir string) params {
	p := params{dur: 60 * time.Second, longDur: 280 * time.Second, ttl: 250 * time.Millisecond, work: 5 * time.Millisecond,
		clients: 16, locks: 16, checkTimeout: 2 * time.Minute, htmlDir: htmlDir}
	if quick {
		p = params{dur: 2 * time.Second, longDur: 2 * time.Second, ttl: 150 * time.Millisecond, work: 5 * time.Millisecond,
			clients: 4, locks: 2, checkTimeout: 20 * time.Second, htmlDir: htmlDir}
	}
	p.quick = quick
	if dur > 0 {
		p.dur, p.longDur, p.fixedDur = dur, dur, true
	}
	return p
}

func runAll(p params, only string, seed int64) ([]result, error) {
	match, err := regexp.Compile(only)
	if err != nil {
		return nil, fmt.Errorf("-only: %w", err)
	}
	var results []result
	for i, s := range scenarios {
		if !match.MatchString(s.Name) || p.quick && s.FullOnly {
			continue
		}
		r, err := runScenario(s, p, seed+int64(i))
		// A control that caught nothing runs again (up to 3 times in all): its job is to show
		// the checker can see a broken lock, and a short run can miss the moment.
		for try := 1; err == nil && s.Weak != "" && !r.Caught() && try < 3; try++ {
			fmt.Printf("%-24s caught nothing in run %d of 3; running it again\n", s.Name, try)
			r, err = runScenario(s, p, seed+int64(i)+int64(try)*1000)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		v := r.Verdict
		fmt.Printf("%-24s %6d acq %4d faults  leases lost %d  overlaps %d double %d tokens %d stale %d lost %d foreign %d expired %d false %d reentry %d/%d porcupine %s  unknown ops %d  violations %d  %.0fs%s\n",
			s.Name, v.Acquisitions, r.Faults, v.LeasesLost, v.Overlaps, v.DoubleGrants, v.TokenRegressions, v.StaleAccepted, v.LostUpdates, v.ForeignReleases, v.ExpiredHandedOut,
			v.FalseLosses, v.ReentryErrors, v.Reentries, v.Porcupine, v.Unknown, r.Violations(), r.Seconds, controlNote(r))
		if extra := extraLine(r); extra != "" {
			fmt.Printf("%-24s %s\n", "", extra)
		}
		if v.PorcupineHTML != "" {
			fmt.Printf("%-24s porcupine visualisation: %s\n", "", v.PorcupineHTML)
		}
		results = append(results, r)
	}
	return results, nil
}

// extraLine reports the figures of the newer nemeses: forced releases and how fast they were
// noticed, Cluster unavailability, unexplained overlaps.
func extraLine(r result) string {
	v := r.Verdict
	var parts []string
	if v.Forces > 0 {
		parts = append(parts, fmt.Sprintf("forced %d: noticed %d (%s; right after a connection kill: %s), missed until Unlock %d, no holder %d; lost without a force %d",
			v.Forces, v.ForcesNoticed, v.Notice, v.NoticeKill, v.ForcesMissed, v.ForceNoHolder, v.LostUnforced))
	}
	if v.Unavailable != nil {
		parts = append(parts, "locks unavailable per fault: "+v.Unavailable.String())
	}
	if r.Scenario.Cluster {
		parts = append(parts, fmt.Sprintf("unexplained overlaps/double grants %d", v.Unexplained))
	}
	if r.Scenario.Workload == "sem" {
		parts = append(parts, semLine(r))
	}
	if r.Scenario.Workload == "latch" {
		parts = append(parts, fmt.Sprintf("waits returned %d, early %d", v.LatchWaits, v.LatchEarly))
	}
	return strings.Join(parts, "; ")
}

func controlNote(r result) string {
	if !r.Control {
		return ""
	}
	if r.Caught() {
		return "  (control: caught)"
	}
	return "  (control: CAUGHT NOTHING)"
}

func runScenario(s scenario, p params, seed int64) (result, error) {
	ttl := p.ttl
	if s.TTL > 0 {
		ttl = s.TTL
	}
	goroutines := 1
	if s.Default {
		goroutines = 4
		if s.Goroutines > 0 {
			goroutines = s.Goroutines
		}
	}
	// Semaphores and latches are shared by more clients each: a quarter as many.
	locks := p.locks
	if s.Workload == "sem" || s.Workload == "latch" {
		locks = max(1, locks/4)
	}
	r := result{Scenario: s, Control: s.Weak != "", TTLms: ttl.Milliseconds(), Clients: p.clients, Locks: locks, Seed: seed, Goroutines: goroutines}
	e := &env{p: p, ttl: ttl, paused: map[int]bool{}, seed: r.Seed}
	lockURL := ""
	var clusterAddrs []string
	if s.Cluster {
		cl, err := redisserver.StartCluster(redisserver.ClusterConfig{})
		if err != nil {
			return r, err
		}
		defer cl.Stop()
		e.cluster, clusterAddrs = cl, cl.Addrs()
	} else {
		// TCP where a proxy sits in between, unix sockets otherwise.
		cfg := redisserver.Config{TCP: s.Fault == "F2" || s.Fault == "F4"}
		if s.Fault == "F6-aof" {
			cfg.Args = []string{"--appendonly", "yes", "--appendfsync", "always"}
		}
		lockSrv, err := redisserver.Start(cfg)
		if err != nil {
			return r, err
		}
		defer lockSrv.Stop()
		e.lockSrv, lockURL = lockSrv, lockSrv.URL()
	}
	resSrv, err := redisserver.Start(redisserver.Config{TCP: s.Fault == "F3"})
	if err != nil {
		return r, err
	}
	defer resSrv.Stop()
	dir, err := os.MkdirTemp("", "dlock-safety-")
	if err != nil {
		return r, err
	}
	if os.Getenv("SAFETY_KEEP") == "" {
		defer os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "safety: %s: histories kept in %s\n", s.Name, dir)
	}

	e.res = resSrv.Client()
	defer e.res.Close()
	tx := newToxics()
	if s.Fault == "F2" || s.Fault == "F4" {
		if e.lockPx, err = tx.proxy(e.lockSrv.Addr); err != nil {
			return r, err
		}
		defer e.lockPx.Stop()
		lockURL = proxyURL(e.lockPx)
	}
	if err := e.setUp(s.Fault, s.Workload); err != nil {
		return r, err
	}
	defer e.tearDown()
	work := p.work
	if s.Renew {
		work = ttl * 3 / 2
	}
	if s.WorkTTL > 0 {
		work = time.Duration(float64(ttl) * s.WorkTTL)
	}
	opTimeout := 2 * time.Second
	if s.OpTimeout > 0 {
		opTimeout = s.OpTimeout
	}
	dur := p.dur
	if s.Long {
		dur = p.longDur
	}
	if !p.fixedDur && !p.quick && s.FullDur > 0 {
		dur = s.FullDur
	}
	if !p.fixedDur && p.quick && s.QuickDur > 0 {
		dur = s.QuickDur
	}
	start := time.Now()
	until := mono() + int64(dur)
	specFor := func(id int, writeURL string) clientSpec {
		spec := clientSpec{ID: id, LockURL: lockURL, ResURL: resSrv.URL(), WriteURL: writeURL, Workload: s.Workload, Weak: s.Weak,
			TTL: ttl, Work: work, Until: until, Locks: locks, HistPath: filepath.Join(dir, fmt.Sprintf("c%d.jsonl", id)),
			Drift: drift, OpTimeout: opTimeout, Seed: r.Seed, Renew: s.Renew, Try: s.Try, Extend: s.Extend, Clock: s.Fault == "F9",
			ClusterAddrs: clusterAddrs, Default: s.Default, Goroutines: goroutines}
		if s.Default {
			spec.Reenter = 0.3
		}
		return spec
	}
	e.locks, e.until, e.dead = locks, until, map[int]bool{}
	e.spawn = func(id int) (*exec.Cmd, error) { return startClient(specFor(id, "")) }
	e.procs = make([]*exec.Cmd, p.clients)
	for i := range e.procs {
		writeURL := ""
		if s.Fault == "F3" {
			px, err := tx.proxy(resSrv.Addr)
			if err != nil {
				return r, err
			}
			defer px.Stop()
			e.resPx = append(e.resPx, px)
			writeURL = proxyURL(px)
		}
		cmd, err := startClient(specFor(i+1, writeURL))
		if err != nil {
			return r, err
		}
		e.procs[i] = cmd
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	e.stop = stop
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.Faults = nemesis(s.Fault, e)
	}()
	e.startProbes(stop, &wg)
	// The kill nemesis adds clients as it goes: wait for every one, those it started after
	// the first ones ended included. A client it killed ends with an error, as it should.
	var failed error
	waited := 0
	waitAll := func() {
		for {
			e.mu.Lock()
			if waited >= len(e.procs) {
				e.mu.Unlock()
				return
			}
			cmd := e.procs[waited]
			e.mu.Unlock()
			waited++
			err := waitTimeout(cmd, dur+30*time.Second+opTimeout)
			e.mu.Lock()
			killed := e.dead[waited]
			e.mu.Unlock()
			if err != nil && !killed && failed == nil {
				failed = fmt.Errorf("client: %w", err)
			}
		}
	}
	waitAll()
	close(stop)
	wg.Wait()
	waitAll()
	if failed != nil {
		return r, failed
	}
	var ops []op
	for i := range e.procs {
		h, err := readHistory(filepath.Join(dir, fmt.Sprintf("c%d.jsonl", i+1)))
		if err != nil {
			return r, err
		}
		ops = append(ops, h...)
	}
	ops = append(ops, notRecorded(ops, e.nemOps)...)
	var finals map[int]int64
	if s.Workload == "lockset" {
		finals = map[int]int64{}
		for i := range p.locks {
			finals[i], _ = e.res.Get(context.Background(), fmt.Sprintf("counter:%d", i)).Int64()
		}
	}
	r.Verdict = check(ops, finals, ttl, s.Try, e.kills)
	if s.Workload == "sem" {
		r.Verdict.PermitsLost = e.lostPermits(s.Weak)
		r.Verdict.Kills = len(e.dead)
		r.Verdict.PermitsBack = distOf(e.permitsBack)
		for _, b := range e.permitsBack {
			if b > int64(ttl+permitSlack) {
				r.Verdict.PermitsLate++
			}
		}
	}
	r.Verdict.Unavailable = e.unavailability()
	r.Verdict.Porcupine, r.Verdict.PorcupineUnknown, r.Verdict.PorcupineHTML = linearize(ops, ttl, p.htmlDir, s.Name, p.checkTimeout)
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

func waitTimeout(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not finish within %v", d)
	}
}

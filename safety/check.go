package main

import (
	"fmt"
	"sort"
	"time"
)

// verdict is what the checker finds in one scenario's histories.
type verdict struct {
	Ops          int `json:"ops"`
	Acquisitions int `json:"acquisitions"`
	Unknown      int `json:"unknown"`  // operations whose outcome is unknown (lost replies)
	Overlaps     int `json:"overlaps"` // two clients' validity windows overlapping
	// StaleAccepted counts writes the fenced register accepted after a higher token's write:
	// a write that started after a higher-token write returned, or a read that returned a
	// lower token than a write that had returned before the read started.
	StaleAccepted int `json:"stale_accepted"`
	Increments    int `json:"increments"`   // successful read-modify-writes (lockset)
	LostUpdates   int `json:"lost_updates"` // increments minus the final counters (lockset)
	// ForeignReleases counts releases and extends that succeeded although another client had
	// acquired the lock since the releaser's own acquire returned.
	ForeignReleases int `json:"foreign_releases"`
	// ExpiredHandedOut counts single acquire attempts (TryLock) that returned a lease after
	// call + TTL × (1 − drift) + expiredSlack: a lease already over when handed out.
	ExpiredHandedOut int `json:"expired_handed_out"`
	// DoubleGrants counts acquires that returned while another client's lease, acquired just
	// before, could not yet have expired and had not been released (or possibly released,
	// when its release's outcome is unknown).
	DoubleGrants int `json:"double_grants"`
	// TokenRegressions counts acquires whose token was not above that of an acquire that had
	// returned before they were called.
	TokenRegressions int `json:"token_regressions"`
	// LeasesLost counts leases that ended (Done) before their holder released them: not a
	// violation, the measure of how often a fault cost a holder its lease.
	LeasesLost int `json:"leases_lost"`
	// Porcupine is the linearizability check's result: "ok", "illegal" or "unknown" (it
	// timed out); PorcupineUnknown counts locks whose check timed out.
	Porcupine        string `json:"porcupine"`
	PorcupineUnknown int    `json:"porcupine_unknown"`
	PorcupineHTML    string `json:"porcupine_html,omitempty"`

	// FalseLosses counts leases that ended by an answer from Redis (not by their safe
	// deadline) although their hold was still there: the client read the lock right after the
	// loss and found the same owner and token block. dlock promises that only a definite
	// answer from the lock's current master ends a lease.
	FalseLosses int `json:"false_losses"`
	// Re-entry through Lease.Context (default-mode workload): re-entries granted, anomalies
	// (an inner lease with another token or owner, an inner Unlock that let the outer lease
	// go, an inner Unlock that failed while the outer lease held on), and re-entries refused
	// while the outer lease still had time left by its holder's reading (not counted: it may
	// have been ending).
	Reentries      int `json:"reentries,omitempty"`
	ReentryErrors  int `json:"reentry_errors"`
	ReentryRefused int `json:"reentry_refused,omitempty"`
	// Forced releases (notification nemesis): how many found the lock held, how many of those
	// the broken lease's holder saw (Done) before it released, how many it only learnt of at
	// its Unlock (missed), and leases lost without a force (neither is a violation).
	Forces        int `json:"forces,omitempty"`
	ForcesNoticed int `json:"forces_noticed,omitempty"`
	ForcesMissed  int `json:"forces_missed,omitempty"`
	LostUnforced  int `json:"lost_unforced,omitempty"`
	ForceNoHolder int `json:"force_no_holder,omitempty"`
	// Notice latencies (ms) from a forced release's call to its holder seeing Done: all,
	// and those forced right after the notification connections were killed.
	Notice     *dist `json:"notice_ms,omitempty"`
	NoticeKill *dist `json:"notice_after_kill_ms,omitempty"`
	// Unexplained counts overlaps and double grants whose earlier lease's hold did not span
	// a fault that may lose acknowledged writes (a Cluster master killed): with no such
	// fault in between, nothing excuses them.
	Unexplained int `json:"unexplained"`
	// Semaphores (issue 11): the permits a semaphore could not hand out at the end of the run,
	// once every client had stopped and a TTL had passed (lost for good); the client kills,
	// and for each kill of a holder, how long after it its permits were free again by the
	// deadline Redis kept for its hold (late: more than a TTL).
	PermitsLost int   `json:"permits_lost"`
	Kills       int   `json:"kills,omitempty"`
	PermitsLate int   `json:"permits_late"`
	PermitsBack *dist `json:"permits_back_ms,omitempty"`
	// Latches: Waits that returned ok, and those that returned while the count was certainly
	// above zero.
	LatchWaits int `json:"latch_waits,omitempty"`
	LatchEarly int `json:"latch_early"`
	// Unavailable (Cluster nemeses): per fault, the longest gap between successful probe
	// TryLocks on the failing master's slots around it, in ms.
	Unavailable *dist `json:"unavailable_ms,omitempty"`
}

// dist summarises durations in milliseconds.
type dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func distOf(ns []int64) *dist {
	if len(ns) == 0 {
		return nil
	}
	s := append([]int64(nil), ns...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) float64 {
		i := int(q * float64(len(s)-1))
		return float64(s[i]) / 1e6
	}
	return &dist{N: len(s), P50: at(0.5), P99: at(0.99), Max: float64(s[len(s)-1]) / 1e6}
}

func (d *dist) String() string {
	if d == nil {
		return "-"
	}
	return fmt.Sprintf("p50 %.1f / p99 %.1f / max %.1f ms (n=%d)", d.P50, d.P99, d.Max, d.N)
}

// expiredSlack allows for the client being descheduled between the library's last check of
// a lease and the client's reading of the return time.
const expiredSlack = 10 * time.Millisecond

type window struct {
	holder     int
	start, end int64
	a          op // the acquire
}

// leaseID names one lease in a history: its client and its acquire's call time.
type leaseID struct {
	client int
	call   int64
}

// check merges the clients' histories (CLOCK_MONOTONIC is shared by all processes) and counts
// what breaks the lock's guarantees. finals holds each lockset counter at the end (nil for
// the fenced workload); single says every acquire was one attempt (TryLock); kills are the
// instants of faults that may lose acknowledged writes (see verdict.Unexplained).
func check(ops []op, finals map[int]int64, ttl time.Duration, single bool, kills []int64) verdict {
	var v verdict
	v.Ops = len(ops)
	byLock := map[int][]op{}
	for _, o := range ops {
		if o.Result == "unknown" {
			v.Unknown++
		}
		if o.Kind == "incr" && o.Result == "ok" {
			v.Increments++
		}
		byLock[o.Lock] = append(byLock[o.Lock], o)
	}
	var notice, noticeKill []int64
	for _, lops := range byLock {
		early, waits := earlyWaits(lops, ttl)
		v.LatchEarly += early
		v.LatchWaits += waits
		n, nk := checkLock(lops, ttl, single, kills, &v)
		notice, noticeKill = append(notice, n...), append(noticeKill, nk...)
	}
	v.Notice, v.NoticeKill = distOf(notice), distOf(noticeKill)
	if finals != nil {
		total := 0
		for _, c := range finals {
			total += int(c)
		}
		v.LostUpdates = v.Increments - total
	}
	return v
}

func checkLock(ops []op, ttl time.Duration, single bool, kills []int64, v *verdict) (notice, noticeKill []int64) {
	releaseCall := map[leaseID]int64{}
	releaseRes := map[leaseID]string{}
	var acquires, writes, reads, releases, forces []op
	for _, o := range ops {
		switch {
		case o.Kind == "acquire" && o.Result == "ok":
			acquires = append(acquires, o)
		case o.Kind == "release":
			releaseCall[leaseID{o.holder(), o.Acq}] = o.Call
			releaseRes[leaseID{o.holder(), o.Acq}] = o.Result
			if o.Result == "ok" {
				releases = append(releases, o)
			}
		case o.Kind == "extend" && o.Result == "ok":
			releases = append(releases, o)
		case o.Kind == "write" && o.Result == "ok":
			writes = append(writes, o)
		case o.Kind == "read" && o.Result == "ok":
			reads = append(reads, o)
		case o.Kind == "force" && o.Result == "ok":
			forces = append(forces, o)
		case o.Kind == "reenter" && o.Result == "ok":
			v.Reentries++
		}
		switch o.Note {
		case "token-or-owner-differs", "outer-let-go", "inner-unlock-failed-outer-held":
			v.ReentryErrors++
		case "refused-while-held":
			v.ReentryRefused++
		}
	}
	v.Acquisitions += len(acquires)
	v.Forces += len(forces)
	for _, a := range acquires {
		if a.Lost {
			v.LeasesLost++
		}
		if a.False {
			v.FalseLosses++
		}
	}

	// A forced release (an operator's DEL or ForceRelease) ends the hold of whoever held the
	// lock: that lease's window and certain hold end at the force's call. A lease granted
	// before the force's call was broken by it if its window reaches past that call; one
	// whose grant may have come either side of the force was broken if its holder saw it lost
	// or its release was refused (then nothing of its window is counted).
	broken := map[leaseID]bool{}
	cut := func(a op, end int64) int64 {
		for _, f := range forces {
			if f.Return <= a.Call || f.Call >= end {
				continue
			}
			id := leaseID{a.holder(), a.Call}
			if a.Return < f.Call || (a.Lost && a.DoneAt >= f.Call) || releaseRes[id] == "fail" {
				broken[id] = true
				end = min(end, max(f.Call, a.Return))
			}
		}
		return end
	}

	// Validity windows: from the acquire's return to the end the client last knew, cut short
	// by its release.
	var windows []window
	acqReturn := map[leaseID]int64{}
	for _, a := range acquires {
		acqReturn[leaseID{a.holder(), a.Call}] = a.Return
		if single && a.Return > a.Call+safeLease(ttl)+int64(expiredSlack) {
			v.ExpiredHandedOut++
		}
		end := a.Until
		if rc, ok := releaseCall[leaseID{a.holder(), a.Call}]; ok && rc < end {
			end = rc
		}
		end = memberEnd(a, end)
		if end = cut(a, end); end > a.Return {
			windows = append(windows, window{a.holder(), a.Return, end, a})
		}
	}
	explained := func(a op) bool { // a fault that may lose writes fell in a's hold
		end := max(a.Until, a.Call+safeLease(ttl))
		if rc, ok := releaseCall[leaseID{a.holder(), a.Call}]; ok {
			end = max(end, rc)
		}
		for _, k := range kills {
			if a.Call <= k && k <= end {
				return true
			}
		}
		return false
	}
	v.TokenRegressions += tokenRegressions(acquires)
	sort.Slice(windows, func(i, j int) bool { return windows[i].start < windows[j].start })
	if isSemaphore(acquires) {
		// Holders of a semaphore overlap by design: what they must not do is take more
		// permits at once than it has.
		v.DoubleGrants += permitGrants(acquires, ops, ttl, cut)
		v.Overlaps += permitOverlaps(windows)
	} else {
		dg, unexplained := doubleGrantPairs(acquires, ops, ttl, cut, explained)
		v.DoubleGrants += dg
		v.Unexplained += unexplained
		for i, w := range windows {
			for j := i - 1; j >= 0 && j >= i-256; j-- {
				if p := windows[j]; p.holder != w.holder && p.end > w.start && !(p.a.Mode == "r" && w.a.Mode == "r") {
					v.Overlaps++
					if !explained(p.a) {
						v.Unexplained++
					}
					break
				}
			}
		}
	}

	// Forced releases: who noticed, how fast. A force breaks the hold of the lease that held
	// the lock when it was called (see heldAtForce); that lease's Done, not the earliest loss
	// of any lease around, measures how fast the force was noticed.
	byForce := heldAtForce(acquires, forces, releaseCall)
	for fi, f := range forces {
		var best int64 = -1
		missed := false
		for _, a := range byForce[fi] {
			id := leaseID{a.holder(), a.Call}
			if a.Lost && (best < 0 || a.DoneAt-f.Call < best) {
				best = a.DoneAt - f.Call
			}
			if !a.Lost && releaseRes[id] == "fail" {
				missed = true
			}
		}
		switch {
		case best >= 0:
			v.ForcesNoticed++
			notice = append(notice, best)
			if f.Note != "" {
				noticeKill = append(noticeKill, best)
			}
		case missed:
			v.ForcesMissed++
		default:
			v.ForceNoHolder++
		}
	}
	if len(forces) > 0 {
		for _, a := range acquires {
			if a.Lost && !broken[leaseID{a.holder(), a.Call}] {
				v.LostUnforced++
			}
		}
	}

	// A release or extend by A succeeding after B acquired since A's acquire returned (but a
	// reader's after another reader joined it).
	readers := map[leaseID]bool{}
	for _, a := range acquires {
		if shared(a.Mode) {
			readers[leaseID{a.holder(), a.Call}] = true
		}
	}
	sort.Slice(acquires, func(i, j int) bool { return acquires[i].Call < acquires[j].Call })
	for _, r := range releases {
		ra, ok := acqReturn[leaseID{r.holder(), r.Acq}]
		if !ok {
			continue
		}
		k := sort.Search(len(acquires), func(i int) bool { return acquires[i].Call > ra })
		for ; k < len(acquires) && acquires[k].Call < r.Call; k++ {
			if b := acquires[k]; b.holder() != r.holder() && b.Return < r.Call && !(shared(b.Mode) && readers[leaseID{r.holder(), r.Acq}]) {
				v.ForeignReleases++
				break
			}
		}
	}

	// The fenced register's highest token never goes down: no accepted write and no read
	// may come after a higher token's write returned.
	byRet := append([]op(nil), writes...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	later := append(append([]op(nil), writes...), reads...)
	sort.Slice(later, func(i, j int) bool { return later[i].Call < later[j].Call })
	var maxTok uint64
	k := 0
	for _, o := range later {
		for k < len(byRet) && byRet[k].Return < o.Call {
			maxTok = max(maxTok, byRet[k].Token)
			k++
		}
		if o.Token < maxTok {
			v.StaleAccepted++
		}
	}
	return notice, noticeKill
}

// heldAtForce returns, for each of a lock's forced releases, the leases whose hold it broke:
// those granted before its call, neither released nor seen lost before it, and not broken
// already by an earlier force (a hold is broken once). A lease granted while a force ran is
// left out: ForceRelease hands the lock to the first waiter, so its hold may be one the force
// created; and a lease broken by an earlier force and noticed only after this one tells
// nothing of how fast this one was noticed. Attributing either would turn an unrelated later
// loss (often one to the next force) into this force's notice time.
func heldAtForce(acquires, forces []op, releaseCall map[leaseID]int64) [][]op {
	order := make([]int, len(forces))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return forces[order[i]].Call < forces[order[j]].Call })
	out := make([][]op, len(forces))
	for _, a := range acquires {
		// The first force called after the lease was granted is the only one that can break
		// its hold.
		k := sort.Search(len(order), func(i int) bool { return forces[order[i]].Call > a.Return })
		if k == len(order) {
			continue
		}
		f := forces[order[k]]
		if rc, ok := releaseCall[leaseID{a.holder(), a.Call}]; ok && rc <= f.Call {
			continue
		}
		if a.Lost && a.DoneAt < f.Call {
			continue
		}
		out[order[k]] = append(out[order[k]], a)
	}
	return out
}

// doubleGrants counts acquires B granted while another client's lease A certainly still
// held the lock in Redis (but a read lease B while A was a read lease too). A's hold certainly exists over [A's return, E_A), where E_A is the
// later of its acquire call + certainLease (TTL, or the grant's TTL if shorter, × (1 − drift))
// and the end of the window its holder last
// read (renewals included), cut at the call of a release of A that succeeded or may have
// (unknown outcome). B is a double grant if its own such interval meets A's, or if its
// grant instant, somewhere in [B's call, B's return], certainly falls in A's interval. A
// client paused between a grant and recording its return only shrinks these intervals, so
// the count stays sound under SIGSTOP.
func doubleGrants(acquires, ops []op, ttl time.Duration) int {
	n, _ := doubleGrantPairs(acquires, ops, ttl, nil, nil)
	return n
}

// doubleGrantPairs is doubleGrants with forced releases (cut ends a lease's certain hold at
// a force that broke it) and the count of those whose earlier lease's hold did not span a
// fault that may lose writes (explained). A lease handed over locally (cohorting) holds
// certainly only to the end of the window its holder read: its hold may predate its call.
func doubleGrantPairs(acquires, ops []op, ttl time.Duration, cut func(op, int64) int64, explained func(op) bool) (n, unexplained int) {
	byRet, ends := certainHolds(acquires, ops, ttl, cut)
	for i, b := range byRet {
		for j := i - 1; j >= 0 && j >= i-512; j-- {
			a := byRet[j]
			if a.holder() == b.holder() || ends[j] <= a.Return || (shared(a.Mode) && shared(b.Mode)) {
				continue
			}
			meets := ends[i] > b.Return && b.Return < ends[j] // a.Return <= b.Return by the order
			inside := a.Return <= b.Call && b.Return < ends[j]
			if meets || inside {
				n++
				if explained != nil && !explained(a) {
					unexplained++
				}
				break
			}
		}
	}
	return n, unexplained
}

// certainHolds returns the acquires by return time and, for each, the end of the interval
// from its return over which its hold certainly exists in Redis (see doubleGrants).
func certainHolds(acquires, ops []op, ttl time.Duration, cut func(op, int64) int64) (byRet []op, ends []int64) {
	released := map[leaseID]int64{} // release call (ok or unknown outcome)
	for _, o := range ops {
		if o.Kind == "release" && o.Result != "fail" {
			released[leaseID{o.holder(), o.Acq}] = o.Call
		}
	}
	lease := certainLease(ttl)
	held := func(a op) int64 { // end of the interval A certainly holds
		end := a.Until
		if !a.Cohort {
			end = max(a.Call+lease, a.Until)
		}
		if rc, ok := released[leaseID{a.holder(), a.Call}]; ok {
			end = min(end, rc)
		}
		end = memberEnd(a, end)
		if cut != nil {
			end = cut(a, end)
		}
		return end
	}
	byRet = append([]op(nil), acquires...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	ends = make([]int64, len(byRet))
	for i, a := range byRet {
		ends[i] = held(a)
	}
	return byRet, ends
}

// memberEnd cuts the hold of a multi-lock lease's member at the moment its holder saw the
// lease lost: dlock then gives the other members back (Lease docs: lost as soon as any member
// is lost), so their holds, and the lease's window, end there.
func memberEnd(a op, end int64) int64 {
	if a.Mode == "m" && a.Lost && a.DoneAt > 0 {
		return min(end, a.DoneAt)
	}
	return end
}

// tokenRegressions counts acquires whose token does not exceed the highest token of the
// acquires that returned before their call. A read lease (Mode "r") shares its read phase's
// token, and a semaphore's lease (Mode "s") its busy period's: it must exceed every earlier
// writer's and equal or exceed every earlier reader's.
func tokenRegressions(acquires []op) int {
	byCall := append([]op(nil), acquires...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	byRet := append([]op(nil), acquires...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	var maxTok, maxWrite uint64
	n, k := 0, 0
	for _, b := range byCall {
		for k < len(byRet) && byRet[k].Return < b.Call {
			maxTok = max(maxTok, byRet[k].Token)
			if !shared(byRet[k].Mode) {
				maxWrite = max(maxWrite, byRet[k].Token)
			}
			k++
		}
		if shared(b.Mode) && (b.Token < maxTok || b.Token <= maxWrite) || !shared(b.Mode) && b.Token <= maxTok {
			n++
		}
	}
	return n
}

package main

import (
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
}

// expiredSlack allows for the client being descheduled between the library's last check of
// a lease and the client's reading of the return time.
const expiredSlack = 10 * time.Millisecond

type window struct {
	client     int
	start, end int64
}

// leaseID names one lease in a history: its client and its acquire's call time.
type leaseID struct {
	client int
	call   int64
}

// check merges the clients' histories (CLOCK_MONOTONIC is shared by all processes) and counts
// what breaks the lock's guarantees. finals holds each lockset counter at the end (nil for
// the fenced workload); single says every acquire was one attempt (TryLock).
func check(ops []op, finals map[int]int64, ttl time.Duration, single bool) verdict {
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
	for _, lops := range byLock {
		checkLock(lops, ttl, single, &v)
	}
	if finals != nil {
		total := 0
		for _, c := range finals {
			total += int(c)
		}
		v.LostUpdates = v.Increments - total
	}
	return v
}

func checkLock(ops []op, ttl time.Duration, single bool, v *verdict) {
	releaseCall := map[leaseID]int64{}
	var acquires, writes, reads, releases []op
	for _, o := range ops {
		switch {
		case o.Kind == "acquire" && o.Result == "ok":
			acquires = append(acquires, o)
		case o.Kind == "release":
			releaseCall[leaseID{o.Client, o.Acq}] = o.Call
			if o.Result == "ok" {
				releases = append(releases, o)
			}
		case o.Kind == "extend" && o.Result == "ok":
			releases = append(releases, o)
		case o.Kind == "write" && o.Result == "ok":
			writes = append(writes, o)
		case o.Kind == "read" && o.Result == "ok":
			reads = append(reads, o)
		}
	}
	v.Acquisitions += len(acquires)
	for _, a := range acquires {
		if a.Lost {
			v.LeasesLost++
		}
	}

	// Validity windows: from the acquire's return to the end the client last knew, cut short
	// by its release.
	var windows []window
	acqReturn := map[leaseID]int64{}
	for _, a := range acquires {
		acqReturn[leaseID{a.Client, a.Call}] = a.Return
		if single && a.Return > a.Call+safeLease(ttl)+int64(expiredSlack) {
			v.ExpiredHandedOut++
		}
		end := a.Until
		if rc, ok := releaseCall[leaseID{a.Client, a.Call}]; ok && rc < end {
			end = rc
		}
		if end > a.Return {
			windows = append(windows, window{a.Client, a.Return, end})
		}
	}
	v.DoubleGrants += doubleGrants(acquires, ops, ttl)
	v.TokenRegressions += tokenRegressions(acquires)
	sort.Slice(windows, func(i, j int) bool { return windows[i].start < windows[j].start })
	for i, w := range windows {
		for j := i - 1; j >= 0 && j >= i-256; j-- {
			if p := windows[j]; p.client != w.client && p.end > w.start {
				v.Overlaps++
				break
			}
		}
	}

	// A release or extend by A succeeding after B acquired since A's acquire returned.
	sort.Slice(acquires, func(i, j int) bool { return acquires[i].Call < acquires[j].Call })
	for _, r := range releases {
		ra, ok := acqReturn[leaseID{r.Client, r.Acq}]
		if !ok {
			continue
		}
		k := sort.Search(len(acquires), func(i int) bool { return acquires[i].Call > ra })
		for ; k < len(acquires) && acquires[k].Call < r.Call; k++ {
			if b := acquires[k]; b.Client != r.Client && b.Return < r.Call {
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
}

// doubleGrants counts acquires B granted while another client's lease A certainly still
// held the lock in Redis. A's hold certainly exists over [A's return, E_A), where E_A is the
// later of its acquire call + TTL × (1 − drift) and the end of the window its holder last
// read (renewals included), cut at the call of a release of A that succeeded or may have
// (unknown outcome). B is a double grant if its own such interval meets A's, or if its
// grant instant, somewhere in [B's call, B's return], certainly falls in A's interval. A
// client paused between a grant and recording its return only shrinks these intervals, so
// the count stays sound under SIGSTOP.
func doubleGrants(acquires, ops []op, ttl time.Duration) int {
	released := map[leaseID]int64{} // release call (ok or unknown outcome)
	for _, o := range ops {
		if o.Kind == "release" && o.Result != "fail" {
			released[leaseID{o.Client, o.Acq}] = o.Call
		}
	}
	lease := safeLease(ttl)
	held := func(a op) int64 { // end of the interval A certainly holds
		end := max(a.Call+lease, a.Until)
		if rc, ok := released[leaseID{a.Client, a.Call}]; ok {
			end = min(end, rc)
		}
		return end
	}
	byRet := append([]op(nil), acquires...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	ends := make([]int64, len(byRet))
	for i, a := range byRet {
		ends[i] = held(a)
	}
	n := 0
	for i, b := range byRet {
		for j := i - 1; j >= 0 && j >= i-512; j-- {
			a := byRet[j]
			if a.Client == b.Client || ends[j] <= a.Return {
				continue
			}
			meets := ends[i] > b.Return && b.Return < ends[j] // a.Return <= b.Return by the order
			inside := a.Return <= b.Call && b.Return < ends[j]
			if meets || inside {
				n++
				break
			}
		}
	}
	return n
}

// tokenRegressions counts acquires whose token does not exceed the highest token of the
// acquires that returned before their call.
func tokenRegressions(acquires []op) int {
	byCall := append([]op(nil), acquires...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	byRet := append([]op(nil), acquires...)
	sort.Slice(byRet, func(i, j int) bool { return byRet[i].Return < byRet[j].Return })
	var maxTok uint64
	n, k := 0, 0
	for _, b := range byCall {
		for k < len(byRet) && byRet[k].Return < b.Call {
			maxTok = max(maxTok, byRet[k].Token)
			k++
		}
		if b.Token <= maxTok {
			n++
		}
	}
	return n
}

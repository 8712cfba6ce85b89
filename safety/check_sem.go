package main

import (
	"fmt"
	"os"
	"sort"
	"time"
)

// The semaphore and latch checks (issue 11). A semaphore's leases (Mode "s") may overlap, up
// to its permits: the pairwise overlap and double-grant counts become sums of the permits held
// at once. A latch's Wait must not return while the count was certainly above zero.

// isSemaphore reports whether a lock's acquires are a semaphore's.
func isSemaphore(acquires []op) bool {
	return len(acquires) > 0 && acquires[0].Mode == "s"
}

// permitGrants counts semaphore acquires B granted while the leases certainly holding permits
// in Redis (see certainHolds), B's included, held more than the semaphore has: at B's return
// if B's own hold is certain then, or over the whole span in which B may have been granted
// ([B's call, B's return]) otherwise.
func permitGrants(acquires, ops []op, ttl time.Duration, cut func(op, int64) int64) int {
	byRet, ends := certainHolds(acquires, ops, ttl, cut)
	n := 0
	for i, b := range byRet {
		atReturn, throughout := 0, b.Permits
		if ends[i] > b.Return {
			atReturn = b.Permits
		}
		for j := i - 1; j >= 0 && j >= i-512; j-- {
			a := byRet[j]
			// The same holder's earlier lease counts too: a hold it lost locally (a late
			// reply, a missed renewal) may still have its permits in Redis.
			if ends[j] <= b.Return {
				continue
			}
			atReturn += a.Permits // a.Return <= b.Return by the order
			if a.Return <= b.Call {
				throughout += a.Permits
			}
		}
		if ends[i] > b.Return && atReturn > b.Of || throughout > b.Of {
			n++
		}
	}
	return n
}

// permitOverlaps counts semaphore validity windows (sorted by start) that began while the
// windows of other holders already open held so many permits that theirs made more than the
// semaphore has.
func permitOverlaps(windows []window) int {
	n := 0
	for i, w := range windows {
		sum := w.a.Permits
		for j := i - 1; j >= 0 && j >= i-256; j-- {
			if p := windows[j]; p.holder != w.holder && p.end > w.start {
				sum += p.a.Permits
			}
		}
		if sum > w.a.Of {
			n++
			if os.Getenv("SAFETY_DEBUG") != "" {
				for j := i - 1; j >= 0 && j >= i-256; j-- {
					if p := windows[j]; p.holder != w.holder && p.end > w.start {
						fmt.Fprintf(os.Stderr, "  open: holder %d [%d,%d] p=%d tok=%d owner=%s call=%d\n", p.holder, p.start/1e6, p.end/1e6, p.a.Permits, p.a.Token, p.a.Owner, p.a.Call/1e6)
					}
				}
				fmt.Fprintf(os.Stderr, "OVER: holder %d [%d,%d] p=%d tok=%d owner=%s call=%d\n", w.holder, w.start/1e6, w.end/1e6, w.a.Permits, w.a.Token, w.a.Owner, w.a.Call/1e6)
			}
		}
	}
	return n
}

// earlyWaits counts a latch's Waits that returned ok while its count was certainly above
// zero: after a TrySetCount that reported true (S) had returned before the Wait was called,
// fewer CountDowns than S's count could have been applied before the Wait returned (those
// that did not fail and overlap [S's call, the Wait's return], one whose reply was lost from
// its call until 2 x TTL after it), and no other TrySetCount
// could have started a new count in between (one that did would mean the count had reached
// zero). It returns the Waits that returned ok as well.
func earlyWaits(ops []op, ttl time.Duration) (early, waits int) {
	var sets, downs []op
	for _, o := range ops {
		switch {
		case o.Kind == "set" && o.Result != "fail":
			sets = append(sets, o)
		case o.Kind == "down" && o.Result != "fail":
			if o.Result == "unknown" {
				// Its reply was lost: Redis may run it after the caller gave up, but no later
				// than the faults here allow (a Redis paused 1.5 x TTL runs what it was sent
				// once resumed; a killed one never runs it).
				o.Return = max(o.Return, o.Call+int64(2*ttl))
			}
			downs = append(downs, o)
		}
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Return < sets[j].Return })
	for _, w := range ops {
		if w.Kind != "wait" || w.Result != "ok" {
			continue
		}
		waits++
		// The last set certainly applied before the Wait began.
		k := sort.Search(len(sets), func(i int) bool { return sets[i].Return > w.Call }) - 1
		for k >= 0 && sets[k].Result != "ok" {
			k--
		}
		if k < 0 {
			continue // no count known: the latch may have had no state
		}
		s := &sets[k]
		newer := false
		for x := range sets {
			if x != k && sets[x].Call < w.Return && sets[x].Return > s.Call {
				newer = true
				break
			}
		}
		if newer {
			continue
		}
		applied := 0
		for d := range downs {
			if downs[d].Call < w.Return && downs[d].Return > s.Call {
				applied++
			}
		}
		if applied < int(s.Value) {
			early++
		}
	}
	return early, waits
}

package main

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability check: each lock's history (acquires, releases, extends, and the reads
// and writes of its fenced register) must be explainable by one sequence of atomic steps of a
// lease-aware, owner-aware, fenced mutex, each step falling between its operation's call and
// return:
//   - an acquire succeeds only if the lock is free or the holder's lease could have expired
//     (past both the holder's acquire or last extend call + TTL × (1 − drift) and the end of
//     the validity window the holder last read from the library, renewals included),
//     and only with a token above every token granted before;
//   - only the holder releases or extends, with its own token;
//   - the register accepts a write only with a token at least its highest, refuses it
//     otherwise, and a read returns its highest token;
//   - a forced release (an operator's DEL or ForceRelease, by the nemesis) frees the lock
//     whoever holds it.
//
// A holder is one goroutine of one client process (op.holder): with cohorting, the
// goroutines of a process share the Redis owner id, but each lease is a holder of its own
// with a token of its own. A lease that may have been handed over locally (op.Cohort) holds
// for certain only until the end of the window its holder read: its Redis hold may be older
// than its acquire's call. Re-entries (reenter, unreenter) leave the state as it is and are
// checked by the client and the counters, not here.
//
// Operations whose outcome is unknown may have taken effect at any time after their call, or
// not at all. Operations that cannot change the state whatever happened (refused or unknown
// acquires: an acquire whose reply was lost is undone by the library or expires, unseen by
// any client; refused extends and reads) are left out: they are legal at any point.

// mutexState is the model's state for one lock.
type mutexState struct {
	owner   int    // client holding the lease, 0 if free
	token   uint64 // the holder's token
	lastTok uint64 // highest token ever granted
	expMin  int64  // earliest moment the holder's lease may expire
	regTok  uint64 // the fenced register's highest accepted token
}

type mutexInput struct {
	kind   string
	client int // the holder (op.holder)
	token  uint64
	call   int64
	ret    int64 // the real return, also for unknown outcomes
	until  int64 // acquires: the end of the validity window the holder last read
	cohort bool  // acquires: see op.Cohort
	acq    op    // acquires: the op itself (see memberEnd)
	result string
}

func mutexModel(ttl time.Duration) porcupine.Model {
	lease := certainLease(ttl)
	step := func(st, in, _ interface{}) []interface{} {
		s, o := st.(mutexState), in.(mutexInput)
		switch o.kind {
		case "acquire": // only successful ones reach the model
			if (s.owner != 0 && s.expMin > o.ret) || o.token <= s.lastTok {
				return nil
			}
			// The lease cannot expire in Redis before the holder's own last-known deadline
			// (renewals included), nor before its acquire call + TTL × (1 − drift), or the
			// grant's TTL if shorter (unless handed over locally; see certainLease).
			exp := o.until
			if !o.cohort {
				exp = max(o.call+lease, o.until)
			}
			exp = memberEnd(o.acq, exp)
			return []interface{}{mutexState{owner: o.client, token: o.token, lastTok: o.token, expMin: exp, regTok: s.regTok}}
		case "force":
			freed := s
			freed.owner, freed.token, freed.expMin = 0, 0, 0
			return []interface{}{freed}
		case "release":
			mine := s.owner == o.client && s.token == o.token
			freed := s
			freed.owner, freed.token, freed.expMin = 0, 0, 0
			switch {
			case o.result == "ok" && mine:
				return []interface{}{freed}
			case o.result == "ok":
				return nil
			case o.result == "unknown" && mine:
				return []interface{}{s, freed}
			}
			return []interface{}{s}
		case "extend":
			mine := s.owner == o.client && s.token == o.token
			ext := s
			ext.expMin = max(s.expMin, o.call+lease)
			switch {
			case o.result == "ok" && mine:
				return []interface{}{ext}
			case o.result == "ok":
				return nil
			case mine: // unknown
				return []interface{}{s, ext}
			}
			return []interface{}{s}
		case "read":
			if o.token != s.regTok {
				return nil
			}
			return []interface{}{s}
		case "write":
			w := s
			w.regTok = o.token
			accept := o.token >= s.regTok
			switch o.result {
			case "ok":
				if accept {
					return []interface{}{w}
				}
				return nil
			case "fail":
				if accept {
					return nil
				}
				return []interface{}{s}
			}
			if accept { // unknown
				return []interface{}{s, w}
			}
			return []interface{}{s}
		}
		return []interface{}{s}
	}
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{mutexState{}} },
		Step: step,
		Hash: func(st interface{}) uint64 {
			s := st.(mutexState)
			return uint64(s.owner)*0x9e3779b97f4a7c15 ^ s.token*31 ^ s.lastTok*131 ^ uint64(s.expMin) ^ s.regTok*0x100000001b3
		},
		DescribeOperation: func(in, _ interface{}) string {
			o := in.(mutexInput)
			return fmt.Sprintf("%s(c%d.%d, tok %d) -> %s", o.kind, o.client/1000, o.client%1000, o.token, o.result)
		},
		DescribeState: func(st interface{}) string {
			s := st.(mutexState)
			if s.owner == 0 {
				return fmt.Sprintf("free (last token %d, register %d)", s.lastTok, s.regTok)
			}
			return fmt.Sprintf("held by c%d.%d tok %d, may expire from %.3fs (register %d)", s.owner/1000, s.owner%1000, s.token, float64(s.expMin)/1e9, s.regTok)
		},
	}
	return nm.ToModel()
}

// porcupineOps turns one lock's ops into porcupine operations, leaving out those that cannot
// change the state.
func porcupineOps(ops []op) []porcupine.Operation {
	var out []porcupine.Operation
	dense := map[int]int{} // holder -> zero-based index (the visualisation has a row per client id)
	for _, o := range ops {
		switch {
		case o.Kind == "incr", o.Kind == "reenter", o.Kind == "unreenter",
			o.Kind == "set", o.Kind == "down", o.Kind == "wait": // a latch's: not the model's
			continue
		case o.Kind == "force" && o.Result != "ok":
			continue
		case o.Kind == "acquire" && o.Result != "ok":
			continue
		case (o.Kind == "read" || o.Kind == "extend") && o.Result == "fail":
			continue
		case o.Kind == "read" && o.Result == "unknown":
			continue
		}
		ret := o.Return
		if o.Result == "unknown" {
			ret = math.MaxInt64 / 2 // it may take effect any time after its call
		}
		out = append(out, porcupine.Operation{
			ClientId: denseID(dense, o.holder()),
			Input:    mutexInput{kind: o.Kind, client: o.holder(), token: o.Token, call: o.Call, ret: o.Return, until: o.Until, cohort: o.Cohort, result: o.Result, acq: o},
			Call:     o.Call,
			Output:   nil,
			Return:   ret,
		})
	}
	return out
}

// linearize checks each lock's history with porcupine. On an illegal history it writes
// porcupine's HTML visualisation of the failing lock into dir.
func linearize(ops []op, ttl time.Duration, dir, name string, timeout time.Duration) (result string, unknown int, html string) {
	byLock := map[int][]op{}
	for _, o := range ops {
		byLock[o.Lock] = append(byLock[o.Lock], o)
	}
	locks := make([]int, 0, len(byLock))
	for l := range byLock {
		locks = append(locks, l)
	}
	sort.Ints(locks)
	model := mutexModel(ttl)
	result = "ok"
	for _, l := range locks {
		hist := porcupineOps(exclusiveOps(byLock[l]))
		switch porcupine.CheckOperationsTimeout(model, hist, timeout) {
		case porcupine.Unknown:
			unknown++
			if result == "ok" {
				result = "unknown"
			}
		case porcupine.Illegal:
			result = "illegal"
			if html == "" && dir != "" {
				_, info := porcupine.CheckOperationsVerbose(model, hist, timeout)
				path := filepath.Join(dir, fmt.Sprintf("porcupine-%s-lock%d.html", name, l))
				if err := porcupine.VisualizePath(model, info, path); err == nil {
					html = path
				}
			}
		}
	}
	return result, unknown, html
}

// exclusiveOps leaves out the read leases of a read-write lock and the leases of a semaphore
// (acquires with Mode "r" or "s", and the releases and extends of those leases): the model is a
// mutex, so it checks the writers among themselves; the counters check the others.
func exclusiveOps(ops []op) []op {
	readers := map[leaseID]bool{}
	for _, o := range ops {
		if o.Kind == "acquire" && shared(o.Mode) {
			readers[leaseID{o.holder(), o.Call}] = true
		}
	}
	if len(readers) == 0 {
		return ops
	}
	out := make([]op, 0, len(ops))
	for _, o := range ops {
		if o.Kind == "acquire" && shared(o.Mode) || (o.Kind == "release" || o.Kind == "extend") && readers[leaseID{o.holder(), o.Acq}] {
			continue
		}
		out = append(out, o)
	}
	return out
}

func denseID(m map[int]int, h int) int {
	id, ok := m[h]
	if !ok {
		id = len(m)
		m[h] = id
	}
	return id
}

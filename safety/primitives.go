package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// The "rw" and "multi" workloads (issue 10): holders take a read-write lock (half of them to
// read, half to write) or a multi-lock over 2-3 of the scenario's locks mixed with plain
// Mutex holders on the same names, work in steps while their lease has time left, and
// release. They touch no resource: the checker works on the validity windows and tokens
// alone. A read lease's acquire is recorded with Mode "r" (readers may overlap readers); a
// multi-lock lease is recorded as one exclusive acquire per member (Mode "m"), with that
// member's token, so every per-lock check sees it beside the Mutex holders of the same name.

// roundRW takes lock i to read or to write, works and releases.
func (w *worker) roundRW(i int) {
	s := w.spec
	ctx, cancel := context.WithTimeout(context.Background(), s.OpTimeout)
	defer cancel()
	write := w.rng.IntN(2) == 0
	rw := w.c.RWMutex(lockName(i))
	call := mono()
	var l *dlock.Lease
	var err error
	// The "readwriter" control's writers take only a read lease, yet count as writers.
	if write && s.Weak != "readwriter" {
		l, err = rw.Lock(ctx)
	} else {
		l, err = rw.RLock(ctx)
	}
	ret := mono()
	mode := "r"
	if write {
		mode = ""
	}
	if err != nil {
		w.rec(op{Lock: i, Kind: "acquire", Call: call, Return: ret, Result: outcomeOf(err, "fail"), Mode: mode})
		time.Sleep(10 * time.Millisecond)
		return
	}
	h := &held{lock: i, lease: l, acq: op{Lock: i, Kind: "acquire", Call: call, Return: ret, Token: l.Token(), Result: "ok", Owner: l.Owner(), Mode: mode}}
	w.holdAndRelease(ctx, h)
}

// roundMulti takes lock i alone with a Mutex, or with a multi-lock together with one or two
// other locks, works and releases.
func (w *worker) roundMulti(i int) {
	s := w.spec
	ctx, cancel := context.WithTimeout(context.Background(), s.OpTimeout)
	defer cancel()
	if s.Locks < 2 || w.rng.IntN(2) == 0 {
		h := w.acquire(ctx, i)
		if h == nil {
			return
		}
		w.holdAndRelease(ctx, h)
		return
	}
	members := []int{i}
	for n := 1 + w.rng.IntN(2); len(members) < min(1+n, s.Locks); {
		if j := w.rng.IntN(s.Locks); !contains(members, j) {
			members = append(members, j)
		}
	}
	names := make([]string, len(members))
	for k, j := range members {
		names[k] = lockName(j)
	}
	call := mono()
	var l *dlock.Lease
	var extra []*dlock.Lease
	var err error
	if s.Weak == "early" {
		l, extra, err = w.loose(ctx, names)
	} else {
		l, err = w.c.MultiLock(names).Lock(ctx)
	}
	ret := mono()
	if err != nil {
		w.rec(op{Lock: i, Kind: "acquire", Call: call, Return: ret, Result: outcomeOf(err, "fail")})
		time.Sleep(10 * time.Millisecond)
		return
	}
	tokens := l.Tokens()
	for _, e := range extra {
		for n, t := range e.Tokens() {
			tokens[n] = t
		}
	}
	h := &held{lock: i, lease: l, members: members, extra: extra,
		acq: op{Lock: i, Kind: "acquire", Call: call, Return: ret, Token: tokens[names[0]], Result: "ok", Owner: l.Owner(), Mode: "m"}}
	for _, n := range names {
		h.tokens = append(h.tokens, tokens[n])
	}
	w.holdAndRelease(ctx, h)
}

// loose is the "early" control's multi-lock: the members taken one at a time with plain
// Mutexes (no all or nothing), and the last one released at once, while the holder goes on
// as if it held them all. It returns the first member's lease and the others.
func (w *worker) loose(ctx context.Context, names []string) (*dlock.Lease, []*dlock.Lease, error) {
	var leases []*dlock.Lease
	for _, n := range names {
		l, err := w.c.Mutex(n).Lock(ctx)
		if err != nil {
			for _, t := range leases {
				_ = t.Unlock(ctx)
			}
			return nil, nil, err
		}
		leases = append(leases, l)
	}
	last := leases[len(leases)-1]
	_ = last.Unlock(ctx)
	return leases[0], leases[1:], nil
}

// holdAndRelease tells the nemesis who holds the locks, works while the lease lasts, releases
// and records the lease, once per member for a multi-lock.
func (w *worker) holdAndRelease(ctx context.Context, h *held) {
	s := w.spec
	if h.watched == nil { // acquire started the Mutex path's watcher already
		w.watch(h)
		h.deadline(s.TTL)
	}
	for _, j := range h.locks() {
		_ = w.res.Set(ctx, fmt.Sprintf("holder:%d", j), s.ID, 0).Err()
	}
	w.critical(ctx, h)
	select {
	case <-h.lease.Done():
		h.acq.Lost = true
	default:
	}
	h.deadline(s.TTL)
	rc := mono()
	if h.releasing != nil {
		h.releasing(rc)
	}
	res := []string{outcomeOf(h.lease.Unlock(ctx), "fail")}
	for _, e := range h.extra { // the early control's other members: each Unlock says for its own
		res = append(res, outcomeOf(e.Unlock(ctx), "fail"))
	}
	w.finish(h)
	if h.members == nil {
		w.rec(op{Lock: h.lock, Kind: "release", Call: rc, Return: mono(), Token: h.acq.Token, Acq: h.acq.Call, Result: res[0]})
		return
	}
	ret := mono()
	for k, j := range h.members {
		if k > 0 { // finish recorded the first member's acquire
			a := h.acq
			a.Lock, a.Token = j, h.tokens[k]
			w.rec(a)
		}
		r := res[0]
		if h.extra != nil {
			r = res[k]
		} else if r == "fail" && !h.acq.Lost {
			// A multi-lock's Unlock fails as a whole when one member was gone, yet releases
			// the others: which it released is not known. (Once the lease was seen lost, dlock
			// gave them back already: memberEnd ends their holds at DoneAt, and "fail" stands.)
			r = "unknown"
		}
		w.rec(op{Lock: j, Kind: "release", Call: rc, Return: ret, Token: h.tokens[k], Acq: h.acq.Call, Result: r})
	}
}

func (h *held) locks() []int {
	if h.members == nil {
		return []int{h.lock}
	}
	return h.members
}

func contains(s []int, x int) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

package dlock

import (
	"context"
	"sync"
)

// A grip is what a cohort slot holds in Redis and passes from local holder to local holder: a
// hold on the Client's Redis (*hold), or a Redlock's holds on a quorum of its masters
// (*quorum). The cohort sees only this; how the grip is renewed, lost and released is the
// holds' business.
type grip interface {
	// base is the first fencing token of the block the grip reserved (cohortBlock tokens,
	// every one below any later holder's).
	base() uint64
	// valid reports whether the grip is certainly held: it may be handed to a holder.
	valid() bool
	// setOnEnd installs f, called once and outside any lock when the grip ends other than by
	// its release (lost, or the Client closed); if it has ended already, f is not installed
	// and setOnEnd reports the end.
	setOnEnd(f func(err error)) (ended bool, err error)
	// holding returns a holding of the grip for one local holder with token, shared through
	// co.
	holding(co sharer, token uint64) *holding
	// letGo gives the grip back to Redis (to the next waiter in its queue). l, if not nil, is
	// the lease whose Unlock this is: it ends by the release's answer, and letGo returns
	// Unlock's error. Without l a release that got no answer is retried in the background.
	letGo(ctx context.Context, l *Lease) error
}

func (h *hold) base() uint64 { return h.token }

func (h *hold) holding(co sharer, token uint64) *holding { return newHolding(h, co, token) }

func (h *hold) letGo(ctx context.Context, l *Lease) error {
	switch {
	case !h.beginRelease():
		// Lost or ended by Close while we got here: the lease ends with that.
		if l != nil {
			l.finish(h.lossErr(), true)
			return l.heldErr()
		}
		return nil
	case l != nil:
		return l.finishRelease(ctx, h)
	}
	_, err := h.release(ctx)
	h.end(nil, false)
	if err != nil {
		h.releaseLater() // no answer: retried until Redis answers or the TTL has run out
	}
	return nil
}

// A quorum is a Redlock's grip: its holds on the masters that granted it, at least need of
// them, and the lease's token (see redlockTake.raiseFence). It stands while need of them are
// held; when fewer are, it ends, and the holds still held are given back.
type quorum struct {
	hs    []*hold
	need  int
	token uint64
	owner string // the take's owner id (a master's hold may have it in a later epoch)

	mu    sync.Mutex
	onEnd func(err error)
	ended bool
}

func newQuorum(hs []*hold, need int, token uint64, owner string) *quorum {
	return &quorum{hs: hs, need: need, token: token, owner: owner}
}

func (q *quorum) base() uint64 { return q.token }

func (q *quorum) valid() bool {
	n := 0
	for _, h := range q.hs {
		if h.valid() {
			n++
		}
	}
	return n >= q.need
}

// setOnEnd watches every hold (q.mu is held throughout, so a hold ending meanwhile waits in
// holdEnded and then finds the end decided here).
func (q *quorum) setOnEnd(f func(err error)) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return true, q.lossErrLocked()
	}
	for _, h := range q.hs {
		_, _ = h.setOnEnd(q.holdEnded)
	}
	if q.heldLocked() < q.need {
		q.ended = true
		q.giveBackLater()
		return true, q.lossErrLocked()
	}
	q.onEnd = f
	return false, nil
}

// holdEnded runs when one of the holds ended other than by a release: below a quorum, the
// grip ends with err, and then the holds still held are given back. In that order: the
// holds given back may be what lets another process in (with 4 masters, 2 lost leave only
// 2 free), so the local holder's lease must have ended first (found by review).
func (q *quorum) holdEnded(err error) {
	q.mu.Lock()
	if q.ended || q.heldLocked() >= q.need {
		q.mu.Unlock()
		return
	}
	q.ended = true
	f := q.onEnd
	q.mu.Unlock()
	if f != nil {
		f(err)
	}
	q.giveBackLater()
}

func (q *quorum) heldLocked() int {
	n := 0
	for _, h := range q.hs {
		if h.isHeld() {
			n++
		}
	}
	return n
}

// lossErrLocked is why the grip ended: the loss of its first hold no longer held.
func (q *quorum) lossErrLocked() error {
	for _, h := range q.hs {
		if !h.isHeld() {
			return h.lossErr()
		}
	}
	return q.hs[0].lossErr()
}

// giveBackLater releases, in the background, the holds of a grip that ended.
func (q *quorum) giveBackLater() {
	c := q.hs[0].c
	if !c.goBackground() {
		return // Close releases them
	}
	go func() {
		defer c.wg.Done()
		c.giveBack(q.hs)
	}()
}

func (q *quorum) holding(co sharer, token uint64) *holding {
	return startHolding(&holding{h: q.hs[0], more: q.hs[1:], co: co, token: token, need: q.need, owner: q.owner})
}

func (q *quorum) letGo(ctx context.Context, l *Lease) error {
	if l != nil {
		return l.unlockAll(ctx)
	}
	var releasing []*hold
	for _, h := range q.hs {
		if h.beginRelease() {
			releasing = append(releasing, h)
		}
	}
	releaseHolds(ctx, releasing, 0, q.need)
	return nil
}

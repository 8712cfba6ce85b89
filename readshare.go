package dlock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// readShareAge is how long a Client's read hold takes new local readers: cohortBatchTime
// (a variable for tests that must tell the push from the age bound).
var readShareAge = cohortBatchTime

// A readShare is one Redis read hold of a Client shared by its goroutines' read leases (reader
// cohorting). A reader whose Client holds the lock to read joins that hold without a round
// trip while the hold is young (readShareAge), valid, and no writer waits for the lock in
// Redis: the acquire's reply says whether anyone waited then, and a writer joining the queue
// later is pushed ("x" on the lock's channel). Otherwise the reader takes a read hold of its
// own, through the Redis queue, which later readers may join. So a waiting writer is
// overtaken by no new reader of a Client that heard of it, and by none at all once the young
// hold's batch time has passed. The hold is released when its last reader unlocks, and all its
// readers' leases end when it is lost. Its readers share the read phase's token, as every
// reader admitted in one phase does.
type readShare struct {
	c     *Client
	key   string // in the Client's table of open shares: lock key + settings (cohortVariant)
	h     *hold
	since time.Time
	sub   *subscription // woken when a writer joins the queue; nil without push

	ageOut *time.Timer // closes the share at readShareAge (sh.mu)

	mu      sync.Mutex
	closed  bool // no new reader joins (but those the hold was waited for: joinWaited)
	gone    bool // released or ended: nobody joins
	readers map[*holding]struct{}
}

// A pendingRead is a reader of a Client waiting in the Redis queue on behalf of the Client's
// readers that come while it waits: they wait for it locally and join the hold it gets, so a
// read phase admits one hold per Client rather than one per goroutine.
type pendingRead struct {
	done    chan struct{} // closed when the wait ended
	sh      *readShare    // the hold it got, nil if none; set before done is closed
	waiters int           // readers waiting for it (Client.mu)
}

// sharedRead takes rw to read for a goroutine of the Client: it joins the Client's open read
// hold if it may, or else the hold a reader of the Client is already waiting for, or else
// takes a hold of its own (waiting when wait is set) for later readers to join.
func (c *Client) sharedRead(ctx context.Context, rw *RWMutex, ref lockRef, wait bool) (*Lease, error) {
	for {
		if l := c.joinShare(ctx, rw.share, ref); l != nil {
			return l, nil
		}
		if !wait {
			return c.newShare(ctx, rw, ref, false)
		}
		c.mu.Lock()
		p := c.pendingReads[rw.share]
		mine := p == nil
		if mine {
			p = &pendingRead{done: make(chan struct{})}
			c.pendingReads[rw.share] = p
		} else {
			p.waiters++
		}
		c.mu.Unlock()
		if mine {
			l, err := c.newShare(ctx, rw, ref, true)
			if err == nil {
				p.sh = l.hd.co.(*readShare)
			}
			c.mu.Lock()
			delete(c.pendingReads, rw.share)
			c.mu.Unlock()
			close(p.done)
			return l, err
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, notObtained(rw.name, ctx.Err())
		case <-c.bg.Done():
			return nil, fmt.Errorf("%w: lock %q", ErrClosed, rw.name)
		}
		if p.sh != nil {
			if l := p.sh.joinWaited(ctx, ref); l != nil {
				return l, nil
			}
		}
		// It got nothing (its caller gave up, an error), or its hold is gone already: go on
		// as a new reader.
	}
}

// newShare takes a read hold of the Client's own for rw (waiting when wait is set) and returns
// a lease on it, opening it to later local readers unless a writer waits.
func (c *Client) newShare(ctx context.Context, rw *RWMutex, ref lockRef, wait bool) (*Lease, error) {
	// Each shared hold is an owner of its own in Redis: a reader's entries there are per owner.
	s := holdSpec{name: rw.name, keys: rw.keys, cfg: rw.cfg, access: accessRead,
		owner: c.id + rw.share[len(rw.keys.lock):] + "/r" + c.nextHoldID()}
	var h *hold
	var err error
	if wait {
		h, err = c.waitHold(ctx, s, false)
	} else {
		h, _, err = c.tryHold(ctx, s, false)
	}
	if err != nil {
		return nil, err
	}
	sh := &readShare{c: c, key: rw.share, h: h, since: c.now(), readers: make(map[*holding]struct{})}
	hd := newHolding(h, sh, h.token)
	sh.readers[hd] = struct{}{}
	l := hd.first(ctx, ref)
	if ended, herr := h.setOnEnd(sh.holdEnded); ended {
		sh.holdEnded(herr)
		return l, nil
	}
	// Listen for writers only on a channel this Client already has subscribed (a lock with
	// waiters): a fresh subscription costs a round trip, and for an uncontended lock the age
	// bound alone is as good.
	if n := c.notifierFor(ctx, rw.keys.lock); n != nil && !h.othersWait && n.subscribed(rw.keys.channel) {
		sh.sub = n.subscribe(ctx, rw.keys.channel, writerWaits)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || h.othersWait {
		sh.closed = true // ended meanwhile, or a writer waits: the hold is the caller's alone
		sh.unsubscribeLocked()
		return l, nil
	}
	c.mu.Lock()
	c.shares[sh.key] = sh
	c.mu.Unlock()
	// Closed when its time is up, so it holds no subscription or table entry after.
	sh.ageOut = time.AfterFunc(readShareAge, func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		sh.closeLocked()
	})
	return l, nil
}

// joinShare returns a read lease on the Client's open read hold of the lock, or nil when there
// is none that may take one more reader.
func (c *Client) joinShare(ctx context.Context, key string, ref lockRef) *Lease {
	if c.checkOpen() != nil {
		return nil // the caller's own attempt reports ErrClosed
	}
	c.mu.Lock()
	sh := c.shares[key]
	c.mu.Unlock()
	if sh == nil {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.joinableLocked() {
		return nil
	}
	return sh.addLocked(ctx, ref)
}

// joinWaited returns a read lease on the hold a reader of the Client waited for on behalf of
// the caller, or nil when it is gone. The caller started waiting before that hold was granted,
// so it joins even if a writer waits now (it was in line before that writer, as far as this
// Client can tell); the readers of a Client overtake a writer by at most one such batch.
func (sh *readShare) joinWaited(ctx context.Context, ref lockRef) *Lease {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.gone || !sh.h.valid() {
		return nil
	}
	return sh.addLocked(ctx, ref)
}

// addLocked makes the caller a reader of the shared hold and returns its lease.
func (sh *readShare) addLocked(ctx context.Context, ref lockRef) *Lease {
	hd := newHolding(sh.h, sh, sh.h.token)
	sh.readers[hd] = struct{}{}
	return hd.first(ctx, ref)
}

// joinableLocked reports whether one more reader may join, and closes the share if not.
func (sh *readShare) joinableLocked() bool {
	if sh.closed {
		return false
	}
	writer := false
	if sh.sub != nil {
		select {
		case <-sh.sub.c:
			writer = true
		default:
		}
	}
	if writer || sh.c.since(sh.since) >= readShareAge || !sh.h.valid() {
		sh.closeLocked()
		return false
	}
	return true
}

// closeLocked stops new readers from joining: the share leaves the Client's table.
func (sh *readShare) closeLocked() {
	if sh.closed {
		return
	}
	sh.closed = true
	sh.unsubscribeLocked()
	if sh.ageOut != nil {
		sh.ageOut.Stop()
	}
	sh.c.mu.Lock()
	if sh.c.shares[sh.key] == sh {
		delete(sh.c.shares, sh.key)
	}
	sh.c.mu.Unlock()
}

func (sh *readShare) unsubscribeLocked() {
	if sh.sub != nil {
		sh.sub.close()
		sh.sub = nil
	}
}

// unlock lets go of l's holding: the hold is released when it was the last reader's.
func (sh *readShare) unlock(ctx context.Context, l *Lease) error {
	sh.mu.Lock()
	if _, ok := sh.readers[l.hd]; !ok { // the hold ended meanwhile
		sh.mu.Unlock()
		l.finish(sh.h.lossErr(), true)
		return l.heldErr()
	}
	delete(sh.readers, l.hd)
	last := len(sh.readers) == 0
	if last {
		sh.closeLocked()
		sh.gone = true
	}
	sh.mu.Unlock()
	switch {
	case !last && !sh.h.valid():
		// Others still read through the hold, but it is no longer certainly held: this
		// reader's lease may have run out before its Unlock, which must not say otherwise.
		lost := leaseLost(l.ref.name, errDeadline)
		if !sh.h.isHeld() {
			lost = sh.h.lossErr()
		}
		l.finish(lost, true)
		return l.heldErr()
	case !last:
		l.finish(nil, true)
		return nil
	case !sh.h.beginRelease():
		// Lost while we got here: end the lease with the hold's loss.
		l.finish(sh.h.lossErr(), true)
		return l.heldErr()
	}
	return l.finishRelease(ctx, sh.h)
}

// holdEnded runs when the hold was lost or the Client closed: every reader's lease ends with
// err.
func (sh *readShare) holdEnded(err error) {
	sh.mu.Lock()
	sh.closeLocked()
	sh.gone = true
	readers := slices.Collect(maps.Keys(sh.readers))
	clear(sh.readers)
	sh.mu.Unlock()
	for _, hd := range readers {
		hd.end(err)
	}
}

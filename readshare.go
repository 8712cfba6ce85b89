package dlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// readShareAge is how long a Client's read hold takes new local readers: cohortBatchTime
// (a variable for tests that must tell the push from the age bound).
var readShareAge = cohortBatchTime

// A readShare is one Redis read hold of a Client shared by its goroutines' read leases (reader
// cohorting). A reader whose Client holds the lock to read joins that hold without a round
// trip while the hold is young (readShareAge), valid, and no writer waits for the lock in
// Redis: the acquire's reply says whether anyone waited then, and a writer joining the queue
// later is pushed ("x" on the lock's channel, heard on a channel the Client has subscribed).
// Otherwise the reader gets a read hold through the Redis queue (pendingRead), which later
// readers may join. So a waiting writer is overtaken by no new reader of a Client that heard
// of it, and by none at all once the young hold's batch time has passed. The hold is released
// when it has no reader and no reserved place left, and all its readers' leases end when it
// is lost. Its readers share the read phase's token, as every
// reader admitted in one phase does.
type readShare struct {
	c     *Client
	key   string // in the Client's table of open shares: lock key + settings (cohortVariant)
	h     *hold
	since time.Time
	sub   *subscription // woken when a writer joins the queue; nil without push

	ageOut *time.Timer // closes the share at readShareAge (sh.mu)

	mu       sync.Mutex
	closed   bool // no new reader joins (but those the hold was waited for: joinReserved)
	gone     bool // released or ended: nobody joins
	readers  map[*holding]struct{}
	reserved int // places of readers that waited for the hold and have not joined yet
}

// A pendingRead is a Client's wait in the Redis queue for a read hold, on behalf of every
// reader of the Client that found no hold to join: they wait for it locally, and the hold it
// gets has a place reserved for each of them, so a read phase admits one hold per Client
// rather than one per goroutine, and none of them loses its place to a writer that came after
// it. The wait goes on while any of them still waits (it runs on its own goroutine).
type pendingRead struct {
	c    *Client
	key  string        // the lock's share key, in the Client's table while new readers may join
	done chan struct{} // closed when the wait ended
	sh   *readShare    // the hold it got, with the waiters' places reserved; set before done
	err  error         // why it got none, unless every waiter had left; set before done
	// waiters counts the readers waiting for it and ended says the wait has ended (Client.mu):
	// the wait ends when no reader is left, and a reader that leaves after gives its place back.
	waiters int
	ended   bool
	wctx    context.Context // the Redis wait's: ends when no reader waits any more, or at Close
	cancel  context.CancelFunc
	failing atomic.Pointer[error] // the wait's last attempt's ErrUnavailable, for a ctx that ends
}

// writerQueued takes the wait out of the Client's table when a writer joins the queue: the
// readers waiting already keep their places, and new ones wait again behind the writer.
func (p *pendingRead) writerQueued() { p.c.detachRead(p.key, p) }

func (p *pendingRead) attempted(failing error) {
	if failing == nil {
		p.failing.Store(nil)
	} else {
		p.failing.Store(&failing)
	}
}

func (p *pendingRead) lastFailure() error {
	if e := p.failing.Load(); e != nil {
		return *e
	}
	return nil
}

// detachRead takes the Client's read wait for the lock out of its table (only p, when p is
// given), so readers that come later start a wait of their own.
func (c *Client) detachRead(key string, p *pendingRead) {
	c.mu.Lock()
	if q := c.pendingReads[key]; q != nil && (p == nil || q == p) {
		delete(c.pendingReads, key)
	}
	c.mu.Unlock()
}

// sharedRead takes rw to read for a goroutine of the Client: it joins the Client's open read
// hold if it may; otherwise TryRLock takes a hold of its own, and RLock waits with the
// Client's other readers for one (see pendingRead). Later readers may join either.
func (c *Client) sharedRead(ctx context.Context, rw *RWMutex, ref lockRef, wait bool) (*Lease, error) {
	for {
		if l := c.joinShare(ctx, rw.share, ref); l != nil {
			return l, nil
		}
		if !wait {
			h, _, err := c.tryHold(ctx, rw.shareSpec(), false)
			if err != nil {
				return nil, err
			}
			if l := c.openShare(rw.share, h, 1).joinReserved(ctx, ref); l != nil {
				return l, nil
			}
			return nil, notObtained(rw.name, errLostAtOnce)
		}
		p, err := c.awaitRead(ctx, rw)
		if err != nil {
			return nil, err
		}
		if p.sh == nil {
			return nil, p.err
		}
		if l := p.sh.joinReserved(ctx, ref); l != nil {
			return l, nil
		}
		// The hold was lost before we could read through it: wait again.
	}
}

// shareSpec is the spec of a new shared read hold: an owner of its own in Redis, since a
// reader's entries there are per owner.
func (rw *RWMutex) shareSpec() holdSpec {
	return holdSpec{name: rw.name, keys: rw.keys, cfg: rw.cfg, access: accessRead,
		owner: rw.c.id + rw.share[len(rw.keys.lock):] + "/r" + rw.c.nextHoldID()}
}

// awaitRead waits, with the Client's other readers of rw, for the read hold the Client waits
// for in Redis (starting that wait if none is under way). It returns the ended wait, which has
// a place reserved for the caller on its hold, or the caller's own ctx or Close error.
func (c *Client) awaitRead(ctx context.Context, rw *RWMutex) (*pendingRead, error) {
	c.mu.Lock()
	p := c.pendingReads[rw.share]
	fresh := p == nil
	if fresh {
		p = &pendingRead{c: c, key: rw.share, done: make(chan struct{})}
		p.wctx, p.cancel = context.WithCancel(c.bg)
		c.pendingReads[rw.share] = p
	}
	p.waiters++
	c.mu.Unlock()
	var own error // this reader's own attempt's ErrUnavailable, if it made the first
	if fresh {
		own = c.startRead(ctx, rw, p)
	}
	select {
	case <-p.done:
		return p, nil
	case <-ctx.Done():
		c.leaveWait(p)
		return nil, notObtained(rw.name, ctx.Err(), cmpOr(p.lastFailure(), own))
	case <-c.bg.Done():
		c.leaveWait(p)
		return nil, fmt.Errorf("%w: lock %q", ErrClosed, rw.name)
	}
}

// startRead makes p's first attempt from the goroutine of the reader that started it, so an
// uncontended lock costs no hand-off (readers that come meanwhile wait for it: p is in the
// table already), and when the lock is taken goes on waiting on a goroutine of its own. It
// returns the attempt's error when Redis gave no answer to it (ErrUnavailable).
func (c *Client) startRead(ctx context.Context, rw *RWMutex, p *pendingRead) (unavailable error) {
	s := rw.shareSpec()
	s.observer = p
	h, _, err := c.tryHold(ctx, s, false)
	if errors.Is(err, ErrUnavailable) {
		unavailable = err
	}
	if unknownOutcome(err) {
		// The attempt may still reach Redis: the wait is another owner, to which it is a
		// stranger.
		s = rw.shareSpec()
		s.observer = p
	}
	switch {
	case h != nil:
		c.endWait(p, h, nil)
		return unavailable
	case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
		p.attempted(err) // Redis's doing, not this reader's ctx (a deadline reads as a timeout)
	case !errors.Is(err, ErrNotObtained) && !errors.Is(err, ErrUnavailable):
		c.endWait(p, nil, err) // an error every reader gets (a mutex's name, Close)
		return unavailable
	}
	if ctx.Err() != nil {
		// This reader gives up: if nobody else waits, the wait ends here, with no Redis call.
		c.mu.Lock()
		if p.waiters == 1 {
			if c.pendingReads[p.key] == p {
				delete(c.pendingReads, p.key)
			}
			p.ended = true
			c.mu.Unlock()
			p.err = err
			p.cancel()
			close(p.done)
			return unavailable
		}
		c.mu.Unlock()
	}
	// Taken, or no answer: wait in Redis for everyone who still waits (if this reader's own
	// ctx ended, it leaves the wait, which ends when nobody is left).
	contended := errors.Is(err, ErrNotObtained) && ctx.Err() == nil
	if !c.goBackground() {
		c.endWait(p, nil, fmt.Errorf("%w: lock %q", ErrClosed, rw.name))
		return unavailable
	}
	go c.waitRead(rw, p, s, contended)
	return unavailable
}

// waitRead is the Client's wait in Redis for a read hold of rw, on behalf of p's waiters.
func (c *Client) waitRead(rw *RWMutex, p *pendingRead, s holdSpec, contended bool) {
	defer c.wg.Done()
	h, err := c.waitHold(p.wctx, s, contended)
	if err != nil && c.checkOpen() != nil {
		err = fmt.Errorf("%w: lock %q", ErrClosed, rw.name) // not the wait's own ctx, which Close ended
	}
	c.endWait(p, h, err)
}

// endWait ends p with the hold h got for its waiters, or with err.
func (c *Client) endWait(p *pendingRead, h *hold, err error) {
	defer p.cancel()
	var sh *readShare
	if h != nil && h.othersWait {
		// A writer waits behind the hold: later readers wait anew, behind it, rather than
		// join this wait on its way out (its share takes no later reader either).
		c.detachRead(p.key, p)
	}
	if h != nil {
		// Open to later readers first, with one place (ours) that keeps it until the waiters
		// have theirs: a reader that comes in between joins it rather than waiting anew.
		sh = c.openShare(p.key, h, 1)
	}
	c.mu.Lock()
	if c.pendingReads[p.key] == p {
		delete(c.pendingReads, p.key)
	}
	p.ended = true
	n := p.waiters // from now on a waiter that leaves gives its place back (leaveWait)
	c.mu.Unlock()
	if sh != nil {
		sh.reserve(n - 1) // the waiters' places in place of ours; let go if nobody is left
	}
	p.sh, p.err = sh, err
	close(p.done)
}

// leaveWait takes a reader that stops waiting out of p: the Redis wait ends when it was the
// last, and a place already reserved for it on p's hold is given back.
func (c *Client) leaveWait(p *pendingRead) {
	c.mu.Lock()
	if !p.ended {
		p.waiters--
		if p.waiters == 0 {
			if c.pendingReads[p.key] == p {
				delete(c.pendingReads, p.key)
			}
			p.cancel()
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	<-p.done // ending now, with a place counted for us
	if p.sh != nil {
		p.sh.unreserve()
	}
}

// openShare makes h a shared read hold with reserved places for readers that waited for it,
// open to later local readers while it is young unless a writer waits.
func (c *Client) openShare(key string, h *hold, reserved int) *readShare {
	sh := &readShare{c: c, key: key, h: h, since: c.now(), reserved: reserved, readers: make(map[*holding]struct{})}
	if ended, _ := h.setOnEnd(sh.holdEnded); ended {
		sh.closed, sh.gone = true, true // lost at once: the waiters wait again
		return sh
	}
	// Listen for writers only on a channel this Client already has subscribed (a lock with
	// waiters): a fresh subscription costs a round trip, and for an uncontended lock the age
	// bound alone is as good.
	var sub *subscription
	if n := c.notifierFor(c.bg, h.keys.lock); n != nil && !h.othersWait && n.subscribed(h.keys.channel) {
		sub = n.subscribe(c.bg, h.keys.channel, writerWaits)
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed || h.othersWait {
		sh.closed = true // ended meanwhile, or a writer waits: only the waiters read through it
		if sub != nil {
			sub.close()
		}
		return sh
	}
	sh.sub = sub
	c.mu.Lock()
	c.shares[sh.key] = sh
	c.mu.Unlock()
	// Closed when its time is up, so it holds no subscription or table entry after.
	sh.ageOut = time.AfterFunc(readShareAge, func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		sh.closeLocked()
	})
	return sh
}

// closeShare lets no new reader join the Client's open read hold of the lock, if any.
func (c *Client) closeShare(key string) {
	c.mu.Lock()
	sh := c.shares[key]
	c.mu.Unlock()
	if sh != nil {
		sh.mu.Lock()
		sh.closeLocked()
		sh.mu.Unlock()
	}
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

// joinReserved takes up a place reserved for the caller on the hold (it waited for it, so it
// joins even once the share is closed to new readers: it was in line before any writer this
// Client heard of) and returns its read lease, or nil when the hold is gone or no longer
// certainly held.
func (sh *readShare) joinReserved(ctx context.Context, ref lockRef) *Lease {
	sh.mu.Lock()
	sh.reserved--
	if !sh.gone && sh.h.valid() {
		defer sh.mu.Unlock()
		return sh.addLocked(ctx, ref)
	}
	idle := sh.idleLocked()
	sh.mu.Unlock()
	if idle {
		sh.giveBackLater()
	}
	return nil
}

// unreserve gives back a place reserved for a reader that stopped waiting.
func (sh *readShare) unreserve() { sh.reserve(-1) }

// reserve adds n places (n < 0 gives places back), releasing the hold when it is left idle.
func (sh *readShare) reserve(n int) {
	sh.mu.Lock()
	sh.reserved += n
	idle := sh.idleLocked()
	sh.mu.Unlock()
	if idle {
		sh.giveBackLater()
	}
}

// giveBackLater releases the idle hold from a background goroutine: the reader whose leaving
// made it idle is giving up and must not wait for Redis (Close releases it otherwise).
func (sh *readShare) giveBackLater() {
	if !sh.c.goBackground() {
		return
	}
	go func() {
		defer sh.c.wg.Done()
		sh.c.giveBack([]*hold{sh.h})
	}()
}

// idleLocked reports, once, that the hold has no reader and no reserved place left, so the
// caller releases it.
func (sh *readShare) idleLocked() bool {
	if sh.gone || len(sh.readers) > 0 || sh.reserved > 0 {
		return false
	}
	sh.closeLocked()
	sh.gone = true
	return true
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
	valid := sh.h.valid() // before another reader can let the hold go
	last := sh.idleLocked()
	sh.mu.Unlock()
	switch {
	case !last && !valid:
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
	told := false
	for _, hd := range readers {
		told = hd.end(err, !told) || told // warned once for the hold, not per reader
	}
}

package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	// cohortBlock is how many tokens a hold reserves (see lib.lua) and so the most local
	// hand-offs one Redis hold can serve.
	cohortBlock = 64
	// cohortBatchTime bounds how long a Client keeps a contended lock for its own goroutines
	// before passing it to the next process in the Redis queue.
	cohortBatchTime = 5 * time.Millisecond
	// cohortLinger is how long a Client keeps a lock it had to wait for after its last local
	// holder left, in case a goroutine locks again at once (a loop): it then gets the lock
	// without a round trip, within the same batch bounds. An uncontended hold is released at
	// once.
	cohortLinger = 500 * time.Microsecond
	// cohortLingerBatch bounds a batch served by lingering (one goroutine re-locking in a
	// loop) tighter than cohortBatchTime, since every other process then waits for one
	// goroutine's run.
	cohortLingerBatch = 2 * time.Millisecond
)

// A cohort is a Client's local queue for one lock (lock cohorting): the Client takes the Redis
// lock once, under its own owner id, and hands it from goroutine to goroutine in this process
// without a Redis round trip, up to a bounded batch (cohortBlock hand-offs, cohortBatchTime),
// then releases it to the next process in the Redis FIFO. Each local holder gets its own
// Lease with a token from the hold's block, so tokens still rise across every holder.
type cohort struct {
	c    *Client
	key  string   // in the Client's table: lock key + settings (cohortVariant)
	spec holdSpec // owner: the Client's id (+ settings, + epoch); cfg: the handles' settings
	base string   // the owner id without epoch

	mu      sync.Mutex
	dead    bool // removed from the Client's table; callers must look up afresh
	h       *hold
	next    uint64    // next token of h's block to hand out
	since   time.Time // when h was taken
	cur     *holding  // the local holder's holding, nil if none
	queue   []*cohortWaiter
	busy    bool               // a goroutine is taking or releasing the Redis hold
	stopAcq context.CancelFunc // ends the acquirer's Redis wait when the queue empties
	waited  bool               // h was obtained by waiting: other processes want this lock
	linger  *time.Timer        // releases a lingering h (see cohortLinger)
}

type cohortWaiter struct {
	m     *Mutex
	ctx   context.Context  // the waiter's: a waiter whose ctx is done is not granted the lock
	ready chan grantResult // buffered 1
}

type grantResult struct {
	l   *Lease
	err error
}

// cohortFor returns the Client's cohort for m's lock and settings, creating it on first use.
func (c *Client) cohortFor(m *Mutex) *cohort {
	c.mu.Lock()
	defer c.mu.Unlock()
	co := c.cohorts[m.cohort]
	if co == nil {
		k := lockKeys(m.cfg.keyPrefix(), m.name)
		base := c.id + m.cohort[len(m.keys.lock):]
		co = &cohort{c: c, key: m.cohort, base: base, spec: holdSpec{name: m.name, keys: k, cfg: m.cfg,
			owner: epochOwner(base, c.cohortEpoch.Load()), reentrant: false}}
		c.cohorts[m.cohort] = co
	}
	return co
}

// cohortVariant names the settings a cohort's hold is taken with (TTL, lease mode, drift),
// "" for the defaults. Handles that differ in them are served by different cohorts, whose
// owner ids differ, so each handle's lease is always taken with its own settings.
func cohortVariant(cfg config) string {
	if !cfg.ttlSet && !cfg.fixedLease && cfg.drift == nil {
		return ""
	}
	v := "/" + strconv.FormatInt(cfg.leaseTTL().Milliseconds(), 10)
	if cfg.fixedLease {
		v += "f"
	}
	if cfg.drift != nil {
		v += "/" + strconv.FormatFloat(*cfg.drift, 'g', -1, 64)
	}
	return v
}

// cohortLock takes the lock for handle m: at once if m already holds it (re-entry) or the Client
// holds it with nobody waiting locally; otherwise through the local queue, which the Client
// serves by taking the Redis lock. Without wait it makes one attempt.
//
// The waiting itself happens in await, a small frame: a goroutine waiting here keeps the
// smallest stack, which with thousands of waiters is most of their memory.
func (c *Client) cohortLock(ctx context.Context, m *Mutex, wait bool) (*Lease, error) {
	for {
		co := c.cohortFor(m)
		l, w, err, retry := co.lock(ctx, m, wait)
		switch {
		case retry:
			continue
		case w != nil:
			return co.await(ctx, m, w)
		}
		return l, err
	}
}

// lock does everything that needs no waiting: re-entry, a local hand-off, an attempt in Redis
// when the cohort is idle. When the caller must wait it queues it and returns its waiter.
func (co *cohort) lock(ctx context.Context, m *Mutex, wait bool) (l *Lease, w *cohortWaiter, err error, retry bool) {
	co.mu.Lock()
	if co.dead {
		co.mu.Unlock()
		return nil, nil, nil, true
	}
	if err := co.c.checkOpen(); err != nil {
		co.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: lock %q", err, m.name), false
	}
	if co.cur == nil && len(co.queue) == 0 && co.canHandOffLocked() {
		co.stopLingerLocked()
		l := co.grantLocked(ctx, m)
		co.mu.Unlock()
		return l, nil, nil, false
	}
	if co.cur == nil && co.h != nil && !co.busy {
		// Lingering past the batch bounds: give it back now; this caller queues for the next.
		co.stopLingerLocked()
		co.releaseLaterLocked()
	}
	if co.h == nil && !co.busy && len(co.queue) == 0 {
		// Idle: try Redis from this goroutine, saving a hand-off in the uncontended case.
		co.busy = true
		spec := co.spec
		co.mu.Unlock()
		h, _, err := co.c.tryHold(ctx, spec, false)
		co.mu.Lock()
		co.busy = false
		if unknownOutcome(err) {
			co.renewOwnerLocked()
		}
		if h != nil && co.installLocked(h, false) {
			l := co.grantLocked(ctx, m)
			co.mu.Unlock()
			return l, nil, nil, false
		}
		// Taken, Redis unavailable (the acquirer retries it), or lost the moment it was
		// taken: Lock queues; anything else, TryLock, or a done ctx returns.
		retry := h != nil || errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable)
		if !wait || ctx.Err() != nil || !retry {
			if err == nil {
				err = notObtained(m.name, errLostAtOnce)
			}
			co.kickLocked() // serve waiters that queued meanwhile
			co.retireIfIdleLocked()
			co.mu.Unlock()
			return nil, nil, err, false
		}
	} else if !wait {
		co.mu.Unlock()
		return nil, nil, notObtained(m.name), false
	}
	w = &cohortWaiter{m: m, ctx: ctx, ready: make(chan grantResult, 1)}
	co.queue = append(co.queue, w)
	co.kickLocked()
	co.mu.Unlock()
	return nil, w, nil, false
}

// await waits for w to be served, for ctx to end or for the Client to close.
func (co *cohort) await(ctx context.Context, m *Mutex, w *cohortWaiter) (*Lease, error) {
	select {
	case r := <-w.ready:
		return r.l, r.err
	case <-ctx.Done():
		return co.giveUp(ctx, m, w, notObtained(m.name, ctx.Err()))
	case <-co.c.bg.Done():
		return co.giveUp(ctx, m, w, fmt.Errorf("%w: lock %q", ErrClosed, m.name))
	}
}

// giveUp takes a waiter that stops waiting out of the queue, passing on a lock granted
// meanwhile, and returns err.
func (co *cohort) giveUp(ctx context.Context, m *Mutex, w *cohortWaiter, err error) (*Lease, error) {
	co.mu.Lock()
	if i := slices.Index(co.queue, w); i >= 0 {
		co.queue = slices.Delete(co.queue, i, i+1)
		if len(co.queue) == 0 && co.stopAcq != nil {
			co.stopAcq() // nobody left to take the Redis lock for
		}
		co.mu.Unlock()
	} else {
		co.mu.Unlock()
		if r := <-w.ready; r.l != nil { // granted just now: pass it on
			_ = r.l.Unlock(context.WithoutCancel(ctx))
		}
	}
	return nil, err
}

// canHandOffLocked reports whether the Client's hold may serve one more local holder.
func (co *cohort) canHandOffLocked() bool {
	return co.h != nil && !co.busy && co.next < co.h.token+cohortBlock &&
		co.c.since(co.since) < cohortBatchTime && co.h.valid()
}

// installLocked makes h the Client's hold for this lock. It reports false if h was lost
// before it could be installed.
func (co *cohort) installLocked(h *hold, waited bool) bool {
	if ended, _ := h.setOnEnd(func(err error) { co.holdEnded(h, err) }); ended {
		return false
	}
	co.h, co.next, co.since, co.waited = h, h.token, co.c.now(), waited
	return true
}

// grantLocked makes m, locking with ctx, the local holder with the next token of the block.
func (co *cohort) grantLocked(ctx context.Context, m *Mutex) *Lease {
	co.cur = newHolding(co.h, co, co.next)
	co.next++
	return co.cur.first(ctx, m.ref())
}

// kickLocked starts a goroutine taking the Redis lock for the local queue, if one is needed.
func (co *cohort) kickLocked() {
	if co.h != nil || co.busy || len(co.queue) == 0 || co.c.checkOpen() != nil {
		return
	}
	if !co.c.goBackground() {
		return
	}
	co.busy = true
	ctx, cancel := context.WithCancel(co.c.bg)
	co.stopAcq = cancel
	go co.acquire(ctx, cancel)
}

// acquire waits in the Redis queue on behalf of the local waiters and gives the lock to the
// first of them.
func (co *cohort) acquire(ctx context.Context, cancel context.CancelFunc) {
	defer co.c.wg.Done()
	defer cancel()
	// The acquirer serves goroutines that found the lock taken, often right after this Client
	// let it go at the end of a batch: it must queue behind the other processes, not barge.
	co.mu.Lock()
	s := co.spec
	co.mu.Unlock()
	s.noBarge = true
	h, err := co.c.waitHold(ctx, s, true)
	co.mu.Lock()
	co.busy, co.stopAcq = false, nil
	if h == nil && unknownOutcome(err) {
		co.renewOwnerLocked() // its last attempt may still be on its way
	}
	switch {
	case h == nil && ctx.Err() != nil && co.c.checkOpen() == nil:
		co.kickLocked() // the queue emptied; a waiter may have come back since
	case h == nil:
		for _, w := range co.queue { // Redis error or Client closed: every waiter gets it
			w.ready <- grantResult{err: err}
		}
		co.queue = nil
	case !co.installLocked(h, true):
		co.kickLocked() // lost at once: try again for the waiters
	case co.grantHeadLocked():
	default:
		h := co.detachLocked() // everyone left meanwhile
		co.mu.Unlock()
		rctx, rcancel := context.WithTimeout(co.c.cleanup, abandonTimeout)
		defer rcancel()
		_ = co.releaseDetached(rctx, h, nil)
		return
	}
	co.retireIfIdleLocked()
	co.mu.Unlock()
}

// renewOwnerLocked gives the later holds of the Client's cohorts an owner id of a new epoch,
// after an attempt whose outcome is unknown (its reply lost, or a wait that ended with attempts
// in flight). Such an attempt may still reach Redis after a later one took the lock: under the
// same owner it would take that hold for a stale one of the cohort's (see acquire.lua) and
// drop it; under another owner it meets a foreign hold, and what it takes itself is undone
// (abandon, or the wait's leaving). The epoch is the Client's, so a cohort that retires and
// comes back does not return to the old owner id.
func (co *cohort) renewOwnerLocked() {
	co.spec.owner = epochOwner(co.base, co.c.cohortEpoch.Add(1))
}

// unknownOutcome reports an error of a Redis call that may yet run, or have run: a transport
// error (ErrUnavailable that is not Redis's own reply), not an answer such as "not obtained".
func unknownOutcome(err error) bool {
	return errors.Is(err, ErrUnavailable) && !isRedisReply(err)
}

// epochOwner is a cohort's owner id in epoch e.
func epochOwner(base string, e uint64) string {
	if e == 0 {
		return base
	}
	return base + "~" + strconv.FormatUint(e, 36)
}

// grantHeadLocked makes the first waiter whose ctx is not done the local holder; waiters that
// gave up are told so on the way. It reports whether anyone was granted.
func (co *cohort) grantHeadLocked() bool {
	for len(co.queue) > 0 {
		w := co.queue[0]
		co.queue = co.queue[1:]
		if err := w.ctx.Err(); err != nil {
			w.ready <- grantResult{err: notObtained(w.m.name, err)}
			continue
		}
		w.ready <- grantResult{l: co.grantLocked(w.ctx, w.m)}
		return true
	}
	return false
}

// unlock lets go of the local holding of l, its last lease (already taken out of it): the
// lock goes to the next local waiter while the batch allows, else back to Redis.
func (co *cohort) unlock(ctx context.Context, l *Lease) error {
	co.mu.Lock()
	if co.cur != l.hd { // the hold was lost and the holding ended meanwhile
		co.mu.Unlock()
		l.finish(l.hd.h.lossErr(), true)
		return l.heldErr()
	}
	co.cur = nil
	if co.canHandOffLocked() && co.grantHeadLocked() {
		co.mu.Unlock()
		l.finish(nil, true)
		return nil
	}
	if len(co.queue) == 0 && co.waited && co.canHandOffLocked() && co.c.since(co.since) < cohortLingerBatch {
		wait := min(cohortLinger, cohortLingerBatch-co.c.since(co.since))
		co.linger = time.AfterFunc(wait, co.lingerOver)
		co.mu.Unlock()
		l.finish(nil, true)
		return nil
	}
	h := co.detachLocked()
	co.mu.Unlock()
	return co.releaseDetached(ctx, h, l)
}

// lingerOver releases a lingering hold nobody took up.
func (co *cohort) lingerOver() {
	co.mu.Lock()
	defer co.mu.Unlock()
	if co.linger != nil && co.cur == nil && co.h != nil && !co.busy {
		co.linger = nil
		co.releaseLaterLocked()
	}
}

func (co *cohort) stopLingerLocked() {
	if co.linger != nil {
		co.linger.Stop()
		co.linger = nil
	}
}

// releaseLaterLocked detaches the Client's hold now and releases it from a background
// goroutine.
func (co *cohort) releaseLaterLocked() {
	h := co.detachLocked()
	if !co.c.goBackground() {
		return // closing: Close releases every hold
	}
	go func() {
		defer co.c.wg.Done()
		ctx, cancel := context.WithTimeout(co.c.cleanup, abandonTimeout)
		defer cancel()
		_ = co.releaseDetached(ctx, h, nil)
	}()
}

// detachLocked takes the Client's hold out of the cohort for release, in the same critical
// section that decided to release it, so no goroutine can be handed it in between. The caller
// passes it to releaseDetached.
func (co *cohort) detachLocked() *hold {
	h := co.h
	co.h, co.busy = nil, true
	co.stopLingerLocked()
	return h
}

// releaseDetached gives a detached hold back to Redis (to the next process in the queue) and,
// when local waiters remain, queues for the lock again. l, if not nil, is the lease whose
// Unlock this is; it ends with the release's result.
func (co *cohort) releaseDetached(ctx context.Context, h *hold, l *Lease) error {
	var err error
	switch {
	case h == nil || !h.beginRelease():
		// Lost or ended by Close while we got here: the lease ends with that.
		if l != nil {
			lost := fmt.Errorf("%w: lock %q", ErrClosed, l.ref.name)
			if h != nil {
				lost = h.lossErr()
			}
			l.finish(lost, true)
			err = l.heldErr()
		}
	case l != nil:
		err = l.finishRelease(ctx, h)
	default:
		_, rerr := h.release(ctx)
		h.end(nil, false)
		if rerr != nil {
			h.releaseLater() // no answer: retried until Redis answers or the TTL has run out
		}
	}
	co.mu.Lock()
	co.busy = false
	co.kickLocked()
	co.retireIfIdleLocked()
	co.mu.Unlock()
	return err
}

// holdEnded runs when the Client's hold was lost or the Client closed: the local holder's
// leases end with err, and the local queue waits for a new hold.
func (co *cohort) holdEnded(h *hold, err error) {
	co.mu.Lock()
	if co.h != h {
		co.mu.Unlock()
		return
	}
	co.h, co.busy = nil, true // no new hold until the old leases are told
	co.stopLingerLocked()
	cur := co.cur
	co.cur = nil
	co.mu.Unlock()
	if cur != nil {
		cur.end(err)
	}
	co.mu.Lock()
	co.busy = false
	co.kickLocked()
	co.retireIfIdleLocked()
	co.mu.Unlock()
}

// retireIfIdleLocked removes an idle cohort from the Client's table, so a process that locks
// millions of names (one per user, say) keeps no state for them.
func (co *cohort) retireIfIdleLocked() {
	if co.h != nil || co.busy || co.cur != nil || len(co.queue) > 0 {
		return
	}
	co.dead = true
	co.c.mu.Lock()
	if co.c.cohorts[co.key] == co {
		delete(co.c.cohorts, co.key)
	}
	co.c.mu.Unlock()
}

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
	// cohortBlock is how many tokens a hold reserves (see head.lua) and so the most local
	// hand-offs one Redis hold can serve.
	cohortBlock = 64
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

// cohortBatchTime bounds how long a Client keeps a contended lock for its own goroutines
// before passing it to the next process in the Redis queue (a variable for tests that must
// see a hand-off whatever the machine's speed).
var cohortBatchTime = 5 * time.Millisecond

// A cohort is a Client's local queue for one lock (lock cohorting): the Client takes the Redis
// lock, and hands each hold from goroutine to goroutine in this process without a Redis round
// trip, up to a bounded batch per hold (cohortBlock hand-offs, cohortBatchTime), then releases
// it to the next process in the Redis FIFO.
//
// A Mutex's cohort has one hold at a time, under the Client's owner id, and gives each local
// holder a Lease with a token of its own from the hold's block, so tokens still rise across
// every holder. A Semaphore's cohort (permits) serves the Acquires of one size: it may have as
// many holds at once as the semaphore has room for, each a holder of its own in Redis (an owner
// id of its own, as every semaphore holder), and each passed from local holder to local holder
// under the token of the semaphore's busy period, which every holder admitted while it stays
// held shares.
type cohort struct {
	c    *Client
	key  string   // in the Client's table: lock key + settings (cohortVariant) [+ size]
	spec holdSpec // owner: the Client's id (+ settings, + epoch); cfg: the handles' settings
	base string   // the owner id without epoch or hold id
	// permits: a Semaphore's cohort (see above); maxSlots: how many holds it may have at once
	// (1 for a Mutex)
	permits  bool
	maxSlots int
	// fresh: each hold has an owner id of its own, made from the Client's id: a Semaphore's
	// (each holder of permits is its own in Redis) and a Redlock's (an attempt its take gave up
	// on may land on a master late, where under a shared owner id it would take a later hold
	// of the cohort's for its own; see redlockTake)
	fresh bool

	mu        sync.Mutex
	dead      bool // removed from the Client's table; callers must look up afresh
	slots     []*cohortSlot
	queue     []*cohortWaiter
	tries     int                // callers trying Redis at once, from their own goroutine
	acquiring bool               // the acquirer waits in Redis for the local queue
	stopAcq   context.CancelFunc // ends the acquirer's Redis wait when the queue empties
}

// A cohortSlot is one Redis hold of a cohort and its local holder. It stays among the
// cohort's slots until its release has an answer or its end has been told, so a Mutex's
// cohort never takes the lock again while its last hold is on its way out.
type cohortSlot struct {
	co     *cohort
	h      grip
	next   uint64      // next token of h's block to hand out (a Mutex's)
	since  time.Time   // when h was taken
	cur    *holding    // the local holder's holding, nil if none
	waited bool        // h was obtained by waiting: other processes want this lock
	linger *time.Timer // releases a lingering h (see cohortLinger)
	out    bool        // detached for release, or ended: handed to nobody any more
}

// unlock makes a slot the sharer of the holdings it serves.
func (s *cohortSlot) unlock(ctx context.Context, l *Lease) error { return s.co.unlock(ctx, s, l) }

type cohortWaiter struct {
	ref   lockRef
	ctx   context.Context  // the waiter's: a waiter whose ctx is done is not granted the lock
	ready chan grantResult // buffered 1
}

type grantResult struct {
	l   *Lease
	err error
}

// cohortFor returns the Client's cohort called key, made by mk on first use.
func (c *Client) cohortFor(key string, mk func() *cohort) *cohort {
	c.mu.Lock()
	defer c.mu.Unlock()
	co := c.cohorts[key]
	if co == nil {
		co = mk()
		c.cohorts[key] = co
	}
	return co
}

// mutexCohort makes the cohort of m's lock and settings.
func (c *Client) mutexCohort(m *Mutex) *cohort {
	k := lockKeys(m.cfg.keyPrefix(), m.name)
	base := c.id + m.cohort[len(m.keys.lock):]
	if c.rl != nil {
		// Fresh owner ids, each a call id as Inspect reads a Redlock master's (callOwner): the
		// settings need not be in it, as no two holds share one.
		base = c.id
	}
	return &cohort{c: c, key: m.cohort, base: base, maxSlots: 1, fresh: c.rl != nil, spec: holdSpec{name: m.name, keys: k,
		cfg: m.cfg, owner: epochOwner(base, c.cohortEpoch.Load()), reentrant: false}}
}

// cohortVariant names the settings a cohort's hold is taken with (TTL, lease mode, drift, replica ack),
// "" for the defaults. Handles that differ in them are served by different cohorts, whose
// owner ids differ, so each handle's lease is always taken with its own settings.
func cohortVariant(cfg config) string {
	// Handles that differ in replica acknowledgement never share holds: a hold taken without
	// it must not be handed to a caller that asked for it.
	ack := ""
	if a := cfg.ack; a.on() {
		ack = "/a" + strconv.Itoa(a.n) + "t" + strconv.FormatInt(a.timeout.Milliseconds(), 10)
		if a.aof {
			ack += "f" + strconv.FormatBool(a.local)
		}
	}
	if !cfg.ttlSet && !cfg.fixedLease && cfg.drift == nil {
		return ack
	}
	v := "/" + strconv.FormatInt(cfg.leaseTTL().Milliseconds(), 10)
	if cfg.fixedLease {
		v += "f"
	}
	if cfg.drift != nil {
		v += "/" + strconv.FormatFloat(*cfg.drift, 'g', -1, 64)
	}
	return v + ack
}

// cohortLock takes a lock through the Client's cohort called key (made by mk on first use)
// for ref: at once when the cohort has a hold with nobody waiting locally; otherwise through
// the local queue, which the Client serves by taking holds in Redis. Without wait it makes
// one attempt.
//
// The waiting itself happens in await, a small frame: a goroutine waiting here keeps the
// smallest stack, which with thousands of waiters is most of their memory.
func (c *Client) cohortLock(ctx context.Context, key string, mk func() *cohort, ref lockRef, wait bool) (*Lease, error) {
	for {
		co := c.cohortFor(key, mk)
		l, w, err, retry := co.lock(ctx, ref, wait)
		switch {
		case retry:
			continue
		case w != nil:
			return co.await(ctx, w)
		}
		return l, err
	}
}

// lock does everything that needs no waiting: a local hand-off, an attempt in Redis when the
// cohort may take one more hold and nobody waits locally. When the caller must wait it
// queues it and returns its waiter.
func (co *cohort) lock(ctx context.Context, ref lockRef, wait bool) (l *Lease, w *cohortWaiter, err error, retry bool) {
	co.mu.Lock()
	if co.dead {
		co.mu.Unlock()
		return nil, nil, nil, true
	}
	if err := co.c.checkOpen(); err != nil {
		co.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: lock %q", err, ref.name), false
	}
	if l := co.takeIdleLocked(ctx, ref); l != nil {
		co.mu.Unlock()
		return l, nil, nil, false
	}
	if co.mayTakeLocked() && len(co.queue) == 0 {
		// Nobody waits here: try Redis from this goroutine, saving a hand-off in the
		// uncontended case.
		co.tries++
		spec := co.holdSpecLocked()
		co.mu.Unlock()
		h, err := co.take(ctx, spec, false)
		co.mu.Lock()
		co.tries--
		if unknownOutcome(err) {
			co.renewOwnerLocked()
		}
		if h != nil {
			if s := co.installLocked(h, false); s != nil {
				l := co.grantLocked(ctx, s, ref)
				co.kickLocked() // serve waiters that queued meanwhile, if there is room
				co.mu.Unlock()
				return l, nil, nil, false
			}
		}
		// Taken, Redis unavailable (the acquirer retries it), or lost the moment it was
		// taken: Lock queues; anything else, TryLock, or a done ctx returns.
		retry := h != nil || errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable)
		if retry && wait && ctx.Err() == nil {
			// A hold of the cohort's may have come free meanwhile (a Semaphore's, whose
			// permits the attempt found taken): it is this caller's before the queue's.
			if l := co.takeIdleLocked(ctx, ref); l != nil {
				co.mu.Unlock()
				return l, nil, nil, false
			}
		}
		if !wait || ctx.Err() != nil || !retry {
			if err == nil {
				err = notObtained(ref.name, errLostAtOnce)
			}
			co.kickLocked() // serve waiters that queued meanwhile
			co.retireIfIdleLocked()
			co.mu.Unlock()
			return nil, nil, err, false
		}
	} else if !wait {
		co.mu.Unlock()
		return nil, nil, notObtained(ref.name), false
	}
	w = &cohortWaiter{ref: ref, ctx: ctx, ready: make(chan grantResult, 1)}
	co.queue = append(co.queue, w)
	co.kickLocked()
	co.mu.Unlock()
	return nil, w, nil, false
}

// takeIdleLocked makes the caller of ref the holder of a hold of the cohort that has none,
// when nobody waits locally and the hold's batch allows (a hold lingering after its last
// holder left), and returns its lease; nil if there is none. An idle hold past its batch
// bounds is given back on the way.
func (co *cohort) takeIdleLocked(ctx context.Context, ref lockRef) *Lease {
	for _, s := range co.slots {
		switch {
		case s.cur != nil || s.out:
		case len(co.queue) == 0 && co.canHandOffLocked(s):
			s.stopLingerLocked()
			return co.grantLocked(ctx, s, ref)
		default:
			// Lingering past the batch bounds: give it back now; this caller queues for the
			// next.
			s.stopLingerLocked()
			co.releaseLaterLocked(s)
		}
	}
	return nil
}

// mayTakeLocked reports whether the cohort may take one more hold in Redis: it has fewer than
// maxSlots (those on their way out count, and the attempts in flight) and its acquirer does
// not wait in Redis already.
func (co *cohort) mayTakeLocked() bool {
	return !co.acquiring && len(co.slots)+co.tries < co.maxSlots
}

// take makes one attempt at a Redis hold for spec s (or, with wait, waits in the lock's queue
// for one): on a Redlock's masters a quorum of holds whose token block is below every later
// holder's, else one hold. A grip is returned only without error.
func (co *cohort) take(ctx context.Context, s holdSpec, wait bool) (grip, error) {
	if rl := co.c.rl; rl != nil {
		hs, token, err := rl.take(ctx, co.c, s, wait, cohortBlock)
		if err != nil {
			return nil, err
		}
		return newQuorum(hs, rl.quorum, token, s.owner), nil
	}
	var h *hold
	var err error
	if wait {
		h, err = co.c.waitHold(ctx, s, true)
	} else {
		h, _, err = co.c.tryHold(ctx, s, false)
	}
	if h == nil {
		return nil, err
	}
	return h, nil
}

// holdSpecLocked is what the cohort's next Redis attempt takes: a Mutex's cohort its owner
// id; a Semaphore's an owner id of its own for each hold.
func (co *cohort) holdSpecLocked() holdSpec {
	s := co.spec
	if co.fresh {
		s.owner = co.base + "." + co.c.nextHoldID()
	}
	return s
}

// await waits for w to be served, for ctx to end or for the Client to close.
func (co *cohort) await(ctx context.Context, w *cohortWaiter) (*Lease, error) {
	select {
	case r := <-w.ready:
		return r.l, r.err
	case <-ctx.Done():
		return co.giveUp(ctx, w, notObtained(w.ref.name, ctx.Err()))
	case <-co.c.bg.Done():
		return co.giveUp(ctx, w, fmt.Errorf("%w: lock %q", ErrClosed, w.ref.name))
	}
}

// giveUp takes a waiter that stops waiting out of the queue, passing on a lock granted
// meanwhile, and returns err.
func (co *cohort) giveUp(ctx context.Context, w *cohortWaiter, err error) (*Lease, error) {
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
			_ = r.l.giveBackUnseen(context.WithoutCancel(ctx))
		}
	}
	return nil, err
}

// canHandOffLocked reports whether slot s's hold may serve one more local holder.
func (co *cohort) canHandOffLocked(s *cohortSlot) bool {
	return !s.out && s.next < s.h.base()+cohortBlock && co.c.since(s.since) < cohortBatchTime && s.h.valid()
}

// installLocked makes h a hold of the cohort, in a slot of its own. It returns nil if h was
// lost before it could be installed.
func (co *cohort) installLocked(h grip, waited bool) *cohortSlot {
	s := &cohortSlot{co: co, h: h, next: h.base(), since: co.c.now(), waited: waited}
	if ended, _ := h.setOnEnd(func(err error) { co.holdEnded(s, err) }); ended {
		return nil
	}
	co.slots = append(co.slots, s)
	return s
}

// grantLocked makes the caller of ref, locking with ctx, the local holder of slot s: a Mutex's
// with the next token of the block, a Semaphore's with the hold's.
func (co *cohort) grantLocked(ctx context.Context, s *cohortSlot, ref lockRef) *Lease {
	token := s.next
	if co.permits {
		token = s.h.base()
	}
	s.next++
	s.cur = s.h.holding(s, token)
	return s.cur.first(ctx, ref)
}

// kickLocked starts a goroutine taking a Redis hold for the local queue, if one is needed
// and the cohort may take one.
func (co *cohort) kickLocked() {
	if !co.mayTakeLocked() || len(co.queue) == 0 || co.c.checkOpen() != nil {
		return
	}
	if !co.c.goBackground() {
		return
	}
	co.acquiring = true
	ctx, cancel := context.WithCancel(closeWaits(co.c.bg))
	co.stopAcq = cancel
	go co.acquire(ctx, cancel)
}

// acquire waits in the Redis queue on behalf of the local waiters and gives the hold it gets
// to the first of them.
func (co *cohort) acquire(ctx context.Context, cancel context.CancelFunc) {
	defer co.c.wg.Done()
	defer cancel()
	// The acquirer serves goroutines that found the lock taken, often right after this Client
	// let it go at the end of a batch: it must queue behind the other processes, not barge.
	co.mu.Lock()
	s := co.holdSpecLocked()
	co.mu.Unlock()
	s.noBarge = true
	h, err := co.take(ctx, s, true)
	co.mu.Lock()
	co.acquiring, co.stopAcq = false, nil
	if h == nil && unknownOutcome(err) {
		co.renewOwnerLocked() // its last attempt may still be on its way
	}
	var slot *cohortSlot
	if h != nil {
		slot = co.installLocked(h, true)
	}
	switch {
	case h == nil && ctx.Err() != nil && co.c.checkOpen() == nil:
		co.kickLocked() // the queue emptied; a waiter may have come back since
	case h == nil:
		for _, w := range co.queue { // Redis error or Client closed: every waiter gets it
			w.ready <- grantResult{err: err}
		}
		co.queue = nil
	case slot == nil:
		co.kickLocked() // lost at once: try again for the waiters
	case co.grantHeadLocked(slot):
		co.kickLocked() // more waiters, and room for another hold (a Semaphore's)
	default:
		h := co.detachLocked(slot) // everyone left meanwhile
		co.mu.Unlock()
		rctx, rcancel := context.WithTimeout(co.c.cleanup, abandonTimeout)
		defer rcancel()
		_ = co.releaseDetached(rctx, slot, h, nil)
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
// comes back does not return to the old owner id. A cohort with fresh owner ids (a Semaphore's,
// a Redlock's) needs none: each of its attempts has an owner id of its own.
func (co *cohort) renewOwnerLocked() {
	if !co.fresh {
		co.spec.owner = epochOwner(co.base, co.c.cohortEpoch.Add(1))
	}
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

// grantHeadLocked makes the first waiter whose ctx is not done the local holder of slot s;
// waiters that gave up are told so on the way. It reports whether anyone was granted.
func (co *cohort) grantHeadLocked(s *cohortSlot) bool {
	for len(co.queue) > 0 {
		w := co.queue[0]
		co.queue = co.queue[1:]
		if err := w.ctx.Err(); err != nil {
			w.ready <- grantResult{err: notObtained(w.ref.name, err)}
			continue
		}
		w.ready <- grantResult{l: co.grantLocked(w.ctx, s, w.ref)}
		if len(co.queue) == 0 && co.stopAcq != nil {
			// The acquirer waits in Redis for nobody now (a Semaphore's, while another of
			// its holds served the last waiter): it would keep its place in the queue ahead
			// of other processes for permits nobody here wants.
			co.stopAcq()
		}
		return true
	}
	return false
}

// unlock lets go of the local holding of l in slot s, its last lease (already taken out of
// it): the hold goes to the next local waiter while the batch allows, else back to Redis.
func (co *cohort) unlock(ctx context.Context, s *cohortSlot, l *Lease) error {
	co.mu.Lock()
	if s.cur != l.hd { // the hold was lost and the holding ended meanwhile
		co.mu.Unlock()
		l.finish(l.hd.lossErr(), true)
		return l.heldErr()
	}
	s.cur = nil
	if co.canHandOffLocked(s) && co.grantHeadLocked(s) {
		co.mu.Unlock()
		l.finish(nil, true)
		return nil
	}
	if len(co.queue) == 0 && s.waited && co.canHandOffLocked(s) && co.c.since(s.since) < cohortLingerBatch {
		wait := min(cohortLinger, cohortLingerBatch-co.c.since(s.since))
		s.linger = time.AfterFunc(wait, s.lingerOver)
		co.mu.Unlock()
		l.finish(nil, true)
		return nil
	}
	h := co.detachLocked(s)
	co.mu.Unlock()
	return co.releaseDetached(ctx, s, h, l)
}

// lingerOver releases a lingering hold nobody took up.
func (s *cohortSlot) lingerOver() {
	co := s.co
	co.mu.Lock()
	defer co.mu.Unlock()
	if s.linger != nil && s.cur == nil && !s.out {
		s.linger = nil
		co.releaseLaterLocked(s)
	}
}

func (s *cohortSlot) stopLingerLocked() {
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
}

// releaseLaterLocked detaches slot s's hold now and releases it from a background goroutine.
func (co *cohort) releaseLaterLocked(s *cohortSlot) {
	h := co.detachLocked(s)
	if !co.c.goBackground() {
		return // closing: Close releases every hold
	}
	go func() {
		defer co.c.wg.Done()
		ctx, cancel := context.WithTimeout(co.c.cleanup, abandonTimeout)
		defer cancel()
		_ = co.releaseDetached(ctx, s, h, nil)
	}()
}

// detachLocked takes slot s's hold out of service for release, in the same critical section
// that decided to release it, so no goroutine can be handed it in between. The caller passes
// it to releaseDetached.
func (co *cohort) detachLocked(s *cohortSlot) grip {
	s.out = true
	s.stopLingerLocked()
	return s.h
}

// releaseDetached gives a detached hold back to Redis (to the next process in the queue) and,
// when local waiters remain, queues for the lock again. l, if not nil, is the lease whose
// Unlock this is; it ends with the release's result.
func (co *cohort) releaseDetached(ctx context.Context, s *cohortSlot, h grip, l *Lease) error {
	err := h.letGo(ctx, l)
	co.mu.Lock()
	co.removeLocked(s)
	co.kickLocked()
	co.retireIfIdleLocked()
	co.mu.Unlock()
	return err
}

// removeLocked takes slot s, whose hold has been released or ended, out of the cohort.
func (co *cohort) removeLocked(s *cohortSlot) {
	if i := slices.Index(co.slots, s); i >= 0 {
		co.slots = slices.Delete(co.slots, i, i+1)
	}
}

// holdEnded runs when slot s's hold was lost or the Client closed: the local holder's leases
// end with err, and the local queue waits for a new hold.
func (co *cohort) holdEnded(s *cohortSlot, err error) {
	co.mu.Lock()
	if s.out {
		co.mu.Unlock()
		return // being released: releaseDetached tells its lease
	}
	s.out = true // no new holder, nor a Mutex's new hold, until the old leases are told
	s.stopLingerLocked()
	cur := s.cur
	s.cur = nil
	co.mu.Unlock()
	if cur != nil {
		cur.end(err, true)
	}
	co.mu.Lock()
	co.removeLocked(s)
	co.kickLocked()
	co.retireIfIdleLocked()
	co.mu.Unlock()
}

// retireIfIdleLocked removes an idle cohort from the Client's table, so a process that locks
// millions of names (one per user, say) keeps no state for them.
func (co *cohort) retireIfIdleLocked() {
	if len(co.slots) > 0 || co.acquiring || co.tries > 0 || len(co.queue) > 0 {
		return
	}
	co.dead = true
	co.c.mu.Lock()
	if co.c.cohorts[co.key] == co {
		delete(co.c.cohorts, co.key)
	}
	co.c.mu.Unlock()
}

package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// doneCtx is a context that has ended: a subscription made with it does not wait for Redis to
// confirm it.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// pollWithoutPush bounds a waiter's sleep when no notification can reach it (the notification
// connection is down, or the client type has none).
const pollWithoutPush = 50 * time.Millisecond

// lateRetry is how long an acquire whose reply came after the lease's safe deadline waits
// before trying again, so a network that stays that slow is not hammered.
const lateRetry = 10 * time.Millisecond

// leaveTimeout bounds how long a waiter that gives up spends leaving the Redis queue.
const leaveTimeout = time.Second

// lockWith runs a primitive's lock call take for ref (waiting if wait is set), told to the
// Client's observer: bad (the handle's invalid name or option, or a bad argument) is returned
// as is, a done ctx gets no lease, a ctx holding a lease of the lock re-enters it (when access
// allows; a ref without a lock key, a MultiLock's or a Semaphore's, never re-enters), and a
// lease obtained while ctx ended is given back. take runs with the context the observer gave;
// the lease keeps the caller's.
func (c *Client) lockWith(ctx context.Context, ref lockRef, a access, wait bool, bad error, take func(context.Context) (*Lease, error)) (*Lease, error) {
	if ctx == nil {
		if bad == nil {
			bad = nilContext("lock", ref.name)
		}
		ctx = context.Background() // only for the observer: the call takes nothing
	}
	if c.obs == nil {
		if bad != nil {
			return nil, bad
		}
		return c.lockWithin(ctx, ctx, ref, a, take)
	}
	call := Call{Name: ref.name}
	call.Kind, call.Method = callKind(a, ref.lock == "" && a == accessMutex, wait)
	octx := c.observeStart(ctx, &call)
	var l *Lease
	err := bad
	if err == nil {
		l, err = c.lockWithin(ctx, octx, ref, a, take)
	}
	if l != nil {
		l.mu.Lock()
		l.lockCx = ctx // work under the lease is not part of the lock call
		l.mu.Unlock()
	}
	// A CallDone that panics (or calls runtime.Goexit) leaves the caller without the lease:
	// the lock must not stay held, renewed for nobody, until Close.
	told := false
	defer func() {
		if !told && l != nil {
			_ = l.giveBackUnseen(context.WithoutCancel(ctx))
		}
	}()
	c.observeDone(octx, call, l, err)
	told = true
	return l, err
}

// lockWithin is lockWith's work: ctx is the caller's, octx the one the call runs with (ctx, or
// one the observer derived from it).
func (c *Client) lockWithin(ctx, octx context.Context, ref lockRef, a access, take func(context.Context) (*Lease, error)) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, notObtained(ref.name, err)
	}
	if hd := reentered(ctx, ref); hd != nil && ref.lock != "" {
		return hd.reenter(ctx, ref, a)
	}
	l, err := take(octx)
	if err == nil && ctx.Err() != nil {
		// The caller's ctx ended while the lock was being taken: it must not get a lease it
		// will not expect, so the lock goes on to the next waiter.
		_ = l.giveBackUnseen(context.WithoutCancel(ctx))
		return nil, notObtained(ref.name, ctx.Err())
	}
	return l, err
}

// plainLease takes a hold of its own for s (waiting when wait is set) and returns its lease.
func (c *Client) plainLease(ctx context.Context, ref lockRef, s holdSpec, wait bool) (*Lease, error) {
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
	return newHolding(h, nil, h.token).first(ctx, ref), nil
}

// ownerIDs are a handle's owner ids (every primitive's handle has one): the WithOwner id, or
// a random id made on first use, and per lock call an id of its own.
type ownerIDs struct {
	id    string // the WithOwner id, or "" until made
	fixed bool   // WithOwner: every call is that owner
	once  sync.Once
	seq   atomic.Uint64
}

// init sets the ids from a handle's configuration, before the handle is shared.
func (o *ownerIDs) init(cfg config) { o.id, o.fixed = cfg.owner, cfg.ownerSet }

// handle returns the handle's id: the WithOwner id, or a random 128-bit one made on first use.
func (o *ownerIDs) handle() string {
	o.once.Do(func() {
		if o.id == "" {
			o.id = newOwnerID()
		}
	})
	return o.id
}

// call returns the Redis owner id of one lock call: the WithOwner id, or the handle's id with
// a sequence number, so goroutines sharing a handle are different owners.
func (o *ownerIDs) call() string {
	if o.fixed {
		return o.id
	}
	return o.fresh()
}

// fresh returns an owner id of its own for one call, made from the handle's (WithOwner or
// not): for holds that are never one owner's, as a semaphore's.
func (o *ownerIDs) fresh() string {
	return o.handle() + "." + strconv.FormatUint(o.seq.Add(1), 36)
}

// unique returns an owner id no other call makes, in any handle or process, made from the
// handle's (WithOwner or not) and c's next hold id: for holds that are never one owner's
// even when handles share a WithOwner id, as a semaphore's.
func (o *ownerIDs) unique(c *Client) string { return o.handle() + "." + c.nextHoldID() }

// holdSpec says which hold to take: lock, owner and configuration.
type holdSpec struct {
	name      string
	keys      keys
	cfg       config
	owner     string
	reentrant bool // false for a cohort: its own hold found in Redis is stale and re-taken
	noBarge   bool // a cohort's acquirer: never take a free lock ahead of waiting processes
	handOn    bool // see hold.handOn
	access    access
	// failFast: a wait (waitHold) returns Redis's ErrUnavailable instead of waiting it out (a
	// Redlock waits on one master while others may serve it)
	failFast bool
	sem      semSpec      // with accessPermits: the permits the hold takes
	observer waitObserver // nil, or told what a wait on behalf of others hears (waitHold)
	// holdID is the hold a wait's queued attempts send, the one a grant writes for it
	// (waitHold); "" gives each call a fresh one. attempt numbers the wait's attempts. undo
	// lists the hold ids of its attempts that got no usable reply, whose holds (taken or
	// granted, never used) its next attempt or its leaving drops.
	holdID  string
	attempt uint64
	undo    []string
}

// maxUndo bounds holdSpec.undo: each attempt that runs drops them all, so only a run of
// attempts none of which ran can need more. The first id of a run is kept (in an outage the
// attempt in flight when it began is the likeliest to have run; the later ones fail fast);
// a hold under an id dropped from the list expires with its TTL, unless a WithOwner co-owner
// re-enters it first.
const maxUndo = 16

// A waitObserver hears what a wait on behalf of others (the readers of a Client waiting
// together, readshare.go) must pass on to them.
type waitObserver interface {
	// writerQueued says a writer joined the lock's queue behind the wait's place (pushed "x",
	// or an attempt's reply says so); it may be called more than once.
	writerQueued()
	// attempted reports the last attempt's ErrUnavailable, or nil once Redis answered.
	attempted(failing error)
}

// tryHold runs the acquire script once. With queue set, a caller that does not get the lock
// joins (or stays in, refreshing its liveness) the lock's FIFO. When the lock is not obtained
// it returns ErrNotObtained and how long to wait before trying again; when Redis gave no
// definite answer, an error matching ErrUnavailable.
func (c *Client) tryHold(ctx context.Context, s holdSpec, queue bool) (*hold, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, notObtained(s.name, err)
	}
	if err := c.checkOpen(); err != nil {
		return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
	}
	ttl := s.cfg.leaseTTL()
	barge := bargeWindow
	if s.noBarge {
		barge = 0
	}
	holdID := s.holdID
	if holdID == "" {
		holdID = c.nextHoldID()
	}
	k := s.keys
	sent := c.now()
	ks := []string{k.lock, k.fence, k.opLog, k.queue, k.live}
	args := []any{s.owner, ttl.Milliseconds(), holdID, opLogTTL.Milliseconds(), queue,
		livenessWindow.Milliseconds(), k.channel, grantGrace.Milliseconds(), c.publishCmd,
		s.reentrant, queueTTL.Milliseconds(), barge.Milliseconds(), string(s.access), s.attempt,
		strings.Join(s.undo, " "), s.sem.n, s.sem.permits}
	var res []int64
	var err error
	viaRunner := false // sent by the runner, whose dial failures were not sent (surelyUnsent)
	if a := s.cfg.ack; a.on() {
		var r ackedCall
		if r, err = c.runAcked(ctx, a, scripts.Acquire, ks, args...); err != nil {
			if errors.Is(err, ErrInvalid) {
				return nil, 0, fmt.Errorf("lock %q: %w", s.name, err)
			}
			return nil, 0, redisErr("lock", s.name, err) // no node for the key yet: nothing sent
		}
		res, err = r.cmd.Int64Slice()
		if err == nil && len(res) > 1 && res[0] == 1 && r.short(a) {
			// Taken but not acknowledged: give it back now, on the node that took it (a Cluster
			// client's first routed call may first ask a frozen replica for command info).
			rctx, cancel := c.ownCleanup(ctx, abandonTimeout)
			_, uerr := runReleaseOn(rctx, r.node, c, s.ref(holdID), releaseIfAcquired)
			cancel()
			err := c.notReplicated(ctx, s.name, k.lock, a, r)
			if uerr != nil {
				err = fmt.Errorf("%w; giving it back failed, so it stays held until its TTL: %v", err, uerr)
			}
			return nil, 0, err
		}
		if err == nil && errors.Is(r.ack.err, ErrInvalid) {
			// Not taken, but this server cannot acknowledge as asked, so no wait could end
			// well: leave the queue the attempt may have joined, and say why at once.
			rctx, cancel := c.ownCleanup(ctx, abandonTimeout)
			_, _ = runReleaseOn(rctx, r.node, c, s.ref(holdID), releaseLeavingQueue, s.undo...)
			cancel()
			return nil, 0, c.notReplicated(ctx, s.name, k.lock, a, r)
		}
	} else {
		res, err = c.runScript(c.lockCall(ctx), scripts.Acquire, ks, args...).Int64Slice()
		viaRunner = c.runner != nil
	}
	if err != nil {
		if classify(err) == replyUnavailable {
			c.topologyMayHaveChanged(ctx) // the next attempt, the caller's or ours, may go elsewhere
		}
		if !isRedisReply(err) && s.holdID == "" && !(viaRunner && surelyUnsent(err)) {
			// The script may have run with its reply lost: undo it (abandon) so the lock is
			// not left held (it would otherwise expire only after its TTL). A wait's hold is
			// not: its next attempt finds it, and leaving the queue releases it.
			c.abandon(ctx, s.ref(holdID))
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, 0, notObtained(s.name, cerr, redisErr("lock", s.name, err))
		}
		if cerr := c.checkOpen(); cerr != nil && (classify(err) == replyUnavailable || refusedBeforeRunning(err)) {
			// Close cut the call short (a runner's back-off after LOADING, say): a call still
			// waiting then returns ErrClosed, as Close promises. (A definite answer stays one.)
			return nil, 0, fmt.Errorf("%w: %w", cerr, redisErr("lock", s.name, err))
		}
		return nil, 0, redisErr("lock", s.name, err)
	}
	if len(res) < 2 {
		return nil, 0, fmt.Errorf("dlock: lock %q: unexpected acquire reply %v", s.name, res)
	}
	if res[0] == 0 {
		wait := time.Duration(res[1]) * time.Millisecond
		if res[1] < 0 {
			wait = time.Second // a key without TTL (set by hand): re-check now and then
		}
		if len(res) > 2 && res[2] == 1 {
			return nil, max(wait, time.Millisecond), notObtained(s.name, errForeignValue)
		}
		if len(res) > 3 && res[3] == 1 {
			return nil, max(wait, time.Millisecond), notObtained(s.name, errWriterBehind)
		}
		return nil, max(wait, time.Millisecond), notObtained(s.name)
	}
	return c.startHold(ctx, s, holdID, uint64(res[1]), len(res) > 3 && res[3] == 1, ttl, 0, sent)
}

// startHold starts tracking the hold holdID that an acquire sent at sent just took for s with
// token (othersWait: see hold), unless its reply came too late to start a lease (it is then
// dropped in Redis, and the caller told to try again a little later) or it ended at once.
// grantTTL is 0 for a hold the acquire took with ttl; for a hold a grant wrote (startGranted),
// the TTL the grant gave it, which counts from sent instead until the hold's first renewal.
func (c *Client) startHold(ctx context.Context, s holdSpec, holdID string, token uint64, othersWait bool, ttl, grantTTL time.Duration, sent time.Time) (*hold, time.Duration, error) {
	// A reply that came after the lease's safe deadline (a slow network) must not start a
	// lease that is already over: drop the hold in Redis and let the caller try again a
	// little later. Decided before the hold is tracked, so no deadline timer races with it.
	late := func(why error) (*hold, time.Duration, error) {
		if s.holdID == "" { // a wait's next attempt takes its hold again (see tryHold)
			c.abandon(ctx, s.ref(holdID))
		}
		return nil, lateRetry, notObtained(s.name, why)
	}
	h := &hold{
		c: c, name: s.name, keys: s.keys, cfg: s.cfg, owner: s.owner, holdID: holdID, access: s.access, sem: s.sem,
		token: token, tracked: make(chan struct{}), ttl: ttl, grantTTL: grantTTL, heapIdx: -1,
		othersWait: othersWait, handOn: s.handOn,
	}
	if c.since(sent) >= s.cfg.safeLease(h.liveTTL()) {
		return late(errLateReply)
	}
	if err := c.track(ctx, h, sent); err != nil {
		// The Client closed while the script ran: give the hold back now, on this goroutine
		// (a background clean-up may no longer start, and Close may have returned already).
		rctx, cancel := c.ownCleanup(ctx, abandonTimeout)
		_, _ = runRelease(rctx, c, s.ref(holdID), releaseIfAcquired)
		cancel()
		h.end(err, false)
		return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
	}
	if !h.valid() {
		// The deadline passed while the hold was being tracked (its timer may have ended it
		// already), or a push ended it the moment it was taken: no lease was handed out, so
		// the caller has not obtained the lock. Close is reported as such.
		h.lose(errLateReply)
		if err := c.checkOpen(); err != nil {
			return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
		}
		if err := h.lossErr(); errors.Is(err, errLateReply) || errors.Is(err, errDeadline) || errors.Is(err, errFixedLeaseOver) {
			return late(errLateReply)
		}
		return late(errLostAtOnce)
	}
	return h, 0, nil
}

// Backoff of a waiter while Redis gives no definite answer (a failover, a restart): short
// enough that a lock whose master was just promoted is taken within a fraction of a second.
const (
	minUnavailableRetry = 10 * time.Millisecond
	maxUnavailableRetry = 200 * time.Millisecond
)

// waitHold takes a hold, waiting in the lock's FIFO until a release grants it or ctx ends.
// It subscribes to the lock's channel before an attempt that may leave it waiting, so a grant
// cannot be missed, and re-tries at the holder's remaining TTL or the liveness refresh,
// whichever comes first (the retry also refreshes its place in the queue). It does not poll
// otherwise. With contended set (the caller knows the lock is taken) or when the channel is
// already subscribed, it subscribes before its first attempt, saving one; otherwise the first
// attempt goes without, so an uncontended lock costs no subscription. While Redis is
// unavailable it retries with backoff, asking the client to refresh its view of the topology.
//
// Its queued attempts all send one hold id, recorded in Redis with its place, and a release
// that grants it the lock writes that hold for it: the pushed grant starts the hold with no
// further round trip (startGranted): if the grant names the wait's attempt Redis answered
// last. After an attempt with no usable reply (lost, or too late) the wait goes on with a new
// id, and its next attempt (or its leaving the queue) drops what the old one holds (undo);
// a grant not taken up is left to the wait's next attempt, which finds the hold, or to
// leaving the queue, which releases it.
func (c *Client) waitHold(ctx context.Context, s holdSpec, contended bool) (*hold, error) {
	// The wait holds a slot of the Client's background work until it has left the queue, so
	// Close, which ends the wait at once, waits for the leaving (bounded) before it returns.
	if !c.goBackground() {
		return nil, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
	}
	ctx = closeWaits(ctx)
	slot := true
	defer func() {
		if slot {
			c.wg.Done()
		}
	}()
	s.holdID = c.nextHoldID()
	// answered numbers the latest attempt Redis answered "not obtained", sent at queuedAt: a
	// grant that names it came after it, so the grant's TTL runs from after queuedAt. A grant
	// naming an earlier attempt may have ended before that answer (expired, lost in a
	// failover, passed on while this process was paused) and is never taken.
	var queuedAt time.Time
	var answered uint64
	leave := func() {
		slot = false
		go func() {
			defer c.wg.Done()
			c.leaveQueueNow(s)
		}()
	}
	n := c.notifierFor(ctx, s.keys.lock)
	var sub *subscription
	defer func() {
		if sub != nil {
			sub.close()
		}
	}()
	// xsub hears writers joining the queue, for an observer; subscribed with sub.
	var xsub *subscription
	defer func() {
		if xsub != nil {
			xsub.close()
		}
	}()
	listen := func() {
		sub = n.subscribe(ctx, s.keys.channel, s.owner)
		if s.observer != nil {
			// The same channel: sub's wait for its confirmation covers this one.
			xsub = n.subscribe(doneCtx, s.keys.channel, writerWaits)
		}
	}
	// An observer hears writers from the first queued attempt on: it must not miss one.
	if n != nil && (contended || s.observer != nil || n.subscribed(s.keys.channel)) {
		listen()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var failing error // the last ErrUnavailable, while Redis keeps failing
	backoff := time.Duration(0)
	for {
		s.attempt++
		before := c.now()
		h, wait, err := c.tryHoldShallow(ctx, s)
		switch {
		case errors.Is(err, ErrUnavailable) && !isRedisReply(err):
			// The attempt may have run, taking the lock or a grant under s.holdID, with its
			// reply lost: go on under a new id, and have the next attempt (or leaving) drop
			// what the old one holds, so replies that keep getting lost never keep the lock.
			s.undo = append(s.undo, s.holdID)
			if len(s.undo) > maxUndo {
				s.undo = append(s.undo[:1], s.undo[len(s.undo)-maxUndo+1:]...)
			}
			s.holdID = c.nextHoldID()
		case errors.Is(err, errLateReply) || errors.Is(err, errLostAtOnce):
			// It ran (dropping the undo list) and took a hold too late to use: the same.
			s.undo, s.holdID = []string{s.holdID}, c.nextHoldID()
		case h == nil && errors.Is(err, ErrNotObtained) && ctx.Err() == nil:
			// Redis answered: the attempt ran, dropping what the undo list held.
			s.undo, queuedAt, answered = nil, before, s.attempt
		}
		switch {
		case h != nil:
			return h, nil
		case errors.Is(err, ErrUnavailable) && s.failFast:
			leave() // the attempt may have queued, or been granted: pass that on
			return nil, err
		case errors.Is(err, ErrUnavailable):
			failing = err
			backoff = min(max(2*backoff, minUnavailableRetry), maxUnavailableRetry)
			wait = backoff/2 + rand.N(backoff/2+1)
		case errors.Is(err, ErrNotObtained) && ctx.Err() == nil:
			// On a Cluster the slot may have a new master since the last attempt (a failover,
			// a migration), whose releases publish on its own connections; a notifier may also
			// have retired, or the server have dropped the subscription (the slot moved away
			// from it). The attempt that just answered went where the lock lives now.
			if nn := c.notifierFor(ctx, s.keys.lock); nn != n || (sub != nil && sub.gone()) {
				if sub != nil {
					sub.close()
					sub = nil
				}
				if xsub != nil {
					xsub.close()
					xsub = nil
				}
				n = nn
			}
			failing, backoff = nil, 0
		default:
			if !isRedisReply(err) {
				// Cut short with no reply (the ctx ended, the Client closed): it may yet run.
				s.undo = append(s.undo, s.holdID)
			}
			leave() // it may have joined the queue: a grant must not wait for it
			if ctx.Err() != nil && (failing != nil || errors.Is(err, ErrNotObtained)) {
				// The ctx ended during the attempt: say so, as the documented contract has it.
				return nil, notObtained(s.name, ctx.Err(), failing)
			}
			return nil, err
		}
		if s.observer != nil {
			s.observer.attempted(failing)
			if errors.Is(err, errWriterBehind) {
				// Redis says so even when no push reaches us (a user that may not publish or
				// subscribe): within one refresh of the writer joining.
				s.observer.writerQueued()
			}
		}
		if sub == nil && n != nil && failing == nil {
			// Subscribe, then attempt again at once: a grant between the attempt and the
			// subscription would otherwise go unnoticed until the next retry.
			listen()
			continue
		}
		var wake, writer <-chan struct{}
		if xsub != nil {
			writer = xsub.c
		}
		wait = min(wait, livenessRefresh)
		if sub != nil {
			wake = sub.c
		}
		if sub == nil || !sub.confirmed {
			wait = min(wait, pollWithoutPush)
		}
		timer.Reset(wait)
	sleep:
		select {
		case <-ctx.Done():
			leave()
			return nil, notObtained(s.name, ctx.Err(), failing)
		case <-c.bg.Done():
			leave()
			return nil, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
		case <-wake:
			if g := sub.takeGrant(); g != nil && g.holdID == s.holdID && g.attempt == answered && answered > 0 {
				if h := c.startGranted(ctx, s, g, queuedAt); h != nil {
					return h, nil
				}
			}
		case <-writer:
			// Nothing to attempt: the lock is no nearer. Pass it on and sleep on.
			s.observer.writerQueued()
			xsub.close()
			xsub, writer = nil, nil
			goto sleep
		case <-timer.C:
		}
	}
}

// startGranted starts the hold a release granted to the wait s (g, pushed, naming the wait's
// attempt Redis answered last, sent at queuedAt), which Redis holds for it as of the grant
// with the grant's TTL: the grace, or the lease TTL if shorter. That TTL ran from after
// queuedAt, from which the hold's safe deadline counts until its first renewal, due within
// the grace, gives it the full TTL. It returns nil when too little of it is left, when the
// lease is fixed (never renewed) and longer than the grant's TTL, under WithReplicaAck (the
// grant was written on another connection, where no WAIT of ours can count it), or when the
// hold ended at once: the wait's next attempt then finds the hold and takes it with a TTL of
// its own.
func (c *Client) startGranted(ctx context.Context, s holdSpec, g *grantMsg, queuedAt time.Time) *hold {
	ttl := s.cfg.leaseTTL()
	grantTTL := min(grantGrace, ttl, g.ttl)
	if c.since(queuedAt) >= s.cfg.safeLease(grantTTL)/2 {
		return nil
	}
	if s.cfg.fixedLease && grantTTL < ttl {
		return nil // no renewal would give it the rest of its fixed TTL
	}
	if err := c.checkOpen(); err != nil {
		return nil // the wait ends on Close and leaves the queue, giving the grant back
	}
	if s.cfg.ack.on() {
		// The grant's write was made on another connection: the wait's next attempt, at once,
		// confirms it and has it acknowledged on its own (replicaack.go).
		return nil
	}
	h, _, _ := c.startHold(ctx, s, g.holdID, g.token, g.waiting, ttl, grantTTL, queuedAt)
	return h
}

// tryHoldShallow runs a queued attempt on a short-lived goroutine. A waiter's own goroutine
// then never grows the deep stack of a Redis call, which it would keep while it waits: with
// thousands of waiters that is most of their memory. Close ends the wait at once; the attempt
// itself is cut short when Close gives up on clean-up, and a hold it took is given back.
func (c *Client) tryHoldShallow(ctx context.Context, s holdSpec) (*hold, time.Duration, error) {
	type result struct {
		h    *hold
		wait time.Duration
		err  error
	}
	if !c.goBackground() {
		return nil, 0, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
	}
	done := make(chan result, 1)
	var gone atomic.Bool // the waiter returned (Close) before the attempt ended
	go func() {
		defer c.wg.Done()
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(c.cleanup, cancel)
		defer stop()
		h, wait, err := c.tryHold(actx, s, true)
		done <- result{h, wait, err}
		if gone.Load() && h == nil {
			// The attempt may have put the waiter back in the queue after it left: leave
			// again, passing on a grant (a hold it took was given back by tryHold).
			c.leaveQueueNow(s)
		}
	}()
	select {
	case r := <-done:
		return r.h, r.wait, r.err
	case <-c.bg.Done():
		// A hold the attempt took was tracked before Close looked (Close releases it) or
		// refused and given back by tryHold.
		gone.Store(true)
		return nil, 0, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
	}
}

// topologyMayHaveChanged runs when Redis gave no definite answer: a Cluster client is asked to
// reload its slot map (go-redis reloads it only on MOVED or every minute otherwise, and a
// reload request is rate-limited, so waiters keep asking until the slot's new master answers).
func (c *Client) topologyMayHaveChanged(ctx context.Context) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}

// leaveQueueNow takes a waiter out of the lock's queue, passing on a grant made to it (of the
// hold s.holdID the wait recorded, or one to confirm).
func (c *Client) leaveQueueNow(s holdSpec) {
	// Work Close waits for (a wait's own leaving, its attempt's): after Close's cut, a leaving
	// that passes on a grant or an attempt's late hold is still sent (ownCleanup).
	ctx, cancel := c.ownCleanup(closeWaits(context.Background()), leaveTimeout)
	defer cancel()
	_, _ = runRelease(ctx, c, s.ref(s.holdID), releaseLeavingQueue, s.undo...)
}

// abandon undoes, in the background, acquires whose reply was lost (the holds hs, in one
// round trip per node), if Redis applied them. Once Close has begun it undoes them on the
// goroutine of the call on ctx (ownCleanup) when that call is not work Close waits for, or
// when Close allows no more background work: a call that may have taken a lock Close will not
// release must not leave it held for its TTL.
func (c *Client) abandon(ctx context.Context, hs ...holdRef) {
	undo := func(ctx context.Context) {
		keys, args := make([][]string, len(hs)), make([][]any, len(hs))
		for i, h := range hs {
			keys[i], args[i] = releaseCall(c, h, releaseIfAcquired, nil)
		}
		c.runBatch(ctx, scripts.Release, keys, args)
	}
	if c.checkOpen() != nil && ctx.Value(closeWaitsFor{}) == nil || !c.goBackground() {
		// As background work, Close's bound would cap a call's undo, and it may be past.
		ctx, cancel := c.ownCleanup(ctx, lateGiveBack)
		defer cancel()
		undo(ctx)
		return
	}
	go func() {
		defer c.wg.Done()
		// Close may have cut its clean-up short; it waits for this goroutine.
		ctx, cancel := c.ownCleanup(closeWaits(context.Background()), abandonTimeout)
		defer cancel()
		undo(ctx)
	}()
}

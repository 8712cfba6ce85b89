package dlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
)

// multiPatience is how long a MultiLock gives way (holding no member while another is taken)
// before it takes the members in name order, waiting in each one's queue: it does so once this
// long has passed since the call began and one wait of the polite way is over (a pass, a wait
// in the taken member's queue holding nothing, another pass), so that wait comes first however
// slow the passes are. Under heavy contention the polite way mostly gives back what it waited
// for. Measured (bench/, multi-4x8, ops/s against redislock-chain-1ms in the same run, four
// runs each, once the switch kept the members already held in name order, before the polite
// wait was made sure): 0 1.07× median, 2 ms 1.08×, 5 ms 0.97×, 10 ms 0.92× (the polite way
// costs Redis calls: 80, 87, 93, 103 per operation). Earlier, when the switch gave everything
// back: 5 ms ~840 ops/s, 20 ms ~780, 50 ms ~670, and 1 s a third fewer than 50 ms with four
// times the p99 wait.
const multiPatience = 2 * time.Millisecond

// multiStepTimeout bounds a pass's attempt on a member while the pass holds members taken
// before it: a member whose node does not answer (down, paused, partitioned) must not keep the
// others from plain Mutexes on healthy nodes for as long as go-redis waits (seconds). The
// MultiLock then waits for that member alone, holding nothing, before it takes the others.
const multiStepTimeout = 200 * time.Millisecond

// errSlowMember is the cause of a pass's ErrUnavailable when a member did not answer within
// multiStepTimeout.
var errSlowMember = errors.New("no answer while the MultiLock held members before it")

// A MultiLock is a handle on several named locks taken together, all or nothing: Redisson's
// MultiLock. Its members are ordinary locks: a MultiLock over {a, b} excludes a Mutex on a, and
// the names may live on different Cluster slots. It is cheap to create, holds no Redis state
// and is safe for concurrent use; like a Mutex it excludes goroutines (each call is an owner of
// its own, unless made WithOwner).
//
// Waiting never deadlocks, and at first gives way to other lockers: Lock takes every member that
// is free in one pass in name order (one script when every name's keys share a hash slot: on a
// single Redis always, on a Cluster when the names share a {tag}), and when one is taken it gives back what it took and waits
// in that member's FIFO queue (woken by push when the member is handed to it), then tries the
// others again. So a Mutex on a free member waits for a waiting MultiLock at most one such
// pass, and a pass waits at most multiStepTimeout (200 ms) for a member while it holds others:
// a member whose node does not answer (down, paused) is then waited for alone, holding nothing.
// Once multiPatience (2 ms) has passed since the call began and one such wait is over, it
// stops giving way: it keeps the members it has before the first it lacks, gives back the
// others and takes the rest in name order, waiting in each one's queue and keeping what it has (a Mutex on an earlier member then waits
// for it, also while a later member's node is silent), which every MultiLock does in the same
// order, so they never wait for each other in a cycle. (Code that nests plain Mutexes on the same names in another order can still deadlock
// with it then, as with any ordered locking.)
//
// Its releases (those of a lease, and of members a pass gives back) hand each member straight
// to the member's first waiter. A Mutex's release frees a lock whose first waiter has waited
// only a few milliseconds, for that waiter to take with another attempt unless a caller
// outside the queue takes it first (bounded barging, which keeps a busy process going on a
// lock it re-takes at once); a waiting MultiLock, which holds nothing while it waits for a
// member, paid for that with a wake-up, an attempt and often the member. A MultiLock's passes
// may still take a free member ahead of a waiter of a few milliseconds, as a Mutex may.
//
// The lease is the same *Lease as a Mutex's, over all members: it is lost as soon as any member
// is lost (the others are then released), Extend and Unlock act on every member, Remaining is
// the least of theirs, and Tokens gives each member's fencing token (Token is 0). An Extend runs
// on every member at once; one that fails on a member may have extended the others. A
// MultiLock lease is not re-entered through its context: a Mutex or MultiLock given that
// context on one of its members gets ErrInvalid at once; other locks are taken as usual.
type MultiLock struct {
	c     *Client
	names []string // sorted
	keys  []keys
	cfg   config
	err   error // bad names or options, reported by Lock and TryLock
	// together: every member's keys are on one node's slot, so a pass is one script
	together atomic.Bool

	ids ownerIDs // see Owner
}

// MultiLock returns a handle on the locks called names, taken together. Options override the
// Client's (WithoutCohort has no effect: members are always Redis holds of the call). An empty
// list, a duplicate or an invalid name is reported by Lock and TryLock as ErrInvalid;
// MultiLock itself never fails.
func (c *Client) MultiLock(names []string, opts ...Option) *MultiLock {
	ml := &MultiLock{c: c, names: slices.Sorted(slices.Values(names)), cfg: c.cfg.apply(opts)}
	ml.ids.init(ml.cfg)
	errs := []error{c.unsupported("MultiLock"), c.err, ml.cfg.validate()}
	if len(names) == 0 {
		errs = append(errs, fmt.Errorf("%w: MultiLock of no names", ErrInvalid))
	}
	for i, n := range ml.names {
		errs = append(errs, validateName(n))
		if i > 0 && n == ml.names[i-1] {
			errs = append(errs, fmt.Errorf("%w: MultiLock names %q twice", ErrInvalid, n))
		}
		ml.keys = append(ml.keys, lockKeys(ml.cfg.keyPrefix(), n))
	}
	ml.err = join(errs...)
	// Under WithReplicaAck members go one by one: each acquisition is acknowledged on its own.
	ml.together.Store(ml.err == nil && !ml.cfg.ack.on() && c.oneSlot(ml.keys))
	return ml
}

// Names returns the members' names, sorted.
func (ml *MultiLock) Names() []string { return slices.Clone(ml.names) }

// Owner returns the handle's owner id: the WithOwner id, or a random one made on first use
// (each lease then has an owner id of its own, shared by its member holds).
func (ml *MultiLock) Owner() string { return ml.ids.handle() }

// TryLock makes one pass over the members in name order and returns a lease on all of them, or
// gives back what it took and returns the first member's refusal (ErrNotObtained, naming the
// member, when another owner holds it). Other errors are those of Mutex.TryLock.
func (ml *MultiLock) TryLock(ctx context.Context) (*Lease, error) {
	return ml.lock(ctx, false)
}

// Lock takes every member, waiting as long as ctx allows (see MultiLock for how it waits).
// Errors are those of Mutex.Lock; a lease is returned only with every member held.
func (ml *MultiLock) Lock(ctx context.Context) (*Lease, error) {
	return ml.lock(ctx, true)
}

func (ml *MultiLock) lock(ctx context.Context, wait bool) (*Lease, error) {
	ref := lockRef{c: ml.c, name: strings.Join(ml.names, ",")} // no lock key: never re-entered
	bad := ml.err
	for i, k := range ml.keys {
		// A member the caller's context already holds would be waited for by the caller itself.
		if bad == nil && reentered(ctx, lockRef{ml.c, ml.names[i], k.lock}) != nil {
			bad = fmt.Errorf("%w: MultiLock member %q is held by a lease of the context", ErrInvalid, ml.names[i])
		}
	}
	return ml.c.lockWith(ctx, ref, accessMutex, wait, bad, func(ctx context.Context) (*Lease, error) {
		owner := ml.ids.call()
		specs := make([]holdSpec, len(ml.names))
		for i, n := range ml.names {
			specs[i] = holdSpec{name: n, keys: ml.keys[i], cfg: ml.cfg, owner: owner, reentrant: ml.cfg.ownerSet, handOn: true}
		}
		hs, err := ml.c.takeAll(ctx, specs, &ml.together, wait, ml.ids.call)
		if err != nil {
			return nil, err
		}
		hd := newHolding(hs[0], nil, 0, hs[1:]...)
		hd.multi = true
		return hd.first(ctx, ref), nil
	})
}

// takeAll takes a hold on every spec (sorted by name) or none; see MultiLock for the waiting.
// together says the members share a slot, so a pass may take them in one script (cleared when
// the server refuses that: a proxy that shards a single endpoint's keys). newOwner gives the
// call a fresh owner id once an attempt it gave up may still reach Redis (see errSlowMember).
func (c *Client) takeAll(ctx context.Context, specs []holdSpec, together *atomic.Bool, wait bool, newOwner func() string) ([]*hold, error) {
	taken := make([]*hold, len(specs))
	// renewOwner makes the call another owner, when nothing is held (a WithOwner id stays).
	renewOwner := func() {
		if !specs[0].reentrant {
			owner := newOwner()
			for k := range specs {
				specs[k].owner = owner
			}
		}
	}
	start := c.now()
	backoff := time.Duration(0)
	// patient: one polite wait is over (whatever the passes cost, a slow Redis too) and so is
	// multiPatience since the start, so the call may wait in name order now.
	waited := false
	patient := func() bool { return waited && c.since(start) >= multiPatience }
	for blocking, slow := -1, false; ; {
		if blocking >= 0 {
			if !slow && patient() {
				hs, err := c.takeInOrder(ctx, specs, taken)
				if err != nil || allValid(hs) {
					return hs, err
				}
				// A member taken early ended while a later one was awaited (a fixed lease ran
				// out, a renewal failed): start again.
				c.giveBack(hs)
				clear(taken)
				start, blocking, waited = c.now(), -1, false
				continue
			}
			// Wait in the taken member's queue (holding nothing): a release hands it to us and
			// wakes us.
			h, err := c.waitHold(ctx, specs[blocking], true)
			if err != nil {
				c.giveBack(taken) // nothing, unless a clock going back ended the patience early
				return nil, err
			}
			taken[blocking], waited = h, true
		}
		i, err := c.pass(ctx, specs, taken, together)
		blocking, slow = -1, false
		switch {
		case err == nil && allValid(taken):
			return taken, nil
		case err == nil:
			c.giveBack(taken) // a member ended during the pass: start again
			clear(taken)
			continue
		}
		if wait && ctx.Err() == nil && errors.Is(err, ErrNotObtained) && patient() {
			// Patience is over, and member i is taken: from here the call waits in name order.
			// The members it holds before the first it does not (p ≤ i: a refused script takes
			// none of the free members before i) are what such a waiter holds, so they are
			// kept, not queued for again from the back; every later one is given back (one
			// handed over from its queue may be after p: keeping it would hold a member after
			// one waited for, which can deadlock).
			p := slices.Index(taken, nil)
			c.giveBack(taken[p:])
			clear(taken[p:])
			blocking = p
			continue
		}
		c.giveBack(taken)
		clear(taken)
		if !wait || ctx.Err() != nil {
			return nil, err
		}
		switch {
		case errors.Is(err, errSlowMember):
			// Wait for that member alone (its node answers slowly, or not yet), holding
			// nothing meanwhile, however long the patience has run. The given-up attempt may
			// still reach Redis: from now on the call is another owner, so that attempt
			// meets a foreign hold (acquire would take a hold of its own owner without its
			// mark for a stale one of ours, and drop it) and its hold is given back.
			// A WithOwner id stays: its holds are counted, so that attempt is one more.
			renewOwner()
			backoff, blocking, slow = 0, i, true
		case errors.Is(err, ErrUnavailable):
			// Wait it out as Lock does (a failover): back off, then a new pass, under a fresh
			// owner if an attempt got no reply (it may still reach Redis; see above).
			if unknownOutcome(err) {
				renewOwner()
			}
			backoff = min(max(2*backoff, minUnavailableRetry), maxUnavailableRetry)
			if werr := sleepCtx(ctx, c, backoff); werr != nil {
				return nil, notObtained(specs[i].name, werr, err)
			}
		case errors.Is(err, ErrNotObtained):
			backoff, blocking = 0, i
		default:
			return nil, err
		}
	}
}

// pass tries once to take every member not taken yet: in one script when they share a slot
// and are all free, else one after the other in name order. It stops at the first member it
// cannot take and returns its index and error (what it took stays in taken for the caller to
// give back); -1 and nil when every member is taken.
func (c *Client) pass(ctx context.Context, specs []holdSpec, taken []*hold, together *atomic.Bool) (int, error) {
	untaken := 0
	for _, h := range taken {
		if h == nil {
			untaken++
		}
	}
	if untaken > 1 && together.Load() {
		if i, done, err := c.takeTogether(ctx, specs, taken, together); done {
			return i, err
		}
	}
	holding := untaken < len(specs)
	for i, s := range specs {
		if taken[i] != nil {
			continue
		}
		h, err := c.passStep(ctx, s, holding)
		if err != nil {
			return i, err
		}
		taken[i], holding = h, true
	}
	return -1, nil
}

// passStep makes a pass's attempt on member s. While the pass holds other members (holding)
// it waits for the attempt at most multiStepTimeout (see tryHoldWithin): past it, the error
// is ErrUnavailable with cause errSlowMember.
func (c *Client) passStep(ctx context.Context, s holdSpec, holding bool) (*hold, error) {
	if !holding {
		h, _, err := c.tryHold(ctx, s, false)
		return h, err
	}
	return c.tryHoldWithin(ctx, s, multiStepTimeout, errSlowMember)
}

// tryHoldWithin makes one attempt (tryHold, not queued) and waits for it at most d, whatever
// go-redis's own timeouts (it honours a context deadline only with ContextTimeoutEnabled):
// past d, the error is ErrUnavailable with cause slow, and the attempt, which goes on in the
// background, gives back a hold it gets (one whose reply is lost is undone as tryHold does).
func (c *Client) tryHoldWithin(ctx context.Context, s holdSpec, d time.Duration, slow error) (*hold, error) {
	if !c.goBackground() {
		return nil, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
	}
	type result struct {
		h   *hold
		err error
	}
	done := make(chan result, 1)
	var decided atomic.Bool // set by whichever comes first: the result, or the caller giving up
	sctx, cancel := context.WithTimeout(closeWaits(ctx), d)
	defer cancel() // once we have the result, or gave up on it
	go func() {
		defer c.wg.Done()
		h, _, err := c.tryHold(sctx, s, false)
		if decided.CompareAndSwap(false, true) {
			done <- result{h, err}
		} else if h != nil {
			c.giveBack([]*hold{h})
		}
	}()
	tooSlow := fmt.Errorf("%w: lock %q: %w within %v", ErrUnavailable, s.name, slow, d)
	t := time.NewTimer(d)
	defer t.Stop()
	var r result
	got := false
	select {
	case r = <-done:
		got = true
	case <-t.C:
	case <-ctx.Done():
	}
	if !got {
		if decided.CompareAndSwap(false, true) {
			if err := ctx.Err(); err != nil {
				return nil, notObtained(s.name, err)
			}
			return nil, tooSlow
		}
		r = <-done // the result came first after all
	}
	if r.err != nil && ctx.Err() == nil && (errors.Is(r.err, context.DeadlineExceeded) || cutByDeadline(sctx, r.err)) {
		// Cut short by the deadline d: go-redis with ContextTimeoutEnabled returns the ctx's
		// error or, its read deadline being d, an i/o timeout (which may come before sctx's
		// own timer has fired). Either way the attempt may still land, which the caller must
		// know (a fresh owner id for the next one).
		return nil, tooSlow
	}
	return r.h, r.err
}

// cutByDeadline reports whether err is a network timeout that came once ctx's deadline had
// passed: the deadline go-redis reads by with ContextTimeoutEnabled.
func cutByDeadline(ctx context.Context, err error) bool {
	var ne net.Error
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl) && errors.As(err, &ne) && ne.Timeout()
}

// takeTogether takes every member not taken yet in one script (multi_acquire.lua), when all of
// them are free and nobody queues for them. done false means a member needs more than that (a
// queue to respect, a lock of the caller's, an error to report): the caller goes member by
// member. Otherwise it returns as pass does. At least two members must be untaken.
func (c *Client) takeTogether(ctx context.Context, specs []holdSpec, taken []*hold, together *atomic.Bool) (i int, done bool, err error) {
	var idx []int
	var ks, ids []string
	for i, s := range specs {
		if taken[i] == nil {
			idx = append(idx, i)
			ks = append(ks, s.keys.lock, s.keys.fence, s.keys.queue, s.keys.opLog)
			ids = append(ids, c.nextHoldID())
		}
	}
	s0 := specs[idx[0]] // every member has the handle's owner and settings
	if err := ctx.Err(); err != nil {
		return idx[0], true, notObtained(s0.name, err)
	}
	if err := c.checkOpen(); err != nil {
		return idx[0], true, fmt.Errorf("%w: lock %q", err, s0.name)
	}
	ttl := s0.cfg.leaseTTL()
	args := []any{s0.owner, ttl.Milliseconds()}
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, opLogTTL.Milliseconds())
	sent := c.now()
	dropAll := func() {
		refs := make([]holdRef, len(idx))
		for j, i := range idx {
			refs[j] = specs[i].ref(ids[j])
		}
		c.abandon(ctx, refs...)
	}
	res, err := c.runScript(c.lockCall(ctx), scripts.MultiAcquire, ks, args...).Int64Slice()
	if err != nil && strings.HasPrefix(err.Error(), "CROSSSLOT") {
		// A proxy in front of a sharded deployment, behind a single endpoint: member by
		// member from now on, as on a Cluster.
		together.Store(false)
		return 0, false, nil
	}
	if err != nil {
		if classify(err) == replyUnavailable {
			c.topologyMayHaveChanged(ctx)
		}
		if !isRedisReply(err) && !(c.runner != nil && surelyUnsent(err)) { // it may have run with its reply lost: undo it
			dropAll()
		}
		if cerr := ctx.Err(); cerr != nil {
			return idx[0], true, notObtained(s0.name, cerr, redisErr("lock", s0.name, err))
		}
		if cerr := c.checkOpen(); cerr != nil && (classify(err) == replyUnavailable || refusedBeforeRunning(err)) { // see tryHold
			return idx[0], true, fmt.Errorf("%w: %w", cerr, redisErr("lock", s0.name, err))
		}
		return idx[0], true, redisErr("lock", s0.name, err)
	}
	switch {
	case len(res) == 1 && res[0] == -1:
		return 0, false, nil
	case len(res) == 1 && res[0] == -2: // a resend found part of what the lost reply took
		dropAll()
		return 0, false, nil
	case len(res) == 3 && res[0] == 0 && res[1] >= 1 && int(res[1]) <= len(idx):
		i := idx[res[1]-1]
		return i, true, notObtained(specs[i].name)
	case len(res) != len(idx)+1 || res[0] != 1:
		return idx[0], true, fmt.Errorf("dlock: MultiLock %q: unexpected multi-acquire reply %v", s0.name, res)
	}
	for j, i := range idx {
		h, _, err := c.startHold(ctx, specs[i], ids[j], uint64(res[j+1]), false, ttl, 0, sent)
		if err != nil {
			// The later members were taken in Redis but never started here: given back
			// together (abandon), member i having been given back by startHold.
			var later []holdRef
			for k := j + 1; k < len(idx); k++ {
				later = append(later, specs[idx[k]].ref(ids[k]))
			}
			if len(later) > 0 {
				c.abandon(ctx, later...)
			}
			return i, true, err
		}
		taken[i] = h
	}
	return -1, true, nil
}

// allValid reports whether every hold is still certainly held.
func allValid(hs []*hold) bool {
	for _, h := range hs {
		if !h.valid() {
			return false
		}
	}
	return true
}

// sleepCtx waits d, or until ctx ends or the Client closes (its error then).
func sleepCtx(ctx context.Context, c *Client, d time.Duration) error {
	return sleepUntil(ctx, c.bg.Done(), d)
}

// sleepUntil waits d, or until ctx ends (its error) or closed is closed (ErrClosed; a nil
// closed never is).
func sleepUntil(ctx context.Context, closed <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	case <-t.C:
		return nil
	}
}

// takeInOrder takes the members not in taken yet (those it has are before the first it has
// not: see takeAll) one after the other in name order, waiting in each one's queue and
// keeping those it has: the same order for every MultiLock, so none waits for another in a
// cycle. On an error it gives back every member it has, those in taken too.
func (c *Client) takeInOrder(ctx context.Context, specs []holdSpec, taken []*hold) ([]*hold, error) {
	for k, s := range specs {
		if taken[k] != nil {
			continue
		}
		h, err := c.waitHold(ctx, s, true)
		if err != nil {
			c.giveBack(taken)
			clear(taken)
			return nil, err
		}
		taken[k] = h
	}
	return taken, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

type holdState int

const (
	holdHeld holdState = iota
	holdReleasing
	holdEnded
)

// A hold is one Redis-level hold of a lock by one owner id: the thing the renewer renews, the
// notifier watches and the safe deadline guards. A plain Lease has a hold of its own; with
// cohorting, the Client's hold on a lock serves a run of local Leases one after the other.
type hold struct {
	c      *Client
	name   string
	keys   keys
	cfg    config
	owner  string
	holdID string
	access access // a mutex's hold, a read-write lock's read or write hold, or a semaphore's
	sem    semSpec
	// othersWait: a read hold taken while someone waited in the lock's queue (a writer, since
	// readers first in line are admitted together), so no more local readers may share it
	othersWait bool
	// handOn: its releases, clean-ups included, grant the lock to the first waiter at once,
	// however briefly that has waited, instead of freeing it within the barging window for
	// the waiter to take with an attempt of its own if no caller outside the queue takes it
	// first. A MultiLock's members: a waiting MultiLock holds nothing and needs the member
	// handed to it, and freed members cost it a wake-up, an attempt and often the member
	// (see MultiLock).
	handOn bool
	token  uint64 // first token of the block reserved by this hold
	notif  *notifier
	// tracked is closed once a tracked read confirmed the hold, so a later change of the key
	// is pushed (tests wait on it before tampering with the key).
	tracked     chan struct{}
	trackedOnce sync.Once
	mu          sync.Mutex
	onEnd       func(err error) // see setOnEnd
	state       holdState
	err         error
	ttl         time.Duration
	// grantTTL, for a hold a release granted (startGranted), is the TTL the grant gave it;
	// its first renewal is due within it and counts at once, then it is 0 (renewer.requeue)
	grantTTL     time.Duration
	deadline     time.Time   // monotonic: when the hold counts as lost without a renewal
	pending      time.Time   // the latest renewal's deadline, trusted once the next renewal succeeds
	deadlineFrom time.Time   // send time of the latest acquire/renewal/extend
	timer        *time.Timer // fires at armAt, then at deadline: one timer per hold
	armAt        time.Time   // when to arm push loss detection (zero: done or not watched)
	heapIdx      int         // position in the renewer's heap, -1 when not scheduled (renewer.mu)
	renewAt      time.Time   // next renewal (renewer.mu)
}

// liveTTL is the TTL the hold's safe deadline counts with now: the grant's (grantTTL) until a
// granted hold's first renewal, else its own.
func (h *hold) liveTTL() time.Duration {
	if h.grantTTL > 0 {
		return min(h.grantTTL, h.ttl)
	}
	return h.ttl
}

// wasGranted reports whether a release handed the hold over (startGranted) and it has not
// been renewed yet: it was waited for.
func (h *hold) wasGranted() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.grantTTL > 0
}

// setOnEnd installs f, called once and outside any lock when the hold ends other than by a
// release its user asked for (err then wraps ErrLeaseLost, or is ErrClosed). If the hold has
// already ended, f is not installed and setOnEnd reports the end instead.
func (h *hold) setOnEnd(f func(err error)) (ended bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == holdEnded {
		return true, h.err
	}
	h.onEnd = f
	return false, nil
}

// valid reports whether the hold is held and its safe deadline has not passed: whether it may
// be handed to a holder. The deadline timer ends a hold soon after the deadline, but not in the
// same instant, and a reply that arrived after the deadline must not start a lease.
func (h *hold) valid() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == holdHeld && (h.deadline.IsZero() || h.c.until(h.deadline) > 0)
}

// remaining returns how long the hold is certainly still held: 0 once ended or past its
// safe deadline.
func (h *hold) remaining() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != holdHeld || h.deadline.IsZero() {
		return 0
	}
	return max(h.c.until(h.deadline), 0)
}

func (h *hold) isHeld() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == holdHeld
}

// extend sets the lock's TTL to ttl if the owner still holds it. A refusal ends the hold as
// lost and returns the loss.
func (h *hold) extend(ctx context.Context, ttl time.Duration) error {
	sent := h.c.now()
	var n int
	var err error
	var unacked error
	if a := h.cfg.ack; a.on() {
		var r ackedCall
		if r, err = h.c.runAcked(ctx, a, scripts.Extend, []string{h.keys.lock}, h.holdID, ttl.Milliseconds()); err != nil {
			if errors.Is(err, ErrInvalid) {
				return fmt.Errorf("extend %q: %w", h.name, err)
			}
			return redisErr("extend", h.name, err)
		}
		n, err = r.cmd.Int()
		if err == nil && n != 0 && r.short(a) {
			unacked = h.c.notReplicated(ctx, h.name, h.keys.lock, a, r)
		}
	} else {
		n, err = h.c.runScript(ctx, scripts.Extend, []string{h.keys.lock}, h.holdID, ttl.Milliseconds()).Int()
	}
	if err != nil {
		return redisErr("extend", h.name, err)
	}
	if unacked != nil {
		// Extended in Redis but not acknowledged: the lease keeps the deadline it had.
		return unacked
	}
	if n == 0 {
		h.lose(errRenewRefused)
		return h.lossErr()
	}
	h.mu.Lock()
	if h.state == holdHeld {
		h.ttl, h.grantTTL = ttl, 0
		h.setDeadlineLocked(sent, ttl, false)
	}
	h.mu.Unlock()
	h.c.renew.reschedule(h, sent)
	return nil
}

// lossErr returns why the hold ended, or a generic loss if it has not (yet) recorded one.
func (h *hold) lossErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return h.err
	}
	if h.c.checkOpen() != nil {
		return fmt.Errorf("%w: lock %q", ErrClosed, h.name) // Close is releasing it
	}
	return leaseLost(h.name, errRenewRefused)
}

// beginRelease moves a held hold to releasing, so neither the renewer nor a pushed loss acts
// on it while the release script runs. It reports false if the hold had already ended.
func (h *hold) beginRelease() bool {
	h.mu.Lock()
	ok := h.state == holdHeld
	if ok {
		h.state = holdReleasing
	}
	h.mu.Unlock()
	if ok {
		h.c.renew.remove(h)
	}
	return ok
}

// release runs the release script: 3 handed to a waiter, 2 freed, 1 one hold dropped (or an
// earlier attempt already applied), 0 not held.
func (h *hold) release(ctx context.Context) (int, error) {
	return runRelease(ctx, h.c, h.ref(), releaseNormal)
}

// releaseLater retries the release of h, whose release got no answer, in the background
// until Redis answers or the lock's TTL has surely run out, so a failed Unlock does not keep
// others out for the TTL (the lock may be renewed no more: h has ended). Close bounds it.
func (h *hold) releaseLater() {
	h.mu.Lock()
	from := h.deadlineFrom
	until := from.Add(h.ttl + time.Duration(float64(h.ttl)*h.cfg.driftFactor()))
	h.mu.Unlock()
	if from.IsZero() || !h.c.goBackground() {
		return
	}
	go func() {
		defer h.c.wg.Done()
		t := time.NewTimer(0)
		defer t.Stop()
		for backoff := 20 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
			wait := min(backoff, h.c.until(until))
			if wait <= 0 {
				return
			}
			t.Reset(wait)
			select {
			case <-h.c.cleanup.Done():
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(h.c.cleanup, time.Second)
			_, err := h.release(ctx)
			cancel()
			if err == nil || classify(err) != replyUnavailable {
				return
			}
		}
	}()
}

type releaseMode int

const (
	releaseNormal       releaseMode = iota
	releaseIfAcquired               // clean-up after an acquire whose reply was lost
	releaseLeavingQueue             // a waiter giving up, possibly granted meanwhile
)

// A holdRef is what the release script is told of a hold: its lock, owner and id, how it holds
// the lock, and whether its release hands the lock on at once (hold.handOn).
type holdRef struct {
	keys   keys
	owner  string
	holdID string
	access access
	sem    semSpec
	handOn bool
}

func (h *hold) ref() holdRef {
	return holdRef{h.keys, h.owner, h.holdID, h.access, h.sem, h.handOn}
}

// ref is the hold holdID of s: one its call took, or may have taken.
func (s holdSpec) ref(holdID string) holdRef {
	return holdRef{s.keys, s.owner, holdID, s.access, s.sem, s.handOn}
}

// runRelease runs the release script for the hold h in mode; undo, for a waiter leaving the
// queue, names its wait's earlier hold ids whose holds go too (holdSpec.undo).
func runRelease(ctx context.Context, c *Client, h holdRef, mode releaseMode, undo ...string) (int, error) {
	keys, args := releaseCall(c, h, mode, undo)
	return c.runScript(ctx, scripts.Release, keys, args...).Int()
}

// runReleaseOn is runRelease sent through rdb: a node's own client where the Client's would
// route it (a Cluster's) through calls of its own that may hang on another node.
func runReleaseOn(ctx context.Context, rdb redis.Scripter, c *Client, h holdRef, mode releaseMode, undo ...string) (int, error) {
	keys, args := releaseCall(c, h, mode, undo)
	return scripts.Release.Run(ctx, rdb, keys, args...).Int()
}

// releaseCall is the release script's keys and arguments (release.lua).
func releaseCall(c *Client, h holdRef, mode releaseMode, undo []string) ([]string, []any) {
	barge := bargeWindow
	if h.handOn {
		barge = 0
	}
	k := h.keys
	return []string{k.lock, k.opLog, k.fence, k.queue, k.live},
		[]any{h.owner, h.holdID, opLogTTL.Milliseconds(), k.channel, mode == releaseIfAcquired,
			grantGrace.Milliseconds(), c.publishCmd, mode == releaseLeavingQueue,
			barge.Milliseconds(), string(h.access), strings.Join(undo, " "), h.sem.permits, h.sem.n}
}

// access is how a hold holds its lock: a mutex's (""), a read-write lock's shared ("r")
// or exclusive ("w") hold, or a semaphore's permits ("s", with a semSpec). The scripts take
// it as is.
type access string

const (
	accessMutex   access = ""
	accessRead    access = "r"
	accessWrite   access = "w"
	accessPermits access = "s"
)

// A semSpec is what a semaphore's hold (accessPermits) takes: n of its permits.
type semSpec struct {
	permits int // the semaphore's number of permits
	n       int // how many this hold takes
}

// reentry says why a hold with access held cannot be re-entered with access want, or "".
func (held access) reentry(want access) string {
	switch {
	case held == accessPermits || want == accessPermits:
		if held == want {
			return "" // not reached: a semaphore's holds are never re-entered (no lock key in its ref)
		}
		if held == accessPermits {
			return "the context holds it as a semaphore, not a lock"
		}
		return "the context holds it as a lock, not a semaphore"
	case (held == accessMutex) != (want == accessMutex):
		if held == accessMutex {
			return "the context holds it as a mutex, not a read-write lock"
		}
		return "the context holds it as a read-write lock, not a mutex"
	case held == accessRead && want == accessWrite:
		return "the context holds it to read; a read lease cannot be upgraded to a write lease (two upgraders would wait for each other forever): unlock it first"
	}
	return ""
}

func leaseLost(name string, cause error) error {
	return fmt.Errorf("%w: %q: %w", ErrLeaseLost, name, cause)
}

// lose ends a held hold as lost, and reports whether it did. It is a no-op once a release has
// started (the release script's answer decides then) or the hold has ended.
func (h *hold) lose(cause error) bool {
	return h.isHeld() && h.end(leaseLost(h.name, cause), true)
}

// end ends the hold once: records err, stops the deadline timer, renewal and watching, and
// calls onEnd when notify is set. It reports whether this call ended it.
func (h *hold) end(err error, notify bool) bool {
	h.mu.Lock()
	if h.state == holdEnded {
		h.mu.Unlock()
		return false
	}
	h.state = holdEnded
	h.err = err
	if h.timer != nil {
		h.timer.Stop()
	}
	n, onEnd := h.notif, h.onEnd
	h.mu.Unlock()
	// After the state change, so a renewal in flight cannot queue the hold again.
	h.c.renew.remove(h)
	if n != nil {
		n.unwatch(h.keys.lock, h)
	}
	h.c.forget(h)
	if notify && onEnd != nil {
		onEnd(err)
	}
	return true
}

// setDeadlineLocked moves the safe deadline after an acquire, renewal or extend that was sent
// at sent with ttl: to sent + ttl × (1 − drift), measured on the monotonic clock from the send.
// Redis started that TTL no earlier than that (and never shortens a held lock's TTL), so the
// hold ends locally before it can expire there.
//
// A watchdog renewal (renewal set) moves the deadline only to the previous renewal's: a master
// that acknowledged the latest one may die, or turn out to have been demoted (a paused master
// coming back), before its replica got it, and the promoted replica then expires the key by
// the previous renewal's TTL. Renewals run at TTL/4, so this costs a lease nothing while they
// succeed. Acquires and explicit Extends count at once (see Lease.Extend).
//
// Replies may arrive out of order (an Extend overtaken by a renewal sent after it): every
// command sets the TTL with GT, so each one that succeeded is a lower bound on the key's expiry,
// and the deadline is the greatest bound that counts.
func (h *hold) setDeadlineLocked(sent time.Time, ttl time.Duration, renewal bool) {
	if sent.After(h.deadlineFrom) {
		h.deadlineFrom = sent
	}
	next := sent.Add(h.cfg.safeLease(ttl))
	if renewal {
		if h.pending.After(h.deadline) {
			h.deadline = h.pending
		}
		if next.After(h.pending) {
			h.pending = next
		}
	} else {
		if next.After(h.deadline) {
			h.deadline = next
		}
		if next.After(h.pending) {
			h.pending = next
		}
	}
	h.resetTimerLocked()
}

// resetTimerLocked sets the hold's one timer to its next event: arming loss detection, or the
// safe deadline.
func (h *hold) resetTimerLocked() {
	next := h.deadline
	if !h.armAt.IsZero() && h.armAt.Before(next) {
		next = h.armAt
	}
	d := h.c.until(next)
	if h.timer == nil {
		h.timer = time.AfterFunc(d, h.timerFired)
	} else {
		h.timer.Reset(d)
	}
}

func (h *hold) timerFired() {
	h.mu.Lock()
	now := h.c.now()
	arm := !h.armAt.IsZero() && !now.Before(h.armAt)
	if arm {
		h.armAt = time.Time{}
	}
	late := !now.Before(h.deadline) // else a renewal moved the deadline and reset the timer
	if h.state == holdHeld && !late {
		h.resetTimerLocked()
	}
	n := h.notif
	h.mu.Unlock()
	if arm && n != nil {
		n.arm(h.keys.lock, h)
	}
	if !late {
		return
	}
	if h.cfg.fixedLease {
		h.lose(errFixedLeaseOver)
		return
	}
	h.lose(errDeadline)
}

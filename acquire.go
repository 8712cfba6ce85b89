package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// pollWithoutPush bounds a waiter's sleep when no notification can reach it (the notification
// connection is down, or the client type has none).
const pollWithoutPush = 50 * time.Millisecond

// lateRetry is how long an acquire whose reply came after the lease's safe deadline waits
// before trying again, so a network that stays that slow is not hammered.
const lateRetry = 10 * time.Millisecond

// leaveTimeout bounds how long a waiter that gives up spends leaving the Redis queue.
const leaveTimeout = time.Second

// holdSpec says which hold to take: lock, owner and configuration.
type holdSpec struct {
	name      string
	keys      keys
	cfg       config
	owner     string
	reentrant bool // false for a cohort: its own hold found in Redis is stale and re-taken
	noBarge   bool // a cohort's acquirer: never take a free lock ahead of waiting processes
}

// tryHold runs the acquire script once. With queue set, a caller that does not get the lock
// joins (or stays in, refreshing its liveness) the lock's FIFO. When the lock is not obtained
// it returns ErrNotObtained and how long to wait before trying again.
func (c *Client) tryHold(ctx context.Context, s holdSpec, queue bool) (*hold, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, s.name), err)
	}
	if err := c.checkOpen(); err != nil {
		return nil, 0, fmt.Errorf("%w: lock %q", err, s.name)
	}
	ttl := s.cfg.leaseTTL()
	barge := bargeWindow
	if s.noBarge {
		barge = 0
	}
	holdID := c.nextHoldID()
	k := s.keys
	sent := c.now()
	res, err := scripts.Acquire.Run(ctx, c.rdb, []string{k.lock, k.fence, k.opLog, k.queue, k.live},
		s.owner, ttl.Milliseconds(), holdID, opLogTTL.Milliseconds(), queue,
		livenessWindow.Milliseconds(), k.channel, grantGrace.Milliseconds(), c.publishCmd,
		s.reentrant, queueTTL.Milliseconds(), barge.Milliseconds()).Int64Slice()
	if err != nil {
		if !isRedisReply(err) {
			// The script may have run with its reply lost: undo it in the background so the
			// lock is not left held (it would otherwise expire only after its TTL).
			c.abandon(s, holdID)
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, 0, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, s.name), cerr)
		}
		return nil, 0, fmt.Errorf("dlock: lock %q: %w", s.name, err)
	}
	if len(res) < 2 {
		return nil, 0, fmt.Errorf("dlock: lock %q: unexpected acquire reply %v", s.name, res)
	}
	if res[0] == 0 {
		wait := time.Duration(res[1]) * time.Millisecond
		if res[1] < 0 {
			wait = time.Second // a key without TTL (set by hand): re-check now and then
		}
		return nil, max(wait, time.Millisecond), fmt.Errorf("%w: %q", ErrNotObtained, s.name)
	}
	// A reply that came after the lease's safe deadline (a slow network) must not start a
	// lease that is already over: drop the hold in Redis and let the caller try again a
	// little later. Decided before the hold is tracked, so no deadline timer races with it.
	late := func(why error) (*hold, time.Duration, error) {
		c.abandon(s, holdID)
		return nil, lateRetry, fmt.Errorf("%w: %q: %w", ErrNotObtained, s.name, why)
	}
	if c.since(sent) >= s.cfg.safeLease(ttl) {
		return late(errLateReply)
	}
	h := &hold{
		c: c, name: s.name, keys: k, cfg: s.cfg, owner: s.owner, holdID: holdID,
		token: uint64(res[1]), tracked: make(chan struct{}), ttl: ttl, heapIdx: -1,
	}
	if err := c.track(ctx, h, sent); err != nil {
		// The Client closed while the script ran: give the hold back.
		_, _ = h.release(context.WithoutCancel(ctx))
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

// waitHold takes a hold, waiting in the lock's FIFO until a release grants it or ctx ends.
// It subscribes to the lock's channel before an attempt that may leave it waiting, so a grant
// cannot be missed, and re-tries at the holder's remaining TTL or the liveness refresh,
// whichever comes first (the retry also refreshes its place in the queue). It does not poll
// otherwise. With contended set (the caller knows the lock is taken) or when the channel is
// already subscribed, it subscribes before its first attempt, saving one; otherwise the first
// attempt goes without, so an uncontended lock costs no subscription.
func (c *Client) waitHold(ctx context.Context, s holdSpec, contended bool) (*hold, error) {
	n := c.notifierFor(ctx, s.keys.lock)
	var sub *subscription
	if n != nil && (contended || n.subscribed(s.keys.channel)) {
		sub = n.subscribe(ctx, s.keys.channel, s.owner)
		defer sub.close()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		h, wait, err := c.tryHoldShallow(ctx, s)
		if h != nil || !errors.Is(err, ErrNotObtained) {
			if err != nil && (ctx.Err() != nil || c.checkOpen() != nil) {
				c.leaveQueue(s)
			}
			return h, err
		}
		if sub == nil && n != nil {
			// Subscribe, then attempt again at once: a grant between the attempt and the
			// subscription would otherwise go unnoticed until the next retry.
			sub = n.subscribe(ctx, s.keys.channel, s.owner)
			defer sub.close()
			continue
		}
		var wake <-chan struct{}
		wait = min(wait, livenessRefresh)
		if sub != nil {
			wake = sub.c
		}
		if sub == nil || !sub.confirmed {
			wait = min(wait, pollWithoutPush)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			c.leaveQueue(s)
			return nil, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, s.name), ctx.Err())
		case <-c.bg.Done():
			c.leaveQueue(s)
			return nil, fmt.Errorf("%w: lock %q", ErrClosed, s.name)
		case <-wake:
		case <-timer.C:
		}
	}
}

// tryHoldShallow runs a queued attempt on a short-lived goroutine. A waiter's own goroutine
// then never grows the deep stack of a Redis call, which it would keep while it waits: with
// thousands of waiters that is most of their memory.
func (c *Client) tryHoldShallow(ctx context.Context, s holdSpec) (*hold, time.Duration, error) {
	type result struct {
		h    *hold
		wait time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		h, wait, err := c.tryHold(ctx, s, true)
		done <- result{h, wait, err}
	}()
	r := <-done
	return r.h, r.wait, r.err
}

// leaveQueue takes a waiter that gave up out of the lock's queue; if a release granted it the
// lock meanwhile, the lock goes on to the next waiter.
func (c *Client) leaveQueue(s holdSpec) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	_, _ = runRelease(ctx, c, s.keys, s.owner, "", releaseLeavingQueue)
}

// abandon undoes, in the background, an acquire whose reply was lost, if Redis applied it.
func (c *Client) abandon(s holdSpec, holdID string) {
	if !c.goBackground() {
		return // closing: the hold, if any, expires within its TTL
	}
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
		defer cancel()
		_, _ = runRelease(ctx, c, s.keys, s.owner, holdID, releaseIfAcquired)
	}()
}

// isRedisReply tells an error Redis answered (the script did not change anything) from a
// transport failure or timeout, after which the script may or may not have run.
func isRedisReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, context.DeadlineExceeded)
}

package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// DefaultLatchTTL is how long a latch lives after its last TrySetCount or CountDown when
// WithTTL is not given: an abandoned latch (its counters died) disappears then.
const DefaultLatchTTL = 24 * time.Hour

// latchRecheck is how often a waiting Wait reads the count although no push came: the push
// may be lost (a dropped connection, a user that may not subscribe), and the latch may expire.
var latchRecheck = time.Second

// A Latch is a handle on one named count-down latch, Redisson's RCountDownLatch: TrySetCount
// starts it at a count, each CountDown takes one off, and Wait returns once the count has
// reached zero. It is cheap to create, holds no Redis state and is safe for concurrent use.
//
// In Redis a latch is one hash at its name's lock key, with a TTL (WithTTL, default
// DefaultLatchTTL) renewed by TrySetCount and every CountDown: an abandoned latch disappears
// on its own. Each call is applied once even when it is sent again (by go-redis, or by the
// call itself while Redis gives no answer): the name's op log remembers the calls applied for
// a minute. At zero it is deleted and its waiters are told by push (one message per
// Client, which wakes all of the Client's waiters). A latch with no state in Redis (never
// set, already at zero, expired) is open: Wait returns at once and CountDown does nothing,
// as Redisson's do. So a Wait that starts only after the count reached zero returns at once,
// and a latch can be set again once it has opened.
//
// A name is a latch or a lock (Mutex, RWMutex, Semaphore), not both: a call of one kind on
// a name used as the other returns ErrInvalid.
type Latch struct {
	c    *Client
	name string
	keys keys
	ttl  time.Duration
	err  error // invalid name or option, reported by every call
}

// Latch returns a handle on the count-down latch called name. Of the options only WithTTL
// (how long an abandoned latch lives; only as given here: a Client's WithTTL is its leases'
// TTL) and WithKeyPrefix apply. An invalid name or option is
// reported by the handle's calls as ErrInvalid; Latch itself never fails.
func (c *Client) Latch(name string, opts ...Option) *Latch {
	cfg := c.cfg.apply(opts)
	d := &Latch{c: c, name: name, keys: lockKeys(cfg.keyPrefix(), name), ttl: DefaultLatchTTL}
	if own := (config{}).apply(opts); own.ttlSet {
		d.ttl = own.ttl // the Client's WithTTL is its leases' TTL, not a latch's lifetime
	}
	d.err = join(c.unsupported("Latch"), c.err, validateName(name), cfg.validate())
	return d
}

// Name returns the latch's name.
func (d *Latch) Name() string { return d.name }

// TrySetCount starts the latch at count (at least 1) and reports true, or reports false and
// changes nothing when the latch is counting already. It returns ErrInvalid for a count below
// 1 or a name used as a lock (held, or waited for). While Redis gives no definite answer (a lost reply, a failover)
// it sends the call again, with backoff, applied once however many sends reach Redis (see
// Latch); an error matching ErrUnavailable means it gave up (ctx ended, the Client closed, or
// half the op log's minute passed) and the latch may have been set, unless the error says "not
// applied" (Redis refused every send before running it).
func (d *Latch) TrySetCount(ctx context.Context, count int) (bool, error) {
	if ctx == nil {
		return false, nilContext("set latch", d.name)
	}
	if d.err != nil {
		return false, d.err
	}
	if count < 1 {
		return false, fmt.Errorf("%w: latch %q: count %d: must be at least 1", ErrInvalid, d.name, count)
	}
	set, err := d.run(ctx, "set latch", scripts.LatchSet, count, d.ttl.Milliseconds(), d.c.nextHoldID(), opLogTTL.Milliseconds())
	if err != nil {
		return false, err
	}
	n, err := set.Int()
	if err != nil {
		return false, fmt.Errorf("dlock: set latch %q: unexpected reply: %w", d.name, err)
	}
	return n == 1, nil
}

// CountDown takes one off the latch's count; at zero the latch opens: it is deleted and its
// waiters are woken. On an open latch (no state in Redis) it does nothing: a count never goes
// below zero. It returns ErrInvalid for a name used as a lock. While Redis gives no definite
// answer (a lost reply, a failover) it sends the same call again, with backoff, counted once
// however many sends reach Redis; an error matching ErrUnavailable means it gave up (ctx
// ended, the Client closed, or half the op log's minute passed) and the count may have gone
// down: calling CountDown again then may count twice. When Redis refused every send before
// running it (LOADING, MISCONF, ...), the error says "not applied" and nothing was counted.
func (d *Latch) CountDown(ctx context.Context) error {
	if ctx == nil {
		return nilContext("count down latch", d.name)
	}
	if d.err != nil {
		return d.err
	}
	_, err := d.run(ctx, "count down latch", scripts.LatchDown, d.ttl.Milliseconds(), d.keys.channel, d.c.publishCmd,
		d.c.nextHoldID(), opLogTTL.Milliseconds())
	return err
}

// run sends a latch call (script over the latch and its op log, with args carrying the call's
// id) until Redis answers it: a send whose reply was lost may have run, and the op log makes a
// resend of the same id apply nothing more, for opLogTTL; the resends stop at half that. The
// error is the answer's (redisErr), or, after giving up, ErrUnavailable saying the call may
// have been applied.
func (d *Latch) run(ctx context.Context, op string, script *redis.Script, args ...any) (*redis.Cmd, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dlock: %s %q: %w", op, d.name, err) // nothing sent
	}
	keys := []string{d.keys.lock, d.keys.opLog, d.keys.queue, d.keys.live}
	giveUp := time.Now().Add(opLogTTL / 2)
	var backoff time.Duration
	unknown := false // a send got no reply: it may have been applied
	gaveUp := func(err error) error {
		if unknown {
			return d.mayHaveRun(op, err)
		}
		// Every send was refused by Redis before it ran (LOADING, MISCONF, a node that is not
		// the master): nothing was applied, which the caller may count on.
		return fmt.Errorf("dlock: %s %q: %w: not applied, Redis refused every send: %w", op, d.name, ErrUnavailable, err)
	}
	for {
		cmd := d.c.runScript(ctx, script, keys, args...)
		err := cmd.Err()
		switch {
		case err == nil:
			return cmd, nil
		case isRedisReply(err) && classify(err) != replyUnavailable, classify(err) == replyClosed:
			return nil, redisErr(op, d.name, err) // an answer; or go-redis closed: nothing sends
		}
		unknown = unknown || !isRedisReply(err)
		d.c.topologyMayHaveChanged(ctx)
		backoff = min(max(2*backoff, minUnavailableRetry), maxUnavailableRetry)
		wait := backoff/2 + rand.N(backoff/2+1)
		if time.Now().Add(wait).After(giveUp) {
			return nil, gaveUp(err)
		}
		if werr := sleepCtx(ctx, d.c, wait); werr != nil {
			return nil, gaveUp(join(werr, err))
		}
	}
}

// mayHaveRun is the error of a latch call given up on without a definite answer.
func (d *Latch) mayHaveRun(op string, err error) error {
	return fmt.Errorf("dlock: %s %q: %w: no definite answer from Redis, so it may have been applied: %w", op, d.name, ErrUnavailable, err)
}

// Count returns the latch's count: 0 when it is open (no state in Redis). It returns
// ErrInvalid for a name used as a lock, ErrIncompatible for a latch of another dlock version,
// and the Redis error (matching ErrUnavailable when Redis gave no answer) if the read fails.
func (d *Latch) Count(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, nilContext("read latch", d.name)
	}
	if d.err != nil {
		return 0, d.err
	}
	n, _, err := d.count(ctx)
	return n, err
}

// count reads the latch's count and its generation (the id of the TrySetCount call that set
// it; "" when open).
func (d *Latch) count(ctx context.Context) (int, string, error) {
	// One read: a latch set or opened meanwhile is seen whole, never half.
	f, exists, err := d.c.stateOf(ctx, "read latch", d.name, d.keys.lock, "latch", "#n", "#g")
	switch {
	case err != nil:
		return 0, "", err
	case !exists:
		return 0, "", nil // no state: open
	}
	n, err := strconv.Atoi(str(f[2]))
	if err != nil {
		return 0, "", fmt.Errorf("dlock: latch %q: count %q: %w", d.name, str(f[2]), err)
	}
	return max(n, 0), str(f[3]), nil
}

// Wait returns nil once the latch is open: at once when it has no state in Redis (never set,
// already at zero, expired), otherwise when the last CountDown opens it, which wakes it by
// push (within about a millisecond), or at the latest at its next check of the count (every
// second; every 50ms on a Redis that refuses the Client's subscriptions). When ctx ends first
// it returns an error matching ErrNotObtained and ctx.Err(). While Redis is unavailable it
// keeps trying, with backoff, as Mutex.Lock does. It returns ErrInvalid for a name used as a
// lock, ErrClosed after Client.Close.
func (d *Latch) Wait(ctx context.Context) error {
	if ctx == nil {
		return nilContext("wait for latch", d.name)
	}
	if d.err != nil {
		return d.err
	}
	if err := d.c.checkOpen(); err != nil {
		return fmt.Errorf("%w: latch %q", err, d.name)
	}
	// listen subscribes to the latch's channel on the notifier of the node that has it now
	// (again after a failover or migration moved it, or its subscription was dropped), before
	// the count is read: an opening after the read is pushed.
	var n *notifier
	var sub *subscription
	defer func() {
		if sub != nil {
			sub.close()
		}
	}()
	// seen holds the generations of the counts this Wait read above zero: an opening pushed
	// for any of them (a count that reached zero during the Wait) ends it, even when the
	// latch was set anew before the Wait looked; one of another generation, pushed late from
	// before the Wait, does not.
	seen := map[string]bool{}
	opened := false
	listen := func() {
		nn := d.c.notifierFor(ctx, d.keys.lock)
		if nn == n && sub != nil && sub.live() {
			return
		}
		if sub != nil {
			opened = opened || sub.openedAny(seen)
			sub.close()
			sub = nil
		}
		if n = nn; n != nil {
			sub = n.subscribe(ctx, d.keys.channel, "")
		}
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var failing error
	backoff := time.Duration(0)
	for {
		listen()
		if opened || sub != nil && sub.openedAny(seen) {
			return nil
		}
		count, gen, err := d.count(ctx)
		switch {
		case err == nil && count == 0:
			return nil
		case err == nil:
			seen[gen] = true
			failing, backoff = nil, 0
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
			failing = err
			d.c.topologyMayHaveChanged(ctx)
		default:
			if ctx.Err() != nil {
				return notObtained(d.name, ctx.Err(), failing)
			}
			return err
		}
		wait := latchRecheck
		if sub == nil || !n.subscribed(d.keys.channel) {
			wait = pollWithoutPush
		}
		if failing != nil {
			backoff = min(max(2*backoff, minUnavailableRetry), maxUnavailableRetry)
			wait = backoff
		}
		var wake <-chan struct{}
		if sub != nil {
			wake = sub.c
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return notObtained(d.name, ctx.Err(), failing)
		case <-d.c.bg.Done():
			return fmt.Errorf("%w: latch %q", ErrClosed, d.name)
		case <-wake: // an opening of a count it read ends the Wait at the top of the loop
		case <-timer.C:
		}
	}
}

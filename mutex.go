package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// pollWithoutPush bounds a waiter's sleep when no release notification can reach it (the
// notification connection is down, or the client type has none).
const pollWithoutPush = 50 * time.Millisecond

// A Mutex is a handle on one named lock. It is cheap to create and holds no Redis state; the
// handle is the owner: all leases taken through it share its owner id (random unless
// WithOwner was given), so they re-enter each other. A Mutex is safe for concurrent use, but
// goroutines that must exclude each other need separate handles (or separate owner ids).
type Mutex struct {
	c     *Client
	name  string
	keys  keys
	cfg   config
	owner string
	err   error // invalid name or option, reported by Lock and TryLock
}

// Mutex returns a handle on the lock called name. Options override the Client's. An invalid
// name or option is reported by Lock and TryLock as ErrInvalid; Mutex itself never fails.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{c: c, name: name, cfg: c.cfg.apply(opts)}
	m.err = errors.Join(c.err, validateName(name), m.cfg.validate())
	m.keys = lockKeys(m.cfg.keyPrefix(), name)
	m.owner = m.cfg.owner
	if !m.cfg.ownerSet {
		m.owner = newOwnerID()
	}
	return m
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Owner returns the owner id of this handle.
func (m *Mutex) Owner() string { return m.owner }

// TryLock makes one attempt to take the lock. It returns a held Lease, or an error matching
// ErrNotObtained when another owner holds the lock, ErrInvalid for a bad name or option,
// ErrClosed after Client.Close, or the Redis error that stopped the attempt. If this handle's
// owner already holds the lock, TryLock re-enters it at once (hold count + 1).
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	l, _, err := m.attempt(ctx)
	return l, err
}

// Lock takes the lock, waiting as long as ctx allows. It subscribes to the lock's release
// notification before each attempt, so a release wakes it at once, and re-checks when the
// holder's TTL would run out in case a notification was lost; it does not poll.
//
// When ctx ends first, Lock returns an error matching both ErrNotObtained and ctx.Err().
// Other errors are those of TryLock; a Redis error ends the wait.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	l, wait, err := m.attempt(ctx)
	if l != nil || !errors.Is(err, ErrNotObtained) {
		return l, err
	}
	var sub *subscription
	if n := m.c.notifierFor(ctx, m.keys.lock); n != nil {
		sub = n.subscribe(ctx, m.keys.channel)
		defer sub.close()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		// Attempt after subscribing: a release between the first attempt and the subscription
		// would otherwise go unnoticed until the re-check.
		l, wait, err = m.attempt(ctx)
		if l != nil || !errors.Is(err, ErrNotObtained) {
			return l, err
		}
		var wake <-chan struct{}
		if sub != nil {
			wake = sub.c
		}
		if sub == nil || !sub.confirmed {
			wait = min(wait, pollWithoutPush)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, m.name), ctx.Err())
		case <-m.c.bg.Done():
			return nil, fmt.Errorf("%w: lock %q", ErrClosed, m.name)
		case <-wake:
		case <-timer.C:
		}
	}
}

// attempt runs the acquire script once. When the lock is taken it returns ErrNotObtained and
// how long to wait before re-checking (the holder's remaining TTL).
func (m *Mutex) attempt(ctx context.Context) (*Lease, time.Duration, error) {
	if m.err != nil {
		return nil, 0, m.err
	}
	if err := m.c.checkOpen(); err != nil {
		return nil, 0, fmt.Errorf("%w: lock %q", err, m.name)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, m.name), err)
	}
	ttl := m.cfg.leaseTTL()
	holdID := m.c.nextHoldID()
	k := m.keys
	sent := time.Now()
	res, err := scripts.Acquire.Run(ctx, m.c.rdb, []string{k.lock, k.fence, k.opLog},
		m.owner, ttl.Milliseconds(), holdID, opLogTTL.Milliseconds()).Int64Slice()
	if err != nil {
		if !isRedisReply(err) {
			// The script may have run with its reply lost: undo it in the background so the
			// lock is not left held (it would otherwise expire only after its TTL).
			m.c.abandon(m, holdID)
		}
		if cerr := ctx.Err(); cerr != nil {
			return nil, 0, errors.Join(fmt.Errorf("%w: %q", ErrNotObtained, m.name), cerr)
		}
		return nil, 0, fmt.Errorf("dlock: lock %q: %w", m.name, err)
	}
	if len(res) < 2 {
		return nil, 0, fmt.Errorf("dlock: lock %q: unexpected acquire reply %v", m.name, res)
	}
	if res[0] == 0 {
		wait := time.Duration(res[1]) * time.Millisecond
		if res[1] < 0 {
			wait = time.Second // a key without TTL (set by hand): re-check now and then
		}
		return nil, max(wait, time.Millisecond), fmt.Errorf("%w: %q", ErrNotObtained, m.name)
	}
	l := &Lease{
		m:       m,
		token:   uint64(res[1]),
		holdID:  holdID,
		done:    make(chan struct{}),
		tracked: make(chan struct{}),
		ttl:     ttl,
		heapIdx: -1,
	}
	if err := m.c.track(ctx, l, sent); err != nil {
		// The Client closed while the script ran: give the hold back.
		_, _ = l.release(context.WithoutCancel(ctx))
		l.finish(err, true)
		return nil, 0, fmt.Errorf("%w: lock %q", err, m.name)
	}
	return l, 0, nil
}

// isRedisReply tells an error Redis answered (the script did not change anything) from a
// transport failure or timeout, after which the script may or may not have run.
func isRedisReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, context.DeadlineExceeded)
}

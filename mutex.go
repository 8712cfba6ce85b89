package dlock

import (
	"context"
	"errors"
	"sync"
)

// A Mutex is a handle on one named lock. It is cheap to create and holds no Redis state; the
// handle is the owner: all leases taken through it re-enter each other. A Mutex is safe for
// concurrent use, but goroutines that must exclude each other need separate handles.
//
// By default the handles of one Client on one lock form a cohort: the Client holds the Redis
// lock under its own id and passes it between its goroutines without a round trip, a bounded
// batch at a time (see WithoutCohort). A handle made WithOwner takes the lock in Redis under
// that id instead, so handles sharing the id, in any process, re-enter each other there.
type Mutex struct {
	c         *Client
	name      string
	keys      keys // all of them for a plain handle; only the lock key for a cohort handle
	cfg       config
	owner     string    // see Owner
	ownerOnce sync.Once // a cohort handle's id is made on first use: Redis never sees it
	cohort    bool      // served by the Client's cohort for this lock (see cohort.go)
	err       error     // invalid name or option, reported by Lock and TryLock
}

// Mutex returns a handle on the lock called name. Options override the Client's. An invalid
// name or option is reported by Lock and TryLock as ErrInvalid; Mutex itself never fails.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{c: c, name: name, cfg: c.cfg.apply(opts)}
	m.err = errors.Join(c.err, validateName(name), m.cfg.validate())
	m.owner = m.cfg.owner
	m.cohort = !m.cfg.ownerSet && !m.cfg.noCohort
	if m.cohort {
		// Only the lock key, to find the cohort: it holds the rest, once per lock.
		m.keys = keys{lock: lockKey(m.cfg.keyPrefix(), name)}
	} else {
		m.keys = lockKeys(m.cfg.keyPrefix(), name)
		if !m.cfg.ownerSet {
			m.owner = newOwnerID() // the owner field of its holds in Redis
		}
	}
	return m
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Owner returns the owner id of this handle: the WithOwner id, or a random 128-bit one. A
// cohort handle's holds appear in Redis under its Client's id; this id then names the handle
// only (for logs, or a command's environment).
func (m *Mutex) Owner() string {
	m.ownerOnce.Do(func() {
		if m.owner == "" {
			m.owner = newOwnerID()
		}
	})
	return m.owner
}

// TryLock makes one attempt to take the lock. It returns a held Lease, or an error matching
// ErrNotObtained when another owner holds the lock (or, with cohorting, another goroutine of
// this Client holds or waits for it, or the reply came too late to start a lease), ErrInvalid for a bad name or option, ErrClosed after
// Client.Close, or the Redis error that stopped the attempt. If this handle already holds the
// lock, TryLock re-enters it at once.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, false)
}

// Lock takes the lock, waiting as long as ctx allows. Waiters are served first come, first
// served: goroutines of this Client queue locally and the Client waits for them in the lock's
// Redis queue, where a release hands the lock directly to the next live waiter and wakes only
// it. Lock does not poll; it re-checks at the holder's remaining TTL or every 250 ms (which also
// keeps its place in the queue alive).
//
// When ctx ends first, Lock returns an error matching both ErrNotObtained and ctx.Err().
// Other errors are those of TryLock; a Redis error ends the wait.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, true)
}

func (m *Mutex) lock(ctx context.Context, wait bool) (*Lease, error) {
	if m.err != nil {
		return nil, m.err
	}
	if m.cohort {
		return m.c.cohortLock(ctx, m, wait)
	}
	return m.plainLock(ctx, wait)
}

// plainLock takes the lock in Redis under the handle's own owner id.
func (m *Mutex) plainLock(ctx context.Context, wait bool) (*Lease, error) {
	s := holdSpec{name: m.name, keys: m.keys, cfg: m.cfg, owner: m.Owner(), reentrant: true}
	var h *hold
	var err error
	if wait {
		h, err = m.c.waitHold(ctx, s, false)
	} else {
		h, _, err = m.c.tryHold(ctx, s, false)
	}
	if err != nil {
		return nil, err
	}
	return newLease(m, h, nil, h.token), nil
}

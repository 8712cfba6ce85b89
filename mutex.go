package dlock

import (
	"context"
)

// A Mutex is a handle on one named lock. It is cheap to create and holds no Redis state. Like
// a sync.Mutex it excludes goroutines: two goroutines that call Lock on the same *Mutex (or on
// two handles of the lock) never both hold it; the second waits, or gets ErrNotObtained from
// TryLock. The one exception is explicit: handles made WithOwner with the same id are one
// owner and re-enter each other (below). A Mutex is safe for concurrent use.
//
// Re-entry is explicit: a Lock or TryLock of the same lock on the same Client given the
// context of a held lease (Lease.Context, or a context derived from it) re-enters that lease:
// it returns at once with the same token, and the lock is let go when every lease of the chain
// has unlocked. A handle made WithOwner is the other way in: handles with that owner id, in
// any process, are one owner in Redis and re-enter each other's holds there.
//
// By default the handles of one Client on one lock form a cohort: the Client holds the Redis
// lock under its own id (under NewRedlock, an id of each hold's own) and passes it between its goroutines without a round trip, a bounded
// batch at a time (see WithoutCohort). Each handle's TTL and lease mode stay its own: handles
// with other settings form their own cohort, which the Redis lock excludes like another
// process.
type Mutex struct {
	c      *Client
	name   string
	keys   keys // all of them for a plain handle; only the lock key for a cohort handle
	cfg    config
	cohort string // the key of the Client's cohort serving this handle ("" when not cohorting)
	err    error  // invalid name or option, reported by Lock and TryLock

	ids ownerIDs // see Owner
}

// Mutex returns a handle on the lock called name. Options override the Client's. An invalid
// name or option is reported by Lock and TryLock as ErrInvalid; Mutex itself never fails.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{c: c, name: name, cfg: c.cfg.apply(opts)}
	m.ids.init(m.cfg)
	m.err = join(c.err, validateName(name), m.cfg.validate())
	if !m.cfg.ownerSet && !m.cfg.noCohort {
		// Only the lock key, to find the cohort: it holds the rest, once per lock.
		m.keys = keys{lock: lockKey(m.cfg.keyPrefix(), name)}
		m.cohort = m.keys.lock + cohortVariant(m.cfg)
	} else {
		m.keys = lockKeys(m.cfg.keyPrefix(), name)
	}
	return m
}

func (m *Mutex) ref() lockRef { return lockRef{m.c, m.name, m.keys.lock} }

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Owner returns the owner id of this handle: the WithOwner id, or a random 128-bit one made on
// first use. Leases of a handle without WithOwner have owner ids of their own in Redis (see
// Lease.Owner); this id names the handle (for logs, or a command's environment).
func (m *Mutex) Owner() string { return m.ids.handle() }

// TryLock makes one attempt to take the lock. It returns a held Lease, or an error matching
// ErrNotObtained when another owner holds the lock (or, with cohorting, another goroutine of
// this Client holds or waits for it, or the reply came too late to start a lease, or ctx was
// done), ErrUnavailable when Redis gave no definite answer (down, failing over, loading),
// ErrInvalid for a bad name or option, ErrClosed after Client.Close, ErrIncompatible for a
// server older than 7.0 or a lock of another dlock version, or the Redis error that stopped
// the attempt. Given the context of a held lease on this lock, it re-enters that lease.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, false)
}

// Lock takes the lock, waiting as long as ctx allows. Waiters are served first come, first
// served: goroutines of this Client queue locally and the Client waits for them in the lock's
// Redis queue, where a release hands the lock directly to the next live waiter and wakes only
// it. Lock does not poll; it re-checks at the holder's remaining TTL or every 250 ms (which also
// keeps its place in the queue alive). While Redis is unavailable (a failover, a restart) it
// keeps trying with backoff.
//
// When ctx ends first, Lock returns an error matching both ErrNotObtained and ctx.Err() (and
// ErrUnavailable when its last finished attempt failed so); a ctx that is done when Lock
// returns never yields a lease. Other errors are those of TryLock, except ErrUnavailable,
// which Lock waits out.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, true)
}

func (m *Mutex) lock(ctx context.Context, wait bool) (*Lease, error) {
	return m.c.lockWith(ctx, m.ref(), accessMutex, wait, m.err, func(ctx context.Context) (*Lease, error) {
		if m.cohort != "" {
			return m.c.cohortLock(ctx, m.cohort, m.newCohort, m.ref(), wait)
		}
		return m.plainLock(ctx, wait)
	})
}

// newCohort makes the cohort of the handle's lock and settings.
func (m *Mutex) newCohort() *cohort { return m.c.mutexCohort(m) }

// plainLock takes the lock in Redis under an owner id of its own: the WithOwner id, or one
// made for this call, so goroutines sharing the handle exclude each other.
func (m *Mutex) plainLock(ctx context.Context, wait bool) (*Lease, error) {
	s := holdSpec{name: m.name, keys: m.keys, cfg: m.cfg, owner: m.ids.call(), reentrant: m.cfg.ownerSet}
	if m.c.rl != nil {
		return m.c.redlockLease(ctx, m.ref(), s, wait)
	}
	return m.c.plainLease(ctx, m.ref(), s, wait)
}

package dlock

import (
	"context"
)

// An RWMutex is a handle on one named read-write lock: many readers share it, or one writer
// holds it alone. Like a sync.RWMutex it excludes goroutines: each RLock or Lock call is an
// owner of its own (readers of one Client may share a Redis hold, below), unless the handle is made WithOwner (then, as for Mutex, handles with that
// owner id are one owner and re-enter each other's holds). It is cheap to create, holds no
// Redis state and is safe for concurrent use.
//
// It is fair, in one FIFO queue in Redis for readers and writers: readers first in line are
// admitted together, a reader arriving while anyone waits queues behind them (so a waiting
// writer is not overtaken by new readers, but for the bounded sharing below), and a writer waits for the readers admitted
// before it. Waiters are woken by push when the lock is handed to them. Two bounded
// exceptions, as for Mutex: a writer may take a free lock ahead of a first waiter that has
// waited under a few milliseconds (barging, which keeps a busy lock busy), and callers that
// joined the queue in the same millisecond are ordered by owner id. Handles sharing a
// WithOwner id re-enter each other's read hold even while a writer waits.
//
// Leases are the same *Lease as a Mutex's: renewed, loss-detected, re-entered through their
// context. Re-entry: RLock or Lock given a write lease's context re-enters it (an RLock gets a
// read lease on the write hold, a downgrade that keeps the lock exclusive until the write
// lease and its re-entries have unlocked); Lock given a read lease's context fails at once with
// ErrInvalid, because two readers upgrading would wait for each other forever. A read lease
// from a downgrade is the exception: its hold is still the writer's, exclusive, so Lock given
// its context re-enters it to write (no other reader can be waiting to upgrade).
//
// Fencing tokens: a write lease's token is above every earlier lease's token on the lock, so a
// resource can refuse a stale writer. Readers admitted in one read phase (between two writers)
// share that phase's token, which is above every earlier writer's token: it says which writes
// a reader may have seen.
//
// The lock's name may not be used as a Mutex too: a call of one kind on a lock held as the
// other returns ErrInvalid.
//
// Readers of one Client share Redis holds (reader cohorting, unless WithoutCohort or
// WithOwner): an RLock joins a read hold its Client already has on the lock without a round
// trip, while that hold is under 5 ms old and no writer waits for the lock in Redis (the
// acquire's reply says whether anyone waited, and a writer joining the queue later is pushed to
// a Client that has the lock's channel subscribed, as it has while it waits for the lock;
// otherwise the 5 ms bound alone applies). Readers that find the lock taken wait together in
// one place in Redis's queue, which the Client keeps while any of them waits, and each has a
// place on the hold it gets; readers that come once a writer has queued behind that place
// wait behind the writer (the Client learns of it by push, from a writer of its own, or,
// without push, from its wait's next refresh in Redis, within 250 ms). The shared hold shows
// in Inspect as one reader, its leases have its owner id, it is released when its last reader
// unlocks, and all of them end if it is lost. Writers never share: every write lease is a
// Redis hold of its own.
type RWMutex struct {
	c     *Client
	name  string
	keys  keys
	cfg   config
	share string // the key of the Client's shared read holds of this lock ("" when not shared)
	err   error  // invalid name or option, reported by every lock call

	ids ownerIDs // see Owner
}

// RWMutex returns a handle on the read-write lock called name. Options override the Client's
// (WithoutCohort: every read lease is a Redis hold of its own). An invalid name or option is
// reported by the lock calls as ErrInvalid; RWMutex itself never fails.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{c: c, name: name, cfg: c.cfg.apply(opts)}
	rw.ids.init(rw.cfg)
	rw.err = join(c.unsupported("RWMutex"), c.err, validateName(name), rw.cfg.validate())
	rw.keys = lockKeys(rw.cfg.keyPrefix(), name)
	if !rw.cfg.ownerSet && !rw.cfg.noCohort {
		rw.share = rw.keys.lock + cohortVariant(rw.cfg)
	}
	return rw
}

// Name returns the lock's name.
func (rw *RWMutex) Name() string { return rw.name }

// Owner returns the owner id of this handle: the WithOwner id, or a random 128-bit one made on
// first use (each lease then has an owner id of its own in Redis, see Lease.Owner).
func (rw *RWMutex) Owner() string { return rw.ids.handle() }

// RLock takes the lock to read, waiting as long as ctx allows, behind every caller already
// waiting (readers first in line are admitted together). Errors are those of Mutex.Lock, and
// ErrInvalid when the lock is held as a Mutex.
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) {
	return rw.lock(ctx, accessRead, true)
}

// TryRLock makes one attempt to take the lock to read: it succeeds while readers hold it and
// nobody waits, or when it is free. Errors are those of Mutex.TryLock, and ErrInvalid when the
// lock is held as a Mutex.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) {
	return rw.lock(ctx, accessRead, false)
}

// Lock takes the lock to write, alone, waiting as long as ctx allows for the readers and
// writers before it. Errors are those of Mutex.Lock, and ErrInvalid when the lock is held as a
// Mutex, or when ctx is a read lease's context (no upgrade).
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) {
	return rw.lock(ctx, accessWrite, true)
}

// TryLock makes one attempt to take the lock to write. Errors are those of Mutex.TryLock, and
// ErrInvalid as for Lock.
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) {
	return rw.lock(ctx, accessWrite, false)
}

func (rw *RWMutex) lock(ctx context.Context, a access, wait bool) (*Lease, error) {
	ref := lockRef{rw.c, rw.name, rw.keys.lock}
	return rw.c.lockWith(ctx, ref, a, wait, rw.err, func(ctx context.Context) (*Lease, error) {
		if a == accessRead && rw.share != "" {
			return rw.c.sharedRead(ctx, rw, ref, wait)
		}
		if rw.share != "" && wait {
			// A writer of this Client queues: its readers that come later wait behind it.
			rw.c.detachRead(rw.share, nil)
			rw.c.closeShare(rw.share)
		}
		s := holdSpec{name: rw.name, keys: rw.keys, cfg: rw.cfg, owner: rw.ids.call(),
			reentrant: rw.cfg.ownerSet, access: a}
		return rw.c.plainLease(ctx, ref, s, wait)
	})
}

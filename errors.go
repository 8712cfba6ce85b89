package dlock

import "errors"

// Sentinel errors. Compare with errors.Is: dlock wraps them with the lock name and the cause,
// and joins them with ctx.Err() when a context ended the wait.
var (
	// ErrNotObtained means the caller did not get the lock: TryLock found it taken (or its
	// attempt's reply came after the lease's safe deadline, so the lease would have been over
	// already), or Lock's context ended before it was free (then the error also matches
	// ctx.Err()). A key that holds something other than a lock counts as taken.
	ErrNotObtained = errors.New("dlock: not obtained")

	// ErrNotHeld means the caller no longer holds the lock: the lease was lost before Unlock or
	// Extend, Unlock was called twice, or the Lease is nil.
	ErrNotHeld = errors.New("dlock: not held")

	// ErrLeaseLost is what Lease.Err reports once a lease was lost: the key was deleted, expired
	// or taken by another owner, or Redis stayed unreachable past the lease's safe deadline.
	// The error wraps the cause.
	ErrLeaseLost = errors.New("dlock: lease lost")

	// ErrClosed means the Client (or the go-redis client under it) was closed: its leases end
	// and no new ones are granted.
	ErrClosed = errors.New("dlock: client closed")

	// ErrInvalid means an argument or option was rejected (empty name, non-positive TTL,
	// malformed owner, nil Redis client, ...). The error names the value and the rule it broke.
	ErrInvalid = errors.New("dlock: invalid argument")

	// ErrStaleToken means a fenced write carried a token lower than one the resource has
	// already accepted: a newer lock holder exists and the write was refused.
	ErrStaleToken = errors.New("dlock: stale fencing token")

	// ErrUnavailable means Redis could not give a definite answer: the connection failed or
	// timed out, or the server replied that it cannot serve the lock now (LOADING after a
	// restart, READONLY or MOVED during a failover, CLUSTERDOWN, TRYAGAIN, MASTERDOWN,
	// NOREPLICAS under min-replicas-to-write, BUSY while a script runs long, MISCONF while a
	// failed save stops writes). The error wraps the cause. TryLock returns it
	// at once; Lock keeps retrying with backoff until its ctx ends. An attempt that failed
	// this way may still have taken the lock in Redis: dlock gives such a hold back in the
	// background.
	ErrUnavailable = errors.New("dlock: redis unavailable")

	// ErrIncompatible means the deployment cannot run dlock's scripts safely: the server is
	// older than Redis 7.0, or the lock's keys were written in another key layout (by another
	// dlock version during an upgrade); nothing was changed, and the lock is left as it was. It
	// also means the server cannot answer WithReplicaAckAOF (before Redis 7.2, or a local fsync
	// without appendonly): that error matches ErrInvalid too, and the acquisition was undone
	// (the error says if giving it back failed).
	ErrIncompatible = errors.New("dlock: incompatible server or key layout")

	// ErrNotReplicated means a write was not acknowledged by as many replicas as
	// WithReplicaAck (or WithReplicaAckAOF) asks for within its timeout: an acquisition was
	// undone (the caller does not hold the lock), or Lease.Extend did not extend the lease. The
	// error says how many replicas acknowledged and how many the master has.
	ErrNotReplicated = errors.New("dlock: not acknowledged by enough replicas")
)

// Causes wrapped by ErrLeaseLost.
var (
	errKeyGone        = errors.New("lock key deleted or expired in Redis")
	errTaken          = errors.New("lock taken by another owner")
	errDeadline       = errors.New("no successful renewal before the lease's safe deadline")
	errRenewRefused   = errors.New("renewal refused: owner no longer holds the lock")
	errFixedLeaseOver = errors.New("fixed lease TTL ran out")
	errLateReply      = errors.New("the acquire's reply arrived after the lease's safe deadline")
	errLostAtOnce     = errors.New("the lock was lost the moment it was taken")
	errForeignValue   = errors.New("the lock's key holds a value that is not a dlock lock")
	errWriterBehind   = errors.New("a writer waits behind the caller's place in the queue")
)

// joinErr joins errors like errors.Join, but prints them on one line ("a; b"), so a log line
// stays one line. errors.Is and errors.As see every member.
type joinErr []error

func (j joinErr) Error() string {
	s := ""
	for i, e := range j {
		if i > 0 {
			s += "; "
		}
		s += e.Error()
	}
	return s
}

func (j joinErr) Unwrap() []error { return j }

// join returns the non-nil errs joined (nil if none, the error itself if one).
func join(errs ...error) error {
	var j joinErr
	for _, e := range errs {
		if e != nil {
			j = append(j, e)
		}
	}
	switch len(j) {
	case 0:
		return nil
	case 1:
		return j[0]
	}
	return j
}

package dlock

import "errors"

// Sentinel errors. Compare with errors.Is: dlock wraps them with the lock name and the cause,
// and joins them with ctx.Err() when a context ended the wait.
var (
	// ErrNotObtained means the caller did not get the lock: TryLock found it taken (or its
	// attempt's reply came after the lease's safe deadline, so the lease would have been over
	// already), or Lock's context ended before it was free (then the error also matches
	// ctx.Err()).
	ErrNotObtained = errors.New("dlock: not obtained")

	// ErrNotHeld means the caller no longer holds the lock: the lease was lost before Unlock or
	// Extend, or Unlock was called twice.
	ErrNotHeld = errors.New("dlock: not held")

	// ErrLeaseLost is what Lease.Err reports once a lease was lost: the key was deleted, expired
	// or taken by another owner, or Redis stayed unreachable past the lease's safe deadline.
	// The error wraps the cause.
	ErrLeaseLost = errors.New("dlock: lease lost")

	// ErrClosed means the Client was closed: its leases end and no new ones are granted.
	ErrClosed = errors.New("dlock: client closed")

	// ErrInvalid means an argument or option was rejected (empty name, non-positive TTL,
	// malformed owner, ...). The error names the value and the rule it broke.
	ErrInvalid = errors.New("dlock: invalid argument")

	// ErrStaleToken means a fenced write carried a token lower than one the resource has
	// already accepted: a newer lock holder exists and the write was refused.
	ErrStaleToken = errors.New("dlock: stale fencing token")
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
)

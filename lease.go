package dlock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

type leaseState int

const (
	leaseHeld leaseState = iota
	leaseReleasing
	leaseEnded
)

// A Lease is one hold of a lock, returned by Mutex.Lock and Mutex.TryLock. It stays valid
// until Unlock or until it is lost; Done tells which moment that is.
//
// A Lease is safe for concurrent use. Work protected by the lock should stop when Done closes:
// from then on another owner may hold the lock. Resources that must never see a stale holder
// should also check Token (see FencedSet).
type Lease struct {
	m     *Mutex
	h     *hold   // the Redis-level hold behind this lease
	co    *cohort // non-nil when h is the Client's hold shared by a run of local leases
	token uint64
	done  chan struct{}

	mu       sync.Mutex
	state    leaseState
	err      error
	unlocked bool // Unlock reached Redis (or found the lease lost)
}

// newLease returns a held lease on h. A plain lease (co nil) ends with its hold.
func newLease(m *Mutex, h *hold, co *cohort, token uint64) *Lease {
	l := &Lease{m: m, h: h, co: co, token: token, done: make(chan struct{})}
	if co == nil {
		if ended, err := h.setOnEnd(func(err error) { l.finish(err, false) }); ended {
			l.finish(err, false)
		}
	}
	return l
}

// Token returns the lease's fencing token. Tokens of one lock strictly increase with every
// acquisition, whoever the owner and whichever process; re-entrant holds share their outer
// hold's token. Tokens are large numbers (at least the Redis server's clock in microseconds,
// so they survive a restart that lost the counter) and not consecutive. Pass it to the protected resource so it can refuse writes from an older
// holder.
func (l *Lease) Token() uint64 { return l.token }

// Name returns the name of the lock this lease holds.
func (l *Lease) Name() string { return l.m.name }

// Owner returns the owner id of the handle the lease was taken with.
func (l *Lease) Owner() string { return l.m.Owner() }

// Done returns a channel that is closed when the lease ends: released by Unlock, lost, or
// ended by Client.Close. Err then tells which.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns nil while the lease is held and after a successful Unlock. Once the lease was
// lost it returns an error matching ErrLeaseLost that wraps the cause (key deleted or expired,
// taken by another owner, renewal refused, or no successful renewal before the safe deadline);
// after Client.Close it returns ErrClosed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Remaining returns how long the lease is certainly still held: its safe deadline (the send
// time of the acquire or last renewal + TTL × (1 − drift)) minus now, or 0 once the lease has
// ended or the deadline has passed. A holder about to start a write that must finish under
// the lock checks that Remaining exceeds the write's duration; beyond that, fencing tokens
// protect the resource.
func (l *Lease) Remaining() time.Duration {
	if l.Err() != nil {
		return 0
	}
	select {
	case <-l.done:
		return 0
	default:
	}
	return l.h.remaining()
}

// TTL returns the lease's current TTL: the one it was acquired with or last extended to.
func (l *Lease) TTL() time.Duration {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	return l.h.ttl
}

// Extend makes the lock's TTL in Redis at least ttl from now, if the lease is still held;
// later watchdog renewals use ttl. It never shortens the TTL in Redis (another hold of the same
// owner may rely on it), but the lease's own safe deadline becomes
// send time + ttl × (1 − drift) either way. If the owner no longer holds the lock the lease ends as lost
// and Extend returns an error matching ErrNotHeld and ErrLeaseLost. A Redis error leaves the
// lease unchanged and is returned.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl < minTTL {
		return fmt.Errorf("%w: extend TTL %v: must be at least %v", ErrInvalid, ttl, minTTL)
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	if err := l.h.extend(ctx, ttl.Truncate(time.Millisecond)); err != nil {
		if herr := l.heldErr(); herr != nil {
			return herr
		}
		return err
	}
	return l.heldErr()
}

// Unlock releases this hold. When it was the owner's last hold the lock goes to the next
// waiter (in this process first, within a bounded batch, then in Redis's queue) or is freed.
//
// Unlock returns an error matching ErrNotHeld when the lease had already been lost (the error
// also matches ErrLeaseLost) or was already unlocked. If Redis cannot be reached, Unlock returns
// that error, ends the lease locally (renewal stops, Done closes) and the lock expires within
// its TTL; calling Unlock again retries the release, which is applied at most once even when
// an earlier attempt succeeded but its reply was lost.
func (l *Lease) Unlock(ctx context.Context) error {
	l.mu.Lock()
	state, unlocked, lostErr := l.state, l.unlocked, l.err
	if state == leaseHeld {
		l.state = leaseReleasing
	}
	l.mu.Unlock()
	switch {
	case state == leaseReleasing:
		return fmt.Errorf("%w: %q: Unlock already in progress", ErrNotHeld, l.m.name)
	case unlocked:
		return fmt.Errorf("%w: %q: already unlocked", ErrNotHeld, l.m.name)
	case lostErr != nil:
		return fmt.Errorf("%w: %w", ErrNotHeld, lostErr)
	}
	if l.co != nil && state == leaseHeld {
		return l.co.unlock(ctx, l)
	}
	if state == leaseHeld && !l.h.beginRelease() {
		// Lost while we got here: end the lease with the hold's loss even if the hold's own
		// notice has not reached it yet.
		l.finish(l.h.lossErr(), true)
		return l.heldErr()
	}
	// Here the hold is releasing, or was ended locally by an earlier Unlock whose release
	// failed: the script is idempotent, so run it (again).
	return l.finishRelease(ctx, l.h)
}

// finishRelease runs h's release script and ends h and the lease according to its answer.
func (l *Lease) finishRelease(ctx context.Context, h *hold) error {
	n, err := h.release(ctx)
	if err != nil {
		h.end(nil, false)
		l.finish(nil, false) // ended locally; a later Unlock retries the release
		return fmt.Errorf("dlock: unlock %q: %w (the lock expires within its TTL if the release did not reach Redis)", l.m.name, err)
	}
	if n == 0 {
		lost := leaseLost(l.m.name, errKeyGone)
		h.end(lost, false)
		l.finish(lost, true)
		return fmt.Errorf("%w: %w", ErrNotHeld, lost)
	}
	h.end(nil, false)
	l.finish(nil, true)
	return nil
}

// heldErr returns nil while the lease is held, else an error matching ErrNotHeld.
func (l *Lease) heldErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.state == leaseHeld:
		return nil
	case l.err != nil:
		return fmt.Errorf("%w: %w", ErrNotHeld, l.err)
	default:
		return fmt.Errorf("%w: %q: already unlocked", ErrNotHeld, l.m.name)
	}
}

// finish ends the lease once: records why and closes Done.
func (l *Lease) finish(err error, unlocked bool) {
	l.mu.Lock()
	if unlocked {
		l.unlocked = true
	}
	if l.state == leaseEnded {
		if l.err == nil && err != nil && unlocked {
			l.err = err // a retried Unlock found the lease lost after all
		}
		l.mu.Unlock()
		return
	}
	l.state = leaseEnded
	l.err = err
	l.mu.Unlock()
	close(l.done)
}

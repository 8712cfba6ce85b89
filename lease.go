package dlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
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
	m      *Mutex
	token  uint64
	holdID string
	notif  *notifier // nil when the server gives no push notifications
	done   chan struct{}
	// tracked is closed once a tracked read confirmed the hold, so a later change of the key
	// is pushed (tests wait on it before tampering with the key).
	tracked     chan struct{}
	trackedOnce sync.Once

	mu           sync.Mutex
	state        leaseState
	err          error
	ttl          time.Duration
	deadline     time.Time   // monotonic: when the lease counts as lost without a renewal
	deadlineFrom time.Time   // send time of the acquire/renewal/extend that set deadline
	timer        *time.Timer // fires at deadline
	heapIdx      int         // position in the renewer's heap, -1 when not scheduled (renewer.mu)
	renewAt      time.Time   // next renewal (renewer.mu)
	unlocked     bool        // Unlock reached Redis (or found the lease lost)
}

// Token returns the lease's fencing token. Tokens of one lock strictly increase with every
// fresh acquisition, whoever the owner; re-entrant holds share their outer hold's token.
// Pass it to the protected resource so it can refuse writes from an older holder.
func (l *Lease) Token() uint64 { return l.token }

// Name returns the name of the lock this lease holds.
func (l *Lease) Name() string { return l.m.name }

// Owner returns the owner id the lease was taken with.
func (l *Lease) Owner() string { return l.m.owner }

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

// TTL returns the lease's current TTL: the one it was acquired with or last extended to.
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Extend sets the lock's TTL in Redis to ttl from now, if the lease is still held; later
// watchdog renewals keep using ttl. On success the local safe deadline moves to
// send time + ttl × (1 − drift). If the owner no longer holds the lock the lease ends as lost
// and Extend returns an error matching ErrNotHeld and ErrLeaseLost. A Redis error leaves the
// lease unchanged and is returned.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl < minTTL {
		return fmt.Errorf("%w: extend TTL %v: must be at least %v", ErrInvalid, ttl, minTTL)
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	k := l.m.keys
	sent := time.Now()
	n, err := scripts.Extend.Run(ctx, l.m.c.rdb, []string{k.lock}, l.m.owner, ttl.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("dlock: extend %q: %w", l.m.name, err)
	}
	if n == 0 {
		l.lose(errRenewRefused)
		return l.heldErr()
	}
	l.mu.Lock()
	if l.state == leaseHeld {
		l.ttl = ttl
		l.setDeadlineLocked(sent)
	}
	l.mu.Unlock()
	l.m.c.renew.reschedule(l, sent)
	return l.heldErr()
}

// Unlock releases this hold. When it was the owner's last hold the lock is deleted and waiters
// are woken; otherwise the lock stays held by the owner's remaining holds.
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
	case state == leaseHeld:
		l.m.c.renew.remove(l)
	}
	// Here the lease is releasing, or ended locally by an earlier Unlock whose release failed.

	n, err := l.release(ctx)
	if err != nil {
		l.finish(nil, false) // ended locally; a later Unlock retries the release
		return fmt.Errorf("dlock: unlock %q: %w (the lock expires within its TTL if the release did not reach Redis)", l.m.name, err)
	}
	if n == 0 {
		l.finish(leaseLost(l.m.name, errKeyGone), true)
		return fmt.Errorf("%w: %w", ErrNotHeld, l.Err())
	}
	l.finish(nil, true)
	return nil
}

// release runs the release script for this hold: 2 freed, 1 one hold dropped (or an earlier
// attempt already applied), 0 not held.
func (l *Lease) release(ctx context.Context) (int, error) { return l.runRelease(ctx, false) }

// releaseIfAcquired releases the hold only if its acquire was applied in Redis.
func (l *Lease) releaseIfAcquired(ctx context.Context) (int, error) { return l.runRelease(ctx, true) }

func (l *Lease) runRelease(ctx context.Context, onlyIfAcquired bool) (int, error) {
	k := l.m.keys
	return scripts.Release.Run(ctx, l.m.c.rdb, []string{k.lock, k.opLog},
		l.m.owner, l.holdID, opLogTTL.Milliseconds(), k.channel, onlyIfAcquired).Int()
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

func leaseLost(name string, cause error) error {
	return fmt.Errorf("%w: %q: %w", ErrLeaseLost, name, cause)
}

// lose ends a held lease as lost. It is a no-op once Unlock has started: the release script's
// answer decides then.
func (l *Lease) lose(cause error) {
	l.mu.Lock()
	held := l.state == leaseHeld
	l.mu.Unlock()
	if held {
		l.finish(leaseLost(l.m.name, cause), false)
	}
}

// finish ends the lease once: records why, closes Done and detaches it from the Client.
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
	if l.timer != nil {
		l.timer.Stop()
	}
	n := l.notif
	l.mu.Unlock()
	close(l.done)
	// After the state change, so a renewal in flight cannot queue the lease again.
	l.m.c.renew.remove(l)
	if n != nil {
		n.unwatch(l.m.keys.lock, l)
	}
	l.m.c.forget(l)
}

// setDeadlineLocked moves the safe deadline to sent + TTL × (1 − drift), measured on the
// monotonic clock from when the acquire or renewal was sent: Redis started the TTL no earlier
// than that, so the lease ends locally before it can expire there.
func (l *Lease) setDeadlineLocked(sent time.Time) {
	if sent.Before(l.deadlineFrom) {
		return // a later-sent extend already set it
	}
	l.deadlineFrom = sent
	ttl := l.ttl
	margin := time.Duration(float64(ttl) * l.m.cfg.driftFactor())
	l.deadline = sent.Add(ttl - margin)
	d := time.Until(l.deadline)
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.deadlinePassed)
	} else {
		l.timer.Reset(d)
	}
}

func (l *Lease) deadlinePassed() {
	l.mu.Lock()
	early := time.Now().Before(l.deadline) // a renewal moved the deadline and reset the timer
	l.mu.Unlock()
	if early {
		return
	}
	if l.m.cfg.fixedLease {
		l.lose(errFixedLeaseOver)
		return
	}
	l.lose(errDeadline)
}

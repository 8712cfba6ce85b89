package dlock

import (
	"context"
	"errors"
	"time"
)

// An Observer is told what a Client's locks do, for metrics, traces and logs. It is a struct of
// optional functions, as net/http/httptrace's ClientTrace is, so later dlock versions can tell
// more without breaking it; a nil field is skipped. Install it with WithObserver.
//
// The functions run synchronously on the goroutine doing the work (a caller's, or dlock's
// renewer and loss detection), so they must return quickly and must not block: a slow
// LeaseEnded delays the next holder's hand-off, a slow Renewed delays every lease's renewal.
// They may run concurrently with one another. They must not take a lock of the same Client
// from within (that may wait for the very work they hold up).
type Observer struct {
	// CallStart is called when a call of the API starts: Lock, TryLock, RLock, TryRLock,
	// Acquire, TryAcquire (of Mutex, RWMutex, Semaphore, MultiLock) and Lease.Unlock. The
	// context it returns (carrying a trace span, say) is the one the call runs with, so its
	// Redis commands (and a lease it returns: Lease.Context keeps its values) carry it; it is
	// given to CallDone. Returning nil keeps ctx.
	CallStart func(ctx context.Context, call Call) context.Context
	// CallDone is called when that call returns, with the lease it returned or unlocked (nil
	// if none) and its error (nil on success; match it with errors.Is against ErrNotObtained,
	// ErrUnavailable, ErrNotHeld and the rest). time.Since(call.Start) is how long it took:
	// for a Lock, how long it waited.
	CallDone func(ctx context.Context, call Call, l *Lease, err error)
	// LeaseEnded is called once per lease when it ends, with how long it was held: err is nil
	// when an Unlock ended it (even one whose release Redis has not confirmed yet: its
	// CallDone has that error), an error matching ErrLeaseLost when it was lost, ErrClosed when
	// Client.Close ended it.
	LeaseEnded func(l *Lease, held time.Duration, err error)
	// Renewed is called for each watchdog renewal of a Redis hold, with the lock's name, how long
	// Redis took to answer, and nil or why it did not count (a Redis error, a renewal that the
	// replicas did not acknowledge under WithReplicaAck, or an error matching ErrLeaseLost when
	// Redis refused it because the hold was gone). A hold shared by several leases (cohorting, a
	// Redlock's masters, a MultiLock's members) is one renewal.
	Renewed func(lock string, latency time.Duration, err error)
}

// A Call describes a call an Observer hears of.
type Call struct {
	// Method is the method called: "Lock", "TryLock", "RLock", "TryRLock", "Acquire",
	// "TryAcquire" or "Unlock".
	Method string
	// Kind is the primitive: "mutex", "rwmutex", "semaphore" or "multilock".
	Kind string
	// Name is the lock's name (a MultiLock's names joined by commas).
	Name string
	// Start is when the call started.
	Start time.Time
}

// WithObserver makes the Client tell o what its locks do (see Observer). It is a Client
// option: given to a handle it has no effect. Under NewRedlock it is told of the Redlock's
// leases, and Renewed of each master's renewals.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = &o } }

// callKind names the primitive and method of a lock call taking a with wait.
func callKind(a access, multi, wait bool) (kind, method string) {
	switch {
	case multi:
		kind, method = "multilock", "Lock"
	case a == accessRead:
		kind, method = "rwmutex", "RLock"
	case a == accessWrite:
		kind, method = "rwmutex", "Lock"
	case a == accessPermits:
		kind, method = "semaphore", "Acquire"
	default:
		kind, method = "mutex", "Lock"
	}
	if !wait {
		method = "Try" + method
	}
	return kind, method
}

// observeStart tells the Client's observer that call starts and returns the context the call
// runs with.
func (c *Client) observeStart(ctx context.Context, call *Call) context.Context {
	o := c.obs
	if o == nil {
		return ctx
	}
	call.Start = c.now()
	if o.CallStart != nil {
		if octx := o.CallStart(ctx, *call); octx != nil {
			return octx
		}
	}
	return ctx
}

// observeDone tells the Client's observer that call returned.
func (c *Client) observeDone(ctx context.Context, call Call, l *Lease, err error) {
	if o := c.obs; o != nil && o.CallDone != nil {
		o.CallDone(ctx, call, l, err)
	}
}

// observeEnd tells the Client's observer that lease l ended with err, and its logger when the
// lease was lost (work it protected may have overlapped another holder's).
func (l *Lease) observeEnd(err error) {
	c := l.ref.c
	if errors.Is(err, ErrLeaseLost) {
		c.log.Warn("dlock: lease lost", "lock", l.ref.name, "token", l.token, "err", err)
	}
	if o := c.obs; o != nil && o.LeaseEnded != nil {
		o.LeaseEnded(l, c.since(l.start), err)
	}
}

// observeRenewal tells the Client's observer how a renewal of h, sent at sent, ended.
func (c *Client) observeRenewal(h *hold, sent time.Time, err error) {
	if o := c.obs; o != nil && o.Renewed != nil {
		o.Renewed(h.name, c.since(sent), err)
	}
}

// Outcome names the outcome of a call, a lease's end or a renewal by its error, for metrics
// and traces (the adapters label with it): "ok" (nil), "not_obtained" (taken by another owner,
// or the caller's context ended first), "not_held" (Unlock or Extend of a lease that had
// ended), "lost" (a lease lost, a renewal Redis refused), "not_replicated" (the replicas did
// not acknowledge in time), "closed", "invalid" (a bad argument or setting, or a server dlock
// cannot use), "unavailable" (Redis gave no definite answer) or "error" (anything else, such
// as a refused permission).
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotObtained):
		return "not_obtained"
	case errors.Is(err, ErrNotHeld):
		return "not_held"
	case errors.Is(err, ErrLeaseLost):
		return "lost"
	case errors.Is(err, ErrNotReplicated):
		return "not_replicated"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrIncompatible):
		return "invalid"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	default:
		return "error"
	}
}

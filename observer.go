package dlock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// An Observer is told what a Client's locks do, for metrics, traces and logs. It is a struct of
// optional functions, as net/http/httptrace's ClientTrace is, each taking a struct, so later
// dlock versions can tell more without breaking it; a nil field is skipped. Install it with
// WithObserver; the adapter modules dlockprom (Prometheus) and dlockotel (OpenTelemetry)
// build on it.
//
// The functions run synchronously on the goroutine doing the work (a caller's, or dlock's
// renewer and loss detection), never under a lock of dlock's, so they must return quickly and
// must not block: a slow LeaseEnded delays the next holder's hand-off, a slow Renewed every
// lease's renewal. They may run concurrently with one another, and events of different leases
// may arrive in either order (the next holder's CallDone may come before the last holder's
// LeaseEnded), and a lease that ended before its call returned (lost at once) may be reported
// ended before its CallDone. They must not wait for
// a lock of the same Client (the work they hold up may be what would free it).
//
// They should not panic. A panic in CallStart or CallDone goes up the caller's goroutine, as
// the call's own would, after dlock has given back the lock a lock call took (CallDone) or
// released the lease an Unlock was given (CallStart); one in a function dlock's own
// goroutines call (LeaseEnded of a lost lease, Renewed) ends the program, as any goroutine's
// panic does.
type Observer struct {
	// CallStart is called when a call of the API starts: Lock, TryLock, RLock, TryRLock,
	// Acquire, TryAcquire (of Mutex, RWMutex, Semaphore, MultiLock) and Lease.Unlock. It must
	// return ctx or a context derived from it (carrying a trace span, say), or nil to keep
	// ctx: the call's Redis commands run with it, and CallDone gets it. A lease the call
	// returns keeps the values of the caller's ctx, not of this one (work under the lease is
	// not part of the lock call).
	CallStart func(ctx context.Context, call Call) context.Context
	// CallDone is called when that call returns, with what it returned.
	CallDone func(ctx context.Context, call Call, res CallResult)
	// LeaseEnded is called once for each lease a call returned, when it ends.
	LeaseEnded func(end LeaseEnd)
	// Renewed is called for each watchdog renewal of a Redis hold: one per lock for a Mutex
	// lease (however many goroutines of the Client share its hold), one per member for a
	// MultiLock's, one per master for a Redlock's (Server names it).
	Renewed func(r Renewal)
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
	// Start is when the call started (time.Now, with its monotonic reading:
	// time.Since(Start) in CallDone is how long the call took, for a Lock how long it waited).
	Start time.Time
}

// CallResult is what a call returned.
type CallResult struct {
	// Lease is the lease the call returned (a lock call) or acted on (Unlock); nil if none.
	Lease *Lease
	// Err is the call's error, nil on success: match it with errors.Is (ErrNotObtained,
	// ErrUnavailable, ErrNotHeld, ...), or name it with Outcome.
	Err error
}

// LeaseEnd tells how a lease ended.
type LeaseEnd struct {
	Lease *Lease
	// Held is how long the lease was held: from the lock call's return to its end.
	Held time.Duration
	// Err is nil when an Unlock ended the lease (even one whose release Redis has not
	// confirmed yet: its CallDone has that error), an error matching ErrLeaseLost when it was
	// lost, ErrClosed when Client.Close ended it.
	Err error
}

// A Renewal is one watchdog renewal of a Redis hold.
type Renewal struct {
	// Lock is the lock's name.
	Lock string
	// Server is the address of the Redis the renewal went to, when the Client knows it (a
	// client of one server, a Redlock's master); "" otherwise (a Cluster, a Sentinel group).
	Server string
	// Latency is how long Redis took to answer the renewal's round trip.
	Latency time.Duration
	// Err is nil when the renewal counts; otherwise why not: a Redis error (matching
	// ErrUnavailable when there was no answer), ErrNotReplicated under WithReplicaAck when
	// the replicas did not acknowledge it, or an error matching ErrLeaseLost when Redis
	// refused it because the hold was gone (the lease then ends as lost).
	Err error
}

// WithObserver makes the Client tell o what its locks do (see Observer). It is a Client
// option: given to a handle it has no effect. Under NewRedlock it is told of the Redlock's
// lock calls and leases, and of each master's renewals.
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
	call.Start = time.Now()
	if o := c.obs; o.CallStart != nil {
		if octx := o.CallStart(ctx, *call); octx != nil {
			return octx
		}
	}
	return ctx
}

// observeDone tells the Client's observer that call returned.
func (c *Client) observeDone(ctx context.Context, call Call, l *Lease, err error) {
	if o := c.obs; o.CallDone != nil {
		o.CallDone(ctx, call, CallResult{Lease: l, Err: err})
	}
}

// observeEnd tells the Client's observer that lease l ended with err.
func (l *Lease) observeEnd(err error) {
	if o := l.ref.c.obs; o != nil && o.LeaseEnded != nil {
		o.LeaseEnded(LeaseEnd{Lease: l, Held: time.Since(l.start), Err: err})
	}
}

// observesRenewals reports whether the Client's observer hears renewals (the renewer builds
// their errors only then).
func (c *Client) observesRenewals() bool { return c.obs != nil && c.obs.Renewed != nil }

// observeRenewal tells the Client's observer how a renewal of h that took latency ended.
func (c *Client) observeRenewal(h *hold, latency time.Duration, err error) {
	c.obs.Renewed(Renewal{Lock: h.name, Server: c.serverAddr(), Latency: latency, Err: err})
}

// serverAddr is the address of the one Redis server the Client talks to, "" for a Cluster or
// a Sentinel group.
func (c *Client) serverAddr() string {
	if r, ok := c.rdb.(*redis.Client); ok && r.Options().Addr != "FailoverClient" {
		return r.Options().Addr
	}
	return ""
}

// logLost warns the Client's logger of a lost lease of lock name with token, once per Redis
// hold lost (not per lease sharing it), unless it was a fixed lease running out (its
// documented end, not a fault).
func (c *Client) logLost(name string, token uint64, err error) {
	if errors.Is(err, ErrLeaseLost) && !errors.Is(err, errFixedLeaseOver) {
		c.log.Warn("dlock: lease lost", "lock", name, "token", token, "err", err)
	}
}

// Outcome names the outcome of a call, a lease's end or a renewal by its error, for metrics
// and traces (the adapters label with it): "ok" (nil), "not_obtained" (taken by another owner,
// or the caller's context ended first), "not_held" (Unlock or Extend of a lease that had
// ended), "expired" (a WithFixedLease lease that ran out its TTL, as it should), "lost" (a
// lease lost, a renewal Redis refused), "not_replicated" (the replicas did
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
	case errors.Is(err, errFixedLeaseOver):
		return "expired"
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

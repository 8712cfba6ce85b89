package dlock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

type leaseState int

const (
	leaseHeld leaseState = iota
	leaseReleasing
	leaseEnded
)

// A Lease is one hold of a lock, returned by the lock calls of Mutex, RWMutex (a read or a
// write lease), MultiLock (a lease on every member) and Semaphore (a lease on permits); a
// Lease made otherwise (the zero Lease) is not one and must not be used. It stays valid until Unlock or until
// it is lost; Done tells which moment that is.
//
// A Lease is safe for concurrent use. Work protected by the lock should stop when Done closes
// (or, equivalently, when Context is cancelled): from then on another owner may hold the lock.
// Resources that must never see a stale holder should also check Token (see FencedSet).
//
// The methods of a nil *Lease report ErrNotHeld (Unlock, Extend, Err), return a closed Done
// channel and a cancelled Context, so `defer l.Unlock(ctx)` before the error check is safe.
type Lease struct {
	ref    lockRef
	hd     *holding
	token  uint64
	done   chan struct{}
	lockCx context.Context // the ctx given to Lock: Context keeps its values
	start  time.Time       // when it was handed out (for an Observer)
	unseen bool            // given back before its lock call returned it: no Observer hears of it

	mu       sync.Mutex
	state    leaseState
	err      error
	unlocked bool    // Unlock reached Redis (or found the lease lost)
	retry    []*hold // holds whose release failed: a later Unlock runs them again
	released int     // holds of a lease over several whose release Redis confirmed
	ctx      context.Context
	cancel   context.CancelCauseFunc
}

// A holding is one caller's possession of a lock: the lease Lock returned and its re-entries
// through Lease.Context share it and its token; the lock is let go when the last of them
// unlocks, and all of them end when the hold behind them is lost.
type holding struct {
	h     *hold
	more  []*hold // a MultiLock's or a Redlock's other holds (h is the first)
	multi bool    // a MultiLock's holding (even of one member): never re-entered
	// need is how many of the holds must be held for the holding to be: all of them (a
	// MultiLock's members), or a quorum of a Redlock's masters.
	need  int
	owner string // a Redlock's: the call's owner id (a master's hold may have it in a later epoch)
	co    sharer // non-nil when h is a Client's hold shared by its goroutines (the sharer's)
	token uint64

	mu     sync.Mutex
	leases []*Lease // held leases, the first one first; empty once let go or ended
	ended  bool
	err    error // why end ended it (the error of the hold whose end did)
}

// A sharer passes one Redis hold of its Client among local holders: a Mutex's cohort (one
// holder after the other, cohort.go) or a read share (readers at once, readshare.go). It ends
// their holdings when the hold ends, and lets the hold go when its last holder unlocks.
type sharer interface {
	// unlock lets go of l's holding, whose last lease l was (already taken out of it).
	unlock(ctx context.Context, l *Lease) error
}

// newHolding returns a holding of h (and, for a MultiLock, more) with token, which needs all
// of them. For plain holds (co nil) it ends with the first of them to end; a sharer ends its
// holdings itself.
func newHolding(h *hold, co sharer, token uint64, more ...*hold) *holding {
	return startHolding(&holding{h: h, more: more, co: co, token: token, need: 1 + len(more)})
}

// newQuorumHolding returns the holding of a Redlock lease: hs, one hold per master that
// granted it (at least need of them), with token. It ends once fewer than need are held.
func newQuorumHolding(hs []*hold, need int, token uint64) *holding {
	return startHolding(&holding{h: hs[0], more: hs[1:], token: token, need: need})
}

func startHolding(hd *holding) *holding {
	if hd.co == nil {
		for _, x := range hd.holds() {
			if ended, err := x.setOnEnd(hd.holdEnded); ended {
				hd.holdEnded(err)
			}
		}
	}
	return hd
}

// holdEnded runs when one of the holding's holds ended other than by a release (lost, or
// the Client closed): the holding ends with err once fewer than need of its holds are held.
func (hd *holding) holdEnded(err error) {
	held := 0
	for _, x := range hd.holds() {
		if x.isHeld() {
			held++
		}
	}
	if held < hd.need {
		hd.end(err, true)
	}
}

// holds returns every hold of the holding.
func (hd *holding) holds() []*hold { return append([]*hold{hd.h}, hd.more...) }

// lossErr is why the holding ended: the error it ended with, else that of the first of its
// holds no longer held, else a generic loss of its first hold (for a caller that knows it
// ended).
func (hd *holding) lossErr() error {
	hd.mu.Lock()
	err := hd.err
	hd.mu.Unlock()
	if err != nil {
		return err
	}
	for _, x := range hd.holds() {
		if !x.isHeld() {
			return x.lossErr()
		}
	}
	return hd.h.lossErr()
}

// valid reports whether at least need of the holds are certainly held.
func (hd *holding) valid() bool {
	n := 0
	for _, x := range hd.holds() {
		if x.valid() {
			n++
		}
	}
	return n >= hd.need
}

// remaining is how long at least need of the holds are certainly held: the least remaining
// time of all of them when all are needed, the need-th longest for a quorum.
func (hd *holding) remaining() time.Duration {
	if len(hd.more) == 0 {
		return hd.h.remaining()
	}
	ds := make([]time.Duration, 0, 1+len(hd.more))
	for _, x := range hd.holds() {
		ds = append(ds, x.remaining())
	}
	slices.Sort(ds)
	return ds[len(ds)-hd.need]
}

// newLease returns a lease of holding hd, taken through ref with ctx.
func newLease(ctx context.Context, ref lockRef, hd *holding) *Lease {
	l := &Lease{ref: ref, hd: hd, token: hd.token, done: make(chan struct{}), lockCx: ctx}
	if ref.c.obs != nil {
		l.start = time.Now()
	}
	return l
}

// first returns the holding's first lease, taken through ref with ctx. A holding ended in between
// (lost the moment it was taken) gives a lease that has ended too.
func (hd *holding) first(ctx context.Context, ref lockRef) *Lease {
	l := newLease(ctx, ref, hd)
	hd.mu.Lock()
	ended := hd.ended
	if !ended {
		hd.leases = append(hd.leases, l)
	}
	hd.mu.Unlock()
	if ended {
		l.finish(hd.lossErr(), false)
	}
	return l
}

// reenter adds a lease to a holding that is still held (a Lock given the lease's context),
// taken with access a: a read lease inside a write lease, never a write lease inside a read
// lease (ErrInvalid), and a mutex never inside a read-write lock or the reverse.
func (hd *holding) reenter(ctx context.Context, ref lockRef, a access) (*Lease, error) {
	if hd.multi {
		return nil, fmt.Errorf("%w: lock %q: the context holds it through a MultiLock, which is not re-entered", ErrInvalid, ref.name)
	}
	if why := hd.h.access.reentry(a); why != "" {
		return nil, fmt.Errorf("%w: lock %q: %s", ErrInvalid, ref.name, why)
	}
	hd.mu.Lock()
	defer hd.mu.Unlock()
	if hd.ended || len(hd.leases) == 0 || !hd.valid() {
		return nil, notObtained(ref.name, fmt.Errorf("the lease of the context has ended"))
	}
	l := newLease(ctx, ref, hd)
	hd.leases = append(hd.leases, l)
	return l, nil
}

// end ends every lease of the holding with err (the hold was lost, or the Client closed). It
// reports whether the holding had leases it ended (it was not ended or let go before); with
// warn set it then warns the Client's logger of a loss first (once per Redis hold: a sharer
// warns for the first of its holdings only).
func (hd *holding) end(err error, warn bool) bool {
	hd.mu.Lock()
	leases, was := hd.leases, hd.ended
	hd.leases, hd.ended = nil, true
	if hd.err == nil {
		hd.err = err
	}
	hd.mu.Unlock()
	ended := !was && len(leases) > 0
	if ended && warn {
		hd.h.c.logLost(leases[0].ref.name, hd.token, err)
	}
	for _, l := range leases {
		l.finish(err, false)
	}
	hd.lostMember()
	return ended
}

// drop takes l out of the holding and reports whether it was the last lease, which lets the
// lock go. It reports held false when the holding had ended (the lease with it).
func (hd *holding) drop(l *Lease) (held, last bool) {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	i := slices.Index(hd.leases, l)
	if i < 0 {
		return false, false
	}
	hd.leases = slices.Delete(hd.leases, i, i+1)
	if len(hd.leases) == 0 {
		hd.ended = true // no re-entry into a holding that is being let go
		return true, true
	}
	return true, false
}

// Token returns the lease's fencing token. Tokens of one lock strictly increase with every
// acquisition, whoever the owner and whichever process; re-entrant leases share their outer
// lease's token. Tokens are large numbers (at least the Redis server's clock in microseconds,
// so they survive a restart that lost the counter) and not consecutive. Pass it to the
// protected resource so it can refuse writes from an older holder. A nil Lease has token 0,
// and so does a MultiLock lease (see Tokens).
func (l *Lease) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.token
}

// Tokens returns the fencing token of every lock the lease holds, by name: one for a Mutex or
// RWMutex lease, one per member for a MultiLock lease (whose Token is 0: its members' tokens
// are unrelated counters). A nil Lease has none.
func (l *Lease) Tokens() map[string]uint64 {
	if l == nil {
		return nil
	}
	if !l.hd.multi {
		return map[string]uint64{l.ref.name: l.token}
	}
	m := make(map[string]uint64, 1+len(l.hd.more))
	for _, h := range l.hd.holds() {
		m[h.name] = h.token
	}
	return m
}

// Name returns the name of the lock this lease holds, the members' names joined by commas for
// a MultiLock lease ("" for a nil Lease).
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	return l.ref.name
}

// Owner returns the owner id the lease's hold has in Redis: the handle's WithOwner id, an id
// made for this lease (a handle without WithOwner), or the id of the Redis hold its Client's
// cohort passes among its goroutines (cohorting: the Client's id, or under NewRedlock an id
// of each hold's own). Inspect and `dlock status` show the same id while the lease holds.
func (l *Lease) Owner() string {
	if l == nil {
		return ""
	}
	if l.hd.owner != "" {
		return l.hd.owner
	}
	return l.hd.h.owner
}

// Done returns a channel that is closed when the lease ends: released by Unlock, lost, or
// ended by Client.Close. Err then tells which. A nil Lease's channel is closed.
func (l *Lease) Done() <-chan struct{} {
	if l == nil {
		return closedChan
	}
	return l.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lease is held and after a successful Unlock. Once the lease was
// lost it returns an error matching ErrLeaseLost that wraps the cause (key deleted or expired,
// taken by another owner, renewal refused, or no successful renewal before the safe deadline);
// after Client.Close it returns ErrClosed. A nil Lease reports ErrNotHeld.
func (l *Lease) Err() error {
	if l == nil {
		return ErrNotHeld
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a context for the work the lease protects. It carries the values of the ctx
// given to Lock but not its cancellation or deadline, and is cancelled when the lease ends:
// with context.Cause = Err() when the lease was lost or the Client closed, context.Canceled
// after Unlock. Given to Lock or TryLock of the same lock on the same Client (directly or
// through a derived context), it re-enters the lease. A nil Lease's context is cancelled.
func (l *Lease) Context() context.Context {
	if l == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrNotHeld)
		return ctx
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		base := context.WithoutCancel(l.lockCx)
		for _, h := range l.hd.holds() { // every lock the lease holds: a MultiLock's members too
			base = context.WithValue(base, reentryKey{l.ref.c, h.keys.lock}, l.hd)
		}
		l.ctx, l.cancel = context.WithCancelCause(base)
		if l.state == leaseEnded {
			l.cancel(l.err)
		}
	}
	return l.ctx
}

// reentryKey finds, in a context, the holding a Lock on this Client and lock re-enters.
type reentryKey struct {
	c    *Client
	lock string
}

// reentered returns the holding a Lock through ref re-enters with ctx, if any.
func reentered(ctx context.Context, ref lockRef) *holding {
	if ctx == nil {
		return nil // refused by lockWith
	}
	hd, _ := ctx.Value(reentryKey{ref.c, ref.lock}).(*holding)
	return hd
}

// A lockRef names a lock as its leases see it: the Client, the lock's name and its key (which
// re-entry through a lease's context is matched on).
type lockRef struct {
	c    *Client
	name string
	lock string
}

// Remaining returns how long the lease is certainly still held: its safe deadline (the send
// time of the acquire, of the latest Extend or of the renewal before the latest one, + TTL ×
// (1 − drift); between 1/2 and 3/4 of the TTL while renewals succeed, except that a lease a
// release handed over holds the grant's TTL, at most half a second, until its first renewal a
// quarter of a second later) minus now, or 0 once the lease has ended or the deadline has
// passed. A holder about to start a write that must finish under
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
	return l.hd.remaining()
}

// TTL returns the lease's current TTL: the one it was acquired with or last extended to (0
// for a nil Lease).
func (l *Lease) TTL() time.Duration {
	if l == nil {
		return 0
	}
	// The need-th longest of the held holds' (a Redlock master that missed an Extend lags; an
	// Extend that reached fewer than a quorum did not extend the lease).
	var ttls []time.Duration
	for _, h := range l.hd.holds() {
		h.mu.Lock()
		if h.state == holdHeld {
			ttls = append(ttls, h.ttl)
		}
		h.mu.Unlock()
	}
	if len(ttls) < l.hd.need {
		l.hd.h.mu.Lock()
		defer l.hd.h.mu.Unlock()
		return l.hd.h.ttl
	}
	slices.Sort(ttls)
	return ttls[len(ttls)-l.hd.need]
}

// Extend makes the lock's TTL in Redis at least ttl from now, if the lease is still held;
// later watchdog renewals use ttl. It never shortens the TTL in Redis (another hold of the same
// owner may rely on it), nor the lease's safe deadline, which becomes at least
// send time + ttl × (1 − drift). If the owner no longer holds the lock the lease ends as lost
// and Extend returns an error matching ErrNotHeld and ErrLeaseLost. A Redis error (matching
// ErrUnavailable when Redis gave no answer) leaves the lease unchanged and is returned; a ttl
// under a millisecond or a nil ctx is ErrInvalid.
//
// Unlike a watchdog renewal, which counts only once the next one succeeded, an Extend counts at
// once: if the master dies, or turns out to have been demoted, before its replica got the
// Extend, the promoted replica expires the key by the earlier TTL while the lease still runs.
// Fence what matters, or let the watchdog renew (the default) rather than Extend a fixed lease.
// Under WithReplicaAck (or WithReplicaAckAOF) an Extend the replicas did not acknowledge
// returns ErrNotReplicated (ErrInvalid when the server cannot answer WAITAOF) and leaves the
// lease's deadline as it was (the TTL in Redis may have grown).
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return fmt.Errorf("%w: Extend of a nil Lease", ErrNotHeld)
	}
	if ctx == nil {
		return nilContext("extend", l.ref.name)
	}
	if ttl < minTTL {
		return fmt.Errorf("%w: extend TTL %v: must be at least %v", ErrInvalid, ttl, minTTL)
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	ttl = ttl.Truncate(time.Millisecond)
	hs := l.hd.holds()
	// At once: a MultiLock's members and a Redlock's masters are apart. It returns as soon as
	// the outcome is known, so a silent Redlock master does not hold up a quorum's answer (its
	// call goes on in the background).
	results := make(chan error, len(hs))
	var errs []error
	running := 0
	for _, h := range hs {
		switch {
		case !h.isHeld():
			errs = append(errs, h.lossErr()) // a Redlock master lost while the quorum holds
		case !h.c.goBackground():
			errs = append(errs, fmt.Errorf("%w: lock %q", ErrClosed, h.name))
		default:
			running++
			go func() {
				defer h.c.wg.Done()
				// Close waits for this goroutine: its cut of the clean-up ends the call.
				ectx, cancel := context.WithCancel(ctx)
				defer cancel()
				stop := context.AfterFunc(h.c.cleanup, cancel)
				defer stop()
				results <- h.extend(ectx, ttl)
			}()
		}
	}
	ok := 0
	quorum := l.hd.need < len(hs) // a Redlock's: stop waiting once the outcome is known
	for ; running > 0 && (!quorum || ok < l.hd.need && len(errs) <= len(hs)-l.hd.need); running-- {
		if err := <-results; err != nil {
			errs = append(errs, err)
		} else {
			ok++
		}
	}
	if herr := l.heldErr(); herr != nil {
		return herr
	}
	if ok >= l.hd.need {
		return nil
	}
	return join(errs...)
}

// Unlock releases this lease. When it was the last lease of its holding (re-entries through
// Context count) the lock goes to the next waiter (in this process first, within a bounded
// batch, then in Redis's queue) or is freed.
//
// Unlock returns an error matching ErrNotHeld when the lease had already been lost (the error
// also matches ErrLeaseLost), was already unlocked, or is nil. If Redis gives no answer, Unlock
// returns that error (matching ErrUnavailable) and ends the lease locally (renewal stops, Done
// closes); dlock keeps retrying the release in the background until Redis answers or the
// lock's TTL has run out, and calling Unlock again retries it at once. A release is applied at
// most once even when an earlier attempt succeeded but its reply was lost. A nil ctx is taken
// as context.Background, as Close takes it.
func (l *Lease) Unlock(ctx context.Context) error {
	if l == nil {
		return fmt.Errorf("%w: Unlock of a nil Lease", ErrNotHeld)
	}
	if ctx == nil {
		ctx = context.Background() // as Close: a `defer l.Unlock(nil)` must not keep the lock
	}
	c := l.ref.c
	if c.obs == nil {
		return l.unlock(ctx)
	}
	kind, _ := callKind(l.hd.h.access, l.hd.multi, true)
	call := Call{Method: "Unlock", Kind: kind, Name: l.ref.name}
	ctx = c.startUnlock(ctx, &call, l)
	err := l.unlock(ctx)
	c.observeDone(ctx, call, l, err)
	return err
}

// startUnlock is observeStart for Unlock: a CallStart that panics (or calls runtime.Goexit)
// goes up the caller's goroutine after the lease is unlocked, unobserved, not with the lock
// kept and renewed.
func (c *Client) startUnlock(ctx context.Context, call *Call, l *Lease) context.Context {
	told := false
	defer func() {
		if !told {
			_ = l.unlock(ctx)
		}
	}()
	octx := c.observeStart(ctx, call)
	told = true
	return octx
}

// giveBackUnseen unlocks a lease its lock call will not return (the caller's ctx ended, or a
// waiter gave up as it was granted): the Observer hears nothing of it.
func (l *Lease) giveBackUnseen(ctx context.Context) error {
	l.mu.Lock()
	l.unseen = true
	l.mu.Unlock()
	return l.unlock(ctx)
}

// unlock is Unlock's work, unobserved.
func (l *Lease) unlock(ctx context.Context) error {
	l.mu.Lock()
	state, unlocked, lostErr, retry := l.state, l.unlocked, l.err, l.retry
	if state == leaseHeld {
		l.state = leaseReleasing
	}
	l.mu.Unlock()
	switch {
	case state == leaseReleasing:
		return fmt.Errorf("%w: %q: Unlock already in progress", ErrNotHeld, l.ref.name)
	case unlocked:
		return fmt.Errorf("%w: %q: already unlocked", ErrNotHeld, l.ref.name)
	case lostErr != nil:
		return fmt.Errorf("%w: %w", ErrNotHeld, lostErr)
	case len(retry) > 0 && len(l.hd.more) > 0:
		return l.releaseMembers(ctx, retry, nil)
	case len(retry) > 0:
		return l.finishRelease(ctx, retry[0])
	case state != leaseHeld:
		return fmt.Errorf("%w: %q: already unlocked", ErrNotHeld, l.ref.name)
	}
	held, last := l.hd.drop(l)
	switch {
	case !held: // the holding ended (lost, closed) while we got here
		l.finish(l.hd.lossErr(), true)
		return l.heldErr()
	case !last: // other leases of the holding still hold the lock
		l.finish(nil, true)
		return nil
	case l.hd.co != nil:
		return l.hd.co.unlock(ctx, l)
	case len(l.hd.more) > 0:
		return l.unlockAll(ctx)
	case !l.hd.h.beginRelease():
		// Lost while we got here: end the lease with the hold's loss even if the hold's own
		// notice has not reached it yet.
		l.finish(l.hd.h.lossErr(), true)
		return l.heldErr()
	}
	return l.finishRelease(ctx, l.hd.h)
}

// finishRelease runs h's release script and ends h and the lease according to its answer.
func (l *Lease) finishRelease(ctx context.Context, h *hold) error {
	n, err := h.release(ctx)
	if err != nil {
		h.end(nil, false)
		h.releaseLater() // until Redis answers or the TTL has run out
		l.mu.Lock()
		l.retry = []*hold{h}
		l.mu.Unlock()
		l.finish(nil, false) // ended locally; a later Unlock retries the release at once
		return fmt.Errorf("%w (dlock retries the release in the background; the lock expires within its TTL otherwise)", redisErr("unlock", l.ref.name, err))
	}
	if n == 0 {
		lost := leaseLost(l.ref.name, errKeyGone)
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
		return fmt.Errorf("%w: %q: already unlocked", ErrNotHeld, l.ref.name)
	}
}

// finish ends the lease once: records why, closes Done and cancels Context.
func (l *Lease) finish(err error, unlocked bool) {
	l.mu.Lock()
	if unlocked {
		l.unlocked, l.retry = true, nil
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
	cancel, unseen := l.cancel, l.unseen
	l.mu.Unlock()
	if unlocked && err != nil {
		// Unlock found the hold gone (the loss was not told before): the work under the lease
		// may have overlapped another holder's. Only the last lease of a holding gets here.
		l.ref.c.logLost(l.ref.name, l.token, err)
	}
	close(l.done)
	if cancel != nil {
		cancel(err)
	}
	if !unseen {
		l.observeEnd(err)
	}
}

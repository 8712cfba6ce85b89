package dlock

import (
	"context"
	"fmt"
	"strconv"
)

// A Semaphore is a handle on one named counting semaphore: at most Permits permits are out at
// once, across every process, each Acquire taking n of them under a lease. It is Redisson's
// RPermitExpirableSemaphore rather than its RSemaphore: permits are leased, so those of a holder
// that dies come back when its lease's TTL runs out, never later, and a holder that pauses past
// its TTL learns it through Done. It is cheap to create, holds no Redis state and is safe for
// concurrent use.
//
// The number of permits is stored with the semaphore while it has holders (as a lock, an idle
// semaphore leaves nothing in Redis, and the next handle to take it sets the number): a handle
// naming another number while it is held gets ErrInvalid from Acquire and TryAcquire.
//
// Waiting is fair, in one FIFO queue in Redis: a waiter is admitted when it is first in line
// and its permits fit, so a request for many permits is never overtaken by later small ones
// that would fit before it (the small ones wait behind it; a Java-style "barging" semaphore
// would starve it). As for a Mutex, an Acquire may take permits ahead of a first waiter that
// has waited under a few milliseconds only when the semaphore is free (barging, bounded).
// Waiters are woken by push when a release admits them, and only those admitted.
//
// Each lease is a Redis hold of its own (an owner id of its own): there is no re-entry, and
// Acquire given a held lease's context takes more permits. By default the Acquires of one
// Client that take the same number of permits form a cohort, as a Mutex's Locks do: the
// Client takes a hold of n permits in Redis (under an owner id made from its own, one per
// hold) and, when its holder gives it back while another goroutine of the Client waits for n
// permits, hands the hold to that goroutine without a round trip, a bounded batch at a time
// (at most 5 ms after the hold was taken; then it goes back to the Redis queue). The Client
// has as many such holds at once as the semaphore lets it. A handle made WithOwner or
// WithoutCohort takes every lease in Redis under an owner id made from the handle's (see
// Owner).
// The lease's fencing token is that of the semaphore's busy period: every lease admitted while
// the semaphore stayed held shares it, and it is above every token of a lease that ended
// before the semaphore was last free (as the readers of one read phase share theirs).
//
// A name is a semaphore, a Mutex or an RWMutex, not two of them: a call of one kind on a name
// held as another returns ErrInvalid.
type Semaphore struct {
	c       *Client
	name    string
	keys    keys
	cfg     config
	permits int
	cohort  string // the key of the Client's cohorts serving this handle, without the size ("" when not cohorting)
	err     error  // invalid name, count or option, reported by every call

	ids ownerIDs
}

// MaxPermits is the most permits a Semaphore may have (counts are exact integers in Redis's
// Lua scripts far beyond it).
const MaxPermits = 1 << 30

// Semaphore returns a handle on the semaphore called name with permits permits. An invalid
// name, a count outside 1..MaxPermits or an invalid option is reported by the handle's calls
// as ErrInvalid; Semaphore itself never fails.
func (c *Client) Semaphore(name string, permits int, opts ...Option) *Semaphore {
	s := &Semaphore{c: c, name: name, cfg: c.cfg.apply(opts), permits: permits}
	s.ids.init(s.cfg)
	var perr error
	if permits < 1 || permits > MaxPermits {
		perr = fmt.Errorf("%w: semaphore %q: %d permits: must be 1 to %d", ErrInvalid, name, permits, MaxPermits)
	}
	s.err = join(c.unsupported("Semaphore"), c.err, validateName(name), perr, s.cfg.validate())
	s.keys = lockKeys(s.cfg.keyPrefix(), name)
	if !s.cfg.ownerSet && !s.cfg.noCohort {
		s.cohort = s.keys.lock + cohortVariant(s.cfg) + "#s" + strconv.Itoa(permits)
	}
	return s
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns the number of permits the handle was made with.
func (s *Semaphore) Permits() int { return s.permits }

// Owner returns the handle's owner id: the WithOwner id, or a random 128-bit one made on first
// use. A handle made WithOwner or WithoutCohort holds each lease under an owner id of its own
// made from it (Lease.Owner), since two acquisitions are never one hold; a cohort's leases
// have owner ids made from the Client's.
func (s *Semaphore) Owner() string { return s.ids.handle() }

// Acquire takes n permits (1 ≤ n ≤ Permits), waiting as long as ctx allows, behind every
// caller already waiting. The lease holds the n permits until Unlock gives them back, or until
// it is lost (Done, Err). With cohorting, Unlock gives them to a goroutine of the Client that
// waits for n permits while the hold's batch allows; a hold the Client had to wait for may
// stay with it up to half a millisecond after its last holder left (Available counts it), for
// a goroutine that acquires again at once. Errors are those of Mutex.Lock, and ErrInvalid for a bad n, for a
// semaphore held with another number of permits, or for a name held as a lock.
func (s *Semaphore) Acquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, true)
}

// TryAcquire makes one attempt to take n permits: it succeeds when nobody waits and n of them
// are free, or (cohorting) when its Client keeps a hold of n permits that a holder of its own
// just gave back (a hold it had waited for lingers half a millisecond for a goroutine that
// acquires again, even while other processes wait: see Unlock). Errors are those of
// Mutex.TryLock (ErrNotObtained when too few permits are free or others wait), and ErrInvalid
// as for Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, false)
}

func (s *Semaphore) acquire(ctx context.Context, n int, wait bool) (*Lease, error) {
	bad := s.err
	if bad == nil && (n < 1 || n > s.permits) {
		bad = fmt.Errorf("%w: semaphore %q: cannot take %d permits of %d", ErrInvalid, s.name, n, s.permits)
	}
	ref := lockRef{c: s.c, name: s.name} // no lock key: never re-entered
	return s.c.lockWith(ctx, ref, accessPermits, wait, bad, func(ctx context.Context) (*Lease, error) {
		if s.cohort != "" {
			key := s.cohort + ":" + strconv.Itoa(n)
			return s.c.cohortLock(ctx, key, func() *cohort { return s.newCohort(key, n) }, ref, wait)
		}
		return s.c.plainLease(ctx, ref, s.holdSpec(s.ids.unique(s.c), n), wait)
	})
}

// holdSpec is a hold of n permits under owner.
func (s *Semaphore) holdSpec(owner string, n int) holdSpec {
	return holdSpec{name: s.name, keys: s.keys, cfg: s.cfg, owner: owner, access: accessPermits,
		sem: semSpec{permits: s.permits, n: n}}
}

// newCohort makes the Client's cohort called key, for the handle's Acquires of n permits: it
// may have as many holds at once as the semaphore has room for.
func (s *Semaphore) newCohort(key string, n int) *cohort {
	return &cohort{c: s.c, key: key, base: s.c.id + cohortVariant(s.cfg), permits: true, fresh: true,
		maxSlots: s.permits / n, spec: s.holdSpec("", n)}
}

// Available returns how many permits are free now: Permits minus those held (by leases not
// yet known to have ended: a dead holder's permits count until its TTL runs out and a script
// meets the semaphore), or Permits when the semaphore has no state in Redis. It is a snapshot
// and may be wrong the moment after. It returns ErrInvalid for a bad handle, for a semaphore
// held with another number of permits or a name held as a lock, ErrIncompatible for a
// semaphore of another dlock version, and the Redis error (matching
// ErrUnavailable when Redis gave no answer) if the read fails.
func (s *Semaphore) Available(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, nilContext("read semaphore", s.name)
	}
	if s.err != nil {
		return 0, s.err
	}
	f, exists, err := s.c.stateOf(ctx, "read semaphore", s.name, s.keys.lock, "sem", "#n", "#u")
	switch {
	case err != nil:
		return 0, err
	case !exists:
		return s.permits, nil // no state: every permit is free
	}
	total, _ := strconv.Atoi(str(f[2]))
	used, _ := strconv.Atoi(str(f[3]))
	if total != s.permits {
		return 0, fmt.Errorf("%w: semaphore %q has %d permits, not %d", ErrInvalid, s.name, total, s.permits)
	}
	return max(total-used, 0), nil
}

// str returns v as a string ("" for nil or another type): a field of an HMGET reply.
func str(v any) string {
	s, _ := v.(string)
	return s
}

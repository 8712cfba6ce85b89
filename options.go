package dlock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults for the options below.
const (
	// DefaultTTL is the lease TTL when WithTTL is not given (Redisson's watchdog default).
	DefaultTTL = 30 * time.Second
	// DefaultKeyPrefix starts every key and channel dlock writes when WithKeyPrefix is not given.
	DefaultKeyPrefix = "dlock:"
	// DefaultDrift is the fraction of the TTL a lease gives up locally to cover clock-rate
	// differences between this process and Redis (Redlock's factor).
	DefaultDrift = 0.01

	minTTL       = time.Millisecond
	maxNameLen   = 1024
	maxOwnerLen  = 256
	maxPrefixLen = 256
	queueTTL     = time.Minute // a lock's queue keys vanish this long after the last waiter's refresh
	// A caller outside the queue may take a free lock ahead of a first waiter that has waited
	// less than bargeWindow (bounded barging, as in sync.Mutex): a process that releases and
	// re-locks at once keeps going instead of paying a cross-process hand-off each time, and
	// no waiter waits longer than bargeWindow for it.
	bargeWindow    = 4 * time.Millisecond
	minRenewPeriod = time.Millisecond
)

// opLogTTL is how long a retried acquire or release is recognised, and so how long a lock's
// op log outlives its last use. A variable so tests can shorten it.
var opLogTTL = time.Minute

// A waiter not heard from for livenessWindow is skipped by the FIFO; live waiters refresh
// their entry every livenessRefresh. A lock granted to a waiter keeps grantGrace as TTL until
// the waiter's first renewal (or, for a waiter of an older dlock, its confirming acquire).
// Together they bound how long a killed waiter can stall a lock, and so how long a live one
// may be paused before it loses its place. Variables so tests of the FIFO's order can outlast
// the pauses of a loaded machine (SetWaitWindows).
var (
	livenessWindow  = 750 * time.Millisecond
	livenessRefresh = 250 * time.Millisecond
	grantGrace      = 500 * time.Millisecond
)

// An Option configures a Client (the default for all its mutexes) or a single Mutex.
// Options given to Client.Mutex override those given to New.
type Option func(*config)

// config is what options set. The zero value of each field means "use the default".
type config struct {
	ttl        time.Duration // default: DefaultTTL
	ttlSet     bool
	prefix     *string // default: DefaultKeyPrefix
	owner      string  // default: a random 128-bit id per Mutex handle
	ownerSet   bool
	drift      *float64         // default: DefaultDrift
	fixedLease bool             // default: false (watchdog renewal on)
	noCohort   bool             // default: false (cohorting on, unless WithOwner is given)
	clock      func() time.Time // default: time.Now (a Client option only)
	logger     *slog.Logger     // default: discard (a Client option only)
	ack        replicaAck       // default: off (WithReplicaAck)
	observer   *Observer        // default: none (a Client option only)
	runner     ScriptRunner     // default: none, go-redis runs the scripts (a Client option only)
	runnerSet  bool
	onGoRedis  bool // tests only (export_test.go): never the suite's runner (testRunner)
}

// WithTTL sets the lease TTL. With renewal on (the default) the lease is renewed every TTL/4
// while held, so the TTL bounds how long a crashed holder blocks others; with WithFixedLease it
// is the whole lease. It must be at least 1ms; otherwise Lock and TryLock return ErrInvalid.
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl, c.ttlSet = ttl, true } }

// WithKeyPrefix sets the prefix of every key and channel dlock uses (default "dlock:"). All
// processes sharing a lock must use the same prefix. It must not contain '{' or '}', which
// would break the hash tag that keeps a lock's keys in one Redis Cluster slot.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.prefix = &prefix } }

// WithOwner sets the owner id instead of a random one. Handles with the same owner id, in one
// process or several, are the same owner: they re-enter each other's holds and must each
// Unlock. Use it for an identity that outlives a process (a job id, a host name). It must be
// non-empty, at most 256 bytes, and not start with '#', "r:" or "w:" (dlock's own fields and
// queue entries of read-write locks). Handles of an RWMutex sharing the id re-enter each
// other's read hold even while a writer waits, as Redisson's read locks do.
func WithOwner(id string) Option { return func(c *config) { c.owner, c.ownerSet = id, true } }

// WithDrift sets the fraction of the TTL a lease gives up locally for clock drift
// (default 0.01): a lease counts as lost at send time + TTL × (1 − drift) unless renewed.
// It must be in [0, 0.5).
func WithDrift(f float64) Option { return func(c *config) { c.drift = &f } }

// WithFixedLease turns the watchdog off: the lease lasts exactly its TTL from the acquire
// unless Lease.Extend is called, and then ends (Done closes, Err reports ErrLeaseLost).
func WithFixedLease() Option { return func(c *config) { c.fixedLease = true } }

// WithoutCohort turns cohorting off: every Lock (or a Semaphore's Acquire) of a handle waits in
// the Redis queue on its own instead of being handed the lock (or the permits) by the
// Client's other goroutines; an RWMutex's readers then share no read hold. Handles with
// WithOwner never cohort, since their owner id must reach Redis.
func WithoutCohort() Option { return func(c *config) { c.noCohort = true } }

// WithClock makes the Client read the time from now instead of time.Now. It exists for tests
// that inject clock faults. dlock only ever compares two readings of the clock (a deadline is
// a reading plus a duration, checked against a later reading; timers wait for the difference),
// so with readings that carry Go's monotonic clock, as time.Now's do, a step of the wall clock
// (NTP, a manual date change) moves no deadline; a now whose readings lack it (Round(0),
// time.Unix) makes dlock follow the wall clock, which is unsafe. A nil now means time.Now. It
// is a Client option: given to Client.Mutex it has no effect.
func WithClock(now func() time.Time) Option { return func(c *config) { c.clock = now } }

// WithLogger makes the Client report what it cannot fix itself to logger: a lease lost (a
// warning per Redis hold lost, however many leases shared it; a fixed lease running out is not
// a loss), a missing permission that switches a feature off, a maxmemory-policy that may evict
// locks, a notification connection that keeps failing. Each condition but a lost lease is
// logged once when it starts (and once when it ends); nothing is logged per call. The default discards them. It is a Client option: given to Client.Mutex it has no
// effect. For metrics and traces see WithObserver.
func WithLogger(logger *slog.Logger) Option { return func(c *config) { c.logger = logger } }

func (c config) apply(opts []Option) config {
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// leaseTTL is the TTL as Redis gets it, in whole milliseconds, so the local deadline never
// counts on a fraction Redis did not grant.
func (c config) leaseTTL() time.Duration {
	if !c.ttlSet {
		return DefaultTTL
	}
	return c.ttl.Truncate(time.Millisecond)
}

func (c config) keyPrefix() string {
	if c.prefix == nil {
		return DefaultKeyPrefix
	}
	return *c.prefix
}

func (c config) driftFactor() float64 {
	if c.drift == nil {
		return DefaultDrift
	}
	return *c.drift
}

// validate reports the first option that breaks its rule, as an ErrInvalid.
func (c config) validate() error {
	if c.ttlSet && c.ttl < minTTL {
		return fmt.Errorf("%w: TTL %v: must be at least %v", ErrInvalid, c.ttl, minTTL)
	}
	if p := c.keyPrefix(); len(p) > maxPrefixLen || strings.ContainsAny(p, "{}") {
		return fmt.Errorf("%w: key prefix %q: must be at most %d bytes without '{' or '}'", ErrInvalid, p, maxPrefixLen)
	}
	if c.ownerSet && (c.owner == "" || len(c.owner) > maxOwnerLen || c.owner[0] == '#' ||
		strings.HasPrefix(c.owner, "r:") || strings.HasPrefix(c.owner, "w:")) {
		return fmt.Errorf("%w: owner id %.40q: must be 1 to %d bytes, not starting with '#', \"r:\" or \"w:\"", ErrInvalid, c.owner, maxOwnerLen)
	}
	if d := c.driftFactor(); !(d >= 0 && d < 0.5) {
		return fmt.Errorf("%w: drift %v: must be in [0, 0.5)", ErrInvalid, d)
	}
	if c.runnerSet && isNilRunner(c.runner) {
		return fmt.Errorf("%w: nil ScriptRunner", ErrInvalid)
	}
	return c.ack.validate()
}

// validateName checks a lock name: non-empty, at most 1024 bytes.
func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty lock name", ErrInvalid)
	}
	if name[0] == '}' {
		// The key's hash tag would be empty, spreading the lock's keys over Cluster slots.
		return fmt.Errorf("%w: lock name %.40q: must not start with '}'", ErrInvalid, name)
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("%w: lock name of %d bytes: must be at most %d", ErrInvalid, len(name), maxNameLen)
	}
	return nil
}

// safeLease is how long after sending a command that set the TTL to ttl a lease counts as
// held: ttl × (1 − drift).
func (c config) safeLease(ttl time.Duration) time.Duration {
	return ttl - time.Duration(float64(ttl)*c.driftFactor())
}

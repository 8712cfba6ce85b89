// Package dlock provides distributed locks on Redis that are correct first: reentrant,
// fenced, renewed by a watchdog, and observable when lost.
//
// # Quick start
//
//	c := dlock.New(rdb)             // rdb: *redis.Client, failover or *redis.ClusterClient
//	defer c.Close(context.Background())
//
//	m := c.Mutex("orders:42")       // a cheap handle, shared by goroutines like a sync.Mutex
//	l, err := m.Lock(ctx)           // waits until held or ctx ends
//	if err != nil { ... }
//	defer l.Unlock(ctx)
//	work(l.Context())               // cancelled when the lease is lost (Cause: l.Err())
//	dlock.FencedSet(ctx, rdb, "stock:42", newStock, l.Token())
//
// # Semantics
//
// A lock is a Redis hash {owner: holdCount, hold ids, token, layout} with a TTL. Acquire,
// release and extend are one Lua script each, one round trip each. A Mutex excludes
// goroutines like a sync.Mutex; re-entry is explicit: Lock given the context of a held lease
// (Lease.Context) re-enters it with the same token, and each Lock needs its Unlock. Handles
// made WithOwner share an owner id and re-enter each other in Redis, across processes.
// Every fresh acquisition reserves a block of tokens from a per-lock counter:
// fencing tokens strictly increase across all owners, processes and goroutines. The counter
// never falls behind the Redis server's clock in microseconds, so tokens keep increasing even
// across a Redis restart that lost the counter, unless the server's clock steps back or one
// lock took more than 15,625 fresh Redis holds a second before it (each advances the counter
// by 64, cohort hand-offs by nothing), which puts the counter ahead of the clock.
//
// An RWMutex (Client.RWMutex) is a read-write lock with the same leases: RLock and TryRLock
// share it among readers, Lock and TryLock take it alone. Readers and writers wait in one FIFO
// in Redis: readers first in line are admitted together, and a waiting writer stops new
// readers, so neither side starves. A write lease's token is above every earlier lease's; the
// readers of one read phase share a token above every earlier writer's. RLock given a write
// lease's context re-enters it; Lock given a read lease's context fails with ErrInvalid (no
// upgrade). A name is either a Mutex or an RWMutex: the other kind gets ErrInvalid. Readers of
// one Client share a young Redis read hold while no writer waits (reader cohorting).
//
// A MultiLock (Client.MultiLock) takes several locks together, all or nothing, in any order of
// names, without deadlock among MultiLocks: it takes every free member in one pass (one script
// when the names share a hash slot), and when a member is taken gives the others back and
// waits in that member's queue; after one such wait and 2 ms it takes the members in name order. Its lease covers every member (Lease.Tokens gives each
// token) and is lost with any of them.
//
// A Semaphore (Client.Semaphore) gives out at most N permits at once, each Acquire(n) taking
// n of them under the same kind of lease: renewed, loss-detected, given back by Unlock or when
// the lease ends (a holder that dies gives its permits back within its TTL, never later).
// Waiters queue in one FIFO in Redis and are admitted first in line when their permits fit, so
// a large request is not overtaken by small ones; a release pushes exactly those it admits.
// Goroutines of one Client taking the same number of permits hand them to each other in
// bounded batches (cohorting, as for a Mutex). A
// Latch (Client.Latch) is a count-down latch: TrySetCount starts it, CountDown takes one off,
// Wait returns once it reaches zero (at once on a latch with no state), woken by push; an
// abandoned latch expires after its TTL (DefaultLatchTTL).
//
// Waiting is fair: goroutines of one Client queue locally and are handed the lock without a
// Redis round trip in bounded batches (cohorting); processes wait in a FIFO kept in Redis,
// where a release hands the lock to the next live waiter, writing the hold that waiter
// recorded, and wakes only it: the waiter's lease starts on the pushed message.
//
// While held, the Client's renewer extends every lease at TTL/4 (default TTL 30s). A lease is
// lost when its key is deleted, expires or is taken, which Redis pushes to the Client through
// client-side-caching invalidations (no server configuration needed), or when no renewal
// succeeded by the lease's safe deadline: send time of the acquire, of an Extend, or of the
// renewal before the latest one (a failover can lose the latest) + TTL × (1 − drift), on the
// monotonic clock (for a lease a release granted: send time of the waiter's last attempt Redis
// answered before the grant + the grant's 500 ms TTL, until its first renewal, due within it).
// Then Done closes and Err wraps ErrLeaseLost.
//
// # Safety model
//
// Under bounded clock-rate drift between this process and Redis, and with a Redis that does
// not lose writes, the validity windows of two leases on one lock never overlap: a holder that
// watches Done stops before anyone else can acquire. A holder that cannot watch Done in time
// (a long GC or VM pause, a slow write already in flight) is not covered by any TTL lock; a
// resource that checks the fencing token (FencedSet) refuses its late writes. A Redis restart
// without persistence, or a failover to a replica that missed the write, can grant a lock
// twice: fencing still protects the resource, and docs/DESIGN.md explains the rest.
// WithReplicaAck narrows the second case: a lease is handed out only once replicas of the
// master acknowledged its write (ErrNotReplicated otherwise). NewRedlock narrows it
// further for Mutexes: a lease is held on a quorum of independent masters (on every one that
// answered), so another owner can take it only when masters lost the lease's writes on at
// least a quorum minus those the lease never held.
//
// # Errors
//
// Errors match the sentinels with errors.Is: ErrNotObtained (taken, or ctx ended while
// waiting, joined with ctx.Err()), ErrUnavailable (Redis gave no definite answer: down,
// failing over, loading; Lock waits it out), ErrNotHeld, ErrLeaseLost, ErrClosed, ErrInvalid,
// ErrIncompatible (a server before 7.0, a lock of another dlock version), ErrStaleToken and
// ErrNotReplicated (WithReplicaAck: too few replicas acknowledged; nothing is held).
// Other Redis errors are returned wrapped with the lock name. Errors print on one line.
//
// # Deployments
//
// dlock runs on a single Redis, Sentinel (a failover client) and Redis Cluster. Only a
// definite answer from the lock's current master ends a lease; failovers, restarts that kept
// their data and dead connections leave leases running until Redis answers or their safe
// deadline passes. dlock logs (WithLogger) what it cannot fix itself, such as a refused
// permission, an evicting maxmemory-policy or a lost lease; it never writes to stderr.
// WithObserver tells metrics and tracing code of every lock call, lease end and renewal.
// README.md shows the minimal ACL; docs/DESIGN.md what each failure does.
//
// WithScriptRunner runs the Lua scripts through another client library, the go-redis client
// keeping everything else: the dlockrueidis module runs them on rueidis (auto-pipelining).
package dlock

package dlock

import (
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// FixedLeaseOver is the loss of a fixed lease that ran out its TTL.
func FixedLeaseOver() error { return leaseLost("x", errFixedLeaseOver) }

// Tracked exposes, to tests only, the moment a lease's key is tracked for push loss detection.
func Tracked(l *Lease) <-chan struct{} { return l.hd.h.tracked }

// WatchedAt tells tests the address of the node whose notifier watches a lease's hold for
// loss ("" when none does).
func WatchedAt(l *Lease) string {
	h := l.hd.h
	h.mu.Lock()
	n := h.notif
	h.mu.Unlock()
	if n == nil {
		return ""
	}
	return n.opt.Addr
}

// HasNotifier tells tests whether c has a notifier for the node at addr (any database).
func HasNotifier(c *Client, addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.notifiers {
		if n.opt.Addr == addr {
			return true
		}
	}
	return false
}

// CohortWaiters tells tests how many goroutines of c wait locally for the lock called name.
func CohortWaiters(c *Client, name string) int {
	c.mu.Lock()
	co := c.cohorts[lockKeys(DefaultKeyPrefix, name).lock]
	c.mu.Unlock()
	if co == nil {
		return 0
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	return len(co.queue)
}

// SemaphoreCohortWaiters tells tests how many goroutines of c wait locally for n permits of
// the semaphore s (default settings), and whether the Client's acquirer waits in Redis.
func SemaphoreCohortWaiters(c *Client, s *Semaphore, n int) (waiting int, acquiring bool) {
	c.mu.Lock()
	co := c.cohorts[s.cohort+":"+strconv.Itoa(n)]
	c.mu.Unlock()
	if co == nil {
		return 0, false
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	return len(co.queue), co.acquiring
}

// LayoutVersion is the key layout, for tests to check against head.lua.
const LayoutVersion = layoutVersion

// CohortBlock is the number of tokens a hold reserves, for tests to check against head.lua.
const CohortBlock = cohortBlock

// CohortState reports whether c's cohort on name has a hold and a linger timer.
func CohortState(c *Client, name string) (hasHold, lingering bool) {
	c.mu.Lock()
	co := c.cohorts[lockKeys(DefaultKeyPrefix, name).lock]
	c.mu.Unlock()
	if co == nil {
		return false, false
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	for _, s := range co.slots {
		hasHold = hasHold || !s.out
		lingering = lingering || s.linger != nil
	}
	return hasHold, lingering
}

// SetCohortBatchTime sets how long a cohort's hold serves local holders, for a test, and
// restores it at cleanup.
func SetCohortBatchTime(t interface{ Cleanup(func()) }, d time.Duration) {
	old := cohortBatchTime
	cohortBatchTime = d
	t.Cleanup(func() { cohortBatchTime = old })
}

// SetOpLogTTL shortens the op log window for a test and restores it at cleanup.
func SetOpLogTTL(t interface{ Cleanup(func()) }, d time.Duration) {
	old := opLogTTL
	opLogTTL = d
	t.Cleanup(func() { opLogTTL = old })
}

// RedisErr is redisErr, for tests of the error mapping.
func RedisErr(err error) error { return redisErr("lock", "x", err) }

// SetReadShareAge changes how long a Client's read hold takes new local readers, for a test,
// and restores it at cleanup.
func SetReadShareAge(t interface{ Cleanup(func()) }, d time.Duration) {
	old := readShareAge
	readShareAge = d
	t.Cleanup(func() { readShareAge = old })
}

// SetWaitWindows widens, for a test of the FIFO's order, how long a waiter may go unheard
// (liveness) and a grantee may take to renew its grant (grace), so a pause of the loaded
// machine does not cost a waiter its place; restored at cleanup.
func SetWaitWindows(t interface{ Cleanup(func()) }, liveness, grace time.Duration) {
	lw, lr, gg := livenessWindow, livenessRefresh, grantGrace
	livenessWindow, livenessRefresh, grantGrace = liveness, liveness/3, grace
	t.Cleanup(func() { livenessWindow, livenessRefresh, grantGrace = lw, lr, gg })
}

// KeySlot is the Cluster hash slot dlock computes for key.
func KeySlot(key string) int { return keySlot(key) }

// PendingReadWaiters tells tests how many readers of c wait locally for the read hold another
// reader of c waits for in Redis on the lock called name.
func PendingReadWaiters(c *Client, name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.pendingReads[lockKeys(DefaultKeyPrefix, name).lock]; p != nil {
		return p.waiters
	}
	return 0
}

// SetLatchRecheck sets how often a waiting Latch.Wait reads the count without a push, for
// the test.
func SetLatchRecheck(t interface{ Cleanup(func()) }, d time.Duration) {
	old := latchRecheck
	latchRecheck = d
	t.Cleanup(func() { latchRecheck = old })
}

// SetTestScriptRunner makes every Client made without WithScriptRunner run its scripts through
// the runner f returns for its go-redis client (nil: through go-redis), so the whole suite can
// run through another client library (dlockrueidis's `make test-rueidis`).
func SetTestScriptRunner(f func(redis.UniversalClient) ScriptRunner) { testRunner = f }

// OnGoRedis keeps a Client's scripts on its go-redis client in every run of the suite: for
// tests that inject faults into go-redis (hooks that lose or delay replies, a closed client),
// which a script runner would not pass through. dlockrueidis tests its own transport faults.
func OnGoRedis() Option { return func(c *config) { c.onGoRedis = true } }

// SetIdleChannelAfter shortens how long an unused release channel stays subscribed, for
// notifiers started during the test.
func SetIdleChannelAfter(t interface{ Cleanup(func()) }, d time.Duration) {
	old := idleChannelAfter
	idleChannelAfter = d
	t.Cleanup(func() { idleChannelAfter = old })
}

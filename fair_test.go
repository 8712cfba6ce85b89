package dlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// waitQueueLen waits until the lock's Redis queue holds n waiters.
func waitQueueLen(t *testing.T, rdb *redis.Client, name string, n int64) {
	t.Helper()
	waitQueueLenWithin(t, rdb, name, n, 5*time.Second)
}

func waitQueueLenWithin(t *testing.T, rdb *redis.Client, name string, n int64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for rdb.ZCard(context.Background(), lockKey(name)+":queue").Val() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q never reached %d waiters", name, n)
		}
		time.Sleep(time.Millisecond) // Redis state has no event to wait on
	}
}

func TestWaitersAcrossClientsAreServedInArrivalOrder(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	ctx := ctxT(t)
	name := redistest.Name(t)
	holderC, rdb := newClient(t)
	held, err := holderC.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Three Clients stand for three processes; each queues after the previous one.
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		c, _ := newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			_ = l.Unlock(ctx)
		}()
		waitQueueLen(t, rdb, name, int64(i+1))
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served in position %d: not first come, first served", got, want)
		}
		want++
	}
}

func TestCohortHandsOffLocallyWithRisingTokens(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	first, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Four more goroutines of this Client queue locally behind the holder.
	const n = 4
	got := make(chan *dlock.Lease, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			got <- l
		}()
	}
	// While the first holds, another handle's TryLock must fail and nobody else holds.
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while a local goroutine holds: %v", err)
	}
	last := first.Token()
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		l := <-got
		if l.Token() <= last {
			t.Fatalf("hand-off %d: token %d not above %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	// A hold the Client had to wait for may linger 0.5 ms for another local Lock; no longer.
	deadline := time.Now().Add(time.Second)
	for rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Client kept the Redis lock after its last local holder left")
		}
		time.Sleep(time.Millisecond) // the background release has no event to wait on
	}
}

func TestCohortReentryIsThroughTheLeaseContext(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	m := c.Mutex(name)
	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("same handle without the lease's context: %v, want ErrNotObtained", err)
	}
	inner, err := m.TryLock(outer.Context())
	if err != nil {
		t.Fatalf("re-entry through the lease's context: %v", err)
	}
	if inner.Token() != outer.Token() {
		t.Fatalf("re-entry token %d, want %d", inner.Token(), outer.Token())
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("other handle after the inner Unlock: %v, want ErrNotObtained", err)
	}
	if outer.Err() != nil {
		t.Fatal(outer.Err())
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("after both Unlocks: %v", err)
	}
	_ = l.Unlock(ctx)
}

func TestCohortLossWhileLocalWaitersQueue(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	holder := lockTracked(t, c.Mutex(name))
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// Take the Redis lock away from the Client while a local goroutine waits.
	for dlock.CohortWaiters(c, name) != 1 {
		time.Sleep(time.Millisecond) // the local queue has no event to wait on
	}
	rdb.Del(ctx, lockKey(name))
	waitDone(t, holder, 2*time.Second)
	if !errors.Is(holder.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("holder Err = %v, want ErrLeaseLost", holder.Err())
	}
	select {
	case l := <-got:
		if l == nil {
			t.Fatal("waiter failed")
		}
		if l.Token() <= holder.Token() {
			t.Fatalf("waiter token %d not above the lost holder's %d", l.Token(), holder.Token())
		}
		if n := rdb.Exists(ctx, lockKey(name)).Val(); n != 1 {
			t.Fatal("waiter holds a lease but the Redis lock is missing")
		}
		_ = l.Unlock(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("local waiter not served after the Client's hold was lost")
	}
	if err := holder.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of the lost lease = %v, want ErrNotHeld", err)
	}
}

func TestDeadWaiterStallsTheLockBriefly(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	c, rdb := newClient(t)
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter of another process that then died: first in the queue, never refreshing.
	k := lockNames{lock: lockKey(name), fence: lockKey(name) + ":fence", log: lockKey(name) + ":log",
		queue: lockKey(name) + ":queue", live: lockKey(name) + ":live", channel: lockKey(name) + ":released"}
	if res := acquireArgs(t, rdb, k, "ghost", "g1", true, true); res[0] != 0 {
		t.Fatalf("ghost got the lock: %v", res)
	}
	other, _ := newClient(t)
	got := make(chan time.Time, 1)
	go func() {
		l, err := other.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		got <- time.Now()
		_ = l.Unlock(ctx)
	}()
	waitQueueLen(t, rdb, name, 2)
	released := time.Now()
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		stall := at.Sub(released)
		t.Logf("a dead waiter first in line stalled the lock %v", stall)
		if stall > 2*time.Second {
			t.Fatalf("dead waiter stalled the lock %v", stall)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("live waiter never got the lock past a dead one")
	}
}

func TestWaiterGivingUpLeavesTheQueue(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	c, rdb := newClient(t)
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := newClient(t)
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := other.Mutex(name).Lock(wctx)
		errc <- err
	}()
	waitQueueLen(t, rdb, name, 1)
	cancel()
	if err := <-errc; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock = %v", err)
	}
	// The Client leaves the Redis queue in the background; well before the entry's liveness
	// window (750 ms) could have dropped it.
	waitQueueLenWithin(t, rdb, name, 0, 300*time.Millisecond)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("lock granted to a waiter that had left")
	}
}

// A hold the Client waited for lingers after its holder leaves; when the linger timer decides
// to release it, a Lock arriving before the release goroutine runs is granted the hold, which
// the goroutine then releases in Redis under it. Another Client then takes the lock while the
// first lease is still held (Done open, Err nil).
// (Found by review.) A regression test: whatever the timing, a lease the Client grants from a
// lingering hold is really held in Redis.
func TestLingerReleaseNeverDropsANewHolder(t *testing.T) {
	for i := 0; i < 10; i++ {
		lingerRace(t, false)
		lingerRace(t, true)
	}
}

func lingerRace(t *testing.T, reenter bool) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	c1, _ := newClient(t)
	c2, rdb := newClient(t)
	m1, m2 := c1.Mutex(name), c2.Mutex(name)

	l2, err := m2.Lock(ctx) // another process holds it, so c1 must wait: its hold will linger
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease)
	go func() {
		l, err := m1.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	for dlock.CohortWaiters(c1, name) == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l1 := <-got
	_ = l1.Unlock(ctx) // lingers 0.5 ms
	hh, lg := dlock.CohortState(c1, name)
	_ = hh
	for lg { // wait for the linger timer to fire: the release is then decided
		_, lg = dlock.CohortState(c1, name)
	}
	l1b, err := m1.TryLock(ctx) // granted locally only if the hold was still c1's
	if err != nil {
		return // given back already: fine
	}
	time.Sleep(10 * time.Millisecond)
	l2b, err := m2.TryLock(ctx)
	if err == nil {
		select {
		case <-l1b.Done():
			t.Logf("l1b ended: %v", l1b.Err())
		default:
			t.Errorf("two holders: c1's lease (token %d, Done open, Err %v) and c2's (token %d)", l1b.Token(), l1b.Err(), l2b.Token())
		}
		_ = l2b.Unlock(ctx)
	}
	_ = rdb
	if reenter {
		_, _ = m1.Lock(ctx) // re-entry by the same handle
	}
	_ = l1b.Unlock(ctx)
}

// A waiter handed the lock by a release takes it with its own TTL, even one shorter than the
// grant's grace: otherwise the lock outlives the lease and stalls the next waiter.
func TestGrantedLockTakesTheGranteesShortTTL(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	const ttl = 100 * time.Millisecond
	holderC, rdb := newClient(t)
	held, err := holderC.Mutex(name).Lock(ctx) // the default TTL: only the grantee's matters
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newClient(t)
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name, dlock.WithTTL(ttl), dlock.WithFixedLease()).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueueLen(t, rdb, name, 1)
	time.Sleep(10 * time.Millisecond) // past the 4ms barging window: the release grants to the waiter
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		return
	}
	if pttl := rdb.PTTL(ctx, lockKey(name)).Val(); pttl > ttl {
		t.Fatalf("granted lock's PTTL %v, longer than the grantee's TTL %v (the grant's grace is %v)", pttl, ttl, 500*time.Millisecond)
	}
}

// A handle's TTL and lease mode are its own, also when its Client's other handles hold the
// lock with other settings (issue 9, point 8).
func TestCohortHandleKeepsItsOwnOptions(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	short, err := c.Mutex(name, dlock.WithTTL(150*time.Millisecond), dlock.WithFixedLease()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, c, name, 1)
	if err := short.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.Fatal("default handle did not get the lock")
	}
	if l.TTL() != dlock.DefaultTTL {
		t.Fatalf("default handle's lease TTL = %v, want %v", l.TTL(), dlock.DefaultTTL)
	}
	select {
	case <-l.Done():
		t.Fatalf("default handle's lease ended within 3x the other handle's fixed 150ms: %v", l.Err())
	case <-time.After(450 * time.Millisecond):
	}
	if pttl := rdb.PTTL(ctx, lockKey(name)).Val(); pttl < time.Second {
		t.Fatalf("lock PTTL %v under the default handle", pttl)
	}
	_ = l.Unlock(ctx)
}

// A waiter whose ctx ended before the holder released never gets the lock (issue 9,
// point 14).
func TestCancelledWaitersNeverGetTheLock(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	for round := 0; round < 5; round++ {
		name := redistest.Name(t)
		holder, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		const waiters = 30
		wctx, cancel := context.WithCancel(ctx)
		results := make(chan error, waiters)
		for i := 0; i < waiters; i++ {
			go func() {
				l, err := c.Mutex(name).Lock(wctx)
				if err == nil {
					err = errors.New("a waiter whose ctx had ended got the lock")
					_ = l.Unlock(ctx)
				}
				results <- err
			}()
		}
		for dlock.CohortWaiters(c, name) != waiters {
			time.Sleep(time.Millisecond) // the local queue has no event to wait on
		}
		cancel()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < waiters; i++ {
			if err := <-results; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: cancelled waiter = %v, want ErrNotObtained and context.Canceled", round, err)
			}
		}
	}
}

// When a Client's fixed lease runs out while another process waits in Redis, the Client's
// next goroutine does not take the lock ahead of it, even while the expired hold is still in
// Redis (issue 9, point 14).
func TestFixedLeaseRunOutRespectsTheRedisQueue(t *testing.T) {
	for _, noCohort := range []bool{false, true} {
		opts := []dlock.Option{dlock.WithTTL(300 * time.Millisecond), dlock.WithFixedLease(), dlock.WithDrift(0.3)}
		if noCohort {
			opts = append(opts, dlock.WithoutCohort())
		}
		a, _ := newClient(t, opts...)
		b, _ := newClient(t)
		ctx := ctxT(t)
		name := redistest.Name(t)
		first, err := a.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := b.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitQueued(t, b, name, 1)
		waitDone(t, first, 2*time.Second)
		// The lease ended locally 90 ms before the key expires in Redis.
		if l, err := a.Mutex(name).TryLock(ctx); err == nil {
			_ = l.Unlock(ctx)
			t.Fatalf("noCohort %v: the Client took the lock ahead of the waiting process", noCohort)
		}
		l := <-got
		if l == nil || l.Token() <= first.Token() {
			t.Fatal("the waiting process did not get the lock")
		}
		_ = l.Unlock(ctx)
	}
}

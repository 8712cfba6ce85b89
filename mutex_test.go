package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestTryLockExcludesOtherOwners(t *testing.T) {
	c, rdb := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	a, b := c.Mutex(name), c.Mutex(name)

	la, err := a.TryLock(ctx)
	if err != nil {
		t.Fatalf("first TryLock: %v", err)
	}
	if _, err := b.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second owner's TryLock = %v, want ErrNotObtained", err)
	}
	if n, _ := rdb.HGet(ctx, lockKey(name), la.Owner()).Int(); n != 1 {
		t.Fatalf("hold count in Redis = %d, want 1", n)
	}
	if ttl := rdb.PTTL(ctx, lockKey(name)).Val(); ttl <= 0 || ttl > dlock.DefaultTTL {
		t.Fatalf("lock PTTL = %v, want (0, %v]", ttl, dlock.DefaultTTL)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if la.Err() != nil {
		t.Fatalf("Err after Unlock = %v, want nil", la.Err())
	}
	select {
	case <-la.Done():
	default:
		t.Fatal("Done not closed after Unlock")
	}
	lb, err := b.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	if err := la.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatalf("Unlock b: %v", err)
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("lock key still exists after the last Unlock")
	}
}

// A handle made WithOwner re-enters its owner's holds in Redis, which counts them.
func TestReentrantHoldsAreCounted(t *testing.T) {
	c, rdb := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	m := c.Mutex(name, dlock.WithOwner("job-1"))
	other := c.Mutex(name)

	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.TryLock(ctx)
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if inner.Token() != outer.Token() {
		t.Fatalf("re-entry token %d, want the outer hold's %d", inner.Token(), outer.Token())
	}
	if n, _ := rdb.HGet(ctx, lockKey(name), m.Owner()).Int(); n != 2 {
		t.Fatalf("hold count = %d, want 2", n)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("after one of two Unlocks another owner got %v, want ErrNotObtained", err)
	}
	select {
	case <-outer.Done():
		t.Fatalf("outer lease ended when the inner hold was released: %v", outer.Err())
	default:
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := other.TryLock(ctx)
	if err != nil {
		t.Fatalf("after both Unlocks: %v", err)
	}
	_ = l.Unlock(ctx)
}

func TestSameOwnerAcrossClientsReenters(t *testing.T) {
	// Two Clients with one owner id stand for two processes sharing an identity.
	c1, _ := newClient(t)
	c2, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	l1, err := c1.Mutex(name, dlock.WithOwner("job-7")).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c2.Mutex(name, dlock.WithOwner("job-7")).TryLock(ctx)
	if err != nil {
		t.Fatalf("same owner from a second client: %v", err)
	}
	if _, err := c2.Mutex(name, dlock.WithOwner("job-8")).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("different owner: %v, want ErrNotObtained", err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFencingTokensStrictlyIncrease(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	var last uint64
	for i := 0; i < 20; i++ {
		m := c.Mutex(name) // a new owner each time
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("acquisition %d: token %d not above previous %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLockWaitsForRelease(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease)
	errc := make(chan error, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	select {
	case l := <-got:
		t.Fatalf("waiter got the lock (token %d) while it was held", l.Token())
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(100 * time.Millisecond): // still waiting, as it must
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The holder's TTL is 30s: a waiter that relied on the TTL re-check would time out here.
	select {
	case l := <-got:
		if l.Token() <= held.Token() {
			t.Fatalf("waiter token %d not above holder's %d", l.Token(), held.Token())
		}
		_ = l.Unlock(ctx)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by the release")
	}
}

func TestLockContextEndsWait(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Mutex(name).Lock(wctx)
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with expiring ctx = %v, want ErrNotObtained joined with DeadlineExceeded", err)
	}
}

func TestRenewalKeepsLockPastTTL(t *testing.T) {
	c, rdb := newClient(t, dlock.WithTTL(150*time.Millisecond))
	ctx := ctxT(t)
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Watch Redis for 5 TTLs: the key must stay ours and never expire.
	end := time.Now().Add(750 * time.Millisecond)
	for time.Now().Before(end) {
		if _, err := rdb.HGet(ctx, lockKey(name), c.Mutex(name).Owner()).Result(); err == nil {
			t.Fatal("a fresh handle's owner found in the lock hash")
		}
		if n := rdb.Exists(ctx, lockKey(name)).Val(); n != 1 {
			t.Fatalf("lock key expired while held (lease err: %v)", l.Err())
		}
		time.Sleep(10 * time.Millisecond) // sampling Redis state over time is the point here
	}
	if l.Err() != nil {
		t.Fatalf("lease lost while renewed: %v", l.Err())
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("other owner after 5 TTLs: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// After release the renewer must not resurrect the key.
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("key exists after Unlock")
	}
}

func TestFixedLeaseEndsAtTTL(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	ttl := 200 * time.Millisecond
	sent := time.Now()
	// A 10% drift margin leaves room for timer latency on a loaded test machine.
	l, err := c.Mutex(name, dlock.WithTTL(ttl), dlock.WithFixedLease(), dlock.WithDrift(0.1)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at := waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	if at.Sub(sent) > ttl {
		t.Fatalf("fixed lease ended %v after the acquire was sent, after its TTL %v", at.Sub(sent), ttl)
	}
	_ = rdb
}

// A Redis restarted without persistence forgets the fence counter; tokens still increase,
// since a fresh counter starts from the server's clock.
func TestTokensIncreaseAcrossRestartWithoutPersistence(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithoutCohort())
	defer c.Close(ctx)
	m := c.Mutex(redistest.Name(t))
	var last uint64
	for i := range 3 {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if l.Token() <= last {
			t.Fatalf("round %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		srv.Kill()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		if n := rdb.DBSize(ctx).Val(); n != 0 {
			t.Fatalf("restarted Redis kept %d keys; the test needs one without persistence", n)
		}
	}
}

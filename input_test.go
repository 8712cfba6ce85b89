package dlock_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestBadInputIsRejectedClearly(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	cases := []struct {
		name  string
		m     *dlock.Mutex
		about string
	}{
		{"empty name", c.Mutex(""), "empty lock name"},
		{"long name", c.Mutex(strings.Repeat("x", 2000)), "lock name"},
		{"name with an empty hash tag", c.Mutex("}x"), "must not start with '}'"},
		{"owner like a hold field", c.Mutex("a", dlock.WithOwner("#1")), "owner"},
		{"zero TTL", c.Mutex("a", dlock.WithTTL(0)), "TTL"},
		{"negative TTL", c.Mutex("a", dlock.WithTTL(-time.Second)), "TTL"},
		{"empty owner", c.Mutex("a", dlock.WithOwner("")), "owner"},
		{"brace in prefix", c.Mutex("a", dlock.WithKeyPrefix("x{y")), "prefix"},
		{"drift too big", c.Mutex("a", dlock.WithDrift(0.7)), "drift"},
		{"drift NaN", c.Mutex("a", dlock.WithDrift(math.NaN())), "drift"},
		{"nil client", dlock.New(nil).Mutex("a"), "nil Redis client"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for op, f := range map[string]func(context.Context) (*dlock.Lease, error){"TryLock": tc.m.TryLock, "Lock": tc.m.Lock} {
				l, err := f(ctx)
				if l != nil || !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tc.about) {
					t.Fatalf("%s = %v, %v; want ErrInvalid naming %q", op, l, err, tc.about)
				}
			}
		})
	}
	if err := dlock.FencedSet(ctx, redistest.Client(t), "", "v", 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("FencedSet with empty key = %v, want ErrInvalid", err)
	}
}

// With Redis down, TryLock returns ErrUnavailable naming the cause at once; Lock waits it out
// until its ctx ends and then says both (issue 9, point 4).
func TestRedisDownIsUnavailable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Network: "unix", Addr: t.TempDir() + "/nothing.sock", MaxRetries: -1})
	defer rdb.Close()
	for _, opts := range [][]dlock.Option{nil, {dlock.WithoutCohort()}} {
		c := dlock.New(rdb, opts...)
		defer c.Close(context.Background())
		l, err := c.Mutex("a").TryLock(ctxT(t))
		if l != nil || !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "nothing.sock") {
			t.Fatalf("TryLock with Redis down = %v, %v; want ErrUnavailable naming the connection error", l, err)
		}
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		l, err = c.Mutex("a").Lock(ctx)
		cancel()
		if l != nil || !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("Lock with Redis down = %v, %v; want ErrNotObtained, DeadlineExceeded and ErrUnavailable", l, err)
		}
		// The same for a reader, whose Client may wait for it (reader cohorting).
		ctx, cancel = context.WithTimeout(ctxT(t), 300*time.Millisecond)
		l, err = c.RWMutex("b").RLock(ctx)
		cancel()
		if l != nil || !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("RLock with Redis down = %v, %v; want ErrNotObtained, DeadlineExceeded and ErrUnavailable", l, err)
		}
	}
}

// A server that may not write (min-replicas-to-write without replicas) refuses every script
// before it runs: TryLock returns ErrUnavailable naming NOREPLICAS, not a raw Redis string, and
// nothing was written (issue 9, point 4).
func TestNoReplicasIsUnavailable(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{Args: []string{"--min-replicas-to-write", "1"}})
	rdb := srv.Client()
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx := ctxT(t)
	_, err := c.Mutex("a").TryLock(ctx)
	if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "NOREPLICAS") {
		t.Fatalf("TryLock without the replicas min-replicas-to-write wants = %v, want ErrUnavailable naming NOREPLICAS", err)
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys written by a refused script", n)
	}
}

// A Lock whose ctx ends while an attempt is in flight still reports the ctx's end, as its
// contract says (found through the demo's nested-lock timeouts).
func TestLockTimeoutAlwaysSaysDeadlineExceeded(t *testing.T) {
	c, _ := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	held := must(t)(c.Mutex(name).Lock(ctx))
	defer held.Unlock(ctx)
	for i := range 200 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(200+i*7)*time.Microsecond)
		_, err := c.Mutex(name).Lock(wctx)
		cancel()
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock %d with its ctx ended: %v, want ErrNotObtained and DeadlineExceeded", i, err)
		}
	}
}

// A nil context.Context is refused with ErrInvalid by every call that takes one, before
// anything is touched (an Extend(nil) crashes nothing), except Unlock and Close, which take
// it as context.Background: Unlock(nil) unlocks, Close(nil) closes. Found by review: Close(nil) panicked holding the
// Client's mutex (every later call blocked), Extend(nil) panicked on a goroutine of its own
// (the process died), and Unlock(nil) panicked with the lease half-released: it looked held
// until another Client took the lock.
func TestNilContextIsRefused(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	var nilCtx context.Context
	invalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "nil Context") {
			t.Errorf("%s with a nil ctx: %v, want ErrInvalid naming the nil Context", what, err)
		}
	}
	_, err := c.Mutex(name).Lock(nilCtx)
	invalid("Mutex.Lock", err)
	_, err = c.Mutex(name).TryLock(nilCtx)
	invalid("Mutex.TryLock", err)
	_, err = c.RWMutex(name + "rw").RLock(nilCtx)
	invalid("RWMutex.RLock", err)
	_, err = c.MultiLock([]string{name + "a", name + "b"}).Lock(nilCtx)
	invalid("MultiLock.Lock", err)
	_, err = c.Semaphore(name+"s", 2).Acquire(nilCtx, 1)
	invalid("Semaphore.Acquire", err)
	_, err = c.Semaphore(name+"s", 2).Available(nilCtx)
	invalid("Semaphore.Available", err)
	d := c.Latch(name + "l")
	_, err = d.TrySetCount(nilCtx, 1)
	invalid("Latch.TrySetCount", err)
	invalid("Latch.CountDown", d.CountDown(nilCtx))
	_, err = d.Count(nilCtx)
	invalid("Latch.Count", err)
	invalid("Latch.Wait", d.Wait(nilCtx))
	_, err = c.Inspect(nilCtx, name)
	invalid("Inspect", err)
	_, err = c.Locks(nilCtx, "*")
	invalid("Locks", err)
	_, err = c.ForceRelease(nilCtx, name)
	invalid("ForceRelease", err)
	invalid("FencedSet", dlock.FencedSet(nilCtx, rdb, name+"r", "v", 1))
	_, _, err = dlock.FencedGet(nilCtx, rdb, name+"r")
	invalid("FencedGet", err)
	var nilRedis *redis.Client
	if err := dlock.FencedSet(ctx, nilRedis, name+"r", "v", 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("FencedSet on a nil Redis client: %v, want ErrInvalid", err)
	}

	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	invalid("Lease.Extend", l.Extend(nilCtx, time.Minute))
	if l.Err() != nil {
		t.Fatalf("the lease after Extend(nil): %v, want still held", l.Err())
	}
	// Unlock(nil) unlocks, as Close(nil) closes: a `defer l.Unlock(nil)` must not keep the lock.
	if err := l.Unlock(nilCtx); err != nil {
		t.Fatalf("Unlock(nil): %v", err)
	}
	if l2, err := c.Mutex(name).TryLock(ctx); err != nil {
		t.Fatalf("TryLock after Unlock(nil): %v", err)
	} else {
		_ = l2.Unlock(ctx)
	}
	if err := c.Close(nilCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("TryLock after Close(nil): %v, want ErrClosed", err)
	}
}

// A master that cannot persist (MISCONF: a failed background save, with
// stop-writes-on-bgsave-error) cannot serve writes until a save succeeds: TryLock returns
// ErrUnavailable, which Lock waits out, not a plain error; nothing is written. A latch call
// refused on every send says it was not applied (not that it may have been).
func TestMisconfIsUnavailable(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{Args: []string{"--enable-protected-configs", "yes"}})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	if _, err := c.Latch("l").TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := srv.FailSaves(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("a").TryLock(ctx); !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "MISCONF") {
		t.Fatalf("TryLock on a MISCONF master = %v, want ErrUnavailable naming MISCONF", err)
	}
	if n := rdb.Exists(ctx, lockKey("a")).Val(); n != 0 {
		t.Fatal("a refused script wrote the lock")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := c.Latch("l").CountDown(short)
	if !errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), "not applied") || strings.Contains(err.Error(), "may have been applied") {
		t.Fatalf("CountDown refused on every send = %v, want ErrUnavailable saying it was not applied", err)
	}
}

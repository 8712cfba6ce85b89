package dlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lockTracked takes a lock and waits until its key is tracked, so a change is pushed.
func lockTracked(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	l, err := m.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-dlock.Tracked(l):
	case <-l.Done():
		t.Fatalf("lease ended before tracking: %v", l.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("lock key not tracked within 5s")
	}
	return l
}

func TestLossPushedAfterExternalDel(t *testing.T) {
	// The default 30s lease renews every 10s: a detection within 2s can only come from a push.
	c, rdb := newClient(t)
	ctx := ctxT(t)
	var lat []time.Duration
	for i := 0; i < 200; i++ {
		name := redistest.Name(t)
		l := lockTracked(t, c.Mutex(name))
		t0 := time.Now()
		if err := rdb.Del(ctx, lockKey(name)).Err(); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, waitDone(t, l, 2*time.Second).Sub(t0))
		if err := l.Err(); !errors.Is(err, dlock.ErrLeaseLost) || !strings.Contains(err.Error(), "deleted") {
			t.Fatalf("Err = %v, want ErrLeaseLost naming the deletion", err)
		}
	}
	slices.Sort(lat)
	t.Logf("loss detection after DEL: p50 %v, p99 %v, max %v over %d runs",
		lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], len(lat))
}

func TestLossFoundWhenDeletedBeforeTrackingIsArmed(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, lockKey(name)) // before the arming read: that read must find it gone
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
}

func TestLossPushedWhenTakenOrOverwritten(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	tamper := map[string]func(key string) error{
		"taken by another owner": func(key string) error {
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, key)
				p.HSet(ctx, key, "intruder", 1)
				return nil
			})
			return err
		},
		"overwritten with a string": func(key string) error { return rdb.Set(ctx, key, "x", 0).Err() },
		"expired by hand":           func(key string) error { return rdb.PExpire(ctx, key, time.Millisecond).Err() },
	}
	for what, f := range tamper {
		t.Run(what, func(t *testing.T) {
			name := redistest.Name(t)
			l := lockTracked(t, c.Mutex(name))
			if err := f(lockKey(name)); err != nil {
				t.Fatal(err)
			}
			waitDone(t, l, 2*time.Second)
			if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
				t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
			}
		})
	}
}

func TestLossPushedWhenDeletedAndRetakenBySameOwner(t *testing.T) {
	c, rdb := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	m := c.Mutex(name)
	old := lockTracked(t, m)
	rdb.Del(ctx, lockKey(name))
	l, err := m.TryLock(ctx) // the same owner takes a fresh hold at once
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, old, 2*time.Second)
	if !errors.Is(old.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("old lease Err = %v, want ErrLeaseLost", old.Err())
	}
	if l.Err() != nil || l.Token() <= old.Token() {
		t.Fatalf("new lease: err %v, token %d (old %d)", l.Err(), l.Token(), old.Token())
	}
	_ = l.Unlock(ctx)
}

func TestUnlockOfLostLease(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	t.Run("after the loss was pushed", func(t *testing.T) {
		name := redistest.Name(t)
		l := lockTracked(t, c.Mutex(name))
		rdb.Del(ctx, lockKey(name))
		waitDone(t, l, 2*time.Second)
		err := l.Unlock(ctx)
		if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Unlock = %v, want ErrNotHeld and ErrLeaseLost", err)
		}
	})
	t.Run("before the loss was noticed", func(t *testing.T) {
		name := redistest.Name(t)
		l, err := c.Mutex(name, dlock.WithTTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Taken by someone else: our Unlock must neither report success nor free their hold.
		rdb.Del(ctx, lockKey(name))
		rdb.HSet(ctx, lockKey(name), "intruder", 1)
		err = l.Unlock(ctx)
		if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Unlock = %v, want ErrNotHeld and ErrLeaseLost", err)
		}
		if n, _ := rdb.HGet(ctx, lockKey(name), "intruder").Int(); n != 1 {
			t.Fatalf("intruder's hold = %d after our Unlock, want 1", n)
		}
	})
}

func TestExtend(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	l, err := c.Mutex(name, dlock.WithTTL(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, lockKey(name)).Val(); ttl < 50*time.Second {
		t.Fatalf("PTTL after Extend(1m) = %v", ttl)
	}
	if l.TTL() != time.Minute {
		t.Fatalf("TTL() = %v, want 1m", l.TTL())
	}
	if err := l.Extend(ctx, 0); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Extend(0) = %v, want ErrInvalid", err)
	}
	rdb.Del(ctx, lockKey(name))
	err = l.Extend(ctx, time.Minute)
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Extend after loss = %v, want ErrNotHeld and ErrLeaseLost", err)
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("Extend after loss recreated the key")
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done still open after a refused Extend")
	}
}

func TestRedisKilledLeaseEndsBySafeDeadline(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	opt := srv.Options()
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	const ttl, drift = 600 * time.Millisecond, 0.1
	c := dlock.New(rdb, dlock.WithTTL(ttl), dlock.WithDrift(drift))
	defer c.Close(context.Background())

	sent := time.Now()
	l, err := c.Mutex(redistest.Name(t)).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	at := waitDone(t, l, 5*time.Second)
	elapsed := at.Sub(sent)
	safe := time.Duration(float64(ttl) * (1 - drift))
	t.Logf("Redis killed: lease ended %v after the acquire was sent (safe deadline %v, TTL %v)", elapsed, safe, ttl)
	if elapsed > ttl {
		t.Fatalf("lease ended %v after the acquire was sent, later than the TTL %v: another owner could already hold it", elapsed, ttl)
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !strings.Contains(l.Err().Error(), "safe deadline") {
		t.Fatalf("Err = %v, want ErrLeaseLost by the safe deadline", l.Err())
	}
}

func TestCloseReleasesLeases(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	c := dlock.New(rdb)
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, time.Second)
	if !errors.Is(l.Err(), dlock.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", l.Err())
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("Close left the lock held")
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock after Close = %v, want ErrClosed", err)
	}
}

// A renewal moves the lease's deadline only once the next renewal succeeded: a master that
// acknowledged the latest one may die before its replica got it (issue 9, point 2). While
// renewals succeed, the lease keeps at least half its TTL.
func TestARenewalCountsOnceTheNextOneSucceeded(t *testing.T) {
	const ttl = 800 * time.Millisecond
	c, _ := newClient(t, dlock.WithTTL(ttl), dlock.WithDrift(0))
	l, err := c.Mutex(redistest.Name(t)).Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 2) // two renewals (every TTL/4) have been sent
	var most, least time.Duration = 0, ttl
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		r := l.Remaining() // sampling over time is the point here
		most, least = max(most, r), min(least, r)
	}
	t.Logf("Remaining over 3 TTLs of renewals: %v..%v", least.Round(time.Millisecond), most.Round(time.Millisecond))
	if most > ttl*3/4+20*time.Millisecond {
		t.Fatalf("Remaining reached %v: the latest renewal counted before the next one succeeded (at most %v)", most, ttl*3/4)
	}
	if least < ttl/2-50*time.Millisecond || l.Err() != nil {
		t.Fatalf("Remaining fell to %v (err %v): want at least about half the TTL while renewals succeed", least, l.Err())
	}
}

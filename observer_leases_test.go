package dlock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Callbacks that call back into the lease (from review) and the Client (Err, Remaining, TTL, Context,
// Inspect, TryLock+Unlock of another lock) do not deadlock, whichever path ends the lease:
// Unlock, re-entry, cohort hand-off, shared reads, MultiLock, loss by push, Close.
func TestObserverCallbacksMayCallBack(t *testing.T) {
	var c *dlock.Client
	var calls atomic.Int64
	other := redistest.Name(t) + ".other"
	obs := dlock.Observer{
		LeaseEnded: func(e dlock.LeaseEnd) {
			l := e.Lease
			if l.Name() == other {
				return // the callback's own lock
			}
			_ = l.Err()
			_ = l.Remaining()
			_ = l.TTL()
			_ = l.Context()
			_ = l.Tokens()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _ = c.Inspect(ctx, l.Name())
			if x, err := c.Mutex(other, dlock.WithoutCohort()).TryLock(ctx); err == nil {
				_ = x.Unlock(ctx)
			}
			calls.Add(1)
		},
		CallDone: func(ctx context.Context, call dlock.Call, res dlock.CallResult) {
			if l := res.Lease; l != nil {
				_ = l.Err()
				_ = l.Remaining()
			}
		},
	}
	c, raw := newClient(t, dlock.WithObserver(obs))
	ctx := ctxT(t)
	name := redistest.Name(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// cohort hand-offs
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					l, err := c.Mutex(name).Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					r, err := c.Mutex(name).Lock(l.Context())
					if err != nil {
						t.Error(err)
						return
					}
					_ = r.Unlock(ctx)
					_ = l.Unlock(ctx)
				}
			})
		}
		// shared reads
		for range 8 {
			wg.Go(func() {
				for range 20 {
					l, err := c.RWMutex(name + ".rw").RLock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					_ = l.Unlock(ctx)
				}
			})
		}
		wg.Wait()
		ml, err := c.MultiLock([]string{name + ".a", name + ".b"}).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		_ = raw.Del(ctx, lockKey(name+".a")).Err()
		<-ml.Done()
		// loss by push of a cohort lease and of readers
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		r1, _ := c.RWMutex(name + ".rw2").RLock(ctx)
		r2, _ := c.RWMutex(name + ".rw2").RLock(ctx)
		_ = raw.Del(ctx, lockKey(name), lockKey(name+".rw2")).Err()
		<-l.Done()
		<-r1.Done()
		<-r2.Done()
		// Close
		if _, err := c.Mutex(name).Lock(ctx); err != nil {
			t.Error(err)
			return
		}
		_ = c.Close(ctx)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("stuck: a callback that calls back into dlock deadlocked")
	}
	if calls.Load() == 0 {
		t.Fatal("no LeaseEnded")
	}
}

// Every lease a call returned ends exactly once, and LeaseEnded hears of no other: Mutex with
// re-entries unlocked in either order (cohorting), shared reads, Semaphore permits, MultiLock
// (one lost), and Close (from review).
func TestObserverEveryLeaseEndsOnce(t *testing.T) {
	var mu sync.Mutex
	returned := map[*dlock.Lease]bool{}
	ends := map[*dlock.Lease]int{}
	obs := dlock.Observer{
		CallDone: func(ctx context.Context, call dlock.Call, res dlock.CallResult) {
			if l := res.Lease; call.Method != "Unlock" && l != nil {
				mu.Lock()
				returned[l] = true
				mu.Unlock()
			}
		},
		LeaseEnded: func(e dlock.LeaseEnd) {
			mu.Lock()
			ends[e.Lease]++
			mu.Unlock()
		},
	}
	c, raw := newClient(t, dlock.WithObserver(obs))
	ctx := ctxT(t)
	name := redistest.Name(t)
	var keep []*dlock.Lease
	var wg sync.WaitGroup
	var kmu sync.Mutex
	for i := range 8 {
		wg.Go(func() {
			for j := range 10 {
				var l *dlock.Lease
				var err error
				switch i % 4 {
				case 0:
					l, err = c.Mutex(name).Lock(ctx)
					if err == nil {
						var r *dlock.Lease
						if r, err = c.Mutex(name).Lock(l.Context()); err == nil {
							if j%2 == 0 || j == 9 {
								_ = r.Unlock(ctx)
							} else {
								_ = l.Unlock(ctx) // the outer lease first
								l = r
							}
						}
					}
				case 1:
					l, err = c.RWMutex(name + ".rw").RLock(ctx)
				case 2:
					l, err = c.Semaphore(name+".sem", 3).Acquire(ctx, 1)
				case 3:
					l, err = c.MultiLock([]string{name + ".m1", name + ".m2"}).Lock(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if j == 9 && (i%4 == 1 || i%4 == 2) {
					kmu.Lock()
					keep = append(keep, l)
					kmu.Unlock()
					return
				}
				_ = l.Unlock(ctx)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if l, err := c.Mutex(name).Lock(ctx); err == nil {
		_, _ = c.Mutex(name).Lock(l.Context())
	}
	_, _ = c.MultiLock([]string{name + ".m1", name + ".m2"}).Lock(ctx)
	_, _ = c.MultiLock([]string{name + ".m3", name + ".m4"}).Lock(ctx)
	lost, _ := c.MultiLock([]string{name + ".m5", name + ".m6"}).Lock(ctx)
	_ = raw.Del(ctx, lockKey(name+".m5")).Err()
	waitDone(t, lost, 5*time.Second)
	_ = c.Close(ctx)
	mu.Lock()
	defer mu.Unlock()
	for l := range returned {
		if ends[l] != 1 {
			t.Errorf("lease %s ended %d times", l.Name(), ends[l])
		}
	}
	for l, n := range ends {
		if !returned[l] {
			t.Errorf("LeaseEnded ×%d for a lease never returned (%s)", n, l.Name())
		}
	}
	t.Logf("%d leases", len(returned))
}

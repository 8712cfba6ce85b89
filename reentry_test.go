package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// handleModes are the three ways a handle takes a lock.
var handleModes = []struct {
	name string
	opts []dlock.Option
}{
	{"cohort", nil},
	{"plain", []dlock.Option{dlock.WithoutCohort()}},
	{"owner", []dlock.Option{dlock.WithOwner("job-1")}},
}

// waitQueued waits until n callers wait for the lock: in c's cohort, or in Redis.
func waitQueued(t *testing.T, c *dlock.Client, name string, n int) {
	t.Helper()
	ctx := ctxT(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if dlock.CohortWaiters(c, name) >= n || info.Waiters >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters not queued within 5s", n)
		}
	}
}

// Goroutines sharing one *Mutex exclude each other, as with sync.Mutex (issue 9, point 12).
func TestGoroutinesSharingAMutexExclude(t *testing.T) {
	for _, mode := range handleModes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			c, _ := newClient(t, mode.opts...)
			ctx := ctxT(t)
			name := redistest.Name(t)
			m := c.Mutex(name)
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("second TryLock on the shared handle = %v, want ErrNotObtained", err)
			}
			got := make(chan *dlock.Lease, 1)
			go func() {
				l2, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
				}
				got <- l2
			}()
			waitQueued(t, c, name, 1)
			select {
			case <-got:
				t.Fatal("a second goroutine got the shared handle's lock while it was held")
			default:
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l2 := <-got
			if l2 == nil || l2.Token() <= l.Token() {
				t.Fatalf("second lease %v: want a new hold with a higher token than %d", l2, l.Token())
			}
			_ = l2.Unlock(ctx)

			// Many goroutines on one handle: never two inside.
			var inside atomic.Int32
			var wg sync.WaitGroup
			for g := 0; g < 6; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 15; i++ {
						l, err := m.Lock(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						if inside.Add(1) != 1 {
							t.Error("two goroutines held the shared handle's lock at once")
						}
						inside.Add(-1)
						if err := l.Unlock(ctx); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

type ctxValueKey struct{}

// tryErr makes one attempt on m and gives back what it got.
func tryErr(t *testing.T, m *dlock.Mutex) error {
	l, err := m.TryLock(ctxT(t))
	if err == nil {
		_ = l.Unlock(ctxT(t))
	}
	return err
}

// Re-entry is explicit: through the lease's context (issue 9, point 12).
func TestReentryThroughTheLeaseContext(t *testing.T) {
	for _, mode := range handleModes {
		t.Run(mode.name, func(t *testing.T) {
			c, _ := newClient(t, mode.opts...)
			other, _ := newClient(t)
			name := redistest.Name(t)
			parent, cancelParent := context.WithCancel(context.WithValue(ctxT(t), ctxValueKey{}, "v"))
			outer, err := c.Mutex(name, mode.opts...).Lock(parent)
			if err != nil {
				t.Fatal(err)
			}
			lctx := outer.Context()
			cancelParent() // the lease's context keeps the values, not the cancellation
			if lctx.Err() != nil || lctx.Value(ctxValueKey{}) != "v" {
				t.Fatalf("lease context: err %v, value %v; want live with the Lock ctx's values", lctx.Err(), lctx.Value(ctxValueKey{}))
			}
			derived, cancel := context.WithTimeout(lctx, 10*time.Second)
			defer cancel()
			// Another handle of the lock on the same Client, given a derived context, re-enters.
			inner, err := c.Mutex(name, mode.opts...).TryLock(derived)
			if err != nil {
				t.Fatalf("re-entry through a derived lease context: %v", err)
			}
			if inner.Token() != outer.Token() {
				t.Fatalf("re-entry token %d, want %d", inner.Token(), outer.Token())
			}
			// Not across Clients, nor for another lock.
			if _, err := other.Mutex(name).TryLock(lctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("another Client with the lease context: %v, want ErrNotObtained", err)
			}
			l2, err := c.Mutex(name + "-other").TryLock(lctx)
			if err != nil || l2.Token() == outer.Token() {
				t.Fatalf("another lock with the lease context: %v (token %d): want a lock of its own", err, l2.Token())
			}
			_ = l2.Unlock(lctx)
			if err := outer.Unlock(lctx); err != nil {
				t.Fatal(err)
			}
			if lctx.Err() == nil {
				t.Fatal("lease context not cancelled after Unlock")
			}
			if inner.Err() != nil || tryErr(t, other.Mutex(name)) == nil {
				t.Fatalf("after the outer Unlock the inner lease must still hold (err %v)", inner.Err())
			}
			if _, err := c.Mutex(name, mode.opts...).TryLock(lctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("Lock with an ended lease's context = %v, want ErrNotObtained", err)
			}
			if err := inner.Unlock(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			l3, err := other.Mutex(name).TryLock(ctxT(t))
			if err != nil {
				t.Fatalf("after every lease of the chain unlocked: %v", err)
			}
			_ = l3.Unlock(ctxT(t))
		})
	}
}

// The lease's context ends with the loss as its cause.
func TestLeaseContextCarriesTheLoss(t *testing.T) {
	c, rdb := newClient(t)
	name := redistest.Name(t)
	l := lockTracked(t, c.Mutex(name))
	lctx := l.Context()
	rdb.Del(ctxT(t), lockKey(name))
	select {
	case <-lctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("lease context not cancelled within 2s of the loss")
	}
	if cause := context.Cause(lctx); !errors.Is(cause, dlock.ErrLeaseLost) || cause != l.Err() {
		t.Fatalf("context.Cause = %v, want Err() = %v", cause, l.Err())
	}
	if late := l.Context(); context.Cause(late) != l.Err() {
		t.Fatalf("Context after the loss: cause %v", context.Cause(late))
	}
}

// A nil Lease's methods report "not held" and never panic (issue 9, point 14).
func TestNilLeaseIsNotHeld(t *testing.T) {
	var l *dlock.Lease
	ctx := ctxT(t)
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("nil Unlock = %v", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("nil Extend = %v", err)
	}
	if !errors.Is(l.Err(), dlock.ErrNotHeld) || l.Token() != 0 || l.Remaining() != 0 || l.TTL() != 0 || l.Name() != "" || l.Owner() != "" {
		t.Fatal("nil Lease getters")
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("nil Lease's Done not closed")
	}
	if l.Context().Err() == nil {
		t.Fatal("nil Lease's Context not cancelled")
	}
}

package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// recovered runs f and returns what it panicked with.
func recovered(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

// An Observer that panics (a metrics bug) does not leave a lock held: a CallDone panicking
// after Lock took the lock gives it back before the panic reaches the caller, who never got
// the lease; a CallStart panicking in Unlock releases the lease first. Before, both locks
// stayed held and renewed until the Client closed. Lock(nil) is observed like any other
// refused call.
func TestObserverPanicLeavesNoLockHeld(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	var starts, dones atomic.Int32
	obs := dlock.Observer{
		CallStart: func(ctx context.Context, c dlock.Call) context.Context {
			starts.Add(1)
			if c.Method == "Unlock" {
				panic("observer bug in CallStart")
			}
			return nil
		},
		CallDone: func(ctx context.Context, c dlock.Call, res dlock.CallResult) {
			dones.Add(1)
			if c.Method == "Lock" && res.Err == nil && c.Name == name+"-done" {
				panic("observer bug in CallDone")
			}
		},
	}
	a, _ := newClient(t, dlock.WithObserver(obs))
	b, _ := newClient(t)
	free := func(name string) {
		t.Helper()
		l, err := b.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("%s after the observer panicked: %v; want it free", name, err)
		}
		_ = l.Unlock(ctx)
	}

	if r := recovered(func() { _, _ = a.Mutex(name + "-done").Lock(ctx) }); r != "observer bug in CallDone" {
		t.Fatalf("Lock's panic = %v", r)
	}
	free(name + "-done")

	l, err := a.Mutex(name + "-start").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := recovered(func() { _ = l.Unlock(ctx) }); r != "observer bug in CallStart" {
		t.Fatalf("Unlock's panic = %v", r)
	}
	if !errors.Is(l.Err(), dlock.ErrNotHeld) && l.Err() != nil {
		t.Fatalf("lease after the panicking Unlock: %v", l.Err())
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("the lease is not done after the panicking Unlock")
	}
	free(name + "-start")

	starts.Store(0)
	dones.Store(0)
	//lint:ignore SA1012 the nil Context is the point
	if _, err := a.Mutex(name).Lock(nil); !errors.Is(err, dlock.ErrInvalid) { //nolint:staticcheck
		t.Fatalf("Lock(nil) = %v, want ErrInvalid", err)
	}
	if starts.Load() != 1 || dones.Load() != 1 {
		t.Fatalf("Lock(nil): the observer heard %d CallStart and %d CallDone, want 1 and 1", starts.Load(), dones.Load())
	}
}

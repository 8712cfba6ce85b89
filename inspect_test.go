package dlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestInspectListAndForceRelease(t *testing.T) {
	prefix := "insp" + strings.ReplaceAll(redistest.Name(t), "#", "") + ":"
	c, _ := newClient(t, dlock.WithKeyPrefix(prefix), dlock.WithoutCohort())
	ctx := ctxT(t)
	m := c.Mutex("orders:1", dlock.WithOwner("ops-1")) // re-enters in Redis: a hold count of 2
	free, err := c.Inspect(ctx, "orders:1")
	if err != nil || free.Held || free.Token != 0 {
		t.Fatalf("never-locked lock: %+v, %v", free, err)
	}
	l := lockTracked(t, m)
	inner, _ := m.Lock(ctx)
	other, _ := newClient(t, dlock.WithKeyPrefix(prefix), dlock.WithoutCohort())
	waiting := make(chan error, 1)
	go func() {
		wl, err := other.Mutex("orders:1").Lock(ctx)
		if err == nil {
			err = wl.Unlock(ctx)
		}
		waiting <- err
	}()
	var info dlock.LockInfo
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if info, err = c.Inspect(ctx, "orders:1"); err != nil || info.Waiters == 1 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !info.Held || info.Owner != m.Owner() || info.HoldCount != 2 || info.Token != l.Token() ||
		info.Waiters != 1 || info.TTL <= 0 || info.TTL > dlock.DefaultTTL {
		t.Fatalf("held lock: %+v, %v (lease token %d, owner %s)", info, err, l.Token(), m.Owner())
	}
	c.Mutex("jobs:nightly").Lock(ctx)
	list, err := c.Locks(ctx, "orders:*")
	if err != nil || len(list) != 1 || list[0].Name != "orders:1" {
		t.Fatalf("Locks(orders:*) = %+v, %v", list, err)
	}
	if all, _ := c.Locks(ctx, ""); len(all) != 2 {
		t.Fatalf("Locks() = %+v, want 2 locks", all)
	}
	broke, err := c.ForceRelease(ctx, "orders:1")
	if err != nil || !broke {
		t.Fatalf("ForceRelease = %v, %v", broke, err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("holder after force release: %v", l.Err())
	}
	if err := <-waiting; err != nil {
		t.Fatalf("waiter after force release: %v", err)
	}
	_ = inner
	if broke, err := c.ForceRelease(ctx, "orders:1"); err != nil || broke {
		t.Fatalf("ForceRelease of a free lock = %v, %v", broke, err)
	}
}

// Inspect tells a lock used lately (Recent: its op log is still in Redis) from one with no
// state at all (never taken, or idle past the op log's window); a held lock is not Recent.
func TestInspectTellsRecentUseFromNoState(t *testing.T) {
	dlock.SetOpLogTTL(t, 300*time.Millisecond)
	c, _ := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	if info, err := c.Inspect(ctx, name); err != nil || info.Held || info.Recent {
		t.Fatalf("never-taken lock: %+v, %v; want neither held nor recent", info, err)
	}
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Inspect(ctx, name); err != nil || !info.Held || info.Recent {
		t.Fatalf("held lock: %+v, %v; want held, not recent", info, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Held || !info.Recent {
		t.Fatalf("lock just released: %+v, %v; want recent", info, err)
	}
	// The op log expires on Redis' own clock: no event to wait on.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := c.Inspect(ctx, name)
		if err == nil && !info.Recent && !info.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock idle past its op log's window: %+v, %v; want no state", info, err)
		}
	}
}

package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// queueLocally starts n Locks of the lock called name on c and returns once all of them wait
// in c's cohort. Their leases come on the channel, in the order they were granted; each holder
// checks it is alone and unlocks at once.
func queueLocally(ctx context.Context, t *testing.T, c *dlock.Client, name string, n int, inside *atomic.Int32) <-chan *dlock.Lease {
	t.Helper()
	got := make(chan *dlock.Lease, n)
	for range n {
		go func() {
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
				got <- nil
				return
			}
			if inside.Add(1) != 1 {
				t.Error("two holders of one Redlock lock at once")
			}
			got <- l
			inside.Add(-1)
			if err := l.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); dlock.CohortWaiters(c, name) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d Locks queued locally", dlock.CohortWaiters(c, name), n)
		}
	}
	return got
}

// The goroutines of a Redlock Client that wait for a lock it holds are handed its quorum of
// holds one after the other, without a round trip: one owner in Redis, the next token of the
// lease's block each, one holder at a time.
func TestRedlockCohortHandsOffLocally(t *testing.T) {
	ctx := ctxT(t)
	dlock.SetCohortBatchTime(t, time.Minute) // the set-up's waits must not end the batch
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	var inside atomic.Int32
	l0, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	got := queueLocally(ctx, t, set.c, name, n, &inside)
	if err := l0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		l := <-got
		if l == nil {
			t.FailNow()
		}
		if l.Owner() != l0.Owner() || l.Token() != l0.Token()+uint64(i)+1 {
			t.Fatalf("hand-off %d: owner %s token %d, want the hold of %s with token %d", i, l.Owner(), l.Token(), l0.Owner(), l0.Token()+uint64(i)+1)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); set.holders(t, name) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lock key on %d masters after the last Unlock", set.holders(t, name))
		}
	}
}

// Every token a Redlock cohort hands out is below the next process's, even when that process's
// quorum lacks the master whose token was the lease's: the lease raises every master it holds
// to the last token of its block. Master 0's fencing counter is set far ahead (a master whose
// clock runs ahead), so the lease's token is master 0's; master 0 then dies.
func TestRedlockCohortTokensStayBelowTheNextProcess(t *testing.T) {
	ctx := ctxT(t)
	dlock.SetCohortBatchTime(t, time.Minute)
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	ahead := uint64(time.Now().UnixMicro()) + uint64(time.Hour/time.Microsecond)
	if err := set.raw[0].Set(ctx, lockKey(name)+":fence", strconv.FormatUint(ahead, 10), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	var inside atomic.Int32
	l0, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l0.Token() <= ahead {
		t.Fatalf("lease token %d, want master 0's (above %d)", l0.Token(), ahead)
	}
	got := queueLocally(ctx, t, set.c, name, 3, &inside)
	if err := l0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for range 3 {
		l := <-got
		if l == nil {
			t.FailNow()
		}
		last = max(last, l.Token())
	}
	set.servers[0].Kill()
	l, err := set.another(t).Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if l.Token() <= last {
		t.Fatalf("next process's token %d, not above the cohort's last %d", l.Token(), last)
	}
}

// A Redlock cohort's lease ends when its quorum is lost (the key deleted on 2 of 3 masters):
// the holder's lease ends with ErrLeaseLost, the hold left on the third master is given back at
// once (not after its TTL), and the goroutine waiting locally gets a new lease with a higher
// token. Close then ends a held lease and a local waiter with ErrClosed and leaves no key.
func TestRedlockCohortQuorumLostAndClose(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil) // the default TTL, 30s
	name := redistest.Name(t)
	l1, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var inside atomic.Int32 // the waiter's alone: l1 ends as lost, not by Unlock
	got := queueLocally(ctx, t, set.c, name, 1, &inside)
	for _, r := range set.raw[1:] {
		if err := r.Del(ctx, lockKey(name)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitDone(t, l1, 5*time.Second)
	if !errors.Is(l1.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease after losing its quorum: %v, want ErrLeaseLost", l1.Err())
	}
	select {
	case l2 := <-got:
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= l1.Token() {
			t.Fatalf("new lease token %d, not above the lost one's %d", l2.Token(), l1.Token())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the local waiter got no lease within 5s of the loss (TTL 30s): the hold left on master 0 was not given back")
	}
	// Close with a holder and a local waiter.
	l3, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		l, err := set.c.Mutex(name).Lock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
		}
		waiting <- err
	}()
	for dlock.CohortWaiters(set.c, name) < 1 {
		time.Sleep(time.Millisecond)
	}
	if err := set.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l3.Err(), dlock.ErrClosed) {
		t.Fatalf("held lease after Close: %v, want ErrClosed", l3.Err())
	}
	if err := <-waiting; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("local waiter after Close: %v, want ErrClosed", err)
	}
	if n := set.holders(t, name); n != 0 {
		t.Fatalf("lock key on %d masters after Close", n)
	}
}

// TestRedlockWaiterCtxAndClose with cohorting on: the waiter is local, the cohort's acquirer
// waits in the masters' queue (from review).
func TestRedlockCohortWaiterCtxAndClose(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	holder := set.another(t)
	name := redistest.Name(t)
	if _, err := holder.Mutex(name).Lock(ctx); err != nil { // held until the end
		t.Fatal(err)
	}
	wait := func(wctx context.Context) <-chan error {
		done := make(chan error, 1)
		go func() {
			l, err := set.c.Mutex(name).Lock(wctx)
			if err == nil {
				_ = l.Unlock(ctx)
			}
			done <- err
		}()
		return done
	}
	queued := func() (n int64) {
		for _, r := range set.raw {
			n += r.ZCard(ctx, lockKey(name)+":queue").Val()
		}
		return n
	}
	noneQueued := func(when string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); queued() > 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d places still queued", when, queued())
			}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := wait(wctx)
	waitQueuedRaw(t, set.raw[0], name, 1)
	cancel()
	if err := <-done; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want ErrNotObtained and context.Canceled", err)
	}
	noneQueued("after the cancelled waiter")

	done = wait(ctx)
	waitQueuedRaw(t, set.raw[0], name, 1)
	if err := set.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("waiter at Close: %v, want ErrClosed", err)
	}
	noneQueued("after Close")
}

// TestRedlockFaultyFirstMasterAfterContention with cohorting on, the contended Lock another
// process's (its cohort's acquirer; from review).
func TestRedlockCohortFaultyFirstMasterAfterContention(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	o := set.another(t)
	name := redistest.Name(t)
	l1, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := o.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueuedRaw(t, set.raw[0], name, 1)
	time.Sleep(10 * time.Millisecond)
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	// Another local waiter, so the next take is the acquirer's (a wait, on a contended lock).
	l3c := make(chan *dlock.Lease, 1)
	go func() {
		l, err := o.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		l3c <- l
	}()
	for dlock.CohortWaiters(o, name) < 1 {
		time.Sleep(time.Millisecond)
	}
	dlock.SetCohortBatchTime(t, 0) // no hand-off: the waiter needs a new quorum
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := set.raw[0].ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Master 0 cannot write: its release fails (OOM), which Unlock reports when l2 held only a
	// quorum; the point is the waiter's lease.
	_ = l2.Unlock(ctx)
	select {
	case l3 := <-l3c:
		if l3 == nil {
			t.FailNow()
		}
		_ = l3.Unlock(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("no lease with master 0 out of memory")
	}
}

// A Redlock cohort lease whose Unlock reached fewer than a quorum (two masters paused, a
// short ctx): Unlock says so, a later Unlock retries the releases, a local waiter is served
// once the masters answer again, and no key is left (from review).
func TestRedlockCohortUnlockRetry(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, func(int) redistest.Config { return redistest.Config{TCP: true} })
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dlock.SetCohortBatchTime(t, 0) // no hand-off: the waiter needs the lock back from Redis
	got := make(chan error, 1)
	go func() {
		l2, err := set.c.Mutex(name).Lock(ctx)
		if err == nil {
			err = l2.Unlock(ctx)
		}
		got <- err
	}()
	for dlock.CohortWaiters(set.c, name) < 1 {
		time.Sleep(time.Millisecond)
	}
	set.servers[1].Pause()
	set.servers[2].Pause()
	uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = l.Unlock(uctx)
	cancel()
	t.Logf("first Unlock: %v", err)
	if err == nil {
		t.Fatal("Unlock reached one master of three and returned nil")
	}
	set.servers[1].Resume()
	set.servers[2].Resume()
	err = l.Unlock(ctx)
	t.Logf("second Unlock: %v", err)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("local waiter not served 10s after the masters came back")
	}
	for deadline := time.Now().Add(5 * time.Second); set.holders(t, name) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lock key on %d masters", set.holders(t, name))
		}
	}
}

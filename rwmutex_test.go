package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// rwLockAsync takes rw (to read or to write) on its own goroutine; the lease or error arrives
// on the returned channel.
type rwResult struct {
	l   *dlock.Lease
	err error
}

func rwLockAsync(t *testing.T, rw *dlock.RWMutex, read bool) <-chan rwResult {
	ctx := ctxT(t)
	ch := make(chan rwResult, 1)
	go func() {
		var r rwResult
		if read {
			r.l, r.err = rw.RLock(ctx)
		} else {
			r.l, r.err = rw.Lock(ctx)
		}
		ch <- r
	}()
	return ch
}

// must returns a function that fails the test on a lock call's error and returns its lease.
func must(t *testing.T) func(*dlock.Lease, error) *dlock.Lease {
	return func(l *dlock.Lease, err error) *dlock.Lease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

func got(t *testing.T, what string, ch <-chan rwResult) *dlock.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not granted within 5s", what)
		return nil
	}
}

func notYet(t *testing.T, what string, ch <-chan rwResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: granted too early (%v)", what, r.err)
	default:
	}
}

// Readers share the lock; a writer excludes readers and writers; readers exclude writers.
func TestRWMutexReadersShareWritersExclude(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rw := c.RWMutex(name, dlock.WithoutCohort()) // each reader a Redis hold of its own
	r1 := must(t)(rw.TryRLock(ctx))
	r2 := must(t)(rw.TryRLock(ctx))
	if r1.Token() != r2.Token() {
		t.Errorf("readers of one phase have tokens %d and %d, want one", r1.Token(), r2.Token())
	}
	info, err := c.Inspect(ctx, name)
	if err != nil || info.Kind != "rwmutex" || info.Readers != 2 {
		t.Fatalf("Inspect with two readers: %+v, %v", info, err)
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while read: %v, want ErrNotObtained", err)
	}
	for _, l := range []*dlock.Lease{r1, r2} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w := must(t)(rw.TryLock(ctx))
	if w.Token() <= r1.Token() {
		t.Errorf("writer token %d not above the readers' %d", w.Token(), r1.Token())
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryRLock while written: %v, want ErrNotObtained", err)
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while written: %v, want ErrNotObtained", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r3 := must(t)(rw.TryRLock(ctx))
	if r3.Token() <= w.Token() {
		t.Errorf("reader token %d not above the writer's %d", r3.Token(), w.Token())
	}
	_ = r3.Unlock(ctx)
}

// A waiting writer stops new readers (no writer starvation), readers queued first are admitted
// together, and a writer queued behind them waits for all of them (FIFO, both ways).
func TestRWMutexFairQueue(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rw := c.RWMutex(name, dlock.WithoutCohort()) // every reader its own place in Redis's queue
	r0 := must(t)(rw.TryRLock(ctx))
	w1 := rwLockAsync(t, rw, false)
	waitQueued(t, c, name, 1)
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a new reader overtook a waiting writer: %v", err)
	}
	readers := []<-chan rwResult{rwLockAsync(t, rw, true)}
	waitQueued(t, c, name, 2)
	readers = append(readers, rwLockAsync(t, rw, true))
	waitQueued(t, c, name, 3)
	w2 := rwLockAsync(t, rw, false)
	waitQueued(t, c, name, 4)

	if err := r0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wl := got(t, "first writer", w1)
	if wl.Token() <= r0.Token() {
		t.Errorf("writer token %d not above the reader's %d", wl.Token(), r0.Token())
	}
	for _, r := range readers {
		notYet(t, "reader queued behind the writer", r)
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Readers != 0 || info.Owner != wl.Owner() || info.Waiters != 3 {
		t.Fatalf("while the first writer holds: %+v, %v; want its owner %s and 3 waiters", info, err, wl.Owner())
	}
	if err := wl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var rs []*dlock.Lease
	for i, r := range readers {
		l := got(t, "queued reader", r)
		if i > 0 && l.Token() != rs[0].Token() {
			t.Errorf("readers admitted together have tokens %d and %d", rs[0].Token(), l.Token())
		}
		rs = append(rs, l)
	}
	for _, l := range rs {
		if l.Err() != nil {
			t.Fatalf("a reader admitted with others lost its lease: %v", l.Err())
		}
	}
	notYet(t, "writer queued behind the readers", w2)
	if info, err := c.Inspect(ctx, name); err != nil || info.Readers != 2 || info.Waiters != 1 {
		t.Fatalf("while the readers hold: %+v, %v; want 2 readers and 1 waiter", info, err)
	}
	if err := rs[0].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Readers != 1 || info.Waiters != 1 {
		t.Fatalf("after one reader left: %+v, %v; want 1 reader and the writer waiting", info, err)
	}
	notYet(t, "writer while one reader still reads", w2)
	if err := rs[1].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := got(t, "second writer", w2)
	if last.Token() <= rs[0].Token() {
		t.Errorf("writer token %d not above the readers' %d", last.Token(), rs[0].Token())
	}
	_ = last.Unlock(ctx)
}

// A read lease inside a write lease's context re-enters it (a downgrade), and a write lease
// inside that downgraded one re-enters the write hold; a write lease inside a read lease's
// context is refused at once; a Mutex and an RWMutex never share a name.
func TestRWMutexReentryAndKinds(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rw := c.RWMutex(name)
	w := must(t)(rw.Lock(ctx))
	r := must(t)(rw.RLock(w.Context()))
	if r.Token() != w.Token() {
		t.Errorf("read lease inside the write lease has token %d, want %d", r.Token(), w.Token())
	}
	if _, err := c.Mutex(name).Lock(w.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Mutex.Lock inside an RWMutex lease: %v, want ErrInvalid", err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Mutex.TryLock of a held read-write lock: %v, want ErrInvalid", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the read lease inside the write lease let another reader in: %v", err)
	}
	// The downgraded read lease's hold is still the writer's: Lock re-enters it (as the docs
	// say: no other reader can be waiting to upgrade), and the lock stays exclusive.
	w2, err := rw.Lock(r.Context())
	if err != nil || w2.Token() != w.Token() {
		t.Fatalf("Lock given a downgraded read lease's context: %v; want a re-entry of the write hold", err)
	}
	if err := w2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	rl := must(t)(rw.RLock(ctx))
	start := time.Now()
	if _, err := rw.Lock(rl.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("upgrade: %v, want ErrInvalid", err)
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("upgrade refused only after %v", d)
	}
	_ = rl.Unlock(ctx)

	m := must(t)(c.Mutex(name, dlock.WithoutCohort()).Lock(ctx))
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("TryRLock of a held Mutex: %v, want ErrInvalid", err)
	}
	_ = m.Unlock(ctx)
}

// A reader whose lease ran out without an Unlock (its process died) is dropped from the lock
// by the next script that meets it, even while other readers keep the key alive: a waiting
// writer gets the lock when the live readers leave, not never.
func TestRWMutexDeadReaderIsPruned(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	dead := must(t)(c.RWMutex(name, dlock.WithTTL(300*time.Millisecond), dlock.WithFixedLease()).RLock(ctx))
	live := must(t)(c.RWMutex(name).RLock(ctx))
	w := rwLockAsync(t, c.RWMutex(name), false)
	waitQueued(t, c, name, 1)
	waitDone(t, dead, 5*time.Second) // ended by its deadline, never unlocked
	// The waiting writer's refreshes prune the dead reader while the live one keeps the key.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Readers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead reader never pruned: %+v", info)
		}
	}
	notYet(t, "writer while a live reader reads", w)
	if err := live.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wl := got(t, "writer after the live reader left", w)
	_ = wl.Unlock(ctx)
}

// A read lease is renewed like any other: it outlives its TTL while held.
func TestRWMutexReadLeaseIsRenewed(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rw := c.RWMutex(name, dlock.WithTTL(400*time.Millisecond))
	r := must(t)(rw.RLock(ctx))
	other := must(t)(rw.RLock(ctx))
	select {
	case <-r.Done():
		t.Fatalf("read lease lost while renewed: %v", r.Err())
	case <-time.After(1500 * time.Millisecond): // several TTLs: only renewals keep it
	}
	if _, err := c.RWMutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("writer got a lock renewed by readers: %v", err)
	}
	_ = r.Unlock(ctx)
	_ = other.Unlock(ctx)
}

// Handles sharing a WithOwner id: two read holds of the owner count twice (one Unlock leaves
// the other held), and a write call of the owner while it reads is refused at once instead of
// confirming the owner's read grant as a write lease. Found by review.
func TestRWMutexWithOwnerHandles(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	w := must(t)(c.RWMutex(name).Lock(ctx))
	r2 := rwLockAsync(t, c.RWMutex(name), true)
	waitQueued(t, c, name, 1)
	ro := rwLockAsync(t, c.RWMutex(name, dlock.WithOwner("O")), true)
	waitQueued(t, c, name, 2)
	wo := rwLockAsync(t, c.RWMutex(name, dlock.WithOwner("O")), false)
	waitQueued(t, c, name, 3)
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lr2, lro := got(t, "reader", r2), got(t, "owner O's reader", ro)
	select {
	case r := <-wo:
		if !errors.Is(r.err, dlock.ErrInvalid) {
			t.Fatalf("owner O's Lock while O reads: lease %v, err %v; want ErrInvalid", r.l != nil, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("owner O's Lock while O reads neither refused nor granted")
	}
	second := must(t)(c.RWMutex(name, dlock.WithOwner("O")).RLock(ctx))
	if err := lro.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if second.Err() != nil {
		t.Fatalf("owner O's second read hold ended with its first: %v", second.Err())
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Readers != 2 {
		t.Fatalf("after O unlocked one of two holds: %+v, %v; want 2 readers", info, err)
	}
	_ = second.Unlock(ctx)
	_ = lr2.Unlock(ctx)
	if _, err := c.RWMutex(name, dlock.WithOwner("r:x")).TryRLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("owner id r:x: %v, want ErrInvalid", err)
	}
}

// Thousands of readers that ran out at once are pruned in one call without error while a live
// reader keeps the key (Lua's unpack limit). Found by review.
func TestRWMutexManyDeadReaders(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	live := must(t)(c.RWMutex(name).RLock(ctx))
	short := c.RWMutex(name, dlock.WithTTL(300*time.Millisecond), dlock.WithFixedLease())
	var last *dlock.Lease
	for range 3000 {
		last = must(t)(short.TryRLock(ctx))
	}
	waitDone(t, last, 5*time.Second) // its local deadline: Redis's is a little later
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := c.RWMutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("writer with 3000 dead readers and a live one: %v, want ErrNotObtained", err)
		}
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Readers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the prune: %+v; want the live reader only", info)
		}
	}
	if err := live.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = must(t)(c.RWMutex(name).TryLock(ctx)).Unlock(ctx)
}

// ForceRelease of a read-write lock ends every reader's lease and hands the lock to the
// waiting writer.
func TestRWMutexForceRelease(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rw := c.RWMutex(name)
	r1, r2 := must(t)(rw.RLock(ctx)), must(t)(rw.RLock(ctx))
	<-dlock.Tracked(r1)
	<-dlock.Tracked(r2)
	w := rwLockAsync(t, rw, false)
	waitQueued(t, c, name, 1)
	if _, err := c.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	waitDone(t, r1, 5*time.Second)
	waitDone(t, r2, 5*time.Second)
	wl := got(t, "writer after the force", w)
	if wl.Token() <= r1.Token() {
		t.Errorf("writer token %d not above the readers' %d", wl.Token(), r1.Token())
	}
	_ = wl.Unlock(ctx)
}

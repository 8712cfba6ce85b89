package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// Readers of one Client share one Redis read hold; another Client's reader is a hold of its
// own; the shared hold goes when its last reader unlocks.
func TestRWMutexReadersOfAClientShareOneHold(t *testing.T) {
	dlock.SetReadShareAge(t, time.Hour) // nothing but this test's steps closes the share
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	a := must(t)(c1.RWMutex(name).RLock(ctx))
	b := must(t)(c1.RWMutex(name).TryRLock(ctx))
	if a.Owner() != b.Owner() || a.Token() != b.Token() {
		t.Fatalf("readers of one Client: owners %q/%q, tokens %d/%d; want one shared hold", a.Owner(), b.Owner(), a.Token(), b.Token())
	}
	other := must(t)(c2.RWMutex(name).RLock(ctx))
	if other.Owner() == a.Owner() {
		t.Fatal("another Client's reader shares the first Client's hold")
	}
	readers := func(want int) {
		t.Helper()
		info, err := c1.Inspect(ctx, name)
		if err != nil || info.Readers != want {
			t.Fatalf("Inspect: %+v, %v; want %d readers", info, err, want)
		}
	}
	readers(2)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	readers(2) // b still reads through the shared hold
	if b.Err() != nil || b.Remaining() <= 0 {
		t.Fatalf("the other reader of the shared hold after one unlocked: %v", b.Err())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	readers(1)
	// The share was released with its last reader: a new reader of c1 is a new hold.
	c := must(t)(c1.RWMutex(name).TryRLock(ctx))
	if c.Owner() == a.Owner() {
		t.Fatal("a reader joined a released shared hold")
	}
	for _, l := range []*dlock.Lease{c, other} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = must(t)(c2.RWMutex(name).TryLock(ctx)).Unlock(ctx)
}

// A writer joining the queue is pushed to the Client sharing a read hold, which then lets no
// new local reader join it: the writer is not overtaken for longer than the push takes.
func TestRWMutexQueuedWriterStopsReaderSharing(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	dlock.SetReadShareAge(t, time.Hour)                    // only the push can close the share
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	// c1 listens for writers on a lock whose channel it has subscribed (a lock it waited
	// for): its first reader waits behind a writer of c2.
	w0 := must(t)(c2.RWMutex(name).Lock(ctx))
	r := rwLockAsync(t, c1.RWMutex(name), true)
	waitQueued(t, c2, name, 1)
	_ = w0.Unlock(ctx)
	first := got(t, "first reader", r)
	held := []*dlock.Lease{first}
	w := rwLockAsync(t, c2.RWMutex(name), false)
	waitQueued(t, c2, name, 1)
	for deadline := time.Now().Add(5 * time.Second); ; {
		l, err := c1.RWMutex(name).TryRLock(ctx)
		if errors.Is(err, dlock.ErrNotObtained) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.Owner() != first.Owner() {
			t.Fatalf("a reader took a hold of its own (%q) while a writer waits", l.Owner())
		}
		held = append(held, l)
		if time.Now().After(deadline) {
			t.Fatalf("readers still join the shared hold 5s after a writer queued (%d joined)", len(held)-1)
		}
	}
	notYet(t, "writer while the shared hold has readers", w)
	for _, l := range held {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wl := got(t, "writer after the shared hold's readers left", w)
	if wl.Token() <= first.Token() {
		t.Errorf("writer token %d not above the readers' %d", wl.Token(), first.Token())
	}
	_ = wl.Unlock(ctx)
}

// A reader admitted while a writer waits behind it (the acquire's reply says so) does not
// share its hold: a new local reader queues behind the writer.
func TestRWMutexReaderAdmittedAheadOfAWriterDoesNotShare(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	dlock.SetReadShareAge(t, time.Hour)
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	w1 := must(t)(c2.RWMutex(name).Lock(ctx))
	r := rwLockAsync(t, c1.RWMutex(name), true)
	waitQueued(t, c2, name, 1)
	w2 := rwLockAsync(t, c2.RWMutex(name), false)
	waitQueued(t, c2, name, 2)
	if err := w1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	rl := got(t, "reader admitted after the first writer", r)
	if _, err := c1.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryRLock of the admitted reader's Client while a writer waits: %v, want ErrNotObtained", err)
	}
	notYet(t, "second writer while the reader reads", w2)
	if err := rl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = got(t, "second writer", w2).Unlock(ctx)
}

// Readers of a Client that find the lock written wait together on one Redis wait of their
// Client: the read phase admits one hold for them, which they share.
func TestRWMutexWaitingReadersOfAClientShareOneRedisWait(t *testing.T) {
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	w := must(t)(c2.RWMutex(name).Lock(ctx))
	const n = 5
	rs := make([]<-chan rwResult, n)
	for i := range rs {
		rs[i] = rwLockAsync(t, c1.RWMutex(name), true)
	}
	waitQueued(t, c2, name, 1)
	waitPendingReaders(t, c1, name, n)
	if info, err := c1.Inspect(ctx, name); err != nil || info.Waiters != 1 {
		t.Fatalf("Inspect: %+v, %v; want the Client's readers as one waiter", info, err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var leases []*dlock.Lease
	for i, r := range rs {
		leases = append(leases, got(t, fmt.Sprintf("reader %d", i), r))
		if leases[i].Owner() != leases[0].Owner() {
			t.Fatalf("reader %d has hold %q, reader 0 %q: want one shared hold", i, leases[i].Owner(), leases[0].Owner())
		}
	}
	if info, err := c1.Inspect(ctx, name); err != nil || info.Readers != 1 {
		t.Fatalf("Inspect: %+v, %v; want one reader hold", info, err)
	}
	for _, l := range leases {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = must(t)(c2.RWMutex(name).TryLock(ctx)).Unlock(ctx)
}

// A shared read hold lost in Redis ends every reader's lease; a reader that unlocks after the
// loss, while another still reads, is told its lease was lost, never that it unlocked a held
// lock.
func TestRWMutexSharedHoldLossEndsEveryReader(t *testing.T) {
	dlock.SetReadShareAge(t, time.Hour)
	c, _ := newClient(t, dlock.WithTTL(time.Second), dlock.WithFixedLease())
	ctx := ctxT(t)
	name := redistest.Name(t)
	a := must(t)(c.RWMutex(name).RLock(ctx))
	b := must(t)(c.RWMutex(name).RLock(ctx))
	if a.Owner() != b.Owner() {
		t.Fatal("the readers do not share a hold")
	}
	waitDone(t, a, 5*time.Second) // the fixed lease runs out
	waitDone(t, b, 5*time.Second)
	if err := a.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Unlock of a reader whose shared hold ran out: %v, want ErrNotHeld and ErrLeaseLost", err)
	}
	if err := b.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of the other reader: %v, want ErrNotHeld", err)
	}
	_ = must(t)(c.RWMutex(name).Lock(ctx)).Unlock(ctx) // the lock is free once Redis's TTL ran out
}

func waitPendingReaders(t *testing.T, c *dlock.Client, name string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); dlock.PendingReadWaiters(c, name) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d readers wait together, want %d", dlock.PendingReadWaiters(c, name), n)
		}
	}
}

// Readers of a Client waiting together each have a place on the hold their wait gets: one
// that unlocks at once does not release it under the others, who therefore never fall behind
// a writer that queued after them; a reader that gives up leaves the others waiting.
func TestRWMutexWaitingReadersKeepTheirPlaceBeforeALaterWriter(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	w0 := must(t)(c2.RWMutex(name).Lock(ctx))
	type res struct {
		owner string
		err   error
	}
	ch := make(chan res, 3)
	for range 3 {
		go func() {
			l, err := c1.RWMutex(name).RLock(ctx)
			if err != nil {
				ch <- res{err: err}
				return
			}
			ch <- res{l.Owner(), l.Unlock(ctx)} // unlocks at once
		}()
	}
	short, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := c1.RWMutex(name).RLock(short)
		gaveUp <- err
	}()
	waitPendingReaders(t, c1, name, 4)
	waitQueued(t, c2, name, 1) // c1's one wait for its readers is in Redis's queue
	cancel()
	if err := <-gaveUp; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("reader that gave up: %v", err)
	}
	w2 := rwLockAsync(t, c2.RWMutex(name), false)
	waitQueued(t, c2, name, 2) // c1's one wait for its readers, then the writer
	if err := w0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var owners []string
	for range 3 {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		owners = append(owners, r.owner)
	}
	if owners[0] != owners[1] || owners[1] != owners[2] {
		t.Fatalf("readers that waited together read through holds %v, want one", owners)
	}
	_ = got(t, "writer after the readers", w2).Unlock(ctx)
}

// Readers that come after a writer queued (another Client's, pushed; or their own Client's)
// do not join their Client's wait that is ahead of the writer: they wait behind it.
func TestRWMutexReadersAfterAQueuedWriterWaitBehindIt(t *testing.T) {
	dlock.SetWaitWindows(t, 10*time.Second, 5*time.Second) // order, not pauses of a loaded machine
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("own writer %v", own), func(t *testing.T) {
			c1, c2 := twoClients(t)
			ctx := ctxT(t)
			name := redistest.Name(t)
			w0 := must(t)(c2.RWMutex(name).Lock(ctx))
			r1 := rwLockAsync(t, c1.RWMutex(name), true)
			waitPendingReaders(t, c1, name, 1)
			waitQueued(t, c2, name, 1)
			writer := c2
			if own {
				writer = c1
			}
			w1 := rwLockAsync(t, writer.RWMutex(name), false)
			waitQueued(t, c2, name, 2)
			if !own {
				// The push reaches c1's wait: poll for its effect (no later reader joins it).
				for deadline := time.Now().Add(5 * time.Second); dlock.PendingReadWaiters(c1, name) != 0; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("c1's wait still takes new readers 5s after a writer queued")
					}
				}
			}
			r2 := rwLockAsync(t, c1.RWMutex(name), true)
			waitQueued(t, c2, name, 3) // r2 waits in Redis of its own, behind the writer
			inOrderAfter(t, w0, r1, w1, r2)
		})
	}
}

// Readers of a Client that lock a free name at the same moment share one Redis hold: the
// first one's attempt is the Client's, and the others wait for it.
func TestRWMutexConcurrentFirstReadersShareOneHold(t *testing.T) {
	dlock.SetReadShareAge(t, time.Hour) // a slow start of a goroutine must not take a hold of its own
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	const n = 16
	var start sync.WaitGroup
	start.Add(1)
	ch := make(chan rwResult, n)
	for range n {
		go func() {
			start.Wait()
			l, err := c.RWMutex(name).RLock(ctx)
			ch <- rwResult{l, err}
		}()
	}
	start.Done()
	var leases []*dlock.Lease
	owners := map[string]bool{}
	for range n {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		leases = append(leases, r.l)
		owners[r.l.Owner()] = true
	}
	info, err := c.Inspect(ctx, name)
	if err != nil || info.Readers != len(owners) {
		t.Fatalf("Inspect: %+v, %v; want %d readers", info, err, len(owners))
	}
	if len(owners) != 1 {
		t.Errorf("%d readers that locked together hold %d Redis holds, want 1", n, len(owners))
	}
	for _, l := range leases {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = must(t)(c.RWMutex(name).TryLock(ctx)).Unlock(ctx)
}

// twoClients returns two Clients (two processes, as far as Redis can tell) on one server.
func twoClients(t *testing.T) (*dlock.Client, *dlock.Client) {
	c1, rdb := newClient(t)
	c2 := dlock.New(rdb)
	t.Cleanup(func() { _ = c2.Close(context.Background()) })
	return c1, c2
}

// Close while readers wait together: every one of them gets ErrClosed, and the Client's wait
// leaves nothing in Redis (the lock goes to the next process once its holder unlocks).
func TestRWMutexCloseWhileReadersWaitTogether(t *testing.T) {
	c1, c2 := twoClients(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	w := must(t)(c2.RWMutex(name).Lock(ctx))
	rs := []<-chan rwResult{rwLockAsync(t, c1.RWMutex(name), true), rwLockAsync(t, c1.RWMutex(name), true)}
	waitPendingReaders(t, c1, name, 2)
	waitQueued(t, c2, name, 1)
	if err := c1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if res := <-r; !errors.Is(res.err, dlock.ErrClosed) {
			t.Fatalf("reader waiting at Close: %v, want ErrClosed", res.err)
		}
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := c2.Inspect(ctx, name); err != nil || info.Held || info.Waiters != 0 {
		t.Fatalf("after Close and the writer's Unlock: %+v, %v; want the lock free, nobody queued", info, err)
	}
}

// With no push at all (the writer's user may not publish on dlock's channels), a Client's read
// wait learns from its own next refresh that a writer queued behind its place, so readers that
// come later wait behind that writer instead of joining the place ahead of it. Found by review.
func TestRWMutexLaterReadersWaitBehindAWriterWithoutPush(t *testing.T) {
	dlock.SetWaitWindows(t, 1500*time.Millisecond, 5*time.Second) // waits refresh every 500 ms
	var rules []string
	for _, r := range minimalACL {
		if r != "&dlock:*" {
			rules = append(rules, r)
		}
	}
	c1, _ := newClient(t)
	user := "nopub" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c2 := dlock.New(aclClient(t, redistest.Shared(t), user, rules...))
	t.Cleanup(func() { _ = c2.Close(context.Background()) })
	ctx := ctxT(t)
	name := redistest.Name(t)
	w0 := must(t)(c2.RWMutex(name).Lock(ctx))
	r1 := rwLockAsync(t, c1.RWMutex(name), true)
	waitPendingReaders(t, c1, name, 1)
	waitQueued(t, c1, name, 1)
	w1 := rwLockAsync(t, c2.RWMutex(name), false)
	waitQueued(t, c1, name, 2)
	for deadline := time.Now().Add(5 * time.Second); dlock.PendingReadWaiters(c1, name) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("c1's wait still takes new readers 5s after a writer queued behind it")
		}
	}
	r2 := rwLockAsync(t, c1.RWMutex(name), true)
	waitQueued(t, c1, name, 3) // r2 waits in a place of its own, behind the writer
	inOrderAfter(t, w0, r1, w1, r2)
}

// inOrderAfter checks that, once w0 unlocks, r1 (a reader queued before the writer w1) reads
// first and alone, then w1 writes, then r2 (a reader that came after w1) reads.
func inOrderAfter(t *testing.T, w0 *dlock.Lease, r1, w1, r2 <-chan rwResult) {
	t.Helper()
	ctx := ctxT(t)
	if err := w0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	first := got(t, "reader that came before the writer", r1)
	notYet(t, "writer while the first reader reads", w1)
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wl := got(t, "writer", w1)
	notYet(t, "reader that came after the writer", r2)
	if err := wl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = got(t, "reader that came after the writer", r2).Unlock(ctx)
}

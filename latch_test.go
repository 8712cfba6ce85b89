package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

func mustCount(t *testing.T, d *dlock.Latch, want int) {
	t.Helper()
	if got, err := d.Count(ctxT(t)); err != nil || got != want {
		t.Fatalf("Count = %d, %v; want %d", got, err, want)
	}
}

// TrySetCount starts a latch once; CountDown takes it to zero, where it leaves nothing behind,
// and below zero does nothing.
func TestLatchCountsDownToZeroAndLeavesNothing(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	d := c.Latch(name)
	mustCount(t, d, 0)
	if ok, err := d.TrySetCount(ctx, 2); !ok || err != nil {
		t.Fatalf("TrySetCount on a new latch: %v, %v", ok, err)
	}
	if ok, err := d.TrySetCount(ctx, 5); ok || err != nil {
		t.Fatalf("TrySetCount on a counting latch: %v, %v; want false", ok, err)
	}
	mustCount(t, d, 2)
	if ttl := rdb.PTTL(ctx, lockKey(name)).Val(); ttl <= 0 || ttl > dlock.DefaultLatchTTL {
		t.Fatalf("latch TTL %v, want up to %v", ttl, dlock.DefaultLatchTTL)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	mustCount(t, d, 1)
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	mustCount(t, d, 0)
	if n := rdb.Exists(ctx, lockKey(name)).Val(); n != 0 {
		t.Fatal("an open latch left its key behind")
	}
	if err := d.CountDown(ctx); err != nil { // below zero: nothing
		t.Fatal(err)
	}
	mustCount(t, d, 0)
	if n := rdb.Exists(ctx, lockKey(name)).Val(); n != 0 {
		t.Fatal("CountDown on an open latch wrote a key")
	}
	if ok, err := d.TrySetCount(ctx, 1); !ok || err != nil {
		t.Fatalf("TrySetCount once open again: %v, %v", ok, err)
	}
}

// Wait on a latch with no state returns at once; waiters in several Clients are woken by
// push by the last CountDown (the periodic re-check is set to a minute, so only a push can
// wake them within the test).
func TestLatchWaitersWokenByTheLastCountDown(t *testing.T) {
	dlock.SetLatchRecheck(t, time.Minute)
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	if err := c.Latch(name).Wait(ctx); err != nil {
		t.Fatalf("Wait on a latch never set: %v", err)
	}
	d := c.Latch(name)
	if ok, err := d.TrySetCount(ctx, 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	const waiters = 6
	done := make(chan error, waiters)
	for i := range waiters {
		w := c
		if i%2 == 1 {
			w, _ = newClient(t)
		}
		go func() { done <- w.Latch(name).Wait(ctx) }()
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("a Wait returned at count 1: %v", err)
	default:
	}
	waitSubscribed(t, name, 2)
	start := time.Now()
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		waitReturned(t, done, "a waiter was not woken by the last CountDown")
	}
	t.Logf("%d waiters in 2 Clients woken %v after the last CountDown", waiters, time.Since(start).Round(time.Microsecond))
}

// waitSubscribed waits until n connections listen on the latch's channel (each Client
// subscribes once).
func waitSubscribed(t *testing.T, name string, n int) {
	t.Helper()
	rdb := redistest.Client(t)
	ch := lockKey(name) + ":released"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if m, err := rdb.PubSubNumSub(ctxT(t), ch).Result(); err == nil && m[ch] >= int64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers on %s not reached", n, ch)
		}
	}
}

// A Wait whose ctx ends returns ErrNotObtained with the ctx error.
func TestLatchWaitEndsWithCtx(t *testing.T) {
	c, _ := newClient(t)
	name := redistest.Name(t)
	d := c.Latch(name)
	if _, err := d.TrySetCount(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := d.Wait(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its ctx: %v", err)
	}
	mustCount(t, d, 1)
}

// An abandoned latch expires after its TTL, which opens it.
func TestLatchAbandonedExpiresAfterItsTTL(t *testing.T) {
	dlock.SetLatchRecheck(t, 20*time.Millisecond)
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	d := c.Latch(name, dlock.WithTTL(200*time.Millisecond))
	if _, err := d.TrySetCount(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, lockKey(name)).Val(); ttl <= 0 || ttl > 200*time.Millisecond {
		t.Fatalf("TTL after CountDown %v, want (0, 200ms]", ttl)
	}
	if err := d.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mustCount(t, d, 0)
}

// Bad input and a name used both as a lock and as a latch get ErrInvalid.
func TestLatchBadInput(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	for _, n := range []int{0, -1} {
		if _, err := c.Latch(name).TrySetCount(ctx, n); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("TrySetCount(%d): %v, want ErrInvalid", n, err)
		}
	}
	if _, err := c.Latch("").TrySetCount(ctx, 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("empty name: %v, want ErrInvalid", err)
	}
	if err := c.Latch("").Wait(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("empty name Wait: %v, want ErrInvalid", err)
	}
	if n := rdb.Exists(ctx, lockKey(name)).Val(); n != 0 {
		t.Fatal("bad input left a key")
	}
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := c.Latch(name)
	if _, err := d.TrySetCount(ctx, 1); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "mutex") {
		t.Errorf("TrySetCount on a held Mutex: %v", err)
	}
	if err := d.CountDown(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("CountDown on a held Mutex: %v", err)
	}
	if _, err := d.Count(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Count on a held Mutex: %v", err)
	}
	if err := d.Wait(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Wait on a held Mutex: %v", err)
	}
	_ = l.Unlock(ctx)
	if _, err := d.TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "latch") {
		t.Errorf("Mutex on a latch: %v", err)
	}
	if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Semaphore on a latch: %v", err)
	}
	info, err := c.Inspect(ctx, name)
	if err != nil || info.Kind != "latch" || info.Count != 2 {
		t.Errorf("Inspect = %+v, %v", info, err)
	}
	rdb.Set(ctx, lockKey(name), "x", 0)
	if _, err := d.TrySetCount(ctx, 1); err == nil {
		t.Errorf("TrySetCount on a string key: no error")
	}
	if err := d.CountDown(ctx); err == nil {
		t.Errorf("CountDown on a string key: no error")
	}
}

// A CountDown that go-redis resends (its first send delivered late, after the resend was
// answered) counts once; a TrySetCount resent reports the latch it set as set (found by
// review: the latch opened a CountDown early, and "counting already" was reported).
func TestLatchResentCallsCountOnce(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	setter, raw := resendingClient(t, scripts.LatchSet, lockKey(name))
	if ok, err := setter.Latch(name).TrySetCount(ctx, 2); !ok || err != nil {
		t.Fatalf("TrySetCount resent: %v, %v; want true", ok, err)
	}
	c, _ := resendingClient(t, scripts.LatchDown, lockKey(name))
	if err := c.Latch(name).CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the first sends arrive (1 s late; no event tells)
	mustCount(t, c.Latch(name), 1)
	if ok, err := setter.Latch(name).TrySetCount(ctx, 2); ok || err != nil {
		t.Fatalf("TrySetCount of a counting latch: %v, %v; want false", ok, err)
	}
	_ = raw
}

// Count and Wait read a latch in one round trip: a latch being set meanwhile is seen either
// open or counting, never as a lock (found by review); a key of another type is ErrInvalid.
func TestLatchReadWhileBeingSet(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	for i := range 50 {
		name := redistest.Name(t)
		d := c.Latch(name)
		done := make(chan error, 1)
		go func() {
			_, err := d.Count(ctx)
			done <- err
		}()
		if _, err := d.TrySetCount(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("attempt %d: Count while being set: %v", i, err)
		}
	}
	name := redistest.Name(t)
	rdb.Set(ctx, lockKey(name), "x", 0)
	if _, err := c.Latch(name).Count(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Count on a string key: %v, want ErrInvalid", err)
	}
	if err := c.Latch(name).Wait(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Wait on a string key: %v, want ErrInvalid", err)
	}
}

// A latch broken by force release opens: its waiters return by push.
func TestLatchForceReleasedOpens(t *testing.T) {
	dlock.SetLatchRecheck(t, time.Minute)
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	if _, err := c.Latch(name).TrySetCount(ctx, 3); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Latch(name).Wait(ctx) }()
	waitSubscribed(t, name, 1)
	if _, err := c.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	waitReturned(t, done, "a force-released latch's waiter was not woken")
}

// A late first send of a TrySetCount (go-redis resent it; the resend set the latch, which
// then opened) does not set the latch again, and a late first send of a CountDown (its resend
// opened the latch, which was then set anew) does not count the new latch down (found by
// review: the calls applied were remembered in the latch's hash, gone once it opened).
func TestLatchLateSendsAfterItOpenedChangeNothing(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	setter, _ := resendingClient(t, scripts.LatchSet, lockKey(name))
	other, _ := newClient(t)
	if ok, err := setter.Latch(name).TrySetCount(ctx, 1); !ok || err != nil {
		t.Fatalf("TrySetCount: %v, %v", ok, err)
	}
	if err := other.Latch(name).CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	mustCount(t, other.Latch(name), 0)

	name2 := redistest.Name(t)
	if ok, err := other.Latch(name2).TrySetCount(ctx, 1); !ok || err != nil {
		t.Fatalf("TrySetCount: %v, %v", ok, err)
	}
	c, _ := resendingClient(t, scripts.LatchDown, lockKey(name2))
	if err := c.Latch(name2).CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	mustCount(t, other.Latch(name2), 0)
	if ok, err := other.Latch(name2).TrySetCount(ctx, 2); !ok || err != nil {
		t.Fatalf("TrySetCount again: %v, %v", ok, err)
	}
	time.Sleep(1500 * time.Millisecond) // both late first sends arrive (1 s late; no event tells)
	mustCount(t, other.Latch(name), 0)
	mustCount(t, other.Latch(name2), 2)
}

// A Wait ends with ErrClosed when its Client closes meanwhile; a Wait on a closed Client
// fails at once.
func TestLatchWaitEndsOnClose(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	if _, err := c.Latch(name).TrySetCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Latch(name).Wait(ctx) }()
	waitSubscribed(t, name, 1)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Wait during Close: %v, want ErrClosed", err)
	}
	if err := c.Latch(name).Wait(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Wait after Close: %v, want ErrClosed", err)
	}
}

// An opening pushed late (the "z" of an earlier count, still on its way when the latch was
// set anew and a Wait began) does not end a Wait on the new count: only the opening of the
// count the Wait read does (found by the safety suite's latch-F1, a client paused while the
// latch opened). The stale messages are published by hand, then a second latch's opening on
// the same notifier connection proves they were processed before the first Wait is looked at.
func TestLatchStaleOpeningDoesNotEndWait(t *testing.T) {
	dlock.SetLatchRecheck(t, time.Minute)
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name, other := redistest.Name(t), redistest.Name(t)+"-barrier"
	d := c.Latch(name)
	if _, err := d.TrySetCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.CountDown(ctx); err != nil { // opens: "z <first generation>"
		t.Fatal(err)
	}
	if _, err := d.TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Wait(ctx) }()
	waitSubscribed(t, name, 1)
	// The first count's opening and a generation-less one, as an older dlock publishes.
	for _, stale := range []string{"z", "z 0000000000000000zz"} {
		if err := rdb.Publish(ctx, lockKey(name)+":released", stale).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b := c.Latch(other)
	if _, err := b.TrySetCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	barrier := make(chan error, 1)
	go func() { barrier <- b.Wait(ctx) }()
	waitSubscribed(t, other, 1)
	if err := b.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-barrier; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Wait on a count of 2 ended by a stale opening: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	for range 2 {
		if err := d.CountDown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitReturned(t, done, "the opening of the count the Wait read did not wake it")
}

// waitReturned fails the test unless the Wait whose result comes on done returns nil within
// 10 s; what says which wake-up was expected.
func waitReturned(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the Wait did not return", what)
	}
}

// readSignal is a go-redis hook that tells, on reads, when an HMGET of key has been answered.
type readSignal struct {
	key   string
	reads chan struct{}
}

func (h *readSignal) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *readSignal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); len(a) > 1 && cmd.Name() == "hmget" && a[1] == h.key {
			select {
			case h.reads <- struct{}{}:
			default:
			}
		}
		return err
	}
}
func (h *readSignal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Wait that read a count ends when that count opens, even when the latch was set anew
// before the Wait took the push (a paused process, or the push and the re-check timer ready
// at once): the opening is of a count it read (found by review: it waited on the new count).
// The opening and the new count are written back to back in one transaction, as latch_down
// and a TrySetCount right after it would; the re-check runs every microsecond so the timer is
// ready together with the push.
func TestLatchWaitEndsOnTheOpeningOfACountItRead(t *testing.T) {
	dlock.SetLatchRecheck(t, time.Microsecond)
	ctx := ctxT(t)
	_, raw := newClient(t)
	for i := range 8 {
		name := fmt.Sprintf("%s-%d", redistest.Name(t), i)
		k := lockKey(name)
		rdb := redistest.Client(t)
		sig := &readSignal{key: k, reads: make(chan struct{}, 1)}
		rdb.AddHook(sig)
		c := dlock.New(rdb)
		defer c.Close(context.Background())
		d := c.Latch(name)
		if _, err := d.TrySetCount(ctx, 1); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- d.Wait(ctx) }()
		<-sig.reads // the Wait has read the count (1) and its generation
		f := raw.HMGet(ctx, k, "#g", "#v").Val()
		g1, v := f[0].(string), f[1].(string)
		if _, err := raw.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, k)
			p.Publish(ctx, k+":released", "z "+g1)
			p.HSet(ctx, k, "#k", "latch", "#v", v, "#n", 2, "#g", "another-count")
			p.PExpire(ctx, k, time.Minute)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		waitReturned(t, done, fmt.Sprintf("trial %d: the opening of the count the Wait read", i))
	}
}

// A Client's WithTTL is its leases' TTL, not its latches' lifetime: a latch lives
// DefaultLatchTTL unless given a WithTTL of its own. Found by review: a latch took the
// Client's lease TTL, so with WithTTL(10s) on the Client a latch whose loaders were slower
// than 10 s expired, and Wait saw it open with nobody having counted down.
func TestLatchLifetimeIsNotTheClientsLeaseTTL(t *testing.T) {
	c, rdb := newClient(t, dlock.WithTTL(time.Second))
	ctx := ctxT(t)
	name := redistest.Name(t)
	if _, err := c.Latch(name).TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if pttl := rdb.PTTL(ctx, lockKey(name)).Val(); pttl < dlock.DefaultLatchTTL-time.Minute {
		t.Errorf("a latch of a Client made WithTTL(1s): PTTL %v, want about DefaultLatchTTL (%v)", pttl, dlock.DefaultLatchTTL)
	}
	own := redistest.Name(t)
	if _, err := c.Latch(own, dlock.WithTTL(time.Hour)).TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if pttl := rdb.PTTL(ctx, lockKey(own)).Val(); pttl <= time.Hour-time.Minute || pttl > time.Hour {
		t.Errorf("a latch made WithTTL(1h): PTTL %v, want about an hour", pttl)
	}
}

// A TrySetCount or CountDown whose reply is lost is sent again under the same call id until
// Redis answers, and applies once: the caller gets the answer, not an ErrUnavailable it
// could only retry by counting twice. Found by review: a loader's CountDown whose reply was
// lost returned ErrUnavailable after it had counted, and its retry opened the latch a loader
// early.
func TestLatchCallWhoseReplyIsLostIsSentAgainAndAppliedOnce(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	for _, s := range []*redis.Script{scripts.LatchSet, scripts.LatchDown} {
		if err := s.Load(ctx, redistest.Client(t)).Err(); err != nil { // so the first send is the one that runs
			t.Fatal(err)
		}
	}
	rdb := redistest.Client(t)
	set, down := &dropReply{sha: scripts.LatchSet.Hash()}, &dropReply{sha: scripts.LatchDown.Hash()}
	rdb.AddHook(set)
	rdb.AddHook(down)
	c := dlock.New(rdb, dlock.OnGoRedis()) // go-redis does not resend a script whose reply was lost
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	d := c.Latch(name)
	set.drops.Store(2)
	if ok, err := d.TrySetCount(ctx, 3); !ok || err != nil {
		t.Fatalf("TrySetCount with two replies lost: %v, %v; want true", ok, err)
	}
	mustCount(t, d, 3)
	down.drops.Store(2)
	if err := d.CountDown(ctx); err != nil {
		t.Fatalf("CountDown with two replies lost: %v; want nil", err)
	}
	mustCount(t, d, 2)
	if set.drops.Load() > 0 || down.drops.Load() > 0 {
		t.Fatalf("replies left to drop: set %d, down %d; the test lost none", set.drops.Load(), down.drops.Load())
	}
}

// A latch call given up on without an answer says so: ErrUnavailable, saying it may have been
// applied, with the ctx's error.
func TestLatchCallGivenUpSaysItMayHaveRun(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(rdb)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	srv.Kill()
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	err := c.Latch(redistest.Name(t)).CountDown(ctx)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !contains(err, "may have been applied") {
		t.Errorf("CountDown with Redis down until its ctx ended: %v; want ErrUnavailable, the ctx's error, and that it may have been applied", err)
	}
}

// A hash at a latch's or a semaphore's key that dlock did not write is refused by their reads
// as by their scripts, not read as an open latch or a free semaphore; a latch read as a
// semaphore is named a latch. Found by review.
func TestLatchAndSemaphoreReadsRefuseAForeignHash(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rdb.HSet(ctx, lockKey(name), "foo", "bar")
	d := c.Latch(name)
	if err := d.Wait(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "not a latch") {
		t.Errorf("Wait on a foreign hash: %v, want ErrInvalid", err)
	}
	if _, err := d.Count(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Count on a foreign hash: %v, want ErrInvalid", err)
	}
	if _, err := c.Semaphore(name, 2).Available(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "not a semaphore") {
		t.Errorf("Available on a foreign hash: %v, want ErrInvalid", err)
	}
	latch := redistest.Name(t)
	if _, err := c.Latch(latch).TrySetCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Semaphore(latch, 2).Available(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "held as a latch") {
		t.Errorf("Available on a latch: %v, want ErrInvalid naming a latch", err)
	}
	// Written by another dlock version (its key layout): ErrIncompatible, as the scripts say.
	other := redistest.Name(t)
	rdb.HSet(ctx, lockKey(other), "#k", "sem", "#v", "9", "#n", 2, "#u", 0)
	if _, err := c.Semaphore(other, 2).Available(ctx); !errors.Is(err, dlock.ErrIncompatible) {
		t.Errorf("Available on a semaphore of another layout: %v, want ErrIncompatible", err)
	}
	rdb.HSet(ctx, lockKey(other), "#k", "latch", "#n", 1)
	if _, err := c.Latch(other).Count(ctx); !errors.Is(err, dlock.ErrIncompatible) {
		t.Errorf("Count on a latch of another layout: %v, want ErrIncompatible", err)
	}
}

// afterReply runs do once, after the first EVALSHA of sha ran, then loses that call's reply.
type afterReply struct {
	sha  string
	done atomic.Bool
	do   func()
}

func (h *afterReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *afterReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); len(args) > 1 && args[0] == "evalsha" && args[1] == h.sha && h.done.CompareAndSwap(false, true) {
			h.do()
			cmd.SetErr(io.ErrUnexpectedEOF)
			return io.ErrUnexpectedEOF
		}
		return err
	}
}

// A CountDown that opened its latch, with its reply lost, is answered as applied by its
// resend although the name was taken as a Mutex meanwhile. Found by review: the resend's
// check of the key's kind came before its look in the op log, so it was refused as a mutex
// (ErrInvalid), and the caller told its count was not applied.
func TestLatchCountDownResentAfterTheNameWasReusedIsApplied(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	if err := scripts.LatchDown.Load(ctx, redistest.Client(t)).Err(); err != nil {
		t.Fatal(err)
	}
	other, _ := newClient(t)
	var held *dlock.Lease
	rdb := redistest.Client(t)
	rdb.AddHook(&afterReply{sha: scripts.LatchDown.Hash(), do: func() {
		held = must(t)(other.Mutex(name).TryLock(ctx)) // the latch opened: its name is free
	}})
	c := dlock.New(rdb, dlock.OnGoRedis())
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	d := c.Latch(name)
	if ok, err := d.TrySetCount(ctx, 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Errorf("CountDown that opened the latch, resent once the name was a Mutex's: %v; want nil", err)
	}
	if held == nil {
		t.Fatal("the reply was not lost")
	}
	_ = held.Unlock(ctx)
}

// A name that lock callers of another kind wait for is in use as that kind, even while it is
// free for a moment (its holder's key expired, a hand-off): TrySetCount refuses it with
// ErrInvalid, as a Mutex or another Semaphore is refused on a semaphore's waited-for name,
// and the waiter then gets the lock. Before, the latch took the name and the waiter's next
// attempt failed with ErrInvalid.
func TestLatchRefusesANameOthersWaitFor(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	w, _ := newClient(t)
	for _, kind := range []string{"semaphore", "mutex"} {
		t.Run(kind, func(t *testing.T) {
			name := redistest.Name(t)
			got := make(chan error, 1)
			if kind == "semaphore" {
				if _, err := c.Semaphore(name, 1).Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				r := acquired(ctx, w.Semaphore(name, 1), 1)
				go func() { x := <-r; got <- x.err; _ = x.l.Unlock(ctx) }()
			} else {
				if _, err := c.Mutex(name).Lock(ctx); err != nil {
					t.Fatal(err)
				}
				go func() {
					l, err := w.Mutex(name).Lock(ctx)
					if err == nil {
						_ = l.Unlock(ctx)
					}
					got <- err
				}()
			}
			waitQueued(t, c, name, 1)
			rdb.Del(ctx, lockKey(name)) // the holder's key expired: free, and waited for
			if ok, err := c.Latch(name).TrySetCount(ctx, 1); !errors.Is(err, dlock.ErrInvalid) {
				t.Errorf("TrySetCount on a free %s with a waiter = %v, %v; want ErrInvalid", kind, ok, err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the %s's waiter: %v", kind, err)
			}
		})
	}
}

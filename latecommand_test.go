package dlock_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// Commands of one owner that reach Redis late: an acquire whose reply was lost, or whose first
// send go-redis resent, arriving after a later call of the same owner took the lock. For an
// owner that never re-enters (a cohort, a MultiLock call, a shared read hold), acquire.lua would
// take that hold for a stale one of its own and drop it; it drops it only if an earlier call
// of the owner took it (hold ids grow per Client). Found by review.

// A Client's shared read wait (readshare.go startRead → waitRead) makes
// its first attempt with tryHold and, when that gets no reply, goes on waiting under the SAME
// shareSpec owner. The first attempt, reaching Redis after the wait took the read hold, finds
// its owner reading without its mark, takes that for a stale hold of its own (ARGV[10] '0'),
// drops it, and hands the lock to the writer queued behind: the writer is granted while the
// reader's lease is valid.
func TestLateFirstAttemptOfASharedReadLeavesTheReadHold(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	scripts.Release.Load(ctx, raw)
	rdb := redistest.Client(t)
	hook := &heldBack{n: 1, cleanUps: true}
	rdb.AddHook(hook)
	c := dlock.New(rdb, dlock.OnGoRedis())
	defer c.Close(context.Background())
	name := redistest.Name(t)
	r := must(t)(c.RWMutex(name).RLock(ctx)) // first attempt held back; the wait goes on and gets it
	held := hook.held()
	if len(held) != 1 {
		t.Fatal("no acquire was held back")
	}
	late := held[0]
	other, _ := newClient(t)
	wch := rwLockAsync(t, other.RWMutex(name), false) // a writer queues behind the reader
	waitQueueLen(t, raw, name, 1)
	time.Sleep(10 * time.Millisecond) // past the 4 ms barging window (server time: no event)
	before := raw.HGetAll(ctx, lockKey(name)).Val()
	if err := raw.Do(ctx, late...).Err(); err != nil { // the first attempt arrives
		t.Fatal(err)
	}
	after := raw.HGetAll(ctx, lockKey(name)).Val()
	if !maps.Equal(after, before) {
		t.Errorf("the late first attempt changed the lock:\n before %v\n after  %v", before, after)
	}
	select {
	case w := <-wch:
		if w.err == nil {
			t.Errorf("a writer was granted the lock while the read lease was held (read lease err now: %v)", r.Err())
			_ = w.l.Unlock(ctx)
		}
	case <-time.After(300 * time.Millisecond): // nothing to wait for: no grant may come
	}
	_ = r.Unlock(ctx)
}

// A wait's attempts without a reply are undone by the next attempt through
// its undo list (u:<id> marks), but the list is cut to maxUndo (16) ids: the ids cut out are
// never marked. After 17 attempts without a reply, the wait (a plain Lock: a non-reentrant
// owner of its own, the same for every attempt) takes the lock; the 2nd attempt, arriving
// late, finds its owner holding without its mark and drops the hold.
func TestLateAttemptCutFromAWaitsUndoListLeavesItsHold(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	scripts.Release.Load(ctx, raw)
	rdb := redistest.Client(t)
	hook := &heldBack{n: 17}
	rdb.AddHook(hook)
	c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithoutCohort())
	defer c.Close(context.Background())
	name := redistest.Name(t)
	l := must(t)(c.Mutex(name).Lock(ctx)) // 17 attempts held back, the 18th takes the lock
	held := hook.held()
	if len(held) != 17 {
		t.Fatalf("%d attempts held back, want 17", len(held))
	}
	before := raw.HGetAll(ctx, lockKey(name)).Val()
	if err := raw.Do(ctx, held[1]...).Err(); err != nil { // the 2nd attempt arrives
		t.Fatal(err)
	}
	after := raw.HGetAll(ctx, lockKey(name)).Val()
	if !maps.Equal(after, before) {
		t.Errorf("the late 2nd attempt changed the lock:\n before %v\n after  %v", before, after)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("Unlock of the wait's hold: %v", err)
	}
	if all := raw.HGetAll(ctx, lockKey(name)).Val(); len(all) != 0 {
		t.Errorf("lock still held after the only lease's Unlock: %v", all)
	}
}

// asyncDelayConn delivers the first write that matches after delay, in the background, as a
// network that holds a segment back; the write returns at once (go-redis then times out
// reading and retries on a new connection). Close waits for the delivery.
type asyncDelayConn struct {
	net.Conn
	match   func(string) bool
	armed   *atomic.Bool
	delay   time.Duration
	mu      sync.Mutex
	pending chan struct{}
}

func (c *asyncDelayConn) Write(p []byte) (int, error) {
	if c.armed.Load() && c.match(string(p)) && c.armed.CompareAndSwap(true, false) {
		b := slices.Clone(p)
		done := make(chan struct{})
		c.mu.Lock()
		c.pending = done
		c.mu.Unlock()
		go func() {
			defer close(done)
			time.Sleep(c.delay)
			_ = c.Conn.SetWriteDeadline(time.Time{}) // go-redis's deadline was for the write it thinks done
			_, _ = c.Conn.Write(b)
		}()
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *asyncDelayConn) Close() error {
	c.mu.Lock()
	p := c.pending
	c.mu.Unlock()
	if p != nil {
		go func() { <-p; time.Sleep(50 * time.Millisecond); _ = c.Conn.Close() }()
		return nil
	}
	return c.Conn.Close()
}

// go-redis (default MaxRetries 3) resends a script after a read timeout.
// The cohort's TryLock then succeeds on the resend, so it keeps its owner id, while its first
// send is still on its way. After an Unlock and a new TryLock (same cohort owner, new hold),
// the first send arrives, takes the new hold for a stale one of the cohort's and drops it.
func TestLateFirstSendOfAResentAcquireLeavesTheCohortsLaterHold(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	key := lockKey(name)
	c, raw := resendingClient(t, scripts.Acquire, key+":fence")
	m := c.Mutex(name)
	l1, err := m.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := must(t)(m.TryLock(ctx))
	before := raw.HGetAll(ctx, key).Val()
	time.Sleep(1500 * time.Millisecond) // the first send arrives (1 s late; no event tells)
	after := raw.HGetAll(ctx, key).Val()
	if !maps.Equal(after, before) {
		t.Errorf("the late first send changed the lock:\n before %v\n after  %v", before, after)
	}
	if err := l2.Err(); err != nil {
		t.Errorf("the cohort's later lease was lost to its own earlier send: %v", err)
	}
	if err := l2.Unlock(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Error(err)
	}
	if all := raw.HGetAll(ctx, key).Val(); len(all) != 0 {
		t.Errorf("lock held after the only lease's Unlock: %v", all)
	}
}

// A cohort's TryLock whose first send is delayed (go-redis resends it; the resend is answered):
// the lease is used and unlocked before the first send arrives. That send finds the lock free:
// its hold id is among the owner's recent releases, so it takes nothing (it took the lock under
// a hold nobody tracked, refusing everyone for the lease's TTL).
func TestLateFirstSendAfterUnlockTakesNothing(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	key := lockKey(name)
	c, raw := resendingClient(t, scripts.Acquire, key+":fence")
	l1, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the first send arrives (1 s late; no event tells)
	if all := raw.HGetAll(ctx, key).Val(); len(all) != 0 {
		t.Errorf("lock held after the only lease's Unlock: %v (PTTL %v)", all, raw.PTTL(ctx, key).Val())
	}
	other, _ := newClient(t)
	if l, err := other.Mutex(name).TryLock(ctx); err != nil {
		t.Errorf("another Client is refused a lock nobody holds: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}
}

func acquireNonReentrant(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string) []int64 {
	t.Helper()
	res, err := scripts.Acquire.Run(ctxT(t), rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
		owner, 30000, holdID, 60000, true, 750, k.channel, 500, "PUBLISH", false, 60000, 0, "", 1, "").Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A cohort's live wait W2 (hold id n+5) is queued; a late queued attempt of the same owner's
// earlier wait W1 (hold id n+1: its go-redis first send) arrives. It must not rewrite W2's
// record with its older id (the grant would write hold n+1, which W2 ignores, and W2's next
// attempt would drop it and grant the lock to Y, which queued after W2).
func TestLateQueuedAttemptLeavesTheLiveWaitsPlace(t *testing.T) {
	ctx := ctxT(t)
	rdb := redistest.Client(t)
	k := names(t)
	nonce := "0123456789abcdef"
	acquireMode(t, rdb, k, "X", "hx", "")
	if r := acquireNonReentrant(t, rdb, k, "co", nonce+"5"); r[0] != 0 {
		t.Fatalf("W2 = %v", r)
	}
	time.Sleep(5 * time.Millisecond) // Y queues in a later millisecond (server time: no event)
	if r := acquireMode(t, rdb, k, "Y", "hy", ""); r[0] != 0 {
		t.Fatalf("Y = %v", r)
	}
	acquireNonReentrant(t, rdb, k, "co", nonce+"1") // W1's late first send
	if p := rdb.HGet(ctx, k.log, "p:co").Val(); !strings.HasPrefix(p, nonce+"5 ") {
		t.Errorf("the live wait's record was rewritten by an older command: %q", p)
	}
	if n := releaseMode(t, rdb, k, "X", "hx", "", false); n != 3 {
		t.Fatalf("X's release = %d, want 3", n)
	}
	if r := acquireNonReentrant(t, rdb, k, "co", nonce+"5"); r[0] != 1 {
		t.Errorf("W2, first in line, lost the lock: %v; lock now %v", r, rdb.HGetAll(ctx, k.lock).Val())
	}
}

// Only an attempt whose outcome is unknown moves a Client's cohorts to a new owner id: refusals
// ("not obtained", a definite answer) leave it as it is, so a contended lock's op log does not
// fill with the records of ever new owners.
func TestCohortOwnerStaysAcrossRefusals(t *testing.T) {
	c, _ := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	first := must(t)(c.Mutex(name).TryLock(ctx))
	owner := first.Owner()
	_ = first.Unlock(ctx)
	held := must(t)(other.Mutex(name).Lock(ctx))
	for range 5 {
		if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock of a held lock: %v", err)
		}
	}
	_ = held.Unlock(ctx)
	l := must(t)(c.Mutex(name).TryLock(ctx))
	defer l.Unlock(ctx)
	if l.Owner() != owner {
		t.Fatalf("cohort owner %q after refusals, was %q", l.Owner(), owner)
	}
}

// resendingClient returns a Client whose first call of script sc naming marker (a key) is
// delivered 1 s late, in the background, while go-redis (its default MaxRetries, a 200 ms read
// timeout) resends it and gets the resend answered; and a plain client of the same server.
func resendingClient(t *testing.T, sc *redis.Script, marker string) (*dlock.Client, *redis.Client) {
	raw := redistest.Client(t)
	sc.Load(ctxT(t), raw)
	var armed atomic.Bool
	armed.Store(true)
	o := redistest.Shared(t).Options()
	o.MaxRetries = 3
	o.ReadTimeout = 200 * time.Millisecond
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &asyncDelayConn{Conn: cn, armed: &armed, delay: time.Second, match: func(s string) bool {
			return strings.Contains(s, "evalsha") && strings.Contains(s, sc.Hash()) && strings.Contains(s, marker)
		}}, nil
	}
	rdb := redis.NewClient(o)
	c := dlock.New(rdb, dlock.OnGoRedis()) // go-redis's own resend is what is tested
	t.Cleanup(func() {
		_ = c.Close(context.Background())
		_ = rdb.Close()
	})
	return c, raw
}

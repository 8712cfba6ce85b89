package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// Script-level edge cases, run directly against Redis.

type lockNames struct{ lock, fence, log, queue, live, channel string }

func names(t *testing.T) lockNames {
	base := "dlock:{" + redistest.Name(t) + "}"
	return lockNames{base, base + ":fence", base + ":log", base + ":queue", base + ":live", base + ":released"}
}

// acquireArgs runs the acquire script; queue joins the FIFO when not obtained.
func acquireArgs(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string, queue, reentrant bool) []int64 {
	t.Helper()
	return acquireBarging(t, rdb, k, owner, holdID, queue, reentrant, 0)
}

func acquireBarging(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string, queue, reentrant bool, bargeMs int) []int64 {
	t.Helper()
	res, err := scripts.Acquire.Run(ctxT(t), rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
		owner, 30000, holdID, 60000, queue, 750, k.channel, 500, "PUBLISH", reentrant, 60000, bargeMs).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func acquire(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string) []int64 {
	t.Helper()
	return acquireArgs(t, rdb, k, owner, holdID, false, true)
}

func releaseArgs(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string, onlyIfAcquired, leaving bool) int64 {
	t.Helper()
	return releaseBarging(t, rdb, k, owner, holdID, onlyIfAcquired, leaving, 0)
}

func releaseBarging(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string, onlyIfAcquired, leaving bool, bargeMs int) int64 {
	t.Helper()
	n, err := scripts.Release.Run(ctxT(t), rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		owner, holdID, 60000, k.channel, onlyIfAcquired, 500, "PUBLISH", leaving, bargeMs).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func release(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID string, onlyIfAcquired bool) int64 {
	t.Helper()
	return releaseArgs(t, rdb, k, owner, holdID, onlyIfAcquired, false)
}

func TestAcquireRetryIsNotCountedTwice(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	first := acquire(t, rdb, k, "A", "h1")
	again := acquire(t, rdb, k, "A", "h1") // the same call resent after a lost reply
	if first[0] != 1 || again[0] != 1 || again[1] != first[1] {
		t.Fatalf("acquire then its retry = %v, %v: want both held with one token", first, again)
	}
	if n, _ := rdb.HGet(ctxT(t), k.lock, "A").Int(); n != 1 {
		t.Fatalf("hold count after a retried acquire = %d, want 1", n)
	}
	reentry := acquire(t, rdb, k, "A", "h2")
	if reentry[2] != 2 || reentry[1] != first[1] {
		t.Fatalf("re-entry = %v, want count 2 and token %d", reentry, first[1])
	}
}

func TestReleaseRetryIsAppliedOnce(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	acquire(t, rdb, k, "A", "h2")
	if n := release(t, rdb, k, "A", "h2", false); n != 1 {
		t.Fatalf("release of the inner hold = %d, want 1", n)
	}
	if n := release(t, rdb, k, "A", "h2", false); n != 1 {
		t.Fatalf("retried release = %d, want 1 (already applied)", n)
	}
	if n, _ := rdb.HGet(ctxT(t), k.lock, "A").Int(); n != 1 {
		t.Fatalf("hold count after a retried release = %d, want 1: the outer hold was dropped", n)
	}
	if n := release(t, rdb, k, "A", "h1", false); n != 2 {
		t.Fatalf("last release = %d, want 2 (freed, nobody queued)", n)
	}
	if n := release(t, rdb, k, "A", "h1", false); n != 1 {
		t.Fatalf("retry of the freeing release = %d, want 1, not 'not held'", n)
	}
	if n := release(t, rdb, k, "B", "x", false); n != 0 {
		t.Fatalf("release by a non-owner = %d, want 0", n)
	}
}

func TestReleaseIfAcquiredSparesOtherHolds(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	// An acquire "h2" whose reply was lost never reached Redis: its clean-up must not drop h1.
	if n := release(t, rdb, k, "A", "h2", true); n != 0 {
		t.Fatalf("clean-up of an unapplied acquire = %d, want 0", n)
	}
	if n, _ := rdb.HGet(ctxT(t), k.lock, "A").Int(); n != 1 {
		t.Fatalf("hold count = %d, want 1", n)
	}
	if n := release(t, rdb, k, "A", "h1", true); n != 2 {
		t.Fatalf("clean-up of an applied acquire = %d, want 2", n)
	}
}

func TestAcquireOnKeyWithoutTTLReportsIt(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	rdb.HSet(ctxT(t), k.lock, "someone", 1, "#v", "2") // set by hand, no TTL
	if res := acquire(t, rdb, k, "A", "h1"); res[0] != 0 || res[1] != -1 {
		t.Fatalf("acquire on a key without TTL = %v, want [0 -1]", res)
	}
}

// A key that is not a lock hash (overwritten by hand) is a lock held by someone else: TryLock
// is not obtained, and the holder it was taken from finds it not held.
// A semaphore on a key of another type with a TTL is not obtained, naming the foreign value;
// its acquire stopped with a WRONGTYPE error after it had joined the queue.
func TestSemaphoreOnAWrongTypeKeyIsNotObtained(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	rdb.Set(ctx, lockKey(name), "not a hash", time.Minute)
	if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "not a dlock lock") {
		t.Fatalf("TryAcquire on a string key = %v, want ErrNotObtained naming the foreign value", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Semaphore(name, 2).Acquire(short, 1); !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a string key = %v, want ErrNotObtained at the deadline", err)
	}
}

func TestWrongTypeKeyIsTakenAndNotHeld(t *testing.T) {
	for _, cohort := range []bool{true, false} {
		opts := []dlock.Option{}
		if !cohort {
			opts = append(opts, dlock.WithoutCohort())
		}
		c, rdb := newClient(t, opts...)
		ctx := ctxT(t)
		name := redistest.Name(t)
		rdb.Set(ctx, lockKey(name), "not a hash", 0)
		_, err := c.Mutex(name).TryLock(ctx)
		if !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "not a dlock lock") {
			t.Fatalf("TryLock on a string key = %v, want ErrNotObtained naming the foreign value", err)
		}
		rdb.Del(ctx, lockKey(name))
		l, err := c.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rdb.Set(ctx, lockKey(name), "overwritten", 0)
		if err := l.Extend(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("cohort %v: Extend after the key was overwritten by a string = %v, want ErrNotHeld", cohort, err)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("cohort %v: Unlock after the key was overwritten by a string = %v, want ErrNotHeld", cohort, err)
		}
		var rerr redis.Error
		if err := l.Unlock(ctx); errors.As(err, &rerr) {
			t.Fatalf("a raw Redis error leaked: %v", err)
		}
	}
}

func TestExtendByNonOwnerChangesNothing(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	n, err := scripts.Extend.Run(ctxT(t), rdb, []string{k.lock}, "B", 5).Int()
	if err != nil || n != 0 {
		t.Fatalf("extend by non-owner = %d, %v; want 0", n, err)
	}
	if ttl := rdb.PTTL(ctxT(t), k.lock).Val(); ttl.Milliseconds() < 1000 {
		t.Fatalf("non-owner extend changed PTTL to %v", ttl)
	}
}

func TestFencedSetComparesLargeTokensExactly(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	key := redistest.Name(t)
	big := uint64(1)<<60 + 1 // beyond float64's exact integers
	steps := []struct {
		token uint64
		ok    bool
	}{{9, true}, {10, true}, {9, false}, {10, true}, {big, true}, {big - 1, false}, {big, true}, {11, false}}
	for i, s := range steps {
		err := dlock.FencedSet(ctx, rdb, key, "v"+strconv.Itoa(i), s.token)
		if s.ok != (err == nil) {
			t.Fatalf("step %d: FencedSet(token %d) = %v, want ok=%v", i, s.token, err, s.ok)
		}
		if !s.ok && !errors.Is(err, dlock.ErrStaleToken) {
			t.Fatalf("step %d: rejection %v does not match ErrStaleToken", i, err)
		}
	}
	v, tok, err := dlock.FencedGet(ctx, rdb, key)
	if err != nil || v != "v6" || tok != big {
		t.Fatalf("FencedGet = %q, %d, %v; want v6, %d", v, tok, err, big)
	}
	if v, tok, err := dlock.FencedGet(ctx, rdb, key+"-missing"); err != nil || v != "" || tok != 0 {
		t.Fatalf("FencedGet of a missing resource = %q, %d, %v", v, tok, err)
	}
}

func TestReleaseRetryAfterAnotherHoldsReleaseKeepsTheRest(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	acquire(t, rdb, k, "A", "h2")
	acquire(t, rdb, k, "A", "h3")
	release(t, rdb, k, "A", "h1", false) // applied, reply lost
	release(t, rdb, k, "A", "h2", false)
	if n := release(t, rdb, k, "A", "h1", false); n != 1 {
		t.Fatalf("retried release of h1 = %d, want 1 (already applied)", n)
	}
	if n, _ := rdb.HGet(ctxT(t), k.lock, "A").Int(); n != 1 {
		t.Fatalf("hold count = %d after h1's retry, want 1: h3 was dropped", n)
	}
}

func TestReleaseRetryNeverTouchesALaterHold(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	rdb.Del(ctxT(t), k.lock) // h1 expired before its release reached Redis
	acquire(t, rdb, k, "A", "h4")
	release(t, rdb, k, "A", "h1", false)
	if n, _ := rdb.HGet(ctxT(t), k.lock, "A").Int(); n != 1 || rdb.HExists(ctxT(t), k.lock, "#h4").Val() != true {
		t.Fatal("a late release of an expired hold dropped the owner's newer hold")
	}
}

func TestExtendNeverShortensAnotherHoldsTTL(t *testing.T) {
	c, rdb := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	m := c.Mutex(name, dlock.WithOwner("job-1")) // re-entry in Redis, two holds
	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Extend(ctx, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, lockKey(name)).Val(); ttl < 20*time.Second {
		t.Fatalf("PTTL = %v after a re-entrant hold extended to 100ms: the outer hold's TTL shrank", ttl)
	}
	_ = outer.Unlock(ctx)
}

func TestTokenBlockIsTheSameInGoAndLua(t *testing.T) {
	src, err := os.ReadFile("internal/scripts/head.lua")
	if err != nil {
		t.Fatal(err)
	}
	if want := "local BLOCK = " + strconv.Itoa(dlock.CohortBlock) + "\n"; !strings.Contains(string(src), want) {
		t.Fatalf("head.lua does not say %q: the cohort would hand out tokens of another hold's block", want)
	}
	if want := "local LAYOUT = '" + dlock.LayoutVersion + "'\n"; !strings.Contains(string(src), want) {
		t.Fatalf("head.lua does not say %q: Inspect would call every lock foreign", want)
	}
}

func TestBargingIsBoundedByTheFirstWaitersWait(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	const long = 60000 // a window no test run outlasts: the first waiter has "not waited long"
	acquire(t, rdb, k, "A", "a1")
	if res := acquireArgs(t, rdb, k, "W", "w1", true, true); res[0] != 0 {
		t.Fatalf("W got a held lock: %v", res)
	}
	// W has waited less than the window: the release frees the lock for W to compete for.
	if n := releaseBarging(t, rdb, k, "A", "a1", false, false, long); n != 2 {
		t.Fatalf("release with a fresh first waiter = %d, want 2 (freed, W woken)", n)
	}
	// C, not queued, may take it ahead of W; W, queued, may not barge in turn.
	if res := acquireBarging(t, rdb, k, "C", "c1", false, true, long); res[0] != 1 {
		t.Fatalf("C could not barge: %v", res)
	}
	if res := acquireBarging(t, rdb, k, "X", "x1", true, true, long); res[0] != 0 {
		t.Fatalf("X took a held lock: %v", res)
	}
	// With no window, the next release grants W directly: W is first, X after it.
	if n := releaseBarging(t, rdb, k, "C", "c1", false, false, 0); n != 3 {
		t.Fatalf("release with no window = %d, want 3 (granted)", n)
	}
	if res := acquireArgs(t, rdb, k, "W", "w2", true, true); res[0] != 1 {
		t.Fatalf("W could not confirm its grant: %v", res)
	}
	if res := acquireBarging(t, rdb, k, "C", "c2", false, true, long); res[0] != 0 {
		t.Fatalf("C barged into a held lock: %v", res)
	}
}

// heldBy starts a Redis with a lock that owner holds under hold id.
func heldBy(t *testing.T, owner, id string) (*redis.Client, lockNames) {
	t.Helper()
	rdb, k := redistest.Client(t), names(t)
	if r := acquire(t, rdb, k, owner, id); r[0] != 1 {
		t.Fatalf("%s: %v", owner, r)
	}
	return rdb, k
}

// Waiters that join the queue in one millisecond keep their order of arrival: equal scores
// would sort them by name, and a reader that came after a waiting writer would go first.
func TestQueueKeepsArrivalOrderWithinAMillisecond(t *testing.T) {
	rdb, k := heldBy(t, "holder", "h0")
	ctx := ctxT(t)
	// Names that sort against arrival, sent in one pipeline so most join in one millisecond.
	const n = 40
	var want []string
	pipe := rdb.Pipeline()
	for i := range n {
		owner := fmt.Sprintf("w%02d", n-i)
		want = append(want, owner)
		scripts.Acquire.EvalSha(ctx, pipe, []string{k.lock, k.fence, k.log, k.queue, k.live},
			owner, 30000, "h"+owner, 60000, true, 10000, k.channel, 500, "PUBLISH", true, 60000, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.ZRange(ctx, k.queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("queue order %v, want arrival order %v", got, want)
	}
}

// A queue entry scored in the server's future (written before the clock stepped back, or on a
// master whose clock was ahead before a failover) is not passed on to waiters joining after
// it: their wait would count as 0 until the clock caught up, so a release would not grant the
// first of them for as long as the step, and callers that never queued would barge ahead of it.
func TestQueueDoesNotPassOnAFutureScore(t *testing.T) {
	rdb, k := heldBy(t, "H", "h1")
	ctx := ctxT(t)
	// A dead waiter's entry scored one hour ahead of the server's clock.
	tm := rdb.Time(ctx).Val()
	rdb.ZAdd(ctx, k.queue, redis.Z{Score: float64(tm.Add(time.Hour).UnixMilli()), Member: "ghost"})
	if res := acquireArgs(t, rdb, k, "W", "w1", true, true); res[0] != 0 {
		t.Fatalf("W got a held lock: %v", res)
	}
	s := rdb.ZScore(ctx, k.queue, "W").Val()
	if ahead := s - float64(tm.UnixMilli()); ahead > 1000 {
		t.Fatalf("W joined %.0f ms in the server's future", ahead)
	}
	// No barging window: the release must hand the lock to W, first live waiter.
	if n := releaseBarging(t, rdb, k, "H", "h1", false, false, 0); n != 3 {
		t.Errorf("release with no barging window = %d, want 3 (granted to W)", n)
	}
	if res := acquireBarging(t, rdb, k, "C", "c1", false, true, 0); res[0] == 1 {
		t.Errorf("C, never queued, took the lock ahead of W with barging off: %v", res)
	}
}

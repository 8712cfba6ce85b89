package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// Grants that write the waiter's hold (lib.lua): the waiter's lease starts on the pushed grant.

// acquireMode runs a queued acquire of a lock kind ("" mutex, "r" or "w" read-write).
func acquireMode(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID, mode string) []int64 {
	t.Helper()
	res, err := scripts.Acquire.Run(ctxT(t), rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
		owner, 30000, holdID, 60000, true, 750, k.channel, 500, "PUBLISH", true, 60000, 0, mode).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func releaseMode(t *testing.T, rdb *redis.Client, k lockNames, owner, holdID, mode string, leaving bool) int64 {
	t.Helper()
	n, err := scripts.Release.Run(ctxT(t), rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		owner, holdID, 60000, k.channel, false, 500, "PUBLISH", leaving, 0, mode).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// grantScripted has owner A hold the mutex k, waiter queue for it recording hold, and A's
// release grant it to waiter.
func grantScripted(t *testing.T, rdb *redis.Client, k lockNames, waiter, hold string) {
	t.Helper()
	acquireMode(t, rdb, k, "A", "ha", "")
	acquireMode(t, rdb, k, waiter, hold, "")
	if n := releaseMode(t, rdb, k, "A", "ha", "", false); n != 3 {
		t.Fatalf("A's release = %d, want 3 (granted to %s)", n, waiter)
	}
}

// A waiter whose user may no longer run scripts once it waits still gets the lock from the
// release: the grant wrote its hold, and the pushed message starts its lease.
func TestGrantedWaiterHoldsWithoutRunningAScript(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Shared(t)
	name := redistest.Name(t)
	user := "grantee" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c := dlock.New(aclClient(t, srv, user, minimalACL...))
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	// A first grant to c, with scripts allowed, settles its notification connection (its
	// first subscription wakes every waiter, which then tries again).
	grantTo(t, c.Mutex(name+"-warm-up"))
	held, ch, admin := waitBehind(t, c.Mutex(name))
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "-evalsha", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // past the 4ms barging window: the release grants to the waiter
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var r rwResult
	select {
	case r = <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never got the lock granted to it")
	}
	// Scripts again, before the lease's first renewal (due within the grant's 500ms).
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "+evalsha", "+eval").Err(); err != nil {
		t.Fatal(err)
	}
	if r.err != nil {
		t.Fatalf("granted waiter's Lock = %v, want a lease without running a script", r.err)
	}
	tok, _ := admin.HGet(ctx, lockKey(name), "#t").Uint64()
	if r.l.Token() != tok {
		t.Fatalf("granted lease's token %d, lock's %d", r.l.Token(), tok)
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the granted lease: %v", err)
	}
	// A Client lingers briefly on a lock it waited for (cohortLinger) before it lets go.
	for deadline := time.Now().Add(time.Second); admin.Exists(ctx, lockKey(name)).Val() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("lock still there 1s after the granted lease's Unlock")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitBehind has another Client hold m's lock and m.Lock wait for it in the Redis queue; it
// returns the holder's lease, m's result to come, and a raw client.
func waitBehind(t *testing.T, m *dlock.Mutex) (*dlock.Lease, <-chan rwResult, *redis.Client) {
	t.Helper()
	ctx := ctxT(t)
	holderC, rdb := newClient(t)
	held := must(t)(holderC.Mutex(m.Name()).Lock(ctx))
	ch := make(chan rwResult, 1)
	go func() {
		var r rwResult
		r.l, r.err = m.Lock(ctx)
		ch <- r
	}()
	waitQueueLen(t, rdb, m.Name(), 1)
	return held, ch, rdb
}

// grantTo makes m wait behind a lease of another Client and returns the lease the release
// grants it.
func grantTo(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	held, ch, _ := waitBehind(t, m)
	time.Sleep(10 * time.Millisecond) // past the barging window
	if err := held.Unlock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	l := got(t, "granted waiter", ch)
	t.Cleanup(func() { _ = l.Unlock(context.Background()) })
	return l
}

// A granted lease holds the lock with the grant's short TTL only until its first renewal,
// due within that TTL, which gives the lock the lease's own.
func TestGrantedLeaseGetsItsFullTTLFromItsFirstRenewal(t *testing.T) {
	const ttl = 10 * time.Second
	c, rdb := newClient(t)
	name := redistest.Name(t)
	l := grantTo(t, c.Mutex(name, dlock.WithTTL(ttl)))
	if rem := l.Remaining(); rem > 500*time.Millisecond {
		t.Fatalf("granted lease's Remaining %v before its first renewal, want at most the grant's 500ms", rem)
	}
	deadline := time.Now().Add(2 * time.Second)
	for l.Remaining() < time.Second { // the renewal's reply has come back
		if time.Now().After(deadline) {
			t.Fatalf("granted lease's Remaining still %v after 2s: the first renewal never came", l.Remaining())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if pttl := rdb.PTTL(ctxT(t), lockKey(name)).Val(); pttl < time.Second {
		t.Fatalf("granted lock's PTTL %v after the lease's first renewal, want about %v", pttl, ttl)
	}
	select {
	case <-l.Done():
		t.Fatalf("granted lease ended: %v", l.Err())
	default:
	}
}

// A fixed lease is never renewed: granted, it still holds the lock for its whole TTL.
func TestGrantedFixedLeaseKeepsItsTTL(t *testing.T) {
	const ttl = 3 * time.Second
	c, rdb := newClient(t)
	name := redistest.Name(t)
	l := grantTo(t, c.Mutex(name, dlock.WithTTL(ttl), dlock.WithFixedLease()))
	if pttl := rdb.PTTL(ctxT(t), lockKey(name)).Val(); pttl < time.Second {
		t.Fatalf("granted fixed lease's lock PTTL %v, want about %v", pttl, ttl)
	}
	if rem := l.Remaining(); rem < time.Second {
		t.Fatalf("granted fixed lease's Remaining %v, want about %v", rem, ttl)
	}
}

// The grant writes the hold the waiter recorded; the waiter's next attempt finds it and gives
// it its own TTL, and a waiter leaving instead passes it on.
func TestGrantWritesTheRecordedHold(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	if res := acquireMode(t, rdb, k, "A", "ha", ""); res[0] != 1 {
		t.Fatalf("A: %v", res)
	}
	for _, w := range []string{"W1", "W2"} {
		if res := acquireMode(t, rdb, k, w, "h"+w, ""); res[0] != 0 {
			t.Fatalf("%s got the held lock: %v", w, res)
		}
	}
	time.Sleep(5 * time.Millisecond) // past any barging window
	sub := rdb.Subscribe(ctx, k.channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if n := releaseMode(t, rdb, k, "A", "ha", "", false); n != 3 {
		t.Fatalf("A's release = %d, want 3 (granted)", n)
	}
	tok, _ := rdb.HGet(ctx, k.lock, "#t").Int64()
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "G hW1 0 500 " + strconv.FormatInt(tok, 10) + " 0 W1"; msg.Payload != want {
		t.Fatalf("grant message %q, want %q", msg.Payload, want)
	}
	if v := rdb.HGet(ctx, k.lock, "#hW1").Val(); v != "1" {
		t.Fatalf("W1's recorded hold in the lock = %q, want 1", v)
	}
	if pttl := rdb.PTTL(ctx, k.lock).Val(); pttl > 500*time.Millisecond {
		t.Fatalf("granted lock's PTTL %v, want the grace", pttl)
	}
	// W1's attempt, before it heard of the grant: held, with its own TTL from now on.
	if res := acquireMode(t, rdb, k, "W1", "hW1", ""); res[0] != 1 || res[1] != tok || res[2] != 1 {
		t.Fatalf("W1's attempt after its grant = %v, want held with token %d, count 1", res, tok)
	}
	if pttl := rdb.PTTL(ctx, k.lock).Val(); pttl < 20*time.Second {
		t.Fatalf("lock's PTTL after the grantee's attempt %v, want its 30s TTL", pttl)
	}
	// W1's release grants W2's recorded hold; W2 gives up and passes it on (nobody waits).
	if n := releaseMode(t, rdb, k, "W1", "hW1", "", false); n != 3 {
		t.Fatalf("W1's release = %d, want 3", n)
	}
	if v := rdb.HGet(ctx, k.lock, "#hW2").Val(); v != "1" {
		t.Fatalf("W2's recorded hold in the lock = %q, want 1", v)
	}
	releaseMode(t, rdb, k, "W2", "hW2", "", true)
	if n := rdb.Exists(ctx, k.lock).Val(); n != 0 {
		t.Fatalf("lock still held after its grantee left the queue: %v", rdb.HGetAll(ctx, k.lock).Val())
	}
	for f := range rdb.HGetAll(ctx, k.log).Val() {
		if strings.HasPrefix(f, "p:") || strings.HasPrefix(f, "g:") {
			t.Fatalf("op log after the waits: %v, want no pending or grant records", rdb.HGetAll(ctx, k.log).Val())
		}
	}
}

// Readers first in line are granted together, each with its recorded hold, and told whether a
// writer waits behind them; one owner waiting to read and to write records two holds.
func TestReadersGrantedTogetherWithTheirRecordedHolds(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	if res := acquireMode(t, rdb, k, "W0", "hw0", "w"); res[0] != 1 {
		t.Fatalf("W0: %v", res)
	}
	acquireMode(t, rdb, k, "O", "hr", "r")
	acquireMode(t, rdb, k, "R", "hR", "r")
	acquireMode(t, rdb, k, "O", "hw", "w")
	sub := rdb.Subscribe(ctx, k.channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if n := releaseMode(t, rdb, k, "W0", "hw0", "w", false); n != 3 {
		t.Fatalf("W0's release = %d, want 3", n)
	}
	tok := rdb.HGet(ctx, k.lock, "#t").Val()
	var got []string
	for len(got) < 2 {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msg.Payload)
	}
	want := []string{"G hr 0 500 " + tok + " 1 O", "G hR 0 500 " + tok + " 1 R"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("grant messages %q, want %q", got, want)
	}
	h := rdb.HGetAll(ctx, k.lock).Val()
	if h["O"] != "1" || h["R"] != "1" || h["#hr"] != "O" || h["#hR"] != "R" || h["#r"] != "2" || h["#hw"] != "" {
		t.Fatalf("lock after the readers' grant: %v", h)
	}
	if v := rdb.HGet(ctx, k.log, "p:w:O").Val(); !strings.HasPrefix(v, "hw ") {
		t.Fatalf("O's writer record %q, want its own hold hw", v)
	}
	// The readers leave the read phase: the last one grants O's write hold.
	releaseMode(t, rdb, k, "R", "hR", "r", false)
	if n := releaseMode(t, rdb, k, "O", "hr", "r", false); n != 3 {
		t.Fatalf("last reader's release = %d, want 3", n)
	}
	h = rdb.HGetAll(ctx, k.lock).Val()
	if h["#m"] != "w" || h["#hw"] != "1" || h["O"] != "1" {
		t.Fatalf("lock after the writer's grant: %v", h)
	}
}

// A waiter leaving the queue gives back the hold a grant wrote for it, and only that hold when
// its owner id holds the lock elsewhere too.
func TestLeavingWaiterGivesBackOnlyItsGrantedHold(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	grantScripted(t, rdb, k, "O", "h1")
	// The same owner id locks again elsewhere (WithOwner): a re-entry on top of the grant.
	if res := acquireArgs(t, rdb, k, "O", "h2", false, true); res[0] != 1 || res[2] != 2 {
		t.Fatalf("O's second hold = %v, want count 2", res)
	}
	releaseMode(t, rdb, k, "O", "h1", "", true) // the waiter of h1 gives up
	h := rdb.HGetAll(ctx, k.lock).Val()
	if h["O"] != "1" || h["#h2"] != "1" || h["#h1"] != "" {
		t.Fatalf("lock after the waiter of h1 left: %v, want O's other hold h2 alone", h)
	}
}

// A pushed grant naming an attempt older than the last one Redis answered may have ended
// before that answer (expired, passed on, lost in a failover): the waiter does not take it.
func TestStaleGrantIsNotTaken(t *testing.T) {
	ctx := ctxT(t)
	name := redistest.Name(t)
	c, _ := newClient(t)
	held, ch, rdb := waitBehind(t, c.Mutex(name))
	record := func() (field, id string, attempt int) {
		for f, v := range rdb.HGetAll(ctx, lockKey(name)+":log").Val() {
			if rest, ok := strings.CutPrefix(f, "p:"); ok {
				p := strings.Fields(v)
				n, _ := strconv.Atoi(p[1])
				return rest, p[0], n
			}
		}
		t.Fatal("no pending hold recorded for the waiter")
		return
	}
	owner, id, n := record()
	if n < 1 {
		t.Fatalf("recorded attempt %d", n)
	}
	stale := fmt.Sprintf("G %s %d 500 12345 0 %s", id, n-1, owner)
	if err := rdb.Publish(ctx, lockKey(name)+":released", stale).Err(); err != nil {
		t.Fatal(err)
	}
	// Woken, the waiter does not take the grant: it tries again, which records its next attempt.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, _, m := record(); m > n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never tried again after a stale grant")
		}
	}
	notYet(t, "the waiter, after a stale grant", ch)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := got(t, "the waiter", ch)
	if l.Token() == 12345 {
		t.Fatal("the waiter's lease has the stale grant's token")
	}
	_ = l.Unlock(ctx)
}

// Two waits of one WithOwner id: when one's recorded hold is admitted by a script that the
// other runs, the other's hold counts as one more (found by review: two holds on a count of
// one let a writer in while a reader still held).
func TestReadersOfOneOwnerIdAreCountedApart(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	acquireMode(t, rdb, k, "W", "hw", "w")
	acquireMode(t, rdb, k, "E", "he", "r") // ahead of O (same-ms ties go by name)
	acquireMode(t, rdb, k, "O", "ha", "r") // O's first wait records ha
	rdb.Del(ctx, k.lock)                   // the writer's hold ran out: free, nobody granted yet
	// O's other caller (TryRLock): its script grants E, which admits O's recorded hold ha.
	res, err := scripts.Acquire.Run(ctx, rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
		"O", 30000, "hb", 60000, false, 750, k.channel, 500, "PUBLISH", true, 60000, 0, "r").Int64Slice()
	if err != nil || res[0] != 1 {
		t.Fatalf("O's second reader = %v, %v; want held", res, err)
	}
	if h := rdb.HGetAll(ctx, k.lock).Val(); h["O"] != "2" || h["#ha"] != "O" || h["#hb"] != "O" {
		t.Fatalf("lock after O's two holds: %v, want O counted twice", h)
	}
	releaseMode(t, rdb, k, "O", "hb", "r", false)
	releaseMode(t, rdb, k, "E", "he", "r", false)
	if h := rdb.HGetAll(ctx, k.lock).Val(); h["#m"] != "r" || h["O"] != "1" || h["#ha"] != "O" {
		t.Fatalf("lock after O's second hold and E left: %v, want O still reading with ha", h)
	}
}

// A waiter leaving the queue also drops the holds of its earlier hold ids (attempts that got
// no usable reply), and an attempt sent with them drops them first; an attempt under a
// given-up id that arrives late (a lost command delivered after later ones) changes nothing
// (found by review).
func TestUndoneHoldIdsAreDropped(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	grantScripted(t, rdb, k, "W", "h1")
	// W never heard of its grant of h1 (its attempt's reply was lost) and leaves under h2.
	_, err := scripts.Release.Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		"W", "h2", 60000, k.channel, false, 500, "PUBLISH", true, 0, "", "h1").Result()
	if err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, k.lock).Val() != 0 {
		t.Fatalf("lock after W left with h1 to undo: %v", rdb.HGetAll(ctx, k.lock).Val())
	}
	// An attempt under the given-up id that reaches Redis only now changes nothing.
	if res := acquireMode(t, rdb, k, "W", "h1", ""); res[0] != 0 {
		t.Fatalf("late attempt under given-up h1 = %v, want not obtained", res)
	}
	if rdb.Exists(ctx, k.lock).Val() != 0 || rdb.ZCard(ctx, k.queue).Val() != 0 {
		t.Fatalf("late attempts under given-up ids changed the lock %v or queue %v",
			rdb.HGetAll(ctx, k.lock).Val(), rdb.ZRange(ctx, k.queue, 0, -1).Val())
	}
	// W's attempt under h5 finds its own hold h4 (taken with a lost reply) and drops it first.
	acquireMode(t, rdb, k, "W", "h4", "")
	res, err := scripts.Acquire.Run(ctx, rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
		"W", 30000, "h5", 60000, true, 750, k.channel, 500, "PUBLISH", true, 60000, 0, "", 2, "h4").Int64Slice()
	if err != nil || res[0] != 1 || res[2] != 1 {
		t.Fatalf("W's attempt under h5 undoing h4 = %v, %v; want held with count 1", res, err)
	}
	if h := rdb.HGetAll(ctx, k.lock).Val(); h["#h4"] != "" || h["#h5"] != "1" || h["W"] != "1" {
		t.Fatalf("lock after W's attempt under h5: %v", h)
	}
}

// A waiter first in line that leaves the queue of a free lock (freed for it to compete for,
// "w <owner>", then its ctx ended) hands the lock on: the waiter behind it is woken by push,
// not by its next refresh (made 10 s here, past got's limit). Found by review.
func TestWaiterLeavingTheHeadOfAFreeLockWakesTheNext(t *testing.T) {
	dlock.SetWaitWindows(t, 30*time.Second, 5*time.Second)
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	base := "dlock:{" + name + "}"
	k := lockNames{base, base + ":fence", base + ":log", base + ":queue", base + ":live", base + ":released"}
	acquireMode(t, rdb, k, "A", "ha", "w")
	acquireMode(t, rdb, k, "X", "hx", "w") // X queues first
	r := rwLockAsync(t, c.RWMutex(name), true)
	waitQueued(t, c, name, 2)
	// A releases while X has waited less than the barging window: X is only woken.
	n, err := scripts.Release.Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		"A", "ha", 60000, k.channel, false, 500, "PUBLISH", false, 60000, "w").Int64()
	if err != nil || n != 2 {
		t.Fatalf("A's release = %d, %v; want 2 (freed, X woken to compete)", n, err)
	}
	releaseMode(t, rdb, k, "X", "hx", "w", true) // X gives up
	_ = got(t, "reader behind the waiter that left", r).Unlock(ctx)
}

// A waiter whose queue score runs ahead of the server's clock (joins in one millisecond are
// placed up to 1 ms ahead of it) has waited 0, not less: a release asked to hand the lock on
// at once grants it, and a caller that may not barge (window 0) does not go ahead of it. A
// negative wait did both wrong (seen as a flake of TestReadersGrantedTogetherWithTheirRecordedHolds).
func TestWaiterQueuedAheadOfTheClockIsFirst(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	// aheadOfClock moves member's queue score ahead of the server's clock: by an hour, so the
	// clock cannot catch up before the script runs (only the sign of the wait matters).
	aheadOfClock := func(k lockNames, member string) {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		score := float64(now.Add(time.Hour).UnixMilli())
		if err := rdb.ZAddXX(ctx, k.queue, redis.Z{Score: score, Member: member}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	k := names(t)
	acquireMode(t, rdb, k, "A", "ha", "")
	acquireMode(t, rdb, k, "B", "hb", "")
	aheadOfClock(k, "B")
	if n := releaseMode(t, rdb, k, "A", "ha", "", false); n != 3 {
		t.Errorf("A's release = %d, want 3 (handed to B, first in line)", n)
	}

	k = names(t)
	acquireMode(t, rdb, k, "A", "ha", "")
	acquireMode(t, rdb, k, "B", "hb", "")
	aheadOfClock(k, "B")
	if err := rdb.Del(ctx, k.lock).Err(); err != nil { // A's hold expired: the lock is free
		t.Fatal(err)
	}
	if res := acquireBarging(t, rdb, k, "C", "hc", true, true, 0); res[0] == 1 {
		t.Errorf("C, which may not barge, took the lock ahead of B: %v", res)
	}
	if h := rdb.HGetAll(ctx, k.lock).Val(); h["B"] == "" {
		t.Errorf("lock after C's attempt: %v, want it granted to B", h)
	}
}

package main

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// acq is an ok acquire of lock 0 by client c, called at call and returned at ret (ms).
func acq(c int, call, ret int64, tok uint64) op {
	return op{Client: c, Kind: "acquire", Call: call * ms, Return: ret * ms, Token: tok, Result: "ok"}
}

func rel(c int, acqCall, call int64, res string) op {
	return op{Client: c, Kind: "release", Call: call * ms, Return: (call + 1) * ms, Acq: acqCall * ms, Result: res}
}

func TestDoubleGrants(t *testing.T) {
	ttl := 100 * time.Millisecond // lease 99ms
	cases := []struct {
		name string
		ops  []op
		want int
	}{
		{"second grant before the first could expire", []op{acq(1, 0, 1, 1), acq(2, 10, 20, 2)}, 1},
		{"after the first was released", []op{acq(1, 0, 1, 1), rel(1, 0, 5, "ok"), acq(2, 10, 20, 2)}, 0},
		{"after a release with an unknown outcome", []op{acq(1, 0, 1, 1), rel(1, 0, 5, "unknown"), acq(2, 10, 20, 2)}, 0},
		{"a refused release frees nothing", []op{acq(1, 0, 1, 1), rel(1, 0, 5, "fail"), acq(2, 10, 20, 2)}, 1},
		{"after the first could have expired", []op{acq(1, 0, 1, 1), acq(2, 10, 100, 2)}, 0},
		{"within the window the holder last read", []op{func() op { o := acq(1, 0, 1, 1); o.Until = 200 * ms; return o }(), acq(2, 10, 150, 2)}, 1},
		// Client 2 was granted at about 0 but paused before it recorded its return; client 1,
		// waiting since -50, was granted when client 2's lease expired and returned at 101
		// with a window to 200. Return order is not grant order here.
		// c1 holds [0,1] and releases at 5; c2 is granted [3,6] and holds to 102; c3, waiting
		// since 2, returns at 50 while c2 certainly holds.
		{"a waiter granted while another holds", []op{acq(1, 0, 1, 1), rel(1, 0, 5, "ok"), acq(2, 3, 6, 2), acq(3, 2, 50, 3)}, 1},
		{"paused grantee returns late", []op{acq(2, -10, 120, 1), func() op { o := acq(1, -50, 101, 2); o.Until = 200 * ms; return o }()}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var acquires []op
			for _, o := range c.ops {
				if o.Kind == "acquire" {
					acquires = append(acquires, o)
				}
			}
			if got := doubleGrants(acquires, c.ops, ttl); got != c.want {
				t.Fatalf("doubleGrants = %d, want %d", got, c.want)
			}
		})
	}
}

func TestTokenRegressions(t *testing.T) {
	if n := tokenRegressions([]op{acq(1, 0, 1, 5), acq(2, 2, 3, 6), acq(1, 4, 5, 6)}); n != 1 {
		t.Fatalf("a repeated token after its grant returned: %d regressions, want 1", n)
	}
	// Concurrent acquires may return tokens in either order.
	if n := tokenRegressions([]op{acq(1, 0, 10, 6), acq(2, 1, 5, 5)}); n != 0 {
		t.Fatalf("concurrent acquires: %d regressions, want 0", n)
	}
}

func TestStaleReadAndOverlap(t *testing.T) {
	w := func(c int, call, ret int64, tok uint64) op {
		return op{Client: c, Kind: "write", Call: call * ms, Return: ret * ms, Token: tok, Result: "ok"}
	}
	r := func(c int, call int64, tok uint64) op {
		return op{Client: c, Kind: "read", Call: call * ms, Return: (call + 1) * ms, Token: tok, Result: "ok"}
	}
	v := check([]op{w(1, 0, 1, 5), w(2, 2, 3, 6), r(1, 4, 5)}, nil, 100*time.Millisecond, false, nil)
	if v.StaleAccepted != 1 {
		t.Fatalf("a read of token 5 after token 6 was written: %d stale, want 1", v.StaleAccepted)
	}
	a1, a2 := acq(1, 0, 1, 1), acq(2, 2, 3, 2)
	a1.Until, a2.Until = 50*ms, 60*ms
	if v := check([]op{a1, a2}, nil, 100*time.Millisecond, false, nil); v.Overlaps != 1 {
		t.Fatalf("two windows [1,50] and [3,60]: %d overlaps, want 1", v.Overlaps)
	}
}

// The Cluster slot of a lock's keys, as CLUSTER KEYSLOT computes it.
func TestSlotOf(t *testing.T) {
	if got := slotOf("foo"); got != 12182 {
		t.Fatalf("slotOf(foo) = %d, want 12182", got)
	}
	if thirdOf(5460) != 0 || thirdOf(5461) != 1 || thirdOf(10921) != 1 || thirdOf(10922) != 2 || thirdOf(16383) != 2 {
		t.Fatal("thirdOf does not follow StartCluster's split")
	}
}

// Goroutines of one process are holders of their own: their windows must not overlap.
func TestGoroutinesAreHolders(t *testing.T) {
	a1, a2 := acq(1, 0, 1, 1), acq(1, 2, 3, 2)
	a1.G, a2.G = 1, 2
	a1.Until, a2.Until = 50*ms, 60*ms
	if v := check([]op{a1, a2}, nil, 100*time.Millisecond, false, nil); v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("two goroutines' windows [1,50] and [3,60]: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	a2.G = 1 // the same goroutine: a re-entry is not a second holder
	if v := check([]op{a1, a2}, nil, 100*time.Millisecond, false, nil); v.Overlaps != 0 {
		t.Fatalf("one goroutine: %d overlaps, want 0", v.Overlaps)
	}
}

// A lease handed over locally (cohorting) holds for certain only to the end of the window
// its holder read, not to its call + TTL: its Redis hold may be older.
func TestCohortLeaseBound(t *testing.T) {
	a, b := acq(1, 0, 1, 1), acq(2, 40, 45, 70)
	a.Until = 30 * ms
	rel := rel(1, 0, 35, "fail") // refused: a's hold was gone by then
	if n := doubleGrants([]op{a, b}, []op{a, b, rel}, 100*time.Millisecond); n != 1 {
		t.Fatalf("plain lease: %d double grants, want 1 (held to call + TTL)", n)
	}
	a.Cohort = true
	if n := doubleGrants([]op{a, b}, []op{a, b, rel}, 100*time.Millisecond); n != 0 {
		t.Fatalf("cohort lease: %d double grants, want 0 (held only to the window read)", n)
	}
}

// A forced release ends the holder's window and certain hold at its call.
func TestForcedRelease(t *testing.T) {
	a, b := acq(1, 0, 1, 1), acq(2, 20, 60, 2)
	a.Until, b.Until = 90*ms, 150*ms
	a.Lost, a.DoneAt = true, 52*ms
	f := op{Kind: "force", Call: 50 * ms, Return: 51 * ms, Result: "ok", Note: "kill-t"}
	v := check([]op{a, b}, nil, 100*time.Millisecond, false, nil)
	if v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("without the force: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	v = check([]op{a, b, f}, nil, 100*time.Millisecond, false, nil)
	if v.Overlaps != 0 || v.DoubleGrants != 0 || v.ForcesNoticed != 1 || v.NoticeKill == nil || v.Notice.Max != 2 {
		t.Fatalf("with the force: %+v", v)
	}
	if res := linearizeOne([]op{a, b, f}); res != "ok" {
		t.Fatalf("porcupine with the force: %s", res)
	}
	if res := linearizeOne([]op{a, b}); res != "illegal" {
		t.Fatalf("porcupine without the force: %s", res)
	}
}

func linearizeOne(ops []op) string {
	res, _, _ := linearize(ops, 100*time.Millisecond, "", "test", 5*time.Second)
	return res
}

// A force's notice time is its holder's: a waiter granted while the force ran (ForceRelease
// hands the lock to it) and lost to the next force, or a lease broken by an earlier force and
// noticed late, says nothing of how fast this force was noticed.
func TestForceNoticeAttribution(t *testing.T) {
	ttl := 5 * time.Second
	force := func(call int64, note string) op {
		return op{Kind: "force", Call: call * ms, Return: (call + 1) * ms, Result: "ok", Note: note}
	}
	lost := func(o op, until, done int64) op {
		o.Until, o.Lost, o.DoneAt = until*ms, true, done*ms
		return o
	}

	// a holds when f1 comes right after a kill and learns of it only at its Unlock; b, waiting
	// since 10, is granted by f1 and loses its lock to f2 2s later, noticing within 3ms.
	a := acq(1, 0, 1, 1)
	a.Until = 2000 * ms
	b := lost(acq(2, 10, 52, 2), 2100, 2003)
	v := check([]op{a, rel(1, 0, 100, "fail"), b, force(50, "kill-t"), force(2000, "")}, nil, ttl, false, nil)
	if v.ForcesNoticed != 1 || v.ForcesMissed != 1 || v.Notice == nil || v.Notice.Max != 3 || v.NoticeKill != nil {
		t.Fatalf("a waiter granted by the force: noticed %d, missed %d, notice %v, after a kill %v; want 1, 1, max 3ms, none",
			v.ForcesNoticed, v.ForcesMissed, v.Notice, v.NoticeKill)
	}

	// f1 breaks a's hold; c takes the lock at 60 and f2 breaks c's at 100; a notices at 105,
	// c at 300: f2 was noticed after 200ms, not 5.
	a = lost(acq(1, 0, 1, 1), 2000, 105)
	c := lost(acq(2, 60, 61, 2), 2000, 300)
	v = check([]op{a, rel(1, 0, 106, "fail"), c, rel(2, 60, 301, "fail"), force(50, ""), force(100, "")}, nil, ttl, false, nil)
	if v.ForcesNoticed != 2 || v.Notice == nil || v.Notice.P50 != 55 || v.Notice.Max != 200 {
		t.Fatalf("a hold broken once: noticed %d, notice %v; want 2, p50 55ms, max 200ms", v.ForcesNoticed, v.Notice)
	}
}

// relTok is rel with the lease's token, as the client records it (the model checks it).
func relTok(c int, acqCall, call int64, tok uint64) op {
	o := rel(c, acqCall, call, "ok")
	o.Token = tok
	return o
}

// Read-write lock: readers may overlap readers; a writer's window may overlap no other lease,
// reader or writer; a writer's token exceeds every earlier lease's, a reader's every earlier
// writer's (readers of one phase share a token).
func TestReadWrite(t *testing.T) {
	ttl := 100 * time.Millisecond
	read := func(c int, call, ret, until int64, tok uint64) op {
		o := acq(c, call, ret, tok)
		o.Mode, o.Until = "r", until*ms
		return o
	}
	write := func(c int, call, ret, until int64, tok uint64) op {
		o := acq(c, call, ret, tok)
		o.Until = until * ms
		return o
	}
	good := []op{
		read(1, 0, 1, 50, 1), read(2, 2, 3, 60, 1), relTok(1, 0, 40, 1), relTok(2, 2, 45, 1), // one read phase
		write(3, 5, 46, 90, 2), relTok(3, 5, 80, 2), // waits for both readers
		read(1, 81, 82, 150, 3), read(2, 83, 84, 150, 3), relTok(1, 81, 120, 3), relTok(2, 83, 121, 3),
	}
	v := check(good, nil, ttl, false, nil)
	if v.Overlaps != 0 || v.DoubleGrants != 0 || v.TokenRegressions != 0 || v.ForeignReleases != 0 {
		t.Fatalf("good read-write history: %+v", v)
	}
	if res := linearizeOne(good); res != "ok" {
		t.Fatalf("porcupine on the good history's writers: %s", res)
	}

	// A writer granted while a reader holds: its window overlaps the reader's.
	bad := []op{read(1, 0, 1, 50, 1), write(2, 2, 3, 60, 2), rel(1, 0, 40, "ok"), rel(2, 2, 45, "ok")}
	if v := check(bad, nil, ttl, false, nil); v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("a writer beside a reader: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	// A reader granted while a writer holds.
	bad = []op{write(1, 0, 1, 50, 1), read(2, 2, 3, 60, 2), rel(1, 0, 40, "ok"), rel(2, 2, 45, "ok")}
	if v := check(bad, nil, ttl, false, nil); v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("a reader beside a writer: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	// Two writers: porcupine sees them too.
	bad = []op{write(1, 0, 1, 50, 1), write(2, 2, 3, 60, 2), relTok(1, 0, 40, 1), relTok(2, 2, 45, 2)}
	if res := linearizeOne(bad); res != "illegal" {
		t.Fatalf("porcupine on two writers at once: %s", res)
	}

	// Tokens: a reader sharing an earlier reader's token is fine, one below a writer's or a
	// writer's equal to a reader's is not.
	if n := tokenRegressions([]op{read(1, 0, 1, 50, 4), read(2, 2, 3, 50, 4)}); n != 0 {
		t.Fatalf("readers of one phase: %d regressions, want 0", n)
	}
	if n := tokenRegressions([]op{write(1, 0, 1, 50, 4), read(2, 60, 61, 90, 4)}); n != 1 {
		t.Fatalf("a reader with an earlier writer's token: %d regressions, want 1", n)
	}
	if n := tokenRegressions([]op{read(1, 0, 1, 50, 4), write(2, 60, 61, 90, 4)}); n != 1 {
		t.Fatalf("a writer with an earlier reader's token: %d regressions, want 1", n)
	}
	if n := tokenRegressions([]op{read(1, 0, 1, 50, 5), read(2, 60, 61, 90, 4)}); n != 1 {
		t.Fatalf("a reader below an earlier reader's token: %d regressions, want 1", n)
	}

	// A reader releasing after another reader joined releases nothing of the other's.
	if v := check([]op{read(1, 0, 1, 50, 1), read(2, 2, 3, 60, 1), rel(1, 0, 10, "ok")}, nil, ttl, false, nil); v.ForeignReleases != 0 {
		t.Fatalf("a reader's release beside another reader: %d foreign, want 0", v.ForeignReleases)
	}
	if v := check([]op{write(1, 0, 1, 50, 1), read(2, 2, 3, 60, 2), rel(1, 0, 10, "ok")}, nil, ttl, false, nil); v.ForeignReleases != 1 {
		t.Fatalf("a writer's release after a reader came in: %d foreign, want 1", v.ForeignReleases)
	}
}

// A multi-lock lease is recorded as one exclusive acquire per member (with its own token):
// its window must not overlap a Mutex lease's on any member, nor the same multi-lock
// lease's on another member count against it.
func TestMultiLockMembers(t *testing.T) {
	ttl := 100 * time.Millisecond
	member := func(lock int, tok uint64) op {
		o := acq(1, 0, 1, tok)
		o.Lock, o.Until = lock, 50*ms
		return o
	}
	mrel := func(lock int, tok uint64) op { o := relTok(1, 0, 40, tok); o.Lock = lock; return o }
	mutex := func(lock int, call, ret int64, tok uint64) op {
		o := acq(2, call, ret, tok)
		o.Lock, o.Until = lock, (ret+30)*ms
		return o
	}
	urel := func(lock int, call, at int64, tok uint64) op { o := relTok(2, call, at, tok); o.Lock = lock; return o }
	good := []op{member(0, 1), member(1, 7), mrel(0, 1), mrel(1, 7), mutex(1, 2, 41, 8), urel(1, 2, 60, 8)}
	if v := check(good, nil, ttl, false, nil); v.Overlaps != 0 || v.DoubleGrants != 0 || v.TokenRegressions != 0 {
		t.Fatalf("a Mutex after the multi-lock released: %+v", v)
	}
	if res := linearizeOne(good); res != "ok" {
		t.Fatalf("porcupine, good multi-lock history: %s", res)
	}
	// The Mutex on member 1 granted while the multi-lock holds it (a member released early).
	bad := []op{member(0, 1), member(1, 7), mrel(0, 1), mrel(1, 7), mutex(1, 2, 10, 8), urel(1, 2, 30, 8)}
	if v := check(bad, nil, ttl, false, nil); v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("a Mutex inside a multi-lock's member: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	if res := linearizeOne(bad); res != "illegal" {
		t.Fatalf("porcupine, a Mutex inside a multi-lock's member: %s", res)
	}

	// The lease lost at 20 (a member gone): dlock gives member 1 back, and a Mutex may take it.
	lost := []op{member(0, 1), member(1, 7), mutex(1, 2, 25, 8), urel(1, 2, 30, 8)}
	for k := range 2 {
		lost[k].Mode, lost[k].Lost, lost[k].DoneAt = "m", true, 20*ms
	}
	if v := check(lost, nil, ttl, false, nil); v.Overlaps != 0 || v.DoubleGrants != 0 {
		t.Fatalf("a Mutex on a member given back after the loss: %d overlaps, %d double grants, want 0 and 0", v.Overlaps, v.DoubleGrants)
	}
	if res := linearizeOne(lost); res != "ok" {
		t.Fatalf("porcupine, a member given back after the loss: %s", res)
	}
	lost[1].Lost = false // not lost: member 1 was still held
	if v := check(lost, nil, ttl, false, nil); v.DoubleGrants != 1 {
		t.Fatalf("a Mutex on a member still held: %d double grants, want 1", v.DoubleGrants)
	}
}

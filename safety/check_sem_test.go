package main

import (
	"testing"
	"time"
)

// Semaphore of 3 permits: leases may overlap while their permits add up to at most 3.
func TestSemaphorePermits(t *testing.T) {
	ttl := 100 * time.Millisecond
	take := func(c int, call, ret, until int64, n int, tok uint64) op {
		o := acq(c, call, ret, tok)
		o.Mode, o.Until, o.Permits, o.Of = "s", until*ms, n, 3
		return o
	}
	good := []op{
		take(1, 0, 1, 50, 2, 1), take(2, 2, 3, 60, 1, 1), relTok(1, 0, 40, 1), relTok(2, 2, 45, 1),
		take(3, 5, 41, 90, 2, 1), relTok(3, 5, 80, 1), // waited for client 1's two permits
	}
	if v := check(good, nil, ttl, false, nil); v.Overlaps != 0 || v.DoubleGrants != 0 || v.TokenRegressions != 0 || v.ForeignReleases != 0 {
		t.Fatalf("3 permits never exceeded: %+v", v)
	}
	if res := linearizeOne(good); res != "ok" {
		t.Fatalf("porcupine leaves semaphores out: %s", res)
	}
	// Client 3 takes 2 permits while clients 1 and 2 hold 3.
	bad := []op{take(1, 0, 1, 50, 2, 1), take(2, 2, 3, 60, 1, 1), take(3, 5, 10, 90, 2, 1), relTok(1, 0, 40, 1), relTok(2, 2, 45, 1), relTok(3, 5, 80, 1)}
	if v := check(bad, nil, ttl, false, nil); v.Overlaps != 1 || v.DoubleGrants != 1 {
		t.Fatalf("4 permits out of 3: %d overlaps, %d double grants, want 1 and 1", v.Overlaps, v.DoubleGrants)
	}
	// A holder killed at 5 (no release) keeps its permits in Redis until its TTL: a grant of
	// them at 30 is a double grant, though its window (to 20, what it last read) is over.
	killed := []op{take(1, 0, 1, 20, 3, 1), take(2, 2, 30, 60, 1, 1), relTok(2, 2, 45, 1)}
	if v := check(killed, nil, ttl, false, nil); v.DoubleGrants != 1 || v.Overlaps != 0 {
		t.Fatalf("permits of a dead holder granted before its TTL: %d double grants, %d overlaps, want 1 and 0", v.DoubleGrants, v.Overlaps)
	}
	// ... unless it sent its release (outcome unknown) before it died.
	killed = append(killed, rel(1, 0, 10, "unknown"))
	if v := check(killed, nil, ttl, false, nil); v.DoubleGrants != 0 {
		t.Fatalf("permits of a holder that may have released: %d double grants, want 0", v.DoubleGrants)
	}
	// A later busy period's token must not go back.
	if n := tokenRegressions([]op{take(1, 0, 1, 50, 1, 5), take(2, 60, 61, 90, 1, 4)}); n != 1 {
		t.Fatalf("a token below an earlier holder's: %d regressions, want 1", n)
	}
}

// A latch's Wait may return only once the count could have reached zero.
func TestLatchEarlyWaits(t *testing.T) {
	at := func(kind string, call, ret int64, res string, v int64) op {
		return op{Client: 1, Kind: kind, Call: call * ms, Return: ret * ms, Result: res, Value: v}
	}
	cases := []struct {
		name string
		ops  []op
		want int
	}{
		{"after both count-downs", []op{at("set", 0, 1, "ok", 2), at("down", 2, 3, "ok", 0), at("down", 4, 5, "ok", 0), at("wait", 3, 6, "ok", 0)}, 0},
		{"after one of two", []op{at("set", 0, 1, "ok", 2), at("down", 2, 3, "ok", 0), at("wait", 3, 6, "ok", 0), at("down", 7, 8, "ok", 0)}, 1},
		{"a count-down with a lost reply may have applied", []op{at("set", 0, 1, "ok", 2), at("down", 2, 3, "ok", 0), at("down", 4, 9, "unknown", 0), at("wait", 3, 6, "ok", 0)}, 0},
		{"a refused count-down did not", []op{at("set", 0, 1, "ok", 2), at("down", 2, 3, "ok", 0), at("down", 4, 5, "fail", 0), at("wait", 3, 6, "ok", 0)}, 1},
		{"never set: no state, returns at once", []op{at("wait", 3, 6, "ok", 0)}, 0},
		{"a set refused (counting already) starts nothing", []op{at("set", 0, 1, "ok", 2), at("set", 2, 3, "fail", 3), at("down", 2, 3, "ok", 0), at("wait", 4, 6, "ok", 0)}, 1},
		{"a new count set while it waited means it reached zero", []op{at("set", 0, 1, "ok", 2), at("wait", 2, 6, "ok", 0), at("set", 3, 4, "ok", 1)}, 0},
		{"the count set last before the Wait is the one that counts", []op{at("set", 0, 1, "ok", 2), at("down", 1, 2, "ok", 0), at("down", 2, 3, "ok", 0), at("set", 3, 4, "ok", 1), at("wait", 5, 6, "ok", 0)}, 1},
		{"a count-down with a lost reply may apply after it gave up", []op{at("down", 0, 5, "unknown", 0), at("set", 10, 11, "ok", 1), at("wait", 13, 14, "ok", 0)}, 0},
		{"but not for ever", []op{at("down", 0, 5, "unknown", 0), at("set", 300, 301, "ok", 1), at("wait", 303, 304, "ok", 0)}, 1},
		{"a Wait that timed out counts for nothing", []op{at("set", 0, 1, "ok", 2), at("wait", 3, 600, "unknown", 0)}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := earlyWaits(c.ops, 100*time.Millisecond); got != c.want {
				t.Fatalf("earlyWaits = %d, want %d", got, c.want)
			}
		})
	}
}

// A holder killed after it recorded its lease, before it took back what it left for the
// nemesis: the nemesis's copy of the lease, and of its release, is dropped at the merge.
func TestKilledHolderRecordedOnce(t *testing.T) {
	a := acq(1, 0, 1, 1)
	a.Mode, a.Permits, a.Of = "s", 2, 3
	recorded := []op{a, relTok(1, 0, 10, 1)}
	nem := []op{a, {Client: 1, Kind: "release", Call: 10 * ms, Acq: 0, Result: "unknown"}, acq(2, 20, 21, 2)}
	got := notRecorded(recorded, nem)
	if len(got) != 1 || got[0].Client != 2 {
		t.Fatalf("notRecorded kept %+v, want only the lease no client recorded", got)
	}
}

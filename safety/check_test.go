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
	v := check([]op{w(1, 0, 1, 5), w(2, 2, 3, 6), r(1, 4, 5)}, nil, 100*time.Millisecond, false)
	if v.StaleAccepted != 1 {
		t.Fatalf("a read of token 5 after token 6 was written: %d stale, want 1", v.StaleAccepted)
	}
	a1, a2 := acq(1, 0, 1, 1), acq(2, 2, 3, 2)
	a1.Until, a2.Until = 50*ms, 60*ms
	if v := check([]op{a1, a2}, nil, 100*time.Millisecond, false); v.Overlaps != 1 {
		t.Fatalf("two windows [1,50] and [3,60]: %d overlaps, want 1", v.Overlaps)
	}
}

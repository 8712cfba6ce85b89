package clocktest

import (
	"testing"
	"time"
)

func TestWallShiftKeepsMonotonic(t *testing.T) {
	if err := Check(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, d := range []time.Duration{time.Hour, -time.Hour, 24 * time.Hour, -3 * time.Second} {
		j := WallShift(now, d)
		if got := j.Sub(now); got != 0 {
			t.Errorf("WallShift(%v): monotonic difference %v, want 0", d, got)
		}
		if got := j.Round(0).Sub(now.Round(0)); got != d {
			t.Errorf("WallShift(%v): wall difference %v", d, got)
		}
		if j.Nanosecond() != now.Nanosecond() {
			t.Errorf("WallShift(%v) changed the nanoseconds", d)
		}
	}
}

func TestClock(t *testing.T) {
	var c Clock
	a := c.Now()
	c.Jump(-time.Hour)
	b := c.Now()
	if b.Sub(a) < 0 || b.Sub(a) > time.Second {
		t.Errorf("monotonic difference across a jump: %v", b.Sub(a))
	}
	if w := b.Round(0).Sub(a.Round(0)); w > -59*time.Minute {
		t.Errorf("wall difference across a -1h jump: %v", w)
	}
	weak := Clock{NoMonotonic: true}
	x := weak.Now()
	weak.Jump(-time.Hour)
	if d := weak.Now().Sub(x); d > -59*time.Minute {
		t.Errorf("NoMonotonic clock: difference across a -1h jump %v, want about -1h", d)
	}
}

// Package clocktest makes clocks whose wall reading jumps while their monotonic reading runs
// on, as a machine's clock does when NTP steps it or someone sets the date: the clock fault
// the tests inject into dlock through WithClock.
package clocktest

import (
	"errors"
	"sync/atomic"
	"time"
	"unsafe"
)

// timeLayout mirrors time.Time's fields (Go 1.9 and later): wall holds a flag bit, 33 bits of
// seconds since 1885 and 30 bits of nanoseconds when the time has a monotonic reading, which
// is then ext. WallShift checks the mirror against the time package before trusting it.
type timeLayout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

const (
	hasMonotonic = 1 << 63
	nsecShift    = 30
	secMask      = (1<<33 - 1) << nsecShift
)

// WallShift returns t with its wall reading moved by whole seconds of d and its monotonic
// reading unchanged. A t without a monotonic reading is simply t.Add(d).
func WallShift(t time.Time, d time.Duration) time.Time {
	p := (*timeLayout)(unsafe.Pointer(&t))
	if p.wall&hasMonotonic == 0 {
		return t.Add(d)
	}
	secs := int64(p.wall&secMask>>nsecShift) + int64(d/time.Second)
	p.wall = p.wall&^secMask | uint64(secs)<<nsecShift&secMask
	return t
}

// Check reports whether WallShift works with this Go release's time.Time.
func Check() error {
	now := time.Now()
	j := WallShift(now, -time.Hour)
	if j.Sub(now) != 0 || now.Round(0).Sub(j.Round(0)) != time.Hour {
		return errors.New("clocktest: time.Time layout not understood; WallShift unusable")
	}
	return nil
}

// A Clock reads time.Now with its wall reading offset by the sum of the jumps so far. Its Now
// is safe for concurrent use with Jump.
type Clock struct {
	offset atomic.Int64
	// NoMonotonic strips the monotonic reading, so a reader can only go by the wall clock:
	// the weakened clock of a positive control. Set it before the first Now.
	NoMonotonic bool
}

// Jump moves the wall reading by d (whole seconds) from now on.
func (c *Clock) Jump(d time.Duration) { c.offset.Add(int64(d)) }

// Offset returns the sum of the jumps so far.
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Now returns the current time with the wall reading offset.
func (c *Clock) Now() time.Time {
	t := WallShift(time.Now(), c.Offset())
	if c.NoMonotonic {
		t = t.Round(0)
	}
	return t
}

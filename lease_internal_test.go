package dlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// A MultiLock member lost between the check that every member is held and the lease being
// made (the race lock() tolerates by returning a lease that has ended): the lease's error
// names that member and its cause, not another member. Found by review.
func TestMultiLockLeaseEndedAtOnceNamesTheLostMember(t *testing.T) {
	c := New(redistest.Client(t))
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := redistest.Name(t)
	ml := c.MultiLock([]string{n + "a", n + "b"})
	owner := ml.ids.call()
	specs := make([]holdSpec, 2)
	for i, name := range ml.names {
		specs[i] = holdSpec{name: name, keys: ml.keys[i], cfg: ml.cfg, owner: owner}
	}
	var together atomic.Bool
	together.Store(true)
	hs, err := c.takeAll(ctx, specs, &together, false, ml.ids.call)
	if err != nil {
		t.Fatal(err)
	}
	hs[1].lose(errKeyGone) // member b lost "at once"
	hd := newHolding(hs[0], nil, 0, hs[1:]...)
	hd.multi = true
	l := hd.first(ctx, lockRef{c: c, name: strings.Join(ml.names, ",")})
	if err := l.Err(); !errors.Is(err, errKeyGone) || !strings.Contains(err.Error(), n+"b") {
		t.Fatalf("lease error %v, want member %q's loss (key gone)", err, n+"b")
	}
}

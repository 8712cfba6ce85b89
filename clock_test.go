package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/clocktest"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// A step of the wall clock moves no deadline: dlock measures leases on the monotonic clock.
// The same steps on a clock without monotonic readings do end the lease, which shows the test
// can see a wall-clock dependence.
func TestWallClockStepsMoveNoDeadline(t *testing.T) {
	ctx := ctxT(t)
	for _, weak := range []bool{false, true} {
		clk := &clocktest.Clock{NoMonotonic: weak}
		c := dlock.New(redistest.Client(t), dlock.WithClock(clk.Now), dlock.WithTTL(300*time.Millisecond),
			dlock.WithFixedLease(), dlock.WithoutCohort())
		defer c.Close(ctx)
		start := time.Now() // before the acquire is sent, as the lease's deadline is
		l, err := c.Mutex(redistest.Name(t)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		clk.Jump(time.Hour)
		rem := l.Remaining()
		if weak {
			if rem != 0 {
				t.Fatalf("wall-clock-only control: Remaining after a +1h step = %v, want 0 (the test cannot see the step)", rem)
			}
			continue
		}
		if rem < 200*time.Millisecond {
			t.Fatalf("Remaining after a +1h wall-clock step = %v, want about 297ms", rem)
		}
		clk.Jump(-2 * time.Hour)
		select {
		case <-l.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("a -1h wall-clock step kept a 300ms fixed lease alive for 2s")
		}
		if el := time.Since(start); el < 297*time.Millisecond {
			t.Fatalf("fixed 300ms lease ended %v after its acquire was sent, before its safe deadline", el)
		}
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) || l.Remaining() != 0 {
			t.Fatalf("after the fixed lease ran out: Err %v, Remaining %v", l.Err(), l.Remaining())
		}
	}
}

// Renewals keep a lease through wall-clock steps in both directions.
func TestWallClockStepsDuringRenewal(t *testing.T) {
	ctx := ctxT(t)
	clk := &clocktest.Clock{}
	rdb := redistest.Client(t)
	c := dlock.New(rdb, dlock.WithClock(clk.Now), dlock.WithTTL(300*time.Millisecond), dlock.WithoutCohort())
	defer c.Close(ctx)
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 { // 1s: about 13 renewals, with a step of ±1h every 100ms
		clk.Jump(time.Duration(1-2*(i%2)) * time.Hour)
		select {
		case <-l.Done():
			t.Fatalf("lease lost after %d wall-clock steps: %v", i+1, l.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if pttl := rdb.PTTL(ctx, lockKey(name)).Val(); pttl <= 0 {
		t.Fatalf("lock key PTTL %v after renewals across wall-clock steps", pttl)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// delayReply delays the reply of one EVALSHA of a script: the network slow on the way back.
type delayReply struct {
	dropReply
	delay time.Duration
	n     atomic.Int32
}

func (h *delayReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if len(args) > 1 && args[0] == "evalsha" && args[1] == h.sha && h.n.Add(-1) >= 0 {
			time.Sleep(h.delay)
		}
		return err
	}
}

// An acquire whose reply arrives after the lease's safe deadline hands out no lease: TryLock
// reports the lock not obtained, Lock tries again and returns a lease with time left.
func TestLateAcquireReplyHandsOutNoLease(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	rdb := redistest.Client(t)
	h := &delayReply{dropReply: dropReply{sha: scripts.Acquire.Hash()}, delay: 250 * time.Millisecond}
	rdb.AddHook(h)
	c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithTTL(200*time.Millisecond), dlock.WithoutCohort())
	defer c.Close(ctx)
	m := c.Mutex(redistest.Name(t))

	h.n.Store(1)
	l, err := m.TryLock(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "after the lease's safe deadline") {
		t.Fatalf("TryLock with its reply 250ms late on a 200ms TTL = %v, %v; want ErrNotObtained (late reply)", l, err)
	}
	h.n.Store(1)
	l, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rem := l.Remaining(); rem <= 0 || rem > 200*time.Millisecond {
		t.Fatalf("Lock after a late reply: Remaining %v, want in (0, 200ms]", rem)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rem := l.Remaining(); rem != 0 {
		t.Fatalf("Remaining after Unlock = %v, want 0", rem)
	}
}

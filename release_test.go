package dlock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// failBefore is a go-redis hook that fails calls of one script before they reach Redis, as a
// connection that died before the request was written.
type failBefore struct {
	sha   string
	fails atomic.Int32
}

func (h *failBefore) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failBefore) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failBefore) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && args[0] == "evalsha" && args[1] == h.sha && h.fails.Add(-1) >= 0 {
			err := &net.OpError{Op: "write", Net: "unix", Err: io.ErrClosedPipe}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A failed Unlock does not lock others out: dlock retries the release in the background, and
// the handle's next Lock takes a new hold, not the stale one (issue 9, point 6).
func TestFailedUnlockIsRetriedInTheBackground(t *testing.T) {
	for _, mode := range handleModes {
		t.Run(mode.name, func(t *testing.T) {
			ctx := ctxT(t)
			rdb := redistest.Client(t)
			scripts.Release.Load(ctx, rdb) // so the release goes as EVALSHA, which the hook knows
			h := &failBefore{sha: scripts.Release.Hash()}
			rdb.AddHook(h)
			c := dlock.New(rdb, dlock.OnGoRedis())
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			other, _ := newClient(t)
			name := redistest.Name(t)
			m := c.Mutex(name, mode.opts...)
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			h.fails.Store(1)
			if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrUnavailable) {
				t.Fatalf("Unlock that did not reach Redis = %v, want ErrUnavailable", err)
			}
			// Another owner gets the lock long before its 30s TTL.
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			ol, err := other.Mutex(name).Lock(wctx)
			if err != nil {
				t.Fatalf("another owner after a failed Unlock: %v (the lock was left held)", err)
			}
			if err := ol.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l2, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if l2.Token() <= ol.Token() {
				t.Fatalf("the handle's next lease has token %d, want above %d: it re-entered a stale hold", l2.Token(), ol.Token())
			}
			if err := l2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A release, a departing waiter and a grant confirmation act only on the hold they name
// (issue 9, point 11).
func TestStaleGrantIsNeitherConfirmedNorPassedOn(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	acquire(t, rdb, k, "A", "a1")
	if res := acquireArgs(t, rdb, k, "W", "w1", true, true); res[0] != 0 {
		t.Fatalf("W got a held lock: %v", res)
	}
	// A's release grants the lock to W with a 30 ms grace, which runs out unconfirmed.
	n, err := scripts.Release.Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		"A", "a1", 60000, k.channel, false, 30, "PUBLISH", false, 0).Int()
	if err != nil || n != 3 {
		t.Fatalf("release = %d, %v; want 3 (granted to W)", n, err)
	}
	for rdb.Exists(ctx, k.lock).Val() == 1 {
		time.Sleep(time.Millisecond) // the grace running out has no event to wait on
	}
	// W takes the lock afresh; its old grant is stale.
	fresh := acquireArgs(t, rdb, k, "W", "w2", false, true)
	if fresh[0] != 1 {
		t.Fatalf("W's fresh acquire: %v", fresh)
	}
	// W leaving the queue with the stale grant must not drop its live hold.
	if n := releaseArgs(t, rdb, k, "W", "", false, true); n != 0 {
		t.Fatalf("a waiter leaving with a stale grant = %d, want 0", n)
	}
	if !rdb.HExists(ctx, k.lock, "#w2").Val() {
		t.Fatal("a waiter leaving with a stale grant dropped the owner's live hold")
	}
}

func TestReleaseOfALostHoldIsNotHeldWhenTheOwnerRetook(t *testing.T) {
	rdb := redistest.Client(t)
	k := names(t)
	acquire(t, rdb, k, "A", "h1")
	rdb.Del(ctxT(t), k.lock) // h1 lost
	acquire(t, rdb, k, "A", "h2")
	if n := release(t, rdb, k, "A", "h1", false); n != 0 {
		t.Fatalf("release of the lost hold h1 = %d, want 0 (not held)", n)
	}
	if !rdb.HExists(ctxT(t), k.lock, "#h2").Val() {
		t.Fatal("the release of a lost hold dropped the owner's newer hold")
	}

	// Through the API, on every kind of handle.
	for _, mode := range handleModes {
		c, rdb := newClient(t, mode.opts...)
		ctx := ctxT(t)
		name := redistest.Name(t)
		m := c.Mutex(name, mode.opts...)
		for i := 0; i < 10; i++ {
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rdb.Del(ctx, lockKey(name)) // lost; re-taken at once, maybe before the push arrives
			l2, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLeaseLost) {
				t.Fatalf("%s: Unlock of a lost lease after the owner re-took the lock = %v, want ErrNotHeld and ErrLeaseLost", mode.name, err)
			}
			if l2.Err() != nil {
				t.Fatalf("%s: the new lease ended: %v", mode.name, l2.Err())
			}
			if err := l2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

package dlock_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// afterMultiAcquire runs f once, when armed, right after a multi_acquire over two members
// (8 keys) was refused ({0, i, pttl}).
type afterMultiAcquire struct {
	armed atomic.Bool
	f     func()
}

func (h *afterMultiAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterMultiAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *afterMultiAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		n := strings.ToLower(cmd.Name())
		args := cmd.Args()
		if (n == "evalsha" || n == "eval") && len(args) > 2 && fmt.Sprint(args[2]) == "8" {
			if c, ok := cmd.(*redis.Cmd); ok {
				if v, ok := c.Val().([]any); ok && len(v) == 3 && v[0] == int64(0) && h.armed.CompareAndSwap(true, false) {
					h.f()
				}
			}
		}
		return err
	}
}

// Once its patience is over a MultiLock waits in name order, keeping only members before the
// one it waits for (found by review: the first version kept every member before the taken
// one). Over {a, b, c}, handed b from b's queue, its one-script pass over {a, c} is refused
// at c with a free: keeping b and waiting in a's queue would deadlock with a process that
// took a meanwhile and nests b (name order, which the MultiLock doc calls safe). So b is
// given back, and that process gets it.
func TestMultiLockHoldsNoMemberAfterOneItWaitsFor(t *testing.T) {
	ctx := ctxT(t)
	rdb := redistest.Client(t)
	hook := &afterMultiAcquire{}
	rdb.AddHook(hook)
	c := dlock.New(rdb, dlock.OnGoRedis())
	defer c.Close(context.Background())
	other, raw := newClient(t, dlock.WithoutCohort(), dlock.OnGoRedis())
	base := redistest.Name(t)
	// Warm up: scripts cached, connections and the notification connection made.
	for i := range 3 {
		w := fmt.Sprintf("%sw%d", base, i)
		hw := must(t)(other.Mutex(w + "b").Lock(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			l := must(t)(c.MultiLock([]string{w + "a", w + "b", w + "c"}).Lock(ctx))
			_ = l.Unlock(ctx)
		}()
		waitQueueLen(t, raw, w+"b", 1)
		_ = hw.Unlock(ctx)
		<-done
	}
	a, b, cc := base+"a", base+"b", base+"c"
	hb := must(t)(other.Mutex(b).Lock(ctx))
	hc := must(t)(other.Mutex(cc).Lock(ctx))

	var ha atomic.Pointer[dlock.Lease]
	gotB := make(chan error, 1)
	hook.f = func() {
		// a was free at that pass: another process takes it now, then nests b.
		l, err := other.Mutex(a).TryLock(context.Background())
		if err != nil {
			gotB <- fmt.Errorf("taking a: %w", err)
			return
		}
		ha.Store(l)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			lb, err := other.Mutex(b).Lock(wctx)
			if err == nil {
				_ = lb.Unlock(ctx)
			}
			gotB <- err
		}()
	}
	mctx, mcancel := context.WithTimeout(ctx, 10*time.Second)
	defer mcancel()
	ml := make(chan rwResult, 1)
	go func() {
		l, err := c.MultiLock([]string{a, b, cc}).Lock(mctx)
		ml <- rwResult{l, err}
	}()
	waitQueueLen(t, raw, b, 1) // the MultiLock waits for b, holding nothing
	if raw.Exists(ctx, lockKey(a)).Val() != 0 {
		t.Fatal("the MultiLock holds a while it waits for b: its first wait was not the polite one")
	}
	time.Sleep(20 * time.Millisecond) // past multiPatience and the barging window
	hook.armed.Store(true)
	if err := hb.Unlock(ctx); err != nil { // b handed to the MultiLock
		t.Fatal(err)
	}
	err := <-gotB
	if err != nil {
		info, _ := c.Inspect(ctx, b)
		t.Errorf("a process holding a (free when the MultiLock passed) and nesting b never got b: %v; "+
			"b held=%v while the MultiLock waits in a's queue (len %d): it holds a member after the one it waits for",
			err, info.Held, raw.ZCard(ctx, lockKey(a)+":queue").Val())
	}
	if l := ha.Load(); l != nil {
		_ = l.Unlock(ctx)
	}
	_ = hc.Unlock(ctx)
	r := <-ml
	if r.err != nil {
		t.Fatalf("MultiLock: %v", r.err)
	}
	_ = r.l.Unlock(ctx)
}

// slowScripts adds a fixed latency to every script call: a Redis 3 ms away.
type slowScripts struct{ d time.Duration }

func (h slowScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h slowScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := strings.ToLower(cmd.Name()); n == "evalsha" || n == "eval" {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

// A MultiLock's first wait is the polite one (in the taken member's queue, holding nothing),
// however slow its passes: found by review, when a first pass slower than multiPatience (a
// Redis 2 ms away, a cold client under -race) sent it to wait in name order at once, keeping
// the free member a while it waited for b.
func TestMultiLockFirstWaitIsPolite(t *testing.T) {
	ctx := ctxT(t)
	rdb := redistest.Client(t)
	rdb.AddHook(slowScripts{3 * time.Millisecond})
	c := dlock.New(rdb, dlock.OnGoRedis())
	defer c.Close(context.Background())
	other, raw := newClient(t, dlock.WithoutCohort(), dlock.OnGoRedis())
	base := redistest.Name(t)
	a, b := base+"a", base+"b"
	hb := must(t)(other.Mutex(b).Lock(ctx))
	done := make(chan error, 1)
	go func() {
		l, err := c.MultiLock([]string{a, b}).Lock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
		}
		done <- err
	}()
	waitQueueLen(t, raw, b, 1)
	if raw.Exists(ctx, lockKey(a)).Val() != 0 {
		t.Errorf("first wait not polite: the MultiLock holds free member a while it waits in b's queue")
	}
	_ = hb.Unlock(ctx)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

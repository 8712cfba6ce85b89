package dlock_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// gatedRunner is a goRedisRunner whose calls wait for open to be closed; entered is closed
// when the first call has come. With loseFirst, the first call's reply is lost (it ran).
type gatedRunner struct {
	goRedisRunner
	open, entered chan struct{}
	once          sync.Once
	loseFirst     bool
}

func (r *gatedRunner) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	first := false
	r.once.Do(func() { close(r.entered); first = true })
	<-r.open
	rs := r.goRedisRunner.RunScripts(ctx, calls)
	if first && r.loseFirst {
		for i := range rs {
			rs[i] = dlock.ScriptResult{Err: io.ErrUnexpectedEOF}
		}
	}
	return rs
}

// A lock call on the caller's goroutine is not background work: Close returns without waiting
// for it. When its acquire reaches Redis after that and takes the lock, the call returns
// ErrClosed and gives the lock back then and there, whether its reply came or was lost (it
// then undoes what the acquire may have taken). Found
// by review: the give-back ran on the Client's clean-up context, which Close had ended, so it
// was never sent, and after a lost reply none was tried: the lock stayed held for its whole
// TTL (30 s) by a Client that no longer existed.
func TestLockTakenAfterCloseIsGivenBack(t *testing.T) {
	for _, tc := range []struct {
		kind      string
		names     int
		loseReply bool
		lock      func(c *dlock.Client, names []string) (*dlock.Lease, error)
	}{
		{"Mutex", 1, false, func(c *dlock.Client, names []string) (*dlock.Lease, error) {
			return c.Mutex(names[0]).TryLock(context.Background())
		}},
		{"MultiLock", 2, false, func(c *dlock.Client, names []string) (*dlock.Lease, error) {
			return c.MultiLock(names).TryLock(context.Background())
		}},
		{"Mutex, reply lost", 1, true, func(c *dlock.Client, names []string) (*dlock.Lease, error) {
			return c.Mutex(names[0]).TryLock(context.Background())
		}},
		{"MultiLock, reply lost", 2, true, func(c *dlock.Client, names []string) (*dlock.Lease, error) {
			return c.MultiLock(names).TryLock(context.Background())
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			rdb := redistest.Client(t)
			r := &gatedRunner{goRedisRunner: goRedisRunner{rdb: rdb}, open: make(chan struct{}), entered: make(chan struct{}), loseFirst: tc.loseReply}
			c := dlock.New(rdb, dlock.WithScriptRunner(r))
			var names []string
			for i := range tc.names {
				names = append(names, redistest.Name(t)+string(rune('a'+i)))
			}
			type result struct {
				l   *dlock.Lease
				err error
			}
			got := make(chan result, 1)
			go func() {
				l, err := tc.lock(c, names)
				got <- result{l, err}
			}()
			<-r.entered
			if err := c.Close(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			close(r.open) // the acquire reaches Redis now, after Close returned
			res := <-got
			if res.l != nil || !errors.Is(res.err, dlock.ErrClosed) {
				t.Fatalf("TryLock whose acquire ran after Close: %v, %v; want ErrClosed", res.l, res.err)
			}
			for _, n := range names {
				if h, err := rdb.HGetAll(ctxT(t), lockKey(n)).Result(); err != nil || len(h) != 0 {
					t.Errorf("lock %s after the call returned ErrClosed: %v (PTTL %v), %v; want it given back",
						n, h, rdb.PTTL(ctxT(t), lockKey(n)).Val(), err)
				}
			}
		})
	}
}

package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// delBeforeRelease is a go-redis hook that, once armed, deletes key (through raw) just before
// the next script call that names it runs: an Unlock then finds its hold gone.
type delBeforeRelease struct {
	armed atomic.Bool
	raw   *redis.Client
	key   string
}

func (h *delBeforeRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *delBeforeRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.before(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook: a MultiLock's releases go out pipelined.
func (h *delBeforeRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.before(cmd)
		}
		return next(ctx, cmds)
	}
}

// before deletes the key when armed and cmd is a script call that names it.
func (h *delBeforeRelease) before(cmd redis.Cmder) {
	n := strings.ToLower(cmd.Name())
	if n != "evalsha" && n != "eval" {
		return
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && s == h.key && h.armed.CompareAndSwap(true, false) {
			h.raw.Del(context.Background(), h.key)
			return
		}
	}
}

// A hold found gone by Unlock (deleted, expired, taken) is a lost Redis hold: the work under
// the lease may have overlapped another holder's, and the logger is warned once (from review:
// f134a34 lost this warning).
func TestLoggerWarnsWhenUnlockFindsTheHoldGone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		multi bool
		opts  []dlock.Option
	}{{"plain", false, []dlock.Option{dlock.WithoutCohort()}}, {"cohort", false, nil}, {"multilock", true, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			logs := newLogRecords()
			rdb := redistest.Client(t)
			name := redistest.Name(t)
			hook := &delBeforeRelease{raw: redistest.Client(t), key: lockKey(name)}
			rdb.AddHook(hook)
			c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithLogger(slog.New(logs)))
			defer c.Close(context.Background())
			ctx := ctxT(t)
			var l *dlock.Lease
			var err error
			if tc.multi {
				l, err = c.MultiLock([]string{name, name + "-b"}).Lock(ctx)
			} else {
				l, err = c.Mutex(name, tc.opts...).Lock(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			hook.armed.Store(true)
			uerr := l.Unlock(ctx)
			if !errors.Is(uerr, dlock.ErrLeaseLost) {
				t.Fatalf("Unlock did not find the hold gone: %v", uerr)
			}
			if n := logs.countWarn("lease lost"); n != 1 {
				t.Errorf("Unlock found the Redis hold lost (%v); %d 'lease lost' warnings, want 1", uerr, n)
			}
		})
	}
}

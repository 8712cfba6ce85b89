package dlockrueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestSentinelSwitchIsNotAClosedClient: rueidis says ErrClosing not only when the client is
// closed but also to a call on a connection it retires itself, as a Sentinel client does when
// it moves to the new master while the old one is frozen (a partition). That is no answer, and
// must not read as ErrClosed: a Lock waiting through the failover takes the lock on the new
// master, as with go-redis alone. (Timeouts of 10s keep the call waiting on the old master
// until rueidis switches.)
func TestSentinelSwitchIsNotAClosedClient(t *testing.T) {
	for _, viaRueidis := range []bool{false, true} {
		name := "go-redis"
		if viaRueidis {
			name = "rueidis"
		}
		t.Run(name, func(t *testing.T) {
			g := redistest.StartSentinelT(t, redistest.SentinelConfig{})
			rdb := g.FailoverClient(func(o *redis.FailoverOptions) { o.ReadTimeout = 10 * time.Second })
			defer rdb.Close()
			var opts []dlock.Option
			if viaRueidis {
				rc, err := rueidis.NewClient(rueidis.ClientOption{
					InitAddress: g.SentinelAddrs(), Sentinel: rueidis.SentinelOption{MasterSet: g.MasterName()},
					DisableCache: true, DisableRetry: true, AlwaysPipelining: true, ConnWriteTimeout: 10 * time.Second,
				})
				if err != nil {
					t.Fatal(err)
				}
				defer rc.Close()
				opts = append(opts, dlock.WithScriptRunner(dlockrueidis.RunnerFor(rdb, rc)))
			}
			c := dlock.New(rdb, opts...)
			defer c.Close(context.Background())
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			lname := redistest.Name(t)
			l, err := c.Mutex(lname).Lock(ctx) // warm up: connections made
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			old := g.Master()
			old.Pause()
			defer old.Resume()
			start := time.Now()
			l, err = c.Mutex(lname).Lock(ctx)
			t.Logf("Lock after %v: err=%v", time.Since(start).Round(time.Millisecond), err)
			if errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("a Sentinel failover made Lock fail with ErrClosed (no Client was closed): %v", err)
			}
			if err != nil {
				t.Fatalf("Lock: %v", err)
			}
			_ = l.Unlock(ctx)
		})
	}
}

package dlockrueidis_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestCallsAreBoundedByTheReadTimeout: a call to a frozen server waits for its reply at most
// the go-redis client's ReadTimeout, as go-redis's own calls do, whatever its ctx: a far
// deadline, none, and with rueidis's keep-alive off.
func TestCallsAreBoundedByTheReadTimeout(t *testing.T) {
	s := redistest.StartT(t, redistest.Config{TCP: true})
	o := s.Options()
	o.ReadTimeout = 500 * time.Millisecond
	rdb := redis.NewClient(o)
	defer rdb.Close()
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		keep    time.Duration
		goRedis bool
	}{
		{"go-redis, no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 0, true},
		{"rueidis, 30s deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Second)
		}, 0, false},
		{"rueidis, no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 0, false},
		{"rueidis, no deadline, keep-alive off", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []dlock.Option
			if !tc.goRedis {
				rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{o.Addr},
					DisableCache: true, DisableRetry: true, AlwaysPipelining: true, ForceSingleClient: true,
					Dialer: net.Dialer{KeepAlive: tc.keep}})
				if err != nil {
					t.Fatal(err)
				}
				defer rc.Close()
				opts = append(opts, dlock.WithScriptRunner(dlockrueidis.RunnerFor(rdb, rc)))
			}
			c := dlock.New(rdb, opts...)
			defer c.Close(context.Background())
			name := redistest.Name(t)
			if l, err := c.Mutex(name).TryLock(context.Background()); err != nil { // warm up
				t.Fatal(err)
			} else if err := l.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			s.Pause()
			resumed := false
			defer func() {
				if !resumed {
					s.Resume()
				}
			}()
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := c.Mutex(name).TryLock(ctx)
				done <- err
			}()
			select {
			case err := <-done:
				took := time.Since(start)
				t.Logf("TryLock returned after %v: %v", took.Round(time.Millisecond), err)
				if took > 3*time.Second {
					t.Errorf("TryLock waited %v on a frozen server; the runner's bound is 500ms", took.Round(time.Millisecond))
				}
			case <-time.After(20 * time.Second):
				t.Errorf("TryLock still waiting after 20s on a frozen server; the runner's bound is 500ms")
				s.Resume()
				resumed = true
				<-done
			}
		})
	}
}

package dlockrueidis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLoadingIsWaitedOutAsGoRedisDoes: a server still loading its data answers LOADING, which
// go-redis waits out for its own calls (MaxRetries, with back-off). A script through rueidis is
// sent again the same way, not failed at once as ErrUnavailable.
func TestLoadingIsWaitedOutAsGoRedisDoes(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartT(t, redistest.Config{AOF: true})
	admin := srv.Client()
	t.Cleanup(func() { _ = admin.Close() })
	// A million keys in the AOF take Redis about half a second to load.
	if err := admin.Do(ctx, "DEBUG", "POPULATE", 1000000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.BgRewriteAOF(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		info, err := admin.Info(ctx, "persistence").Result()
		if err == nil && strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("AOF rewrite not done: %v", err)
		}
	}
	o := *admin.Options()
	o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff = 100, 50*time.Millisecond, 100*time.Millisecond
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { _ = rdb.Close() })
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	cnt := &counting{r: dlockrueidis.RunnerFor(rdb, rc)}
	c := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(cnt)))

	srv.Kill()
	if err := srv.RestartNoWait(); err != nil {
		t.Fatal(err)
	}
	// redistest's clients do not retry: admin sees LOADING as it is.
	if err := admin.Ping(ctx).Err(); err == nil || !strings.HasPrefix(err.Error(), "LOADING") {
		t.Fatalf("PING right after the restart: %v, want LOADING", err)
	}
	began := time.Now()
	l, err := c.Mutex(redistest.Name(t)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock while the server loads: %v, want a lease once it has loaded", err)
	}
	t.Logf("TryLock while the server loads took %v, %d script calls", time.Since(began).Round(time.Millisecond), cnt.calls.Load())
	if n := cnt.calls.Load(); n < 2 {
		t.Errorf("TryLock made %d script call(s): the server had loaded before it, no LOADING was waited out", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

package dlockrueidis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestLoadingIsWaitedOutAsGoRedisDoes: a server still loading its data answers LOADING, which
// go-redis waits out for its own calls (MaxRetries, with back-off). A script through rueidis is
// sent again the same way, not failed at once as ErrUnavailable.
func TestLoadingIsWaitedOutAsGoRedisDoes(t *testing.T) {
	ctx := context.Background()
	srv, admin := loadingServer(t)
	rdb, rc := retryingClients(t, admin, 50*time.Millisecond, 100*time.Millisecond)
	cnt := &counting{r: dlockrueidis.RunnerFor(rdb, rc)}
	c := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(cnt)))

	restartLoading(t, srv, admin)
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

// loadingServer starts a server with AOF and a million keys in it, which take it about half a
// second to load after a restart, and returns it with an admin client (no retries).
func loadingServer(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
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
	return srv, admin
}

// retryingClients returns a go-redis client of admin's server that retries refused calls 100
// times with back-offs between minBackoff and maxBackoff (which a runner's resends follow), and
// a rueidis client for it, both closed at cleanup.
func retryingClients(t *testing.T, admin *redis.Client, minBackoff, maxBackoff time.Duration) (*redis.Client, rueidis.Client) {
	t.Helper()
	o := *admin.Options()
	o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff = 100, minBackoff, maxBackoff
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { _ = rdb.Close() })
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return rdb, rc
}

// restartLoading restarts srv and returns while it still loads its data (PING says LOADING).
func restartLoading(t *testing.T, srv *redistest.Server, admin *redis.Client) {
	t.Helper()
	ctx := context.Background()
	srv.Kill()
	if err := srv.RestartNoWait(); err != nil {
		t.Fatal(err)
	}
	// redistest's clients do not retry: admin sees LOADING as it is.
	if err := admin.Ping(ctx).Err(); err == nil || !strings.HasPrefix(err.Error(), "LOADING") {
		t.Fatalf("PING right after the restart: %v, want LOADING", err)
	}
}

// loadingSeen passes calls on to r and signals seen when a reply is LOADING.
type loadingSeen struct {
	r    dlock.ScriptRunner
	seen chan struct{}
}

func (l *loadingSeen) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	rs := l.r.RunScripts(ctx, calls)
	for _, r := range rs {
		if r.Err != nil && strings.HasPrefix(r.Err.Error(), "LOADING") {
			select {
			case l.seen <- struct{}{}:
			default:
			}
		}
	}
	return rs
}

// A script Redis refused with LOADING is sent again after a back-off (here 2 s, the go-redis
// client's), but the back-off lasts no longer than the caller's ctx or the Client: cancelling
// the ctx or closing the Client during it ends the call at once, with the ctx's error or
// ErrClosed (a Mutex's and a MultiLock's; before, Close's was the LOADING refusal).
func TestLoadingBackOffEndsWithTheContextOrClose(t *testing.T) {
	srv, admin := loadingServer(t)
	rdb, rc := retryingClients(t, admin, 2*time.Second, 2*time.Second)
	byCtx := &loadingSeen{r: dlockrueidis.RunnerFor(rdb, rc), seen: make(chan struct{}, 1)}
	byClose := &loadingSeen{r: dlockrueidis.RunnerFor(rdb, rc), seen: make(chan struct{}, 2)}
	c1 := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(byCtx)))
	c2 := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(byClose)))

	restartLoading(t, srv, admin)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		err error
		at  time.Time
	}
	r1, r2, r3 := make(chan result, 1), make(chan result, 1), make(chan result, 1)
	go func() {
		_, err := c1.Mutex(redistest.Name(t) + "1").TryLock(ctx)
		r1 <- result{err, time.Now()}
	}()
	go func() {
		_, err := c2.Mutex(redistest.Name(t) + "2").TryLock(context.Background())
		r2 <- result{err, time.Now()}
	}()
	go func() {
		_, err := c2.MultiLock([]string{redistest.Name(t) + "3a", redistest.Name(t) + "3b"}).TryLock(context.Background())
		r3 <- result{err, time.Now()}
	}()
	refused := func(l *loadingSeen) {
		t.Helper()
		select {
		case <-l.seen:
		case <-time.After(10 * time.Second):
			t.Fatal("no call met LOADING: the server loaded before it")
		}
	}

	refused(byCtx)
	cancelled := time.Now()
	cancel()
	r := <-r1
	t.Logf("TryLock returned %v after its ctx was cancelled: %v", r.at.Sub(cancelled).Round(time.Millisecond), r.err)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("TryLock whose ctx was cancelled in the back-off: %v, want context.Canceled", r.err)
	}
	if d := r.at.Sub(cancelled); d > time.Second {
		t.Errorf("TryLock returned %v after its ctx was cancelled: it sat out the 2 s back-off", d)
	}

	refused(byClose)
	refused(byClose)
	closing := time.Now()
	if err := c2.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed := time.Now()
	r = <-r2
	t.Logf("Close took %v; TryLock returned %v after Close began: %v", closed.Sub(closing).Round(time.Millisecond), r.at.Sub(closing).Round(time.Millisecond), r.err)
	if !errors.Is(r.err, dlock.ErrClosed) {
		t.Errorf("TryLock whose Client closed in the back-off: %v, want ErrClosed", r.err)
	}
	if d := r.at.Sub(closing); d > time.Second {
		t.Errorf("TryLock returned %v after Close began: it sat out the 2 s back-off", d)
	}
	r = <-r3
	t.Logf("MultiLock.TryLock returned %v after Close began: %v", r.at.Sub(closing).Round(time.Millisecond), r.err)
	if !errors.Is(r.err, dlock.ErrClosed) || r.at.Sub(closing) > time.Second {
		t.Errorf("MultiLock.TryLock whose Client closed in the back-off: %v after %v, want ErrClosed at once", r.err, r.at.Sub(closing))
	}
	if d := closed.Sub(closing); d > time.Second {
		t.Errorf("Close took %v: it waited for the back-off", d)
	}
}

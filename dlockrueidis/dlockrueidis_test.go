package dlockrueidis_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The whole dlock suite also runs with its scripts on rueidis: `make test-rueidis`. These tests
// cover what is the adapter's own: construction, error and reply conversion, the fallback to
// EVAL, and Clients on either library sharing locks.

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

// counting runs scripts through a runner and counts the calls, so a test can tell they went
// through rueidis.
type counting struct {
	r     dlock.ScriptRunner
	calls atomic.Int64
}

func (c *counting) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	c.calls.Add(int64(len(calls)))
	return c.r.RunScripts(ctx, calls)
}

// clients returns a go-redis client of the shared server and a rueidis client for it, both
// closed at cleanup.
func clients(t *testing.T) (*redis.Client, rueidis.Client) {
	t.Helper()
	rdb := redistest.Client(t)
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return rdb, rc
}

func newClient(t *testing.T, c *dlock.Client) *dlock.Client {
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestLockAndUnlockRunOnRueidis(t *testing.T) {
	ctx := context.Background()
	rdb, rc := clients(t)
	cnt := &counting{r: dlockrueidis.Runner(rc)}
	c := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(cnt)))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, dlock.DefaultKeyPrefix+"{"+name+"}").Val(); n != 1 {
		t.Fatalf("lock key exists %d, want 1", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, dlock.DefaultKeyPrefix+"{"+name+"}").Val(); n != 0 {
		t.Fatalf("lock key exists %d after Unlock, want 0", n)
	}
	if n := cnt.calls.Load(); n != 2 {
		t.Fatalf("%d script calls through rueidis, want 2 (acquire, release)", n)
	}
}

// TestClientsOnEitherLibraryExcludeEachOther runs goroutines of a rueidis Client and of a
// go-redis Client on one lock, each incrementing a counter with a GET and a SET: none is lost,
// and waiters of each are woken by the other's releases.
func TestClientsOnEitherLibraryExcludeEachOther(t *testing.T) {
	ctx := context.Background()
	rdb, rc := clients(t)
	cs := []*dlock.Client{
		newClient(t, dlockrueidis.New(rdb, rc)),
		newClient(t, dlock.New(redistest.Client(t))),
	}
	name, counter := redistest.Name(t), redistest.Name(t)+":n"
	const perG = 50
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[g%2]
			for range perG {
				l, err := c.Mutex(name).Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				n, _ := rdb.Get(ctx, counter).Int()
				rdb.Set(ctx, counter, n+1, 0)
				if err := l.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n, _ := rdb.Get(ctx, counter).Int(); n != 8*perG {
		t.Fatalf("counter %d, want %d: an increment was lost", n, 8*perG)
	}
}

// TestErrorRepliesKeepTheirMeaning: a script's own error reply (a lock taken as another kind)
// must reach dlock as a Redis reply, so it is ErrInvalid, not an unknown outcome.
func TestErrorRepliesKeepTheirMeaning(t *testing.T) {
	ctx := context.Background()
	rdb, rc := clients(t)
	c := newClient(t, dlockrueidis.New(rdb, rc))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	_, err = c.RWMutex(name).TryLock(ctx)
	if !errors.Is(err, dlock.ErrInvalid) || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("RWMutex on a Mutex's name: %v, want ErrInvalid", err)
	}
}

// TestScriptsFallBackToEval: a server without dlock's scripts cached (restarted, promoted) gets
// them by EVAL.
func TestScriptsFallBackToEval(t *testing.T) {
	ctx := context.Background()
	rdb, rc := clients(t)
	c := newClient(t, dlockrueidis.New(rdb, rc))
	for i := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l, err := c.Mutex(redistest.Name(t)).Lock(ctx)
		if err != nil {
			t.Fatalf("lock %d after SCRIPT FLUSH: %v", i, err)
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("unlock %d after SCRIPT FLUSH: %v", i, err)
		}
	}
}

// TestRenewalRunsOnRueidis: a lease outlives its TTL several times over while renewed in
// batches through the runner.
func TestRenewalRunsOnRueidis(t *testing.T) {
	ctx := context.Background()
	rdb, rc := clients(t)
	cnt := &counting{r: dlockrueidis.Runner(rc)}
	c := newClient(t, dlock.New(rdb, dlock.WithScriptRunner(cnt), dlock.WithTTL(200*time.Millisecond)))
	l, err := c.Mutex(redistest.Name(t)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		t.Fatalf("lease lost while renewed: %v", l.Err())
	case <-time.After(time.Second): // five TTLs
	}
	if n := cnt.calls.Load(); n < 1+4 {
		t.Fatalf("%d script calls through rueidis in five TTLs, want the acquire and at least 4 renewals", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClosedRueidisClientIsErrClosed: scripts on a closed rueidis client fail as on a closed
// go-redis client.
func TestClosedRueidisClientIsErrClosed(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, dlockrueidis.New(rdb, rc))
	rc.Close()
	_, err = c.Mutex(redistest.Name(t)).TryLock(ctx)
	if !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock on a closed rueidis client: %v, want ErrClosed", err)
	}
}

func TestNilRueidisClientIsInvalid(t *testing.T) {
	c := newClient(t, dlockrueidis.New(redistest.Client(t), nil))
	_, err := c.Mutex("x").TryLock(context.Background())
	if !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TryLock with a nil rueidis client: %v, want ErrInvalid", err)
	}
}

func TestClientForRefusesWhatItCannotMirror(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	defer failover.Close()
	for i, rdb := range []redis.UniversalClient{nil, ring, failover} {
		if rc, err := dlockrueidis.ClientFor(rdb); err == nil {
			rc.Close()
			t.Errorf("ClientFor(%d: %T) made a client", i, rdb)
		}
	}
}

// TestClientForDialsAsTheGoRedisClient: a unix-socket server (the shared one) and a TCP one
// with a password and a database are both reached.
func TestClientForDialsAsTheGoRedisClient(t *testing.T) {
	ctx := context.Background()
	s := redistest.StartT(t, redistest.Config{TCP: true})
	admin := s.Client()
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "requirepass", "secret").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(ctx, "requirepass", "")
	o := s.Options()
	o.Password, o.DB = "secret", 3
	rdb := redis.NewClient(o)
	defer rdb.Close()
	rc, err := dlockrueidis.ClientFor(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	key := "k" + strconv.Itoa(int(time.Now().UnixNano()))
	if err := rc.Do(ctx, rc.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if v := rdb.Get(ctx, key).Val(); v != "v" {
		t.Fatalf("rueidis wrote to another database or server: go-redis reads %q", v)
	}
}

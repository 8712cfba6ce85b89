package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// minimalACL is the least a dlock user needs (README.md, "Minimal ACL", shows the same rules):
// its keys and channels, the commands its scripts and connections run.
var minimalACL = []string{
	"~dlock:*", "&dlock:*", "&__redis__:invalidate",
	"+evalsha", "+eval", "+time", "+exists", "+hmget", "+hget", "+hset", "+hdel", "+hincrby",
	"+hexists", "+hgetall", "+del", "+pexpire", "+pttl", "+zadd", "+zrange", "+zrem", "+zcard",
	"+get", "+set", "+publish", "+spublish", "+subscribe", "+unsubscribe", "+ssubscribe",
	"+sunsubscribe", "+ping", "+hello", "+auth", "+client|id", "+client|tracking",
	"+client|setname",
}

// optionalACL only switch checks on: ROLE (the notifier tells a demoted master by itself),
// CONFIG GET (the maxmemory-policy warning), SCAN (Client.Locks, dlock list).
var optionalACL = []string{"+role", "+config|get", "+scan"}

// replicaAckACL is what WithReplicaAck adds: WAIT, and INFO for its error's replica count.
var replicaAckACL = []string{"+wait", "+info"}

func TestREADMEShowsTheMinimalACL(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, rules := range [][]string{minimalACL, optionalACL, replicaAckACL} {
		if want := strings.Join(rules, " "); !strings.Contains(string(readme), want) {
			t.Fatalf("README.md does not show the ACL rules %q", want)
		}
	}
}

// aclClient returns a go-redis client of a new user with rules on srv, closed at cleanup.
func aclClient(t *testing.T, srv *redistest.Server, user string, rules ...string) *redis.Client {
	t.Helper()
	if err := srv.AddACLUser(ctxT(t), user, "pw", rules...); err != nil {
		t.Fatal(err)
	}
	rdb := srv.ClientFor(user, "pw")
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// coreCases runs dlock's core behaviour through rdb: exclusion, contended hand-off between
// processes and goroutines, re-entry, extend, loss by DEL (through admin), Inspect. It reports
// the slowest contended Lock.
func coreCases(t *testing.T, rdb, admin *redis.Client, logs *logRecords, pushLoss bool) time.Duration {
	t.Helper()
	ctx := ctxT(t)
	a := dlock.New(rdb, dlock.WithLogger(slog.New(logs)))
	defer a.Close(ctx)
	b := dlock.New(rdb, dlock.WithLogger(slog.New(logs)))
	defer b.Close(ctx)
	name := redistest.Name(t)

	l, err := a.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock = %v", err)
	}
	inner, err := a.Mutex(name).Lock(l.Context())
	if err != nil || inner.Token() != l.Token() {
		t.Fatalf("re-entry: %v", err)
	}
	if err := inner.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, err := a.Inspect(ctx, name); err != nil || !info.Held || info.Token != l.Token() {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	_ = inner.Unlock(ctx)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Contended: two Clients, several goroutines each, alternating on one lock.
	var slowest time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	var inside int
	for _, c := range []*dlock.Client{a, b} {
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					start := time.Now()
					l, err := c.Mutex(name + "-hot").Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					if inside != 1 {
						t.Error("two holders at once")
					}
					slowest = max(slowest, time.Since(start))
					inside--
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
					}
				}
			}()
		}
	}
	wg.Wait()
	// A hold a Client waited for lingers half a millisecond, then goes in the background.
	for deadline := time.Now().Add(2 * time.Second); admin.Exists(ctx, lockKey(name+"-hot")).Val() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lock left held after every Unlock: %v", admin.HGetAll(ctx, lockKey(name+"-hot")).Val())
		}
	}

	if pushLoss {
		l := lockTracked(t, a.Mutex(name))
		admin.Del(ctx, lockKey(name))
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("Err after DEL = %v", l.Err())
		}
	}
	return slowest
}

// A user with exactly the minimal ACL runs the core cases with push loss detection, and dlock
// logs nothing it cannot do (issue 9, point 5).
func TestLeastPrivilegedUser(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	admin := srv.Client()
	defer admin.Close()
	logs := newLogRecords()
	coreCases(t, aclClient(t, srv, "dlock", append(minimalACL, optionalACL...)...), admin, logs, true)
	if msg, ok := logs.findExcept(slog.LevelWarn, "lease lost"); ok { // the test deletes a held key
		t.Fatalf("a warning with the minimal ACL: %s", msg)
	}

	// Without the optional commands: the same, and one line per switched-off check.
	logs = newLogRecords()
	coreCases(t, aclClient(t, srv, "dlock-min", minimalACL...), admin, logs, true)
	if _, ok := logs.find(slog.LevelWarn, "ROLE"); !ok {
		t.Fatal("no warning that ROLE was refused")
	}
}

// A user that may not publish or subscribe (Redis 7's default for new users: resetchannels)
// and one without CLIENT: no script is left half-applied, waiters poll instead of stalling 2s
// each, the connections are not re-dialled in a storm, and each refusal is one log line.
func TestRestrictedUsersDegradeQuietly(t *testing.T) {
	noChannels := []string{}
	for _, r := range minimalACL {
		if !strings.HasPrefix(r, "&") {
			noChannels = append(noChannels, r)
		}
	}
	noClient := []string{}
	for _, r := range minimalACL {
		if !strings.HasPrefix(r, "+client|") {
			noClient = append(noClient, r)
		}
	}
	for _, c := range []struct {
		name     string
		rules    []string
		refused  string
		pushLoss bool
	}{
		{"no-channels", noChannels, "SUBSCRIBE", false},
		{"no-client", noClient, "CLIENT ID", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.StartT(t, redistest.Config{})
			admin := srv.Client()
			defer admin.Close()
			before := connectionsReceived(t, admin)
			logs := newLogRecords()
			slowest := coreCases(t, aclClient(t, srv, c.name, c.rules...), admin, logs, c.pushLoss)
			if slowest > time.Second {
				t.Fatalf("a contended Lock took %v (a 2s subscription stall?)", slowest)
			}
			time.Sleep(time.Second) // a reconnect storm would show in the connection count
			conns := connectionsReceived(t, admin) - before
			t.Logf("%s: slowest contended Lock %v, %d connections in all", c.name, slowest.Round(time.Millisecond), conns)
			if conns > 40 {
				t.Fatalf("%d connections: the notifier re-dialled in a storm", conns)
			}
			logs.mu.Lock()
			warns := 0
			for _, r := range logs.recs {
				if r.Level == slog.LevelWarn && strings.Contains(r.Message, c.refused) {
					warns++
				}
			}
			logs.mu.Unlock()
			if warns == 0 || warns > 2 { // once per Client
				for _, r := range logs.recs {
					t.Logf("log: %v %s", r.Level, r.Message)
				}
				t.Fatalf("%d warnings naming %s, want one per Client", warns, c.refused)
			}
		})
	}
}

func connectionsReceived(t *testing.T, admin *redis.Client) int {
	t.Helper()
	info := admin.Info(context.Background(), "stats").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatal("no total_connections_received in INFO")
	return 0
}

// The read-write lock and the multi-lock work as the least-privileged user: their scripts use
// only the commands README lists (pruning readers reads the hash with HGETALL).
func TestLeastPrivilegedUserRWMutexAndMultiLock(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := aclClient(t, srv, "dlock", minimalACL...)
	ctx := ctxT(t)
	c := dlock.New(rdb, dlock.WithLogger(slog.New(newLogRecords())))
	defer c.Close(ctx)
	rw := c.RWMutex("acl-rw")
	short := c.RWMutex("acl-rw", dlock.WithTTL(200*time.Millisecond), dlock.WithFixedLease())
	dead := must(t)(short.RLock(ctx))
	r := must(t)(rw.RLock(ctx))
	w := rwLockAsync(t, rw, false)
	waitQueued(t, c, "acl-rw", 1)
	waitDone(t, dead, 5*time.Second) // its entry is pruned by a later script
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = got(t, "writer", w).Unlock(ctx)
	ml := must(t)(c.MultiLock([]string{"acl-a", "acl-b"}).Lock(ctx))
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A user with exactly the minimal ACL sets, counts down, reads and waits for a latch, and
// acquires and reads a semaphore, held and free. Found by review: reading an open latch or a
// free semaphore sent HLEN, which that ACL does not allow.
func TestLeastPrivilegedUserLatchAndSemaphore(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := aclClient(t, srv, "dlock", minimalACL...)
	ctx := ctxT(t)
	c := dlock.New(rdb, dlock.WithLogger(slog.New(newLogRecords())))
	defer c.Close(ctx)
	d := c.Latch("acl-latch")
	if n, err := d.Count(ctx); err != nil || n != 0 {
		t.Errorf("Count of an open latch: %d, %v", n, err)
	}
	if err := d.Wait(ctx); err != nil {
		t.Errorf("Wait of an open latch: %v", err)
	}
	if ok, err := d.TrySetCount(ctx, 1); !ok || err != nil {
		t.Fatalf("TrySetCount: %v, %v", ok, err)
	}
	if n, err := d.Count(ctx); err != nil || n != 1 {
		t.Errorf("Count of a counting latch: %d, %v", n, err)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(ctx); err != nil {
		t.Errorf("Wait of a latch opened: %v", err)
	}
	s := c.Semaphore("acl-sem", 3)
	if n, err := s.Available(ctx); err != nil || n != 3 {
		t.Errorf("Available of a free semaphore: %d, %v", n, err)
	}
	l := must(t)(s.Acquire(ctx, 2))
	if n, err := s.Available(ctx); err != nil || n != 1 {
		t.Errorf("Available with 2 of 3 permits out: %d, %v", n, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A user with exactly the minimal ACL reads under one WithOwner id from two handles (two
// holds of one reading owner). Found by review of the scripts' commands: that path used
// HSETNX, which the minimal ACL does not allow.
func TestLeastPrivilegedUserReadsTwiceAsOneOwner(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := aclClient(t, srv, "dlock", minimalACL...)
	ctx := ctxT(t)
	c := dlock.New(rdb, dlock.WithLogger(slog.New(newLogRecords())))
	defer c.Close(ctx)
	a := must(t)(c.RWMutex("acl-owner", dlock.WithOwner("svc-1")).RLock(ctx))
	b := must(t)(c.RWMutex("acl-owner", dlock.WithOwner("svc-1")).RLock(ctx))
	for _, l := range []*dlock.Lease{b, a} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Every command dlock's scripts call is in the minimal ACL (a script calling another fails
// for a least-privileged user only on the path that calls it, which a test may not reach).
func TestScriptsCallOnlyTheMinimalACL(t *testing.T) {
	allowed := map[string]bool{}
	for _, r := range minimalACL {
		if strings.HasPrefix(r, "+") {
			allowed[strings.ToUpper(strings.TrimPrefix(r, "+"))] = true
		}
	}
	files, err := filepath.Glob("internal/scripts/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	call := regexp.MustCompile(`redis\.p?call\(\s*'([A-Za-z]+)'`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if cmd := strings.ToUpper(m[1]); !allowed[cmd] {
				t.Errorf("%s calls %s, which the minimal ACL (README) does not allow", f, cmd)
			}
		}
	}
}

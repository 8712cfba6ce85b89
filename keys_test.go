package dlock_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A missing fence key (evicted, deleted) never breaks a call: the token of a hold lives with
// the hold (issue 9, point 9).
func TestMissingFenceKeyBreaksNothing(t *testing.T) {
	c, rdb := newClient(t, dlock.WithoutCohort())
	ctx := ctxT(t)
	name := redistest.Name(t)
	fence := lockKey(name) + ":fence"

	// Re-entry by owner id.
	m := c.Mutex(name, dlock.WithOwner("job-1"))
	l1, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, fence)
	l2, err := m.Lock(ctx)
	if err != nil || l2.Token() != l1.Token() {
		t.Fatalf("re-entry without the fence key: %v (token %d, want %d)", err, l2.Token(), l1.Token())
	}
	_ = l2.Unlock(ctx)

	// A grant and its confirmation.
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, c, name, 1)
	rdb.Del(ctx, fence)
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil || w.Token() <= l1.Token() {
		t.Fatalf("granted waiter without the fence key: %v", w)
	}

	// A retried acquire (its reply lost) after the fence key went.
	k := names(t)
	first := acquire(t, rdb, k, "A", "h1")
	rdb.Del(ctx, k.fence)
	if again := acquire(t, rdb, k, "A", "h1"); again[0] != 1 || again[1] != first[1] {
		t.Fatalf("retried acquire without the fence key = %v, want %v", again, first)
	}
	_ = w.Unlock(ctx)
}

// logRecords is a slog handler that keeps the records it gets.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
	got  chan struct{}
}

func newLogRecords() *logRecords { return &logRecords{got: make(chan struct{}, 100)} }

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	select {
	case h.got <- struct{}{}:
	default:
	}
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

// findExcept returns the first record at level whose message does not contain text.
func (h *logRecords) findExcept(level slog.Level, text string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Level == level && !strings.Contains(r.Message, text) {
			return r.Message, true
		}
	}
	return "", false
}

// find returns the first record at level whose message contains text, with its attributes.
func (h *logRecords) find(level slog.Level, text string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, text) {
			s := r.Message
			r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
			return s, true
		}
	}
	return "", false
}

// An evicting maxmemory-policy is reported at start through WithLogger (issue 9, point 9).
func TestEvictingPolicyIsLoggedAtStart(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{MaxMemory: "64mb", Policy: "allkeys-lru"})
	rdb := srv.Client()
	defer rdb.Close()
	logs := newLogRecords()
	c := dlock.New(rdb, dlock.WithLogger(slog.New(logs)))
	l, err := c.Mutex(redistest.Name(t)).Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctxT(t))
	_ = c.Close(ctxT(t)) // waits for the background check
	msg, ok := logs.find(slog.LevelWarn, "evict")
	if !ok || !strings.Contains(msg, "allkeys-lru") {
		t.Fatalf("no warning naming allkeys-lru; got %q", msg)
	}

	// The default policy (noeviction) gives no warning.
	logs2 := newLogRecords()
	c2 := dlock.New(redistest.Client(t), dlock.WithLogger(slog.New(logs2)))
	if l, err := c2.Mutex(redistest.Name(t)).Lock(ctxT(t)); err == nil {
		_ = l.Unlock(ctxT(t))
	}
	_ = c2.Close(ctxT(t))
	if msg, ok := logs2.find(slog.LevelWarn, "evict"); ok {
		t.Fatalf("a warning with noeviction: %q", msg)
	}
}

// A lock that is free and unwaited for leaves nothing in Redis once the op log window has
// passed, and tokens keep increasing across that (issue 9, point 10).
func TestFreeLocksLeaveNothingBehind(t *testing.T) {
	dlock.SetOpLogTTL(t, 200*time.Millisecond)
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx := ctxT(t)
	var last uint64
	for i := 0; i < 300; i++ {
		l, err := c.Mutex("user:" + string(rune('a'+i%26)) + time.Duration(i).String()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			last = l.Token()
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	emptyWithin(t, rdb, 5*time.Second)
	l, err := c.Mutex("user:a0s").Lock(ctx) // the first name again, after its keys went
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= last {
		t.Fatalf("token %d after the lock's keys expired, want above the earlier %d", l.Token(), last)
	}
	_ = l.Unlock(ctx)
	emptyWithin(t, rdb, 5*time.Second)
}

// emptyWithin waits until the server holds no key, failing the test after limit.
func emptyWithin(t *testing.T, rdb *redis.Client, limit time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	for deadline := time.Now().Add(limit); rdb.DBSize(ctx).Val() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			keys := rdb.Keys(ctx, "*").Val()
			t.Fatalf("%d keys left %v after the locks were freed: %.5v", len(keys), limit, keys)
		}
	}
}

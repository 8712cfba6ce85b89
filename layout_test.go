package dlock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// layout1 runs the scripts of the previous key layout (testdata/layout1, dlock before layout
// versioning), as an old process would during a rolling upgrade.
type layout1 struct{ acquire, release *redis.Script }

func loadLayout1(t *testing.T) layout1 {
	read := func(f string) string {
		b, err := os.ReadFile("testdata/layout1/" + f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return layout1{redis.NewScript(read("grant.lua") + read("acquire.lua")), redis.NewScript(read("grant.lua") + read("release.lua"))}
}

func (v layout1) lock(ctx context.Context, rdb *redis.Client, name, owner, holdID string) ([]int64, error) {
	k := lockKey(name)
	return v.acquire.Run(ctx, rdb, []string{k, k + ":fence", k + ":log", k + ":queue", k + ":live"},
		owner, 30000, holdID, 60000, false, 750, k+":released", 500, "PUBLISH", true, 60000, 0).Int64Slice()
}

func (v layout1) unlock(ctx context.Context, rdb *redis.Client, name, owner, holdID string) (int64, error) {
	k := lockKey(name)
	return v.release.Run(ctx, rdb, []string{k, k + ":log", k + ":fence", k + ":queue", k + ":live"},
		owner, holdID, 60000, k+":released", false, 500, "PUBLISH", false, 0).Int64()
}

// A process of the previous layout and one of this layout never both hold a lock: each
// refuses or waits for the other's lock (issue 9, point 15).
func TestTwoLayoutsNeverBothHoldALock(t *testing.T) {
	old := loadLayout1(t)
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)

	res, err := old.lock(ctx, rdb, name, "old-process", "o1")
	if err != nil || res[0] != 1 {
		t.Fatalf("old layout lock: %v, %v", res, err)
	}
	before := rdb.HGetAll(ctx, lockKey(name)).Val()
	for _, opts := range [][]dlock.Option{nil, {dlock.WithoutCohort()}, {dlock.WithOwner("old-process")}} {
		if _, err := c.Mutex(name, opts...).TryLock(ctx); !errors.Is(err, dlock.ErrIncompatible) || !strings.Contains(err.Error(), "another dlock version") {
			t.Fatalf("TryLock on a lock of the old layout = %v, want ErrIncompatible naming the cause", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Mutex(name, opts...).Lock(wctx)
		cancel()
		if !errors.Is(err, dlock.ErrIncompatible) {
			t.Fatalf("Lock on a lock of the old layout = %v, want ErrIncompatible at once", err)
		}
	}
	if after := rdb.HGetAll(ctx, lockKey(name)).Val(); len(after) != len(before) {
		t.Fatalf("the old layout's lock was changed: %v -> %v", before, after)
	}
	if n, err := old.unlock(ctx, rdb, name, "old-process", "o1"); err != nil || n != 2 {
		t.Fatalf("old layout unlock: %d, %v", n, err)
	}

	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// (A handle made WithOwner with the holder's very owner id is that owner, in any process
	// and either layout: it re-enters, by design.)
	if res, err := old.lock(ctx, rdb, name, "old-process", "o2"); err == nil && res[0] == 1 {
		t.Fatalf("an old-layout process got a lock this layout holds: %v", res)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A server older than 7.0 refuses the "#!lua" line of every script at once, changing nothing;
// dlock names the cause. The refusal is produced here by a real Redis compile error of the
// same shape, since no such server is at hand (issue 9, point 13).
func TestOldServerIsIncompatible(t *testing.T) {
	rdb := redistest.Client(t)
	err := rdb.Eval(ctxT(t), "return 1 #", nil).Err()
	if err == nil {
		t.Fatal("no compile error")
	}
	mapped := dlock.RedisErr(err)
	if !errors.Is(mapped, dlock.ErrIncompatible) || !strings.Contains(mapped.Error(), "Redis 7.0") {
		t.Fatalf("compile error of the shebang = %v, want ErrIncompatible naming Redis 7.0", mapped)
	}
}

// A nil or closed go-redis client gives ErrInvalid or ErrClosed, never a panic or a wait; errors
// print on one line (issue 9, point 13).
func TestNilAndClosedRedisClients(t *testing.T) {
	ctx := ctxT(t)
	for _, rdb := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		c := dlock.New(rdb)
		if _, err := c.Mutex("x").Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Lock on a nil client %T = %v, want ErrInvalid", rdb, err)
		}
		if _, err := c.Inspect(ctx, "x"); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Inspect on a nil client = %v", err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redistest.Shared(t).Client()
	_ = rdb.Close()
	c := dlock.New(rdb, dlock.OnGoRedis()) // the go-redis client's own closing is what is tested
	defer c.Close(ctx)
	for _, wait := range []bool{false, true} {
		m := c.Mutex(redistest.Name(t))
		var err error
		if wait {
			_, err = m.Lock(ctx)
		} else {
			_, err = m.TryLock(ctx)
		}
		if !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("lock (wait %v) on a closed go-redis client = %v, want ErrClosed", wait, err)
		}
	}

	// A joined error (not obtained + the ctx's end) is one line.
	c2, _ := newClient(t)
	name := redistest.Name(t)
	held, err := c2.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	c3, _ := newClient(t)
	_, err = c3.Mutex(name).Lock(wctx)
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Lock until the ctx ends = %q: want one line matching ErrNotObtained and DeadlineExceeded", err)
	}
}

package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// goRedisRunner is a ScriptRunner over a go-redis client, as another library's would be: it
// sends what it is given and counts the calls.
type goRedisRunner struct {
	rdb   *redis.Client
	calls atomic.Int64
	short bool // return no results at all (a broken runner)
}

func (r *goRedisRunner) RunScripts(ctx context.Context, calls []dlock.ScriptCall) []dlock.ScriptResult {
	r.calls.Add(int64(len(calls)))
	if r.short {
		return nil
	}
	out := make([]dlock.ScriptResult, len(calls))
	for i, c := range calls {
		args := make([]any, len(c.Args))
		for j, a := range c.Args {
			args[j] = a
		}
		v, err := r.rdb.EvalSha(ctx, c.SHA1, c.Keys, args...).Result()
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			v, err = r.rdb.Eval(ctx, c.Source, c.Keys, args...).Result()
		}
		out[i] = dlock.ScriptResult{Val: v, Err: err}
	}
	return out
}

// Every primitive's scripts go through the runner, and their replies and errors mean what they
// mean on go-redis.
func TestScriptRunnerRunsEveryScript(t *testing.T) {
	ctx := ctxT(t)
	rdb := redistest.Client(t)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil { // the runner's EVAL fallback too
		t.Fatal(err)
	}
	r := &goRedisRunner{rdb: rdb}
	c, _ := newClient(t, dlock.WithScriptRunner(r))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock through the runner: %v, want ErrNotObtained", err)
	}
	if _, err := c.RWMutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("RWMutex on a Mutex's name through the runner: %v, want ErrInvalid (a script's error reply)", err)
	}
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	d := c.Latch(name + ":latch")
	if _, err := d.TrySetCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	ml, err := c.MultiLock([]string{name + ":a", name + ":b"}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	// Lock, TryLock, RWMutex TryLock, Extend, Unlock, TrySetCount, CountDown, MultiLock, its
	// Unlock (one release per member at most), ForceRelease: all through the runner.
	if n := r.calls.Load(); n < 10 {
		t.Fatalf("%d script calls through the runner, want at least 10", n)
	}
}

// A runner that returns no result is an error, never a panic or a lease.
func TestScriptRunnerWithoutResultsIsAnError(t *testing.T) {
	ctx := ctxT(t)
	c, _ := newClient(t, dlock.WithScriptRunner(&goRedisRunner{rdb: redistest.Client(t), short: true}))
	if l, err := c.Mutex(redistest.Name(t)).TryLock(ctx); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock through a runner that returns nothing: %v, %v; want an error", l, err)
	}
}

func TestNilScriptRunnerIsInvalid(t *testing.T) {
	ctx := ctxT(t)
	for _, r := range []dlock.ScriptRunner{nil, (*goRedisRunner)(nil)} {
		c, _ := newClient(t, dlock.WithScriptRunner(r))
		if _, err := c.Mutex("x").TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock with WithScriptRunner(%#v): %v, want ErrInvalid", r, err)
		}
	}
}

// One runner reaches one deployment: a Redlock, whose masters are several, refuses it.
func TestRedlockRefusesAScriptRunner(t *testing.T) {
	ctx := ctxT(t)
	var masters []redis.UniversalClient
	for range 3 {
		m := redistest.StartT(t, redistest.Config{}).Client()
		t.Cleanup(func() { _ = m.Close() })
		masters = append(masters, m)
	}
	c := dlock.NewRedlock(masters, dlock.WithScriptRunner(&goRedisRunner{rdb: masters[0].(*redis.Client)}))
	defer c.Close(ctx)
	if _, err := c.Mutex("x").TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Redlock with a ScriptRunner: %v, want ErrInvalid", err)
	}
}

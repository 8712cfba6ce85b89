package dlock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A user without HGETALL: the tracking read of a held key would fail with NOPERM forever. It is
// switched off with one log line, not re-read every 100 ms for the lease's whole life (found by
// review; issue 9, point 5).
func TestNoPermOnTheTrackedReadSwitchesTrackingOff(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	admin := srv.Client()
	defer admin.Close()
	var rules []string
	for _, r := range append(append([]string{}, minimalACL...), optionalACL...) {
		if r != "+hgetall" {
			rules = append(rules, r)
		}
	}
	rdb := aclClient(t, srv, "nohgetall", rules...)
	logs := newLogRecords()
	ctx := ctxT(t)
	dl := dlock.New(rdb, dlock.WithLogger(slog.New(logs)))
	defer dl.Close(ctx)
	l, err := dl.Mutex(redistest.Name(t)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	time.Sleep(500 * time.Millisecond)
	before := rejectedHGETALLs(t, admin)
	time.Sleep(1500 * time.Millisecond)
	n := rejectedHGETALLs(t, admin) - before
	logs.mu.Lock()
	for _, r := range logs.recs {
		t.Logf("log: %v %s", r.Level, r.Message)
	}
	logs.mu.Unlock()
	t.Logf("ACL-denied commands in 1.5s while one lease is held: %d", n)
	if n > 3 {
		t.Errorf("hot loop: %d NOPERM refusals in 1.5s, lease Err=%v", n, l.Err())
	}
	if _, ok := logs.find(slog.LevelWarn, "HGETALL"); !ok {
		t.Error("no log line saying HGETALL was refused")
	}
}

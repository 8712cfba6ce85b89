package dlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A Sentinel failover away from a master that is paused (SIGSTOP: a partition, no RST) and
// stays so: the pub/sub connection on it gets no PONG within a health interval and is re-dialled
// through the sentinels, so a DEL on the new master is pushed within about a second (found by
// review; issue 9, points 1 and 2).
func TestPausedOldSentinelMasterIsLeftBehind(t *testing.T) {
	g := redistest.StartSentinelT(t, redistest.SentinelConfig{})
	rdb := g.FailoverClient()
	defer rdb.Close()
	ctx := ctxT(t)
	dl := dlock.New(rdb) // TTL 30s: renewal every 10s
	defer dl.Close(ctx)
	l, err := dl.Mutex(redistest.Name(t)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-dlock.Tracked(l)
	old := g.Master()
	old.Pause()
	defer old.Resume()
	start := time.Now()
	var now *redistest.Server
	for now == nil || now == old {
		if time.Since(start) > 20*time.Second {
			t.Fatal("no failover")
		}
		time.Sleep(50 * time.Millisecond)
		now = g.Master()
	}
	for {
		if r, err := now.Role(context.Background()); err == nil && r == "master" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("new master %s %v after the pause", now.Addr, time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // settle: tracking health check (2s) and re-dial
	if l.Err() != nil {
		t.Fatalf("lease lost by the failover: %v", l.Err())
	}
	admin := now.Client()
	defer admin.Close()
	tracking := func() string {
		for _, line := range strings.Split(admin.Info(ctx, "commandstats").Val(), "\r\n") {
			if strings.HasPrefix(line, "cmdstat_client|tracking:") {
				return line
			}
		}
		return ""
	}
	t.Logf("before: %s", tracking())
	time.Sleep(2 * time.Second)
	t.Logf("2s later: %s", tracking())
	if err := admin.Del(ctx, lockKey(l.Name())).Err(); err != nil {
		t.Fatal(err)
	}
	del := time.Now()
	select {
	case <-l.Done():
	case <-time.After(15 * time.Second):
	}
	took := time.Since(del)
	t.Logf("loss reported %v after the DEL: %v", took.Round(time.Millisecond), l.Err())
	if took > 1500*time.Millisecond {
		t.Errorf("missed loss: %v after the DEL on the new master", took.Round(time.Millisecond))
	}
	list, _ := admin.ClientList(ctx).Result()
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "dlock-notify") {
			t.Logf("dlock-notify on the new master: %s", line)
		}
	}
}

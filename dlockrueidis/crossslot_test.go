package dlockrueidis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockrueidis"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// A go-redis *redis.Client on a one-shard Cluster (a node owning every slot) and a rueidis
// client for it that detects the Cluster (rueidis.NewClient's default) reach one deployment.
// dlock sends a MultiLock on a *redis.Client as one script over keys of several slots and goes
// member by member on CROSSSLOT; rueidis's Cluster builder panics on such keys instead, which the
// adapter must turn into that reply, not a panic in the caller's goroutine.
func TestMultiLockAcrossSlotsOnAClusterModeRueidisClient(t *testing.T) {
	s := redistest.StartT(t, redistest.Config{Cluster: true})
	rdb := s.Client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := []string{redistest.Name(t) + "a", redistest.Name(t) + "b", redistest.Name(t) + "c"}

	// go-redis alone: CROSSSLOT, then member by member: taken.
	c0 := dlock.New(rdb)
	defer c0.Close(ctx)
	l, err := c0.MultiLock(names).TryLock(ctx)
	if err != nil {
		t.Fatalf("go-redis: %v", err)
	}
	_ = l.Unlock(ctx)

	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Options().Addr},
		DisableCache: true, DisableRetry: true, AlwaysPipelining: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	t.Logf("rueidis mode: %v", rc.Mode())
	c := dlock.New(rdb, dlock.WithScriptRunner(dlockrueidis.RunnerFor(rdb, rc)))
	defer c.Close(ctx)
	err = func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		l, err := c.MultiLock(names).TryLock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
		}
		return err
	}()
	if err != nil {
		t.Fatalf("rueidis: %v", err)
	}
}

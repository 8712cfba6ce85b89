package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The cluster code paths (slot routing, per-node notifier, pipelined renewal) on a real
// one-node Redis Cluster.
func TestClusterClient(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{Cluster: true})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	defer cc.Close()
	c := dlock.New(cc, dlock.WithTTL(300*time.Millisecond))
	defer c.Close(context.Background())
	ctx := ctxT(t)
	name := redistest.Name(t)

	held := lockTracked(t, c.Mutex(name))
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second owner on cluster: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	// Outlive the TTL a few times: renewal must keep the lock through the cluster pipeline.
	time.Sleep(time.Second)
	if held.Err() != nil {
		t.Fatalf("lease lost while renewed on cluster: %v", held.Err())
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter on cluster: %v", err)
	}

	lost := lockTracked(t, c.Mutex(name))
	cc.Del(ctx, lockKey(name))
	waitDone(t, lost, 2*time.Second)
	if !errors.Is(lost.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err after DEL on cluster = %v", lost.Err())
	}
}

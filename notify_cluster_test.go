package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// twoSlotNames returns two lock names of the test whose keys are on different Cluster slots.
func twoSlotNames(t *testing.T) (string, string) {
	a := redistest.Name(t)
	for i := 0; ; i++ {
		if b := fmt.Sprintf("%s-%d", a, i); dlock.KeySlot(lockKey(b)) != dlock.KeySlot(lockKey(a)) {
			return a, b
		}
	}
}

// oneNodeCluster starts a Cluster of one node and returns it, a client of the node itself, and
// two dlock Clients over a Cluster client: a holder, and a waiter without cohorting (each of
// its waits is a Redis waiter). All are closed at the test's end.
func oneNodeCluster(t *testing.T) (srv *redistest.Server, node *redis.Client, holder, waiter *dlock.Client) {
	srv = redistest.StartT(t, redistest.Config{Cluster: true})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	node = srv.Client()
	holder, waiter = dlock.New(cc), dlock.New(cc, dlock.WithoutCohort())
	t.Cleanup(func() {
		_ = waiter.Close(context.Background())
		_ = holder.Close(context.Background())
		_ = node.Close()
		_ = cc.Close()
	})
	return srv, node, holder, waiter
}

// shardSubscribersOn waits up to limit for the shard channels' subscriber counts on the node to
// be want, and returns the counts it saw last.
func shardSubscribersOn(t *testing.T, node *redis.Client, want int64, limit time.Duration, chans ...string) map[string]int64 {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(5 * time.Millisecond) {
		got, err := node.PubSubShardNumSub(context.Background(), chans...).Result()
		if err != nil {
			t.Fatal(err)
		}
		all := true
		for _, ch := range chans {
			all = all && got[ch] == want
		}
		if all || time.Now().After(deadline) {
			return got
		}
	}
}

// On a Cluster the release channels of locks on two slots are subscribed again after the
// pub/sub connection is reset: go-redis re-subscribes them in one SSUBSCRIBE, which the node
// refuses (CROSSSLOT), so dlock does it slot by slot. Before, neither channel was subscribed
// again and every later release reached the waiters only by their 250 ms retry.
func TestClusterReleaseChannelsOnTwoSlotsSurviveAPubSubReset(t *testing.T) {
	a, b := twoSlotNames(t)
	srv, node, holder, waiter := oneNodeCluster(t)
	ctx := ctxT(t)
	got := make(chan error, 2)
	var held []*dlock.Lease
	for _, name := range []string{a, b} {
		l, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		go func() {
			l, err := waiter.Mutex(name).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		waitQueued(t, waiter, name, 1)
	}
	chans := []string{lockKey(a) + ":released", lockKey(b) + ":released"}
	if n := shardSubscribersOn(t, node, 1, 5*time.Second, chans...); n[chans[0]] != 1 || n[chans[1]] != 1 {
		t.Fatalf("the waiters' channels were not subscribed: %v", n)
	}
	if _, err := srv.KillClients(ctx, "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	if n := shardSubscribersOn(t, node, 1, 5*time.Second, chans...); n[chans[0]] != 1 || n[chans[1]] != 1 {
		t.Fatalf("5 s after a reset of the pub/sub connections the waiters' channels were not subscribed again: %v", n)
	}
	for _, l := range held {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
}

// On a Cluster, idle release channels of locks on two slots are unsubscribed: one SUNSUBSCRIBE
// naming both was refused (CROSSSLOT) and the node kept both subscribed for the connection's
// life, one per lock name ever waited for.
func TestClusterIdleReleaseChannelsOnTwoSlotsAreUnsubscribed(t *testing.T) {
	dlock.SetIdleChannelAfter(t, 300*time.Millisecond)
	a, b := twoSlotNames(t)
	_, node, holder, waiter := oneNodeCluster(t)
	ctx := ctxT(t)
	var chans []string
	for _, name := range []string{a, b} {
		held, err := holder.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Mutex(name).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		waitQueued(t, waiter, name, 1)
		ch := lockKey(name) + ":released"
		chans = append(chans, ch)
		if n := shardSubscribersOn(t, node, 1, 5*time.Second, ch); n[ch] != 1 {
			t.Fatalf("the waiter's channel was not subscribed: %v", n)
		}
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	// Both idle now: the sweep drops them within two idle periods.
	if n := shardSubscribersOn(t, node, 0, 5*time.Second, chans...); n[chans[0]] != 0 || n[chans[1]] != 0 {
		t.Fatalf("idle release channels still subscribed 5 s after their last waiter: %v", n)
	}
}

package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// After a Cluster master is killed (not a graceful failover) the leases on its slots survive:
// a renewal that gets no answer asks the ClusterClient to reload its slot map, which otherwise
// names the dead node for up to a minute. Found by review; issue 9, points 2 and 4.
func TestKilledClusterMastersLeasesRenewOnThePromotedReplica(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc, dlock.WithTTL(6*time.Second))
	defer dl.Close(ctx)
	victim := cl.Masters()[0]
	ls := lockAllTracked(t, dl, namesOn(t, cc, victim, 3))
	start := time.Now()
	promoted, at := killReplicated(t, cl, victim)
	t.Logf("promoted %s %v after the kill", promoted.Addr, at.Sub(start).Round(time.Millisecond))
	admin := promoted.Client()
	defer admin.Close()
	select {
	case <-ls[0].Done():
		ttl, _ := admin.PTTL(ctx, lockKey(ls[0].Name())).Result()
		t.Errorf("lease lost %v after the kill (promotion after %v): %v; key PTTL on the promoted master now %v",
			time.Since(start).Round(time.Millisecond), at.Sub(start).Round(time.Millisecond), ls[0].Err(), ttl)
	case <-time.After(9 * time.Second): // past the deadline of a lease renewed only on the dead node
		t.Logf("leases survived 9s")
	}
}

// A waiter whose lock's slot gets a new Cluster master subscribes again in the slot's shard, so
// the holder's release there wakes it by push, not by its next periodic retry: after a kill
// once Redis answers again, after a graceful failover when the old master drops the
// subscription, and after a failback to the first master. The new subscription may be on the
// new master or, while go-redis's slot map still names the old one, on that old master, now
// the new one's replica: Redis Cluster passes a shard channel's messages on to the shard's
// replicas, so a release wakes it there too. Found by review; issue 9, point 4.
func TestWaitersSubscribeOnTheSlotsNewMaster(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	holder := dlock.New(cc)
	defer holder.Close(ctx)
	waiter := dlock.New(cc)
	defer waiter.Close(ctx)
	// One lock through every move, so the waiter's notifiers have seen the channel before.
	name := namesOn(t, cc, cl.Masters()[0], 1)[0]
	graceful := func(old *redistest.Server) *redistest.Server {
		r := cl.ReplicaOf(old)
		if err := cl.GracefulFailover(r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	moves := []struct {
		what string
		move func(old *redistest.Server) *redistest.Server
	}{
		{"graceful failover", graceful},
		{"failback", graceful},
		{"kill", func(old *redistest.Server) *redistest.Server {
			r, _ := killReplicated(t, cl, old)
			return r
		}},
	}
	current := cl.Masters()[0]
	for _, mv := range moves {
		held := lockAllTracked(t, holder, []string{name})[0]
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Mutex(name).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		waitQueued(t, waiter, name, 1)
		current = mv.move(current)
		channel := lockKey(name) + ":released"
		for deadline := time.Now().Add(5 * time.Second); ; {
			if n := subscribersInShard(cl, current, channel); n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the waiter never subscribed to %s in the shard of the new master %s; subscribers per node: %s",
					mv.what, channel, current.Addr, shardSubscribers(cl, channel))
			}
			time.Sleep(20 * time.Millisecond) // the subscription is the waiter's, no event reaches the test
		}
		// Right after a kill go-redis's slot map may still name the dead master for a while
		// (its reload can ask the dead node first): Unlock may then say Redis is unavailable,
		// as documented, and release in the background. The waiter gets the lock either way.
		if err := held.Unlock(ctx); err != nil && !(mv.what == "kill" && errors.Is(err, dlock.ErrUnavailable)) {
			t.Fatalf("%s: %v", mv.what, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("%s: waiter: %v", mv.what, err)
		}
	}
}

// killReplicated kills the Cluster master once its replica has applied every write made so
// far, and returns the promoted replica and when its promotion was seen. Replication is
// asynchronous: a kill before the replica has a hold (or a waiter's place) loses them, a
// scenario of its own (lost writes) that would otherwise hit these tests by chance on a
// loaded machine.
func killReplicated(t *testing.T, cl *redistest.Cluster, master *redistest.Server) (*redistest.Server, time.Time) {
	t.Helper()
	if err := master.AwaitReplicated(cl.ReplicaOf(master), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	promoted, at, err := cl.KillMaster(master)
	if err != nil {
		t.Fatal(err)
	}
	return promoted, at
}

// subscribersInShard counts the subscribers of a shard channel on master and its replica.
func subscribersInShard(cl *redistest.Cluster, master *redistest.Server, channel string) int64 {
	shard := []*redistest.Server{master}
	if r := cl.ReplicaOf(master); r != nil {
		shard = append(shard, r)
	}
	var sum int64
	for _, s := range shard {
		c := s.Client()
		n, err := c.PubSubShardNumSub(context.Background(), channel).Result()
		c.Close()
		if err == nil {
			sum += n[channel]
		}
	}
	return sum
}

// shardSubscribers lists each running node's subscriber count of a shard channel, for a
// failure message.
func shardSubscribers(cl *redistest.Cluster, channel string) string {
	var out []string
	for _, s := range cl.Nodes() {
		if !s.Running() {
			continue
		}
		c := s.Client()
		n, err := c.PubSubShardNumSub(context.Background(), channel).Result()
		c.Close()
		out = append(out, fmt.Sprintf("%s=%d(%v)", s.Addr, n[channel], err))
	}
	return strings.Join(out, " ")
}

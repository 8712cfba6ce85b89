package dlock_test

import (
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
	promoted, at, err := cl.KillMaster(victim)
	if err != nil {
		t.Fatal(err)
	}
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

// A waiter whose lock's Cluster master is killed subscribes again on the promoted replica once
// Redis answers there, so the holder's release there wakes it by push, not by its next
// periodic retry. Found by review; issue 9, point 4.
func TestWaitersSubscribeOnThePromotedReplica(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	holder := dlock.New(cc)
	defer holder.Close(ctx)
	waiter := dlock.New(cc)
	defer waiter.Close(ctx)
	victim := cl.Masters()[0]
	name := namesOn(t, cc, victim, 1)[0]
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
	promoted, _, err := cl.KillMaster(victim)
	if err != nil {
		t.Fatal(err)
	}
	admin := promoted.Client()
	defer admin.Close()
	channel := lockKey(name) + ":released"
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := admin.PubSubShardNumSub(ctx, channel).Result()
		if err == nil && n[channel] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never subscribed to %s on the promoted master (%v, %v)", channel, n, err)
		}
		time.Sleep(20 * time.Millisecond) // the subscription is the waiter's, no event reaches the test
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

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

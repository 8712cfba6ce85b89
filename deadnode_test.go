package dlock_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Cluster master killed for good (kill -9, not restarted): its replica is promoted and the
// watched keys move to the new master's notification connections, so a later DEL there is
// pushed at once; once no lease lives on the dead node, dlock dials it no more (its notifier
// retires). Found by review; issue 9, points 1 and 2.
//
// The ClusterClient's own node pools are left out of the dial count: go-redis reloads its slot
// map from a node picked at random among every address it knows, its seeds included, so it
// may dial the dead node whatever dlock does (it failed CI so once).
func TestKilledClusterMastersKeysMoveAndItsNotifierGoes(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	var victimAddr atomic.Value
	victimAddr.Store("")
	var all, pools atomic.Int64 // dials to the victim: every one, and the ClusterClient's pools'
	cc := cl.Client(func(o *redis.ClusterOptions) {
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == victimAddr.Load().(string) {
				all.Add(1)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		// Node clients of the ClusterClient only: dlock's notifiers make their own clients
		// from the node's options (which carry the Dialer but not this hook).
		o.NewClient = func(opt *redis.Options) *redis.Client {
			node := redis.NewClient(opt)
			node.AddHook(dialCounter{addr: &victimAddr, n: &pools})
			return node
		}
	})
	dials := func() int64 { return all.Load() - pools.Load() }
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc) // default TTL 30s: renewal every 10s
	defer dl.Close(ctx)
	victim := cl.Masters()[0]
	victimAddr.Store(victim.Addr)
	ls := lockAllTracked(t, dl, namesOn(t, cc, victim, 3))
	promoted, at := killReplicated(t, cl, victim)
	if err := cl.WaitStable(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted %v", promoted.Addr, at.Format("15:04:05.000"))
	// Isolate the notifier from the renewal finding: make the main client learn the new
	// slot map (as a Lock attempt would), so renewals reach the promoted master.
	for deadline := time.Now().Add(5 * time.Second); ; {
		cc.ReloadState(ctx)
		if node, err := cc.MasterForKey(ctx, lockKey(ls[0].Name())); err == nil && node.Options().Addr == promoted.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("main client never learnt the promotion")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// dlock settles on the new topology: every hold is watched by the promoted master's notifier.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		settled := true
		for _, l := range ls {
			if l.Err() != nil {
				t.Fatalf("lease lost by the failover: %v", l.Err())
			}
			settled = settled && dlock.WatchedAt(l) == promoted.Addr
		}
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holds not watched on the promoted master 10s after it was known: %s", dlock.WatchedAt(ls[0]))
		}
	}
	admin := promoted.Client()
	defer admin.Close()
	d0 := dials()
	if d0 == 0 {
		// Its notifier re-dials the dead node until the holds move: a counter that missed
		// those would miss a leak too.
		t.Fatalf("no dial of the dead node %s counted as dlock's since the kill", victim.Addr)
	}
	del := time.Now()
	if err := admin.Del(ctx, lockKey(ls[0].Name())).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ls[0].Done():
		t.Logf("loss reported %v after the DEL", time.Since(del).Round(time.Millisecond))
	case <-time.After(12 * time.Second):
		t.Errorf("lease still held 12s after its key was deleted on the new master")
	}
	if took := time.Since(del); took > 1500*time.Millisecond {
		t.Errorf("missed loss: reported only %v after the DEL (want ~<1s)", took.Round(time.Millisecond))
	}
	t.Logf("dials to the dead node %s during the %v after the DEL: %d", victim.Addr, time.Since(del).Round(time.Millisecond), dials()-d0)
	// Unlock the rest: nothing may keep dialling the dead node afterwards.
	for _, l := range ls[1:] {
		_ = l.Unlock(ctx)
	}
	// Its notifier, idle now, retires at its next failed retry (backoff up to 2s).
	for deadline := time.Now().Add(10 * time.Second); dlock.HasNotifier(dl, victim.Addr); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("leak: the dead node %s still has a notifier 10s after no lease lives on it", victim.Addr)
		}
	}
	d1 := dials()
	time.Sleep(3 * time.Second) // nothing to wait for: no dial must come
	if n := dials() - d1; n > 0 {
		t.Errorf("leak: %d dials to the dead node %s in the 3s after its notifier retired", n, victim.Addr)
	}
}

// dialCounter counts a go-redis client's dials to the address addr holds.
type dialCounter struct {
	addr *atomic.Value
	n    *atomic.Int64
}

func (h dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		// Counted once the Dialer under it has counted the same dial, so the difference
		// never shows a pool dial as dlock's.
		defer func() {
			if addr == h.addr.Load().(string) {
				h.n.Add(1)
			}
		}()
		return next(ctx, network, addr)
	}
}

func (h dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

package dlock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// killNotifyConns closes dlock's notification connections on srv whose CLIENT LIST flags
// contain flag ('t': the tracking reader, 'P': the pub/sub receiver) and returns how many.
func killNotifyConns(t *testing.T, srv *redistest.Server, flag string) int {
	t.Helper()
	n, err := srv.KillClientsFlagged(ctxT(t), "dlock-notify", flag)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Loss detection survives the death of either notification connection, and the server's idle
// timeout: a loss during the outage is reported within about a second (issue 9, point 1).
func TestLossFoundAfterANotificationConnectionDies(t *testing.T) {
	for _, c := range []struct{ name, flag string }{{"tracking", "t"}, {"pubsub", "P"}, {"idle-timeout", ""}} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.StartT(t, redistest.Config{})
			rdb := srv.Client()
			defer rdb.Close()
			ctx := ctxT(t)
			dl := dlock.New(rdb)
			defer dl.Close(ctx)
			other := dlock.New(rdb)
			defer other.Close(ctx)
			name := redistest.Name(t)
			l := lockTracked(t, dl.Mutex(name))
			if c.flag == "" {
				rdb.ConfigSet(ctx, "timeout", "1")
				time.Sleep(2500 * time.Millisecond) // idle connections would be closed by now
			} else if n := killNotifyConns(t, srv, c.flag); n != 1 {
				t.Fatalf("killed %d %s connections, want 1", n, c.name)
			}
			// Taken by another owner while the connection is down.
			if _, err := other.ForceRelease(ctx, name); err != nil {
				t.Fatal(err)
			}
			taken, err := other.Mutex(name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			waitDone(t, l, 1500*time.Millisecond)
			t.Logf("%s: loss reported %v after the lock was taken", c.name, time.Since(start).Round(time.Millisecond))
			if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
				t.Fatalf("Err = %v", l.Err())
			}
			_ = taken.Unlock(ctx)
		})
	}
}

// namesOn returns n lock names of this test whose keys live on master.
func namesOn(t *testing.T, cc *redis.ClusterClient, master *redistest.Server, n int) []string {
	t.Helper()
	var names []string
	for i := 0; len(names) < n; i++ {
		name := fmt.Sprintf("%s-%d", redistest.Name(t), i)
		if node, err := cc.MasterForKey(ctxT(t), lockKey(name)); err == nil && node.Options().Addr == master.Addr {
			names = append(names, name)
		}
	}
	return names
}

// lockAllTracked takes a lease on each name through c, each tracked for push loss detection.
func lockAllTracked(t *testing.T, c *dlock.Client, names []string, opts ...dlock.Option) []*dlock.Lease {
	t.Helper()
	ls := make([]*dlock.Lease, len(names))
	for i, name := range names {
		ls[i] = lockTracked(t, c.Mutex(name, opts...))
	}
	return ls
}

// holdMany takes n leases on distinct locks and returns them.
func holdMany(t *testing.T, c *dlock.Client, prefix string, n int) []*dlock.Lease {
	t.Helper()
	ls := make([]*dlock.Lease, n)
	for i := range ls {
		l, err := c.Mutex(fmt.Sprintf("%s-%d", prefix, i)).Lock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}

// keepsThrough holds n tracked leases through dl across event, lets renewals and re-reads run
// for settle, and fails the test if any lease was lost (its lock survived the event); then it
// unlocks them all.
func keepsThrough(t *testing.T, dl *dlock.Client, n int, what string, event func(), settle time.Duration) {
	t.Helper()
	ls := holdMany(t, dl, redistest.Name(t), n)
	for _, l := range ls {
		<-dlock.Tracked(l)
	}
	event()
	time.Sleep(settle) // renewals and re-reads meet the event's replies, then the new state
	if lost, err := falseLosses(ls); lost > 0 {
		t.Fatalf("%d of %d leases lost in %s, which kept their locks: %v", lost, len(ls), what, err)
	}
	for _, l := range ls {
		if err := l.Unlock(ctxT(t)); err != nil {
			t.Fatalf("Unlock after %s: %v", what, err)
		}
	}
}

// falseLosses counts leases that ended although their lock is still theirs.
func falseLosses(ls []*dlock.Lease) (lost int, first error) {
	for _, l := range ls {
		if err := l.Err(); err != nil {
			lost++
			if first == nil {
				first = err
			}
		}
	}
	return lost, first
}

// A restart that kept the data is no loss: LOADING is not an answer (issue 9, point 2).
func TestRestartWithPersistenceIsNoLoss(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{AOF: true})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	dl := dlock.New(rdb, dlock.WithTTL(6*time.Second))
	defer dl.Close(ctx)
	keepsThrough(t, dl, 50, "a restart with persistence (LOADING)", func() {
		srv.Kill()
		if err := srv.RestartNoWait(); err != nil {
			t.Fatal(err)
		}
	}, 4500*time.Millisecond) // past renewal periods that meet LOADING, then the data
}

// A Sentinel failover, and a paused master that comes back after one, are no loss; locks
// are taken through the new master (issue 9, point 2).
func TestSentinelFailoverIsNoLoss(t *testing.T) {
	g := redistest.StartSentinelT(t, redistest.SentinelConfig{})
	rdb := g.FailoverClient()
	defer rdb.Close()
	ctx := ctxT(t)
	dl := dlock.New(rdb, dlock.WithTTL(8*time.Second))
	defer dl.Close(ctx)
	keepsThrough(t, dl, 30, "a Sentinel failover", func() {
		old := g.Master()
		if err := g.Failover(); err != nil {
			t.Fatal(err)
		}
		if g.Master() == old {
			t.Fatal("no new master")
		}
		l, err := dl.Mutex(redistest.Name(t)).Lock(ctx)
		if err != nil {
			t.Fatalf("lock after the failover: %v", err)
		}
		_ = l.Unlock(ctx)
	}, 3*time.Second)
}

// A graceful Cluster failover is no loss (issue 9, point 2).
func TestClusterFailoverIsNoLoss(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc, dlock.WithTTL(6*time.Second))
	defer dl.Close(ctx)
	keepsThrough(t, dl, 60, "a graceful Cluster failover", func() { // 60 leases: on every shard
		if err := cl.GracefulFailover(cl.ReplicaOf(cl.Masters()[0])); err != nil {
			t.Fatal(err)
		}
	}, 3*time.Second)
}

// Renewals run per node: a paused master delays only its own leases; the others keep theirs
// (issue 9, point 3).
func TestPausedNodeDelaysOnlyItsOwnLeases(t *testing.T) {
	// The node timeout outlasts the pause: the cluster stays up (no CLUSTERDOWN).
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{Replicas: -1, NodeTimeout: 10 * time.Second})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc, dlock.WithTTL(900*time.Millisecond))
	defer dl.Close(ctx)
	ls := holdMany(t, dl, redistest.Name(t), 60)
	paused := cl.Masters()[0]
	var healthy []*dlock.Lease
	for _, l := range ls {
		node, err := cc.MasterForKey(ctx, lockKey(l.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr != paused.Addr {
			healthy = append(healthy, l)
		}
	}
	if len(healthy) == 0 || len(healthy) == len(ls) {
		t.Fatalf("%d of %d leases on healthy masters: want some on each side", len(healthy), len(ls))
	}
	paused.Pause()
	time.Sleep(2700 * time.Millisecond) // three TTLs
	paused.Resume()
	if n, err := falseLosses(healthy); n > 0 {
		t.Fatalf("%d of %d leases on healthy masters lost while another master was paused: %v", n, len(healthy), err)
	}
	for _, l := range healthy {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// After a forced failover (the master killed), the killed master's slots are lockable again
// within a second of the replica's promotion, TryLock says ErrUnavailable (not
// ErrNotObtained) meanwhile, and waiters wait through it (issue 9, point 4).
func TestForcedClusterFailoverIsBrief(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	dl := dlock.New(cc)
	defer dl.Close(ctx)
	victim := cl.Masters()[0]
	names := namesOn(t, cc, victim, 8)
	waiting := make(chan error, len(names))
	for _, name := range names[:4] { // held, with a waiter that must get it after the failover
		if _, err := dl.Mutex(name, dlock.WithTTL(3*time.Second), dlock.WithFixedLease()).Lock(ctx); err != nil {
			t.Fatal(err)
		}
		w := dlock.New(cc)
		defer w.Close(ctx)
		go func() {
			l, err := w.Mutex(name).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			waiting <- err
		}()
	}
	type first struct {
		at   time.Time
		errs map[string]int
	}
	firsts := make(chan first, len(names))
	stop := make(chan struct{})
	for _, name := range names[4:] {
		go func() {
			f := first{errs: map[string]int{}}
			for {
				select {
				case <-stop:
					firsts <- f
					return
				default:
				}
				l, err := dl.Mutex(name).TryLock(ctx)
				if err == nil {
					f.at = time.Now()
					_ = l.Unlock(ctx)
					firsts <- f
					return
				}
				switch {
				case errors.Is(err, dlock.ErrUnavailable):
					f.errs["unavailable"]++
				case errors.Is(err, dlock.ErrNotObtained):
					f.errs["not obtained"]++
				default:
					f.errs[err.Error()]++
				}
				time.Sleep(5 * time.Millisecond) // a caller's retry loop
			}
		}()
	}
	// Let the TryLock loops start failing on the dead master first.
	victim.Kill()
	promoted, err := cl.AwaitPromotion(cl.ReplicaOf(victim), 20*time.Second)
	if err != nil {
		close(stop)
		t.Fatal(err)
	}
	_ = promoted
	var worst time.Duration
	for range names[4:] {
		select {
		case f := <-firsts:
			if f.at.IsZero() {
				t.Fatalf("a slot never became lockable; errors %v", f.errs)
			}
			if f.errs["not obtained"] > 0 || len(f.errs) > 1 {
				t.Fatalf("TryLock during the failover gave %v, want only ErrUnavailable", f.errs)
			}
			worst = max(worst, f.at.Sub(promoted))
		case <-time.After(10 * time.Second):
			close(stop)
			t.Fatal("slots not lockable 10s after the promotion")
		}
	}
	close(stop)
	t.Logf("slots lockable %v after the replica's promotion (worst of %d)", worst.Round(time.Millisecond), len(names)-4)
	if worst > time.Second {
		t.Fatalf("slots lockable only %v after the promotion, want within 1s", worst)
	}
	for range names[:4] {
		if err := <-waiting; err != nil {
			t.Fatalf("a waiter through the failover: %v", err)
		}
	}
}

// A failover to a replica whose wall clock runs ahead: Redis replicates a TTL as an absolute
// expiry time, so on the new master every key expires earlier by the clock difference
// (docs/DESIGN.md, Deployments, states the bound). Renewed leases are re-based by their next
// renewal and keep their locks; a fixed lease's key expires early there, and the holder is told
// at once by push, not at its local deadline (issue 9, point 15).
func TestFailoverToAReplicaWithAClockAhead(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{ReplicaClockOffset: "+1s"})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	master := cl.Nodes()[0]
	fast := cl.ReplicaOf(master)
	if fast != cl.Nodes()[len(cl.Masters())] {
		t.Fatal("the replica with the clock ahead is not the first master's")
	}
	dl := dlock.New(cc, dlock.WithTTL(3*time.Second))
	defer dl.Close(ctx)
	names := namesOn(t, cc, master, 21)
	fixedAt := time.Now()
	fixed := lockTracked(t, dl.Mutex(names[0], dlock.WithFixedLease()))
	renewed := lockAllTracked(t, dl, names[1:])
	if err := cl.GracefulFailover(fast); err != nil {
		t.Fatal(err)
	}
	end := waitDone(t, fixed, 4*time.Second)
	lived := end.Sub(fixedAt)
	t.Logf("fixed 3s lease ended after %v: %v", lived.Round(time.Millisecond), fixed.Err())
	if !errors.Is(fixed.Err(), dlock.ErrLeaseLost) || strings.Contains(fixed.Err().Error(), "fixed lease TTL ran out") {
		t.Fatalf("fixed lease after the failover: %v, want its key found expired early on the new master", fixed.Err())
	}
	if lived > 2700*time.Millisecond {
		t.Fatalf("fixed lease lived %v: the new master's clock 1s ahead should have cut it", lived)
	}
	time.Sleep(2 * time.Second) // renewals on the new master
	if n, err := falseLosses(renewed); n > 0 {
		t.Fatalf("%d of %d renewed leases lost after a failover to a replica 1s ahead: %v", n, len(renewed), err)
	}
	for _, l := range renewed {
		_ = l.Unlock(ctx)
	}
}

//go:build ha

// The high-availability scenarios behind `make test-ha`: Cluster failovers (graceful and
// forced) and Sentinel failovers (forced by the sentinels, and a paused master that comes back),
// repeated, with many leases and waiters on the failing shard. They take minutes, so they are
// not part of `make test`.
package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	haLeases  = 100 // leases held on the failing shard
	haWaiters = 10  // waiters for held locks on the failing shard, through the failover
	haProbes  = 4   // free locks on the failing shard, tried until lockable again
)

func haReps() int {
	if n, err := strconv.Atoi(os.Getenv("DLOCK_HA_REPS")); err == nil && n > 0 {
		return n
	}
	return 20
}

// haCounts is what a scenario saw over its repetitions.
type haCounts struct {
	reps, leases, waiters           int
	falseLosses, trueLosses         int // lost with the hold still on the master / gone from it
	doubleGrants, tokenRegressions  int
	worstUnlockable, worstWaiterGot time.Duration
	goroutinesLeft                  int
}

func (c haCounts) String() string {
	return fmt.Sprintf("%d reps, %d leases, %d waiters: false losses %d, double grants %d, token regressions %d, "+
		"slots lockable <= %v after promotion, goroutines left after Close %d (leases lost with their hold gone from the new master: %d)",
		c.reps, c.leases, c.waiters, c.falseLosses, c.doubleGrants, c.tokenRegressions,
		c.worstUnlockable.Round(time.Millisecond), c.goroutinesLeft, c.trueLosses)
}

// haTopology is one deployment under test.
type haTopology struct {
	client func() redis.UniversalClient
	// onFailing reports whether a lock key lives on the node that will fail.
	onFailing func(ctx context.Context, rdb redis.UniversalClient, key string) bool
	// fail makes the failover happen and returns when the new master was first seen as one.
	fail func(t *testing.T) time.Time
	// restore brings the topology back to full strength for the next repetition.
	restore func(t *testing.T)
}

func TestHAClusterGracefulFailover(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	var victim *redistest.Server
	top := clusterTopology(cl, &victim)
	top.fail = func(t *testing.T) time.Time {
		if err := cl.GracefulFailover(cl.ReplicaOf(victim)); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	top.restore = func(t *testing.T) { victim = cl.Masters()[0] }
	runHA(t, "Cluster graceful failover", top, 4*time.Second)
}

func TestHAClusterForcedFailover(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	var victim *redistest.Server
	top := clusterTopology(cl, &victim)
	top.fail = func(t *testing.T) time.Time {
		replica := cl.ReplicaOf(victim)
		// Kill a master whose writes reached its replica: a forced failover that loses
		// acknowledged-by-nobody writes is issue 12's scenario (WithReplicaAck, Redlock).
		if err := victim.AwaitReplicated(replica, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		victim.Kill()
		at, err := cl.AwaitPromotion(replica, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	top.restore = func(t *testing.T) {
		if err := victim.Restart(); err != nil { // rejoins as a replica of its old replica
			t.Fatal(err)
		}
		if err := cl.WaitStable(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		victim = cl.Masters()[0]
	}
	runHA(t, "Cluster forced failover (kill -9)", top, 8*time.Second)
}

func clusterTopology(cl *redistest.Cluster, victim **redistest.Server) haTopology {
	*victim = cl.Masters()[0]
	return haTopology{
		client: func() redis.UniversalClient { return cl.Client() },
		onFailing: func(ctx context.Context, rdb redis.UniversalClient, key string) bool {
			node, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, key)
			return err == nil && node.Options().Addr == (*victim).Addr
		},
	}
}

func TestHASentinelFailover(t *testing.T) {
	g := redistest.StartSentinelT(t, redistest.SentinelConfig{})
	top := sentinelTopology(g)
	top.fail = func(t *testing.T) time.Time {
		if err := g.Failover(); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	runHA(t, "Sentinel failover", top, 8*time.Second)
}

func TestHASentinelPausedMaster(t *testing.T) {
	g := redistest.StartSentinelT(t, redistest.SentinelConfig{})
	top := sentinelTopology(g)
	top.fail = func(t *testing.T) time.Time {
		old := g.Master()
		old.Pause()
		deadline := time.Now().Add(30 * time.Second)
		for g.Master() == old {
			if time.Now().After(deadline) {
				old.Resume()
				t.Fatal("no failover 30s after the master was paused")
			}
			time.Sleep(20 * time.Millisecond) // the sentinels' decision has no event to wait on
		}
		at := time.Now()
		old.Resume() // comes back still believing it is the master, until the sentinels demote it
		return at
	}
	runHA(t, "Sentinel master paused and resumed", top, 10*time.Second)
}

func sentinelTopology(g *redistest.SentinelGroup) haTopology {
	return haTopology{
		client:    func() redis.UniversalClient { return g.FailoverClient() },
		onFailing: func(context.Context, redis.UniversalClient, string) bool { return true },
		restore:   func(*testing.T) {},
	}
}

// runHA repeats the scenario and fails on any false loss, double grant, token regression,
// slot unlockable for more than a second after promotion, or goroutine left after Close.
func runHA(t *testing.T, what string, top haTopology, ttl time.Duration) {
	var total haCounts
	for rep := 0; rep < haReps(); rep++ {
		c := haRep(t, top, ttl, rep)
		total.reps++
		total.leases += c.leases
		total.waiters += c.waiters
		total.falseLosses += c.falseLosses
		total.trueLosses += c.trueLosses
		total.doubleGrants += c.doubleGrants
		total.tokenRegressions += c.tokenRegressions
		total.worstUnlockable = max(total.worstUnlockable, c.worstUnlockable)
		total.goroutinesLeft += c.goroutinesLeft
		if t.Failed() {
			break
		}
		top.restore(t)
	}
	fmt.Printf("test-ha: %s: %v\n", what, total)
	if total.falseLosses > 0 || total.doubleGrants > 0 || total.tokenRegressions > 0 ||
		total.worstUnlockable > time.Second || total.goroutinesLeft > 0 {
		t.Fatalf("%s: %v", what, total)
	}
}

// haRep is one repetition: leases and waiters on the failing shard, the failover, then checks.
func haRep(t *testing.T, top haTopology, ttl time.Duration, rep int) (c haCounts) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rdb := top.client()
	defer rdb.Close()
	holder := dlock.New(rdb, dlock.WithTTL(ttl), dlock.WithoutCohort())
	waiter := dlock.New(rdb)
	prober := dlock.New(rdb)
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			for _, dl := range []*dlock.Client{holder, waiter, prober} {
				_ = dl.Close(ctx)
			}
		}
	}
	defer closeAll()

	// Lock names on the failing shard.
	var names []string
	for i := 0; len(names) < haLeases+haProbes; i++ {
		name := fmt.Sprintf("ha%d-%d-%d", rep, time.Now().UnixNano()%1e6, i)
		if top.onFailing(ctx, rdb, lockKey(name)) {
			names = append(names, name)
		}
	}
	held := make([]*dlock.Lease, haLeases)
	for i := range held {
		l, err := holder.Mutex(names[i]).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
		<-dlock.Tracked(l)
	}
	c.leases, c.waiters = haLeases, haWaiters

	// Waiters for the first haWaiters held locks: each checks, when it gets the lock, that the
	// previous lease had ended (no overlapping validity windows) and that its token is higher.
	type got struct {
		i      int
		l      *dlock.Lease
		err    error
		double bool // granted while the previous lease had not ended
	}
	gotc := make(chan got, haWaiters)
	// A holder's validity window ends when it decides to Unlock: the grant to the waiter may
	// reach the waiter before the release's reply closes the holder's Done.
	var letGo [haWaiters]atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < haWaiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Mutex(names[i]).Lock(ctx)
			double := false
			if err == nil && !letGo[i].Load() {
				select {
				case <-held[i].Done():
				default:
					double = true
				}
			}
			gotc <- got{i, l, err, double}
		}()
	}
	waitQueued(t, waiter, names[0], 1)

	promoted := top.fail(t)

	// Free locks on the failed shard: lockable again how long after the promotion?
	var pmu sync.Mutex
	var pwg sync.WaitGroup
	for _, name := range names[haLeases:] {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for ctx.Err() == nil {
				l, err := prober.Mutex(name).TryLock(ctx)
				if err == nil {
					d := time.Since(promoted)
					_ = l.Unlock(ctx)
					pmu.Lock()
					c.worstUnlockable = max(c.worstUnlockable, d)
					pmu.Unlock()
					return
				}
				time.Sleep(5 * time.Millisecond) // a caller's retry loop
			}
		}()
	}
	pwg.Wait()

	// Two renewal periods on the new master, then judge every lease.
	time.Sleep(2 * ttl / 3)
	for _, l := range held {
		if l.Err() == nil {
			continue
		}
		if errors.Is(l.Err(), dlock.ErrClosed) {
			continue
		}
		// Lost: a false loss if the hold is still there on the current master.
		info, err := holder.Inspect(ctx, l.Name())
		for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond) // the client may still be learning the new topology
			info, err = holder.Inspect(ctx, l.Name())
		}
		if err != nil {
			t.Errorf("inspect %q after the failover: %v", l.Name(), err)
		}
		if err == nil && info.Held && info.Owner == l.Owner() {
			c.falseLosses++
			t.Logf("false loss: %v", l.Err())
		} else {
			c.trueLosses++
			if c.trueLosses <= 3 {
				t.Logf("lease lost with its hold gone from the new master (%+v): %v", info, l.Err())
			}
		}
	}
	// Hand the contested locks to the waiters.
	for i := 0; i < haWaiters; i++ {
		letGo[i].Store(true)
		_ = held[i].Unlock(ctx)
	}
	wg.Wait()
	close(gotc)
	for g := range gotc {
		if g.err != nil {
			t.Errorf("waiter %d through the failover: %v", g.i, g.err)
			continue
		}
		if g.double {
			c.doubleGrants++
			t.Logf("double grant on %q: waiter token %d, holder token %d, holder Err %v", g.l.Name(), g.l.Token(), held[g.i].Token(), held[g.i].Err())
		}
		if g.l.Token() <= held[g.i].Token() {
			c.tokenRegressions++
		}
		_ = g.l.Unlock(ctx)
	}
	for _, l := range held[haWaiters:] {
		_ = l.Unlock(ctx)
	}
	closeAll()
	c.goroutinesLeft = dlockGoroutines(5 * time.Second)
	return c
}

// dlockGoroutines waits up to limit for dlock's goroutines to end and returns how many are left.
func dlockGoroutines(limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		n := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "github.com/dlock-go/dlock.") && !strings.Contains(g, "dlock_test.") {
				n++
			}
		}
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Bytes per lock name left in Redis after a million distinct names were locked once and the
// op log window passed (issue 9, point 10; the figure in docs/DESIGN.md).
func TestHAMemoryPerName(t *testing.T) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("DLOCK_HA_NAMES")); err == nil && v > 0 {
		n = v
	}
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	used := func() int64 {
		info := rdb.Info(ctx, "memory").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				x, _ := strconv.ParseInt(v, 10, 64)
				return x
			}
		}
		return 0
	}
	dl := dlock.New(rdb)
	defer dl.Close(ctx)
	before := used()
	start := time.Now()
	var wg sync.WaitGroup
	const workers = 64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				l, err := dl.Mutex("order:user:" + strconv.Itoa(i)).Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				_ = l.Unlock(ctx)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	right := used()
	keysRight := rdb.DBSize(ctx).Val()
	time.Sleep(time.Minute + 5*time.Second) // the op log window
	after := used()
	keysAfter := rdb.DBSize(ctx).Val()
	fmt.Printf("test-ha: memory: %d names locked once in %v: right after %d keys, %+.1f bytes/name; after the op log window %d keys, %+.2f bytes/name\n",
		n, took.Round(time.Second), keysRight, float64(right-before)/float64(n), keysAfter, float64(after-before)/float64(n))
	if keysAfter != 0 {
		t.Fatalf("%d keys left after the op log window", keysAfter)
	}
}

package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redlockSet is n independent servers and a Redlock Client over them.
type redlockSet struct {
	servers []*redistest.Server
	clients []*redis.Client // one per server, for the Redlock
	raw     []*redis.Client // one per server, for the test's own reads
	c       *dlock.Client
}

// startRedlock starts n servers (cfg for each, by index; nil for the zero Config) and a
// Redlock Client over them with opts, all stopped at cleanup.
func startRedlock(t *testing.T, n int, cfg func(i int) redistest.Config, opts ...dlock.Option) *redlockSet {
	t.Helper()
	set := &redlockSet{}
	var masters []redis.UniversalClient
	for i := range n {
		var c redistest.Config
		if cfg != nil {
			c = cfg(i)
		}
		s := redistest.StartT(t, c)
		rc, raw := s.Client(), s.Client()
		t.Cleanup(func() { _ = rc.Close(); _ = raw.Close() })
		set.servers = append(set.servers, s)
		set.clients = append(set.clients, rc)
		set.raw = append(set.raw, raw)
		masters = append(masters, rc)
	}
	set.c = dlock.NewRedlock(masters, opts...)
	t.Cleanup(func() { _ = set.c.Close(context.Background()) })
	return set
}

// another returns another Redlock Client over the set's masters: another process's.
func (set *redlockSet) another(t *testing.T, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	masters := make([]redis.UniversalClient, len(set.clients))
	for i, rc := range set.clients {
		masters[i] = rc
	}
	c := dlock.NewRedlock(masters, opts...)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// holders counts the masters on which the lock's key exists.
func (set *redlockSet) holders(t *testing.T, name string) int {
	t.Helper()
	n := 0
	for i, r := range set.raw {
		if !set.servers[i].Running() {
			continue
		}
		if r.Exists(context.Background(), lockKey(name)).Val() == 1 {
			n++
		}
	}
	return n
}

// Bad input gets ErrInvalid from every call, and primitives a Redlock does not serve say so
// with errors.ErrUnsupported.
func TestRedlockRefusesBadMastersAndOtherPrimitives(t *testing.T) {
	ctx := ctxT(t)
	a, b := redistest.Client(t), redistest.Client(t)
	other := func() *redis.Client {
		c := redistest.StartT(t, redistest.Config{}).Client()
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// One server under two addresses: NewRedlock cannot tell, the first lock does (run ids).
	tcp := redistest.StartT(t, redistest.Config{TCP: true})
	_, port, _ := strings.Cut(tcp.Addr, ":")
	alias := func(host string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: host + ":" + port})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	cases := map[string][]redis.UniversalClient{
		"two masters":               {a, other()},
		"nil master":                {a, nil, other()},
		"one server twice":          {a, b, other()},
		"one server, two addresses": {alias("127.0.0.1"), other(), alias("localhost")},
	}
	for what, masters := range cases {
		c := dlock.NewRedlock(masters)
		if _, err := c.Mutex("x").TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: TryLock: %v, want ErrInvalid", what, err)
		}
		if _, err := c.Mutex("x").Lock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Lock: %v, want ErrInvalid", what, err)
		} else {
			t.Logf("%s: %v", what, err)
		}
		_ = c.Close(ctx)
	}
	set := startRedlock(t, 3, nil)
	for what, err := range map[string]error{
		"RWMutex":   func() error { _, err := set.c.RWMutex("x").TryLock(ctx); return err }(),
		"MultiLock": func() error { _, err := set.c.MultiLock([]string{"x"}).TryLock(ctx); return err }(),
		"Semaphore": func() error { _, err := set.c.Semaphore("x", 2).TryAcquire(ctx, 1); return err }(),
		"Latch":     func() error { _, err := set.c.Latch("x").TrySetCount(ctx, 1); return err }(),
		"Locks":     func() error { _, err := set.c.Locks(ctx, "*"); return err }(),
	} {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s on a Redlock Client: %v, want errors.ErrUnsupported", what, err)
		}
	}
}

// A Redlock lease holds the lock on every master that answers; another owner gets
// ErrNotObtained; Unlock frees it everywhere.
func TestRedlockExcludesAndReleasesEverywhere(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 5, nil)
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := set.holders(t, name); n != 5 {
		t.Fatalf("lock key on %d masters, want 5", n)
	}
	if l.Token() == 0 || l.Tokens()[name] != l.Token() {
		t.Fatalf("token %d, tokens %v", l.Token(), l.Tokens())
	}
	if _, err := set.c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second TryLock: %v, want ErrNotObtained", err)
	}
	info, err := set.c.Inspect(ctx, name)
	if err != nil || !info.Held || info.Owner != l.Owner() || info.Token != l.Token() || len(info.Masters) != 5 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Unlock returns once a quorum released; the last master's release may still be on its way.
	for deadline := time.Now().Add(5 * time.Second); set.holders(t, name) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lock key still on %d masters 5s after Unlock", set.holders(t, name))
		}
	}
}

// With two of five masters down a lease is still taken and held; with three down the lock
// cannot be taken (ErrUnavailable), and a lease held when the third goes is lost.
func TestRedlockStandsOnAQuorum(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 5, nil, dlock.WithTTL(600*time.Millisecond))
	name := redistest.Name(t)
	set.servers[1].Kill()
	set.servers[3].Kill()
	l, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock with 3 of 5 masters up: %v", err)
	}
	if n := set.holders(t, name); n != 3 {
		t.Fatalf("lock key on %d masters, want 3", n)
	}
	// Several renewal periods later, it still holds (the renewals of the dead masters fail).
	select {
	case <-l.Done():
		t.Fatalf("lease lost with a quorum up: %v", l.Err())
	case <-time.After(time.Second):
	}
	if _, err := set.c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock by another owner: %v, want ErrNotObtained", err)
	}
	set.servers[4].Kill()
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease after losing the quorum: %v, want ErrLeaseLost", l.Err())
	}
	// Another owner (a handle of its own: the Client's cohort answers ErrNotObtained until
	// its lost hold is out of its table, a moment after Done).
	if _, err := set.c.Mutex(name, dlock.WithoutCohort()).TryLock(ctx); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryLock with 2 of 5 masters up: %v, want ErrUnavailable", err)
	}
}

// A Lock waiting for a Redlock lease is woken when it is released and served in the order it
// came: first waiter first, each waiter another process (a Client whose cohort waits in the
// masters' queue for it).
func TestRedlockWaitersAreServedInOrder(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 2)
	leases := make(chan *dlock.Lease, 2)
	for i, who := range []string{"first", "second"} {
		c := set.another(t)
		go func() {
			l, err := c.Mutex(name).Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			got <- who
			leases <- l
		}()
		// The waiter queues on the first master before the next one starts.
		waitQueuedRaw(t, set.raw[0], name, i+1)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if who := <-got; who != "first" {
		t.Fatalf("%s waiter served first", who)
	}
	if err := (<-leases).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if who := <-got; who != "second" {
		t.Fatalf("%s waiter served second", who)
	}
	if err := (<-leases).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// queueBehind starts a Lock of m and returns once it has waited in master 0's queue past the
// bounded barging window (4 ms, as a single master allows a releaser that re-locks at once):
// from then on its turn is its own. Its lease comes on the channel (nil on error).
func queueBehind(ctx context.Context, t *testing.T, set *redlockSet, m *dlock.Mutex) <-chan *dlock.Lease {
	t.Helper()
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueuedRaw(t, set.raw[0], m.Name(), 1)
	time.Sleep(10 * time.Millisecond)
	return got
}

// waitQueuedRaw waits until n owners queue for the lock on one server.
func waitQueuedRaw(t *testing.T, r *redis.Client, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.ZCard(context.Background(), lockKey(name)+":queue").Val() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d waiters queued for %q", n, name)
		}
		time.Sleep(time.Millisecond)
	}
}

// Tokens never go backwards across Redlock leases even when the masters' counters differ and
// the next lease is granted by another quorum: master 2's clock runs 10 s ahead, so its
// tokens are the highest; the lease after it is taken without master 2.
func TestRedlockTokensRiseAcrossQuorums(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, func(i int) redistest.Config {
		if i == 2 {
			return redistest.Config{ClockOffset: "+10s"}
		}
		return redistest.Config{}
	})
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := l.Token()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	set.servers[2].Kill()
	l, err = set.c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if l.Token() <= first {
		t.Fatalf("token went back from %d to %d when the quorum changed", first, l.Token())
	}
}

// A lease re-enters through its context, as a Mutex lease does, and Extend holds on a quorum.
func TestRedlockReentryAndExtend(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	m := set.c.Mutex(name)
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.TryLock(l.Context())
	if err != nil || inner.Token() != l.Token() {
		t.Fatalf("re-entry: %v (token %d, outer %d)", err, inner.Token(), l.Token())
	}
	set.servers[0].Kill()
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("Extend with 2 of 3 masters: %v", err)
	}
	if d := l.Remaining(); d < 50*time.Second {
		t.Fatalf("Remaining after Extend: %v", d)
	}
	if l.TTL() != time.Minute { // not the dead first master's
		t.Fatalf("TTL after Extend: %v", l.TTL())
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := set.holders(t, name); n != 2 {
		t.Fatalf("inner Unlock let go: key on %d masters", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with 2 of 3 masters: %v", err)
	}
	if n := set.holders(t, name); n != 0 {
		t.Fatalf("key on %d masters after Unlock", n)
	}
}

// Close ends a Redlock's leases with ErrClosed and frees the lock on its masters.
func TestRedlockClose(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, time.Second)
	if !errors.Is(l.Err(), dlock.ErrClosed) {
		t.Fatalf("lease after Close: %v", l.Err())
	}
	if n := set.holders(t, name); n != 0 {
		t.Fatalf("key on %d masters after Close", n)
	}
	if _, err := set.c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock after Close: %v", err)
	}
}

// A released Redlock lock goes to a waiter that has waited past the barging window, not back
// to its releaser: the first master's FIFO decides, whatever the other masters (free after the
// release) would allow.
func TestRedlockReleaserDoesNotOvertakeTheWaiter(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil, dlock.WithoutCohort()) // every Lock its own waiter in Redis
	name := redistest.Name(t)
	m := set.c.Mutex(name)
	for round := range 5 {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := queueBehind(ctx, t, set, m)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if again, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("round %d: the releaser took the lock again ahead of its waiter: %v", round, err)
			_ = again.Unlock(ctx)
		}
		w := <-got
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A master with a fault of its own (out of memory, here) is a master down: a quorum of healthy
// masters grants the lock (found by review: the fault failed every call).
func TestRedlockToleratesAFaultyMinority(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil)
	name := redistest.Name(t)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := set.raw[2].ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l, err := set.c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with one master out of memory: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err = set.c.Mutex(name).Lock(ctx); err != nil {
		t.Fatalf("Lock with one master out of memory: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// With two of three out of memory no quorum can be had: the fault is returned, not waited on.
	if err := set.raw[1].ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := set.c.Mutex(name).Lock(ctx); err == nil || errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Lock with two of three masters out of memory: %v, want their OOM", err)
	}
}

// A silent (paused) master holds up neither Extend nor Unlock of a Redlock lease: a fixed
// lease extended again and again on the quorum stays held (found by review: each Extend
// waited for the silent master past the lease's end), and Unlock returns once a quorum
// released.
func TestRedlockSilentMasterHoldsUpNeitherExtendNorUnlock(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil, dlock.WithTTL(time.Second), dlock.WithFixedLease())
	name := redistest.Name(t)
	l, err := set.c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set.servers[2].Pause()
	defer set.servers[2].Resume()
	for i := range 4 {
		if err := l.Extend(ctx, time.Second); err != nil {
			t.Fatalf("Extend %d with 2 of 3 masters answering: %v (lease: %v)", i, err, l.Err())
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with 2 of 3 masters answering: %v", err)
	}
	for i := range 2 {
		if set.raw[i].Exists(ctx, lockKey(name)).Val() != 0 {
			t.Fatalf("master %d still holds the lock after Unlock", i)
		}
	}
}

// Two leases of one WithOwner id re-enter each other's holds, whose tokens are the masters'
// old ones: the later lease's token is still not below the earlier's, also when it is taken
// without the master whose token was the highest (found by review).
func TestRedlockWithOwnerTokenDoesNotGoBack(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, func(i int) redistest.Config {
		if i == 0 {
			return redistest.Config{ClockOffset: "+10s"} // master 0's tokens are the highest
		}
		return redistest.Config{}
	}, dlock.WithTTL(2*time.Second))
	name := redistest.Name(t)
	m := set.c.Mutex(name, dlock.WithOwner("job"))
	l1, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	set.servers[0].Pause()
	l2, err := m.TryLock(ctx)
	set.servers[0].Resume()
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	defer l2.Unlock(ctx)
	if l2.Token() < l1.Token() {
		t.Fatalf("the second lease of one owner has token %d, below the first's %d", l2.Token(), l1.Token())
	}
}

// A master that faults while the lock is waited for on it (out of memory, here master 0, the
// first a contended Lock queues on) is left out, as in a pass: a quorum of the others grants
// the lock (found by review).
func TestRedlockFaultyFirstMasterAfterContention(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil, dlock.WithoutCohort()) // every Lock its own waiter in Redis
	name := redistest.Name(t)
	m := set.c.Mutex(name)
	l1, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := queueBehind(ctx, t, set, m) // the next Lock of this lock then queues on master 0 at once
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := (<-got).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := set.raw[0].ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l3, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock with master 0 out of memory, after a contended acquisition: %v", err)
	}
	_ = l3.Unlock(ctx)
}

// A Redlock waiter whose ctx ends returns ErrNotObtained with the ctx's error and leaves no
// place in any master's queue; one waiting when Close runs returns ErrClosed, and Close leaves
// neither a hold nor a queue entry behind.
func TestRedlockWaiterCtxAndClose(t *testing.T) {
	ctx := ctxT(t)
	set := startRedlock(t, 3, nil, dlock.WithoutCohort()) // every Lock its own waiter in Redis
	name := redistest.Name(t)
	if _, err := set.c.Mutex(name).Lock(ctx); err != nil { // held until Close
		t.Fatal(err)
	}
	wait := func(wctx context.Context) <-chan error {
		done := make(chan error, 1)
		go func() {
			l, err := set.c.Mutex(name).Lock(wctx)
			if err == nil {
				_ = l.Unlock(ctx)
			}
			done <- err
		}()
		return done
	}
	queued := func() (n int64) {
		for _, r := range set.raw {
			n += r.ZCard(ctx, lockKey(name)+":queue").Val()
		}
		return n
	}
	noneQueued := func(when string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); queued() > 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d places still queued", when, queued())
			}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := wait(wctx)
	waitQueuedRaw(t, set.raw[0], name, 1)
	cancel()
	if err := <-done; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want ErrNotObtained and context.Canceled", err)
	}
	noneQueued("after the cancelled waiter")

	done = wait(ctx)
	waitQueuedRaw(t, set.raw[0], name, 1)
	if err := set.c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("waiter at Close: %v, want ErrClosed", err)
	}
	noneQueued("after Close")
	if n := set.holders(t, name); n != 0 {
		t.Fatalf("lock key on %d masters after Close", n)
	}
}

// A master that is silent when NewRedlock starts (paused) holds up neither the first lock call
// (the duplicate check waits at most a second, and the lock stands on the other two) nor
// Close (which ends the check at once).
func TestRedlockSilentMasterAtStart(t *testing.T) {
	ctx := ctxT(t)
	var masters []redis.UniversalClient
	var servers []*redistest.Server
	for range 3 {
		s := redistest.StartT(t, redistest.Config{TCP: true})
		c := s.Client()
		t.Cleanup(func() { _ = c.Close() })
		servers = append(servers, s)
		masters = append(masters, c)
	}
	servers[2].Pause()
	defer servers[2].Resume()
	c := dlock.NewRedlock(masters, dlock.WithTTL(2*time.Second))
	start := time.Now()
	l, err := c.Mutex(redistest.Name(t)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with 2 of 3 masters answering: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the first TryLock took %v with a silent master; want about a second at most", took)
	}
	_ = l.Unlock(ctx)
	c2 := dlock.NewRedlock(masters)
	start = time.Now()
	if err := c2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close right after NewRedlock took %v with a silent master; want it at once", took)
	}
	servers[2].Resume() // Close waits for a paused master's renewal stragglers
	_ = c.Close(ctx)
}

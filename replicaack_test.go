package dlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// startReplicated starts a master and one replica of it (loopback TCP), replicating.
func startReplicated(t *testing.T) (master, replica *redistest.Server) {
	t.Helper()
	master = redistest.StartT(t, redistest.Config{TCP: true})
	host, port, _ := strings.Cut(master.Addr, ":")
	replica = redistest.StartT(t, redistest.Config{TCP: true, Args: []string{"--replicaof", host, port}})
	if err := master.AwaitReplicated(replica, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return master, replica
}

// pauseReplica freezes the replica (SIGSTOP) until the test ends or the returned func runs.
func pauseReplica(t *testing.T, replica *redistest.Server) (resume func()) {
	t.Helper()
	replica.Pause()
	done := false
	resume = func() {
		if !done {
			done = true
			replica.Resume()
		}
	}
	t.Cleanup(resume)
	return resume
}

// A lease under WithReplicaAck is handed out only once the replica has the hold: the replica
// holds the lock's key, with the lease's token, the moment Lock or TryLock returns, both for a
// fresh acquisition and for a lock a release granted to a waiter.
func TestReplicaAckLeaseIsOnTheReplicaWhenHandedOut(t *testing.T) {
	master, replica := startReplicated(t)
	rdb, rrep := master.Client(), replica.Client()
	defer rdb.Close()
	defer rrep.Close()
	ctx := ctxT(t)
	a := dlock.New(rdb, dlock.WithReplicaAck(1, time.Second))
	defer a.Close(ctx)
	b := dlock.New(rdb, dlock.WithReplicaAck(1, time.Second))
	defer b.Close(ctx)
	name := redistest.Name(t)
	onReplica := func(l *dlock.Lease) {
		t.Helper()
		tok, err := rrep.HGet(ctx, lockKey(name), "#t").Uint64()
		if err != nil {
			t.Fatalf("replica: lock key: %v", err)
		}
		if tok > l.Token() {
			t.Fatalf("replica's phase token %d is above the lease's %d", tok, l.Token())
		}
	}
	la, err := a.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onReplica(la)
	got := make(chan *dlock.Lease, 1)
	go func() {
		lb, err := b.Mutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	waitQueued(t, a, name, 1)
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		return
	}
	tok, err := rrep.HGet(ctx, lockKey(name), "#t").Uint64()
	if err != nil || tok != lb.Token() {
		t.Fatalf("replica: token %d (%v), want the granted lease's %d", tok, err, lb.Token())
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// An acquisition no replica acknowledged is undone: TryLock and Lock return ErrNotReplicated
// (not ErrNotObtained), saying how many replicas acknowledged, and the lock is free at once.
func TestReplicaAckUndoesAnUnacknowledgedAcquisition(t *testing.T) {
	master, replica := startReplicated(t)
	rdb := master.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	c := dlock.New(rdb, dlock.WithReplicaAck(1, 50*time.Millisecond))
	defer c.Close(ctx)
	plain := dlock.New(rdb)
	defer plain.Close(ctx)
	name := redistest.Name(t)
	pauseReplica(t, replica)
	for _, lock := range []func() (*dlock.Lease, error){
		func() (*dlock.Lease, error) { return c.Mutex(name).TryLock(ctx) },
		func() (*dlock.Lease, error) { return c.Mutex(name).Lock(ctx) },
	} {
		l, err := lock()
		if l != nil || !errors.Is(err, dlock.ErrNotReplicated) || errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("got %v, %v; want ErrNotReplicated", l, err)
		}
		if !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Fatalf("error %q does not say how many replicas acknowledged", err)
		}
		if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 0 {
			t.Fatalf("the undone acquisition left the lock key behind")
		}
		other, err := plain.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("lock not free after the undone acquisition: %v", err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Asking for more replicas than the master has fails with an error that says so.
func TestReplicaAckMoreReplicasThanConnected(t *testing.T) {
	master, _ := startReplicated(t)
	rdb := master.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	c := dlock.New(rdb, dlock.WithReplicaAck(2, 20*time.Millisecond))
	defer c.Close(ctx)
	_, err := c.Mutex(redistest.Name(t)).TryLock(ctx)
	if !errors.Is(err, dlock.ErrNotReplicated) || !strings.Contains(err.Error(), "has 1 connected replicas") {
		t.Fatalf("err = %v; want ErrNotReplicated naming the 1 connected replica", err)
	}
}

// Renewals that no replica acknowledges do not count: the lease ends at its safe deadline
// although the master kept extending the key; Extend returns ErrNotReplicated.
func TestReplicaAckUnacknowledgedRenewalsEndTheLease(t *testing.T) {
	master, replica := startReplicated(t)
	rdb := master.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	// A timeout that a loaded machine's replica meets for the first TryLock; once the replica is
	// frozen nothing is acknowledged, however long WAIT waits.
	c := dlock.New(rdb, dlock.WithReplicaAck(1, 300*time.Millisecond), dlock.WithTTL(ttl))
	defer c.Close(ctx)
	name := redistest.Name(t)
	// The first acquisition must be acknowledged; a loaded machine's replica may miss one
	// timeout, so try again for a while.
	var l *dlock.Lease
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if l, err = c.Mutex(name).TryLock(ctx); err == nil {
			break
		}
		if !errors.Is(err, dlock.ErrNotReplicated) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	resume := pauseReplica(t, replica)
	frozen := time.Now()
	if err := l.Extend(ctx, time.Second); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("Extend = %v; want ErrNotReplicated", err)
	}
	ended := waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	// The master still has the hold: only the missing acknowledgements ended the lease.
	if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 1 {
		t.Fatalf("lock key gone from the master: the lease ended for another reason")
	}
	t.Logf("lease ended %v after the replica froze (TTL %v)", ended.Sub(frozen).Round(time.Millisecond), ttl)
	resume()
}

// Bad settings are refused with ErrInvalid, before anything is written.
func TestReplicaAckInvalid(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	for _, o := range []dlock.Option{dlock.WithReplicaAck(-1, time.Second), dlock.WithReplicaAck(1, 0)} {
		if _, err := c.Mutex(name, o).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock = %v; want ErrInvalid", err)
		}
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": rdb.Options().Addr}})
	defer ring.Close()
	rc := dlock.New(ring, dlock.WithReplicaAck(1, time.Second))
	defer rc.Close(ctx)
	if _, err := rc.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TryLock over a Ring = %v; want ErrInvalid", err)
	}
	if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatalf("a refused call wrote the lock key")
	}
}

// WithReplicaAckAOF on a server that cannot answer WAITAOF as asked (Redis 7.0 has no WAITAOF;
// 7.2 refuses a local fsync without appendonly) gives ErrInvalid naming what is missing, from
// TryLock and from a Lock that would otherwise wait, and leaves the lock free; bad settings
// are refused before anything is sent.
func TestReplicaAckAOFNeedsWaitAOF(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	for _, o := range []dlock.Option{dlock.WithReplicaAckAOF(false, 0, time.Second), dlock.WithReplicaAckAOF(true, -1, time.Second),
		dlock.WithReplicaAckAOF(true, 1, 0)} {
		if _, err := c.Mutex(name, o).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "WithReplicaAckAOF(") {
			t.Fatalf("TryLock = %v; want ErrInvalid naming the setting", err)
		}
	}
	m := c.Mutex(name, dlock.WithReplicaAckAOF(true, 0, 100*time.Millisecond))
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "Redis 7.2") {
		t.Fatalf("TryLock = %v; want ErrInvalid naming Redis 7.2", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := m.Lock(lctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Lock = %v; want ErrInvalid at once", err)
	}
	if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatalf("the refused acquisitions left the lock key behind")
	}
	// While a plain handle of the same Client holds the lock, the AOF handle's Lock goes to
	// Redis (their cohorts differ: a plain hold is never handed to it), learns there that the
	// server cannot answer WAITAOF, and returns ErrInvalid at once rather than wait for the
	// holder, leaving no place in the queue.
	l, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("a plain TryLock after them: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		la, err := m.Lock(lctx)
		if la != nil {
			_ = la.Unlock(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("the AOF handle's Lock while a plain handle holds = %v; want ErrInvalid", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("the AOF handle's Lock still waits 3s after it was called; want ErrInvalid at once")
	}
	if n, _ := rdb.ZCard(ctx, lockKey(name)+":queue").Result(); n != 0 {
		t.Fatalf("the refused Lock left %d places in the queue", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lock a release grants to a waiter is not handed out before a replica acknowledged it: with
// the replica frozen, the waiter's Lock returns ErrNotReplicated instead of the granted lease,
// and the lock is free again.
func TestReplicaAckGrantNotAcknowledgedIsNotHandedOut(t *testing.T) {
	master, replica := startReplicated(t)
	rdb := master.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	a := dlock.New(rdb)
	defer a.Close(ctx)
	b := dlock.New(rdb, dlock.WithReplicaAck(1, 50*time.Millisecond))
	defer b.Close(ctx)
	name := redistest.Name(t)
	la, err := a.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := b.Mutex(name).Lock(ctx)
		got <- result{l, err}
	}()
	waitQueued(t, a, name, 1)
	pauseReplica(t, replica)
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.l != nil || !errors.Is(r.err, dlock.ErrNotReplicated) {
		t.Fatalf("waiter got %v, %v; want ErrNotReplicated", r.l, r.err)
	}
	other, err := a.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("lock not free after the unacknowledged grant: %v", err)
	}
	_ = other.Unlock(ctx)
}

// A handle asking for acknowledgement never shares a hold with one that does not, on the same
// Client: with the replica frozen it gets ErrNotReplicated, not the plain handle's hold handed
// on locally (Mutex cohort, RWMutex read share).
func TestReplicaAckNeverSharesAPlainHold(t *testing.T) {
	master, replica := startReplicated(t)
	rdb := master.Client()
	defer rdb.Close()
	ctx := ctxT(t)
	c := dlock.New(rdb)
	defer c.Close(ctx)
	name := redistest.Name(t)
	pauseReplica(t, replica)
	ack := dlock.WithReplicaAck(1, 30*time.Millisecond)
	plain, err := c.RWMutex(name).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := c.RWMutex(name, ack).RLock(ctx); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("RLock with ack joined a plain read hold: %v, %v", l, err)
	}
	_ = plain.Unlock(ctx)
	m := name + "-m"
	held, err := c.Mutex(m).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := c.Mutex(m, ack).Lock(ctx)
		got <- err
	}()
	waitQueued(t, c, m, 1)
	_ = held.Unlock(ctx)
	if err := <-got; !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("Lock with ack got the plain handle's hold: %v", err)
	}
}

// A user of the minimal ACL (no +wait) asking for acknowledgement gets ErrNotReplicated naming
// the refusal, and nothing stays held; with +wait +info added it gets its lease.
func TestReplicaAckWithoutWaitPermission(t *testing.T) {
	master, _ := startReplicated(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	ack := dlock.WithReplicaAck(1, time.Second)
	c := dlock.New(aclClient(t, master, "nowait", minimalACL...), ack)
	defer c.Close(ctx)
	_, err := c.Mutex(name).TryLock(ctx)
	if !errors.Is(err, dlock.ErrNotReplicated) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("TryLock = %v; want ErrNotReplicated naming NOPERM", err)
	}
	admin := master.Client()
	defer admin.Close()
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatalf("the refused acquisition left the lock key behind")
	}
	ok := dlock.New(aclClient(t, master, "withwait", append(slices.Clone(minimalACL), replicaAckACL...)...), ack)
	defer ok.Close(ctx)
	l, err := ok.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with %v: %v", replicaAckACL, err)
	}
	_ = l.Unlock(ctx)
}

// On a Redis Cluster the acknowledgement is asked of the master of the lock's slot, on the
// connection that wrote: for a lock on each master, the lease's hold is on that master's
// replica when TryLock returns, and with that replica frozen TryLock returns ErrNotReplicated
// and leaves the lock free. (A WAIT sent to another node, or on another connection, answers
// at once with its replicas and would hand the lease out.)
func TestReplicaAckOnACluster(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	c := dlock.New(cc, dlock.WithReplicaAck(1, 300*time.Millisecond))
	defer c.Close(ctx)
	for _, master := range cl.Masters() {
		replica := cl.ReplicaOf(master)
		if replica == nil {
			t.Fatalf("master %s has no replica", master.Addr)
		}
		rrep := redis.NewClient(&redis.Options{Addr: replica.Addr, OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			return cn.ReadOnly(ctx).Err()
		}})
		defer rrep.Close()
		names := namesOn(t, cc, master, 2)
		l, err := c.Mutex(names[0]).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock on master %s: %v", master.Addr, err)
		}
		tok, err := rrep.HGet(ctx, lockKey(names[0]), "#t").Uint64()
		if err != nil || tok != l.Token() {
			t.Fatalf("replica %s of %s: token %d (%v) when TryLock returned, want the lease's %d", replica.Addr, master.Addr, tok, err, l.Token())
		}
		resume := pauseReplica(t, replica)
		_, err = c.Mutex(names[1]).TryLock(ctx)
		resume()
		if !errors.Is(err, dlock.ErrNotReplicated) {
			t.Fatalf("TryLock with the replica %s of %s frozen = %v; want ErrNotReplicated", replica.Addr, master.Addr, err)
		}
		if n, _ := cc.Exists(ctx, lockKey(names[1])).Result(); n != 0 {
			t.Fatalf("the unacknowledged acquisition on %s left the lock key behind", master.Addr)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// An acknowledgement timeout that the go-redis client's ReadTimeout would cut short (the
// pipeline's replies are read with ReadTimeout) is refused with ErrInvalid naming both, and
// nothing is held; one below it works.
func TestReplicaAckTimeoutBelowReadTimeout(t *testing.T) {
	master, _ := startReplicated(t)
	opt := master.Options()
	opt.ReadTimeout = 2 * time.Second
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := ctxT(t)
	c := dlock.New(rdb)
	defer c.Close(ctx)
	name := redistest.Name(t)
	_, err := c.Mutex(name, dlock.WithReplicaAck(1, 1950*time.Millisecond)).TryLock(ctx)
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "ReadTimeout") {
		t.Fatalf("TryLock = %v; want ErrInvalid naming ReadTimeout", err)
	}
	if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatalf("the refused call wrote the lock key")
	}
	l, err := c.Mutex(name, dlock.WithReplicaAck(1, time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with a timeout well below ReadTimeout: %v", err)
	}
	_ = l.Unlock(ctx)
	// Without a read timeout (-1: none, -2: no deadline set) any acknowledgement timeout goes.
	for _, rt := range []time.Duration{-1, -2} {
		opt := master.Options()
		opt.ReadTimeout = rt
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		c := dlock.New(rdb)
		defer c.Close(ctx)
		l, err := c.Mutex(name, dlock.WithReplicaAck(1, 10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatalf("ReadTimeout %v: TryLock: %v", rt, err)
		}
		_ = l.Unlock(ctx)
	}
}

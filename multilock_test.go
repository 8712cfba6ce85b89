package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
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

// A MultiLock gets every member or none: a taken member makes TryLock give back the others.
func TestMultiLockAllOrNothing(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	a, b := redistest.Name(t)+"a", redistest.Name(t)+"b"
	held := must(t)(c.Mutex(b).Lock(ctx))
	if _, err := c.MultiLock([]string{a, b}).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with a member taken: %v, want ErrNotObtained", err)
	}
	if info, err := c.Inspect(ctx, a); err != nil || info.Held {
		t.Fatalf("the free member was kept: %+v, %v", info, err)
	}
	_ = held.Unlock(ctx)
	l := must(t)(c.MultiLock([]string{b, a}).TryLock(ctx))
	tokens := l.Tokens()
	if len(tokens) != 2 || tokens[a] == 0 || tokens[b] == 0 {
		t.Fatalf("Tokens %v, want one per member", tokens)
	}
	if _, err := c.Mutex(a).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a Mutex on a member of a held MultiLock: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{a, b} {
		if info, err := c.Inspect(ctx, n); err != nil || info.Held {
			t.Fatalf("member %s after Unlock: %+v, %v", n, info, err)
		}
	}
}

// A waiting MultiLock does not sit on its free members, and gets them all once the taken one
// is released (woken by push: it waits in that member's queue).
func TestMultiLockWaitsWithoutHoldingFreeMembers(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	a, b := redistest.Name(t)+"a", redistest.Name(t)+"b"
	held := must(t)(c.Mutex(b).Lock(ctx))
	got := make(chan rwResult, 1)
	go func() {
		l, err := c.MultiLock([]string{a, b}).Lock(ctx)
		got <- rwResult{l, err}
	}()
	waitQueued(t, c, b, 1)
	other := must(t)(c.Mutex(a, dlock.WithoutCohort()).TryLock(ctx)) // free while the MultiLock waits
	_ = other.Unlock(ctx)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.l.Tokens()) != 2 {
			t.Fatalf("Tokens %v", r.l.Tokens())
		}
		_ = r.l.Unlock(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("MultiLock not granted 5s after its taken member was released")
	}
}

// Losing one member ends the lease, and the other members are released at once.
func TestMultiLockLosesWithAnyMember(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	a, b := redistest.Name(t)+"a", redistest.Name(t)+"b"
	l := must(t)(c.MultiLock([]string{a, b}).Lock(ctx))
	if err := rdb.Del(ctx, lockKey(a)).Err(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err %v, want ErrLeaseLost", l.Err())
	}
	other := must(t)(c.Mutex(b).Lock(ctx)) // would wait for b's TTL (30s, ctx ends first) if kept
	_ = other.Unlock(ctx)
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of a lost MultiLock lease: %v, want ErrNotHeld", err)
	}
}

func TestMultiLockBadInput(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	for _, names := range [][]string{nil, {}, {"x", "x"}, {"x", ""}} {
		if _, err := c.MultiLock(names).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("MultiLock(%q): %v, want ErrInvalid", names, err)
		}
	}
}

// MultiLocks over overlapping names, taken in opposite orders by goroutines of two Clients,
// never deadlock and never overlap on a member.
func TestMultiLockNoDeadlockNoOverlap(t *testing.T) {
	c1, rdb := newClient(t)
	c2 := dlock.New(rdb)
	defer c2.Close(context.Background())
	ctx := ctxT(t)
	base := redistest.Name(t)
	names := []string{base + "0", base + "1", base + "2", base + "3"}
	inside := make([]atomic.Int32, len(names))
	var overlaps, done atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		c := c1
		if g%2 == 1 {
			c = c2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 15 {
				idx := rng.Perm(len(names))[:2+rng.IntN(2)]
				var ns []string
				for _, i := range idx {
					ns = append(ns, names[i])
				}
				l, err := c.MultiLock(ns).Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				for _, i := range idx {
					if inside[i].Add(1) > 1 {
						overlaps.Add(1)
					}
				}
				time.Sleep(time.Millisecond) // the critical section
				for _, i := range idx {
					inside[i].Add(-1)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 || done.Load() != 8*15 {
		t.Fatalf("%d overlaps, %d of %d critical sections done", overlaps.Load(), done.Load(), 8*15)
	}
}

// Members on different Cluster slots: the MultiLock holds them all and excludes a Mutex on
// each.
func TestMultiLockAcrossClusterSlots(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	c := dlock.New(cc)
	defer c.Close(ctx)
	var names []string
	seen := map[string]bool{}
	for i := 0; len(names) < 3; i++ {
		n := fmt.Sprintf("%s-%d", redistest.Name(t), i)
		node, err := cc.MasterForKey(ctx, lockKey(n))
		if err != nil {
			t.Fatal(err)
		}
		if !seen[node.Options().Addr] {
			seen[node.Options().Addr] = true
			names = append(names, n)
		}
	}
	l := must(t)(c.MultiLock(names).Lock(ctx))
	for _, n := range names {
		if _, err := c.Mutex(n).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("Mutex on member %s (its own master): %v, want ErrNotObtained", n, err)
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := must(t)(c.MultiLock(names).TryLock(ctx))
	_ = l2.Unlock(ctx)
	// A later member held by another owner: TryLock says so (member by member here, each
	// member's attempt answered at once), and gives back the members it took.
	last := slices.Max(names) // taken last: the pass holds the others when it gets there
	held := must(t)(c.Mutex(last).Lock(ctx))
	for range 20 {
		_, err := c.MultiLock(names).TryLock(ctx)
		if !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrUnavailable) || !strings.Contains(err.Error(), last) {
			t.Fatalf("TryLock with member %s held: %v, want ErrNotObtained naming it", last, err)
		}
	}
	_ = held.Unlock(ctx)
	for _, n := range names {
		_ = must(t)(c.Mutex(n).TryLock(ctx)).Unlock(ctx)
	}
}

// Contexts and MultiLocks (found by review): a MultiLock lease's context never lets another
// MultiLock or a Mutex "re-enter" what it does not hold, nested MultiLocks on other names work,
// and a one-name MultiLock has its member's token.
func TestMultiLockContexts(t *testing.T) {
	c, _ := newClient(t)
	other := dlock.New(redistest.Client(t))
	defer other.Close(context.Background())
	ctx := ctxT(t)
	n := redistest.Name(t)
	a, b, x, y := n+"a", n+"b", n+"x", n+"y"
	hb := must(t)(other.Mutex(b).Lock(ctx))
	la := must(t)(c.MultiLock([]string{a}).Lock(ctx))
	if la.Tokens()[a] == 0 {
		t.Fatalf("one-name MultiLock Tokens %v", la.Tokens())
	}
	if l, err := c.MultiLock([]string{b}).TryLock(la.Context()); err == nil {
		t.Fatalf("a MultiLock on %s, held elsewhere, was granted through another MultiLock's context (Err %v)", b, l.Err())
	}
	_ = hb.Unlock(ctx)
	lab := must(t)(c.MultiLock([]string{b}).Lock(la.Context()))
	lxy := must(t)(c.MultiLock([]string{x, y}).Lock(lab.Context())) // nested, other names
	start := time.Now()
	if _, err := c.Mutex(a).Lock(la.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Mutex on a member inside the MultiLock's context: %v, want ErrInvalid", err)
	}
	if _, err := c.MultiLock([]string{a, x}).Lock(la.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("MultiLock over a member the context holds: %v, want ErrInvalid", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusals took %v, want at once", d)
	}
	for _, l := range []*dlock.Lease{lxy, lab, la} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// In ordered mode a member taken early can end (here a fixed lease runs out) while a later one
// is awaited: Lock must not return a lease then, but take the members again (found by review).
func TestMultiLockNeverReturnsALostMember(t *testing.T) {
	c, _ := newClient(t)
	other := dlock.New(redistest.Client(t), dlock.WithoutCohort())
	defer other.Close(context.Background())
	ctx := ctxT(t)
	n := redistest.Name(t)
	a, b := n+"a", n+"b"
	ha, hb := must(t)(other.Mutex(a).Lock(ctx)), must(t)(other.Mutex(b).Lock(ctx))
	res := make(chan rwResult, 1)
	go func() {
		l, err := c.MultiLock([]string{a, b}, dlock.WithFixedLease(), dlock.WithTTL(time.Second)).Lock(ctx)
		res <- rwResult{l, err}
	}()
	waitQueued(t, c, a, 1)
	time.Sleep(1100 * time.Millisecond) // past the MultiLock's patience: it then takes members in order
	_ = ha.Unlock(ctx)
	waitQueued(t, c, b, 1) // holds a (fixed, 1s) and waits for b
	var ha2 *dlock.Lease
	for deadline := time.Now().Add(5 * time.Second); ha2 == nil; time.Sleep(20 * time.Millisecond) {
		ha2, _ = other.Mutex(a).TryLock(ctx) // free once the MultiLock's fixed lease on a ran out
		if time.Now().After(deadline) {
			t.Fatal("a never became free")
		}
	}
	_ = hb.Unlock(ctx)
	waitQueued(t, c, a, 1) // took b, found a lost, gave b back and waits for a again
	notYet(t, "MultiLock while another owner holds a member", res)
	_ = ha2.Unlock(ctx)
	l := got(t, "MultiLock", res)
	if l.Err() != nil {
		t.Fatalf("MultiLock returned an ended lease: %v", l.Err())
	}
	_ = l.Unlock(ctx)
}

// While Redis is unavailable, Lock waits it out within ctx as Mutex.Lock does (found by review).
func TestMultiLockWaitsOutUnavailability(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.MultiLock([]string{"a", "b"}).Lock(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("MultiLock.Lock with Redis down: %v, want the ctx's end and ErrUnavailable", err)
	}
}

// A MultiLock one of whose members lives on a master that does not answer (paused, no
// replica to take over) does not sit on its healthy members meanwhile: its attempt on the
// silent member is bounded while it holds the others, then it waits for that member alone, so
// a plain Mutex on a healthy member gets it at once. Once the master answers again, the
// MultiLock gets every member. Found by review.
func TestMultiLockWaitingOnASilentMasterHoldsNoOtherMember(t *testing.T) {
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{Masters: 3, Replicas: -1,
		Node: redistest.Config{Args: []string{"--cluster-require-full-coverage", "no"}}})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	c := dlock.New(cc)
	defer c.Close(context.Background())
	other := dlock.New(cl.Client())
	defer other.Close(context.Background())
	ms := cl.Masters()
	// a on a healthy master, b on the one that goes silent, a first in name order.
	a, b := namesOn(t, cc, ms[0], 1)[0], namesOn(t, cc, ms[1], 1)[0]
	silent := ms[1]
	if a > b {
		a, b, silent = b, a, ms[0]
	}
	for _, n := range []string{a, b} { // both Clients know the slot map before the outage
		_ = must(t)(c.Mutex(n).Lock(ctx)).Unlock(ctx)
		_ = must(t)(other.Mutex(n).Lock(ctx)).Unlock(ctx)
	}
	silent.Pause()
	defer silent.Resume()
	res := make(chan error, 1)
	go func() {
		l, err := c.MultiLock([]string{a, b}).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		res <- err
	}()
	// The MultiLock's pass takes a, then meets the silent master.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if info, err := other.Inspect(ctx, a); err == nil && info.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the MultiLock never took the healthy member")
		}
	}
	for i := range 3 {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		l, err := other.Mutex(a).Lock(lctx)
		cancel()
		if err != nil {
			t.Fatalf("Mutex %d on the healthy member while the MultiLock waits for the silent one: %v", i, err)
		}
		_ = l.Unlock(ctx)
	}
	silent.Resume()
	if err := <-res; err != nil {
		t.Fatalf("MultiLock once the master answers again: %v", err)
	}
}

// An Unlock whose releases get no answer (here: its ctx had ended) is retried at once by the
// next Unlock, for a MultiLock lease as for a Mutex's: it returns nil and every member is free
// for another owner. Found by review.
func TestMultiLockUnlockAgainRetriesTheFailedReleases(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	n := redistest.Name(t)
	names := []string{n + "a", n + "b"}
	l := must(t)(c.MultiLock(names).Lock(ctx))
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Unlock(dead); !errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock with an ended ctx: %v, want it to fail", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v, want nil (the releases retried at once)", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("third Unlock: %v, want ErrNotHeld", err)
	}
	_ = must(t)(c.MultiLock(names).TryLock(ctx)).Unlock(ctx)
}

// delayConn delays, once, the write of the first command that matches.
type delayConn struct {
	net.Conn
	match func(string) bool
	armed *atomic.Bool
	delay time.Duration
}

func (c *delayConn) Write(p []byte) (int, error) {
	if c.armed.Load() && c.match(string(p)) && c.armed.CompareAndSwap(true, false) {
		time.Sleep(c.delay)
	}
	return c.Conn.Write(p)
}

// A pass gives up an attempt on a slow member after 200 ms, waits for that member alone and
// gets it; the given-up attempt, reaching Redis only then, must not touch the MultiLock's hold
// (as the call's own owner it would have been taken for a stale hold of ours and dropped: the
// member free while the lease says it is held). With and without push loss detection (without
// it the overlap would last until a renewal), and with a WithOwner id, which the call keeps
// (its holds are counted: the late attempt is one more, given back). Found by review.
func TestMultiLockGivenUpAttemptArrivingLateLeavesTheLeaseAlone(t *testing.T) {
	for _, tc := range []struct {
		push  bool
		owner string
	}{{false, ""}, {true, ""}, {true, "fixed-owner"}} {
		push := tc.push
		t.Run(fmt.Sprintf("push %v owner %q", push, tc.owner), func(t *testing.T) {
			srv := redistest.Shared(t)
			ctx := ctxT(t)
			n := redistest.Name(t)
			a, b := n+"a", n+"b"
			bKey := lockKey(b)
			user := "late" + strconv.FormatInt(time.Now().UnixNano(), 36)
			var rules []string
			for _, r := range minimalACL {
				if r != "+client|tracking" || push {
					rules = append(rules, r)
				}
			}
			if err := srv.AddACLUser(ctx, user, "pw", rules...); err != nil {
				t.Fatal(err)
			}
			var armed atomic.Bool
			o := srv.Options()
			o.Username, o.Password = user, "pw"
			o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
				cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &delayConn{Conn: cn, armed: &armed, delay: 800 * time.Millisecond, match: func(s string) bool {
					// the acquire of b alone (its fence and op log keys), not a one-script pass
					f, l := strings.Index(s, bKey+":fence"), strings.Index(s, bKey+":log")
					return f >= 0 && l > f && !strings.Contains(s, lockKey(a))
				}}, nil
			}
			rdb := redis.NewClient(o)
			defer rdb.Close()
			c := dlock.New(rdb, dlock.WithLogger(slog.New(newLogRecords())))
			defer c.Close(context.Background())
			other, raw := newClient(t)
			// A dead waiter in b's queue: the one-script pass answers -1, so the pass goes
			// member by member (a, then b while holding a).
			raw.ZAdd(ctx, bKey+":queue", redis.Z{Score: 1, Member: "ghost"})
			raw.HSet(ctx, bKey+":live", "ghost", 0)
			raw.PExpire(ctx, bKey+":queue", time.Minute)
			raw.PExpire(ctx, bKey+":live", time.Minute)
			armed.Store(true)
			var opts []dlock.Option
			if tc.owner != "" {
				opts = append(opts, dlock.WithOwner(tc.owner))
			}
			l := must(t)(c.MultiLock([]string{a, b}, opts...).Lock(ctx))
			defer l.Unlock(ctx)
			// The delayed attempt reaches Redis about 800 ms after it was sent; no event tells.
			time.Sleep(time.Second)
			if err := l.Err(); err != nil {
				t.Fatalf("the MultiLock lease was lost by its own given-up attempt: %v", err)
			}
			if m, err := other.Mutex(b).TryLock(ctx); err == nil {
				_ = m.Unlock(ctx)
				t.Fatalf("another Client got member %q while the MultiLock lease on it is valid", b)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if all := raw.HGetAll(ctx, bKey).Val(); len(all) != 0 {
				t.Fatalf("member %q still held after Unlock: %v", b, all)
			}
		})
	}
}

package dlock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// acquired runs Acquire in the background and returns where its lease (or error) arrives.
func acquired(ctx context.Context, s *dlock.Semaphore, n int) <-chan leaseOrErr {
	ch := make(chan leaseOrErr, 1)
	go func() {
		l, err := s.Acquire(ctx, n)
		ch <- leaseOrErr{l, err}
	}()
	return ch
}

type leaseOrErr struct {
	l   *dlock.Lease
	err error
}

func mustAvailable(t *testing.T, s *dlock.Semaphore, want int) {
	t.Helper()
	got, err := s.Available(ctxT(t))
	if err != nil || got != want {
		t.Fatalf("Available = %d, %v; want %d", got, err, want)
	}
}

// mustAvailableSoon is mustAvailable after an Unlock: a Client may keep a hold it waited for
// a moment after its last local holder left (cohortLinger), then releases it in the
// background, which has no event to wait on.
func mustAvailableSoon(t *testing.T, s *dlock.Semaphore, want int) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		got, err := s.Available(ctxT(t))
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Available = %d, %v, 1s after the Unlock; want %d", got, err, want)
		}
	}
}

// No more than the semaphore's permits are out at once, and Unlock gives them back.
func TestSemaphoreGivesOutAtMostItsPermits(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	s := c.Semaphore(redistest.Name(t), 3)
	mustAvailable(t, s, 3)
	a, err := s.TryAcquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	mustAvailable(t, s, 1)
	if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("2 more of 3 with 2 out: %v, want ErrNotObtained", err)
	}
	b, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustAvailable(t, s, 0)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("1 more with all out: %v, want ErrNotObtained", err)
	}
	if a.Token() == 0 || b.Token() == 0 {
		t.Fatalf("tokens %d, %d; want set", a.Token(), b.Token())
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mustAvailable(t, s, 2)
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mustAvailable(t, s, 3)
	if err := b.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock: %v, want ErrNotHeld", err)
	}
}

// A waiter is woken when a release frees enough permits, not before.
func TestSemaphoreWaiterAdmittedWhenItsPermitsAreFree(t *testing.T) {
	c, _ := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 2)
	a, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := acquired(ctx, other.Semaphore(name, 2), 2)
	waitQueued(t, other, name, 1)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("2 permits granted with 1 free: %v", r.err)
	default:
	}
	start := time.Now()
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("admitted %v after the release", time.Since(start).Round(time.Microsecond))
	mustAvailable(t, s, 0)
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A request for many permits first in line is not overtaken by a later small one that fits.
func TestSemaphoreLargeRequestIsNotOvertaken(t *testing.T) {
	c, _ := newClient(t)
	big, _ := newClient(t)
	small, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 4)
	held, err := s.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	bigGot := acquired(ctx, big.Semaphore(name, 4), 4)
	waitQueued(t, big, name, 1)
	// One permit is free, but the waiter for 4 is first: a new caller of 1 waits behind it.
	if _, err := small.Semaphore(name, 4).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire(1) ahead of a waiter for 4: %v, want ErrNotObtained", err)
	}
	smallGot := acquired(ctx, small.Semaphore(name, 4), 1)
	waitQueued(t, c, name, 2)
	select {
	case r := <-smallGot:
		t.Fatalf("the later waiter for 1 overtook the waiter for 4: %v", r.err)
	default:
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-bigGot
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case r := <-smallGot:
		t.Fatalf("1 permit granted while 4 of 4 are out: %v", r.err)
	default:
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	rs := <-smallGot
	if rs.err != nil {
		t.Fatal(rs.err)
	}
	_ = rs.l.Unlock(ctx)
}

// A release admits every waiter first in line whose permits fit, and only those.
func TestSemaphoreReleaseAdmitsEveryWaiterThatFits(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 3)
	held, err := s.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	var waits []<-chan leaseOrErr
	for i, n := range []int{1, 1, 2} {
		w, _ := newClient(t)
		waits = append(waits, acquired(ctx, w.Semaphore(name, 3), n))
		waitQueued(t, c, name, i+1)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r := <-waits[i]; r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		} else {
			defer r.l.Unlock(ctx)
		}
	}
	mustAvailable(t, s, 1)
	select {
	case r := <-waits[2]:
		t.Fatalf("a waiter for 2 admitted with 1 free: %v", r.err)
	case <-time.After(100 * time.Millisecond): // nothing to wait for: it must not come
	}
}

// Bad input gets ErrInvalid and leaves nothing behind.
func TestSemaphoreBadInput(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	for _, tc := range []struct {
		what string
		s    *dlock.Semaphore
		n    int
	}{
		{"0 permits", c.Semaphore(name, 0), 1},
		{"negative permits", c.Semaphore(name, -2), 1},
		{"empty name", c.Semaphore("", 2), 1},
		{"n = 0", c.Semaphore(name, 2), 0},
		{"n < 0", c.Semaphore(name, 2), -1},
		{"n > permits", c.Semaphore(name, 2), 3},
		{"too many permits", c.Semaphore(name, dlock.MaxPermits+1), 1},
	} {
		if _, err := tc.s.TryAcquire(ctx, tc.n); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: TryAcquire: %v, want ErrInvalid", tc.what, err)
		}
		if _, err := tc.s.Acquire(ctx, tc.n); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Acquire: %v, want ErrInvalid", tc.what, err)
		}
	}
	if n, _ := rdb.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatalf("bad input left the key behind")
	}
	// Another number of permits for a semaphore that is held, or another kind of lock.
	l, err := c.Semaphore(name, 2).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Semaphore(name, 3).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "2 permits") {
		t.Errorf("other count: %v, want ErrInvalid naming 2 permits", err)
	}
	if _, err := c.Semaphore(name, 3).Available(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Available with another count: %v, want ErrInvalid", err)
	}
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "semaphore") {
		t.Errorf("Mutex on a semaphore: %v, want ErrInvalid naming the semaphore", err)
	}
	if _, err := c.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWMutex on a semaphore: %v, want ErrInvalid", err)
	}
	mustAvailable(t, c.Semaphore(name, 2), 1)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Free again: the next handle sets the count.
	l3, err := c.Semaphore(name, 3).TryAcquire(ctx, 3)
	if err != nil {
		t.Fatalf("a free semaphore taken with another count: %v", err)
	}
	_ = l3.Unlock(ctx)
	m, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Semaphore on a held Mutex: %v, want ErrInvalid", err)
	}
	if _, err := c.Semaphore(name, 2).Available(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Available on a held Mutex: %v, want ErrInvalid", err)
	}
}

// A free semaphore whose waiters still queue (its holder's lease ran out: the key deleted
// here) is a semaphore to every caller: a lock call, or a semaphore handle of another count,
// is refused, not handed the waiters (found by review: they were admitted as a read-write
// lock's readers, or with the caller's count). Its first waiter then takes it.
func TestSemaphoreWaitersKeepTheNameAsASemaphore(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	held, err := c.Semaphore(name, 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var waits []<-chan leaseOrErr
	for i := range 2 {
		w, _ := newClient(t)
		waits = append(waits, acquired(ctx, w.Semaphore(name, 1), 1))
		waitQueued(t, c, name, i+1)
	}
	rdb.Del(ctx, lockKey(name)) // the holder's lease ran out
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "semaphore") {
		t.Errorf("Mutex on a free semaphore with waiters: %v, want ErrInvalid naming the semaphore", err)
	}
	if _, err := c.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWMutex on a free semaphore with waiters: %v, want ErrInvalid", err)
	}
	if _, err := c.Semaphore(name, 3).TryAcquire(ctx, 3); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "1 permits") {
		t.Errorf("another count on a free semaphore with waiters: %v, want ErrInvalid naming 1 permit", err)
	}
	first := <-waits[0]
	if first.err != nil {
		t.Fatal(first.err)
	}
	if info, err := c.Inspect(ctx, name); err != nil || info.Kind != "semaphore" || info.PermitsOut != 1 || info.Waiters != 1 {
		t.Fatalf("after the first waiter took it: %+v, %v", info, err)
	}
	if err := first.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-waits[1]
	if second.err != nil {
		t.Fatal(second.err)
	}
	_ = second.l.Unlock(ctx)
	_ = held
}

// A semaphore lease's context is no lock's: lock calls given it fail, and Acquire given it
// takes more permits under a hold of its own (found by review: an RWMutex re-entered it).
func TestSemaphoreLeaseContextIsNoLocks(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 3)
	l, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if _, err := c.RWMutex(name).Lock(l.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWMutex.Lock with a semaphore lease's context: %v, want ErrInvalid", err)
	}
	if _, err := c.RWMutex(name).RLock(l.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWMutex.RLock with a semaphore lease's context: %v, want ErrInvalid", err)
	}
	if _, err := c.Mutex(name).Lock(l.Context()); !errors.Is(err, dlock.ErrInvalid) || !contains(err, "semaphore") {
		t.Errorf("Mutex.Lock with a semaphore lease's context: %v, want ErrInvalid naming the semaphore", err)
	}
	more, err := s.Acquire(l.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if more.Owner() == l.Owner() {
		t.Errorf("Acquire with a lease's context re-entered it (owner %s)", more.Owner())
	}
	mustAvailable(t, s, 0)
	_ = more.Unlock(ctx)
}

// Semaphore handles sharing a WithOwner id (one process or several) hold apart (found by
// review: the second Acquire took the first one's hold for a stale one of its own).
func TestSemaphoreHandlesSharingAnOwnerIDHoldApart(t *testing.T) {
	c, _ := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	a, err := c.Semaphore(name, 2, dlock.WithOwner("host-a")).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	<-dlock.Tracked(a)
	b, err := other.Semaphore(name, 2, dlock.WithOwner("host-a")).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Semaphore(name, 2).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a third permit of 2: %v, want ErrNotObtained", err)
	}
	mustAvailable(t, c.Semaphore(name, 2), 0)
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("the first holder's Unlock: %v (its hold was taken)", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func contains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

// A deleted semaphore key ends its leases (loss detection works as for locks).
func TestSemaphoreLeaseLostWhenItsKeyGoes(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	l, err := c.Semaphore(name, 2).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	<-dlock.Tracked(l)
	rdb.Del(ctx, lockKey(name))
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
}

// semHolderChild takes DLOCK_TEST_N permits of the semaphore DLOCK_TEST_NAME (of
// DLOCK_TEST_PERMITS) with a 1s TTL, says "held" and sleeps until killed.
func semHolderChild() int {
	rdb := redis.NewClient(&redis.Options{Network: os.Getenv("DLOCK_TEST_NET"), Addr: os.Getenv("DLOCK_TEST_ADDR")})
	c := dlock.New(rdb, dlock.WithTTL(time.Second))
	permits, _ := strconv.Atoi(os.Getenv("DLOCK_TEST_PERMITS"))
	n, _ := strconv.Atoi(os.Getenv("DLOCK_TEST_N"))
	if _, err := c.Semaphore(os.Getenv("DLOCK_TEST_NAME"), permits).Acquire(context.Background(), n); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println("held")
	select {}
}

// The permits of a holder killed with SIGKILL come back within its TTL, to a waiter, which is
// admitted then (its refresh finds the dead holder gone).
func TestSemaphoreKilledHoldersPermitsComeBackWithinTTL(t *testing.T) {
	srv := redistest.Shared(t)
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"=semholder",
		"DLOCK_TEST_NET="+srv.Network, "DLOCK_TEST_ADDR="+srv.Addr,
		"DLOCK_TEST_NAME="+name, "DLOCK_TEST_PERMITS=2", "DLOCK_TEST_N=2")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		t.Fatalf("child: %q", line)
	}
	s := c.Semaphore(name, 2)
	mustAvailable(t, s, 0)
	got := acquired(ctx, s, 1)
	waitQueued(t, c, name, 1)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		after := time.Since(killed)
		t.Logf("permits back %v after SIGKILL (TTL 1s)", after.Round(time.Millisecond))
		if after > time.Second+500*time.Millisecond {
			t.Fatalf("permits back %v after the kill, TTL 1s", after)
		}
		_ = r.l.Unlock(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the killed holder's permits never came back")
	}
	mustAvailableSoon(t, s, 2)
}

// Inspect shows a held semaphore's kind, permits out, holders and waiters.
func TestSemaphoreInspect(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 5)
	a, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx)
	b, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(ctx)
	w, _ := newClient(t)
	got := acquired(ctx, w.Semaphore(name, 5), 3)
	waitQueued(t, c, name, 1)
	info, err := c.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != "semaphore" || info.Permits != 5 || info.PermitsOut != 4 || info.Readers != 2 || info.Waiters != 1 || !info.Held {
		t.Fatalf("Inspect = %+v", info)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil {
		t.Fatal(r.err)
	} else {
		_ = r.l.Unlock(ctx)
	}
}

// On a Redis Cluster, a semaphore's waiter in another Client is admitted by push when a
// holder releases, and a latch's waiters are woken by push (shard channels) by the last
// CountDown, on names on different masters.
func TestSemaphoreAndLatchOnACluster(t *testing.T) {
	dlock.SetLatchRecheck(t, time.Minute)
	cl := redistest.StartClusterT(t, redistest.ClusterConfig{})
	cc := cl.Client()
	defer cc.Close()
	ctx := ctxT(t)
	a := dlock.New(cc)
	defer a.Close(ctx)
	b := dlock.New(cc)
	defer b.Close(ctx)
	for i, m := range cl.Masters()[:2] {
		name := namesOn(t, cc, m, 1)[0]
		held, err := a.Semaphore(name, 2).Acquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		got := acquired(ctx, b.Semaphore(name, 2), 1)
		waitQueued(t, a, name, 1)
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatal(r.err)
			}
			_ = r.l.Unlock(ctx)
		case <-time.After(10 * time.Second):
			t.Fatalf("master %d: the waiter was not admitted", i)
		}

		latch := namesOn(t, cc, m, 2)[1]
		if ok, err := a.Latch(latch).TrySetCount(ctx, 1); !ok || err != nil {
			t.Fatal(ok, err)
		}
		done := make(chan error, 1)
		go func() { done <- b.Latch(latch).Wait(ctx) }()
		admin := m.Client()
		ch := lockKey(latch) + ":released"
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if n, err := admin.PubSubShardNumSub(ctx, ch).Result(); err == nil && n[ch] > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the latch's waiter never subscribed")
			}
		}
		admin.Close()
		if err := a.Latch(latch).CountDown(ctx); err != nil {
			t.Fatal(err)
		}
		waitReturned(t, done, fmt.Sprintf("master %d: the latch's waiter was not woken by push", i))
	}
}

// Owner ids that look like a semaphore waiter's queue member ("s:<n>:<n>:...") stay valid for
// locks and are queued and granted as a Mutex's (found by review: "s:" was briefly reserved).
func TestMutexOwnerIDsLikeSemaphoreMembersStayMutexes(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	a, err := c.Mutex(name, dlock.WithOwner("s:2:1:host-a")).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := newClient(t)
	got := make(chan error, 1)
	go func() {
		l, err := w.Mutex(name, dlock.WithOwner("s:2:1:host-b")).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	waitQueued(t, c, name, 1)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiting Mutex with an \"s:\" owner id: %v", err)
	}
}

// waitLocalWaiters waits until n goroutines of c wait locally for one permit of s.
func waitLocalWaiters(t *testing.T, c *dlock.Client, s *dlock.Semaphore, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if got, _ := dlock.SemaphoreCohortWaiters(c, s, 1); got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines never queued locally", n)
		}
	}
}

// A Client holds as many permits at once as its goroutines ask for and the semaphore has
// (its cohort has a Redis hold per holder), and hands a hold its holder gives back to the
// next local waiter without a round trip (same hold, same owner and token) while another
// process waits in Redis; a hold nobody here waits for goes back to that process.
func TestSemaphoreCohortHandsPermitsToLocalWaiters(t *testing.T) {
	dlock.SetCohortBatchTime(t, time.Minute) // the set-up's waits must not end the batch
	c, rdb := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 2)
	a, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.TryAcquire(ctx, 1) // a permit is free: a local holder does not stop it
	if err != nil {
		t.Fatalf("TryAcquire with a permit free and a local holder: %v", err)
	}
	if a.Owner() == b.Owner() {
		t.Fatalf("two holders at once share the owner id %q: one Redis hold for two permits", a.Owner())
	}
	mustAvailable(t, s, 0)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire with every permit held by this Client: %v, want ErrNotObtained", err)
	}
	local := acquired(ctx, s, 1)
	waitLocalWaiters(t, c, s, 1)
	if _, acquiring := dlock.SemaphoreCohortWaiters(c, s, 1); acquiring {
		t.Fatal("the Client waits in Redis for a third permit of 2")
	}
	remote := acquired(ctx, other.Semaphore(name, 2), 1)
	waitQueueLen(t, rdb, name, 1)

	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var w *dlock.Lease
	select {
	case r := <-local:
		if r.err != nil {
			t.Fatal(r.err)
		}
		w = r.l
	case r := <-remote:
		t.Fatalf("the other process got the permit (%v) while a local goroutine waited", r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the local waiter was not handed the permit")
	}
	if w.Owner() != a.Owner() || w.Token() != a.Token() {
		t.Fatalf("local hand-off: owner %q token %d, the hold's %q %d", w.Owner(), w.Token(), a.Owner(), a.Token())
	}
	if n := rdb.ZCard(ctx, dlock.DefaultKeyPrefix+"{"+name+"}:queue").Val(); n != 1 {
		t.Fatalf("Redis queue %d long after the local hand-off, want the other process still in it", n)
	}
	if err := b.Unlock(ctx); err != nil { // nobody waits here: back to Redis, to the other
		t.Fatal(err)
	}
	select {
	case r := <-remote:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the other process was not admitted when this Client gave a permit back")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mustAvailableSoon(t, s, 2)
}

// Goroutines of one Client that take and give back the only permit in a loop never keep it
// from another process for long: each hold serves a bounded batch of them.
func TestSemaphoreCohortBatchLetsOtherProcessesIn(t *testing.T) {
	c, _ := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := s.Acquire(ctx, 1)
				if err != nil {
					t.Error(err)
					return
				}
				_ = l.Unlock(ctx)
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	waitLocalWaiters(t, c, s, 3)
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l, err := other.Semaphore(name, 1).Acquire(wctx, 1)
	if err != nil {
		t.Fatalf("the other process got no permit in %v while this Client's goroutines looped: %v", time.Since(start), err)
	}
	t.Logf("the other process waited %v", time.Since(start).Round(time.Microsecond))
	_ = l.Unlock(ctx)
}

// A Client's goroutines together hold every permit of the semaphore at once, each under a
// Redis hold of its own, and no more.
func TestSemaphoreCohortTakesEveryPermit(t *testing.T) {
	c, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 3)
	leases := make(chan leaseOrErr, 4)
	for i := 0; i < 4; i++ {
		go func() {
			l, err := s.Acquire(ctx, 1)
			leases <- leaseOrErr{l, err}
		}()
	}
	var held []*dlock.Lease
	for len(held) < 3 {
		select {
		case r := <-leases:
			if r.err != nil {
				t.Fatal(r.err)
			}
			held = append(held, r.l)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 3 permits held by 4 goroutines of one Client", len(held))
		}
	}
	waitLocalWaiters(t, c, s, 1)
	mustAvailable(t, s, 0)
	owners := map[string]bool{}
	for _, l := range held {
		owners[l.Owner()] = true
	}
	if len(owners) != 3 {
		t.Fatalf("3 holders under %d owner ids", len(owners))
	}
	select {
	case r := <-leases:
		t.Fatalf("a fourth goroutine got a permit of 3: %v", r.err)
	default:
	}
	_ = held[0].Unlock(ctx)
	select {
	case r := <-leases:
		if r.err != nil {
			t.Fatal(r.err)
		}
		held[0] = r.l
	case <-time.After(5 * time.Second):
		t.Fatal("the fourth goroutine was not handed the permit given back")
	}
	for _, l := range held {
		_ = l.Unlock(ctx)
	}
}

// A Client whose acquirer waits in Redis for permits leaves the queue once a local hand-off
// served the goroutine it waited for: it keeps no place there ahead of other processes for
// permits nobody wants, so another process gets a free permit at once.
func TestSemaphoreCohortLeavesTheRedisQueueWhenNobodyWaitsLocally(t *testing.T) {
	dlock.SetCohortBatchTime(t, time.Minute) // the set-up's waits must not end the batch
	c, rdb := newClient(t)
	other, _ := newClient(t)
	ctx := ctxT(t)
	name := redistest.Name(t)
	s := c.Semaphore(name, 4)
	a, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	so := other.Semaphore(name, 4)
	p, err := so.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unlock(ctx)
	local := acquired(ctx, s, 2) // 1 permit free: it waits, its Client's acquirer in Redis
	waitQueueLen(t, rdb, name, 1)
	if err := a.Unlock(ctx); err != nil { // handed to the local waiter
		t.Fatal(err)
	}
	r := <-local
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Unlock(ctx)
	waitQueueLen(t, rdb, name, 0)
	mustAvailable(t, s, 1)
	qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	q, err := so.Acquire(qctx, 1)
	if err != nil {
		t.Fatalf("another process's Acquire(1) with 1 permit free and nobody waiting: %v", err)
	}
	_ = q.Unlock(ctx)
}

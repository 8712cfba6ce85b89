package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
)

// dropReply is a go-redis hook that lets a script run in Redis and then loses its reply, as a
// connection reset after the server executed the command would.
type dropReply struct {
	sha       string
	drops     atomic.Int32
	pipelines bool // pipelined calls too (a MultiLock's releases), not only single ones
}

func (h *dropReply) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *dropReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if len(args) > 1 && args[0] == "evalsha" && args[1] == h.sha && h.drops.Add(-1) >= 0 {
			cmd.SetErr(io.ErrUnexpectedEOF)
			return io.ErrUnexpectedEOF
		}
		return err
	}
}

func (h *dropReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if !h.pipelines {
		return next
	}
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) > 1 && args[0] == "evalsha" && args[1] == h.sha && h.drops.Add(-1) >= 0 {
				cmd.SetErr(io.ErrUnexpectedEOF)
				err = io.ErrUnexpectedEOF
			}
		}
		return err
	}
}

func clientDropping(t *testing.T, sha string, drops int32) (*dlock.Client, *redis.Client) {
	rdb := redistest.Client(t)
	h := &dropReply{sha: sha}
	h.drops.Store(drops)
	rdb.AddHook(h)
	c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithoutCohort()) // every hold is its own Redis hold
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, rdb
}

func TestUnlockRetriedAfterLostReply(t *testing.T) {
	ctx := ctxT(t)
	// Load the scripts so the client sends EVALSHA, which the hook recognises.
	raw := redistest.Client(t)
	scripts.Release.Load(ctx, raw)
	scripts.Acquire.Load(ctx, raw)
	c, rdb := clientDropping(t, scripts.Release.Hash(), 1)
	name := redistest.Name(t)
	m := c.Mutex(name, dlock.WithOwner("job-1")) // re-entry counted in Redis
	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Unlock(ctx); err == nil {
		t.Fatal("Unlock with a lost reply returned nil")
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatalf("retried Unlock of a release that succeeded = %v, want nil", err)
	}
	if n, _ := rdb.HGet(ctx, lockKey(name), m.Owner()).Int(); n != 1 {
		t.Fatalf("hold count = %d after the retried inner Unlock, want 1", n)
	}
	if err := inner.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock after a successful retry = %v, want ErrNotHeld", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatal("lock still held after both Unlocks")
	}
}

func TestAcquireWithLostReplyIsUndone(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	c, _ := clientDropping(t, scripts.Acquire.Hash(), 1)
	name := redistest.Name(t)
	if _, err := c.Mutex(name).TryLock(ctx); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with a lost reply = %v, want the transport error", err)
	}
	// The acquire ran in Redis with a 30s TTL; only the background clean-up can free it soon.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	other := dlock.New(raw)
	defer other.Close(ctx)
	l, err := other.Mutex(name).Lock(wctx)
	if err != nil {
		t.Fatalf("lock left held after an acquire whose reply was lost: %v", err)
	}
	_ = l.Unlock(ctx)
}

// A waiter whose replies keep getting lost never keeps the lock: each attempt without a reply
// is undone (found by review: a wait that kept its hold id refreshed it forever).
func TestWaiterWithLostRepliesNeverKeepsTheLock(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	name := redistest.Name(t)
	holderC := dlock.New(raw, dlock.WithoutCohort())
	defer holderC.Close(ctx)
	held, err := holderC.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := clientDropping(t, scripts.Acquire.Hash(), 1<<30) // every acquire's reply is lost
	wctx, stopWaiter := context.WithCancel(ctx)
	defer stopWaiter()
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		if l, err := c.Mutex(name).Lock(wctx); err == nil {
			t.Error("a waiter that never got a reply got a lease")
			_ = l.Unlock(ctx)
		}
	}()
	waitQueueLen(t, raw, name, 1)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	l, err := holderC.Mutex(name).Lock(octx)
	if err != nil {
		t.Fatalf("another owner's Lock while a waiter's replies get lost: %v", err)
	}
	_ = l.Unlock(ctx)
	stopWaiter()
	<-waiterDone
}

// A WithOwner Lock whose first attempt took the free lock with its reply lost: the next
// attempt drops that hold before it takes the lock, so Unlock leaves nothing behind (found by
// review: a hold left under the lost attempt's id was re-entered and outlived the lease).
func TestLostAttemptsHoldIsDroppedByTheNext(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	c, _ := clientDropping(t, scripts.Acquire.Hash(), 1)
	name := redistest.Name(t)
	l, err := c.Mutex(name, dlock.WithOwner("job-"+name)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := raw.HGet(ctx, lockKey(name), "job-"+name).Int(); n != 1 {
		t.Fatalf("owner's count while holding = %d, want 1: %v", n, raw.HGetAll(ctx, lockKey(name)).Val())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if raw.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatalf("lock left after the only lease's Unlock: %v", raw.HGetAll(ctx, lockKey(name)).Val())
	}
}

// An acquire whose reply was lost is undone in the background (abandon: the release "only if
// acquired"). When the acquire itself reaches Redis only after that clean-up (a command
// delayed on a dead connection), it must take nothing: nobody would release the lock, which
// would stall everyone for its TTL.
func TestAbandonedAcquireArrivingLateTakesNothing(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	n, err := scripts.Release.Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
		"A", "h1", 60000, k.channel, true, 500, "PUBLISH", false, 0, "").Int64()
	if err != nil || n != 0 {
		t.Fatalf("clean-up of an acquire that has not run: %d, %v; want 0", n, err)
	}
	if res := acquireArgs(t, rdb, k, "A", "h1", false, true); res[0] != 0 {
		t.Fatalf("the late acquire took the lock: %v", res)
	}
	if rdb.Exists(ctx, k.lock).Val() != 0 {
		t.Fatal("the late acquire left a lock behind")
	}
	// The owner's next call, under a hold id of its own, takes the lock as usual.
	if res := acquireArgs(t, rdb, k, "A", "h2", false, true); res[0] != 1 {
		t.Fatalf("a fresh acquire after the clean-up: %v, want it taken", res)
	}
}

// A reader wait's queued attempt as hold A gets no reply, so the wait goes on as B, undoing
// A. B's attempt finds the lock free with another reader H first in line: H's grant admits the
// readers behind it, O among them, and must write O's hold as B (the attempt now running), not
// as A: a hold under A would outlive B's release (B's renewals keeping it alive), a ghost
// reader keeping writers out for a whole TTL. Found by review.
func TestReaderAdmittedByItsNextAttemptLeavesNoGhostHold(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	k := names(t)
	acq := func(owner, hold, mode string, attempt int, undo string) []int64 {
		t.Helper()
		res, err := scripts.Acquire.Run(ctx, rdb, []string{k.lock, k.fence, k.log, k.queue, k.live},
			owner, 30000, hold, 60000, true, 750, k.channel, 500, "PUBLISH", false, 60000, 4, mode, attempt, undo).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	acq("X", "hx", "w", 1, "") // X writes
	acq("H", "hh", "r", 1, "") // reader H queues
	acq("O", "A", "r", 1, "")  // reader O queues as A: this reply is lost
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		// H must have waited through the 4 ms barging window (server time, no event).
		now, _ := rdb.Time(ctx).Result()
		if joined, _ := rdb.ZScore(ctx, k.queue, "r:H").Result(); float64(now.UnixMilli())-joined > 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server clock did not move")
		}
	}
	rdb.Del(ctx, k.lock) // X's hold expired
	if res := acq("O", "B", "r", 2, "A"); res[0] != 1 {
		t.Fatalf("O's next attempt as B: %v, want it admitted with H", res)
	}
	if hold, _ := rdb.HGet(ctx, k.lock, "#A").Result(); hold != "" {
		t.Fatalf("the grant wrote the given-up hold A (for %q)", hold)
	}
	for _, r := range []struct{ owner, hold string }{{"O", "B"}, {"H", "hh"}} {
		if _, err := scripts.Release.Run(ctx, rdb, []string{k.lock, k.log, k.fence, k.queue, k.live},
			r.owner, r.hold, 60000, k.channel, false, 500, "PUBLISH", false, 4, "r", "").Int64(); err != nil {
			t.Fatal(err)
		}
	}
	if all := rdb.HGetAll(ctx, k.lock).Val(); len(all) != 0 {
		t.Fatalf("every reader released, the lock still holds %v", all)
	}
	if w := acq("W", "hw", "w", 1, ""); w[0] != 1 {
		t.Fatalf("a writer after every reader released: %v, want the lock", w)
	}
}

// heldBack is a go-redis hook that holds back a Client's first n acquires (as commands stuck
// on a dead connection: the caller gets a transport error, Redis has not run them yet), and
// with cleanUps every background clean-up of one (release "only if acquired"), so a test can
// deliver them late, after later calls (held returns their arguments).
type heldBack struct {
	n        int
	cleanUps bool
	mu       sync.Mutex
	args     [][]any // the held-back acquires' arguments
}

// held returns the arguments of the acquires held back so far.
func (h *heldBack) held() [][]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.args)
}

func (h *heldBack) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldBack) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 12 && args[0] == "evalsha" {
			h.mu.Lock()
			acquire := args[1] == scripts.Acquire.Hash() && len(h.args) < h.n
			if acquire {
				h.args = append(h.args, slices.Clone(args))
			}
			cleanUp := h.cleanUps && args[1] == scripts.Release.Hash() && fmt.Sprint(args[12]) == "true"
			h.mu.Unlock()
			if acquire || cleanUp {
				cmd.SetErr(io.ErrUnexpectedEOF)
				return io.ErrUnexpectedEOF
			}
		}
		return next(ctx, cmd)
	}
}

func (h *heldBack) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Client's cohort (one owner id in Redis for its goroutines) whose TryLock got no reply, and
// whose later TryLock took the lock: the first acquire, reaching Redis only now, must not take
// that hold for a stale one of the cohort's and drop it. The cohort goes on under an owner id
// of a new generation after an attempt whose outcome it does not know. Found by review.
func TestCohortAttemptArrivingLateLeavesTheLaterHoldAlone(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Acquire.Load(ctx, raw)
	scripts.Release.Load(ctx, raw)
	rdb := redistest.Client(t)
	hook := &heldBack{n: 1, cleanUps: true}
	rdb.AddHook(hook)
	c := dlock.New(rdb, dlock.OnGoRedis())
	defer c.Close(context.Background())
	name := redistest.Name(t)
	if _, err := c.Mutex(name).TryLock(ctx); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock whose acquire is held back = %v, want the transport error", err)
	}
	l := must(t)(c.Mutex(name).TryLock(ctx))
	before := raw.HGetAll(ctx, lockKey(name)).Val()
	if err := raw.Do(ctx, hook.held()[0]...).Err(); err != nil { // the first acquire arrives
		t.Fatal(err)
	}
	if after := raw.HGetAll(ctx, lockKey(name)).Val(); !maps.Equal(after, before) {
		t.Fatalf("the late acquire changed the lock: %v, was %v", after, before)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the later hold: %v", err)
	}
}

// A MultiLock's releases go out in one pipeline: when Redis ran them and their replies were
// lost (the connection died after), Unlock says Redis gave no answer, not that the lease was
// lost, and a second Unlock finds both releases applied.
func TestMultiLockUnlockAfterLostPipelinedReplies(t *testing.T) {
	ctx := ctxT(t)
	raw := redistest.Client(t)
	scripts.Release.Load(ctx, raw) // EVALSHA, which the hook recognises
	rdb := redistest.Client(t)
	h := &dropReply{sha: scripts.Release.Hash(), pipelines: true}
	rdb.AddHook(h)
	c := dlock.New(rdb, dlock.OnGoRedis())
	defer c.Close(context.Background())
	name := redistest.Name(t)
	names := []string{name + "-a", name + "-b"}
	l, err := c.MultiLock(names).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.drops.Store(2)
	err = l.Unlock(ctx)
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Unlock with both replies lost: %v; want ErrUnavailable, not a lost lease", err)
	}
	if n := h.drops.Load(); n > 0 {
		t.Fatalf("%d replies left to drop: the releases did not go out pipelined", n)
	}
	for _, n := range names {
		if raw.Exists(ctx, lockKey(n)).Val() != 0 {
			t.Errorf("%s still held in Redis: the release whose reply was lost did not run", n)
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v; want nil (both releases were applied)", err)
	}
}

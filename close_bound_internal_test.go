package dlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// heldRunner runs calls on rdb once open is closed (entered is closed when the first call
// comes); with loseFirst, the first call's reply is lost (it ran).
type heldRunner struct {
	rdb           *redis.Client
	open, entered chan struct{}
	once          sync.Once
	loseFirst     bool
}

func (r *heldRunner) RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult {
	first := false
	r.once.Do(func() { close(r.entered); first = true })
	<-r.open
	out := make([]ScriptResult, len(calls))
	for i, c := range calls {
		args := make([]any, len(c.Args))
		for j, a := range c.Args {
			args[j] = a
		}
		v, err := r.rdb.Eval(ctx, c.Source, c.Keys, args...).Result() // a cancelled ctx sends nothing
		out[i] = ScriptResult{Val: v, Err: err}
		if first && r.loseFirst {
			out[i] = ScriptResult{Err: io.ErrUnexpectedEOF}
		}
	}
	return out
}

// Close cuts its clean-up short at its bound, then still waits for its background work. A
// lock call on the caller's goroutine, which Close does not wait for, whose acquire reaches
// Redis in between gives the lock back all the same, whether its reply came or was lost, and
// however long ago Close's bound passed. Found by review: its give-back got the clean-up
// context Close had ended, so it was never sent and the lock stayed held for its TTL; then
// (stale) a deadline of one second after Close's bound, over before it began.
func TestGiveBackBetweenClosesBoundAndItsReturn(t *testing.T) {
	for _, stale := range []bool{false, true} {
		for _, lose := range []bool{false, true} {
			rdb := redistest.Client(t)
			r := &heldRunner{rdb: rdb, open: make(chan struct{}), entered: make(chan struct{}), loseFirst: lose}
			c := New(rdb, WithScriptRunner(r))
			name := redistest.Name(t)
			c.wg.Add(1) // background work Close waits for (an attempt still in flight, say)
			got := make(chan error, 1)
			go func() {
				_, err := c.Mutex(name).TryLock(context.Background())
				got <- err
			}()
			<-r.entered
			closed := make(chan error, 1)
			gone, cancel := context.WithCancel(context.Background())
			cancel() // a shutdown whose ctx has already ended: Close's bound is over at once
			go func() { closed <- c.Close(gone) }()
			<-c.cleanup.Done() // Close cut its clean-up short, and waits for the background work
			if stale {
				// Close has waited past its bound for longer than a give-back is given.
				long := time.Now().Add(-10 * lateGiveBack)
				c.closeBy.Store(&long)
			}
			close(r.open) // the acquire reaches Redis now
			if err := <-got; !errors.Is(err, ErrClosed) {
				t.Errorf("stale %v, reply lost %v: TryLock whose acquire ran during Close: %v, want ErrClosed", stale, lose, err)
			}
			c.wg.Done()
			<-closed // the give-back may have gone to the background, which Close waits for
			key := lockKeys(DefaultKeyPrefix, name).lock
			if h := rdb.HGetAll(context.Background(), key).Val(); len(h) != 0 {
				t.Errorf("stale %v, reply lost %v: the lock after TryLock and Close returned: %v (PTTL %v), want it given back",
					stale, lose, h, rdb.PTTL(context.Background(), key).Val())
			}
		}
	}
}

// A give-back after Close has begun on work Close waits for ends by Close's bound plus
// lateGiveBack, so Close's documented bound holds; elsewhere it gets lateGiveBack from its
// start, and Close's bound does not shorten it.
func TestGiveBackDeadlineAfterClose(t *testing.T) {
	c := New(redistest.Client(t))
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-10 * lateGiveBack)
	c.closeBy.Store(&long) // Close's bound passed long ago
	waited, cancel := c.ownCleanup(closeWaits(context.Background()), abandonTimeout)
	defer cancel()
	if waited.Err() == nil {
		d, _ := waited.Deadline()
		t.Errorf("a give-back Close waits for, 10 s after Close's bound: deadline %v from now, want over", time.Until(d))
	}
	soon := time.Now().Add(-lateGiveBack / 2)
	c.closeBy.Store(&soon)
	waited, cancel = c.ownCleanup(closeWaits(context.Background()), abandonTimeout)
	defer cancel()
	if d, _ := waited.Deadline(); !d.Equal(soon.Add(lateGiveBack)) || waited.Err() != nil {
		t.Errorf("a give-back Close waits for, half a second after Close's bound: deadline %v after the bound (err %v), want %v", d.Sub(soon), waited.Err(), lateGiveBack)
	}
	c.closeBy.Store(&long)
	start := time.Now()
	own, cancel := c.ownCleanup(context.Background(), abandonTimeout)
	defer cancel()
	if d, _ := own.Deadline(); own.Err() != nil || d.Before(start.Add(lateGiveBack)) || d.After(time.Now().Add(lateGiveBack)) {
		t.Errorf("a give-back on a caller's goroutine after Close: deadline %v from its start (err %v), want %v", d.Sub(start), own.Err(), lateGiveBack)
	}
}

// stallRunner runs calls on rdb until stall is set; then every call is held until its ctx
// ends (a frozen server, through a runner without read timeouts), entered closed at the first.
type stallRunner struct {
	rdb     *redis.Client
	stall   atomic.Bool
	entered chan struct{}
	once    sync.Once
}

func (r *stallRunner) RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult {
	out := make([]ScriptResult, len(calls))
	if r.stall.Load() {
		r.once.Do(func() { close(r.entered) })
		<-ctx.Done()
		for i := range out {
			out[i] = ScriptResult{Err: ctx.Err()}
		}
		return out
	}
	for i, c := range calls {
		args := make([]any, len(c.Args))
		for j, a := range c.Args {
			args[j] = a
		}
		v, err := r.rdb.Eval(ctx, c.Source, c.Keys, args...).Result()
		out[i] = ScriptResult{Val: v, Err: err}
	}
	return out
}

// An Extend in flight is background work Close waits for: Close's cut of its clean-up ends
// it, so Close returns within its bound. Found by review: the Extend ran on its caller's ctx,
// so Close waited for as long as the server stayed frozen.
func TestCloseCutsAnExtendInFlight(t *testing.T) {
	rdb := redistest.Client(t)
	r := &stallRunner{rdb: rdb, entered: make(chan struct{})}
	c := New(rdb, WithScriptRunner(r))
	l, err := c.Mutex(redistest.Name(t)).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r.stall.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- l.Extend(context.Background(), time.Minute) }()
	<-r.entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- c.Close(ctx) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close with a 100 ms ctx has not returned after 10 s: it waits for the Extend")
	}
	if err := <-extended; err == nil {
		t.Error("Extend cut short by Close: nil error")
	}
}

// closeStuckRunner passes calls through to rdb, except calls on stuck, held (once armed) until
// unstuck is closed whatever their ctx (go-redis on a frozen server without
// ContextTimeoutEnabled ends a call at its read timeout, not at its ctx), and the first call
// on lost (once armed), held until land is closed, then run with its reply lost.
type closeStuckRunner struct {
	rdb                 *redis.Client
	armed               atomic.Bool
	stuck, lost         string
	stuckIn, lostIn     chan struct{}
	unstuck, land       chan struct{}
	stuckOnce, lostOnce sync.Once
}

func (r *closeStuckRunner) RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult {
	out := make([]ScriptResult, len(calls))
	for i, c := range calls {
		armed := r.armed.Load() && len(c.Keys) > 0
		first := false
		if armed && c.Keys[0] == r.stuck {
			r.stuckOnce.Do(func() { close(r.stuckIn) })
			<-r.unstuck
			out[i] = ScriptResult{Err: errors.New("i/o timeout (a read timeout)")}
			continue
		}
		if armed && c.Keys[0] == r.lost {
			r.lostOnce.Do(func() { first = true; close(r.lostIn) })
			if first {
				<-r.land
			}
		}
		args := make([]any, len(c.Args))
		for j, a := range c.Args {
			args[j] = a
		}
		v, err := r.rdb.Eval(ctx, c.Source, c.Keys, args...).Result() // a done ctx sends nothing
		out[i] = ScriptResult{Val: v, Err: err}
		if first {
			out[i] = ScriptResult{Err: io.ErrUnexpectedEOF} // it ran; its reply is lost
		}
	}
	return out
}

// A TryLock on the caller's goroutine, which Close does not wait for, whose acquire ran with
// its reply lost while Close is still releasing its leases long past its bound (a release
// stuck for a read timeout) undoes the acquire all the same. Found by review: the undo went to
// a background goroutine, which Close waits for and so caps at its bound plus lateGiveBack,
// over before it started: the lock stayed held for its TTL.
func TestCallerUndoWhileCloseOverrunsItsBound(t *testing.T) {
	rdb := redistest.Client(t)
	nameA, nameB := redistest.Name(t)+"-a", redistest.Name(t)+"-b"
	r := &closeStuckRunner{rdb: rdb,
		stuck: lockKeys(DefaultKeyPrefix, nameA).lock, lost: lockKeys(DefaultKeyPrefix, nameB).lock,
		stuckIn: make(chan struct{}), lostIn: make(chan struct{}), unstuck: make(chan struct{}), land: make(chan struct{})}
	c := New(rdb, WithScriptRunner(r))
	if _, err := c.Mutex(nameA).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.armed.Store(true)
	got := make(chan error, 1)
	go func() {
		_, err := c.Mutex(nameB).TryLock(context.Background())
		got <- err
	}()
	<-r.lostIn // TryLock's acquire is in flight
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	<-r.stuckIn // Close is releasing lease A, stuck
	long := time.Now().Add(-10 * lateGiveBack)
	c.closeBy.Store(&long) // as if Close's bound passed long ago
	close(r.land)          // the acquire runs now, its reply lost
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Errorf("TryLock whose acquire ran during Close: %v, want ErrClosed", err)
	}
	close(r.unstuck)
	<-closed
	key := lockKeys(DefaultKeyPrefix, nameB).lock
	if h := rdb.HGetAll(context.Background(), key).Val(); len(h) != 0 {
		t.Errorf("the lock TryLock took during Close, after Close returned: %v (PTTL %v), want it given back",
			h, rdb.PTTL(context.Background(), key).Val())
	}
}

// cutRunner holds the first call on key until a second call on key (the waiter's leaving the
// queue, at Close) has run; then it runs the held call (it reached Redis late) and loses its
// reply at its ctx's end (Close's cut of its clean-up), as go-redis does with
// ContextTimeoutEnabled. Calls on key after that are recorded with their ctx error.
type cutRunner struct {
	rdb        *redis.Client
	key        string
	mu         sync.Mutex
	n          int
	entered    chan struct{}
	leftQueue  chan struct{}
	afterCalls []error
}

func (r *cutRunner) eval(ctx context.Context, c ScriptCall) ScriptResult {
	args := make([]any, len(c.Args))
	for j, a := range c.Args {
		args[j] = a
	}
	v, err := r.rdb.Eval(ctx, c.Source, c.Keys, args...).Result()
	return ScriptResult{Val: v, Err: err}
}

func (r *cutRunner) RunScripts(ctx context.Context, calls []ScriptCall) []ScriptResult {
	out := make([]ScriptResult, len(calls))
	for i, c := range calls {
		if len(c.Keys) == 0 || c.Keys[0] != r.key {
			out[i] = r.eval(ctx, c)
			continue
		}
		r.mu.Lock()
		r.n++
		n := r.n
		if n > 2 {
			r.afterCalls = append(r.afterCalls, ctx.Err())
		}
		r.mu.Unlock()
		switch n {
		case 1:
			close(r.entered)
			<-r.leftQueue
			out[i] = r.eval(context.Background(), c) // it reached Redis
			r.mu.Lock()
			r.afterCalls = append(r.afterCalls, fmt.Errorf("late acquire: %v %v", out[i].Val, out[i].Err))
			r.mu.Unlock()
			<-ctx.Done()
			out[i] = ScriptResult{Err: ctx.Err()} // its reply cut short
		case 2:
			out[i] = r.eval(ctx, c)
			close(r.leftQueue)
		default:
			out[i] = r.eval(ctx, c)
		}
	}
	return out
}

// A wait's attempt in flight when Close begins, whose acquire reaches Redis after the waiter
// left the queue and whose reply Close's cut of its clean-up ends, is given back by the
// attempt's own leaving, work Close waits for, which gets until Close's bound plus
// lateGiveBack as that work's other give-backs do. Found by review: the leaving ran on the
// clean-up context Close had cut, so nothing was sent and the lock stayed held for its TTL.
func TestWaitAttemptLandingAfterClosesCutIsGivenBack(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(fmt.Sprintf("close ctx ended already %v", gone), func(t *testing.T) { waitAttemptLandingAfterClosesCut(t, gone) })
	}
}

func waitAttemptLandingAfterClosesCut(t *testing.T, gone bool) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	key := lockKeys(DefaultKeyPrefix, name).lock
	r := &cutRunner{rdb: rdb, key: key, entered: make(chan struct{}), leftQueue: make(chan struct{})}
	c := New(rdb, WithScriptRunner(r), WithoutCohort())
	got := make(chan error, 1)
	go func() {
		_, err := c.Mutex(name).Lock(context.Background())
		got <- err
	}()
	<-r.entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if gone {
		cancel() // a shutdown whose ctx has already ended
	}
	_ = c.Close(ctx)
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock waiting when Close began: %v, want ErrClosed", err)
	}
	if h := rdb.HGetAll(context.Background(), key).Val(); len(h) != 0 {
		t.Errorf("lock taken by a wait's attempt in flight at Close: still held after Close returned: %v (PTTL %v), want it given back",
			h, rdb.PTTL(context.Background(), key).Val())
	}
}

package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// recorder is an Observer that writes down what it hears, one line per event.
type recorder struct {
	mu     sync.Mutex
	events []string
	ended  chan error // each LeaseEnded's error
	renew  chan error // each Renewed's error
}

type spanKey struct{}

func newRecorder() *recorder {
	return &recorder{ended: make(chan error, 100), renew: make(chan error, 1000)}
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// nextEnd returns the error of the next LeaseEnded, failing the test after 5s.
func (r *recorder) nextEnd(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.ended:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no LeaseEnded within 5s")
		return nil
	}
}

func (r *recorder) observer() dlock.Observer {
	return dlock.Observer{
		CallStart: func(ctx context.Context, c dlock.Call) context.Context {
			r.add("start %s %s %s", c.Kind, c.Method, c.Name)
			return context.WithValue(ctx, spanKey{}, c.Method+" "+c.Name)
		},
		CallDone: func(ctx context.Context, c dlock.Call, res dlock.CallResult) {
			l, err := res.Lease, res.Err
			span, _ := ctx.Value(spanKey{}).(string)
			outcome := "ok"
			switch {
			case errors.Is(err, dlock.ErrNotObtained):
				outcome = "not obtained"
			case err != nil:
				outcome = err.Error()
			}
			if c.Start.IsZero() || time.Since(c.Start) < 0 {
				outcome += " (no start time)"
			}
			r.add("done %s %s %s lease=%v span=%q: %s", c.Kind, c.Method, c.Name, l != nil, span, outcome)
		},
		LeaseEnded: func(e dlock.LeaseEnd) {
			if e.Held <= 0 {
				r.add("ended %s with held %v", e.Lease.Name(), e.Held)
			}
			r.ended <- e.Err
		},
		Renewed: func(rn dlock.Renewal) {
			if rn.Latency <= 0 || rn.Lock == "" {
				r.add("renewal %+v", rn)
			}
			select {
			case r.renew <- rn.Err:
			default:
			}
		},
	}
}

// An Observer hears every lock call start and return (with the context its CallStart gave,
// which the call and the lease's context carry), each Unlock, and each lease's end.
func TestObserverHearsCallsAndLeaseEnds(t *testing.T) {
	ctx := ctxT(t)
	rec := newRecorder()
	c, _ := newClient(t, dlock.WithObserver(rec.observer()))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Context().Value(spanKey{}); got != nil {
		t.Fatalf("lease context carries the lock call's %v: work under the lease is not part of the call", got)
	}
	if _, err := c.Mutex(name, dlock.WithoutCohort()).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rec.nextEnd(t); err != nil {
		t.Fatalf("LeaseEnded after Unlock: %v, want nil", err)
	}
	want := []string{
		"start mutex Lock " + name,
		fmt.Sprintf("done mutex Lock %s lease=true span=%q: ok", name, "Lock "+name),
		"start mutex TryLock " + name,
		fmt.Sprintf("done mutex TryLock %s lease=false span=%q: not obtained", name, "TryLock "+name),
		"start mutex Unlock " + name,
		fmt.Sprintf("done mutex Unlock %s lease=true span=%q: ok", name, "Unlock "+name),
	}
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The other primitives name themselves and their methods.
	rl, err := c.RWMutex(name + ".rw").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := c.Semaphore(name+".sem", 2).TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	ml, err := c.MultiLock([]string{name + ".a", name + ".b"}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []*dlock.Lease{rl, sl, ml} {
		if err := x.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var starts []string
	for _, e := range rec.take() {
		if strings.HasPrefix(e, "start ") {
			starts = append(starts, e)
		} else if !strings.HasSuffix(e, ": ok") {
			t.Errorf("event %s", e)
		}
	}
	want = []string{
		"start rwmutex RLock " + name + ".rw",
		"start semaphore TryAcquire " + name + ".sem",
		"start multilock Lock " + name + ".a," + name + ".b",
		"start rwmutex Unlock " + name + ".rw",
		"start semaphore Unlock " + name + ".sem",
		"start multilock Unlock " + name + ".a," + name + ".b",
	}
	if !slices.Equal(starts, want) {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(starts, "\n"), strings.Join(want, "\n"))
	}
}

// An Observer hears each watchdog renewal, a lost lease's end with its cause, and Close ending
// a lease with ErrClosed; the logger gets a warning for the lost lease.
func TestObserverHearsRenewalsLossAndClose(t *testing.T) {
	ctx := ctxT(t)
	rec := newRecorder()
	logs := newLogRecords()
	c, raw := newClient(t, dlock.WithObserver(rec.observer()), dlock.WithTTL(200*time.Millisecond), dlock.WithLogger(slog.New(logs)))
	name := redistest.Name(t)
	l, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rec.renew:
		if err != nil {
			t.Fatalf("first renewal: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal heard within 5s (TTL 200ms: one every 50ms)")
	}
	if err := raw.Del(ctx, lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if err := rec.nextEnd(t); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("LeaseEnded of a lost lease: %v, want ErrLeaseLost", err)
	}
	if msg, ok := logs.find(slog.LevelWarn, "lease lost"); !ok || !strings.Contains(msg, name) {
		t.Fatalf("no warning naming the lost lease's lock (%q)", msg)
	}
	l2, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rec.nextEnd(t); !errors.Is(err, dlock.ErrClosed) || !errors.Is(l2.Err(), dlock.ErrClosed) {
		t.Fatalf("LeaseEnded at Close: %v (lease: %v), want ErrClosed", err, l2.Err())
	}
	for _, e := range rec.take() {
		if strings.Contains(e, "held") {
			t.Error(e)
		}
	}
}

// Outcome names errors as dlock returns them, the most specific first (a Lock whose ctx ended
// while Redis was down matches both ErrNotObtained and ErrUnavailable: not_obtained).
func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("%w: %w", dlock.ErrNotObtained, dlock.ErrUnavailable), "not_obtained"},
		{fmt.Errorf("%w: %w", dlock.ErrNotHeld, dlock.ErrLeaseLost), "not_held"},
		{fmt.Errorf("%w: renewal refused", dlock.ErrLeaseLost), "lost"},
		{dlock.FixedLeaseOver(), "expired"},
		{fmt.Errorf("%w: 0 of 1", dlock.ErrNotReplicated), "not_replicated"},
		{fmt.Errorf("%w: lock", dlock.ErrClosed), "closed"},
		{fmt.Errorf("%w: bad TTL", dlock.ErrInvalid), "invalid"},
		{dlock.ErrIncompatible, "invalid"},
		{fmt.Errorf("%w: EOF", dlock.ErrUnavailable), "unavailable"},
		{errors.New("NOPERM"), "error"},
	} {
		if got := dlock.Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

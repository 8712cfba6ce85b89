package dlock_test

// Tests of the Observer and the lost-lease warning in the cases an adversarial review found
// wrong (each failed before its fix).

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// obsTally counts what an Observer hears, per lease.
type obsTally struct {
	mu        sync.Mutex
	starts    int
	dones     int
	returned  map[*dlock.Lease]bool // leases CallDone of a lock call returned
	ended     map[*dlock.Lease]error
	endOrder  []string
	renewErrs []error
	renewLat  []time.Duration
}

func newObsTally() *obsTally {
	return &obsTally{returned: map[*dlock.Lease]bool{}, ended: map[*dlock.Lease]error{}}
}

func (z *obsTally) observer() dlock.Observer {
	return dlock.Observer{
		CallStart: func(ctx context.Context, c dlock.Call) context.Context {
			z.mu.Lock()
			z.starts++
			z.mu.Unlock()
			return ctx
		},
		CallDone: func(ctx context.Context, c dlock.Call, res dlock.CallResult) {
			l, err := res.Lease, res.Err
			z.mu.Lock()
			z.dones++
			if c.Method != "Unlock" && l != nil && err == nil {
				z.returned[l] = true
				z.endOrder = append(z.endOrder, "returned")
			}
			z.mu.Unlock()
		},
		LeaseEnded: func(e dlock.LeaseEnd) {
			z.mu.Lock()
			z.ended[e.Lease] = e.Err
			z.endOrder = append(z.endOrder, "ended")
			z.mu.Unlock()
		},
		Renewed: func(r dlock.Renewal) {
			z.mu.Lock()
			z.renewErrs = append(z.renewErrs, r.Err)
			z.renewLat = append(z.renewLat, r.Latency)
			z.mu.Unlock()
		},
	}
}

// cancelAfterAcquire is a go-redis hook that, once armed, runs f after the next EVALSHA/EVAL
// script reply that took a lock (the acquire script of a Lock), then disarms.
type cancelAfterAcquire struct {
	armed atomic.Bool
	f     func()
}

func (h *cancelAfterAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cancelAfterAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		n := strings.ToLower(cmd.Name())
		if n != "evalsha" && n != "eval" || err != nil {
			return err
		}
		// the acquire's reply: [1, token, ...]
		if c, ok := cmd.(*redis.Cmd); ok {
			if v, ok := c.Val().([]any); ok && len(v) > 1 && v[0] == int64(1) && h.armed.CompareAndSwap(true, false) {
				h.f()
			}
		}
		return err
	}
}
func (h *cancelAfterAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// LeaseEnded is told only of leases a caller was handed: a Lock whose ctx ends while the
// acquire is in flight gets no lease (CallDone: nil, ErrNotObtained), and the lease dlock made
// and gives back is not reported (a "leases held" gauge kept from CallDone and LeaseEnded
// would drift).
func TestObserverNotToldOfLeasesNeverHandedOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []dlock.Option
	}{{"plain", []dlock.Option{dlock.WithoutCohort()}}, {"cohort", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			z := newObsTally()
			rdb := redistest.Client(t)
			hook := &cancelAfterAcquire{}
			rdb.AddHook(hook)
			c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithObserver(z.observer()))
			defer c.Close(context.Background())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hook.f = cancel
			hook.armed.Store(true)
			l, err := c.Mutex(redistest.Name(t), tc.opts...).Lock(ctx)
			if l != nil || !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("Lock with a ctx that ended during the acquire: %v, %v", l, err)
			}
			time.Sleep(50 * time.Millisecond)
			z.mu.Lock()
			defer z.mu.Unlock()
			for el, e := range z.ended {
				if !z.returned[el] {
					t.Errorf("LeaseEnded(err=%v) for a lease no CallDone returned (CallDone saw %d leases, LeaseEnded %d)", e, len(z.returned), len(z.ended))
				}
			}
		})
	}
}

// blockRenewal is a go-redis hook that, once armed, stops the next pipeline (the watchdog's
// renewal batch) before it is sent, signals reached and waits for release.
type blockRenewal struct {
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func (h *blockRenewal) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *blockRenewal) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *blockRenewal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.CompareAndSwap(true, false) {
			close(h.reached)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// A renewal in flight when the holder unlocks is refused by Redis (the hold is gone, released
// by its owner): Renewed does not report that as ErrLeaseLost, since nothing was lost.
func TestObserverNoLossForARenewalOvertakenByUnlock(t *testing.T) {
	z := newObsTally()
	rdb := redistest.Client(t)
	hook := &blockRenewal{reached: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(hook)
	c := dlock.New(rdb, dlock.OnGoRedis(), dlock.WithObserver(z.observer()), dlock.WithTTL(200*time.Millisecond))
	defer c.Close(context.Background())
	ctx := ctxT(t)
	l, err := c.Mutex(redistest.Name(t), dlock.WithoutCohort()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(true)
	select {
	case <-hook.reached:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal within 5s")
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	close(hook.release)
	time.Sleep(100 * time.Millisecond)
	z.mu.Lock()
	defer z.mu.Unlock()
	if e := z.ended[l]; e != nil {
		t.Fatalf("LeaseEnded: %v, want nil", e)
	}
	for _, e := range z.renewErrs {
		if errors.Is(e, dlock.ErrLeaseLost) {
			t.Errorf("Renewed reported %v for a lease its holder unlocked (LeaseEnded: nil)", e)
		}
	}
}

// countWarn counts warnings whose message contains text.
func (h *logRecords) countWarn(text string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, text) {
			n++
		}
	}
	return n
}

// A fixed lease (WithFixedLease) that runs out its TTL, as documented, is not logged as lost.
func TestLoggerQuietWhenAFixedLeaseRunsOut(t *testing.T) {
	logs := newLogRecords()
	c, _ := newClient(t, dlock.WithLogger(slog.New(logs)))
	ctx := ctxT(t)
	for i := range 5 {
		_ = i
		l, err := c.Mutex(redistest.Name(t), dlock.WithFixedLease(), dlock.WithTTL(50*time.Millisecond)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, l, 5*time.Second)
	}
	time.Sleep(50 * time.Millisecond) // the warning follows Done
	if n := logs.countWarn("lease lost"); n > 0 {
		t.Errorf("%d 'lease lost' warnings for 5 fixed leases that ran out their TTL as documented", n)
	}
}

// One Redis hold lost is one warning, however many leases were on it: a lease and its
// re-entries, the readers sharing a Client's read hold.
func TestLoggerWarnsOncePerLostHold(t *testing.T) {
	t.Run("reentry", func(t *testing.T) {
		logs := newLogRecords()
		c, raw := newClient(t, dlock.WithLogger(slog.New(logs)))
		ctx := ctxT(t)
		name := redistest.Name(t)
		m := c.Mutex(name)
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ls []*dlock.Lease
		for range 9 {
			r, err := m.Lock(l.Context())
			if err != nil {
				t.Fatal(err)
			}
			ls = append(ls, r)
		}
		if err := raw.Del(ctx, lockKey(name)).Err(); err != nil {
			t.Fatal(err)
		}
		waitDone(t, l, 5*time.Second)
		for _, r := range ls {
			waitDone(t, r, 5*time.Second)
		}
		if n := logs.countWarn("lease lost"); n != 1 {
			t.Errorf("one lost Redis hold (one lease and 9 re-entries) logged %d 'lease lost' warnings", n)
		}
	})
	t.Run("readers", func(t *testing.T) {
		logs := newLogRecords()
		c, raw := newClient(t, dlock.WithLogger(slog.New(logs)))
		ctx := ctxT(t)
		name := redistest.Name(t)
		rw := c.RWMutex(name)
		const n = 20
		ls := make([]*dlock.Lease, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				l, err := rw.RLock(ctx)
				if err != nil {
					t.Error(err)
				}
				ls[i] = l
			})
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		if err := raw.Del(ctx, lockKey(name)).Err(); err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			waitDone(t, l, 5*time.Second)
		}
		holds := map[string]bool{}
		for _, l := range ls {
			holds[l.Owner()] = true
		}
		if w := logs.countWarn("lease lost"); w > len(holds) {
			t.Errorf("%d Redis read holds lost, %d 'lease lost' warnings", len(holds), w)
		}
	})
}

// Renewed's latency is how long Redis took to answer: for the holds of one batch, the batch's
// round trip, not counting the earlier holds' callbacks.
func TestObserverRenewalLatencyIsTheRoundTrip(t *testing.T) {
	z := newObsTally()
	obs := z.observer()
	inner := obs.Renewed
	obs.Renewed = func(r dlock.Renewal) {
		inner(r)
		time.Sleep(5 * time.Millisecond) // "quick" enough for one callback
	}
	c, _ := newClient(t, dlock.WithObserver(obs), dlock.WithTTL(400*time.Millisecond))
	ctx := ctxT(t)
	name := redistest.Name(t)
	var names []string
	for i := range 8 {
		names = append(names, name+"."+string(rune('a'+i)))
	}
	l, err := c.MultiLock(names).Lock(ctx) // one script: every member due at once, one batch
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		z.mu.Lock()
		got := len(z.renewLat)
		z.mu.Unlock()
		if got >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d renewals in 5s", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = l.Unlock(ctx)
	z.mu.Lock()
	lat := append([]time.Duration(nil), z.renewLat[:8]...)
	z.mu.Unlock()
	if spread := lat[7] - lat[0]; spread > 10*time.Millisecond {
		t.Errorf("latencies of one pipelined round trip: %v (the last includes the earlier callbacks' %v)", lat, spread)
	}
}

// Calls that fail their argument checks (a bad permit count, an invalid name) are heard too.
func TestObserverHearsInvalidCalls(t *testing.T) {
	z := newObsTally()
	c, _ := newClient(t, dlock.WithObserver(z.observer()))
	ctx := ctxT(t)
	_, err1 := c.Semaphore(redistest.Name(t), 2).TryAcquire(ctx, 3)
	_, err2 := c.Mutex("").TryLock(ctx)
	if !errors.Is(err1, dlock.ErrInvalid) || !errors.Is(err2, dlock.ErrInvalid) {
		t.Fatalf("%v / %v", err1, err2)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.starts != 2 || z.dones != 2 {
		t.Errorf("2 failed lock calls, CallStart heard %d, CallDone %d", z.starts, z.dones)
	}
}

// Re-entry is decided on the caller's context, whatever context CallStart returns (here one
// that does not derive from it, against the doc).
func TestObserverContextKeepsReentry(t *testing.T) {
	type spanKey struct{}
	obs := dlock.Observer{CallStart: func(ctx context.Context, c dlock.Call) context.Context {
		return context.WithValue(context.WithoutCancel(context.Background()), spanKey{}, c.Method)
	}}
	c, _ := newClient(t, dlock.WithObserver(obs))
	ctx := ctxT(t)
	m := c.Mutex(redistest.Name(t))
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if r, err := m.TryLock(l.Context()); err != nil {
		t.Errorf("re-entry through the lease's Context with such an observer: %v", err)
	} else {
		_ = r.Unlock(ctx)
	}
}

// A Redlock lease is renewed on every master, each renewal naming its master (Server); the
// Redlock's calls and lease are heard once (not again from the masters' Clients).
func TestObserverRedlockRenewalsNameTheirMaster(t *testing.T) {
	z := newObsTally()
	var mu sync.Mutex
	servers := map[string]bool{}
	obs := z.observer()
	obs.Renewed = func(r dlock.Renewal) {
		mu.Lock()
		servers[r.Server] = true
		mu.Unlock()
	}
	set := startRedlock(t, 3, nil, dlock.WithObserver(obs), dlock.WithTTL(400*time.Millisecond))
	ctx := ctxT(t)
	l, err := set.c.Mutex(redistest.Name(t)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, rc := range set.clients {
		want[rc.Options().Addr] = true
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got := maps.Clone(servers)
		mu.Unlock()
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewals named servers %v, want each master of %v", got, want)
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.starts != 2 || z.dones != 2 || len(z.ended) != 1 {
		t.Errorf("Redlock lease: %d CallStart, %d CallDone, %d LeaseEnded; want 2, 2, 1", z.starts, z.dones, len(z.ended))
	}
}

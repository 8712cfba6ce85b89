package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/clocktest"
	"github.com/redis/go-redis/v9"
)

// clientSpec tells a client process what to do; the driver passes it as JSON.
type clientSpec struct {
	ID      int    `json:"id"`
	LockURL string `json:"lock_url"`
	ResURL  string `json:"res_url"`
	// WriteURL, when set, is where the resource writes go (through a proxy the nemesis slows
	// down); reads and the rest go to ResURL.
	WriteURL string `json:"write_url,omitempty"`
	Workload string `json:"workload"` // "fenced", "lockset", "rw", "multi", "sem" or "latch"
	// Weak names the weakened client of a positive control: "nodel" (SET NX PX, plain DEL,
	// no owner check), "nofence" (dlock's lock, resource writes without the token check),
	// "wallclock" (dlock reading a clock without monotonic readings), "readwriter" (rw: writers
	// that take only a read lease), "early" (multi: members taken one at a time with
	// Mutexes, the last released at once; latch: a Wait that returns at a count of 1) or
	// "incr" (sem: a semaphore without leases, INCRBY/DECRBY). "" is dlock as shipped.
	Weak      string        `json:"weak,omitempty"`
	TTL       time.Duration `json:"ttl"`
	Work      time.Duration `json:"work"` // time inside the critical section
	Until     int64         `json:"until"`
	Locks     int           `json:"locks"`
	HistPath  string        `json:"hist"`
	Drift     float64       `json:"drift"`
	OpTimeout time.Duration `json:"op_timeout"`
	Renew     bool          `json:"renew,omitempty"`  // watchdog renewal instead of a fixed lease
	Try       bool          `json:"try,omitempty"`    // TryLock in a loop instead of Lock
	Extend    bool          `json:"extend,omitempty"` // call Lease.Extend in the critical section
	Clock     bool          `json:"clock,omitempty"`  // a clock whose wall reading jumps on SIGUSR1/2
	Seed      int64         `json:"seed"`             // for the choice of locks
	// ClusterAddrs, when set, are the nodes of the Redis Cluster the locks live on (a go-redis
	// ClusterClient); LockURL is not used then.
	ClusterAddrs []string `json:"cluster,omitempty"`
	// Default runs dlock as shipped: cohorting on (no WithoutCohort), Goroutines goroutines
	// taking the same locks, and re-entry through Lease.Context with probability Reenter in
	// each critical section.
	Default    bool    `json:"default,omitempty"`
	Goroutines int     `json:"goroutines,omitempty"`
	Reenter    float64 `json:"reenter,omitempty"`
}

// writeMargin is how much of its validity window a holder wants left beyond a step of work.
const writeMargin = 20 * time.Millisecond

// worker is one client goroutine's state; the goroutines of a process share everything but
// g and rng.
type worker struct {
	spec clientSpec
	r    *recorder
	rdb  redis.UniversalClient // the lock's Redis (possibly through a proxy, or a Cluster)
	res  *redis.Client         // the protected resource's Redis
	resW *redis.Client         // the same, for the writes
	c    *dlock.Client
	g    int // goroutine (1-based) in the default-mode workload, 0 otherwise
	rng  *rand.Rand
	// shared is the "shared" control's table of the leases held in this process, by lock.
	shared *sharedLeases
}

type sharedLeases struct {
	mu sync.Mutex
	m  map[int]*dlock.Lease
}

func (w *worker) rec(o op) {
	o.G = w.g
	w.r.rec(o)
}

// runClient loops acquire → work → release on random locks until spec.Until, recording every
// operation.
func runClient(spec clientSpec) error {
	r, err := newRecorder(spec.HistPath, spec.ID)
	if err != nil {
		return err
	}
	r.flush = spec.Workload == "sem" // the nemesis may SIGKILL its clients
	var rdb redis.UniversalClient
	if len(spec.ClusterAddrs) > 0 {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: spec.ClusterAddrs})
	} else {
		lockOpt, err := redis.ParseURL(spec.LockURL)
		if err != nil {
			return err
		}
		lockOpt.MaxRetries = -1 // a retry would hide a lost reply; dlock's scripts are idempotent anyway
		rdb = redis.NewClient(lockOpt)
	}
	resOpt, err := redis.ParseURL(spec.ResURL)
	if err != nil {
		return err
	}
	resOpt.MaxRetries = -1
	redis.SetLogger(quietLogger{}) // dial failures while Redis is down are expected here
	w := &worker{spec: spec, r: r, rdb: rdb, res: redis.NewClient(resOpt)}
	defer w.rdb.Close()
	defer w.res.Close()
	w.resW = w.res
	if spec.WriteURL != "" {
		wOpt, err := redis.ParseURL(spec.WriteURL)
		if err != nil {
			return err
		}
		wOpt.MaxRetries = -1
		w.resW = redis.NewClient(wOpt)
		defer w.resW.Close()
	}

	opts := []dlock.Option{dlock.WithTTL(spec.TTL), dlock.WithDrift(spec.Drift)}
	if !spec.Default {
		opts = append(opts, dlock.WithoutCohort())
	}
	if !spec.Renew {
		opts = append(opts, dlock.WithFixedLease())
	}
	if spec.Clock {
		if err := clocktest.Check(); err != nil {
			return err
		}
		clk := &clocktest.Clock{NoMonotonic: spec.Weak == "wallclock"}
		opts = append(opts, dlock.WithClock(clk.Now))
		jumps := make(chan os.Signal, 16)
		signal.Notify(jumps, syscall.SIGUSR1, syscall.SIGUSR2)
		go func() {
			for s := range jumps {
				if s == syscall.SIGUSR1 {
					clk.Jump(time.Hour)
				} else {
					clk.Jump(-time.Hour)
				}
			}
		}()
	}
	w.c = dlock.New(w.rdb, opts...)
	defer w.c.Close(context.Background())

	if spec.Goroutines <= 1 {
		w.rng = rand.New(rand.NewPCG(uint64(spec.Seed), uint64(spec.ID)))
		for mono() < spec.Until {
			w.round(w.rng.IntN(spec.Locks))
		}
		return r.close()
	}
	w.shared = &sharedLeases{m: map[int]*dlock.Lease{}}
	var wg sync.WaitGroup
	for g := 1; g <= spec.Goroutines; g++ {
		gw := *w
		gw.g = g
		gw.rng = rand.New(rand.NewPCG(uint64(spec.Seed), uint64(spec.ID*1000+g)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for mono() < spec.Until {
				gw.round(gw.rng.IntN(spec.Locks))
			}
		}()
	}
	wg.Wait()
	return r.close()
}

// held is what a client knows of the lock it holds.
type held struct {
	lock  int
	lease *dlock.Lease // nil for the "nodel" control
	acq   op
	// members are a multi-lock's locks (nil otherwise), with their tokens; extra are the
	// "early" control's other members' leases.
	members []int
	tokens  []uint64
	extra   []*dlock.Lease
	// releasing, when set, is told the release's call time just before the release is sent.
	releasing func(rc int64)

	doneAt    atomic.Int64  // when the watcher saw Done close
	falseLoss atomic.Bool   // see op.False
	watched   chan struct{} // closed when the watcher has finished
}

// watch records when the lease's Done closes and, when the lease was lost by an answer from
// Redis rather than by its safe deadline, whether its hold was in fact still there.
func (w *worker) watch(h *held) {
	h.watched = make(chan struct{})
	l := h.lease
	go func() {
		defer close(h.watched)
		<-l.Done()
		h.doneAt.Store(mono())
		err := l.Err()
		// Inspect reads a Mutex's hold: the other workloads do not measure false losses.
		mutex := w.spec.Workload == "fenced" || w.spec.Workload == "lockset"
		if !errors.Is(err, dlock.ErrLeaseLost) || deadlineLoss(err) || !mutex {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, ierr := w.c.Inspect(ctx, l.Name())
		// A hold's first token starts a block of 64 (local hand-offs of a cohort take the
		// next ones): the same owner with the block of this lease's token is the same hold.
		if ierr == nil && info.Held && info.Owner == l.Owner() && info.Token <= l.Token() && l.Token() < info.Token+64 {
			h.falseLoss.Store(true)
		}
	}()
}

// deadlineLoss reports whether a lease ended because its safe deadline passed (no renewal
// in time, a fixed lease over, a late reply): a local decision, right whatever Redis holds.
// The causes are the library's documented ones; they are unexported, so matched by text.
func deadlineLoss(err error) bool {
	s := err.Error()
	return strings.Contains(s, "safe deadline") || strings.Contains(s, "TTL ran out")
}

// finish waits for the lease's watcher and records the acquire with what it saw.
func (w *worker) finish(h *held) {
	if h.watched != nil {
		select {
		case <-h.watched:
		case <-time.After(3 * time.Second):
		}
		h.acq.DoneAt = h.doneAt.Load()
		h.acq.False = h.falseLoss.Load()
	}
	w.rec(h.acq)
}

// deadline returns the end of the validity window as the client knows it now, recording it in
// the acquire op, or 0 if the lease has ended.
func (h *held) deadline(ttl time.Duration) int64 {
	now := mono()
	if h.lease == nil {
		return h.acq.Call + safeLease(ttl)
	}
	select {
	case <-h.lease.Done():
		return 0
	default:
	}
	rem := h.lease.Remaining()
	if rem <= 0 {
		return 0
	}
	h.acq.Until = max(h.acq.Until, now+int64(rem))
	return now + int64(rem)
}

// round takes lock i, works on its resource and releases it.
func (w *worker) round(i int) {
	s := w.spec
	switch s.Workload {
	case "rw":
		w.roundRW(i)
		return
	case "multi":
		w.roundMulti(i)
		return
	case "sem":
		w.roundSem(i)
		return
	case "latch":
		w.roundLatch(i)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.OpTimeout)
	defer cancel()
	h := w.acquire(ctx, i)
	if h == nil {
		return
	}
	// Tell the nemesis who is inside the critical section, so pauses hit holders.
	_ = w.res.Set(ctx, fmt.Sprintf("holder:%d", i), s.ID, 0).Err()
	w.critical(ctx, h)
	if h.lease != nil {
		select {
		case <-h.lease.Done():
			h.acq.Lost = true
		default:
		}
	}
	w.release(ctx, h)
	w.finish(h)
}

func (w *worker) acquire(ctx context.Context, i int) *held {
	s := w.spec
	name := fmt.Sprintf("safety-%d", i)
	if s.Weak == "nodel" {
		call := mono()
		key := "weak:{" + name + "}"
		ok, err := w.rdb.SetNX(ctx, key, s.ID, s.TTL).Result()
		if err != nil || !ok {
			w.rec(op{Lock: i, Kind: "acquire", Call: call, Return: mono(), Result: failOr(err)})
			time.Sleep(time.Millisecond)
			return nil
		}
		tok, err := w.rdb.Incr(ctx, key+":token").Uint64()
		if err != nil {
			return nil // held without a token: the key expires within its TTL
		}
		h := &held{lock: i, acq: op{Lock: i, Kind: "acquire", Call: call, Return: mono(), Token: tok, Result: "ok"}}
		h.acq.Until = h.deadline(s.TTL)
		return h
	}
	m := w.c.Mutex(name)
	for {
		call := mono()
		var l *dlock.Lease
		var err error
		if s.Weak == "shared" {
			l, err = w.sharedLock(ctx, m, i)
		} else if s.Try {
			l, err = m.TryLock(ctx)
		} else {
			l, err = m.Lock(ctx)
		}
		ret := mono()
		if err != nil {
			if s.Try && errors.Is(err, dlock.ErrNotObtained) && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
				continue
			}
			w.rec(op{Lock: i, Kind: "acquire", Call: call, Return: ret, Result: outcomeOf(err, "fail")})
			time.Sleep(10 * time.Millisecond) // Redis down: do not spin on "connection refused"
			return nil
		}
		h := &held{lock: i, lease: l, acq: op{Lock: i, Kind: "acquire", Call: call, Return: ret, Token: l.Token(), Result: "ok",
			Owner: l.Owner(), Cohort: s.Default}}
		w.watch(h)
		h.deadline(s.TTL)
		return h
	}
}

// critical reads the resource, works in steps while the lease has time left for the next
// step, and writes. A pause during the last step is the classic hazard: the write goes out
// after the lease ended, and only fencing can refuse it.
func (w *worker) critical(ctx context.Context, h *held) {
	s := w.spec
	i := h.lock
	tok := h.acq.Token
	reg, counter := fmt.Sprintf("reg:%d", i), fmt.Sprintf("counter:%d", i)
	var v int64
	rc := mono()
	switch s.Workload {
	case "fenced":
		_, t, err := dlock.FencedGet(ctx, w.res, reg)
		w.rec(op{Lock: i, Kind: "read", Call: rc, Return: mono(), Token: t, Result: outcomeOf(err, "fail")})
		if err != nil {
			return
		}
	case "lockset":
		var err error
		v, err = w.res.Get(ctx, counter).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			w.rec(op{Lock: i, Kind: "incr", Call: rc, Return: mono(), Token: tok, Result: "fail"})
			return
		}
	}
	if h.lease != nil && h.members == nil && s.Reenter > 0 && w.rng.Float64() < s.Reenter {
		w.reenter(ctx, h)
	}
	step := min(s.Work, s.TTL/4)
	extended := false
	for done := time.Duration(0); done < s.Work; done += step {
		if dl := h.deadline(s.TTL); dl == 0 || dl-mono() < int64(step+writeMargin) {
			return // not enough of the lease left: a correct holder stops here
		}
		time.Sleep(step)
		if s.Extend && h.lease != nil && !extended && done+step >= s.Work/2 {
			extended = true
			ec := mono()
			err := h.lease.Extend(ctx, s.TTL)
			w.rec(op{Lock: i, Kind: "extend", Call: ec, Return: mono(), Token: tok, Acq: h.acq.Call, Result: outcomeOf(err, "fail")})
		}
	}
	wc := mono()
	switch s.Workload {
	case "fenced":
		var err error
		if s.Weak == "nofence" || s.Weak == "nodel" {
			err = w.resW.HSet(ctx, reg, "v", s.ID, "t", tok).Err()
		} else {
			err = dlock.FencedSet(ctx, w.resW, reg, s.ID, tok)
		}
		w.rec(op{Lock: i, Kind: "write", Call: wc, Return: mono(), Token: tok, Result: outcomeOf(err, "fail")})
	case "lockset":
		err := w.resW.Set(ctx, counter, v+1, 0).Err()
		w.rec(op{Lock: i, Kind: "incr", Call: rc, Return: mono(), Token: tok, Result: outcomeOf(err, "fail"), Value: v})
	}
}

// reenter takes the lock again through the held lease's context (re-entry), checks that the
// inner lease has the outer one's token and owner, and unlocks it: the outer lease must hold
// on. Anomalies are noted on the reenter op; the checker counts them.
func (w *worker) reenter(ctx context.Context, h *held) {
	s := w.spec
	rctx := h.lease.Context()
	if w.rng.IntN(2) == 0 { // a context derived from the lease's re-enters too
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(rctx, s.OpTimeout)
		defer cancel()
	}
	name := fmt.Sprintf("safety-%d", h.lock)
	lock, try := w.c.Mutex(name).Lock, w.c.Mutex(name).TryLock // another handle on the same lock
	if s.Workload == "rw" {
		// A read lease re-enters to read; a write lease to write, or to read (a downgrade).
		rw := w.c.RWMutex(name)
		lock, try = rw.Lock, rw.TryLock
		if h.acq.Mode == "r" || w.rng.IntN(2) == 0 {
			lock, try = rw.RLock, rw.TryRLock
		}
	}
	call := mono()
	var in *dlock.Lease
	var err error
	if w.rng.IntN(2) == 0 {
		in, err = lock(rctx)
	} else {
		in, err = try(rctx)
	}
	o := op{Lock: h.lock, Kind: "reenter", Call: call, Return: mono(), Token: in.Token(), Acq: h.acq.Call, Result: outcomeOf(err, "fail")}
	if err != nil {
		if h.deadline(s.TTL) > 0 {
			o.Note = "refused-while-held" // not counted as a violation: the lease may have been ending
		}
		w.rec(o)
		return
	}
	if in.Token() != h.acq.Token || in.Owner() != h.lease.Owner() {
		o.Note = "token-or-owner-differs"
	}
	h.deadline(s.TTL)
	uc := mono()
	uerr := in.Unlock(ctx)
	u := op{Lock: h.lock, Kind: "unreenter", Call: uc, Return: mono(), Token: h.acq.Token, Acq: h.acq.Call, Result: outcomeOf(uerr, "fail")}
	select {
	case <-h.lease.Done():
		if h.lease.Err() == nil {
			u.Note = "outer-let-go" // the inner Unlock ended the outer lease
		}
	default:
		if uerr != nil {
			// An inner Unlock fails only when the holding ended (lost): the outer lease must
			// end with it.
			select {
			case <-h.lease.Done():
			case <-time.After(time.Second):
				u.Note = "inner-unlock-failed-outer-held"
			}
		}
	}
	w.rec(o)
	w.rec(u)
}

// sharedLock is the "shared" control's Lock: a goroutine re-enters a lease another goroutine
// of this process holds on the lock (as if goroutines did not exclude each other), or takes
// the lock and shares its lease.
func (w *worker) sharedLock(ctx context.Context, m *dlock.Mutex, i int) (*dlock.Lease, error) {
	w.shared.mu.Lock()
	other := w.shared.m[i]
	w.shared.mu.Unlock()
	if other != nil {
		if l, err := m.Lock(other.Context()); err == nil {
			return l, nil
		}
	}
	l, err := m.Lock(ctx)
	if err == nil {
		w.shared.mu.Lock()
		w.shared.m[i] = l
		w.shared.mu.Unlock()
	}
	return l, err
}

func (w *worker) release(ctx context.Context, h *held) {
	if w.shared != nil {
		w.shared.mu.Lock()
		if w.shared.m[h.lock] == h.lease {
			delete(w.shared.m, h.lock)
		}
		w.shared.mu.Unlock()
	}
	rc := mono()
	var err error
	if h.lease == nil {
		err = w.rdb.Del(ctx, fmt.Sprintf("weak:{safety-%d}", h.lock)).Err() // deletes whoever holds it
	} else {
		h.deadline(w.spec.TTL)
		err = h.lease.Unlock(ctx)
	}
	w.rec(op{Lock: h.lock, Kind: "release", Call: rc, Return: mono(), Token: h.acq.Token, Acq: h.acq.Call, Result: outcomeOf(err, "fail")})
}

// failOr is "fail" for a refusal (err nil) and the outcome of err otherwise.
func failOr(err error) string {
	if err == nil {
		return "fail"
	}
	return outcomeOf(err, "fail")
}

// outcomeOf classifies an error: nil is ok; a reply from Redis or a refusal is fail; anything
// else (timeout, reset) is unknown, since the operation may have taken effect.
func outcomeOf(err error, refused string) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, dlock.ErrUnavailable):
		// Even a reply that says the command did not run (READONLY, MOVED, LOADING during a
		// failover) leaves a release to dlock's background retries: it may take effect later.
		return "unknown"
	case errors.Is(err, dlock.ErrNotObtained), errors.Is(err, dlock.ErrNotHeld), errors.Is(err, dlock.ErrStaleToken),
		errors.Is(err, dlock.ErrLeaseLost):
		return refused
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return refused
	}
	return "unknown"
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...interface{}) {}

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
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
	Workload string `json:"workload"` // "fenced" or "lockset"
	// Weak names the weakened client of a positive control: "nodel" (SET NX PX, plain DEL,
	// no owner check), "nofence" (dlock's lock, resource writes without the token check) or
	// "wallclock" (dlock reading a clock without monotonic readings). "" is dlock as shipped.
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
}

// writeMargin is how much of its validity window a holder wants left beyond a step of work.
const writeMargin = 20 * time.Millisecond

// worker is one client process's state.
type worker struct {
	spec clientSpec
	r    *recorder
	rdb  *redis.Client // the lock's Redis (possibly through a proxy)
	res  *redis.Client // the protected resource's Redis
	resW *redis.Client // the same, for the writes
	c    *dlock.Client
}

// runClient loops acquire → work → release on random locks until spec.Until, recording every
// operation.
func runClient(spec clientSpec) error {
	r, err := newRecorder(spec.HistPath, spec.ID)
	if err != nil {
		return err
	}
	lockOpt, err := redis.ParseURL(spec.LockURL)
	if err != nil {
		return err
	}
	lockOpt.MaxRetries = -1 // a retry would hide a lost reply; dlock's scripts are idempotent anyway
	resOpt, err := redis.ParseURL(spec.ResURL)
	if err != nil {
		return err
	}
	resOpt.MaxRetries = -1
	redis.SetLogger(quietLogger{}) // dial failures while Redis is down are expected here
	w := &worker{spec: spec, r: r, rdb: redis.NewClient(lockOpt), res: redis.NewClient(resOpt)}
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

	opts := []dlock.Option{dlock.WithTTL(spec.TTL), dlock.WithDrift(spec.Drift), dlock.WithoutCohort()}
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

	rng := rand.New(rand.NewPCG(uint64(spec.Seed), uint64(spec.ID)))
	for mono() < spec.Until {
		w.round(rng.IntN(spec.Locks))
	}
	return r.close()
}

// held is what a client knows of the lock it holds.
type held struct {
	lock  int
	lease *dlock.Lease // nil for the "nodel" control
	acq   op
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
	w.r.rec(h.acq)
}

func (w *worker) acquire(ctx context.Context, i int) *held {
	s := w.spec
	name := fmt.Sprintf("safety-%d", i)
	if s.Weak == "nodel" {
		call := mono()
		key := "weak:{" + name + "}"
		ok, err := w.rdb.SetNX(ctx, key, s.ID, s.TTL).Result()
		if err != nil || !ok {
			w.r.rec(op{Lock: i, Kind: "acquire", Call: call, Return: mono(), Result: failOr(err)})
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
		if s.Try {
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
			w.r.rec(op{Lock: i, Kind: "acquire", Call: call, Return: ret, Result: outcomeOf(err, "fail")})
			time.Sleep(10 * time.Millisecond) // Redis down: do not spin on "connection refused"
			return nil
		}
		h := &held{lock: i, lease: l, acq: op{Lock: i, Kind: "acquire", Call: call, Return: ret, Token: l.Token(), Result: "ok"}}
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
		w.r.rec(op{Lock: i, Kind: "read", Call: rc, Return: mono(), Token: t, Result: outcomeOf(err, "fail")})
		if err != nil {
			return
		}
	case "lockset":
		var err error
		v, err = w.res.Get(ctx, counter).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			w.r.rec(op{Lock: i, Kind: "incr", Call: rc, Return: mono(), Token: tok, Result: "fail"})
			return
		}
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
			w.r.rec(op{Lock: i, Kind: "extend", Call: ec, Return: mono(), Token: tok, Acq: h.acq.Call, Result: outcomeOf(err, "fail")})
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
		w.r.rec(op{Lock: i, Kind: "write", Call: wc, Return: mono(), Token: tok, Result: outcomeOf(err, "fail")})
	case "lockset":
		err := w.resW.Set(ctx, counter, v+1, 0).Err()
		w.r.rec(op{Lock: i, Kind: "incr", Call: rc, Return: mono(), Token: tok, Result: outcomeOf(err, "fail"), Value: v})
	}
}

func (w *worker) release(ctx context.Context, h *held) {
	rc := mono()
	var err error
	if h.lease == nil {
		err = w.rdb.Del(ctx, fmt.Sprintf("weak:{safety-%d}", h.lock)).Err() // deletes whoever holds it
	} else {
		h.deadline(w.spec.TTL)
		err = h.lease.Unlock(ctx)
	}
	w.r.rec(op{Lock: h.lock, Kind: "release", Call: rc, Return: mono(), Token: h.acq.Token, Acq: h.acq.Call, Result: outcomeOf(err, "fail")})
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

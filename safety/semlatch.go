package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
)

// The "sem" and "latch" workloads (issue 11). In "sem" the locks are semaphores of semPermits
// permits; a round takes 1-3 of them with Acquire, works while its lease has time left and
// gives them back. Its acquire is recorded with Mode "s" and the permits it took, so the
// checker sums the permits held at once. Before working, a holder leaves its acquire in the
// resource Redis (semHeldKey): a holder the nemesis SIGKILLs never records its lease, and
// the nemesis adds it to the history from there. In "latch" a round sets a latch's count,
// counts it down or waits for it, at random.

// semPermits is the number of permits of the sem workload's semaphores.
const semPermits = 3

// semSizes are the permit counts a round asks for, at random: mostly one, sometimes all, so
// a large request at the head of the queue meets a stream of small ones.
var semSizes = []int{1, 1, 1, 2, 3}

// latchTTL is the latches' TTL: longer than any run, so none expires while counting (the
// clients' WithTTL is the locks' short lease TTL).
const latchTTL = 10 * time.Minute

func semHeldKey(id int) string { return fmt.Sprintf("semheld:%d", id) }

// incrKey is the "incr" control's counter of permits out for semaphore i (on the lock Redis).
func incrKey(i int) string { return "semctl:{" + lockName(i) + "}" }

// roundSem takes n permits of semaphore i, works and gives them back.
func (w *worker) roundSem(i int) {
	s := w.spec
	ctx, cancel := context.WithTimeout(context.Background(), s.OpTimeout)
	defer cancel()
	n := semSizes[w.rng.IntN(len(semSizes))]
	call := mono()
	var l *dlock.Lease
	var tok uint64
	var err error
	if s.Weak == "incr" {
		tok, err = w.incrAcquire(ctx, i, n)
	} else {
		l, err = w.c.Semaphore(lockName(i), semPermits).Acquire(ctx, n)
	}
	ret := mono()
	if err != nil {
		w.rec(op{Lock: i, Kind: "acquire", Call: call, Return: ret, Result: outcomeOf(err, "fail"), Mode: "s", Permits: n, Of: semPermits})
		time.Sleep(10 * time.Millisecond)
		return
	}
	h := &held{lock: i, lease: l, acq: op{Lock: i, Kind: "acquire", Call: call, Return: ret, Token: tok, Result: "ok", Mode: "s", Permits: n, Of: semPermits}}
	if l != nil {
		h.acq.Token, h.acq.Owner = l.Token(), l.Owner()
		w.watch(h)
	}
	h.deadline(s.TTL)
	w.leave(semHeld{Acq: h.acq})
	h.releasing = func(rc int64) { w.leave(semHeld{Acq: h.acq, Release: rc}) }
	if l != nil {
		w.holdAndRelease(ctx, h)
	} else {
		_ = w.res.Set(ctx, fmt.Sprintf("holder:%d", i), s.ID, 0).Err()
		w.critical(ctx, h)
		rc := mono()
		h.releasing(rc)
		err := w.rdb.DecrBy(ctx, incrKey(i), int64(n)).Err()
		w.rec(op{Lock: i, Kind: "release", Call: rc, Return: mono(), Token: tok, Acq: call, Result: outcomeOf(err, "fail")})
		w.finish(h)
	}
	_ = w.res.Del(context.Background(), semHeldKey(s.ID)).Err()
}

// semHeld is what a holder leaves in the resource Redis (semHeldKey) for the nemesis, should
// it be killed before recording its lease: the acquire and, once it sends its release, the
// release's call time (the release may then have taken effect, or not).
type semHeld struct {
	Acq     op    `json:"acq"`
	Release int64 `json:"release,omitempty"`
}

// leave writes what the nemesis finds of this holder's lease if it kills it. When the release
// cannot be noted, the record is taken back: the nemesis would take the lease for held to its
// end, which would be wrong (it then misses the lease instead).
func (w *worker) leave(sh semHeld) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	sh.Acq.G = w.g // as rec stamps it, so the merge knows the lease for recorded
	b, _ := json.Marshal(sh)
	if err := w.res.Set(ctx, semHeldKey(w.spec.ID), b, 0).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "safety client: note the held permits:", err)
		if sh.Release > 0 {
			_ = w.res.Del(context.Background(), semHeldKey(w.spec.ID)).Err()
		}
	}
}

// incrAcquire is the "incr" control's semaphore, without leases: INCRBY the count of permits
// out, and DECRBY back and retry while that made more than semPermits. A holder that dies
// never gives its permits back. The token comes from a counter beside it.
func (w *worker) incrAcquire(ctx context.Context, i, n int) (uint64, error) {
	for {
		v, err := w.rdb.IncrBy(ctx, incrKey(i), int64(n)).Result()
		if err != nil {
			return 0, err
		}
		if v <= semPermits {
			return w.rdb.Incr(ctx, incrKey(i)+":token").Uint64()
		}
		if err := w.rdb.DecrBy(ctx, incrKey(i), int64(n)).Err(); err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", dlock.ErrNotObtained, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// roundLatch sets latch i's count (1-3), counts it down or waits for it to reach zero.
func (w *worker) roundLatch(i int) {
	s := w.spec
	d := w.c.Latch(lockName(i), dlock.WithTTL(latchTTL))
	ctx, cancel := context.WithTimeout(context.Background(), min(s.OpTimeout, 500*time.Millisecond))
	defer cancel()
	call := mono()
	switch r := w.rng.Float64(); {
	case r < 0.15:
		count := 1 + w.rng.IntN(3)
		ok, err := d.TrySetCount(ctx, count)
		res := outcomeOf(err, "fail")
		if err == nil && !ok {
			res = "fail"
		}
		w.rec(op{Lock: i, Kind: "set", Call: call, Return: mono(), Result: res, Value: int64(count)})
	case r < 0.55:
		err := d.CountDown(ctx)
		w.rec(op{Lock: i, Kind: "down", Call: call, Return: mono(), Result: outcomeOf(err, "fail")})
	default:
		var err error
		if s.Weak == "early" {
			err = earlyWait(ctx, d)
		} else {
			err = d.Wait(ctx)
		}
		w.rec(op{Lock: i, Kind: "wait", Call: call, Return: mono(), Result: outcomeOf(err, "fail")})
	}
	time.Sleep(time.Duration(w.rng.IntN(5)) * time.Millisecond)
}

// earlyWait is the "early" control's Wait: it returns once the count is at most 1, one
// CountDown too soon.
func earlyWait(ctx context.Context, d *dlock.Latch) error {
	for {
		n, err := d.Count(ctx)
		if err != nil {
			return err
		}
		if n <= 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(dlock.ErrNotObtained, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

package main

// The semaphore scenario (section 12): dlock's Semaphore against a Mutex on the same workload
// and against the sorted-set "fair semaphore" recipe (timestamps + a counter) widely
// described for Redis, written here as a peer.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

const (
	semID      = "sem-4x8"
	semPermits = 4
	// keySemOwn: one semaphore (or lock) for every goroutine, one counter per goroutine: the
	// holders of a semaphore's permits run at once, each on its own data.
	keySemOwn = "shared, own counter"
	// zsetTimeout is the recipe's permit timeout: a holder that died is dropped after it.
	zsetTimeout = 10 * time.Second
)

// semLibs: dlock's Semaphore, dlock's Mutex on the same workload (one at a time), and the
// sorted-set recipe at three retry delays.
var semLibs = []string{"dlock-sem4", "dlock", "zsetsem-1ms", "zsetsem-10ms", "zsetsem-100ms"}

// newSemLib returns the semaphore libraries of this file, or nil for another name.
func newSemLib(name string, e *env) lib {
	switch name {
	case "dlock-sem4":
		return &dlockSemLib{c: dlock.New(e.rdb)}
	}
	if d, ok := strings.CutPrefix(name, "zsetsem-"); ok {
		if delay, err := time.ParseDuration(d); err == nil {
			return &zsetSemLib{rdb: e.rdb, delay: delay}
		}
	}
	return nil
}

// --- dlock: one Client per process, one Semaphore handle per goroutine, one permit per call.

type dlockSemLib struct{ c *dlock.Client }

func (d *dlockSemLib) newLocker(context.Context) (locker, error) { return &dlockSemLocker{c: d.c}, nil }
func (d *dlockSemLib) close(ctx context.Context)                 { _ = d.c.Close(ctx) }

type dlockSemLocker struct {
	c   *dlock.Client
	key string
	s   *dlock.Semaphore
	l   *dlock.Lease
}

func (d *dlockSemLocker) lock(ctx context.Context, key string) error {
	if d.s == nil || d.key != key {
		d.s, d.key = d.c.Semaphore(key, semPermits), key
	}
	l, err := d.s.Acquire(ctx, 1)
	if err != nil {
		return err
	}
	d.l = l
	return nil
}

func (d *dlockSemLocker) unlock(ctx context.Context) error {
	l := d.l
	d.l = nil
	if err := l.Err(); err != nil {
		_ = l.Unlock(ctx)
		return fmt.Errorf("lease lost while held: %w", err)
	}
	return l.Unlock(ctx)
}

func (d *dlockSemLocker) close() {}

// --- The fair semaphore recipe: a sorted set of holders by acquire time (to drop those past
// the timeout), a sorted set of holders by a counter's value (the order of arrival), and the
// counter. A caller takes the counter's next value, joins both sets and holds a permit if its
// rank in the counter order is below the limit; otherwise it leaves and tries again after the
// retry delay. One script per attempt.

var zsetAcquire = redis.NewScript(`
local t, owners, ctr = KEYS[1], KEYS[2], KEYS[3]
local now, timeout, limit, id = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', t, '-inf', now - timeout)
redis.call('ZINTERSTORE', owners, 2, owners, t, 'WEIGHTS', 1, 0)
local c = redis.call('INCR', ctr)
redis.call('ZADD', t, now, id)
redis.call('ZADD', owners, c, id)
if redis.call('ZRANK', owners, id) < limit then
  return 1
end
redis.call('ZREM', t, id)
redis.call('ZREM', owners, id)
return 0`)

var zsetRelease = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('ZREM', KEYS[2], ARGV[1])`)

type zsetSemLib struct {
	rdb   *redis.Client
	delay time.Duration
}

var zsetIDs atomic.Uint64

func (z *zsetSemLib) newLocker(context.Context) (locker, error) {
	return &zsetSemLocker{rdb: z.rdb, delay: z.delay}, nil
}
func (z *zsetSemLib) close(context.Context) {}

type zsetSemLocker struct {
	rdb   *redis.Client
	delay time.Duration
	keys  []string
	id    string
}

func (z *zsetSemLocker) lock(ctx context.Context, key string) error {
	z.keys = []string{"{" + key + "}:sem", "{" + key + "}:sem:owner", "{" + key + "}:sem:counter"}
	z.id = strconv.FormatUint(zsetIDs.Add(1), 36) + "." + strconv.Itoa(os.Getpid())
	for {
		ok, err := zsetAcquire.Run(ctx, z.rdb, z.keys, float64(time.Now().UnixMicro())/1e6,
			zsetTimeout.Seconds(), semPermits, z.id).Int()
		if err != nil {
			return err
		}
		if ok == 1 {
			return nil
		}
		if err := retryPause(ctx, z.delay); err != nil {
			return err
		}
	}
}

func (z *zsetSemLocker) unlock(ctx context.Context) error {
	n, err := zsetRelease.Run(ctx, z.rdb, z.keys, z.id).Int()
	if err == nil && n == 0 {
		return errors.New("zsetsem: permit already gone at release")
	}
	return err
}

func (z *zsetSemLocker) close() {}

// scenarioByID returns the scenario with the id.
func scenarioByID(id string) *scenario {
	for i := range scenarios {
		if scenarios[i].ID == id {
			return &scenarios[i]
		}
	}
	return nil
}

// semStats sweeps the holds of a semaphore run in time order (acquired at Acquired[i], released
// from Unlocking[i], one clock: every process runs on this host): the most holders at once,
// and the wake-up latencies, each from a release that freed a permit of a full semaphore to
// the next acquisition (the woken caller's return).
func semStats(res []*workerResult, permits int) (most int, wakes []int64) {
	type ev struct {
		at  int64
		acq bool
	}
	var evs []ev
	for _, r := range res {
		for i := range r.Acquired {
			evs = append(evs, ev{r.Acquired[i], true}, ev{r.Unlocking[i], false})
		}
	}
	// At equal times the release comes first: a hand-off measured at 0, not an overlap.
	slices.SortFunc(evs, func(a, b ev) int {
		if c := compareInt64(a.at, b.at); c != 0 {
			return c
		}
		if a.acq == b.acq {
			return 0
		}
		if a.acq {
			return 1
		}
		return -1
	})
	held := 0
	var freed []int64 // releases of a full semaphore not yet followed by an acquisition
	for _, e := range evs {
		if e.acq {
			held++
			most = max(most, held)
			if len(freed) > 0 {
				wakes = append(wakes, e.at-freed[0])
				freed = freed[1:]
			}
			continue
		}
		if held == permits {
			freed = append(freed, e.at)
		}
		held--
	}
	slices.Sort(wakes)
	return most, wakes
}

// semTable prints the semaphore section's table.
func (rp *report) semTable(b *strings.Builder, rs []*runResult) {
	p := func(f string, a ...any) { fmt.Fprintf(b, f, a...) }
	p("Every goroutine loops on one name; **dlock-sem4**: `Semaphore(name, %d).Acquire(ctx, 1)`, its critical section "+
		"GET + 2 ms + SET of the goroutine's own counter (holders run at once, each on its own data); **dlock**: a `Mutex` "+
		"on the same workload (one holder at a time, the ideal semaphore being %d× faster); **zsetsem-D**: the sorted-set fair "+
		"semaphore recipe (a sorted set of holders by time, one by a counter's order, the counter; a caller holds a permit "+
		"if its rank is below %d, else leaves and retries after D), one script per attempt. *most at once*: the most holds "+
		"overlapping in time (from the workers' timestamps, one host clock); *wake-up*: from the release that freed a permit "+
		"of a full semaphore to the next acquisition's return.\n\n", semPermits, semPermits, semPermits)
	p("| library | ops/s | wait p50 | wait p99 | Jain | most at once | wake-up p50 | wake-up p99 | cmds/acq | lost | errors |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Failed != "" {
			p("| %s | failed: %s ||||||||||\n", r.Library, mdEscape(r.Failed))
			continue
		}
		wake50, wake99 := "–", "–"
		if r.WakeP50us != nil {
			wake50, wake99 = fmtUs(*r.WakeP50us), fmtUs(*r.WakeP99us)
		}
		p("| %s | %.0f | %s | %s | %.3f | %d | %s | %s | %.2f | %s | %s |\n", r.Library, r.OpsPerSec,
			fmtUs(r.WaitP50us), fmtUs(r.WaitP99us), r.Jain, r.MostAtOnce, wake50, wake99, r.CmdsPerAcq, lostStr(r), errStr(r))
	}
	p("\n")
}

// semTargets adds the semaphore targets to the targets table.
func (rp *report) semTargets(row func(t, d, ref, res string)) {
	s := rp.find(semID, "dlock-sem4")
	if s == nil || s.Failed != "" {
		return
	}
	if m := rp.find(semID, "dlock"); m != nil && m.Failed == "" {
		row(fmt.Sprintf("semaphore of %d, 4×8: ops/s vs dlock Mutex (≥ 3.5×)", semPermits), fmt.Sprintf("%.0f", s.OpsPerSec),
			fmt.Sprintf("dlock Mutex %.0f", m.OpsPerSec), ratio(s.OpsPerSec, m.OpsPerSec)+", "+check(s.OpsPerSec >= 3.5*m.OpsPerSec))
	}
	var best *runResult
	for _, r := range rp.ofScenario(semID) {
		if strings.HasPrefix(r.Library, "zsetsem-") && r.Failed == "" && (best == nil || r.OpsPerSec > best.OpsPerSec) {
			best = r
		}
	}
	if best != nil {
		row("semaphore 4×8: ops/s vs best sorted-set semaphore (≥ 2×)", fmt.Sprintf("%.0f", s.OpsPerSec),
			fmt.Sprintf("%s %.0f", best.Library, best.OpsPerSec), ratio(s.OpsPerSec, best.OpsPerSec)+", "+check(s.OpsPerSec >= 2*best.OpsPerSec))
	}
	row("semaphore 4×8: Jain (≥ 0.99)", fmt.Sprintf("%.3f", s.Jain), "", check(s.Jain >= 0.99))
	if s.WakeP50us != nil {
		row("semaphore 4×8: wake-up p50 (≤ 1 ms)", fmtUs(*s.WakeP50us)+" (p99 "+fmtUs(*s.WakeP99us)+")", "", check(*s.WakeP50us <= 1000))
	}
	row(fmt.Sprintf("semaphore 4×8: most holders at once (≤ %d)", semPermits), strconv.Itoa(s.MostAtOnce), "", check(s.MostAtOnce <= semPermits))
}

package main

// The latch scenario (section 13): 1,000 goroutines in 8 processes wait on one dlock Latch; the
// driver counts it down to zero and each worker reports when each of its waits returned.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

const (
	latchID      = "latch-1000"
	latchProcs   = 8
	latchPerProc = 125
	modeLatch    = "latch" // a worker of the latch scenario
	latchTimeout = 30 * time.Second
)

var latchLibs = []string{"dlock"}

// latchReport is what a latch worker prints once its waits have all returned.
type latchReport struct {
	Returned []int64 `json:"returned"` // wall-clock ns, one per wait
	Errors   int     `json:"errors"`
	Sample   string  `json:"sample,omitempty"`
}

// latchWorker starts spec.Goroutines Waits on the latch spec.LockName, says "waiting" once all
// have started (and a moment passed for them to read the count), then reports their returns.
func latchWorker(spec workerSpec, in *bufio.Scanner) error {
	rdb, err := newRedis(spec.RedisURL, 16)
	if err != nil {
		return err
	}
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), latchTimeout)
	defer cancel()
	d := c.Latch(spec.LockName)
	rep := latchReport{Returned: make([]int64, spec.Goroutines)}
	var mu sync.Mutex
	var started, wg sync.WaitGroup
	for g := range spec.Goroutines {
		started.Add(1)
		wg.Go(func() {
			started.Done()
			err := d.Wait(ctx)
			now := time.Now().UnixNano()
			mu.Lock()
			defer mu.Unlock()
			rep.Returned[g] = now
			if err != nil {
				rep.Errors++
				rep.Sample = err.Error()
			}
		})
	}
	started.Wait()
	say("waiting")
	wg.Wait()
	b, _ := json.Marshal(rep)
	say("done %s", b)
	drainStdin(in)
	return nil
}

// runLatch sets the latch to 1, starts the workers, waits until every process listens on the
// latch's channel and its waiters have had time to read the count, counts it down at t0 and
// collects the returns.
func (d *driver) runLatch(idx int, pr plannedRun) *runResult {
	r := &runResult{Library: pr.lib, Scenario: latchID, Processes: latchProcs, Goroutines: latchPerProc}
	prefix := fmt.Sprintf("bench-%02d-%s", idx, randHex(3))
	defer d.cleanup(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 2*latchTimeout)
	defer cancel()
	rdb := redis.NewClient(d.opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	name := prefix + ":latch"
	latch := c.Latch(name)
	if _, err := latch.TrySetCount(ctx, 1); err != nil {
		r.Failed = err.Error()
		return r
	}
	var ws []*workerProc
	for p := range latchProcs {
		w, err := d.spawn(workerSpec{Mode: modeLatch, Lib: pr.lib, RedisURL: d.redisURL, Prefix: prefix, Proc: p,
			Goroutines: latchPerProc, LockName: name, Duration: latchTimeout})
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		defer w.finish(5 * time.Second)
		ws = append(ws, w)
	}
	for _, w := range ws {
		if _, err := w.expect("waiting", time.Now().Add(30*time.Second)); err != nil {
			r.Failed = err.Error()
			return r
		}
	}
	ch := "dlock:{" + name + "}:released"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, err := rdb.PubSubNumSub(ctx, ch).Result(); err == nil && n[ch] >= latchProcs {
			break
		}
		if time.Now().After(deadline) {
			r.Failed = "the workers never all subscribed to the latch's channel"
			return r
		}
	}
	time.Sleep(500 * time.Millisecond) // the waiters read the count (1) and sleep: no event tells the driver
	t0 := time.Now().UnixNano()
	if err := latch.CountDown(ctx); err != nil {
		r.Failed = err.Error()
		return r
	}
	var lat []int64
	for _, w := range ws {
		line, err := w.expect("done", time.Now().Add(latchTimeout))
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		var rep latchReport
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "done ")), &rep); err != nil {
			r.Failed = err.Error()
			return r
		}
		r.LockErrors += int64(rep.Errors)
		if rep.Sample != "" && len(r.ErrorSample) < 3 {
			r.ErrorSample = append(r.ErrorSample, rep.Sample)
		}
		for _, at := range rep.Returned {
			lat = append(lat, at-t0)
		}
	}
	slices.Sort(lat)
	r.Ops = int64(len(lat))
	r.WaitP50us = us(percentile(lat, 0.50))
	r.WaitP99us = us(percentile(lat, 0.99))
	if len(lat) > 0 {
		r.WaitMaxus = us(lat[len(lat)-1])
	}
	return r
}

// latchSection prints section 13.
func (rp *report) latchSection(b *strings.Builder) {
	rs := rp.ofScenario(latchID)
	if len(rs) == 0 {
		return
	}
	p := func(f string, a ...any) { fmt.Fprintf(b, f, a...) }
	p("## 13. Latch: %d waiters in %d processes released by the last CountDown\n\n", latchProcs*latchPerProc, latchProcs)
	p("The driver sets a `Latch` to 1; %d worker processes start %d goroutines each on `Wait`; once every process "+
		"listens on the latch's channel (PUBSUB NUMSUB) and half a second has passed for the waits to read the count, the "+
		"driver calls `CountDown` at t0. *release*: each Wait's return − t0 (one host clock).\n\n", latchProcs, latchPerProc)
	p("| library | waits returned | release p50 | release p99 | release max | errors |\n|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Failed != "" {
			p("| %s | failed: %s |||||\n", r.Library, mdEscape(r.Failed))
			continue
		}
		p("| %s | %d | %s | %s | %s | %d |\n", r.Library, r.Ops, fmtUs(r.WaitP50us), fmtUs(r.WaitP99us), fmtUs(r.WaitMaxus), r.LockErrors)
	}
	p("\n")
}

// latchTargets adds the latch target to the targets table.
func (rp *report) latchTargets(row func(t, d, ref, res string)) {
	if r := rp.find(latchID, "dlock"); r != nil && r.Failed == "" {
		row(fmt.Sprintf("latch: %d waiters in %d processes released, p99 (≤ 10 ms)", latchProcs*latchPerProc, latchProcs),
			fmtUs(r.WaitP99us)+" (p50 "+fmtUs(r.WaitP50us)+", max "+fmtUs(r.WaitMaxus)+")", "",
			check(r.WaitP99us <= 10e3 && r.Ops == latchProcs*latchPerProc && r.LockErrors == 0))
	}
}

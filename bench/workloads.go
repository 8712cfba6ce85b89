package main

// The read-heavy (RWMutex) and multi-lock (MultiLock) scenarios: worker loops whose
// operations are not all alike, so they record reads and writes, or the names taken, apart.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Workloads (scenario.Workload); "" is the plain mutex loop of worker.go.
const (
	workRW    = "rw"    // one name; 1 op in 10 writes (GET+SET counter), the others read (GET, 1 ms)
	workMulti = "multi" // 2 or 3 random names of multiNames, GET+SET of each name's counter
)

const (
	rwWriteEvery = 10               // one write in every block of this many operations, at a random place
	rwReadHold   = time.Millisecond // a read's critical section: GET, then this long
	multiNames   = 16
	// stuckAfter bounds one multi-lock wait: a call not done by then is given up and counted as
	// a deadlock. No correct lock needs that long here; a real deadlock would never end.
	stuckAfter = 2 * time.Second
)

func multiName(prefix string, i int) string    { return fmt.Sprintf("%s:m%02d", prefix, i) }
func multiCounter(prefix string, i int) string { return fmt.Sprintf("%s:counter:m%02d", prefix, i) }

// mixWorker runs a rw or multi scenario in one worker process; see loopWorker.
func mixWorker(spec workerSpec, in *bufio.Scanner) error {
	res := &workerResult{Proc: spec.Proc, Counts: make([]int64, spec.Goroutines),
		WriteCounts: make([]int64, spec.Goroutines), Incr: map[string]int64{}}
	fail := func(err error) error {
		say("failed %s", strings.ReplaceAll(err.Error(), "\n", " "))
		drainStdin(in)
		return err
	}
	rdb, err := newRedis(spec.RedisURL, spec.Goroutines+8)
	if err != nil {
		return fail(err)
	}
	defer rdb.Close()
	e := &env{redisURL: spec.RedisURL, rdb: rdb, pgURL: spec.PGURL}
	setupCtx, cancelSetup := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelSetup()
	c := dlock.New(rdb)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
	rws := make([]rwLocker, spec.Goroutines)
	mls := make([]multiLocker, spec.Goroutines)
	for g := range spec.Goroutines {
		if spec.Workload == workRW {
			rws[g], err = newRWLocker(setupCtx, spec.Lib, e, c)
			if err == nil {
				defer rws[g].close()
			}
		} else {
			mls[g], err = newMultiLocker(spec.Lib, e, c)
			if err == nil {
				defer mls[g].close()
			}
		}
		if err != nil {
			return fail(err)
		}
	}
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Go(func() { _ = rdb.Ping(setupCtx).Err() })
	}
	wg.Wait()

	say("ready")
	start, err := awaitStart(in)
	if err != nil {
		return err
	}
	end := start.Add(spec.Duration)
	runCtx, cancelRun := context.WithDeadline(context.Background(), end)
	defer cancelRun()
	tailCtx, cancelTail := context.WithDeadline(context.Background(), end.Add(20*time.Second))
	defer cancelTail()

	type gres struct {
		waits, writeWaits, readWaits []int64
		cut                          int64
		stuck                        int64
		gets, sets                   int64
		incr                         map[string]int64
		lockErrs, unlockErrs, csErrs int64
		errs                         []string
	}
	per := make([]gres, spec.Goroutines)
	for g := 0; g < spec.Goroutines; g++ {
		wg.Go(func() {
			r := &per[g]
			r.incr = map[string]int64{}
			note := func(err error) {
				if len(r.errs) < 3 {
					r.errs = append(r.errs, err.Error())
				}
			}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(spec.Proc<<16|g)))
			writeAt := rng.IntN(rwWriteEvery)
			idx := make([]int, multiNames)
			for i := range idx {
				idx[i] = i
			}
			for n := 0; time.Now().Before(end); n++ {
				var (
					write bool
					names []string
					ctrs  []string
					lerr  error
				)
				t0 := time.Now()
				opCtx, cancelOp := runCtx, context.CancelFunc(func() {})
				if spec.Workload == workRW {
					if n%rwWriteEvery == 0 && n > 0 {
						writeAt = rng.IntN(rwWriteEvery)
					}
					write = n%rwWriteEvery == writeAt
					lerr = rws[g].lock(runCtx, lockKey(spec.Prefix), write)
					ctrs = []string{counterKey(spec.Prefix)}
				} else {
					k := 2 + rng.IntN(2)
					rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
					names, ctrs = make([]string, k), make([]string, k)
					for i := range k {
						names[i], ctrs[i] = multiName(spec.Prefix, idx[i]), multiCounter(spec.Prefix, idx[i])
					}
					opCtx, cancelOp = context.WithTimeout(runCtx, stuckAfter)
					lerr = mls[g].lock(opCtx, names)
					write = true
				}
				cancelOp()
				t1 := time.Now()
				if lerr != nil {
					if runCtx.Err() != nil {
						r.cut = int64(t1.Sub(t0))
						break
					}
					if errors.Is(lerr, context.DeadlineExceeded) || errors.Is(opCtx.Err(), context.DeadlineExceeded) {
						r.stuck++
						continue
					}
					r.lockErrs++
					note(lerr)
					_ = retryPause(runCtx, 10*time.Millisecond)
					continue
				}
				var cerr error
				if write {
					for _, ctr := range ctrs {
						if cerr = getSet(tailCtx, rdb, ctr); cerr != nil {
							break
						}
						r.gets++
						r.sets++
						r.incr[ctr]++
					}
				} else {
					cerr = rdb.Get(tailCtx, ctrs[0]).Err()
					if errors.Is(cerr, redis.Nil) {
						cerr = nil
					}
					r.gets++
					time.Sleep(rwReadHold)
				}
				if cerr != nil {
					r.csErrs++
					note(cerr)
				}
				var uerr error
				if spec.Workload == workRW {
					uerr = rws[g].unlock(tailCtx)
				} else {
					uerr = mls[g].unlock(tailCtx)
				}
				if uerr != nil {
					r.unlockErrs++
					note(uerr)
				}
				w := int64(t1.Sub(t0))
				res.Counts[g]++
				r.waits = append(r.waits, w)
				if write && spec.Workload == workRW {
					res.WriteCounts[g]++
					r.writeWaits = append(r.writeWaits, w)
				} else if !write {
					r.readWaits = append(r.readWaits, w)
				}
			}
		})
	}
	wg.Wait()
	for _, r := range per {
		res.Waits = append(res.Waits, r.waits...)
		res.WriteWaits = append(res.WriteWaits, r.writeWaits...)
		res.ReadWaits = append(res.ReadWaits, r.readWaits...)
		if r.cut > 0 {
			res.CutWaits = append(res.CutWaits, r.cut)
		}
		res.Stuck += r.stuck
		res.Gets += r.gets
		res.Sets += r.sets
		for k, v := range r.incr {
			res.Incr[k] += v
		}
		res.LockErrs += r.lockErrs
		res.UnlockErr += r.unlockErrs
		res.CSErrs += r.csErrs
		for _, e := range r.errs {
			if len(res.ErrSample) < 5 {
				res.ErrSample = append(res.ErrSample, e)
			}
		}
	}
	res.HWMKB = procStatusKB("VmHWM")
	if err := writeResult(spec.ResultPath, res); err != nil {
		return err
	}
	say("done")
	drainStdin(in)
	return nil
}

// getSet is the write: a non-atomic read-modify-write of a counter (an overlap of two
// writers, or of a writer and a holder of the same name, loses an increment).
func getSet(ctx context.Context, rdb *redis.Client, counter string) error {
	v, err := rdb.Get(ctx, counter).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return rdb.Set(ctx, counter, v+1, 0).Err()
}

// mixResults fills the rw/multi fields of a run from its workers' results: reads and writes
// apart, writer fairness, deadlocks, and lost increments per counter.
func (d *driver) mixResults(ctx context.Context, r *runResult, sc *scenario, res []*workerResult,
	before, after serverStats) error {
	var writeCounts, writeWaits, readWaits []int64
	var gets, sets, stuck int64
	incr := map[string]int64{}
	for _, wr := range res {
		writeCounts = append(writeCounts, wr.WriteCounts...)
		writeWaits = append(writeWaits, wr.WriteWaits...)
		readWaits = append(readWaits, wr.ReadWaits...)
		gets += wr.Gets
		sets += wr.Sets
		stuck += wr.Stuck
		for k, v := range wr.Incr {
			incr[k] += v
		}
	}
	if sc.Workload == workRW {
		sortInt64(writeWaits)
		sortInt64(readWaits)
		r.Writes, r.Reads = int64(len(writeWaits)), int64(len(readWaits))
		wp50, wp99 := us(percentile(writeWaits, 0.50)), us(percentile(writeWaits, 0.99))
		rp99 := us(percentile(readWaits, 0.99))
		wj := jain(writeCounts)
		r.WriteWaitP50us, r.WriteWaitP99us, r.ReadWaitP99us, r.WriterJain = &wp50, &wp99, &rp99, &wj
	} else {
		r.Deadlocks = &stuck
	}
	if r.Ops > 0 {
		cost := costBetween(before, after, map[string]int64{"info": 1, "get": gets, "set": sets})
		r.CmdsPerAcq = float64(cost.calls) / float64(r.Ops)
		r.ServerUsPerAcq = cost.usec / float64(r.Ops)
		r.RedisCPUUsPerAcq = cost.cpuUs / float64(r.Ops)
	}
	keys := make([]string, 0, len(incr))
	for k := range incr {
		keys = append(keys, k)
	}
	var lost int64
	if len(keys) > 0 {
		vals, err := d.stats.MGet(ctx, keys...).Result()
		if err != nil {
			return err
		}
		for i, k := range keys {
			var got int64
			if s, ok := vals[i].(string); ok {
				fmt.Sscan(s, &got)
			}
			lost += incr[k] - got
		}
	}
	r.LostIncrements = &lost
	return nil
}

// --- report

// check says whether a target is met.
func check(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func (rp *report) mixSections(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	for i := range scenarios {
		sc := &scenarios[i]
		rs := rp.ofScenario(sc.ID)
		if sc.Workload == "" || len(rs) == 0 {
			continue
		}
		p("## %s\n\n", sc.Title)
		if sc.Note != "" {
			p("%s\n\n", sc.Note)
		}
		switch sc.Workload {
		case workRW:
			if sc.ID == "rw-4x8" {
				p("Every goroutine loops on one name; in each block of %d of its operations one, at a random place, is a write "+
					"(GET+SET of the counter), the others reads (GET of the counter, then %v). **dlock-rw**: `RWMutex` (`RLock` to read, "+
					"`Lock` to write); **dlock**: a `Mutex` for both, the same workload; **pg-rw** (with PG_URL): `pg_advisory_lock_shared` "+
					"to read, `pg_advisory_lock` to write, one connection per goroutine. *ops/s* counts reads and writes; *wait* is the "+
					"Lock or RLock call; **writer Jain** is Jain's index over the goroutines' write counts (each goroutine writes one "+
					"operation in %d, so a writer kept waiting shows up as fewer writes); **lost** = writes − final counter.\n\n",
					rwWriteEvery, rwReadHold, rwWriteEvery)
			}
			p("| library | ops/s | reads | writes | read wait p99 | writer wait p50 | writer wait p99 | wait max | writer Jain | cmds/acq | CPU µs/acq | lost | errors |\n")
			p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			for _, r := range rs {
				if r.Failed != "" || r.WriteWaitP99us == nil {
					p("| %s | failed: %s ||||||||||||\n", r.Library, mdEscape(r.Failed))
					continue
				}
				cmds := fmt.Sprintf("%.2f", r.CmdsPerAcq)
				if strings.HasPrefix(r.Library, "pg") {
					cmds = "– (pg)"
				}
				p("| %s | %.0f | %d | %d | %s | %s | %s | %s | %.3f | %s | %.1f | %s | %s |\n", r.Library, r.OpsPerSec,
					r.Reads, r.Writes, fmtUs(*r.ReadWaitP99us), fmtUs(*r.WriteWaitP50us), fmtUs(*r.WriteWaitP99us),
					waitMaxStr(r), *r.WriterJain, cmds, r.RedisCPUUsPerAcq, lostStr(r), errStr(r))
			}
		case workMulti:
			p("Each operation picks 2 or 3 distinct names of %d at random, takes them all, does GET+SET of each name's "+
				"counter and releases. **dlock**: `MultiLock(names).Lock`; **redsync-chain-D** / **redislock-chain-D**: one "+
				"redsync `Mutex.LockContext` (`WithRetryDelay(D)`, called again when it gives up) or bsm/redislock `Obtain` "+
				"(`LinearBackoff(D)`) per name, in sorted name order, holding the earlier ones; released in reverse. "+
				"**deadlocks**: lock calls not done after %v, given up (a correct lock never gets there; a deadlock would "+
				"never end; in runs shorter than that, a stuck call shows as a cut wait in *wait max*). **lost** = increments made − the final counters, over all %d names. *ops/s* counts operations, not names.\n\n",
				multiNames, stuckAfter, multiNames)
			p("| library | ops/s | wait p50 | wait p99 | wait max | Jain | deadlocks | lost | cmds/op | CPU µs/op | errors |\n")
			p("|---|---|---|---|---|---|---|---|---|---|---|\n")
			for _, r := range rs {
				if r.Failed != "" || r.Deadlocks == nil {
					p("| %s | failed: %s ||||||||||\n", r.Library, mdEscape(r.Failed))
					continue
				}
				p("| %s | %.0f | %s | %s | %s | %.3f | %d | %s | %.2f | %.1f | %s |\n", r.Library, r.OpsPerSec,
					fmtUs(r.WaitP50us), fmtUs(r.WaitP99us), waitMaxStr(r), r.Jain, *r.Deadlocks, lostStr(r),
					r.CmdsPerAcq, r.RedisCPUUsPerAcq, errStr(r))
			}
			p("\nBest retry delay per peer family (most ops/s): %s.\n", rp.bestChains())
		}
		p("\n")
	}
}

func waitMaxStr(r *runResult) string {
	if r.LongestCutWaitus > r.WaitMaxus {
		return "≥ " + fmtUs(r.LongestCutWaitus) + " (cut)"
	}
	return fmtUs(r.WaitMaxus)
}

func errStr(r *runResult) string {
	s := fmt.Sprint(r.errors())
	if r.errors() > 0 {
		s += ": " + mdEscape(strings.Join(r.ErrorSample, "; "))
	}
	return s
}

// bestChain returns the multi-lock run of a peer family ("redsync-chain") with the most ops/s.
func (rp *report) bestChain(family string) *runResult {
	var best *runResult
	for _, r := range rp.ofScenario("multi-4x8") {
		if r.Failed == "" && strings.HasPrefix(r.Library, family+"-") && (best == nil || r.OpsPerSec > best.OpsPerSec) {
			best = r
		}
	}
	return best
}

func (rp *report) bestChains() string {
	var s []string
	for _, f := range []string{"redsync-chain", "redislock-chain"} {
		if r := rp.bestChain(f); r != nil {
			s = append(s, fmt.Sprintf("%s %.0f ops/s", r.Library, r.OpsPerSec))
		}
	}
	if len(s) == 0 {
		return "none run"
	}
	return strings.Join(s, ", ")
}

// mixTargets adds the read-heavy and multi-lock targets to the targets table.
func (rp *report) mixTargets(row func(t, d, ref, res string)) {
	if rw := rp.find("rw-4x8", "dlock-rw"); rw != nil && rw.WriteWaitP99us != nil {
		if m := rp.find("rw-4x8", "dlock"); m != nil {
			row("read-heavy 4×8: RWMutex ops/s vs Mutex (≥ 3×)", fmt.Sprintf("%.0f", rw.OpsPerSec),
				fmt.Sprintf("dlock Mutex %.0f", m.OpsPerSec), ratio(rw.OpsPerSec, m.OpsPerSec)+", "+check(rw.OpsPerSec >= 3*m.OpsPerSec))
		}
		if pg := rp.find("rw-4x8", "pg-rw"); pg != nil {
			row("read-heavy 4×8: RWMutex ops/s vs PostgreSQL shared advisory locks (≥ 1.5×)", fmt.Sprintf("%.0f", rw.OpsPerSec),
				fmt.Sprintf("pg-rw %.0f", pg.OpsPerSec), ratio(rw.OpsPerSec, pg.OpsPerSec)+", "+check(rw.OpsPerSec >= 1.5*pg.OpsPerSec))
		}
		if ceil := rp.find("rw-1x32", "local-rw"); ceil != nil && ceil.Failed == "" {
			ref := fmt.Sprintf("local-rw 1×32 %.0f", ceil.OpsPerSec)
			if pg := rp.find("rw-4x8", "pg-rw"); pg != nil {
				ref += fmt.Sprintf("; 1.5× pg-rw is %.0f%% of it", 100*1.5*pg.OpsPerSec/ceil.OpsPerSec)
			}
			row("read-heavy 4×8: RWMutex ops/s vs the workload's ceiling (an in-memory RWMutex)", fmt.Sprintf("%.0f", rw.OpsPerSec),
				ref, ratio(rw.OpsPerSec, ceil.OpsPerSec))
		}
		row("read-heavy 4×8: writer wait p99 (≤ 50 ms)", fmtUs(*rw.WriteWaitP99us), "", check(*rw.WriteWaitP99us <= 50e3))
		row("read-heavy 4×8: Jain among writers (≥ 0.99)", fmt.Sprintf("%.3f", *rw.WriterJain), "", check(*rw.WriterJain >= 0.99))
	}
	if d := rp.find("multi-4x8", "dlock"); d != nil && d.Deadlocks != nil {
		for _, f := range []string{"redsync-chain", "redislock-chain"} {
			if bp := rp.bestChain(f); bp != nil {
				row("multi-lock 4×8: ops/s vs best "+f, fmt.Sprintf("%.0f", d.OpsPerSec),
					fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec), ratio(d.OpsPerSec, bp.OpsPerSec))
				row("multi-lock 4×8: wait p99 vs best "+f, fmtUs(d.WaitP99us), bp.Library+" "+fmtUs(bp.WaitP99us),
					ratio(d.WaitP99us, bp.WaitP99us))
			}
		}
		var dl, lost int64
		n := 0
		for _, r := range rp.ofScenario("multi-4x8") {
			if r.Failed == "" && r.Deadlocks != nil && r.LostIncrements != nil {
				dl += *r.Deadlocks
				lost += *r.LostIncrements
				n++
			}
		}
		// The target is dlock's; a peer's call over the bound is a slow chain (ordered chains
		// cannot deadlock), shown for comparison.
		row("multi-lock 4×8: deadlocks and lost updates (0)", fmt.Sprintf("%d deadlocks, %d lost", *d.Deadlocks, *d.LostIncrements),
			fmt.Sprintf("all %d runs: %d calls over the bound, %d lost", n, dl, lost), check(*d.Deadlocks == 0 && *d.LostIncrements == 0))
	}
}

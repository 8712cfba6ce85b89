package main

// The worker side: the driver re-executes this binary with -worker SPEC. A worker sets up its
// library, says "ready" on stdout, waits for "start <unix nanos>" on stdin (the start time all
// processes share), runs, writes its result file, says "done" and exits when stdin closes.
// Every loop stops at the run's end by itself; a watchdog exits the process if the driver
// goes silent, and the driver SIGKILLs whatever is left.

import (
	"bufio"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

const (
	modeLoop     = "loop"     // a throughput scenario
	modeKillWait = "killwait" // the waiter that the killed-waiter scenario SIGKILLs
	modeMemory   = "memory"   // 10,000 waiters on 1,000 keys
)

// workerSpec is everything a worker process needs, passed as JSON in -worker.
type workerSpec struct {
	Mode       string        `json:"mode"`
	Lib        string        `json:"lib"`
	RedisURL   string        `json:"redis_url"`
	PGURL      string        `json:"pg_url,omitempty"`
	EtcdURL    string        `json:"etcd_url,omitempty"`
	ZKAddr     string        `json:"zk_addr,omitempty"`
	Proc       int           `json:"proc"`
	Goroutines int           `json:"goroutines"`
	Keying     string        `json:"keying"`
	CS         string        `json:"cs"`
	Workload   string        `json:"workload,omitempty"` // "" (mutex loop), workRW or workMulti
	Prefix     string        `json:"prefix"`
	Duration   time.Duration `json:"duration"`
	ResultPath string        `json:"result_path"`
	LockName   string        `json:"lock_name,omitempty"` // killwait
	Keys       int           `json:"keys,omitempty"`      // memory
	PerKey     int           `json:"per_key,omitempty"`   // memory
	Masters    []string      `json:"masters,omitempty"`   // replication runs (redlock.go)
	AckURL     string        `json:"ack_url,omitempty"`   // replication runs (redlock.go)
}

// workerResult is what a loop worker reports (gob file: it can hold 10^5 samples).
type workerResult struct {
	Proc      int
	Counts    []int64 // acquisitions per goroutine
	Waits     []int64 // ns from Lock call to its return, every acquisition
	Acquired  []int64 // wall-clock ns when Lock returned, every acquisition
	Unlocking []int64 // wall-clock ns when Unlock was called, same order
	CutWaits  []int64 // ns waited by Lock calls the end of the run cut short (at most one per goroutine)
	LockErrs  int64
	UnlockErr int64
	CSErrs    int64
	ErrSample []string
	HWMKB     int64
	// rw and multi workloads (workloads.go)
	WriteCounts []int64          // writes per goroutine (rw)
	WriteWaits  []int64          // ns, every write acquisition (rw)
	ReadWaits   []int64          // ns, every read acquisition (rw)
	Stuck       int64            // lock calls given up after stuckAfter (multi)
	Gets, Sets  int64            // critical-section commands, left out of the lock's Redis cost
	Incr        map[string]int64 // increments made, by counter key
}

// Key names. All start with the run's prefix, so the driver can remove them afterwards.
func lockKey(prefix string) string            { return prefix + ":lock" }
func counterKey(prefix string) string         { return prefix + ":counter" }
func gLockKey(prefix string, p, g int) string { return fmt.Sprintf("%s:lock:p%dg%d", prefix, p, g) }
func gCounterKey(prefix string, p, g int) string {
	return fmt.Sprintf("%s:counter:p%dg%d", prefix, p, g)
}

// workerMain runs a worker process and returns its exit code.
func workerMain(specJSON string) int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker: bad spec:", err)
		return 2
	}
	// The watchdog: no run lasts this long; a worker whose driver vanished must not linger.
	limit := spec.Duration + 2*time.Minute
	if spec.Mode == modeMemory {
		limit = 3 * memoryTimeout
	}
	time.AfterFunc(limit, func() {
		fmt.Fprintf(os.Stderr, "worker %s/%d: watchdog: exiting after %v\n", spec.Lib, spec.Proc, limit)
		os.Exit(3)
	})
	in := bufio.NewScanner(os.Stdin)
	var err error
	switch spec.Mode {
	case modeLoop:
		err = loopWorker(spec, in)
	case modeKillWait:
		err = killWaitWorker(spec, in)
	case modeMemory:
		err = memoryWorker(spec, in)
	case modeLatch:
		err = latchWorker(spec, in)
	default:
		err = fmt.Errorf("unknown mode %q", spec.Mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker %s/%d: %v\n", spec.Lib, spec.Proc, err)
		return 1
	}
	return 0
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// awaitStart reads "start <unix nanos>" and sleeps until then.
func awaitStart(in *bufio.Scanner) (time.Time, error) {
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 2 && f[0] == "start" {
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			t := time.Unix(0, ns)
			time.Sleep(time.Until(t))
			return t, nil
		}
	}
	return time.Time{}, errors.New("stdin closed before start")
}

// drainStdin blocks until the driver closes stdin (it first reads the result).
func drainStdin(in *bufio.Scanner) {
	for in.Scan() {
	}
}

func newRedis(url string, poolSize int) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	if poolSize > opt.PoolSize {
		opt.PoolSize = poolSize
	}
	return redis.NewClient(opt), nil
}

func loopWorker(spec workerSpec, in *bufio.Scanner) error {
	if spec.Workload != "" {
		return mixWorker(spec, in)
	}
	res := &workerResult{Proc: spec.Proc, Counts: make([]int64, spec.Goroutines)}
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
	e := &env{redisURL: spec.RedisURL, rdb: rdb, pgURL: spec.PGURL, etcdURL: spec.EtcdURL, zkAddr: spec.ZKAddr}
	setupCtx, cancelSetup := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelSetup()
	closeRepl, err := connectRepl(setupCtx, spec, e, spec.Goroutines+8)
	if err != nil {
		return fail(err)
	}
	defer closeRepl()
	l, err := newLib(spec.Lib, e)
	if err != nil {
		return fail(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.close(ctx)
	}()
	lockers := make([]locker, spec.Goroutines)
	for g := range lockers {
		if lockers[g], err = l.newLocker(setupCtx); err != nil {
			return fail(err)
		}
		defer lockers[g].close()
	}
	// Warm the connection pool up outside the measured window.
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
	// Critical sections and unlocks run to completion after the deadline, bounded here.
	tailCtx, cancelTail := context.WithDeadline(context.Background(), end.Add(20*time.Second))
	defer cancelTail()

	type gres struct {
		waits, acq, unl              []int64
		cut                          int64
		lockErrs, unlockErrs, csErrs int64
		errs                         []string
	}
	per := make([]gres, spec.Goroutines)
	for g := 0; g < spec.Goroutines; g++ {
		wg.Go(func() {
			r := &per[g]
			note := func(err error) {
				if len(r.errs) < 3 {
					r.errs = append(r.errs, err.Error())
				}
			}
			lk := lockers[g]
			key, ctr := lockKey(spec.Prefix), counterKey(spec.Prefix)
			switch spec.Keying {
			case keyPerG:
				key, ctr = gLockKey(spec.Prefix, spec.Proc, g), gCounterKey(spec.Prefix, spec.Proc, g)
			case keySemOwn:
				ctr = gCounterKey(spec.Prefix, spec.Proc, g)
			}
			for n := 0; time.Now().Before(end); n++ {
				if spec.Keying == keyFresh {
					key = fmt.Sprintf("%s:%d", gLockKey(spec.Prefix, spec.Proc, g), n)
				}
				t0 := time.Now()
				err := lk.lock(runCtx, key)
				t1 := time.Now()
				if err != nil {
					if runCtx.Err() != nil {
						r.cut = int64(t1.Sub(t0)) // still waiting when the run ended
						break
					}
					r.lockErrs++
					note(err)
					_ = retryPause(runCtx, 10*time.Millisecond)
					continue
				}
				if err := criticalSection(tailCtx, rdb, spec.CS, ctr); err != nil {
					r.csErrs++
					note(err)
				}
				tu := time.Now()
				if err := lk.unlock(tailCtx); err != nil {
					r.unlockErrs++
					note(err)
				}
				res.Counts[g]++
				r.waits = append(r.waits, int64(t1.Sub(t0)))
				r.acq = append(r.acq, t1.UnixNano())
				r.unl = append(r.unl, tu.UnixNano())
			}
		})
	}
	wg.Wait()
	for _, r := range per {
		res.Waits = append(res.Waits, r.waits...)
		res.Acquired = append(res.Acquired, r.acq...)
		res.Unlocking = append(res.Unlocking, r.unl...)
		if r.cut > 0 {
			res.CutWaits = append(res.CutWaits, r.cut)
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

// criticalSection is the protected work: a non-atomic read-modify-write of a counter, so any
// overlap of two holders shows up as a lost increment.
func criticalSection(ctx context.Context, rdb *redis.Client, cs, counter string) error {
	if cs == csNone {
		return nil
	}
	v, err := rdb.Get(ctx, counter).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if cs == csGetWait {
		time.Sleep(2 * time.Millisecond)
	}
	return rdb.Set(ctx, counter, v+1, 0).Err()
}

func writeResult(path string, res *workerResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(res); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func dlockOpts(lib string) []dlock.Option {
	if lib == "dlock-nocohort" {
		return []dlock.Option{dlock.WithoutCohort()}
	}
	return nil
}

// killWaitWorker blocks in Lock until the driver SIGKILLs it.
func killWaitWorker(spec workerSpec, in *bufio.Scanner) error {
	rdb, err := newRedis(spec.RedisURL, 0)
	if err != nil {
		return err
	}
	c := dlock.New(rdb, dlockOpts(spec.Lib)...)
	m := c.Mutex(spec.LockName)
	say("ready")
	if _, err := awaitStart(in); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := m.Lock(ctx)
	if err != nil {
		say("failed %v", err)
		return err
	}
	say("acquired") // not expected: the driver kills this process while it waits
	_ = l.Unlock(ctx)
	drainStdin(in)
	return c.Close(ctx)
}

// memoryReport is what the memory worker prints once all its goroutines wait ("waiting {...}")
// and once they all got and released their lock ("done {...}").
type memoryReport struct {
	RSSBeforeKB   int64  `json:"rss_before_kb"`
	RSSWaitingKB  int64  `json:"rss_waiting_kb"`
	Goroutines    int    `json:"goroutines"`
	QueuedKeys    int    `json:"queued_keys"`
	ConnsTotal    int    `json:"conns_total"`
	ConnsNotify   int    `json:"conns_notify"`
	ConnsPubSub   int    `json:"conns_pubsub"`
	ConnsWaiting  int    `json:"conns_waiting"`
	ConnsNote     string `json:"conns_note,omitempty"`
	Acquired      int64  `json:"acquired"`
	Errors        int64  `json:"errors"`
	ErrSample     string `json:"err_sample,omitempty"`
	DrainMs       int64  `json:"drain_ms"`
	HWMKB         int64  `json:"hwm_kb"`
	WaitTimedOut  bool   `json:"wait_timed_out,omitempty"`
	DrainTimedOut bool   `json:"drain_timed_out,omitempty"`
}

func memoryKey(prefix string, i int) string { return fmt.Sprintf("%s:m%d", prefix, i) }

// memoryWorker starts Keys×PerKey goroutines waiting on keys the driver holds, measures RSS
// and connections once all wait, then lets them finish when the driver releases the keys.
func memoryWorker(spec workerSpec, in *bufio.Scanner) error {
	rdb, err := newRedis(spec.RedisURL, 0)
	if err != nil {
		return err
	}
	defer rdb.Close()
	c := dlock.New(rdb, dlockOpts(spec.Lib)...)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), memoryTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return err
	}
	say("ready")
	if _, err := awaitStart(in); err != nil {
		return err
	}
	runtime.GC()
	rep := memoryReport{RSSBeforeKB: procStatusKB("VmRSS")}
	n := spec.Keys * spec.PerKey
	var started, acquired, errs atomic.Int64
	var errMu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() {
			m := c.Mutex(memoryKey(spec.Prefix, i/spec.PerKey))
			started.Add(1)
			l, err := m.Lock(ctx)
			if err == nil {
				acquired.Add(1)
				err = l.Unlock(ctx)
			}
			if err != nil {
				if errs.Add(1) == 1 {
					errMu.Lock()
					rep.ErrSample = err.Error()
					errMu.Unlock()
				}
			}
		})
	}
	// All waiting: every goroutine is inside Lock and every key's Redis queue has a waiter.
	queues := make([]string, spec.Keys)
	for i := range queues {
		queues[i] = "dlock:{" + memoryKey(spec.Prefix, i) + "}:queue"
	}
	waitDeadline := time.Now().Add(memoryTimeout / 2)
	for {
		q := countQueued(ctx, rdb, queues)
		rep.QueuedKeys = q
		if started.Load() == int64(n) && q == spec.Keys {
			break
		}
		if time.Now().After(waitDeadline) || ctx.Err() != nil {
			rep.WaitTimedOut = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let the last subscriptions and queue entries settle
	rep.QueuedKeys = countQueued(ctx, rdb, queues)
	rep.RSSWaitingKB = procStatusKB("VmRSS")
	rep.Goroutines = runtime.NumGoroutine()
	cs, err := ownRedisConns(ctx, rdb)
	if err != nil {
		rep.ConnsNote = err.Error()
	}
	rep.ConnsTotal, rep.ConnsNotify, rep.ConnsPubSub, rep.ConnsWaiting = cs.total, cs.notify, cs.pubsub, cs.waiting
	b, _ := json.Marshal(rep)
	say("waiting %s", b)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t1 := time.Now()
	select {
	case <-done:
	case <-ctx.Done():
		rep.DrainTimedOut = true
	}
	rep.DrainMs = time.Since(t1).Milliseconds()
	rep.Acquired, rep.Errors = acquired.Load(), errs.Load()
	rep.HWMKB = procStatusKB("VmHWM")
	errMu.Lock()
	b, _ = json.Marshal(rep)
	errMu.Unlock()
	say("done %s", b)
	drainStdin(in)
	return nil
}

// countQueued returns how many of the queue keys have a waiter (one pipelined round trip).
func countQueued(ctx context.Context, rdb *redis.Client, queues []string) int {
	n := 0
	for _, v := range queueLens(ctx, rdb, queues...) {
		if v > 0 {
			n++
		}
	}
	return n
}

// queueLens returns the length of each dlock queue key, whether the library keeps the queue
// as a list (LLEN) or a sorted set (ZCARD): both are asked, the one of the wrong type fails.
func queueLens(ctx context.Context, rdb *redis.Client, queues ...string) []int64 {
	ll := make([]*redis.IntCmd, len(queues))
	zc := make([]*redis.IntCmd, len(queues))
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			ll[i] = p.LLen(ctx, q)
			zc[i] = p.ZCard(ctx, q)
		}
		return nil
	})
	out := make([]int64, len(queues))
	for i := range queues {
		if v, err := ll[i].Result(); err == nil {
			out[i] = v
		}
		if v, err := zc[i].Result(); err == nil {
			out[i] = max(out[i], v)
		}
	}
	return out
}

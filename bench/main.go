// Command bench compares dlock with other Go distributed locks on Redis (and PostgreSQL
// advisory locks when PG_URL is set, etcd's concurrency.Mutex when ETCD_URL is set and
// ZooKeeper's lock recipe when ZK_ADDR is set), across real OS processes.
//
//	cd bench && go run . -out ../docs              # full suite (-duration 4s per run)
//	cd bench && go run . -quick -out /tmp/bench    # smoke test, ~1s per run
//	cd bench && go run . -only 'contended-8x1/(dlock|redsync)$'
//	bash bench/with-postgres.sh -out ../docs  # with a throwaway PostgreSQL
//	bash bench/with-consensus.sh -out ../docs # with throwaway etcd, ZooKeeper and PostgreSQL
//
// It starts a throwaway redis-server on a loopback port unless REDIS_URL is set, and writes
// bench.jsonl, BENCHMARKS.md and chart.png into -out.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/gob"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func main() {
	out := flag.String("out", ".", "directory for bench.jsonl, BENCHMARKS.md and chart.png")
	dur := flag.Duration("duration", 4*time.Second, "length of each throughput run")
	quick := flag.Bool("quick", false, "short runs (1s) for smoke testing")
	only := flag.String("only", "", "run only the runs whose `scenario/library` matches this regexp")
	worker := flag.String("worker", "", "internal: run as a worker process with this spec")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run . [-out DIR] [-duration D] [-quick] [-only REGEXP]\n"+
			"  env REDIS_URL: use this Redis (loopback) instead of a throwaway redis-server\n"+
			"  env PG_URL:    also benchmark PostgreSQL advisory locks (loopback or unix socket)\n"+
			"  env ETCD_URL:  also benchmark etcd's concurrency.Mutex (client URLs, loopback)\n"+
			"  env ZK_ADDR:   also benchmark ZooKeeper's lock recipe (host:port, loopback)\n\n")
		flag.VisitAll(func(f *flag.Flag) {
			if f.Name != "worker" {
				fmt.Fprintf(os.Stderr, "  -%s\t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
			}
		})
	}
	flag.Parse()
	if *worker != "" {
		os.Exit(workerMain(*worker))
	}
	if *quick {
		*dur = time.Second
	}
	var re *regexp.Regexp
	if *only != "" {
		var err error
		if re, err = regexp.Compile(*only); err != nil {
			fatalf("bad -only: %v", err)
		}
	}
	d, err := newDriver(*dur)
	if err != nil {
		fatalf("%v", err)
	}
	defer d.close()
	runs := plan(re, d.enabled)
	if len(runs) == 0 {
		fatalf("-only %q selects no run", *only)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fatalf("%v", err)
	}
	d.runAll(runs)
	rep := &report{
		machine: d.machine, command: commandLine(), date: time.Now().UTC(),
		duration: *dur, results: d.results, pg: d.pgURL != "", etcd: d.etcdURL != "", zk: d.zkAddr != "",
	}
	md := rep.markdown()
	if err := writeOutputs(*out, rep, md); err != nil {
		d.close()
		fatalf("%v", err)
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "wrote %s, %s, %s (%d runs, %v)\n", filepath.Join(*out, "bench.jsonl"),
		filepath.Join(*out, "BENCHMARKS.md"), filepath.Join(*out, "chart.png"), len(d.results),
		time.Since(d.began).Round(time.Second))
	if n := d.failed(); n > 0 {
		d.close()
		fatalf("%d run(s) failed; see the error column", n)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}

// commandLine is how this run was started, for the report.
func commandLine() string {
	var env []string
	if u := os.Getenv("REDIS_URL"); u != "" {
		env = append(env, "REDIS_URL="+redactURL(u))
	}
	if u := os.Getenv("PG_URL"); u != "" {
		env = append(env, "PG_URL="+redactURL(u))
	}
	if u := os.Getenv("ETCD_URL"); u != "" {
		env = append(env, "ETCD_URL="+redactURL(u))
	}
	if a := os.Getenv("ZK_ADDR"); a != "" {
		env = append(env, "ZK_ADDR="+a)
	}
	parts := append(env, "go", "run", ".")
	for _, a := range os.Args[1:] {
		parts = append(parts, shellQuote(a))
	}
	return "cd bench && " + strings.Join(parts, " ")
}

// shellQuote quotes a for a POSIX shell when it holds anything but plain characters.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,@+") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return s
}

// driver runs the benchmark: it owns the Redis connection used for statistics and the worker
// processes of the current run.
type driver struct {
	self     string // this binary, re-executed as the workers
	redisURL string
	server   *redisserver.Server // nil with REDIS_URL
	opt      *redis.Options
	stats    *redis.Client // the driver's own connection: INFO, counters, clean-up
	pgURL    string
	etcdURL  string // ETCD_URL: the etcd peer runs
	zkAddr   string // ZK_ADDR: the zookeeper peer runs
	dur      time.Duration
	tmp      string
	began    time.Time
	machine  machineInfo
	results  []*runResult
	repl     *replServers // the replication runs' extra servers, started on first use
}

func newDriver(dur time.Duration) (*driver, error) {
	d := &driver{dur: dur, began: time.Now(), pgURL: os.Getenv("PG_URL"), etcdURL: os.Getenv("ETCD_URL"),
		zkAddr: os.Getenv("ZK_ADDR")}
	var err error
	if d.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if d.tmp, err = os.MkdirTemp("", "dlock-bench-"); err != nil {
		return nil, err
	}
	if u := os.Getenv("REDIS_URL"); u != "" {
		d.redisURL = u
	} else {
		s, err := redisserver.Start(redisserver.Config{TCP: true})
		if err != nil {
			d.close()
			return nil, err
		}
		d.server, d.redisURL = s, s.URL()
	}
	if d.opt, err = redis.ParseURL(d.redisURL); err != nil {
		d.close()
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	if err := checkLoopback("REDIS_URL", d.opt.Network, d.opt.Addr); err != nil {
		d.close()
		return nil, err
	}
	so := *d.opt
	so.ClientName, so.PoolSize = "bench-driver", 2
	d.stats = redis.NewClient(&so)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.stats.Ping(ctx).Err(); err != nil {
		d.close()
		return nil, fmt.Errorf("redis at %s: %w", redactURL(d.redisURL), err)
	}
	if d.pgURL != "" {
		if err := checkPG(ctx, d.pgURL); err != nil {
			d.close()
			return nil, err
		}
	}
	d.machine = gatherMachine(ctx, d.stats)
	if d.etcdURL != "" {
		if d.machine.EtcdVersion, err = checkEtcd(ctx, d.etcdURL); err != nil {
			d.close()
			return nil, err
		}
	}
	if d.zkAddr != "" {
		if d.machine.ZKVersion, err = checkZK(d.zkAddr); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

// checkLoopback refuses a server that is not on this machine: the benchmark only talks to
// loopback addresses and unix sockets.
func checkLoopback(what, network, addr string) error {
	if network == "unix" || strings.HasPrefix(addr, "/") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s: %s is not a loopback address or unix socket; this benchmark only runs against a local server", what, addr)
}

func checkPG(ctx context.Context, pgURL string) error {
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		return fmt.Errorf("PG_URL: %w", err)
	}
	if err := checkLoopback("PG_URL", "", cfg.Host); err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("PG_URL: %w (see BENCHMARKS.md or main.go for how to start a local PostgreSQL)", err)
	}
	return conn.Close(ctx)
}

// enabled reports whether a library runs: the optional peers only when their server is given.
func (d *driver) enabled(lib string) bool {
	switch optionalEnv(lib) {
	case "PG_URL":
		return d.pgURL != ""
	case "ETCD_URL":
		return d.etcdURL != ""
	case "ZK_ADDR":
		return d.zkAddr != ""
	}
	return true
}

func (d *driver) close() {
	if d.stats != nil {
		_ = d.stats.Close()
		d.stats = nil
	}
	if d.server != nil {
		d.server.Stop()
		d.server = nil
	}
	if d.repl != nil {
		d.repl.stop()
		d.repl = nil
	}
	if d.tmp != "" {
		_ = os.RemoveAll(d.tmp)
		d.tmp = ""
	}
}

func (d *driver) failed() int {
	n := 0
	for _, r := range d.results {
		if r.Failed != "" {
			n++
		}
	}
	return n
}

func (d *driver) runAll(runs []plannedRun) {
	for i, pr := range runs {
		t := time.Now()
		var r *runResult
		switch {
		case pr.sc != nil:
			r = d.runLoop(i, pr)
		case pr.id == killedID:
			r = d.runKilled(i, pr)
		case pr.id == memoryID:
			r = d.runMemory(i, pr)
		case pr.id == latchID:
			r = d.runLatch(i, pr)
		}
		d.results = append(d.results, r)
		fmt.Fprintf(os.Stderr, "[%d/%d] %-32s %s (%.1fs)\n", i+1, len(runs), pr.name(), r.summary(),
			time.Since(t).Seconds())
		if strings.HasPrefix(pr.lib, "pg") {
			d.pgSettle()
		}
	}
}

// pgSettle waits until the PostgreSQL backends of a pg run have gone: with 256 connections
// their exit takes the machine's CPU for seconds, which the next run (measured: a read-heavy
// RWMutex run at 0.4x its usual rate) would otherwise pay for.
func (d *driver) pgSettle() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.pgURL)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	for ctx.Err() == nil {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").Scan(&n)
		if err != nil || n == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the exited backends' clean-up
}

// --- worker processes

type workerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string   // stdout lines; closed at EOF
	exit  chan struct{} // closed once the process has exited
}

// spawn starts a worker process. It dies with the driver (PR_SET_PDEATHSIG).
func (d *driver) spawn(spec workerSpec) (*workerProc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(d.self, "-worker", string(b))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &workerProc{cmd: cmd, stdin: stdin, lines: make(chan string, 64), exit: make(chan struct{})}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(w.exit)
	}()
	return w, nil
}

// expect waits for a stdout line starting with word and returns the rest of it.
func (w *workerProc) expect(word string, deadline time.Time) (string, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				return "", fmt.Errorf("worker exited before %q", word)
			}
			if rest, found := strings.CutPrefix(line, "failed"); found {
				return "", fmt.Errorf("worker failed:%s", rest)
			}
			if rest, found := strings.CutPrefix(line, word); found {
				return strings.TrimSpace(rest), nil
			}
		case <-t.C:
			return "", fmt.Errorf("timed out waiting for worker's %q", word)
		}
	}
}

func (w *workerProc) send(format string, args ...any) error {
	_, err := fmt.Fprintf(w.stdin, format+"\n", args...)
	return err
}

// finish closes stdin (the worker then cleans up and exits), waits up to grace and SIGKILLs
// the process if it is still there.
func (w *workerProc) finish(grace time.Duration) {
	_ = w.stdin.Close()
	select {
	case <-w.exit:
		return
	case <-time.After(grace):
	}
	w.kill()
}

func (w *workerProc) kill() {
	_ = w.cmd.Process.Kill()
	select {
	case <-w.exit:
	case <-time.After(5 * time.Second):
	}
}

func finishAll(ws []*workerProc, grace time.Duration) {
	var wg sync.WaitGroup
	for _, w := range ws {
		if w != nil {
			wg.Go(func() { w.finish(grace) })
		}
	}
	wg.Wait()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// cleanup removes every key of a run (all contain its prefix).
func (d *driver) cleanup(prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it := d.stats.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	var batch []string
	for it.Next(ctx) {
		batch = append(batch, it.Val())
		if len(batch) == 1000 {
			_ = d.stats.Unlink(ctx, batch...).Err()
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		_ = d.stats.Unlink(ctx, batch...).Err()
	}
}

// --- throughput runs

func (d *driver) runLoop(idx int, pr plannedRun) *runResult {
	sc := pr.sc
	r := &runResult{Library: pr.lib, Scenario: sc.ID, Processes: sc.Procs, Goroutines: sc.Goroutines,
		DurationS: d.dur.Seconds()}
	prefix := fmt.Sprintf("bench-%02d-%s", idx, randHex(3))
	defer d.cleanup(prefix)
	defer d.cleanupConsensus(pr.lib, prefix) // after the workers are gone (deferred below)
	ws := make([]*workerProc, sc.Procs)
	defer finishAll(ws, 5*time.Second) // a no-op when the run got that far itself
	paths := make([]string, sc.Procs)
	var masters []string
	var ackURL string
	if needsMasters(pr.lib) || needsAck(pr.lib) {
		var err error
		if masters, ackURL, err = d.replication(); err != nil {
			r.Failed = "starting the replication runs' servers: " + err.Error()
			return r
		}
		if !needsMasters(pr.lib) {
			masters = nil
		}
		if !needsAck(pr.lib) {
			ackURL = ""
		}
	}
	for i := range ws {
		paths[i] = filepath.Join(d.tmp, fmt.Sprintf("%s-%d.gob", prefix, i))
		w, err := d.spawn(workerSpec{Mode: modeLoop, Lib: pr.lib, RedisURL: d.redisURL, PGURL: d.pgURL,
			EtcdURL: d.etcdURL, ZKAddr: d.zkAddr,
			Proc: i, Goroutines: sc.Goroutines, Keying: sc.Keying, CS: sc.CS, Workload: sc.Workload, Prefix: prefix,
			Duration: d.dur, ResultPath: paths[i], Masters: masters, AckURL: ackURL})
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		ws[i] = w
	}
	readyBy := time.Now().Add(60 * time.Second)
	for _, w := range ws {
		if _, err := w.expect("ready", readyBy); err != nil {
			r.Failed = err.Error()
			return r
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.dur+2*time.Minute)
	defer cancel()
	before, err := readServerStats(ctx, d.stats)
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	start := time.Now().Add(100 * time.Millisecond)
	for _, w := range ws {
		if err := w.send("start %d", start.UnixNano()); err != nil {
			r.Failed = err.Error()
			return r
		}
	}
	doneBy := start.Add(d.dur + 40*time.Second)
	for _, w := range ws {
		if _, err := w.expect("done", doneBy); err != nil {
			r.Failed = err.Error()
			return r
		}
	}
	after, err := readServerStats(ctx, d.stats)
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	finishAll(ws, 5*time.Second)

	var res []*workerResult
	for _, p := range paths {
		wr, err := readResult(p)
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		res = append(res, wr)
	}
	var counts, waits []int64
	for _, wr := range res {
		counts = append(counts, wr.Counts...)
		waits = append(waits, wr.Waits...)
		r.LockErrors += wr.LockErrs
		r.UnlockErrors += wr.UnlockErr
		r.CSErrors += wr.CSErrs
		for _, e := range wr.ErrSample {
			if len(r.ErrorSample) < 3 {
				r.ErrorSample = append(r.ErrorSample, e)
			}
		}
		r.MaxRSSMB = max(r.MaxRSSMB, float64(wr.HWMKB)/1024)
		for _, c := range wr.CutWaits {
			r.CutWaits++
			r.LongestCutWaitus = max(r.LongestCutWaitus, us(c))
		}
	}
	for _, c := range counts {
		r.Ops += c
	}
	r.OpsPerSec = float64(r.Ops) / d.dur.Seconds()
	sortInt64(waits)
	r.WaitP50us = us(percentile(waits, 0.50))
	r.WaitP99us = us(percentile(waits, 0.99))
	if len(waits) > 0 {
		r.WaitMaxus = us(waits[len(waits)-1])
	}
	r.Jain = jain(counts)
	for _, c := range counts {
		if c == 0 {
			r.Starved++
		}
	}
	if sc.Workload != "" {
		if err := d.mixResults(ctx, r, sc, res, before, after); err != nil {
			r.Failed = err.Error()
		}
		return r
	}
	exclude := map[string]int64{"info": 1} // the driver's INFO before the run
	if sc.CS != csNone {
		exclude["get"], exclude["set"] = r.Ops, r.Ops
	}
	if r.Ops > 0 {
		cost := costBetween(before, after, exclude)
		r.CmdsPerAcq = float64(cost.calls) / float64(r.Ops)
		r.ServerUsPerAcq = cost.usec / float64(r.Ops)
		r.RedisCPUUsPerAcq = cost.cpuUs / float64(r.Ops)
	}
	if sc.CS != csNone {
		total, err := d.counterTotal(ctx, sc, prefix)
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		lost := r.Ops - total
		r.LostIncrements = &lost
	}
	if sc.Keying == keySemOwn {
		permits := 1 // a Mutex on the same workload
		if sc.ID == semID && r.Library != "dlock" {
			permits = semPermits
		}
		var lat []int64
		r.MostAtOnce, lat = semStats(res, permits)
		r.Handoffs = len(lat)
		if len(lat) > 0 {
			p50, p99 := us(percentile(lat, 0.50)), us(percentile(lat, 0.99))
			r.WakeP50us, r.WakeP99us = &p50, &p99
		}
	}
	if sc.Keying == keyShared && sc.Procs > 1 {
		lat := handoffLatencies(res)
		r.Handoffs = len(lat)
		if len(lat) > 0 {
			p50, p99 := us(percentile(lat, 0.50)), us(percentile(lat, 0.99))
			r.WakeP50us, r.WakeP99us = &p50, &p99
		}
	}
	return r
}

// counterTotal reads the run's counter(s): what the critical sections really added.
func (d *driver) counterTotal(ctx context.Context, sc *scenario, prefix string) (int64, error) {
	var keys []string
	if sc.Keying == keyPerG || sc.Keying == keySemOwn {
		for p := 0; p < sc.Procs; p++ {
			for g := 0; g < sc.Goroutines; g++ {
				keys = append(keys, gCounterKey(prefix, p, g))
			}
		}
	} else {
		keys = []string{counterKey(prefix)}
	}
	vals, err := d.stats.MGet(ctx, keys...).Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, v := range vals {
		if s, ok := v.(string); ok {
			var n int64
			if _, err := fmt.Sscan(s, &n); err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}

func readResult(path string) (*workerResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r workerResult
	if err := gob.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

// --- killed waiter

// runKilled: holder H (a Client in the driver) holds the lock; worker process W waits for it;
// once W is in the Redis queue, Client C starts waiting behind it; W is SIGKILLed, H unlocks
// at t0 and C gets the lock at t1. The stall is t1 − t0.
func (d *driver) runKilled(idx int, pr plannedRun) *runResult {
	r := &runResult{Library: pr.lib, Scenario: killedID, Processes: 1, Goroutines: 1}
	prefix := fmt.Sprintf("bench-%02d-%s", idx, randHex(3))
	defer d.cleanup(prefix)
	for rep := 0; rep < killedReps; rep++ {
		stall, err := d.killedOnce(pr.lib, fmt.Sprintf("%s:k%d", prefix, rep))
		if err != nil {
			r.Failed = fmt.Sprintf("rep %d: %v", rep+1, err)
			return r
		}
		ms := float64(stall) / 1e6
		r.StallsMs = append(r.StallsMs, ms)
		r.MaxStallMs = max(r.MaxStallMs, ms)
	}
	return r
}

func (d *driver) killedOnce(lib, name string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rdb := redis.NewClient(d.opt)
	defer rdb.Close()
	h := dlock.New(rdb, dlockOpts(lib)...)
	defer h.Close(context.Background())
	c := dlock.New(rdb, dlockOpts(lib)...)
	defer c.Close(context.Background())
	held, err := h.Mutex(name).Lock(ctx)
	if err != nil {
		return 0, fmt.Errorf("holder: %w", err)
	}
	w, err := d.spawn(workerSpec{Mode: modeKillWait, Lib: lib, RedisURL: d.redisURL, LockName: name,
		Duration: 30 * time.Second})
	if err != nil {
		return 0, err
	}
	defer w.kill()
	if _, err := w.expect("ready", time.Now().Add(30*time.Second)); err != nil {
		return 0, err
	}
	if err := w.send("start %d", time.Now().UnixNano()); err != nil {
		return 0, err
	}
	queue := "dlock:{" + name + "}:queue"
	if err := waitQueued(ctx, rdb, queue, 1, 10*time.Second); err != nil {
		return 0, fmt.Errorf("waiter W never queued: %w", err)
	}
	type got struct {
		at time.Time
		l  *dlock.Lease
		e  error
	}
	ch := make(chan got, 1)
	go func() {
		l, err := c.Mutex(name).Lock(ctx)
		ch <- got{time.Now(), l, err}
	}()
	if err := waitQueued(ctx, rdb, queue, 2, 10*time.Second); err != nil {
		return 0, fmt.Errorf("client C never queued behind W: %w", err)
	}
	w.kill() // SIGKILL
	t0 := time.Now()
	if err := held.Unlock(ctx); err != nil {
		return 0, fmt.Errorf("holder unlock: %w", err)
	}
	var g got
	select {
	case g = <-ch:
	case <-time.After(30 * time.Second):
		return 0, errors.New("client C did not get the lock within 30s of the release")
	}
	if g.e != nil {
		return 0, fmt.Errorf("client C: %w", g.e)
	}
	_ = g.l.Unlock(ctx)
	return g.at.Sub(t0), nil
}

// waitQueued polls the length of a dlock queue key (LLEN, or ZCARD when the queue is a sorted
// set) until it reaches n: the queue has no event to wait on from outside.
func waitQueued(ctx context.Context, rdb *redis.Client, key string, n int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		v := queueLens(ctx, rdb, key)[0]
		if v >= n {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("queue %s has %d entries after %v (want ≥ %d)", key, v, limit, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// --- memory

// runMemory: the driver holds memoryKeys locks; one worker process starts memoryKeys ×
// memoryPerKey goroutines waiting on them and reports its RSS and Redis connections once all
// wait; then the driver releases the locks and every waiter gets its turn.
func (d *driver) runMemory(idx int, pr plannedRun) *runResult {
	r := &runResult{Library: pr.lib, Scenario: memoryID, Processes: 1, Goroutines: memoryKeys * memoryPerKey}
	prefix := fmt.Sprintf("bench-%02d-%s", idx, randHex(3))
	defer d.cleanup(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 3*memoryTimeout)
	defer cancel()
	rdb := redis.NewClient(d.opt)
	defer rdb.Close()
	h := dlock.New(rdb)
	defer h.Close(context.Background())
	leases := make([]*dlock.Lease, memoryKeys)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for p := 0; p < 16; p++ {
		wg.Go(func() {
			for i := p; i < memoryKeys; i += 16 {
				l, err := h.Mutex(memoryKey(prefix, i)).Lock(ctx)
				mu.Lock()
				leases[i] = l
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		r.Failed = "holder: " + firstErr.Error()
		return r
	}
	w, err := d.spawn(workerSpec{Mode: modeMemory, Lib: pr.lib, RedisURL: d.redisURL, Prefix: prefix,
		Keys: memoryKeys, PerKey: memoryPerKey, Duration: memoryTimeout})
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	defer w.finish(5 * time.Second)
	if _, err := w.expect("ready", time.Now().Add(30*time.Second)); err != nil {
		r.Failed = err.Error()
		return r
	}
	if err := w.send("start %d", time.Now().UnixNano()); err != nil {
		r.Failed = err.Error()
		return r
	}
	line, err := w.expect("waiting", time.Now().Add(memoryTimeout))
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	var waiting memoryReport
	if err := json.Unmarshal([]byte(line), &waiting); err != nil {
		r.Failed = err.Error()
		return r
	}
	for p := 0; p < 16; p++ {
		wg.Go(func() {
			for i := p; i < memoryKeys; i += 16 {
				_ = leases[i].Unlock(ctx)
			}
		})
	}
	wg.Wait()
	line, err = w.expect("done", time.Now().Add(memoryTimeout))
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	var done memoryReport
	if err := json.Unmarshal([]byte(line), &done); err != nil {
		r.Failed = err.Error()
		return r
	}
	r.Memory = &done
	r.MaxRSSMB = float64(done.HWMKB) / 1024
	r.Ops = done.Acquired
	r.LockErrors = done.Errors
	if done.ErrSample != "" {
		r.ErrorSample = []string{done.ErrSample}
	}
	switch {
	case done.WaitTimedOut:
		r.Failed = fmt.Sprintf("not all waiters queued (%d of %d keys)", done.QueuedKeys, memoryKeys)
	case done.DrainTimedOut || done.Acquired != int64(memoryKeys*memoryPerKey):
		r.Failed = fmt.Sprintf("only %d of %d waiters got the lock", done.Acquired, memoryKeys*memoryPerKey)
	}
	return r
}

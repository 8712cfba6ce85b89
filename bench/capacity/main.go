// Command capacity measures what dlock costs Redis: bytes per held lock, per released name
// and per waiter, and Redis CPU µs and commands per acquisition, for each primitive, each on a
// fresh throwaway redis-server; then the same Mutex loop on a local 3-master Cluster. It
// prints a markdown report with the derived sizing model (docs/CAPACITY.md).
//
//	cd bench && go run ./capacity
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

var (
	heldN    = flag.Int("n", 10000, "leases held at once for the memory figures")
	loopDur  = flag.Duration("loop", 3*time.Second, "length of each uncontended acquire+release loop")
	workers  = flag.Int("workers", 8, "goroutines of each loop")
	waitWin  = flag.Bool("window", true, "wait once past dlock's 1-minute op-log window and measure the released names again")
	names    = flag.Int("waitnames", 100, "held Mutex names for the waiter figure")
	perName  = flag.Int("perName", 10, "waiters per held name")
	clusterN = flag.Int("masters", 3, "Cluster masters")
)

// prim is one primitive: acquire takes the i-th lease of a run (name prefix p) and returns
// what releases it.
type prim struct {
	name    string
	acquire func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error)
}

func lease(l *dlock.Lease, err error) (func(context.Context) error, error) {
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

var prims = []prim{
	{"Mutex", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		return lease(c.Mutex(fmt.Sprintf("%s%d", p, i)).Lock(ctx))
	}},
	{"RWMutex (read)", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		return lease(c.RWMutex(fmt.Sprintf("%s%d", p, i)).RLock(ctx))
	}},
	{"RWMutex (write)", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		return lease(c.RWMutex(fmt.Sprintf("%s%d", p, i)).Lock(ctx))
	}},
	{"Semaphore (1 of 4)", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		return lease(c.Semaphore(fmt.Sprintf("%s%d", p, i), 4).Acquire(ctx, 1))
	}},
	{"MultiLock (3 names)", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		n := fmt.Sprintf("%s%d", p, i)
		return lease(c.MultiLock([]string{n + ":a", n + ":b", n + ":c"}).Lock(ctx))
	}},
	{"Latch (set 1, count down)", func(ctx context.Context, c *dlock.Client, p string, i int) (func(context.Context) error, error) {
		d := c.Latch(fmt.Sprintf("%s%d", p, i))
		ok, err := d.TrySetCount(ctx, 1)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("latch %s already counting", d.Name())
		}
		return d.CountDown, nil
	}},
}

// stats is one INFO reading of a server.
type stats struct {
	mem   int64   // used_memory
	cpu   float64 // used_cpu_sys + used_cpu_user, seconds
	calls int64   // sum of commandstats calls (commands inside scripts included)
	evals int64   // EVAL/EVALSHA/FCALL calls: the client's script round trips
	keys  int64   // DBSIZE
	conns int64   // connected_clients
}

func read(ctx context.Context, rdb *redis.Client) stats {
	info, err := rdb.Info(ctx, "memory", "cpu", "commandstats", "clients").Result()
	if err != nil {
		log.Fatalf("INFO: %v", err)
	}
	var s stats
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "connected_clients":
			fmt.Sscan(v, &s.conns)
		case k == "used_memory":
			fmt.Sscan(v, &s.mem)
		case k == "used_cpu_sys" || k == "used_cpu_user":
			var f float64
			fmt.Sscan(v, &f)
			s.cpu += f
		case strings.HasPrefix(k, "cmdstat_"):
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					var c int64
					fmt.Sscan(n, &c)
					s.calls += c
					if strings.Contains(k, "eval") || strings.Contains(k, "fcall") {
						s.evals += c
					}
				}
			}
		}
	}
	s.keys, _ = rdb.DBSize(ctx).Result()
	return s
}

// loopResult is one uncontended loop.
type loopResult struct {
	acq      int64
	secs     float64
	cpuUS    float64 // Redis CPU µs per acquisition
	cmds     float64 // commands per acquisition
	evals    float64 // script calls per acquisition
	perShard []int64 // Cluster: commands per master
	shardCPU []float64
}

// serverLoop starts a redis-server of cfg and runs loop on it with a WithoutCohort Client.
func serverLoop(ctx context.Context, cfg redisserver.Config, p prim, workers int) loopResult {
	s, err := redisserver.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop()
	rdb, admin := s.Client(), s.Client()
	defer rdb.Close()
	defer admin.Close()
	c := dlock.New(rdb, dlock.WithoutCohort())
	defer c.Close(ctx)
	return loop(ctx, c, []*redis.Client{admin}, p, "cpu:", *loopDur, workers)
}

// loop runs workers goroutines acquiring and releasing fresh names for d, measuring the
// servers in admins (summed).
func loop(ctx context.Context, c *dlock.Client, admins []*redis.Client, p prim, prefix string, d time.Duration, workers int) loopResult {
	// warm up: scripts loaded, connections open
	for i := range 20 {
		rel, err := p.acquire(ctx, c, prefix+"warm:", i)
		if err != nil {
			log.Fatalf("%s warm-up: %v", p.name, err)
		}
		_ = rel(ctx)
	}
	before := make([]stats, len(admins))
	for i, a := range admins {
		before[i] = read(ctx, a)
	}
	var n atomic.Int64
	var next atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				i := int(next.Add(1))
				rel, err := p.acquire(ctx, c, prefix, i)
				if err != nil {
					log.Fatalf("%s loop: %v", p.name, err)
				}
				if err := rel(ctx); err != nil {
					log.Fatalf("%s loop release: %v", p.name, err)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	r := loopResult{acq: n.Load(), secs: secs}
	var cpu float64
	var calls, evals int64
	for i, a := range admins {
		after := read(ctx, a)
		dc := after.cpu - before[i].cpu
		dn := after.calls - before[i].calls - 2 // the INFO and DBSIZE of the first reading
		cpu += dc
		calls += dn
		evals += after.evals - before[i].evals
		r.perShard = append(r.perShard, dn)
		r.shardCPU = append(r.shardCPU, dc)
	}
	r.cpuUS = cpu * 1e6 / float64(r.acq)
	r.cmds = float64(calls) / float64(r.acq)
	r.evals = float64(evals) / float64(r.acq)
	return r
}

// memResult is the memory figures of one primitive.
type memResult struct {
	held, recent, after  float64 // bytes per lease / per released name
	keysHeld, keysRecent float64 // keys per lease / per released name
	keysAfter            float64
	base                 stats
	srv                  *redisserver.Server
	admin                *redis.Client
	client               *dlock.Client
	rdb                  *redis.Client
	released             time.Time
}

func memory(ctx context.Context, p prim) *memResult {
	s, err := redisserver.Start(redisserver.Config{})
	if err != nil {
		log.Fatal(err)
	}
	rdb := s.Client()
	admin := s.Client()
	c := dlock.New(rdb, dlock.WithoutCohort())
	// warm-up on other names: scripts cached, notification connection open; then let
	// those names' op logs go before the baseline is immaterial (20 names of 10,000).
	var ww sync.WaitGroup
	for w := range *workers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for i := range 5 {
				rel, err := p.acquire(ctx, c, fmt.Sprintf("warm:%d:", w), i)
				if err != nil {
					log.Fatalf("%s warm-up: %v", p.name, err)
				}
				_ = rel(ctx)
			}
		}()
	}
	ww.Wait()
	m := &memResult{srv: s, admin: admin, client: c, rdb: rdb}
	m.base = read(ctx, admin)
	rels := make([]func(context.Context) error, *heldN)
	forEach(*heldN, *workers, func(i int) {
		rel, err := p.acquire(ctx, c, "cap:", i)
		if err != nil {
			log.Fatalf("%s hold: %v", p.name, err)
		}
		rels[i] = rel
	})
	held := read(ctx, admin)
	forEach(*heldN, *workers, func(i int) {
		if err := rels[i](ctx); err != nil {
			log.Fatalf("%s release: %v", p.name, err)
		}
	})
	m.released = time.Now()
	recent := read(ctx, admin)
	n := float64(*heldN)
	m.held = float64(held.mem-m.base.mem) / n
	m.keysHeld = float64(held.keys-m.base.keys) / n
	m.recent = float64(recent.mem-m.base.mem) / n
	m.keysRecent = float64(recent.keys-m.base.keys) / n
	return m
}

// waiters measures bytes per waiting goroutine's Redis state.
func waiters(ctx context.Context) (perWaiter float64, keysPer float64, queued int, took time.Duration, conns [2]int64) {
	s, err := redisserver.Start(redisserver.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop()
	admin := s.Client()
	defer admin.Close()
	hr, wr := s.Client(), s.Client()
	defer hr.Close()
	defer wr.Close()
	holder := dlock.New(hr, dlock.WithoutCohort())
	defer holder.Close(ctx)
	wc := dlock.New(wr, dlock.WithoutCohort())
	defer wc.Close(ctx)
	// warm up the waiting Client: its notification connection and scripts
	wl, err := holder.Mutex("warm").Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, _ = wc.Mutex("warm").Lock(wctx)
	cancel()
	_ = wl.Unlock(ctx)
	if l, err := wc.Mutex("warm").Lock(ctx); err == nil {
		_ = l.Unlock(ctx)
	}
	var pw sync.WaitGroup
	for i := range *names * *perName {
		pw.Add(1)
		go func() {
			defer pw.Done()
			if l, err := wc.Mutex(fmt.Sprintf("pool%d", i)).TryLock(ctx); err == nil {
				_ = l.Unlock(ctx)
			}
		}()
	}
	pw.Wait()
	var held []*dlock.Lease
	for i := range *names {
		l, err := holder.Mutex(fmt.Sprintf("w%d", i)).Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		held = append(held, l)
	}
	time.Sleep(500 * time.Millisecond)
	before := read(ctx, admin)
	wctx, cancel = context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *names {
		for range *perName {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := wc.Mutex(fmt.Sprintf("w%d", i)).Lock(wctx)
				if err == nil {
					_ = l.Unlock(ctx)
				}
			}()
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		queued = 0
		for i := range *names {
			info, err := holder.Inspect(ctx, fmt.Sprintf("w%d", i))
			if err != nil {
				log.Fatal(err)
			}
			queued += info.Waiters
		}
		if queued >= *names**perName || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	took = time.Since(start)
	after := read(ctx, admin)
	total := float64(*names * *perName)
	perWaiter = float64(after.mem-before.mem) / total
	keysPer = float64(after.keys-before.keys) / total
	conns = [2]int64{before.conns, after.conns}
	cancel()
	wg.Wait()
	for _, l := range held {
		_ = l.Unlock(ctx)
	}
	return
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	t0 := time.Now()
	var version string
	{
		s, err := redisserver.Start(redisserver.Config{})
		if err != nil {
			log.Fatal(err)
		}
		a := s.Client()
		info, _ := a.Info(ctx, "server").Result()
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				version = v
			}
		}
		a.Close()
		s.Stop()
	}

	mems := make([]*memResult, len(prims))
	loops := make([]loopResult, len(prims))
	for i, p := range prims {
		fmt.Fprintf(os.Stderr, "%s: memory...\n", p.name)
		mems[i] = memory(ctx, p)
		fmt.Fprintf(os.Stderr, "%s: CPU loop...\n", p.name)
		loops[i] = serverLoop(ctx, redisserver.Config{}, p, *workers)
	}

	// The single-server Mutex loop over TCP: the Cluster's transport, for a like comparison.
	fmt.Fprintf(os.Stderr, "Mutex over TCP: CPU loop...\n")
	tcpLoop := serverLoop(ctx, redisserver.Config{TCP: true}, prims[0], *workers)

	// The same at a third of the concurrency: what each of 3 masters sees of the 8 goroutines.
	fmt.Fprintf(os.Stderr, "Mutex over TCP, fewer goroutines: CPU loop...\n")
	third := max(1, *workers / *clusterN)
	thirdLoop := serverLoop(ctx, redisserver.Config{TCP: true}, prims[0], third)

	// A one-node Cluster: the cost of cluster mode itself, apart from sharding.
	fmt.Fprintf(os.Stderr, "1-node Cluster: CPU loop...\n")
	var oneLoop loopResult
	{
		s, err := redisserver.Start(redisserver.Config{Cluster: true})
		if err != nil {
			log.Fatal(err)
		}
		admin := s.Client()
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr}})
		c := dlock.New(cc, dlock.WithoutCohort())
		oneLoop = loop(ctx, c, []*redis.Client{admin}, prims[0], "cpu:", *loopDur, *workers)
		_ = c.Close(ctx)
		cc.Close()
		admin.Close()
		s.Stop()
	}

	fmt.Fprintf(os.Stderr, "waiters...\n")
	perWaiter, keysPerWaiter, queued, took, wconns := waiters(ctx)

	fmt.Fprintf(os.Stderr, "Cluster of %d masters...\n", *clusterN)
	cl, err := redisserver.StartCluster(redisserver.ClusterConfig{Masters: *clusterN, Replicas: -1})
	if err != nil {
		log.Fatal(err)
	}
	masters := cl.Masters()
	var admins []*redis.Client
	for _, m := range masters {
		admins = append(admins, m.Client())
	}
	cc := cl.Client()
	ccl := dlock.New(cc, dlock.WithoutCohort())
	clLoop := loop(ctx, ccl, admins, prims[0], "cpu:", *loopDur, *workers)
	_ = ccl.Close(ctx)
	cc.Close()
	for _, a := range admins {
		a.Close()
	}
	cl.Stop()

	windowed := false
	if *waitWin {
		last := mems[len(mems)-1].released
		wait := time.Until(last.Add(65 * time.Second))
		fmt.Fprintf(os.Stderr, "waiting %s past the op-log window...\n", wait.Round(time.Second))
		time.Sleep(wait)
		for _, m := range mems {
			a := read(ctx, m.admin)
			m.after = float64(a.mem-m.base.mem) / float64(*heldN)
			m.keysAfter = float64(a.keys-m.base.keys) / float64(*heldN)
		}
		windowed = true
	}
	for _, m := range mems {
		_ = m.client.Close(ctx)
		m.rdb.Close()
		m.admin.Close()
		m.srv.Stop()
	}

	// report
	fmt.Printf("# dlock capacity measurements\n\n")
	fmt.Printf("Redis %s, %d CPUs (GOMAXPROCS %d), %s, go run ./capacity (n=%d, loop=%s, workers=%d), total %s.\n",
		version, runtime.NumCPU(), runtime.GOMAXPROCS(0), time.Now().UTC().Format("2006-01-02"), *heldN, *loopDur, *workers, time.Since(t0).Round(time.Second))
	fmt.Printf("Every lease WithoutCohort (one Redis hold each); single servers over a unix socket.\n\n")
	fmt.Printf("## Per primitive\n\n")
	fmt.Printf("| primitive | bytes/held | keys/held | bytes/name just released | keys/name just released | bytes/name after window | keys/name after window | Redis CPU µs/acq | scripts/acq | cmds/acq | acq/s (client-bound) | acq/s per shard core (1e6/µs) | MB per 1M held |\n")
	fmt.Printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range prims {
		m, l := mems[i], loops[i]
		after, keysAfter := "not measured", "-"
		if windowed {
			after, keysAfter = fmt.Sprintf("%.0f", m.after), fmt.Sprintf("%.2f", m.keysAfter)
		}
		fmt.Printf("| %s | %.0f | %.2f | %.0f | %.2f | %s | %s | %.1f | %.2f | %.2f | %.0f | %.0f | %.0f |\n",
			p.name, m.held, m.keysHeld, m.recent, m.keysRecent, after, keysAfter, l.cpuUS, l.evals, l.cmds,
			float64(l.acq)/l.secs, 1e6/l.cpuUS, m.held*1e6/1e6)
	}
	fmt.Printf("\nAn acquisition is one acquire + release cycle (Latch: TrySetCount(1) + CountDown) on a fresh name; %d goroutines, no contention.\n", *workers)
	fmt.Printf("'just released' is read at once after releasing all %d leases (inside dlock's 1-minute op-log window)", *heldN)
	if windowed {
		fmt.Printf("; 'after window' at least 65 s after the release.\n")
	} else {
		fmt.Printf("; the window was not waited out.\n")
	}
	fmt.Printf("\n## Waiters\n\n")
	fmt.Printf("%d Mutex names held, %d waiters (%d per name, WithoutCohort, one handle each, one Client); %d queued in Redis after %s.\n\n",
		*names, *names**perName, *perName, queued, took.Round(time.Millisecond))
	fmt.Printf("Redis connections: %d before the waiters, %d once queued (the waiting Client's pool was opened beforehand).\n\n", wconns[0], wconns[1])
	fmt.Printf("| bytes per waiter | keys per waiter | MB per 1M waiters |\n|---:|---:|---:|\n| %.0f | %.3f | %.0f |\n",
		perWaiter, keysPerWaiter, perWaiter)
	fmt.Printf("\n## Cluster check (%d masters, no replicas, TCP)\n\n", *clusterN)
	fmt.Printf("| setup | acquisitions | acq/s | Redis CPU µs/acq (sum over servers) | scripts/acq | cmds/acq |\n|---|---:|---:|---:|---:|---:|\n")
	row := func(name string, l loopResult) {
		fmt.Printf("| %s | %d | %.0f | %.1f | %.2f | %.2f |\n", name, l.acq, float64(l.acq)/l.secs, l.cpuUS, l.evals, l.cmds)
	}
	row("single server, unix socket", loops[0])
	row("single server, TCP", tcpLoop)
	row(fmt.Sprintf("single server, TCP, %d goroutines", third), thirdLoop)
	row("1-node Cluster (all slots), TCP", oneLoop)
	row(fmt.Sprintf("%d-master Cluster, TCP", *clusterN), clLoop)
	fmt.Printf("\n| master | commands | share | Redis CPU s | CPU µs per command |\n|---|---:|---:|---:|---:|\n")
	var tot int64
	for _, n := range clLoop.perShard {
		tot += n
	}
	for i, n := range clLoop.perShard {
		fmt.Printf("| %d | %d | %.1f%% | %.3f | %.1f |\n", i+1, n, 100*float64(n)/float64(tot), clLoop.shardCPU[i], clLoop.shardCPU[i]*1e6/float64(n))
	}
	fmt.Printf("\n## Model\n\n")
	fmt.Printf("- acquisitions/s per shard core ≈ 1e6 / (Redis CPU µs per acquisition): Mutex %.0f (unix socket), %.0f (TCP), %.0f (1-node Cluster), %.0f (%d-master Cluster, per master core).\n",
		1e6/loops[0].cpuUS, 1e6/tcpLoop.cpuUS, 1e6/oneLoop.cpuUS, 1e6/clLoop.cpuUS, *clusterN)
	fmt.Printf("- memory per million held locks = bytes per held lock × 1e6 (Mutex %.0f MB); per million waiters %.0f MB.\n", mems[0].held, perWaiter)
	fmt.Printf("- N masters ≈ N × the per-shard rate for independent names (hash tags keep each lock on one slot; names spread as above); one hot lock stays on one shard.\n")
	fmt.Printf("- On %d CPUs the client and all %d masters share the cores, so the Cluster's total throughput cannot grow here; compare per-acquisition cost instead.\n", runtime.NumCPU(), *clusterN)
}

// forEach calls f(i) for i in [0, n) from the given number of goroutines, and returns when
// every call has.
func forEach(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		}()
	}
	wg.Wait()
}

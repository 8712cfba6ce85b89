// Command clientcmp measures dlock's acquire and release Lua scripts on go-redis against
// rueidis (issue 14): is rueidis (auto-pipelining) >= 15% faster in any shape? It is a
// measurement, not a port: each pair is an uncontended Mutex's Lock (TryLock: no queue) and
// Unlock with the KEYS and ARGV dlock sends (acquire.go tryHold, hold.go runReleaseOn), and
// every reply is checked to be the success reply, so Redis does dlock's real work.
//
//	cd bench && go run ./clientcmp -duration 3s
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// Values dlock sends for a plain Mutex with default options (options.go, client.go).
const (
	prefix     = "dlock:"
	leaseTTLms = "30000" // DefaultTTL
	opLogTTLms = "60000" // opLogTTL
	liveMs     = "750"   // livenessWindow
	graceMs    = "500"   // grantGrace
	queueTTLms = "60000" // queueTTL
	bargeMs    = "4"     // bargeWindow
	publishCmd = "PUBLISH"
)

// keysOf mirrors lockKeys in keys.go.
type keysOf struct{ lock, fence, opLog, queue, live, channel string }

func lockKeys(name string) keysOf {
	b := prefix + "{" + name + "}"
	return keysOf{b, b + ":fence", b + ":log", b + ":queue", b + ":live", b + ":released"}
}

// acquireArgs is tryHold's KEYS/ARGV for a Mutex without WithOwner, queue false (TryLock, or
// Lock's first attempt), no cohort. Both clients get the same strings; go-redis would encode
// dlock's bools and ints to exactly these bytes.
func acquireArgs(k keysOf, owner, hold string) ([]string, []string) {
	return []string{k.lock, k.fence, k.opLog, k.queue, k.live},
		[]string{owner, leaseTTLms, hold, opLogTTLms, "0", liveMs, k.channel, graceMs, publishCmd,
			"0", queueTTLms, bargeMs, "", "0", "", "0", "0"}
}

// releaseArgs is runReleaseOn's KEYS/ARGV for releaseNormal of a mutex hold.
func releaseArgs(k keysOf, owner, hold string) ([]string, []string) {
	return []string{k.lock, k.opLog, k.fence, k.queue, k.live},
		[]string{owner, hold, opLogTTLms, k.channel, "0", graceMs, publishCmd, "0", bargeMs, "", "", "0", "0"}
}

// client runs the two scripts; acquire reports whether the lock was taken.
type client interface {
	acquire(ctx context.Context, keys, args []string) (bool, error)
	release(ctx context.Context, keys, args []string) (int64, error)
	close()
}

func toAny(s []string) []any {
	a := make([]any, len(s))
	for i, v := range s {
		a[i] = v
	}
	return a
}

// goRedis uses dlock's own script objects, as dlock does (Run: EVALSHA, EVAL on NOSCRIPT).
type goRedis struct{ c *redis.Client }

func (g goRedis) acquire(ctx context.Context, keys, args []string) (bool, error) {
	res, err := scripts.Acquire.Run(ctx, g.c, keys, toAny(args)...).Int64Slice()
	if err != nil {
		return false, err
	}
	return checkAcquire(res)
}

func (g goRedis) release(ctx context.Context, keys, args []string) (int64, error) {
	return scripts.Release.Run(ctx, g.c, keys, toAny(args)...).Int64()
}

func (g goRedis) close() { _ = g.c.Close() }

// rueidisClient runs the same source through rueidis.Lua (EVALSHA, EVAL on NOSCRIPT).
type rueidisClient struct {
	c        rueidis.Client
	acq, rel *rueidis.Lua
}

func (r rueidisClient) acquire(ctx context.Context, keys, args []string) (bool, error) {
	res, err := r.acq.Exec(ctx, r.c, keys, args).AsIntSlice()
	if err != nil {
		return false, err
	}
	return checkAcquire(res)
}

func (r rueidisClient) release(ctx context.Context, keys, args []string) (int64, error) {
	return r.rel.Exec(ctx, r.c, keys, args).AsInt64()
}

func (r rueidisClient) close() { r.c.Close() }

// checkAcquire: {1, token, 1, 0} is a fresh hold; {0, pttl, foreign, behind} a refusal.
func checkAcquire(res []int64) (bool, error) {
	switch {
	case len(res) >= 3 && res[0] == 1 && res[2] == 1:
		return true, nil
	case len(res) >= 3 && res[0] == 0 && res[2] == 0:
		return false, nil
	}
	return false, fmt.Errorf("unexpected acquire reply %v", res)
}

type shape struct {
	name       string
	goroutines int
	// keyFor names the lock of goroutine g's i-th pair; contended shapes share one.
	keyFor    func(run string, g, i int) string
	contended bool
}

var shapes = []shape{
	{name: "uncontended 1x1", goroutines: 1, keyFor: freshKey},
	{name: "uncontended 1x8", goroutines: 8, keyFor: freshKey},
	{name: "keys 64 (1000 keys)", goroutines: 64, keyFor: func(run string, g, i int) string {
		// goroutine g owns keys g, g+64, ...: no two goroutines share one.
		per := (1000 - g + 63) / 64
		return run + "-k" + strconv.Itoa(g+64*(i%per))
	}},
	{name: "contended 8 on 1 key", goroutines: 8, contended: true, keyFor: func(run string, _, _ int) string {
		return run + "-hot"
	}},
}

func freshKey(run string, g, i int) string {
	return run + "-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type result struct {
	pairs, refusals int
	elapsed         time.Duration
	lat             []time.Duration
}

// run drives one client through one shape for d (after an unmeasured warm-up) and returns
// acquire+release pairs, refusals (contended shape) and per-pair latencies.
func run(c client, s shape, d, warm time.Duration, runID string) (result, error) {
	ctx := context.Background()
	var (
		wg       sync.WaitGroup
		measure  atomic.Bool
		stop     atomic.Bool
		mu       sync.Mutex
		all      []time.Duration
		refusals atomic.Int64
		firstErr error
	)
	for g := 0; g < s.goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner, nonce := randHex(16), randHex(8) // a handle's owner id; a Client's hold-id nonce
			lat := make([]time.Duration, 0, 1<<16)
			fail := func(err error) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				stop.Store(true)
			}
			for i := 0; !stop.Load(); i++ {
				k := lockKeys(s.keyFor(runID, g, i))
				hold := nonce + strconv.FormatUint(uint64(i+1), 36)
				t0 := time.Now()
				ak, aa := acquireArgs(k, owner, hold)
				for {
					ok, err := c.acquire(ctx, ak, aa)
					if err != nil {
						fail(err)
						return
					}
					if ok {
						break
					}
					if !s.contended {
						fail(fmt.Errorf("uncontended acquire refused on %s", k.lock))
						return
					}
					if measure.Load() {
						refusals.Add(1)
					}
					if stop.Load() {
						return // refused at the end: nothing held
					}
					// Retried at once with the same hold id, as a retried call would be.
				}
				rk, ra := releaseArgs(k, owner, hold)
				n, err := c.release(ctx, rk, ra)
				if err != nil {
					fail(err)
					return
				}
				if n != 2 { // 2: freed (no waiter: nobody queues here)
					fail(fmt.Errorf("release reply %d, want 2", n))
					return
				}
				if measure.Load() {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	time.Sleep(warm)
	measure.Store(true)
	start := time.Now()
	time.Sleep(d)
	measure.Store(false)
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	if firstErr != nil {
		return result{}, firstErr
	}
	slices.Sort(all)
	return result{pairs: len(all), refusals: int(refusals.Load()), elapsed: elapsed, lat: all}, nil
}

func pct(l []time.Duration, p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[min(len(l)-1, int(float64(len(l))*p))]
}

func main() {
	dur := flag.Duration("duration", 3*time.Second, "measured time per shape and client")
	warm := flag.Duration("warmup", 300*time.Millisecond, "unmeasured time before each measurement")
	addr := flag.String("addr", "", "existing redis host:port (default: a throwaway redis-server on TCP)")
	flag.Parse()
	if err := mainErr(*dur, *warm, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "clientcmp:", err)
		os.Exit(1)
	}
}

func mainErr(dur, warm time.Duration, addr string) error {
	// rueidis runs the identical source (its Lua computes the same SHA-1).
	acqSrc, relSrc := scripts.Source(scripts.Acquire), scripts.Source(scripts.Release)
	if addr == "" {
		srv, err := redisserver.Start(redisserver.Config{TCP: true})
		if err != nil {
			return err
		}
		defer srv.Stop()
		addr = srv.Addr
	}
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	// Load once; both clients then run EVALSHA (their NOSCRIPT fallback never fires).
	if err := scripts.Acquire.Load(ctx, admin).Err(); err != nil {
		return err
	}
	if err := scripts.Release.Load(ctx, admin).Err(); err != nil {
		return err
	}

	type variant struct {
		name string
		mk   func() (client, error)
	}
	newRueidis := func(always bool) func() (client, error) {
		return func() (client, error) {
			// DisableCache: EVALSHA never uses client-side caching; auto-pipelining stays on.
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr},
				DisableCache: true, AlwaysPipelining: always})
			if err != nil {
				return nil, err
			}
			return rueidisClient{c: c, acq: rueidis.NewLuaScript(acqSrc), rel: rueidis.NewLuaScript(relSrc)}, nil
		}
	}
	variants := []variant{
		// Default options: PoolSize 10 per GOMAXPROCS.
		{"go-redis", func() (client, error) { return goRedis{redis.NewClient(&redis.Options{Addr: addr})}, nil }},
		{"rueidis", newRueidis(false)},
		{"rueidis-always", newRueidis(true)},
	}

	fmt.Printf("dlock acquire+release (Mutex, uncontended TryLock/Unlock scripts), %s per run, GOMAXPROCS %d, redis at %s\n\n",
		dur, runtime.GOMAXPROCS(0), addr)
	fmt.Println("| shape | client | pairs/s | p50 | p99 | refusals | script calls/s | ratio vs go-redis |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	best, bestAt := 0.0, ""
	for si, s := range shapes {
		order := slices.Clone(variants)
		if si%2 == 1 { // alternate which client runs first, against drift (server memory, heat)
			slices.Reverse(order)
		}
		rate := map[string]float64{}
		res := map[string]result{}
		for _, v := range order {
			if err := admin.FlushAll(ctx).Err(); err != nil { // same server state for each run
				return err
			}
			c, err := v.mk()
			if err != nil {
				return err
			}
			r, err := run(c, s, dur, warm, randHex(4))
			c.close()
			if err != nil {
				return fmt.Errorf("%s, %s: %w", s.name, v.name, err)
			}
			res[v.name] = r
			rate[v.name] = float64(r.pairs) / r.elapsed.Seconds()
		}
		for _, v := range variants {
			r := res[v.name]
			ratio := rate[v.name] / rate["go-redis"]
			if v.name != "go-redis" && ratio > best {
				best, bestAt = ratio, s.name+", "+v.name
			}
			// Script calls: two per pair plus each refused acquire (the contended spin).
			calls := float64(2*r.pairs+r.refusals) / r.elapsed.Seconds()
			fmt.Printf("| %s | %s | %.0f | %s | %s | %d | %.0f | %.2fx |\n", s.name, v.name, rate[v.name],
				pct(r.lat, 0.50).Round(time.Microsecond), pct(r.lat, 0.99).Round(time.Microsecond), r.refusals, calls, ratio)
		}
	}
	verdict := "no shape reaches"
	if best >= 1.15 {
		verdict = "reaches"
	}
	fmt.Printf("\nbest rueidis/go-redis ratio: %.2fx (%s): %s the 1.15x bar\n", best, bestAt, verdict)
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// env is what a nemesis acts on.
type env struct {
	p        params
	ttl      time.Duration // the scenario's lease TTL
	procs    []*exec.Cmd
	lockSrv  *redisserver.Server // nil on a Cluster
	cluster  *redisserver.Cluster
	res      *redis.Client // the resource Redis, where clients say who holds each lock
	lockPx   *toxiproxy.Proxy
	resPx    []*toxiproxy.Proxy // per client, F3 only
	stop     <-chan struct{}
	seed     int64
	faults   atomic.Int64
	pausedMu sync.Mutex
	paused   map[int]bool

	// The notification and Cluster nemeses' own clients: dl (on lockRdb) inspects and
	// force-releases locks and probes the Cluster's availability.
	lockRdb redis.UniversalClient
	dl      *dlock.Client
	kinds   int // notification connection kills so far (alternating tracking, pub/sub)
	forces  int // forced releases so far (alternating ForceRelease, DEL)

	mu      sync.Mutex
	nemOps  []op          // the nemesis's forced releases, merged into the history
	kills   []int64       // instants of faults that may lose acknowledged writes
	windows []faultWindow // Cluster faults, for the unavailability figures
	probeOK map[int][]int64
	// lastFault is when the last Cluster fault on each slot range ended (nemesis goroutine).
	lastFault map[int]int64

	// The kill nemesis's: the scenario's locks (semaphores), the end of the run, the clients
	// it killed (by id), how it starts a replacement (the next id), and how long after each
	// kill of a holder its permits were free again (ns). procs grows under mu.
	locks       int
	until       int64
	dead        map[int]bool
	spawn       func(id int) (*exec.Cmd, error)
	permitsBack []int64
}

// faultWindow is one Cluster fault: from its start to the cluster being stable again, on the
// master serving the slot range third.
type faultWindow struct {
	third      int
	start, end int64
}

// setUp makes the nemesis's own clients for faults (and the sem workload's final check)
// that need them.
func (e *env) setUp(fault, workload string) error {
	switch {
	case workload == "sem":
		e.lockRdb = e.lockSrv.Client()
		e.dl = dlock.New(e.lockRdb, dlock.WithTTL(e.ttl))
	case e.cluster != nil:
		e.lockRdb = e.cluster.Client()
		e.dl = dlock.New(e.lockRdb, dlock.WithTTL(e.ttl))
		e.probeOK, e.lastFault = map[int][]int64{}, map[int]int64{}
	case fault == "notify":
		e.lockRdb = e.lockSrv.Client()
		e.dl = dlock.New(e.lockRdb)
	}
	return nil
}

func (e *env) tearDown() {
	if e.dl != nil {
		_ = e.dl.Close(context.Background())
	}
	if e.lockRdb != nil {
		_ = e.lockRdb.Close()
	}
}

func lockName(i int) string { return fmt.Sprintf("safety-%d", i) }

// crc16 is Redis Cluster's key hash (CRC16-CCITT, XMODEM).
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotOf is the Cluster slot of lock name's keys: they all carry the hash tag {name}.
func slotOf(name string) int { return int(crc16([]byte(name)) % 16384) }

// thirdOf is which of the three masters' slot ranges (as StartCluster splits them; failovers
// move a range whole) holds slot.
func thirdOf(slot int) int {
	for i := range 3 {
		if slot <= (i+1)*16384/3-1 {
			return i
		}
	}
	return 2
}

// startProbes, on a Cluster, takes and releases a probe lock on each master's slot range
// every 10ms until stop, recording when Redis answered (a grant or a refusal).
func (e *env) startProbes(stop <-chan struct{}, wg *sync.WaitGroup) {
	if e.cluster == nil {
		return
	}
	for t := range 3 {
		name := ""
		for k := 0; name == ""; k++ {
			if n := fmt.Sprintf("probe-%d", k); thirdOf(slotOf(n)) == t {
				name = n
			}
		}
		m := e.dl.Mutex(name, dlock.WithoutCohort())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				l, err := m.TryLock(ctx)
				if err == nil {
					_ = l.Unlock(ctx)
				}
				cancel()
				// A refusal is an answer too; a refusal because ctx ended or Redis gave no
				// answer is not.
				answered := err == nil || (errors.Is(err, dlock.ErrNotObtained) && !errors.Is(err, dlock.ErrUnavailable) &&
					!errors.Is(err, context.DeadlineExceeded))
				if answered {
					e.mu.Lock()
					e.probeOK[t] = append(e.probeOK[t], mono())
					e.mu.Unlock()
				}
			}
		}()
	}
}

// unavailability is, per Cluster fault, the longest gap between answered probes on the
// failing master's slot range that meets the fault's window.
func (e *env) unavailability() *dist {
	e.mu.Lock()
	defer e.mu.Unlock()
	var gaps []int64
	for _, w := range e.windows {
		ok := e.probeOK[w.third]
		sort.Slice(ok, func(i, j int) bool { return ok[i] < ok[j] })
		var worst int64
		for k := 1; k < len(ok); k++ {
			if ok[k-1] < w.end && ok[k] > w.start {
				worst = max(worst, ok[k]-ok[k-1])
			}
		}
		if worst > 0 {
			gaps = append(gaps, worst)
		}
		if os.Getenv("SAFETY_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "safety: fault on slots %d: %.3fs-%.3fs, longest gap %v\n", w.third, float64(w.start)/1e9, float64(w.end)/1e9, time.Duration(worst))
		}
	}
	return distOf(gaps)
}

// sleep waits d or until the run stops; it reports whether the run goes on.
func (e *env) sleep(d time.Duration) bool {
	select {
	case <-e.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// holder returns the client (1-based) the resource says holds lock i, or a random client.
func (e *env) holder(rng *rand.Rand, i int) int {
	if id, err := e.res.Get(context.Background(), fmt.Sprintf("holder:%d", i)).Int(); err == nil && id >= 1 && id <= len(e.procs) {
		return id
	}
	return 1 + rng.IntN(len(e.procs))
}

// pauseLen is a pause of 0.5-3 x TTL.
func (e *env) pauseLen(rng *rand.Rand) time.Duration {
	return time.Duration(float64(e.p.ttl) * (0.5 + 2.5*rng.Float64()))
}

// nemesis injects fault until the run stops and returns how many faults it injected.
func nemesis(fault string, e *env) int {
	var wg sync.WaitGroup
	loops := 1
	if fault == "F1" || fault == "F3" {
		loops = min(e.locks, 3)
	}
	for k := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each loop draws from its own generator, seeded from the scenario's seed.
			rng := rand.New(rand.NewPCG(uint64(e.seed), uint64(k)))
			for e.sleep(time.Duration(rng.Int64N(int64(e.p.ttl/2)))) && e.inject(rng, fault, k) {
			}
		}()
	}
	wg.Wait()
	return int(e.faults.Load())
}

// inject injects one fault; it reports false when there is nothing (more) to do.
func (e *env) inject(rng *rand.Rand, fault string, k int) bool {
	ttl := e.ttl
	switch fault {
	case "notify":
		return e.notify(rng)
	case "cluster-failover", "cluster-kill":
		return e.clusterFault(rng, fault == "cluster-kill")
	case "":
		return false
	case "kill": // SIGKILL a semaphore's holder, start a client in its place
		if !e.sleep(2 * ttl) {
			return false
		}
		return e.killHolder(rng)
	case "F1": // SIGSTOP a holder of lock k for 0.5-3 x TTL
		id := e.holder(rng, k)
		e.pausedMu.Lock()
		busy := e.paused[id]
		e.paused[id] = true
		e.pausedMu.Unlock()
		if busy {
			return true
		}
		c := e.procs[id-1]
		_ = c.Process.Signal(syscall.SIGSTOP)
		e.faults.Add(1)
		time.Sleep(e.pauseLen(rng))
		_ = c.Process.Signal(syscall.SIGCONT)
		e.pausedMu.Lock()
		delete(e.paused, id)
		e.pausedMu.Unlock()
	case "F2": // every reply from the lock's Redis delayed past the TTL for a while
		if !e.sleep(2 * ttl) {
			return false
		}
		if err := addToxic(e.lockPx, fmt.Sprintf(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":%d}}`,
			(ttl*6/5).Milliseconds())); err != nil {
			fmt.Fprintln(os.Stderr, "safety: F2:", err)
			return false
		}
		e.faults.Add(1)
		time.Sleep(2 * ttl)
		removeToxic(e.lockPx, "slow")
	case "F3": // the writes of lock k's holder to the resource take 0.5-3 x TTL to arrive
		id := e.holder(rng, k)
		px := e.resPx[id-1]
		name := fmt.Sprintf("slow%d", k)
		lat := e.pauseLen(rng)
		if err := addToxic(px, fmt.Sprintf(`{"name":%q,"type":"latency","stream":"upstream","attributes":{"latency":%d}}`,
			name, lat.Milliseconds())); err != nil {
			return true // this client's link is already slowed by another loop
		}
		e.faults.Add(1)
		// Removing the toxic would flush what it holds: keep it until a write sent just now
		// has gone through.
		time.Sleep(lat + ttl/2)
		removeToxic(px, name)
	case "F4": // a partition (no data either way) for 1.5 x TTL, or connection resets
		if !e.sleep(2 * ttl) {
			return false
		}
		if rng.IntN(2) == 0 {
			_ = addToxic(e.lockPx, `{"name":"cut-down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
			_ = addToxic(e.lockPx, `{"name":"cut-up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)
			e.faults.Add(1)
			time.Sleep(ttl * 3 / 2)
			removeToxic(e.lockPx, "cut-down")
			removeToxic(e.lockPx, "cut-up")
		} else {
			_ = addToxic(e.lockPx, `{"name":"reset","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`)
			e.faults.Add(1)
			time.Sleep(ttl / 5)
			removeToxic(e.lockPx, "reset")
		}
	case "F5": // Redis paused longer than the TTL
		if !e.sleep(2 * ttl) {
			return false
		}
		e.lockSrv.Pause()
		e.faults.Add(1)
		time.Sleep(ttl * 3 / 2)
		e.lockSrv.Resume()
	case "F6-restart", "F6-aof", "F6-delayed":
		if !e.sleep(3 * ttl) {
			return false
		}
		e.mu.Lock()
		e.kills = append(e.kills, mono())
		e.mu.Unlock()
		e.lockSrv.Kill()
		e.faults.Add(1)
		if fault == "F6-delayed" {
			time.Sleep(2 * ttl)
		}
		if err := e.lockSrv.Restart(); err != nil {
			fmt.Fprintln(os.Stderr, "safety: restart redis:", err)
			return false
		}
	case "F9": // a client's wall clock steps an hour forward, or back
		if !e.sleep(ttl / 2) {
			return false
		}
		sig := syscall.SIGUSR1
		if e.faults.Add(1)%2 == 0 {
			sig = syscall.SIGUSR2
		}
		for _, c := range e.procs {
			_ = c.Process.Signal(sig)
		}
	}
	return true
}

// notify kills the lock Redis's dlock-notify connections of one kind (tracking and pub/sub
// alternately), then force-releases a held lock; or does only one of the two.
func (e *env) notify(rng *rand.Rand) bool {
	if !e.sleep(200*time.Millisecond + time.Duration(rng.Int64N(int64(300*time.Millisecond)))) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	i, held := e.heldLock(ctx, rng)
	action := rng.IntN(3) // 0: kill only, 1: kill then force, 2: force only
	note := ""
	if action < 2 {
		flag := "t"
		if e.kinds%2 == 1 {
			flag = "P"
		}
		e.kinds++
		if n, err := e.killNotify(ctx, flag); err != nil {
			fmt.Fprintln(os.Stderr, "safety: notify:", err)
		} else if n > 0 {
			e.faults.Add(1)
			note = "kill-" + flag
		}
	}
	if action > 0 && held {
		e.force(ctx, i, note)
	}
	return true
}

// heldLock returns a lock held now, if it finds one among a few random picks.
func (e *env) heldLock(ctx context.Context, rng *rand.Rand) (int, bool) {
	for range 4 {
		i := rng.IntN(e.p.locks)
		if info, err := e.dl.Inspect(ctx, lockName(i)); err == nil && info.Held {
			return i, true
		}
	}
	return 0, false
}

// killNotify closes every dlock-notify connection on the lock Redis whose CLIENT LIST flags
// contain flag ('t': the tracking reader, 'P': the pub/sub receiver).
func (e *env) killNotify(ctx context.Context, flag string) (int, error) {
	return e.lockSrv.KillClientsFlagged(ctx, "dlock-notify", flag)
}

// force breaks lock i whoever holds it, as an operator would: dlock's ForceRelease and a
// plain DEL of the lock key, alternately. The op is "ok" when the lock was held.
func (e *env) force(ctx context.Context, i int, note string) {
	call := mono()
	var held bool
	var err error
	e.forces++
	if e.forces%2 == 1 {
		held, err = e.dl.ForceRelease(ctx, lockName(i))
	} else {
		var n int64
		n, err = e.lockRdb.Del(ctx, "dlock:{"+lockName(i)+"}").Result()
		held = n == 1
	}
	o := op{Lock: i, Kind: "force", Call: call, Return: mono(), Result: "fail", Note: note}
	switch {
	case err != nil:
		o.Result = "unknown"
		fmt.Fprintln(os.Stderr, "safety: force release:", err)
	case held:
		o.Result = "ok"
	}
	e.mu.Lock()
	e.nemOps = append(e.nemOps, o)
	e.mu.Unlock()
}

// clusterFault fails over the master of a random lock's slot: gracefully (CLUSTER FAILOVER
// on its replica) or by killing it, letting its replica take over and restarting it to rejoin
// as a replica. It waits for the cluster to be stable again.
func (e *env) clusterFault(rng *rand.Rand, kill bool) bool {
	pause := time.Second + time.Duration(rng.Int64N(int64(time.Second)))
	if e.p.quick {
		pause /= 3
	}
	if !e.sleep(pause) {
		return false
	}
	cl := e.cluster
	slot := slotOf(lockName(rng.IntN(e.p.locks)))
	// Masters do not vote for a second failover of one shard within 2 x node timeout (2s):
	// a failover sooner would stall (a manual one pauses the master's writes for 5s and gives
	// up), which measures the cluster's pacing rule, not dlock.
	if last, ok := e.lastFault[thirdOf(slot)]; ok {
		if wait := time.Duration(last + int64(2500*time.Millisecond) - mono()); wait > 0 && !e.sleep(wait) {
			return false
		}
	}
	master := cl.MasterForSlot(slot)
	if master == nil || cl.ReplicaOf(master) == nil {
		_ = cl.WaitStable(20 * time.Second)
		return true
	}
	start := mono()
	e.faults.Add(1)
	var err error
	if kill {
		e.mu.Lock()
		e.kills = append(e.kills, start)
		e.mu.Unlock()
		if _, _, err = cl.KillMaster(master); err == nil {
			err = master.Restart()
		}
	} else {
		err = cl.GracefulFailover(cl.ReplicaOf(master))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "safety: cluster fault:", err)
	}
	if err := cl.WaitStable(20 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "safety: cluster not stable:", err)
	}
	end := mono()
	e.lastFault[thirdOf(slot)] = end
	e.mu.Lock()
	e.windows = append(e.windows, faultWindow{third: thirdOf(slot), start: start, end: end})
	e.mu.Unlock()
	return true
}

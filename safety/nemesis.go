package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// env is what a nemesis acts on.
type env struct {
	p        params
	procs    []*exec.Cmd
	lockSrv  *redisserver.Server
	res      *redis.Client // the resource Redis, where clients say who holds each lock
	lockPx   *toxiproxy.Proxy
	resPx    []*toxiproxy.Proxy // per client, F3 only
	stop     <-chan struct{}
	seed     int64
	faults   atomic.Int64
	pausedMu sync.Mutex
	paused   map[int]bool
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
		loops = min(e.p.locks, 3)
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
	ttl := e.p.ttl
	switch fault {
	case "":
		return false
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

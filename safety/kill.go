package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// The "kill" nemesis (issue 11): every 2-2.5 x TTL it SIGKILLs the process holding permits
// of a random semaphore (or a random client) and starts a fresh client process in its place.
// The killed holder's lease, which it never recorded, comes from what it left in the resource
// Redis (semHeldKey, with its release if it had sent one); how long its permits stay out comes from the deadline Redis keeps for
// its hold. At the end of the run every permit must be free again.

// permitSlack allows for the millisecond resolution of the server's clock and the nemesis's
// read of it when comparing a killed holder's deadline with the kill.
const permitSlack = 5 * time.Millisecond

// killHolder kills the holder of a random semaphore and starts a client in its place; it
// reports false when there is nothing (more) to do.
func (e *env) killHolder(rng *rand.Rand) bool {
	i := rng.IntN(e.locks)
	id := e.holder(rng, i)
	if e.dead[id] {
		return true
	}
	e.mu.Lock()
	e.dead[id] = true // before the kill: the driver waiting on the process reads it
	e.mu.Unlock()
	at := mono()
	_ = e.procs[id-1].Process.Kill()
	e.faults.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if b, err := e.res.Get(ctx, semHeldKey(id)).Bytes(); err == nil {
		var sh semHeld
		if json.Unmarshal(b, &sh) == nil {
			a := sh.Acq
			a.Client = id
			e.mu.Lock()
			e.nemOps = append(e.nemOps, a)
			if sh.Release > 0 { // sent, outcome unknown: the lease may have ended there
				e.nemOps = append(e.nemOps, op{Client: id, G: a.G, Lock: a.Lock, Kind: "release", Call: sh.Release, Return: at,
					Token: a.Token, Acq: a.Call, Result: "unknown"})
			}
			e.mu.Unlock()
			e.permitsOut(ctx, a, at)
		}
		_ = e.res.Del(ctx, semHeldKey(id)).Err()
	}
	if mono() > e.until-int64(e.ttl) {
		return false // too late in the run for a new client to do anything
	}
	cmd, err := e.spawn(len(e.procs) + 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "safety: kill: start a client:", err)
		return false
	}
	e.mu.Lock()
	e.procs = append(e.procs, cmd)
	e.mu.Unlock()
	return true
}

// permitsOut records how long after the kill at the killed lease a's permits are free again:
// the deadline Redis keeps for its hold ("#e:"+owner, server ms), if it still has one.
func (e *env) permitsOut(ctx context.Context, a op, at int64) {
	if a.Owner == "" {
		return // the "incr" control: no lease, nothing ends it
	}
	var dl *redis.StringCmd
	var now *redis.TimeCmd
	sent := mono()
	_, err := e.lockRdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		dl = p.HGet(ctx, "dlock:{"+lockName(a.Lock)+"}", "#e:"+a.Owner)
		now = p.Time(ctx)
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return // released, or pruned already
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "safety: kill: read the holder's deadline:", err)
		return
	}
	d, derr := dl.Int64()
	if derr != nil {
		return
	}
	// A lower bound: Redis read its clock after the read was sent (the time the reply took to
	// come back would count against dlock).
	back := (d-now.Val().UnixMilli())*int64(time.Millisecond) + (sent - at)
	e.mu.Lock()
	e.permitsBack = append(e.permitsBack, max(back, 0))
	e.mu.Unlock()
}

// lostPermits returns, once every client has stopped, how many permits of the semaphores
// cannot be had a TTL (and a grant's grace) after the last lease could have ended: dlock's
// are taken back with TryAcquire, the "incr" control's read from its counter.
func (e *env) lostPermits(weak string) int {
	time.Sleep(e.ttl + grantGrace + 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lost := 0
	for i := range e.locks {
		if weak == "incr" {
			n, err := e.lockRdb.Get(ctx, incrKey(i)).Int()
			if err != nil && !errors.Is(err, redis.Nil) {
				fmt.Fprintln(os.Stderr, "safety: read the control's permits:", err)
			}
			lost += max(n, 0)
			continue
		}
		s := e.dl.Semaphore(lockName(i), semPermits)
		free := 0
		for n := semPermits; n >= 1 && free == 0; n-- {
			l, err := s.TryAcquire(ctx, n)
			if err == nil {
				free = n
				_ = l.Unlock(ctx)
			} else if !errors.Is(err, dlock.ErrNotObtained) {
				fmt.Fprintln(os.Stderr, "safety: take the permits back:", err)
			}
		}
		lost += semPermits - free
	}
	return lost
}

// startClient is how runScenario starts a client process; the kill nemesis starts its
// replacements with it.
func startClient(spec clientSpec) (*exec.Cmd, error) {
	b, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-client", string(b))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// notRecorded returns the nemesis's ops but the killed holders' leases (and their releases)
// that their clients recorded themselves before the kill: a holder killed between recording
// its lease and taking back what it left would be counted twice.
func notRecorded(recorded, nem []op) []op {
	acquired, released := map[leaseID]bool{}, map[leaseID]bool{}
	for _, o := range recorded {
		switch o.Kind {
		case "acquire":
			acquired[leaseID{o.holder(), o.Call}] = true
		case "release":
			released[leaseID{o.holder(), o.Acq}] = true
		}
	}
	var out []op
	for _, o := range nem {
		if o.Kind == "acquire" && acquired[leaseID{o.holder(), o.Call}] || o.Kind == "release" && released[leaseID{o.holder(), o.Acq}] {
			continue
		}
		out = append(out, o)
	}
	return out
}

// semLine is a sem scenario's figures beside the main table's: kills, how soon killed
// holders' permits were free again, permits lost.
func semLine(r result) string {
	v := r.Verdict
	if r.Scenario.Fault != "kill" {
		return fmt.Sprintf("permits lost at the end %d", v.PermitsLost)
	}
	return fmt.Sprintf("client kills %d: a killed holder's permits free again after %s (late, over the TTL: %d); permits lost at the end %d",
		v.Kills, v.PermitsBack, v.PermitsLate, v.PermitsLost)
}

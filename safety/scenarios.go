package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/redisserver"
)

// A scenario is one workload under one fault.
type scenario struct {
	Name     string `json:"name"`
	Workload string `json:"workload"` // "fenced" or "lockset"
	Fault    string `json:"fault"`    // "", "F1", "F5", "F6-restart", "F6-aof", "F6-delayed"
	Weak     bool   `json:"control"`  // a positive control: the weakened client
	// Guarantee lists what dlock promises here (a count above 0 is a violation); Expected
	// lists the documented limits, measured and reported beside them.
	Guarantee []string `json:"guarantee"`
	Expected  []string `json:"expected"`
	About     string   `json:"about"`
}

var scenarios = []scenario{
	{Name: "baseline-lockset", Workload: "lockset", Guarantee: []string{"overlaps", "lost"},
		About: "no fault: the lock alone keeps read-modify-write exact"},
	{Name: "baseline-fenced", Workload: "fenced", Guarantee: []string{"overlaps", "stale"},
		About: "no fault, fenced register"},
	{Name: "F1-fenced", Workload: "fenced", Fault: "F1", Guarantee: []string{"overlaps", "stale"},
		About: "clients paused (SIGSTOP) 0.5-3 x TTL, often inside the critical section; the register refuses stale tokens"},
	{Name: "F1-lockset", Workload: "lockset", Fault: "F1", Guarantee: []string{"overlaps"}, Expected: []string{"lost"},
		About: "the same pauses on an unfenced read-modify-write: the reason fencing exists"},
	{Name: "F5-lockset", Workload: "lockset", Fault: "F5", Guarantee: []string{"overlaps", "lost"},
		About: "Redis paused (SIGSTOP) for 1.5 x TTL"},
	{Name: "F6-restart", Workload: "lockset", Fault: "F6-restart", Expected: []string{"overlaps", "lost"},
		About: "Redis killed and restarted at once without persistence: a lock can be granted twice (documented)"},
	{Name: "F6-aof", Workload: "lockset", Fault: "F6-aof", Guarantee: []string{"overlaps", "lost"},
		About: "Redis killed and restarted with appendfsync always"},
	{Name: "F6-delayed", Workload: "lockset", Fault: "F6-delayed", Guarantee: []string{"overlaps", "lost"},
		About: "Redis killed and restarted after 2 x TTL, without persistence"},
	{Name: "control-F1-lockset", Workload: "lockset", Fault: "F1", Weak: true,
		About: "control: SET NX PX + plain DEL, no owner check"},
	{Name: "control-F1-fenced", Workload: "fenced", Fault: "F1", Weak: true,
		About: "control: fencing disabled (tokens handed out, never checked)"},
}

// result is one scenario's outcome.
type result struct {
	Scenario scenario `json:"scenario"`
	Verdict  verdict  `json:"verdict"`
	Faults   int      `json:"faults"`
	Control  bool     `json:"control"`
	Seconds  float64  `json:"seconds"`
	TTLms    int64    `json:"ttl_ms"`
	Clients  int      `json:"clients"`
}

func (r result) count(what string) int {
	switch what {
	case "overlaps":
		return r.Verdict.Overlaps
	case "stale":
		return r.Verdict.StaleAccepted
	case "lost":
		return r.Verdict.LostUpdates
	}
	return 0
}

// Violations counts breaches of what dlock guarantees in this scenario.
func (r result) Violations() int {
	n := 0
	for _, g := range r.Scenario.Guarantee {
		n += r.count(g)
	}
	return n
}

// Caught reports whether a control run showed the harness can see a broken lock.
func (r result) Caught() bool {
	return r.Verdict.Overlaps+r.Verdict.StaleAccepted+r.Verdict.LostUpdates > 0
}

type params struct {
	dur     time.Duration
	ttl     time.Duration
	work    time.Duration
	clients int
}

func runAll(quick bool, only string) ([]result, error) {
	p := params{dur: 60 * time.Second, ttl: 500 * time.Millisecond, work: 20 * time.Millisecond, clients: 5}
	if quick {
		p = params{dur: 4 * time.Second, ttl: 300 * time.Millisecond, work: 20 * time.Millisecond, clients: 4}
	}
	var results []result
	for _, s := range scenarios {
		if only != "" && !strings.Contains(s.Name, only) {
			continue
		}
		r, err := runScenario(s, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		v := r.Verdict
		fmt.Printf("%-20s %6d acquisitions %4d faults  overlaps %d  stale accepted %d  lost updates %d  unknown %d  violations %d%s\n",
			s.Name, v.Acquisitions, r.Faults, v.Overlaps, v.StaleAccepted, v.LostUpdates, v.Unknown, r.Violations(), controlNote(r))
		results = append(results, r)
	}
	return results, nil
}

func controlNote(r result) string {
	if !r.Control {
		return ""
	}
	if r.Caught() {
		return "  (control: caught)"
	}
	return "  (control: CAUGHT NOTHING)"
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func runScenario(s scenario, p params) (result, error) {
	r := result{Scenario: s, Control: s.Weak, TTLms: p.ttl.Milliseconds(), Clients: p.clients}
	cfg := redisserver.Config{}
	if s.Fault == "F6-aof" {
		cfg.Args = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	lockSrv, err := redisserver.Start(cfg)
	if err != nil {
		return r, err
	}
	defer lockSrv.Stop()
	resSrv, err := redisserver.Start(redisserver.Config{})
	if err != nil {
		return r, err
	}
	defer resSrv.Stop()
	dir, err := os.MkdirTemp("", "dlock-safety-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	until := mono() + int64(p.dur)
	procs := make([]*exec.Cmd, p.clients)
	for i := range procs {
		spec := clientSpec{ID: i + 1, LockURL: lockSrv.URL(), ResURL: resSrv.URL(), Workload: s.Workload, Weak: s.Weak,
			TTL: p.ttl, Work: p.work, Until: until, Name: "safety", HistPath: filepath.Join(dir, fmt.Sprintf("c%d.jsonl", i+1)),
			Drift: drift, OpTimeout: 2 * time.Second}
		b, _ := json.Marshal(spec)
		cmd := exec.Command(os.Args[0], "-client", string(b))
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return r, err
		}
		procs[i] = cmd
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.Faults = nemesis(s.Fault, p, procs, lockSrv, resSrv, stop)
	}()
	var failed error
	for _, cmd := range procs {
		if err := waitTimeout(cmd, p.dur+30*time.Second); err != nil && failed == nil {
			failed = fmt.Errorf("client: %w", err)
		}
	}
	close(stop)
	wg.Wait()
	if failed != nil {
		return r, failed
	}
	var ops []op
	for i := range procs {
		h, err := readHistory(filepath.Join(dir, fmt.Sprintf("c%d.jsonl", i+1)))
		if err != nil {
			return r, err
		}
		ops = append(ops, h...)
	}
	final := int64(-1)
	if s.Workload == "lockset" {
		res := resSrv.Client()
		final, _ = res.Get(context.Background(), "counter").Int64()
		_ = res.Close()
	}
	r.Verdict = check(ops, final)
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

func waitTimeout(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("did not finish within %v", d)
	}
}

// nemesis injects fault until stop closes and returns how many faults it injected.
func nemesis(fault string, p params, procs []*exec.Cmd, lockSrv, resSrv *redisserver.Server, stop <-chan struct{}) int {
	res := resSrv.Client()
	defer res.Close()
	n := 0
	sleep := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	for {
		switch fault {
		case "":
			return n
		case "F1":
			if !sleep(time.Duration(rand.Int64N(int64(p.ttl / 2)))) {
				return n
			}
			// Pause the client inside the critical section (it says so in the resource Redis).
			c := procs[rand.IntN(len(procs))]
			if id, err := res.Get(context.Background(), "holder").Int(); err == nil && id >= 1 && id <= len(procs) {
				c = procs[id-1]
			}
			_ = c.Process.Signal(syscall.SIGSTOP)
			n++
			pause := time.Duration(float64(p.ttl) * (0.5 + 2.5*rand.Float64()))
			time.Sleep(pause)
			_ = c.Process.Signal(syscall.SIGCONT)
		case "F5":
			if !sleep(2 * p.ttl) {
				return n
			}
			lockSrv.Pause()
			n++
			time.Sleep(p.ttl * 3 / 2)
			lockSrv.Resume()
		case "F6-restart", "F6-aof", "F6-delayed":
			if !sleep(3 * p.ttl) {
				return n
			}
			lockSrv.Kill()
			n++
			if fault == "F6-delayed" {
				time.Sleep(2 * p.ttl)
			}
			if err := lockSrv.Restart(); err != nil {
				fmt.Fprintln(os.Stderr, "safety: restart redis:", err)
				return n
			}
		}
	}
}

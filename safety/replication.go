package main

// Replication faults (issue 12): a failover that loses a lock's write (F8) and a Redlock
// master that restarts empty (Kleppmann's scenario). Each trial is one fault between two
// lock clients in this process: A takes a fresh lock, the fault strikes, and B tries to take
// the same lock until the lock's servers are whole again. A double grant is B's lease handed
// out while A's lease was still valid as A knew it (A's Err was nil and its Remaining above
// zero when B's TryLock returned); A and B share this process's monotonic clock, so the
// comparison needs no model. B's token must be above A's whenever B follows A.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// A replScenario is one way of losing a lock's write.
type replScenario struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"`               // "plain", "ack" (WithReplicaAck(1, ackTimeout)) or "redlock" (NewRedlock over 5 servers)
	Fault    string `json:"fault"`              // "failover" (Sentinel), "kill", "restart-now" or "restart-after-ttl" (a Redlock master)
	Replicas int    `json:"replicas,omitempty"` // the Sentinel master's replicas
	// PromoteUnacked gives the replica that acknowledges replica-priority 0, so the sentinels
	// promote the one whose link was cut.
	PromoteUnacked bool `json:"promote_unacked,omitempty"`
	// Safe: dlock promises no double grant here, so one is a violation; elsewhere double grants
	// are the measured cost of the mode. Token regressions are violations everywhere.
	Safe  bool   `json:"safe"`
	About string `json:"about"`
}

var replScenarios = []replScenario{
	{Name: "F8-plain", Mode: "plain", Fault: "failover", Replicas: 1,
		About: "Sentinel (1 master, 1 replica, 3 sentinels, down after 300ms): the replica's link cut (CLIENT KILL TYPE master on it, and a wrong masterauth so it cannot reconnect), A takes the lock with a plain Mutex, the master is SIGKILLed at once and the replica promoted, the old master restarted empty as its replica; B tries until then + 500ms"},
	{Name: "F8-ack1", Mode: "ack", Fault: "failover", Replicas: 1, Safe: true,
		About: "F8-plain with WithReplicaAck(1, 100ms) on both clients (every replica the master has): A's acquisition waits for the replica that cannot answer"},
	{Name: "F8-ack1-of-2", Mode: "ack", Fault: "failover", Replicas: 2, PromoteUnacked: true,
		About: "two replicas, one link cut, WithReplicaAck(1, 100ms): the replica still linked acknowledges A's write, and has replica-priority 0, so the sentinels promote the one that did not (WAIT is not consensus)"},
	{Name: "F8-redlock5", Mode: "redlock", Fault: "kill", Safe: true,
		About: "NewRedlock over 5 independent servers: A holds the lock on all 5, one of them is SIGKILLed and restarted empty at once (its lost write); B tries for 500ms"},
	{Name: "redlock-restart-now", Mode: "redlock", Fault: "restart-now",
		About: "Kleppmann's scenario: A reaches only 3 of the 5 servers (the other two refuse its connections) and holds the lock on those 3; one of them is SIGKILLed and restarted empty at once; B, which reaches all 5, tries for 1s"},
	{Name: "redlock-restart-after-ttl", Mode: "redlock", Fault: "restart-after-ttl", Safe: true,
		About: "the same, but the killed server restarts only a TTL after the kill (antirez's delayed restart): A's hold there has expired by then, so its lease is below a quorum"},
}

// replResult is one replication scenario's outcome.
type replResult struct {
	Scenario replScenario `json:"scenario"`
	Trials   int          `json:"trials"`  // faults: failovers, kills or restarts
	Held     int          `json:"held"`    // A held the lock when the fault struck
	Refused  int          `json:"refused"` // A's acquisition was refused (ErrNotReplicated, ...)
	Granted  int          `json:"granted"` // B got the lock after A had held it: A's hold did not survive
	Double   int          `json:"double"`  // of those, B got it while A's lease was still valid
	// NoticedFirst counts the grants to B after A's lease had ended (A saw the loss first).
	NoticedFirst     int      `json:"noticed_first"`
	TokenRegressions int      `json:"token_regressions"`
	Examples         []string `json:"examples,omitempty"` // the first double grants, timed from the fault
	TTLms            int64    `json:"ttl_ms"`
	Seconds          float64  `json:"seconds"`
	Seed             int64    `json:"seed"`
}

// Violations counts breaches of what dlock promises in the scenario.
func (r replResult) Violations() int {
	if r.Scenario.Safe {
		return r.TokenRegressions + r.Double
	}
	return r.TokenRegressions
}

func (r replResult) line() string {
	return fmt.Sprintf("%-26s %4d faults  A held %d refused %d  B granted after A %d: double %d, A noticed first %d  tokens %d  violations %d  %.0fs",
		r.Scenario.Name, r.Trials, r.Held, r.Refused, r.Granted, r.Double, r.NoticedFirst, r.TokenRegressions, r.Violations(), r.Seconds)
}

const (
	ackTimeout      = 100 * time.Millisecond
	sentinelTTL     = 5 * time.Second // outlives a failover, so A's lease is valid when B may get the lock
	redlockTTL      = time.Second
	maxExamples     = 5
	bRetryInterval  = 5 * time.Millisecond
	bTriesAfterHeal = 500 * time.Millisecond // B tries on after a Sentinel group is whole again
	redlockTries    = 500 * time.Millisecond // B tries after a Redlock fault
)

// replTrials is how many faults a scenario runs.
func replTrials(p params) int {
	if p.quick {
		return 3
	}
	return 200
}

// runReplication runs the replication scenarios that match only, all at once: a trial waits
// on Sentinel's timers (a failover takes 3-4s here) far more than it computes.
func runReplication(p params, only string, seed int64) ([]replResult, error) {
	match, err := regexp.Compile(only)
	if err != nil {
		return nil, fmt.Errorf("-only: %w", err)
	}
	var (
		out  []replResult
		errs = make([]error, len(replScenarios))
		wg   sync.WaitGroup
	)
	results := make([]*replResult, len(replScenarios))
	for i, s := range replScenarios {
		if !match.MatchString(s.Name) {
			continue
		}
		r := &replResult{Scenario: s, Seed: seed + 500 + int64(i)}
		results[i] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			rng := rand.New(rand.NewSource(r.Seed))
			if s.Fault == "failover" {
				errs[i] = runSentinelTrials(r, replTrials(p), rng)
			} else {
				errs[i] = runRedlockTrials(r, replTrials(p), rng)
			}
			r.Seconds = time.Since(start).Seconds()
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r == nil {
			continue
		}
		if errs[i] != nil {
			return nil, fmt.Errorf("%s: after %d faults: %w", r.Scenario.Name, r.Trials, errs[i])
		}
		fmt.Println(r.line())
		out = append(out, *r)
	}
	return out, nil
}

// judge records the race of one trial: a is A's lease (nil if A was refused), b B's (nil if
// B got nothing), bAt when B's TryLock returned and aLive whether A's lease was valid then.
func (r *replResult) judge(a, b *dlock.Lease, faultAt, bAt time.Time, aLive bool) {
	if a == nil || b == nil {
		return
	}
	r.Granted++
	if b.Token() <= a.Token() {
		r.TokenRegressions++
	}
	if !aLive {
		r.NoticedFirst++
		return
	}
	r.Double++
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf("fault %d: B granted %v after the fault with A's lease valid for %v more (tokens A %d, B %d)",
			r.Trials, bAt.Sub(faultAt).Round(time.Millisecond), a.Remaining().Round(time.Millisecond), a.Token(), b.Token()))
	}
}

// tryUntil has B try the lock every bRetryInterval until it gets it or stop says so; it
// returns B's lease (or nil), when TryLock returned it and whether A's lease was valid then.
func tryUntil(ctx context.Context, m *dlock.Mutex, a *dlock.Lease, stop func() bool) (*dlock.Lease, time.Time, bool) {
	for !stop() {
		lb, err := m.TryLock(ctx)
		if err == nil {
			at := time.Now()
			return lb, at, a != nil && a.Err() == nil && a.Remaining() > 0
		}
		time.Sleep(bRetryInterval)
	}
	return nil, time.Time{}, false
}

// runSentinelTrials runs F8: per trial a failover whose promoted replica missed A's write.
func runSentinelTrials(r *replResult, trials int, rng *rand.Rand) error {
	r.TTLms = sentinelTTL.Milliseconds()
	g, err := redisserver.StartSentinel(redisserver.SentinelConfig{Replicas: r.Scenario.Replicas, DownAfter: 300 * time.Millisecond, FailoverTimeout: time.Second})
	if err != nil {
		return err
	}
	defer g.Stop()
	opts := []dlock.Option{dlock.WithTTL(sentinelTTL), dlock.WithoutCohort()}
	if r.Scenario.Mode == "ack" {
		opts = append(opts, dlock.WithReplicaAck(1, ackTimeout))
	}
	ra, rb := g.FailoverClient(), g.FailoverClient()
	defer ra.Close()
	defer rb.Close()
	ca, cb := dlock.New(ra, opts...), dlock.New(rb, opts...)
	ctx := context.Background()
	defer ca.Close(ctx)
	defer cb.Close(ctx)
	for ; r.Trials < trials; r.Trials++ {
		if err := sentinelTrial(ctx, r, g, ca, cb, rng); err != nil {
			return err
		}
	}
	return nil
}

func sentinelTrial(ctx context.Context, r *replResult, g *redisserver.SentinelGroup, ca, cb *dlock.Client, rng *rand.Rand) error {
	if err := mend(ctx, g); err != nil {
		return err
	}
	replicas := g.Replicas()
	if len(replicas) != r.Scenario.Replicas {
		return fmt.Errorf("%d replicas running, want %d", len(replicas), r.Scenario.Replicas)
	}
	cut := replicas
	if r.Scenario.PromoteUnacked {
		k := rng.Intn(len(replicas))
		keep := replicas[k]
		cut = []*redisserver.Server{replicas[1-k]}
		if err := setPriority(ctx, keep, 0); err != nil {
			return err
		}
		if err := setPriority(ctx, cut[0], 100); err != nil {
			return err
		}
	}
	for _, s := range cut {
		if err := cutLink(ctx, s); err != nil {
			return err
		}
	}
	name := fmt.Sprintf("f8-%d", r.Trials)
	a, err := ca.Mutex(name).TryLock(ctx)
	if err != nil {
		if !errors.Is(err, dlock.ErrNotReplicated) {
			return fmt.Errorf("A's TryLock: %w", err)
		}
		r.Refused++
		a = nil
	} else {
		r.Held++
	}
	faultAt := time.Now()
	healed := make(chan error, 1)
	var healedAt time.Time
	go func() {
		_, _, err := g.KillMaster()
		if err == nil {
			old := g.Servers()
			for _, s := range old {
				if !s.Running() {
					err = g.Rejoin(s)
					break
				}
			}
		}
		healed <- err
	}()
	var healErr error
	done := false
	lb, bAt, aLive := tryUntil(ctx, cb.Mutex(name), a, func() bool {
		if !done {
			select {
			case healErr = <-healed:
				done, healedAt = true, time.Now()
			default:
			}
		}
		return done && (healErr != nil || time.Since(healedAt) > bTriesAfterHeal)
	})
	r.judge(a, lb, faultAt, bAt, aLive)
	if !done {
		healErr = <-healed
	}
	if a != nil {
		_ = a.Unlock(ctx)
	}
	if lb != nil {
		_ = lb.Unlock(ctx)
	}
	return healErr
}

// cutLink closes replica s's link to its master and keeps it from coming back: a wrong
// masterauth fails its reconnects (the master has no password), so no write of the master
// reaches it until it is promoted (and masterauth no longer matters) or restarted.
func cutLink(ctx context.Context, s *redisserver.Server) error {
	c := s.Client()
	defer c.Close()
	if err := c.ConfigSet(ctx, "masterauth", "cut-by-the-safety-suite").Err(); err != nil {
		return fmt.Errorf("cut the link of replica %s: %w", s.Addr, err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		return fmt.Errorf("cut the link of replica %s: %w", s.Addr, err)
	}
	return nil
}

// mend clears what cutLink set on every running data server of g (a cut replica that was not
// promoted keeps it otherwise).
func mend(ctx context.Context, g *redisserver.SentinelGroup) error {
	for _, s := range g.Servers() {
		if !s.Running() {
			continue
		}
		c := s.Client()
		err := c.ConfigSet(ctx, "masterauth", "").Err()
		c.Close()
		if err != nil {
			return fmt.Errorf("masterauth on %s: %w", s.Addr, err)
		}
	}
	return nil
}

func setPriority(ctx context.Context, s *redisserver.Server, p int) error {
	c := s.Client()
	defer c.Close()
	if err := c.ConfigSet(ctx, "replica-priority", fmt.Sprint(p)).Err(); err != nil {
		return fmt.Errorf("replica-priority on %s: %w", s.Addr, err)
	}
	return nil
}

// runRedlockTrials runs the Redlock faults over 5 independent servers without persistence.
func runRedlockTrials(r *replResult, trials int, rng *rand.Rand) error {
	r.TTLms = redlockTTL.Milliseconds()
	servers := make([]*redisserver.Server, 5)
	for i := range servers {
		s, err := redisserver.Start(redisserver.Config{TCP: true})
		if err != nil {
			return err
		}
		defer s.Stop()
		servers[i] = s
	}
	// Addresses where nothing listens: A's view of the servers it cannot reach.
	unreachable := make([]string, 2)
	for i := range unreachable {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		unreachable[i] = l.Addr().String()
		l.Close()
	}
	ctx := context.Background()
	for ; r.Trials < trials; r.Trials++ {
		if err := redlockTrial(ctx, r, servers, unreachable, rng); err != nil {
			return err
		}
	}
	return nil
}

// redlock returns a Redlock client over addrs and a function that closes it and its clients.
func redlock(addrs []string) (*dlock.Client, func()) {
	rdbs := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	}
	c := dlock.NewRedlock(rdbs, dlock.WithTTL(redlockTTL))
	return c, func() {
		_ = c.Close(context.Background())
		for _, r := range rdbs {
			_ = r.Close()
		}
	}
}

func redlockTrial(ctx context.Context, r *replResult, servers []*redisserver.Server, unreachable []string, rng *rand.Rand) error {
	all := make([]string, len(servers))
	for i, s := range servers {
		all[i] = s.Addr
	}
	// A's view: in the restart scenarios two random servers are out of its reach, so it holds
	// the lock on exactly a quorum of 3.
	aAddrs := append([]string(nil), all...)
	held := []int{0, 1, 2, 3, 4}
	if r.Scenario.Fault != "kill" {
		perm := rng.Perm(5)
		aAddrs[perm[3]], aAddrs[perm[4]] = unreachable[0], unreachable[1]
		held = perm[:3]
	}
	ca, closeA := redlock(aAddrs)
	defer closeA()
	cb, closeB := redlock(all)
	defer closeB()
	name := fmt.Sprintf("restart-%d", r.Trials)
	a, err := ca.Mutex(name).TryLock(ctx)
	if err != nil {
		r.Refused++
		a = nil
	} else {
		r.Held++
	}
	victim := servers[held[rng.Intn(len(held))]]
	victim.Kill()
	faultAt := time.Now()
	if r.Scenario.Fault == "restart-after-ttl" {
		time.Sleep(redlockTTL)
	}
	if err := victim.Restart(); err != nil {
		return err
	}
	until := time.Now().Add(redlockTries)
	lb, bAt, aLive := tryUntil(ctx, cb.Mutex(name), a, func() bool { return time.Now().After(until) })
	r.judge(a, lb, faultAt, bAt, aLive)
	if a != nil {
		_ = a.Unlock(ctx)
	}
	if lb != nil {
		_ = lb.Unlock(ctx)
	}
	return nil
}

// replicationSection is the replication part of SAFETY.md.
func replicationSection(results []replResult, info runInfo) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cmd := fmt.Sprintf("make safety SAFETY_ARGS='-only \"F8|redlock-restart\" -seed %d'", info.Seed)
	p("## Replication: a failover that loses a write (F8), and Redlock restarts\n\n")
	p("Generated with `%s` on %s, in %s. ", cmd, time.Now().UTC().Format("2006-01-02 15:04 UTC"), info.Elapsed.Round(time.Second))
	p("The scenarios run at once (each on servers of its own). Each fault is one trial between two lock clients in one process: A takes a fresh lock, the fault strikes at once, and B tries it every %v until the servers are whole again. ", bRetryInterval)
	p("A **double grant** is B getting the lock while A's lease was still valid as A knew it (`Err` nil and `Remaining` above zero when B's `TryLock` returned); ")
	p("**A noticed first** counts B's grants after A's lease had ended (A was told of the loss first); a **token regression** is B's token not above A's. ")
	p("Double grants are violations where dlock promises none (✓ below); elsewhere they are the measured cost of the mode. ")
	p("Servers run without persistence; Sentinel leases have a TTL of %v (longer than a failover), Redlock leases %v.\n\n", sentinelTTL, redlockTTL)
	p("| scenario | faults | A held | A refused | B granted after A | double grants | per 1,000 faults | A noticed first | token regressions | promised |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range results {
		promised := "tokens"
		if r.Scenario.Safe {
			promised = "no double grant, tokens"
		}
		per := 0.0
		if r.Trials > 0 {
			per = 1000 * float64(r.Double) / float64(r.Trials)
		}
		p("| %s | %d | %d | %d | %d | %d | %.0f | %d | %d | %s |\n", r.Scenario.Name, r.Trials, r.Held, r.Refused, r.Granted, r.Double, per, r.NoticedFirst, r.TokenRegressions, promised)
	}
	p("\n")
	for _, r := range results {
		p("- **%s**: %s.", r.Scenario.Name, r.Scenario.About)
		for _, e := range r.Examples {
			p(" E.g. %s.", e)
		}
		p("\n")
	}
	return b.String()
}

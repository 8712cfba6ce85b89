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
	"slices"
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
	// CutAfter cuts the link after A's acquisition returned, in odd trials (even ones cut it
	// before): a write acknowledged before the cut against one refused because of it.
	CutAfter bool `json:"cut_after,omitempty"`
	// Control: the fault is known to lose A's hold, so a full run that shows no double grant
	// means the harness cannot see one, and fails (as the other scenarios' controls do).
	Control bool `json:"control,omitempty"`
	// Safe: dlock promises no double grant here, so one is a violation; elsewhere double grants
	// are the measured cost of the mode. Token regressions are violations everywhere.
	Safe  bool   `json:"safe"`
	About string `json:"about"`
}

var replScenarios = []replScenario{
	{Name: "F8-plain", Mode: "plain", Fault: "failover", Replicas: 1, Control: true,
		About: "Sentinel (1 master, 1 replica, 3 sentinels, down after 300ms): the replica's link cut (CLIENT KILL TYPE master on it, and a wrong masterauth so it cannot reconnect), A takes the lock with a plain Mutex, the master is SIGKILLed at once and the replica promoted, the old master restarted empty as its replica; B tries until then + 500ms"},
	{Name: "F8-ack1", Mode: "ack", Fault: "failover", Replicas: 1, CutAfter: true, Safe: true,
		About: "F8-plain with WithReplicaAck(1, 100ms) on both clients (every replica the master has); in even faults the link is cut before A's acquisition, which the replica then cannot acknowledge (A refused), in odd ones right after A's acquisition returned (acknowledged), before the kill"},
	{Name: "F8-ack1-of-2", Mode: "ack", Fault: "failover", Replicas: 2, PromoteUnacked: true, Control: true,
		About: "two replicas, one link cut, WithReplicaAck(1, 100ms): the replica still linked acknowledges A's write, and has replica-priority 0 (set once, and seen by every sentinel, before the first fault), so the sentinels promote the one that did not (checked every fault; WAIT is not consensus)"},
	{Name: "F8-redlock5", Mode: "redlock", Fault: "kill", Safe: true,
		About: "NewRedlock over 5 independent servers: A holds the lock on all 5, one of them is SIGKILLed and restarted empty at once (its lost write); B tries for 500ms"},
	{Name: "redlock-restart-now", Mode: "redlock", Fault: "restart-now", Control: true,
		About: "Kleppmann's scenario: A reaches only 3 of the 5 servers (the other two refuse its connections) and holds the lock on those 3; one of them is SIGKILLed and restarted empty at once; B, which reaches all 5, tries for 500ms. A Redlock lease must include the first master in the list that answers (dlock's ticket rule, for fair waiting), so when that is one of A's two surviving servers B gets in only after A saw the loss: that alone spares about 2 faults in 5"},
	{Name: "redlock-restart-after-ttl", Mode: "redlock", Fault: "restart-after-ttl", Safe: true,
		About: "the same, but the killed server restarts only a TTL after the kill (antirez's delayed restart): A's hold there has passed its safe deadline by then (TTL x (1 - drift) from its last renewal's send), so A's lease is below a quorum and over before B can take the restarted server; 0 follows from the deadline, and this checks that dlock keeps it"},
}

// replResult is one replication scenario's outcome.
type replResult struct {
	Scenario replScenario `json:"scenario"`
	Trials   int          `json:"trials"`  // faults: failovers, kills or restarts
	Held     int          `json:"held"`    // A held the lock when the fault struck
	Refused  int          `json:"refused"` // A's acquisition was refused (ErrNotReplicated, ...)
	Granted  int          `json:"granted"` // B got the lock after A had held it: A's hold did not survive
	Double   int          `json:"double"`  // of those, B got it while A's lease was still valid
	// Kept counts the faults where A held the lock and B did not get it: the hold survived the
	// fault (or outlived B's tries).
	Kept int `json:"kept"`
	// Ambiguous counts the double grants where A's lease ended while B's successful TryLock
	// was in flight (counted as double grants: B may have been granted first).
	Ambiguous int `json:"ambiguous"`
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

// Caught reports whether a control scenario showed a double grant (the harness can see one).
func (r replResult) Caught() bool { return r.Double > 0 }

func (r replResult) line() string {
	return fmt.Sprintf("%-26s %4d faults  A held %d refused %d  kept %d  B granted after A %d: double %d (ambiguous %d), A noticed first %d  tokens %d  violations %d  %.0fs",
		r.Scenario.Name, r.Trials, r.Held, r.Refused, r.Kept, r.Granted, r.Double, r.Ambiguous, r.NoticedFirst, r.TokenRegressions, r.Violations(), r.Seconds)
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
// on Sentinel's timers (a failover takes 3-4s here) far more than it computes. A scenario
// that fails leaves the others' results; the error names every failure.
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
			if errs[i] == nil && s.Safe && r.Held == 0 {
				errs[i] = fmt.Errorf("A never held the lock: the scenario shows nothing")
			}
		}()
	}
	wg.Wait()
	var failed []error
	for i, r := range results {
		if r == nil {
			continue
		}
		if errs[i] != nil {
			failed = append(failed, fmt.Errorf("%s: after %d faults: %w", r.Scenario.Name, r.Trials, errs[i]))
			continue
		}
		fmt.Println(r.line() + replControlNote(*r, p))
		out = append(out, *r)
	}
	return out, errors.Join(failed...)
}

// replControlNote marks a control scenario's line in a full run (a quick run's few faults may
// show no double grant by chance).
func replControlNote(r replResult, p params) string {
	switch {
	case !r.Scenario.Control || p.quick:
		return ""
	case r.Caught():
		return "  (control: caught)"
	}
	return "  (control: NOT CAUGHT)"
}

// bTry is B's successful TryLock: its lease and when the call started and returned.
type bTry struct {
	l           *dlock.Lease
	start, done time.Time
}

// aWatch records when A's lease ended (Done closed), for the comparison with B's grant.
type aWatch struct {
	l     *dlock.Lease
	ended chan time.Time // buffered 1: the end time, once
}

func watchA(a *dlock.Lease) *aWatch {
	if a == nil {
		return nil
	}
	w := &aWatch{l: a, ended: make(chan time.Time, 1)}
	go func() {
		<-a.Done()
		w.ended <- time.Now()
	}()
	return w
}

// endedAt returns when A's lease ended, or the zero time if it had not when asked.
func (w *aWatch) endedAt() time.Time {
	select {
	case t := <-w.ended:
		w.ended <- t
		return t
	default:
		return time.Time{}
	}
}

// judge records the race of one trial: A's lease (nil if A was refused) against B's
// successful TryLock (b.l nil if B got nothing). A's lease counts as valid at B's grant unless
// it ended before B's call started; if it ended while B's call was in flight the grant counts
// as a double grant and as ambiguous; if it is still on when judged, its Remaining must be
// above zero (its own safe deadline may have passed without the end being told yet).
func (r *replResult) judge(a *aWatch, b bTry, faultAt time.Time) {
	if a == nil {
		return
	}
	if b.l == nil {
		r.Kept++
		return
	}
	r.Granted++
	if b.l.Token() <= a.l.Token() {
		r.TokenRegressions++
	}
	remaining := a.l.Remaining()
	end := a.endedAt()
	switch {
	case !end.IsZero() && end.Before(b.start):
		r.NoticedFirst++
		return
	case !end.IsZero():
		r.Ambiguous++
	case remaining <= 0:
		r.NoticedFirst++
		return
	}
	r.Double++
	if len(r.Examples) < maxExamples {
		what := fmt.Sprintf("A's lease valid for %v more", remaining.Round(time.Millisecond))
		if !end.IsZero() {
			what = "A's lease ending while B's call was in flight"
		}
		r.Examples = append(r.Examples, fmt.Sprintf("fault %d: B granted %v after the fault, %s (tokens A %d, B %d)",
			r.Trials, b.done.Sub(faultAt).Round(time.Millisecond), what, a.l.Token(), b.l.Token()))
	}
}

// tryUntil has B try the lock every bRetryInterval until it gets it or stop says so. Refusals
// and unavailability are what B expects while the fault lasts; ErrInvalid (a broken harness)
// ends the trial with an error.
func tryUntil(ctx context.Context, m *dlock.Mutex, stop func() bool) (bTry, error) {
	for !stop() {
		start := time.Now()
		lb, err := m.TryLock(ctx)
		if err == nil {
			return bTry{l: lb, start: start, done: time.Now()}, nil
		}
		if errors.Is(err, dlock.ErrInvalid) || errors.Is(err, dlock.ErrClosed) {
			return bTry{}, fmt.Errorf("B's TryLock: %w", err)
		}
		time.Sleep(bRetryInterval)
	}
	return bTry{}, nil
}

// runSentinelTrials runs F8: per trial a failover whose promoted replica missed A's write.
func runSentinelTrials(r *replResult, trials int, rng *rand.Rand) error {
	r.TTLms = sentinelTTL.Milliseconds()
	g, err := redisserver.StartSentinel(redisserver.SentinelConfig{Replicas: r.Scenario.Replicas, DownAfter: 300 * time.Millisecond, FailoverTimeout: time.Second})
	if err != nil {
		return err
	}
	defer g.Stop()
	ctx := context.Background()
	var keep *redisserver.Server
	if r.Scenario.PromoteUnacked {
		// The replica that acknowledges is the same all run: never promoted, so it stays a
		// replica while the other two servers take turns as master.
		keep = g.Replicas()[rng.Intn(r.Scenario.Replicas)]
		if err := setPriority(ctx, g, keep, 0); err != nil {
			return err
		}
	}
	opts := []dlock.Option{dlock.WithTTL(sentinelTTL), dlock.WithoutCohort()}
	if r.Scenario.Mode == "ack" {
		opts = append(opts, dlock.WithReplicaAck(1, ackTimeout))
	}
	ra, rb := g.FailoverClient(), g.FailoverClient()
	defer ra.Close()
	defer rb.Close()
	ca, cb := dlock.New(ra, opts...), dlock.New(rb, opts...)
	defer ca.Close(ctx)
	defer cb.Close(ctx)
	for ; r.Trials < trials; r.Trials++ {
		if err := sentinelTrial(ctx, r, g, keep, ca, cb); err != nil {
			return err
		}
	}
	return nil
}

func sentinelTrial(ctx context.Context, r *replResult, g *redisserver.SentinelGroup, keep *redisserver.Server, ca, cb *dlock.Client) error {
	replicas := g.Replicas()
	if len(replicas) != r.Scenario.Replicas {
		return fmt.Errorf("%d replicas running, want %d", len(replicas), r.Scenario.Replicas)
	}
	// Every replica in sync first (one the sentinels re-pointed at the last promoted master may
	// still be loading its copy), so what is acknowledged depends only on the cut.
	master := g.Master()
	if master == nil {
		return fmt.Errorf("no master reported")
	}
	for _, s := range replicas {
		if err := master.AwaitReplicated(s, 15*time.Second); err != nil {
			return err
		}
	}
	var cut []*redisserver.Server
	for _, s := range replicas {
		if s != keep {
			cut = append(cut, s)
		}
	}
	cutAfter := r.Scenario.CutAfter && r.Trials%2 == 1
	if !cutAfter {
		for _, s := range cut {
			if err := cutLink(ctx, s); err != nil {
				return err
			}
		}
	}
	name := fmt.Sprintf("f8-%d", r.Trials)
	a, err := ca.Mutex(name).TryLock(ctx)
	switch {
	case err == nil:
		r.Held++
	case errors.Is(err, dlock.ErrNotReplicated) && !cutAfter:
		r.Refused++
		a = nil
	default:
		return fmt.Errorf("A's TryLock: %w", err)
	}
	if cutAfter {
		for _, s := range cut {
			if err := cutLink(ctx, s); err != nil {
				return err
			}
		}
	} else if a != nil {
		// The cut must have kept A's write from every cut replica: otherwise this fault is not
		// the one the scenario names.
		for _, s := range cut {
			if err := missing(ctx, s, name); err != nil {
				return err
			}
		}
	}
	aw := watchA(a)
	faultAt := time.Now()
	healed := make(chan error, 1)
	go func() {
		now, _, err := g.KillMaster()
		if err == nil && keep != nil && now == keep {
			err = fmt.Errorf("the sentinels promoted %s, the replica with priority 0", now.Addr)
		}
		if err == nil {
			err = g.Rejoin(master)
		}
		healed <- err
	}()
	var healErr error
	var healedAt time.Time
	done := false
	b, berr := tryUntil(ctx, cb.Mutex(name), func() bool {
		if !done {
			select {
			case healErr = <-healed:
				done, healedAt = true, time.Now()
			default:
			}
		}
		return done && (healErr != nil || time.Since(healedAt) > bTriesAfterHeal)
	})
	r.judge(aw, b, faultAt)
	if !done {
		healErr = <-healed
	}
	if a != nil {
		_ = a.Unlock(ctx)
	}
	if b.l != nil {
		_ = b.l.Unlock(ctx)
	}
	return errors.Join(berr, healErr)
}

// missing checks that replica s has no key of lock name.
func missing(ctx context.Context, s *redisserver.Server, name string) error {
	c := s.Client()
	defer c.Close()
	n, err := c.Exists(ctx, dlock.DefaultKeyPrefix+"{"+name+"}").Result()
	if err != nil {
		return fmt.Errorf("replica %s: %w", s.Addr, err)
	}
	if n != 0 {
		return fmt.Errorf("replica %s has lock %q although its link was cut first", s.Addr, name)
	}
	return nil
}

// cutLink closes replica s's link to its master and keeps it from coming back: a wrong
// masterauth fails its reconnects (the master has no password), so no write of the master
// reaches it until it is promoted (and masterauth no longer matters) or restarted. The old
// master, which the next fault kills, is restarted with a fresh configuration.
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

// setPriority sets replica s's replica-priority and waits until every sentinel reports it
// (they read a replica's INFO every 10s).
func setPriority(ctx context.Context, g *redisserver.SentinelGroup, s *redisserver.Server, p int) error {
	c := s.Client()
	defer c.Close()
	if err := c.ConfigSet(ctx, "replica-priority", fmt.Sprint(p)).Err(); err != nil {
		return fmt.Errorf("replica-priority on %s: %w", s.Addr, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		seen, err := g.ReplicaPrioritySeen(s, p)
		if err != nil {
			return err
		}
		if seen {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sentinels did not see replica-priority %d on %s within 30s", p, s.Addr)
		}
	}
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
	ctx := context.Background()
	for ; r.Trials < trials; r.Trials++ {
		if err := redlockTrial(ctx, r, servers, rng); err != nil {
			return err
		}
	}
	return nil
}

// unreachable returns n distinct loopback addresses where nothing listens (checked: ports
// freed by the kernel may be taken again, or handed out twice in a row), A's view of the
// servers it cannot reach. Two equal ones would make A's Redlock refuse its masters as one
// server.
func unreachable(n int) ([]string, error) {
	var out []string
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := l.Addr().String()
		l.Close()
		if slices.Contains(out, addr) {
			continue
		}
		if c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond); err == nil {
			c.Close()
			continue
		}
		out = append(out, addr)
	}
	return out, nil
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

func redlockTrial(ctx context.Context, r *replResult, servers []*redisserver.Server, rng *rand.Rand) error {
	all := make([]string, len(servers))
	for i, s := range servers {
		all[i] = s.Addr
	}
	// A's view: in the restart scenarios two random servers are out of its reach, so it holds
	// the lock on exactly a quorum of 3.
	aAddrs := append([]string(nil), all...)
	held := []int{0, 1, 2, 3, 4}
	if r.Scenario.Fault != "kill" {
		away, err := unreachable(2)
		if err != nil {
			return err
		}
		perm := rng.Perm(5)
		aAddrs[perm[3]], aAddrs[perm[4]] = away[0], away[1]
		held = perm[:3]
	}
	ca, closeA := redlock(aAddrs)
	defer closeA()
	cb, closeB := redlock(all)
	defer closeB()
	name := fmt.Sprintf("restart-%d", r.Trials)
	a, err := ca.Mutex(name).TryLock(ctx)
	if err != nil {
		return fmt.Errorf("A's TryLock on a fresh lock with %d servers in reach: %w", len(held), err)
	}
	r.Held++
	aw := watchA(a)
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
	b, berr := tryUntil(ctx, cb.Mutex(name), func() bool { return time.Now().After(until) })
	r.judge(aw, b, faultAt)
	_ = a.Unlock(ctx)
	if b.l != nil {
		_ = b.l.Unlock(ctx)
	}
	return berr
}

// replicationSection is the replication part of SAFETY.md.
func replicationSection(results []replResult, info runInfo) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	args := fmt.Sprintf("-seed %d", info.Seed)
	if info.Only != "" {
		args = fmt.Sprintf("-only '%s' %s", info.Only, args)
	}
	cmd := fmt.Sprintf("make safety SAFETY_ARGS=\"%s\"", args)
	if info.Quick {
		cmd = fmt.Sprintf("SAFETY_QUICK=1 make safety SAFETY_ARGS=\"%s -out ../docs\"", args)
	}
	p("## Replication: a failover that loses a write (F8), and Redlock restarts\n\n")
	p("Generated with `%s` on %s; the trials took %s. ", cmd, time.Now().UTC().Format("2006-01-02 15:04 UTC"), info.ReplElapsed.Round(time.Second))
	p("The scenarios run at once (each on servers of its own). Each fault is one trial between two lock clients in one process: A takes a fresh lock, the fault strikes at once, and B tries it every %v until the servers are whole again. ", bRetryInterval)
	p("A **double grant** is B getting the lock while A's lease was still valid as A knew it: its lease had not ended (`Done`) when B's successful `TryLock` started, and its `Remaining` was above zero when that call returned; ")
	p("one that ended while B's call was in flight counts too (*ambiguous*: B may have been granted first). ")
	p("**A noticed first** counts B's grants after A's lease had ended (A was told of the loss first); a **token regression** is B's token not above A's. ")
	p("**Kept** counts the faults after which A's hold survived (B did not get the lock in its tries). ")
	p("Double grants are violations where dlock promises none (the *promised* column); elsewhere they are the measured cost of the mode. ")
	p("Servers run without persistence; Sentinel leases have a TTL of %v (longer than a failover), Redlock leases %v.\n\n", sentinelTTL, redlockTTL)
	p("| scenario | faults | A held | A refused | kept | B granted after A | double grants (ambiguous) | per 1,000 faults | A noticed first | token regressions | promised |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range results {
		promised := "tokens"
		if r.Scenario.Safe {
			promised = "no double grant, tokens"
		}
		per := 0.0
		if r.Trials > 0 {
			per = 1000 * float64(r.Double) / float64(r.Trials)
		}
		if r.Scenario.Control {
			promised += " (control: a double grant must show)"
		}
		p("| %s | %d | %d | %d | %d | %d | %d (%d) | %.0f | %d | %d | %s |\n", r.Scenario.Name, r.Trials, r.Held, r.Refused, r.Kept, r.Granted, r.Double, r.Ambiguous, per, r.NoticedFirst, r.TokenRegressions, promised)
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

// Command safety is dlock's fault-injection suite: client processes take locks in a loop and
// work on a protected resource in a second Redis, while a nemesis pauses clients, delays,
// cuts or resets their connections (toxiproxy, in this process), slows their writes, pauses,
// kills and restarts Redis, or steps the clients' wall clocks. The merged histories are then
// checked: porcupine checks each lock's history for linearizability against a lease-aware,
// owner-aware fenced mutex model, and counters measure overlapping validity windows, stale
// writes accepted, lost updates, releases of another owner's lock and leases handed out
// already expired. What dlock guarantees counts as violations; the documented limits are
// reported as expected figures. RWMutex (readers may overlap readers, nothing else may) and
// MultiLock (each member an exclusive lease beside plain Mutexes on the same names) run under
// the same faults; so do Semaphore (never more permits out than it has, a SIGKILLed holder's
// permits back within its TTL, none lost) and Latch (no Wait returns before the count reached
// zero). Weakened clients (SET NX + plain DEL; writes without the token check; a
// clock without monotonic readings; writers that take a read lease; multi-locks taken one
// member at a time with one released at once; a semaphore without leases; a latch Wait one
// CountDown early) are the positive controls: if one shows no
// violation, the harness is not sensitive enough and the run fails.
//
//	cd safety && go run .            # full run, writes ../docs/SAFETY.md
//	SAFETY_QUICK=1 go run .          # about two minutes
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	client := flag.String("client", "", "run as a client process with this JSON spec (internal)")
	out := flag.String("out", "", "write SAFETY.md and safety.jsonl into this directory")
	only := flag.String("only", "", "run only scenarios whose name matches this regular expression (a plain part of a name will do)")
	seed := flag.Int64("seed", 0, "base seed of the nemeses' and clients' random choices (default: from the clock); scenario i uses seed+i, replication scenario i seed+500+i")
	dur := flag.Duration("dur", 0, "run each scenario this long instead of the default (for trying things out)")
	html := flag.String("html", "out", "write porcupine's visualisation of an illegal history into this directory")
	flag.Parse()
	if *client != "" {
		var spec clientSpec
		if err := json.Unmarshal([]byte(*client), &spec); err != nil {
			fmt.Fprintln(os.Stderr, "safety client:", err)
			os.Exit(2)
		}
		if err := runClient(spec); err != nil {
			fmt.Fprintln(os.Stderr, "safety client:", err)
			os.Exit(1)
		}
		return
	}
	redis.SetLogger(quietLogger{}) // the nemeses' clients see dial failures while a server is down
	quick := os.Getenv("SAFETY_QUICK") != ""
	if err := os.MkdirAll(*html, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "safety:", err)
		os.Exit(1)
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1e9
	}
	p := paramsFor(quick, *dur, *html)
	start := time.Now()
	results, err := runAll(p, *only, *seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "safety:", err)
		os.Exit(1)
	}
	elapsed := time.Since(start)
	// The replication trials come after, and a failed one keeps what the rest found (written
	// below); the run still fails.
	replStart := time.Now()
	repl, replErr := runReplication(p, *only, *seed)
	if replErr != nil {
		fmt.Fprintln(os.Stderr, "safety:", replErr)
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "safety:", err)
			os.Exit(1)
		}
		info := runInfo{Quick: quick, Seed: *seed, Elapsed: elapsed, ReplElapsed: time.Since(replStart), Only: *only, P: p}
		if err := writeReport(filepath.Clean(*out), results, repl, info); err != nil {
			fmt.Fprintln(os.Stderr, "safety:", err)
			os.Exit(1)
		}
	}
	fmt.Println(summaryLine(results, repl, p))
	unknown := 0
	for _, r := range results {
		unknown += r.Verdict.PorcupineUnknown
	}
	if unknown > 0 {
		fmt.Fprintf(os.Stderr, "safety: porcupine could not decide %d lock histories in time: the run proves nothing about them\n", unknown)
	}
	if violations, caught, controls := tally(results, repl, p); violations > 0 || caught < controls || unknown > 0 || replErr != nil {
		os.Exit(1)
	}
}

// tally counts violations and controls; the replication controls count in a full run only
// (a quick run's 3 faults may show no double grant by chance).
func tally(results []result, repl []replResult, p params) (violations, caught, controls int) {
	for _, r := range repl {
		violations += r.Violations()
		if r.Scenario.Control && !p.quick {
			controls++
			if r.Caught() {
				caught++
			}
		}
	}
	for _, r := range results {
		if r.Control {
			controls++
			if r.Caught() {
				caught++
			}
			continue
		}
		violations += r.Violations()
	}
	return violations, caught, controls
}

// summaryLine is the run's last line: ops, faults, violations, and the controls' catch.
func summaryLine(results []result, repl []replResult, p params) string {
	ops, faults := 0, 0
	for _, r := range results {
		ops += r.Verdict.Ops
		faults += r.Faults
	}
	trials := 0
	for _, r := range repl {
		trials += r.Trials
	}
	violations, caught, controls := tally(results, repl, p)
	if len(repl) == 0 {
		return fmt.Sprintf("safety: %d ops, %d faults, %d violations, controls caught %d/%d", ops, faults, violations, caught, controls)
	}
	return fmt.Sprintf("safety: %d ops, %d faults, %d replication faults, %d violations, controls caught %d/%d", ops, faults, trials, violations, caught, controls)
}

func init() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, strings.TrimSpace(`
Usage: go run . [-out DIR] [-only NAME]
Runs dlock's safety scenarios (SAFETY_QUICK=1 for a short run) and prints a line per scenario
and a summary; exits non-zero on a violation, a control that caught nothing, or a history
porcupine could not decide in time. SAFETY_KEEP=1 keeps the clients' histories (JSON lines).`))
		flag.PrintDefaults()
	}
}

// Command safety is dlock's fault-injection suite: client processes take a lock in a loop and
// work on a protected resource in a second Redis, while a nemesis pauses clients, pauses Redis
// or kills and restarts it; the merged histories are then checked for what the lock
// guarantees (no two validity windows overlap; a fenced resource never accepts a stale write;
// no lost updates when no fault can break a TTL lock) and for the documented limits, which are
// reported as expected figures. Weakened clients (SET NX + plain DEL, no fencing) are the
// positive controls: if they show no violation, the harness is not sensitive enough.
//
//	cd safety && go run .            # full run, writes ../docs/SAFETY.md
//	SAFETY_QUICK=1 go run .          # under a minute
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	client := flag.String("client", "", "run as a client process with this JSON spec (internal)")
	out := flag.String("out", "", "write SAFETY.md and safety.jsonl into this directory")
	only := flag.String("only", "", "run only scenarios whose name contains this")
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
	quick := os.Getenv("SAFETY_QUICK") != ""
	results, err := runAll(quick, *only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "safety:", err)
		os.Exit(1)
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "safety:", err)
			os.Exit(1)
		}
		if err := writeReport(filepath.Clean(*out), results, quick); err != nil {
			fmt.Fprintln(os.Stderr, "safety:", err)
			os.Exit(1)
		}
	}
	fmt.Println(summaryLine(results))
	if violations, caught, controls := tally(results); violations > 0 || caught < controls {
		os.Exit(1)
	}
}

func tally(results []result) (violations, caught, controls int) {
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
func summaryLine(results []result) string {
	ops, faults := 0, 0
	for _, r := range results {
		ops += r.Verdict.Ops
		faults += r.Faults
	}
	violations, caught, controls := tally(results)
	return fmt.Sprintf("safety: %d ops, %d faults, %d violations, controls caught %d/%d", ops, faults, violations, caught, controls)
}

func init() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, strings.TrimSpace(`
Usage: go run . [-out DIR] [-only NAME]
Runs dlock's safety scenarios (SAFETY_QUICK=1 for a short run) and prints a line per scenario
and a summary; exits non-zero on a violation or a control that caught nothing.`))
		flag.PrintDefaults()
	}
}

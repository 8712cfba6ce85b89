package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// runResult is one line of bench.jsonl.
type runResult struct {
	Library          string   `json:"library"`
	Scenario         string   `json:"scenario"`
	Processes        int      `json:"processes"`
	Goroutines       int      `json:"goroutines"`
	DurationS        float64  `json:"duration_s"`
	Ops              int64    `json:"ops"`
	OpsPerSec        float64  `json:"ops_per_s"`
	WaitP50us        float64  `json:"wait_p50_us"`
	WaitP99us        float64  `json:"wait_p99_us"`
	WaitMaxus        float64  `json:"wait_max_us"`
	CutWaits         int      `json:"waits_cut_at_end"`       // Lock calls still waiting when the run ended
	LongestCutWaitus float64  `json:"longest_cut_wait_us"`    // the longest of those (a lower bound)
	Starved          int      `json:"goroutines_without_acq"` // goroutines that never got the lock
	Jain             float64  `json:"jain"`
	CmdsPerAcq       float64  `json:"redis_cmds_per_acq"`
	ServerUsPerAcq   float64  `json:"redis_server_us_per_acq"`
	RedisCPUUsPerAcq float64  `json:"redis_cpu_us_per_acq"`
	LostIncrements   *int64   `json:"lost_increments,omitempty"`
	MaxRSSMB         float64  `json:"worker_max_rss_mb"`
	LockErrors       int64    `json:"lock_errors"`
	UnlockErrors     int64    `json:"unlock_errors"`
	CSErrors         int64    `json:"cs_errors"`
	ErrorSample      []string `json:"error_sample,omitempty"`
	Handoffs         int      `json:"cross_process_handoffs,omitempty"`
	WakeP50us        *float64 `json:"wakeup_p50_us,omitempty"`
	WakeP99us        *float64 `json:"wakeup_p99_us,omitempty"`
	MostAtOnce       int      `json:"most_at_once,omitempty"` // semaphore runs: the most holds overlapping in time
	// read-heavy (rw) and multi-lock runs
	Reads          int64    `json:"reads,omitempty"`
	Writes         int64    `json:"writes,omitempty"`
	ReadWaitP99us  *float64 `json:"read_wait_p99_us,omitempty"`
	WriteWaitP50us *float64 `json:"write_wait_p50_us,omitempty"`
	WriteWaitP99us *float64 `json:"write_wait_p99_us,omitempty"`
	WriterJain     *float64 `json:"writer_jain,omitempty"`
	Deadlocks      *int64   `json:"deadlocks,omitempty"`
	// killed waiter
	StallsMs   []float64 `json:"stalls_ms,omitempty"`
	MaxStallMs float64   `json:"max_stall_ms,omitempty"`
	// memory
	Memory *memoryReport `json:"memory,omitempty"`
	Failed string        `json:"failed,omitempty"`
}

func (r *runResult) errors() int64 { return r.LockErrors + r.UnlockErrors + r.CSErrors }

// summary is the progress line of a run.
func (r *runResult) summary() string {
	if r.Failed != "" {
		return "FAILED: " + r.Failed
	}
	switch r.Scenario {
	case killedID:
		return fmt.Sprintf("max stall %.0f ms (%s)", r.MaxStallMs, joinFloats(r.StallsMs, "%.0f"))
	case latchID:
		return fmt.Sprintf("%d waits released: p50 %s, p99 %s, max %s", r.Ops, fmtUs(r.WaitP50us), fmtUs(r.WaitP99us), fmtUs(r.WaitMaxus))
	case memoryID:
		m := r.Memory
		return fmt.Sprintf("%d waiters: +%.1f MB RSS, %d waiting conns of %d, drained in %d ms",
			r.Goroutines, float64(m.RSSWaitingKB-m.RSSBeforeKB)/1024, m.ConnsWaiting, m.ConnsTotal, m.DrainMs)
	}
	s := fmt.Sprintf("%8.0f ops/s  p99 %s  jain %.3f  %.1f cmds/acq  %.1f srv-µs/acq", r.OpsPerSec,
		fmtUs(r.WaitP99us), r.Jain, r.CmdsPerAcq, r.ServerUsPerAcq)
	if r.WriteWaitP99us != nil {
		s += fmt.Sprintf("  reads %d writes %d  writer p99 %s  writer jain %.3f", r.Reads, r.Writes,
			fmtUs(*r.WriteWaitP99us), *r.WriterJain)
	}
	if r.Deadlocks != nil {
		s += fmt.Sprintf("  deadlocks %d", *r.Deadlocks)
	}
	if r.LostIncrements != nil {
		s += fmt.Sprintf("  lost %d", *r.LostIncrements)
	}
	if n := r.errors(); n > 0 {
		s += fmt.Sprintf("  ERRORS %d: %s", n, strings.Join(r.ErrorSample, " | "))
	}
	return s
}

func joinFloats(v []float64, f string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf(f, x)
	}
	return strings.Join(s, ", ")
}

func sortInt64(v []int64) { slices.Sort(v) }

// fmtUs prints a duration given in µs with a readable unit.
func fmtUs(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f s", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1f ms", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.2f ms", v/1e3)
	}
	return fmt.Sprintf("%.0f µs", v)
}

// --- machine

type machineInfo struct {
	NProc        int    `json:"nproc"`
	CPU          string `json:"cpu"`
	RedisVersion string `json:"redis_version"`
	GoVersion    string `json:"go_version"`
	Kernel       string `json:"kernel"`
	EtcdVersion  string `json:"etcd_version,omitempty"` // with ETCD_URL
	ZKVersion    string `json:"zookeeper_version,omitempty"`
}

func gatherMachine(ctx context.Context, rdb *redis.Client) machineInfo {
	m := machineInfo{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), CPU: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				m.RedisVersion = v
			}
		}
	}
	return m
}

// --- report

type report struct {
	machine  machineInfo
	command  string
	date     time.Time
	duration time.Duration
	results  []*runResult
	pg       bool
	etcd, zk bool // ETCD_URL, ZK_ADDR set
}

func (rp *report) find(scenario, lib string) *runResult {
	for _, r := range rp.results {
		if r.Scenario == scenario && r.Library == lib && r.Failed == "" {
			return r
		}
	}
	return nil
}

func (rp *report) ofScenario(scenario string) []*runResult {
	var out []*runResult
	for _, r := range rp.results {
		if r.Scenario == scenario {
			out = append(out, r)
		}
	}
	return out
}

// bestPeer returns the peer run (not dlock*, not raw) with the most ops/s in a scenario.
func (rp *report) bestPeer(scenario string) *runResult {
	var best *runResult
	for _, r := range rp.ofScenario(scenario) {
		if r.Failed == "" && isPeer(r.Library) && (best == nil || r.OpsPerSec > best.OpsPerSec) {
			best = r
		}
	}
	return best
}

func writeOutputs(dir string, rp *report, md string) error {
	var jb bytes.Buffer
	for _, r := range rp.results {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		jb.Write(b)
		jb.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.jsonl"), jb.Bytes(), 0o644); err != nil {
		return err
	}
	mdPath := filepath.Join(dir, "BENCHMARKS.md")
	if old, err := os.ReadFile(mdPath); err == nil {
		md += keptSections(old)
	}
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	png, err := rp.chart()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "chart.png"), png, 0o644)
}

// keptMark opens the part of BENCHMARKS.md written by hand (runs of other programs: the flash
// sale, the client-library comparison), which a new run keeps as it is.
const keptMark = "<!-- Sections below are written by hand and kept when the report is regenerated. -->\n"

// keptSections returns the hand-written part of an earlier BENCHMARKS.md, from keptMark on
// ("" when it has none).
func keptSections(old []byte) string {
	if i := bytes.Index(old, []byte(keptMark)); i >= 0 {
		return "\n" + string(old[i:])
	}
	return ""
}

func (rp *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := rp.machine
	p("# dlock benchmarks\n\n")
	p("Generated by `bench/` (a separate Go module, so library users never download the peers).\n\n")
	p("- Machine: %d CPUs (nproc), %s, %s\n", m.NProc, m.CPU, m.Kernel)
	p("- Redis %s on loopback TCP; %s\n", m.RedisVersion, m.GoVersion)
	if rp.etcd || rp.zk {
		p("- %s on loopback, single member, default durability (every write fsynced)\n",
			strings.Join(nonEmpty(verLabel(rp.etcd, "etcd", m.EtcdVersion), verLabel(rp.zk, "ZooKeeper", m.ZKVersion)), ", "))
	}
	p("- Command: `%s`\n", rp.command)
	p("- Date: %s; %v per throughput run\n\n", rp.date.Format("2006-01-02 15:04 MST"), rp.duration)
	p("Libraries: **dlock** (default options: cohorting on; one Client per process, one Mutex handle per goroutine), " +
		"**dlock-nocohort** (`WithoutCohort()`), **dlock-rueidis** (the `dlockrueidis` adapter: dlock with its scripts on rueidis, `dlockrueidis.New(rdb, rc)` with `rc` from `ClientFor(rdb)`), **redsync** v4 (defaults: 32 tries, 50–250 ms random delay) and " +
		"**redsync-1ms / -10ms / -100ms** (`WithRetryDelay(…)`, `WithTries(1<<20)`), all called again when they give up, " +
		"**redislock-100ms / -10ms / -1ms** (bsm/redislock `Obtain` with `LinearBackoff`), **rueidislock** (`KeyMajority: 1`), " +
		"**raw** (`SET NX PX` + `DEL`, no ownership check, 1 ms sleep while taken: the floor, not a lock to use)")
	if rp.pg {
		p(", **pg** (`pg_advisory_lock`, one connection per goroutine)")
	}
	if rp.etcd {
		p(", **etcd** (client v3 `concurrency.Mutex`: one client per process, one `Session` per goroutine, lease TTL %v)",
			consensusTTL)
	}
	if rp.zk {
		p(", **zookeeper** (go-zookeeper `zk.Lock`, the lock recipe: ephemeral sequential znodes, each waiter watching "+
			"its predecessor; one session per process, timeout %v; a name's first lock also creates its parent znode, "+
			"which the uncontended run's fresh names pay every time)", consensusTTL)
	}
	p(".\n\n")
	p("Every run uses real OS processes (the benchmark re-executes itself) started together at a shared " +
		"wall-clock time. Columns:\n\n")
	p("- **ops/s**: acquisitions per second; **wait**: time from the Lock call to its return (a library that gives up is called again; the wait counts from the first call).\n")
	p("- Percentiles are over completed waits. A Lock call still waiting when the run ended is not in them; when it had " +
		"waited longer than every completed one, **wait max** shows its wait as \"≥ … (cut)\", a lower bound.\n")
	p("- **Jain**: Jain's fairness index over per-goroutine acquisition counts (1 = perfectly even, 1/n = one goroutine got everything); *starved* = goroutines that never got the lock.\n")
	p("- **cmds/acq**, **srv µs/acq**: Redis `INFO commandstats` deltas (calls and usec summed over all commands) per acquisition, " +
		"minus the critical section's GET and SET and the driver's INFO. Redis counts the commands a Lua script runs in their own " +
		"entries as well as the script's EVALSHA, and EVALSHA's usec includes theirs: script-based libraries are charged twice for " +
		"the script body's commands. **CPU µs/acq** is the Redis process CPU time (`INFO cpu`) per acquisition, including " +
		"networking and the critical section's GET+SET, and counts nothing twice.\n")
	p("- **lost**: acquisitions − final counter (the critical section is a non-atomic GET then SET); must be 0 for a lock.\n")
	p("- **RSS**: highest VmHWM of the worker processes. **errors**: lock/critical-section/unlock errors (a dlock unlock whose lease was lost while held counts here).\n\n")

	for i := range scenarios {
		sc := &scenarios[i]
		rs := rp.ofScenario(sc.ID)
		if len(rs) == 0 || sc.Workload != "" || sc.ID == semID { // rw, multi and sem come after the special scenarios
			continue
		}
		p("## %s\n\n", sc.Title)
		if sc.Note != "" {
			p("%s\n\n", sc.Note)
		}
		rp.loopTable(&b, rs, sc.CS != csNone)
		if sc.ID == "waiters-256" {
			rp.waiterTable(&b)
		}
		if sc.ID == "contended-8x1" {
			rp.wakeTable(&b)
		}
	}
	if rs := rp.ofScenario(killedID); len(rs) > 0 {
		p("## 8. Killed waiter\n\n")
		p("A holder H (a Client in the driver) holds the lock; a worker process W calls Lock and waits; once W is in "+
			"the Redis queue (length of `dlock:{NAME}:queue` ≥ 1: LLEN, or ZCARD if the queue is a sorted set) a second Client C calls Lock and queues behind it (length ≥ 2); "+
			"W is SIGKILLed; H unlocks at t0; C acquires at t1. Stall = t1 − t0, %d repetitions.\n\n", killedReps)
		p("| library | stalls (ms) | max stall | error |\n|---|---|---|---|\n")
		for _, r := range rs {
			p("| %s | %s | %.0f ms | %s |\n", r.Library, joinFloats(r.StallsMs, "%.0f"), r.MaxStallMs, r.Failed)
		}
		p("\n")
	}
	if rs := rp.ofScenario(memoryID); len(rs) > 0 {
		p("## 9. Memory: %d goroutines waiting on %d keys\n\n", memoryKeys*memoryPerKey, memoryKeys)
		p("One worker process starts %d goroutines (%d per key, each with its own Mutex handle) while a driver Client "+
			"holds all %d keys. RSS (VmRSS) before starting them and once all wait; connections of that process in "+
			"`CLIENT LIST` (matched by its local TCP ports); *waiting* = named `dlock-notify` or in pub/sub mode. "+
			"Then the driver releases the keys and every goroutine gets its turn.\n\n", memoryKeys*memoryPerKey, memoryPerKey, memoryKeys)
		p("| library | RSS before | RSS waiting | RSS added | per waiter | goroutines | conns (total) | waiting conns (notify / pub/sub) | drain | acquired | errors |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rs {
			if r.Memory == nil {
				p("| %s | failed: %s |||||||||\n", r.Library, r.Failed)
				continue
			}
			mm := r.Memory
			added := float64(mm.RSSWaitingKB - mm.RSSBeforeKB)
			p("| %s | %.1f MB | %.1f MB | %.1f MB | %.0f B | %d | %d | %d (%d / %d) | %d ms | %d | %d |\n", r.Library,
				float64(mm.RSSBeforeKB)/1024, float64(mm.RSSWaitingKB)/1024, added/1024,
				added*1024/float64(r.Goroutines), mm.Goroutines, mm.ConnsTotal, mm.ConnsWaiting, mm.ConnsNotify,
				mm.ConnsPubSub, mm.DrainMs, mm.Acquired, mm.Errors)
			if r.Failed != "" {
				p("\nFailed: %s\n", r.Failed)
			}
		}
		p("\n")
	}
	rp.mixSections(&b)
	if rs := rp.ofScenario(semID); len(rs) > 0 {
		b.WriteString("## " + scenarioByID(semID).Title + "\n\n")
		rp.semTable(&b, rs)
	}
	rp.latchSection(&b)
	rp.targets(&b)
	if !rp.pg {
		p("## PostgreSQL advisory locks (optional)\n\n")
		p("Not run: set `PG_URL` to include `pg` (`SELECT pg_advisory_lock($1)` / `pg_advisory_unlock`, pgx, one connection " +
			"per goroutine). A throwaway server from Debian's `postgresql` package, on a unix socket only:\n\n")
	} else {
		p("## Starting PostgreSQL for the `pg` runs\n\n")
	}
	p("```sh\n%s```\n\n", pgHowTo)
	var missing []string
	if !rp.etcd {
		missing = append(missing, "`ETCD_URL` (client URL) for **etcd**")
	}
	if !rp.zk {
		missing = append(missing, "`ZK_ADDR` (host:port) for **zookeeper**")
	}
	if len(missing) > 0 {
		p("## etcd and ZooKeeper (optional)\n\n")
		p("Not run: set %s. `bash bench/with-consensus.sh -out ../docs` (paths are relative to bench/) installs Debian's `etcd-server` and `zookeeper`, "+
			"starts throwaway single-member servers of both on loopback (and a throwaway PostgreSQL unless `PG_URL` is set), "+
			"runs the suite with them and removes them.\n\n", strings.Join(missing, " and "))
	}
	p("![ops/s per library, contended 4×8 and 8×1](chart.png)\n\n")
	return b.String()
}

// pgHowTo starts a throwaway PostgreSQL from Debian's postgresql package on a unix socket.
const pgHowTo = `apt-get install -y postgresql            # Debian 12: PostgreSQL 15
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
D=$(mktemp -d) && chown postgres "$D"
su postgres -c "$PGBIN/initdb -D $D/data -A trust -U postgres" >/dev/null
su postgres -c "$PGBIN/pg_ctl -D $D/data -l $D/log -w start -o '-c listen_addresses= -k $D -c max_connections=300'"
cd bench && PG_URL="postgres://postgres@/postgres?host=$D" go run . -out ../docs
su postgres -c "$PGBIN/pg_ctl -D $D/data -m fast stop" && rm -rf "$D"
`

// verLabel is "name version" (or just name when the version is unknown), "" when not run.
func verLabel(ran bool, name, version string) string {
	if !ran {
		return ""
	}
	return strings.TrimSpace(name + " " + version)
}

func nonEmpty(v ...string) []string {
	var out []string
	for _, s := range v {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func lostStr(r *runResult) string {
	if r.LostIncrements == nil {
		return "–"
	}
	return fmt.Sprint(*r.LostIncrements)
}

func (rp *report) loopTable(b *strings.Builder, rs []*runResult, counter bool) {
	fmt.Fprintf(b, "| library | procs×gor | ops | ops/s | wait p50 | wait p99 | wait max | Jain | cmds/acq | srv µs/acq | CPU µs/acq | lost | RSS | errors |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Failed != "" {
			fmt.Fprintf(b, "| %s | %d×%d | failed: %s |||||||||||\n", r.Library, r.Processes, r.Goroutines, r.Failed)
			continue
		}
		errs := fmt.Sprint(r.errors())
		if r.errors() > 0 {
			errs += ": " + mdEscape(strings.Join(r.ErrorSample, "; "))
		}
		wmax := fmtUs(r.WaitMaxus)
		if r.LongestCutWaitus > r.WaitMaxus {
			wmax = "≥ " + fmtUs(r.LongestCutWaitus) + " (cut)"
		}
		jainS := fmt.Sprintf("%.3f", r.Jain)
		if r.Starved > 0 {
			jainS += fmt.Sprintf(" (%d starved)", r.Starved)
		}
		cmds, srv := fmt.Sprintf("%.2f", r.CmdsPerAcq), fmt.Sprintf("%.1f", r.ServerUsPerAcq)
		if !usesRedisLock(r.Library) { // no Redis commands: only the critical section's, subtracted
			cmds, srv = "– ("+r.Library+")", "– ("+r.Library+")"
		}
		fmt.Fprintf(b, "| %s | %d×%d | %d | %.0f | %s | %s | %s | %s | %s | %s | %.1f | %s | %.0f MB | %s |\n",
			r.Library, r.Processes, r.Goroutines, r.Ops, r.OpsPerSec, fmtUs(r.WaitP50us), fmtUs(r.WaitP99us),
			wmax, jainS, cmds, srv, r.RedisCPUUsPerAcq, lostStr(r), r.MaxRSSMB, errs)
	}
	fmt.Fprintf(b, "\n")
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func (rp *report) waiterTable(b *strings.Builder) {
	fmt.Fprintf(b, "Redis server work per acquisition, 32 waiters (contended 4×8) vs 256 waiters (4×64):\n\n")
	fmt.Fprintf(b, "| library | srv µs/acq 32 | srv µs/acq 256 | change | cmds/acq 32 | cmds/acq 256 | CPU µs/acq 32 | CPU µs/acq 256 |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|\n")
	for _, r := range rp.ofScenario("waiters-256") {
		a := rp.find("contended-4x8", r.Library)
		if a == nil || r.Failed != "" {
			continue
		}
		fmt.Fprintf(b, "| %s | %.1f | %.1f | %s | %.2f | %.2f | %.1f | %.1f |\n", r.Library, a.ServerUsPerAcq,
			r.ServerUsPerAcq, pctChange(a.ServerUsPerAcq, r.ServerUsPerAcq), a.CmdsPerAcq, r.CmdsPerAcq,
			a.RedisCPUUsPerAcq, r.RedisCPUUsPerAcq)
	}
	fmt.Fprintf(b, "\n")
}

func pctChange(from, to float64) string {
	if from == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%+.0f%%", (to-from)/from*100)
}

func (rp *report) wakeTable(b *strings.Builder) {
	fmt.Fprintf(b, "### 7. Wake-up latency (from the 8×1 run)\n\n")
	fmt.Fprintf(b, "All processes' (acquired_at, unlock_called_at) records merged by acquisition time; for consecutive "+
		"acquisitions by different processes, latency = next.acquired_at − prev.unlock_called_at (wall clock, one machine).\n\n")
	fmt.Fprintf(b, "| library | hand-offs | wake-up p50 | wake-up p99 |\n|---|---|---|---|\n")
	for _, r := range rp.ofScenario("contended-8x1") {
		if r.Failed != "" || r.WakeP50us == nil {
			continue
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s |\n", r.Library, r.Handoffs, fmtUs(*r.WakeP50us), fmtUs(*r.WakeP99us))
	}
	fmt.Fprintf(b, "\n")
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a/b) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// targets computes the headline comparisons from this run's results.
func (rp *report) targets(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Targets (computed from this run)\n\n")
	p("Peers are every library except dlock's own (dlock, dlock-nocohort, dlock-rueidis) and raw; \"best peer\" is the peer with the most ops/s in that scenario.\n\n")
	p("| target | dlock | reference | result |\n|---|---|---|---|\n")
	n := 0
	row := func(t, d, ref, res string) {
		p("| %s | %s | %s | %s |\n", t, d, ref, res)
		n++
	}
	peerCompare := func(scID, label string, extra bool) {
		d, bp := rp.find(scID, "dlock"), rp.bestPeer(scID)
		if d == nil || bp == nil {
			return
		}
		row(label+": ops/s vs best peer", fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("%s %.0f", bp.Library, bp.OpsPerSec),
			ratio(d.OpsPerSec, bp.OpsPerSec))
		row(label+": Jain", fmt.Sprintf("%.3f", d.Jain), fmt.Sprintf("%s %.3f", bp.Library, bp.Jain), fmt.Sprintf("%+.3f", d.Jain-bp.Jain))
		if extra {
			row(label+": wait p99", fmtUs(d.WaitP99us), bp.Library+" "+fmtUs(bp.WaitP99us), ratio(d.WaitP99us, bp.WaitP99us))
			row(label+": Redis cmds/acq", fmt.Sprintf("%.2f", d.CmdsPerAcq), fmt.Sprintf("%s %.2f", bp.Library, bp.CmdsPerAcq),
				ratio(d.CmdsPerAcq, bp.CmdsPerAcq))
		} else {
			row(label+": wait max", fmtUs(d.WaitMaxus), bp.Library+" "+fmtUs(bp.WaitMaxus), ratio(d.WaitMaxus, bp.WaitMaxus))
		}
	}
	peerCompare("contended-4x8", "contended 4×8", true)
	for _, o := range []struct{ lib, what string }{{"pg", "PostgreSQL advisory locks"}, {"etcd", "etcd concurrency.Mutex"},
		{"zookeeper", "ZooKeeper lock recipe"}} {
		if d, x := rp.find("contended-4x8", "dlock"), rp.find("contended-4x8", o.lib); d != nil && x != nil {
			row("contended 4×8: ops/s vs "+o.what, fmt.Sprintf("%.0f", d.OpsPerSec), fmt.Sprintf("%s %.0f", o.lib, x.OpsPerSec),
				ratio(d.OpsPerSec, x.OpsPerSec))
		}
	}
	peerCompare("contended-8x1", "contended 8×1", false)
	for _, lib := range []string{"dlock", "dlock-nocohort"} {
		// dlock-nocohort is the plain Redis FIFO: 32 and 256 waiters in Redis itself.
		if a, c := rp.find("contended-4x8", lib), rp.find("waiters-256", lib); a != nil && c != nil {
			row("server µs/acq, 256 vs 32 waiters ("+lib+")", fmt.Sprintf("%.1f → %.1f", a.ServerUsPerAcq, c.ServerUsPerAcq), "32 waiters",
				pctChange(a.ServerUsPerAcq, c.ServerUsPerAcq))
		}
	}
	rp.mixTargets(row)
	rp.semTargets(row)
	rp.latchTargets(row)
	rp.perfTargets(row)
	if d := rp.find("contended-8x1", "dlock"); d != nil && d.WakeP50us != nil {
		ref := "–"
		if bp := rp.bestPeer("contended-8x1"); bp != nil && bp.WakeP50us != nil {
			ref = fmt.Sprintf("%s %s / %s", bp.Library, fmtUs(*bp.WakeP50us), fmtUs(*bp.WakeP99us))
		}
		row("wake-up latency p50 / p99 (8×1)", fmtUs(*d.WakeP50us)+" / "+fmtUs(*d.WakeP99us), ref, "")
	}
	for _, lib := range killedLibs {
		if r := rp.find(killedID, lib); r != nil {
			name := "killed waiter: max stall"
			if lib != "dlock" {
				name += " (" + lib + ")"
			}
			dv, ref := fmt.Sprintf("%.0f ms", r.MaxStallMs), ""
			if lib != "dlock" {
				dv, ref = "", fmt.Sprintf("%s %.0f ms", lib, r.MaxStallMs)
			}
			row(name, dv, ref, fmt.Sprintf("%d runs", len(r.StallsMs)))
		}
	}
	if r := rp.find(memoryID, "dlock"); r != nil && r.Memory != nil {
		mm := r.Memory
		row(fmt.Sprintf("memory: %d waiters on %d keys", r.Goroutines, memoryKeys),
			fmt.Sprintf("%d waiting conns (%d total); +%.1f MB RSS", mm.ConnsWaiting, mm.ConnsTotal, float64(mm.RSSWaitingKB-mm.RSSBeforeKB)/1024),
			"", fmt.Sprintf("%.0f B per waiter", float64(mm.RSSWaitingKB-mm.RSSBeforeKB)*1024/float64(r.Goroutines)))
	}
	// Lost increments everywhere.
	var safeRuns, safeLost, rawLost int64
	var bad []string
	for _, r := range rp.results {
		if r.LostIncrements == nil || r.Failed != "" {
			continue
		}
		if isSafe(r.Library) {
			safeRuns++
			safeLost += *r.LostIncrements
			if *r.LostIncrements != 0 {
				bad = append(bad, fmt.Sprintf("%s/%s: %d", r.Scenario, r.Library, *r.LostIncrements))
			}
		} else {
			rawLost += *r.LostIncrements
		}
	}
	if safeRuns > 0 {
		res := "none"
		if len(bad) > 0 {
			res = "**" + strings.Join(bad, ", ") + "**"
		}
		dl := int64(0)
		for _, r := range rp.results {
			if strings.HasPrefix(r.Library, "dlock") && r.LostIncrements != nil {
				dl += *r.LostIncrements
			}
		}
		row("lost increments, every run with a counter", fmt.Sprintf("%d (dlock + dlock-nocohort)", dl),
			fmt.Sprintf("all locks: %d in %d runs", safeLost, safeRuns), res)
	}
	var errRuns []string
	for _, r := range rp.results {
		if r.errors() > 0 || r.Failed != "" {
			errRuns = append(errRuns, r.Scenario+"/"+r.Library)
		}
	}
	res := "none"
	if len(errRuns) > 0 {
		res = "**" + strings.Join(errRuns, ", ") + "**"
	}
	row("runs with errors or failures", "", "", res)
	if n == 0 {
		p("| (no target computable from the selected runs) | | | |\n")
	}
	p("\n")
}

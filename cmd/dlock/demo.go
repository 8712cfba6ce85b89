package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// A scenario is one of the seeds' stories, replayed by worker processes first without a lock
// and then with dlock.
type scenario struct {
	name, title string
	procs       int      // worker processes
	perProc     int      // concurrent actors per process
	columns     []string // the table's value columns, before "result"
	runs        []string // the runs' labels, the first without a lock (default: noLock, withDlock)
	setup       func(ctx context.Context, rdb redis.UniversalClient, keys demoKeys) error
	act         func(ctx context.Context, w *worker, actor int) error // one actor, in a worker
	outcome     func(ctx context.Context, rdb redis.UniversalClient, keys demoKeys, took time.Duration) (outcome, error)
	// dies, if set, names the worker processes of a run that kill themselves on purpose
	// (SIGKILL, a crash the run shows surviving).
	dies func(run string, proc int) bool
}

// Run labels: what a worker's helpers (worker.go) take the lock with.
const (
	noLock       = "no lock"
	withDlock    = "with dlock"
	runMutex     = "Mutex"
	runRWMutex   = "RWMutex"
	runNested    = "nested Mutexes"
	runMulti     = "MultiLock"
	runSemaphore = "Semaphore"
	runLatch     = "Latch"
)

func (s *scenario) runLabels() []string {
	if s.runs != nil {
		return s.runs
	}
	return []string{noLock, withDlock}
}

// outcome is one row of the demo table.
type outcome struct {
	cells []string // values for the scenario's columns
	exact bool
	text  string
}

// demoKeys names the keys of one run, under a prefix unique to it, so runs never meet.
type demoKeys string

func (k demoKeys) key(name string) string { return string(k) + name }

var scenarios = map[string]*scenario{
	"tickets": ticketScenario, "seckill": seckillScenario, "cron": cronScenario, "counter": counterScenario,
	"prices": pricesScenario, "transfer": transferScenario, "exports": exportsScenario, "sale": saleScenario,
}

const scenarioOrder = "tickets seckill cron counter prices transfer exports sale"

// demoCmd is `dlock demo [SCENARIO|all]`.
func demoCmd(stdout, stderr io.Writer) *cobra.Command {
	var redisURL string
	c := &cobra.Command{
		Use:   "demo [flags] [" + strings.ReplaceAll(scenarioOrder, " ", "|") + "|all]",
		Short: "Replay the seed scenarios without and with a lock",
		Long: `Replay a seed scenario (default: all of them) across OS processes, first without a lock,
then with dlock, and show that only the locked runs are exact. Without --redis or
$REDIS_URL, it starts a throwaway redis-server and removes it on exit.`,
		Args:      rangeArgs(0, 1, "dlock demo tickets"),
		ValidArgs: append(strings.Fields(scenarioOrder), "all"),
	}
	c.Flags().StringVar(&redisURL, "redis", "", "Redis URL (default $REDIS_URL, else a throwaway redis-server)")
	c.RunE = func(_ *cobra.Command, args []string) error {
		names := strings.Fields(scenarioOrder)
		if len(args) == 1 && args[0] != "all" {
			if scenarios[args[0]] == nil {
				return usageError{fmt.Sprintf("unknown demo scenario %q", args[0]), "choose one of: " + scenarioOrder + ", all"}
			}
			names = args[:1]
		}
		return runDemo(redisURL, names, stdout, stderr)
	}
	return c
}

// runDemo plays the scenarios names against redisURL, $REDIS_URL or a throwaway server.
func runDemo(redisURL string, names []string, stdout, stderr io.Writer) error {
	var urls []string
	if redisURL != "" {
		urls = []string{redisURL}
	}
	conn, err := connect(urls, true)
	if err != nil {
		return err
	}
	defer conn.close()
	if conn.server != nil {
		fmt.Fprintf(stdout, "Started a throwaway redis-server at %s (removed on exit; set REDIS_URL to use your own).\n\n", conn.url)
	}
	failed := 0
	for _, name := range names {
		ok, err := playScenario(scenarios[name], conn, stdout, stderr)
		if err != nil {
			return err
		}
		if !ok {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d locked run(s) were not exact", failed)
	}
	return nil
}

// playScenario runs s without and with the lock (or each of its runs) and prints the table. It
// reports whether every locked run was exact.
func playScenario(s *scenario, conn *connection, stdout, stderr io.Writer) (bool, error) {
	fmt.Fprintf(stdout, "%s\n\n", s.title)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  run\t%s\tresult\n", strings.Join(s.columns, "\t"))
	rdb := conn.rdb
	exact := true
	for _, label := range s.runLabels() {
		o, err := runOnce(s, conn, rdb, label, stderr)
		if err != nil {
			return false, err
		}
		if label != noLock {
			exact = exact && o.exact
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", label, strings.Join(o.cells, "\t"), o.text)
	}
	tw.Flush()
	fmt.Fprintln(stdout)
	return exact, nil
}

// runOnce starts the worker processes for one run and collects the outcome. A run longer than
// two seconds shows its progress on stderr.
func runOnce(s *scenario, conn *connection, rdb redis.UniversalClient, run string, stderr io.Writer) (outcome, error) {
	ctx := context.Background()
	keys := demoKeys(fmt.Sprintf("dlock-demo:%s:%d:", s.name, time.Now().UnixNano()))
	if err := s.setup(ctx, rdb, keys); err != nil {
		return outcome{}, fmt.Errorf("demo %s: set-up: %w", s.name, err)
	}
	defer cleanup(rdb, keys)
	exe, err := os.Executable()
	if err != nil {
		return outcome{}, err
	}
	// All workers start at the same instant, so unlocked actors really overlap.
	start := time.Now().Add(300 * time.Millisecond).UnixNano()
	var wg sync.WaitGroup
	errs := make([]error, s.procs)
	for p := 0; p < s.procs; p++ {
		cmd := workerCmd(exe, conn.url, "--scenario", s.name, "--keys", string(keys),
			"--run", run, "--actors", strconv.Itoa(s.perProc),
			"--proc", strconv.Itoa(p), "--start", strconv.FormatInt(start, 10))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil && !(s.dies != nil && s.dies(run, p) && killed(err)) {
				errs[p] = fmt.Errorf("worker %d: %v: %s", p, err, strings.TrimSpace(string(out)))
			}
		}()
	}
	stopProgress := progress(stderr, s.name, run)
	wg.Wait()
	took := time.Since(time.Unix(0, start)) // from the shared start line
	stopProgress()
	if err := errors.Join(errs...); err != nil {
		return outcome{}, fmt.Errorf("demo %s: %w", s.name, err)
	}
	return s.outcome(ctx, rdb, keys, took)
}

// workerCmd is the command of one demo worker process with Redis at url: the URL goes in its
// environment, not on its argv, where ps shows any password in it to every user.
func workerCmd(exe, url string, args ...string) *exec.Cmd {
	cmd := exec.Command(exe, append([]string{workerCommand}, args...)...)
	cmd.Env = append(os.Environ(), workerRedisEnv+"="+url)
	return cmd
}

// progress prints a line every second on stderr once a run has taken two seconds.
func progress(stderr io.Writer, name, run string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if el := now.Sub(start); el >= 2*time.Second {
					fmt.Fprintf(stderr, "dlock: demo %s (%s): running for %.0fs...\n", name, run, el.Seconds())
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// killed reports a worker that died of SIGKILL.
func killed(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
	}
	return false
}

// cleanup deletes a run's keys, and the dlock keys of its locks (a latch the run left set).
func cleanup(rdb redis.UniversalClient, keys demoKeys) {
	ctx := context.Background()
	for _, match := range []string{string(keys) + "*", "dlock:{" + string(keys) + "*"} {
		iter := rdb.Scan(ctx, 0, match, 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
}

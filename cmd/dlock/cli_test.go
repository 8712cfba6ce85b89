package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// asCLI makes the test binary act as the dlock command (the demo re-runs it as workers too).
const asCLI = "DLOCK_TEST_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" || (len(os.Args) > 1 && os.Args[1] == workerCommand) {
		redis.SetLogger(quiet{}) // as main does
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(redistest.Main(m))
}

// dlockCmd returns the dlock command (this test binary) with args, against the shared server.
func dlockCmd(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asCLI+"=1", "REDIS_URL="+redistest.Shared(t).URL(), noRaceExitSleep)
	return cmd
}

// noRaceExitSleep stops a -race binary from sleeping a second before it exits 0 (the race
// runtime's default atexit_sleep_ms): the test binary runs as dlock hundreds of times.
const noRaceExitSleep = "GORACE=atexit_sleep_ms=0"

// runDlock runs dlock to completion and returns its exit code and output.
func runDlock(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := dlockCmd(t, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return exitCode(err), out.String(), errb.String()
}

func uniqueName(t *testing.T) string { return strings.ReplaceAll(redistest.Name(t), "#", "-") }

func TestRunPassesExitCodeAndEnvironment(t *testing.T) {
	name := uniqueName(t)
	code, out, errs := runDlock(t, "run", name, "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKEN $DLOCK_OWNER"; exit 7`)
	if code != 7 {
		t.Fatalf("exit %d, want the command's 7; stderr: %s", code, errs)
	}
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != name || f[1] == "0" || len(f[2]) < 32 {
		t.Fatalf("command saw %q, want NAME TOKEN OWNER", out)
	}
	if code, _, _ := runDlock(t, "run", name, "--", "true"); code != 0 {
		t.Fatalf("exit %d after a successful command", code)
	}
}

func TestRunExcludesConcurrentRuns(t *testing.T) {
	name := uniqueName(t)
	dir := t.TempDir()
	// Each run appends "start", sleeps, appends "end": interleaving means two held the lock.
	script := `echo start >> ` + dir + `/log; sleep 0.05; echo end >> ` + dir + `/log`
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _, errs := runDlock(t, "run", name, "--", "sh", "-c", script); code != 0 {
				t.Errorf("run exit %d: %s", code, errs)
			}
		}()
	}
	wg.Wait()
	b, _ := os.ReadFile(filepath.Join(dir, "log"))
	if got := strings.Fields(string(b)); strings.Join(got, " ") != strings.TrimSpace(strings.Repeat("start end ", 5)) {
		t.Fatalf("runs overlapped: %v", got)
	}
}

func TestRunNoWaitConflictExitCode(t *testing.T) {
	name := uniqueName(t)
	rdb := redistest.Client(t)
	c := dlock.New(rdb, dlock.WithoutCohort())
	defer c.Close(context.Background())
	l, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	code, _, errs := runDlock(t, "run", "--no-wait", "--conflict-exit-code", "9", name, "--", "true")
	if code != 9 || !strings.Contains(errs, "held by another owner") {
		t.Fatalf("--no-wait on a held lock: exit %d, stderr %q", code, errs)
	}
	code, _, _ = runDlock(t, "run", "--wait", "100ms", name, "--", "true")
	if code != exitConflict {
		t.Fatalf("--wait 100ms on a held lock: exit %d, want %d", code, exitConflict)
	}
}

// startRun starts `dlock run` on a command that writes its pid to a file and then sleeps, and
// waits until the command runs.
func startRun(t *testing.T, name string, extra ...string) (*exec.Cmd, *bytes.Buffer, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	args := append(append([]string{"run"}, extra...), name, "--", "sh", "-c",
		`trap 'echo got-term; exit 3' TERM; echo $$ > `+pidFile+`.tmp; mv `+pidFile+`.tmp `+pidFile+`; while :; do sleep 0.01; done`)
	cmd := dlockCmd(t, args...)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return cmd, &errb, pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("command never started: %s", errb.String())
		}
		time.Sleep(5 * time.Millisecond) // a file written by another process: no event to wait on
	}
}

func TestRunForwardsSignalsAndReleases(t *testing.T) {
	name := uniqueName(t)
	cmd, out, _ := startRun(t, name)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if code := exitCode(err); code != 3 || !strings.Contains(out.String(), "got-term") {
		t.Fatalf("after SIGTERM: exit %d, output %q; want the command's trap to run and exit 3", code, out.String())
	}
	if code, stdout, _ := runDlock(t, "status", name); code != 0 || !regexp.MustCompile(`state:\s+free`).MatchString(stdout) {
		t.Fatalf("lock after the run ended: %q", stdout)
	}
}

func TestLostLeaseStopsTheCommand(t *testing.T) {
	name := uniqueName(t)
	cmd, out, _ := startRun(t, name, "--grace", "2s")
	if code, stdout, errs := runDlock(t, "release", "--force", name); code != 0 || !strings.Contains(stdout, "released") {
		t.Fatalf("release --force: exit %d, %q %q", code, stdout, errs)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := exitCode(err); code != exitLost {
			t.Fatalf("exit %d after the lease was lost, want %d; output %q", code, exitLost, out.String())
		}
		if !strings.Contains(out.String(), "got-term") || !strings.Contains(out.String(), "lost") {
			t.Fatalf("output %q: want the command stopped with SIGTERM and a clear message", out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dlock run kept the command running after its lease was lost")
	}
}

func TestStatusAndList(t *testing.T) {
	name := uniqueName(t)
	_, _, _ = startRun(t, name, "--owner", "cron-host-1")
	code, out, errs := runDlock(t, "status", name)
	if code != 0 || !strings.Contains(out, "state:      held") || !strings.Contains(out, "owner:      cron-host-1") {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runDlock(t, "status", "--json", name)
	var info dlock.LockInfo
	if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil || !info.Held || info.Owner != "cron-host-1" || info.Token == 0 {
		t.Fatalf("status --json: exit %d, %q (%v)", code, out, err)
	}
	code, out, _ = runDlock(t, "list", name)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		strings.Join(strings.Fields(lines[1])[:3], " ") != name+" held cron-host-1" {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	code, out, _ = runDlock(t, "list", "--json", name)
	if code != 0 || !strings.Contains(out, `"owner":"cron-host-1"`) {
		t.Fatalf("list --json: %q", out)
	}
}

func TestDemoLockedRunsAreExact(t *testing.T) {
	code, out, errs := runDlock(t, "demo", "all")
	if code != 0 {
		t.Fatalf("demo exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"exact: 8 sold, 2 refused", "exact: 20 orders", "exact: one clean-up per tick", "exact: 0",
		"exact: no torn read", "exact: money conserved, no deadlock", "exact: never more than 2 at once",
		"exact: no order before every warehouse was loaded"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

func TestBadCommandLinesGiveOneClearError(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `dlock: error: unknown command "frobnicate"`},
		{[]string{"demo", "nope"}, `dlock: error: unknown demo scenario "nope"`},
		{[]string{"demo", "--redis", "bogus://x"}, `dlock: error: bad Redis URL "bogus://x"`},
		{[]string{"status", "--redis", "unix:///nonexistent/redis.sock", "x"}, "dlock: error: cannot reach Redis"},
		{[]string{"run", "--bogus", "x", "--", "true"}, "dlock: error: unknown flag: --bogus"},
		{[]string{"run", "x"}, "dlock: error: run needs -- between the lock NAME and the COMMAND"},
		{[]string{"run", "--ttl", "0s", "x", "--", "true"}, "dlock: error: --ttl 0s: must be at least 1s"},
		{[]string{"status"}, "dlock: error: dlock status takes exactly 1 argument(s), got 0"},
		{[]string{"stauts", "x"}, `dlock: error: unknown command "stauts"; did you mean status?`},
		{[]string{"release", "x"}, "dlock: error: release breaks another owner's lock: say --force"},
		{[]string{"status", ""}, "dlock: error: dlock: invalid argument: empty lock name"},
	}
	for _, tc := range cases {
		code, _, errs := runDlock(t, tc.args...)
		if code == 0 || !strings.Contains(errs, tc.want) || strings.Count(errs, "dlock: error:") != 1 {
			t.Errorf("dlock %v: exit %d, stderr %q; want one error containing %q", tc.args, code, errs, tc.want)
		}
	}
}

// Help asked for (-h, --help, help COMMAND) goes to stdout, as a pager or grep expects.
func TestHelpForEveryCommand(t *testing.T) {
	for _, c := range []string{"run", "status", "list", "release", "latch", "demo", "version", "completion"} {
		for _, args := range [][]string{{c, "-h"}, {c, "--help"}, {"help", c}} {
			code, out, errs := runDlock(t, args...)
			if code != 0 || !strings.Contains(out, "Usage:\n  dlock "+c) || errs != "" {
				t.Errorf("dlock %v: exit %d, stdout %q, stderr %q; want the usage on stdout", args, code, out, errs)
			}
		}
	}
	code, out, errs := runDlock(t, "help")
	if code != 0 || !strings.Contains(out, "Run a command while holding a lock") || errs != "" {
		t.Errorf("dlock help: %d %q %q", code, out, errs)
	}
	// Not asked for: the usage goes to stderr with the error.
	if code, out, errs := runDlock(t); code != exitUsage || out != "" || !strings.Contains(errs, "Available Commands") {
		t.Errorf("dlock without a command: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestSignalWhileWaitingExitsWithTheSignal(t *testing.T) {
	name := uniqueName(t)
	rdb := redistest.Client(t)
	c := dlock.New(rdb, dlock.WithoutCohort())
	defer c.Close(context.Background())
	l, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	cmd := dlockCmd(t, "run", name, "--", "true")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if info, _ := c.Inspect(context.Background(), name); info.Waiters == 1 {
			break // queued in Redis: waiting
		}
		if time.Now().After(deadline) {
			t.Fatal("dlock run never queued for the lock")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	if code := exitCode(cmd.Wait()); code != 130 || !strings.Contains(errb.String(), "interrupt while waiting") {
		t.Fatalf("SIGINT while waiting: exit %d, stderr %q; want 130", code, errb.String())
	}
}

func TestCommandDiesWithDlock(t *testing.T) {
	cmd, _, pid := startRun(t, uniqueName(t))
	_ = cmd.Process.Kill() // SIGKILL: dlock cannot forward anything
	_, _ = cmd.Process.Wait()
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatal("the command outlived dlock: it would run on without the lock")
		}
	}
}

// `run --read` runs share the lock, a `run --write` waits for them, and status and list show
// the readers; plain `run` on the name is refused with a clear error (issue 10).
func TestRunReadAndWrite(t *testing.T) {
	name := uniqueName(t)
	_, _, _ = startRun(t, name, "--read")
	_, _, _ = startRun(t, name, "--read") // would never start if readers excluded each other
	code, out, errs := runDlock(t, "status", name)
	if code != 0 || !strings.Contains(out, "read-write lock") || !strings.Contains(out, "read by 2 owners") {
		t.Fatalf("status with two readers: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runDlock(t, "list", name)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		strings.Join(strings.Fields(lines[1])[:4], " ") != name+" read 2 readers" {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if code, _, errs := runDlock(t, "run", "--write", "--no-wait", name, "--", "true"); code != exitConflict {
		t.Fatalf("run --write while read: exit %d, want %d: %s", code, exitConflict, errs)
	}
	code, _, errs = runDlock(t, "run", "--no-wait", name, "--", "true")
	if code == 0 || !strings.Contains(errs, "read-write lock, not a mutex") {
		t.Fatalf("plain run on a read-write lock: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runDlock(t, "run", "--read", "--write", name, "--", "true"); code == 0 || !strings.Contains(errs, "exclude each other") {
		t.Fatalf("--read --write: exit %d, stderr %q", code, errs)
	}
}

// `run --permits N` runs at most N commands at once (a semaphore of N); status and list show
// the permits out, and a killed run's permit comes back (issue 11).
func TestRunPermits(t *testing.T) {
	name := uniqueName(t)
	_, _, _ = startRun(t, name, "--permits", "2")
	killed, _, _ := startRun(t, name, "--permits", "2", "--ttl", "1s") // would never start with 1 permit
	code, out, errs := runDlock(t, "status", name)
	if code != 0 || !strings.Contains(out, "semaphore") || !strings.Contains(out, "2 of 2 permits out, 0 free, 2 holders") {
		t.Fatalf("status with two holders: exit %d\n%s%s", code, out, errs)
	}
	code, out, _ = runDlock(t, "list", name)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		strings.Join(strings.Fields(lines[1])[:4], " ") != name+" 2/2 permits 2" {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	code, _, errs = runDlock(t, "run", "--permits", "2", "--no-wait", name, "--", "true")
	if code != exitConflict || !strings.Contains(errs, "no permit") {
		t.Fatalf("a third run of 2 permits: exit %d, want %d: %s", code, exitConflict, errs)
	}
	_ = killed.Process.Kill() // SIGKILL: its permit comes back within its 1s TTL
	_, _ = killed.Process.Wait()
	if code, _, errs := runDlock(t, "run", "--permits", "2", "--wait", "5s", name, "--", "true"); code != 0 {
		t.Fatalf("run after a holder was killed: exit %d: %s", code, errs)
	}
	for _, bad := range [][]string{{"--permits", "-1"}, {"--permits", "2", "--read"}, {"--permits", "2", "--lock", "a", "--lock", "b"}} {
		args := append(append([]string{"run"}, bad...), "--", "true")
		if !slices.Contains(bad, "--lock") {
			args = append(append([]string{"run"}, bad...), name, "--", "true")
		}
		if code, _, errs := runDlock(t, args...); code == 0 || !strings.Contains(errs, "--permits") {
			t.Errorf("run %v: exit %d, stderr %q", bad, code, errs)
		}
	}
}

// `dlock latch` sets, counts down, waits for and shows a latch (issue 11).
func TestLatchCommand(t *testing.T) {
	name := uniqueName(t)
	if code, out, errs := runDlock(t, "latch", "set", name, "2"); code != 0 || !strings.Contains(out, "set to 2") {
		t.Fatalf("latch set: exit %d %q %q", code, out, errs)
	}
	if code, _, errs := runDlock(t, "latch", "set", name, "3"); code != exitError || !strings.Contains(errs, "counting already") {
		t.Fatalf("latch set again: exit %d %q", code, errs)
	}
	if code, out, _ := runDlock(t, "latch", "status", name); code != 0 || !strings.Contains(out, "at 2") {
		t.Fatalf("latch status: exit %d %q", code, out)
	}
	if code, out, _ := runDlock(t, "status", name); code != 0 || !strings.Contains(out, "latch") || !strings.Contains(out, "counting: 2") {
		t.Fatalf("status of a latch: exit %d %q", code, out)
	}
	if code, _, errs := runDlock(t, "latch", "--wait", "100ms", "wait", name); code != exitConflict || !strings.Contains(errs, "not open") {
		t.Fatalf("latch wait past --wait: exit %d %q", code, errs)
	}
	// --wait 0 looks once, as run --wait 0 tries once (found by review: it waited forever).
	if code, _, errs := runDlock(t, "latch", "--wait", "0", "wait", name); code != exitConflict || !strings.Contains(errs, "not open (at 2)") {
		t.Fatalf("latch wait --wait 0 of a counting latch: exit %d %q", code, errs)
	}
	waiter := dlockCmd(t, "latch", "--wait", "20s", "wait", name)
	var wout bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &wout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code, _, errs := runDlock(t, "latch", "down", name); code != 0 {
			t.Fatalf("latch down: exit %d %q", code, errs)
		}
	}
	if code := exitCode(waiter.Wait()); code != 0 || !strings.Contains(wout.String(), "open") {
		t.Fatalf("latch wait: exit %d %q", code, wout.String())
	}
	if code, out, _ := runDlock(t, "latch", "status", name); code != 0 || !strings.Contains(out, "open") {
		t.Fatalf("latch status once open: exit %d %q", code, out)
	}
	if code, out, errs := runDlock(t, "latch", "--wait", "0", "wait", name); code != 0 || !strings.Contains(out, "open") {
		t.Fatalf("latch wait --wait 0 of an open latch: exit %d %q %q", code, out, errs)
	}
	for _, bad := range [][]string{{"set", name}, {"set", name, "0"}, {"down"}, {"frob", name}, {"wait", name, "x"}} {
		if code, _, errs := runDlock(t, append([]string{"latch"}, bad...)...); code != exitUsage {
			t.Errorf("latch %v: exit %d %q, want %d", bad, code, errs, exitUsage)
		}
	}
}

// `run --lock A --lock B -- cmd` holds both locks (a multi-lock) and passes each token in
// DLOCK_TOKENS; the command's own -- is the command's.
func TestRunMultiLock(t *testing.T) {
	a, b := uniqueName(t)+"a", uniqueName(t)+"b"
	code, out, errs := runDlock(t, "run", "--lock", b, "--lock", a, "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKENS"`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != b+","+a || !strings.HasPrefix(f[1], b+"=") || !strings.Contains(f[1], ","+a+"=") {
		t.Fatalf("command saw %q, want NAMES and name=token pairs", out)
	}
	_, _, _ = startRun(t, a)
	if code, _, errs := runDlock(t, "run", "--no-wait", "--lock", a, "--lock", b, "--", "true"); code != exitConflict {
		t.Fatalf("multi-lock with a member held: exit %d, want %d: %s", code, exitConflict, errs)
	}
	if code, _, _ := runDlock(t, "run", "--no-wait", b, "--", "true"); code != 0 {
		t.Fatalf("the free member was kept by the refused multi-lock: exit %d", code)
	}
	if code, out, errs := runDlock(t, "run", b, "--", "echo", "x", "--", "y"); code != 0 || strings.TrimSpace(out) != "x -- y" {
		t.Fatalf("run NAME -- echo x -- y: exit %d, out %q, %s", code, out, errs)
	}
	// DLOCK_TOKENS lists name=token,...: a name of several with , or = would read as others
	// (found by review).
	for _, bad := range []string{"a,b", "a=b"} {
		if code, _, errs := runDlock(t, "run", "--lock", bad, "--lock", a, "--", "true"); code != exitUsage || !strings.Contains(errs, bad) {
			t.Errorf("run --lock %s --lock %s: exit %d %q, want %d naming it", bad, a, code, errs, exitUsage)
		}
	}
}

// `run` with --redis repeated takes a Redlock over the masters; `status` shows each master's
// state; a second run is refused; two --redis are a usage error.
func TestRunOnARedlock(t *testing.T) {
	var flags []string
	for range 3 {
		flags = append(flags, "--redis", redistest.StartT(t, redistest.Config{}).URL())
	}
	name := uniqueName(t)
	dir := t.TempDir()
	holding := exec.Command(os.Args[0], append(append([]string{"run"}, flags...), name, "--", "sh", "-c",
		`echo "$DLOCK_TOKEN" > `+dir+`/token; sleep 30`)...)
	holding.Env = append(os.Environ(), asCLI+"=1", noRaceExitSleep)
	if err := holding.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holding.Process.Signal(syscall.SIGTERM); _ = holding.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(dir + "/token"); err == nil && len(bytes.TrimSpace(b)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Redlock run did not start its command")
		}
		time.Sleep(5 * time.Millisecond)
	}
	code, out, errs := runDlock(t, append(append([]string{"status"}, flags...), name)...)
	if code != 0 || len(regexp.MustCompile(`(?m)^/\S+\s+held\s`).FindAllString(out, -1)) != 3 || !regexp.MustCompile(`state:\s+held`).MatchString(out) {
		t.Fatalf("status exit %d:\n%s%s", code, out, errs)
	}
	t.Logf("status:\n%s", out)
	if code, _, errs := runDlock(t, append(append([]string{"run", "--no-wait"}, flags...), name, "--", "true")...); code != exitConflict {
		t.Fatalf("second run exit %d, want %d: %s", code, exitConflict, errs)
	}
	if code, _, errs := runDlock(t, "run", "--redis", "redis://127.0.0.1:1", "--redis", "redis://127.0.0.1:2", name, "--", "true"); code != exitUsage || !strings.Contains(errs, "at least 3") {
		t.Fatalf("two --redis: exit %d: %s", code, errs)
	}
	// A master that does not answer at start is named in a warning; the run goes on with the
	// quorum, as a Redlock is made to. Without a quorum it does not start.
	down := append(append([]string{"run"}, flags[:4]...), "--redis", "redis://127.0.0.1:1", name+"-2", "--", "true")
	if code, _, errs := runDlock(t, down...); code != 0 || !strings.Contains(errs, "warning: cannot reach Redis at redis://127.0.0.1:1") || !strings.Contains(errs, "2 of 3 masters") {
		t.Fatalf("a master down at start: exit %d: %s", code, errs)
	}
	down = append(append([]string{"run"}, flags[:2]...), "--redis", "redis://127.0.0.1:1", "--redis", "redis://127.0.0.1:2", name+"-3", "--", "true")
	if code, _, errs := runDlock(t, down...); code != exitUnavailable || !strings.Contains(errs, "cannot reach Redis at redis://127.0.0.1:") {
		t.Fatalf("two masters of three down at start: exit %d: %s", code, errs)
	}
}

// --replica-ack N[/TIMEOUT] takes the lock only once a replica acknowledged it; a bad value
// is a usage error.
func TestRunReplicaAck(t *testing.T) {
	master := redistest.StartT(t, redistest.Config{TCP: true})
	host, port, _ := strings.Cut(master.Addr, ":")
	replica := redistest.StartT(t, redistest.Config{TCP: true, Args: []string{"--replicaof", host, port}})
	if err := master.AwaitReplicated(replica, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t)
	if code, _, errs := runDlock(t, "run", "--redis", master.URL(), "--replica-ack", "1/2s", name, "--", "true"); code != 0 {
		t.Fatalf("run --replica-ack 1/2s: exit %d: %s", code, errs)
	}
	if code, _, errs := runDlock(t, "run", "--redis", master.URL(), "--replica-ack", "2/100ms", name, "--", "true"); code != exitError || !strings.Contains(errs, "replica") {
		t.Fatalf("run --replica-ack 2 with one replica: exit %d: %s", code, errs)
	}
	for _, bad := range []string{"0", "x", "1/", "1/0s", "-1/1s"} {
		if code, _, errs := runDlock(t, "run", "--replica-ack", bad, name, "--", "true"); code != exitUsage {
			t.Errorf("--replica-ack %q: exit %d: %s", bad, code, errs)
		}
	}
	// --replica-ack-aof asks for WAITAOF, which Redis 7.0 lacks (7.2 refuses a local fsync
	// without appendonly): the run fails naming it, and the command does not run.
	code, out, errs := runDlock(t, "run", "--redis", master.URL(), "--replica-ack-aof", "local+1/1s", name, "--", "echo", "ran")
	if code != exitError || !strings.Contains(errs, "WithReplicaAckAOF") || strings.Contains(out, "ran") {
		t.Fatalf("run --replica-ack-aof local+1/1s: exit %d, stdout %q: %s", code, out, errs)
	}
	for _, bad := range []string{"0", "x", "localx", "local+", "local+0", "1/0s"} {
		if code, _, errs := runDlock(t, "run", "--replica-ack-aof", bad, name, "--", "true"); code != exitUsage {
			t.Errorf("--replica-ack-aof %q: exit %d: %s", bad, code, errs)
		}
	}
	if code, _, errs := runDlock(t, "run", "--replica-ack", "1", "--replica-ack-aof", "1", name, "--", "true"); code != exitUsage {
		t.Errorf("--replica-ack with --replica-ack-aof: exit %d: %s", code, errs)
	}
}

// --replica-ack-aof's value is read as [local+]N[/TIMEOUT] or local[/TIMEOUT].
func TestParseReplicaAckAOF(t *testing.T) {
	type want struct {
		local bool
		n     int
		d     time.Duration
	}
	for v, w := range map[string]want{
		"1":            {false, 1, defaultAOFAckTimeout},
		"2/250ms":      {false, 2, 250 * time.Millisecond},
		"local":        {true, 0, defaultAOFAckTimeout},
		"local/2s":     {true, 0, 2 * time.Second},
		"local+1":      {true, 1, defaultAOFAckTimeout},
		"local+3/1.5s": {true, 3, 1500 * time.Millisecond},
	} {
		local, n, d, err := parseReplicaAckAOF(v)
		if err != nil || (want{local, n, d}) != w {
			t.Errorf("%q: local %v, n %d, timeout %v, err %v; want %+v", v, local, n, d, err, w)
		}
	}
	for _, bad := range []string{"0", "+1", "local++1", "local+", "localx", "1/", "1/0s", "-1", "x"} {
		if _, _, _, err := parseReplicaAckAOF(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// A command's background children run on under the lock: dlock releases it, and exits with
// the command's code, only once the last process of the command's group has exited, as a
// lock taken with flock stays held while a child keeps its descriptor.
func TestRunHoldsTheLockUntilBackgroundChildrenExit(t *testing.T) {
	name := uniqueName(t)
	dir := t.TempDir()
	leader, goFile, doneFile := filepath.Join(dir, "leader"), filepath.Join(dir, "go"), filepath.Join(dir, "done")
	// The command itself (the shell) exits at once, leaving its background child.
	script := `(while [ ! -e ` + goFile + ` ]; do sleep 0.01; done; touch ` + doneFile + `) & ` + writePid("$$", leader) + `; exit 4`
	r := startBgRun(t, script, leader, name)
	out, exited, pid := r.out, r.exited, r.pid
	t.Cleanup(func() { _ = os.WriteFile(goFile, nil, 0o644) })
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // the group, should the test fail
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the command's shell did not exit")
		}
	}
	select {
	case err := <-exited:
		t.Fatalf("dlock exited (%v) while the command's background child ran: %s", err, out.String())
	default:
	}
	if code, stdout, _ := runDlock(t, "status", name); code != 0 || !strings.Contains(stdout, "state:      held") {
		t.Fatalf("lock while the background child runs: exit %d, %q", code, stdout)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if code := exitCode(err); code != 4 {
			t.Fatalf("dlock exited %d, want the command's 4: %s", code, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dlock did not exit after the background child did")
	}
	if _, err := os.Stat(doneFile); err != nil {
		t.Fatalf("the background child did not finish before dlock exited: %v", err)
	}
	if code, stdout, _ := runDlock(t, "status", name); code != 0 || !regexp.MustCompile(`state:\s+free`).MatchString(stdout) {
		t.Fatalf("lock after the background child exited: %q", stdout)
	}
}

// A lease lost while only the command's background children run stops them, and dlock exits
// with the lost-lease code.
func TestLostLeaseStopsTheBackgroundChildren(t *testing.T) {
	name := uniqueName(t)
	child := filepath.Join(t.TempDir(), "child")
	// The subshell (the background child) is the parent of the sh that writes its pid.
	script := `(trap 'echo child-got-term; exit 0' TERM; sh -c 'echo $PPID' > ` + child + `.tmp; mv ` + child + `.tmp ` + child + `; while :; do sleep 0.01; done) & exit 0`
	r := startBgRun(t, script, child, "--grace", "2s", name)
	out, exited, pid := r.out, r.exited, r.pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	if code, stdout, errs := runDlock(t, "release", "--force", name); code != 0 || !strings.Contains(stdout, "released") {
		t.Fatalf("release --force: exit %d, %q %q", code, stdout, errs)
	}
	select {
	case err := <-exited:
		if code := exitCode(err); code != exitLost || !strings.Contains(out.String(), "lost") || !strings.Contains(out.String(), "child-got-term") {
			t.Fatalf("exit %d after the lease was lost, want %d and the child stopped by SIGTERM; output %q", code, exitLost, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dlock kept the background child running after its lease was lost")
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the background child %d still runs after the lease was lost: %s", pid, out.String())
	}
}

// dlock run under a parent that is a subreaper (or PID 1 of a container) but does not reap
// unknown children, as many a Go, Python or Node supervisor does, releases the lock once the
// command and its background child have exited: the orphaned child comes to dlock (its
// subreaper), which reaps it, instead of staying a zombie of the group under that parent.
func TestRunUnderANonReapingParentReleases(t *testing.T) {
	const prSetChildSubreaper = 36
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		t.Fatal("prctl:", e)
	}
	t.Cleanup(func() { syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 0, 0) })
	name := uniqueName(t)
	child := filepath.Join(t.TempDir(), "child")
	// The background child records its pid, then exits 0.2s later.
	script := `sh -c '` + writePid("$$", child) + `; sleep 0.2' & exit 0`
	r := startBgRun(t, script, child, name)
	out, exited, pid := r.out, r.exited, r.pid
	t.Cleanup(func() { var ws syscall.WaitStatus; _, _ = syscall.Wait4(pid, &ws, 0, nil) })
	select {
	case err := <-exited:
		if code := exitCode(err); code != 0 {
			t.Fatalf("dlock exited %d: %s", code, out.String())
		}
	case <-time.After(5 * time.Second):
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		t.Fatalf("dlock still holds the lock 5s after the command and its only child exited (child: %s)", st)
	}
}

// bgRun is a `dlock run` whose command reports a pid through a file (see startBgRun).
type bgRun struct {
	out    *bytes.Buffer
	exited chan error // dlock's exit
	pid    int        // the pid the command wrote
}

// startBgRun starts `dlock run ARGS -- sh -c script` and waits for the pid the script writes
// to pidFile (with a .tmp file renamed into place). dlock's output goes to out; exited gets
// its exit. A file written by another process has no event to wait on: it is polled.
func startBgRun(t *testing.T, script, pidFile string, args ...string) *bgRun {
	t.Helper()
	cmd := dlockCmd(t, append(append([]string{"run"}, args...), "--", "sh", "-c", script)...)
	r := &bgRun{out: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	for deadline := time.Now().Add(10 * time.Second); r.pid == 0; time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil {
			r.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		} else if time.Now().After(deadline) {
			t.Fatalf("the command never wrote its pid: %s", r.out.String())
		}
	}
	return r
}

// writePid is a shell command writing pid (a shell expression) to file, renamed into place
// whole.
func writePid(pid, file string) string {
	return `echo ` + pid + ` > ` + file + `.tmp; mv ` + file + `.tmp ` + file
}

// Orphans of a command that runs on are reaped while it runs: dlock, their subreaper, leaves
// no zombie to pile up under a long run.
func TestRunReapsOrphansWhileTheCommandRuns(t *testing.T) {
	name := uniqueName(t)
	dir := t.TempDir()
	orphan, goFile := filepath.Join(dir, "orphan"), filepath.Join(dir, "go")
	// The inner shell starts a short sleep in the background and exits: the sleep is orphaned
	// (to dlock) and exits 50 ms later, while the command waits for goFile.
	script := `sh -c 'sleep 0.05 & ` + writePid("$!", orphan) + `'; while [ ! -e ` + goFile + ` ]; do sleep 0.01; done`
	r := startBgRun(t, script, orphan, name)
	t.Cleanup(func() { _ = os.WriteFile(goFile, nil, 0o644) })
	stat := "/proc/" + strconv.Itoa(r.pid) + "/stat"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan is still there 5s on, while the command runs: %s", b)
		}
	}
	select {
	case err := <-r.exited:
		t.Fatalf("dlock exited (%v) before the command did: %s", err, r.out.String())
	default:
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.exited:
		if code := exitCode(err); code != 0 {
			t.Fatalf("dlock exited %d: %s", code, r.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dlock did not exit after the command did")
	}
}

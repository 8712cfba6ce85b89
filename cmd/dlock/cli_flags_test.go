package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// holdLock holds name on the shared server from this test process (another owner than any
// dlock run) until the test ends.
func holdLock(t *testing.T, name string) { holdLockOn(t, redistest.Client(t), name) }

// holdLockOn holds name on rdb's server until the test ends, and returns the Client holding
// it. Its Close releases the lock, bounded in time: the test may have killed the server.
func holdLockOn(t *testing.T, rdb redis.UniversalClient, name string) *dlock.Client {
	t.Helper()
	c := dlock.New(rdb, dlock.WithoutCohort())
	if _, err := c.Mutex(name).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// Flags go anywhere before --; after it, everything is the command's, its own flags and --
// included.
func TestRunFlagsAnywhereBeforeDash(t *testing.T) {
	name := uniqueName(t)
	code, out, errs := runDlock(t, "run", name, "--no-wait", "--owner", "me", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_OWNER $1 $2"`, "sh", "--no-wait", "--")
	if code != 0 || strings.TrimSpace(out) != name+" me --no-wait --" {
		t.Fatalf("flags after NAME: exit %d, out %q, stderr %q", code, out, errs)
	}
	holdLock(t, name)
	// --no-wait after NAME was read as dlock's: the run is refused at once, not queued.
	if code, _, errs := runDlock(t, "run", name, "--no-wait", "--", "true"); code != exitConflict {
		t.Fatalf("run NAME --no-wait -- true on a held lock: exit %d, want %d: %s", code, exitConflict, errs)
	}
}

// Contradictory and out-of-range flags, and command lines without NAME -- COMMAND, are
// refused with exit 2 before anything runs or touches Redis.
func TestRunRefusesBadCommandLines(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := []string{"--", "touch", marker}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-wait", "--wait", "5s", "x"}, "--no-wait and --wait exclude each other"},
		{[]string{"--read", "--write", "x"}, "--read and --write exclude each other"},
		{[]string{"--replica-ack", "1", "--replica-ack-aof", "1", "x"}, "exclude each other"},
		{[]string{"--conflict-exit-code", "9", "--exit-code-base", "300", "x"}, "exclude each other"},
		{[]string{"--conflict-exit-code", "300", "x"}, "--conflict-exit-code 300: must be 0-255"},
		{[]string{"--conflict-exit-code", "-1", "x"}, "--conflict-exit-code -1"},
		{[]string{"--exit-code-base", "252", "x"}, "--exit-code-base 252: must be 1-251"},
		{[]string{"--exit-code-base", "0", "x"}, "--exit-code-base 0"},
		{[]string{"--ttl", "2ms", "x"}, "--ttl 2ms: must be at least 1s"},
		{[]string{"--ttl", "-5s", "x"}, "--ttl -5s"},
		{[]string{"--wait", "-1s", "x"}, "--wait -1s: must not be negative"},
		{[]string{"--grace", "-1s", "x"}, "--grace -1s"},
		{[]string{"--permits", "0", "x"}, "--permits 0: must be 1-1073741824"},
		{[]string{"--permits", "99999999999", "x"}, "--permits 99999999999: must be 1-1073741824"},
		{[]string{"--permits", "2", "--read", "x"}, "--permits takes a semaphore"},
		{[]string{"--read", "--lock", "a", "--lock", "b"}, "take one lock NAME"},
		{[]string{"--lock", "a", "x"}, "not both"},
		{[]string{"--wait", "soon", "x"}, `invalid argument "soon" for "-w, --wait"`},
		{[]string{"x", "y"}, "one lock NAME before --, got 2"},
		{nil, "run needs a lock NAME before --"}, // dlock run -- touch ...: not a lock named touch
	} {
		args := append(append([]string{"run"}, tc.args...), cmd...)
		code, out, errs := runDlock(t, args...)
		if code != exitUsage || !strings.Contains(errs, "dlock: error: "+tc.want) && !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("dlock %v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", args, code, out, errs, tc.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a refused command line ran its command")
	}
}

// --quiet prints nothing on a conflict (as flock -n), and only then; --wait 0 and -n try once.
func TestRunQuietAndWaitZero(t *testing.T) {
	name := uniqueName(t)
	holdLock(t, name)
	for _, flags := range [][]string{{"--quiet", "--wait", "0"}, {"-q", "-n"}, {"-q", "-w", "0"}, {"--quiet", "--wait", "50ms"}} {
		code, out, errs := runDlock(t, append(append([]string{"run"}, flags...), name, "--", "echo", "ran")...)
		if code != exitConflict || out != "" || errs != "" {
			t.Errorf("run %v on a held lock: exit %d, stdout %q, stderr %q; want %d and silence", flags, code, out, errs, exitConflict)
		}
	}
	code, _, errs := runDlock(t, "run", "--wait", "0", name, "--", "true")
	if code != exitConflict || !strings.Contains(errs, "held by another owner") || strings.Contains(errs, "waited") {
		t.Errorf("run --wait 0: exit %d, stderr %q; want a conflict found at once", code, errs)
	}
	code, _, errs = runDlock(t, "run", "--wait", "50ms", name, "--", "true")
	if code != exitConflict || !strings.Contains(errs, "(waited 50ms)") {
		t.Errorf("run --wait 50ms: exit %d, stderr %q", code, errs)
	}
	// --quiet does not hide what needs a human.
	code, _, errs = runDlock(t, "run", "--quiet", "--redis", "redis://127.0.0.1:1", name, "--", "true")
	if code != exitUnavailable || !strings.Contains(errs, "cannot reach Redis") {
		t.Errorf("run --quiet with Redis down: exit %d, stderr %q", code, errs)
	}
	if code, _, _ := runDlock(t, "run", "--wait", "0", name+"-free", "--", "true"); code != 0 {
		t.Errorf("run --wait 0 on a free lock: exit %d", code)
	}
}

// run -h lists the exit codes; --exit-code-base moves dlock's own out of the command's
// range, and the command's own code still passes through.
func TestRunExitCodes(t *testing.T) {
	_, help, _ := runDlock(t, "run", "-h")
	for _, want := range []string{"Exit codes:", "\n  1 ", "\n  2 ", "\n  69 ", "\n  75 ", "\n  76 ", "126, 127", "128+N", "--exit-code-base 200 gives 200-204"} {
		if !strings.Contains(help, want) {
			t.Errorf("run -h lacks %q", want)
		}
	}
	name := uniqueName(t)
	base := []string{"run", "--exit-code-base", "200"}
	check := func(what string, want int, args ...string) {
		t.Helper()
		if code, _, errs := runDlock(t, append(append([]string{}, base...), args...)...); code != want {
			t.Errorf("%s: exit %d, want %d; stderr %q", what, code, want, errs)
		}
	}
	check("the command's own 75", 75, name, "--", "sh", "-c", "exit 75")
	check("the command's own 2", 2, name, "--", "sh", "-c", "exit 2")
	check("failed: too few replicas", 200, "--replica-ack", "2/50ms", name, "--", "true")
	check("usage", 201, "--ttl", "2ms", name, "--", "true")
	check("usage, flag after the base", 201, name, "--bogus", "--", "true")
	check("usage, contradictory", 201, "-E", "9", name, "--", "true")
	check("unreachable", 202, "--redis", "redis://127.0.0.1:1", name, "--", "true")
	holdLock(t, name+"-held")
	check("conflict", 203, "-n", name+"-held", "--", "true")

	cmd, out, _ := startRun(t, name+"-lost", "--exit-code-base", "200", "--grace", "2s")
	if code, _, errs := runDlock(t, "release", "--force", name+"-lost"); code != 0 {
		t.Fatalf("release --force: exit %d: %s", code, errs)
	}
	if code := exitCode(cmd.Wait()); code != 204 {
		t.Errorf("lease lost: exit %d, want 204; output %q", code, out.String())
	}
}

// A command that is not found exits 127, one that cannot be executed 126, as in a shell,
// and neither takes the lock (nor reaches Redis).
func TestRunCommandNotFoundOrNotExecutable(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho ran\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	down := "redis://127.0.0.1:1" // were Redis contacted, the exit would be 69
	for _, tc := range []struct {
		cmd  string
		code int
		want string
	}{
		{"dlock-no-such-command", exitNotFound, "executable file not found in $PATH"},
		{"/nonexistent/cleanup", exitNotFound, "no such file or directory"},
		{notExec, exitCannotExec, "permission denied"},
		{t.TempDir(), exitCannotExec, "is a directory"},
	} {
		code, out, errs := runDlock(t, "run", "--redis", down, uniqueName(t), "--", tc.cmd)
		if code != tc.code || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("run -- %s: exit %d, stdout %q, stderr %q; want %d naming %q", tc.cmd, code, out, errs, tc.code, tc.want)
		}
	}
}

// dlock completion prints bash, zsh and fish scripts; the shell's callback completes
// commands, demo scenarios, lock names from Redis, and run's command as a file.
func TestCompletion(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "# bash completion V2 for dlock", "zsh": "#compdef dlock", "fish": "complete -c dlock"} {
		code, out, errs := runDlock(t, "completion", shell)
		if code != 0 || !strings.Contains(out, marker) || errs != "" {
			t.Errorf("completion %s: exit %d, stderr %q, script lacks %q", shell, code, errs, marker)
		}
		if shell == "bash" {
			check := exec.Command("bash", "-n")
			check.Stdin = strings.NewReader(out)
			if b, err := check.CombinedOutput(); err != nil {
				t.Errorf("bash -n on the bash script: %v: %s", err, b)
			}
		}
	}
	complete := func(args ...string) []string {
		t.Helper()
		code, out, errs := runDlock(t, append([]string{"__complete"}, args...)...)
		if code != 0 {
			t.Fatalf("__complete %v: exit %d: %s", args, code, errs)
		}
		return strings.Split(strings.TrimSpace(out), "\n")
	}
	has := func(lines []string, want string) bool {
		for _, l := range lines {
			if strings.Split(l, "\t")[0] == want {
				return true
			}
		}
		return false
	}
	if got := complete("st"); !has(got, "status") {
		t.Errorf("complete st: %q", got)
	}
	if got := complete("demo", "t"); !has(got, "tickets") || !has(got, "transfer") {
		t.Errorf("complete demo t: %q", got)
	}
	name := uniqueName(t)
	_, _, _ = startRun(t, name+"-x")
	for _, args := range [][]string{{"status", name}, {"release", "--force", name}, {"run", "--no-wait", name}} {
		if got := complete(args...); !has(got, name+"-x") || got[len(got)-1] != ":4" {
			t.Errorf("complete %v: %q; want the held lock's name, no files", args, got)
		}
	}
	if got := complete("run", name+"-x", ""); !has(got, "--") {
		t.Errorf("complete run NAME: %q; want --", got)
	}
	if got := complete("run", name+"-x", "--", ""); got[len(got)-1] != ":0" {
		t.Errorf("complete run NAME -- : %q; want the shell's default (files)", got)
	}
}

// list --held lists only the locks held now; list also shows recently used ones.
func TestListHeld(t *testing.T) {
	name := uniqueName(t)
	_, _, _ = startRun(t, name+"-held")
	if code, _, errs := runDlock(t, "run", name+"-used", "--", "true"); code != 0 {
		t.Fatalf("run: exit %d: %s", code, errs)
	}
	names := func(args ...string) string {
		t.Helper()
		code, out, errs := runDlock(t, append([]string{"list"}, args...)...)
		if code != 0 {
			t.Fatalf("list %v: exit %d: %s", args, code, errs)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			got = append(got, strings.Fields(l)[0])
		}
		return strings.Join(got, " ")
	}
	if got := names(name + "*"); got != name+"-held "+name+"-used" {
		t.Errorf("list: %q", got)
	}
	if got := names("--held", name+"*"); got != name+"-held" {
		t.Errorf("list --held: %q", got)
	}
}

// status tells a lock used lately from one with no state in Redis.
func TestStatusOfALockWithNoState(t *testing.T) {
	name := uniqueName(t)
	code, out, _ := runDlock(t, "status", name)
	if code != 0 || !strings.Contains(out, "free: no state in Redis (never taken, or idle past the clean-up window)") {
		t.Errorf("status of a never-taken lock: exit %d\n%s", code, out)
	}
	if code, _, errs := runDlock(t, "run", name, "--", "true"); code != 0 {
		t.Fatalf("run: exit %d: %s", code, errs)
	}
	code, out, _ = runDlock(t, "status", name)
	if code != 0 || !strings.Contains(out, "free (used within the last minute)") {
		t.Errorf("status of a lock just released: exit %d\n%s", code, out)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runDlock(t, "version")
	if code != 0 || !strings.HasPrefix(out, "dlock ") || !strings.Contains(out, "go1.") || !strings.Contains(out, "go-redis v9.") {
		t.Errorf("dlock version: exit %d, %q", code, out)
	}
	if code, out, _ := runDlock(t, "--version"); code != 0 || !strings.HasPrefix(out, "dlock ") {
		t.Errorf("dlock --version: exit %d, %q", code, out)
	}
}

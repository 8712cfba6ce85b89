package main

// Edge cases of the command line found by an adversarial review of the cobra CLI: each
// failed before its fix.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// `dlock help NOSUCH` is a mistake on the command line: one error line, usage exit code,
// nothing on stdout. (The hand-written parser ran `NOSUCH -h`: unknown command, exit 2.)
func TestHelpUnknownTopicIsAUsageError(t *testing.T) {
	code, out, errs := runDlock(t, "help", "frobnicate")
	if code != exitUsage || out != "" || !strings.Contains(errs, "dlock: error:") {
		t.Errorf("dlock help frobnicate: exit %d, stdout %d bytes, stderr %q; want exit %d, one error, empty stdout",
			code, len(out), errs, exitUsage)
	}
}

// `dlock completion bsah > /etc/bash_completion.d/dlock` must not write help text into the
// completion file and succeed; a stray argument to `completion bash` is a usage error (2),
// like every other bad argument.
func TestCompletionBadShellIsAUsageError(t *testing.T) {
	code, out, errs := runDlock(t, "completion", "bsah")
	if code != exitUsage || out != "" {
		t.Errorf("dlock completion bsah: exit %d, stdout %q..., stderr %q; want exit %d and nothing on stdout",
			code, out[:min(len(out), 60)], errs, exitUsage)
	}
	code, _, errs = runDlock(t, "completion", "bash", "extra")
	if code != exitUsage {
		t.Errorf("dlock completion bash extra: exit %d, stderr %q; want the usage code %d", code, errs, exitUsage)
	}
}

// Completion asks Redis with a 1 s bound (completionTimeout): a shell waits on it. A Redis
// that accepts connections but does not answer (stopped, overloaded, a hung proxy) must not
// hold the shell for longer.
func TestCompletionWithHungRedisIsQuick(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	srv.Pause()
	t.Cleanup(srv.Resume)
	for _, args := range [][]string{
		{"__complete", "status", ""},                       // via REDIS_URL
		{"__complete", "status", "--redis", srv.URL(), ""}, // via --redis
	} {
		cmd := dlockCmd(t, args...)
		cmd.Env = append(cmd.Env, "REDIS_URL="+srv.URL()) // the last one wins
		start := time.Now()
		out, _ := cmd.CombinedOutput()
		if took := time.Since(start); took > completionTimeout+time.Second {
			t.Errorf("dlock %v against a stopped Redis took %v (bound: %v); output %q", args, took.Round(time.Millisecond), completionTimeout, out)
		}
	}
}

// `run --wait D` that runs out while Redis is unreachable is not a conflict: it must exit
// with the unreachable code (69) and say so, even with --quiet (which silences a conflict,
// nothing else). The lock being held by another owner is not what happened.
func TestWaitRunningOutWhileRedisIsDownIsNotAConflict(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	name := uniqueName(t)
	c := holdLockOn(t, rdb, name)
	cmd := dlockCmd(t, "run", "--redis", srv.URL(), "--wait", "3s", "--quiet", name, "--", "true")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if info, _ := c.Inspect(context.Background(), name); info.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dlock run never queued")
		}
	}
	srv.Kill() // Redis goes away while dlock waits
	code := exitCode(cmd.Wait())
	if code != exitUnavailable || !strings.Contains(errb.String(), "dlock: error:") {
		t.Errorf("--wait ran out with Redis down: exit %d, output %q; want exit %d (unreachable) and an error line",
			code, errb.String(), exitUnavailable)
	}
}

// Out-of-range flags are refused with exit 2 before anything touches Redis; --permits above
// the library's maximum is out of range like --permits 0.
func TestPermitsOutOfRangeIsAUsageError(t *testing.T) {
	name := uniqueName(t)
	for _, redis := range [][]string{nil, {"--redis", "redis://127.0.0.1:1"}} {
		args := append(append([]string{"run", "--permits", "99999999999"}, redis...), name, "--", "true")
		if code, _, errs := runDlock(t, args...); code != exitUsage {
			t.Errorf("dlock %v: exit %d, stderr %q; want %d, refused before Redis", args, code, errs, exitUsage)
		}
	}
}

// A lock name that can never be valid is a bad argument: usage, 2.
func TestInvalidLockNamesAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"run", "", "--", "true"},
		{"run", "--lock", "a", "--lock", "a", "--", "true"},
		{"status", ""},
	} {
		if code, _, errs := runDlock(t, args...); code != exitUsage {
			t.Errorf("dlock %q: exit %d, stderr %q; want the usage code %d", args, code, errs, exitUsage)
		}
	}
}

// A Redis URL that can never work is a usage error naming what is wrong, not Redis being
// down: a port out of range, a sentinel URL without the master's name, an empty URL, a
// password with an unencoded # (which would parse as a port and a fragment).
func TestBadRedisURLsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct{ url, says string }{
		{"redis://127.0.0.1:99999", `port "99999" is not a number from 1 to 65535`},
		{"redis://:pw@127.0.0.1:70000", `port "70000"`},
		{"redis+cluster://127.0.0.1:1?addr=127.0.0.1:0", `port "0"`},
		{"redis+sentinel://127.0.0.1:1", "needs ?master_name=NAME"},
		{"", "it is empty"},
		{"redis://:99#pw@127.0.0.1:1/0", "must be percent-encoded"},
	} {
		code, _, errs := runDlock(t, "status", "--redis", tc.url, "x")
		if code != exitUsage || !strings.Contains(errs, tc.says) {
			t.Errorf("dlock status --redis %q: exit %d, stderr %q; want exit %d saying %q", tc.url, code, errs, exitUsage, tc.says)
		}
	}
}

// With --exit-code-base B a usage error exits B+1 (run -h). It must not depend on whether the
// bad flag came before or after --exit-code-base.
func TestExitCodeBaseUsageCodeDoesNotDependOnFlagOrder(t *testing.T) {
	a, _, _ := runDlock(t, "run", "--exit-code-base", "200", "--bogus", "x", "--", "true")
	b, _, _ := runDlock(t, "run", "--bogus", "--exit-code-base", "200", "x", "--", "true")
	c, _, _ := runDlock(t, "run", "--exit-code-base", "200", "--wait", "soon", "x", "--", "true")
	d, _, _ := runDlock(t, "run", "--wait", "soon", "--exit-code-base", "200", "x", "--", "true")
	if a != b || c != d {
		t.Errorf("usage error with --exit-code-base 200: %d (base first) vs %d (bad flag first); %d vs %d", a, b, c, d)
	}
}

// A signal while dlock tries for the lock ends the attempt with 128+N, for --wait 0 (try
// once) as for --wait D. Here the try is slow (CLIENT PAUSE WRITE holds it for 2 s) and the
// lock is held: dlock must exit 130 on SIGINT, not report a conflict 75 afterwards (or, with a
// free lock, start the command and forward the signal to it).
func TestSignalDuringTryOnceEndsIt(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	name := uniqueName(t)
	holdLockOn(t, rdb, name)
	for _, flags := range [][]string{{"--wait", "10s"}, {"--wait", "0"}, {"--no-wait"}} {
		if err := rdb.Do(context.Background(), "CLIENT", "PAUSE", 2000, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		cmd := dlockCmd(t, append(append([]string{"run", "--redis", srv.URL()}, flags...), name, "--", "true")...)
		var errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &errb, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			info, _ := rdb.Info(context.Background(), "clients").Result()
			if strings.Contains(info, "blocked_clients:1") {
				break // dlock's attempt is held by the pause
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: dlock's attempt was never held by the pause", flags)
			}
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		if code := exitCode(cmd.Wait()); code != 130 || !strings.Contains(errb.String(), "interrupt while waiting") {
			t.Errorf("run %v, SIGINT during the attempt: exit %d, output %q; want 130, interrupt while waiting", flags, code, errb.String())
		}
		_ = rdb.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
	}
}

// "The command must never outlive the lock": when the lease is lost, the command's process
// group gets SIGTERM, then SIGKILL after --grace. A member of the group that ignores SIGTERM
// must not keep running once dlock has exited 76 because the group leader obeyed.
func TestLostLeaseStopsTheWholeGroup(t *testing.T) {
	name := uniqueName(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := dlockCmd(t, "run", "--grace", "1s", name, "--", "sh", "-c",
		`(trap '' TERM; while :; do sleep 0.05; done) & echo $! > `+pidFile+`.tmp; mv `+pidFile+`.tmp `+pidFile+`; wait`)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	cmd.WaitDelay = time.Second // a survivor holding the output pipe must not hang Wait
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatalf("command never started: %s", errb.String())
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if code, _, errs := runDlock(t, "release", "--force", name); code != 0 {
		t.Fatalf("release --force: %d %s", code, errs)
	}
	err := cmd.Wait()
	if code := exitCode(err); code != exitLost && !errors.Is(err, exec.ErrWaitDelay) {
		t.Fatalf("exit %d (%v), want %d: %s", code, err, exitLost, errb.String())
	}
	// dlock returns once the group is gone or SIGKILLed; a killed process takes a moment to go.
	for deadline := time.Now().Add(2 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d of the command's group still runs after dlock exited %d on a lost lease", pid, exitLost)
		}
	}
}

// Completion offers lock names for the NAME of `dlock latch status|down|wait|set` too.
func TestCompletionLatchOffersLockNames(t *testing.T) {
	name := uniqueName(t)
	if code, _, errs := runDlock(t, "latch", "set", name, "1"); code != 0 {
		t.Fatal(errs)
	}
	code, out, _ := runDlock(t, "__complete", "latch", "status", name[:len(name)-1])
	if code != 0 || !strings.Contains(out, name+"\n") {
		t.Errorf("dlock __complete latch status PREFIX: exit %d, %q; want the latch's name", code, out)
	}
}

// --no-wait=false (or --read=false) says the flag is off; it does not contradict --wait 5s
// (--write).
func TestFalseBoolFlagsDoNotContradict(t *testing.T) {
	name := uniqueName(t)
	for _, flags := range [][]string{{"--no-wait=false", "--wait", "5s"}, {"--read=false", "--write"}} {
		args := append(append([]string{"run"}, flags...), name, "--", "true")
		if code, _, errs := runDlock(t, args...); code != 0 {
			t.Errorf("dlock %v: exit %d, stderr %q; want the run to go ahead", args, code, errs)
		}
	}
}

// With "." in PATH, a command found there is refused by os/exec (exec.ErrDot): the hint says
// to write ./NAME, not to chmod it.
func TestDotInPathHint(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "myscript"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := dlockCmd(t, "run", uniqueName(t), "--", "myscript")
	cmd.Dir = dir
	cmd.Env = append(cmd.Env, "PATH=.:"+os.Getenv("PATH"))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	code := exitCode(cmd.Run())
	if strings.Contains(errb.String(), "chmod +x") || !strings.Contains(errb.String(), "./myscript") {
		t.Errorf("myscript found through . in PATH: exit %d, stderr %q; want a hint to run ./myscript", code, errb.String())
	}
}

// Redis refusing dlock (a wrong password, a user without the commands dlock needs) is no
// outage: exit 1 with the refusal named, not 69, and the command does not run.
func TestRefusedByRedisIsNotUnreachable(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{TCP: true})
	if err := srv.AddACLUser(context.Background(), "noscripts", "pw", "~*", "&*", "+@all", "-@scripting"); err != nil {
		t.Fatal(err)
	}
	url := func(user, pass string) string { return "redis://" + user + ":" + pass + "@" + srv.Addr }
	code, out, errs := runDlock(t, "run", "--redis", url("noscripts", "wrong"), uniqueName(t), "--", "echo", "ran")
	if code != exitError || out != "" || !strings.Contains(errs, "refused PING") || !strings.Contains(errs, "password") {
		t.Errorf("wrong password: exit %d, stdout %q, stderr %q; want %d, the refusal and a hint", code, out, errs, exitError)
	}
	code, out, errs = runDlock(t, "run", "--redis", url("noscripts", "pw"), uniqueName(t), "--", "echo", "ran")
	if code != exitError || out != "" || !strings.Contains(errs, "NOPERM") {
		t.Errorf("user without scripting: exit %d, stdout %q, stderr %q; want %d naming NOPERM", code, out, errs, exitError)
	}
}

// Error lines name the Redis URL without its password (they end up in cron mail, journald,
// CI logs), whether the URL parses or not, wherever the password is. Found by review.
func TestErrorLinesMaskTheRedisPassword(t *testing.T) {
	for _, tc := range []struct {
		url       string
		showsHost bool
	}{
		{"redis://admin:S3cretPw@127.0.0.1:1/0", true},
		{"redis://:S3cretPw@127.0.0.1:1/0", true},
		{"redis://S3cretPw@127.0.0.1:1/0", true},
		{"redis://admin:S3c@retPw@127.0.0.1:1/0", true},
		{"redis://127.0.0.1:1/0?password=S3cretPw", false}, // go-redis refuses the option
		{"redis://admin:S3cretPw@127.0.0.1:1/0?dial_timeout=x", false},
		{"redis://admin:S3c/retPw@127.0.0.1:1/0", false},
		{"redis://admin:S3c#retPw@127.0.0.1:1/0", false},
		{`redis://admin:S3c"retPw@127.0.0.1:1/0`, false},
		{"admin:S3cretPw@127.0.0.1:1", false},
		// A password of digits and #, ? or / parses as a port and a fragment, query or path.
		{"redis://:99#S3cretPw@127.0.0.1:1/0", false},
		{"redis://:99?S3cretPw@127.0.0.1:1/0", false},
		{"redis://:99/S3cretPw@127.0.0.1:1/0", false},
		{"redis://admin:99#S3cretPw@127.0.0.1:1/0", false},
	} {
		code, _, errs := runDlock(t, "status", "--redis", tc.url, "x")
		for _, secret := range []string{"S3cretPw", "S3c", "retPw"} {
			if strings.Contains(errs, secret) {
				t.Errorf("dlock status --redis %s: exit %d, stderr %q shows (part of) the password", tc.url, code, errs)
				break
			}
		}
		if tc.showsHost && !strings.Contains(errs, "127.0.0.1:1") {
			t.Errorf("dlock status --redis %s: stderr %q, want the URL's host named", tc.url, errs)
		}
	}
}

// A demo worker gets the Redis URL, which may hold a password, in its environment: argv is
// shown by ps to every user.
func TestDemoWorkersGetTheRedisURLOutsideArgv(t *testing.T) {
	url := "redis://:S3cretPw@127.0.0.1:6379/0"
	cmd := workerCmd("/bin/dlock", url, "--scenario", "tickets")
	if strings.Contains(strings.Join(cmd.Args, " "), "S3cretPw") {
		t.Errorf("worker argv %q shows the password", cmd.Args)
	}
	if !slices.Contains(cmd.Env, workerRedisEnv+"="+url) {
		t.Errorf("worker environment lacks %s", workerRedisEnv)
	}
}

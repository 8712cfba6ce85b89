package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A command holding several locks sees no DLOCK_TOKEN, not even one inherited from an outer
// `dlock run` (it would read as a token of its own locks); one lock's run sets its own.
func TestRunDropsAnInheritedToken(t *testing.T) {
	a, b := uniqueName(t)+"a", uniqueName(t)+"b"
	cmd := dlockCmd(t, "run", "--lock", a, "--lock", b, "--", "sh", "-c", `echo "token=${DLOCK_TOKEN-unset}"`)
	cmd.Env = append(cmd.Env, "DLOCK_TOKEN=999")
	out, err := cmd.CombinedOutput()
	if exitCode(err) != 0 || strings.TrimSpace(string(out)) != "token=unset" {
		t.Errorf("multi-lock run with DLOCK_TOKEN=999 inherited: exit %d, output %q; want token=unset", exitCode(err), out)
	}
	cmd = dlockCmd(t, "run", a, "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`)
	cmd.Env = append(cmd.Env, "DLOCK_TOKEN=999")
	if out, err = cmd.CombinedOutput(); exitCode(err) != 0 || strings.Contains(string(out), "999") {
		t.Errorf("run with DLOCK_TOKEN=999 inherited: exit %d, output %q; want its own token", exitCode(err), out)
	}
}

// `dlock --` and `dlock -- run` name no command: a usage error line, no panic.
func TestRootDoubleDashIsAUsageError(t *testing.T) {
	for _, args := range [][]string{{"--"}, {"--", "run"}} {
		code, _, errs := runDlock(t, args...)
		if code != exitUsage || strings.Contains(errs, "panic") || !strings.Contains(errs, "no command given before --") {
			t.Errorf("dlock %q: exit %d, stderr %q; want a usage error naming the --", args, code, errs)
		}
	}
}

// A Redis that answers PING with BUSY (a long script) cannot serve now: exit 69, as for
// LOADING, not 1 with advice on passwords.
func TestBusyRedisIsUnavailable(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{Args: []string{"--busy-reply-threshold", "50"}})
	rdb := srv.Client()
	defer rdb.Close()
	busy := make(chan error, 1)
	go func() { busy <- rdb.Eval(context.Background(), "while true do end", nil).Err() }()
	defer func() {
		other := srv.Client()
		defer other.Close()
		for other.ScriptKill(context.Background()).Err() != nil && len(busy) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		<-busy
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, _, errs := runDlock(t, "status", "--redis", srv.URL(), uniqueName(t))
		if strings.Contains(errs, "BUSY") {
			if code != exitUnavailable {
				t.Errorf("status against a BUSY Redis: exit %d, stderr %q; want %d", code, errs, exitUnavailable)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis never answered BUSY: exit %d, %q", code, errs)
		}
	}
}

// A wait shorter than a round trip still tries once: a free lock runs the command, an open
// latch is reported open (as flock -w tries before it waits).
func TestShortWaitTriesOnce(t *testing.T) {
	name := uniqueName(t)
	for _, w := range []string{"1us", "100us"} {
		if code, out, errs := runDlock(t, "run", "--wait", w, name+"-"+w, "--", "echo", "ran"); code != 0 || strings.TrimSpace(out) != "ran" {
			t.Errorf("run --wait %s on a free lock: exit %d, stdout %q, stderr %q; want it run", w, code, out, errs)
		}
		if code, out, errs := runDlock(t, "latch", "--wait", w, "wait", name); code != 0 || !strings.Contains(out, "open") {
			t.Errorf("latch wait --wait %s on an open latch: exit %d, stdout %q, stderr %q; want open", w, code, out, errs)
		}
	}
}

// What can never work is a usage error (2) before anything is dialled, also with Redis down
// (69 would be retried by a script): a latch count that is not a number of at least 1;
// read-write locks, semaphores, several locks, latches and list on a Redlock.
func TestHopelessCommandLinesAreUsageErrors(t *testing.T) {
	name := uniqueName(t)
	down := []string{"--redis", "redis://127.0.0.1:1"}
	redlock := []string{"--redis", "redis://127.0.0.1:1", "--redis", "redis://127.0.0.1:2", "--redis", "redis://127.0.0.1:3"}
	for _, args := range [][]string{
		append(append([]string{"latch"}, down...), "set", name, "abc"),
		append(append([]string{"latch"}, down...), "set", name, "0"),
		append(append([]string{"run", "--read"}, redlock...), name, "--", "true"),
		append(append([]string{"run", "--write"}, redlock...), name, "--", "true"),
		append(append([]string{"run", "--permits", "2"}, redlock...), name, "--", "true"),
		append(append([]string{"run", "--lock", name + "a", "--lock", name + "b"}, redlock...), "--", "true"),
		append(append([]string{"latch"}, redlock...), "set", name, "2"),
		append([]string{"list"}, redlock...),
	} {
		if code, _, errs := runDlock(t, args...); code != exitUsage {
			t.Errorf("dlock %q: exit %d, stderr %q; want the usage code %d", args, code, errs, exitUsage)
		}
	}
}

// An operator's tools work on a Redlock with a master down, as long as a quorum answers:
// status shows the down master as unreachable, release --force breaks the lock on the others.
func TestRedlockAdminWithAMasterDown(t *testing.T) {
	var flags []string
	var servers []*redistest.Server
	for range 3 {
		s := redistest.StartT(t, redistest.Config{})
		servers = append(servers, s)
		flags = append(flags, "--redis", s.URL())
	}
	name := uniqueName(t)
	servers[2].Kill()
	if code, out, errs := runDlock(t, append(append([]string{"status"}, flags...), name)...); code != 0 || !strings.Contains(out, "unreachable") || !strings.Contains(errs, "2 of 3 masters") {
		t.Errorf("status with 1 of 3 masters down: exit %d, stdout %q, stderr %q; want the down one unreachable", code, out, errs)
	}
	if code, out, errs := runDlock(t, append(append([]string{"release", "--force"}, flags...), name)...); code != 0 || !strings.Contains(errs, "broken on the other masters") {
		t.Errorf("release --force with 1 of 3 masters down: exit %d, stdout %q, stderr %q; want it broken on the quorum", code, out, errs)
	}
}

// A unix socket's path may hold an @ (it is no password).
func TestUnixSocketPathWithAnAt(t *testing.T) {
	rdb, err := openURL("unix:///run/redis@6379/redis.sock")
	if err != nil {
		t.Fatalf("openURL(unix:///run/redis@6379/redis.sock) = %v", err)
	}
	_ = rdb.Close()
}

// release --force on a Redlock succeeds only when the masters that broke the lock leave too
// few others for a quorum: here A refuses scripts (NOREPLICAS) and B cannot be reached, so
// only C breaks it, a quorum (A, B) may still hold it, and release fails. (It read the lock
// back through Inspect, which counts only the masters that answer, and said it was broken.)
func TestRedlockReleaseNeedsAllButLessThanAQuorum(t *testing.T) {
	ctx := context.Background()
	var servers []*redistest.Server
	for range 3 {
		servers = append(servers, redistest.StartT(t, redistest.Config{}))
	}
	name := uniqueName(t)
	for _, s := range servers {
		c := s.Client()
		defer c.Close()
		dl := dlock.New(c, dlock.WithOwner("op-x"), dlock.WithTTL(time.Minute), dlock.WithoutCohort())
		defer dl.Close(ctx)
		if _, err := dl.Mutex(name).TryLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	a := servers[0].Client()
	defer a.Close()
	if err := a.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runDlock(t, "release", "--force", "--redis", servers[0].URL(), "--redis", "redis://127.0.0.1:1", "--redis", servers[2].URL(), name)
	if code == 0 || !strings.Contains(errs, "2 of 3 masters could not break the lock") {
		t.Errorf("release --force with one master refusing and one unreachable: exit %d, stdout %q, stderr %q; want a failure", code, out, errs)
	}
	if err := a.ConfigSet(ctx, "min-replicas-to-write", "0").Err(); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runDlock(t, "release", "--force", "--redis", servers[0].URL(), "--redis", "redis://127.0.0.1:1", "--redis", servers[2].URL(), name)
	if code != 0 || !strings.Contains(out, "released") || !strings.Contains(errs, "too few left for a quorum") {
		t.Errorf("release --force with one master unreachable: exit %d, stdout %q, stderr %q; want it released, with a warning", code, out, errs)
	}
}

// --wait waits out a Redis that cannot serve for a moment (NOREPLICAS here), as Lock does,
// also after its first try.
func TestWaitOutlastsAMomentaryRefusal(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartT(t, redistest.Config{})
	rdb := srv.Client()
	defer rdb.Close()
	if err := rdb.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	reset := time.AfterFunc(time.Second, func() { _ = rdb.ConfigSet(ctx, "min-replicas-to-write", "0").Err() })
	defer reset.Stop()
	code, out, errs := runDlock(t, "run", "--redis", srv.URL(), "--wait", "20s", uniqueName(t), "--", "echo", "ran")
	if code != 0 || strings.TrimSpace(out) != "ran" {
		t.Errorf("run --wait 20s with Redis refusing writes for 1 s: exit %d, stdout %q, stderr %q; want it run", code, out, errs)
	}
}

// PING answered with an error that retrying never mends (a database the server does not have)
// exits 1, not 69 (Redis unavailable, which a script retries).
func TestPingErrorThatLastsIsNotUnavailable(t *testing.T) {
	u := redistest.Shared(t).URL()
	if strings.HasPrefix(u, "unix://") {
		u += "?db=99"
	} else {
		u += "/99"
	}
	if code, _, errs := runDlock(t, "status", "--redis", u, uniqueName(t)); code != exitError || !strings.Contains(errs, "DB index is out of range") {
		t.Errorf("status --redis %s (db 99 of 16): exit %d, stderr %q; want %d", u, code, errs, exitError)
	}
}

// A unix URL whose password holds a / reads as a host and a path with an @: refused, and not
// shown.
func TestUnixURLWithAPasswordSlashIsNotShown(t *testing.T) {
	code, out, errs := runDlock(t, "status", "--redis", "unix://user:12/s3cr3t@/nonexistent/redis.sock", uniqueName(t))
	if code != exitUsage || strings.Contains(errs+out, "s3cr3t") {
		t.Errorf("exit %d, stderr %q; want a usage error that does not show the password", code, errs)
	}
}

// A master answering MISCONF (a failed background save, with stop-writes-on-bgsave-error)
// cannot serve writes until a save succeeds: Redis unavailable, exit 69 for one deployment,
// and a Redlock goes on with the others. A Redlock given one server three times is refused by
// release --force as by every other command.
func TestMisconfIsUnavailableAndReleaseChecksTheMasters(t *testing.T) {
	ctx := context.Background()
	var servers []*redistest.Server
	for range 3 {
		servers = append(servers, redistest.StartT(t, redistest.Config{Args: []string{"--enable-protected-configs", "yes"}}))
	}
	if err := servers[2].FailSaves(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runDlock(t, "run", "--redis", servers[2].URL(), uniqueName(t), "--", "true"); code != exitUnavailable || !strings.Contains(errs, "MISCONF") {
		t.Errorf("run against a MISCONF Redis: exit %d, stderr %q; want %d", code, errs, exitUnavailable)
	}
	redlock := []string{"--redis", servers[0].URL(), "--redis", servers[1].URL(), "--redis", servers[2].URL()}
	if code, out, errs := runDlock(t, append(append([]string{"run"}, redlock...), uniqueName(t), "--", "echo", "ran")...); code != 0 || strings.TrimSpace(out) != "ran" || !strings.Contains(errs, "2 of 3 masters") {
		t.Errorf("Redlock run with one master MISCONF: exit %d, stdout %q, stderr %q; want it run with a warning", code, out, errs)
	}
	u := servers[0].URL()
	if code, out, errs := runDlock(t, "release", "--force", "--redis", u, "--redis", u, "--redis", u, uniqueName(t)); code != exitUsage {
		t.Errorf("release --force with one server given 3 times: exit %d, stdout %q, stderr %q; want the usage code", code, out, errs)
	}
}

// release --force on a Redlock with one master hung (paused: it accepts and never answers)
// breaks the lock on the two others: the Redlock's own checks first need no server, so they do
// not use up the time the release has (they did: every master's release then failed).
func TestRedlockReleaseWithAHungMaster(t *testing.T) {
	ctx := context.Background()
	var servers []*redistest.Server
	var flags []string
	for range 3 {
		s := redistest.StartT(t, redistest.Config{})
		servers = append(servers, s)
		flags = append(flags, "--redis", s.URL())
	}
	name := uniqueName(t)
	for _, s := range servers[:2] {
		c := s.Client()
		defer c.Close()
		dl := dlock.New(c, dlock.WithOwner("op-x"), dlock.WithTTL(time.Minute), dlock.WithoutCohort())
		defer dl.Close(ctx)
		if _, err := dl.Mutex(name).TryLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	servers[2].Pause()
	defer servers[2].Resume()
	code, out, errs := runDlock(t, append(append([]string{"release", "--force"}, flags...), name)...)
	if code != 0 || !strings.Contains(out, "released") {
		t.Errorf("release --force with 1 of 3 masters hung: exit %d, stdout %q, stderr %q; want it released on the other two", code, out, errs)
	}
	for i, s := range servers[:2] {
		c := s.Client()
		defer c.Close()
		if n, _ := c.Exists(ctx, "dlock:{"+name+"}").Result(); n != 0 {
			t.Errorf("master %d still holds the lock key", i+1)
		}
	}
}

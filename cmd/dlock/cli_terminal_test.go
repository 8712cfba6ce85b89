package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"golang.org/x/sys/unix"
)

// sigCount makes the test binary, run with it set to a file, a command that appends a line
// to that file for each SIGINT it gets, for 3 seconds ("ready" once it listens).
const sigCount = "DLOCK_TEST_SIGCOUNT"

func init() {
	file := os.Getenv(sigCount)
	if file == "" {
		return
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		os.Exit(100)
	}
	c := make(chan os.Signal, 16)
	signal.Notify(c, syscall.SIGINT)
	_, _ = f.WriteString("ready\n")
	end := time.After(3 * time.Second)
	for {
		select {
		case <-c:
			_, _ = f.WriteString("INT\n")
		case <-end:
			os.Exit(0)
		}
	}
}

// openPTY returns a new pseudo-terminal's master and slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(); _ = s.Close() })
	return m, s
}

// waitFile waits (polling: another process writes it) until file holds want.
func waitFile(t *testing.T, file, want string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(file); strings.Contains(string(b), want) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q", file, want)
		}
	}
}

// One Ctrl-C typed at the terminal `dlock run` was started from reaches the command once, as
// without dlock: from a terminal the command shares dlock's process group, which the
// terminal signals. Found by review: dlock passed its own copy on too, and a command taking
// a second Ctrl-C as "force quit" (terraform, docker compose) was cut short in its clean-up.
func TestRunFromATerminalPassesCtrlCOnce(t *testing.T) {
	master, slave := openPTY(t)
	go func() { _, _ = io.Copy(io.Discard, master) }() // neither side blocks on a full buffer
	counts := filepath.Join(t.TempDir(), "ints")
	// The variable goes to the command only (env), not to dlock, which is this binary too.
	cmd := dlockCmd(t, "run", uniqueName(t), "--", "env", sigCount+"="+counts, os.Args[0])
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFile(t, counts, "ready")
	if _, err := master.Write([]byte{0x03}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("dlock did not exit")
	}
	b, _ := os.ReadFile(counts)
	if n := strings.Count(string(b), "INT"); n != 1 {
		t.Fatalf("one Ctrl-C at the terminal: the command got %d SIGINTs, want 1 (as without dlock)", n)
	}
}

// Ctrl-Z at a job-control shell stops a run whose command has a process group of its own
// (stdin not the terminal): the command is stopped with dlock, not left running without the
// lock dlock no longer renews. Found by review: the terminal stopped dlock alone, the lock
// expired and another host took it while the command ran on. Stopping itself, dlock sends
// the stop to its own thread: sent to the process, another thread could take it while this
// one continued the command it had just stopped (seen in about half the runs).
func TestRunCtrlZStopsTheCommandToo(t *testing.T) {
	// With the output at the terminal, and with it in a file: Ctrl-Z comes from the terminal
	// either way.
	for _, tc := range []struct{ name, redirect string }{
		{"output at the terminal", "< /dev/null"},
		{"output in a file", "< /dev/null > /dev/null 2>&1"},
	} {
		t.Run(tc.name, func(t *testing.T) { ctrlZStopsTheCommandToo(t, tc.redirect) })
	}
}

func ctrlZStopsTheCommandToo(t *testing.T, redirect string) {
	name := uniqueName(t)
	master, slave := openPTY(t)
	var mu sync.Mutex
	var tty bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			tty.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	shown := func(s string) bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(tty.String(), s) }
	sh := exec.Command("bash", "--norc", "--noprofile", "-i")
	sh.Env = append(os.Environ(), "PS1=prompt$ ")
	sh.Stdin, sh.Stdout, sh.Stderr = slave, slave, slave
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Process.Kill(); _, _ = sh.Process.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !shown("prompt$ "); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no prompt from the shell")
		}
	}
	dir := t.TempDir()
	beat, pidFile := filepath.Join(dir, "beat"), filepath.Join(dir, "pid")
	line := fmt.Sprintf("env %s=1 REDIS_URL=%s %s %s run --ttl 2s %s -- sh -c '%s; while :; do date +%%s%%N > %s; sleep 0.05; done' %s\n",
		asCLI, redistest.Shared(t).URL(), noRaceExitSleep, os.Args[0], name, writePid("$$", pidFile), beat, redirect)
	if _, err := master.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile, "\n")))
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	if _, err := master.Write([]byte{0x1a}); err != nil { // Ctrl-Z
		t.Fatal(err)
	}
	// dlock, stopped, renews nothing: the lock expires and another host takes it.
	c := dlock.New(redistest.Client(t), dlock.WithoutCohort())
	defer c.Close(context.Background())
	var l *dlock.Lease
	for deadline := time.Now().Add(10 * time.Second); l == nil; time.Sleep(20 * time.Millisecond) {
		if l, _ = c.Mutex(name).TryLock(context.Background()); l == nil && time.Now().After(deadline) {
			t.Fatal("the lock was not free 10 s after Ctrl-Z stopped dlock")
		}
	}
	defer l.Unlock(context.Background())
	// Stopped: T, or D when stopped while it waited for a child it had just vforked (dash).
	stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || !strings.ContainsRune("TtD", rune(stat[i+2])) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("after Ctrl-Z another owner took the lock while the command was not stopped (%s); terminal: %q", stat, tty.String())
	}
}

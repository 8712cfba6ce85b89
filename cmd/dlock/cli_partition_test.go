package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// cutProxy is a unix-socket proxy to the shared Redis that can be cut: every connection
// closed and new ones refused, as a network partition between one host and Redis.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T) (*cutProxy, string) {
	t.Helper()
	srv := redistest.Shared(t)
	sock := filepath.Join(t.TempDir(), "p.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial(srv.Network, srv.Addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p, "unix://" + sock
}

func (p *cutProxy) cut() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// A run cut off from Redis (a partition: Redis is fine, other hosts reach it) stops its
// command before its lease ends, SIGKILL coming at the lease's end at the latest, so the
// command is gone when the lock expires and another host takes it; dlock exits with the lost
// code. Found by review: SIGTERM came only at the lease's end and SIGKILL --grace after, so a
// command slow to stop on SIGTERM ran on beside the next holder for up to --grace.
func TestRunStopsTheCommandBeforeAnUnrenewedLeaseEnds(t *testing.T) {
	name := uniqueName(t)
	proxy, url := startCutProxy(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The command takes its time on SIGTERM (a graceful shutdown), longer than the lease has.
	script := `trap 'sleep 5; exit 0' TERM; ` + writePid("$$", pidFile) + `; while :; do sleep 0.01; done`
	r := startBgRun(t, script, pidFile, "--redis", url, "--ttl", "2s", name)
	t.Cleanup(func() { _ = syscall.Kill(-r.pid, syscall.SIGKILL) })
	proxy.cut()

	c := dlock.New(redistest.Client(t), dlock.WithoutCohort())
	defer c.Close(context.Background())
	// No event tells another host when the lock expires: it tries, as a cron job would.
	var l *dlock.Lease
	for deadline := time.Now().Add(15 * time.Second); l == nil; time.Sleep(5 * time.Millisecond) {
		var err error
		if l, err = c.Mutex(name).TryLock(context.Background()); err != nil && time.Now().After(deadline) {
			t.Fatalf("the lock never came free after the partition: %v", err)
		}
	}
	defer l.Unlock(context.Background())
	if syscall.Kill(r.pid, 0) == nil {
		t.Errorf("another host took the lock while the partitioned run's command still ran")
	}
	select {
	case err := <-r.exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitLost || !strings.Contains(r.out.String(), "not renewed") {
			t.Errorf("dlock cut off from Redis: %v, %q; want exit %d saying the lease was not renewed", err, r.out.String(), exitLost)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("dlock has not exited 10 s after the lock was taken elsewhere: %q", r.out.String())
	}
}

// The stop before an unrenewed lease's end comes at most an eighth of the TTL early: a healthy
// lease has about half its TTL left at its lowest (renewed every TTL/4, each renewal trusted
// once the next succeeded), and a renewal that timed out is retried before then.
func TestRunStopBeforeTheLeaseEnds(t *testing.T) {
	for _, tc := range []struct{ grace, ttl, want time.Duration }{
		{10 * time.Second, 30 * time.Second, 3750 * time.Millisecond},
		{2 * time.Second, 30 * time.Second, 2 * time.Second},
		{10 * time.Second, 2 * time.Second, 250 * time.Millisecond},
		{0, 30 * time.Second, 0},
	} {
		o := runOpts{grace: tc.grace, ttl: tc.ttl}
		if got := o.stopBefore(); got != tc.want {
			t.Errorf("--grace %v --ttl %v: stop %v before the lease's end, want %v", tc.grace, tc.ttl, got, tc.want)
		}
	}
}

// A run that waited for its lock, handed to it by the holder's release, keeps its command:
// such a lease starts with the grant's short TTL (half a second) until its first renewal,
// which is not Redis failing to renew it. Found by review of the early stop: about three
// handovers in four stopped a healthy command at once with exit 76.
func TestRunGrantedTheLockKeepsItsCommand(t *testing.T) {
	name := uniqueName(t)
	c := dlock.New(redistest.Client(t), dlock.WithoutCohort())
	defer c.Close(context.Background())
	// With --ttl 2s the early stop comes 250 ms before the end: within the grant's TTL (found
	// by review of the first fix, which armed the watch above that).
	for i, ttl := range []string{"30s", "30s", "2s", "2s", "2s"} {
		held, err := c.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		cmd := dlockCmd(t, "run", "--ttl", ttl, name, "--", "sh", "-c", "sleep 1.2")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The run waits in the queue: the release hands the lock straight to it.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			info, err := c.Inspect(context.Background(), name)
			if err == nil && info.Waiters > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the run never waited: %v %q", err, out.String())
			}
		}
		if err := held.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("handover %d (--ttl %s): a run granted the lock: %v, %q; want its command run to the end", i, ttl, err, out.String())
		}
	}
}

package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"

	"github.com/dlock-go/dlock"
	"golang.org/x/sys/unix"
)

// Not run from a terminal, the command runs in a process group of its own, and dlock is the
// subreaper of its descendants: the lock is held until the last process of the group has
// exited, and the orphans that come to dlock are reaped here, so that none lingers as a
// zombie (a zombie would count as a member of the group, and pile up under a long run).

// waitGroup keeps the lease while the command's process group (target < 0) still has
// members after the command itself exited: children it started in the background run on
// under the lock, as a lock taken with flock stays held while a child keeps its descriptor.
// Signals are forwarded to the group meanwhile. It reports whether the group exited, or the
// lease was lost or is ending unrenewed first (the caller stops the group).
func waitGroup(target int, lease *dlock.Lease, ending <-chan struct{}, sigs <-chan os.Signal) groupEnd {
	for groupAlive(target) {
		select {
		case sig := <-sigs:
			_ = syscall.Kill(target, sig.(syscall.Signal))
		case <-lease.Done():
			return groupLost
		case <-ending:
			return groupEnding
		case <-time.After(20 * time.Millisecond): // no event tells when the last of a group exits
		}
	}
	return groupExited
}

// groupEnd is how waitGroup ended: the group exited, the lease was lost, or the lease is
// ending unrenewed (leaseEnding).
type groupEnd int

const (
	groupExited groupEnd = iota
	groupLost
	groupEnding
)

// groupAlive reports whether the process group (target < 0) has a member left. It first
// reaps dlock's own exited children: the command's orphans, reparented to dlock (its
// subreaper), which unreaped would count as members forever. Called only once the command
// itself has been waited for, so no other wait is robbed (until then its orphans' zombies
// wait).
func groupAlive(target int) bool {
	for {
		if pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 || err != nil {
			break
		}
	}
	err := syscall.Kill(target, 0)
	return err == nil || err == syscall.EPERM // EPERM: a member under another user id
}

// leaderGone is stop's exited channel for a command that has already exited.
var leaderGone = func() chan error { c := make(chan error); close(c); return c }()

// reapOrphans reaps the command's orphans (reparented to dlock, its subreaper) each time a
// child of dlock exits while the command runs, until done closes: all but the command itself
// (leader), which os/exec waits for. An orphan that exits after the command is reaped by
// groupAlive.
func reapOrphans(leader int, done <-chan struct{}) {
	exits := make(chan os.Signal, 1)
	signal.Notify(exits, syscall.SIGCHLD)
	defer signal.Stop(exits)
	for {
		// Peek at an exited child without reaping it, and reap it only if it is not the
		// command: the command's status belongs to os/exec. Orphans behind an exited command
		// wait for groupAlive, which runs once the command has been waited for. The first
		// pass runs at once: an orphan may have exited before Notify.
		for {
			pid, ok := exitedChild()
			if !ok || pid == leader {
				break
			}
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != nil {
				break
			}
		}
		select {
		case <-done:
			return
		case <-exits:
		}
	}
}

// exitedChild returns a child of dlock that has exited, without reaping it (waitid with
// WNOWAIT); false when none has.
func exitedChild() (int, bool) {
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil || info.Signo == 0 {
		return 0, false
	}
	// siginfo_t's si_pid opens the union after three ints, aligned as a pointer (Linux, every
	// architecture); x/sys/unix leaves the union unnamed.
	word := unsafe.Sizeof(uintptr(0))
	off := (12 + word - 1) &^ (word - 1)
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(&info), off))), true
}

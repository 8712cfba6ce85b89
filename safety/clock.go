package main

import (
	"os/exec"
	"syscall"
	"unsafe"
)

// mono reads CLOCK_MONOTONIC in nanoseconds: one clock for every process on this machine, so
// histories from separate client processes can be merged (Go's monotonic readings are only
// comparable within a process).
func mono() int64 {
	var ts syscall.Timespec
	const clockMonotonic = 1
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		panic(errno)
	}
	return ts.Nano()
}

func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}

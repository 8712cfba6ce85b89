//go:build !linux

package redisserver

import "os/exec"

// dieWithParent does nothing where the kernel has no parent-death signal (macOS, the BSDs):
// a server outlives a test process that was killed, not one that ended (Stop and the tests'
// cleanup stop it).
func dieWithParent(*exec.Cmd) {}

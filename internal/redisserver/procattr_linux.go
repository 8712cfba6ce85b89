package redisserver

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server if the test process dies first (a test binary
// killed by its timeout), so no redis-server outlives its test run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

package redistest

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// leakedGoroutines waits up to timeout for every goroutine started by dlock, go-redis or rueidis to
// exit, and returns the stacks of those still running. The test runner's own goroutines
// (and this function's) are not counted.
func leakedGoroutines(timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		var leaked []string
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range bytes.Split(buf, []byte("\n\n")) {
			s := string(g)
			if strings.Contains(s, "redistest.leakedGoroutines") || strings.Contains(s, "redistest.Main") {
				continue
			}
			if strings.Contains(s, "github.com/dlock-go/dlock") || strings.Contains(s, "github.com/redis/go-redis") ||
				strings.Contains(s, "github.com/redis/rueidis") {
				leaked = append(leaked, s)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(20 * time.Millisecond) // goroutines wind down after Close returns
	}
}

// checkLeaks reports leaked goroutines as an error.
func checkLeaks() error {
	leaked := leakedGoroutines(5 * time.Second)
	if len(leaked) == 0 {
		return nil
	}
	return fmt.Errorf("%d goroutines leaked after the tests:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
}

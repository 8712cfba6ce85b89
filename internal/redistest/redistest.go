// Package redistest gives tests real redis-server processes (see internal/redisserver): one
// shared server per test package, started by Main, or one per test with StartT. A missing
// redis-server is a test failure with an install hint, never a skip.
package redistest

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// Server and Config are redisserver's.
type (
	Server = redisserver.Server
	Config = redisserver.Config
)

// StartT starts a server for one test and stops it at cleanup. It fails the test (never skips)
// when redis-server cannot start.
func StartT(t testing.TB, cfg Config) *Server {
	t.Helper()
	s, err := redisserver.Start(cfg)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

var (
	shared   *Server
	sharedMu sync.Mutex
	nameSeq  atomic.Uint64
)

// Main runs a test package against one shared server started before the tests and stopped
// after them, then fails the package if any goroutine of dlock, go-redis or rueidis is still running. Use it from TestMain: os.Exit(redistest.Main(m)). It exits non-zero with a clear
// message when redis-server cannot start.
// Each before function runs once the server is up, before the tests.
func Main(m *testing.M, before ...func(*Server)) int {
	s, err := redisserver.Start(Config{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	for _, f := range before {
		f(s)
	}
	sharedMu.Lock()
	shared = s
	sharedMu.Unlock()
	code := m.Run()
	atEndMu.Lock()
	ends := atEnd
	atEndMu.Unlock()
	for _, f := range ends {
		f()
	}
	s.Stop()
	if code == 0 {
		if err := checkLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			return 1
		}
	}
	return code
}

var (
	atEndMu sync.Mutex
	atEnd   []func()
)

// AtEnd has Main call f after the tests, before it looks for leaked goroutines: for what a
// test hook keeps for the whole run (clients shared between tests) and closes then.
func AtEnd(f func()) {
	atEndMu.Lock()
	defer atEndMu.Unlock()
	atEnd = append(atEnd, f)
}

// Shared returns the package's shared server (see Main).
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		t.Fatal("redistest: no shared server: call redistest.Main from TestMain")
	}
	return shared
}

// Client returns a client of the shared server, closed at test cleanup.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := Shared(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Name returns a key name unique to this test run, so tests sharing a server never meet.
func Name(t testing.TB) string {
	r := strings.NewReplacer("/", ".", " ", "_")
	return fmt.Sprintf("%s#%d", r.Replace(t.Name()), nameSeq.Add(1))
}

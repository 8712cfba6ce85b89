// Package dlocktest starts real, throwaway redis-server processes for the tests of code that
// uses dlock. A lock's behaviour lives in Redis (Lua scripts, key expiry, push notifications,
// the FIFO a release hands the lock to), so a fake of Redis cannot show it; dlock's own tests
// run against real servers the same way. A server starts in a few milliseconds, in a temporary
// directory, on a unix socket, without persistence, and is stopped when the test ends.
//
//	func TestReport(t *testing.T) {
//		c := dlocktest.NewClient(t)           // a dlock Client on a fresh server
//		l, err := c.Mutex("report").Lock(t.Context())
//		...
//	}
//
// It needs the redis-server binary (Debian: apt-get install redis-server), version 7.0 or
// later. When it is missing the test fails, saying how to install it: a lock test that
// silently skips in CI proves nothing.
//
// For unit tests that should not touch Redis at all, depend on a small interface of your own
// (see the package example) rather than on *dlock.Mutex.
package dlocktest

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// A Server is one redis-server process started for a test.
type Server struct {
	s *redisserver.Server
}

// Start starts a redis-server for t and stops it when t's cleanup runs. It fails t (it never
// skips) when redis-server is not installed, saying how to install it, or does not start.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("dlocktest: %v", err)
	}
	t.Cleanup(s.s.Stop)
	return s
}

// start starts a server, or says why it cannot.
func start() (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found in PATH: install Redis 7.0 or later (Debian, Ubuntu: `apt-get install -y redis-server`; macOS: `brew install redis`)")
	}
	s, err := redisserver.Start(redisserver.Config{})
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// Client returns a go-redis client of the server, closed when t's cleanup runs.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := s.s.Client()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// URL returns the server's address as a URL (unix://...), for code that connects by itself
// from a setting such as REDIS_URL (redis.ParseURL reads it).
func (s *Server) URL() string { return s.s.URL() }

// Kill stops the server at once, as a crash would (SIGKILL): for tests of what the code under
// test does when Redis goes away. Its data is lost. Restart starts it again.
func (s *Server) Kill() { s.s.Kill() }

// Restart starts a killed server again, on the same address and empty, and returns once it
// answers. A server that is running is killed first.
func (s *Server) Restart() error {
	s.s.Kill()
	return s.s.Restart()
}

// NewClient starts a server for t (as Start does) and returns a dlock Client on it with opts,
// closed when t's cleanup runs, before the server stops.
func NewClient(t testing.TB, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	s := Start(t)
	c := dlock.New(s.Client(t), opts...)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

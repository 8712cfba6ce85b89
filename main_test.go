package dlock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	// Examples connect through REDIS_URL, as a program would; point it at the shared server.
	os.Exit(redistest.Main(m, func(s *redistest.Server) { os.Setenv("REDIS_URL", s.URL()) }))
}

// newClient returns a dlock Client on the shared server, closed at cleanup, and a raw client
// for inspecting and tampering with keys.
func newClient(t *testing.T, opts ...dlock.Option) (*dlock.Client, *redis.Client) {
	t.Helper()
	rdb := redistest.Client(t)
	c := dlock.New(rdb, opts...)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, rdb
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitDone waits for a lease to end, failing the test after limit.
func waitDone(t *testing.T, l *dlock.Lease, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-l.Done():
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("lease %q still held after %v", l.Name(), limit)
		return time.Time{}
	}
}

func lockKey(name string) string { return dlock.DefaultKeyPrefix + "{" + name + "}" }

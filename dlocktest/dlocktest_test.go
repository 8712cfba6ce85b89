package dlocktest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
)

// A Client on a fresh server takes and releases a lock, and a second owner is refused while
// it is held.
func TestNewClientLocks(t *testing.T) {
	ctx := context.Background()
	c := NewClient(t)
	l, err := c.Mutex("job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("job", dlock.WithoutCohort()).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second owner: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A killed server makes lock calls fail with ErrUnavailable; restarted, it serves again.
func TestKillAndRestart(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	c := dlock.New(s.Client(t))
	defer c.Close(ctx)
	s.Kill()
	if _, err := c.Mutex("job").TryLock(ctx); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryLock with the server killed: %v, want ErrUnavailable", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	l, err := c.Mutex("job").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after Restart: %v", err)
	}
	_ = l.Unlock(ctx)
}

// Without redis-server in PATH, Start says how to install it.
func TestStartSaysHowToInstallRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := start()
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y redis-server") {
		t.Fatalf("start without redis-server: %v, want an install hint", err)
	}
}

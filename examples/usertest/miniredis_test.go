package usertest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// dlock on miniredis, the in-process Redis emulator many Go teams test with: miniredis's Lua
// cannot compile dlock's scripts (Redis 7 script flags), so every lock call fails at once with
// ErrIncompatible, saying to use a real server (dlocktest) rather than slowing down silently.
func TestMiniredisIsRefusedWithAClearError(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)
	for _, lock := range []func() error{
		func() error { _, err := c.Mutex("job").TryLock(ctx); return err },
		func() error { _, err := c.Mutex("job").Lock(ctx); return err },
		func() error { _, err := c.RWMutex("cfg").RLock(ctx); return err },
		func() error { _, err := c.Semaphore("pool", 2).Acquire(ctx, 1); return err },
	} {
		err := lock()
		if !errors.Is(err, dlock.ErrIncompatible) || !strings.Contains(err.Error(), "dlocktest") {
			t.Fatalf("on miniredis: %v, want ErrIncompatible naming dlocktest", err)
		}
	}
}

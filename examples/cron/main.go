// Command cron is seed 001's clean-up job with dlock: several "nodes" wake at each tick and
// only the one that gets the lock runs the clean-up; the others skip. The job stops at once
// if its lease is lost (Done), instead of going on without the lock.
//
//	REDIS_URL=redis://localhost:6379 go run ./examples/cron
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

func main() {
	opt, err := redis.ParseURL(envOr("REDIS_URL", "redis://localhost:6379"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := run(context.Background(), rdb, "example:cleanup", os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rdb *redis.Client, job string, out io.Writer) error {
	const nodes, ticks = 4, 3
	var runs, skips atomic.Int32
	var wg sync.WaitGroup
	errs := make([]error, nodes)
	for n := 0; n < nodes; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dlock.New(rdb) // one Client per node, as in separate processes
			defer c.Close(ctx)
			for tick := 0; tick < ticks; tick++ {
				// Whoever gets the tick's lock runs the clean-up unless it is marked done; the
				// others skip. The mark makes a node that wakes late skip too, even after the
				// lock was released.
				name := fmt.Sprintf("%s:%d", job, tick)
				l, err := c.Mutex(name).TryLock(ctx)
				if errors.Is(err, dlock.ErrNotObtained) {
					skips.Add(1)
					continue
				}
				if err != nil {
					errs[n] = err
					return
				}
				if rdb.Exists(ctx, name+":done").Val() == 1 {
					skips.Add(1)
				} else {
					select {
					case <-l.Done(): // lost the lease: stop, another node may run now
					case <-time.After(20 * time.Millisecond): // the clean-up's work
						runs.Add(1)
						rdb.Set(ctx, name+":done", n, time.Hour)
					}
				}
				_ = l.Unlock(ctx)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(out, "ticks %d, clean-ups %d, skipped %d\n", ticks, runs.Load(), skips.Load())
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Command counter is seed 002's shared counter with dlock: goroutines add 1 and subtract 1,
// 10,000 times each, with a read-modify-write under the lock; the result is 0 every time.
//
//	REDIS_URL=redis://localhost:6379 go run ./examples/counter
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

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
	if err := run(context.Background(), rdb, "example:counter", 10000, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rdb *redis.Client, key string, times int, out io.Writer) error {
	c := dlock.New(rdb)
	defer c.Close(ctx)
	if err := rdb.Set(ctx, key, 0, 0).Err(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, delta := range []int{+1, -1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(key + ":lock")
			for n := 0; n < times && errs[i] == nil; n++ {
				l, err := m.Lock(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				v, err := rdb.Get(ctx, key).Int()
				if err == nil {
					err = rdb.Set(ctx, key, v+delta, 0).Err()
				}
				errs[i] = errors.Join(err, l.Unlock(ctx))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	v, err := rdb.Get(ctx, key).Int()
	fmt.Fprintf(out, "counter %d\n", v)
	return err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

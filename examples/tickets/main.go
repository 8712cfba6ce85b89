// Command tickets is seed 000's ticket sale with dlock: 8 tickets, 10 buyers, no oversell.
// Each buyer holds the lock for the film while it reads and writes the stock, and writes the
// stock with its fencing token so a buyer that stalled past its lease cannot overwrite it.
//
//	REDIS_URL=redis://localhost:6379 go run ./examples/tickets
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
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
	if err := run(context.Background(), rdb, "example:film-1", os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rdb *redis.Client, film string, out io.Writer) error {
	c := dlock.New(rdb)
	defer c.Close(ctx)
	stock := film + ":stock"
	rdb.Del(ctx, stock) // a fresh sale: 8 tickets, no token seen yet
	if err := dlock.FencedSet(ctx, rdb, stock, 8, 0); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sold, refused := 0, 0
	errs := make([]error, 10)
	for buyer := 0; buyer < 10; buyer++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Mutex(film).Lock(ctx) // one handle per buyer: buyers exclude each other
			if err != nil {
				errs[buyer] = err
				return
			}
			defer l.Unlock(ctx)
			v, _, err := dlock.FencedGet(ctx, rdb, stock)
			if err != nil {
				errs[buyer] = err
				return
			}
			left, _ := strconv.Atoi(v)
			mu.Lock()
			defer mu.Unlock()
			if left < 1 {
				refused++
				return
			}
			// The token makes the write safe even if this buyer's lease ended meanwhile.
			if err := dlock.FencedSet(ctx, rdb, stock, left-1, l.Token()); err != nil {
				errs[buyer] = err
				return
			}
			sold++
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	v, _, _ := dlock.FencedGet(ctx, rdb, stock)
	fmt.Fprintf(out, "sold %d, refused %d, left %s\n", sold, refused, v)
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

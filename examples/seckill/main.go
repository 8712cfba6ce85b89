// Command seckill is seed 003's flash sale with dlock: every user clicks twice, but a lock per
// user id ("order:<userId>") keeps it to one order each, and the stock is decremented
// atomically in Redis, so nothing is oversold.
//
//	REDIS_URL=redis://localhost:6379 go run ./examples/seckill
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
	if err := run(context.Background(), rdb, "example:sale", os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rdb *redis.Client, sale string, out io.Writer) error {
	const vouchers, users = 20, 30
	c := dlock.New(rdb)
	defer c.Close(ctx)
	if err := rdb.Set(ctx, sale+":stock", vouchers, 0).Err(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 2*users)
	for click := 0; click < 2*users; click++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[click] = order(ctx, c, rdb, sale, strconv.Itoa(click/2))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	orders, _ := rdb.HLen(ctx, sale+":orders").Result()
	left, _ := rdb.Get(ctx, sale+":stock").Int()
	fmt.Fprintf(out, "orders %d, vouchers left %d\n", orders, left)
	return nil
}

// order places at most one order for user: the user's lock makes check-then-create atomic.
func order(ctx context.Context, c *dlock.Client, rdb *redis.Client, sale, user string) error {
	l, err := c.Mutex(sale + ":order:" + user).Lock(ctx)
	if err != nil {
		return err
	}
	defer l.Unlock(ctx)
	if rdb.HExists(ctx, sale+":orders", user).Val() {
		return nil // this user's other click got here first
	}
	if left, err := rdb.Decr(ctx, sale+":stock").Result(); err != nil || left < 0 {
		if err == nil {
			err = rdb.Incr(ctx, sale+":stock").Err() // sold out: put it back
		}
		return err
	}
	return rdb.HSet(ctx, sale+":orders", user, l.Token()).Err()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

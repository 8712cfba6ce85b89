// Command clientpercall measures what a dlock Client made per call costs against one Client
// per process: 200 sequential Lock + Unlock each way, the time per lock and the connections
// Redis received (INFO stats total_connections_received). README.md quotes its output.
//
//	REDIS_URL=redis://localhost:6379 go run ./clientpercall   (in bench/)
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientpercall: set REDIS_URL:", err)
		os.Exit(2)
	}
	admin := redis.NewClient(opt)
	defer admin.Close()
	const n = 200
	for _, perCall := range []bool{false, true} {
		before := connections(ctx, admin)
		start := time.Now()
		shared := dlock.New(redis.NewClient(opt))
		for i := range n {
			c, rdb := shared, (*redis.Client)(nil)
			if perCall {
				rdb = redis.NewClient(opt)
				c = dlock.New(rdb)
			}
			l, err := c.Mutex("clientpercall:" + strconv.FormatBool(perCall) + ":" + strconv.Itoa(i)).Lock(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, "clientpercall:", err)
				os.Exit(1)
			}
			_ = l.Unlock(ctx)
			if perCall {
				_ = c.Close(ctx)
				_ = rdb.Close()
			}
		}
		per := time.Since(start) / n
		_ = shared.Close(ctx)
		mode := "one Client per process"
		if perCall {
			mode = "a Client per call"
		}
		fmt.Printf("%s: %v per lock, %d connections for %d locks\n", mode, per.Round(time.Microsecond), connections(ctx, admin)-before, n)
	}
}

// connections is how many connections the server has received since it started.
func connections(ctx context.Context, rdb *redis.Client) int {
	for _, line := range strings.Split(rdb.Info(ctx, "stats").Val(), "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return -1
}

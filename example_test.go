package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb) // one per process; renews and watches all its leases
	defer c.Close(ctx)

	l, err := c.Mutex("example:orders:42").Lock(ctx)
	if err != nil {
		fmt.Println("not locked:", err)
		return
	}
	select {
	case <-l.Done(): // the lease was lost: stop working, someone else may hold the lock
		fmt.Println("lost:", l.Err())
	default:
		fmt.Println("holding", l.Name()) // pass l.Token() to the resource you write
	}
	fmt.Println("unlock:", l.Unlock(ctx))
	// Output:
	// holding example:orders:42
	// unlock: <nil>
}

// A holder that stalls past its lease (a GC pause, a slow disk) may still try to write. The
// fencing token lets the resource refuse it: the next holder's token is higher.
func Example_fencing() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	stalled, _ := c.Mutex("example:stock", dlock.WithTTL(50*time.Millisecond), dlock.WithFixedLease()).Lock(ctx)
	<-stalled.Done() // its lease ran out while it was "paused"

	current, _ := c.Mutex("example:stock").Lock(ctx)
	fmt.Println("current holder writes:", dlock.FencedSet(ctx, rdb, "example:stock-count", 41, current.Token()))

	err := dlock.FencedSet(ctx, rdb, "example:stock-count", 40, stalled.Token())
	fmt.Println("stalled holder's write refused:", errors.Is(err, dlock.ErrStaleToken))

	v, token, _ := dlock.FencedGet(ctx, rdb, "example:stock-count")
	fmt.Println("stock:", v, "written by the current holder:", token == current.Token() && token > stalled.Token())
	_ = current.Unlock(ctx)
	// Output:
	// current holder writes: <nil>
	// stalled holder's write refused: true
	// stock: 41 written by the current holder: true
}

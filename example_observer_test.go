package dlock_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// An Observer's CallStart may return a context for the call (a trace span, say); CallDone gets
// it back with what the call returned.
func ExampleObserver() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	type spanKey struct{}
	c := dlock.New(rdb, dlock.WithObserver(dlock.Observer{
		CallStart: func(ctx context.Context, call dlock.Call) context.Context {
			return context.WithValue(ctx, spanKey{}, "span for "+call.Method)
		},
		CallDone: func(ctx context.Context, call dlock.Call, res dlock.CallResult) {
			fmt.Println(ctx.Value(spanKey{}), "->", dlock.Outcome(res.Err))
		},
	}))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:observer").Lock(ctx)
	_ = l.Unlock(ctx)
	// Output:
	// span for Lock -> ok
	// span for Unlock -> ok
}

// A Call names the primitive, the method and the lock.
func ExampleCall() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithObserver(dlock.Observer{
		CallDone: func(_ context.Context, call dlock.Call, _ dlock.CallResult) {
			fmt.Println(call.Kind, call.Method, call.Name, time.Since(call.Start) > 0)
		},
	}))
	defer c.Close(ctx)

	l, _ := c.Semaphore("example:exports", 2).TryAcquire(ctx, 1)
	_ = l.Unlock(ctx)
	// Output:
	// semaphore TryAcquire example:exports true
	// semaphore Unlock example:exports true
}

// A CallResult is the lease a call returned, or its error.
func ExampleCallResult() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithObserver(dlock.Observer{
		CallDone: func(_ context.Context, call dlock.Call, res dlock.CallResult) {
			if call.Method != "Unlock" {
				fmt.Println(call.Method, "lease:", res.Lease != nil, "outcome:", dlock.Outcome(res.Err))
			}
		},
	}))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:result").Lock(ctx)
	_, _ = c.Mutex("example:result", dlock.WithoutCohort()).TryLock(ctx) // another owner
	_ = l.Unlock(ctx)
	// Output:
	// Lock lease: true outcome: ok
	// TryLock lease: false outcome: not_obtained
}

// A LeaseEnd says how a lease ended: Err is nil for an Unlock, and matches ErrLeaseLost when
// the lease was lost (here, an operator broke the lock).
func ExampleLeaseEnd() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ended := make(chan dlock.LeaseEnd, 2)
	c := dlock.New(rdb, dlock.WithObserver(dlock.Observer{LeaseEnded: func(e dlock.LeaseEnd) { ended <- e }}))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:ended").Lock(ctx)
	_ = l.Unlock(ctx)
	e := <-ended
	fmt.Println("unlocked:", e.Err == nil, e.Held > 0)

	_, _ = c.Mutex("example:ended").Lock(ctx)
	_, _ = c.ForceRelease(ctx, "example:ended")
	e = <-ended
	fmt.Println("broken:", dlock.Outcome(e.Err), e.Lease.Token() > 0)
	// Output:
	// unlocked: true true
	// broken: lost true
}

// A Renewal is one watchdog renewal: every TTL/4 while a lease is held.
func ExampleRenewal() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	renewed := make(chan dlock.Renewal, 1)
	c := dlock.New(rdb, dlock.WithTTL(300*time.Millisecond), dlock.WithObserver(dlock.Observer{
		Renewed: func(r dlock.Renewal) {
			select {
			case renewed <- r:
			default: // the example reads one
			}
		},
	}))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:renewal").Lock(ctx)
	r := <-renewed
	fmt.Println(r.Lock, dlock.Outcome(r.Err), r.Latency > 0)
	_ = l.Unlock(ctx)
	// Output:
	// example:renewal ok true
}

// LockInfo is what Inspect and Locks read: here, a semaphore with one of its permits out.
func ExampleLockInfo() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL")) // in a real program: the client it already has
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	l, _ := c.Semaphore("example:info", 3).Acquire(ctx, 1)
	info, _ := c.Inspect(ctx, "example:info")
	fmt.Printf("%s held=%v permits=%d out=%d holders=%d\n", info.Kind, info.Held, info.Permits, info.PermitsOut, info.Readers)
	_ = l.Unlock(ctx)
	info, _ = c.Inspect(ctx, "example:info")
	fmt.Println("after Unlock: held =", info.Held)
	// Output:
	// semaphore held=true permits=3 out=1 holders=1
	// after Unlock: held = false
}

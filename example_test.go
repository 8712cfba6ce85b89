package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
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

// Re-entry is explicit: code running under a lease passes the lease's context on, and a Lock
// of the same lock given that context re-enters with the same token. The same context is
// cancelled when the lease is lost, so it is also the one to give the protected work.
func ExampleLease_Context() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)
	m := c.Mutex("example:account:7")

	outer, err := m.Lock(ctx)
	if err != nil {
		fmt.Println("not locked:", err)
		return
	}
	defer outer.Unlock(ctx)

	transfer := func(ctx context.Context) error { // called with or without the lock held
		l, err := m.Lock(ctx) // re-enters when ctx comes from a lease on this lock
		if err != nil {
			return err
		}
		defer l.Unlock(ctx)
		fmt.Println("re-entered with the outer token:", l.Token() == outer.Token())
		return nil
	}
	fmt.Println("transfer:", transfer(outer.Context()))

	_, err = m.TryLock(ctx) // without the lease's context: another caller, excluded
	fmt.Println("plain TryLock:", errors.Is(err, dlock.ErrNotObtained))
	// Output:
	// re-entered with the outer token: true
	// transfer: <nil>
	// plain TryLock: true
}

// Many readers share a read-write lock; a writer takes it alone, after the readers before it
// and ahead of readers that come after it.
func ExampleRWMutex() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	prices := c.RWMutex("example:config:pricing")
	r1, _ := prices.RLock(ctx) // serve from the price table...
	r2, _ := prices.RLock(ctx) // ...with another reader at the same time
	_, err = prices.TryLock(ctx)
	fmt.Println("writer while read:", errors.Is(err, dlock.ErrNotObtained))
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)

	w, err := prices.Lock(ctx) // reload the table, alone
	if err != nil {
		fmt.Println("not locked:", err)
		return
	}
	fmt.Println("writer token above the readers':", w.Token() > r1.Token())
	fmt.Println("unlock:", w.Unlock(ctx))
	// Output:
	// writer while read: true
	// writer token above the readers': true
	// unlock: <nil>
}

// A MultiLock takes several locks together, all or nothing, whatever order the names come in:
// two transfers between the same accounts in opposite directions never deadlock.
func ExampleMultiLock() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	l, err := c.MultiLock([]string{"example:account:7", "example:account:1"}).Lock(ctx)
	if err != nil {
		fmt.Println("not locked:", err)
		return
	}
	_, err = c.Mutex("example:account:1").TryLock(ctx)
	fmt.Println("a member is taken:", errors.Is(err, dlock.ErrNotObtained))
	fmt.Println("tokens:", len(l.Tokens())) // pass each to its account's store
	fmt.Println("unlock:", l.Unlock(ctx))
	// Output:
	// a member is taken: true
	// tokens: 2
	// unlock: <nil>
}

// A Semaphore lets at most N holders in at once; each Acquire leases its permits, so a holder
// that dies gives them back when its lease ends.
func ExampleSemaphore() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	exports := c.Semaphore("example:exports", 2) // at most 2 exports at once, across processes
	a, _ := exports.Acquire(ctx, 1)
	b, _ := exports.Acquire(ctx, 1)
	_, err = exports.TryAcquire(ctx, 1)
	fmt.Println("a third export:", errors.Is(err, dlock.ErrNotObtained))
	_ = a.Unlock(ctx) // gives its permit back
	free, _ := exports.Available(ctx)
	fmt.Println("free permits:", free)
	fmt.Println("unlock:", b.Unlock(ctx))
	// Output:
	// a third export: true
	// free permits: 1
	// unlock: <nil>
}

// A Latch opens when its count reaches zero: here a sale waits for its warehouse loaders.
func ExampleLatch() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	loaded := c.Latch("example:warehouses-loaded")
	_, _ = loaded.TrySetCount(ctx, 2)
	for range 2 {
		go func() { _ = loaded.CountDown(ctx) }() // each loader, once its stock is in
	}
	fmt.Println("wait:", loaded.Wait(ctx)) // the sale opens
	n, _ := loaded.Count(ctx)
	fmt.Println("count:", n)
	// Output:
	// wait: <nil>
	// count: 0
}

// NewRedlock holds a Mutex on a quorum of independent masters (at least 3 of 5): a lease
// outlives the loss of two masters, and a master that loses its data does not grant the lock
// twice while the lease holds more than a bare quorum. It is compiled, not run: it needs five
// servers.
func ExampleNewRedlock() {
	ctx := context.Background()
	var masters []redis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379", "redis-d:6379", "redis-e:6379"} {
		masters = append(masters, redis.NewClient(&redis.Options{Addr: addr}))
	}
	c := dlock.NewRedlock(masters, dlock.WithTTL(10*time.Second))
	defer c.Close(ctx)

	l, err := c.Mutex("payments:42").Lock(ctx)
	if err != nil {
		fmt.Println("not locked:", err)
		return
	}
	defer l.Unlock(ctx)
	// Pass l.Token() to the payment store: it only rises across holders, on any quorum.
	fmt.Println("charging under token", l.Token())
}

// An Observer feeds metrics, traces and logs. Here it counts lock calls by outcome and measures
// how long leases were held; the CallStart context is where a tracer would start its span.
func ExampleWithObserver() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var mu sync.Mutex
	calls := map[string]int{}
	ended := make(chan time.Duration, 1)
	c := dlock.New(rdb, dlock.WithObserver(dlock.Observer{
		CallDone: func(ctx context.Context, call dlock.Call, res dlock.CallResult) {
			outcome := "ok"
			if errors.Is(res.Err, dlock.ErrNotObtained) {
				outcome = "busy"
			}
			mu.Lock()
			calls[call.Kind+" "+call.Method+" "+outcome]++
			mu.Unlock()
		},
		LeaseEnded: func(e dlock.LeaseEnd) { ended <- e.Held },
	}))
	defer c.Close(ctx)

	l, _ := c.Mutex("example:report").Lock(ctx)
	_, err := c.Mutex("example:report", dlock.WithoutCohort()).TryLock(ctx) // another owner
	fmt.Println("second owner:", errors.Is(err, dlock.ErrNotObtained))
	_ = l.Unlock(ctx)
	fmt.Println("held for a while:", <-ended > 0)
	mu.Lock()
	fmt.Println(calls["mutex Lock ok"], calls["mutex TryLock busy"], calls["mutex Unlock ok"])
	mu.Unlock()
	// Output:
	// second owner: true
	// held for a while: true
	// 1 1 1
}

// A Client is made once per process over the go-redis client the program already has, and
// closed at shutdown (which releases what is still held).
func ExampleNew() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithTTL(10*time.Second)) // options here are every handle's defaults
	defer c.Close(ctx)

	l, err := c.Mutex("example:new").TryLock(ctx)
	fmt.Println("locked:", err == nil, "TTL:", l.TTL())
	_ = l.Unlock(ctx)
	// Output:
	// locked: true TTL: 10s
}

// TryLock makes one attempt: a lock another owner holds is ErrNotObtained at once.
func ExampleMutex_TryLock() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	job := c.Mutex("example:nightly-cleanup")
	first, _ := job.TryLock(ctx)
	_, err := job.TryLock(ctx) // another goroutine, or another process
	fmt.Println("second attempt:", errors.Is(err, dlock.ErrNotObtained))
	_ = first.Unlock(ctx)
	// Output:
	// second attempt: true
}

// Inspect tells who holds a lock, with which token, and how many wait (what `dlock status`
// shows).
func ExampleClient_Inspect() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(ctx)

	l, _ := c.Mutex("example:inspected", dlock.WithOwner("worker-7")).Lock(ctx)
	info, err := c.Inspect(ctx, "example:inspected")
	fmt.Println(err, info.Held, info.Owner, info.Token == l.Token(), info.Waiters)
	_ = l.Unlock(ctx)
	// Output:
	// <nil> true worker-7 true 0
}

// Options set defaults on the Client and override them per handle.
func ExampleOption() {
	ctx := context.Background()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb, dlock.WithTTL(20*time.Second))
	defer c.Close(ctx)

	short := c.Mutex("example:option", dlock.WithTTL(2*time.Second), dlock.WithFixedLease()) // not renewed
	l, _ := short.Lock(ctx)
	fmt.Println("TTL:", l.TTL())
	_ = l.Unlock(ctx)
	// Output:
	// TTL: 2s
}

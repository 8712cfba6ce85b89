package dlock_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// childRoleEnv makes the test binary act as a worker process (see runChild).
const childRoleEnv = "DLOCK_TEST_CHILD"

// incrementUnderLock does a deliberately non-atomic read-modify-write of counterKey under the
// lock, n times: any overlap between two holders loses an increment.
func incrementUnderLock(ctx context.Context, c *dlock.Client, rdb *redis.Client, name, counterKey string, n int) error {
	m := c.Mutex(name)
	for i := 0; i < n; i++ {
		l, err := m.Lock(ctx)
		if err != nil {
			return err
		}
		v, err := rdb.Get(ctx, counterKey).Int()
		if err != nil && err != redis.Nil {
			return err
		}
		if err := rdb.Set(ctx, counterKey, v+1, 0).Err(); err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}

// runChild is the body of a worker process: goroutines × iterations increments.
func runChild(role string) int {
	if role == "semholder" {
		return semHolderChild()
	}
	if role != "increment" {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	goroutines, _ := strconv.Atoi(os.Getenv("DLOCK_TEST_GOROUTINES"))
	iters, _ := strconv.Atoi(os.Getenv("DLOCK_TEST_ITERS"))
	rdb := redis.NewClient(&redis.Options{Network: os.Getenv("DLOCK_TEST_NET"), Addr: os.Getenv("DLOCK_TEST_ADDR")})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx := context.Background()
	var wg sync.WaitGroup
	var failed atomic.Bool
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := incrementUnderLock(ctx, c, rdb, os.Getenv("DLOCK_TEST_NAME"), os.Getenv("DLOCK_TEST_COUNTER"), iters); err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
				failed.Store(true)
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return 1
	}
	return 0
}

func TestMutualExclusionAcrossGoroutines(t *testing.T) {
	c, rdb := newClient(t)
	ctx := ctxT(t)
	name, counter := redistest.Name(t), redistest.Name(t)
	const goroutines, iters = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- incrementUnderLock(ctx, c, rdb, name, counter, iters)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, _ := rdb.Get(ctx, counter).Int()
	if want := goroutines * iters; got != want {
		t.Fatalf("counter = %d, want %d: %d increments lost to overlapping holders", got, want, want-got)
	}
}

func TestMutualExclusionAcrossProcesses(t *testing.T) {
	srv := redistest.Shared(t)
	rdb := redistest.Client(t)
	ctx := ctxT(t)
	name, counter := redistest.Name(t), redistest.Name(t)
	const procs, goroutines, iters = 4, 2, 40
	var wg sync.WaitGroup
	outs := make([][]byte, procs)
	errs := make([]error, procs)
	for p := 0; p < procs; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			childRoleEnv+"=increment",
			"DLOCK_TEST_NET="+srv.Network, "DLOCK_TEST_ADDR="+srv.Addr,
			"DLOCK_TEST_NAME="+name, "DLOCK_TEST_COUNTER="+counter,
			"DLOCK_TEST_GOROUTINES="+strconv.Itoa(goroutines), "DLOCK_TEST_ITERS="+strconv.Itoa(iters))
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[p], errs[p] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for p := range errs {
		if errs[p] != nil {
			t.Fatalf("worker process %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	got, _ := rdb.Get(ctx, counter).Int()
	want := procs * goroutines * iters
	t.Logf("cross-process: %d processes x %d goroutines: %d increments, %d lost", procs, goroutines, got, want-got)
	if got != want {
		t.Fatalf("counter = %d, want %d", got, want)
	}
}

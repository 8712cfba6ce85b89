package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Close ends every wait at once, local (cohort) and in Redis, with ErrClosed (issue 9,
// point 7).
func TestCloseEndsEveryWaitAtOnce(t *testing.T) {
	rdb := redistest.Client(t)
	c := dlock.New(rdb)
	ctx := ctxT(t)
	name := redistest.Name(t)
	held, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const local = 5
	errs := make(chan error, local+1)
	for i := 0; i < local; i++ {
		go func() {
			_, err := c.Mutex(name).Lock(ctx)
			errs <- err
		}()
	}
	go func() {
		_, err := c.Mutex(name, dlock.WithoutCohort()).Lock(ctx) // waits in Redis
		errs <- err
	}()
	for dlock.CohortWaiters(c, name) != local {
		time.Sleep(time.Millisecond) // the local queue has no event to wait on
	}
	waitQueued(t, c, name, 1)
	start := time.Now()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < local+1; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("a wait ended by Close returned %v, want ErrClosed", err)
			}
		case <-time.After(time.Second):
			t.Fatalf("%d waits still blocked 1s after Close returned", local+1-i)
		}
	}
	if !errors.Is(held.Err(), dlock.ErrClosed) {
		t.Fatalf("held lease after Close: %v", held.Err())
	}
	if d := time.Since(start); d > dlock.CloseTimeout {
		t.Fatalf("Close took %v with Redis up", d)
	}
	if rdb.Exists(ctx, lockKey(name)).Val() != 0 {
		t.Fatalf("Close left the lock held: %v (cohort owner of the holder %s)", rdb.HGetAll(ctx, lockKey(name)).Val(), held.Owner())
	}
}

// With Redis frozen, Close still returns within its documented bound: CloseTimeout plus one
// go-redis read timeout for a call in flight.
func TestCloseIsBoundedWithRedisDown(t *testing.T) {
	srv := redistest.StartT(t, redistest.Config{})
	opt := srv.Options()
	opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	c := dlock.New(rdb)
	ctx := ctxT(t)
	name := redistest.Name(t)
	if _, err := c.Mutex(name).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Mutex(name, dlock.WithoutCohort()).Lock(ctx)
		waiting <- err
	}()
	waitQueued(t, c, name, 1)
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.Close(context.Background()) }()
	bound := dlock.CloseTimeout + opt.ReadTimeout + time.Second
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Close with Redis frozen reported no release error")
		}
		t.Logf("Close with Redis frozen returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(bound):
		t.Fatalf("Close still running %v after it started with Redis frozen", bound)
	}
	if err := <-waiting; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("waiter after Close: %v, want ErrClosed", err)
	}
}

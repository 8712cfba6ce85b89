package dlocktest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// These examples are compiled, not run: they need the *testing.T of a test, as in
// func TestNightlyReport(t *testing.T) { ... }.

// Start gives a test its own redis-server; Kill and Restart play a crash, to test what the
// code under test does when Redis goes away.
func ExampleStart() {
	var t *testing.T // the test's t
	srv := dlocktest.Start(t)
	c := dlock.New(srv.Client(t), dlock.WithTTL(time.Second))
	defer c.Close(context.Background())

	l, err := c.Mutex("report").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill() // Redis crashes while the lease is held
	<-l.Done() // at its safe deadline (within the TTL), no renewal having succeeded
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("lease ended with %v", l.Err())
	}
	if err := srv.Restart(); err != nil { // empty, on the same address
		t.Fatal(err)
	}
}

// NewClient is Start and dlock.New in one: a Client on a server of the test's own.
func ExampleNewClient() {
	var t *testing.T // the test's t
	c := dlocktest.NewClient(t, dlock.WithOwner("worker-1"))
	l, err := c.Mutex("report").TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if l.Owner() != "worker-1" {
		t.Fatalf("owner %q", l.Owner())
	}
}

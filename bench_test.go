package dlock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkUncontended is one Lock and Unlock of a fresh lock per iteration: the client-side
// cost of the uncontended path (run with -cpuprofile to see where it goes).
func BenchmarkUncontended(b *testing.B) {
	c, name := benchClient(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUncontendedFresh8 is one Lock and Unlock of a fresh lock per iteration from 8
// goroutines of one Client: the client-side cost of many independent locks (the flash sale's
// one lock per user).
func BenchmarkUncontendedFresh8(b *testing.B) {
	c, name := benchClient(b)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(4) // 8 goroutines on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := c.Mutex(name + strconv.FormatInt(n.Add(1), 10)).Lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchClient starts a Redis and a Client on it (closed at cleanup) and names the lock.
func benchClient(b *testing.B) (*dlock.Client, string) {
	c := dlock.New(redistest.Client(b))
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	b.ReportAllocs()
	return c, redistest.Name(b)
}

package dlock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkUncontended is one Lock and Unlock of a fresh lock per iteration: the client-side
// cost of the uncontended path (run with -cpuprofile to see where it goes).
func BenchmarkUncontended(b *testing.B) {
	rdb := redistest.Client(b)
	c := dlock.New(rdb)
	defer c.Close(context.Background())
	ctx := context.Background()
	name := redistest.Name(b)
	b.ReportAllocs()
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

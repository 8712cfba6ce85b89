package dlock_test

import (
	"context"
	"math/rand/v2"
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

// BenchmarkMultiLockContended is bench/'s multi-lock scenario in one process (run with
// -cpuprofile to see where a contended MultiLock's client time goes): 4 Clients × 8
// goroutines, each operation a MultiLock over 2 or 3 random names of 16 and a GET+SET of each
// name's counter.
func BenchmarkMultiLockContended(b *testing.B) {
	rdb := redistest.Client(b)
	name := redistest.Name(b)
	b.ReportAllocs()
	var cs []*dlock.Client
	for range 4 {
		c := dlock.New(rdb)
		b.Cleanup(func() { _ = c.Close(context.Background()) })
		cs = append(cs, c)
	}
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(16) // 32 goroutines on 2 CPUs
	b.RunParallel(func(pb *testing.PB) {
		g := n.Add(1)
		c := cs[g%4]
		rng := rand.New(rand.NewPCG(uint64(g), 1))
		for pb.Next() {
			perm := rng.Perm(16)[:2+rng.IntN(2)]
			names := make([]string, len(perm))
			for i, p := range perm {
				names[i] = name + ":" + strconv.Itoa(p)
			}
			l, err := c.MultiLock(names).Lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, nm := range names {
				v, _ := rdb.Get(ctx, nm+":ctr").Int()
				rdb.Set(ctx, nm+":ctr", v+1, 0)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
